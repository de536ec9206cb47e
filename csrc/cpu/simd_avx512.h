// AVX-512 pieces of the CPU codec, part two: loading and storing values, and the FP4 codes
// with their E4M3 micro-scales (included by codec_span.h in codec_avx512.cpp only; the
// transform is in simd_avx512_fwht.h).  Each computes exactly what the scalar loop it
// replaces computes: the same IEEE operations on the same operands, 16 values per
// instruction.  One 16-value micro-group is one register.
#pragma once

#include <immintrin.h>

#include "simd_avx512_fwht.h"

namespace fp4q {
namespace cpu {
namespace {
namespace avx512 {

// load_values, each value times p (count a multiple of 16, every value exists).
inline void load_values_times(const void* x, int32_t dtype, int64_t first, int64_t count, float* buf, float p) {
  for (int64_t i = 0; i < count; i += 16) {
    const __m512 v = load_any(x, dtype, first + i);
    _mm512_storeu_ps(buf + i, _mm512_mul_ps(v, _mm512_set1_ps(p)));
  }
}

// The finite amax of count input values (a multiple of 16, every value exists), read only.
template <int32_t dtype>
inline float input_amax_t(const void* x, int64_t first, int64_t count) {
  __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    m0 = _mm512_max_epu32(m0, abs_bits(load_input<dtype>(x, first + i)));
    m1 = _mm512_max_epu32(m1, abs_bits(load_input<dtype>(x, first + i + 16)));
  }
  for (; i < count; i += 16) m0 = _mm512_max_epu32(m0, abs_bits(load_input<dtype>(x, first + i)));
  const float a = finite_or_unknown(_mm512_max_epu32(m0, m1));
  if (a >= 0.0f) return a;
  __m512 m = _mm512_setzero_ps();  // a non-finite value: the masked maximum
  for (i = 0; i < count; i += 16) {
    const __m512 v = abs_ps(load_input<dtype>(x, first + i));
    m = _mm512_mask_max_ps(m, finite_mask(v), m, v);
  }
  return _mm512_reduce_max_ps(m);
}

inline float input_amax(const void* x, int32_t dtype, int64_t first, int64_t count) {
  if (dtype == kF32) return input_amax_t<kF32>(x, first, count);
  if (dtype == kBF16) return input_amax_t<kBF16>(x, first, count);
  return input_amax_t<kF16>(x, first, count);
}

// Loading fused with the finite amax of what was loaded (count a multiple of 16, every value exists).
inline float load_values_amax(const void* x, int32_t dtype, int64_t first, int64_t count, float* buf) {
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = 0; i < count; i += 16) {
    const __m512 v = load_any(x, dtype, first + i);
    _mm512_storeu_ps(buf + i, v);
    const __m512 a = abs_ps(v);
    m = _mm512_mask_max_ps(m, finite_mask(a), m, a);
  }
  return _mm512_reduce_max_ps(m);
}

inline void load_values(const void* x, int32_t dtype, int64_t first, int64_t count, float* buf) {
  // count is a multiple of 16 and every value exists
  if (dtype == kF32) {
    const float* p = static_cast<const float*>(x) + first;
    for (int64_t i = 0; i < count; i += 16) _mm512_storeu_ps(buf + i, _mm512_loadu_ps(p + i));
  } else if (dtype == kBF16) {
    const uint16_t* p = static_cast<const uint16_t*>(x) + first;
    for (int64_t i = 0; i < count; i += 16) {
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
      _mm512_storeu_ps(buf + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(x) + first;
    for (int64_t i = 0; i < count; i += 16)
      _mm512_storeu_ps(buf + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i))));
  }
}

inline void store_values(const float* buf, int64_t count, void* out, int32_t dtype, int64_t first, bool saturate,
                         bool stream) {
  stream = stream && dtype == kF32 && (reinterpret_cast<uintptr_t>(static_cast<float*>(out) + first) & 63) == 0;
  for (int64_t i = 0; i < count; i += 16) store16(_mm512_loadu_ps(buf + i), out, dtype, first + i, saturate, stream);
}

// The constants of the round-to-nearest E2M1 encoder, made once per span: built inside the
// loop, GCC rematerializes each broadcast per micro-group (a mov and a vpbroadcastd, ten
// instructions of ~25, measured); made once and hidden from the optimizer (pin), they are
// reloaded from the stack once per four micro-groups, or, pinned again at the top of each
// iteration of a loop without a cold path, kept in registers.
struct E2m1Constants {
  __m512i abs_mask, bias, cap, lo, hi, tie_bits, down_flag, mag_bits, one, sign_bit, low_byte, order;

  static E2m1Constants make() {
    E2m1Constants k;
    k.abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
    k.bias = _mm512_set1_epi32(499);
    k.cap = _mm512_set1_epi32(21);
    k.lo = _mm512_setr_epi32(0, 17, 1, 1, 1, 1, 1, 2, 2, 2, 19, 3, 4, 4, 21, 5);
    k.hi = _mm512_setr_epi32(6, 6, 23, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7);
    k.tie_bits = _mm512_set1_epi32(0x1FFFFF);
    k.down_flag = _mm512_set1_epi32(16);
    k.mag_bits = _mm512_set1_epi32(15);
    k.one = _mm512_set1_epi32(1);
    k.sign_bit = _mm512_set1_epi32(8);
    k.low_byte = _mm512_set1_epi16(0xFF);
    k.order = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  // words 16..31: unused
                               27, 19, 11, 3, 26, 18, 10, 2, 25, 17, 9, 1, 24, 16, 8, 0);
    k.pin();
    return k;
  }

  // opaque to the optimizer from here on: it cannot rebuild them, only keep or spill them
  void pin() {
    __asm__("" : "+v"(abs_mask), "+v"(bias), "+v"(cap), "+v"(lo), "+v"(hi), "+v"(tie_bits));
    __asm__("" : "+v"(down_flag), "+v"(mag_bits), "+v"(one), "+v"(sign_bit), "+v"(low_byte), "+v"(order));
  }
};

// E2M1 magnitude (round to nearest even, saturating) of |v| by table: every tie point of
// e2m1_nearest_mag (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) starts a quarter of an octave, so
// the exponent and top two mantissa bits name the step, except exactly at a tie point that
// rounds down (">": 0.25, 1.25, 2.5, 5), where the table's flag (16) takes one off.
inline __m512i e2m1_nearest_mag(__m512i abs_bits, const E2m1Constants& k) {
  // index: quarter-octaves from 0.25 (1) up, 0 below, 21 from 8 on
  const __m512i key = _mm512_srli_epi32(abs_bits, 21);
  const __m512i idx = _mm512_min_epu16(_mm512_subs_epu16(key, k.bias), k.cap);
  const __m512i entry = _mm512_permutex2var_epi32(k.lo, idx, k.hi);
  const __mmask16 at_tie = _mm512_testn_epi32_mask(abs_bits, k.tie_bits);
  const __mmask16 down = _mm512_mask_test_epi32_mask(at_tie, entry, k.down_flag);
  const __m512i mag = _mm512_and_si512(entry, k.mag_bits);
  return _mm512_mask_sub_epi32(mag, down, mag, k.one);
}

// The FP4 code of each lane of the finite micro-group y scaled by r, round-to-nearest-even:
// (sign >> 28 & 8) | magnitude, one per 32-bit lane.
inline __m512i e2m1_nearest_code_lanes(__m512 y, float r, const E2m1Constants& k) {
  const __m512i v = _mm512_castps_si512(_mm512_mul_ps(y, _mm512_set1_ps(r)));
  const __m512i mag = e2m1_nearest_mag(_mm512_and_si512(v, k.abs_mask), k);
  return _mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 28), k.sign_bit, mag, 0xEA);
}

// The codes of one micro-group (from e2m1_nearest_code_lanes), packed low nibble first into 8 bytes.
inline void store_codes(__m512i codes, uint8_t* out) {
  // each 64-bit lane holds (even code) | (odd code) << 32: fold the odd one into bits 4..7
  const __m512i pairs = _mm512_or_si512(codes, _mm512_srli_epi64(codes, 28));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm512_cvtepi64_epi8(pairs));
}

// The codes of four consecutive micro-groups a, b, c, d packed into 32 bytes, with in-lane
// packs and one word permute (AVX512BW) in place of four narrowing stores: narrowed to bytes,
// value m = 4L + j of group g sits at byte 16L + 4g + j (L: 128-bit lane); each even value's
// word then ORs in its odd neighbour a nibble up; narrowed again, pair h of lane L of group g
// is byte 16L + 2g + h, so output word 4g + L (bytes 8g + 2L + h) is word 8L + g (k.order).
inline void store_codes4(__m512i a, __m512i b, __m512i c, __m512i d, uint8_t* out, const E2m1Constants& k) {
  const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(a, b), _mm512_packus_epi32(c, d));
  const __m512i pairs = _mm512_and_si512(_mm512_or_si512(bytes, _mm512_srli_epi16(bytes, 4)), k.low_byte);
  const __m512i narrow = _mm512_packus_epi16(pairs, pairs);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_castsi512_si256(_mm512_permutexvar_epi16(k.order, narrow)));
}

// FP4 codes of one finite 16-value micro-group y scaled by r, round-to-nearest-even, packed
// low nibble first into 8 bytes.
inline void e2m1_nearest_codes(__m512 y, float r, uint8_t* out, const E2m1Constants& k) {
  store_codes(e2m1_nearest_code_lanes(y, r, k), out);
}

inline __m512i mix32(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int32_t(0x21F0AAADu)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int32_t(0x735A2D97u)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
}

// fp4q::uniform's inner hash, mix32(high word ^ key), for one high word of the counters and
// for the next (taken by the lanes whose low word wrapped): the same for every micro-group of
// a span unless its counters cross a multiple of 2**32, so made once per high word rather
// than per micro-group (half of the hash's multiplies).
struct UniformHigh {
  uint32_t key, word;
  __m512i at_word, at_next;
  UniformHigh(uint32_t k, uint32_t w)
      : key(k), word(w), at_word(mix32(_mm512_set1_epi32(int32_t(w ^ k)))),
        at_next(mix32(_mm512_set1_epi32(int32_t((w + 1u) ^ k)))) {}
};

// fp4q::uniform of the 16 counters ctr .. ctr + 15 (``high``: the last high word's hash,
// remade here where ctr's differs)
inline __m512 uniforms(uint64_t ctr, UniformHigh& high) {
  if (uint32_t(ctr >> 32) != high.word) high = UniformHigh(high.key, uint32_t(ctr >> 32));
  const __m512i lo0 = _mm512_set1_epi32(int32_t(uint32_t(ctr)));
  const __m512i lo = _mm512_add_epi32(lo0, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __mmask16 carry = _mm512_cmplt_epu32_mask(lo, lo0);  // the low word wrapped
  const __m512i h = mix32(_mm512_xor_si512(lo, _mm512_mask_blend_epi32(carry, high.at_word, high.at_next)));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)), _mm512_set1_ps(5.9604644775390625e-08f));
}

// The FP4 code of each lane of the finite micro-group y scaled by r with stochastic rounding
// (grid_round, mode stochastic): up with probability equal to the position between the two
// neighbours, decided by u < frac; (sign >> 28 & 8) | magnitude, one per 32-bit lane.
inline __m512i e2m1_stochastic_code_lanes(__m512 y, float r, __m512 u, const E2m1Constants& k) {
  const __m512 v = _mm512_mul_ps(y, _mm512_set1_ps(r));
  const __m512 a = _mm512_min_ps(_mm512_set1_ps(6.0f), abs_ps(v));
  // spacing sp = 2**(e - 1), e = max(floor(log2 a), 0): 0.5 below 2, 1 below 4, 2 above;
  // a / sp as a * 2**(1 - e), exact (a power of two), where a division would cost ten times more
  __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(a), 23), _mm512_set1_epi32(127));
  e = _mm512_max_epi32(e, _mm512_setzero_si512());
  const __m512 sp = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(126)), 23));
  const __m512 inv_sp = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(128), e), 23));
  const __m512 idx = _mm512_mul_ps(a, inv_sp);
  const __m512 lo = _mm512_roundscale_ps(idx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_sub_ps(idx, lo);
  const __mmask16 up = _mm512_cmp_ps_mask(u, frac, _CMP_LT_OQ);
  const __m512 q = _mm512_min_ps(_mm512_set1_ps(6.0f), _mm512_mul_ps(_mm512_mask_add_ps(lo, up, lo, _mm512_set1_ps(1.0f)), sp));
  // q is on the grid (0, 0.5, 1, 1.5, 2, 3, 4, 6; v is never NaN: the micro-group and r are
  // finite, and an overflow to inf saturates to 6): its exponent and first mantissa bit less
  // 251 index its code (q = 0 -> 0, 0.5 -> 1, 1 -> 3, 1.5 -> 4 .. 6 -> 8)
  const __m512i step = _mm512_subs_epu16(_mm512_srli_epi32(_mm512_castps_si512(q), 22), _mm512_set1_epi32(251));
  const __m512i mag = _mm512_permutexvar_epi32(step, _mm512_setr_epi32(0, 1, 0, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0));
  return _mm512_ternarylogic_epi32(_mm512_srli_epi32(_mm512_castps_si512(v), 28), k.sign_bit, mag, 0xEA);
}

// E4M3 micro-scales of up to 16 micro-groups at once (fp4q::micro_scale, vectorized for
// e4m3 scales): t = (amax / 6) / c, clamped to [2**-6, 448] and rounded onto the E4M3
// grid; the decoded scale m is the rounded value itself; r = (1/c) / m (or 1/m).
inline void e4m3_micro_scales(const float* amax, __mmask16 finite, float c, bool coarse, int32_t rule, uint8_t* stored,
                              float* r, int64_t count) {
  __m512 t = _mm512_div_ps(_mm512_loadu_ps(amax), _mm512_set1_ps(6.0f));
  if (coarse) t = c == 0.0f ? _mm512_setzero_ps() : _mm512_div_ps(t, _mm512_set1_ps(c));
  __m512 a = _mm512_min_ps(_mm512_set1_ps(448.0f), _mm512_max_ps(_mm512_set1_ps(0.015625f), t));
  const __m512i abits = _mm512_castps_si512(a);
  const __m512i a_exp = _mm512_srli_epi32(abits, 23);
  const __m512 sp = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(a_exp, _mm512_set1_epi32(3)), 23));
  // a / sp as a * (1 / sp): sp is a power of two in [2**-9, 2**5], its inverse exact
  const __m512 inv_sp = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(257), a_exp), 23));
  const __m512 idx = _mm512_mul_ps(a, inv_sp);
  const __m512 lo = _mm512_roundscale_ps(idx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_sub_ps(idx, lo);
  __mmask16 up;
  if (rule == kScaleUp) {
    up = _mm512_cmp_ps_mask(frac, _mm512_setzero_ps(), _CMP_GT_OQ);
  } else {
    const __mmask16 odd = _mm512_test_epi32_mask(_mm512_cvttps_epi32(lo), _mm512_set1_epi32(1));
    up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GT_OQ) |
         (_mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_EQ_OQ) & odd);
  }
  const __m512 q = _mm512_min_ps(_mm512_set1_ps(448.0f),
                                 _mm512_mul_ps(_mm512_mask_add_ps(lo, up, lo, _mm512_set1_ps(1.0f)), sp));
  const __m512i qbits = _mm512_castps_si512(q);
  // E4M3 byte of a normal value: biased exponent (e + 7) and the top three mantissa bits
  const __m512i exp = _mm512_sub_epi32(_mm512_srli_epi32(qbits, 23), _mm512_set1_epi32(127 - 7));
  __m512i bytes = _mm512_or_si512(_mm512_slli_epi32(exp, 3), _mm512_and_si512(_mm512_srli_epi32(qbits, 20), _mm512_set1_epi32(7)));
  bytes = _mm512_mask_mov_epi32(_mm512_set1_epi32(0x7F), finite, bytes);  // NaN scale for non-finite groups
  const __m512 rv = coarse ? (c == 0.0f ? _mm512_setzero_ps() : _mm512_div_ps(_mm512_set1_ps(1.0f / c), q))
                           : _mm512_div_ps(_mm512_set1_ps(1.0f), q);
  _mm_mask_storeu_epi8(stored, __mmask16((1u << count) - 1u), _mm512_cvtepi32_epi8(bytes));
  _mm512_storeu_ps(r, rv);
}

// Lane k: the largest of the 16 lanes of a[k], for 16 registers of non-negative float bits
// compared as unsigned integers (the order of the floats, with +inf and then NaN above every
// finite value).  A tree of 15 maxima: each level halves the lanes a group keeps.
inline __m512i group_max_bits(const __m512i* a) {
  __m512i l1[8], l2[4], l3[2];
  for (int k = 0; k < 8; ++k)  // 256-bit halves: group 2k in lanes 0-7, 2k+1 in 8-15
    l1[k] = _mm512_max_epu32(_mm512_shuffle_i32x4(a[2 * k], a[2 * k + 1], 0x44),
                             _mm512_shuffle_i32x4(a[2 * k], a[2 * k + 1], 0xEE));
  for (int k = 0; k < 4; ++k)  // 128-bit blocks: group 4k + j in block j
    l2[k] = _mm512_max_epu32(_mm512_shuffle_i32x4(l1[2 * k], l1[2 * k + 1], 0x88),
                             _mm512_shuffle_i32x4(l1[2 * k], l1[2 * k + 1], 0xDD));
  const __m512i lo3 = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
  const __m512i hi3 = _mm512_add_epi32(lo3, _mm512_set1_epi32(2));
  for (int k = 0; k < 2; ++k)  // lane pairs: group 8k + j in lanes 2j, 2j+1
    l3[k] = _mm512_max_epu32(_mm512_permutex2var_epi32(l2[2 * k], lo3, l2[2 * k + 1]),
                             _mm512_permutex2var_epi32(l2[2 * k], hi3, l2[2 * k + 1]));
  const __m512i lo4 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i hi4 = _mm512_add_epi32(lo4, _mm512_set1_epi32(1));
  return _mm512_max_epu32(_mm512_permutex2var_epi32(l3[0], lo4, l3[1]), _mm512_permutex2var_epi32(l3[0], hi4, l3[1]));
}

// The micro-group maxima and finiteness of `count` micro-groups (16 values each) at b.
inline void group_amax(const float* b, int64_t count, float* amax, __mmask16& finite) {
  if (count == 16) {
    __m512i a[16];
    for (int k = 0; k < 16; ++k) a[k] = _mm512_and_si512(_mm512_loadu_si512(b + 16 * k), _mm512_set1_epi32(0x7FFFFFFF));
    const __m512i m = group_max_bits(a);
    finite = _mm512_cmplt_epu32_mask(m, _mm512_set1_epi32(0x7F800000));
    _mm512_storeu_si512(amax, _mm512_maskz_mov_epi32(finite, m));
    return;
  }
  finite = 0;
  for (int64_t k = 0; k < 16; ++k) amax[k] = 0.0f;
  for (int64_t k = 0; k < count; ++k) {
    const __m512 a = abs_ps(_mm512_loadu_ps(b + 16 * k));
    if (finite_mask(a) == 0xFFFF) {
      finite = __mmask16(finite | (1u << k));
      amax[k] = _mm512_reduce_max_ps(a);
    }
  }
}

// A span of FP4 values with E4M3 micro-scales over 16 values: micro-scales into `scales`,
// packed codes into `codes` (the span's slices of the message).  Stochastic rounding uses
// the counters ctr0 + i of the span's values.
inline void encode_fp4_e4m3_span(const Config& cfg, const float* b, int64_t len, float c, uint8_t* scales,
                                 uint8_t* codes, uint32_t key, uint64_t ctr0) {
  const int64_t micros = len / 16;  // at most 4096
  // the micro-scales of the whole span before any code, and every micro-group's maximum
  // before any micro-scale: a loop of the scales alone keeps several blocks' chains of
  // divisions in flight, where one loop doing both waits for each block's (as simd_avx2.h)
  // on the stack, not thread_local: in a shared library each thread_local access is a call
  // (__tls_get_addr), and a call in the loop spills every register it holds (measured)
  alignas(64) float r[4096 + 16];
  alignas(64) float amax[4096 + 16];
  uint16_t finite_of[256 + 1];  // finite mask of micro-groups 16j .. 16j+15
  for (int64_t j0 = 0; j0 < micros; j0 += 16) {
    __mmask16 finite;
    group_amax(b + 16 * j0, micros - j0 < 16 ? micros - j0 : 16, amax + j0, finite);
    finite_of[j0 / 16] = finite;
  }
  bool all_finite = true;
  for (int64_t j0 = 0; j0 < micros; j0 += 16) {
    const int64_t count = micros - j0 < 16 ? micros - j0 : 16;
    const __mmask16 finite = finite_of[j0 / 16];
    e4m3_micro_scales(amax + j0, finite, c, cfg.coarse != kCoarseNone, cfg.scale_round, scales + j0, r + j0, count);
    all_finite = all_finite && finite == __mmask16((1u << count) - 1u);
  }
  E2m1Constants K = E2m1Constants::make();
  if (all_finite && cfg.rounding == kRoundNearest && micros % 4 == 0) {  // the common case: no test per micro-group
    for (int64_t k = 0; k < micros; k += 4) {
      K.pin();
      store_codes4(e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k), r[k], K),
                   e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k + 16), r[k + 1], K),
                   e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k + 32), r[k + 2], K),
                   e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k + 48), r[k + 3], K), codes + 8 * k, K);
    }
    return;
  }
  UniformHigh high(key, uint32_t(ctr0 >> 32));
  if (all_finite && cfg.rounding == kRoundStochastic && micros % 4 == 0) {  // the trainer's backward: the same
    for (int64_t k = 0; k < micros; k += 4) {
      K.pin();
      const uint64_t ctr = ctr0 + uint64_t(16 * k);
      store_codes4(e2m1_stochastic_code_lanes(_mm512_loadu_ps(b + 16 * k), r[k], uniforms(ctr, high), K),
                   e2m1_stochastic_code_lanes(_mm512_loadu_ps(b + 16 * k + 16), r[k + 1], uniforms(ctr + 16, high), K),
                   e2m1_stochastic_code_lanes(_mm512_loadu_ps(b + 16 * k + 32), r[k + 2], uniforms(ctr + 32, high), K),
                   e2m1_stochastic_code_lanes(_mm512_loadu_ps(b + 16 * k + 48), r[k + 3], uniforms(ctr + 48, high), K),
                   codes + 8 * k, K);
    }
    return;
  }
  auto is_finite = [&](int64_t k) { return (finite_of[k / 16] >> (k % 16)) & 1u; };
  auto one = [&](int64_t k) {
    uint8_t* out = codes + 8 * k;
    if (is_finite(k) && cfg.rounding == kRoundStochastic) {
      const __m512 u = uniforms(ctr0 + uint64_t(16 * k), high);
      store_codes(e2m1_stochastic_code_lanes(_mm512_loadu_ps(b + 16 * k), r[k], u, K), out);
    } else if (is_finite(k)) {
      e2m1_nearest_codes(_mm512_loadu_ps(b + 16 * k), r[k], out, K);
    } else {
      std::memset(out, 0, 8);  // the non-finite code of e2m1
    }
  };
  int64_t k = 0;
  for (; k + 4 <= micros; k += 4) {
    // four finite micro-groups rounded to nearest at a time (4 divides 16: one mask word)
    if (cfg.rounding == kRoundNearest && ((finite_of[k / 16] >> (k % 16)) & 15u) == 15u) {
      store_codes4(e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k), r[k], K),
                   e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k + 16), r[k + 1], K),
                   e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k + 32), r[k + 2], K),
                   e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k + 48), r[k + 3], K), codes + 8 * k, K);
      continue;
    }
    for (int64_t i = k; i < k + 4; ++i) one(i);
  }
  for (; k < micros; ++k) one(k);
}

// The 16 values of a micro-group from its 8 code bytes and its decoding scale s.
inline __m512 e2m1_decode(const uint8_t* in, float s) {
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                      -2.0f, -3.0f, -4.0f, -6.0f);
  const __m512i bytes = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in)));
  const __m512i idx = _mm512_or_si512(_mm512_and_si512(bytes, _mm512_set1_epi64(0xF)),
                                      _mm512_and_si512(_mm512_slli_epi64(bytes, 28), _mm512_set1_epi64(0xF00000000LL)));
  return _mm512_mul_ps(_mm512_permutexvar_ps(idx, table), _mm512_set1_ps(s));
}

// fp4q::e4m3_value of 16 bytes: normal values built from their fields (exact), subnormals as
// mant * 2**-9, the sign by its bit (-0 included), NaN bytes as the positive quiet NaN.
inline __m512 e4m3_values(__m128i bytes) {
  const __m512i b = _mm512_cvtepu8_epi32(bytes);
  const __m512i exp = _mm512_and_si512(_mm512_srli_epi32(b, 3), _mm512_set1_epi32(15));
  const __m512i mant = _mm512_and_si512(b, _mm512_set1_epi32(7));
  const __m512i normal = _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(exp, _mm512_set1_epi32(120)), 23),
                                         _mm512_slli_epi32(mant, 20));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mant), _mm512_set1_ps(0.001953125f));
  __m512i v = _mm512_mask_mov_epi32(normal, _mm512_testn_epi32_mask(exp, exp), _mm512_castps_si512(sub));
  v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24));
  const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7F)), _mm512_set1_epi32(0x7F));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(v, nan, _mm512_set1_epi32(0x7FC00000)));
}

// `micros` micro-groups of FP4 codes under E4M3 micro-scales, decoded a micro-group at a time:
// put(i, v) with v = code value * (micro-scale * f) of values i .. i+15, as decode_span.
template <class Put>
inline void decode_fp4_e4m3_each(const uint8_t* scales, const uint8_t* codes, int64_t micros, float f, Put put) {
  for (int64_t j0 = 0; j0 < micros; j0 += 16) {
    const int64_t count = micros - j0 < 16 ? micros - j0 : 16;
    const __m128i bytes = _mm_maskz_loadu_epi8(__mmask16((1u << count) - 1u), scales + j0);
    alignas(64) float s[16];
    _mm512_store_ps(s, _mm512_mul_ps(e4m3_values(bytes), _mm512_set1_ps(f)));
    for (int64_t k = 0; k < count; ++k) put(16 * (j0 + k), e2m1_decode(codes + 8 * (j0 + k), s[k]));
  }
}

// The decoded values into b (or added to b).
inline void decode_fp4_e4m3_span(const uint8_t* scales, const uint8_t* codes, int64_t micros, float f, float* b,
                                 bool accumulate) {
  decode_fp4_e4m3_each(scales, codes, micros, f, [=](int64_t i, __m512 v) {
    _mm512_storeu_ps(b + i, accumulate ? _mm512_add_ps(_mm512_loadu_ps(b + i), v) : v);
  });
}

// The decoded values times p (where p_on: finish_span's 2**E without the transform), rounded
// to dtype into out from index first: decode_span, finish_span and store_values in one pass
// (codec_span.h's dequantize_span_direct picks the dtype and whether to stream).
template <int32_t dtype>
inline void dequantize_fp4_e4m3_t(const uint8_t* scales, const uint8_t* codes, int64_t micros, float f, bool p_on,
                                  float p, void* out, int64_t first, bool saturate, bool stream) {
  const __m512 pv = _mm512_set1_ps(p);
  decode_fp4_e4m3_each(scales, codes, micros, f, [=](int64_t i, __m512 v) {
    store16(p_on ? _mm512_mul_ps(v, pv) : v, out, dtype, first + i, saturate, stream);
  });
}

}  // namespace avx512
}  // namespace
}  // namespace cpu
}  // namespace fp4q
