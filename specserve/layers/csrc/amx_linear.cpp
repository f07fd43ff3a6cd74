// A linear layer with bf16 weights for up to 256 rows of bf16 activations, on AMX tiles.
//
// Why: decoding is bound by reading the weights. On an Intel Xeon with AMX (and ~23 GB/s of
// memory bandwidth over two cores), oneDNN's packed bf16 GEMM read SmolLM2-135M's 269 MB of
// weights at ~16 GB/s for one row and ~13 GB/s for 32 (docs/performance.md, session 25), while
// the arithmetic of 64 rows takes AMX a fraction of that time. This kernel streams each weight
// once, in the order it lies in memory, for up to 32 rows at once (more rows read each block's
// tiles again, from the cache, 32 rows a pass).
// Up to 256 rows (speculative verification at 32-64 requests, short prefills, draft heads): over
// every linear of SmolLM2-135M it took 0.8-1.05x oneDNN's time at 48-256 rows (faster at 64 and
// 96, even at 65 and 192-256) and ~1.03x at 384-512 (session 30). It also needs no oneDNN
// primitive per new row count (1.7-2.7 ms at each one's first call, session 29), and a row's
// result never depends on the other rows of the call.
//
// Layout (amx_pack_weight in layers/linear.py): the [N, K] weight as tiles of 16 output columns
// x 32 inputs, in AMX's pair-interleaved ("VNNI") order; an output block's tiles lie one after
// another along K, so a thread reads one contiguous stretch of memory:
//   packed[nb][kb][r][n][j] = w[16 nb + n][32 kb + 2 r + j]     (N % 16 == 0, K % 32 == 0)
//
// y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]): bf16 products summed in fp32 (tdpbf16ps; bf16
// subnormal inputs read as zero), the bias added in fp32, one rounding to bf16: what a bf16 GEMM
// with fp32 accumulation computes, up to the order of the sum.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

// SPECSERVE_AMX, amx_permitted() and TileConfig: amx_tiles.cpp.

namespace {

constexpr int64_t kAmxMaxRows = 256;  // why 256: the top of the file
constexpr int64_t kTileElems = 16 * 32;  // bf16 elements of one weight tile (1 KB)

#ifdef SPECSERVE_AMX
// Tiles are 64 bytes wide: 0-3 are fp32 accumulators (16 columns), 4-7 operands: rows of 32
// bf16 activations, or 16 pair-rows x 16 columns x 2 of weights (amx_blocks: 4, 6 activations
// and 5, 7 weights; amx_pairs: 4, 5 and 6, 7). tile_config(r): accumulators and activation
// tiles of r rows (fewer than 16 for a batch of r < 16 rows, which then needs no padding),
// weights of 16; amx_pairs uses tile_config(16).
const TileConfig& tile_config(int64_t rows) {
  static const auto configs = [] {
    std::array<TileConfig, 17> c{};
    for (int r = 1; r <= 16; ++r)
      for (int t = 0; t < 8; ++t) {
        c[r].rows[t] = (t == 5 || t == 7) ? 16 : r;  // 5, 7 are amx_blocks' weight tiles
        c[r].colsb[t] = 64;
      }
    return c;
  }();
  return configs[rows];
}

// out[m, 0:16] = bf16(acc[m, 0:16] + bias[0:16]) for m < M (out's rows ldo apart), rounding to
// nearest even as c10::BFloat16 does; 16 at a time where AVX512-BF16 has the conversion (every
// AMX CPU so far), since at 64 rows the scalar loop took as long as streaming the weights.
inline void store_rows(const float* acc, int64_t M, const float* bias, c10::BFloat16* out,
                       int64_t ldo) {
#ifdef __AVX512BF16__
  const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int64_t m = 0; m < M; ++m) {
    const __m256bh r = _mm512_cvtneps_pbh(_mm512_add_ps(_mm512_load_ps(acc + m * 16), b));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * ldo), reinterpret_cast<const __m256i&>(r));
  }
#else
  for (int64_t m = 0; m < M; ++m)
    for (int c = 0; c < 16; ++c)
      out[m * ldo + c] = static_cast<c10::BFloat16>(acc[m * 16 + c] + (bias ? bias[c] : 0.f));
#endif
}

// Output blocks [nb0, nb1) for MB 16-row blocks of x (xp: [16 MB, K] bf16, zero-padded; or
// MB = 1 and M < 16 rows as they are).
// Two k-blocks per iteration, on alternating activation / weight tiles, so that a tile load
// does not wait for the product that still reads the previous one.
// (The tile numbers are spelled out: gcc's AMX intrinsics are macros that paste them into the
// instruction text, so they cannot come from a template parameter.)
template <int MB>
void amx_blocks(const c10::BFloat16* xp, int64_t K, const c10::BFloat16* wp, int64_t nb0,
                int64_t nb1, int64_t M, int64_t N, const float* bias, c10::BFloat16* y) {
  const int64_t KB = K / 32;
  const int64_t xstride = K * 2;  // bytes between rows of x
  alignas(64) float acc[64 * 16];
  _tile_loadconfig(&tile_config(MB == 1 ? M : 16));
  for (int64_t nb = nb0; nb < nb1; ++nb) {
    const c10::BFloat16* w = wp + nb * KB * kTileElems;
    _tile_zero(0);
    if (MB > 1) _tile_zero(1);
    if (MB > 2) _tile_zero(2);
    if (MB > 3) _tile_zero(3);
    int64_t kb = 0;
    for (; kb + 2 <= KB; kb += 2) {
      const c10::BFloat16* x0 = xp + kb * 32;
      const c10::BFloat16* x1 = x0 + 32;
      _tile_loadd(5, w + kb * kTileElems, 64);
      _tile_loadd(7, w + (kb + 1) * kTileElems, 64);
      _tile_loadd(4, x0, xstride);
      _tile_loadd(6, x1, xstride);
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(0, 6, 7);
      if (MB > 1) {
        _tile_loadd(4, x0 + 16 * K, xstride);
        _tile_loadd(6, x1 + 16 * K, xstride);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(1, 6, 7);
      }
      if (MB > 2) {
        _tile_loadd(4, x0 + 32 * K, xstride);
        _tile_loadd(6, x1 + 32 * K, xstride);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(2, 6, 7);
      }
      if (MB > 3) {
        _tile_loadd(4, x0 + 48 * K, xstride);
        _tile_loadd(6, x1 + 48 * K, xstride);
        _tile_dpbf16ps(3, 4, 5);
        _tile_dpbf16ps(3, 6, 7);
      }
    }
    if (kb < KB) {  // an odd number of k-blocks
      const c10::BFloat16* x0 = xp + kb * 32;
      _tile_loadd(5, w + kb * kTileElems, 64);
      _tile_loadd(4, x0, xstride);
      _tile_dpbf16ps(0, 4, 5);
      if (MB > 1) { _tile_loadd(4, x0 + 16 * K, xstride); _tile_dpbf16ps(1, 4, 5); }
      if (MB > 2) { _tile_loadd(4, x0 + 32 * K, xstride); _tile_dpbf16ps(2, 4, 5); }
      if (MB > 3) { _tile_loadd(4, x0 + 48 * K, xstride); _tile_dpbf16ps(3, 4, 5); }
    }
    _tile_stored(0, acc, 64);
    if (MB > 1) _tile_stored(1, acc + 256, 64);
    if (MB > 2) _tile_stored(2, acc + 512, 64);
    if (MB > 3) _tile_stored(3, acc + 768, 64);
    store_rows(acc, M, bias ? bias + nb * 16 : nullptr, y + nb * 16, N);
  }
  _tile_release();
}

// More than 16 rows: 2 output blocks x 2 row blocks per pass over K, 32 rows at a time. Each
// loaded tile feeds two products and consecutive products go to different accumulators: with
// one output block at a time, a product waited for the previous one on the same accumulator and
// 32 / 64 rows took 1.35x / 2x as long as 16 (docs/performance.md, session 25).
// Output block pairs [p0, p1); xp is [32 MP, K] bf16, zero-padded.
void amx_pairs(const c10::BFloat16* xp, int64_t K, const c10::BFloat16* wp, int64_t p0,
               int64_t p1, int64_t M, int64_t N, const float* bias, c10::BFloat16* y) {
  const int64_t KB = K / 32;
  const int64_t xstride = K * 2;
  alignas(64) float acc[4 * 256];
  _tile_loadconfig(&tile_config(16));
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t nb = 2 * p;
    const c10::BFloat16* w0 = wp + nb * KB * kTileElems;
    const c10::BFloat16* w1 = w0 + KB * kTileElems;
    for (int64_t m0 = 0; m0 < M; m0 += 32) {
      const c10::BFloat16* x0 = xp + m0 * K;
      const int64_t rows = std::min<int64_t>(32, M - m0);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < KB; ++kb) {
        _tile_loadd(4, x0 + kb * 32, xstride);
        _tile_loadd(5, x0 + 16 * K + kb * 32, xstride);
        _tile_loadd(6, w0 + kb * kTileElems, 64);
        _tile_loadd(7, w1 + kb * kTileElems, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, acc, 64);
      _tile_stored(1, acc + 256, 64);
      _tile_stored(2, acc + 512, 64);
      _tile_stored(3, acc + 768, 64);
      c10::BFloat16* out = y + m0 * N + nb * 16;
      store_rows(acc, rows, bias ? bias + nb * 16 : nullptr, out, N);
      store_rows(acc + 512, rows, bias ? bias + nb * 16 + 16 : nullptr, out + 16, N);
    }
  }
  _tile_release();
}
#endif

}  // namespace

// Whether this build and this process can run AMX tiles.
bool amx_linear_available() { return amx_permitted(); }
int64_t amx_linear_max_rows() { return kAmxMaxRows; }

// x [M, K] bf16 (M <= kAmxMaxRows); wp the packed weight ([N / 16, K / 32, 16, 16, 2] bf16);
// bias [N] (any float dtype) or empty / undefined. Returns [M, N] bf16. Called with the GIL
// released (layer loop).
at::Tensor amx_linear_impl(const at::Tensor& x, const at::Tensor& wp, const at::Tensor& bias) {
  TORCH_CHECK(amx_permitted(), "amx_linear: AMX is not available in this build or process");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kBFloat16,
              "amx_linear: x must be a 2-D bfloat16 CPU tensor");
  TORCH_CHECK(wp.scalar_type() == at::kBFloat16 && wp.dim() == 5 && wp.is_contiguous() &&
                  wp.size(2) == 16 && wp.size(3) == 16 && wp.size(4) == 2 &&
                  wp.size(1) * 32 == x.size(1),
              "amx_linear: the weight must be packed by amx_pack_weight for x's K");
  const int64_t M = x.size(0), K = x.size(1), N = wp.size(0) * 16;
  TORCH_CHECK(M <= kAmxMaxRows, "amx_linear: at most ", kAmxMaxRows, " rows, got ", M);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.dim() == 1 && bias.size(0) == N),
              "amx_linear: bias must be [N] or empty");
  RECORD_FUNCTION("specserve::amx_linear", std::vector<c10::IValue>());  // for bench profile
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
#ifdef SPECSERVE_AMX
  const at::Tensor bias_f = has_bias ? bias.to(at::kFloat).contiguous() : at::Tensor();
  const int64_t MB = (M + 15) / 16;
  const int64_t NB = N / 16;
  const bool pairs = MB > 1 && NB % 2 == 0;
  // The activation tiles read 16 rows, 32 for pairs: pad x with zero rows (a few KB).
  const int64_t padded = pairs ? (M + 31) / 32 * 32 : MB == 1 ? M : MB * 16;
  const at::Tensor xc = x.contiguous();
  at::Tensor xp = xc;
  if (padded != M) {
    xp = at::zeros({padded, K}, x.options());
    std::memcpy(xp.data_ptr(), xc.data_ptr(), M * K * sizeof(c10::BFloat16));
  }
  const auto* xd = xp.data_ptr<c10::BFloat16>();
  const auto* wd = wp.data_ptr<c10::BFloat16>();
  const float* bd = has_bias ? bias_f.data_ptr<float>() : nullptr;
  auto* yd = y.data_ptr<c10::BFloat16>();
  if (pairs) {
    at::parallel_for(0, NB / 2, 2, [&](int64_t b, int64_t e) {
      amx_pairs(xd, K, wd, b, e, M, N, bd, yd);
    });
    return y;
  }
  // An odd number of output blocks (every SmolLM2 linear pairs up): four 16-row accumulators
  // at a time, so more than 64 rows take a pass over the weights per 64.
  at::parallel_for(0, NB, 4, [&](int64_t b, int64_t e) {
    for (int64_t m0 = 0; m0 < M; m0 += 64) {
      const int64_t rows = std::min<int64_t>(64, M - m0);
      const c10::BFloat16* xm = xd + m0 * K;
      c10::BFloat16* ym = yd + m0 * N;
      switch ((rows + 15) / 16) {
        case 1: amx_blocks<1>(xm, K, wd, b, e, rows, N, bd, ym); break;
        case 2: amx_blocks<2>(xm, K, wd, b, e, rows, N, bd, ym); break;
        case 3: amx_blocks<3>(xm, K, wd, b, e, rows, N, bd, ym); break;
        default: amx_blocks<4>(xm, K, wd, b, e, rows, N, bd, ym); break;
      }
    }
  });
#endif
  return y;
}

// The Python entry point (layers/linear.py): the same, releasing the GIL while it runs.
at::Tensor amx_linear(at::Tensor x, at::Tensor wp, at::Tensor bias) {
  pybind11::gil_scoped_release no_gil;
  return amx_linear_impl(x, wp, bias);
}
