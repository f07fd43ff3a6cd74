// Fused paged attention for short queries (decode, speculative verification) on CPU.
//
// Reads K/V in place from the paged cache through the block tables: no gather copy, no padding,
// no materialised scores. Work item = (run of consecutive query tokens of one sequence, key
// partition), all heads: a slot's K (or V) rows of all KV heads are adjacent in memory, so an item
// streams whole slots. All query heads of a KV head's GQA group, and all tokens of the run, share
// each K/V row load. Online softmax over tiles of TILE keys: scores for the tile, one max / exp /
// rescale per row per tile, then the P*V update; fp32 accumulation throughout, bf16 output
// rounded to nearest-even.
//
// Vectorisation: for head_dim 64 and 128 the dot products and P*V use GCC/Clang 16-lane vector
// types (gcc's auto-vectoriser picks the wrong loop there: it vectorised P*V across keys with
// gathers); the 16 dot products of a key group are reduced with one shuffle tree. With AVX512_BF16
// the bf16 scores use vdpbf16ps on the cache rows in place (exact bf16 products, fp32 sums);
// otherwise keys are widened once per tile (uint16 << 16). V is widened in registers. Other
// head_dims use plain loops that gcc vectorises (-O3 -march=native plus the flags that allow
// reassociating fp32 reductions). exp is a polynomial so that it vectorises too; scores are kept
// in log2 units (q is pre-scaled by scale * log2(e)). On CPUs with AMX (Intel Xeon, Sapphire
// Rapids on) the bf16 scores of runs of up to 16 rows per KV head come from tiles instead
// (amx_scores); SPECSERVE_NO_AMX=1 turns that off with the AMX linears.
//
// Threads: at::parallel_for over torch's intra-op pool (respects torch.set_num_threads); each
// thread pulls work items, largest first, from a shared atomic counter. When there are too few
// items for the threads (small batch, long context) the keys are split into partitions and the
// partial softmax states are merged afterwards (flash-decoding style). K/V are software-
// prefetched into L2 64 keys ahead of the tile being computed, and with many items a thread
// claims its next item one ahead and prefetches that item's first keys too. (On the 2-core Xeon
// VM of session 26 the prefetches made no difference either way; what worked there is reading
// one word of every line of a tile's slots in address order before its arithmetic:
// touch_slots.)

// Narrow includes instead of <torch/extension.h>: the build takes a fraction of the time.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int TILE = 32;             // keys per online-softmax tile (hmax_tile assumes 32)
constexpr int MAX_RUN_TOKENS = 16;   // query tokens of one sequence sharing a work item
#ifndef MAX_ROW_TILE_RUN_TOKENS
#define MAX_ROW_TILE_RUN_TOKENS 32
#endif
constexpr int64_t MIN_PART_KEYS = 128;  // smallest key partition when splitting
#ifndef PREFETCH_KEYS
#define PREFETCH_KEYS 64                 // software prefetch distance, in keys
#endif

inline float bf16_bits_to_f32(uint16_t x) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(x) << 16);
}

inline uint16_t f32_to_bf16_rne(float f) {
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// 2^x for x <= 0 (exact 0 below -126, including -inf). Rounded range reduction to [-0.5, 0.5]
// and a degree-7 Taylor polynomial: relative error ~1e-7, vectorisable (no libm call).
inline float exp2_neg(float x) {
  const float xc = x < -126.0f ? -126.0f : x;
  const float n = std::floor(xc + 0.5f);
  const float f = xc - n;
  float p = 1.5252733804059841e-05f;  // ln2^7 / 7!
  p = p * f + 1.5403530393381610e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.6181291076284772e-03f;
  p = p * f + 5.5504108664821580e-02f;
  p = p * f + 2.4022650695910071e-01f;
  p = p * f + 6.9314718055994531e-01f;
  p = p * f + 1.0f;
  const float two_n = __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
  return x < -126.0f ? 0.0f : p * two_n;
}

// 16-lane fp32 vectors (GCC/Clang vector extensions): one zmm register with AVX-512, lowered to
// narrower registers elsewhere. Used where gcc's auto-vectoriser picks the wrong loop.
typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store16(float* p, v16f v) { std::memcpy(p, &v, sizeof(v)); }
inline v16f load16(const uint16_t* p) {  // bf16 -> fp32
#if defined(__AVX512F__)
  // One vpmovzxwd + vpslld (gcc 12 splits the generic form below into two halves).
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return reinterpret_cast<v16f>(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#else
  v16h h;
  std::memcpy(&h, p, sizeof(h));
  return reinterpret_cast<v16f>(__builtin_convertvector(h, v16u) << 16);
#endif
}
inline v16f splat(float x) { return v16f{} + x; }
inline v16f vmax(v16f a, v16f b) { return a > b ? a : b; }

// Sum of each of 16 vectors, as one vector: out[j] = sum(a[j]). Tree of two-source shuffles
// (15 adds, 30 shuffles for 16 dot products instead of a full horizontal sum per product).
inline v16f sum16x16(const v16f* a) {
  v16f t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)
    t[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18,
                                   19, 20, 21, 22, 23) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25,
                                   26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    u[i] = __builtin_shufflevector(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18,
                                   19, 24, 25, 26, 27) +
           __builtin_shufflevector(t[2 * i], t[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22,
                                   23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    w[i] = __builtin_shufflevector(u[2 * i], u[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20,
                                   21, 24, 25, 28, 29) +
           __builtin_shufflevector(u[2 * i], u[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22,
                                   23, 26, 27, 30, 31);
  return __builtin_shufflevector(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                 28, 30) +
         __builtin_shufflevector(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27,
                                 29, 31);
}

// Dot products of q (16 * NC floats, in registers) with 16 key rows.
template <int NC>
inline v16f dot16(const v16f* q, const float* const* krow) {
  v16f a[16];
  for (int j = 0; j < 16; ++j) {
    const float* k = krow[j];
    v16f s = q[0] * load16(k);
    for (int c = 1; c < NC; ++c) s += q[c] * load16(k + 16 * c);
    a[j] = s;
  }
  return sum16x16(a);
}

#if defined(__AVX512BF16__)
// bf16 dot products of q (16 * NC bf16 values, NC / 2 registers) with 16 bf16 key rows read in
// place: vdpbf16ps multiplies bf16 pairs exactly and accumulates in fp32, so the keys need no
// widening pass.
constexpr bool kHaveDpBf16 = true;
template <int NC>
inline v16f dot16_bf16(const __m512bh* q, const uint16_t* const* krow) {
  v16f a[16];
  for (int j = 0; j < 16; ++j) {
    const uint16_t* k = krow[j];
    __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[0],
                                reinterpret_cast<__m512bh>(_mm512_loadu_si512(k)));
    for (int c = 1; c < NC / 2; ++c)
      s = _mm512_dpbf16_ps(s, q[c], reinterpret_cast<__m512bh>(_mm512_loadu_si512(k + 32 * c)));
    a[j] = reinterpret_cast<v16f>(s);
  }
  return sum16x16(a);
}
#else
constexpr bool kHaveDpBf16 = false;
#endif

#ifdef SPECSERVE_AMX
// Q.K^T of a tile on AMX (bf16 pools, head_dim 64 or 128, at most 16 query rows per KV head,
// block_size a multiple of 16). The products are S^T = K Q^T: the A operand is 16 keys' rows,
// read in place (16 consecutive slots of one block, slot_bytes apart), the B operand the rows'
// queries transposed in pairs (qt, built once per item), C 16 keys x R fp32 scores. At decode
// (R = 3 rows per KV head for SmolLM2) this replaced the vdpbf16ps dot products and their
// shuffle-tree sums, half of the kernel's arithmetic.
// Tiles: 0, 1 scores of keys 0-15 / 16-31; 2, 3 key rows (alternating); 4-7 the query chunks
// of 32 dims (head_dim 64: see attention_tile_config). (Tile numbers are literals: gcc's AMX
// intrinsics are macros.)
constexpr int64_t kAmxAttnMaxRows = 16;

// SPECSERVE_NO_AMX is read once, at the first attention call (layers/linear.py reads it when it
// packs the weights).
bool attention_amx_enabled() {
  static const bool on = [] {
    const char* off = std::getenv("SPECSERVE_NO_AMX");
    return amx_permitted() && (off == nullptr || off[0] == '\0' || std::strcmp(off, "0") == 0);
  }();
  return on;
}

// Tiles 0-3 as above; 4-7 for head_dim 128 are the four query chunks, for head_dim 64 two query
// chunks (4, 5) and the second group's key rows (6, 7), so that both groups' products are in
// flight together.
const TileConfig& attention_tile_config(int64_t rows, int nc) {
  static const auto configs = [] {
    std::array<std::array<TileConfig, kAmxAttnMaxRows + 1>, 2> c{};
    for (int wide = 0; wide < 2; ++wide)
      for (int r = 1; r <= kAmxAttnMaxRows; ++r)
        for (int t = 0; t < 8; ++t) {
          const bool keys = t == 2 || t == 3 || (!wide && (t == 6 || t == 7));
          c[wide][r].rows[t] = 16;
          c[wide][r].colsb[t] = keys ? 64 : 4 * r;
        }
    return c;
  }();
  return configs[nc == 8][rows];
}

// qt[c][p][r][e] = q[r][32 c + 2 p + e]: rows r < R of bf16 q (D apart) as B operands.
inline void pack_queries(const uint16_t* q, int64_t R, int64_t D, uint16_t* qt) {
  for (int64_t c = 0; c < D / 32; ++c)
    for (int64_t pr = 0; pr < 16; ++pr)
      for (int64_t r = 0; r < R; ++r) {
        qt[((c * 16 + pr) * R + r) * 2] = q[r * D + 32 * c + 2 * pr];
        qt[((c * 16 + pr) * R + r) * 2 + 1] = q[r * D + 32 * c + 2 * pr + 1];
      }
}

// sbuf[r][j] = scale * q_r . k_j for the n keys of a tile (16 at a time; a group's rows past n
// are slots of the same block, computed and then masked by the caller). k0 / k1: the first key
// row of each group of 16, slot_bytes apart.
template <int NC>
inline void amx_scores(const uint16_t* qt, int64_t R, const uint16_t* k0, const uint16_t* k1,
                       int64_t slot_bytes, int n, float scale, float* st, float* sbuf) {
  static_assert(NC == 4 || NC == 8, "AMX scores: head_dim 64 or 128");
  const int64_t qstride = 4 * R;
  const int64_t chunk = 16 * R * 2;  // bf16 elements of one query chunk
  _tile_loadd(4, qt, qstride);
  _tile_loadd(5, qt + chunk, qstride);
  if constexpr (NC == 8) {
    _tile_loadd(6, qt + 2 * chunk, qstride);
    _tile_loadd(7, qt + 3 * chunk, qstride);
  }
  const bool two = n > 16;
  if constexpr (NC == 4) {
    _tile_zero(0);
    _tile_loadd(2, k0, slot_bytes);
    if (two) {
      _tile_zero(1);
      _tile_loadd(6, k1, slot_bytes);
    }
    _tile_dpbf16ps(0, 2, 4);
    _tile_loadd(3, k0 + 32, slot_bytes);
    if (two) {
      _tile_dpbf16ps(1, 6, 4);
      _tile_loadd(7, k1 + 32, slot_bytes);
    }
    _tile_dpbf16ps(0, 3, 5);
    if (two) _tile_dpbf16ps(1, 7, 5);
  } else {
    _tile_zero(0);
    _tile_loadd(2, k0, slot_bytes);
    _tile_dpbf16ps(0, 2, 4);
    _tile_loadd(3, k0 + 32, slot_bytes);
    _tile_dpbf16ps(0, 3, 5);
    _tile_loadd(2, k0 + 64, slot_bytes);
    _tile_dpbf16ps(0, 2, 6);
    _tile_loadd(3, k0 + 96, slot_bytes);
    _tile_dpbf16ps(0, 3, 7);
    if (two) {
      _tile_zero(1);
      _tile_loadd(2, k1, slot_bytes);
      _tile_dpbf16ps(1, 2, 4);
      _tile_loadd(3, k1 + 32, slot_bytes);
      _tile_dpbf16ps(1, 3, 5);
      _tile_loadd(2, k1 + 64, slot_bytes);
      _tile_dpbf16ps(1, 2, 6);
      _tile_loadd(3, k1 + 96, slot_bytes);
      _tile_dpbf16ps(1, 3, 7);
    }
  }
  _tile_stored(0, st, 64);
  if (two) _tile_stored(1, st + 256, 64);
  // st[j][r] (16 floats per key) -> sbuf[r][j]: one gather per row and group.
  const __m512i idx = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(16));
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < R; ++r) {
    float* sr = sbuf + r * TILE;
    _mm512_storeu_ps(sr, _mm512_mul_ps(_mm512_i32gather_ps(idx, st + r, 4), sc));
    if (n > 16)
      _mm512_storeu_ps(sr + 16, _mm512_mul_ps(_mm512_i32gather_ps(idx, st + 256 + r, 4), sc));
  }
}
#endif

template <int NC, typename S>
inline void widen_row(const S* src, float* dst, int64_t D) {
  if constexpr (NC > 0) {
    for (int c = 0; c < NC; ++c) store16(dst + 16 * c, load16(src + 16 * c));
  } else {
    for (int64_t d = 0; d < D; ++d) dst[d] = bf16_bits_to_f32(src[d]);
  }
}

// 8-bit KV pools: int8 values or fp8 e4m3 bytes with one bf16 scale per (slot, KV head);
// a row is widened to fp32 and scaled once per tile, then used like a widened bf16 row.
inline void widen_scaled(const int8_t* __restrict src, float scale, float* __restrict dst,
                         int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(src[d]) * scale;
}
// fp8 e4m3fn bytes by bit moves that vectorise (a 256-entry table lookup became a gather and
// made fp8 pools ~20% slower than int8 at batch 32): the 7 magnitude bits shifted into an fp32's
// exponent and mantissa give 2^-120 times the value, subnormals included (they land on fp32
// subnormals, which the multiply by 2^120 makes exact normals again); the sign moves to bit 31.
// Codes 0x7f / 0xff (NaN) read as +-480: the writer never produces them (it saturates at 448).
// One multiply by scale * 2^120 is exact (3 + 8 significant bits). From a scale of 2^8 up
// (values past ~115k) that factor overflows fp32, and -fassociative-math let gcc form it from
// f * 2^120 * scale as well: such rows read as inf. They take the multiply in double.
inline float fp8_bits_scaled(uint32_t b, float s) {
  const uint32_t bits = ((b & 0x7fu) << 20) | ((b & 0x80u) << 24);
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f * s;
}
inline void widen_scaled(const uint8_t* __restrict src, float scale, float* __restrict dst,
                         int64_t D) {
  if (scale < 0x1p7f) {
    const float s = scale * 0x1p120f;
    for (int64_t d = 0; d < D; ++d) dst[d] = fp8_bits_scaled(src[d], s);
  } else {
    const double s = static_cast<double>(scale) * 0x1p120;
    for (int64_t d = 0; d < D; ++d) {
      const double f = fp8_bits_scaled(src[d], 1.0f);
      dst[d] = static_cast<float>(f * s);
    }
  }
}

// acc[r0 .. r0+NR) = acc * alpha + P V over the n keys of a tile (head_dim 16 * NC), V read in
// place (bf16 widened in registers). NR rows at once share each V load; with few accumulators,
// even and odd keys go to separate sets so that the FMA latency is hidden.
template <int NC, int NR, typename S>
inline void pv_block(float* __restrict acc, const float* __restrict sbuf,
                     const float* __restrict alpha, int64_t r0, int n, const S* const* vrow) {
  constexpr int D = 16 * NC;
  constexpr int NA = NR * NC <= 8 ? 2 : 1;
  v16f a[NA][NR][NC];
  for (int i = 0; i < NR; ++i) {
    const v16f al = splat(alpha[r0 + i]);
    for (int c = 0; c < NC; ++c) {
      a[0][i][c] = load16(acc + (r0 + i) * D + 16 * c) * al;
      if constexpr (NA == 2) a[1][i][c] = v16f{};
    }
  }
  const float* p = sbuf + r0 * TILE;
  int j = 0;
  for (; j + NA <= n; j += NA) {
    for (int u = 0; u < NA; ++u) {
      const S* v = vrow[j + u];
      for (int c = 0; c < NC; ++c) {
        const v16f vv = load16(v + 16 * c);
        for (int i = 0; i < NR; ++i) a[u][i][c] += splat(p[i * TILE + j + u]) * vv;
      }
    }
  }
  for (; j < n; ++j) {
    const S* v = vrow[j];
    for (int c = 0; c < NC; ++c) {
      const v16f vv = load16(v + 16 * c);
      for (int i = 0; i < NR; ++i) a[0][i][c] += splat(p[i * TILE + j]) * vv;
    }
  }
  for (int i = 0; i < NR; ++i)
    for (int c = 0; c < NC; ++c) {
      v16f x = a[0][i][c];
      if constexpr (NA == 2) x += a[1][i][c];
      store16(acc + (r0 + i) * D + 16 * c, x);
    }
}

// All R rows of a head: pv_block over blocks of rows sharing each V load (16 accumulator
// registers), then the remainder. V: the rows' element type (bf16 / fp32 in place, or fp32
// widened from an 8-bit pool).
template <int NC, typename V>
inline void pv_rows(float* __restrict acc, const float* __restrict sbuf,
                    const float* __restrict alpha, int64_t R, int n, const V* const* vr) {
  constexpr int RB = NC <= 4 ? 4 : 2;
  int64_t r = 0;
  for (; r + RB <= R; r += RB) pv_block<NC, RB>(acc, sbuf, alpha, r, n, vr);
  if (R - r == 1) pv_block<NC, 1>(acc, sbuf, alpha, r, n, vr);
  if constexpr (RB > 2) {
    if (R - r == 2) pv_block<NC, 2>(acc, sbuf, alpha, r, n, vr);
    if (R - r == 3) pv_block<NC, 3>(acc, sbuf, alpha, r, n, vr);
  }
}

static_assert(TILE == 32, "hmax_tile and the 16-key score groups assume 32-key tiles");
inline float hmax_tile(const float* s) {  // max of TILE (= 32) floats
  v16f m = vmax(load16(s), load16(s + 16));
  m = vmax(m, __builtin_shufflevector(m, m, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6,
                                      7));
  m = vmax(m, __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10,
                                      11));
  m = vmax(m, __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12,
                                      13));
  m = vmax(m, __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15,
                                      14));
  return m[0];
}

// Scores of keys a row may not see (causal: positions >= lim; a short tile's padding) -> -inf.
inline void mask_past(float* sr, int32_t lim, int64_t j0, int n) {
  const int valid = static_cast<int>(std::clamp<int64_t>(lim - j0, 0, n));
  for (int j = valid; j < TILE; ++j) sr[j] = -std::numeric_limits<float>::infinity();
}

// Online softmax over a tile's scores (log2 units): each row of sbuf becomes its probabilities
// against the running max; alpha[r] is the factor that rescales row r's earlier sums.
inline void online_softmax(float* __restrict sbuf, int64_t R, float* __restrict mrow,
                           float* __restrict lrow, float* __restrict alpha) {
  for (int64_t r = 0; r < R; ++r) {
    float* __restrict sr = sbuf + r * TILE;
    const float mx = std::max(mrow[r], hmax_tile(sr));
    if (mx == -std::numeric_limits<float>::infinity()) {  // nothing visible yet
      for (int j = 0; j < TILE; ++j) sr[j] = 0.0f;
      alpha[r] = 1.0f;
      continue;
    }
    float sum = 0.0f;
    for (int j = 0; j < TILE; ++j) {
      const float e = exp2_neg(sr[j] - mx);
      sr[j] = e;
      sum += e;
    }
    alpha[r] = mx != mrow[r] ? exp2_neg(mrow[r] - mx) : 1.0f;
    lrow[r] = lrow[r] * alpha[r] + sum;
    mrow[r] = mx;
  }
}

struct Run {        // consecutive query tokens of one sequence
  int32_t t0;       // first token
  int32_t m;        // number of tokens
  int32_t seq;      // row of block_tables
  int32_t max_len;  // max over the run of (token_pos + 1)
};

struct Item {       // one unit of parallel work: all heads of a run over a key range
  int32_t run;
  int32_t part;
  int32_t k0, k1;   // key range [k0, k1)
  int64_t cost;
};

struct Params {
  const void* q;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;
  const int32_t* token_pos;
  const uint16_t* k_scale;  // [num_slots, KVH] bf16 bits (8-bit pools only)
  const uint16_t* v_scale;
  void* out;           // [T, H, D] in q's dtype (used when there is a single partition)
  float* part_out;     // [T, H, P, D] fp32 (partial numerators, already divided by l)
  float* part_ml;      // [T, H, P, 2]: (max, sum) in log2 units
  int64_t num_heads, num_kv_heads, group, head_dim;
  int64_t max_blocks, block_size, num_parts;
  float qscale;        // scale * log2(e)
  bool amx;            // Q.K^T on AMX tiles where a run has at most 16 rows per KV head
};

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  using storage = float;
  static inline float load(float x) { return x; }
  static inline float store(float x) { return x; }
};
template <>
struct Elem<c10::BFloat16> {
  using storage = uint16_t;
  static inline float load(uint16_t x) { return bf16_bits_to_f32(x); }
  static inline uint16_t store(float x) { return f32_to_bf16_rne(x); }
};

// Per-thread scratch. Rows: r = kvh * RG + i * G + g for query head kvh * G + g of the run's
// token i (RG = tokens * G rows per KV head).
struct Scratch {
  std::vector<float> q;      // [R, D] query rows, scaled by scale * log2(e)
  std::vector<uint16_t> qb;  // [R, D] bf16 query rows as given (vdpbf16ps path)
  std::vector<float> acc;    // [R, D] unnormalised outputs
  std::vector<float> s;      // [R, TILE] scores / probabilities of the current tile
  std::vector<float> m, l, alpha;  // [R] running max, running sum, rescale of this tile
  std::vector<int32_t> lim;  // [R] number of keys the row may see (token_pos + 1)
  std::vector<float> kbuf, vbuf;   // [TILE, D] widened bf16 rows
  std::vector<const float*> krow;  // [TILE] (bf16 rows, type-punned, on the vdpbf16ps path)
  std::vector<const void*> vrow;   // [TILE]
  std::vector<int64_t> slot;  // [TILE] element offsets of the tile's slots (all KV heads of a
                              // slot are adjacent)
  std::vector<float> zero;  // [D] zeros (padding rows of a short tile)
  std::vector<uint16_t> qt;  // [KVH, D / 32, 16, RG, 2] queries as AMX B operands (amx_scores)
  std::vector<float> st;     // [2, 16, 16] AMX scores of a tile, keys x rows
  std::vector<uint16_t> kt;  // [2, D / 32, 16, 16, 2] a tile's keys as B operands (amx_rows_head)
  std::vector<uint16_t> vv;  // [D / 16, 16, 16, 2] a tile's values as B operands
  std::vector<uint16_t> pa;  // [2, 16, TILE] probabilities as A operands: bf16 and remainder
  std::vector<float> pv;     // [16, D] P V of one block of rows
  uint64_t touched = 0;      // touch_slots' words (kept so that its loads are not dropped)
};

#if defined(SPECSERVE_AMX) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define SPECSERVE_AMX_ROWS 1
#endif
#ifdef SPECSERVE_AMX_ROWS
// Runs with more than 16 rows per KV head (prefill chunks; long verifications) on AMX tiles,
// row-major: S = Q K^T and O += P V, 16 rows at a time. The query rows are A operands read in
// place; each tile's keys and values are re-laid once per KV head as B operands (K^T pairs of
// dims, V pairs of keys) and shared by all the head's rows, which is what makes this pay only
// for many rows (at decode, amx_scores' K Q^T needs no re-layout). P goes in as two bf16 parts,
// its rounding and the remainder, so P V keeps ~16 bits of P (2^-17 relative), as the fp32 paths
// do to within their tolerance, instead of bf16's 8 bits.
const TileConfig& rows_tile_config() {  // every tile 16 rows x 64 bytes
  static const TileConfig c = [] {
    TileConfig t{};
    for (int i = 0; i < 8; ++i) {
      t.rows[i] = 16;
      t.colsb[i] = 64;
    }
    return t;
  }();
  return c;
}

// Transpose 16 x 16 32-bit words in registers (row i of the input -> column i of the output).
inline void transpose16x16_epi32(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + k], lane l: column 4 l + k of rows i .. i + 3
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {  // a 4 x 4 transpose of 128-bit lanes
    const __m512i a = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44);
    const __m512i b = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xee);
    const __m512i c = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
    const __m512i d = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xee);
    r[k] = _mm512_shuffle_i32x4(a, c, 0x88);
    r[4 + k] = _mm512_shuffle_i32x4(a, c, 0xdd);
    r[8 + k] = _mm512_shuffle_i32x4(b, d, 0x88);
    r[12 + k] = _mm512_shuffle_i32x4(b, d, 0xdd);
  }
}

// kt[g][c][p][j] = the dims 32 c + 2 p, + 1 of key 16 g + j (a 32-bit word); keys past n are 0.
template <int NC>
inline void pack_keys(const uint16_t* kc, const int64_t* slot, int64_t head_off, int n,
                      uint16_t* kt) {
  constexpr int CH = NC / 2;  // 32-dim chunks
  for (int g = 0; g < (n > 16 ? 2 : 1); ++g)
    for (int c = 0; c < CH; ++c) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j)
        r[j] = 16 * g + j < n ? _mm512_loadu_si512(kc + slot[16 * g + j] + head_off + 32 * c)
                              : _mm512_setzero_si512();
      transpose16x16_epi32(r);
      uint16_t* dst = kt + (g * CH + c) * 512;
      for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + 32 * p, r[p]);
    }
}

// vv[c][p][d] = (V[2 p][16 c + d], V[2 p + 1][16 c + d]) for the tile's keys; keys past n are 0
// (their probabilities are 0, but a NaN slot times 0 would still be NaN).
template <int NC>
inline void pack_values(const uint16_t* vc, const int64_t* slot, int64_t head_off, int n,
                        uint16_t* vv) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                      8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int p = 0; p < 16; ++p) {
    const uint16_t* a = 2 * p < n ? vc + slot[2 * p] + head_off : nullptr;
    const uint16_t* b = 2 * p + 1 < n ? vc + slot[2 * p + 1] + head_off : nullptr;
    for (int h = 0; h < NC / 2; ++h) {
      const __m512i va = a ? _mm512_loadu_si512(a + 32 * h) : _mm512_setzero_si512();
      const __m512i vb = b ? _mm512_loadu_si512(b + 32 * h) : _mm512_setzero_si512();
      _mm512_storeu_si512(vv + (2 * h) * 512 + 32 * p, _mm512_permutex2var_epi16(va, lo, vb));
      _mm512_storeu_si512(vv + (2 * h + 1) * 512 + 32 * p, _mm512_permutex2var_epi16(va, hi, vb));
    }
  }
}

// One KV head of one tile for R > 16 rows (see above): scores into sbuf (which, like qb, has
// 16 rows of slack past the last head: a block's tile loads and stores always cover 16 rows),
// the shared online softmax, then acc = acc * alpha + P V.
template <int NC>
inline void amx_rows_head(Scratch& sc, const uint16_t* kc, const uint16_t* vc, int64_t head_off,
                          int64_t j0, int n, int64_t R, const uint16_t* qb, float qscale,
                          float* __restrict acc, float* __restrict sbuf, float* __restrict mrow,
                          float* __restrict lrow, float* __restrict alpha,
                          const int32_t* __restrict lim) {
  constexpr int D = 16 * NC, CH = NC / 2;
  uint16_t* kt = sc.kt.data();
  uint16_t* vv = sc.vv.data();
  pack_keys<NC>(kc, sc.slot.data(), head_off, n, kt);
  pack_values<NC>(vc, sc.slot.data(), head_off, n, vv);
  const bool two = n > 16;
  for (int64_t r0 = 0; r0 < R; r0 += 16) {
    _tile_zero(0);
    if (two) _tile_zero(1);
    for (int c = 0; c < CH; ++c) {
      _tile_loadd(2, qb + r0 * D + 32 * c, D * 2);
      _tile_loadd(4, kt + c * 512, 64);
      _tile_dpbf16ps(0, 2, 4);
      if (two) {
        _tile_loadd(5, kt + (CH + c) * 512, 64);
        _tile_dpbf16ps(1, 2, 5);
      }
    }
    _tile_stored(0, sbuf + r0 * TILE, TILE * 4);
    if (two) _tile_stored(1, sbuf + r0 * TILE + 16, TILE * 4);
  }
  const v16f sc16 = splat(qscale);
  for (int64_t r = 0; r < R; ++r) {
    float* sr = sbuf + r * TILE;
    store16(sr, load16(sr) * sc16);
    if (two) store16(sr + 16, load16(sr + 16) * sc16);
    mask_past(sr, lim[r], j0, n);
  }
  online_softmax(sbuf, R, mrow, lrow, alpha);
  uint16_t* phi = sc.pa.data();
  uint16_t* plo = phi + 16 * TILE;
  float* pv = sc.pv.data();
  for (int64_t r0 = 0; r0 < R; r0 += 16) {
    const int64_t rows = std::min<int64_t>(16, R - r0);
    for (int64_t i = 0; i < 16; ++i) {
      if (i >= rows) {
        _mm512_storeu_si512(phi + i * TILE, _mm512_setzero_si512());
        _mm512_storeu_si512(plo + i * TILE, _mm512_setzero_si512());
        continue;
      }
      const float* sr = sbuf + (r0 + i) * TILE;
      const __m512 p0 = _mm512_loadu_ps(sr), p1 = _mm512_loadu_ps(sr + 16);
      const __m512bh h = _mm512_cvtne2ps_pbh(p1, p0);
      const __m512i hb = reinterpret_cast<__m512i>(h);
      const __m512 h0 = _mm512_cvtpbh_ps(reinterpret_cast<__m256bh>(_mm512_castsi512_si256(hb)));
      const __m512 h1 =
          _mm512_cvtpbh_ps(reinterpret_cast<__m256bh>(_mm512_extracti64x4_epi64(hb, 1)));
      _mm512_storeu_si512(phi + i * TILE, hb);
      _mm512_storeu_si512(plo + i * TILE, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(
                                              _mm512_sub_ps(p1, h1), _mm512_sub_ps(p0, h0))));
    }
    _tile_loadd(2, phi, TILE * 2);
    _tile_loadd(3, plo, TILE * 2);
    for (int h = 0; h < CH; ++h) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_loadd(4, vv + (2 * h) * 512, 64);
      _tile_loadd(5, vv + (2 * h + 1) * 512, 64);
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(1, 2, 5);
      _tile_dpbf16ps(0, 3, 4);
      _tile_dpbf16ps(1, 3, 5);
      _tile_stored(0, pv + 32 * h, D * 4);
      _tile_stored(1, pv + 32 * h + 16, D * 4);
    }
    for (int64_t i = 0; i < rows; ++i) {
      float* ar = acc + (r0 + i) * D;
      const v16f al = splat(alpha[r0 + i]);
      for (int c = 0; c < NC; ++c)
        store16(ar + 16 * c, load16(ar + 16 * c) * al + load16(pv + i * D + 16 * c));
    }
  }
}
#endif

// Whether a tile's scores come from the bf16 query rows as given (qb: vdpbf16ps, or AMX tiles
// on top of it) rather than from the scaled fp32 copy (q): bf16 pools and queries, head_dim a
// multiple of 32, a CPU with AVX512_BF16.
template <typename T, int NC, typename C>
constexpr bool bf16_scores() {
  return sizeof(C) == 2 && !std::is_same<T, float>::value && kHaveDpBf16 && NC > 0 &&
         NC % 2 == 0;
}

// One KV head of one tile: scores, online softmax, P V for that head's R rows.
// NC > 0: head_dim = 16 * NC with explicit 16-lane vectors; NC == 0: any head_dim, plain loops.
// C: the pool's element type (T's storage, or int8_t / uint8_t (fp8) for 8-bit pools, whose
// per-(slot, head) scales are ksc / vsc).
template <typename T, int NC, typename C>
inline void tile_head(Scratch& sc, const C* __restrict kc, const C* __restrict vc,
                      const uint16_t* __restrict ksc, const uint16_t* __restrict vsc,
                      int64_t head_off,
                      int64_t D, int64_t j0, int n, int64_t R, const float* __restrict qf,
                      const uint16_t* __restrict qb, float qscale, float* __restrict acc,
                      float* __restrict sbuf, float* __restrict mrow, float* __restrict lrow,
                      float* __restrict alpha, const int32_t* __restrict lim,
                      const uint16_t* __restrict qt, int64_t slot_elems) {
  using S = typename Elem<T>::storage;
  constexpr bool kQuant = sizeof(C) == 1;
  constexpr bool kWiden = !std::is_same<T, float>::value;
  constexpr bool kDp = bf16_scores<T, NC, C>();
  // qt (AMX, bf16 pools, see amx_scores): the scores come from tiles.
  bool scored = false;
#ifdef SPECSERVE_AMX
  if constexpr (kDp) {
    if (qt != nullptr) {
      amx_scores<NC>(qt, R, reinterpret_cast<const uint16_t*>(kc + sc.slot[0] + head_off),
                     reinterpret_cast<const uint16_t*>(kc + sc.slot[n > 16 ? 16 : 0] + head_off),
                     slot_elems * static_cast<int64_t>(sizeof(S)), n, qscale, sc.st.data(), sbuf);
      scored = true;
    }
  }
#endif
  // K rows: read in place (fp32; bf16 with vdpbf16ps) or widened to fp32 once, shared by all R
  // rows. A short tile's padding rows point at zeros.
  if (scored) {
    // AMX: the tile loads read the key rows in place.
  } else if constexpr (kDp) {
    const S** kr = reinterpret_cast<const S**>(sc.krow.data());
    for (int j = 0; j < n; ++j) kr[j] = kc + sc.slot[j] + head_off;
    for (int j = n; j < TILE; ++j) kr[j] = reinterpret_cast<const S*>(sc.zero.data());
  } else {
    for (int j = 0; j < n; ++j) {
      const int64_t e = sc.slot[j] + head_off;  // element offset; e / D = slot * KVH + head
      if constexpr (kQuant) {
        float* dst = sc.kbuf.data() + j * D;
        widen_scaled(kc + e, bf16_bits_to_f32(ksc[e / D]), dst, D);
        sc.krow[j] = dst;
      } else if constexpr (kWiden) {
        float* dst = sc.kbuf.data() + j * D;
        widen_row<NC>(kc + e, dst, D);
        sc.krow[j] = dst;
      } else {
        sc.krow[j] = kc + e;
      }
    }
    for (int j = n; j < TILE; ++j) sc.krow[j] = sc.zero.data();
  }
  // Scores (log2 units); causally masked and padding entries -inf.
  for (int64_t r = 0; r < R; ++r) {
    float* __restrict sr = sbuf + r * TILE;
    if (scored) {
      // AMX: amx_scores wrote them.
    } else if constexpr (kDp) {
#if defined(__AVX512BF16__)
      __m512bh qv[NC / 2];
      for (int c = 0; c < NC / 2; ++c)
        qv[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(qb + r * D + 32 * c));
      const v16f sc16 = splat(qscale);
      const uint16_t* const* kr = reinterpret_cast<const uint16_t* const*>(sc.krow.data());
      for (int j = 0; j < n; j += 16) store16(sr + j, dot16_bf16<NC>(qv, kr + j) * sc16);
#endif
    } else if constexpr (NC > 0) {
      const float* __restrict qr = qf + r * D;
      v16f qv[NC];
      for (int c = 0; c < NC; ++c) qv[c] = load16(qr + 16 * c);
      for (int j = 0; j < n; j += 16) store16(sr + j, dot16<NC>(qv, sc.krow.data() + j));
    } else {
      const float* __restrict qr = qf + r * D;
      for (int j = 0; j < n; ++j) {
        const float* __restrict kr = sc.krow[j];
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
        sr[j] = dot;
      }
    }
    mask_past(sr, lim[r], j0, n);
  }
  online_softmax(sbuf, R, mrow, lrow, alpha);
  // acc = acc * alpha + P V.
  if constexpr (kQuant && NC > 0) {  // widened, scaled V rows, then the fp32 P V blocks
    const float** vr = reinterpret_cast<const float**>(sc.vrow.data());
    for (int j = 0; j < n; ++j) {
      const int64_t e = sc.slot[j] + head_off;
      float* dst = sc.vbuf.data() + j * D;
      widen_scaled(vc + e, bf16_bits_to_f32(vsc[e / D]), dst, D);
      vr[j] = dst;
    }
    pv_rows<NC>(acc, sbuf, alpha, R, n, vr);
  } else if constexpr (NC > 0) {
    const S** vr = reinterpret_cast<const S**>(sc.vrow.data());
    for (int j = 0; j < n; ++j) vr[j] = vc + sc.slot[j] + head_off;
    pv_rows<NC>(acc, sbuf, alpha, R, n, vr);
  } else {
    for (int j = 0; j < n; ++j) {
      const int64_t e = sc.slot[j] + head_off;
      if constexpr (kQuant) {
        float* dst = sc.vbuf.data() + j * D;
        widen_scaled(vc + e, bf16_bits_to_f32(vsc[e / D]), dst, D);
        sc.vrow[j] = dst;
      } else if constexpr (kWiden) {
        float* dst = sc.vbuf.data() + j * D;
        widen_row<NC>(vc + e, dst, D);
        sc.vrow[j] = dst;
      } else {
        sc.vrow[j] = vc + e;
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* __restrict pr = sbuf + r * TILE;
      float* __restrict ar = acc + r * D;
      if (alpha[r] != 1.0f)
        for (int64_t d = 0; d < D; ++d) ar[d] *= alpha[r];
      for (int j = 0; j < n; ++j) {
        const float pj = pr[j];
        const float* __restrict vrow = static_cast<const float*>(sc.vrow[j]);
        for (int64_t d = 0; d < D; ++d) ar[d] += pj * vrow[d];
      }
    }
  }
}

// Prefetch into L2 (T1) the K and V slots of keys [from, to) of the sequence whose block-table
// row is `table`: all KV heads of a slot are adjacent, slot_bytes each in K and in V.
template <typename C>
void prefetch_keys(const C* kc, const C* vc, const int32_t* table, int64_t bs,
                   int64_t slot_elems, int64_t from, int64_t to) {
  const int64_t slot_bytes = slot_elems * static_cast<int64_t>(sizeof(C));
  int64_t blk = from / bs, off = from % bs;
  for (int64_t pos = from; pos < to; ++pos) {
    const int64_t e = (static_cast<int64_t>(table[blk]) * bs + off) * slot_elems;
    const char* kp = reinterpret_cast<const char*>(kc + e);
    const char* vp = reinterpret_cast<const char*>(vc + e);
    for (int64_t b = 0; b < slot_bytes; b += 64) {
      __builtin_prefetch(kp + b, 0, 2);
      __builtin_prefetch(vp + b, 0, 2);
    }
    if (++off == bs) {
      off = 0;
      ++blk;
    }
  }
}

// Load one word of every cache line of the n slots' K and V, in address order, before the tile's
// arithmetic. Why: on the 2-core Xeon VM of session 26 a decode step's attention took the time
// of its arithmetic plus the time of its reads, software prefetch or not (docs/performance.md,
// "Decode attention on AMX tiles"), and the per-head passes read each slot's lines 128 bytes at
// a time. These plain loads are independent of each other, so the core keeps many misses in
// flight and the hardware prefetchers see whole blocks streamed: 30 layers' attention over 64
// sequences of 192 keys fell from ~25 to ~19 ms. The words are folded into the return value,
// which the caller stores in its thread's Scratch, so that the compiler keeps the loads.
template <typename C>
inline uint64_t touch_slots(const C* kc, const C* vc, const int64_t* slot, int n,
                            int64_t slot_elems) {
  const int64_t slot_bytes = slot_elems * static_cast<int64_t>(sizeof(C));
  uint64_t x = 0;
  for (int j = 0; j < n; ++j) {
    const char* kp = reinterpret_cast<const char*>(kc + slot[j]);
    const char* vp = reinterpret_cast<const char*>(vc + slot[j]);
    for (int64_t b = 0; b + 8 <= slot_bytes; b += 64) {  // never past the slot's last byte
      uint64_t wk, wv;
      std::memcpy(&wk, kp + b, sizeof(wk));
      std::memcpy(&wv, vp + b, sizeof(wv));
      x ^= wk ^ wv;
    }
  }
  return x;
}

// Prefetch an item's first `keys` keys. The thread calls it for the item it will run next
// before it runs the current one: an item used to start cold, its first tile waiting on DRAM,
// and at decode (one query per sequence, ~100-300 keys) that start is a large share of the item.
template <typename C>
void prefetch_item_start(const Params& p, const Run& run, const Item& it, int64_t keys) {
  const int64_t end = std::min<int64_t>({it.k1, static_cast<int64_t>(run.max_len), it.k0 + keys});
  prefetch_keys(static_cast<const C*>(p.k_cache), static_cast<const C*>(p.v_cache),
                p.block_tables + static_cast<int64_t>(run.seq) * p.max_blocks, p.block_size,
                p.num_kv_heads * p.head_dim, it.k0, end);
}

// One work item: all heads of a run of query tokens over the keys [it.k0, it.k1).
template <typename T, int NC, typename C>
void run_item(const Params& p, const Run& run, const Item& it, Scratch& sc) {
  using S = typename Elem<T>::storage;
  const int64_t D = NC > 0 ? 16 * NC : p.head_dim;
  const int64_t G = p.group, H = p.num_heads, KVH = p.num_kv_heads;
  const int64_t RG = static_cast<int64_t>(run.m) * G;  // rows per KV head
  const int64_t R = RG * KVH;

  float* __restrict qf = sc.q.data();
  uint16_t* __restrict qb = sc.qb.data();
  float* __restrict acc = sc.acc.data();
  float* __restrict sbuf = sc.s.data();
  float* __restrict mrow = sc.m.data();
  float* __restrict lrow = sc.l.data();
  float* __restrict alpha = sc.alpha.data();
  int32_t* __restrict lim = sc.lim.data();

  const S* __restrict qsrc = static_cast<const S*>(p.q);
  for (int64_t kvh = 0; kvh < KVH; ++kvh) {
    for (int64_t i = 0; i < run.m; ++i) {
      const int64_t t = run.t0 + i;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t r = kvh * RG + i * G + g;
        const S* src = qsrc + (t * H + kvh * G + g) * D;
        if constexpr (!bf16_scores<T, NC, C>()) {  // only the fp32 score paths read it
          float* dst = qf + r * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = Elem<T>::load(src[d]) * p.qscale;
        }
        if constexpr (!std::is_same<T, float>::value) std::memcpy(qb + r * D, src, D * sizeof(S));
        lim[r] = p.token_pos[t] + 1;
        mrow[r] = -std::numeric_limits<float>::infinity();
        lrow[r] = 0.0f;
      }
    }
  }
  std::fill(acc, acc + R * D, 0.0f);

  // AMX scores (bf16 pools, head_dim 64 / 128): queries as B operands, once per item; each KV
  // head's take as many elements as its rows of q (D / 32 chunks x 16 pairs x RG x 2).
  // More rows per KV head: amx_rows_head.
  const uint16_t* qt = nullptr;
  [[maybe_unused]] bool row_tiles = false;
#ifdef SPECSERVE_AMX
  if constexpr (std::is_same<T, c10::BFloat16>::value && sizeof(C) == 2 && (NC == 4 || NC == 8)) {
    if (p.amx && RG <= kAmxAttnMaxRows) {
      for (int64_t kvh = 0; kvh < KVH; ++kvh)
        pack_queries(qb + kvh * RG * D, RG, D, sc.qt.data() + kvh * RG * D);
      _tile_loadconfig(&attention_tile_config(RG, NC));
      qt = sc.qt.data();
    }
#ifdef SPECSERVE_AMX_ROWS
    else if (p.amx) {
      _tile_loadconfig(&rows_tile_config());
      row_tiles = true;
    }
#endif
  }
#endif

  const C* __restrict kc = static_cast<const C*>(p.k_cache);
  const C* __restrict vc = static_cast<const C*>(p.v_cache);
  const int32_t* table = p.block_tables + static_cast<int64_t>(run.seq) * p.max_blocks;
  const int64_t bs = p.block_size;
  const int64_t slot_elems = KVH * D;  // K (or V) of one slot, all KV heads: contiguous
  const int64_t kend = std::min<int64_t>(it.k1, run.max_len);

  // Element offsets of the slots of keys [j0, j0 + n) (one division per tile, not per key).
  auto fill_slots = [&](int64_t j0, int n, int64_t* out) {
    int64_t blk = j0 / bs, off = j0 % bs;
    for (int j = 0; j < n; ++j) {
      out[j] = (static_cast<int64_t>(table[blk]) * bs + off) * slot_elems;
      if (++off == bs) {
        off = 0;
        ++blk;
      }
    }
  };
  // Software prefetch of the slots PREFETCH_KEYS keys ahead of the tile being computed: a
  // sequence's blocks are scattered over the pool, out of reach of the hardware prefetchers.
  // Into L2, not L1: 64 keys ahead are 768 lines of K and V, far more than L1's miss buffers
  // hold, and prefetches to L1 waited on them (2-core Zen 4, 30 cold layers: 12-20% faster at
  // 32-64 sequences with T1 than with T0; no prefetch at all was 12-20% slower than T0).
  int64_t pf_pos = it.k0;
  auto prefetch_until = [&](int64_t end) {
    end = std::min(end, kend);
    if (pf_pos >= end) return;
    prefetch_keys(kc, vc, table, bs, slot_elems, pf_pos, end);
    pf_pos = end;
  };
  prefetch_until(it.k0 + PREFETCH_KEYS);
  for (int64_t j0 = it.k0; j0 < kend; j0 += TILE) {
    const int n = static_cast<int>(std::min<int64_t>(TILE, kend - j0));
    fill_slots(j0, n, sc.slot.data());
    prefetch_until(j0 + TILE + PREFETCH_KEYS);
    sc.touched ^= touch_slots(kc, vc, sc.slot.data(), n, slot_elems);
    for (int64_t kvh = 0; kvh < KVH; ++kvh) {
      const int64_t r0 = kvh * RG;
#ifdef SPECSERVE_AMX_ROWS
      if constexpr (std::is_same<T, c10::BFloat16>::value && sizeof(C) == 2 &&
                    (NC == 4 || NC == 8)) {
        if (row_tiles) {
          amx_rows_head<NC>(sc, kc, vc, kvh * D, j0, n, RG, qb + r0 * D, p.qscale, acc + r0 * D,
                            sbuf + r0 * TILE, mrow + r0, lrow + r0, alpha + r0, lim + r0);
          continue;
        }
      }
#endif
      tile_head<T, NC, C>(sc, kc, vc, p.k_scale, p.v_scale, kvh * D, D, j0, n, RG, qf + r0 * D, qb + r0 * D, p.qscale,
                       acc + r0 * D, sbuf + r0 * TILE, mrow + r0, lrow + r0, alpha + r0,
                       lim + r0, qt ? qt + r0 * D : nullptr, slot_elems);
    }
  }

  // Write back: normalised output (single partition) or partial state.
  for (int64_t kvh = 0; kvh < KVH; ++kvh) {
    for (int64_t i = 0; i < run.m; ++i) {
      const int64_t t = run.t0 + i;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t r = kvh * RG + i * G + g;
        const int64_t h = kvh * G + g;
        const float inv = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
        const float* ar = acc + r * D;
        if (p.num_parts == 1) {
          S* dst = static_cast<S*>(p.out) + (t * H + h) * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = Elem<T>::store(ar[d] * inv);
        } else {
          const int64_t idx = (t * H + h) * p.num_parts + it.part;
          float* dst = p.part_out + idx * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = ar[d] * inv;
          p.part_ml[idx * 2] = mrow[r];
          p.part_ml[idx * 2 + 1] = lrow[r];
        }
      }
    }
  }
}

template <typename T>
void merge_parts(const Params& p, int64_t num_tokens) {
  using S = typename Elem<T>::storage;
  const int64_t D = p.head_dim;
  const int64_t P = p.num_parts;
  at::parallel_for(0, num_tokens * p.num_heads, 16, [&](int64_t b, int64_t e) {
    std::vector<float> o(D);
    for (int64_t th = b; th < e; ++th) {
      const float* ml = p.part_ml + th * P * 2;
      float M = -std::numeric_limits<float>::infinity();
      for (int64_t q = 0; q < P; ++q) M = std::max(M, ml[q * 2]);
      std::fill(o.begin(), o.end(), 0.0f);
      float L = 0.0f;
      for (int64_t q = 0; q < P; ++q) {
        const float l = ml[q * 2 + 1];
        if (l == 0.0f) continue;  // partition beyond this token's context
        const float w = exp2_neg(ml[q * 2] - M) * l;
        L += w;
        const float* src = p.part_out + (th * P + q) * D;
        for (int64_t d = 0; d < D; ++d) o[d] += w * src[d];
      }
      const float inv = L > 0.0f ? 1.0f / L : 0.0f;
      S* dst = static_cast<S*>(p.out) + th * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = Elem<T>::store(o[d] * inv);
    }
  });
}

template <typename T, int NC, typename C>
void launch(const Params& p, const std::vector<Run>& runs, const std::vector<Item>& items,
            int64_t num_tokens) {
  const int64_t D = p.head_dim;
  int32_t max_m = 1;
  for (const Run& r : runs) max_m = std::max(max_m, r.m);
  const int64_t max_rows = static_cast<int64_t>(max_m) * p.num_heads;
  std::atomic<int64_t> next{0};
  const int64_t n_items = static_cast<int64_t>(items.size());
  const int64_t n_tasks = std::min<int64_t>(at::get_num_threads(), n_items);
  at::parallel_for(0, n_tasks, 1, [&](int64_t, int64_t) {
    // Scratch lives as long as the (persistent) pool thread and only grows.
    thread_local Scratch sc;
    auto grow = [](auto& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    };
    grow(sc.q, max_rows * D);
    grow(sc.qb, (max_rows + 16) * D);  // slack: amx_rows_head's tiles cover 16 rows
    grow(sc.acc, max_rows * D);
    grow(sc.s, (max_rows + 16) * TILE);
    grow(sc.m, max_rows);
    grow(sc.l, max_rows);
    grow(sc.lim, max_rows);
    grow(sc.alpha, max_rows);
    grow(sc.zero, D);  // value-initialised: zeros, never written
    grow(sc.kbuf, TILE * D);
    grow(sc.vbuf, TILE * D);
    grow(sc.krow, TILE);
    grow(sc.vrow, TILE);
    grow(sc.slot, TILE);
    if (p.amx) {
      grow(sc.qt, max_rows * D);
      grow(sc.st, 2 * 16 * 16);
      grow(sc.kt, 2 * 16 * D);
      grow(sc.vv, 32 * D);
      grow(sc.pa, 2 * 16 * TILE);
      grow(sc.pv, 16 * D);
    }
    // With many items, claim the next one ahead so that its first keys load while this one
    // computes (holding one item back costs at most the smallest items' balance at the end);
    // with few, a claimed-ahead item could leave a thread idle.
    const bool ahead = n_items >= 4 * n_tasks;
    int64_t i = next.fetch_add(1, std::memory_order_relaxed);
    while (i < n_items) {
      const int64_t following = ahead ? next.fetch_add(1, std::memory_order_relaxed) : n_items;
      if (following < n_items) {
        const Item& nx = items[following];
        prefetch_item_start<C>(p, runs[nx.run], nx, PREFETCH_KEYS);
      }
      const Item& it = items[i];
      run_item<T, NC, C>(p, runs[it.run], it, sc);
      i = ahead ? following : next.fetch_add(1, std::memory_order_relaxed);
    }
#ifdef SPECSERVE_AMX
    if (p.amx) _tile_release();  // hand the tile state back (the OS then need not save it)
#endif
  });
  if (p.num_parts > 1) merge_parts<T>(p, num_tokens);
}

template <typename T, typename C>
void dispatch_dim(const Params& p, const std::vector<Run>& runs, const std::vector<Item>& items,
                  int64_t num_tokens) {
  switch (p.head_dim) {
    case 64: launch<T, 4, C>(p, runs, items, num_tokens); break;
    case 128: launch<T, 8, C>(p, runs, items, num_tokens); break;
    default: launch<T, 0, C>(p, runs, items, num_tokens); break;
  }
}

// The pool's element type: q's own (kv_format 0), int8 (1) or fp8 e4m3 bytes (2).
template <typename T>
void dispatch_kv(const Params& p, int64_t kv_format, const std::vector<Run>& runs,
                 const std::vector<Item>& items, int64_t num_tokens) {
  if (kv_format == 1) {
    dispatch_dim<T, int8_t>(p, runs, items, num_tokens);
  } else if (kv_format == 2) {
    dispatch_dim<T, uint8_t>(p, runs, items, num_tokens);
  } else {
    dispatch_dim<T, typename Elem<T>::storage>(p, runs, items, num_tokens);
  }
}

}  // namespace

// The checks every kernel that reads or writes a KV pool shares (also used by fused_ops.cpp and
// layer_loop.cpp, built into the same translation unit): the pools' element type for kv_format
// (0: the model dtype, 1: int8, 2: fp8 e4m3 bytes as uint8) and, for 8-bit pools, one contiguous
// bf16 scale per (slot, KV head). k_cache must be at least 2-D.
void check_kv_pool(const char* fn, at::ScalarType model_dtype, const at::Tensor& k_cache,
                   const at::Tensor& v_cache, const at::Tensor& k_scale,
                   const at::Tensor& v_scale, int64_t kv_format) {
  TORCH_CHECK(kv_format >= 0 && kv_format <= 2, fn, ": kv_format must be 0, 1 or 2");
  const at::ScalarType pool = kv_format == 0   ? model_dtype
                              : kv_format == 1 ? at::kChar
                                               : at::kByte;
  TORCH_CHECK(k_cache.scalar_type() == pool && v_cache.scalar_type() == pool, fn, ": ",
              kv_format == 0 ? "k_cache / v_cache must have the model's dtype (8-bit pools: "
                               "kv_format 1 for int8, 2 for fp8 bytes)"
                             : "8-bit k_cache / v_cache must be int8 (kv_format 1) or uint8 "
                               "fp8 bytes (kv_format 2)");
  if (kv_format != 0) {
    TORCH_CHECK(k_scale.scalar_type() == at::kBFloat16 && v_scale.scalar_type() == at::kBFloat16 &&
                    k_scale.is_contiguous() && v_scale.is_contiguous() &&
                    k_scale.numel() == k_cache.size(0) * k_cache.size(1) &&
                    v_scale.numel() == k_scale.numel(),
                fn, ": 8-bit pools need contiguous bf16 k_scale / v_scale, one per (slot, KV "
                "head)");
  }
}

// q [T, H, D]; k_cache, v_cache [num_slots, KVH, D]; block_tables [B, max_blocks] int32;
// token_seq, token_pos [T] int32. Returns [T, H * D] in q's dtype.
// max_parts: upper bound on key partitions per run (0: choose automatically, 1: never split).
// kv_format 0: the pools have q's dtype (k_scale / v_scale unused, may be empty); 1: int8 pools,
// 2: fp8 e4m3 pools stored as uint8; then k_scale / v_scale are [num_slots, KVH(, 1)] bf16 and
// a cached value is value * scale.
// The kernel without the GIL handling (the decoder layer loop calls it with the GIL released).
at::Tensor paged_attention_impl(const at::Tensor& q, const at::Tensor& k_cache,
                                const at::Tensor& v_cache, const at::Tensor& block_tables,
                                const at::Tensor& token_seq, const at::Tensor& token_pos,
                                int64_t block_size, double scale, int64_t max_parts,
                                const at::Tensor& k_scale, const at::Tensor& v_scale,
                                int64_t kv_format) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3,
              "q, k_cache, v_cache must be 3-D");
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu(),
              "CPU tensors only");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16,
              "q must be float32 or bfloat16");
  check_kv_pool("paged_attention_short", q.scalar_type(), k_cache, v_cache, k_scale, v_scale,
                kv_format);
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "q, k_cache, v_cache must be contiguous");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache shapes differ");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && token_seq.scalar_type() == at::kInt &&
                  token_pos.scalar_type() == at::kInt,
              "block_tables, token_seq, token_pos must be int32");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.is_contiguous(),
              "block_tables must be a contiguous [num_seqs, max_blocks] tensor");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KVH = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == D, "head_dim mismatch between q and the cache");
  TORCH_CHECK(KVH > 0 && H % KVH == 0, "num_heads must be a multiple of num_kv_heads");
  // An empty head would configure AMX tiles of no rows (SIGILL) or divide by D in the 8-bit
  // readers.
  TORCH_CHECK(H > 0 && D > 0, "num_heads and head_dim must be positive");
  TORCH_CHECK(token_seq.numel() == T && token_pos.numel() == T,
              "token_seq / token_pos must have one entry per query token");
  TORCH_CHECK(block_size > 0, "block_size must be positive");
  auto tseq = token_seq.contiguous();
  auto tpos = token_pos.contiguous();
  auto out = at::empty({T, H, D}, q.options());
  if (T == 0) return out.view({T, H * D});

  const int64_t B = block_tables.size(0), MB = block_tables.size(1);
  const int64_t num_slots = k_cache.size(0);
  const int32_t* seq_p = tseq.data_ptr<int32_t>();
  const int32_t* pos_p = tpos.data_ptr<int32_t>();
  const int32_t* bt = block_tables.data_ptr<int32_t>();

  bool amx = false;
#ifdef SPECSERVE_AMX
  amx = kv_format == 0 && q.scalar_type() == at::kBFloat16 && block_size % 16 == 0 &&
        attention_amx_enabled();
#endif
  // Runs of consecutive tokens of one sequence; validate every block they will read. Runs on
  // amx_rows_head are longer: each tile's keys and values are re-laid once per run.
  int64_t max_run = MAX_RUN_TOKENS;
#ifdef SPECSERVE_AMX_ROWS
  if (amx && (D == 64 || D == 128)) max_run = MAX_ROW_TILE_RUN_TOKENS;
#endif
  std::vector<Run> runs;
  int64_t max_len = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = seq_p[t];
    const int64_t len = static_cast<int64_t>(pos_p[t]) + 1;
    TORCH_CHECK(s >= 0 && s < B, "token_seq out of range");
    TORCH_CHECK(len >= 1 && len <= MB * block_size, "token_pos out of range of the block table");
    if (!runs.empty() && runs.back().seq == s && runs.back().m < max_run) {
      runs.back().m += 1;
      runs.back().max_len = std::max<int32_t>(runs.back().max_len, static_cast<int32_t>(len));
    } else {
      runs.push_back(Run{static_cast<int32_t>(t), 1, s, static_cast<int32_t>(len)});
    }
    max_len = std::max(max_len, len);
  }
  for (const Run& r : runs) {
    const int64_t nb = (r.max_len + block_size - 1) / block_size;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t blk = bt[r.seq * MB + b];
      TORCH_CHECK(blk >= 0 && (blk + 1) * block_size <= num_slots,
                  "block table entry out of range of the cache");
    }
  }

  // Key partitions: split only when there are too few runs for the threads.
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t base_items = static_cast<int64_t>(runs.size());
  int64_t part_len = max_len;
  if (max_parts != 1 && threads > 1 && base_items < 4 * threads && max_len >= 2 * MIN_PART_KEYS) {
    int64_t want = (4 * threads + base_items - 1) / base_items;
    want = std::min(want, max_len / MIN_PART_KEYS);
    if (max_parts > 1) want = std::min(want, max_parts);
    if (want > 1) {
      part_len = (max_len + want - 1) / want;
      part_len = (part_len + TILE - 1) / TILE * TILE;
    }
  }
  const int64_t P = (max_len + part_len - 1) / part_len;

  std::vector<Item> items;
  items.reserve(base_items * P);
  for (int32_t ri = 0; ri < static_cast<int32_t>(runs.size()); ++ri) {
    const Run& r = runs[ri];
    for (int64_t pi = 0; pi < P; ++pi) {
      const int64_t k0 = pi * part_len;
      const int64_t k1 = std::max(k0, std::min<int64_t>(k0 + part_len, r.max_len));
      // Empty partitions still run (they record l = 0) so that every partial slot is written.
      const int64_t cost = (k1 - k0) * r.m + 16;
      items.push_back(Item{ri, static_cast<int32_t>(pi), static_cast<int32_t>(k0),
                           static_cast<int32_t>(k1), cost});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });

  at::Tensor part_out, part_ml;
  Params p{};
  p.q = q.data_ptr();
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.block_tables = bt;
  p.token_pos = pos_p;
  if (kv_format != 0) {
    p.k_scale = reinterpret_cast<const uint16_t*>(k_scale.data_ptr());
    p.v_scale = reinterpret_cast<const uint16_t*>(v_scale.data_ptr());
  }
  p.out = out.data_ptr();
  p.num_heads = H;
  p.num_kv_heads = KVH;
  p.group = H / KVH;
  p.head_dim = D;
  p.max_blocks = MB;
  p.block_size = block_size;
  p.num_parts = P;
  p.qscale = static_cast<float>(scale * 1.4426950408889634);
  p.amx = amx;
  if (P > 1) {
    part_out = at::empty({T, H, P, D}, q.options().dtype(at::kFloat));
    part_ml = at::empty({T, H, P, 2}, q.options().dtype(at::kFloat));
    p.part_out = part_out.data_ptr<float>();
    p.part_ml = part_ml.data_ptr<float>();
  }
  if (q.scalar_type() == at::kFloat) {
    dispatch_kv<float>(p, kv_format, runs, items, T);
  } else {
    dispatch_kv<c10::BFloat16>(p, kv_format, runs, items, T);
  }
  return out.view({T, H * D});
}

at::Tensor paged_attention_short(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                                 at::Tensor block_tables, at::Tensor token_seq,
                                 at::Tensor token_pos, int64_t block_size, double scale,
                                 int64_t max_parts, at::Tensor k_scale, at::Tensor v_scale,
                                 int64_t kv_format) {
  // Let other Python threads (e.g. a server's event loop) run during the kernel.
  pybind11::gil_scoped_release no_gil;
  return paged_attention_impl(q, k_cache, v_cache, block_tables, token_seq, token_pos, block_size,
                              scale, max_parts, k_scale, v_scale, kv_format);
}
