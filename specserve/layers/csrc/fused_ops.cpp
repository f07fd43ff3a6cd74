// Fused CPU ops for the decoder layer: RMSNorm (optionally with the residual add in front),
// rotary embedding fused with the KV-cache write, and SwiGLU's silu(gate) * up.
//
// Why: at batch 1 a decode step of SmolLM2-135M spent ~1.4 ms of its ~6.4 ms forward in 61
// RMSNorm calls (torch decomposes a bf16 rms_norm into ~10 small ops) and as much again in the
// small ops of RoPE and the cache write, all of it dispatch overhead on 576-wide rows.
//
// Numerics follow Hugging Face's Llama modules op by op, so that the fused path rounds where
// transformers rounds (greedy output is compared token by token against transformers):
//   RMSNorm:  y = w * to_dtype(x * rsqrt(mean(x^2) + eps))      (x in fp32; two roundings in bf16)
//   residual: r = to_dtype(r + x)
//   RoPE:     y = to_dtype(x * cos) + to_dtype(rotate_half(x) * sin), each product rounded
// No fused multiply-add is allowed in these functions (fp-contract=off): transformers runs the
// multiply and the add as separate kernels. The sum of squares is reassociated (vectorised), so
// mean(x^2) may differ from torch's in the last fp32 bit.
//
// Rows are independent; at::parallel_for splits them when there are enough to pay for waking
// the thread pool (a batch-1 decode runs on the calling thread).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/silu.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <ATen/Version.h>
#include <sleef.h>
#define SPECSERVE_SWIGLU_AVX512 1
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t GRAIN_ELEMS = 1 << 15;  // elements per parallel task (~10-20 us of work)

inline float f32(float x) { return x; }
inline float f32(c10::BFloat16 x) { return static_cast<float>(x); }

template <typename T>
inline T round_to(float x) { return static_cast<T>(x); }  // bf16: round to nearest even

template <typename T>
int64_t grain_rows(int64_t width) { return std::max<int64_t>(1, GRAIN_ELEMS / std::max<int64_t>(width, 1)); }

#if defined(__AVX512F__)
// 16 bf16 -> 16 fp32, exactly (also argmax.cpp's, later in the translation unit).
inline __m512 bf16x16_to_f32(const c10::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

#ifdef SPECSERVE_SWIGLU_AVX512
// SwiGLU in one pass over bf16 rows, bit-identical to transformers' F.silu(gate) * up.
//
// Why: as two aten ops (silu, then mul_ into its output) SwiGLU cost 1.4-1.8 ms of a 28 ms decode
// step at concurrency 32: two dispatches and two thread-pool wake-ups per layer for ~50k
// elements each. Bit-identical because this is aten's own arithmetic, reproduced: its AVX512
// silu kernel widens bf16 to fp32 and computes x / (1 + exp(-x)) with Sleef's expf16_u10 (the
// library torch links), 64 elements at a time, the rest of a row in scalar code with std::exp,
// then rounds to bf16 (round to nearest even, NaN to 0xffff); mul_ widens both factors,
// multiplies in fp32 and rounds the same way. So this path runs only where aten dispatches its
// AVX512 kernels (aten_runs_avx512); anywhere else silu_and_mul calls aten itself. The vector
// loop's silu comes from a table of aten's result for each of the 65,536 bf16 gates
// (silu_bf16_table), computed once with that same arithmetic.
bool aten_runs_avx512() {
  static const bool avx512 = at::get_cpu_capability() == "AVX512";
  return avx512;
}

// fp32 -> bf16 bits in the high half of each lane, as aten's cvtfp32_bf16 rounds: add 0x7fff
// plus the lowest kept bit, truncate; NaN becomes 0xffff. (vcvtneps2bf16 would flush
// denormals, which aten does not.)
inline __m512i round_bf16_hi(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_and_si512(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
      _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  const __mmask16 ordered = _mm512_cmp_ps_mask(x, x, _CMP_ORD_Q);
  return _mm512_mask_blend_epi32(ordered, _mm512_set1_epi32(static_cast<int>(0xffff0000u)),
                                 rounded);
}

// Stores 16 values rounded by round_bf16_hi as bf16.
inline void store_bf16_hi(c10::BFloat16* p, __m512i rounded) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

// silu of 16 bf16 gates, as aten's vector loop computes it, before its rounding to bf16.
__attribute__((optimize("fp-contract=off")))
inline __m512 silu_f32(__m512 x) {
  const __m512 neg = _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), Sleef_expf16_u10(neg)));
}

// silu(g) rounded to bf16 for every bf16 bit pattern g, as aten's vector loop rounds it (plus
// padding: the gathers below read 4 bytes at entry g). A gate is one of 65,536 values, so a
// look-up replaces the exp and the division (~30 cycles per 16 lanes) by one gather: SwiGLU
// over 2,048 x 1,536 ran ~1.6x faster (0.97 -> 0.61 ms, session 31), bit for bit the same.
const uint16_t* silu_bf16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(65536 + 16);
    for (int32_t g = 0; g < 65536; g += 16) {
      const __m512i bits = _mm512_add_epi32(_mm512_set1_epi32(g),
          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
      const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
      store_bf16_hi(reinterpret_cast<c10::BFloat16*>(t.data() + g),
                    round_bf16_hi(silu_f32(x)));
    }
    return t;
  }();
  return table.data();
}

__attribute__((optimize("fp-contract=off")))
void swiglu_row_bf16(const c10::BFloat16* __restrict g, const c10::BFloat16* __restrict u,
                     c10::BFloat16* __restrict o, int64_t I, const uint16_t* silu_table) {
  const int64_t vec_end = I / 64 * 64;  // aten's vectorised loop takes 2 x 32 bf16 at a time
  for (int64_t i = 0; i < vec_end; i += 16) {
    const __m512i idx =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + i)));
    const __m512 silu = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_i32gather_epi32(idx, silu_table, 2), 16));
    const __m512 prod = _mm512_mul_ps(silu, bf16x16_to_f32(u + i));
    store_bf16_hi(o + i, round_bf16_hi(prod));
  }
  for (int64_t i = vec_end; i < I; ++i) {
    const float x = static_cast<float>(g[i]);
    const c10::BFloat16 silu = x / (1.0f + std::exp(-x));
    o[i] = static_cast<c10::BFloat16>(static_cast<float>(silu) * static_cast<float>(u[i]));
  }
}
#endif

// One row of RMSNorm; `res` (optional) is added into the residual row first. out may be x
// (add_rms_norm_ normalises in place), so neither is declared __restrict.
template <typename T>
__attribute__((optimize("fp-contract=off")))
void rms_row(T* x, T* __restrict res, const T* __restrict w, T* out, int64_t d, float eps) {
  const T* src = x;
  if (res != nullptr) {
    for (int64_t i = 0; i < d; ++i) res[i] = round_to<T>(f32(res[i]) + f32(x[i]));
    src = res;
  }
  float ss = 0.f;
  for (int64_t i = 0; i < d; ++i) {
    const float v = f32(src[i]);
    ss += v * v;
  }
  const float r = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) {
    const float normed = f32(round_to<T>(f32(src[i]) * r));
    out[i] = round_to<T>(f32(w[i]) * normed);
  }
}

#ifdef SPECSERVE_SWIGLU_AVX512
// rms_row for bf16 on 16 lanes, rounding where rms_row does. gcc kept rms_row's sum of squares
// a chain of scalar adds (it may not reassociate fp32 sums); with two 16-lane sums an RMSNorm of
// 2,048 rows of 576 took 0.226 against 0.240 ms, bound by memory (session 31). x and out may be
// the same row (add_rms_norm_).
__attribute__((optimize("fp-contract=off")))
void rms_row_bf16(c10::BFloat16* x, c10::BFloat16* __restrict res,
                  const c10::BFloat16* __restrict w, c10::BFloat16* out, int64_t d, float eps) {
  const int64_t vec_end = d / 32 * 32;
  const c10::BFloat16* src = res != nullptr ? res : x;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  float tail = 0.f;
  for (int64_t i = 0; i < vec_end; i += 32) {
    __m512 v0 = bf16x16_to_f32(x + i), v1 = bf16x16_to_f32(x + i + 16);
    if (res != nullptr) {  // the residual add rounds to bf16 as `res + x` does
      const __m512i r0 = round_bf16_hi(_mm512_add_ps(bf16x16_to_f32(res + i), v0));
      const __m512i r1 = round_bf16_hi(_mm512_add_ps(bf16x16_to_f32(res + i + 16), v1));
      store_bf16_hi(res + i, r0);
      store_bf16_hi(res + i + 16, r1);
      v0 = _mm512_castsi512_ps(r0);
      v1 = _mm512_castsi512_ps(r1);
    }
    acc0 = _mm512_add_ps(acc0, _mm512_mul_ps(v0, v0));
    acc1 = _mm512_add_ps(acc1, _mm512_mul_ps(v1, v1));
  }
  for (int64_t i = vec_end; i < d; ++i) {
    if (res != nullptr) res[i] = round_to<c10::BFloat16>(f32(res[i]) + f32(x[i]));
    const float v = f32(src[i]);
    tail += v * v;
  }
  const float ss = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + tail;
  const float r = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
  const __m512 rv = _mm512_set1_ps(r);
  for (int64_t i = 0; i < vec_end; i += 16) {
    const __m512i normed = round_bf16_hi(_mm512_mul_ps(bf16x16_to_f32(src + i), rv));
    store_bf16_hi(out + i, round_bf16_hi(_mm512_mul_ps(bf16x16_to_f32(w + i),
                                                       _mm512_castsi512_ps(normed))));
  }
  for (int64_t i = vec_end; i < d; ++i) {
    const float normed = f32(round_to<c10::BFloat16>(f32(src[i]) * r));
    out[i] = round_to<c10::BFloat16>(f32(w[i]) * normed);
  }
}
#endif

void check_rows(const at::Tensor& x, const at::Tensor& w, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(),
              name, ": x must be a contiguous 2-D CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              name, ": float32 or bfloat16 only");
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && w.is_contiguous() && w.dim() == 1 &&
                  w.size(0) == x.size(1),
              name, ": weight must be [hidden] in x's dtype");
}

template <typename T>
void rms_rows(T* x, T* res, const T* w, T* out, int64_t n, int64_t d, float eps) {
  at::parallel_for(0, n, grain_rows<T>(d), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
#ifdef SPECSERVE_SWIGLU_AVX512
      if constexpr (std::is_same<T, c10::BFloat16>::value) {
        rms_row_bf16(x + t * d, res ? res + t * d : nullptr, w, out + t * d, d, eps);
        continue;
      }
#endif
      rms_row<T>(x + t * d, res ? res + t * d : nullptr, w, out + t * d, d, eps);
    }
  });
}

// rotate_half(x)[i] = -x[i + D/2] for i < D/2, x[i - D/2] otherwise.
template <typename T>
__attribute__((optimize("fp-contract=off")))
void rope_head(const T* __restrict x, const T* __restrict cos, const T* __restrict sin,
               T* __restrict out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < D; ++i) {
    const float rot = i < half ? -f32(x[i + half]) : f32(x[i - half]);
    const float a = f32(round_to<T>(f32(x[i]) * f32(cos[i])));
    const float b = f32(round_to<T>(rot * f32(sin[i])));
    out[i] = round_to<T>(a + b);
  }
}

// One head's row into an 8-bit pool, as kv_cache.quantize_kv does it: scale = bf16(max(amax /
// qmax, 1e-12)), value = round-half-even(x / scale) clamped (int8) or x / scale to e4m3 (fp8).
template <typename T, typename C>
void quantize_head(const T* __restrict x, C* __restrict out, uint16_t* __restrict scale_out,
                   int64_t D) {
  constexpr bool kInt8 = std::is_same<C, int8_t>::value;
  // A NaN in the row makes the scale NaN, as torch's amax and clamp do in quantize_kv (and
  // the row reads back as NaN), rather than a finite scale that hides it.
  float amax = 0.f;
  for (int64_t d = 0; d < D; ++d) {
    const float a = std::fabs(f32(x[d]));
    amax = (a > amax || std::isnan(a)) && !std::isnan(amax) ? a : amax;
  }
  const float floor_scale = amax / (kInt8 ? 127.f : 448.f);
  const c10::BFloat16 scale(std::isnan(floor_scale) ? floor_scale : std::max(floor_scale, 1e-12f));
  *scale_out = scale.x;
  const float sf = static_cast<float>(scale);
  for (int64_t d = 0; d < D; ++d) {
    const float y = f32(x[d]) / sf;
    if constexpr (kInt8) {
      // NaN has no int8 value (the cast would be undefined); the NaN scale carries it.
      out[d] = std::isnan(y) ? 0 : static_cast<int8_t>(std::clamp(std::nearbyint(y), -127.f, 127.f));
    } else {
      out[d] = c10::Float8_e4m3fn(y).x;
    }
  }
}

// C: the pool's element type (T, or int8_t / uint8_t fp8 bytes with per-(slot, head) scales).
template <typename T, typename C>
void rope_write(const T* qkv, const T* cos, const T* sin, const int64_t* slots, T* q_out,
                C* k_cache, C* v_cache, uint16_t* k_scale, uint16_t* v_scale, int64_t n,
                int64_t H, int64_t KVH, int64_t D) {
  constexpr bool kQuant = !std::is_same<C, T>::value;
  const int64_t row = (H + 2 * KVH) * D;
  at::parallel_for(0, n, grain_rows<T>(row), [&](int64_t b, int64_t e) {
    std::vector<T> krot(kQuant ? D : 0);
    for (int64_t t = b; t < e; ++t) {
      const T* src = qkv + t * row;
      const T* c = cos + t * D;
      const T* s = sin + t * D;
      for (int64_t h = 0; h < H; ++h) rope_head<T>(src + h * D, c, s, q_out + (t * H + h) * D, D);
      const int64_t base = slots[t] * KVH;  // (slot, head 0) row of the pool
      if constexpr (kQuant) {
        for (int64_t h = 0; h < KVH; ++h) {
          rope_head<T>(src + (H + h) * D, c, s, krot.data(), D);
          quantize_head<T, C>(krot.data(), k_cache + (base + h) * D, k_scale + base + h, D);
          quantize_head<T, C>(src + (H + KVH + h) * D, v_cache + (base + h) * D,
                              v_scale + base + h, D);
        }
      } else {
        for (int64_t h = 0; h < KVH; ++h)
          rope_head<T>(src + (H + h) * D, c, s, k_cache + (base + h) * D, D);
        std::memcpy(v_cache + base * D, src + (H + KVH) * D, KVH * D * sizeof(T));
      }
    }
  });
}

template <typename T>
void rope_write_any(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                    const int64_t* sl, at::Tensor& q, at::Tensor& k_cache, at::Tensor& v_cache,
                    at::Tensor& k_scale, at::Tensor& v_scale, int64_t kv_format, int64_t n,
                    int64_t H, int64_t KVH, int64_t D) {
  using S = typename std::conditional<std::is_same<T, float>::value, float, c10::BFloat16>::type;
  const S* x = reinterpret_cast<const S*>(qkv.data_ptr());
  const S* c = reinterpret_cast<const S*>(cos.data_ptr());
  const S* s = reinterpret_cast<const S*>(sin.data_ptr());
  S* qo = reinterpret_cast<S*>(q.data_ptr());
  if (kv_format == 0) {
    rope_write<S, S>(x, c, s, sl, qo, reinterpret_cast<S*>(k_cache.data_ptr()),
                     reinterpret_cast<S*>(v_cache.data_ptr()), nullptr, nullptr, n, H, KVH, D);
    return;
  }
  auto* ks = reinterpret_cast<uint16_t*>(k_scale.data_ptr());
  auto* vs = reinterpret_cast<uint16_t*>(v_scale.data_ptr());
  if (kv_format == 1) {
    rope_write<S, int8_t>(x, c, s, sl, qo, reinterpret_cast<int8_t*>(k_cache.data_ptr()),
                          reinterpret_cast<int8_t*>(v_cache.data_ptr()), ks, vs, n, H, KVH, D);
  } else {
    rope_write<S, uint8_t>(x, c, s, sl, qo, reinterpret_cast<uint8_t*>(k_cache.data_ptr()),
                           reinterpret_cast<uint8_t*>(v_cache.data_ptr()), ks, vs, n, H, KVH, D);
  }
}

}  // namespace

// x [n, d] -> RMSNorm(x) * w, a new tensor.
at::Tensor rms_norm(at::Tensor x, at::Tensor w, double eps) {
  check_rows(x, w, "rms_norm");
  auto out = at::empty_like(x);
  const int64_t n = x.size(0), d = x.size(1);
  if (x.scalar_type() == at::kFloat) {
    rms_rows<float>(x.data_ptr<float>(), nullptr, w.data_ptr<float>(), out.data_ptr<float>(),
                    n, d, static_cast<float>(eps));
  } else {
    using B = c10::BFloat16;
    rms_rows<B>(x.data_ptr<B>(), nullptr, w.data_ptr<B>(), out.data_ptr<B>(), n, d,
                static_cast<float>(eps));
  }
  return out;
}

// In place: residual = residual + x; x = RMSNorm(residual) * w (vLLM's fused_add_rms_norm).
void add_rms_norm_(at::Tensor x, at::Tensor residual, at::Tensor w, double eps) {
  check_rows(x, w, "add_rms_norm_");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type() &&
                  residual.is_contiguous(),
              "add_rms_norm_: residual must be contiguous with x's shape and dtype");
  const int64_t n = x.size(0), d = x.size(1);
  if (x.scalar_type() == at::kFloat) {
    rms_rows<float>(x.data_ptr<float>(), residual.data_ptr<float>(), w.data_ptr<float>(),
                    x.data_ptr<float>(), n, d, static_cast<float>(eps));
  } else {
    using B = c10::BFloat16;
    rms_rows<B>(x.data_ptr<B>(), residual.data_ptr<B>(), w.data_ptr<B>(), x.data_ptr<B>(), n, d,
                static_cast<float>(eps));
  }
}

// qkv [n, (H + 2 KVH) * D] (q heads, then k heads, then v heads); cos, sin [n, D];
// slots [n] int64; k_cache, v_cache [num_slots, KVH, D]. Writes rotated k and raw v into the
// cache rows `slots` and returns rotated q [n, H, D]; qkv is not modified.
// kv_format 0: pools in qkv's dtype; 1: int8, 2: fp8 e4m3 bytes (uint8), quantized per
// (token, head) with bf16 scales written to k_scale / v_scale [num_slots, KVH(, 1)].
at::Tensor rope_write_kv(at::Tensor qkv, at::Tensor cos, at::Tensor sin, at::Tensor slots,
                         at::Tensor k_cache, at::Tensor v_cache, int64_t num_heads,
                         at::Tensor k_scale, at::Tensor v_scale, int64_t kv_format) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous() && qkv.device().is_cpu(),
              "rope_write_kv: qkv must be a contiguous 2-D CPU tensor");
  TORCH_CHECK(qkv.scalar_type() == at::kFloat || qkv.scalar_type() == at::kBFloat16,
              "rope_write_kv: float32 or bfloat16 only");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.is_contiguous() && v_cache.is_contiguous(),
              "rope_write_kv: caches must be contiguous [num_slots, num_kv_heads, head_dim]");
  check_kv_pool("rope_write_kv", qkv.scalar_type(), k_cache, v_cache, k_scale, v_scale,
                kv_format);
  const int64_t n = qkv.size(0), KVH = k_cache.size(1), D = k_cache.size(2), H = num_heads;
  TORCH_CHECK(D % 2 == 0 && qkv.size(1) == (H + 2 * KVH) * D,
              "rope_write_kv: qkv width does not match the heads");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.numel() == n * D && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.scalar_type() == qkv.scalar_type() &&
                  sin.scalar_type() == qkv.scalar_type(),
              "rope_write_kv: cos / sin must be contiguous [n, head_dim] in qkv's dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == n && slots.is_contiguous(),
              "rope_write_kv: slots must be a contiguous int64 tensor with one entry per token");
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < n; ++t)
    TORCH_CHECK(sl[t] >= 0 && sl[t] < k_cache.size(0), "rope_write_kv: slot out of range");
  auto q = at::empty({n, H, D}, qkv.options());
  if (qkv.scalar_type() == at::kFloat) {
    rope_write_any<float>(qkv, cos, sin, sl, q, k_cache, v_cache, k_scale, v_scale, kv_format, n,
                          H, KVH, D);
  } else {
    rope_write_any<c10::BFloat16>(qkv, cos, sin, sl, q, k_cache, v_cache, k_scale, v_scale,
                                  kv_format, n, H, KVH, D);
  }
  return q;
}

// gate_up [n, 2I] -> silu(gate) * up [n, I], rounded after each op as transformers does.
at::Tensor silu_and_mul(at::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "silu_and_mul: expected [n, 2 * intermediate]");
  const int64_t I = gate_up.size(1) / 2;
#ifdef SPECSERVE_SWIGLU_AVX512
  if (gate_up.scalar_type() == at::kBFloat16 && gate_up.stride(1) == 1 && aten_runs_avx512()) {
    const int64_t n = gate_up.size(0);
    auto out = at::empty({n, I}, gate_up.options());
    const auto* g = gate_up.data_ptr<c10::BFloat16>();
    auto* o = out.data_ptr<c10::BFloat16>();
    const int64_t ld = gate_up.stride(0);
    const uint16_t* table = silu_bf16_table();
    at::parallel_for(0, n, grain_rows<c10::BFloat16>(2 * I), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        swiglu_row_bf16(g + r * ld, g + r * ld + I, o + r * I, I, table);
    });
    return out;
  }
#endif
  auto out = at::silu(gate_up.narrow(1, 0, I));
  return out.mul_(gate_up.narrow(1, I, I));
}
