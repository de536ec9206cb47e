// Side by side, in one process: the CPU quantize, dequantize or dequantize_reduce (AVX-512 or AVX2) of two builds
// of csrc/ (A and B), called alternately on the same input, serially, so that whatever else the
// machine does slows both alike (on a shared VM, timing two builds in separate processes moved
// the same code by +-20% between runs).  Built and run by kernel_ab.sh; exits 1 unless A and B
// write the same message (quantize; dequantize_reduce: of two copies of A's message, re-quantized)
// or the same float32 values (dequantize, of A's message).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cpu/codec_cpu.h"

namespace fp4q {
namespace cpu {
Kernels kernels_a();  // kernel_ab_a.cpp, kernel_ab_b.cpp: codec_<isa>.cpp of each build
Kernels kernels_b();
}  // namespace cpu
}  // namespace fp4q

using namespace fp4q;

static void serial(int64_t n, int64_t, cpu::RangeFn fn, void* ctx) { fn(ctx, 0, n); }

// THREADS=k (kernel_ab.sh): the spans split into k contiguous ranges, each on its own thread, as
// the extension's parallel_for splits them (threads made per call: a few tens of microseconds,
// alike for A and B)
static int threads = 1;
static void split(int64_t n, int64_t grain, cpu::RangeFn fn, void* ctx) {
  if (threads <= 1) return serial(n, grain, fn, ctx);
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back([=] { fn(ctx, n * t / threads, n * (t + 1) / threads); });
  fn(ctx, 0, n / threads);
  for (std::thread& th : pool) th.join();
}

int main(int argc, char** argv) {
  const char* preset = argc > 1 ? argv[1] : "fp4quant";
  const int64_t mib = argc > 2 ? atoll(argv[2]) : 1;
  const int calls = argc > 3 ? atoi(argv[3]) : 400;
  const char* op = argc > 4 ? argv[4] : "quantize";
  const char* rounding = argc > 5 ? argv[5] : "nearest";
  const bool stochastic = !strcmp(rounding, "stochastic");
  if (!stochastic && strcmp(rounding, "nearest")) {
    fprintf(stderr, "kernel_ab: rounding must be nearest or stochastic, got %s\n", rounding);
    return 2;
  }
  const bool dequantize = !strcmp(op, "dequantize"), reduce = !strcmp(op, "dequantize_reduce");
  if (!dequantize && !reduce && strcmp(op, "quantize")) {
    fprintf(stderr, "kernel_ab: op must be quantize, dequantize or dequantize_reduce, got %s\n", op);
    return 2;
  }
  if (const char* t = getenv("THREADS")) threads = atoi(t);
  if (threads < 1) {
    fprintf(stderr, "kernel_ab: THREADS must be a positive count, got %s\n", getenv("THREADS"));
    return 2;
  }
  const int64_t n = mib << 18;  // float32 values
  // the three presets' configs, as fp4quant.format.config.PRESETS defines them
  Config c{kE2M1, 16, 2048, kScaleE4M3, kCoarseGroup, kScaleNearest, 1, kRoundNearest, kPackWarp};
  if (!strcmp(preset, "no_fwht")) {
    c.fwht = 0;
  } else if (!strcmp(preset, "nvfp4")) {
    c.fwht = 0;
    c.group = 16;
    c.coarse = kCoarseTensor;
  } else if (strcmp(preset, "fp4quant")) {
    fprintf(stderr, "kernel_ab: preset must be fp4quant, no_fwht or nvfp4, got %s\n", preset);
    return 2;
  }
  if (stochastic) {  // as the trainer's backward config: stochastic codes under rounded-up micro-scales
    c.rounding = kRoundStochastic;
    c.scale_round = kScaleUp;
  }
  const Layout lay = make_layout(c, n);
  std::vector<float> x(n), signs(c.group);
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(gen);
  for (float& s : signs) s = (gen() & 1) ? 1.0f : -1.0f;
  std::vector<uint8_t> out_a(lay.nbytes), out_b(lay.nbytes);
  auto args = [&](uint8_t* out) {
    QuantizeArgs a{};
    a.cfg = c;
    a.lay = lay;
    a.rows = 1;
    a.x = x.data();
    a.x_dtype = kF32;
    a.x_row_stride = n;
    a.out = out;
    a.signs = c.fwht ? signs.data() : nullptr;
    a.transform = true;
    a.key = 0x9E3779B9u;
    a.offset = (uint64_t(1) << 32) - 1000;  // the counter's low word wraps inside the input
    return a;
  };
  const cpu::Kernels ka = cpu::kernels_a(), kb = cpu::kernels_b();
  if (!ka.quantize || !kb.quantize) {
    fprintf(stderr, "kernel_ab: this compiler built no kernels for the instruction set\n");
    return 2;
  }
  const QuantizeArgs qa = args(out_a.data()), qb = args(out_b.data());
  ka.quantize(qa, serial);
  kb.quantize(qb, serial);
  if (out_a != out_b) {
    fprintf(stderr, "kernel_ab: A and B wrote different messages (%s, %lld MiB)\n", preset, (long long)mib);
    return 1;
  }
  // dequantize: A's message into float32 values (prefaulted buffers; 64 MiB streams past the caches)
  std::vector<float> values_a(dequantize ? n : 0, 1.0f), values_b(dequantize ? n : 0, 1.0f);
  auto dargs = [&](float* values) {
    DequantizeArgs d{};
    d.cfg = c;
    d.lay = lay;
    d.rows = 1;
    d.msgs = out_a.data();
    d.out = values;
    d.out_dtype = kF32;
    d.signs = c.fwht ? signs.data() : nullptr;
    d.saturate = true;
    return d;
  };
  const DequantizeArgs da = dargs(values_a.data()), db = dargs(values_b.data());
  if (dequantize) {
    ka.dequantize(da, serial);
    kb.dequantize(db, serial);
    if (std::memcmp(values_a.data(), values_b.data(), 4 * size_t(n))) {
      fprintf(stderr, "kernel_ab: A and B wrote different values (%s, %lld MiB)\n", preset, (long long)mib);
      return 1;
    }
  }
  // dequantize_reduce: two copies of A's message summed and re-quantized (as the benchmark's)
  constexpr int64_t kWorld = 2;
  std::vector<uint8_t> msgs(reduce ? kWorld * lay.nbytes : 0), sum_a(reduce ? lay.nbytes : 0),
      sum_b(reduce ? lay.nbytes : 0);
  for (int64_t w = 0; reduce && w < kWorld; ++w) std::memcpy(msgs.data() + w * lay.nbytes, out_a.data(), lay.nbytes);
  auto rargs = [&](uint8_t* out) {
    ReduceArgs r{};
    r.cfg = c;
    r.lay = lay;
    r.world = kWorld;
    r.msgs = msgs.data();
    r.requantize = true;
    r.out_msg = out;
    r.out_dtype = kF32;
    r.signs = c.fwht ? signs.data() : nullptr;
    r.key = 0x9E3779B9u;
    r.offset = (uint64_t(1) << 32) - 1000;
    return r;
  };
  const ReduceArgs ra = rargs(sum_a.data()), rb = rargs(sum_b.data());
  if (reduce) {
    ka.dequantize_reduce(ra, serial);
    kb.dequantize_reduce(rb, serial);
    if (sum_a != sum_b) {
      fprintf(stderr, "kernel_ab: A and B wrote different sums (%s, %lld MiB)\n", preset, (long long)mib);
      return 1;
    }
  }
  auto call = [&](bool b) {
    if (reduce) (b ? kb : ka).dequantize_reduce(b ? rb : ra, split);
    else if (dequantize) (b ? kb : ka).dequantize(b ? db : da, split);
    else (b ? kb : ka).quantize(b ? qb : qa, split);
  };
  std::vector<double> ta, tb;
  for (int i = 0; i < calls; ++i) {
    for (int k = 0; k < 2; ++k) {
      const bool b = (k ^ (i & 1)) != 0;  // which goes first alternates too
      const auto t0 = std::chrono::steady_clock::now();
      call(b);
      (b ? tb : ta).push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  // of float32 values taken in (quantize), given out (dequantize) or summed (dequantize_reduce: both messages')
  const double bytes = 4.0 * n * (reduce ? kWorld : 1);
  const double a_med = ta[ta.size() / 2], b_med = tb[tb.size() / 2];
  printf("%s,%s,%s,%lld,%d,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f\n", op, preset, rounding, (long long)mib, calls, bytes / a_med / 1e9,
         bytes / ta[0] / 1e9, bytes / b_med / 1e9, bytes / tb[0] / 1e9, a_med / b_med, ta[0] / tb[0]);
  return 0;
}
