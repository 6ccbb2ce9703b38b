/* Register-accumulator GEMMs. An MR x NC tile of the output (NC vectors of VW floats per row) stays in
 * registers for the whole reduction: per reduction step NC loads and MR broadcasts feed MR*NC FMAs.
 * All shapes except the row count are compile-time constants at every call site, so the tile loops
 * unroll fully and the accumulators live in registers. */
#ifndef EMG_X86_GEMM_H
#define EMG_X86_GEMM_H

#include "simd.h"

#define ROW_PAD 12 /* packed row counts are padded to this; every MR below divides it */

enum epilogue {
    EPI_NONE, /* C = A B */
    EPI_RELU, /* C = max(A B, 0) */
    EPI_ADD,  /* C = E + A B        (residual) */
    EPI_MASK  /* C = (E > 0) ? A B : 0  (ReLU backward, E is the ReLU output) */
};

#if VW == 16
#define NC_MAX 4
#else
#define NC_MAX 2
#endif

/* Vectors per tile row for an N-wide output (N a multiple of VW). */
AI int tile_nc(int n) {
    int nv = n / VW;
    if (NC_MAX >= 4 && nv % 4 == 0) return 4;
    if (NC_MAX >= 3 && nv % 3 == 0) return 3;
    if (nv % 2 == 0) return 2;
    return 1;
}

/* Rows per tile: the largest divisor of ROW_PAD whose accumulators fit the register budget. */
AI int tile_mr(int nc) {
    if (12 * nc <= ACC_BUDGET) return 12;
    if (6 * nc <= ACC_BUDGET) return 6;
    if (4 * nc <= ACC_BUDGET) return 4;
    return 2;
}

/* A tile's accumulators start from 0 or, for EPI_ADD, from the residual E. */
AI void tile_start(const int mr, const int nc, vf *acc, const float *E, const int lde, const int epi) {
#pragma GCC unroll 24
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) acc[i * nc + j] = epi == EPI_ADD ? v_load(E + i * lde + j * VW) : v_zero();
}

/* Apply the epilogue and store a tile's accumulators to C. */
AI void tile_finish(const int mr, const int nc, const vf *acc, float *C, const int ldc, const float *E, const int lde,
                    const int epi) {
#pragma GCC unroll 24
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            vf c = acc[i * nc + j];
            if (epi == EPI_RELU) c = v_max(c, v_zero());
            if (epi == EPI_MASK) c = v_keep_pos(c, v_load(E + i * lde + j * VW));
            v_store(C + i * ldc + j * VW, c);
        }
}

/* One output tile: C[i][0:nc*VW] = epi(sum_k a(i, k) * B[k][0:nc*VW]) for i < mr, where
 * a(i, k) = A[i * a_row + k * a_red]: (lda, 1) reads A row-major (activations x weights),
 * (1, lda) reads it transposed (weight gradients, reducing over packed rows). */
AI void tile(const int mr, const int nc, int K, const float *A, const int a_row, const int a_red, const float *B,
             const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi) {
    vf acc[ACC_BUDGET];
    tile_start(mr, nc, acc, E, lde, epi);
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

/* C[rows][N] = epi(A[rows][K] @ B[K][N]); rows a multiple of ROW_PAD. */
AI void gemm_nn(int rows, const int N, const int K, const float *A, const int lda, const float *B,
                const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi) {
    const int nc = tile_nc(N), mr = tile_mr(nc);
    for (int j0 = 0; j0 < N; j0 += nc * VW)
        for (int i0 = 0; i0 < rows; i0 += mr)
            tile(mr, nc, K, A + (long)i0 * lda, lda, 1, B + j0, ldb, C + (long)i0 * ldc + j0, ldc,
                 E ? E + (long)i0 * lde + j0 : 0, lde, epi);
}

/* Weight gradient: C[M][N] = sum_p A[p][0:M]^T B[p][0:N] over P packed rows (A, B row-major); with
 * `accumulate` the sum is added to C (tiles start from C itself: EPI_ADD with E = C). */
AI void gemm_tn_epi(const int M, const int N, int P, const float *A, const int lda, const float *B, const int ldb,
                    float *C, const int ldc, const int epi) {
    const int nc = tile_nc(N), mr = tile_mr(nc), m_main = M - M % mr;
    for (int j0 = 0; j0 < N; j0 += nc * VW) {
        for (int i0 = 0; i0 < m_main; i0 += mr) {
            float *c = C + (long)i0 * ldc + j0;
            tile(mr, nc, P, A + i0, 1, lda, B + j0, ldb, c, ldc, c, ldc, epi);
        }
        if (M % mr) {
            float *c = C + (long)m_main * ldc + j0;
            tile(M % mr, nc, P, A + m_main, 1, lda, B + j0, ldb, c, ldc, c, ldc, epi);
        }
    }
}

AI void gemm_tn(const int M, const int N, int P, const float *A, const int lda, const float *B, const int ldb,
                float *C, const int ldc, const int accumulate) {
    if (accumulate)
        gemm_tn_epi(M, N, P, A, lda, B, ldb, C, ldc, EPI_ADD);
    else
        gemm_tn_epi(M, N, P, A, lda, B, ldb, C, ldc, EPI_NONE);
}

#endif /* EMG_X86_GEMM_H */
