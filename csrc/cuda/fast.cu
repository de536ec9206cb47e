// The common-case kernel of fp4quant (docs/format.md; the paper's kernel): e2m1 values,
// e4m3 micro-scales of 16 values, segments (lay.block) of at most 8192 values.  It
// quantizes (coarse group / none; tensor without the FWHT), dequantizes and reduces.
//
// A block of T = tile/8 threads (256 .. 1024) takes a tile of max(segment, 2048) values;
// thread t holds tile values 8t .. 8t+7 in registers, half a micro-group, so a lane and
// its neighbour (lane ^ 1) share a micro-group.
//  - loads / stores of values: 16-byte vectors where aligned (scalar at the row's end).
//  - FWHT: level one (strides 1, 2, 4) in registers, stride 8 with __shfl_xor_sync
//    between the two lanes of a micro-group; level two (strides 16 .. G/2) in shared
//    memory, three strides per round on 8 values per thread.  Each butterfly is the
//    (a + b, a - b) of the same pair as the sequential code, stages in the same order.
//  - segment maxima: shuffles inside a warp, shared memory across warps.
//  - codes: 8 nibbles per thread = one 32-bit word.  Warp packing: 4 lanes' words are
//    gathered by shuffles into one 16-byte store on a 16-byte boundary (the words that
//    fall outside whole 16-byte lines are stored as words); naive packing: each thread
//    stores its own word (one 32-bit store: a warp writes the same 128 contiguous bytes),
//    so the two differ only by the lanes' cooperation.  Both give the same bytes.  (The
//    quantize presets run quantize.cu's specialized kernels instead.)
#include "common.cuh"

namespace fp4q {
namespace cuda {
namespace detail {
namespace {

constexpr int kMaxFastSegment = 8192;  // a tile of 8192 values is 1024 threads x 8
constexpr int kMinTile = 2048;         // 256 threads

// Shared-memory slot of tile value i: 16 floats of padding after every 128 keep both the
// rounds of level two and the 8-value chunk accesses free of bank conflicts.
FP4Q_DEV int pad_index(int i) { return i + ((i >> 7) << 4); }
inline int padded_floats(int tile) { return tile + (tile >> 3); }

// One radix-2 stage of stride H on 8 values: (a, b) -> (a + b, a - b).
template <int H>
FP4Q_DEV void stage(float (&y)[8]) {
#pragma unroll
  for (int k0 = 0; k0 < 8; k0 += 2 * H) {
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const float a = y[k0 + j], b = y[k0 + j + H];
      y[k0 + j] = add_rn(a, b);
      y[k0 + j + H] = sub_rn(a, b);
    }
  }
}

FP4Q_DEV void store8(float* p, const float (&y)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(y[0], y[1], y[2], y[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(y[4], y[5], y[6], y[7]);
}

FP4Q_DEV void load8(const float* p, float (&y)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  y[0] = a.x, y[1] = a.y, y[2] = a.z, y[3] = a.w, y[4] = b.x, y[5] = b.y, y[6] = b.z, y[7] = b.w;
}

// Unnormalized FWHT of every group of the tile (all threads call it).
FP4Q_DEV void butterflies(const Params& p, float (&y)[8], float* buf) {
  const int t = threadIdx.x;
  stage<1>(y);
  stage<2>(y);
  stage<4>(y);
  // stride 8: the even lane holds a (the lower index), the odd lane b
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float o = __shfl_xor_sync(kFullMask, y[k], 1);
    y[k] = (t & 1) ? sub_rn(o, y[k]) : add_rn(y[k], o);
  }
  if (p.log2_group <= 4) return;
  store8(buf + pad_index(8 * t), y);
  for (int b = 4; b < p.log2_group; b += 3) {
    __syncthreads();
    // This round's 8 values per thread vary the index bits w, w+1, w+2 (w <= b keeps
    // them inside the tile); it runs the stages of bits b .. min(b+3, log2 G) - 1.
    const int w = b < p.log2_tile - 3 ? b : p.log2_tile - 3;
    const int base = ((t >> w) << (w + 3)) | (t & ((1 << w) - 1));
    float z[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) z[j] = buf[pad_index(base | (j << w))];
    const int lo = b - w, hi = (b + 3 < p.log2_group ? b + 3 : p.log2_group) - w;
    if (lo <= 0 && 0 < hi) stage<1>(z);
    if (lo <= 1 && 1 < hi) stage<2>(z);
    if (lo <= 2 && 2 < hi) stage<4>(z);
#pragma unroll
    for (int j = 0; j < 8; ++j) buf[pad_index(base | (j << w))] = z[j];
  }
  __syncthreads();
  load8(buf + pad_index(8 * t), y);
}

// Maximum over the `tps` consecutive threads of a segment (a power of two, 2 .. blockDim).
FP4Q_DEV uint32_t segment_max(uint32_t v, int tps, uint32_t* red) {
  const int lanes = tps < 32 ? tps : 32;
  for (int o = 1; o < lanes; o <<= 1) v = umax(v, __shfl_xor_sync(kFullMask, v, o));
  if (tps > 32) {
    const int warp = threadIdx.x >> 5;
    __syncthreads();  // a previous call's readers are done with red
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    const int warps = tps >> 5, first = warp & ~(warps - 1);
    v = red[first];
    for (int k = 1; k < warps; ++k) v = umax(v, red[first + k]);
  }
  return v;
}

FP4Q_DEV uint32_t chunk_finite_max(const float (&y)[8]) {
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) m = umax(m, finite_bits(y[k]));
  return m;
}

// Values v0 .. v0+7 of a row of x (zero past n).
FP4Q_DEV void load_chunk(const Params& p, int64_t row, int64_t v0, float (&y)[8]) {
  const int64_t n = p.lay.n;
  const char* base = static_cast<const char*>(p.x) + row * p.x_row_stride * value_bytes(p.x_dtype);
  if (p.x_vec && v0 + 8 <= n) {
    if (p.x_dtype == kF32) {
      const float4* q = reinterpret_cast<const float4*>(base) + (v0 >> 2);
      const float4 a = q[0], b = q[1];
      y[0] = a.x, y[1] = a.y, y[2] = a.z, y[3] = a.w, y[4] = b.x, y[5] = b.y, y[6] = b.z, y[7] = b.w;
    } else {
      const uint4 q = reinterpret_cast<const uint4*>(base)[v0 >> 3];
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint16_t h = uint16_t(w[k >> 1] >> (16 * (k & 1)));
        y[k] = p.x_dtype == kBF16 ? bf16_value(h) : half_value(h);
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) y[k] = v0 + k < n ? load_value(base, p.x_dtype, v0 + k) : 0.0f;
  }
}

// Values v0 .. v0+7 (those below n) of an output row, rounded to its dtype (saturating or not).
FP4Q_DEV void store_chunk(void* row_base, int32_t dtype, int64_t n, int64_t v0, const float (&y)[8], bool saturate) {
  char* at = static_cast<char*>(row_base) + v0 * value_bytes(dtype);
  if (v0 + 8 <= n && (reinterpret_cast<uintptr_t>(at) & 15u) == 0) {
    if (dtype == kF32) {
      float4* q = reinterpret_cast<float4*>(at);
      q[0] = make_float4(out_f32(y[0], saturate), out_f32(y[1], saturate), out_f32(y[2], saturate), out_f32(y[3], saturate));
      q[1] = make_float4(out_f32(y[4], saturate), out_f32(y[5], saturate), out_f32(y[6], saturate), out_f32(y[7], saturate));
    } else {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo = out_bits16(dtype, y[2 * j], saturate);
        const uint32_t hi = out_bits16(dtype, y[2 * j + 1], saturate);
        w[j] = lo | (hi << 16);
      }
      *reinterpret_cast<uint4*>(at) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (v0 + k < n) store_value(row_base, dtype, v0 + k, y[k], saturate);
  }
}

// Decode values v0 .. v0+7 (< padded) of a message in the transformed domain:
// code * m * (c * 2**-E) with a coarse scale (this kernel's e4m3 micro-scales need no
// normalization without one: fp4quant.h, decode_normalizes).
FP4Q_DEV void decode_chunk(const Params& p, const uint8_t* msg, int64_t v0, int E, float (&y)[8]) {
  float f = coarse_of(p, msg, v0);
  if (p.cfg.coarse != kCoarseNone) f = mul_rn(f, pow2(-E));
  const float s = decode_micro(p.cfg, msg[p.lay.micro_off + (v0 >> 4)], f);
  const uint32_t w = load_u32(msg + p.lay.codes_off + (v0 >> 1));
#pragma unroll
  for (int k = 0; k < 8; ++k) y[k] = mul_rn(e2m1_value((w >> (4 * k)) & 0xFu), s);
}

// The block exponent of the thread's values: the largest of the messages' (0 without a coarse scale).
FP4Q_DEV int chunk_exponent(const Params& p, const uint8_t* msgs, int64_t count, int64_t v0, bool valid) {
  return p.cfg.coarse != kCoarseNone && valid ? coarse_exponent(p, msgs, count, v0) : 0;
}

// Sum of the world's messages (row order) in the transformed domain, against 2**-E.
FP4Q_DEV void sum_chunk(const Params& p, int64_t v0, bool valid, int E, float (&y)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) y[k] = 0.0f;
  if (!valid) return;
  decode_chunk(p, p.msgs, v0, E, y);
  for (int64_t w = 1; w < p.world; ++w) {
    float z[8];
    decode_chunk(p, p.msgs + w * p.lay.nbytes, v0, E, z);
#pragma unroll
    for (int k = 0; k < 8; ++k) y[k] = add_rn(y[k], z[k]);
  }
}

// Store this lane's code word (the 4 bytes at dst) and its warp's.
FP4Q_DEV void store_codes(uint8_t* dst, uint32_t word, int64_t v0, int64_t padded, bool warp_pack) {
  const int lane = threadIdx.x & 31;
  const bool valid = v0 < padded;
  if (warp_pack) {
    const uint32_t w1 = __shfl_down_sync(kFullMask, word, 1);
    const uint32_t w2 = __shfl_down_sync(kFullMask, word, 2);
    const uint32_t w3 = __shfl_down_sync(kFullMask, word, 3);
    const uintptr_t first = reinterpret_cast<uintptr_t>(dst) - 4u * uint32_t(lane);  // lane 0's bytes
    if ((first & 3u) == 0) {
      const int64_t left = (padded - (v0 - 8 * lane)) >> 3;  // valid lanes, a prefix of the warp
      const int valid_lanes = left < 0 ? 0 : (left > 32 ? 32 : int(left));
      const int head = int(((16u - uint32_t(first & 15u)) & 15u) >> 2);  // lanes before the first 16-byte boundary
      const int lead = lane - ((lane - head) & 3);                        // first lane of this lane's 16-byte line
      if (lane >= head && lead + 3 < valid_lanes) {
        if (lane == lead) *reinterpret_cast<uint4*>(dst) = make_uint4(word, w1, w2, w3);
      } else if (valid) {
        *reinterpret_cast<uint32_t*>(dst) = word;
      }
      return;
    }
    // a row that starts at an odd address: byte stores, as below
  }
  if (!valid) return;
  if ((reinterpret_cast<uintptr_t>(dst) & 3u) == 0) {
    *reinterpret_cast<uint32_t*>(dst) = word;  // naive packing: the thread's own word, one store
  } else {
#pragma unroll
    for (int b = 0; b < 4; ++b) dst[b] = uint8_t(word >> (8 * b));
  }
}

// docs/format.md steps 1-8 on this thread's 8 values; msg: the message, ctr: the
// stochastic-rounding counter of its first padded value.
// sum_scale: 2**E when y is a sum normalized by 2**-E (requantization), else 1.
template <bool kFwht>
FP4Q_DEV void encode_chunk(const Params& p, float (&y)[8], int64_t row, int64_t v0, uint8_t* msg, uint64_t ctr,
                           float* buf, uint32_t* red, float sum_scale) {
  const Config& cfg = p.cfg;
  const int t = threadIdx.x;
  const int tps = int(p.lay.block >> 3);  // threads per segment
  const bool valid = v0 < p.lay.padded;
  // 1. power-of-two normalization (without a coarse scale: of each FWHT group)
  const bool group_e = cfg.coarse == kCoarseGroup || (cfg.coarse == kCoarseNone && kFwht);
  int e = 0;
  if (group_e) e = normalizing_exponent(u2f(segment_max(chunk_finite_max(y), tps, red)));
  if (cfg.coarse == kCoarseTensor) e = normalizing_exponent(u2f(p.words[2 * row]));
  if (cfg.coarse != kCoarseNone || kFwht) {
    const float f = pow2(-e);
#pragma unroll
    for (int k = 0; k < 8; ++k) y[k] = mul_rn(y[k], f);
  }
  // 2. FWHT (tiles start at multiples of G, so 8t + k is the position in the group);
  // without a coarse scale, times 2**e again (saturating)
  if (kFwht) {
    const int gmask = (1 << p.log2_group) - 1;
    if (p.signs) {
#pragma unroll
      for (int k = 0; k < 8; ++k) y[k] = mul_rn(y[k], p.signs[(8 * t + k) & gmask]);
    }
    butterflies(p, y, buf);
    const float back = pow2(e);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      y[k] = mul_rn(y[k], p.inv_sqrt);
      if (cfg.coarse == kCoarseNone) y[k] = mul_saturating(y[k], back);
    }
  }
  // 3. coarse scale (stored as c * 2**e)
  float c = 0.0f;
  if (cfg.coarse == kCoarseGroup) {
    c = div_rn(u2f(segment_max(chunk_finite_max(y), tps, red)), coarse_divisor(cfg));
    if (valid && (t & (tps - 1)) == 0) store_u32(msg + 4 * (v0 >> p.log2_block), f2u(mul_rn(mul_rn(c, pow2(e)), sum_scale)));
  } else if (cfg.coarse == kCoarseTensor) {
    const TensorScale ts = tensor_scale(cfg, p.words + 2 * row, false);
    c = ts.c;
    if (v0 == 0) store_u32(msg, f2u(mul_rn(c, pow2(ts.e))));
  }
  // 4-5. the micro-group's scale, from this lane's and its neighbour's halves
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float a = abs_f(y[k]);
    finite = finite && is_finite(a);
    amax = a > amax ? a : amax;
  }
  const float other = __shfl_xor_sync(kFullMask, amax, 1);
  finite = (__shfl_xor_sync(kFullMask, int(finite), 1) != 0) && finite;
  amax = other > amax ? other : amax;
  const MicroScale ms = micro_scale(cfg, amax, finite, c);
  if (valid && (t & 1) == 0) msg[p.lay.micro_off + (v0 >> 4)] = uint8_t(ms.stored);
  // 6-7. codes: value 2i in the low nibble of byte i, i.e. nibble k of the little-endian word
  const bool stochastic = cfg.rounding == kRoundStochastic;
  uint32_t word = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float u = stochastic ? uniform(p.key, ctr + uint64_t(v0 + k)) : 0.0f;
    const uint32_t code = finite ? quantize_value(cfg, mul_rn(y[k], ms.r), u) : 0u;
    word |= code << (4 * k);
  }
  store_codes(msg + p.lay.codes_off + (v0 >> 1), word, v0, p.lay.padded, cfg.packing == kPackWarp);
}

template <int kMode, bool kFwht>
__global__ void __launch_bounds__(1024, 1) fast_kernel(const Params p) {
  extern __shared__ __align__(16) float fp4q_smem[];
  __shared__ uint32_t red[32];
  const int t = threadIdx.x;
  const int64_t tiles = p.rows * p.tiles_per_row;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t row = tile / p.tiles_per_row;
    const int64_t v0 = (tile - row * p.tiles_per_row) * p.tile_values + 8 * t;  // this thread's first value
    const bool valid = v0 < p.lay.padded;
    float y[8];
    if (kMode == kModeQuantize) {
      load_chunk(p, row, v0, y);
      encode_chunk<kFwht>(p, y, row, v0, p.out_msgs + row * p.lay.nbytes, p.offset + uint64_t(row * p.lay.padded),
                          fp4q_smem, red, 1.0f);
    } else if (kMode == kModeReduceRequant) {
      // a coarse scale carries the sum's 2**E (this kernel has no e8m0 scales to give it back to)
      const int E = chunk_exponent(p, p.msgs, p.world, v0, valid);
      sum_chunk(p, v0, valid, E, y);
      encode_chunk<false>(p, y, 0, v0, p.out_msgs, p.offset, fp4q_smem, red, pow2(E));
    } else {
      // dequantize (row `row`) or reduce (one row): decode against 2**-E, inverse FWHT, 2**E, store
      const bool one = kMode == kModeDequantize;
      const uint8_t* msgs = one ? p.msgs + row * p.lay.nbytes : p.msgs;
      const int E = chunk_exponent(p, msgs, one ? 1 : p.world, v0, valid);
      if (one) {
#pragma unroll
        for (int k = 0; k < 8; ++k) y[k] = 0.0f;
        if (valid) decode_chunk(p, msgs, v0, E, y);
      } else {
        sum_chunk(p, v0, valid, E, y);
      }
      if (kFwht) {
        butterflies(p, y, fp4q_smem);
        const int gmask = (1 << p.log2_group) - 1;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          float v = mul_rn(y[k], p.inv_sqrt);
          if (p.signs) v = mul_rn(v, p.signs[(8 * t + k) & gmask]);
          y[k] = v;
        }
      }
      if (p.cfg.coarse != kCoarseNone) {
        const float scale_back = pow2(E);
#pragma unroll
        for (int k = 0; k < 8; ++k) y[k] = mul_rn(y[k], scale_back);
      }
      void* out_row = static_cast<char*>(p.out) + row * p.lay.n * value_bytes(p.out_dtype);
      store_chunk(out_row, p.out_dtype, p.lay.n, v0, y, output_saturates(p, kMode));
    }
    __syncthreads();  // shared memory is reused by the next tile
  }
}

int log2_exact(int64_t v) {
  int l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return l;
}

template <int kMode, bool kFwht>
int launch(const Params& p, int threads, size_t smem, cudaStream_t stream) {
  int grid = 0;
  const void* kernel = reinterpret_cast<const void*>(fast_kernel<kMode, kFwht>);
  if (int err = persistent_grid(kernel, threads, smem, p.rows * p.tiles_per_row, &grid)) return err;
  if (grid == 0) return 0;
  fast_kernel<kMode, kFwht><<<grid, threads, smem, stream>>>(p);
  return int(cudaGetLastError());
}

}  // namespace

bool fast_supported(const Params& p, int mode) {
  const Config& c = p.cfg;
  if (c.element != kE2M1 || c.micro_scale != kScaleE4M3 || c.micro_group != 16) return false;
  if (p.lay.block > kMaxFastSegment) return false;
  switch (mode) {
    case kModeQuantize:  // a tensor scale with the FWHT needs the workspace pre-pass: generic kernel
      return !(c.coarse == kCoarseTensor && c.fwht && p.transform);
    case kModeDequantize:
    case kModeReduceOut:
      return true;
    case kModeReduceRequant:  // the tensor scale needs the sum first: generic kernel
      return c.coarse != kCoarseTensor;
    default:
      return false;
  }
}

int launch_fast(const Params& p0, int mode, cudaStream_t stream) {
  Params p = p0;
  p.tile_values = int32_t(p.lay.block > kMinTile ? p.lay.block : kMinTile);
  p.log2_tile = log2_exact(p.tile_values);
  p.tiles_per_row = (p.lay.padded + p.tile_values - 1) / p.tile_values;
  const int threads = p.tile_values / 8;
  bool fwht = p.cfg.fwht != 0;
  if (mode == kModeQuantize) fwht = fwht && p.transform;
  if (mode == kModeReduceRequant) fwht = false;  // the sum is already transformed
  const size_t smem = fwht && p.log2_group > 4 ? sizeof(float) * size_t(padded_floats(p.tile_values)) : 0;
  switch (mode) {
    case kModeQuantize:
      return fwht ? launch<kModeQuantize, true>(p, threads, smem, stream)
                  : launch<kModeQuantize, false>(p, threads, smem, stream);
    case kModeDequantize:
      return fwht ? launch<kModeDequantize, true>(p, threads, smem, stream)
                  : launch<kModeDequantize, false>(p, threads, smem, stream);
    case kModeReduceOut:
      return fwht ? launch<kModeReduceOut, true>(p, threads, smem, stream)
                  : launch<kModeReduceOut, false>(p, threads, smem, stream);
    case kModeReduceRequant:
      return launch<kModeReduceRequant, false>(p, threads, smem, stream);
    default:
      return int(cudaErrorInvalidValue);
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace fp4q
