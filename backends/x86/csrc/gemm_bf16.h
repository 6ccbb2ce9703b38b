/* bf16 GEMMs on AVX512-BF16 (built only for the avx512_bf16 library, -DEMG_BF16). VDPBF16PS multiplies
 * pairs of bf16 values and adds both products to one fp32 lane: acc[j] += a[2j] b[2j] + a[2j+1] b[2j+1].
 * So the reduction runs over pairs: A supplies one 32-bit (a[k], a[k+1]) broadcast per row, B one vector
 * of 16 interleaved (b[k][j], b[k+1][j]) pairs per 16 outputs. Operands are rounded to bf16 (nearest even)
 * once, products and sums stay fp32; master weights, Adam and everything outside the GEMMs stay fp32.
 * Same register tiles as gemm.h, with half as many reduction steps per tile. */
#ifndef EMG_X86_GEMM_BF16_H
#define EMG_X86_GEMM_BF16_H

#include <stdint.h>

#include "gemm.h"
#ifdef EMG_BF16_EMULATE
#include "bf16_emulate.h"
#endif

#if VW != 16 || !defined(__AVX512BF16__)
#error "gemm_bf16.h needs AVX-512 with AVX512-BF16 (-mavx512bf16)"
#endif

#define BF_ALIGN_K 16 /* reductions are padded with zero rows to a multiple of this */

/* Lane j: the pair (bf16(r0[j]), bf16(r1[j])) as 32 bits, r0's value in the low half. */
AI __m512i pair_lanes(const __m512 r0, const __m512 r1) {
    static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(r1, r0); /* lanes 0-15: r0, 16-31: r1 */
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(order), both);
}

/* dst[k/2][n][k % 2] = bf16(src[k * ld + n]) for pair rows kk_lo <= k/2 < kk_hi (rows k >= K are zero), n < N
 * (a multiple of 16): dst is [Kp/2][N] 32-bit pairs for an even Kp >= K, whose pair rows are packed in ranges. */
AI void pack_pairs(const float *src, int ld, int K, int N, uint32_t *dst, int kk_lo, int kk_hi) {
    for (int kk = kk_lo; kk < kk_hi; kk++)
        for (int n0 = 0; n0 < N; n0 += 16) {
            const int k = 2 * kk;
            const __m512 r0 = k < K ? _mm512_loadu_ps(src + (long)k * ld + n0) : _mm512_setzero_ps();
            const __m512 r1 = k + 1 < K ? _mm512_loadu_ps(src + (long)(k + 1) * ld + n0) : _mm512_setzero_ps();
            _mm512_storeu_si512(dst + (long)kk * N + n0, pair_lanes(r0, r1));
        }
}

/* The same packed form of W^T straight from a row-major W[rows][K] (ld ldw), without an fp32 transposed copy:
 * dst[kk][c] = (bf16(W[c][2kk]), bf16(W[c][2kk + 1])) for c < N (rows c >= `rows` are zero; N a multiple of
 * 16), kk < K/2 (K a multiple of 16). A row of W rounded in order is already a row of pairs, so 16 x 16
 * blocks of pairs are transposed as 32-bit lanes. Packed here: the 16-row blocks of W from c_lo (a multiple of
 * 16) below c_hi; the block holding row c_hi - 1 is packed whole (rows from `rows` on as zero). */
AI void pack_pairs_t(const float *W, int rows, int K, int ldw, int N, uint32_t *dst, int c_lo, int c_hi) {
    for (int c0 = c_lo; c0 < c_hi; c0 += 16)
        for (int k0 = 0; k0 < K; k0 += 32) {
            const int pairs = K - k0 >= 32 ? 16 : 8;
            vf r[16];
            for (int i = 0; i < 16; i++) {
                const float *w = W + (long)(c0 + i) * ldw + k0;
                const int live = c0 + i < rows;
                const __m512 lo = live ? _mm512_loadu_ps(w) : _mm512_setzero_ps();
                const __m512 hi = live && pairs == 16 ? _mm512_loadu_ps(w + 16) : _mm512_setzero_ps();
                r[i] = (__m512)_mm512_cvtne2ps_pbh(hi, lo); /* 32-bit lane e: the pair (k0 + 2e, k0 + 2e + 1) */
            }
            v_transpose(r);
            for (int e = 0; e < pairs; e++) _mm512_storeu_ps((float *)(dst + (long)(k0 / 2 + e) * N + c0), r[e]);
        }
}

/* dst[r][0:Kp] = bf16(src[r * ld + 0:Kp]) for r < rows: row-major bf16, i.e. [rows][Kp/2] pairs along k. */
AI void rows_to_bf16(const float *src, int ld, int rows, int Kp, uint16_t *dst) {
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < Kp; k += 16)
            _mm256_storeu_si256((__m256i *)(dst + (long)r * Kp + k),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + (long)r * ld + k)));
}

/* One output tile as gemm.h's `tile`, over K2 pairs: a(i, kk) = A[i * a_row + kk * a_red] (a bf16 pair),
 * B row kk holds the pairs of reduction rows 2kk, 2kk + 1 for every output column. */
AI void tile_bf16(const int mr, const int nc, int K2, const uint32_t *A, const int a_row, const int a_red,
                  const uint32_t *B, const int ldb, float *C, const int ldc, const float *E, const int lde,
                  const int epi) {
    vf acc[ACC_BUDGET];
    tile_start(mr, nc, acc, C, ldc, E, lde, epi);
    for (int kk = 0; kk < K2; kk++) {
        __m512bh b[NC_MAX];
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) b[j] = (__m512bh)_mm512_loadu_si512(B + (long)kk * ldb + j * VW);
#pragma GCC unroll 24
        for (int i = 0; i < mr; i++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[(long)i * a_row + (long)kk * a_red]);
#pragma GCC unroll 4
            for (int j = 0; j < nc; j++) acc[i * nc + j] = _mm512_dpbf16_ps(acc[i * nc + j], a, b[j]);
        }
    }
    tile_finish(mr, nc, acc, C, ldc, E, lde, epi);
}

/* tile_bf16() for a row count r known only at run time, 1 <= r < tile_mr(nc) (as gemm.h's tile_rows). */
AI void tile_bf16_rows(const int r, const int nc, int K2, const uint32_t *A, const int a_row, const int a_red,
                       const uint32_t *B, const int ldb, float *C, const int ldc, const float *E, const int lde,
                       const int epi) {
#define TILE_ROWS_CASE(n)                                                                       \
    case n:                                                                                     \
        if (n < tile_mr(nc)) tile_bf16(n, nc, K2, A, a_row, a_red, B, ldb, C, ldc, E, lde, epi); \
        break;
    switch (r) {
        TILE_ROWS_CASE(1) TILE_ROWS_CASE(2) TILE_ROWS_CASE(3) TILE_ROWS_CASE(4) TILE_ROWS_CASE(5)
        TILE_ROWS_CASE(6) TILE_ROWS_CASE(7) TILE_ROWS_CASE(8) TILE_ROWS_CASE(9) TILE_ROWS_CASE(10)
        TILE_ROWS_CASE(11)
    }
#undef TILE_ROWS_CASE
}

/* Columns [0, nc * 16) of gemm_nn_bf16 over all rows; A already packed (K2 pairs per row), B's rows ldb pairs. */
AI void gemm_nn_bf16_panel(int rows, const int nc, const int K2, const uint32_t *A, const uint32_t *B, const int ldb,
                           float *C, const int ldc, const float *E, const int lde, const int epi) {
    const int mr = tile_mr(nc);
    for (int i0 = 0; i0 < rows; i0 += mr)
        tile_bf16(mr, nc, K2, A + (long)i0 * K2, K2, 1, B, ldb, C + (long)i0 * ldc, ldc, E ? E + (long)i0 * lde : 0,
                  lde, epi);
}

/* The last nv < NC_MAX vector columns (nv may be a run-time count). */
AI void gemm_nn_bf16_rest(int rows, const int nv, const int K2, const uint32_t *A, const uint32_t *B, const int ldb,
                          float *C, const int ldc, const float *E, const int lde, const int epi) {
    switch (nv) {
    case 1: gemm_nn_bf16_panel(rows, 1, K2, A, B, ldb, C, ldc, E, lde, epi); break;
    case 2: gemm_nn_bf16_panel(rows, 2, K2, A, B, ldb, C, ldc, E, lde, epi); break;
    case 3: gemm_nn_bf16_panel(rows, 3, K2, A, B, ldb, C, ldc, E, lde, epi); break;
    }
}

/* gemm_nn with B packed by pack_pairs (K rounded up to BF_ALIGN_K, rows of ldb pairs); A is rounded into scratch
 * first (rows x round_up(K, 16) bf16; A's columns K..round_up(K, 16) must be finite, they meet zero rows of B).
 * `any_n`: N is known only at run time (panels of NC_MAX vectors), else a compile-time constant at the call
 * site (panels of tile_nc(N) vectors), as gemm.h's gemm_nn_any and gemm_nn. */
AI void gemm_nn_bf16(int rows, const int N, const int K, const float *A, const int lda, const uint32_t *B,
                     const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi,
                     uint16_t *scratch, const int any_n) {
    const int Kp = round_up(K, BF_ALIGN_K), nc = any_n ? NC_MAX : tile_nc(N), n_main = N / (nc * VW) * (nc * VW);
    rows_to_bf16(A, lda, rows, Kp, scratch);
    const uint32_t *Ap = (const uint32_t *)scratch;
    for (int j0 = 0; j0 < n_main; j0 += nc * VW)
        gemm_nn_bf16_panel(rows, nc, Kp / 2, Ap, B + j0, ldb, C + j0, ldc, E ? E + j0 : 0, lde, epi);
    if (n_main < N)
        gemm_nn_bf16_rest(rows, (N - n_main) / VW, Kp / 2, Ap, B + n_main, ldb, C + n_main, ldc, E ? E + n_main : 0,
                          lde, epi);
}

/* gemm_nn_bf16 for a run-time N, each panel of B read through a contiguous copy in `panel` (K2 rows of
 * NC_MAX * 16 pairs), as gemm.h's gemm_nn_any_panels: at N = 1024 rows of pairs are 4 KB apart and share a few
 * L1 sets. The run-time-width step's forward and input-gradient GEMMs; the same bits as gemm_nn_bf16. */
AI void gemm_nn_bf16_panels(int rows, const int N, const int K, const float *A, const int lda, const uint32_t *B,
                            const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi,
                            uint16_t *scratch, uint32_t *panel) {
    const int Kp = round_up(K, BF_ALIGN_K);
    rows_to_bf16(A, lda, rows, Kp, scratch);
    const uint32_t *Ap = (const uint32_t *)scratch;
    for (int j0 = 0; j0 < N; j0 += NC_MAX * VW) {
        const int w = N - j0 < NC_MAX * VW ? N - j0 : NC_MAX * VW;
        copy_panel(Kp / 2, w, (const float *)(B + j0), ldb, (float *)panel); /* moves the pairs' bits */
        const float *e = E ? E + j0 : 0;
        if (w == NC_MAX * VW) gemm_nn_bf16_panel(rows, NC_MAX, Kp / 2, Ap, panel, w, C + j0, ldc, e, lde, epi);
        else gemm_nn_bf16_rest(rows, w / VW, Kp / 2, Ap, panel, w, C + j0, ldc, e, lde, epi);
    }
}

/* Columns [0, nc * 16) of a packed weight gradient over all M rows (M may be a run-time count). */
AI void gemm_tn_bf16_panel(const int M, const int nc, const int P2, const uint32_t *Ap, const int Mp,
                           const uint32_t *Bp, const int N, float *C, const int ldc, const int epi) {
    const int mr = tile_mr(nc), m_main = M - M % mr;
    for (int i0 = 0; i0 < m_main; i0 += mr) {
        float *c = C + (long)i0 * ldc;
        tile_bf16(mr, nc, P2, Ap + i0, 1, Mp, Bp, N, c, ldc, c, ldc, epi);
    }
    if (M % mr) {
        float *c = C + (long)m_main * ldc;
        tile_bf16_rows(M % mr, nc, P2, Ap + m_main, 1, Mp, Bp, N, c, ldc, c, ldc, epi);
    }
}

/* gemm_tn over P packed rows (added to C for EPI_ADD): both operands are packed into pairs of rows first
 * (scratch_a: P x round_up(M, 16), scratch_b: P x N bf16, P rounded up to even with a zero row). N is a
 * compile-time constant at the call site unless `any_n` (gemm.h's gemm_tn_epi); M may be a run-time count. */
AI void gemm_tn_bf16_epi(const int M, const int N, int P, const float *A, const int lda, const float *B,
                         const int ldb, float *C, const int ldc, const int epi, uint16_t *scratch_a,
                         uint16_t *scratch_b, const int any_n) {
    const int Mp = round_up(M, 16), Pp = round_up(P, 2), nc = any_n ? NC_MAX : tile_nc(N);
    const int n_main = N / (nc * VW) * (nc * VW);
    uint32_t *Ap = (uint32_t *)scratch_a, *Bp = (uint32_t *)scratch_b;
    pack_pairs(A, lda, P, Mp, Ap, 0, Pp / 2);
    pack_pairs(B, ldb, P, N, Bp, 0, Pp / 2);
    for (int j0 = 0; j0 < n_main; j0 += nc * VW)
        gemm_tn_bf16_panel(M, nc, Pp / 2, Ap, Mp, Bp + j0, N, C + j0, ldc, epi);
    switch ((N - n_main) / VW) { /* at most NC_MAX - 1 vectors left */
    case 1: gemm_tn_bf16_panel(M, 1, Pp / 2, Ap, Mp, Bp + n_main, N, C + n_main, ldc, epi); break;
    case 2: gemm_tn_bf16_panel(M, 2, Pp / 2, Ap, Mp, Bp + n_main, N, C + n_main, ldc, epi); break;
    case 3: gemm_tn_bf16_panel(M, 3, Pp / 2, Ap, Mp, Bp + n_main, N, C + n_main, ldc, epi); break;
    }
}

/* Two row segments into the same C, as gemm.h's gemm_tn_strips (FOLD2_MR-row tiles; rows M - M % FOLD2_MR
 * on are the caller's): both segments are packed first, one after the other (the scratch holds a pass's rows
 * plus two: each segment's count is rounded up to even), then each C tile runs both segments' tiles. */
struct tn_bf16_segment {
    int P2;
    const uint32_t *Ap, *Bp;
    int epi;
};

AI void gemm_tn_bf16_fold2_panel(const int M, const int nc, const struct tn_bf16_segment *seg, const int Mp,
                                 const int N, float *C, const int ldc) {
    for (int i0 = 0; i0 + FOLD2_MR <= M; i0 += FOLD2_MR) {
        float *c = C + (long)i0 * ldc;
        for (int q = 0; q < 2; q++)
            tile_bf16(FOLD2_MR, nc, seg[q].P2, seg[q].Ap + i0, 1, Mp, seg[q].Bp, N, c, ldc, c, ldc, seg[q].epi);
    }
}

AI void gemm_tn_bf16_fold2_epi(const int M, const int N, int P0, const float *A0, const float *B0, int P1,
                               const float *A1, const float *B1, const int lda, const int ldb, float *C,
                               const int ldc, const int epi0, uint16_t *scratch_a, uint16_t *scratch_b) {
    const int Mp = round_up(M, 16), P0p = round_up(P0, 2), P1p = round_up(P1, 2);
    const int n_main = N / (NC_MAX * VW) * (NC_MAX * VW);
    uint32_t *Ap0 = (uint32_t *)scratch_a, *Bp0 = (uint32_t *)scratch_b;
    uint32_t *Ap1 = Ap0 + (long)P0p / 2 * Mp, *Bp1 = Bp0 + (long)P0p / 2 * N;
    pack_pairs(A0, lda, P0, Mp, Ap0, 0, P0p / 2);
    pack_pairs(B0, ldb, P0, N, Bp0, 0, P0p / 2);
    pack_pairs(A1, lda, P1, Mp, Ap1, 0, P1p / 2);
    pack_pairs(B1, ldb, P1, N, Bp1, 0, P1p / 2);
    for (int j0 = 0; j0 < N; j0 += NC_MAX * VW) {
        const struct tn_bf16_segment seg[2] = {{P0p / 2, Ap0, Bp0 + j0, epi0}, {P1p / 2, Ap1, Bp1 + j0, EPI_FOLD}};
        switch (j0 < n_main ? NC_MAX : (N - n_main) / VW) {
        case 1: gemm_tn_bf16_fold2_panel(M, 1, seg, Mp, N, C + j0, ldc); break;
        case 2: gemm_tn_bf16_fold2_panel(M, 2, seg, Mp, N, C + j0, ldc); break;
        case 3: gemm_tn_bf16_fold2_panel(M, 3, seg, Mp, N, C + j0, ldc); break;
        case 4: gemm_tn_bf16_fold2_panel(M, 4, seg, Mp, N, C + j0, ldc); break;
        }
    }
}

AI void gemm_tn_bf16(const int M, const int N, int P, const float *A, const int lda, const float *B, const int ldb,
                     float *C, const int ldc, const enum tn_mode mode, uint16_t *scratch_a, uint16_t *scratch_b) {
    switch (mode) {
    case TN_WRITE: gemm_tn_bf16_epi(M, N, P, A, lda, B, ldb, C, ldc, EPI_NONE, scratch_a, scratch_b, 0); break;
    case TN_CONTINUE: gemm_tn_bf16_epi(M, N, P, A, lda, B, ldb, C, ldc, EPI_ADD, scratch_a, scratch_b, 0); break;
    case TN_FOLD: gemm_tn_bf16_epi(M, N, P, A, lda, B, ldb, C, ldc, EPI_FOLD, scratch_a, scratch_b, 0); break;
    }
}

#endif /* EMG_X86_GEMM_BF16_H */
