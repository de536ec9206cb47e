// The CPU codec compiled for the avx2 instruction set (x86-64 only; chosen at run
// time by dispatch.cpp when the CPU supports it).
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,popcnt")
#define FP4Q_AVX2 1  // the hand-written AVX2 pieces of simd_avx2.h
#include "codec_generic.h"

namespace fp4q {
namespace cpu {

Kernels kernels_avx2() { return Kernels{"avx2", quantize_impl, dequantize_impl, dequantize_reduce_impl}; }

}  // namespace cpu
}  // namespace fp4q
#else
#include "codec_cpu.h"

namespace fp4q {
namespace cpu {

Kernels kernels_avx2() { return Kernels{nullptr, nullptr, nullptr, nullptr}; }

}  // namespace cpu
}  // namespace fp4q
#endif
