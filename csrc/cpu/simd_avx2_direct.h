// AVX2 quantize of a span straight from the input (included by codec_generic.h in
// codec_avx2.cpp only; simd_avx512_direct.h's, eight lanes, with the same names and
// arguments), for FP4 codes under E4M3 micro-scales of 16 values:
//  - without the transform and with round-to-nearest (codec_generic.h's quantize_span_direct runs
//    both passes): pass one finds the micro-groups' maxima of |x|, pass two normalizes and
//    encodes, reading the input again (from the caches) and writing nothing but the message.
//    Bit for bit the general path's result: x * 2**-e rounds monotonically, so
//    max|x * 2**-e| is max|x| * 2**-e rounded.
//  - with the transform and a per-group coarse scale (quantize_span_transformed, fp4quant's
//    method): the input's finite amax read in place, the FWHT's first pass reading the input
//    itself and its last one taking the amax of the result.
// The general path copies each span into a buffer and passes over it five more times.
#pragma once

#include "simd_avx2.h"
#include "span_ahead.h"

namespace fp4q {
namespace cpu {
namespace {
namespace avx2 {

// Whether quantize_span_direct computes this span: the config it is written for, a span of
// whole blocks of 8 micro-groups, every value present.
inline bool direct_applies(const Config& cfg, bool transform, int64_t first, int64_t len, int64_t n) {
  return cfg.element == kE2M1 && cfg.micro_scale == kScaleE4M3 && cfg.micro_group == 16 &&
         cfg.rounding == kRoundNearest && !(cfg.fwht && transform) && len % 128 == 0 && first + len <= n;
}

// Pass one: each micro-group's max |v| of the span's len values v as float bits into maxima
// (integer order: +inf, then NaN, above every finite value).  Returns the span's finite amax.
template <int32_t dtype>
inline float span_maxima_t(const void* v, int64_t len, uint32_t* maxima) {
  __m256i finite_max = _mm256_setzero_si256();
  bool all_finite = true;
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  for (int64_t j0 = 0; j0 < len / 16; j0 += 8) {
    const __m256i m = group_max_bits8<dtype>(static_cast<const Value<dtype>*>(v) + 16 * j0);
    const __m256i finite = _mm256_cmpgt_epi32(inf, m);
    all_finite = all_finite && _mm256_movemask_ps(_mm256_castsi256_ps(finite)) == 0xFF;
    finite_max = _mm256_max_epu32(finite_max, _mm256_and_si256(m, finite));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(maxima + j0), m);
  }
  // a micro-group with a non-finite value may hold the span's largest finite one: read again
  if (!all_finite) return input_amax_t<dtype>(v, len);
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), finite_max);
  uint32_t top = 0;
  for (uint32_t x : lanes) top = x > top ? x : top;
  return u2f(top);
}

// Pass two: the micro-scales and codes of the span's len values v (their maxima from pass
// one), message values first .. first+len-1, normalized by 2**-e under the coarse scale c
// (`normalize`: cfg has a coarse scale), into msg.  r: len / 16 floats of scratch; `ahead`:
// values of the span kAheadSpans later to fetch meanwhile.
template <int32_t dtype, bool normalize>
inline void encode_span_direct_t(const Config& cfg, const Layout& lay, const void* v, int64_t first, int64_t len,
                                 int64_t ahead, int e, float c, uint8_t* msg, const uint32_t* maxima, float* r) {
  const __m256 p = _mm256_set1_ps(pow2(-e));
  uint8_t* scales = msg + lay.micro_off + first / 16;
  uint8_t* codes = msg + lay.codes_off + first / 2;
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  bool all_finite = true;
  for (int64_t j0 = 0; j0 < len / 16; j0 += 8) {
    const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(maxima + j0));
    const __m256i finite = _mm256_cmpgt_epi32(inf, m);
    all_finite = all_finite && _mm256_movemask_ps(_mm256_castsi256_ps(finite)) == 0xFF;
    __m256 amax = _mm256_and_ps(_mm256_castsi256_ps(m), _mm256_castsi256_ps(finite));
    if (normalize) amax = _mm256_mul_ps(amax, p);
    e4m3_micro_scales8(amax, finite, c, normalize, cfg.scale_round, scales + j0, r + j0, 8);
  }
  const Value<dtype>* x = static_cast<const Value<dtype>*>(v);
  const char* next = ahead > 0 ? reinterpret_cast<const char*>(x + kAheadSpans * len) : nullptr;
  auto y = [&](int64_t i) {  // values i .. i+7, normalized
    const __m256 u = load_input<dtype>(x, i);
    return normalize ? _mm256_mul_ps(u, p) : u;
  };
  for (int64_t k = 0; k < len / 16; k += 2) {
    for (int64_t i = k; i < k + 2; ++i)  // one line of the later span per micro-group
      if (16 * i < ahead) _mm_prefetch(next + 16 * i * int64_t(sizeof(Value<dtype>)), _MM_HINT_T1);
    const uint32_t ma = maxima[k], mb = maxima[k + 1];
    if (all_finite || (ma < 0x7F800000u && mb < 0x7F800000u)) {
      const __m256i wa = e2m1_nearest_code_words(y(16 * k), y(16 * k + 8), _mm256_set1_ps(r[k]));
      const __m256i wb = e2m1_nearest_code_words(y(16 * k + 16), y(16 * k + 24), _mm256_set1_ps(r[k + 1]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 8 * k), pack_codes2(wa, wb));
      continue;
    }
    for (int64_t i = k; i < k + 2; ++i) {
      uint64_t packed = 0;  // the non-finite code of e2m1
      if (maxima[i] < 0x7F800000u) packed = e2m1_nearest_codes16(y(16 * i), y(16 * i + 8), _mm256_set1_ps(r[i]));
      std::memcpy(codes + 8 * i, &packed, 8);
    }
  }
}

// Whether quantize_span_transformed computes this span: the config it is written for (either
// rounding: encode_prepared encodes), a span of at least 64 values, every value present.
inline bool transformed_applies(const Config& cfg, bool transform, int64_t first, int64_t len, int64_t n) {
  return cfg.element == kE2M1 && cfg.micro_scale == kScaleE4M3 && cfg.micro_group == 16 && cfg.fwht && transform &&
         cfg.coarse == kCoarseGroup && len >= 64 && (len & (len - 1)) == 0 && first + len <= n;
}

// Steps 1-8 on one span with the transform (normalize_and_transform + encode_prepared).
// b: len floats of scratch.
inline void quantize_span_transformed(const Config& cfg, const Layout& lay, const void* x, int32_t dtype, int64_t first,
                                      int64_t len, const float* signs, float inv_sqrt, uint8_t* msg, uint32_t key,
                                      uint64_t ctr0, float* b) {
  const void* span = static_cast<const char*>(x) + first * (dtype == kF32 ? 4 : 2);
  const int e = normalizing_exponent(input_amax(x, dtype, first, len));
  const float amax = fwht_forward(span, dtype, b, len, pow2(-e), signs, inv_sqrt);
  encode_prepared(cfg, lay, b, first, len, e, 0.0f, msg, key, ctr0, 1.0f, amax);
}

}  // namespace avx2
}  // namespace
}  // namespace cpu
}  // namespace fp4q
