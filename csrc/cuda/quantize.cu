// The quantize kernels specialized at compile time for what the presets fix (docs/format.md
// "Presets"): e2m1 values, e4m3 micro-scales of 16 values rounded to nearest, round-to-nearest
// elements, groups of kG = 2048 values; then per instance the input dtype (float32, bfloat16,
// float16), the mechanism (FWHT + group scale: fp4quant, naive_pack; group scale alone:
// no_fwht, and any group-scale config whose values come already transformed; FWHT alone:
// single_scale) and the packing (warp, naive).  codec.cu's quantize() runs one of these where
// spec_supported() says the config is one of them, and the runtime-config kernels (fast.cu,
// codec.cu) otherwise.  Same bytes as every other kernel, bit for bit.
//
// One block of kG / 16 threads per group (a tile), persistent over the tiles; thread t holds
// micro-group t of the group (values 16t .. 16t+15) in registers from load to store: its
// scale, its codes, no shuffles between lanes to share a micro-group.
//  - loads: 16-byte vectors; the FWHT's sign flips are folded into the conversion to float
//    (a sign flip is the XOR of the sign bit: exact, like the reference's multiply by -1).
//  - maxima: a NaN-propagating max (max.NaN) gives the largest magnitude and finiteness in
//    one instruction a value; a warp's maximum is one REDUX; the group's, a barrier.
//  - FWHT: level one (strides 1 .. 8) in registers; level two (strides 16 .. kG/2) in shared
//    memory, two strides per round, each thread taking four 16-byte vectors (whose 4 floats
//    are index bits 0-1) that vary the round's two index bits: every index is a per-thread
//    base plus a compile-time offset.  Stages run in the reference's order, each butterfly
//    being its (a + b, a - b).
//  - scales: IEEE divisions where the reference divides (div_rn; by the constants 6 and 2688,
//    fp4quant.h's div_const_rn: a multiply and one fused correction, exact where it is used),
//    the e4m3 rounding as integer arithmetic on the bits (e4m3_scale_nearest).
//  - codes: fp4quant.h's e2m1_code_biased (a clamp, one exact power-of-two scaling fused with
//    the rounding add, an offset), packed 8 to a word with shift-adds; the sign bits are
//    gathered by funnel shifts.
//  - stores: warp packing pairs lanes by a shuffle into 16-byte stores; naive packing is each
//    thread's own 8 bytes as one store (the widest a thread has without other lanes).
// Per-thread constants (signs, shared-memory bases) are computed once, outside the loop over
// tiles, which steps row, tile and pointers by host-computed increments (Walk) without
// dividing.  Whole tiles of aligned rows run an instance without any fallback code; a row's
// partial last tile, rows of x off 16-byte boundaries and messages off 4-byte boundaries run
// the safe instance (value-by-value loads and byte stores, a second launch over those tiles
// only).  The one rare case inside the hot loop, a non-finite value without the FWHT, takes a
// short rolled loop through the thread's own shared-memory slots.
#include "common.cuh"

namespace fp4q {
namespace cuda {
namespace detail {
namespace {

constexpr int kSpecGroup = 2048;  // the presets' group (instances exist for this size)
constexpr float kInv6 = 1.0f / 6.0f, kInv2688 = 1.0f / 2688.0f;  // fp32(1 / d) for div_const_rn

__host__ __device__ constexpr int ilog2(int v) { return v <= 1 ? 0 : 1 + ilog2(v >> 1); }

// Shared memory: the 16-byte vector q (values 4q .. 4q+3 of the group) lives at vector slot
// q + (q >> 3).  The padding is additive and linear over disjoint bits, so a per-thread base
// plus a compile-time offset addresses any vector; and it spreads every access pattern below
// over the 8 16-byte bank groups (a quarter warp's 128-bit accesses: no bank conflicts).
__host__ __device__ constexpr int slot(int q) { return q + (q >> 3); }

template <int kG>
struct Shape {
  static_assert(kG >= 512 && kG <= 16384 && (kG & (kG - 1)) == 0, "groups of 512 .. 16384 values");
  static constexpr int kLog2 = ilog2(kG);
  static constexpr int kThreads = kG / 16;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRounds = (kLog2 - 4 + 1) / 2;  // level two: bits 4 .. kLog2-1, two a round
  static constexpr int kSmemFloats = 4 * slot(kG / 4);
  static constexpr int kRedWords = (kWarps + 3) / 4 * 4;  // a set of per-warp maxima
  static constexpr size_t kSmemBytes = sizeof(float) * kSmemFloats + 2 * sizeof(uint32_t) * kRedWords;
  static constexpr int kMinBlocks = 1024 / kThreads > 0 ? 1024 / kThreads : 1;  // 64 registers a thread (G = 2048)
};

// Round r of level two runs the stages of index bits b = 4 + 2r and b + 1 (when < kLog2).
// Its thread holds vectors whose index bits b (vector bit 0) and b1 (vector bit 1) vary:
// b1 = b + 1, or for a last round of one stage some other bit (kLog2 - 2); the thread's
// index bits 0-1 vary inside the vectors and its number supplies the others.
template <int kG>
struct Round {
  static __host__ __device__ constexpr int b(int r) { return 4 + 2 * r; }
  static __host__ __device__ constexpr bool pair(int r) { return b(r) + 1 < Shape<kG>::kLog2; }
  static __host__ __device__ constexpr int b1(int r) { return pair(r) ? b(r) + 1 : Shape<kG>::kLog2 - 2; }
  // Bank group (mod 8) that index bit k adds to a vector slot.
  static __host__ __device__ constexpr int bank(int k) { return k < 5 ? 1 << (k - 2) : (k < 8 ? 1 << (k - 5) : 0); }
  static __host__ __device__ constexpr bool free_bit(int r, int k) { return k >= 2 && k < Shape<kG>::kLog2 && k != b(r) && k != b1(r); }
  // The index bit that thread bit i supplies in round r: thread bits 0-2 (a quarter warp)
  // take free bits that add bank groups 1, 2 and 4; the rest go in increasing order.
  static __host__ __device__ constexpr int pick(int r, int want) {
    for (int k = 2; k < Shape<kG>::kLog2; ++k)
      if (free_bit(r, k) && bank(k) == want) return k;
    return -1;
  }
  static __host__ __device__ constexpr int bit_of(int r, int i) {
    const int first[3] = {pick(r, 1), pick(r, 2), pick(r, 4)};
    if (i < 3) return first[i];
    int seen = 3;
    for (int k = 2; k < Shape<kG>::kLog2; ++k) {
      if (!free_bit(r, k) || k == first[0] || k == first[1] || k == first[2]) continue;
      if (seen++ == i) return k;
    }
    return -1;
  }
  // Vector index (q = index >> 2) of thread t's part, and of vector j's offset.
  static __host__ __device__ int thread_q(int r, int t) {
    int q = 0;
    for (int i = 0; i < Shape<kG>::kLog2 - 4; ++i) q |= ((t >> i) & 1) << (bit_of(r, i) - 2);
    return q;
  }
  static __host__ __device__ constexpr int vec_q(int r, int j) { return ((j & 1) << (b(r) - 2)) | ((j >> 1) << (b1(r) - 2)); }
};

// One radix-2 stage of stride H on 16 values in registers: (a, b) -> (a + b, a - b).
template <int H>
FP4Q_DEV void stage16(float (&y)[16]) {
#pragma unroll
  for (int k0 = 0; k0 < 16; k0 += 2 * H) {
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const float a = y[k0 + j], b = y[k0 + j + H];
      y[k0 + j] = add_rn(a, b);
      y[k0 + j + H] = sub_rn(a, b);
    }
  }
}

FP4Q_DEV void store_vec(float* p, const float* v) { *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]); }
FP4Q_DEV void load_vec(const float* p, float* v) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}

// max(a, b), NaN when either is NaN (PTX max.NaN: one FMNMX).  Magnitudes are never -0.
FP4Q_DEV float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return (a != a || b != b) ? u2f(0x7FC00000u) : (a < b ? b : a);
#endif
}

// The largest of a warp's values (REDUX on sm_80+).
FP4Q_DEV uint32_t warp_max(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullMask, v);
#else
  for (int o = 16; o > 0; o >>= 1) v = umax(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
#endif
}

// (acc << 4) | (v >> 28): the next value's sign bit into the low nibble's bit 3 (SHF.L.W).
FP4Q_DEV uint32_t shift_in_nibble(uint32_t acc, uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_l(v, acc, 4);
#else
  return (acc << 4) | (v >> 28);
#endif
}

// float16 bits -> float32, exact (one conversion instruction on the device).
FP4Q_DEV float half_to_float(uint32_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(uint16_t(h)));
  return f;
#else
  return half_value(uint16_t(h));
#endif
}

// The group's maximum of v (non-negative float bits) over its kWarps warps; one barrier.
template <int kWarps>
FP4Q_DEV uint32_t group_max(uint32_t v, uint32_t* slots) {
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = v;
  __syncthreads();
  if (kWarps % 4 == 0) {
#pragma unroll
    for (int w = 0; w < kWarps; w += 4) {
      const uint4 s = *reinterpret_cast<const uint4*>(slots + w);
      v = umax(umax(v, s.x), umax(umax(s.y, s.z), s.w));
    }
  } else {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v = umax(v, slots[w]);
  }
  return v;
}

// The tiles of a launch and the walk over them (the host computes it for the grid): rows x tpr
// tiles, tile (row, k) being the row's tile tin0 + k; block b takes tile b, then every
// gridDim.x-th: step_rows rows and step_tin tiles on (then one row more and tpr tiles fewer
// where the tile index passes the row's end), the input and message pointers by x_step and
// m_step (then x_wrap and m_wrap more).  Kernel parameters: the loop adds them from the
// constant bank instead of keeping or recomputing them.
struct Walk {
  int32_t tpr, tin0, step_rows, step_tin;
  int64_t x_step, x_wrap, m_step, m_wrap;
};

// kSafe: the instance for the tiles that the others do not take (a row's partial last tile,
// rows of x that are not 16-byte aligned, messages that are not 4-byte aligned): value-by-value
// loads and byte stores there, and no pairing of lanes (the bytes are the same).  The others
// assume whole, aligned tiles, which keeps the loop they run short.
template <int kG, int kDType, bool kFwht, bool kCoarse, bool kWarpPack, bool kSafe>
__global__ void __launch_bounds__(Shape<kG>::kThreads, Shape<kG>::kMinBlocks)
    spec_quantize_kernel(const Params p, const Walk walk) {
  using S = Shape<kG>;
  using R = Round<kG>;
  extern __shared__ __align__(16) float fp4q_smem[];
  float* const buf = fp4q_smem;  // the group, then two sets of per-warp maxima (16-byte aligned)
  uint32_t* const red = reinterpret_cast<uint32_t*>(buf + S::kSmemFloats);
  const int t = threadIdx.x;
  constexpr int kBytes = kDType == kF32 ? 4 : 2;
  constexpr uint32_t kPackBias = kE2m1Bias + (kE2m1Bias << 4);  // sum of kE2m1Bias << 4k, mod 2**32

  // ---- per-thread constants ----
  // sign bits of the FWHT signs at the thread's 16 positions (float16: two to a word)
  uint32_t smask[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) smask[k] = kFwht && p.signs ? f2u(p.signs[16 * t + k]) & 0x80000000u : 0u;
  uint32_t hmask[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) hmask[k] = (smask[2 * k] >> 16) | smask[2 * k + 1];
  int own = 4 * slot(4 * t);  // the thread's 16 values, contiguous
  int rbase[S::kRounds];
#pragma unroll
  for (int r = 0; r < S::kRounds; ++r) rbase[r] = 4 * slot(R::thread_q(r, t));
  {
    // Through a volatile round trip in the thread's own shared-memory slots: values the
    // compiler cannot recompute from threadIdx, so it keeps them in registers instead of
    // redoing the bit arithmetic in every tile.
    static_assert(S::kRounds + 1 <= 16, "own slots");
    volatile int* keep = reinterpret_cast<volatile int*>(buf + own);
    keep[0] = own;
#pragma unroll
    for (int r = 0; r < S::kRounds; ++r) keep[1 + r] = rbase[r];
    own = keep[0];
#pragma unroll
    for (int r = 0; r < S::kRounds; ++r) rbase[r] = keep[1 + r];
  }
  const float inv_sqrt = p.inv_sqrt;
  const int64_t n = p.lay.n;
  const int64_t x_stride = p.x_row_stride * kBytes, nbytes = p.lay.nbytes;
  const int32_t rows = int32_t(p.rows);
  // the thread's first value and its bytes in tile 0 of row 0; offsets inside a message fit
  // 32 bits (spec_supported)
  const char* const x_thread = static_cast<const char*>(p.x) + 16 * kBytes * t;
  const uint32_t micro_thread = uint32_t(p.lay.micro_off) + uint32_t(t);
  const uint32_t codes_thread = uint32_t(p.lay.codes_off) + 8u * uint32_t(t);
  // tiles blockIdx.x, + gridDim.x, ...: (row, tile in row) and the pointers stepped (Walk)
  const int32_t tpr = walk.tpr;
  int32_t row = int32_t(blockIdx.x) / tpr, tin = int32_t(blockIdx.x) - row * tpr;
  const char* xv = x_thread + row * x_stride + int64_t(walk.tin0 + tin) * kG * kBytes;  // the thread's value v0
  uint8_t* msg = p.out_msgs + row * nbytes;
  int parity = 0;

  for (; row < rows; parity ^= 1) {
    const int32_t tidx = walk.tin0 + tin;  // the tile's index in its row
    const int64_t start = int64_t(tidx) * kG;  // its first value
    const int64_t v0 = start + 16 * t;
    const char* const xrow = xv - v0 * kBytes;  // (the safe instance's loads)

    // ---- load 16 values, signs flipped ----
    float y[16];
    if (!kSafe) {
      if (kDType == kF32) {
        const float4* q = reinterpret_cast<const float4*>(xv);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float4 a = q[j];
          y[4 * j + 0] = u2f(f2u(a.x) ^ smask[4 * j + 0]);
          y[4 * j + 1] = u2f(f2u(a.y) ^ smask[4 * j + 1]);
          y[4 * j + 2] = u2f(f2u(a.z) ^ smask[4 * j + 2]);
          y[4 * j + 3] = u2f(f2u(a.w) ^ smask[4 * j + 3]);
        }
      } else {
        const uint4* q = reinterpret_cast<const uint4*>(xv);
        const uint4 a = q[0], b = q[1];
        const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          if (kDType == kBF16) {
            // adding 0 or 2**31 flips the sign bit like the XOR: one IMAD
            y[2 * k] = u2f(w[k] * 65536u + smask[2 * k]);
            y[2 * k + 1] = u2f((w[k] & 0xFFFF0000u) ^ smask[2 * k + 1]);
          } else {
            const uint32_t h = w[k] ^ hmask[k];
            y[2 * k] = half_to_float(h & 0xFFFFu);
            y[2 * k + 1] = half_to_float(h >> 16);
          }
        }
      }
    } else {
      // a partial last tile (zero padding) or an unaligned row: value by value
#pragma unroll 1
      for (int k = 0; k < 16; ++k) {
        float v = v0 + k < n ? load_value(xrow, kDType, v0 + k) : 0.0f;
        if (kFwht && p.signs) v = mul_rn(v, p.signs[16 * t + k]);  // +-1: the sign flip
        buf[own + k] = v;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) load_vec(buf + own + 4 * j, y + 4 * j);
    }

    // ---- 1. normalization by the group's largest finite magnitude ----
    float m = fabsf(y[0]);
#pragma unroll
    for (int k = 1; k < 16; ++k) m = max_nan(m, fabsf(y[k]));
    const bool finite_in = is_finite(m);
    uint32_t mbits = f2u(m);
    // Without the FWHT a non-finite value spoils its micro-group only: the others need the
    // group's largest finite magnitude.  With it, a non-finite value spoils the whole group
    // (step 2 below): then no output depends on e, and the maximum may stay non-finite.
    if (!kFwht && !finite_in) {
#pragma unroll
      for (int j = 0; j < 4; ++j) store_vec(buf + own + 4 * j, y + 4 * j);
      mbits = 0;
#pragma unroll 1
      for (int k = 0; k < 16; ++k) mbits = umax(mbits, finite_bits(buf[own + k]));
    }
    const uint32_t gmax_in = group_max<S::kWarps>(mbits, red + (kFwht ? 0 : parity * S::kRedWords));
    const int e = normalizing_exponent(u2f(gmax_in));
    const float f = pow2(-e);
#pragma unroll
    for (int k = 0; k < 16; ++k) y[k] = mul_rn(y[k], f);

    // ---- 2. FWHT ----
    bool finite;   // the micro-group's values are all finite
    float amax;    // and its largest magnitude
    float c = 0.0f;  // the coarse scale (normalized domain)
    if (kFwht) {
      stage16<1>(y);
      stage16<2>(y);
      stage16<4>(y);
      stage16<8>(y);
#pragma unroll
      for (int j = 0; j < 4; ++j) store_vec(buf + own + 4 * j, y + 4 * j);
      __syncthreads();
#pragma unroll
      for (int r = 0; r < S::kRounds; ++r) {
        float z[16];
#pragma unroll
        for (int j = 0; j < 4; ++j) load_vec(buf + rbase[r] + 4 * slot(R::vec_q(r, j)), z + 4 * j);
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // stage of bit b: vectors (0, 1), (2, 3)
#pragma unroll
          for (int j = 0; j < 4; j += 2) {
            const float a = z[4 * j + i], b = z[4 * (j + 1) + i];
            z[4 * j + i] = add_rn(a, b);
            z[4 * (j + 1) + i] = sub_rn(a, b);
          }
        }
        if (R::pair(r)) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // stage of bit b + 1: vectors (0, 2), (1, 3)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const float a = z[4 * j + i], b = z[4 * (j + 2) + i];
              z[4 * j + i] = add_rn(a, b);
              z[4 * (j + 2) + i] = sub_rn(a, b);
            }
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) store_vec(buf + rbase[r] + 4 * slot(R::vec_q(r, j)), z + 4 * j);
        __syncthreads();
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) load_vec(buf + own + 4 * j, y + 4 * j);
#pragma unroll
      for (int k = 0; k < 16; ++k) y[k] = mul_rn(y[k], inv_sqrt);
      // a non-finite input reaches every value of the group through the butterflies and no
      // finite group overflows (|normalized| < 4): the group is all finite or all not
      finite = is_finite(y[0]);
      if (!kCoarse) {
        // times 2**e again; a finite value saturates at the float32 maximum (mul_saturating),
        // which only the micro-group's amax can tell from +-inf (both give code 7 after the
        // clamp at 6 below: the scale of such a group saturates at 448)
        const float back = pow2(e);
#pragma unroll
        for (int k = 0; k < 16; ++k) y[k] = mul_rn(y[k], back);
      }
      amax = fabsf(y[0]);
#pragma unroll
      for (int k = 1; k < 16; ++k) amax = max_nan(amax, fabsf(y[k]));
      if (!kCoarse && finite && !is_finite(amax)) amax = kF32Max;
      if (kCoarse) {
        // ---- 3. coarse scale: the group's largest finite magnitude / (6 * 448) ----
        c = div_const_rn(u2f(group_max<S::kWarps>(finite ? f2u(amax) : 0u, red + S::kRedWords)), 2688.0f, kInv2688);
      }
    } else {
      // values are in registers as they will be encoded: the maxima follow from the raw ones
      // (rounding is monotonic: max |x * f| = |max| * f)
      finite = finite_in;
      amax = mul_rn(m, f);
      c = div_const_rn(mul_rn(u2f(gmax_in), f), 2688.0f, kInv2688);
    }
    if (kCoarse && t == 0) {
      const uint32_t bits = f2u(mul_rn(c, pow2(e)));
      uint8_t* at = msg + 4u * uint32_t(tidx);
      if (kSafe) {
        store_u32(at, bits);
      } else {
        *reinterpret_cast<uint32_t*>(at) = bits;
      }
    }

    // ---- 4-5. micro-scale and reciprocal ----
    // (the divisions by 6 and 2688 are div_const_rn's: exact for normal quotients; c is
    // zero or at least 2**-41 (the group's normalized maximum is at least 2**-23, and the
    // FWHT keeps a 1/sqrt(2048) share of it), so the coarse scale is exact, and where
    // amax / 6 falls below 2**-126, t is far below the scale's minimum 2**-6 either way)
    float r;
    E4m3Scale s;
    const float t6 = div_const_rn(amax, 6.0f, kInv6);
    if (kCoarse) {
      const bool zero = c == 0.0f;  // x / 0 is not used: the selects keep the code branch-free
      s = e4m3_scale_nearest(zero ? 0.0f : div_rn(t6, c));
      r = zero ? 0.0f : div_rn(rcp_rn(c), s.value);
    } else {
      s = e4m3_scale_nearest(t6);
      r = rcp_rn(s.value);
    }
    msg[micro_thread + 128u * uint32_t(tidx)] = uint8_t(finite ? s.byte : 0x7Fu);

    // ---- 6-7. codes: value 2i in the low nibble of byte i ----
    uint32_t word[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t mag = 0, sgn = 0;
#pragma unroll
      for (int k = 7; k >= 0; --k) {
        const float v = mul_rn(y[8 * h + k], r);
        mag += e2m1_code_biased(fminf(fabsf(v), 6.0f)) << (4 * k);
        sgn = shift_in_nibble(sgn, f2u(v));
      }
      word[h] = finite ? (mag - kPackBias) | (sgn & 0x88888888u) : 0u;
    }

    // ---- stores: 8 bytes of codes a thread ----
    uint8_t* const dst = msg + (codes_thread + 1024u * uint32_t(tidx));
    // the tile's codes start 8-byte aligned (or 4, or 1) iff the thread's do
    const uint32_t align = uint32_t(reinterpret_cast<uintptr_t>(dst)) & 15u;
    if (kWarpPack && !kSafe) {
      // lane pairs (leader, leader + 1) whose 16 bytes start on a 16-byte boundary store
      // both; a lane without a partner (lane 31 or 0, with the line 8 bytes off) its own
      const uint32_t n0 = __shfl_down_sync(kFullMask, word[0], 1), n1 = __shfl_down_sync(kFullMask, word[1], 1);
      const int lane = t & 31;
      if ((align & 7u) == 0) {
        if (align == 0 && lane < 31) {
          *reinterpret_cast<uint4*>(dst) = make_uint4(word[0], word[1], n0, n1);
        } else if (align == 0 || lane == 0) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(word[0], word[1]);
        }
      } else {
        reinterpret_cast<uint32_t*>(dst)[0] = word[0];
        reinterpret_cast<uint32_t*>(dst)[1] = word[1];
      }
    } else if ((align & 7u) == 0) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(word[0], word[1]);
    } else if (!kSafe || (align & 3u) == 0) {
      reinterpret_cast<uint32_t*>(dst)[0] = word[0];
      reinterpret_cast<uint32_t*>(dst)[1] = word[1];
    } else {
      const uint64_t both = uint64_t(word[0]) | (uint64_t(word[1]) << 32);
#pragma unroll 1
      for (int b = 0; b < 8; ++b) dst[b] = uint8_t(both >> (8 * b));
    }

    // next tile (shared memory needs no barrier here: the next writes of other threads' data
    // come after the next tile's first barrier, the reduction slots alternate)
    tin += walk.step_tin;
    row += walk.step_rows;
    xv += walk.x_step;
    msg += walk.m_step;
    if (tin >= tpr) tin -= tpr, ++row, xv += walk.x_wrap, msg += walk.m_wrap;
  }
}

// Tiles rows x tpr, from the row's tile tin0 on.
template <int kG, int kDType, bool kFwht, bool kCoarse, bool kWarpPack, bool kSafe>
int launch_spec_instance(const Params& p, int32_t tpr, int32_t tin0, cudaStream_t stream) {
  using S = Shape<kG>;
  const auto kernel = spec_quantize_kernel<kG, kDType, kFwht, kCoarse, kWarpPack, kSafe>;
  const size_t smem = S::kSmemBytes;
  int grid = 0;
  if (int err = persistent_grid(reinterpret_cast<const void*>(kernel), S::kThreads, smem, p.rows * tpr, &grid))
    return err;
  if (grid == 0) return 0;
  Walk w{};
  w.tpr = tpr;
  w.tin0 = tin0;
  w.step_rows = grid / tpr;
  w.step_tin = grid - w.step_rows * tpr;
  const int64_t x_stride = p.x_row_stride * (kDType == kF32 ? 4 : 2), tile_bytes = int64_t(kG) * (kDType == kF32 ? 4 : 2);
  w.x_step = w.step_rows * x_stride + w.step_tin * tile_bytes;
  w.x_wrap = x_stride - tpr * tile_bytes;
  w.m_step = w.step_rows * p.lay.nbytes;
  w.m_wrap = p.lay.nbytes;
  kernel<<<grid, S::kThreads, smem, stream>>>(p, w);
  return int(cudaGetLastError());
}

// Whole tiles of 16-byte aligned rows into 4-byte aligned messages: the packing's instance;
// the rest (every tile when unaligned, else each row's partial last tile): the safe one.
template <int kDType, bool kFwht, bool kCoarse>
int launch_spec_packing(const Params& p, cudaStream_t stream) {
  constexpr int G = kSpecGroup;
  const int32_t tiles = int32_t(p.lay.padded / G), whole = int32_t(p.lay.n / G);
  // every row of messages starts 4-byte aligned when the first does: nbytes is 4 (coarse
  // scales) + 1 (micro-scales) + 8 (codes) bytes per 16 values
  const bool aligned = p.x_vec && (reinterpret_cast<uintptr_t>(p.out_msgs) & 3u) == 0;
  if (!aligned) return launch_spec_instance<G, kDType, kFwht, kCoarse, false, true>(p, tiles, 0, stream);
  if (whole > 0) {
    const int err = p.cfg.packing == kPackWarp
                        ? launch_spec_instance<G, kDType, kFwht, kCoarse, true, false>(p, whole, 0, stream)
                        : launch_spec_instance<G, kDType, kFwht, kCoarse, false, false>(p, whole, 0, stream);
    if (err) return err;
  }
  if (tiles > whole) return launch_spec_instance<G, kDType, kFwht, kCoarse, false, true>(p, tiles - whole, whole, stream);
  return 0;
}

template <int kDType>
int launch_spec_dtype(const Params& p, cudaStream_t stream) {
  const bool fwht = p.cfg.fwht && p.transform;
  if (p.cfg.coarse == kCoarseGroup)
    return fwht ? launch_spec_packing<kDType, true, true>(p, stream) : launch_spec_packing<kDType, false, true>(p, stream);
  return launch_spec_packing<kDType, true, false>(p, stream);
}

}  // namespace

// The configs the specialized kernels cover: e2m1 / 16 / e4m3 "nearest" / group 2048 /
// round to nearest, any packing and input dtype, and either a group coarse scale (with the
// FWHT, or without: no_fwht, or values already transformed) or the FWHT without a coarse
// scale (single_scale).
bool spec_supported(const Params& p) {
  const Config& c = p.cfg;
  if (c.element != kE2M1 || c.micro_group != 16 || c.micro_scale != kScaleE4M3 || c.scale_round != kScaleNearest)
    return false;
  if (c.rounding != kRoundNearest || c.group != kSpecGroup || p.prepared) return false;
  if (p.x_dtype != kF32 && p.x_dtype != kBF16 && p.x_dtype != kF16) return false;
  if (c.packing != kPackWarp && c.packing != kPackNaive) return false;
  // offsets inside a message, rows and tiles: 32-bit counters
  if (p.lay.nbytes > 0x7FFFFFFF || p.rows > 0x7FFFFFFF || p.lay.padded / kSpecGroup > 0x7FFFFFFF) return false;
  if (c.coarse == kCoarseGroup) return true;
  return c.coarse == kCoarseNone && c.fwht && p.transform;
}

int launch_spec(const Params& p0, cudaStream_t stream) {
  const Params& p = p0;
  switch (p.x_dtype) {
    case kF32:
      return launch_spec_dtype<kF32>(p, stream);
    case kBF16:
      return launch_spec_dtype<kBF16>(p, stream);
    default:
      return launch_spec_dtype<kF16>(p, stream);
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace fp4q
