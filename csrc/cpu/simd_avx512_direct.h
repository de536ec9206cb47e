// AVX-512 quantize of a span straight from the input (included by codec_generic.h in
// codec_avx512.cpp only), for FP4 codes under E4M3 micro-scales of 16 values:
//  - without the transform and with round-to-nearest (codec_generic.h's quantize_span_direct runs
//    both passes): the general path loads the span into a buffer, normalizes it in place and
//    reads it twice more to encode;
//    here the input is read twice (the second time from L1) and nothing is written but the
//    message: pass one finds the micro-groups' maxima of |x|, pass two normalizes and encodes.
//    Bit for bit the general path's result, because normalizing commutes with taking a
//    maximum: x * 2**-e rounds monotonically, so max|x * 2**-e| is max|x| * 2**-e rounded
//    (and finite exactly where max|x| is).  A tensor scale's pre-pass does pass one.
//  - with the transform (quantize_span_transformed): the FWHT's first pass reads the input
//    itself, not a copy of it.
// Both fetch a later span while they compute: at 64 MiB the input comes from memory.
#pragma once

#include "simd_avx512.h"
#include "span_ahead.h"

namespace fp4q {
namespace cpu {
namespace {
namespace avx512 {

// Whether quantize_span_direct computes this span: the config it is written for, a span of
// whole blocks of 16 micro-groups, every value present.
inline bool direct_applies(const Config& cfg, bool transform, int64_t first, int64_t len, int64_t n) {
  return cfg.element == kE2M1 && cfg.micro_scale == kScaleE4M3 && cfg.micro_group == 16 &&
         cfg.rounding == kRoundNearest && !(cfg.fwht && transform) && len % 256 == 0 && first + len <= n;
}

// One line of the later span `next` per micro-group i .. i+3, where the row has it (`ahead`
// values).  (A lambda that tested all four at once and returned early lost its prefetches
// to GCC 12 altogether: kept this plain.)
template <int32_t dtype>
inline void fetch_four(const char* next, int64_t i, int64_t ahead) {
  for (int64_t k = i; k < i + 4; ++k)
    if (16 * k < ahead) _mm_prefetch(next + 16 * k * int64_t(sizeof(Value<dtype>)), _MM_HINT_T1);
}

// Pass one: each micro-group's max |v| of the span's len values v as float bits into maxima
// (unsigned order: +inf, then NaN, above every finite value).  Returns the span's finite amax.
template <int32_t dtype>
inline float span_maxima_t(const void* v, int64_t len, uint32_t* maxima) {
  __m512i finite_max = _mm512_setzero_si512();
  bool all_finite = true;
  for (int64_t j0 = 0; j0 < len / 16; j0 += 16) {
    __m512i a[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) a[k] = abs_bits(load_input<dtype>(v, 16 * (j0 + k)));
    const __m512i m = group_max_bits(a);
    const __mmask16 finite = _mm512_cmplt_epu32_mask(m, _mm512_set1_epi32(0x7F800000));
    all_finite = all_finite && finite == 0xFFFF;
    finite_max = _mm512_mask_max_epu32(finite_max, finite, finite_max, m);
    _mm512_storeu_si512(maxima + j0, m);
  }
  // a micro-group with a non-finite value may hold the span's largest finite one: read again
  return all_finite ? u2f(_mm512_reduce_max_epu32(finite_max)) : input_amax_t<dtype>(v, 0, len);
}

// Pass two: the micro-scales and codes of the span's len values v (their maxima from pass
// one), message values first .. first+len-1, normalized by 2**-e under the coarse scale c
// (`normalize`: cfg has a coarse scale), into msg.  r: len / 16 floats of scratch; `ahead`:
// values of the span kAheadSpans later to fetch meanwhile.
template <int32_t dtype, bool normalize>
inline void encode_span_direct_t(const Config& cfg, const Layout& lay, const void* v, int64_t first, int64_t len,
                                 int64_t ahead, int e, float c, uint8_t* msg, const uint32_t* maxima, float* r) {
  const __m512 p = _mm512_set1_ps(pow2(-e));
  uint8_t* scales = msg + lay.micro_off + first / 16;
  uint8_t* codes = msg + lay.codes_off + first / 2;
  // the micro-scales of the whole span first: their divisions are independent of each other
  // (a chain of three per 16 micro-groups), so they overlap instead of stalling the codes
  bool all_finite = true;
  for (int64_t j0 = 0; j0 < len / 16; j0 += 16) {
    const __m512i m = _mm512_loadu_si512(maxima + j0);
    const __mmask16 finite = _mm512_cmplt_epu32_mask(m, _mm512_set1_epi32(0x7F800000));
    all_finite = all_finite && finite == 0xFFFF;
    alignas(64) float amax[16];
    const __m512 mx = _mm512_castsi512_ps(m);
    _mm512_store_ps(amax, normalize ? _mm512_maskz_mul_ps(finite, mx, p) : _mm512_maskz_mov_ps(finite, mx));
    e4m3_micro_scales(amax, finite, c, normalize, cfg.scale_round, scales + j0, r + j0, 16);
  }
  // the codes, four micro-groups at a time, while the next span is fetched
  // (the address of a later span only where the row has one)
  const char* next = ahead > 0 ? static_cast<const char*>(v) + kAheadSpans * len * int64_t(sizeof(Value<dtype>)) : nullptr;
  E2m1Constants K = E2m1Constants::make();
  auto y = [&](int64_t i) {
    const __m512 x = load_input<dtype>(v, 16 * i);
    return normalize ? _mm512_mul_ps(x, p) : x;
  };
  if (all_finite) {  // the common case: no test per micro-group, the constants in registers
    for (int64_t i = 0; i < len / 16; i += 4) {
      K.pin();
      fetch_four<dtype>(next, i, ahead);
      store_codes4(e2m1_nearest_code_lanes(y(i), r[i], K), e2m1_nearest_code_lanes(y(i + 1), r[i + 1], K),
                   e2m1_nearest_code_lanes(y(i + 2), r[i + 2], K), e2m1_nearest_code_lanes(y(i + 3), r[i + 3], K),
                   codes + 8 * i, K);
    }
    return;
  }
  for (int64_t i = 0; i < len / 16; i += 4) {
    fetch_four<dtype>(next, i, ahead);
    const __m512i m = _mm512_maskz_loadu_epi32(0xF, maxima + i);  // these four only: the array may end here
    const __mmask16 finite = _mm512_cmplt_epu32_mask(m, _mm512_set1_epi32(0x7F800000)) & 15u;
    uint8_t* out = codes + 8 * i;
    if (finite == 15u) {
      store_codes4(e2m1_nearest_code_lanes(y(i), r[i], K), e2m1_nearest_code_lanes(y(i + 1), r[i + 1], K),
                   e2m1_nearest_code_lanes(y(i + 2), r[i + 2], K), e2m1_nearest_code_lanes(y(i + 3), r[i + 3], K),
                   out, K);
      continue;
    }
    for (int64_t k = 0; k < 4; ++k) {
      if ((finite >> k) & 1u) e2m1_nearest_codes(y(i + k), r[i + k], out + 8 * k, K);
      else std::memset(out + 8 * k, 0, 8);  // the non-finite code of e2m1
    }
  }
}

// Whether quantize_span_transformed computes this span: FP4/E4M3 codes (either rounding)
// under a per-group coarse scale with the transform, every value of the span present.
inline bool transformed_applies(const Config& cfg, bool transform, int64_t first, int64_t len, int64_t n) {
  return cfg.element == kE2M1 && cfg.micro_scale == kScaleE4M3 && cfg.micro_group == 16 && cfg.fwht && transform &&
         cfg.coarse == kCoarseGroup && len % 16 == 0 && first + len <= n;
}

// Steps 1-8 on one span with the transform (normalize_and_transform + encode_prepared): the
// input's finite amax read in place, the FWHT's first pass reading the input itself (no copy
// into b first), and the next span fetched meanwhile.  b: len floats of scratch.
inline void quantize_span_transformed(const Config& cfg, const Layout& lay, const void* x, int32_t dtype, int64_t first,
                                      int64_t len, const float* signs, float inv_sqrt, uint8_t* msg, uint32_t key,
                                      uint64_t ctr0, float* b) {
  const int64_t size = dtype == kF32 ? 4 : 2;
  const int e = normalizing_exponent(input_amax(x, dtype, first, len));
  FwhtOps o{true, pow2(-e), signs, inv_sqrt, nullptr, false, 1.0f, true};
  o.src = static_cast<const char*>(x) + first * size;
  o.src_dtype = dtype;
  o.ahead_bytes = ahead_values(first, len, lay.n) * size;
  if (o.ahead_bytes > 0) o.ahead = static_cast<const char*>(x) + (first + kAheadSpans * len) * size;
  const float amax = fwht_fused(b, len, o);
  encode_prepared(cfg, lay, b, first, len, e, 0.0f, msg, key, ctr0, 1.0f, amax);
}

}  // namespace avx512
}  // namespace
}  // namespace cpu
}  // namespace fp4q
