// The CPU codec compiled for the avx512 instruction set (x86-64 only; chosen at run
// time by dispatch.cpp when the CPU supports it).
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2,popcnt")
#define FP4Q_AVX512 1  // the hand-written AVX-512 pieces of simd_avx512.h
// GCC 12 warns about _mm512_undefined_* inside its own intrinsic headers (a known false positive)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "codec_generic.h"

namespace fp4q {
namespace cpu {

Kernels kernels_avx512() { return Kernels{"avx512", quantize_impl, dequantize_impl, dequantize_reduce_impl}; }

}  // namespace cpu
}  // namespace fp4q
#else
#include "codec_cpu.h"

namespace fp4q {
namespace cpu {

Kernels kernels_avx512() { return Kernels{nullptr, nullptr, nullptr, nullptr}; }

}  // namespace cpu
}  // namespace fp4q
#endif
