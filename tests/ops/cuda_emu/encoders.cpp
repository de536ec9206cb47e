// Exhaustive check of the cheap exact encoders of csrc/fp4quant.h (the ones the specialized
// CUDA quantize kernel uses) against the reference's rounding, on the CPU: the same
// FP4Q_HD source, compiled as C++ (tests/ops/test_encoders.py builds and runs it).
//
//   encoders [all|sample] [threads]
//
// all: every finite float bit pattern >= +0 (2**31 - 2**23 of them; NaNs and +inf are outside
// the contract: the kernels use no value of a non-finite micro-group); sample: every pattern of the binades that hold a decision (tie points
// and clamps: [2**-8, 2**10)) plus every 97th pattern elsewhere.  Checks:
//  - e2m1_code_rne(a) == e2m1_nearest_mag(a) == e2m1_code(grid_round(a, e2m1, nearest))
//    (docs/format.md step 6: the reference's grid rounding and code);
//  - e4m3_scale_nearest(t) == encode_scale(t, e4m3, nearest) and its value == decode_scale;
//  - div_const_rn(a, d, fp32(1/d)) == a / d (IEEE) for d = 6 and 2688 wherever the quotient is
//    zero or normal, and below 2**-126 like it elsewhere.
// Exit status 0 when everything matched; prints the count checked and the first mismatches.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "fp4quant.h"

using namespace fp4q;

namespace {

std::atomic<long long> mismatches{0}, checked{0};

void report(const char* what, uint32_t u, uint32_t got, uint32_t want) {
  if (mismatches.fetch_add(1) < 20)
    std::printf("MISMATCH %s at %08x (%.9g): got %u want %u\n", what, u, double(u2f(u)), got, want);
}

void check_one(uint32_t u) {
  const float a = u2f(u);
  const uint32_t want = e2m1_code(grid_round(a, grid_e2m1(), kGridNearest, 0.0f), false);
  const uint32_t tie_points = e2m1_nearest_mag(a);
  const uint32_t fast = e2m1_code_rne(a);
  if (tie_points != want) report("e2m1_nearest_mag", u, tie_points, want);
  if (fast != want) report("e2m1_code_rne", u, fast, want);
  const E4m3Scale s = e4m3_scale_nearest(a);
  const uint32_t byte = encode_scale(a, kScaleE4M3, kScaleNearest);
  if (s.byte != byte) report("e4m3_scale_nearest byte", u, s.byte, byte);
  const float value = decode_scale(byte, kScaleE4M3);
  if (f2u(s.value) != f2u(value)) report("e4m3_scale_nearest value", u, f2u(s.value), f2u(value));
  for (const float d : {6.0f, 2688.0f}) {
    const float q = div_const_rn(a, d, 1.0f / d), exact = a / d;
    const bool normal = exact == 0.0f || exact >= 1.1754943508222875e-38f;  // 2**-126
    if (normal ? f2u(q) != f2u(exact) : !(q >= 0.0f && q < 1.1754943508222875e-38f))
      report(d == 6.0f ? "div_const_rn(., 6)" : "div_const_rn(., 2688)", u, f2u(q), f2u(exact));
  }
}

// Patterns [lo, hi) with stride, split over `threads` threads.
void run(uint64_t lo, uint64_t hi, uint64_t stride, int threads) {
  std::vector<std::thread> pool;
  for (int k = 0; k < threads; ++k)
    pool.emplace_back([=] {
      long long n = 0;
      for (uint64_t u = lo + uint64_t(k) * stride; u < hi; u += uint64_t(threads) * stride, ++n) check_one(uint32_t(u));
      checked += n;
    });
  for (auto& t : pool) t.join();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "sample";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const uint64_t inf = 0x7F800000u;
  if (mode == "all") {
    run(0, inf, 1, threads);  // +inf: outside div_const_rn's contract (inf - inf in the remainder)
  } else {
    const uint64_t dense_lo = f2u(0.00390625f), dense_hi = f2u(1024.0f);  // 2**-8 .. 2**10
    run(dense_lo, dense_hi, 1, threads);
    run(0, dense_lo, 97, threads);
    run(dense_hi, inf, 97, threads);
    for (uint32_t u : {0u, 1u, 0x007FFFFFu, 0x00800000u, uint32_t(inf) - 1u}) {
      check_one(u);
      ++checked;
    }
  }
  std::printf("%s: %lld floats checked, %lld mismatches\n", mode.c_str(), checked.load(), mismatches.load());
  return mismatches.load() ? 1 : 0;
}
