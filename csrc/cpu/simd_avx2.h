// AVX2 pieces of the CPU codec, part two: the FP4 codes with their E4M3 micro-scales
// (included by codec_span.h in codec_avx2.cpp only; the transform is in simd_avx2_fwht.h), for
// CPUs without AVX-512 (AMD Zen 3 and earlier, Intel's client cores).  Without them those
// CPUs ran the plain loops of codec_span.h, whose per-value encoder GCC does not vectorize:
// 10x slower than the AVX-512 path.  Each computes exactly what the scalar loop it replaces
// computes: the same IEEE operations on the same operands, eight values per instruction.  One
// 16-value micro-group is two registers.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "simd_avx2_fwht.h"

namespace fp4q {
namespace cpu {
namespace {
namespace avx2 {

// Lane k: the largest |value| bits of micro-group k (16 values at b + 16k), for 8 micro-groups;
// compared as integers (the order of non-negative floats, +inf and then NaN above every
// finite value).  The maxima of the two halves, then a transposing tree of 7 maxima.
template <int32_t dtype = kF32>
inline __m256i group_max_bits8(const void* b) {
  __m256i m[8];
  for (int k = 0; k < 8; ++k)
    m[k] = _mm256_max_epu32(abs_bits(load_input<dtype>(b, 16 * k)), abs_bits(load_input<dtype>(b, 16 * k + 8)));
  __m256i t[4];
  for (int k = 0; k < 4; ++k)  // 128-bit halves: group 2k in lanes 0-3, 2k+1 in lanes 4-7
    t[k] = _mm256_max_epu32(_mm256_permute2x128_si256(m[2 * k], m[2 * k + 1], 0x20),
                            _mm256_permute2x128_si256(m[2 * k], m[2 * k + 1], 0x31));
  // lane pairs: group 4k + j (j = 0, 2) in lanes j, j + 1 of half 0; 4k + j + 1 of half 1
  const __m256i u0 = _mm256_max_epu32(_mm256_unpacklo_epi64(t[0], t[1]), _mm256_unpackhi_epi64(t[0], t[1]));
  const __m256i u1 = _mm256_max_epu32(_mm256_unpacklo_epi64(t[2], t[3]), _mm256_unpackhi_epi64(t[2], t[3]));
  const __m256 a = _mm256_castsi256_ps(u0), c = _mm256_castsi256_ps(u1);
  // single lanes: half 0 holds groups 0, 2, 4, 6 and half 1 groups 1, 3, 5, 7
  const __m256i v = _mm256_max_epu32(_mm256_castps_si256(_mm256_shuffle_ps(a, c, 0x88)),
                                     _mm256_castps_si256(_mm256_shuffle_ps(a, c, 0xDD)));
  return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The low byte of each 32-bit lane of v, in order, at bytes at .. at+3 of each 128-bit half
// (at: 0 or 4; zeros elsewhere).
inline __m256i low_bytes_at(__m256i v, int at) {
  const __m256i at0 = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                       0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i at4 = _mm256_setr_epi8(-1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                       -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1);
  return _mm256_shuffle_epi8(v, at == 0 ? at0 : at4);
}

// E4M3 micro-scales of 8 micro-groups from their maxima (fp4q::micro_scale for e4m3 scales;
// simd_avx512.h's e4m3_micro_scales, eight lanes): t = (amax / 6) / c, clamped to [2**-6, 448]
// and rounded onto the E4M3 grid; the decoded scale m is the rounded value itself; r = (1/c) /
// m (or 1/m).  `finite`: all ones in the lanes of finite groups; the others store the NaN byte.
inline void e4m3_micro_scales8(__m256 amax, __m256i finite, float c, bool coarse, int32_t rule, uint8_t* stored,
                               float* r, int count) {
  __m256 t = _mm256_div_ps(amax, _mm256_set1_ps(6.0f));
  if (coarse) t = c == 0.0f ? _mm256_setzero_ps() : _mm256_div_ps(t, _mm256_set1_ps(c));
  const __m256 a = _mm256_min_ps(_mm256_set1_ps(448.0f), _mm256_max_ps(_mm256_set1_ps(0.015625f), t));
  const __m256i a_exp = _mm256_srli_epi32(_mm256_castps_si256(a), 23);
  const __m256 sp = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(a_exp, _mm256_set1_epi32(3)), 23));
  // a / sp as a * (1 / sp): sp is a power of two in [2**-9, 2**5], its inverse exact
  const __m256 inv_sp = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(257), a_exp), 23));
  const __m256 idx = _mm256_mul_ps(a, inv_sp);
  const __m256 lo = _mm256_round_ps(idx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_sub_ps(idx, lo);
  __m256 up;
  if (rule == kScaleUp) {
    up = _mm256_cmp_ps(frac, _mm256_setzero_ps(), _CMP_GT_OQ);
  } else {
    const __m256i one = _mm256_set1_epi32(1);
    const __m256 odd = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_cvttps_epi32(lo), one), one));
    const __m256 half = _mm256_set1_ps(0.5f);
    up = _mm256_or_ps(_mm256_cmp_ps(frac, half, _CMP_GT_OQ), _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_EQ_OQ), odd));
  }
  const __m256 q = _mm256_min_ps(_mm256_set1_ps(448.0f),
                                 _mm256_mul_ps(_mm256_add_ps(lo, _mm256_and_ps(up, _mm256_set1_ps(1.0f))), sp));
  const __m256i qbits = _mm256_castps_si256(q);
  // E4M3 byte of a normal value: biased exponent (e + 7) and the top three mantissa bits
  const __m256i exp = _mm256_sub_epi32(_mm256_srli_epi32(qbits, 23), _mm256_set1_epi32(127 - 7));
  const __m256i mant = _mm256_and_si256(_mm256_srli_epi32(qbits, 20), _mm256_set1_epi32(7));
  __m256i bytes = _mm256_or_si256(_mm256_slli_epi32(exp, 3), mant);
  bytes = _mm256_blendv_epi8(_mm256_set1_epi32(0x7F), bytes, finite);  // NaN scale for non-finite groups
  const __m256 rv = coarse ? (c == 0.0f ? _mm256_setzero_ps() : _mm256_div_ps(_mm256_set1_ps(1.0f / c), q))
                           : _mm256_div_ps(_mm256_set1_ps(1.0f), q);
  // the low byte of each lane, in order
  const __m256i packed = low_bytes_at(bytes, 0);
  const uint32_t lo4 = uint32_t(_mm256_cvtsi256_si32(packed));
  const uint32_t hi4 = uint32_t(_mm_cvtsi128_si32(_mm256_extracti128_si256(packed, 1)));
  const uint64_t all = uint64_t(lo4) | (uint64_t(hi4) << 32);
  std::memcpy(stored, &all, size_t(count));
  _mm256_storeu_ps(r, rv);
}

// The high 16 bits of each float lane of v, with bit 0 set where the low 16 are not all zero.
// Every E2M1 tie point has a zero low half and a zero bit 0 in its high half, so comparing
// these words with the tie points' high halves orders |v| against them exactly (a > t: the
// high half larger, or equal with a non-zero low half).
inline __m256i sticky_high_half(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i low_nonzero = _mm256_min_epu32(_mm256_and_si256(bits, _mm256_set1_epi32(0xFFFF)), _mm256_set1_epi32(1));
  return _mm256_or_si256(_mm256_srli_epi32(bits, 16), low_nonzero);
}

// The high halves of the E2M1 tie points 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 (minus one at
// those that round up: a >= t is a > t - 1), and the masks of the encoder, in memory: read as
// operands of the compares (one load each, a port that is otherwise idle) rather than built in
// a register per micro-group, which is what GCC does with 16 registers and all of them in use.
alignas(32) constexpr int16_t kTiePoints[7][16] = {
#define FP4Q_ROW(v) {v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v}
    FP4Q_ROW(0x3E80), FP4Q_ROW(0x3F40 - 1), FP4Q_ROW(0x3FA0), FP4Q_ROW(0x3FE0 - 1),
    FP4Q_ROW(0x4020), FP4Q_ROW(0x4060 - 1), FP4Q_ROW(0x40A0)};
alignas(32) constexpr int16_t kMagnitudeBits[16] = FP4Q_ROW(0x7FFF);
alignas(32) constexpr int16_t kSignCode[16] = FP4Q_ROW(8);
#undef FP4Q_ROW

inline __m256i constant(const int16_t* row) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(row)); }

// The codes of a finite micro-group (y0: values 0-7, y1: 8-15) scaled by r, round-to-nearest-even
// (fp4q::e2m1_nearest_mag: the count of tie points passed, "a > t" at the ones that round down,
// "a >= t" at the others), one per 16-bit word: values 0-3, 8-11 in half 0, 4-7, 12-15 in half 1.
inline __m256i e2m1_nearest_code_words(__m256 y0, __m256 y1, __m256 r) {
  const __m256i w = _mm256_packus_epi32(sticky_high_half(_mm256_mul_ps(y0, r)), sticky_high_half(_mm256_mul_ps(y1, r)));
  const __m256i a = _mm256_and_si256(w, constant(kMagnitudeBits));
  __m256i mag = _mm256_setzero_si256();
#pragma GCC unroll 7
  for (int t = 0; t < 7; ++t) mag = _mm256_sub_epi16(mag, _mm256_cmpgt_epi16(a, constant(kTiePoints[t])));
  return _mm256_or_si256(mag, _mm256_and_si256(_mm256_srli_epi16(w, 12), constant(kSignCode)));
}

// The codes of two micro-groups (e2m1_nearest_code_words) packed low nibble first into 16 bytes.
inline __m128i pack_codes2(__m256i a, __m256i b) {
  // each 32-bit lane: (even code) | (odd code) << 4 in its low byte; a's bytes gathered into
  // bytes 0-3 of each half, b's into bytes 4-7
  const __m256i pa = _mm256_or_si256(a, _mm256_srli_epi32(a, 12)), pb = _mm256_or_si256(b, _mm256_srli_epi32(b, 12));
  const __m256i low = _mm256_or_si256(low_bytes_at(pa, 0), low_bytes_at(pb, 4));
  // half 0: pairs of values 0-3, 8-11 of a, then of b; half 1: 4-7, 12-15: interleaved by words
  return _mm_unpacklo_epi16(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1));
}

// The 8 code bytes of one finite micro-group.
inline uint64_t e2m1_nearest_codes16(__m256 y0, __m256 y1, __m256 r) {
  const __m256i w = e2m1_nearest_code_words(y0, y1, r);
  return uint64_t(_mm_cvtsi128_si64(pack_codes2(w, w)));
}

inline __m256i mix32(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int32_t(0x21F0AAADu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int32_t(0x735A2D97u)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
}

// fp4q::uniform's inner hash, mix32(high word ^ key), for one high word of the counters and
// the next (taken by the lanes whose low word wrapped): made once per high word rather than
// per eight values (as simd_avx512.h's UniformHigh).
struct UniformHigh8 {
  uint32_t key, word;
  __m256i at_word, at_next;
  UniformHigh8(uint32_t k, uint32_t w)
      : key(k), word(w), at_word(mix32(_mm256_set1_epi32(int32_t(w ^ k)))),
        at_next(mix32(_mm256_set1_epi32(int32_t((w + 1u) ^ k)))) {}
};

// fp4q::uniform of the 8 counters ctr .. ctr + 7 (``high``: the last high word's hash, remade
// here where ctr's differs).
inline __m256 uniforms8(uint64_t ctr, UniformHigh8& high) {
  if (uint32_t(ctr >> 32) != high.word) high = UniformHigh8(high.key, uint32_t(ctr >> 32));
  const __m256i lo0 = _mm256_set1_epi32(int32_t(uint32_t(ctr)));
  const __m256i lo = _mm256_add_epi32(lo0, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  // the low word wrapped where lo < lo0 unsigned (a signed compare with the sign bits flipped):
  // those lanes take the next high word's hash
  const __m256i flip = _mm256_set1_epi32(int32_t(0x80000000u));
  const __m256i wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(lo0, flip), _mm256_xor_si256(lo, flip));
  const __m256i h = mix32(_mm256_xor_si256(lo, _mm256_blendv_epi8(high.at_word, high.at_next, wrapped)));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), _mm256_set1_ps(5.9604644775390625e-08f));
}

// The codes (one per 32-bit lane) of 8 finite values y scaled by r with stochastic rounding
// (grid_round, mode stochastic): up with probability equal to the position between the two
// neighbours on the grid, decided by u < frac.
inline __m256i e2m1_stochastic_code_lanes(__m256 y, __m256 r, __m256 u) {
  const __m256 v = _mm256_mul_ps(y, r);
  const __m256 six = _mm256_set1_ps(6.0f);
  const __m256 a = _mm256_min_ps(six, _mm256_castsi256_ps(abs_bits(v)));
  // spacing sp = 2**(e - 1), e = max(floor(log2 a), 0): 0.5 below 2, 1 below 4, 2 above;
  // a / sp as a * 2**(1 - e), exact (a power of two), where a division costs several times more
  __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(a), 23), _mm256_set1_epi32(127));
  e = _mm256_max_epi32(e, _mm256_setzero_si256());
  const __m256 sp = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(126)), 23));
  const __m256 inv_sp = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(128), e), 23));
  const __m256 idx = _mm256_mul_ps(a, inv_sp);
  const __m256 lo = _mm256_round_ps(idx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_sub_ps(idx, lo);
  const __m256 up = _mm256_cmp_ps(u, frac, _CMP_LT_OQ);
  const __m256 q = _mm256_min_ps(six, _mm256_mul_ps(_mm256_add_ps(lo, _mm256_and_ps(up, _mm256_set1_ps(1.0f))), sp));
  // q is on the grid (0, 0.5, 1, 1.5, 2, 3, 4, 6; v is never NaN: the values and r are finite,
  // and an overflow to inf saturates to 6): from 1 up its exponent and first mantissa
  // bit less 252 are its code (1 -> 2, 1.5 -> 3 .. 6 -> 7), 0 and 0.5 fall to 0 and 0.5 is
  // given its 1 (the compare's -1 subtracted)
  const __m256i top = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(q), 22), _mm256_set1_epi32(252));
  const __m256i half = _mm256_castps_si256(_mm256_cmp_ps(q, _mm256_set1_ps(0.5f), _CMP_EQ_OQ));
  const __m256i mag = _mm256_sub_epi32(_mm256_max_epi32(top, _mm256_setzero_si256()), half);
  const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(v), 31), 3);
  return _mm256_or_si256(mag, sign);
}

// The 8 code bytes of one finite micro-group (values 0-7: y0, 8-15: y1) scaled by r with
// stochastic rounding, value i by the counter ctr + i.
inline uint64_t e2m1_stochastic_codes16(__m256 y0, __m256 y1, __m256 r, uint64_t ctr, UniformHigh8& high) {
  const __m256i c0 = e2m1_stochastic_code_lanes(y0, r, uniforms8(ctr, high));
  const __m256i c1 = e2m1_stochastic_code_lanes(y1, r, uniforms8(ctr + 8, high));
  const __m256i w = _mm256_packus_epi32(c0, c1);  // e2m1_nearest_code_words' order
  return uint64_t(_mm_cvtsi128_si64(pack_codes2(w, w)));
}

// A span of FP4 values with E4M3 micro-scales over 16 values: micro-scales into `scales`,
// packed codes into `codes` (the span's slices of the message); as encode_prepared's loop,
// whose steps it vectorizes.  Stochastic rounding uses the counters ctr0 + i of the span's
// values.  The micro-scales of the whole span before any code.
inline void encode_fp4_e4m3_span(const Config& cfg, const float* b, int64_t len, float c, uint8_t* scales,
                                 uint8_t* codes, uint32_t key, uint64_t ctr0) {
  const int64_t micros = len / 16;  // at most 4096
  const bool coarse = cfg.coarse != kCoarseNone;
  alignas(32) float r[4096 + 8];
  alignas(32) uint32_t maxima[4096 + 8];
  // the maxima of every micro-group first, then the micro-scales from them: a loop of the
  // scales alone keeps several blocks' chains of three divisions in flight, where one loop
  // doing both waited for each block's (the whole quantize 1.02-1.04x slower, side by side:
  // scripts/kernel_ab; on AVX-512 too, 1.05-1.06x: the README)
  for (int64_t j0 = 0; j0 < micros; j0 += 8) {
    const int count = micros - j0 < 8 ? int(micros - j0) : 8;
    if (count == 8) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(maxima + j0), group_max_bits8(b + 16 * j0));
      continue;
    }
    for (int k = 0; k < 8; ++k) maxima[j0 + k] = 0;  // the span's last few micro-groups: one by one
    for (int k = 0; k < count; ++k) {
      const float* v = b + 16 * (j0 + k);
      const __m256i h = _mm256_max_epu32(abs_bits(_mm256_loadu_ps(v)), abs_bits(_mm256_loadu_ps(v + 8)));
      alignas(32) uint32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), h);
      for (uint32_t x : lanes) maxima[j0 + k] = x > maxima[j0 + k] ? x : maxima[j0 + k];
    }
  }
  uint8_t finite_of[512 + 1];  // finite mask of micro-groups 8j .. 8j+7
  bool all_finite = true;
  for (int64_t j0 = 0; j0 < micros; j0 += 8) {
    const int count = micros - j0 < 8 ? int(micros - j0) : 8;
    const __m256i m = _mm256_load_si256(reinterpret_cast<const __m256i*>(maxima + j0));
    const __m256i finite = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), m);
    const __m256 amax = _mm256_and_ps(_mm256_castsi256_ps(m), _mm256_castsi256_ps(finite));
    e4m3_micro_scales8(amax, finite, c, coarse, cfg.scale_round, scales + j0, r + j0, count);
    // lanes past the span's last micro-group hold a zero maximum, "finite": their bits cleared
    finite_of[j0 / 8] = uint8_t(_mm256_movemask_ps(_mm256_castsi256_ps(finite)) & ((1 << count) - 1));
    all_finite = all_finite && finite_of[j0 / 8] == uint8_t((1u << count) - 1u);
  }
  const bool stochastic = cfg.rounding == kRoundStochastic;
  if (all_finite && !stochastic && micros % 2 == 0) {  // the common case: two micro-groups a store, no test
    for (int64_t k = 0; k < micros; k += 2) {
      const float* v = b + 16 * k;
      const __m256i wa = e2m1_nearest_code_words(_mm256_loadu_ps(v), _mm256_loadu_ps(v + 8), _mm256_set1_ps(r[k]));
      const __m256i wb =
          e2m1_nearest_code_words(_mm256_loadu_ps(v + 16), _mm256_loadu_ps(v + 24), _mm256_set1_ps(r[k + 1]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 8 * k), pack_codes2(wa, wb));
    }
    return;
  }
  UniformHigh8 high(key, uint32_t(ctr0 >> 32));
  for (int64_t k = 0; k < micros; ++k) {
    const float* v = b + 16 * k;
    uint64_t packed = 0;  // the non-finite code of e2m1
    if (((finite_of[k / 8] >> (k % 8)) & 1u) && stochastic)
      packed = e2m1_stochastic_codes16(_mm256_loadu_ps(v), _mm256_loadu_ps(v + 8), _mm256_set1_ps(r[k]),
                                       ctr0 + uint64_t(16 * k), high);
    else if ((finite_of[k / 8] >> (k % 8)) & 1u)
      packed = e2m1_nearest_codes16(_mm256_loadu_ps(v), _mm256_loadu_ps(v + 8), _mm256_set1_ps(r[k]));
    std::memcpy(codes + 8 * k, &packed, 8);
  }
}

// fp4q::e4m3_value of 8 bytes: normal values built from their fields (exact), subnormals as
// mant * 2**-9, the sign by its bit (-0 included), NaN bytes as the positive quiet NaN.
inline __m256 e4m3_values8(__m128i bytes) {
  const __m256i b = _mm256_cvtepu8_epi32(bytes);
  const __m256i exp = _mm256_and_si256(_mm256_srli_epi32(b, 3), _mm256_set1_epi32(15));
  const __m256i mant = _mm256_and_si256(b, _mm256_set1_epi32(7));
  const __m256i normal = _mm256_or_si256(_mm256_slli_epi32(_mm256_add_epi32(exp, _mm256_set1_epi32(120)), 23),
                                         _mm256_slli_epi32(mant, 20));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mant), _mm256_set1_ps(0.001953125f));
  const __m256i is_sub = _mm256_cmpeq_epi32(exp, _mm256_setzero_si256());
  __m256i v = _mm256_blendv_epi8(normal, _mm256_castps_si256(sub), is_sub);
  v = _mm256_or_si256(v, _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24));
  const __m256i nan = _mm256_cmpeq_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7F)), _mm256_set1_epi32(0x7F));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(v, _mm256_set1_epi32(0x7FC00000), nan));
}

// The 8 values of one half of a micro-group from its 4 code bytes (low nibble first) times s:
// each value's magnitude by its low three bits (the permute reads only those), its sign from
// the fourth, then the product (as element_value(code) * s).
inline __m256 e2m1_decode8(uint32_t four_bytes, __m256 s) {
  const __m256 table = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  // byte j in lanes 2j and 2j+1, shifted by 0 and 4: code in the low nibble (higher bits above)
  const __m128i twice = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i bytes = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128(int(four_bytes)), twice));
  const __m256i code = _mm256_srlv_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
  const __m256i sign_bit = _mm256_set1_epi32(int32_t(0x80000000u));
  const __m256 sign = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(code, 28), sign_bit));
  return _mm256_mul_ps(_mm256_xor_ps(_mm256_permutevar8x32_ps(table, code), sign), s);
}

// The 32 values of two micro-groups from their 16 code bytes (low nibble first), the first 16
// times s0, the others times s1, as put(0 .. 24, v).  Each E2M1 value is a bfloat16 (its float
// bits' low half is zero): the codes index two byte tables (its high and low byte), and
// interleaving those bytes, then zero low halves, builds the floats.  The codes are first
// permuted across the lanes (four at a time: 0 2 4 6 | 1 3 5 7) so that every step after it
// stays in its lane and the registers come out in order.
template <class Put>
inline void e2m1_decode32(const uint8_t* in, __m256 s0, __m256 s1, Put put) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
  const __m128i nibble = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(bytes, nibble), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
  const __m256i codes = _mm256_permutevar8x32_epi32(
      _mm256_setr_m128i(_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  const __m256i high = _mm256_shuffle_epi8(
      _mm256_broadcastsi128_si256(_mm_setr_epi8(0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, char(0x80), char(0xBF),
                                                char(0xBF), char(0xBF), char(0xC0), char(0xC0), char(0xC0), char(0xC0))),
      codes);
  const __m256i low = _mm256_shuffle_epi8(
      _mm256_broadcastsi128_si256(_mm_setr_epi8(0x00, 0x00, char(0x80), char(0xC0), 0x00, 0x40, char(0x80), char(0xC0),
                                                0x00, 0x00, char(0x80), char(0xC0), 0x00, 0x40, char(0x80), char(0xC0))),
      codes);
  const __m256i words_a = _mm256_unpacklo_epi8(low, high), words_b = _mm256_unpackhi_epi8(low, high);
  const __m256i zero = _mm256_setzero_si256();
  put(0, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, words_a)), s0));
  put(8, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, words_a)), s0));
  put(16, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, words_b)), s1));
  put(24, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, words_b)), s1));
}

// `micros` micro-groups of FP4 codes under E4M3 micro-scales, decoded eight values at a time:
// put(i, v) with v = code value * (micro-scale * f) of values i .. i+7, as decode_span.
template <class Put>
inline void decode_fp4_e4m3_each(const uint8_t* scales, const uint8_t* codes, int64_t micros, float f, Put put) {
  for (int64_t j0 = 0; j0 < micros; j0 += 8) {
    const int count = micros - j0 < 8 ? int(micros - j0) : 8;
    uint64_t eight = 0;
    std::memcpy(&eight, scales + j0, size_t(count));
    alignas(32) float s[8];
    _mm256_store_ps(s, _mm256_mul_ps(e4m3_values8(_mm_cvtsi64_si128(int64_t(eight))), _mm256_set1_ps(f)));
    int k = 0;
    for (; k + 2 <= count; k += 2) {
      const int64_t at = 16 * (j0 + k);
      e2m1_decode32(codes + 8 * (j0 + k), _mm256_set1_ps(s[k]), _mm256_set1_ps(s[k + 1]),
                    [&](int64_t i, __m256 v) { put(at + i, v); });
    }
    if (k < count) {  // an odd last micro-group
      const uint8_t* in = codes + 8 * (j0 + k);
      uint32_t lo, hi;
      std::memcpy(&lo, in, 4);
      std::memcpy(&hi, in + 4, 4);
      const __m256 sk = _mm256_set1_ps(s[k]);
      put(16 * (j0 + k), e2m1_decode8(lo, sk));
      put(16 * (j0 + k) + 8, e2m1_decode8(hi, sk));
    }
  }
}

// The decoded values into b (or added to b).
inline void decode_fp4_e4m3_span(const uint8_t* scales, const uint8_t* codes, int64_t micros, float f, float* b,
                                 bool accumulate) {
  decode_fp4_e4m3_each(scales, codes, micros, f, [=](int64_t i, __m256 v) {
    _mm256_storeu_ps(b + i, accumulate ? _mm256_add_ps(_mm256_loadu_ps(b + i), v) : v);
  });
}

// The decoded values times p (where p_on: finish_span's 2**E without the transform), rounded
// to dtype into out from index first: decode_span, finish_span and store_values in one pass
// (codec_span.h's dequantize_span_direct picks the dtype and whether to stream).
template <int32_t dtype>
inline void dequantize_fp4_e4m3_t(const uint8_t* scales, const uint8_t* codes, int64_t micros, float f, bool p_on,
                                  float p, void* out, int64_t first, bool saturate, bool stream) {
  const __m256 pv = _mm256_set1_ps(p);
  decode_fp4_e4m3_each(scales, codes, micros, f, [=](int64_t i, __m256 v) {
    store8(p_on ? _mm256_mul_ps(v, pv) : v, out, dtype, first + i, saturate, stream);
  });
}

}  // namespace avx2
}  // namespace
}  // namespace cpu
}  // namespace fp4q
