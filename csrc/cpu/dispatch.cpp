// Run-time choice of the CPU kernels: the widest instruction set this CPU has, unless
// FP4QUANT_CPU_ISA (scalar, avx2, avx512) asks for another one it also has.
#include <cstdlib>
#include <cstring>

#include "codec_cpu.h"

namespace fp4q {
namespace cpu {
namespace {

bool cpu_has_avx512() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

bool cpu_has_avx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

Kernels choose() {
  const char* want = std::getenv("FP4QUANT_CPU_ISA");
  const bool any = want == nullptr || want[0] == '\0';
  if ((any || std::strcmp(want, "avx512") == 0) && cpu_has_avx512()) return kernels_avx512();
  if ((any || std::strcmp(want, "avx512") == 0 || std::strcmp(want, "avx2") == 0) && cpu_has_avx2())
    return kernels_avx2();
  return kernels_scalar();
}

}  // namespace

const Kernels& best_kernels() {
  static const Kernels chosen = choose();  // thread-safe initialization
  return chosen;
}

}  // namespace cpu
}  // namespace fp4q
