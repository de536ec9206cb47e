// A CPU stand-in for the parts of the CUDA runtime and device language that
// csrc/cuda/*.cu use, so that the kernels can be run (slowly) and checked bit for bit
// on a machine without a GPU.  Test-only (tests/ops/test_cuda.py).
//
// Blocks run one after another.  The CUDA threads of a block are fibers on one OS thread
// (default: deterministic and fast) or, with EMU_THREADS, one std::thread each (for the
// sanitizers).  __syncthreads is a barrier over the block; warp shuffles exchange through
// per-warp slots between two barriers of the warp (so they need all 32 lanes, as the
// kernels' full masks promise); a deadlock (threads at different barriers) aborts.  Shared memory: `static` locals (blocks run one at a
// time) and a per-block dynamic buffer filled with 0xFF bytes (reading it before writing
// shows up as NaN).  Launch checks: grid >= 1, block a multiple of 32 up to 1024,
// dynamic shared memory within the opted-in limit.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <algorithm>
#include <random>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#ifndef EMU_THREADS
#include <csetjmp>
#include <ucontext.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
};
typedef struct CUstream_st* cudaStream_t;
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount,
  cudaDevAttrMaxThreadsPerMultiProcessor,
  cudaDevAttrMaxSharedMemoryPerBlockOptin,
  cudaDevAttrMemoryPoolsSupported,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };

struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
struct alignas(8) uint2 {
  uint32_t x, y;
};
inline uint2 make_uint2(uint32_t x, uint32_t y) { return uint2{x, y}; }
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return uint4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

struct emu_uint3 {
  unsigned x, y, z;
};

namespace emu {

// The emulated device (tests set these).
inline int sms = 2;
inline int threads_per_sm = 2048;
inline int smem_optin = 227 * 1024;
inline int mem_pools = 1;
inline int occupancy = 1;  // blocks per multiprocessor reported by the occupancy query
inline cudaError_t last_error = cudaSuccess;
inline int launches = 0;
inline std::map<const void*, int> max_dynamic_smem;

// A barrier of `expected` participants (a block, or a warp for shuffles).
struct Barrier {
  explicit Barrier(int n) : expected(n) {}
  int expected, count = 0;
  uint64_t gen = 0;
#ifdef EMU_THREADS
  std::mutex mu;
  std::condition_variable cv;
#endif
};

struct Ctx {
  emu_uint3 thread, block, block_dim, grid_dim;
};

struct Block {
  Block(int threads, size_t smem_bytes)
      : sync(threads), slots(size_t(threads)), smem(static_cast<char*>(std::aligned_alloc(16, (smem_bytes + 16) / 16 * 16))) {
    for (int w = 0; w < threads / 32; ++w) warps.emplace_back(std::make_unique<Barrier>(32));
    std::memset(smem, 0xFF, (smem_bytes + 16) / 16 * 16);
  }
  ~Block() { std::free(smem); }
  Barrier sync;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<uint32_t> slots;
  char* smem;
};

inline Block* block = nullptr;

#ifdef EMU_THREADS
// One OS thread per CUDA thread (for the sanitizers: they see real concurrency).
inline thread_local Ctx ctx;

inline void arrive(Barrier& b) {
  std::unique_lock<std::mutex> lock(b.mu);
  const uint64_t gen = b.gen;
  if (++b.count == b.expected) {
    b.count = 0;
    ++b.gen;
    b.cv.notify_all();
    return;
  }
  b.cv.wait(lock, [&] { return b.gen != gen; });
}

template <class K>
void run_block(int threads, K&& body) {
  std::vector<std::thread> pool;
  pool.reserve(size_t(threads));
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { body(t); });
  for (auto& th : pool) th.join();
}
#else
// Fibers (ucontext) on one OS thread: a fiber runs until it waits at a barrier, then the
// scheduler resumes the next runnable one.  Deterministic, and fast enough for tests.
inline Ctx ctx;

// ucontext only enters a fiber's stack; every later switch is _setjmp/_longjmp, which
// (unlike swapcontext) saves no signal mask, so a switch makes no system call.
struct Fiber {
  ucontext_t uc;
  jmp_buf jb;
  bool started = false;
  char* stack;
  Ctx cuda;
  Barrier* waiting = nullptr;
  uint64_t wait_gen = 0;
  bool done = false;
};

inline ucontext_t scheduler;
inline jmp_buf scheduler_jb;
inline Fiber* current = nullptr;
inline std::function<void(int)>* fiber_body = nullptr;

inline void arrive(Barrier& b) {
  if (++b.count == b.expected) {
    b.count = 0;
    ++b.gen;
    return;
  }
  current->waiting = &b;
  current->wait_gen = b.gen;
  if (!_setjmp(current->jb)) _longjmp(scheduler_jb, 1);
}

[[noreturn]] inline void fiber_main() {
  (*fiber_body)(int(current->cuda.thread.x));
  current->done = true;
  _longjmp(scheduler_jb, 1);  // never returns: uc_link would resume a stale scheduler context
}

template <class K>
void run_block(int threads, K&& body) {
  constexpr size_t kStack = 256 * 1024;
  static std::vector<std::unique_ptr<char[]>> stacks;  // reused by every block
  while (stacks.size() < size_t(threads)) stacks.emplace_back(new char[kStack]);
  std::function<void(int)> fn = [&](int t) { body(t); };
  fiber_body = &fn;
  std::vector<Fiber> fibers(static_cast<size_t>(threads));
  const Ctx base = ctx;
  for (int t = 0; t < threads; ++t) {
    Fiber& f = fibers[size_t(t)];
    f.stack = stacks[size_t(t)].get();
    f.cuda = base;
    f.cuda.thread = {unsigned(t), 0, 0};
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = kStack;
    f.uc.uc_link = &scheduler;
    makecontext(&f.uc, fiber_main, 0);
  }
  // Resume the runnable fibers in a fresh random order each pass, so that a missing
  // barrier (one thread reading what another writes in the same phase) shows either way.
  static std::mt19937 order_rng(12345);
  std::vector<int> order(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) order[size_t(t)] = t;
  int left = threads;
  while (left > 0) {
    bool progress = false;
    std::shuffle(order.begin(), order.end(), order_rng);
    for (int i : order) {
      Fiber& f = fibers[size_t(i)];
      if (f.done || (f.waiting && f.waiting->gen == f.wait_gen)) continue;
      f.waiting = nullptr;
      current = &f;
      ctx = f.cuda;
      if (!_setjmp(scheduler_jb)) {
        if (f.started) _longjmp(f.jb, 1);
        f.started = true;
        swapcontext(&scheduler, &f.uc);
      }
      progress = true;
      if (f.done) --left;
    }
    if (!progress) {
      std::fprintf(stderr, "emulator: deadlock (threads wait at different barriers)\n");
      std::abort();
    }
  }
  current = nullptr;
}
#endif

inline uint32_t exchange(uint32_t bits, int src_lane) {
  const int t = int(ctx.thread.x), w = t / 32;
  block->slots[size_t(t)] = bits;
  arrive(*block->warps[size_t(w)]);
  const uint32_t r = block->slots[size_t(w * 32 + src_lane)];
  arrive(*block->warps[size_t(w)]);
  return r;
}

template <class T>
inline uint32_t to_bits(T v) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
template <class T>
inline T from_bits(uint32_t u) {
  T v;
  std::memcpy(&v, &u, 4);
  return v;
}

template <class... P, class... A>
void launch(void (*kernel)(P...), int grid, int threads, size_t smem, cudaStream_t, A&&... args) {
  ++launches;
  if (grid < 1 || threads < 32 || threads > 1024 || threads % 32) {
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  auto it = max_dynamic_smem.find(reinterpret_cast<const void*>(kernel));
  const size_t limit = it == max_dynamic_smem.end() ? 48 * 1024 : size_t(it->second);
  if (smem > limit) {
    last_error = cudaErrorInvalidValue;
    return;
  }
  for (int b = 0; b < grid; ++b) {
    Block blk(threads, smem);
    block = &blk;
    ctx.block = {unsigned(b), 0, 0};
    ctx.block_dim = {unsigned(threads), 1, 1};
    ctx.grid_dim = {unsigned(grid), 1, 1};
    const Ctx launch_ctx = ctx;
    run_block(threads, [&](int t) {
      ctx = launch_ctx;
      ctx.thread = {unsigned(t), 0, 0};
      kernel(args...);
    });
    block = nullptr;
  }
}

}  // namespace emu

#define threadIdx (emu::ctx.thread)
#define blockIdx (emu::ctx.block)
#define blockDim (emu::ctx.block_dim)
#define gridDim (emu::ctx.grid_dim)

inline void __syncthreads() { emu::arrive(emu::block->sync); }

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
  return emu::from_bits<T>(emu::exchange(emu::to_bits(v), int(emu::ctx.thread.x % 32) ^ mask));
}
template <class T>
inline T __shfl_down_sync(unsigned, T v, unsigned d) {
  const int lane = int(emu::ctx.thread.x % 32);
  return emu::from_bits<T>(emu::exchange(emu::to_bits(v), lane + int(d) < 32 ? lane + int(d) : lane));
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  return emu::from_bits<T>(emu::exchange(emu::to_bits(v), src & 31));
}

inline uint32_t atomicMax(uint32_t* p, uint32_t v) {
  std::atomic_ref<uint32_t> a(*p);
  uint32_t old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}

inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = emu::sms; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = emu::threads_per_sm; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = emu::smem_optin; break;
    case cudaDevAttrMemoryPoolsSupported: *v = emu::mem_pools; break;
  }
  return cudaSuccess;
}
template <class F>
cudaError_t cudaFuncSetAttribute(F* fn, cudaFuncAttribute, int value) {
  if (value > emu::smem_optin) return cudaErrorInvalidValue;
  emu::max_dynamic_smem[reinterpret_cast<const void*>(fn)] = value;
  return cudaSuccess;
}
template <class F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, F*, int, size_t) {
  *n = emu::occupancy;
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::malloc(n ? n : 1);
  std::memset(*p, 0xFF, n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) { return cudaMalloc(p, n); }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::last_error;
  emu::last_error = cudaSuccess;
  return e;
}
inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }
