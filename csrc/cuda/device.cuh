// Device properties and persistent-grid sizing of the CUDA kernels, cached per device:
// host code shared by codec.cu and fast.cu (inline: one cache for the whole program).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace fp4q {
namespace cuda {
namespace detail {

struct DeviceInfo {
  int sms;             // multiprocessors
  int smem_optin;      // largest dynamic shared memory a block may opt in to (bytes)
  bool mem_pools;      // cudaMallocAsync works
};

// The current device's properties, read once per device.
inline int device_info(DeviceInfo* info) {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static DeviceInfo cache[kMaxDevices];
  static bool known[kMaxDevices] = {};
  int dev = 0;
  if (cudaError_t err = cudaGetDevice(&dev)) return int(err);
  std::lock_guard<std::mutex> lock(mu);
  if (dev >= 0 && dev < kMaxDevices && known[dev]) {
    *info = cache[dev];
    return 0;
  }
  DeviceInfo d{};
  int pools = 0;
  cudaError_t err = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
  if (!err) err = cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (!err) err = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev);
  if (err) return int(err);
  d.mem_pools = pools != 0;
  if (dev >= 0 && dev < kMaxDevices) {
    cache[dev] = d;
    known[dev] = true;
  }
  *info = d;
  return 0;
}

// Persistent grid of `kernel` (a device function address): as many blocks as are
// resident on the device at once (occupancy cached per device, kernel, block and shared
// memory size), at most `tiles`.
inline int persistent_grid(const void* kernel, int threads, size_t smem, int64_t tiles, int* grid) {
  struct Entry {
    int dev;
    const void* kernel;
    int threads;
    size_t smem;
    int blocks;
  };
  static std::mutex mu;
  static std::vector<Entry> cache;  // a few dozen (kernel, shape) pairs per device
  DeviceInfo d;
  if (int err = device_info(&d)) return err;
  int dev = 0;
  if (cudaError_t err = cudaGetDevice(&dev)) return int(err);
  int blocks = -1;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Entry& e : cache)
      if (e.dev == dev && e.kernel == kernel && e.threads == threads && e.smem == smem) blocks = e.blocks;
  }
  if (blocks < 0) {
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem);
    if (err) return int(err);
    std::lock_guard<std::mutex> lock(mu);
    cache.push_back(Entry{dev, kernel, threads, smem, blocks});
  }
  const int64_t resident = int64_t(d.sms) * (blocks > 0 ? blocks : 1);  // 0: let the launch report why
  *grid = int(tiles < resident ? tiles : resident);
  return 0;
}

}  // namespace detail
}  // namespace cuda
}  // namespace fp4q
