// The thin torch binding of fp4quant's kernels: the op schemas (namespace fp4quant),
// input checks, shapes and dispatch.  Kernels never see a tensor: they get the plain
// argument structs of kernels.h.  The fake (meta) kernels live in fp4quant/ops/_native.py.
// Only the headers of what it uses (ATen's per-operator headers, pybind11 itself): with
// ATen/ATen.h and torch/extension.h, which declare all of torch, it compiled in 40 s on a
// 2-core VM, with these in 21 s.  The define is torch's guard against its all-operator
// headers (it stops a build that reaches aten_interned_strings.h).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cpu/codec_cpu.h"
#include "kernels.h"

#ifdef FP4QUANT_WITH_CUDA
// c10's CUDA headers need only the CUDA runtime; ATen/cuda/CUDAContext.h would pull in the
// cuBLAS/cuSPARSE/cuSOLVER headers, which a bare nvcc install (pip's, a minimal toolkit) lacks.
// (c10::DeviceGuard finds the CUDA guard that c10_cuda registers.)
#include <c10/cuda/CUDAStream.h>

#include "cuda/launch.h"
#endif

namespace fp4q {
namespace {

Config parse_config(at::IntArrayRef v) {
  TORCH_CHECK(v.size() == kConfigFields, "fp4quant: config must have ", kConfigFields, " integers, got ", v.size());
  Config c{int32_t(v[0]), int32_t(v[1]), int32_t(v[2]), int32_t(v[3]), int32_t(v[4]),
           int32_t(v[5]), int32_t(v[6]), int32_t(v[7]), int32_t(v[8])};
  auto pow2 = [](int64_t n) { return n > 0 && (n & (n - 1)) == 0; };
  TORCH_CHECK(c.element >= kE2M1 && c.element <= kE4M3, "fp4quant: bad element code ", c.element);
  TORCH_CHECK(c.micro_scale >= kScaleE4M3 && c.micro_scale <= kScaleNone, "fp4quant: bad micro_scale code ", c.micro_scale);
  TORCH_CHECK(c.coarse >= kCoarseGroup && c.coarse <= kCoarseNone, "fp4quant: bad coarse_scale code ", c.coarse);
  TORCH_CHECK(c.micro_scale != kScaleNone || c.coarse != kCoarseNone, "fp4quant: a config needs a scale");
  TORCH_CHECK(pow2(c.micro_group) && c.micro_group >= 2, "fp4quant: micro_group must be a power of two >= 2, got ", c.micro_group);
  TORCH_CHECK(pow2(c.group) && c.group >= c.micro_group && c.group <= (1 << 16),
              "fp4quant: group must be a power of two, >= micro_group and <= 65536, got ", c.group);
  TORCH_CHECK(c.scale_round >= kScaleNearest && c.scale_round <= kScaleFloor, "fp4quant: bad scale_round code ", c.scale_round);
  TORCH_CHECK(c.rounding == kRoundNearest || c.rounding == kRoundStochastic, "fp4quant: bad rounding code ", c.rounding);
  TORCH_CHECK(c.fwht == 0 || c.fwht == 1, "fp4quant: bad fwht code ", c.fwht);
  return c;
}

int32_t dtype_code(at::ScalarType t, const char* what) {
  if (t == at::kFloat) return kF32;
  if (t == at::kBFloat16) return kBF16;
  if (t == at::kHalf) return kF16;
  TORCH_CHECK(false, "fp4quant: ", what, " must be float32, bfloat16 or float16, got ", t);
}

const float* signs_ptr(const c10::optional<at::Tensor>& signs, const Config& c, const at::Device& device) {
  if (!signs.has_value() || !c.fwht) return nullptr;
  const at::Tensor& s = *signs;
  TORCH_CHECK(s.scalar_type() == at::kFloat && s.dim() == 1 && s.size(0) == c.group && s.is_contiguous(),
              "fp4quant: signs must be a contiguous float32 tensor of shape (", c.group, "), got ", s.sizes());
  TORCH_CHECK(s.device() == device, "fp4quant: signs are on ", s.device(), " but the data is on ", device);
  return s.data_ptr<float>();
}

void check_messages(const at::Tensor& msgs, const Layout& lay, const char* what) {
  TORCH_CHECK(msgs.scalar_type() == at::kByte && msgs.dim() == 2 && msgs.size(1) == lay.nbytes,
              "fp4quant: ", what, " must be uint8 of shape (rows, ", lay.nbytes, ") for n=", lay.n, ", got ",
              msgs.scalar_type(), " ", msgs.sizes());
}

// Team size of the calling thread's most recent parallel region (1: it ran inline), for the
// test that the kernels really run on torch's threads (a build without OpenMP runs serially).
thread_local int region_threads = 0;

// fn over [0, n) in chunks of `grain`, handed out one at a time to torch's threads as each
// finishes its last (not split in equal parts up front): a thread slowed by other work on its
// core then takes fewer chunks instead of holding up the others.  The kernels' results do not
// depend on which thread runs which chunk.
void torch_parallel_for(int64_t n, int64_t grain, cpu::RangeFn fn, void* ctx) {
  const int64_t chunks = (n + grain - 1) / grain;
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), chunks);
  std::atomic<int64_t> next{0};
  std::atomic<int> team{1};
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
#ifdef _OPENMP
    team.store(omp_get_num_threads(), std::memory_order_relaxed);
#endif
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) fn(ctx, c * grain, std::min(n, (c + 1) * grain));
  });
  region_threads = team.load();
}

// A large CPU output that the kernel writes once, in full: ask for transparent huge pages (the
// kernel's "madvise" mode), so that its first touch faults 2 MiB at a time, not 4 KiB: on a
// fresh allocation page faults otherwise cost more than the kernel's own memory traffic.
void prefer_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (!t.is_cpu() || t.nbytes() < 2 * kHuge) return;
  const uintptr_t first = uintptr_t(t.data_ptr()), begin = (first + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (first + t.nbytes()) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice: failure is harmless
#endif
}

// ---- argument building, shared by the CPU and CUDA implementations ----

// Scratch of the tensor-scale configs: float workspace (rows x padded) when the values must be
// transformed before their maximum is known, and zeroed words for device-wide maxima.
struct Scratch {
  at::Tensor workspace, words;
};

QuantizeArgs quantize_args(const at::Tensor& x, const Config& cfg, const c10::optional<at::Tensor>& signs,
                           int64_t seed, int64_t offset, at::Tensor& out, Scratch& scratch) {
  TORCH_CHECK(x.dim() == 2, "fp4quant.quantize: x must be 2-D (rows, n), got ", x.sizes());
  TORCH_CHECK(x.stride(1) == 1, "fp4quant.quantize: x rows must be contiguous");
  const Layout lay = make_layout(cfg, x.size(1));
  out = at::empty({x.size(0), lay.nbytes}, x.options().dtype(at::kByte));
  prefer_huge_pages(out);
  const bool tensor = cfg.coarse == kCoarseTensor;
  const bool needs_workspace = tensor && cfg.fwht;
  scratch.workspace = at::empty({needs_workspace ? x.size(0) * lay.padded : 0}, x.options().dtype(at::kFloat));
  prefer_huge_pages(scratch.workspace);
  scratch.words = at::zeros({tensor ? 2 * x.size(0) : 0}, x.options().dtype(at::kInt));
  QuantizeArgs a{};
  a.cfg = cfg;
  a.lay = lay;
  a.rows = x.size(0);
  a.x = x.data_ptr();
  a.x_dtype = dtype_code(x.scalar_type(), "x");
  a.x_row_stride = x.stride(0);
  a.out = out.data_ptr<uint8_t>();
  a.signs = signs_ptr(signs, cfg, x.device());
  a.key = stream_key(uint64_t(seed));
  a.offset = uint64_t(offset);
  a.transform = true;
  a.workspace = needs_workspace ? scratch.workspace.data_ptr<float>() : nullptr;
  a.reduce_scratch = tensor ? reinterpret_cast<uint32_t*>(scratch.words.data_ptr<int32_t>()) : nullptr;
  return a;
}

// msgs as the kernels read them (contiguous), checked to hold messages of n values under cfg.
at::Tensor checked_messages(const at::Tensor& msgs_in, int64_t n, const Config& cfg, const char* op) {
  TORCH_CHECK(n >= 0, "fp4quant.", op, ": n must be >= 0, got ", n);
  at::Tensor msgs = msgs_in.contiguous();
  check_messages(msgs, make_layout(cfg, n), "msgs");
  return msgs;
}

// The arguments of a decode of msgs into out, already (rows, n) of its dtype, contiguous.
DequantizeArgs dequantize_args(const at::Tensor& msgs, int64_t n, const Config& cfg,
                               const c10::optional<at::Tensor>& signs, bool saturate, const at::Tensor& out) {
  DequantizeArgs a{};
  a.cfg = cfg;
  a.lay = make_layout(cfg, n);
  a.rows = msgs.size(0);
  a.msgs = msgs.data_ptr<uint8_t>();
  a.out = out.data_ptr();
  a.out_dtype = dtype_code(out.scalar_type(), "out");
  a.signs = signs_ptr(signs, cfg, msgs.device());
  a.saturate = saturate;
  return a;
}

ReduceArgs reduce_args(const at::Tensor& msgs, int64_t n, const Config& cfg, const c10::optional<at::Tensor>& signs,
                       at::ScalarType dtype, bool requantize, int64_t seed, int64_t offset, at::Tensor& out,
                       Scratch& scratch) {
  TORCH_CHECK(n >= 0, "fp4quant.dequantize_reduce: n must be >= 0, got ", n);
  const Layout lay = make_layout(cfg, n);
  check_messages(msgs, lay, "msgs");
  TORCH_CHECK(msgs.size(0) >= 1, "fp4quant.dequantize_reduce: needs at least one message");
  out = requantize ? at::empty({lay.nbytes}, msgs.options()) : at::empty({n}, msgs.options().dtype(dtype));
  prefer_huge_pages(out);
  const bool needs_workspace = requantize && cfg.coarse == kCoarseTensor;
  scratch.workspace = at::empty({needs_workspace ? lay.padded : 0}, msgs.options().dtype(at::kFloat));
  prefer_huge_pages(scratch.workspace);
  scratch.words = at::zeros({needs_workspace ? 2 : 0}, msgs.options().dtype(at::kInt));
  ReduceArgs a{};
  a.cfg = cfg;
  a.lay = lay;
  a.world = msgs.size(0);
  a.msgs = msgs.data_ptr<uint8_t>();
  a.requantize = requantize;
  a.out_msg = requantize ? out.data_ptr<uint8_t>() : nullptr;
  a.out = requantize ? nullptr : out.data_ptr();
  a.out_dtype = dtype_code(dtype, "dtype");
  a.signs = signs_ptr(signs, cfg, msgs.device());
  a.key = stream_key(uint64_t(seed));
  a.offset = uint64_t(offset);
  a.workspace = needs_workspace ? scratch.workspace.data_ptr<float>() : nullptr;
  a.reduce_scratch = needs_workspace ? reinterpret_cast<uint32_t*>(scratch.words.data_ptr<int32_t>()) : nullptr;
  return a;
}

// ---- launch on the data's device ----

void cpu_launch(const QuantizeArgs& a) { cpu::best_kernels().quantize(a, torch_parallel_for); }
void cpu_launch(const DequantizeArgs& a) { cpu::best_kernels().dequantize(a, torch_parallel_for); }
void cpu_launch(const ReduceArgs& a) { cpu::best_kernels().dequantize_reduce(a, torch_parallel_for); }

#ifdef FP4QUANT_WITH_CUDA
int cuda_launch(const QuantizeArgs& a, cudaStream_t s) { return cuda::quantize(a, s); }
int cuda_launch(const DequantizeArgs& a, cudaStream_t s) { return cuda::dequantize(a, s); }
int cuda_launch(const ReduceArgs& a, cudaStream_t s) { return cuda::dequantize_reduce(a, s); }
#endif

// The CPU kernels on torch's thread pool, or the CUDA kernels on the device's current stream
// (the caller holds a DeviceGuard; the dispatcher sends CUDA tensors here only when built with CUDA).
template <class Args>
void launch(const Args& a, const at::Device& device, const char* op) {
  if (device.is_cpu()) return cpu_launch(a);
#ifdef FP4QUANT_WITH_CUDA
  const int err = cuda_launch(a, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  TORCH_CHECK(err == 0, "fp4quant.", op, ": CUDA error ", err, ": ", cuda::error_string(err));
#else
  TORCH_CHECK(false, "fp4quant.", op, ": this build has no kernels for ", device);
#endif
}

// ---- the ops: one host function each, for CPU and CUDA ----

at::Tensor quantize(const at::Tensor& x_in, at::IntArrayRef config, const c10::optional<at::Tensor>& signs,
                    int64_t seed, int64_t offset) {
  const Config cfg = parse_config(config);
  const at::Tensor x = x_in.dim() == 2 && x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  const c10::DeviceGuard guard(x.device());
  at::Tensor out;
  Scratch scratch;
  launch(quantize_args(x, cfg, signs, seed, offset, out, scratch), x.device(), "quantize");
  return out;
}

at::Tensor dequantize(const at::Tensor& msgs_in, int64_t n, at::IntArrayRef config,
                      const c10::optional<at::Tensor>& signs, at::ScalarType dtype, bool saturate) {
  const Config cfg = parse_config(config);
  const at::Tensor msgs = checked_messages(msgs_in, n, cfg, "dequantize");
  dtype_code(dtype, "dtype");
  const c10::DeviceGuard guard(msgs.device());
  at::Tensor out = at::empty({msgs.size(0), n}, msgs.options().dtype(dtype));
  prefer_huge_pages(out);
  launch(dequantize_args(msgs, n, cfg, signs, saturate, out), msgs.device(), "dequantize");
  return out;
}

// dequantize into the caller's (rows, n) buffer: no allocation (a fresh large one costs page
// faults) and no copy where the values are wanted in place (the all-reduce's own tensor).
void dequantize_into(const at::Tensor& msgs_in, int64_t n, at::IntArrayRef config,
                     const c10::optional<at::Tensor>& signs, bool saturate, at::Tensor& out) {
  const Config cfg = parse_config(config);
  const at::Tensor msgs = checked_messages(msgs_in, n, cfg, "dequantize_into");
  TORCH_CHECK(out.device() == msgs.device(), "fp4quant.dequantize_into: out is on ", out.device(),
              " but msgs are on ", msgs.device());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == msgs.size(0) && out.size(1) == n,
              "fp4quant.dequantize_into: out must have shape (", msgs.size(0), ", ", n, "), got ", out.sizes());
  TORCH_CHECK(out.is_contiguous(), "fp4quant.dequantize_into: out must be contiguous");
  const at::MemOverlapStatus overlap = at::get_overlap_status(out, msgs);
  TORCH_CHECK(overlap != at::MemOverlapStatus::Full && overlap != at::MemOverlapStatus::Partial,
              "fp4quant.dequantize_into: out overlaps msgs (the values would overwrite the codes they are decoded from)");
  const c10::DeviceGuard guard(msgs.device());
  launch(dequantize_args(msgs, n, cfg, signs, saturate, out), msgs.device(), "dequantize_into");
}

at::Tensor dequantize_reduce(const at::Tensor& msgs_in, int64_t n, at::IntArrayRef config,
                             const c10::optional<at::Tensor>& signs, at::ScalarType dtype, bool requantize,
                             int64_t seed, int64_t offset) {
  const Config cfg = parse_config(config);
  const at::Tensor msgs = msgs_in.contiguous();
  const c10::DeviceGuard guard(msgs.device());
  at::Tensor out;
  Scratch scratch;
  launch(reduce_args(msgs, n, cfg, signs, dtype, requantize, seed, offset, out, scratch), msgs.device(),
         "dequantize_reduce");
  return out;
}

}  // namespace
}  // namespace fp4q

TORCH_LIBRARY(fp4quant, m) {
  m.def("quantize(Tensor x, int[] config, Tensor? signs, int seed, int offset) -> Tensor");
  m.def("dequantize(Tensor msgs, int n, int[] config, Tensor? signs, ScalarType dtype, bool saturate=True) -> Tensor");
  m.def("dequantize_into(Tensor msgs, int n, int[] config, Tensor? signs, bool saturate, Tensor(a!) out) -> ()");
  m.def(
      "dequantize_reduce(Tensor msgs, int n, int[] config, Tensor? signs, ScalarType dtype, bool requantize, "
      "int seed, int offset) -> Tensor");
}

TORCH_LIBRARY_IMPL(fp4quant, CPU, m) {
  m.impl("quantize", &fp4q::quantize);
  m.impl("dequantize", &fp4q::dequantize);
  m.impl("dequantize_into", &fp4q::dequantize_into);
  m.impl("dequantize_reduce", &fp4q::dequantize_reduce);
}

#ifdef FP4QUANT_WITH_CUDA
TORCH_LIBRARY_IMPL(fp4quant, CUDA, m) {
  m.impl("quantize", &fp4q::quantize);
  m.impl("dequantize", &fp4q::dequantize);
  m.impl("dequantize_into", &fp4q::dequantize_into);
  m.impl("dequantize_reduce", &fp4q::dequantize_reduce);
}
#endif

#ifndef FP4QUANT_CUDA_ARCHS
#define FP4QUANT_CUDA_ARCHS ""
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fp4quant native kernels (ops registered under torch.ops.fp4quant)";
  m.def("cpu_isa", []() { return std::string(fp4q::cpu::best_kernels().isa); }, "instruction set of the CPU kernels in use");
  m.def("last_parallel_threads", []() { return fp4q::region_threads; },
        "threads the calling thread's most recent CPU kernel region ran on (0: none yet)");
#ifdef FP4QUANT_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  m.attr("cuda_archs") = std::string(FP4QUANT_CUDA_ARCHS);
}
