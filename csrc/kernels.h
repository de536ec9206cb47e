// Arguments of the fp4quant kernels: plain structs, the same for the CPU and CUDA code.
// The host binding (binding.cpp) checks tensors, fills these and dispatches.
#pragma once

#include "fp4quant.h"

namespace fp4q {

// quantize: each of `rows` rows of n values becomes one message of lay.nbytes bytes.
struct QuantizeArgs {
  Config cfg;
  Layout lay;
  int64_t rows;
  const void* x;         // rows x n values of x_dtype, row stride x_row_stride elements
  int32_t x_dtype;
  int64_t x_row_stride;
  uint8_t* out;          // rows x lay.nbytes
  const float* signs;    // cfg.group FWHT signs, or nullptr
  uint32_t key;          // stochastic rounding: stream_key(seed)
  uint64_t offset;       // counter of row 0's first value; row r starts at offset + r * padded
  bool transform;        // apply the FWHT (when cfg.fwht)
  float* workspace;      // coarse == tensor with the FWHT: lay.padded floats per row, else nullptr
  uint32_t* reduce_scratch;  // coarse == tensor: 2 zeroed words per row for device-wide maxima (CUDA), else nullptr
};

// dequantize: rows messages -> rows x n values of out_dtype (inverse FWHT applied).
struct DequantizeArgs {
  Config cfg;
  Layout lay;
  int64_t rows;
  const uint8_t* msgs;   // rows x lay.nbytes
  void* out;             // rows x n
  int32_t out_dtype;
  const float* signs;
  bool saturate;         // values past out_dtype's range saturate (else +-inf: messages that hold sums)
};

// dequantize_reduce: sum `world` messages in the transformed domain (row order), each block
// against 2**-E (E: the largest of the messages' block exponents), then either re-quantize
// the sum into one message or inverse-transform it into n values (past out_dtype's range:
// +-inf, unless world == 1, which saturates like dequantize).
struct ReduceArgs {
  Config cfg;
  Layout lay;
  int64_t world;
  const uint8_t* msgs;   // world x lay.nbytes
  bool requantize;
  uint8_t* out_msg;      // lay.nbytes (requantize)
  void* out;             // n values of out_dtype (otherwise)
  int32_t out_dtype;
  const float* signs;
  uint32_t key;
  uint64_t offset;
  float* workspace;      // coarse == tensor && requantize: lay.padded floats (CUDA; the CPU sums twice), else nullptr
  uint32_t* reduce_scratch;  // coarse == tensor && requantize: 2 zeroed words (CUDA), else nullptr
};

}  // namespace fp4q
