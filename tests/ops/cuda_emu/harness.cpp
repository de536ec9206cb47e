// Runs the CUDA kernels of csrc/cuda on the CPU emulator (include/cuda_runtime.h) and
// compares every byte and value with the CPU codec (csrc/cpu), itself tested bit for bit
// against the pure-PyTorch reference.  Test-only: tests/ops/test_cuda.py builds and runs it.
//
//   harness [smoke|quick|full] [seed]     exit status 0 when everything matched
//
// smoke: the presets at small sizes, stochastic rounding, a few variants and random
// configs (about a minute); quick: more sizes and variants; full: every dtype and size.
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cpu/codec_cpu.h"
#include "cuda/launch.h"

using namespace fp4q;

namespace {

void serial_for(int64_t n, int64_t grain, cpu::RangeFn fn, void* ctx) {
  for (int64_t b = 0; b < n; b += grain) fn(ctx, b, b + grain < n ? b + grain : n);
}

int failures = 0, checks = 0;

std::string describe(const Config& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "el=%d M=%d G=%d micro=%d coarse=%d sr=%d fwht=%d rnd=%d pack=%d", c.element,
                c.micro_group, c.group, c.micro_scale, c.coarse, c.scale_round, c.fwht, c.rounding, c.packing);
  return buf;
}

void fail(const std::string& what, const Config& c, int64_t n, int64_t rows, int dtype, const std::string& detail) {
  ++failures;
  if (failures <= 30)
    std::printf("MISMATCH %s: %s n=%lld rows=%lld dtype=%d: %s\n", what.c_str(), describe(c).c_str(), (long long)n,
                (long long)rows, dtype, detail.c_str());
}

bool same_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, std::string* detail) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "byte %zu of %zu: cpu %02x cuda %02x", i, a.size(), a[i], b[i]);
      *detail = buf;
      return false;
    }
  return a.size() == b.size();
}

// Values of `dtype` equal bit for bit, any NaN equal to any NaN.
bool same_values(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int dtype, std::string* detail) {
  const size_t w = dtype == kF32 ? 4 : 2;
  for (size_t i = 0; i + w <= a.size(); i += w) {
    uint32_t x = 0, y = 0;
    std::memcpy(&x, &a[i], w);
    std::memcpy(&y, &b[i], w);
    auto nan = [&](uint32_t u) {
      if (dtype == kF32) return (u & 0x7FFFFFFFu) > 0x7F800000u;
      if (dtype == kBF16) return (u & 0x7FFFu) > 0x7F80u;
      return (u & 0x7FFFu) > 0x7C00u;
    };
    if (x != y && !(nan(x) && nan(y))) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "value %zu: cpu %08x cuda %08x", i / w, x, y);
      *detail = buf;
      return false;
    }
  }
  return a.size() == b.size();
}

uint16_t to_dtype_bits(float f, int dtype) { return dtype == kBF16 ? float_to_bf16_rne(f) : float_to_half_rne(f); }

// rows x n values across many decades, with NaN, infinities, zero runs, ties, subnormals.
std::vector<uint8_t> make_input(int64_t rows, int64_t n, int dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> pick(0, 199);
  std::vector<float> x(size_t(rows * n));
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::pow(10.0f, float(int(rng() % 13) - 6));  // 1e-6 .. 1e6
    for (int64_t i = 0; i < n; ++i) {
      float v = normal(rng) * scale;
      const int k = pick(rng);
      if (k == 0) v = std::nanf("");
      if (k == 1) v = INFINITY;
      if (k == 2) v = -INFINITY;
      if (k == 3) v = 3.0e38f;
      if (k == 4) v = 1e-40f;
      if (k >= 5 && k < 12) v = 0.0f;
      if (k == 12) v = -0.0f;
      if (k >= 13 && k < 20) v = 0.25f * float(int(rng() % 25) - 12);  // e2m1 ties at scale 1
      if (k == 20 || k == 21) v = k == 20 ? 6.0e4f : -6.5e4f;  // float16 sums that overflow
      x[size_t(r * n + i)] = v;
    }
    if (n > 100 && r == 1) {  // a row with no non-finite values but a huge one
      for (int64_t i = 0; i < n; ++i)
        if (!is_finite(x[size_t(r * n + i)])) x[size_t(r * n + i)] = 1.0f;
      x[size_t(r * n + n / 3)] = 3.3e38f;
    }
    if (n > 100 && r == 2) {  // a tiny row: scales far below e4m3's range
      for (int64_t i = 0; i < n; ++i) x[size_t(r * n + i)] = normal(rng) * 1e-30f;
    }
  }
  std::vector<uint8_t> out(size_t(rows * n) * (dtype == kF32 ? 4 : 2));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == kF32) {
      std::memcpy(&out[4 * i], &x[i], 4);
    } else {
      const uint16_t h = to_dtype_bits(x[i], dtype);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

struct Run {
  Config cfg;
  int64_t n, rows;
  int dtype;
  bool with_signs;
  uint64_t seed, offset;
  bool transform = true;
  // the CUDA quantize reads rows of stride n + x_pad starting x_shift values into a buffer and
  // writes messages starting out_shift bytes into one (the CPU codec: contiguous, aligned)
  int x_shift = 0, x_pad = 0, out_shift = 0;
};

void check(const Run& run, std::mt19937_64& rng) {
  const Config& cfg = run.cfg;
  const Layout lay = make_layout(cfg, run.n);
  const int64_t rows = run.rows;
  std::vector<uint8_t> x = make_input(rows, run.n, run.dtype, rng);
  std::vector<float> signs(size_t(cfg.group));
  for (auto& s : signs) s = (rng() & 1) ? -1.0f : 1.0f;
  const float* sp = cfg.fwht && run.with_signs ? signs.data() : nullptr;

  QuantizeArgs qa{};
  qa.cfg = cfg;
  qa.lay = lay;
  qa.rows = rows;
  qa.x = x.data();
  qa.x_dtype = run.dtype;
  qa.x_row_stride = run.n;
  qa.signs = sp;
  qa.key = stream_key(run.seed);
  qa.offset = run.offset;
  qa.transform = run.transform;
  const bool tensor = cfg.coarse == kCoarseTensor;
  std::vector<float> ws_cpu(size_t(rows * lay.padded)), ws_gpu(size_t(rows * lay.padded), -7.0f);
  std::vector<uint32_t> words(size_t(2 * rows), 0u);
  std::vector<uint8_t> q_cpu(size_t(rows * lay.nbytes), 0x00), q_gpu(size_t(rows * lay.nbytes), 0xA5);
  // the input as the CUDA kernels see it: shifted, with padded rows
  const size_t vb = run.dtype == kF32 ? 4 : 2;
  const int64_t gstride = run.n + run.x_pad;
  std::vector<uint8_t> xg(size_t(rows * gstride + run.x_shift) * vb + 16, 0x7F);
  uint8_t* xg_base = xg.data() + (16 - reinterpret_cast<uintptr_t>(xg.data()) % 16) % 16 + size_t(run.x_shift) * vb;
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(xg_base + size_t(r * gstride) * vb, x.data() + size_t(r * run.n) * vb, size_t(run.n) * vb);
  std::vector<uint8_t> q_out(size_t(rows * lay.nbytes) + 32);
  uint8_t* q_out_base = q_out.data() + (16 - reinterpret_cast<uintptr_t>(q_out.data()) % 16) % 16 + run.out_shift;

  qa.out = q_cpu.data();
  qa.workspace = tensor && cfg.fwht ? ws_cpu.data() : nullptr;
  cpu::kernels_scalar().quantize(qa, serial_for);

  for (int pack = 0; pack < 2; ++pack) {
    QuantizeArgs g = qa;
    g.cfg.packing = pack;
    std::fill(q_out.begin(), q_out.end(), uint8_t(0xA5 + pack));
    std::fill(words.begin(), words.end(), 0u);
    g.out = q_out_base;
    g.x = xg_base;
    g.x_row_stride = gstride;
    g.workspace = tensor && cfg.fwht ? ws_gpu.data() : nullptr;
    g.reduce_scratch = tensor ? words.data() : nullptr;
    ++checks;
    if (int err = cuda::quantize(g, nullptr)) {
      fail("quantize error", cfg, run.n, rows, run.dtype, cuda::error_string(err));
      return;
    }
    std::copy(q_out_base, q_out_base + q_gpu.size(), q_gpu.begin());
    std::string d;
    if (!same_bytes(q_cpu, q_gpu, &d)) fail(pack ? "quantize(naive)" : "quantize(warp)", cfg, run.n, rows, run.dtype, d);
    const bool before = std::all_of(q_out.data(), q_out_base, [&](uint8_t b) { return b == uint8_t(0xA5 + pack); });
    const bool after = std::all_of(q_out_base + q_gpu.size(), q_out.data() + q_out.size(),
                                   [&](uint8_t b) { return b == uint8_t(0xA5 + pack); });
    if (!before || !after) fail("quantize wrote outside its messages", cfg, run.n, rows, run.dtype, "");
  }
  if (!run.transform) return;

  // dequantize every row, to each dtype, saturating (one message) or not (messages of sums)
  for (int k = 0; k < 6; ++k) {
    const bool saturate = k < 3;
    const int od = k % 3;
    const size_t w = od == kF32 ? 4 : 2;
    std::vector<uint8_t> o_cpu(size_t(rows * run.n) * w, 0x00), o_gpu(size_t(rows * run.n) * w, 0x5A);
    DequantizeArgs da{};
    da.cfg = cfg;
    da.lay = lay;
    da.rows = rows;
    da.msgs = q_cpu.data();
    da.out_dtype = od;
    da.signs = sp;
    da.saturate = saturate;
    da.out = o_cpu.data();
    cpu::kernels_scalar().dequantize(da, serial_for);
    da.out = o_gpu.data();
    ++checks;
    if (int err = cuda::dequantize(da, nullptr)) {
      fail("dequantize error", cfg, run.n, rows, od, cuda::error_string(err));
      continue;
    }
    std::string d;
    if (!same_values(o_cpu, o_gpu, od, &d)) fail("dequantize", cfg, run.n, rows, od, d);
  }

  // the rows as the messages of `rows` ranks, summed
  for (int requant = 0; requant < 2; ++requant) {
    const int od = run.dtype;
    const size_t w = od == kF32 ? 4 : 2;
    ReduceArgs ra{};
    ra.cfg = cfg;
    ra.lay = lay;
    ra.world = rows;
    ra.msgs = q_cpu.data();
    ra.requantize = requant != 0;
    ra.out_dtype = od;
    ra.signs = sp;
    ra.key = stream_key(run.seed + 1);
    ra.offset = run.offset;
    const bool ws = requant && tensor;
    std::vector<float> rws_cpu(size_t(lay.padded)), rws_gpu(size_t(lay.padded), -7.0f);
    std::vector<uint32_t> rwords(2, 0u);
    std::vector<uint8_t> m_cpu(size_t(lay.nbytes), 0x00), m_gpu(size_t(lay.nbytes), 0xC3);
    std::vector<uint8_t> o_cpu(size_t(run.n) * w, 0x00), o_gpu(size_t(run.n) * w, 0x3C);
    ra.out_msg = requant ? m_cpu.data() : nullptr;
    ra.out = requant ? nullptr : o_cpu.data();
    ra.workspace = ws ? rws_cpu.data() : nullptr;
    cpu::kernels_scalar().dequantize_reduce(ra, serial_for);
    for (int pack = 0; pack < 2; ++pack) {
      ReduceArgs g = ra;
      g.cfg.packing = pack;
      std::fill(rwords.begin(), rwords.end(), 0u);
      g.out_msg = requant ? m_gpu.data() : nullptr;
      g.out = requant ? nullptr : o_gpu.data();
      g.workspace = ws ? rws_gpu.data() : nullptr;
      g.reduce_scratch = ws ? rwords.data() : nullptr;
      ++checks;
      if (int err = cuda::dequantize_reduce(g, nullptr)) {
        fail("reduce error", cfg, run.n, rows, od, cuda::error_string(err));
        continue;
      }
      std::string d;
      if (requant ? !same_bytes(m_cpu, m_gpu, &d) : !same_values(o_cpu, o_gpu, od, &d))
        fail(requant ? "reduce(requantize)" : "reduce(values)", cfg, run.n, rows, od, d);
    }
  }
}

Config preset(const std::string& name) {
  Config c{kE2M1, 16, 2048, kScaleE4M3, kCoarseGroup, kScaleNearest, 1, kRoundNearest, kPackWarp};
  if (name == "no_fwht") c.fwht = 0;
  if (name == "single_scale") c.coarse = kCoarseNone;
  if (name == "naive_pack") c.packing = kPackNaive;
  if (name == "nvfp4") c.group = 16, c.coarse = kCoarseTensor, c.fwht = 0;
  if (name == "mxfp4") c.micro_group = 32, c.group = 32, c.micro_scale = kScaleE8M0, c.coarse = kCoarseNone,
                       c.scale_round = kScaleFloor, c.fwht = 0;
  if (name == "int4") c.element = kInt4, c.micro_group = 32, c.group = 32, c.micro_scale = kScaleFP16,
                      c.coarse = kCoarseNone, c.fwht = 0;
  if (name == "fp8") c.element = kE4M3, c.micro_scale = kScaleNone, c.fwht = 0;
  return c;
}

Config random_config(std::mt19937_64& rng) {
  Config c{};
  for (;;) {
    c.element = int(rng() % 3);
    c.micro_group = 1 << (1 + rng() % 6);  // 2 .. 64
    c.group = c.micro_group << (rng() % 8);
    if (c.group > 8192) c.group = 8192;
    c.micro_scale = int(rng() % 4);
    c.coarse = int(rng() % 3);
    c.scale_round = int(rng() % 3);
    c.fwht = int(rng() % 2);
    c.rounding = int(rng() % 2);
    c.packing = int(rng() % 2);
    if (c.micro_scale != kScaleNone || c.coarse != kCoarseNone) return c;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "quick";
  const bool full = mode == "full", smoke = mode == "smoke";
  const uint64_t seed = argc > 2 ? std::stoull(argv[2]) : 1;
  std::mt19937_64 rng(seed);
  const int dtypes[3] = {kF32, kBF16, kF16};
  const char* presets[] = {"fp4quant", "no_fwht", "single_scale", "naive_pack", "nvfp4", "mxfp4", "int4", "fp8"};
  const int64_t sizes[] = {0, 1, 15, 17, 1000, 2048, 5001, 70001};

  // every preset, dtype, size; rows 1..3
  for (const char* name : presets)
    for (int dt : dtypes)
      for (int64_t n : sizes) {
        if (!full && n == 70001 && dt != kBF16) continue;
        if (smoke && (n == 70001 || n == 2048)) continue;
        const int64_t rows = 1 + int64_t((n + dt) % 3);
        check(Run{preset(name), n, rows, dt, true, 3, 0}, rng);
      }
  // stochastic rounding, the counter crossing 2**32, and a seed with the high bit
  for (const char* name : presets)
    for (int dt : dtypes) {
      Config c = preset(name);
      c.rounding = kRoundStochastic;
      check(Run{c, 3000, 2, dt, true, (1ull << 63) + 12345, (1ull << 32) - 1500}, rng);
    }
  // the overrides of tests/ops/test_native.py and the shapes the fast kernel special-cases
  std::vector<Config> extra;
  auto with = [](Config c, auto f) {
    f(c);
    return c;
  };
  const Config base = preset("fp4quant");
  extra.push_back(with(base, [](Config& c) { c.scale_round = kScaleUp; }));
  for (int g : {16, 32, 64, 128, 256, 512, 1024, 4096, 8192, 16384, 65536})
    extra.push_back(with(base, [g](Config& c) { c.group = g; }));
  for (int g : {16, 128, 4096, 8192, 32768})
    extra.push_back(with(base, [g](Config& c) { c.group = g, c.fwht = 0; }));
  extra.push_back(with(base, [](Config& c) { c.coarse = kCoarseTensor; }));
  extra.push_back(with(base, [](Config& c) { c.coarse = kCoarseTensor, c.group = 64; }));
  extra.push_back(with(base, [](Config& c) { c.micro_group = 32, c.group = 1024; }));
  extra.push_back(with(base, [](Config& c) { c.micro_group = 2, c.group = 64; }));
  extra.push_back(with(base, [](Config& c) { c.element = kInt4; }));
  extra.push_back(with(base, [](Config& c) { c.element = kE4M3; }));
  extra.push_back(with(base, [](Config& c) { c.micro_scale = kScaleE8M0, c.coarse = kCoarseNone, c.scale_round = kScaleUp; }));
  extra.push_back(with(base, [](Config& c) { c.micro_scale = kScaleFP16, c.coarse = kCoarseNone, c.scale_round = kScaleUp; }));
  extra.push_back(with(base, [](Config& c) { c.micro_scale = kScaleNone, c.coarse = kCoarseTensor; }));
  extra.push_back(with(base, [](Config& c) { c.micro_scale = kScaleNone, c.fwht = 0; }));
  extra.push_back(with(preset("nvfp4"), [](Config& c) { c.rounding = kRoundStochastic; }));
  extra.push_back(with(base, [](Config& c) { c.group = 65536, c.coarse = kCoarseTensor; }));
  extra.push_back(with(preset("fp8"), [](Config& c) { c.group = 65536; }));
  for (const Config& c : extra)
    for (int dt : dtypes) {
      if (!full && dt == kF16) continue;
      if (smoke && dt != kBF16) continue;
      for (int64_t n : {int64_t(17), int64_t(5001), int64_t(70001)}) {
        if (!full && n == 70001 && c.group < 16384) continue;
        if (smoke && n == 70001 && c.group < 65536) continue;
        check(Run{c, n, 1 + (n % 3), dt, (n & 1) != 0, 5, 99}, rng);
      }
    }
  // quantize without the transform (the binding's dequantize_reduce path does this itself)
  check(Run{base, 5001, 2, kF32, true, 1, 0, false}, rng);
  // the compile-time specialized quantize kernels (csrc/cuda/quantize.cu): each instance (the
  // four presets they cover x dtype x packing, and their safe instance) at sizes whose codes
  // start at every alignment (4, 8, 12, 0 mod 16: 1, 2, 3, 4 groups), with partial last
  // tiles, unaligned and strided rows of x, unaligned messages, several rows and tiles per
  // block (the emulated grid is 2 blocks)
  for (const char* name : {"fp4quant", "no_fwht", "single_scale", "naive_pack"})
    for (int dt : dtypes) {
      const Config c = preset(name);
      for (int64_t n : {int64_t(2048), int64_t(4096), int64_t(6000), int64_t(8192)}) {
        if (smoke && n == 6000) continue;
        check(Run{c, n, 3, dt, true, 7, 0}, rng);
      }
      if (smoke && dt != kBF16) continue;
      Run shifted{c, 4096, 2, dt, (dt & 1) == 0, 9, 0};
      shifted.x_shift = 1;  // rows off 16-byte boundaries: the safe instance throughout
      check(shifted, rng);
      Run padded{c, 4096, 3, dt, true, 9, 0};
      padded.x_pad = 8 * (dt == kF32 ? 1 : 2);  // 32-byte row padding keeps 16-byte alignment
      padded.out_shift = 8;                     // messages at 8 mod 16
      check(padded, rng);
      for (int shift : {1, 2, 4, 12}) {
        Run out{c, 2048 + 5, 2, dt, false, 9, 0};
        out.out_shift = shift;
        check(out, rng);
      }
      Run tf{c, 6000, 2, dt, true, 9, 0, false};  // already transformed: the no-FWHT instance
      check(tf, rng);
    }
  // random configs the binding accepts
  const int randoms = full ? 400 : (smoke ? 25 : 60);
  for (int i = 0; i < randoms; ++i) {
    const Config c = random_config(rng);
    const int64_t n = int64_t(rng() % 6000);
    check(Run{c, n, 1 + int64_t(rng() % 3), dtypes[rng() % 3], (rng() & 1) != 0, rng(), rng()}, rng);
  }
  std::printf("%d checks, %d mismatches, %d launches\n", checks, failures, emu::launches);
  return failures ? 1 : 0;
}
