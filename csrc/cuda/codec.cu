// CUDA codec of fp4quant: the host entry points of launch.h, the generic kernel (every
// config the CPU codec accepts) and the tensor-scale pre-passes.  The common case runs
// the fast kernel of fast.cu; quantize() runs quantize.cu's compile-time specialized kernels
// where spec_supported() says one covers the config (the presets' e2m1 / e4m3 / 2048 configs
// rounded to nearest), and fast.cu's or the generic kernel otherwise.  Semantics: csrc/cpu/codec_generic.h, docs/format.md;
// the bytes and values are the same bit for bit.
//
// Generic kernel: 256 threads take a tile of max(segment, 2048, 256 * min(micro_group, 32))
// values (whole segments of one row), staged in shared memory (in global memory when a
// segment of 2**16 values does not fit).  Values are filled one per thread-stride
// (coalesced), the FWHT runs one radix-2 stage per barrier, and each thread then encodes
// whole micro-groups (scale, codes, byte stores).  Segment maxima: shared-memory atomicMax
// on float bits.
//
// Tensor scale (coarse_scale="tensor"): the row maxima come first, from a pre-pass that
// atomicMax-es float bits into reduce_scratch (zeroed by the caller); with the FWHT a
// second pre-pass writes the normalized, transformed rows to the workspace (as the CPU
// codec does) and their maxima; then the main kernel encodes.
#include "common.cuh"
#include "launch.h"

namespace fp4q {
namespace cuda {
namespace detail {

namespace {

constexpr int kThreads = 256;         // generic and pre-pass kernels
constexpr int kAmaxTile = 8192;       // values per tile of the row-maximum pre-pass
constexpr int kDefaultSmem = 48 << 10;  // dynamic shared memory allowed without opting in

// Shared-memory slot of tile value i: one float of padding per 32 keeps the per-micro-group
// reads (stride micro_group across threads) and the butterflies free of bank conflicts.
FP4Q_DEV int gpad(int i) { return i + (i >> 5); }
__host__ __device__ inline int64_t gpadded_floats(int64_t tile) { return tile + (tile >> 5); }

// Value v of the tile's row before encoding (quantize, reduce) or after decoding; E: the
// block exponent of v's segment (decoding modes).
template <int kMode>
FP4Q_DEV float fill_value(const Params& p, int64_t row, int64_t v, int E) {
  if (v >= p.lay.padded) return 0.0f;
  if (kMode == kModeQuantize || kMode == kModeTransform) {
    if (kMode == kModeQuantize && p.prepared) return p.workspace[row * p.lay.padded + v];
    if (v >= p.lay.n) return 0.0f;  // zero padding
    const char* base = static_cast<const char*>(p.x) + row * p.x_row_stride * value_bytes(p.x_dtype);
    return load_value(base, p.x_dtype, v);
  }
  if (kMode == kModeDequantize) return decode_value(p, p.msgs + row * p.lay.nbytes, v, E);
  if (kMode == kModeReduceRequant && p.cfg.coarse == kCoarseTensor) return p.workspace[v];  // summed by the pre-pass
  // the reduce modes: decoded in the transformed domain against 2**-E, summed in row order
  float s = decode_value(p, p.msgs, v, E);
  for (int64_t w = 1; w < p.world; ++w) s = add_rn(s, decode_value(p, p.msgs + w * p.lay.nbytes, v, E));
  return s;
}

// seg_E[k] = the block exponent (as int bits) of the tile's segment k where decode_normalizes:
// the largest over the messages the mode decodes (dequantize: the row's; reduce: all of them),
// from their coarse scales or (e8m0 FWHT groups) their largest finite micro-scales.  Ends
// with a barrier.
template <int kMode>
FP4Q_DEV void segment_exponents(const Params& p, int64_t row, int64_t start, int tile, int lb, uint32_t* seg_E) {
  const int nseg = tile >> lb;
  const uint8_t* msgs = kMode == kModeDequantize ? p.msgs + row * p.lay.nbytes : p.msgs;
  const int64_t count = kMode == kModeDequantize ? 1 : p.world;
  if (p.cfg.coarse != kCoarseNone) {
    for (int k = threadIdx.x; k < nseg; k += blockDim.x) {
      const int64_t v = start + (int64_t(k) << lb);
      seg_E[k] = uint32_t(v < p.lay.padded ? coarse_exponent(p, msgs, count, v) : 0);
    }
  } else {
    for (int k = threadIdx.x; k < nseg; k += blockDim.x) seg_E[k] = 0u;
    __syncthreads();
    const int lm = p.log2_micro, micros = tile >> lm;
    for (int64_t q = threadIdx.x; q < micros * count; q += blockDim.x) {
      const int g = int(q % micros);
      const int64_t v = start + (int64_t(g) << lm);
      if (v >= p.lay.padded) continue;
      const float m = decode_scale(micro_stored(p.lay, msgs + (q / micros) * p.lay.nbytes, v >> lm), kScaleE8M0);
      atomicMax(&seg_E[g >> (lb - lm)], finite_bits(m));
    }
    __syncthreads();
    for (int k = threadIdx.x; k < nseg; k += blockDim.x) seg_E[k] = uint32_t(normalizing_exponent(u2f(seg_E[k])));
  }
  __syncthreads();
}

// seg[k] = max(seg[k], finite |values| of the tile's segment k); ends with a barrier.
FP4Q_DEV void segment_maxima(const float* buf, int tile, int log2_seg, uint32_t* seg) {
  // tile is a multiple of blockDim.x: every lane of a warp runs every iteration
  for (int i = threadIdx.x; i < tile; i += blockDim.x) {
    uint32_t m = finite_bits(buf[gpad(i)]);
    if (log2_seg >= 5) {  // a warp's 32 values lie in one segment: one atomic per warp
      for (int o = 16; o > 0; o >>= 1) m = umax(m, __shfl_xor_sync(kFullMask, m, o));
      if ((i & 31) == 0) atomicMax(&seg[i >> log2_seg], m);
    } else {
      atomicMax(&seg[i >> log2_seg], m);
    }
  }
  __syncthreads();
}

// Radix-2 butterflies of strides 1 .. 2**(log2_seg - 1) on every segment of the tile,
// stage after stage (the sequential order); starts and ends synchronized.
FP4Q_DEV void tile_butterflies(float* buf, int tile, int log2_seg) {
  for (int h = 1; h < (1 << log2_seg); h <<= 1) {
    for (int q = threadIdx.x; q < tile / 2; q += blockDim.x) {
      const int i = ((q & ~(h - 1)) << 1) | (q & (h - 1));  // bit h of i clear
      const float a = buf[gpad(i)], b = buf[gpad(i + h)];
      buf[gpad(i)] = add_rn(a, b);
      buf[gpad(i + h)] = sub_rn(a, b);
    }
    __syncthreads();
  }
}

template <int kMode>
__global__ void __launch_bounds__(kThreads) generic_kernel(const Params p) {
  extern __shared__ __align__(16) float fp4q_smem[];
  __shared__ uint32_t red[32];
  const Config& cfg = p.cfg;
  const Layout& lay = p.lay;
  const int tid = threadIdx.x, T = blockDim.x;
  const int tile = p.tile_values;
  const int lb = p.log2_block;
  const int nseg = tile >> lb;
  const bool coarse_group = cfg.coarse == kCoarseGroup, tensor = cfg.coarse == kCoarseTensor;
  float* buf = p.staging ? p.staging + int64_t(blockIdx.x) * gpadded_floats(tile) : fp4q_smem;
  uint32_t* seg_raw = reinterpret_cast<uint32_t*>(p.staging ? fp4q_smem : fp4q_smem + gpadded_floats(tile));
  uint32_t* seg_y = seg_raw + nseg;  // maxima before / after the FWHT, per segment
  uint32_t* seg_E = seg_y + nseg;    // decoding modes: block exponents, per segment
  constexpr bool kDecodes = kMode != kModeQuantize && kMode != kModeTransform;
  const bool normalized = kDecodes && decode_normalizes(cfg);
  const int64_t tiles = p.rows * p.tiles_per_row;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row = t / p.tiles_per_row;
    const int64_t start = (t - row * p.tiles_per_row) * tile;
    if (normalized) segment_exponents<kMode>(p, row, start, tile, lb, seg_E);
    for (int i = tid; i < tile; i += T)
      buf[gpad(i)] = fill_value<kMode>(p, row, start + i, normalized ? int32_t(seg_E[i >> lb]) : 0);
    for (int k = tid; k < nseg; k += T) seg_raw[k] = seg_y[k] = 0u;
    __syncthreads();

    if (kMode == kModeDequantize || kMode == kModeReduceOut) {
      // inverse FWHT (then the signs), 2**E, store
      const bool saturate = output_saturates(p, kMode);
      void* out_row = static_cast<char*>(p.out) + row * lay.n * value_bytes(p.out_dtype);
      if (cfg.fwht) tile_butterflies(buf, tile, lb);
      for (int i = tid; i < tile; i += T) {
        const int64_t v = start + i;
        if (v >= lay.n) break;
        float x = buf[gpad(i)];
        if (cfg.fwht) {
          x = mul_rn(x, p.inv_sqrt);
          if (p.signs) x = mul_rn(x, p.signs[i & ((1 << lb) - 1)]);
        }
        if (normalized) x = mul_rn(x, pow2(int32_t(seg_E[i >> lb])));
        store_value(out_row, p.out_dtype, v, x, saturate);
      }
    } else if (kMode == kModeReduceToWorkspace) {
      uint32_t m = 0;
      for (int i = tid; i < tile; i += T) {
        const int64_t v = start + i;
        if (v >= lay.padded) break;
        const float x = buf[gpad(i)];
        p.workspace[v] = x;
        m = umax(m, finite_bits(x));
      }
      m = block_max(m, red);
      if (tid == 0 && m) atomicMax(p.words, m);
    } else {
      // kModeQuantize, kModeTransform, kModeReduceRequant: docs/format.md steps 1-8
      const bool prepared = kMode == kModeQuantize && p.prepared;
      uint8_t* msg = kMode == kModeReduceRequant ? p.out_msgs : p.out_msgs + row * lay.nbytes;
      TensorScale ts{0, 0.0f};
      if (tensor) {
        const uint32_t* words = p.words + (kMode == kModeReduceRequant ? 0 : 2 * row);
        ts = tensor_scale(cfg, words, kMode == kModeQuantize && cfg.fwht && p.transform);
      }
      const bool fwht_now = (kMode == kModeQuantize && cfg.fwht && p.transform && !prepared) || kMode == kModeTransform;
      const bool no_coarse_fwht = cfg.coarse == kCoarseNone && fwht_now;  // normalized per FWHT group
      // a sum without a coarse scale gets its 2**E back (saturating): no scale can carry it
      if (kMode == kModeReduceRequant && cfg.coarse == kCoarseNone && normalized) {
        for (int i = tid; i < tile; i += T) buf[gpad(i)] = mul_saturating(buf[gpad(i)], pow2(int32_t(seg_E[i >> lb])));
        __syncthreads();
      }
      // 1. power-of-two normalization (not again for workspace values)
      if (coarse_group || no_coarse_fwht) segment_maxima(buf, tile, lb, seg_raw);
      if ((cfg.coarse != kCoarseNone && !prepared) || no_coarse_fwht) {
        for (int i = tid; i < tile; i += T) {
          const int e = cfg.coarse == kCoarseTensor ? ts.e : normalizing_exponent(u2f(seg_raw[i >> lb]));
          buf[gpad(i)] = mul_rn(buf[gpad(i)], pow2(-e));
        }
        __syncthreads();
      }
      // 2. FWHT (segments are groups); without a coarse scale, times 2**e again (saturating)
      if (fwht_now) {
        if (p.signs) {
          for (int i = tid; i < tile; i += T) buf[gpad(i)] = mul_rn(buf[gpad(i)], p.signs[i & ((1 << lb) - 1)]);
          __syncthreads();
        }
        tile_butterflies(buf, tile, lb);
        for (int i = tid; i < tile; i += T) {
          float y = mul_rn(buf[gpad(i)], p.inv_sqrt);
          if (no_coarse_fwht) y = mul_saturating(y, pow2(normalizing_exponent(u2f(seg_raw[i >> lb]))));
          buf[gpad(i)] = y;
        }
        __syncthreads();
      }
      if (kMode == kModeTransform) {
        uint32_t m = 0;
        for (int i = tid; i < tile; i += T) {
          const int64_t v = start + i;
          if (v >= lay.padded) break;
          const float x = buf[gpad(i)];
          p.workspace[row * lay.padded + v] = x;
          m = umax(m, finite_bits(x));
        }
        m = block_max(m, red);
        if (tid == 0 && m) atomicMax(p.words + 2 * row + 1, m);
      } else {
        // 3. coarse scales, stored as c * 2**e
        const float D = coarse_divisor(cfg);
        if (coarse_group) {
          segment_maxima(buf, tile, lb, seg_y);
          for (int k = tid; k < nseg; k += T) {
            if (start + (int64_t(k) << lb) >= lay.padded) break;
            const float c = div_rn(u2f(seg_y[k]), D);
            const int e = normalizing_exponent(u2f(seg_raw[k]));
            const float sum_scale = normalized ? pow2(int32_t(seg_E[k])) : 1.0f;  // a sum: 2**E
            store_u32(msg + 4 * ((start >> lb) + k), f2u(mul_rn(mul_rn(c, pow2(e)), sum_scale)));
          }
        }
        if (tensor && start == 0 && tid == 0)
          store_u32(msg, f2u(mul_rn(mul_rn(ts.c, pow2(ts.e)), normalized ? pow2(int32_t(seg_E[0])) : 1.0f)));
        // 4-7. one micro-group per thread: scale, then codes
        const int lm = p.log2_micro, M = 1 << lm;
        const uint64_t ctr = kMode == kModeReduceRequant ? p.offset : p.offset + uint64_t(row * lay.padded);
        const bool stochastic = cfg.rounding == kRoundStochastic;
        const bool four_bit = element_bits(cfg.element) == 4;
        const uint32_t bad = element_nonfinite_code(cfg.element);
        for (int g = tid; g < (tile >> lm); g += T) {
          const int i0 = g << lm;
          const int64_t v0 = start + i0;
          if (v0 >= lay.padded) break;
          const float c = coarse_group ? div_rn(u2f(seg_y[i0 >> lb]), D) : ts.c;
          float amax = 0.0f;
          bool finite = true;
          for (int q = 0; q < M; ++q) {
            const float a = abs_f(buf[gpad(i0 + q)]);
            finite = finite && is_finite(a);
            amax = a > amax ? a : amax;
          }
          const MicroScale ms = micro_scale(cfg, amax, finite, c);
          const int64_t k = v0 >> lm;
          if (lay.micro_bytes == 1) msg[lay.micro_off + k] = uint8_t(ms.stored);
          if (lay.micro_bytes == 2) {
            msg[lay.micro_off + 2 * k] = uint8_t(ms.stored & 0xFFu);
            msg[lay.micro_off + 2 * k + 1] = uint8_t(ms.stored >> 8);
          }
          uint32_t low = 0;
          for (int q = 0; q < M; ++q) {
            const float u = stochastic ? uniform(p.key, ctr + uint64_t(v0 + q)) : 0.0f;
            const uint32_t code = finite ? quantize_value(cfg, mul_rn(buf[gpad(i0 + q)], ms.r), u) : bad;
            if (!four_bit) {
              msg[lay.codes_off + v0 + q] = uint8_t(code);
            } else if (q & 1) {
              msg[lay.codes_off + ((v0 + q) >> 1)] = uint8_t(low | (code << 4));
            } else {
              low = code;
            }
          }
        }
      }
    }
    __syncthreads();  // the tile buffer is reused
  }
}

// Finite maxima of the raw rows of x (tensor scale): reduce_scratch[2 * row].
__global__ void __launch_bounds__(kThreads) row_amax_kernel(const Params p) {
  __shared__ uint32_t red[32];
  const int64_t tiles = p.rows * p.tiles_per_row;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row = t / p.tiles_per_row;
    const int64_t start = (t - row * p.tiles_per_row) * p.tile_values;
    const char* base = static_cast<const char*>(p.x) + row * p.x_row_stride * value_bytes(p.x_dtype);
    uint32_t m = 0;
    for (int i = threadIdx.x; i < p.tile_values; i += blockDim.x) {
      const int64_t v = start + i;
      if (v >= p.lay.n) break;
      m = umax(m, finite_bits(load_value(base, p.x_dtype, v)));
    }
    m = block_max(m, red);
    if (threadIdx.x == 0 && m) atomicMax(p.words + 2 * row, m);
  }
}

int log2_exact(int64_t v) {
  int l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return l;
}

// fp32(1/sqrt(g)) exactly as the CPU codec (codec_generic.h: inv_sqrt_group) and the
// reference compute it: exact for even powers of two.
float inv_sqrt_group(int64_t g) {
  const int log2g = log2_exact(g);
  const float r = pow2(-(log2g / 2));
  return (log2g & 1) ? float(double(r) / 1.4142135623730951) : r;
}

Params base_params(const Config& cfg, const Layout& lay) {
  Params p{};
  p.cfg = cfg;
  p.lay = lay;
  p.log2_block = log2_exact(lay.block);
  p.log2_group = log2_exact(cfg.group);
  p.log2_micro = log2_exact(cfg.micro_group);
  p.inv_sqrt = inv_sqrt_group(cfg.group);
  return p;
}

// Per-block tile buffers in global memory (segments too large for shared memory).
int staging_alloc(const DeviceInfo& d, size_t bytes, cudaStream_t stream, float** out) {
  void* ptr = nullptr;
  const cudaError_t err = d.mem_pools ? cudaMallocAsync(&ptr, bytes, stream) : cudaMalloc(&ptr, bytes);
  *out = static_cast<float*>(ptr);
  return int(err);
}

int staging_free(const DeviceInfo& d, float* ptr, cudaStream_t stream) {
  return int(d.mem_pools ? cudaFreeAsync(ptr, stream) : cudaFree(ptr));  // cudaFree waits for the kernel
}

template <int kMode>
int launch_generic(Params p, cudaStream_t stream) {
  const int64_t seg = p.lay.block;
  const int64_t by_micro = int64_t(kThreads) * (p.cfg.micro_group < 32 ? p.cfg.micro_group : 32);
  int64_t tile = seg > 2048 ? seg : 2048;
  tile = tile > by_micro ? tile : by_micro;  // about one micro-group per thread
  p.tile_values = int32_t(tile);
  p.log2_tile = log2_exact(tile);
  p.tiles_per_row = (p.lay.padded + tile - 1) / tile;
  const int64_t tiles = p.rows * p.tiles_per_row;
  if (tiles == 0) return 0;
  DeviceInfo d;
  if (int err = device_info(&d)) return err;
  const size_t seg_bytes = 3 * sizeof(uint32_t) * size_t(tile / seg);
  size_t smem = sizeof(float) * size_t(gpadded_floats(tile)) + seg_bytes;
  const void* kernel = reinterpret_cast<const void*>(generic_kernel<kMode>);
  int grid = 0;
  float* staging = nullptr;
  if (smem + 1024 > size_t(d.smem_optin)) {
    // The tile does not fit in shared memory (a segment of 2**16 values): each block
    // stages it in global memory instead, one block per multiprocessor.
    smem = seg_bytes;
    grid = int(tiles < d.sms ? tiles : d.sms);
    if (int err = staging_alloc(d, sizeof(float) * size_t(grid) * size_t(gpadded_floats(tile)), stream, &staging))
      return err;
  } else {
    if (smem > size_t(kDefaultSmem)) {
      const cudaError_t err =
          cudaFuncSetAttribute(generic_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (err) return int(err);
    }
    if (int err = persistent_grid(kernel, kThreads, smem, tiles, &grid)) return err;
  }
  p.staging = staging;
  generic_kernel<kMode><<<grid, kThreads, smem, stream>>>(p);
  int err = int(cudaGetLastError());
  if (staging) {
    const int free_err = staging_free(d, staging, stream);
    err = err ? err : free_err;
  }
  return err;
}

int launch_row_amax(Params p, cudaStream_t stream) {
  p.tile_values = kAmaxTile;
  p.log2_tile = log2_exact(kAmaxTile);
  p.tiles_per_row = (p.lay.n + kAmaxTile - 1) / kAmaxTile;
  int grid = 0;
  const void* kernel = reinterpret_cast<const void*>(row_amax_kernel);
  if (int err = persistent_grid(kernel, kThreads, 0, p.rows * p.tiles_per_row, &grid)) return err;
  if (grid == 0) return 0;
  row_amax_kernel<<<grid, kThreads, 0, stream>>>(p);
  return int(cudaGetLastError());
}

template <int kMode>
int launch_best(const Params& p, cudaStream_t stream) {
  return fast_supported(p, kMode) ? launch_fast(p, kMode, stream) : launch_generic<kMode>(p, stream);
}

}  // namespace
}  // namespace detail

using namespace detail;

int quantize(const QuantizeArgs& a, cudaStream_t stream) {
  if (a.rows <= 0 || a.lay.padded == 0) return 0;
  Params p = base_params(a.cfg, a.lay);
  p.rows = a.rows;
  p.x = a.x;
  p.x_dtype = a.x_dtype;
  p.x_row_stride = a.x_row_stride;
  const int64_t row_bytes = a.x_row_stride * value_bytes(a.x_dtype);
  p.x_vec = (reinterpret_cast<uintptr_t>(a.x) & 15u) == 0 && (a.rows == 1 || (row_bytes & 15) == 0);
  p.transform = a.transform;
  p.out_msgs = a.out;
  p.signs = a.cfg.fwht ? a.signs : nullptr;
  p.key = a.key;
  p.offset = a.offset;
  p.workspace = a.workspace;
  p.words = a.reduce_scratch;
  if (a.cfg.coarse == kCoarseTensor) {
    if (!a.reduce_scratch) return int(cudaErrorInvalidValue);
    if (int err = launch_row_amax(p, stream)) return err;
    if (a.cfg.fwht && a.transform) {
      if (!a.workspace) return int(cudaErrorInvalidValue);
      if (int err = launch_generic<kModeTransform>(p, stream)) return err;
      p.prepared = true;
    }
  }
  if (spec_supported(p)) return launch_spec(p, stream);
  return launch_best<kModeQuantize>(p, stream);
}

int dequantize(const DequantizeArgs& a, cudaStream_t stream) {
  if (a.rows <= 0 || a.lay.padded == 0) return 0;
  Params p = base_params(a.cfg, a.lay);
  p.rows = a.rows;
  p.msgs = a.msgs;
  p.world = 1;
  p.out = a.out;
  p.out_dtype = a.out_dtype;
  p.signs = a.cfg.fwht ? a.signs : nullptr;
  p.saturate = a.saturate;
  return launch_best<kModeDequantize>(p, stream);
}

int dequantize_reduce(const ReduceArgs& a, cudaStream_t stream) {
  if (a.world <= 0 || a.lay.padded == 0) return 0;
  Params p = base_params(a.cfg, a.lay);
  p.rows = 1;
  p.msgs = a.msgs;
  p.world = a.world;
  p.out_msgs = a.out_msg;
  p.out = a.out;
  p.out_dtype = a.out_dtype;
  p.signs = a.cfg.fwht ? a.signs : nullptr;
  p.key = a.key;
  p.offset = a.offset;
  p.workspace = a.workspace;
  p.words = a.reduce_scratch;
  if (!a.requantize) return launch_best<kModeReduceOut>(p, stream);
  if (a.cfg.coarse == kCoarseTensor) {
    if (!a.workspace || !a.reduce_scratch) return int(cudaErrorInvalidValue);
    if (int err = launch_generic<kModeReduceToWorkspace>(p, stream)) return err;
    return launch_generic<kModeReduceRequant>(p, stream);
  }
  return launch_best<kModeReduceRequant>(p, stream);
}

const char* error_string(int err) { return cudaGetErrorString(cudaError_t(err)); }

}  // namespace cuda
}  // namespace fp4q
