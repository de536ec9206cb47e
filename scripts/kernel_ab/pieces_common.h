// What pieces.cpp (AVX2) and pieces_avx512.cpp share: the run's arguments, its input (SPANS
// groups of normal values) and FWHT signs, fp4quant's config, the timing of a call in ns a
// value (the fastest of 7 timings of `calls` calls after a tenth as many to warm up) and the
// CSV rows.  Included after cpu/codec_generic.h, under the including file's target.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

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

struct Pieces {
  static constexpr int64_t G = 2048, M = G / 16;  // a group of fp4quant's config, its micro-groups
  int64_t spans;
  int calls;
  std::vector<float> x, signs;
  fp4q::Config cfg{};
  float inv;
  int64_t s = 0;

  Pieces(int argc, char** argv)
      : spans(argc > 1 ? std::max(1LL, atoll(argv[1])) : 1), calls(argc > 2 ? std::max(1, atoi(argv[2])) : 2000),
        x(G * spans), signs(G) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (float& v : x) v = normal(rng);
    for (float& v : signs) v = (rng() & 1) ? 1.0f : -1.0f;
    cfg.element = fp4q::kE2M1;
    cfg.micro_scale = fp4q::kScaleE4M3;
    cfg.micro_group = 16;
    cfg.group = G;
    cfg.fwht = 1;
    cfg.coarse = fp4q::kCoarseGroup;
    cfg.rounding = fp4q::kRoundNearest;
    cfg.scale_round = fp4q::kScaleNearest;
    inv = fp4q::cpu::inv_sqrt_group(G);
    printf("piece,ns_per_value,spans,calls\n");
  }

  // the next of the input's groups (the same one when spans == 1: in L1)
  const float* next() {
    const float* p = x.data() + G * s;
    s = (s + 1) % spans;
    return p;
  }

  template <class F>
  void row(const char* piece, F f) {
    printf("%s,%.4f,%lld,%d\n", piece, ns_per_value(f, G, calls), (long long)spans, calls);
  }
};
