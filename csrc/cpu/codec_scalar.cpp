// The CPU codec compiled for the baseline instruction set: runs on any CPU.
#include <cstdint>
#include <cstring>

#include "codec_generic.h"

namespace fp4q {
namespace cpu {

Kernels kernels_scalar() { return Kernels{"scalar", quantize_impl, dequantize_impl, dequantize_reduce_impl}; }

}  // namespace cpu
}  // namespace fp4q
