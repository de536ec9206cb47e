// The CPU codec written once: plain loops over one span at a time, which each
// codec_<isa>.cpp compiles for its instruction set (the compiler vectorizes the simple
// loops).  Everything here has internal linkage (see fp4quant.h).  The steps follow
// docs/format.md; the comments name them.  This file runs the steps of codec_span.h over
// the spans of each message, in parallel.
//
// Work is split into spans of whole padding blocks: a span is one group when the config
// has the FWHT or a per-group coarse scale (the group is the unit of both), else a
// runs of whole micro-groups (Layout.span).  A span is processed in a float32 buffer.
#pragma once

#include <memory>

#include "codec_span.h"

#if defined(FP4Q_AVX512)
#include "simd_avx512_direct.h"
#elif defined(FP4Q_AVX2)
#include "simd_avx2_direct.h"
#endif

namespace fp4q {
namespace cpu {
namespace {


#if defined(FP4Q_SIMD)
// ---- a span quantized straight from its input (simd_*_direct.h's two passes) ----

// Both passes over one span of len values v, message values first .. first+len-1 (maxima
// known: from a tensor pre-pass, pass one is skipped): the coarse scale (per group) times
// sum_scale, micro-scales and codes, as normalize_and_transform + encode_prepared.
// tensor_e, tensor_c: the tensor's exponent and coarse scale (coarse == tensor); ahead: as
// simd::encode_span_direct_t; scratch: len / 8 words.
template <int32_t dtype>
inline void quantize_span_direct_t(const Config& cfg, const Layout& lay, const void* v, int64_t first, int64_t len,
                                   int64_t ahead, int tensor_e, float tensor_c, float sum_scale, uint8_t* msg,
                                   const uint32_t* known_maxima, uint32_t* scratch) {
  const uint32_t* maxima = known_maxima;  // known only from a tensor scale's pre-pass: raw is not needed then
  float raw = 0.0f;
  if (!maxima) {
    raw = simd::span_maxima_t<dtype>(v, len, scratch);
    maxima = scratch;
  }
  int e = 0;
  float c = tensor_c;
  if (cfg.coarse == kCoarseGroup) {
    e = normalizing_exponent(raw);
    c = (raw * pow2(-e)) / coarse_divisor(cfg);  // the normalized span's amax, exactly
    store_u32_le(msg + 4 * (first / cfg.group), f2u((c * pow2(e)) * sum_scale));
  }
  if (cfg.coarse == kCoarseTensor) e = tensor_e;
  float* r = reinterpret_cast<float*>(scratch + len / 16);
  if (cfg.coarse == kCoarseNone)
    simd::encode_span_direct_t<dtype, false>(cfg, lay, v, first, len, ahead, e, c, msg, maxima, r);
  else
    simd::encode_span_direct_t<dtype, true>(cfg, lay, v, first, len, ahead, e, c, msg, maxima, r);
}

// quantize_span_direct_t for values of the dtype: the span of the row x at first .. first+len-1
// (n values in the row; sum_scale 1).
inline void quantize_span_direct(const Config& cfg, const Layout& lay, const void* x, int32_t dtype, int64_t first,
                                 int64_t len, int tensor_e, float tensor_c, uint8_t* msg, const uint32_t* known_maxima,
                                 uint32_t* scratch) {
  const int64_t ahead = ahead_values(first, len, lay.n);
  if (dtype == kF32)
    return quantize_span_direct_t<kF32>(cfg, lay, static_cast<const float*>(x) + first, first, len, ahead, tensor_e,
                                        tensor_c, 1.0f, msg, known_maxima, scratch);
  const uint16_t* h = static_cast<const uint16_t*>(x) + first;
  if (dtype == kBF16)
    return quantize_span_direct_t<kBF16>(cfg, lay, h, first, len, ahead, tensor_e, tensor_c, 1.0f, msg, known_maxima,
                                         scratch);
  quantize_span_direct_t<kF16>(cfg, lay, h, first, len, ahead, tensor_e, tensor_c, 1.0f, msg, known_maxima, scratch);
}

// Pass one of the span at first .. first+len-1 of the row x for a tensor pre-pass: maxima into
// `maxima`, the span's finite amax returned.
inline float span_maxima(const void* x, int32_t dtype, int64_t first, int64_t len, uint32_t* maxima) {
  if (dtype == kF32) return simd::span_maxima_t<kF32>(static_cast<const float*>(x) + first, len, maxima);
  const uint16_t* h = static_cast<const uint16_t*>(x) + first;
  return dtype == kBF16 ? simd::span_maxima_t<kBF16>(h, len, maxima) : simd::span_maxima_t<kF16>(h, len, maxima);
}
#endif

constexpr int64_t kMaxSegment = 1 << 16;  // QuantConfig.group <= 2**16

// ---- per-thread scratch ----

struct Scratch {
  float* a = new float[kMaxSegment];
  uint32_t* words = new uint32_t[kMaxSegment / 8];  // a direct encoding's maxima and factors (of a span in a)
  ~Scratch() {
    delete[] a;
    delete[] words;
  }
};

inline Scratch& scratch() {
  static thread_local Scratch s;  // one span per thread, on the heap
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
  uint32_t* maxima;     // the row's micro-group maxima from a tensor pre-pass (AVX-512 direct spans), or nullptr
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
#if defined(FP4Q_SIMD)
    if (simd::direct_applies(a.cfg, a.transform, first, len, a.lay.n)) {
      quantize_span_direct(a.cfg, a.lay, row_ptr(a, r.row), a.x_dtype, first, len, r.tensor_e, r.tensor_c, msg,
                           r.maxima ? r.maxima + first / 16 : nullptr, reinterpret_cast<uint32_t*>(b));
      continue;
    }
    if (simd::transformed_applies(a.cfg, a.transform, first, len, a.lay.n)) {
      simd::quantize_span_transformed(a.cfg, a.lay, row_ptr(a, r.row), a.x_dtype, first, len, a.signs, r.inv_sqrt, msg,
                                      a.key, row_ctr + uint64_t(first), b);
      continue;
    }
#endif
    int e = r.tensor_e;
    float amax = kUnknownAmax;
    if (prepared) {
      std::memcpy(b, a.workspace + r.row * a.lay.padded + first, sizeof(float) * len);
    } else if (a.cfg.coarse == kCoarseTensor) {  // no FWHT: step 1 alone, the tensor's 2**-e while loading
      load_values_times(row_ptr(a, r.row), a.x_dtype, first, len, a.lay.n, b, pow2(-r.tensor_e));
    } else {
      // a group's exponent needs the raw amax: loading computes it on the way
      const bool group_e = a.cfg.coarse == kCoarseGroup || (a.cfg.coarse == kCoarseNone && a.cfg.fwht && a.transform);
      float raw = kUnknownAmax;
      if (group_e) raw = load_values_amax(row_ptr(a, r.row), a.x_dtype, first, len, a.lay.n, b);
      else load_values(row_ptr(a, r.row), a.x_dtype, first, len, a.lay.n, b);
      e = normalize_and_transform(a.cfg, b, len, a.signs, a.transform, r.tensor_e, r.inv_sqrt, raw, &amax);
    }
    encode_prepared(a.cfg, a.lay, b, first, len, e, r.tensor_c, msg, a.key, row_ctr + uint64_t(first), 1.0f, amax);
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
#if defined(FP4Q_SIMD)
    const int64_t first = s * span_values(a.lay);
    if (r.maxima && simd::direct_applies(a.cfg, a.transform, first, len, a.lay.n)) {  // pass one of the span, too
      r.partial_amax[s] = span_maxima(row_ptr(a, r.row), a.x_dtype, first, len, r.maxima + first / 16);
      continue;
    }
    if (len <= a.lay.n - s * span_values(a.lay) && len % 16 == 0) {  // read only
      r.partial_amax[s] = simd::input_amax(row_ptr(a, r.row), a.x_dtype, s * span_values(a.lay), len);
      continue;
    }
#endif
    r.partial_amax[s] = load_values_amax(row_ptr(a, r.row), a.x_dtype, s * span_values(a.lay), len, a.lay.n, b);
  }
}

void tensor_transform(void* ctx, int64_t s0, int64_t s1) {
  const QuantizeRun& r = *static_cast<const QuantizeRun*>(ctx);
  const QuantizeArgs& a = *r.a;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t first = s * span_values(a.lay), len = span_len(a.lay, s);
    float* b = a.workspace + r.row * a.lay.padded + first;
    load_values(row_ptr(a, r.row), a.x_dtype, first, len, a.lay.n, b);
    float amax = kUnknownAmax;
    normalize_and_transform(a.cfg, b, len, a.signs, true, r.tensor_e, r.inv_sqrt, kUnknownAmax, &amax);
    r.partial_amax[s] = amax >= 0.0f ? amax : finite_amax(b, len);
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
  std::unique_ptr<float[]> partial(a.cfg.coarse == kCoarseTensor ? new float[spans] : nullptr);
  std::unique_ptr<uint32_t[]> maxima;
#if defined(FP4Q_SIMD)
  // the tensor pre-pass reads every value anyway: it keeps the micro-group maxima of the
  // spans that quantize_span_direct encodes, which then read the input once more, not twice
  if (a.cfg.coarse == kCoarseTensor && simd::direct_applies(a.cfg, a.transform, 0, 0, a.lay.n))
    maxima.reset(new uint32_t[a.lay.padded / 16]);
#endif
  for (int64_t row = 0; row < a.rows; ++row) {
    QuantizeRun r{&a, row, 0, 0.0f, inv_sqrt_group(a.cfg.group), partial.get(), maxima.get()};
    if (a.cfg.coarse == kCoarseTensor) {
      pf(spans, grain_spans(a.lay), tensor_raw_amax, &r);
      const float amax = max_of(partial.get(), spans);
      r.tensor_e = normalizing_exponent(amax);
      if (a.cfg.fwht && a.transform) {
        pf(spans, grain_spans(a.lay), tensor_transform, &r);
        r.tensor_c = max_of(partial.get(), spans) / coarse_divisor(a.cfg);
      } else {  // amax(x * 2**-e) == amax(x) * 2**-e exactly
        r.tensor_c = (amax * pow2(-r.tensor_e)) / coarse_divisor(a.cfg);
      }
      store_u32_le(a.out + row * a.lay.nbytes, f2u(r.tensor_c * pow2(r.tensor_e)));
    }
    pf(spans, grain_spans(a.lay), quantize_spans, &r);
  }
}

// ---- dequantize ----

struct DequantizeRun {
  const DequantizeArgs* a;
  int64_t row;
  float inv_sqrt;
  bool stream;  // the output exceeds the last-level cache: stream it past the caches
};

constexpr int64_t kStreamBytes = int64_t(32) << 20;

void dequantize_spans(void* ctx, int64_t s0, int64_t s1) {
  const DequantizeRun& r = *static_cast<const DequantizeRun*>(ctx);
  const DequantizeArgs& a = *r.a;
  const uint8_t* msg = a.msgs + r.row * a.lay.nbytes;
  float* b = scratch().a;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t first = s * span_values(a.lay), len = span_len(a.lay, s);
    const int E = decode_normalizes(a.cfg) ? block_exponent(a.cfg, a.lay, msg, first, len) : 0;
#if defined(FP4Q_SIMD)
    if (dequantize_span_direct(a.cfg, a.lay, msg, first, len, E, a.out, a.out_dtype, r.row * a.lay.n + first,
                               a.saturate, r.stream))
      continue;
#endif
    decode_span(a.cfg, a.lay, msg, first, len, b, E);
#if defined(FP4Q_AVX512)
    if (a.cfg.fwht && len % 16 == 0 && first + len <= a.lay.n) {  // the transform's last pass stores the values
      const int64_t size = a.out_dtype == kF32 ? 4 : 2;
      avx512::FwhtOps o{false, 1.0f, nullptr, r.inv_sqrt, a.signs, decode_normalizes(a.cfg), pow2(E), false};
      o.dst = static_cast<char*>(a.out) + (r.row * a.lay.n + first) * size;
      o.dst_dtype = a.out_dtype;
      o.dst_saturate = a.saturate;
      o.dst_stream = r.stream && a.out_dtype == kF32 && (reinterpret_cast<uintptr_t>(o.dst) & 63) == 0;
      avx512::fwht_fused(b, len, o);
      continue;
    }
#endif
    finish_span(a.cfg, b, len, E, a.signs, r.inv_sqrt);
    store_values(b, clamp64(a.lay.n - first, 0, len), a.out, a.out_dtype, r.row * a.lay.n + first, a.saturate,
                 r.stream);
  }
#if defined(FP4Q_SIMD)
  if (r.stream) _mm_sfence();  // the streamed stores are visible before the region ends
#endif
}

void dequantize_impl(const DequantizeArgs& a, ParallelFor pf) {
  const int64_t spans = span_count(a.lay);
  for (int64_t row = 0; spans && row < a.rows; ++row) {
    const int64_t bytes = a.rows * a.lay.n * (a.out_dtype == kF32 ? 4 : 2);
    DequantizeRun r{&a, row, inv_sqrt_group(a.cfg.group), bytes >= kStreamBytes};
    pf(spans, grain_spans(a.lay), dequantize_spans, &r);
  }
}

// ---- dequantize_reduce ----

struct ReduceRun {
  const ReduceArgs* a;
  float inv_sqrt;
  int tensor_e;    // requantize, tensor scale: normalizing exponent of the (normalized) sum
  float tensor_c;
  int tensor_E;    // tensor scale: the largest of the messages' block exponents
  float* partial_amax;
};

// The block exponent of a span of the sum: the largest of the messages' (0 when the config
// does not normalize).
inline int sum_exponent(const ReduceArgs& a, int64_t first, int64_t len) {
  if (!decode_normalizes(a.cfg)) return 0;
  int E = block_exponent(a.cfg, a.lay, a.msgs, first, len);
  for (int64_t w = 1; w < a.world; ++w) {
    const int Ew = block_exponent(a.cfg, a.lay, a.msgs + w * a.lay.nbytes, first, len);
    E = Ew > E ? Ew : E;
  }
  return E;
}

// Sum of the world's messages over one span against 2**-E, in the transformed domain, row order.
inline void reduce_span(const ReduceArgs& a, int64_t first, int64_t len, int E, float* acc) {
  decode_span(a.cfg, a.lay, a.msgs, first, len, acc, E);
  for (int64_t w = 1; w < a.world; ++w) decode_span(a.cfg, a.lay, a.msgs + w * a.lay.nbytes, first, len, acc, E, true);
}

void reduce_spans(void* ctx, int64_t s0, int64_t s1) {
  const ReduceRun& r = *static_cast<const ReduceRun*>(ctx);
  const ReduceArgs& a = *r.a;
  float* acc = scratch().a;
  const bool tensor = a.cfg.coarse == kCoarseTensor;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t first = s * span_values(a.lay), len = span_len(a.lay, s);
    const int E = tensor ? r.tensor_E : sum_exponent(a, first, len);
    reduce_span(a, first, len, E, acc);  // again after the pre-pass: cheaper than keeping the sum
#if defined(FP4Q_SIMD)
    // the sum encoded where it is, as a quantize without the transform encodes its input
    if (a.requantize && a.cfg.coarse != kCoarseNone && simd::direct_applies(a.cfg, false, first, len, a.lay.n)) {
      quantize_span_direct_t<kF32>(a.cfg, a.lay, acc, first, len, 0, r.tensor_e, r.tensor_c,
                                   decode_normalizes(a.cfg) ? pow2(E) : 1.0f, a.out_msg, nullptr, scratch().words);
      continue;
    }
#endif
    if (a.requantize && tensor) scale_by(acc, len, pow2(-r.tensor_e));
    if (a.requantize) {
      // a coarse scale carries 2**E; without one the values get it back (saturating)
      if (a.cfg.coarse == kCoarseNone && decode_normalizes(a.cfg)) scale_saturating(acc, len, pow2(E));
      int e = r.tensor_e;
      if (!tensor) e = normalize_and_transform(a.cfg, acc, len, a.signs, false, 0, r.inv_sqrt);
      encode_prepared(a.cfg, a.lay, acc, first, len, e, r.tensor_c, a.out_msg, a.key, a.offset + uint64_t(first),
                      decode_normalizes(a.cfg) ? pow2(E) : 1.0f);
    } else {
      finish_span(a.cfg, acc, len, E, a.signs, r.inv_sqrt);
      store_values(acc, clamp64(a.lay.n - first, 0, len), a.out, a.out_dtype, first, a.world == 1);
    }
  }
}

// Tensor-scale pre-pass of a re-quantized sum: the finite amax of each span of the sum.
void reduce_amax(void* ctx, int64_t s0, int64_t s1) {
  const ReduceRun& r = *static_cast<const ReduceRun*>(ctx);
  const ReduceArgs& a = *r.a;
  float* acc = scratch().a;
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t first = s * span_values(a.lay), len = span_len(a.lay, s);
    reduce_span(a, first, len, r.tensor_E, acc);
    r.partial_amax[s] = finite_amax(acc, len);
  }
}

void dequantize_reduce_impl(const ReduceArgs& a, ParallelFor pf) {
  const int64_t spans = span_count(a.lay);
  if (spans == 0) return;
  ReduceRun r{&a, inv_sqrt_group(a.cfg.group), 0, 0.0f, 0, nullptr};
  if (a.cfg.coarse == kCoarseTensor) r.tensor_E = sum_exponent(a, 0, span_len(a.lay, 0));
  if (a.requantize && a.cfg.coarse == kCoarseTensor) {
    float* partial = new float[spans];
    r.partial_amax = partial;
    pf(spans, grain_spans(a.lay), reduce_amax, &r);
    const float amax = max_of(partial, spans);
    delete[] partial;
    r.partial_amax = nullptr;
    r.tensor_e = normalizing_exponent(amax);
    r.tensor_c = (amax * pow2(-r.tensor_e)) / coarse_divisor(a.cfg);
    store_u32_le(a.out_msg, f2u((r.tensor_c * pow2(r.tensor_e)) * pow2(r.tensor_E)));
  }
  pf(spans, grain_spans(a.lay), reduce_spans, &r);
}

}  // namespace
}  // namespace cpu
}  // namespace fp4q
