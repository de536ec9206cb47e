// pieces.cpp's pieces for the AVX-512 quantize of fp4quant's config (simd_avx512*.h): the
// input's amax, the forward FWHT reading the input (as quantize_span_transformed), the
// micro-groups' maxima, their micro-scales, the E2M1 codes with their packing, the whole
// encoder and the whole quantize of a group; the same timing and the same columns.  Built and
// run by pieces.sh with ISA=avx512; it times, it checks nothing (the tests and kernel_ab.sh
// check the bytes).  The whole group's figure moves with GCC's inlining of this program: on a
// Zen 4, 0.49-0.66 ns a value between builds that differed only elsewhere (the pieces.
// held still); kernel_ab.sh times the extension's own quantize.

#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2,popcnt")
#define FP4Q_AVX512 1
#include "cpu/codec_generic.h"
#include "pieces_common.h"

using namespace fp4q;
using namespace fp4q::cpu;

int main(int argc, char** argv) {
  Pieces P(argc, argv);
  constexpr int64_t G = Pieces::G, M = Pieces::M;
  alignas(64) static float b[G];
  alignas(64) static float r[M + 16];
  alignas(64) static float amax_of[M + 16];
  std::vector<uint8_t> msg(M + G / 2);
  uint8_t* codes = msg.data() + M;
  const Config& cfg = P.cfg;
  // the forward transform as quantize_span_transformed runs it: from the input, its amax after
  auto forward = [&](const float* p, int e) {
    avx512::FwhtOps o{true, pow2(-e), P.signs.data(), P.inv, nullptr, false, 1.0f, true};
    o.src = p;
    o.src_dtype = kF32;
    return avx512::fwht_fused(b, G, o);
  };
  volatile float sink = 0;
  const float c = forward(P.x.data(), 2) / coarse_divisor(cfg);  // as encode_prepared's
  __mmask16 finite_of[M / 16];
  for (int64_t j0 = 0; j0 < M; j0 += 16) avx512::group_amax(b + 16 * j0, 16, amax_of + j0, finite_of[j0 / 16]);
  for (int64_t j0 = 0; j0 < M; j0 += 16)
    avx512::e4m3_micro_scales(amax_of + j0, finite_of[j0 / 16], c, true, kScaleNearest, msg.data() + j0, r + j0, 16);
  P.row("input_amax", [&] { sink = avx512::input_amax(P.next(), kF32, 0, G); });
  P.row("fwht_forward", [&] { sink = forward(P.next(), 2); });
  P.row("maxima", [&] {
    for (int64_t j0 = 0; j0 < M; j0 += 16) avx512::group_amax(b + 16 * j0, 16, amax_of + j0, finite_of[j0 / 16]);
  });
  P.row("micro_scales", [&] {
    for (int64_t j0 = 0; j0 < M; j0 += 16)
      avx512::e4m3_micro_scales(amax_of + j0, finite_of[j0 / 16], c, true, kScaleNearest, msg.data() + j0, r + j0, 16);
  });
  P.row("codes", [&] {
    avx512::E2m1Constants K = avx512::E2m1Constants::make();
    for (int64_t k = 0; k < M; k += 4) {
      K.pin();
      avx512::store_codes4(avx512::e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k), r[k], K),
                           avx512::e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k + 16), r[k + 1], K),
                           avx512::e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k + 32), r[k + 2], K),
                           avx512::e2m1_nearest_code_lanes(_mm512_loadu_ps(b + 16 * k + 48), r[k + 3], K),
                           codes + 8 * k, K);
    }
  });
  P.row("encoder", [&] { avx512::encode_fp4_e4m3_span(cfg, b, G, c, msg.data(), codes, 0, 0); });
  P.row("quantize_group", [&] {
    const float* p = P.next();
    const int e = normalizing_exponent(avx512::input_amax(p, kF32, 0, G));
    const float a = forward(p, e);
    avx512::encode_fp4_e4m3_span(cfg, b, G, a / coarse_divisor(cfg), msg.data(), codes, 0, 0);
  });
  return int(sink != sink);  // NaN never: keeps sink alive
}
