// What both instruction sets' direct quantize (simd_avx2_direct.h, simd_avx512_direct.h)
// share: the input's element type and how far ahead of the span being encoded the input
// is fetched.
#pragma once

#include <cstdint>
#include <type_traits>

#include "codec_cpu.h"

namespace fp4q {
namespace cpu {
namespace {

// The input's values as stored: float32, or the 16 bits of a bfloat16 or float16.
template <int32_t dtype>
using Value = typename std::conditional<dtype == kF32, float, uint16_t>::type;

// Spans are fetched this many ahead of the one being encoded (one line per micro-group
// encoded): at 64 MiB the input comes from memory, and its latency is then hidden behind
// the encoding.
constexpr int64_t kAheadSpans = 2;

// Values of the span kAheadSpans after the one at first .. first+len-1 that the row has.
inline int64_t ahead_values(int64_t first, int64_t len, int64_t n) {
  const int64_t left = n - (first + kAheadSpans * len);
  return left < 0 ? 0 : (left < len ? left : len);
}

}  // namespace
}  // namespace cpu
}  // namespace fp4q
