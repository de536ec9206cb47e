// fp4quant: the scalar math of docs/format.md, shared by the C++ (CPU) and CUDA kernels.
//
// Plain C++17, no torch headers: nvcc compiles it for the device, any C++ compiler for
// the host.  Every function follows the reference (fp4quant/reference) operation for
// operation, in float32 with round-to-nearest-even, so the kernels reproduce its bits.
// A fused multiply-add rounds once where the reference rounds twice, so every float
// operation here goes through mul_rn / add_rn / sub_rn / div_rn / rcp_rn (fma_rn where
// one rounding is the contract): on the device these are the intrinsics nvcc never
// contracts, whatever --fmad says (tests/ops/test_cuda.py compares the SASS of the default
// build with the --fmad=false one); on the host they are the plain operators, so host
// builds keep FP contraction off (-ffp-contract=off: setup.py, tests/ops/cuda_emu/build.py).
#pragma once

#include <cstdint>
#include <cstring>

// Internal linkage on purpose: the CPU kernels are compiled several times with different
// instruction sets (scalar, AVX2, AVX-512), and an inline function with external linkage
// would let the linker keep the AVX-512 copy for everyone.
#if defined(__CUDACC__)
#define FP4Q_HD static __host__ __device__ __forceinline__
#else
#define FP4Q_HD static inline
#endif

namespace fp4q {

// ---- float32 arithmetic: one rounding (to nearest even) per operation ----

FP4Q_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

FP4Q_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

FP4Q_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// IEEE division (never the approximate one, whatever -prec-div says)
FP4Q_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// 1 / a, correctly rounded (= div_rn(1.0f, a))
FP4Q_HD float rcp_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(a);
#else
  return 1.0f / a;
#endif
}

// a * b + c with one rounding: only where that is the contract (an exact product)
FP4Q_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

// a / d for a constant d > 0 given C = fp32(1 / d): RN(a * C), then one correction with the
// remainder, which the fused multiply-add computes exactly (Markstein).  Equal to div_rn(a, d)
// whenever that quotient is zero or at least 2**-126 (a normal float); below, both are below
// 2**-126 (tests/ops/test_encoders.py checks every float for the divisors used: 6, 2688).
FP4Q_HD float div_const_rn(float a, float d, float C) {
  const float q = mul_rn(a, C);
  return fma_rn(fma_rn(-q, d, a), C, q);
}

// ---- configuration (mirrors fp4quant.format.QuantConfig; see fp4quant/ops/codes.py) ----

enum Element : int32_t { kE2M1 = 0, kInt4 = 1, kE4M3 = 2 };
enum ScaleFormat : int32_t { kScaleE4M3 = 0, kScaleE8M0 = 1, kScaleFP16 = 2, kScaleNone = 3 };
enum Coarse : int32_t { kCoarseGroup = 0, kCoarseTensor = 1, kCoarseNone = 2 };
enum ScaleRound : int32_t { kScaleNearest = 0, kScaleUp = 1, kScaleFloor = 2 };
enum Rounding : int32_t { kRoundNearest = 0, kRoundStochastic = 1 };
enum Packing : int32_t { kPackWarp = 0, kPackNaive = 1 };
enum DType : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

constexpr int kConfigFields = 9;  // length of the int[] config of the ops

struct Config {
  int32_t element, micro_group, group, micro_scale, coarse, scale_round, fwht, rounding, packing;
};

// Byte layout of one message of n values (docs/format.md, "Layout").
struct Layout {
  int64_t n, padded, block;
  int64_t span;  // values per unit of work: the group, or whole micro-groups (>= 1024 values)
  int64_t n_coarse, n_micro, micro_bytes, code_bytes;
  int64_t micro_off, codes_off, nbytes;  // coarse scales start at 0
};

FP4Q_HD int element_bits(int32_t element) { return element == kE4M3 ? 8 : 4; }

FP4Q_HD float element_max(int32_t element) {
  return element == kE2M1 ? 6.0f : (element == kInt4 ? 7.0f : 448.0f);
}

FP4Q_HD int64_t config_block(const Config& c) {
  return (c.fwht || c.coarse == kCoarseGroup) ? c.group : c.micro_group;
}

FP4Q_HD Layout make_layout(const Config& c, int64_t n) {
  Layout l{};
  l.n = n;
  l.block = config_block(c);
  l.padded = (n + l.block - 1) / l.block * l.block;
  // A group carries a coarse scale and an FWHT, so it is one unit of work; otherwise the
  // unit is a run of micro-groups long enough to amortize the per-unit overhead.
  const bool grouped = c.fwht || c.coarse == kCoarseGroup;
  l.span = grouped || l.block >= 1024 ? l.block : (1024 / l.block) * l.block;
  l.n_coarse = c.coarse == kCoarseGroup ? l.padded / c.group : (c.coarse == kCoarseTensor && l.padded ? 1 : 0);
  l.n_micro = c.micro_scale == kScaleNone ? 0 : l.padded / c.micro_group;
  l.micro_bytes = c.micro_scale == kScaleFP16 ? 2 : (c.micro_scale == kScaleNone ? 0 : 1);
  l.code_bytes = l.padded * element_bits(c.element) / 8;
  l.micro_off = 4 * l.n_coarse;
  l.codes_off = l.micro_off + l.n_micro * l.micro_bytes;
  l.nbytes = l.codes_off + l.code_bytes;
  return l;
}

// coarse scale = block amax / divisor (6 * 448 = 2688 for FP4 under E4M3 micro-scales)
FP4Q_HD float coarse_divisor(const Config& c) {
  float smax = c.micro_scale == kScaleE4M3 ? 448.0f : (c.micro_scale == kScaleFP16 ? 65504.0f : 1.0f);
  return mul_rn(element_max(c.element), smax);
}

// ---- float32 bit tricks ----

FP4Q_HD uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

FP4Q_HD float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// 2**e, exact, for integer e in [-126, 127]
FP4Q_HD float pow2(int e) { return u2f(uint32_t(e + 127) << 23); }

// floor(log2 a) from the exponent field; -127 for zero and subnormals
FP4Q_HD int exponent_bits(float a) { return int((f2u(a) >> 23) & 0xFF) - 127; }

FP4Q_HD int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

FP4Q_HD bool is_nan(float a) { return a != a; }
FP4Q_HD bool is_finite(float a) { return (f2u(a) & 0x7F800000u) != 0x7F800000u; }
FP4Q_HD float abs_f(float a) { return u2f(f2u(a) & 0x7FFFFFFFu); }
FP4Q_HD bool sign_bit(float a) { return (f2u(a) >> 31) != 0; }
// min/max keeping NaN in `a` (torch.clamp semantics); `b` is never NaN here
FP4Q_HD float min_keep_nan(float a, float b) { return (a > b) ? b : a; }
FP4Q_HD float max_keep_nan(float a, float b) { return (a < b) ? b : a; }
FP4Q_HD float floor_f(float a) {
#if defined(__CUDA_ARCH__)
  return floorf(a);
#else
  return __builtin_floorf(a);
#endif
}

// Normalization exponent of a block (docs/format.md step 1; decoding uses it on c).
FP4Q_HD int normalizing_exponent(float amax) { return clampi(exponent_bits(amax), -126, 126); }

constexpr float kF32Max = 3.4028234663852886e38f;

// v * f, a finite v saturating at +-kF32Max instead of overflowing (the way back from a
// normalized FWHT group without a coarse scale; NaN and +-inf stay as they are).
FP4Q_HD float mul_saturating(float v, float f) {
  const float r = mul_rn(v, f);
  if (is_finite(v) && !is_finite(r)) return sign_bit(v) ? -kF32Max : kF32Max;
  return r;
}

// ---- rounding onto a grid (fp4quant/format/elements.py: Grid.round) ----

struct Grid {
  float max;
  int mbits;  // < 0: integer grid (spacing 1)
  int emin;
};

FP4Q_HD Grid grid_e2m1() { return Grid{6.0f, 1, 0}; }
FP4Q_HD Grid grid_e4m3() { return Grid{448.0f, 3, -6}; }
FP4Q_HD Grid grid_fp16() { return Grid{65504.0f, 10, -14}; }
FP4Q_HD Grid grid_int4() { return Grid{7.0f, -1, 0}; }
FP4Q_HD Grid element_grid(int32_t element) {
  return element == kE2M1 ? grid_e2m1() : (element == kInt4 ? grid_int4() : grid_e4m3());
}

enum GridMode : int32_t { kGridNearest = 0, kGridUp = 1, kGridStochastic = 2 };

// Round a >= 0 onto the grid, saturating at g.max; NaN stays NaN.
FP4Q_HD float grid_round(float a, Grid g, int32_t mode, float u) {
  a = min_keep_nan(a, g.max);
  float sp = 1.0f;
  if (g.mbits >= 0) {
    int e = exponent_bits(a);
    e = e < g.emin ? g.emin : e;
    sp = pow2(e - g.mbits);
  }
  float idx = div_rn(a, sp);
  float lo = floor_f(idx);
  float frac = sub_rn(idx, lo);
  bool up;
  if (mode == kGridNearest) {
    bool odd = sub_rn(lo, mul_rn(2.0f, floor_f(mul_rn(lo, 0.5f)))) == 1.0f;
    up = frac > 0.5f || (frac == 0.5f && odd);
  } else if (mode == kGridUp) {
    up = frac > 0.0f;
  } else {
    up = u < frac;
  }
  float q = mul_rn(add_rn(lo, up ? 1.0f : 0.0f), sp);
  return min_keep_nan(q, g.max);
}

// ---- element codes ----

// E2M1 code of an on-grid magnitude q in {0, .5, 1, 1.5, 2, 3, 4, 6}
FP4Q_HD uint32_t e2m1_code(float q, bool negative) {
  uint32_t twice = uint32_t(mul_rn(q, 2.0f));  // 0,1,2,3,4,6,8,12
  uint32_t mag = twice <= 4 ? twice : (twice == 6 ? 5u : (twice == 8 ? 6u : 7u));
  return mag | (negative ? 8u : 0u);
}

FP4Q_HD float e2m1_value(uint32_t code) {
  const uint32_t mag = code & 7u;
  float v = mag <= 4 ? mul_rn(float(mag), 0.5f) : (mag == 5 ? 3.0f : (mag == 6 ? 4.0f : 6.0f));
  return (code & 8u) ? -v : v;
}

// E2M1 round-to-nearest-even of |v| (saturating) straight from the tie points; equals
// grid_round(a, e2m1, nearest) and is what the vectorized kernels use.
FP4Q_HD uint32_t e2m1_nearest_mag(float a) {
  return uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) + uint32_t(a >= 1.75f) +
         uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) + uint32_t(a > 5.0f);
}

// The same rounding in a handful of operations (the specialized CUDA quantize kernel's
// encoder): for a in [0, 6] the grid spacing is 2**(E-1) with E = max(floor(log2 a), 0), so
// the code is RNE(a * 2**(1-E)) + 2E: one exact scaling by a power of two (a * 2**(1-E) is
// a's significand, or 2a below 1), one rounding to an integer and an offset.  The rounding
// is the float addition of 2**23 + 2E (ulp 1 there; 2E is even, so a tie still goes to the
// even code), fused with the exact scaling.  Returns the code plus kE2m1Bias (the bits of
// 2**23), so that callers can fold the bias into their packing; a must not be NaN and must
// lie in [0, 6] (callers clamp: min(|v|, 6)).  tests/ops/test_encoders.py checks it against
// e2m1_nearest_mag for every float in [0, 6] and beyond.
constexpr uint32_t kE2m1Bias = 0x4B000000u;  // bits of 2**23

FP4Q_HD uint32_t e2m1_code_biased(float a) {
  uint32_t ef = f2u(a) >> 23;            // biased exponent (a >= 0)
  ef = ef > 127u ? ef : 127u;            // E = ef - 127 in {0, 1, 2}
  const float scale = u2f((255u - ef) << 23);              // 2**(1-E)
  const float magic = u2f(kE2m1Bias - 254u + 2u * ef);     // 2**23 + 2E
  return f2u(fma_rn(a, scale, magic));   // a * scale is exact: one rounding, to an integer
}

// E2M1 magnitude code (0..7) of a >= 0, not NaN: e2m1_nearest_mag by the route above.
FP4Q_HD uint32_t e2m1_code_rne(float a) { return e2m1_code_biased(a < 6.0f ? a : 6.0f) - kE2m1Bias; }

// E4M3 ("fn") byte of an exactly representable value (|q| <= 448)
FP4Q_HD uint32_t e4m3_byte(float q) {
  uint32_t sign = sign_bit(q) ? 0x80u : 0u;
  float a = abs_f(q);
  if (a == 0.0f) return sign;
  int e = exponent_bits(a);
  if (e < -6) return sign | uint32_t(mul_rn(a, 512.0f));  // subnormal: multiples of 2**-9
  uint32_t mant = uint32_t(mul_rn(a, pow2(3 - e))) - 8u;  // a / 2**(e-3) in [8, 16)
  return sign | (uint32_t(e + 7) << 3) | mant;
}

FP4Q_HD float e4m3_value(uint32_t byte) {
  uint32_t exp = (byte >> 3) & 0xFu, mant = byte & 7u;
  if (exp == 0xF && mant == 7) return u2f(0x7FC00000u);  // NaN
  float v = exp == 0 ? mul_rn(float(mant), 0.001953125f)
                      : mul_rn(pow2(int(exp) - 7), add_rn(1.0f, mul_rn(float(mant), 0.125f)));
  return (byte & 0x80u) ? -v : v;
}

FP4Q_HD uint32_t element_code(int32_t element, float q, bool negative) {
  if (element == kE2M1) return e2m1_code(q, negative);
  if (element == kInt4) return uint32_t(int32_t(negative ? -q : q)) & 0xFu;
  return e4m3_byte(negative ? -q : q);
}

FP4Q_HD float element_value(int32_t element, uint32_t code) {
  if (element == kE2M1) return e2m1_value(code);
  if (element == kInt4) return float(int32_t((code ^ 8u)) - 8);
  return e4m3_value(code);
}

FP4Q_HD uint32_t element_nonfinite_code(int32_t element) { return element == kE4M3 ? 0x7Fu : 0u; }

// ---- half precision (for fp16 scales and fp16 tensors) ----

// IEEE binary16 bits of an exactly representable float (a value grid_round(., fp16) made)
FP4Q_HD uint16_t half_bits_exact(float q) {
  uint32_t u = f2u(q);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  float a = abs_f(q);
  if (is_nan(a)) return uint16_t(sign | 0x7E00u);
  if (a == 0.0f) return sign;
  int e = exponent_bits(a);
  if (e < -14) return uint16_t(sign | uint32_t(mul_rn(a, 16777216.0f)));  // subnormal: multiples of 2**-24
  uint32_t mant = (f2u(a) >> 13) & 0x3FFu;
  return uint16_t(sign | (uint32_t(e + 15) << 10) | mant);
}

FP4Q_HD float half_value(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0x1F) return u2f(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    float v = mul_rn(float(mant), 5.9604644775390625e-08f);  // multiples of 2**-24
    return sign ? -v : v;
  }
  return u2f(sign | (uint32_t(exp + 112) << 23) | (mant << 13));
}

// float -> binary16, round to nearest even, overflow to inf (torch's .to(float16))
FP4Q_HD uint16_t float_to_half_rne(float f) {
  uint32_t u = f2u(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t au = u & 0x7FFFFFFFu;
  if (au > 0x7F800000u) return uint16_t(sign | 0x7E00u);  // NaN (c10::Half)
  if (au == 0x7F800000u) return uint16_t(sign | 0x7C00u);
  if (au >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds past 65504
  if (au < 0x38800000u) {                                   // below 2**-14: subnormal half
    float a = mul_rn(u2f(au), 16777216.0f);                 // exact: power-of-two scaling into ints
    float r = floor_f(a);
    float frac = sub_rn(a, r);
    uint32_t m = uint32_t(r);
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) m += 1;
    return uint16_t(sign | m);
  }
  uint32_t mant_odd = (au >> 13) & 1u;
  au += 0xC8000FFFu + mant_odd;  // re-bias exponent (-112 << 23) and round
  return uint16_t(sign | (au >> 13));
}

// float -> bfloat16, round to nearest even, NaN -> 0x7FC0 (c10::BFloat16)
FP4Q_HD uint16_t float_to_bf16_rne(float f) {
  uint32_t u = f2u(f);
  if (is_nan(f)) return uint16_t(0x7FC0u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

FP4Q_HD float bf16_value(uint16_t b) { return u2f(uint32_t(b) << 16); }

// ---- the output cast of decoded values (docs/format.md "Decoding") ----
// saturate: values past the dtype's finite range become its maximum (one message: its input
// was finite, the excess is quantization error); otherwise they round to +-inf as a cast
// does (a sum that overflows).  Round to nearest even; NaN stays NaN.

constexpr float kBF16Max = 3.3895313892515355e38f;
constexpr float kHalfMax = 65504.0f;

FP4Q_HD float clamp_keep_nan(float v, float bound) { return max_keep_nan(min_keep_nan(v, bound), -bound); }
FP4Q_HD float out_f32(float v, bool saturate) { return saturate ? clamp_keep_nan(v, kF32Max) : v; }
FP4Q_HD uint16_t out_bf16(float v, bool saturate) { return float_to_bf16_rne(saturate ? clamp_keep_nan(v, kBF16Max) : v); }
FP4Q_HD uint16_t out_half(float v, bool saturate) { return float_to_half_rne(saturate ? clamp_keep_nan(v, kHalfMax) : v); }

// ---- scales ----

FP4Q_HD float scale_min(int32_t fmt) { return fmt == kScaleE4M3 ? 0.015625f : 6.103515625e-05f; }

// e4m3 / fp16 micro-scale: stored bits of the wanted scale t (NaN -> the format's NaN)
FP4Q_HD uint32_t encode_scale(float t, int32_t fmt, int32_t rule) {
  int32_t mode = rule == kScaleUp ? kGridUp : kGridNearest;
  if (fmt == kScaleE4M3) {
    if (is_nan(t)) return 0x7Fu;
    return e4m3_byte(grid_round(max_keep_nan(t, scale_min(fmt)), grid_e4m3(), mode, 0.0f));
  }
  if (is_nan(t)) return 0x7E00u;
  return half_bits_exact(grid_round(max_keep_nan(t, scale_min(fmt)), grid_fp16(), mode, 0.0f));
}

// e8m0 byte of a block from its largest magnitude (OCP floor rule, or "up")
FP4Q_HD uint32_t encode_e8m0(float amax, float emax_elem_value, int emax_elem, int32_t rule) {
  if (is_nan(amax)) return 0xFFu;
  int k = exponent_bits(amax) - emax_elem;
  if (rule == kScaleUp && amax > mul_rn(emax_elem_value, pow2(clampi(k, -126, 127)))) k += 1;
  return uint32_t(clampi(k, -127, 127) + 127);
}

// e4m3 micro-scale under scale_round="nearest" by integer arithmetic on the float's bits:
// encode_scale(t, kScaleE4M3, kScaleNearest) and its decoded value for t >= 0, not NaN
// (tests/ops/test_encoders.py checks every such float).  max(t, 2**-6) is normal, so
// rounding its significand to 3 bits (ties to even) is an integer add that may carry into
// the exponent; then the saturation at 448.  The byte is the rounded float's top bits less
// the exponent bias difference (127 - 7) << 3.
struct E4m3Scale {
  uint32_t byte;
  float value;
};

FP4Q_HD E4m3Scale e4m3_scale_nearest(float t) {
  uint32_t u = f2u(t);
  u = u > 0x3C800000u ? u : 0x3C800000u;                       // max(t, 2**-6)
  uint32_t q = (u + 0x7FFFFu + ((u >> 20) & 1u)) & 0xFFF00000u;  // round to 3 significand bits
  q = q < 0x43E00000u ? q : 0x43E00000u;                         // min(., 448)
  return E4m3Scale{(q >> 20) - 960u, u2f(q)};
}

FP4Q_HD int element_emax_exponent(int32_t element) { return element == kE4M3 ? 8 : 2; }

FP4Q_HD float decode_scale(uint32_t stored, int32_t fmt) {
  if (fmt == kScaleE4M3) return e4m3_value(stored);
  if (fmt == kScaleFP16) return half_value(uint16_t(stored));
  if (stored == 0xFFu) return u2f(0x7FC00000u);
  if (stored == 0) return u2f(0x00400000u);  // 2**-127, the one subnormal scale
  return pow2(int(stored) - 127);
}

// ---- counter-based random numbers (fp4quant/format/random.py) ----

FP4Q_HD uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21F0AAADu;
  x ^= x >> 15;
  x *= 0x735A2D97u;
  x ^= x >> 15;
  return x;
}

FP4Q_HD uint32_t stream_key(uint64_t seed) {
  return mix32(uint32_t(seed) ^ mix32(uint32_t(seed >> 32) ^ 0x9E3779B9u));
}

FP4Q_HD float uniform(uint32_t key, uint64_t counter) {
  uint32_t h = mix32(uint32_t(counter) ^ mix32(uint32_t(counter >> 32) ^ key));
  return mul_rn(float(h >> 8), 5.9604644775390625e-08f);  // 2**-24
}

// ---- the micro-group step (docs/format.md steps 4-5) ----

// Scale of one micro-group: the stored scale bits and the reciprocal r applied to its values.
struct MicroScale {
  uint32_t stored;
  float r;
};

// amax: the micro-group's largest magnitude; finite: whether all its values are finite;
// c: the coarse scale in the normalized domain (ignored without one).
FP4Q_HD MicroScale micro_scale(const Config& cfg, float amax, bool finite, float c) {
  const bool coarse = cfg.coarse != kCoarseNone;
  const float emax = element_max(cfg.element);
  MicroScale out{0u, 0.0f};
  float m = 1.0f;
  if (cfg.micro_scale == kScaleE4M3 || cfg.micro_scale == kScaleFP16) {
    float t = div_rn(amax, emax);
    if (coarse) t = (c == 0.0f) ? 0.0f : div_rn(t, c);
    if (!finite) t = u2f(0x7FC00000u);
    out.stored = encode_scale(t, cfg.micro_scale, cfg.scale_round);
    m = decode_scale(out.stored, cfg.micro_scale);
  } else if (cfg.micro_scale == kScaleE8M0) {
    out.stored = encode_e8m0(finite ? amax : u2f(0x7FC00000u), emax, element_emax_exponent(cfg.element),
                             cfg.scale_round);
    m = decode_scale(out.stored, kScaleE8M0);
  }
  if (coarse && cfg.micro_scale != kScaleNone) {
    out.r = (c == 0.0f) ? 0.0f : div_rn(rcp_rn(c), m);
  } else if (coarse) {
    out.r = (c == 0.0f) ? 0.0f : rcp_rn(c);
  } else {
    out.r = rcp_rn(m);
  }
  return out;
}

// Code of one value v = y * r (finite micro-group); u: its uniform for stochastic rounding.
FP4Q_HD uint32_t quantize_value(const Config& cfg, float v, float u) {
  float a = abs_f(v);
  float q;
  if (cfg.element == kE2M1 && cfg.rounding == kRoundNearest) {
    uint32_t mag = e2m1_nearest_mag(a);
    return mag | (sign_bit(v) ? 8u : 0u);
  }
  q = grid_round(a, element_grid(cfg.element), cfg.rounding == kRoundStochastic ? kGridStochastic : kGridNearest, u);
  return element_code(cfg.element, q, sign_bit(v));
}

// Decoding scale s of a micro-group from its stored micro-scale and f: its coarse scale
// (times 2**-E, docs/format.md "Decoding"), or without a coarse scale 2**-E (1: none).
FP4Q_HD float decode_micro(const Config& cfg, uint32_t stored, float f) {
  if (cfg.micro_scale == kScaleNone) return f;
  return mul_rn(decode_scale(stored, cfg.micro_scale), f);
}

// Whether decoding normalizes a block by 2**-E: with a coarse scale (E from it), and for
// FWHT groups of e8m0 micro-scales (E from the largest finite one: e8m0 spans 2**+-127,
// where the inverse FWHT and sums would overflow).  e4m3 and fp16 micro-scales bound the
// decoded values (by 6 * 448, 7 * 65504) well inside float32's normal range: no need.
FP4Q_HD bool decode_normalizes(const Config& cfg) {
  return cfg.coarse != kCoarseNone || (cfg.fwht && cfg.micro_scale == kScaleE8M0);
}

}  // namespace fp4q
