// AVX2 pieces of the CPU codec, part one: loading values, the finite amax and the fast
// Walsh-Hadamard transform (included through simd_avx2.h, in codec_avx2.cpp only;
// simd_avx512_fwht.h's, eight lanes).  Each computes exactly what the scalar loop it replaces
// computes: the same IEEE operations on the same operands, eight values per instruction.
#pragma once

#include <immintrin.h>

#include <cstdint>


namespace fp4q {
namespace cpu {
namespace {
namespace avx2 {

constexpr int64_t kLanes = 8;  // floats per register

inline __m256i abs_bits(__m256 v) { return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF)); }

// 8 input values from index i of x as floats (float32, bfloat16 or float16; exact).
template <int32_t dtype>
inline __m256 load_input(const void* x, int64_t i) {
  if (dtype == kF32) return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
  return dtype == kBF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

// Saturate to the dtype's range keeping NaN (min_ps(bound, x) returns x when x is NaN) when
// `saturate`, then round to the dtype (fp4quant.h: out_f32, out_bf16, out_half); 8 values to
// out[i .. i+7].  stream: around the caches (float32 at a 32-byte boundary only).
inline void store8(__m256 v, void* out, int32_t dtype, int64_t i, bool saturate, bool stream) {
  const float bound = dtype == kF32 ? kF32Max : (dtype == kBF16 ? kBF16Max : kHalfMax);
  if (saturate) v = _mm256_max_ps(_mm256_set1_ps(-bound), _mm256_min_ps(_mm256_set1_ps(bound), v));
  if (dtype == kF32) {
    float* p = static_cast<float*>(out) + i;
    if (stream) _mm256_stream_ps(p, v);
    else _mm256_storeu_ps(p, v);
    return;
  }
  __m128i h;
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  if (dtype == kBF16) {
    __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
    u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x7FC0), nan);
    // 32-bit lanes to 16-bit words (packus works per half: words 0-3, 8-11 | 4-7, 12-15 of u, u)
    h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(u, u), 0x08));
  } else {
    h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // canonical NaN 0x7E00 with the sign, as c10::Half and the scalar path produce
    const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
    const __m128i sign = _mm_and_si128(h, _mm_set1_epi16(int16_t(0x8000)));
    h = _mm_blendv_epi8(h, _mm_or_si128(sign, _mm_set1_epi16(0x7E00)), nan16);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i), h);
}

// count values of buf (a multiple of 8) to out from index first, as codec_span.h's store_values.
inline void store_values(const float* buf, int64_t count, void* out, int32_t dtype, int64_t first, bool saturate,
                         bool stream) {
  stream = stream && dtype == kF32 && (reinterpret_cast<uintptr_t>(static_cast<float*>(out) + first) & 31) == 0;
  for (int64_t i = 0; i < count; i += 8) store8(_mm256_loadu_ps(buf + i), out, dtype, first + i, saturate, stream);
}

// The finite amax of n values of x (a multiple of 8), read in place: the largest |value| bits
// as integers (one cycle a maximum); where that is not finite, the maximum over the finite values.
template <int32_t dtype>
inline float input_amax_t(const void* x, int64_t n) {
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_epu32(m0, abs_bits(load_input<dtype>(x, i)));
    m1 = _mm256_max_epu32(m1, abs_bits(load_input<dtype>(x, i + 8)));
  }
  for (; i < n; i += 8) m0 = _mm256_max_epu32(m0, abs_bits(load_input<dtype>(x, i)));
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epu32(m0, m1));
  uint32_t top = 0;
  for (uint32_t v : lanes) top = v > top ? v : top;
  if (top < 0x7F800000u) return u2f(top);
  __m256i f = _mm256_setzero_si256();  // a non-finite value: the largest finite bits
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  for (i = 0; i < n; i += 8) {
    const __m256i a = abs_bits(load_input<dtype>(x, i));
    f = _mm256_max_epu32(f, _mm256_and_si256(a, _mm256_cmpgt_epi32(inf, a)));
  }
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), f);
  top = 0;
  for (uint32_t v : lanes) top = v > top ? v : top;
  return u2f(top);
}

inline float finite_amax(const float* b, int64_t n) { return input_amax_t<kF32>(b, n); }

// The finite amax of count values of x from index first (count a multiple of 8), read in place.
inline float input_amax(const void* x, int32_t dtype, int64_t first, int64_t count) {
  if (dtype == kF32) return input_amax_t<kF32>(static_cast<const float*>(x) + first, count);
  const uint16_t* h = static_cast<const uint16_t*>(x) + first;
  return dtype == kBF16 ? input_amax_t<kBF16>(h, count) : input_amax_t<kF16>(h, count);
}

// ---- the transform's butterflies ----

// One butterfly stage of stride h < 8 inside a register (simd_avx512_fwht.h's
// stage_in_register, eight lanes): lanes with bit h clear get a + b, lanes with it set a - b,
// as v * sign + partner in one fused multiply-add (the product is exact: one rounding, the
// sum's).  `sign`: -1 in the upper lanes, else 1.
template <int h>
inline __m256 stage_in_register(__m256 v, __m256 sign) {
  static_assert(h == 1 || h == 2 || h == 4, "a stride inside one 8-lane register");
  const __m256 partner = h == 1 ? _mm256_permute_ps(v, 0xB1)                    // lanes 1 0 3 2
                         : h == 2 ? _mm256_permute_ps(v, 0x4E)                  // lanes 2 3 0 1
                                  : _mm256_permute2f128_ps(v, v, 0x01);         // halves swapped
  return _mm256_fmadd_ps(v, sign, partner);
}

// The stages of strides 1, 2 and 4 of one register (s1, s2, s4: their signs).
inline __m256 strides_1_2_4(__m256 v, __m256 s1, __m256 s2, __m256 s4) {
  return stage_in_register<4>(stage_in_register<2>(stage_in_register<1>(v, s1), s2), s4);
}

// R registers r[0..R) of 8 values each, R/2 .. 1 apart in a block: the stages of strides
// 8 * (1, 2, .. R/2) across them (lower + upper, lower - upper).
template <int R>
inline void stages_across(__m256* r) {
#pragma GCC unroll 4
  for (int m = 1; m < R; m *= 2) {
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) {
      if (k & m) continue;
      const __m256 a = r[k], c = r[k + m];
      r[k] = _mm256_add_ps(a, c);
      r[k + m] = _mm256_sub_ps(a, c);
    }
  }
}

// What the last pass of a fused transform does to each value (at index `at`) before storing
// it.  The forward transform's: times post, then the largest |value| bits kept in m.
struct LastOps {
  __m256 post;
  __m256i m;
  __m256 apply(__m256 v, int64_t) {
    v = _mm256_mul_ps(v, post);
    m = _mm256_max_epu32(m, abs_bits(v));
    return v;
  }
};

// The inverse transform's: times post, then the value's sign (where signs is given), then
// times f (where f_on) -- as inverse_fwht's scale_by and multiply, then finish_span's 2**E.
struct InverseOps {
  __m256 post;
  const float* signs;
  bool f_on;
  __m256 f;
  __m256 apply(__m256 v, int64_t at) {
    v = _mm256_mul_ps(v, post);
    if (signs) v = _mm256_mul_ps(v, _mm256_loadu_ps(signs + at));
    return f_on ? _mm256_mul_ps(v, f) : v;
  }
};

// One pass over n values of the stages h, 2h, .. h * (R/2) (h >= 8), R registers at a time;
// where kLast, the stages end here, then last's operations.
template <int R, bool kLast, class Ops>
inline void stages_pass(float* b, int64_t n, int64_t h, Ops& last_ops) {
  Ops last = last_ops;  // a copy the stores to b cannot alias: its fields stay in registers
  for (int64_t i = 0; i < n; i += R * h) {
    for (int64_t j = 0; j < h; j += 8) {
      __m256 r[R];
#pragma GCC unroll 8
      for (int k = 0; k < R; ++k) r[k] = _mm256_loadu_ps(b + i + j + k * h);
      stages_across<R>(r);
#pragma GCC unroll 8
      for (int k = 0; k < R; ++k) _mm256_storeu_ps(b + i + j + k * h, kLast ? last.apply(r[k], i + j + k * h) : r[k]);
    }
  }
  last_ops = last;
}

// The passes after the first (strides h .. n/2), up to three strides each; the last one
// ends with last's operations where kLast.
template <bool kLast, class Ops>
inline void later_passes(float* b, int64_t n, int64_t h, Ops& last) {
  while (h < n) {
    const int64_t left = n / h;  // strides h .. n/2 remain: log2(left) stages
    if (left > 8) stages_pass<8, false>(b, n, h, last);
    if (left == 8) stages_pass<8, kLast>(b, n, h, last);
    if (left == 4) stages_pass<4, kLast>(b, n, h, last);
    if (left == 2) stages_pass<2, kLast>(b, n, h, last);
    h *= left >= 8 ? 8 : left;
  }
}

// The quantize's forward transform of n values of x (a power of two >= 64) into b, fused into
// three passes for 2048: each value times pre, then its sign (where signs is given), the
// butterflies, then times post -- the same IEEE operations on each value as scale_by,
// multiply, butterflies and scale_by in turn.  Returns the finite amax of the result.
template <int32_t dtype>
inline float fwht_forward_t(const void* x, float* b, int64_t n, float pre, const float* signs, float post) {
  const __m256 one = _mm256_set1_ps(1.0f), minus = _mm256_set1_ps(-1.0f);
  const __m256 s1 = _mm256_blend_ps(one, minus, 0xAA), s2 = _mm256_blend_ps(one, minus, 0xCC),
               s4 = _mm256_blend_ps(one, minus, 0xF0);
  const __m256 p = _mm256_set1_ps(pre);
  LastOps last{_mm256_set1_ps(post), _mm256_setzero_si256()};
  for (int64_t i = 0; i < n; i += 64) {  // strides 1 .. 32
    __m256 r[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      __m256 v = _mm256_mul_ps(load_input<dtype>(x, i + 8 * k), p);
      if (signs) v = _mm256_mul_ps(v, _mm256_loadu_ps(signs + i + 8 * k));
      r[k] = strides_1_2_4(v, s1, s2, s4);
    }
    stages_across<8>(r);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(b + i + 8 * k, n == 64 ? last.apply(r[k], i + 8 * k) : r[k]);
  }
  later_passes<true>(b, n, 64, last);
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), last.m);
  uint32_t top = 0;
  for (uint32_t v : lanes) top = v > top ? v : top;
  return top < 0x7F800000u ? u2f(top) : finite_amax(b, n);
}

inline float fwht_forward(const void* x, int32_t dtype, float* b, int64_t n, float pre, const float* signs,
                          float post) {
  if (dtype == kF32) return fwht_forward_t<kF32>(x, b, n, pre, signs, post);
  if (dtype == kBF16) return fwht_forward_t<kBF16>(x, b, n, pre, signs, post);
  return fwht_forward_t<kF16>(x, b, n, pre, signs, post);
}

// All radix-2 stages on n values (a power of two >= 16), as codec_span.h's butterflies(): the
// first pass does strides 1 .. 32 on 64 values at a time (8 registers: AVX2 has 16), each later
// pass up to three strides more.
inline void butterflies(float* b, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), minus = _mm256_set1_ps(-1.0f);
  const __m256 s1 = _mm256_blend_ps(one, minus, 0xAA), s2 = _mm256_blend_ps(one, minus, 0xCC),
               s4 = _mm256_blend_ps(one, minus, 0xF0);
  const int64_t block = n < 64 ? n : 64;
  for (int64_t i = 0; i < n; i += block) {
    __m256 r[8];
    const int R = int(block / 8);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      if (k >= R) break;
      r[k] = strides_1_2_4(_mm256_loadu_ps(b + i + 8 * k), s1, s2, s4);
    }
    if (R == 8) stages_across<8>(r);
    if (R == 4) stages_across<4>(r);
    if (R == 2) stages_across<2>(r);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      if (k >= R) break;
      _mm256_storeu_ps(b + i + 8 * k, r[k]);
    }
  }
  LastOps none{};
  later_passes<false>(b, n, block, none);
}

// The inverse transform of the n values in b (a power of two >= 64) with the operations after
// it (InverseOps) fused into its last pass: the same IEEE operations on each value as
// butterflies, scale_by, multiply and scale_by in turn.
inline void fwht_inverse(float* b, int64_t n, float post, const float* signs, bool f_on, float f) {
  const __m256 one = _mm256_set1_ps(1.0f), minus = _mm256_set1_ps(-1.0f);
  const __m256 s1 = _mm256_blend_ps(one, minus, 0xAA), s2 = _mm256_blend_ps(one, minus, 0xCC),
               s4 = _mm256_blend_ps(one, minus, 0xF0);
  InverseOps last{_mm256_set1_ps(post), signs, f_on, _mm256_set1_ps(f)};
  for (int64_t i = 0; i < n; i += 64) {  // strides 1 .. 32
    __m256 r[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k)
      r[k] = strides_1_2_4(_mm256_loadu_ps(b + i + 8 * k), s1, s2, s4);
    stages_across<8>(r);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(b + i + 8 * k, n == 64 ? last.apply(r[k], i + 8 * k) : r[k]);
  }
  later_passes<true>(b, n, 64, last);
}

}  // namespace avx2
}  // namespace
}  // namespace cpu
}  // namespace fp4q
