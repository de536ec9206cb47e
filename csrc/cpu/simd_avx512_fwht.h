// AVX-512 pieces of the CPU codec, part one: the fast Walsh-Hadamard transform and the
// finite amax (included through simd_avx512.h, in codec_avx512.cpp only).  Each computes
// exactly what the scalar loop it replaces computes: the same IEEE operations on the same
// operands, 16 values per instruction.  One 16-value micro-group is one register.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace fp4q {
namespace cpu {
namespace {
namespace avx512 {

constexpr int64_t kLanes = 16;  // floats per register

inline __m512 abs_ps(__m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
}

inline __mmask16 finite_mask(__m512 a_abs) { return _mm512_cmp_ps_mask(a_abs, _mm512_set1_ps(__builtin_inff()), _CMP_LT_OQ); }

// 16 input values from index i of x as floats (float32, bfloat16 or float16).
template <int32_t dtype>
inline __m512 load_input(const void* x, int64_t i) {
  if (dtype == kF32) return _mm512_loadu_ps(static_cast<const float*>(x) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(x) + i));
  return dtype == kBF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

// load_input for a dtype known at run time.
inline __m512 load_any(const void* x, int32_t dtype, int64_t i) {
  if (dtype == kF32) return load_input<kF32>(x, i);
  return dtype == kBF16 ? load_input<kBF16>(x, i) : load_input<kF16>(x, i);
}

inline __m512i abs_bits(__m512 v) { return _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)); }

// The finite amax from the largest |value| bits m seen, or -1 when that is not finite (the
// caller then takes the masked maximum).  The integer maximum has a latency of one cycle,
// the masked float maximum four: a chain of them bounds a loop that does little else.
inline float finite_or_unknown(__m512i m) {
  const uint32_t bits = _mm512_reduce_max_epu32(m);
  return bits < 0x7F800000u ? u2f(bits) : -1.0f;
}

inline float finite_amax_masked(const float* b, int64_t n) {
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 a = abs_ps(_mm512_loadu_ps(b + i));
    m = _mm512_mask_max_ps(m, finite_mask(a), m, a);
  }
  return _mm512_reduce_max_ps(m);
}

inline float finite_amax(const float* b, int64_t n) {
  __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_max_epu32(m0, abs_bits(_mm512_loadu_ps(b + i)));
    m1 = _mm512_max_epu32(m1, abs_bits(_mm512_loadu_ps(b + i + 16)));
  }
  for (; i < n; i += 16) m0 = _mm512_max_epu32(m0, abs_bits(_mm512_loadu_ps(b + i)));
  const float a = finite_or_unknown(_mm512_max_epu32(m0, m1));
  return a >= 0.0f ? a : finite_amax_masked(b, n);
}

// Saturate to the dtype's range keeping NaN (min_ps(bound, x) returns x when x is NaN) when
// `saturate`, then round to the dtype (fp4quant.h: out_f32).
inline __m512 clamp_ps(__m512 v, float bound, bool saturate) {
  if (!saturate) return v;
  return _mm512_max_ps(_mm512_set1_ps(-bound), _mm512_min_ps(_mm512_set1_ps(bound), v));
}

// 16 values to out[i .. i+15] in the dtype (store_values, one register); stream: around the
// caches (float32 at a 64-byte boundary only: no read for ownership).
inline void store16(__m512 v, void* out, int32_t dtype, int64_t i, bool saturate, bool stream) {
  if (dtype == kF32) {
    float* p = static_cast<float*>(out) + i;
    v = clamp_ps(v, kF32Max, saturate);
    if (stream) _mm512_stream_ps(p, v);
    else _mm512_storeu_ps(p, v);
  } else if (dtype == kBF16) {
    v = clamp_ps(v, kBF16Max, saturate);
    __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    u = _mm512_mask_mov_epi32(u, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), _mm512_cvtepi32_epi16(u));
  } else {
    v = clamp_ps(v, kHalfMax, saturate);
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // canonical NaN 0x7E00 with the sign, as c10::Half and the scalar path produce
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m256i sign = _mm256_and_si256(h, _mm256_set1_epi16(int16_t(0x8000)));
    h = _mm256_mask_mov_epi16(h, nan, _mm256_or_si256(sign, _mm256_set1_epi16(0x7E00)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), h);
  }
}

// One butterfly stage of stride h < 16 inside a register: the partner of lane i is lane
// i ^ h; lanes with bit h clear get a + b, lanes with it set get a - b (a: the lower one).
// Lower lanes v * 1 + p, upper lanes v * -1 + p = p - v, in one fused multiply-add: the
// product is exact, so its single rounding is the sum's (NaN payloads aside, the same bits
// as add/sub and a blend, two operations fewer).  `sign`: -1 in the upper lanes, else 1.
// The partners by immediate shuffles, in-lane for h = 1, 2 and of 128-bit blocks for 4, 8:
// on AMD Zen 4 their latencies are 1 and 4 cycles against 5 for a variable permute (measured;
// the throughput is the same), and a chain of four stages per register is the first pass.
template <int h>
inline __m512 partners(__m512 v) {
  static_assert(h == 1 || h == 2 || h == 4 || h == 8, "a stride inside one 16-lane register");
  if (h == 1) return _mm512_permute_ps(v, 0xB1);      // lanes 1 0 3 2 of each 128-bit block
  if (h == 2) return _mm512_permute_ps(v, 0x4E);      // lanes 2 3 0 1
  if (h == 4) return _mm512_shuffle_f32x4(v, v, 0xB1);  // blocks 1 0 3 2
  return _mm512_shuffle_f32x4(v, v, 0x4E);            // blocks 2 3 0 1
}

template <int h>
inline __m512 stage_in_register(__m512 v, __m512 sign) {
  return _mm512_fmadd_ps(v, sign, partners<h>(v));
}

// -1 in the lanes of `upper`, 1 elsewhere
inline __m512 lane_signs(__mmask16 upper) { return _mm512_mask_blend_ps(upper, _mm512_set1_ps(1.0f), _mm512_set1_ps(-1.0f)); }

// R registers r[0..R) of 16 values each, R/2 .. 1 apart in a block: the butterfly stages of
// strides 16 * (1, 2, .. R/2) across them (lower + upper, lower - upper: as butterflies()).
template <int R>
inline void stages_across(__m512* r) {
#pragma GCC unroll 4
  for (int m = 1; m < R; m *= 2) {
#pragma GCC unroll 16
    for (int k = 0; k < R; ++k) {
      if (k & m) continue;
      const __m512 a = r[k], c = r[k + m];
      r[k] = _mm512_add_ps(a, c);
      r[k + m] = _mm512_sub_ps(a, c);
    }
  }
}

template <int R>
inline void stages_in_register(__m512* r) {
#pragma GCC unroll 16
  for (int k = 0; k < R; ++k) {
    __m512 v = r[k];
    v = stage_in_register<1>(v, lane_signs(0xAAAA));
    v = stage_in_register<2>(v, lane_signs(0xCCCC));
    v = stage_in_register<4>(v, lane_signs(0xF0F0));
    r[k] = stage_in_register<8>(v, lane_signs(0xFF00));
  }
}

// All radix-2 stages on n values (n a multiple of 16): strides 1..8 (level one, in
// registers), then 16..n/2 (level two, register pairs).
inline void butterflies(float* b, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    __m512 v = _mm512_loadu_ps(b + i);
    stages_in_register<1>(&v);
    _mm512_storeu_ps(b + i, v);
  }
  for (int64_t h = 16; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = 0; j < h; j += 16) {
        const __m512 a = _mm512_loadu_ps(b + i + j), c = _mm512_loadu_ps(b + i + j + h);
        _mm512_storeu_ps(b + i + j, _mm512_add_ps(a, c));
        _mm512_storeu_ps(b + i + j + h, _mm512_sub_ps(a, c));
      }
    }
  }
}

// What a fused transform does around its butterflies, to each value, in this order:
// before, times `pre` then times its sign; after, times `post`, then its sign, then times `f`
// (each only where asked); `amax`: return the finite amax of the result.
struct FwhtOps {
  bool pre_on;
  float pre;
  const float* pre_signs;
  float post;
  const float* post_signs;
  bool f_on;
  float f;
  bool amax;
  // where the first pass reads its values (before `pre`), when not from b: n values of
  // src_dtype; and up to 4n bytes of a later span, fetched into the caches meanwhile (or nullptr)
  const void* src = nullptr;
  int32_t src_dtype = 0;
  const char* ahead = nullptr;
  int64_t ahead_bytes = 0;
  // where the last pass stores its values, when not into b: n values of dst_dtype (store16;
  // not with amax, whose fallback reads b)
  void* dst = nullptr;
  int32_t dst_dtype = 0;
  bool dst_saturate = false;
  bool dst_stream = false;
};

// A plan: what a fused transform does, fixed at compile time for the callers' common cases, so
// that its passes test nothing per register (each FwhtOps test costs a load and a branch in
// every register of every pass otherwise: removing them made fp4quant's quantize 1.44x
// faster in cache on Zen 4, measured).
// kAny: read FwhtOps at run time (every other case).  Src, Dst: kBuffer (b itself) or a dtype.
constexpr int kAny = -2;
constexpr int kBuffer = -1;
enum PlanFlag : int { kPlanPre = 1, kPlanPreSigns = 2, kPlanPostSigns = 4, kPlanF = 8, kPlanAmax = 16 };

template <int Src, int Flags, int Dst>
struct Plan {
  static constexpr int src = Src, flags = Flags, dst = Dst;
  // whether flag f is on: from the plan, or from the run-time value when the plan is kAny
  static constexpr bool on(int f, bool run_time) { return Flags == kAny ? run_time : (Flags & f) != 0; }
};
using AnyPlan = Plan<kAny, kAny, kAny>;

// The last pass's store of the register at b + at: to b, or converted to o.dst.
template <class P>
inline void store_result(float* b, int64_t at, __m512 v, const FwhtOps& o) {
  if constexpr (P::dst == kBuffer) {
    _mm512_storeu_ps(b + at, v);
  } else if constexpr (P::dst == kAny) {
    if (o.dst) store16(v, o.dst, o.dst_dtype, at, o.dst_saturate, o.dst_stream);
    else _mm512_storeu_ps(b + at, v);
  } else {
    store16(v, o.dst, P::dst, at, o.dst_saturate, o.dst_stream);
  }
}

// 16 values from index i of the first pass's source, as floats.
template <class P>
inline __m512 load_source(const FwhtOps& o, const float* b, int64_t i) {
  if constexpr (P::src == kBuffer) return _mm512_loadu_ps(b + i);
  else if constexpr (P::src == kAny) return o.src ? load_any(o.src, o.src_dtype, i) : _mm512_loadu_ps(b + i);
  else return load_input<P::src>(o.src, i);
}

template <class P>
inline __m512 before(__m512 v, const FwhtOps& o, int64_t at) {
  if (P::on(kPlanPre, o.pre_on)) v = _mm512_mul_ps(v, _mm512_set1_ps(o.pre));
  if (P::on(kPlanPreSigns, o.pre_signs != nullptr)) v = _mm512_mul_ps(v, _mm512_loadu_ps(o.pre_signs + at));
  return v;
}

template <class P>
inline __m512 after(__m512 v, const FwhtOps& o, int64_t at, __m512i& m) {
  v = _mm512_mul_ps(v, _mm512_set1_ps(o.post));
  if (P::on(kPlanPostSigns, o.post_signs != nullptr)) v = _mm512_mul_ps(v, _mm512_loadu_ps(o.post_signs + at));
  if (P::on(kPlanF, o.f_on)) v = _mm512_mul_ps(v, _mm512_set1_ps(o.f));
  if (P::on(kPlanAmax, o.amax)) m = _mm512_max_epu32(m, abs_bits(v));
  // one line of the span fetched ahead per register stored (in the last pass only: fetching
  // during the first as well was slower, measured)
  if (4 * at < o.ahead_bytes) _mm_prefetch(o.ahead + 4 * at, _MM_HINT_T1);
  return v;
}

// One pass over n values of the stages h, 2h, .. h * (R/2) (h >= 16), R registers at a time;
// `last`: the stages end here, then the `after` operations.  o by value: a copy the stores
// to b cannot alias, so its fields stay in registers.
template <class P, int R, bool last>
inline void stages_pass(float* b, int64_t n, int64_t h, const FwhtOps o, __m512i& m) {
  for (int64_t i = 0; i < n; i += R * h) {
    for (int64_t j = 0; j < h; j += 16) {
      __m512 r[R];
#pragma GCC unroll 16
      for (int k = 0; k < R; ++k) r[k] = _mm512_loadu_ps(b + i + j + k * h);
      stages_across<R>(r);
#pragma GCC unroll 16
      for (int k = 0; k < R; ++k) {
        if (last) store_result<P>(b, i + j + k * h, after<P>(r[k], o, i + j + k * h, m), o);
        else _mm512_storeu_ps(b + i + j + k * h, r[k]);
      }
    }
  }
}

// The first pass: R registers (R * 16 values) at a time, the stages of strides 1 .. R * 8.
template <class P, int R, bool last>
inline void first_pass(float* b, int64_t n, const FwhtOps o, __m512i& m) {
  for (int64_t i = 0; i < n; i += 16 * R) {
    __m512 r[R];
#pragma GCC unroll 16
    for (int k = 0; k < R; ++k) r[k] = before<P>(load_source<P>(o, b, i + 16 * k), o, i + 16 * k);
    stages_in_register<R>(r);
    stages_across<R>(r);
#pragma GCC unroll 16
    for (int k = 0; k < R; ++k) {
      if (last) store_result<P>(b, i + 16 * k, after<P>(r[k], o, i + 16 * k, m), o);
      else _mm512_storeu_ps(b + i + 16 * k, r[k]);
    }
  }
}

// fwht_fused under the plan P (o must agree with it).
template <class P>
inline float fwht_fused_t(float* b, int64_t n, const FwhtOps& o) {
  __m512i m = _mm512_setzero_si512();
  int64_t h = n <= 128 ? n : 256;  // the first pass's values: strides below h done
  if (n == 256) first_pass<P, 16, true>(b, n, o, m);
  if (n > 256) first_pass<P, 16, false>(b, n, o, m);
  if (n == 128) first_pass<P, 8, true>(b, n, o, m);
  if (n == 64) first_pass<P, 4, true>(b, n, o, m);
  if (n == 32) first_pass<P, 2, true>(b, n, o, m);
  if (n == 16) first_pass<P, 1, true>(b, n, o, m);
  while (h < n) {
    const int64_t left = n / h;  // strides h .. n/2 remain: log2(left) stages
    const int radix = left >= 8 ? 8 : (left >= 4 ? 4 : 2);
    if (radix == 8) left == 8 ? stages_pass<P, 8, true>(b, n, h, o, m) : stages_pass<P, 8, false>(b, n, h, o, m);
    if (radix == 4) left == 4 ? stages_pass<P, 4, true>(b, n, h, o, m) : stages_pass<P, 4, false>(b, n, h, o, m);
    if (radix == 2) stages_pass<P, 2, true>(b, n, h, o, m);
    h *= radix;
  }
  if (!P::on(kPlanAmax, o.amax)) return 0.0f;
  const float a = finite_or_unknown(m);
  return a >= 0.0f ? a : finite_amax_masked(b, n);
}

// The plan of a quantize's transform (times 2**-e, the signs if any, then the amax: the
// codec's forward step) reading the source Src, or the general plan.
template <int Src>
inline float fwht_forward(float* b, int64_t n, const FwhtOps& o) {
  if (o.pre_signs) return fwht_fused_t<Plan<Src, kPlanPre | kPlanPreSigns | kPlanAmax, kBuffer>>(b, n, o);
  return fwht_fused_t<Plan<Src, kPlanPre | kPlanAmax, kBuffer>>(b, n, o);
}

// The plan of a dequantize's inverse transform (the signs and 2**E if any) storing to Dst.
template <int Dst>
inline float fwht_inverse(float* b, int64_t n, const FwhtOps& o) {
  if (o.post_signs && o.f_on) return fwht_fused_t<Plan<kBuffer, kPlanPostSigns | kPlanF, Dst>>(b, n, o);
  if (o.post_signs) return fwht_fused_t<Plan<kBuffer, kPlanPostSigns, Dst>>(b, n, o);
  if (o.f_on) return fwht_fused_t<Plan<kBuffer, kPlanF, Dst>>(b, n, o);
  return fwht_fused_t<Plan<kBuffer, 0, Dst>>(b, n, o);
}

// The FWHT on n values (a power of two >= 16) with the operations around it fused into few
// passes: the same IEEE operations on each value as the separate loops (scale_by, multiply,
// butterflies) in turn.  The first pass does strides 1 .. 128 (256 values, 16 registers), then
// each pass up to 8 strides: for 2048 values two passes, not three (4% faster on a Xeon with
// AVX-512; the radix-16 pass after an 8-register first one was slower).  Returns the finite
// amax of the result when o.amax.  The codec's two cases run under a compile-time plan.
inline float fwht_fused(float* b, int64_t n, const FwhtOps& o) {
  const bool forward = o.pre_on && o.amax && !o.post_signs && !o.f_on && !o.dst;
  if (forward && !o.src) return fwht_forward<kBuffer>(b, n, o);
  if (forward && o.src_dtype == kF32) return fwht_forward<kF32>(b, n, o);
  if (forward && o.src_dtype == kBF16) return fwht_forward<kBF16>(b, n, o);
  if (forward && o.src_dtype == kF16) return fwht_forward<kF16>(b, n, o);
  const bool inverse = !o.pre_on && !o.pre_signs && !o.amax && !o.src;
  if (inverse && !o.dst) return fwht_inverse<kBuffer>(b, n, o);
  if (inverse && o.dst_dtype == kF32) return fwht_inverse<kF32>(b, n, o);
  if (inverse && o.dst_dtype == kBF16) return fwht_inverse<kBF16>(b, n, o);
  if (inverse && o.dst_dtype == kF16) return fwht_inverse<kF16>(b, n, o);
  return fwht_fused_t<AnyPlan>(b, n, o);
}

}  // namespace avx512
}  // namespace
}  // namespace cpu
}  // namespace fp4q
