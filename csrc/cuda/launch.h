// Host entry points of the CUDA kernels (codec.cu).  Plain CUDA: no torch headers, so
// nvcc alone compiles the kernels; the binding (binding.cpp) calls these on torch's
// current stream.  Each returns 0 or a cudaError_t code (error_string explains it).
#pragma once

#include <cuda_runtime.h>

#include "../kernels.h"

namespace fp4q {
namespace cuda {

int quantize(const QuantizeArgs& args, cudaStream_t stream);
int dequantize(const DequantizeArgs& args, cudaStream_t stream);
int dequantize_reduce(const ReduceArgs& args, cudaStream_t stream);
const char* error_string(int err);

}  // namespace cuda
}  // namespace fp4q
