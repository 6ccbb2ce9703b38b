/* The three AVX512-BF16 instructions gemm_bf16.h uses, in AVX-512F/BW code, so that the avx512_bf16 step can
 * run (slowly) on a CPU without AVX512-BF16: a build with -DEMG_BF16_EMULATE (and the usual -mavx512bf16, for
 * the types) executes every packing, pairing and tiling path of that build. Never part of a release build.
 * Rounding is to nearest even (NaNs stay NaN); each bf16 product is exact in fp32, so the dot product's two
 * additions (the odd element first, as VDPBF16PS) round as the instruction does, except for its flushing of
 * subnormals. */
#ifndef EMG_X86_BF16_EMULATE_H
#define EMG_X86_BF16_EMULATE_H

#include <immintrin.h>

/* x rounded to bf16, as the upper 16 bits of each 32-bit lane. */
static inline __m512i emg_bf16_round(__m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(bits, _mm512_set1_epi32(0x00400000)));
    return _mm512_srli_epi32(r, 16);
}

static inline __m256bh emg_emulated_cvtneps_pbh(__m512 a) {
    return (__m256bh)_mm512_cvtepi32_epi16(emg_bf16_round(a));
}

/* bf16 elements 0-15 from b, 16-31 from a. */
static inline __m512bh emg_emulated_cvtne2ps_pbh(__m512 a, __m512 b) {
    const __m256i lo = _mm512_cvtepi32_epi16(emg_bf16_round(b)), hi = _mm512_cvtepi32_epi16(emg_bf16_round(a));
    return (__m512bh)_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* acc[j] += a[2j + 1] b[2j + 1], then += a[2j] b[2j]. */
static inline __m512 emg_emulated_dpbf16_ps(__m512 acc, __m512bh a, __m512bh b) {
    const __m512i ai = (__m512i)a, bi = (__m512i)b, high = _mm512_set1_epi32((int)0xFFFF0000u);
    const __m512 a_odd = _mm512_castsi512_ps(_mm512_and_si512(ai, high));
    const __m512 b_odd = _mm512_castsi512_ps(_mm512_and_si512(bi, high));
    const __m512 a_even = _mm512_castsi512_ps(_mm512_slli_epi32(ai, 16));
    const __m512 b_even = _mm512_castsi512_ps(_mm512_slli_epi32(bi, 16));
    return _mm512_fmadd_ps(a_even, b_even, _mm512_fmadd_ps(a_odd, b_odd, acc));
}

#define _mm512_cvtneps_pbh emg_emulated_cvtneps_pbh
#define _mm512_cvtne2ps_pbh emg_emulated_cvtne2ps_pbh
#define _mm512_dpbf16_ps emg_emulated_dpbf16_ps

#endif /* EMG_X86_BF16_EMULATE_H */
