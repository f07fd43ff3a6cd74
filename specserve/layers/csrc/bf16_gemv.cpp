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
// swept in chunks, so each weight is read from memory once whatever the number of rows.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
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

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// acc[m][r] for MC activation rows (x, ldx = K) and R weight rows (w, ldw = K); k8 = K rounded
// down to 8; the K tail is added in scalar code.
template <int MC, int R>
inline void block_dot(const float* x, const c10::BFloat16* w, int64_t K, float* out,
                      int64_t ldo) {
  __m256 acc[MC][R];
  for (int m = 0; m < MC; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  const int64_t k8 = K & ~int64_t{7};
  for (int64_t k = 0; k < k8; k += 8) {
    if ((k & 31) == 0)  // the next block's line of each row (64 bytes = 32 bf16)
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * K + k), _MM_HINT_T0);
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = widen_bf16(w + r * K + k);
    for (int m = 0; m < MC; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm256_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
  for (int m = 0; m < MC; ++m) {
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[m][r]);
      for (int64_t k = k8; k < K; ++k)
        s += x[m * K + k] * static_cast<float>(w[r * K + k]);
      out[m * ldo + r] = s;
    }
  }
}

// Activation rows [0, M) against weight rows [n0, n0 + R), two activation rows per pass: with
// R = 4 that is 8 accumulators + 4 weight vectors + 1 activation vector of the 16 ymm registers.
template <int R>
void rows_block(const float* x, int64_t M, const c10::BFloat16* w, int64_t K, float* out,
                int64_t N) {
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) block_dot<2, R>(x + m * K, w, K, out + m * N, N);
  if (m < M) block_dot<1, R>(x + m * K, w, K, out + m * N, N);
}

// One activation row: 8 weight rows per pass, 8 independent FMA chains.
void one_row(const float* x, const c10::BFloat16* w, int64_t K, int64_t n0, int64_t n1,
             float* out) {
  int64_t n = n0;
  for (; n + 8 <= n1; n += 8) block_dot<1, 8>(x, w + n * K, K, out + n, 0);
  for (; n < n1; ++n) block_dot<1, 1>(x, w + n * K, K, out + n, 0);
}
#else
constexpr bool kGemvVectorized = false;
#endif

void gemv_rows(const float* x, int64_t M, const c10::BFloat16* w, int64_t K, int64_t n0,
               int64_t n1, float* out, int64_t N) {
#if defined(__AVX2__) && defined(__FMA__)
  if (M == 1) return one_row(x, w, K, n0, n1, out);
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) rows_block<4>(x, M, w + n * K, K, out + n, N);
  for (; n < n1; ++n) rows_block<1>(x, M, w + n * K, K, out + n, N);
#else
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * static_cast<float>(w[n * K + k]);
      out[m * N + n] = s;
    }
#endif
}

}  // namespace

// Up to this many activation rows the kernel beats oneDNN fp32 on the weights' fp32 image (on
// a 2-core Zen 3, all 30 layers of SmolLM2-135M: 2.0x at 1-4 rows, 1.5x at 8-12, 1.1x at 16).
constexpr int64_t kBf16LinearMaxRows = 12;

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
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  const float* xp = xf.data_ptr<float>();
  const auto* wp = w.data_ptr<c10::BFloat16>();
  float* op = out.data_ptr<float>();
  // ~64 rows of 576 bf16 per task: enough work to pay for a wake-up of the pool.
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 16) / std::max<int64_t>(K, 1));
  at::parallel_for(0, N, grain, [&](int64_t b, int64_t e) {
    gemv_rows(xp, M, wp, K, b, e, op, N);
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
