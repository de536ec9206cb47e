// The AVX2 quantize of fp4quant's config (groups of 2048, the FWHT with random signs, a
// coarse scale per group, E4M3 micro-scales over 16 values, round to nearest), piece by piece
// on float32: the input's amax, the forward FWHT, the micro-groups' maxima, their micro-scales,
// the E2M1 codes, the whole encoder and the whole quantize of a group.  The pieces that read
// the input (amax, FWHT, whole group) take the next of SPANS groups each call (1: the same
// group, in L1); the encoder's pieces read the one transformed group in L1.  Single-threaded;
// each figure is the fastest of 7 timings of CALLS calls, in ns a value.  Built and run by
// pieces.sh; it times, it checks nothing (the tests and kernel_ab.sh check the bytes).
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,popcnt")
#define FP4Q_AVX2 1
#include "cpu/codec_generic.h"
#include "pieces_common.h"

using namespace fp4q;
using namespace fp4q::cpu;

int main(int argc, char** argv) {
  Pieces P(argc, argv);
  constexpr int64_t G = Pieces::G, M = Pieces::M;
  alignas(64) static float b[G];
  alignas(64) static float r[M + 8];
  alignas(64) static uint32_t maxima[M + 8];
  std::vector<uint8_t> msg(M + G / 2);
  uint8_t* codes = msg.data() + M;
  const Config& cfg = P.cfg;
  const float* signs = P.signs.data();
  volatile float sink = 0;
  const float amax = avx2::fwht_forward(P.x.data(), kF32, b, G, 0.25f, signs, P.inv);
  const float c = amax / coarse_divisor(cfg);  // as encode_prepared's
  for (int64_t j0 = 0; j0 < M; j0 += 8)
    _mm256_store_si256(reinterpret_cast<__m256i*>(maxima + j0), avx2::group_max_bits8(b + 16 * j0));
  P.row("input_amax", [&] { sink = avx2::input_amax(P.next(), kF32, 0, G); });
  P.row("fwht_forward", [&] { sink = avx2::fwht_forward(P.next(), kF32, b, G, 0.25f, signs, P.inv); });
  P.row("maxima", [&] {
    for (int64_t j0 = 0; j0 < M; j0 += 8)
      _mm256_store_si256(reinterpret_cast<__m256i*>(maxima + j0), avx2::group_max_bits8(b + 16 * j0));
  });
  P.row("micro_scales", [&] {
    for (int64_t j0 = 0; j0 < M; j0 += 8) {
      const __m256i m = _mm256_load_si256(reinterpret_cast<const __m256i*>(maxima + j0));
      const __m256i finite = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), m);
      const __m256 a = _mm256_and_ps(_mm256_castsi256_ps(m), _mm256_castsi256_ps(finite));
      avx2::e4m3_micro_scales8(a, finite, c, true, kScaleNearest, msg.data() + j0, r + j0, 8);
    }
  });
  P.row("codes", [&] {
    for (int64_t k = 0; k < M; k += 2) {
      const float* v = b + 16 * k;
      const __m256i wa = avx2::e2m1_nearest_code_words(_mm256_loadu_ps(v), _mm256_loadu_ps(v + 8), _mm256_set1_ps(r[k]));
      const __m256i wb =
          avx2::e2m1_nearest_code_words(_mm256_loadu_ps(v + 16), _mm256_loadu_ps(v + 24), _mm256_set1_ps(r[k + 1]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 8 * k), avx2::pack_codes2(wa, wb));
    }
  });
  P.row("encoder", [&] { avx2::encode_fp4_e4m3_span(cfg, b, G, c, msg.data(), codes, 0, 0); });
  P.row("quantize_group", [&] {
    const float* p = P.next();
    const int e = normalizing_exponent(avx2::input_amax(p, kF32, 0, G));
    const float a = avx2::fwht_forward(p, kF32, b, G, pow2(-e), signs, P.inv);
    avx2::encode_fp4_e4m3_span(cfg, b, G, a / coarse_divisor(cfg), msg.data(), codes, 0, 0);
  });
  return int(sink != sink);  // NaN never: keeps sink alive
}
