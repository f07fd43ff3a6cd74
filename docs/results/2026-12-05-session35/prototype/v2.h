// Prototype: bf16 pairs widened with one op each (shift / and), x pre-permuted per 16 k.
#include <immintrin.h>
namespace v2 {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// x rows pre-permuted: per 16 k, the 8 even elements then the 8 odd ones. k16 = K & ~15.
template <int MC, int R>
inline void block_dot(const float* x, const c10::BFloat16* w, int64_t K, float* out, int64_t ldo,
                      const float* xraw) {
  __m256 acc[MC][R];
  for (int m = 0; m < MC; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t k16 = K & ~int64_t{15};
  for (int64_t k = 0; k < k16; k += 16) {
    if ((k & 31) == 0)
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * K + k), _MM_HINT_T0);
    __m256 we[R], wo[R];
    for (int r = 0; r < R; ++r) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * K + k));
      we[r] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
      wo[r] = _mm256_castsi256_ps(_mm256_and_si256(raw, hi));
    }
    for (int m = 0; m < MC; ++m) {
      const __m256 xe = _mm256_loadu_ps(x + m * K + k);
      const __m256 xo = _mm256_loadu_ps(x + m * K + k + 8);
      for (int r = 0; r < R; ++r) {
        acc[m][r] = _mm256_fmadd_ps(xe, we[r], acc[m][r]);
        acc[m][r] = _mm256_fmadd_ps(xo, wo[r], acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MC; ++m)
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[m][r]);
      for (int64_t k = k16; k < K; ++k) s += xraw[m * K + k] * static_cast<float>(w[r * K + k]);
      out[m * ldo + r] = s;
    }
}


// x of MC rows held in registers; each weight row widened once per 16 k, even then odd half.
template <int MC, int R>
inline void block_dot_xr(const float* x, const c10::BFloat16* w, int64_t K, float* out,
                         int64_t ldo, const float* xraw) {
  __m256 acc[MC][R];
  for (int m = 0; m < MC; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t k16 = K & ~int64_t{15};
  for (int64_t k = 0; k < k16; k += 16) {
    if ((k & 31) == 0)
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * K + k), _MM_HINT_T0);
    __m256 xe[MC], xo[MC];
    for (int m = 0; m < MC; ++m) {
      xe[m] = _mm256_loadu_ps(x + m * K + k);
      xo[m] = _mm256_loadu_ps(x + m * K + k + 8);
    }
    for (int r = 0; r < R; ++r) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * K + k));
      const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
      for (int m = 0; m < MC; ++m) acc[m][r] = _mm256_fmadd_ps(xe[m], we, acc[m][r]);
      const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(raw, hi));
      for (int m = 0; m < MC; ++m) acc[m][r] = _mm256_fmadd_ps(xo[m], wo, acc[m][r]);
    }
  }
  for (int m = 0; m < MC; ++m)
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[m][r]);
      for (int64_t k = k16; k < K; ++k) s += xraw[m * K + k] * static_cast<float>(w[r * K + k]);
      out[m * ldo + r] = s;
    }
}


// Weight row widened inside the row loop, x reloaded from L1 per (m, r): more accumulators.
template <int MC, int R>
inline void block_dot_wr(const float* x, const c10::BFloat16* w, int64_t K, float* out,
                         int64_t ldo, const float* xraw) {
  __m256 acc[MC][R];
  for (int m = 0; m < MC; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t k16 = K & ~int64_t{15};
  for (int64_t k = 0; k < k16; k += 16) {
    if ((k & 31) == 0)
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * K + k), _MM_HINT_T0);
    for (int r = 0; r < R; ++r) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * K + k));
      const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
      const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(raw, hi));
      for (int m = 0; m < MC; ++m) {
        acc[m][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * K + k), we, acc[m][r]);
        acc[m][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * K + k + 8), wo, acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MC; ++m)
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[m][r]);
      for (int64_t k = k16; k < K; ++k) s += xraw[m * K + k] * static_cast<float>(w[r * K + k]);
      out[m * ldo + r] = s;
    }
}
int g_m3 = 0;
int g_scheme = 0;
template <int MC, int R, bool XR>
void sweep_n(const float* x, const float* xraw, const c10::BFloat16* w, int64_t K, int64_t n0,
             int64_t n1, float* out, int64_t N) {
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    if constexpr (XR) block_dot_xr<MC, R>(x, w + n * K, K, out + n, N, xraw);
    else block_dot<MC, R>(x, w + n * K, K, out + n, N, xraw);
  }
  for (; n < n1; ++n) block_dot_xr<MC, 1>(x, w + n * K, K, out + n, N, xraw);
}

void gemv_rows3(const float* x, const float* xraw, int64_t M, const c10::BFloat16* w, int64_t K,
                int64_t n0, int64_t n1, float* out, int64_t N) {
  // Activation rows in chunks: 4s then the rest; each chunk sweeps the task's weight rows.
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) sweep_n<4, 2, false>(x + m * K, xraw + m * K, w, K, n0, n1, out + m * N, N);
  switch (M - m) {
    case 3: sweep_n<3, 2, true>(x + m * K, xraw + m * K, w, K, n0, n1, out + m * N, N); break;
    case 2: sweep_n<2, 4, true>(x + m * K, xraw + m * K, w, K, n0, n1, out + m * N, N); break;
    case 1: sweep_n<1, 8, true>(x + m * K, xraw + m * K, w, K, n0, n1, out + m * N, N); break;
  }
}

template <int R>
void rows_block(const float* x, const float* xraw, int64_t M, const c10::BFloat16* w, int64_t K,
                float* out, int64_t N) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) block_dot<4, R>(x + m * K, w, K, out + m * N, N, xraw + m * K);
  switch (M - m) {
    case 3: block_dot<3, R>(x + m * K, w, K, out + m * N, N, xraw + m * K); break;
    case 2: block_dot<2, R>(x + m * K, w, K, out + m * N, N, xraw + m * K); break;
    case 1: block_dot<1, R>(x + m * K, w, K, out + m * N, N, xraw + m * K); break;
  }
}

void gemv_rows(const float* x, const float* xraw, int64_t M, const c10::BFloat16* w, int64_t K,
               int64_t n0, int64_t n1, float* out, int64_t N) {
  int64_t n = n0;
  if (M == 1) {
    for (; n + 4 <= n1; n += 4) block_dot<1, 4>(x, w + n * K, K, out + n, 0, xraw);
  } else {
    for (; n + 2 <= n1; n += 2) rows_block<2>(x, xraw, M, w + n * K, K, out + n, N);
  }
  for (; n < n1; ++n) rows_block<1>(x, xraw, M, w + n * K, K, out + n, N);
}


void gemv_rows4(const float* x, const float* xraw, int64_t M, const c10::BFloat16* w, int64_t K,
                int64_t n0, int64_t n1, float* out, int64_t N) {
  switch (M) {
    case 1: return sweep_n<1, 8, true>(x, xraw, w, K, n0, n1, out, N);
    case 2: return sweep_n<2, 4, true>(x, xraw, w, K, n0, n1, out, N);
    case 3: {
      if (g_m3 == 0) return sweep_n<3, 2, true>(x, xraw, w, K, n0, n1, out, N);
      int64_t n = n0;
      if (g_m3 == 1) for (; n + 3 <= n1; n += 3) block_dot_wr<3, 3>(x, w + n * K, K, out + n, N, xraw);
      if (g_m3 == 2) for (; n + 4 <= n1; n += 4) block_dot_wr<3, 4>(x, w + n * K, K, out + n, N, xraw);
      for (; n < n1; ++n) block_dot_xr<3, 1>(x, w + n * K, K, out + n, N, xraw);
      return;
    }
  }
  // Weight rows in blocks of 2 (kept in L1), activation rows swept in chunks of 4 per block.
  int64_t n = n0;
  for (; n <= n1; n += 2) {
    const int R_ = n + 2 <= n1 ? 2 : 1;
    if (n >= n1) break;
    const c10::BFloat16* wb = w + n * K;
    int64_t m = 0;
    if (R_ == 2) {
      for (; m + 4 <= M; m += 4) block_dot<4, 2>(x + m * K, wb, K, out + m * N + n, N, xraw + m * K);
      switch (M - m) {
        case 3: block_dot_xr<3, 2>(x + m * K, wb, K, out + m * N + n, N, xraw + m * K); break;
        case 2: block_dot_xr<2, 2>(x + m * K, wb, K, out + m * N + n, N, xraw + m * K); break;
        case 1: block_dot_xr<1, 2>(x + m * K, wb, K, out + m * N + n, N, xraw + m * K); break;
      }
    } else {
      for (; m < M; ++m) block_dot_xr<1, 1>(x + m * K, wb, K, out + m * N + n, N, xraw + m * K);
    }
  }
}

}  // namespace v2

at::Tensor bf16_linear_v2(at::Tensor x, at::Tensor w, at::Tensor bias) {
  pybind11::gil_scoped_release no_gil;
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor xperm = at::empty({M, K}, xf.options());
  const float* xs = xf.data_ptr<float>();
  float* xd = xperm.data_ptr<float>();
  const int64_t k16 = K & ~int64_t{15};
  for (int64_t m = 0; m < M; ++m) {
    const float* s = xs + m * K;
    float* d = xd + m * K;
    for (int64_t k = 0; k < k16; k += 16)
      for (int j = 0; j < 8; ++j) { d[k + j] = s[k + 2 * j]; d[k + 8 + j] = s[k + 2 * j + 1]; }
    for (int64_t k = k16; k < K; ++k) d[k] = s[k];
  }
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  const auto* wp = w.data_ptr<c10::BFloat16>();
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 16) / std::max<int64_t>(K, 1));
  at::parallel_for(0, N, grain, [&](int64_t b, int64_t e) {
    if (v2::g_scheme == 0) v2::gemv_rows(xd, xs, M, wp, K, b, e, op, N);
    else if (v2::g_scheme == 1) v2::gemv_rows3(xd, xs, M, wp, K, b, e, op, N);
    else v2::gemv_rows4(xd, xs, M, wp, K, b, e, op, N);
  });
  if (bias.defined() && bias.numel() > 0) out.add_(bias.to(at::kFloat));
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

void set_scheme(int s) { v2::g_scheme = s; }

void set_m3(int s) { v2::g_m3 = s; }
