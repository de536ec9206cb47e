// The timing shared by pieces.cpp (AVX2) and pieces_avx512.cpp: a call's cost in ns a value,
// the fastest of 7 timings of `calls` calls after a tenth as many to warm up.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

template <class F>
static double ns_per_value(F f, int64_t values_per_call, int calls) {
  for (int i = 0; i < calls / 10 + 1; ++i) f();
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  return best * 1e9 / (double(values_per_call) * calls);
}
