/* Register-accumulator GEMMs. An MR x NC tile of the output (NC vectors of VW floats per row) stays in
 * registers for the whole reduction: per reduction step NC loads and MR broadcasts feed MR*NC FMAs.
 * Every tile's MR and NC are compile-time constants, so the tile loops unroll fully and the accumulators live
 * in registers. Output widths and row counts known only at run time (the vocabulary) go through a switch to
 * one compiled tile per count (gemm_nn_any, tile_rows). Each output element is the same chain of FMAs over
 * the reduction whatever tile holds it, so the tile shapes never change a result. */
#ifndef EMG_X86_GEMM_H
#define EMG_X86_GEMM_H

#include "simd.h"

#define ROW_PAD 12 /* packed row counts are padded to this; every MR below divides it */

AI int round_up(int x, int m) { return (x + m - 1) / m * m; }

enum epilogue {
    EPI_NONE, /* C = A B */
    EPI_RELU, /* C = max(A B, 0) */
    EPI_ADD,  /* C = E + A B        (residual) */
    EPI_MASK, /* C = (E > 0) ? A B : 0  (ReLU backward, E is the ReLU output) */
    EPI_FOLD, /* C = E + (A B)       (the sum from zero, then one add: a gradient folded into an earlier one) */
    /* The last block of a reduction split into blocks (gemm_nn_wide): the sum continues from C, then */
    EPI_CONT_RELU, /* C = max(C + A B, 0) */
    EPI_CONT_MASK  /* C = (E > 0) ? C + A B : 0 */
};

/* How a weight-gradient GEMM (gemm_tn) treats C: write it, continue its sum (the next rows of one chain of
 * FMAs), or fold a new sum into it (C + sum, the same float add as a separate sum added afterwards). */
enum tn_mode { TN_WRITE, TN_CONTINUE, TN_FOLD };

#if VW == 16
#define NC_MAX 4
#else
#define NC_MAX 2
#endif

/* Vectors per tile row for an N-wide output (N a multiple of VW): the widest of 4, 3, 2 that divides N / VW;
 * for other counts above NC_MAX (5, 7, 11, ... vectors) NC_MAX, with the rest in one narrower panel. */
AI int tile_nc(int n) {
    int nv = n / VW;
    if (NC_MAX >= 4 && nv % 4 == 0) return 4;
    if (NC_MAX >= 3 && nv % 3 == 0) return 3;
    if (nv % 2 == 0) return 2;
    if (nv > NC_MAX) return NC_MAX;
    return 1;
}

/* Rows per tile: the largest divisor of ROW_PAD whose accumulators fit the register budget. */
AI int tile_mr(int nc) {
    if (12 * nc <= ACC_BUDGET) return 12;
    if (6 * nc <= ACC_BUDGET) return 6;
    if (4 * nc <= ACC_BUDGET) return 4;
    return 2;
}

/* A tile's accumulators start from 0, for EPI_ADD from the residual E, for EPI_CONT_* from C. */
AI void tile_start(const int mr, const int nc, vf *acc, const float *C, const int ldc, const float *E, const int lde,
                   const int epi) {
#pragma GCC unroll 24
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++)
            acc[i * nc + j] = epi == EPI_ADD                               ? v_load(E + i * lde + j * VW)
                              : epi == EPI_CONT_RELU || epi == EPI_CONT_MASK ? v_load(C + i * ldc + j * VW)
                                                                             : v_zero();
}

/* Apply the epilogue and store a tile's accumulators to C. */
AI void tile_finish(const int mr, const int nc, const vf *acc, float *C, const int ldc, const float *E, const int lde,
                    const int epi) {
#pragma GCC unroll 24
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            vf c = acc[i * nc + j];
            if (epi == EPI_RELU || epi == EPI_CONT_RELU) c = v_max(c, v_zero());
            if (epi == EPI_MASK || epi == EPI_CONT_MASK) c = v_keep_pos(c, v_load(E + i * lde + j * VW));
            if (epi == EPI_FOLD) c = v_add(v_load(E + i * lde + j * VW), c);
            v_store(C + i * ldc + j * VW, c);
        }
}

/* One output tile: C[i][0:nc*VW] = epi(sum_k a(i, k) * B[k][0:nc*VW]) for i < mr, where
 * a(i, k) = A[i * a_row + k * a_red]: (lda, 1) reads A row-major (activations x weights),
 * (1, lda) reads it transposed (weight gradients, reducing over packed rows). */
AI void tile(const int mr, const int nc, int K, const float *A, const int a_row, const int a_red, const float *B,
             const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi) {
    vf acc[ACC_BUDGET];
    tile_start(mr, nc, acc, C, ldc, E, lde, epi);
    for (int k = 0; k < K; k++) {
        vf b[NC_MAX];
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) b[j] = v_load(B + (long)k * ldb + j * VW);
#pragma GCC unroll 24
        for (int i = 0; i < mr; i++) {
            vf a = v_set1(A[(long)i * a_row + (long)k * a_red]);
#pragma GCC unroll 4
            for (int j = 0; j < nc; j++) acc[i * nc + j] = v_fma(a, b[j], acc[i * nc + j]);
        }
    }
    tile_finish(mr, nc, acc, C, ldc, E, lde, epi);
}

/* tile() for a row count r known only at run time, 1 <= r < tile_mr(nc): one compiled tile per count. */
AI void tile_rows(const int r, const int nc, int K, const float *A, const int a_row, const int a_red, const float *B,
                  const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi) {
#define TILE_ROWS_CASE(n)                                                                  \
    case n:                                                                                \
        if (n < tile_mr(nc)) tile(n, nc, K, A, a_row, a_red, B, ldb, C, ldc, E, lde, epi); \
        break;
    switch (r) {
        TILE_ROWS_CASE(1) TILE_ROWS_CASE(2) TILE_ROWS_CASE(3) TILE_ROWS_CASE(4) TILE_ROWS_CASE(5)
        TILE_ROWS_CASE(6) TILE_ROWS_CASE(7) TILE_ROWS_CASE(8) TILE_ROWS_CASE(9) TILE_ROWS_CASE(10)
        TILE_ROWS_CASE(11)
    }
#undef TILE_ROWS_CASE
}

/* Columns [0, nc * VW) of C = epi(A B) over rows (a multiple of ROW_PAD). */
AI void gemm_nn_panel(int rows, const int nc, const int K, const float *A, const int lda, const float *B,
                      const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi) {
    const int mr = tile_mr(nc);
    for (int i0 = 0; i0 < rows; i0 += mr)
        tile(mr, nc, K, A + (long)i0 * lda, lda, 1, B, ldb, C + (long)i0 * ldc, ldc, E ? E + (long)i0 * lde : 0, lde,
             epi);
}

/* The last nv < NC_MAX vector columns (nv may be a run-time count). */
AI void gemm_nn_rest(int rows, const int nv, const int K, const float *A, const int lda, const float *B,
                     const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi) {
    switch (nv) {
    case 1: gemm_nn_panel(rows, 1, K, A, lda, B, ldb, C, ldc, E, lde, epi); break;
    case 2: if (NC_MAX > 2) gemm_nn_panel(rows, 2, K, A, lda, B, ldb, C, ldc, E, lde, epi); break;
    case 3: if (NC_MAX > 3) gemm_nn_panel(rows, 3, K, A, lda, B, ldb, C, ldc, E, lde, epi); break;
    }
}

/* C[rows][N] = epi(A[rows][K] @ B[K][N]); rows a multiple of ROW_PAD, N a multiple of VW and a compile-time
 * constant at the call site (panels of tile_nc(N) vectors). */
AI void gemm_nn(int rows, const int N, const int K, const float *A, const int lda, const float *B,
                const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi) {
    const int nc = tile_nc(N), n_main = N / (nc * VW) * (nc * VW);
    for (int j0 = 0; j0 < n_main; j0 += nc * VW)
        gemm_nn_panel(rows, nc, K, A, lda, B + j0, ldb, C + j0, ldc, E ? E + j0 : 0, lde, epi);
    if (n_main < N)
        gemm_nn_rest(rows, (N - n_main) / VW, K, A, lda, B + n_main, ldb, C + n_main, ldc, E ? E + n_main : 0, lde,
                     epi);
}

/* gemm_nn for an N known only at run time (the padded vocabulary): panels of NC_MAX vectors, then the rest. */
AI void gemm_nn_any(int rows, const int N, const int K, const float *A, const int lda, const float *B,
                    const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi) {
    const int n_main = N / (NC_MAX * VW) * (NC_MAX * VW);
    for (int j0 = 0; j0 < n_main; j0 += NC_MAX * VW)
        gemm_nn_panel(rows, NC_MAX, K, A, lda, B + j0, ldb, C + j0, ldc, E ? E + j0 : 0, lde, epi);
    if (n_main < N)
        gemm_nn_rest(rows, (N - n_main) / VW, K, A, lda, B + n_main, ldb, C + n_main, ldc, E ? E + n_main : 0, lde,
                     epi);
}

/* Columns [0, nc * VW) of a weight gradient over all M rows (M may be a run-time count). */
AI void gemm_tn_panel(const int M, const int nc, int P, const float *A, const int lda, const float *B, const int ldb,
                      float *C, const int ldc, const int epi) {
    const int mr = tile_mr(nc), m_main = M - M % mr;
    for (int i0 = 0; i0 < m_main; i0 += mr) {
        float *c = C + (long)i0 * ldc;
        tile(mr, nc, P, A + i0, 1, lda, B, ldb, c, ldc, c, ldc, epi);
    }
    if (M % mr) {
        float *c = C + (long)m_main * ldc;
        tile_rows(M % mr, nc, P, A + m_main, 1, lda, B, ldb, c, ldc, c, ldc, epi);
    }
}

/* Weight gradient: C[M][N] = sum_p A[p][0:M]^T B[p][0:N] over P packed rows (A, B row-major); with
 * EPI_ADD the sum continues from C (tiles start from C itself), with EPI_FOLD it starts from zero and is
 * added to C at the end. `any_n`: N is known only at run time (panels of NC_MAX vectors), else a
 * compile-time constant at the call site (panels of tile_nc(N) vectors), as gemm_nn_any and gemm_nn. */
AI void gemm_tn_epi(const int M, const int N, int P, const float *A, const int lda, const float *B, const int ldb,
                    float *C, const int ldc, const int epi, const int any_n) {
    const int nc = any_n ? NC_MAX : tile_nc(N), n_main = N / (nc * VW) * (nc * VW);
    for (int j0 = 0; j0 < n_main; j0 += nc * VW) gemm_tn_panel(M, nc, P, A, lda, B + j0, ldb, C + j0, ldc, epi);
    switch ((N - n_main) / VW) { /* at most NC_MAX - 1 vectors left */
    case 1: gemm_tn_panel(M, 1, P, A, lda, B + n_main, ldb, C + n_main, ldc, epi); break;
    case 2: if (NC_MAX > 2) gemm_tn_panel(M, 2, P, A, lda, B + n_main, ldb, C + n_main, ldc, epi); break;
    case 3: if (NC_MAX > 3) gemm_tn_panel(M, 3, P, A, lda, B + n_main, ldb, C + n_main, ldc, epi); break;
    }
}

/* gemm_tn_epi for two row segments into the same C, tile by tile: each C tile runs the first segment's tile
 * (epilogue epi0) and then the second's, folded in (EPI_FOLD), while it sits in L1. Two gemm_tn_epi calls
 * streamed the whole of C twice, which a wide weight gradient (16 MB per matrix at d1024) pays from memory.
 * The same tile operations in the same order per element: the same bits as the two calls. For build time (the
 * run-time-width step is compiled once per library, and again under the sanitizers) every panel takes
 * FOLD2_MR-row tiles with run-time epilogues, so each tile shape is compiled once, and rows M - M % FOLD2_MR
 * on are left to the caller (two gemm_tn_epi calls: a few rows). N is known only at run time. */
#define FOLD2_MR 6 /* 6 x NC_MAX accumulators fit both register budgets */
struct tn_segment {
    int P;
    const float *A, *B;
    int epi;
};

AI void gemm_tn_fold2_panel(const int M, const int nc, const struct tn_segment *seg, const int lda, const int ldb,
                            float *C, const int ldc) {
    for (int i0 = 0; i0 + FOLD2_MR <= M; i0 += FOLD2_MR) {
        float *c = C + (long)i0 * ldc;
        for (int q = 0; q < 2; q++)
            tile(FOLD2_MR, nc, seg[q].P, seg[q].A + i0, 1, lda, seg[q].B, ldb, c, ldc, c, ldc, seg[q].epi);
    }
}

AI void gemm_tn_fold2_epi(const int M, const int N, int P0, const float *A0, const float *B0, int P1,
                          const float *A1, const float *B1, const int lda, const int ldb, float *C, const int ldc,
                          const int epi0) {
    const int n_main = N / (NC_MAX * VW) * (NC_MAX * VW);
    for (int j0 = 0; j0 < N; j0 += NC_MAX * VW) {
        const struct tn_segment seg[2] = {{P0, A0, B0 + j0, epi0}, {P1, A1, B1 + j0, EPI_FOLD}};
        switch (j0 < n_main ? NC_MAX : (N - n_main) / VW) {
        case 1: gemm_tn_fold2_panel(M, 1, seg, lda, ldb, C + j0, ldc); break;
        case 2: gemm_tn_fold2_panel(M, 2, seg, lda, ldb, C + j0, ldc); break;
        case 3: if (NC_MAX > 3) gemm_tn_fold2_panel(M, 3, seg, lda, ldb, C + j0, ldc); break;
        case 4: if (NC_MAX > 3) gemm_tn_fold2_panel(M, 4, seg, lda, ldb, C + j0, ldc); break;
        }
    }
}

/* The epilogue that gives a weight gradient's tn_mode. */
AI int tn_epi(const enum tn_mode mode) { return mode == TN_WRITE ? EPI_NONE : mode == TN_CONTINUE ? EPI_ADD : EPI_FOLD; }

AI void gemm_tn(const int M, const int N, int P, const float *A, const int lda, const float *B, const int ldb,
                float *C, const int ldc, const enum tn_mode mode) {
    switch (mode) {
    case TN_WRITE: gemm_tn_epi(M, N, P, A, lda, B, ldb, C, ldc, EPI_NONE, 0); break;
    case TN_CONTINUE: gemm_tn_epi(M, N, P, A, lda, B, ldb, C, ldc, EPI_ADD, 0); break;
    case TN_FOLD: gemm_tn_epi(M, N, P, A, lda, B, ldb, C, ldc, EPI_FOLD, 0); break;
    }
}

#endif /* EMG_X86_GEMM_H */
