// CPU kernels of fp4quant: entry points the binding calls.  Work is split into
// segments (config_block values each) and handed to the caller's parallel-for, so
// the kernels carry no threading runtime of their own and are safe to call from
// several threads at once (they keep no state).
#pragma once

#include "../kernels.h"

namespace fp4q {
namespace cpu {

// Run fn(ctx, begin, end) over [0, n) in chunks of at least `grain`, possibly in parallel.
typedef void (*RangeFn)(void* ctx, int64_t begin, int64_t end);
typedef void (*ParallelFor)(int64_t n, int64_t grain, RangeFn fn, void* ctx);

struct Kernels {
  const char* isa;
  void (*quantize)(const QuantizeArgs&, ParallelFor);
  void (*dequantize)(const DequantizeArgs&, ParallelFor);
  void (*dequantize_reduce)(const ReduceArgs&, ParallelFor);
};

// The implementations compiled for each instruction set (codec_{scalar,avx2,avx512}.cpp).
Kernels kernels_scalar();
Kernels kernels_avx2();
Kernels kernels_avx512();

// The best set this CPU supports, or the one FP4QUANT_CPU_ISA names (scalar, avx2, avx512).
const Kernels& best_kernels();

}  // namespace cpu
}  // namespace fp4q
