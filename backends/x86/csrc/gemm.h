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

/* The run-time-width step's reduction blocks (gemm_nn_wide, step_impl.h) and the panel copy one block needs. */
#define WIDE_K_BLOCK 512
#define WIDE_PANEL_FLOATS (WIDE_K_BLOCK * NC_MAX * VW)

/* Columns [j0, j0 + w) of B[0:K] copied into a contiguous panel [K][w] (w a multiple of VW). */
AI void copy_panel(const int K, const int w, const float *B, const int ldb, float *panel) {
    for (int k = 0; k < K; k++)
        for (int j = 0; j < w; j += VW) v_store(panel + (long)k * w + j, v_load(B + (long)k * ldb + j));
}

/* gemm_nn_any with each panel of B read through a contiguous copy in `panel` (K x NC_MAX * VW floats). A row
 * tile streams its panel of B once per reduction; rows of B 4 KB apart (N = 1024 or 4096) all fall in the
 * same few L1 sets, so read in place a panel is refilled from L2 at every step, and on an Intel Xeon
 * (AVX-512 with two 512-bit FMAs) such GEMMs ran at a third of the rate of the same panel copied. The copy
 * holds the same values: every output is the same chain of FMAs. */
AI void gemm_nn_any_panels(int rows, const int N, const int K, const float *A, const int lda, const float *B,
                           const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi,
                           float *panel) {
    for (int j0 = 0; j0 < N; j0 += NC_MAX * VW) {
        const int w = N - j0 < NC_MAX * VW ? N - j0 : NC_MAX * VW;
        copy_panel(K, w, B + j0, ldb, panel);
        const float *e = E ? E + j0 : 0;
        if (w == NC_MAX * VW) gemm_nn_panel(rows, NC_MAX, K, A, lda, panel, w, C + j0, ldc, e, lde, epi);
        else gemm_nn_rest(rows, w / VW, K, A, lda, panel, w, C + j0, ldc, e, lde, epi);
    }
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

/* Weight gradients over two row segments into the same C, tile by tile (gemm_tn_strips here,
 * gemm_tn_bf16_fold2_epi in gemm_bf16.h): each C tile runs the first segment's tile (its own epilogue) and then
 * the second's, folded in (EPI_FOLD), while it sits in L1. Two gemm_tn_epi calls streamed the whole of C twice,
 * which a wide weight gradient (16 MB per matrix at d1024) pays from memory. The same tile operations in the
 * same order per element: the same bits as the two calls. For build time (the run-time-width step is compiled
 * once per library, and again under the sanitizers) every panel takes FOLD2_MR-row tiles with run-time
 * epilogues, so each tile shape is compiled once. N is known only at run time. */
#define FOLD2_MR 6 /* 6 x NC_MAX accumulators fit both register budgets */

/* Weight gradients of the run-time-width step (gemm_tn_wide, step_impl.h) read both operands through copies
 * laid out for the tiles: A's columns in strips of FOLD2_MR, [strip][p][FOLD2_MR] (the last strip padded with
 * zeros), and each panel of B as gemm_nn_any_panels reads it. In place, a tile's A (a few floats per row p)
 * and B panel are rows lda and ldb floats apart, at these widths 4-16 KB, all in the same few L1 sets; on an
 * Intel Xeon both copies made such gradients 2-3 times faster. Same values, same FMA order: the same bits. */
struct tn_wide_segment {
    int P;
    const float *A, *B; /* P rows each, lda and ldb apart */
    int epi;
    float *strips, *panel; /* its copies: round_up(M, FOLD2_MR) * P and NC_MAX * VW * P floats */
};

AI void copy_strips(const int M, const int P, const float *A, const int lda, float *strips) {
    for (int m0 = 0; m0 < M; m0 += FOLD2_MR) {
        float *dst = strips + (long)m0 * P;
        const int w = M - m0 < FOLD2_MR ? M - m0 : FOLD2_MR;
        for (int p = 0; p < P; p++)
            for (int i = 0; i < FOLD2_MR; i++) dst[p * FOLD2_MR + i] = i < w ? A[(long)p * lda + m0 + i] : 0.0f;
    }
}

/* One panel of nc vectors: each C tile runs every segment's tile in turn. */
AI void gemm_tn_strips_panel(const int M, const int nc, const int n_seg, const struct tn_wide_segment *seg,
                             float *C, const int ldc) {
    for (int m0 = 0; m0 < M; m0 += FOLD2_MR) {
        float *c = C + (long)m0 * ldc;
        for (int q = 0; q < n_seg; q++) {
            const float *a = seg[q].strips + (long)m0 * seg[q].P;
            if (M - m0 >= FOLD2_MR)
                tile(FOLD2_MR, nc, seg[q].P, a, 1, FOLD2_MR, seg[q].panel, nc * VW, c, ldc, c, ldc, seg[q].epi);
            else
                tile_rows(M - m0, nc, seg[q].P, a, 1, FOLD2_MR, seg[q].panel, nc * VW, c, ldc, c, ldc, seg[q].epi);
        }
    }
}

/* C[M][N] (epi per segment) += sum over the segments' rows of A^T B; N known only at run time. */
AI void gemm_tn_strips(const int M, const int N, const int n_seg, struct tn_wide_segment *seg, const int lda,
                       const int ldb, float *C, const int ldc) {
    for (int q = 0; q < n_seg; q++) copy_strips(M, seg[q].P, seg[q].A, lda, seg[q].strips);
    for (int j0 = 0; j0 < N; j0 += NC_MAX * VW) {
        const int w = N - j0 < NC_MAX * VW ? N - j0 : NC_MAX * VW;
        for (int q = 0; q < n_seg; q++) copy_panel(seg[q].P, w, seg[q].B + j0, ldb, seg[q].panel);
        switch (w / VW) {
        case 1: gemm_tn_strips_panel(M, 1, n_seg, seg, C + j0, ldc); break;
        case 2: gemm_tn_strips_panel(M, 2, n_seg, seg, C + j0, ldc); break;
        case 3: if (NC_MAX > 3) gemm_tn_strips_panel(M, 3, n_seg, seg, C + j0, ldc); break;
        case 4: if (NC_MAX > 3) gemm_tn_strips_panel(M, 4, n_seg, seg, C + j0, ldc); break;
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
