/* The vector layer: one set of names over AVX-512 (16 floats) or AVX2+FMA (8 floats).
 * The same kernel sources are compiled once per ISA; only this file knows which one it is. */
#ifndef EMG_X86_SIMD_H
#define EMG_X86_SIMD_H

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

#if defined(__AVX2__)
/* In-register 8 x 8 transpose of ymm rows: r[i] lane j becomes r[j] lane i. */
AI void transpose8(__m256 r[8]) {
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) { /* r[g + m], 128-bit half k: column 4k + m of rows g..g+3 */
        __m256d a = _mm256_castps_pd(t[g]), b = _mm256_castps_pd(t[g + 1]);
        __m256d c = _mm256_castps_pd(t[g + 2]), d = _mm256_castps_pd(t[g + 3]);
        r[g] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, c));
        r[g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, c));
        r[g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(b, d));
        r[g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(b, d));
    }
    for (int m = 0; m < 4; m++) {
        t[m] = _mm256_permute2f128_ps(r[m], r[4 + m], 0x20);
        t[4 + m] = _mm256_permute2f128_ps(r[m], r[4 + m], 0x31);
    }
    for (int i = 0; i < 8; i++) r[i] = t[i];
}
#endif

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define VW 16
#define ACC_BUDGET 24 /* 32 zmm registers: accumulators + operands */
typedef __m512 vf;
typedef __mmask16 vmask;
AI vf v_load(const float *p) { return _mm512_loadu_ps(p); }
AI void v_store(float *p, vf x) { _mm512_storeu_ps(p, x); }
AI vf v_set1(float x) { return _mm512_set1_ps(x); }
AI vf v_zero(void) { return _mm512_setzero_ps(); }
AI vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
AI vf v_fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
AI vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
AI vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
AI vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
AI vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
AI vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
AI vf v_min(vf a, vf b) { return _mm512_min_ps(a, b); }
AI vf v_sqrt(vf a) { return _mm512_sqrt_ps(a); }
AI vf v_round(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
AI float v_hsum(vf a) { return _mm512_reduce_add_ps(a); }
/* a * 2^n for integral n in [-126, 127]: one VSCALEFPS (the AVX2 version builds 2^n in the exponent field
 * and multiplies: the same result, in four instructions). */
AI vf v_scale2(vf a, vf n) { return _mm512_scalef_ps(a, n); }
/* a where keep > 0, else 0 (ReLU backward mask). */
AI vf v_keep_pos(vf a, vf keep) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(keep, _mm512_setzero_ps(), _CMP_GT_OQ), a);
}
/* a where lane index >= n, else fill. */
AI vf v_from_n_or(vf a, int n, float fill) {
    __mmask16 m = (__mmask16)(n >= 16 ? 0xFFFFu : ((1u << (n < 0 ? 0 : n)) - 1u));
    return _mm512_mask_mov_ps(a, m, _mm512_set1_ps(fill));
}
/* x where a == b, else y. */
AI vf v_select_eq(vf a, vf b, vf x, vf y) { return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), x); }
/* In-register 16 x 16 transpose: r[i] lane j becomes r[j] lane i. Pairs of rows interleave (ps), then
 * pairs of pairs (pd), then 128-bit blocks move across registers in two rounds. */
AI void v_transpose(vf r[16]) {
    vf t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) { /* r[g + m], 128-bit block k: column 4k + m of rows g..g+3 */
        __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
        __m512d c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
        r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int m = 0; m < 4; m++) {
        t[m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);      /* blocks 0, 2 */
        t[4 + m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xDD);  /* blocks 1, 3 */
        t[8 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
        t[12 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xDD);
    }
    for (int m = 0; m < 4; m++) {
        r[m] = _mm512_shuffle_f32x4(t[m], t[8 + m], 0x88);
        r[8 + m] = _mm512_shuffle_f32x4(t[m], t[8 + m], 0xDD);
        r[4 + m] = _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0xDD);
    }
}

/* The first 8 floats at p (the rest of the vector is unspecified); store the first 8 lanes to p. */
AI vf v_load_lo8(const float *p) { return _mm512_castps256_ps512(_mm256_loadu_ps(p)); }
AI void v_store_lo8(float *p, vf x) { _mm256_storeu_ps(p, _mm512_castps512_ps256(x)); }
/* 8 x 8 transpose of the first 8 lanes of r[0..7], lanes 8-15 zero: ymm shuffles, which Zen 4 issues at
 * twice the rate of zmm ones, for a quarter of the 16 x 16 transpose's data. */
AI void v_transpose_lo8(vf r[8]) {
    __m256 h[8];
    for (int i = 0; i < 8; i++) h[i] = _mm512_castps512_ps256(r[i]);
    transpose8(h);
    for (int i = 0; i < 8; i++) r[i] = _mm512_zextps256_ps512(h[i]);
}

/* 8 x 8 transpose within each half of r[0..7]: lane j (and 8 + j) of r[i] becomes lane i (8 + i) of r[j].
 * transpose8's steps on 512-bit rows (attention_pairs.h: two heads' 8 x 8 tiles at once); its cross-block step
 * keeps each half's blocks in that half. */
AI void v_transpose_halves(vf r[8]) {
    vf t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
        __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
        __m512d c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
        r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int m = 0; m < 4; m++) { /* 128-bit blocks: (r[m].0, r[4+m].0, r[m].2, r[4+m].2) and (.1, .1, .3, .3) */
        t[m] = _mm512_mask_shuffle_f32x4(r[m], 0xF0F0, r[4 + m], r[4 + m], 0x80);
        t[4 + m] = _mm512_mask_shuffle_f32x4(r[4 + m], 0x0F0F, r[m], r[m], 0x31);
    }
    for (int i = 0; i < 8; i++) r[i] = t[i];
}

#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
#define ACC_BUDGET 12 /* 16 ymm registers */
typedef __m256 vf;
AI vf v_load(const float *p) { return _mm256_loadu_ps(p); }
AI void v_store(float *p, vf x) { _mm256_storeu_ps(p, x); }
AI vf v_set1(float x) { return _mm256_set1_ps(x); }
AI vf v_zero(void) { return _mm256_setzero_ps(); }
AI vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
AI vf v_fnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
AI vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
AI vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
AI vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
AI vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
AI vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
AI vf v_min(vf a, vf b) { return _mm256_min_ps(a, b); }
AI vf v_sqrt(vf a) { return _mm256_sqrt_ps(a); }
AI vf v_round(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
AI float v_hsum(vf a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
AI vf v_pow2i(vf n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
AI vf v_scale2(vf a, vf n) { return _mm256_mul_ps(a, v_pow2i(n)); }
AI vf v_keep_pos(vf a, vf keep) {
    return _mm256_and_ps(a, _mm256_cmp_ps(keep, _mm256_setzero_ps(), _CMP_GT_OQ));
}
AI vf v_from_n_or(vf a, int n, float fill) {
    __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i below = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes);
    return _mm256_blendv_ps(a, _mm256_set1_ps(fill), _mm256_castsi256_ps(below));
}
AI vf v_select_eq(vf a, vf b, vf x, vf y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_EQ_OQ)); }
/* In-register 8 x 8 transpose: r[i] lane j becomes r[j] lane i. */
AI void v_transpose(vf r[8]) { transpose8(r); }
/* The first 8 floats at p (the rest of the vector is unspecified); store the first 8 lanes to p. */
AI vf v_load_lo8(const float *p) { return _mm256_loadu_ps(p); }
AI void v_store_lo8(float *p, vf x) { _mm256_storeu_ps(p, x); }
/* 8 x 8 transpose of the first 8 lanes of r[0..7]; lanes 8 and up come out zero (here there are none). */
AI void v_transpose_lo8(vf r[8]) { transpose8(r); }

#else
#error "eemicrogpt x86 kernels need AVX-512F/DQ or AVX2+FMA (compile with the variant's -m flags)"
#endif

#endif /* EMG_X86_SIMD_H */
