// The CPU codec written once: plain loops over one span at a time, which each
// codec_<isa>.cpp compiles for its instruction set (the compiler vectorizes the simple
// loops).  Everything here has internal linkage (see fp4quant.h).  The steps follow
// docs/format.md; the comments name them.
//
// Work is split into spans of whole padding blocks: a span is one group when the config
// has the FWHT or a per-group coarse scale (the group is the unit of both), else a
// runs of whole micro-groups (Layout.span).  A span is processed in a float32 buffer.
#pragma once

#include "codec_cpu.h"

#if defined(FP4Q_AVX512)
#include "simd_avx512.h"
#endif

namespace fp4q {
namespace cpu {
namespace {

constexpr int64_t kMaxSegment = 1 << 16;  // QuantConfig.group <= 2**16

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

// Saturate to the dtype's finite range (NaN stays NaN), then round to it.
inline void store_values(const float* buf, int64_t count, void* out, int32_t dtype, int64_t first) {
#if defined(FP4Q_AVX512)
  const int64_t body = count / 16 * 16;
  avx512::store_values(buf, body, out, dtype, first);
  buf += body;
  first += body;
  count -= body;
#endif
  if (dtype == kF32) {
    float* p = static_cast<float*>(out) + first;
    for (int64_t i = 0; i < count; ++i) p[i] = max_keep_nan(min_keep_nan(buf[i], 3.4028234663852886e38f), -3.4028234663852886e38f);
  } else if (dtype == kBF16) {
    uint16_t* p = static_cast<uint16_t*>(out) + first;
    for (int64_t i = 0; i < count; ++i)
      p[i] = float_to_bf16_rne(max_keep_nan(min_keep_nan(buf[i], 3.3895313892515355e38f), -3.3895313892515355e38f));
  } else {
    uint16_t* p = static_cast<uint16_t*>(out) + first;
    for (int64_t i = 0; i < count; ++i) p[i] = float_to_half_rne(max_keep_nan(min_keep_nan(buf[i], 65504.0f), -65504.0f));
  }
}

// ---- the pieces of a span ----

inline float finite_amax(const float* b, int64_t n) {
#if defined(FP4Q_AVX512)
  if (n % 16 == 0) return avx512::finite_amax(b, n);
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

inline void multiply(float* b, const float* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) b[i] = b[i] * s[i];
}

// Radix-2 butterflies of every stride 1 .. n/2: level one (strides < micro-group) then
// level two; running them in this order is the two-level transform.
inline void butterflies(float* b, int64_t n) {
#if defined(FP4Q_AVX512)
  if (n % 16 == 0) return avx512::butterflies(b, n);
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

// Steps 1-3 on a loaded span: normalize by 2**-e (e from the span, a group, or the tensor's),
// then the FWHT.  Returns e.
inline int normalize_and_transform(const Config& cfg, float* b, int64_t S, const float* signs, bool transform,
                                   int tensor_e, float inv_sqrt) {
  int e = 0;
  if (cfg.coarse == kCoarseGroup) e = normalizing_exponent(finite_amax(b, S));
  if (cfg.coarse == kCoarseTensor) e = tensor_e;
  if (cfg.coarse != kCoarseNone) scale_by(b, S, pow2(-e));
  if (cfg.fwht && transform) forward_fwht(b, S, signs, inv_sqrt);
  return e;
}

inline void store_u32_le(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Steps 4-8 on a normalized, transformed span: coarse scale, micro-scales, codes.
// ctr0: the stochastic-rounding counter of the span's first value.
// b holds the span's len values, the message's values first .. first+len-1.
inline void encode_prepared(const Config& cfg, const Layout& lay, const float* b, int64_t first, int64_t S, int e,
                            float tensor_c, uint8_t* msg, uint32_t key, uint64_t ctr0) {
  float c = tensor_c;
  if (cfg.coarse == kCoarseGroup) {  // a span is exactly one group
    c = finite_amax(b, S) / coarse_divisor(cfg);
    store_u32_le(msg + 4 * (first / cfg.group), f2u(c * pow2(e)));
  }
  const int64_t M = cfg.micro_group;
#if defined(FP4Q_AVX512)
  if (cfg.element == kE2M1 && cfg.micro_scale == kScaleE4M3 && M == 16) {
    avx512::encode_fp4_e4m3_span(cfg, b, S, c, msg + lay.micro_off + first / 16, msg + lay.codes_off + first / 2, key,
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

// Decode one span of a message into b (S values, padding included).  With `transform`
// FWHT configs are inverse-transformed (against c * 2**-E, times 2**E at the end: step
// "Decoding"); without, they stay in the transformed domain as code * m * c.
inline void decode_span(const Config& cfg, const Layout& lay, const uint8_t* msg, int64_t first, int64_t S,
                           float* b, bool transform, const float* signs, float inv_sqrt) {
  float c = 0.0f;
  if (cfg.coarse == kCoarseGroup) c = read_f32_le(msg + 4 * (first / cfg.group));
  if (cfg.coarse == kCoarseTensor) c = read_f32_le(msg);
  const bool inverse = cfg.fwht && transform;
  const bool normalize = inverse && cfg.coarse != kCoarseNone;
  int E = 0;
  if (normalize) {
    E = normalizing_exponent(c);
    c = c * pow2(-E);
  }
  const int64_t M = cfg.micro_group;
  for (int64_t j = 0; j < S / M; ++j) {
    const int64_t k = first / M + j;
    uint32_t stored = 0;
    if (lay.micro_bytes == 1) stored = msg[lay.micro_off + k];
    if (lay.micro_bytes == 2) stored = uint32_t(msg[lay.micro_off + 2 * k]) | (uint32_t(msg[lay.micro_off + 2 * k + 1]) << 8);
    const float s = decode_micro(cfg, stored, c);
    const int64_t at = first + j * M;
    float* v = b + j * M;
#if defined(FP4Q_AVX512)
    if (cfg.element == kE2M1 && M == 16) {
      _mm512_storeu_ps(v, avx512::e2m1_decode(msg + lay.codes_off + at / 2, s));
      continue;
    }
#endif
    if (element_bits(cfg.element) == 4) {
      const uint8_t* in = msg + lay.codes_off + at / 2;
      for (int64_t i = 0; i < M / 2; ++i) {
        v[2 * i] = element_value(cfg.element, in[i] & 0xFu) * s;
        v[2 * i + 1] = element_value(cfg.element, in[i] >> 4) * s;
      }
    } else {
      const uint8_t* in = msg + lay.codes_off + at;
      for (int64_t i = 0; i < M; ++i) v[i] = element_value(cfg.element, in[i]) * s;
    }
  }
  if (inverse) {
    inverse_fwht(b, S, signs, inv_sqrt);
    if (normalize) scale_by(b, S, pow2(E));
  }
}

// ---- per-thread scratch ----

struct Scratch {
  float* a = new float[kMaxSegment];
  float* b = new float[kMaxSegment];
  ~Scratch() {
    delete[] a;
    delete[] b;
  }
};

inline Scratch& scratch() {
  static thread_local Scratch s;  // two spans per thread, on the heap
  return s;
}

// ---- quantize ----

struct QuantizeRun {
  const QuantizeArgs* a;
  int64_t row;
  int tensor_e;
  float tensor_c;
  float inv_sqrt;
  float* partial_amax;  // per span (tensor pre-passes)
};

inline const void* row_ptr(const QuantizeArgs& a, int64_t row) {
  const int64_t size = a.x_dtype == kF32 ? 4 : 2;
  return static_cast<const char*>(a.x) + row * a.x_row_stride * size;
}

void quantize_spans(void* ctx, int64_t s0, int64_t s1) {
  const QuantizeRun& r = *static_cast<const QuantizeRun*>(ctx);
  const QuantizeArgs& a = *r.a;
  const int64_t W = span_values(a.lay);
  uint8_t* msg = a.out + r.row * a.lay.nbytes;
  const uint64_t row_ctr = a.offset + uint64_t(r.row * a.lay.padded);
  float* b = scratch().a;
  // tensor scale with the FWHT: the pre-pass left the transformed row in the workspace
  const bool prepared = a.cfg.coarse == kCoarseTensor && a.cfg.fwht && a.transform;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t first = s * W, len = span_len(a.lay, s);
    int e = r.tensor_e;
    if (prepared) {
      std::memcpy(b, a.workspace + r.row * a.lay.padded + first, sizeof(float) * len);
    } else {
      load_values(row_ptr(a, r.row), a.x_dtype, first, len, a.lay.n, b);
      e = normalize_and_transform(a.cfg, b, len, a.signs, a.transform, r.tensor_e, r.inv_sqrt);
    }
    encode_prepared(a.cfg, a.lay, b, first, len, e, r.tensor_c, msg, a.key, row_ctr + uint64_t(first));
  }
}

// Tensor-scale pre-passes: the row's finite amax, and with the FWHT the transformed
// row (kept in the workspace) and its amax.
void tensor_raw_amax(void* ctx, int64_t s0, int64_t s1) {
  const QuantizeRun& r = *static_cast<const QuantizeRun*>(ctx);
  const QuantizeArgs& a = *r.a;
  float* b = scratch().a;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t len = span_len(a.lay, s);
    load_values(row_ptr(a, r.row), a.x_dtype, s * span_values(a.lay), len, a.lay.n, b);
    r.partial_amax[s] = finite_amax(b, len);
  }
}

void tensor_transform(void* ctx, int64_t s0, int64_t s1) {
  const QuantizeRun& r = *static_cast<const QuantizeRun*>(ctx);
  const QuantizeArgs& a = *r.a;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t first = s * span_values(a.lay), len = span_len(a.lay, s);
    float* b = a.workspace + r.row * a.lay.padded + first;
    load_values(row_ptr(a, r.row), a.x_dtype, first, len, a.lay.n, b);
    normalize_and_transform(a.cfg, b, len, a.signs, true, r.tensor_e, r.inv_sqrt);
    r.partial_amax[s] = finite_amax(b, len);
  }
}

inline float max_of(const float* p, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = p[i] > m ? p[i] : m;
  return m;
}

constexpr int64_t kGrainValues = 1 << 15;  // values per parallel chunk

inline int64_t grain_spans(const Layout& lay) {
  return kGrainValues / span_values(lay) > 0 ? kGrainValues / span_values(lay) : 1;
}

void quantize_impl(const QuantizeArgs& a, ParallelFor pf) {
  const int64_t spans = span_count(a.lay);
  if (spans == 0) return;
  float* partial = a.cfg.coarse == kCoarseTensor ? new float[spans] : nullptr;
  for (int64_t row = 0; row < a.rows; ++row) {
    QuantizeRun r{&a, row, 0, 0.0f, inv_sqrt_group(a.cfg.group), partial};
    if (a.cfg.coarse == kCoarseTensor) {
      pf(spans, grain_spans(a.lay), tensor_raw_amax, &r);
      const float amax = max_of(partial, spans);
      r.tensor_e = normalizing_exponent(amax);
      if (a.cfg.fwht && a.transform) {
        pf(spans, grain_spans(a.lay), tensor_transform, &r);
        r.tensor_c = max_of(partial, spans) / coarse_divisor(a.cfg);
      } else {  // amax(x * 2**-e) == amax(x) * 2**-e exactly
        r.tensor_c = (amax * pow2(-r.tensor_e)) / coarse_divisor(a.cfg);
      }
      store_u32_le(a.out + row * a.lay.nbytes, f2u(r.tensor_c * pow2(r.tensor_e)));
    }
    pf(spans, grain_spans(a.lay), quantize_spans, &r);
  }
  delete[] partial;
}

// ---- dequantize ----

struct DequantizeRun {
  const DequantizeArgs* a;
  int64_t row;
  float inv_sqrt;
};

void dequantize_spans(void* ctx, int64_t s0, int64_t s1) {
  const DequantizeRun& r = *static_cast<const DequantizeRun*>(ctx);
  const DequantizeArgs& a = *r.a;
  const uint8_t* msg = a.msgs + r.row * a.lay.nbytes;
  float* b = scratch().a;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t first = s * span_values(a.lay), len = span_len(a.lay, s);
    decode_span(a.cfg, a.lay, msg, first, len, b, true, a.signs, r.inv_sqrt);
    store_values(b, clamp64(a.lay.n - first, 0, len), a.out, a.out_dtype, r.row * a.lay.n + first);
  }
}

void dequantize_impl(const DequantizeArgs& a, ParallelFor pf) {
  const int64_t spans = span_count(a.lay);
  for (int64_t row = 0; spans && row < a.rows; ++row) {
    DequantizeRun r{&a, row, inv_sqrt_group(a.cfg.group)};
    pf(spans, grain_spans(a.lay), dequantize_spans, &r);
  }
}

// ---- dequantize_reduce ----

struct ReduceRun {
  const ReduceArgs* a;
  float inv_sqrt;
  int tensor_e;
  float tensor_c;
  float* partial_amax;
};

// Sum of the world's messages over one span, in the transformed domain, row order.
inline void reduce_span(const ReduceArgs& a, int64_t first, int64_t len, float* acc, float* tmp, float inv_sqrt) {
  decode_span(a.cfg, a.lay, a.msgs, first, len, acc, false, a.signs, inv_sqrt);
  for (int64_t w = 1; w < a.world; ++w) {
    decode_span(a.cfg, a.lay, a.msgs + w * a.lay.nbytes, first, len, tmp, false, a.signs, inv_sqrt);
    for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] + tmp[i];
  }
}

void reduce_spans(void* ctx, int64_t s0, int64_t s1) {
  const ReduceRun& r = *static_cast<const ReduceRun*>(ctx);
  const ReduceArgs& a = *r.a;
  Scratch& sc = scratch();
  float* acc = sc.a;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t first = s * span_values(a.lay), len = span_len(a.lay, s);
    if (a.requantize && a.cfg.coarse == kCoarseTensor) {  // summed by the pre-pass
      std::memcpy(acc, a.workspace + first, sizeof(float) * len);
      scale_by(acc, len, pow2(-r.tensor_e));
    } else {
      reduce_span(a, first, len, acc, sc.b, r.inv_sqrt);
    }
    if (a.requantize) {
      int e = r.tensor_e;
      if (a.cfg.coarse != kCoarseTensor) e = normalize_and_transform(a.cfg, acc, len, a.signs, false, 0, r.inv_sqrt);
      encode_prepared(a.cfg, a.lay, acc, first, len, e, r.tensor_c, a.out_msg, a.key, a.offset + uint64_t(first));
    } else {
      if (a.cfg.fwht) inverse_fwht(acc, len, a.signs, r.inv_sqrt);
      store_values(acc, clamp64(a.lay.n - first, 0, len), a.out, a.out_dtype, first);
    }
  }
}

void reduce_into_workspace(void* ctx, int64_t s0, int64_t s1) {
  const ReduceRun& r = *static_cast<const ReduceRun*>(ctx);
  const ReduceArgs& a = *r.a;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t first = s * span_values(a.lay), len = span_len(a.lay, s);
    float* acc = a.workspace + first;
    reduce_span(a, first, len, acc, scratch().b, r.inv_sqrt);
    r.partial_amax[s] = finite_amax(acc, len);
  }
}

void dequantize_reduce_impl(const ReduceArgs& a, ParallelFor pf) {
  const int64_t spans = span_count(a.lay);
  if (spans == 0) return;
  ReduceRun r{&a, inv_sqrt_group(a.cfg.group), 0, 0.0f, nullptr};
  if (a.requantize && a.cfg.coarse == kCoarseTensor) {
    float* partial = new float[spans];
    r.partial_amax = partial;
    pf(spans, grain_spans(a.lay), reduce_into_workspace, &r);
    const float amax = max_of(partial, spans);
    delete[] partial;
    r.partial_amax = nullptr;
    r.tensor_e = normalizing_exponent(amax);
    r.tensor_c = (amax * pow2(-r.tensor_e)) / coarse_divisor(a.cfg);
    store_u32_le(a.out_msg, f2u(r.tensor_c * pow2(r.tensor_e)));
  }
  pf(spans, grain_spans(a.lay), reduce_spans, &r);
}

}  // namespace
}  // namespace cpu
}  // namespace fp4q
