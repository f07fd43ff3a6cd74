// A linear layer with bf16 weights for a few rows of activations, on CPUs without bf16 GEMMs.
//
// Why: on an AVX2-only CPU (AMD Zen 3, say) oneDNN cannot pack bf16 weights and torch's bf16
// matmul is a slow generic loop, so the engine runs bf16 layers as oneDNN fp32 GEMMs on the
// exact fp32 image of the weights (layers/linear.py). That is right for prefill, but decoding a
// few rows is bound by reading the weights, and the fp32 image is twice their bytes: a batch-1
// step of SmolLM2-135M read 540 MB. This kernel reads the bf16 weights themselves and widens
// them in registers (a bf16 is the top half of an fp32), so the same step reads 270 MB.
//
// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), fp32 products of bf16 values (exact) summed in
// fp32, the bias added in fp32, one rounding to the output dtype: what a bf16 GEMM with fp32
// accumulation computes, and what the fp32-image path computes, up to the order of the sum.
//
// Register blocking: R weight rows x MC activation rows of 8-wide fp32 accumulators per pass
// over k; an R-row block of weights (R * K * 2 bytes) stays in L1 while the activation rows are
// swept in chunks, so each weight is read from memory once whatever the number of rows. Past a
// few rows the arithmetic bounds it, not the memory: hence the cheap widening below.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/utils/pybind.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>

namespace {

#if defined(__AVX2__)
// 8 bf16 -> 8 fp32, exactly (also argmax.cpp's, later in the translation unit).
inline __m256 widen_bf16(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kGemvVectorized = true;

// The scalar tails below must sum in one order in every inlined copy (see "one order" below):
// the extension is built with -fassociative-math, which lets gcc vectorise such loops.
#pragma GCC push_options
#pragma GCC optimize("no-associative-math")

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Widening by pairs. 16 bf16 weights loaded as eight 32-bit lanes hold element 2j in the low
// half of lane j and element 2j + 1 in the high half, and a bf16 is the top half of an fp32: so
// `lane << 16` is element 2j and `lane & 0xffff0000` is element 2j + 1, one integer op per 8
// weights. (Widening 8 at a time took a zero-extending shuffle and a shift, and at 4-8 rows that
// work, repeated for every pass over the activations, bounded the kernel.) The activations are
// permuted once per call to match (permute_pairs): per 16 k, the 8 even elements, then the 8 odd.
//
// Every output is summed in the same order, whichever path and row count computes it: eight
// lanes over the 16-k blocks (even product, then odd), a horizontal sum, then the K tail in
// scalar code. So a row's result does not depend on the other rows of the call: up to 32 rows
// in the step, a request's logits are the same bits alone or in a batch, verifying drafts or
// decoding one token.
inline __m256i load_pairs(const c10::BFloat16* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline __m256 even_of(__m256i pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }
inline __m256 odd_of(__m256i pairs, __m256i high_half) {
  return _mm256_castsi256_ps(_mm256_and_si256(pairs, high_half));
}

// One output: the horizontal sum, then the K tail (x, w: the unpermuted row and the weight row).
inline float finish_dot(__m256 acc, const float* x, const c10::BFloat16* w, int64_t K) {
  float s = hsum(acc);
  for (int64_t k = K & ~int64_t{15}; k < K; ++k) s += x[k] * static_cast<float>(w[k]);
  return s;
}

// Two things gcc did to this kernel, each checked in its machine code (and 4 rows ran 1.4-1.5x
// slower): inlined into the parallel loop, it kept its accumulators in memory too, storing
// every one at every k step, so it stays a function of its own; and with the prefetch behind a
// helper function gcc emitted no prefetch in some instantiations, so it is written out here.
#define NOINLINE __attribute__((noinline))

// MC activation rows (xp permuted, x not) against R weight rows. Up to 3 rows the activations
// stay in registers (2 * MC + MC * R + 3 of the 16 ymm registers); at 4 x 2 gcc reads them from
// L1 as the FMAs' memory operands, with no spill.
template <int MC, int R>
NOINLINE void block_dot(const float* xp, const float* x, const c10::BFloat16* w, int64_t K,
                        float* out, int64_t ldo) {
  __m256 acc[MC][R];
  for (int m = 0; m < MC; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const int64_t k16 = K & ~int64_t{15};
  for (int64_t k = 0; k < k16; k += 16) {
    if ((k & 31) == 0)  // the next block's line of each row (64 bytes = 32 bf16)
      for (int r = R; r < 2 * R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + r * K + k), _MM_HINT_T0);
    __m256 xe[MC], xo[MC];
    for (int m = 0; m < MC; ++m) {
      xe[m] = _mm256_loadu_ps(xp + m * K + k);
      xo[m] = _mm256_loadu_ps(xp + m * K + k + 8);
    }
    for (int r = 0; r < R; ++r) {
      const __m256i pairs = load_pairs(w + r * K + k);
      const __m256 even = even_of(pairs);
      for (int m = 0; m < MC; ++m) acc[m][r] = _mm256_fmadd_ps(xe[m], even, acc[m][r]);
      const __m256 odd = odd_of(pairs, high_half);
      for (int m = 0; m < MC; ++m) acc[m][r] = _mm256_fmadd_ps(xo[m], odd, acc[m][r]);
    }
  }
  for (int m = 0; m < MC; ++m)
    for (int r = 0; r < R; ++r) out[m * ldo + r] = finish_dot(acc[m][r], x + m * K, w + r * K, K);
}

// 1-3 activation rows against weight rows [n0, n1), R at a time (R * 2 * K bytes stay in L1).
template <int MC, int R>
void sweep_weights(const float* xp, const float* x, const c10::BFloat16* w, int64_t K,
                   int64_t n0, int64_t n1, float* out, int64_t N) {
  int64_t n = n0;
  for (; n + R <= n1; n += R) block_dot<MC, R>(xp, x, w + n * K, K, out + n, N);
  for (; n < n1; ++n) block_dot<MC, 1>(xp, x, w + n * K, K, out + n, N);
}

template <int R>
void few_rows(int64_t mc, const float* xp, const float* x, const c10::BFloat16* w, int64_t K,
              float* out, int64_t N) {
  switch (mc) {
    case 1: return block_dot<1, R>(xp, x, w, K, out, N);
    case 2: return block_dot<2, R>(xp, x, w, K, out, N);
    case 3: return block_dot<3, R>(xp, x, w, K, out, N);
  }
}

void gemv_rows(const float* xp, const float* x, int64_t M, const c10::BFloat16* w, int64_t K,
               int64_t n0, int64_t n1, float* out, int64_t N) {
  // Up to 3 rows: as many weight rows per block as the registers allow (8, 8, 6 accumulators).
  switch (M) {
    case 1: return sweep_weights<1, 8>(xp, x, w, K, n0, n1, out, N);
    case 2: return sweep_weights<2, 4>(xp, x, w, K, n0, n1, out, N);
    case 3: return sweep_weights<3, 2>(xp, x, w, K, n0, n1, out, N);
  }
  // More: weight rows in pairs, each pair swept over the activations in fours while it sits in
  // L1, so every weight is read from memory once.
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) {
    const c10::BFloat16* wb = w + n * K;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)
      block_dot<4, 2>(xp + m * K, x + m * K, wb, K, out + m * N + n, N);
    if (m < M) few_rows<2>(M - m, xp + m * K, x + m * K, wb, K, out + m * N + n, N);
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; m += 3)
      few_rows<1>(std::min<int64_t>(3, M - m), xp + m * K, x + m * K, w + n * K, K,
                  out + m * N + n, N);
}

// [M, K] -> [M, K]: per 16 k, the even elements then the odd ones (even_of / odd_of); the
// K tail as it was.
at::Tensor permute_pairs(const at::Tensor& xf) {
  const int64_t M = xf.size(0), K = xf.size(1), k16 = K & ~int64_t{15};
  at::Tensor out = at::empty_like(xf);
  const float* s = xf.data_ptr<float>();
  float* d = out.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m, s += K, d += K) {
    for (int64_t k = 0; k < k16; k += 16)
      for (int j = 0; j < 8; ++j) {
        d[k + j] = s[k + 2 * j];
        d[k + 8 + j] = s[k + 2 * j + 1];
      }
    for (int64_t k = k16; k < K; ++k) d[k] = s[k];
  }
  return out;
}
#pragma GCC pop_options
#else
constexpr bool kGemvVectorized = false;

void gemv_rows(const float*, const float* x, int64_t M, const c10::BFloat16* w, int64_t K,
               int64_t n0, int64_t n1, float* out, int64_t N) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * static_cast<float>(w[n * K + k]);
      out[m * N + n] = s;
    }
}

at::Tensor permute_pairs(const at::Tensor& xf) { return xf; }
#endif

}  // namespace

// Up to this many activation rows the kernel beats oneDNN fp32 on the weights' fp32 image (on
// a 2-core Zen 3, all 30 layers and the LM head of SmolLM2-135M: 2.1-2.3x at 1-8 rows, 1.5x at
// 16, 1.3x at 24, 1.1x at 32, and 0.92-1.04x at 48; docs/performance.md, session 35).
constexpr int64_t kBf16LinearMaxRows = 32;

// x [M, K] bf16 or fp32; w [N, K] bf16 (nn.Linear's layout); bias [N] (any float dtype) or
// empty / undefined. Returns [M, N] in x's dtype. Called with the GIL released (layer loop).
at::Tensor bf16_linear_impl(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "bf16_linear: x must be a 2-D CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "bf16_linear: x must be float32 or bfloat16");
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.is_contiguous() &&
                  w.size(1) == x.size(1),
              "bf16_linear: w must be a contiguous [N, K] bfloat16 tensor with x's K");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.dim() == 1 && bias.size(0) == N),
              "bf16_linear: bias must be [N] or empty");
  RECORD_FUNCTION("specserve::bf16_linear", std::vector<c10::IValue>());  // for bench profile
  const at::Tensor xf = x.to(at::kFloat).contiguous();  // [M, K] fp32: small, reused N times
  const at::Tensor xperm = permute_pairs(xf);
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  const float* xp = xperm.data_ptr<float>();
  const float* xr = xf.data_ptr<float>();
  const auto* wp = w.data_ptr<c10::BFloat16>();
  float* op = out.data_ptr<float>();
  // ~64 rows of 576 bf16 per task: enough work to pay for a wake-up of the pool.
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 16) / std::max<int64_t>(K, 1));
  at::parallel_for(0, N, grain, [&](int64_t b, int64_t e) {
    gemv_rows(xp, xr, M, wp, K, b, e, op, N);
  });
  if (has_bias) out.add_(bias.to(at::kFloat));
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// The Python entry point (layers/linear.py): the same, releasing the GIL while it runs.
at::Tensor bf16_linear(at::Tensor x, at::Tensor w, at::Tensor bias) {
  pybind11::gil_scoped_release no_gil;
  return bf16_linear_impl(x, w, bias);
}

bool bf16_linear_vectorized() { return kGemvVectorized; }
int64_t bf16_linear_max_rows() { return kBf16LinearMaxRows; }
