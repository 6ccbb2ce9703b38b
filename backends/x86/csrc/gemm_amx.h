/* bf16 GEMMs on AMX tiles (the amx_bf16 library, -DEMG_AMX on top of EMG_BF16). TDPBF16PS multiplies a
 * 16 x 32 bf16 tile of A by a 32 x 16 tile of B held as 16 rows of 16 (b[2k][j], b[2k+1][j]) pairs (the
 * pair form gemm_bf16.h's pack_pairs writes) and adds the products to a 16 x 16 fp32 tile. One instruction is
 * 8,192 multiply-adds, so every output block here is 32 x 32 (four accumulator tiles, two tiles of A and two
 * of B per reduction step of 32), written to a stack block and passed through the epilogue with AVX-512.
 * Operands are rounded to bf16 once (nearest even) as in gemm_bf16.h; the tile unit flushes bf16 subnormals
 * and sums in fp32. Each output is one chain over the reduction in steps of 32 whatever block holds it, so
 * results do not depend on how rows or columns are split between threads. Rows, columns and reductions that
 * are not multiples of the tile are padded with zeros in the participant's scratch (session.c sizes it). */
#ifndef EMG_X86_GEMM_AMX_H
#define EMG_X86_GEMM_AMX_H

#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gemm_bf16.h"

#if !defined(__AMX_TILE__) || !defined(__AMX_BF16__)
#error "gemm_amx.h needs AMX-TILE and AMX-BF16 (-mamx-tile -mamx-bf16)"
#endif

#define AMX_K 32     /* bf16 reduction steps per tile product: a tile row is 64 bytes */
#define AMX_BLOCK 32 /* rows and columns of an output block: 2 x 2 accumulator tiles */

/* LDTILECFG's 64-byte operand, palette 1: tiles 0-3 accumulate a block of C (0 1 / 2 3), 4-5 hold A's two
 * 16-row tiles, 6-7 B's two 16-column tiles; all eight are 16 rows of 64 bytes. */
struct amx_tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Linux hands out AMX tile data (8 KB per thread) to a process on request (arch_prctl ARCH_REQ_XCOMP_PERM); a
 * tile instruction before that faults. Granted once, it holds for every thread. Returns 1 when granted. */
AI int amx_request(void) {
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* Tile configuration is per thread and the other tile state costs a context switch 8 KB: each GEMM loads the
 * configuration on entry and releases the tiles on exit. */
AI void amx_begin(void) {
    struct amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
}

AI void amx_end(void) { _tile_release(); }

/* blk[32][32] = A B over kc steps of 32: A's 32 rows of bf16 (a_stride bytes apart), B's rows of pairs
 * (b_stride bytes apart, 16 pair rows per step). nb = 2 column tiles, or 1 (blk's columns 16-31 unwritten). */
AI void amx_block(const int kc, const uint16_t *A, const long a_stride, const uint32_t *B, const long b_stride,
                  float *blk, const int nb) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < kc; k++) {
        const char *a = (const char *)(A + (long)k * AMX_K), *b = (const char *)B + (long)k * 16 * b_stride;
        _tile_loadd(4, a, a_stride);
        _tile_loadd(5, a + 16 * a_stride, a_stride);
        _tile_loadd(6, b, b_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if (nb == 2) {
            _tile_loadd(7, b + 64, b_stride);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, blk, AMX_BLOCK * 4);
    _tile_stored(2, blk + 16 * AMX_BLOCK, AMX_BLOCK * 4);
    if (nb == 2) {
        _tile_stored(1, blk + 16, AMX_BLOCK * 4);
        _tile_stored(3, blk + 16 * AMX_BLOCK + 16, AMX_BLOCK * 4);
    }
}

/* C[i][0:16 nv] = epi(blk[i]) for i < r, as gemm.h's epilogues with the product summed from zero first: EPI_ADD
 * adds E after the sum (the fp32 kernels start from it), EPI_CONT_* continue from C the same way. */
AI void amx_finish(const float *blk, const int r, const int nv, float *C, const int ldc, const float *E,
                   const int lde, const int epi) {
    for (int i = 0; i < r; i++)
        for (int j = 0; j < nv; j++) {
            vf c = v_load(blk + i * AMX_BLOCK + j * VW);
            float *out = C + (long)i * ldc + j * VW;
            const float *e = E ? E + (long)i * lde + j * VW : 0;
            switch (epi) {
            case EPI_RELU: c = v_max(c, v_zero()); break;
            case EPI_ADD:
            case EPI_FOLD: c = v_add(v_load(e), c); break;
            case EPI_MASK: c = v_keep_pos(c, v_load(e)); break;
            case EPI_CONT_RELU: c = v_max(v_add(v_load(out), c), v_zero()); break;
            case EPI_CONT_MASK: c = v_keep_pos(v_add(v_load(out), c), v_load(e)); break;
            default: break;
            }
            v_store(out, c);
        }
}

/* dst[r][0:Kq] = bf16(src[r * ld + 0:Kp]) for r < rows, zero in columns Kp..Kq-1 and rows rows..rows_q-1. */
AI void amx_rows_to_bf16(const float *src, const int ld, const int rows, const int Kp, const int Kq, const int rows_q,
                         uint16_t *dst) {
    for (int r = 0; r < rows_q; r++)
        for (int k = 0; k < Kq; k += 16) {
            const __m512 x = r < rows && k < Kp ? _mm512_loadu_ps(src + (long)r * ld + k) : _mm512_setzero_ps();
            _mm256_storeu_si256((__m256i *)(dst + (long)r * Kq + k), (__m256i)_mm512_cvtneps_pbh(x));
        }
}

/* C[rows][N] = epi(A[rows][K] B), B packed by pack_pairs ([round_up(K, BF_ALIGN_K) / 2][ldb] pairs), N a
 * multiple of 16, as gemm_bf16.h's gemm_nn_bf16_panels: B is read through contiguous copies of 64-column panels
 * in `panel` (padded with zero pair rows to the tile's reduction step), A through its bf16 rows in `scratch`.
 * A's columns K..round_up(K, 16) must be finite, they meet zero rows of B. */
AI void gemm_nn_amx(const int rows, const int N, const int K, const float *A, const int lda, const uint32_t *B,
                    const int ldb, float *C, const int ldc, const float *E, const int lde, const int epi,
                    uint16_t *scratch, uint32_t *panel) {
    const int Kp = round_up(K, BF_ALIGN_K), Kq = round_up(K, AMX_K), rows_q = round_up(rows, AMX_BLOCK);
    float blk[AMX_BLOCK * AMX_BLOCK] __attribute__((aligned(64)));
    amx_rows_to_bf16(A, lda, rows, Kp, Kq, rows_q, scratch);
    amx_begin();
    for (int j0 = 0; j0 < N; j0 += NC_MAX * VW) {
        const int w = N - j0 < NC_MAX * VW ? N - j0 : NC_MAX * VW;
        copy_panel(Kp / 2, w, (const float *)(B + j0), ldb, (float *)panel); /* moves the pairs' bits */
        memset(panel + (long)Kp / 2 * w, 0, (size_t)(Kq - Kp) / 2 * w * sizeof *panel);
        for (int i0 = 0; i0 < rows_q; i0 += AMX_BLOCK) {
            const int r = rows - i0 < AMX_BLOCK ? rows - i0 : AMX_BLOCK;
            for (int t0 = 0; t0 < w; t0 += AMX_BLOCK) {
                const int nb = w - t0 >= AMX_BLOCK ? 2 : 1;
                amx_block(Kq / AMX_K, scratch + (long)i0 * Kq, 2L * Kq, panel + t0, 4L * w, blk, nb);
                amx_finish(blk, r, nb, C + (long)i0 * ldc + j0 + t0, ldc, E ? E + (long)i0 * lde + j0 + t0 : 0,
                           lde, epi);
            }
        }
    }
    amx_end();
}

/* The pair rows of A^T for a weight gradient: dst[m][kk] = (bf16(A[2kk][m]), bf16(A[2kk + 1][m])) for m < Mq,
 * kk < Pq / 2 (a multiple of 16), zero where m >= M or the row is >= P. Rows of pairs are built as pack_pairs
 * does and transposed in 16 x 16 blocks of 32-bit lanes. */
AI void amx_pack_t(const float *A, const int lda, const int P, const int M, const int Pq, const int Mq,
                   uint32_t *dst) {
    for (int m0 = 0; m0 < Mq; m0 += 16) {
        const __mmask16 live = M - m0 >= 16 ? 0xFFFF : M - m0 > 0 ? (__mmask16)((1u << (M - m0)) - 1) : 0;
        for (int kk0 = 0; kk0 < Pq / 2; kk0 += 16) {
            vf r[16];
            for (int e = 0; e < 16; e++) {
                const int p = 2 * (kk0 + e);
                const __m512 r0 = p < P ? _mm512_maskz_loadu_ps(live, A + (long)p * lda + m0) : _mm512_setzero_ps();
                const __m512 r1 =
                    p + 1 < P ? _mm512_maskz_loadu_ps(live, A + (long)(p + 1) * lda + m0) : _mm512_setzero_ps();
                r[e] = (__m512)pair_lanes(r0, r1);
            }
            v_transpose(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_ps((float *)(dst + (long)(m0 + i) * (Pq / 2) + kk0), r[i]);
        }
    }
}

/* B's pair rows in panels of 32 columns (the last one 16 when N is an odd number of 16s): the panel at column
 * n0 is pack_pairs' form of its columns at dst + n0 * Pq / 2, Pq / 2 rows; rows >= P are zero. */
AI void amx_pack_panels(const float *B, const int ldb, const int P, const int N, const int Pq, uint32_t *dst) {
    for (int n0 = 0; n0 < N; n0 += AMX_BLOCK)
        pack_pairs(B + n0, ldb, P, N - n0 >= AMX_BLOCK ? AMX_BLOCK : 16, dst + (long)n0 * (Pq / 2), 0, Pq / 2);
}

/* One segment of a weight gradient: rows of A and B packed for the tiles (amx_pack_t, amx_pack_panels). */
struct tn_amx_segment {
    int Pq;
    const uint32_t *At, *Bq;
};

/* Pack segment rows [0, P) of A (M columns) and B (N columns) at At and Bq; returns the segment. */
AI struct tn_amx_segment amx_pack_segment(const int M, const int N, const int P, const float *A, const int lda,
                                          const float *B, const int ldb, uint32_t *At, uint32_t *Bq) {
    const int Pq = round_up(P, AMX_K);
    amx_pack_t(A, lda, P, M, Pq, round_up(M, AMX_BLOCK), At);
    amx_pack_panels(B, ldb, P, N, Pq, Bq);
    return (struct tn_amx_segment){Pq, At, Bq};
}

/* A weight gradient over one or two segments of rows (n_seg): C[M][N] epi0= the first segment's
 * sum_p A[p][m] B[p][n] (EPI_NONE writes, EPI_ADD / EPI_FOLD add it to C), then the second's sum folded in
 * (EPI_FOLD), in one pass over C: each block of C takes both segments' tile products before it is stored, the
 * same floats as two calls. N a multiple of 16. scratch_a holds A^T's pairs (round_up(M, 32) x round_up(P, 32)
 * bf16 per segment), scratch_b B's panels (round_up(P, 32) x N bf16 per segment). */
AI void gemm_tn_amx(const int M, const int N, const int n_seg, const int P0, const float *A0, const float *B0,
                    const int P1, const float *A1, const float *B1, const int lda, const int ldb, float *C,
                    const int ldc, const int epi0, uint16_t *scratch_a, uint16_t *scratch_b) {
    const int Mq = round_up(M, AMX_BLOCK);
    float blk[2][AMX_BLOCK * AMX_BLOCK] __attribute__((aligned(64)));
    uint32_t *at = (uint32_t *)scratch_a, *bq = (uint32_t *)scratch_b;
    struct tn_amx_segment seg[2];
    seg[0] = amx_pack_segment(M, N, P0, A0, lda, B0, ldb, at, bq);
    if (n_seg == 2) /* packed after the first */
        seg[1] = amx_pack_segment(M, N, P1, A1, lda, B1, ldb, at + (long)Mq * (seg[0].Pq / 2),
                                  bq + (long)N * (seg[0].Pq / 2));
    amx_begin();
    for (int j0 = 0; j0 < N; j0 += AMX_BLOCK) {
        const int nb = N - j0 >= AMX_BLOCK ? 2 : 1;
        for (int i0 = 0; i0 < Mq; i0 += AMX_BLOCK) {
            const int r = M - i0 < AMX_BLOCK ? M - i0 : AMX_BLOCK;
            for (int q = 0; q < n_seg; q++)
                amx_block(seg[q].Pq / AMX_K, (const uint16_t *)(seg[q].At + (long)i0 * (seg[q].Pq / 2)),
                          2L * seg[q].Pq, seg[q].Bq + (long)j0 * (seg[q].Pq / 2), 64L * nb, blk[q], nb);
            float *c = C + (long)i0 * ldc + j0;
            amx_finish(blk[0], r, nb, c, ldc, c, ldc, epi0);
            if (n_seg == 2) amx_finish(blk[1], r, nb, c, ldc, c, ldc, EPI_FOLD);
        }
    }
    amx_end();
}

#endif /* EMG_X86_GEMM_AMX_H */
