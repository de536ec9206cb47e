// The steps of the CPU codec on one span of values (docs/format.md): loading and storing
// values, the FWHT, normalization, encoding and decoding.  codec_generic.h runs them over
// a message's spans; like it, everything here has internal linkage (see fp4quant.h).
#pragma once

#include "codec_cpu.h"

#if defined(FP4Q_AVX512)
#include "simd_avx512.h"
#elif defined(FP4Q_AVX2)
#include "simd_avx2.h"
#endif

namespace fp4q {
namespace cpu {
namespace {

// The hand-written pieces of this file's instruction set (the same names and arguments in both)
#if defined(FP4Q_AVX512)
#define FP4Q_SIMD 1
namespace simd = avx512;
#elif defined(FP4Q_AVX2)
#define FP4Q_SIMD 1
namespace simd = avx2;
#endif

// Values per span (a group is always exactly one span), and the number of spans.
inline int64_t span_values(const Layout& lay) { return lay.span; }
inline int64_t span_count(const Layout& lay) { return (lay.padded + span_values(lay) - 1) / span_values(lay); }
inline int64_t span_len(const Layout& lay, int64_t s) {
  const int64_t S = span_values(lay);
  return lay.padded - s * S < S ? lay.padded - s * S : S;
}

inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

inline float inv_sqrt_group(int64_t g) {
  // fp32(1/sqrt(g)) as the reference computes it: exact for even powers of two
  int log2g = 0;
  while ((int64_t(1) << log2g) < g) ++log2g;
  float r = pow2(-(log2g / 2));
  return (log2g & 1) ? float(double(r) / 1.4142135623730951) : r;
}

// ---- loading and storing values of the three dtypes ----

inline void load_values(const void* x, int32_t dtype, int64_t first, int64_t count, int64_t total, float* buf) {
  const int64_t valid = clamp64(count < total - first ? count : total - first, 0, count);
#if defined(FP4Q_AVX512)
  if (valid == count && count % 16 == 0) return avx512::load_values(x, dtype, first, count, buf);
#endif
  if (dtype == kF32) {
    const float* p = static_cast<const float*>(x) + first;
    for (int64_t i = 0; i < valid; ++i) buf[i] = p[i];
  } else if (dtype == kBF16) {
    const uint16_t* p = static_cast<const uint16_t*>(x) + first;
    for (int64_t i = 0; i < valid; ++i) buf[i] = u2f(uint32_t(p[i]) << 16);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(x) + first;
    for (int64_t i = 0; i < valid; ++i) buf[i] = half_value(p[i]);
  }
  for (int64_t i = valid; i < count; ++i) buf[i] = 0.0f;  // zero padding
}

inline float finite_amax(const float* b, int64_t n);

// load_values, returning the finite amax of what it loaded (fused into the load on AVX-512).
inline float load_values_amax(const void* x, int32_t dtype, int64_t first, int64_t count, int64_t total, float* buf) {
#if defined(FP4Q_AVX512)
  if (count <= total - first && count % 16 == 0) return avx512::load_values_amax(x, dtype, first, count, buf);
#endif
  load_values(x, dtype, first, count, total, buf);
  return finite_amax(buf, count);
}

inline void scale_by(float* b, int64_t n, float f);

// load_values, then each value times p (one pass on AVX-512).
inline void load_values_times(const void* x, int32_t dtype, int64_t first, int64_t count, int64_t total, float* buf,
                              float p) {
#if defined(FP4Q_AVX512)
  if (count <= total - first && count % 16 == 0) return avx512::load_values_times(x, dtype, first, count, buf, p);
#endif
  load_values(x, dtype, first, count, total, buf);
  scale_by(buf, count, p);
}

// Round to the dtype, saturating at its finite range or not (fp4quant.h: out_f32).
// stream: the output is too large to stay in the caches (streaming stores where they can).
inline void store_values(const float* buf, int64_t count, void* out, int32_t dtype, int64_t first, bool saturate,
                         bool stream = false) {
#if defined(FP4Q_SIMD)
  const int64_t body = count / simd::kLanes * simd::kLanes;
  simd::store_values(buf, body, out, dtype, first, saturate, stream);
  buf += body;
  first += body;
  count -= body;
#endif
  if (dtype == kF32) {
    float* p = static_cast<float*>(out) + first;
    for (int64_t i = 0; i < count; ++i) p[i] = out_f32(buf[i], saturate);
  } else if (dtype == kBF16) {
    uint16_t* p = static_cast<uint16_t*>(out) + first;
    for (int64_t i = 0; i < count; ++i) p[i] = out_bf16(buf[i], saturate);
  } else {
    uint16_t* p = static_cast<uint16_t*>(out) + first;
    for (int64_t i = 0; i < count; ++i) p[i] = out_half(buf[i], saturate);
  }
}

// ---- the pieces of a span ----

inline float finite_amax(const float* b, int64_t n) {
#if defined(FP4Q_AVX512)
  if (n % 16 == 0) return avx512::finite_amax(b, n);
#elif defined(FP4Q_AVX2)
  if (n % 8 == 0) return avx2::finite_amax(b, n);
#endif
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float a = abs_f(b[i]);
    a = is_finite(a) ? a : 0.0f;
    m = a > m ? a : m;
  }
  return m;
}

inline void scale_by(float* b, int64_t n, float f) {
  for (int64_t i = 0; i < n; ++i) b[i] = b[i] * f;
}

inline void scale_saturating(float* b, int64_t n, float f) {
  for (int64_t i = 0; i < n; ++i) b[i] = mul_saturating(b[i], f);
}

inline void multiply(float* b, const float* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) b[i] = b[i] * s[i];
}

// Radix-2 butterflies of every stride 1 .. n/2: level one (strides < micro-group) then
// level two; running them in this order is the two-level transform.
inline void butterflies(float* b, int64_t n) {
#if defined(FP4Q_AVX512)
  if (n % 16 == 0) return avx512::butterflies(b, n);
#elif defined(FP4Q_AVX2)
  if (n >= 16 && (n & (n - 1)) == 0) return avx2::butterflies(b, n);
#endif
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      float* lo = b + i;
      float* hi = b + i + h;
      for (int64_t j = 0; j < h; ++j) {
        const float a = lo[j], c = hi[j];
        lo[j] = a + c;
        hi[j] = a - c;
      }
    }
  }
}

inline void forward_fwht(float* b, int64_t n, const float* signs, float inv_sqrt) {
  if (signs) multiply(b, signs, n);
  butterflies(b, n);
  scale_by(b, n, inv_sqrt);
}

inline void inverse_fwht(float* b, int64_t n, const float* signs, float inv_sqrt) {
  butterflies(b, n);
  scale_by(b, n, inv_sqrt);
  if (signs) multiply(b, signs, n);
}

// A span's finite amax when an earlier step already knows it; kUnknownAmax when not.
constexpr float kUnknownAmax = -1.0f;

// Steps 1-3 on a loaded span: normalize by 2**-e (e from the span, a group, or the tensor's),
// then the FWHT; without a coarse scale the transformed group is multiplied by 2**e again
// (saturating).  Returns e.  raw_amax: the loaded span's finite amax, if known; *amax_after
// (if asked): the result's, or kUnknownAmax.
inline int normalize_and_transform(const Config& cfg, float* b, int64_t S, const float* signs, bool transform,
                                   int tensor_e, float inv_sqrt, float raw_amax = kUnknownAmax,
                                   float* amax_after = nullptr) {
  const bool fwht = cfg.fwht && transform;
  const bool group_e = cfg.coarse == kCoarseGroup || (cfg.coarse == kCoarseNone && fwht);  // the span is a group
  int e = 0;
  if (group_e) {
    if (raw_amax < 0.0f) raw_amax = finite_amax(b, S);
    e = normalizing_exponent(raw_amax);
  }
  if (cfg.coarse == kCoarseTensor) e = tensor_e;
  const bool saturate = cfg.coarse == kCoarseNone && fwht;
  float after = kUnknownAmax;
  bool done = false;
#if defined(FP4Q_AVX512)
  if (fwht && S % 16 == 0) {
    const float a = avx512::fwht_fused(b, S, avx512::FwhtOps{true, pow2(-e), signs, inv_sqrt, nullptr, false, 1.0f, !saturate});
    if (!saturate) after = a;
    done = true;
  }
#endif
  if (!done) {
    if (cfg.coarse != kCoarseNone || fwht) scale_by(b, S, pow2(-e));
    if (fwht) forward_fwht(b, S, signs, inv_sqrt);
    // max(round(x * 2**-e)) == round(max(x) * 2**-e): rounding is monotonic, and a group's
    // 2**-e maps its amax into [1, 4) (no overflow)
    if (!fwht && cfg.coarse == kCoarseGroup && raw_amax >= 0.0f) after = raw_amax * pow2(-e);
  }
  if (saturate) scale_saturating(b, S, pow2(e));
  if (amax_after) *amax_after = after;
  return e;
}

inline void store_u32_le(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Steps 4-8 on a normalized, transformed span: coarse scale, micro-scales, codes.
// ctr0: the stochastic-rounding counter of the span's first value.
// b holds the span's len values, the message's values first .. first+len-1.  sum_scale:
// 2**E when b is a sum normalized by 2**-E (dequantize_reduce), else 1.
// known_amax: b's finite amax when already known (else kUnknownAmax).
inline void encode_prepared(const Config& cfg, const Layout& lay, const float* b, int64_t first, int64_t S, int e,
                            float tensor_c, uint8_t* msg, uint32_t key, uint64_t ctr0, float sum_scale,
                            float known_amax = kUnknownAmax) {
  float c = tensor_c;
  if (cfg.coarse == kCoarseGroup) {  // a span is exactly one group
    c = (known_amax >= 0.0f ? known_amax : finite_amax(b, S)) / coarse_divisor(cfg);
    store_u32_le(msg + 4 * (first / cfg.group), f2u((c * pow2(e)) * sum_scale));
  }
  const int64_t M = cfg.micro_group;
#if defined(FP4Q_AVX512)
  if (cfg.element == kE2M1 && cfg.micro_scale == kScaleE4M3 && M == 16) {
    avx512::encode_fp4_e4m3_span(cfg, b, S, c, msg + lay.micro_off + first / 16, msg + lay.codes_off + first / 2, key,
                                 ctr0);
    return;
  }
#endif
#if defined(FP4Q_AVX2)
  if (cfg.element == kE2M1 && cfg.micro_scale == kScaleE4M3 && M == 16) {
    avx2::encode_fp4_e4m3_span(cfg, b, S, c, msg + lay.micro_off + first / 16, msg + lay.codes_off + first / 2, key,
                               ctr0);
    return;
  }
#endif
  const bool stochastic = cfg.rounding == kRoundStochastic;
  const uint32_t bad_code = element_nonfinite_code(cfg.element);
  uint32_t codes[64];  // codes of up to 64 values of one micro-group
  for (int64_t j = 0; j < S / M; ++j) {
    const float* v = b + j * M;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < M; ++i) {
      const float a = abs_f(v[i]);
      finite = finite && is_finite(a);
      amax = a > amax ? a : amax;
    }
    const MicroScale ms = micro_scale(cfg, amax, finite, c);
    const int64_t k = first / M + j;  // micro-group index in the message
    if (lay.micro_bytes == 1) msg[lay.micro_off + k] = uint8_t(ms.stored);
    if (lay.micro_bytes == 2) {
      msg[lay.micro_off + 2 * k] = uint8_t(ms.stored & 0xFF);
      msg[lay.micro_off + 2 * k + 1] = uint8_t(ms.stored >> 8);
    }
    const int64_t at = first + j * M;  // value index in the message
    for (int64_t i0 = 0; i0 < M; i0 += 64) {
      const int64_t cnt = M - i0 < 64 ? M - i0 : 64;
      for (int64_t i = 0; i < cnt; ++i) {
        const float u = stochastic ? uniform(key, ctr0 + uint64_t(j * M + i0 + i)) : 0.0f;
        codes[i] = finite ? quantize_value(cfg, v[i0 + i] * ms.r, u) : bad_code;
      }
      if (element_bits(cfg.element) == 4) {
        uint8_t* out = msg + lay.codes_off + (at + i0) / 2;
        for (int64_t i = 0; i < cnt / 2; ++i) out[i] = uint8_t(codes[2 * i] | (codes[2 * i + 1] << 4));
      } else {
        uint8_t* out = msg + lay.codes_off + at + i0;
        for (int64_t i = 0; i < cnt; ++i) out[i] = uint8_t(codes[i]);
      }
    }
  }
}

inline float read_f32_le(const uint8_t* p) {
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u2f(u);
}

inline uint32_t micro_stored(const Layout& lay, const uint8_t* msg, int64_t k) {
  if (lay.micro_bytes == 1) return msg[lay.micro_off + k];
  if (lay.micro_bytes == 2) return uint32_t(msg[lay.micro_off + 2 * k]) | (uint32_t(msg[lay.micro_off + 2 * k + 1]) << 8);
  return 0;
}

// The block exponent E of the span (a block) of one message, where decode_normalizes(cfg)
// (docs/format.md "Decoding"): from its coarse scale, or from its largest finite micro-scale.
inline int block_exponent(const Config& cfg, const Layout& lay, const uint8_t* msg, int64_t first, int64_t S) {
  if (cfg.coarse == kCoarseGroup) return normalizing_exponent(read_f32_le(msg + 4 * (first / cfg.group)));
  if (cfg.coarse == kCoarseTensor) return normalizing_exponent(read_f32_le(msg));
  float m = 0.0f;
  for (int64_t k = first / cfg.micro_group; k < (first + S) / cfg.micro_group; ++k) {
    const float v = decode_scale(micro_stored(lay, msg, k), cfg.micro_scale);
    m = v > m ? v : m;  // NaN never wins
  }
  return normalizing_exponent(m);
}

// What decode_span multiplies each micro-scale by: the span's coarse scale (1 without one),
// times 2**-E where decode_normalizes(cfg).
inline float decode_factor(const Config& cfg, const uint8_t* msg, int64_t first, int E) {
  float f = 1.0f;
  if (cfg.coarse == kCoarseGroup) f = read_f32_le(msg + 4 * (first / cfg.group));
  if (cfg.coarse == kCoarseTensor) f = read_f32_le(msg);
  return decode_normalizes(cfg) ? f * pow2(-E) : f;
}

// Decode one span of a message into b (S values, padding included) in the transformed
// domain, against 2**-E where decode_normalizes(cfg): code * m * (c * 2**-E).  accumulate:
// add the decoded values to b instead (b + decoded, as a sum of spans in row order).
inline void decode_span(const Config& cfg, const Layout& lay, const uint8_t* msg, int64_t first, int64_t S, float* b,
                        int E, bool accumulate = false) {
  const float f = decode_factor(cfg, msg, first, E);
  const int64_t M = cfg.micro_group;
#if defined(FP4Q_AVX512)
  if (cfg.element == kE2M1 && cfg.micro_scale == kScaleE4M3 && M == 16) {
    avx512::decode_fp4_e4m3_span(msg + lay.micro_off + first / 16, msg + lay.codes_off + first / 2, S / 16, f, b,
                                 accumulate);
    return;
  }
#endif
#if defined(FP4Q_AVX2)
  if (cfg.element == kE2M1 && cfg.micro_scale == kScaleE4M3 && M == 16) {
    avx2::decode_fp4_e4m3_span(msg + lay.micro_off + first / 16, msg + lay.codes_off + first / 2, S / 16, f, b,
                               accumulate);
    return;
  }
#endif
  float tmp[64];
  for (int64_t j = 0; j < S / M; ++j) {
    const float s = decode_micro(cfg, micro_stored(lay, msg, first / M + j), f);
    const int64_t at = first + j * M;
    for (int64_t i0 = 0; i0 < M; i0 += 64) {
      const int64_t cnt = M - i0 < 64 ? M - i0 : 64;
      float* v = accumulate ? tmp : b + j * M + i0;
#if defined(FP4Q_AVX512)
      if (cfg.element == kE2M1 && M == 16) {
        _mm512_storeu_ps(v, avx512::e2m1_decode(msg + lay.codes_off + at / 2, s));
      } else
#endif
      if (element_bits(cfg.element) == 4) {
        const uint8_t* in = msg + lay.codes_off + (at + i0) / 2;
        for (int64_t i = 0; i < cnt / 2; ++i) {
          v[2 * i] = element_value(cfg.element, in[i] & 0xFu) * s;
          v[2 * i + 1] = element_value(cfg.element, in[i] >> 4) * s;
        }
      } else {
        const uint8_t* in = msg + lay.codes_off + at + i0;
        for (int64_t i = 0; i < cnt; ++i) v[i] = element_value(cfg.element, in[i]) * s;
      }
      if (accumulate) {
        float* acc = b + j * M + i0;
        for (int64_t i = 0; i < cnt; ++i) acc[i] = acc[i] + tmp[i];
      }
    }
  }
}

#if defined(FP4Q_SIMD)
// Dequantize a span of a message without the transform into out (from index out_first) in one
// pass, where the config and the span allow it (every value present): the same operations on
// each value as decode_span, finish_span and store_values.  Returns whether it did.
inline bool dequantize_span_direct(const Config& cfg, const Layout& lay, const uint8_t* msg, int64_t first, int64_t S,
                                   int E, void* out, int32_t dtype, int64_t out_first, bool saturate, bool stream) {
  if (cfg.fwht || cfg.element != kE2M1 || cfg.micro_scale != kScaleE4M3 || cfg.micro_group != 16 ||
      first + S > lay.n)
    return false;
  const uint8_t* scales = msg + lay.micro_off + first / 16;
  const uint8_t* codes = msg + lay.codes_off + first / 2;
  const float f = decode_factor(cfg, msg, first, E), p = pow2(E);
  const bool p_on = decode_normalizes(cfg);
  // streamed as store_values streams: float32 from a register-aligned address
  const uintptr_t at = reinterpret_cast<uintptr_t>(static_cast<float*>(out) + out_first);
  stream = stream && dtype == kF32 && (at & uintptr_t(4 * simd::kLanes - 1)) == 0;
  if (dtype == kF32)
    simd::dequantize_fp4_e4m3_t<kF32>(scales, codes, S / 16, f, p_on, p, out, out_first, saturate, stream);
  else if (dtype == kBF16)
    simd::dequantize_fp4_e4m3_t<kBF16>(scales, codes, S / 16, f, p_on, p, out, out_first, saturate, stream);
  else
    simd::dequantize_fp4_e4m3_t<kF16>(scales, codes, S / 16, f, p_on, p, out, out_first, saturate, stream);
  return true;
}
#endif

// Decoded (normalized, transformed) values -> values: the inverse FWHT, then 2**E.
inline void finish_span(const Config& cfg, float* b, int64_t S, int E, const float* signs, float inv_sqrt) {
#if defined(FP4Q_AVX512)
  if (cfg.fwht && S % 16 == 0) {
    avx512::fwht_fused(b, S, avx512::FwhtOps{false, 1.0f, nullptr, inv_sqrt, signs, decode_normalizes(cfg), pow2(E), false});
    return;
  }
#endif
#if defined(FP4Q_AVX2)
  if (cfg.fwht && S >= 64 && (S & (S - 1)) == 0) {
    avx2::fwht_inverse(b, S, inv_sqrt, signs, decode_normalizes(cfg), pow2(E));
    return;
  }
#endif
  if (cfg.fwht) inverse_fwht(b, S, signs, inv_sqrt);
  if (decode_normalizes(cfg)) scale_by(b, S, pow2(E));
}

}  // namespace
}  // namespace cpu
}  // namespace fp4q
