// Row-wise argmax of fp32 logits for greedy sampling, as torch.argmax(x, dim=-1) defines it: the
// first index of the maximum, and the first NaN where a row has one.
//
// Why: torch's CPU argmax tracks a (value, index) pair per element and does not vectorise; on
// [64, 49152] logits it took 2.0-2.6 ms of a ~70 ms decode step on a 2-core Zen 4 (1.4 ms at
// concurrency 32). Two vector passes do the same in a fraction: the row's maximum, then the
// first position equal to it, which is found within the first few vectors of the scan.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <limits>

namespace {

int64_t first_nan(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(x[i])) return i;
  return -1;
}

int64_t argmax_row(const float* x, int64_t n) {
  int64_t i = 0;
  float best = -std::numeric_limits<float>::infinity();
  bool nan = false;
#if defined(__AVX512F__)
  __m512 m = _mm512_set1_ps(best);
  __mmask16 unordered = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, v);
  }
  best = _mm512_reduce_max_ps(m);
  nan = unordered != 0;
#elif defined(__AVX2__)
  __m256 m = _mm256_set1_ps(best);
  __m256 unordered = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  for (float l : lanes) best = l > best ? l : best;
  nan = _mm256_movemask_ps(unordered) != 0;
#endif
  for (; i < n; ++i) {
    nan |= std::isnan(x[i]);
    best = x[i] > best ? x[i] : best;
  }
  if (nan) return first_nan(x, n);
  int64_t j = 0;
#if defined(__AVX512F__)
  const __m512 b = _mm512_set1_ps(best);
  for (; j + 16 <= n; j += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), b, _CMP_EQ_OQ);
    if (eq) return j + __builtin_ctz(eq);
  }
#elif defined(__AVX2__)
  const __m256 b = _mm256_set1_ps(best);
  for (; j + 8 <= n; j += 8) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), b, _CMP_EQ_OQ));
    if (eq) return j + __builtin_ctz(eq);
  }
#endif
  for (; j < n; ++j)
    if (x[j] == best) return j;
  return 0;  // n == 0 cannot reach here (checked by the caller)
}

}  // namespace

// x [rows, n] contiguous fp32 on the CPU, n >= 1 -> [rows] int64.
at::Tensor argmax_rows(at::Tensor x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() &&
                  x.scalar_type() == at::kFloat && x.size(1) > 0,
              "argmax_rows: expected a contiguous non-empty [rows, n] float32 CPU tensor");
  pybind11::gil_scoped_release no_gil;
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  // A row of a 49k vocabulary is ~10 us of work: split rows across threads from two on.
  at::parallel_for(0, rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) op[r] = argmax_row(xp + r * n, n);
  });
  return out;
}
