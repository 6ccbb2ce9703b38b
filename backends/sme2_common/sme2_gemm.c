/*
 * The FMOPA engine: the only translation unit built with SME flags, and the only code that runs in
 * streaming mode. Vector-length agnostic: tile sides come from svcntsw()/svcntsh(), every load and
 * store is predicated, so the same code is correct at any streaming vector length (tested at 256 and
 * 512 bits). Rows beyond M/N (the last partial strip of packed positions) are masked, never padded.
 * Three builds (sme2_internal.h): fp32, fp16 with fp16 accumulation, fp16 with fp32 accumulation
 * (EMG_SME_F16_WIDEN).
 */
#include <arm_sme.h>

#include "sme2_internal.h"

/* Store one ZA row or column (already widened to fp32) into C or Ct with the epilogue fused in: scale,
 * accumulate, ReLU, ReLU-backward gate. This is the "readout with the neighbouring elementwise op"
 * pattern: the vector is in a register anyway, so the residual add, the clamp and the mask cost no extra
 * pass over memory. `last` is 0 while more fp16 chunks are still to be added (the gate and clamp wait for
 * the full sum). Always inlined: an outlined call from a ZA-using function needs a lazy ZA save, and
 * clang 19 (Apple clang 17) for Darwin crashes on it; never leave that to the optimiser (a64lane darwin stage). */
static inline __attribute__((always_inline)) void put_vec(const emg_gemm *g, float *out, const float *gate,
                                                          long ld, int row, int col, svbool_t pc, svfloat32_t v,
                                                          int add, int last) __arm_streaming {
    const long at = (long)row * ld + col;
    float *c = out + at;
    v = svmul_n_f32_x(pc, v, g->alpha);
    if (add) v = svadd_f32_x(pc, v, svld1_f32(pc, c));
    if (last && (g->flags & GEMM_RELU)) v = svmax_n_f32_x(pc, v, 0.0f);
    if (last && (g->flags & GEMM_GATE)) {
        const svbool_t open = svcmpgt_n_f32(pc, svld1_f32(pc, gate + at), 0.0f);
        v = svsel_f32(open, v, svdup_n_f32(0.0f));
    }
    svst1_f32(pc, c, v);
}

/* The contraction range [lo, hi) of the register block with rows i0..i0 + bm - 1 and columns j0..j0 + bn - 1:
 * all of K, or what g->causal leaves of it (the terms outside are exact zeros). */
typedef struct {
    int lo, hi;
} k_span;
static inline __attribute__((always_inline)) k_span contraction(const emg_gemm *g, int i0, int bm, int j0,
                                                                int bn) __arm_streaming_compatible {
    k_span r = {0, g->K};
    if (g->causal == CAUSAL_K_TO_N && j0 + bn < r.hi) r.hi = j0 + bn;
    if (g->causal == CAUSAL_K_TO_M && i0 + bm < r.hi) r.hi = i0 + bm;
    if (g->causal == CAUSAL_K_FROM_M) r.lo = i0 < r.hi ? i0 : r.hi;
    return r;
}

/* CAUSAL_UPPER: the block (rows from i0, bn columns from j0) holds no wanted element (i <= j). */
static inline __attribute__((always_inline)) int below_diagonal(const emg_gemm *g, int i0, int j0,
                                                                int bn) __arm_streaming_compatible {
    return g->causal == CAUSAL_UPPER && i0 >= j0 + bn;
}

#define put_row(g, row, col, pc, v, add, last) put_vec(g, (g)->C, (g)->gate, (g)->ldc, row, col, pc, v, add, last)
/* Column j of the result, rows i.. (a vertical ZA slice), into Ct's row j. */
#define put_col(g, j, i, pc, v, add, last) put_vec(g, (g)->Ct, (g)->gate_t, (g)->ldct, j, i, pc, v, add, last)

#if !EMG_SME_F16 || EMG_SME_F16_WIDEN

/* Read a za32 tile out four rows per instruction (SME2 multi-vector MOVA, VG4); with Ct, four columns
 * per instruction too (vertical slices: the layout chaining through ZA that hands the next GEMM its
 * transposed operand without a transpose pass). */
#define READ_TILE32(tile, r0, c0)                                                              \
    do {                                                                                       \
        const int r0_ = (r0), c0_ = (c0);                                                      \
        const svbool_t pc_ = svwhilelt_b32(c0_, g->N);                                         \
        for (int s_ = 0; s_ < T && r0_ + s_ < g->M; s_ += 4) {                                 \
            svfloat32x4_t q_ = svread_hor_za32_f32_vg4(tile, s_);                              \
            put_row(g, r0_ + s_, c0_, pc_, svget4(q_, 0), add, 1);                          \
            if (r0_ + s_ + 1 < g->M) put_row(g, r0_ + s_ + 1, c0_, pc_, svget4(q_, 1), add, 1); \
            if (r0_ + s_ + 2 < g->M) put_row(g, r0_ + s_ + 2, c0_, pc_, svget4(q_, 2), add, 1); \
            if (r0_ + s_ + 3 < g->M) put_row(g, r0_ + s_ + 3, c0_, pc_, svget4(q_, 3), add, 1); \
        }                                                                                      \
        if (g->Ct) {                                                                           \
            const svbool_t pr_ = svwhilelt_b32(r0_, g->M);                                     \
            for (int s_ = 0; s_ < T && c0_ + s_ < g->N; s_ += 4) {                             \
                svfloat32x4_t q_ = svread_ver_za32_f32_vg4(tile, s_);                          \
                put_col(g, c0_ + s_, r0_, pr_, svget4(q_, 0), 0, 1);                           \
                if (c0_ + s_ + 1 < g->N) put_col(g, c0_ + s_ + 1, r0_, pr_, svget4(q_, 1), 0, 1); \
                if (c0_ + s_ + 2 < g->N) put_col(g, c0_ + s_ + 2, r0_, pr_, svget4(q_, 2), 0, 1); \
                if (c0_ + s_ + 3 < g->N) put_col(g, c0_ + s_ + 3, r0_, pr_, svget4(q_, 3), 0, 1); \
            }                                                                                  \
        }                                                                                      \
    } while (0)

#endif

#if !EMG_SME_F16

/* fp32: a 2T x 2T block per pass on all four za32 tiles. Each k step loads two A and two B vectors
 * and issues four independent FMOPAs, so consecutive FMOPAs never wait on the same tile. */
static void gemm_body(const emg_gemm *g) __arm_streaming __arm_inout("za") {
    const int T = (int)svcntsw();
    const int add = g->flags & GEMM_ACC;
    for (int i0 = 0; i0 < g->M; i0 += 2 * T) {
        const svbool_t pi0 = svwhilelt_b32(i0, g->M), pi1 = svwhilelt_b32(i0 + T, g->M);
        for (int j0 = 0; j0 < g->N; j0 += 2 * T) {
            if (below_diagonal(g, i0, j0, 2 * T)) continue;
            const svbool_t pj0 = svwhilelt_b32(j0, g->N), pj1 = svwhilelt_b32(j0 + T, g->N);
            const k_span ks = contraction(g, i0, 2 * T, j0, 2 * T);
            const float *a = g->A + (long)ks.lo * g->lda + i0, *b = g->B + (long)ks.lo * g->ldb + j0;
            svzero_za();
            for (int k = ks.lo; k < ks.hi; k++, a += g->lda, b += g->ldb) {
                const svfloat32_t a0 = svld1_f32(pi0, a), a1 = svld1_f32(pi1, a + T);
                const svfloat32_t b0 = svld1_f32(pj0, b), b1 = svld1_f32(pj1, b + T);
                svmopa_za32_f32_m(0, pi0, pj0, a0, b0);
                svmopa_za32_f32_m(1, pi0, pj1, a0, b1);
                svmopa_za32_f32_m(2, pi1, pj0, a1, b0);
                svmopa_za32_f32_m(3, pi1, pj1, a1, b1);
            }
            READ_TILE32(0, i0, j0);
            READ_TILE32(1, i0, j0 + T);
            READ_TILE32(2, i0 + T, j0);
            READ_TILE32(3, i0 + T, j0 + T);
        }
    }
}

#elif EMG_SME_F16_WIDEN

/* One k pair of the widening FMOPA on the four za32 tiles. Each za32 element (i, j) accumulates
 * zn[2i] * zm[2j] + zn[2i + 1] * zm[2j + 1] in fp32, so an operand vector must hold rows k and k + 1
 * interleaved element by element: zip1 of the two fp16 k-rows (2T halves each) pairs up elements
 * 0..T-1 (the first tile's T rows or columns), zip2 elements T..2T-1. Inactive lanes were loaded as
 * zero, so their products add nothing and the FMOPAs need no predicate of their own. */
#define MOPA_PAIR(ak, ak1, bk, bk1)                                                        \
    do {                                                                                   \
        const svfloat16_t a0_ = svzip1_f16(ak, ak1), a1_ = svzip2_f16(ak, ak1);            \
        const svfloat16_t b0_ = svzip1_f16(bk, bk1), b1_ = svzip2_f16(bk, bk1);            \
        svmopa_za32_f16_m(0, all, all, a0_, b0_);                                          \
        svmopa_za32_f16_m(1, all, all, a0_, b1_);                                          \
        svmopa_za32_f16_m(2, all, all, a1_, b0_);                                          \
        svmopa_za32_f16_m(3, all, all, a1_, b1_);                                          \
    } while (0)

/* fp16 operands, fp32 accumulation (the widening FMOPA of base FEAT_SME, which Apple M4 has): the same
 * 2T x 2T block on four za32 tiles as fp32, half the FMOPAs (each takes two k terms) and half the
 * operand bytes, no fp16 accumulator to drain, and fp32's VG4 readouts. An odd K pairs its last row with
 * zeros. */
static void gemm_body(const emg_gemm *g) __arm_streaming __arm_inout("za") {
    const int T = (int)svcntsw();
    const int add = g->flags & GEMM_ACC;
    const svbool_t all = svptrue_b16();
    const svfloat16_t zero = svdup_n_f16(0);
    for (int i0 = 0; i0 < g->M; i0 += 2 * T) {
        const svbool_t pi = svwhilelt_b16(i0, g->M); /* rows i0 .. i0 + 2T - 1 */
        for (int j0 = 0; j0 < g->N; j0 += 2 * T) {
            if (below_diagonal(g, i0, j0, 2 * T)) continue;
            const svbool_t pj = svwhilelt_b16(j0, g->N);
            /* the causal range widened to whole k pairs of the full contraction (0-1, 2-3, ...): the same
             * pair sums */
            const k_span ks = contraction(g, i0, 2 * T, j0, 2 * T);
            const int lo = ks.lo & ~1, hi = ks.hi + (ks.hi & 1) < g->K ? ks.hi + (ks.hi & 1) : g->K;
            const op_t *a = g->A + (long)lo * g->lda + i0, *b = g->B + (long)lo * g->ldb + j0;
            svzero_za();
            int k = lo;
            for (; k + 1 < hi; k += 2, a += 2 * g->lda, b += 2 * g->ldb)
                MOPA_PAIR(svld1_f16(pi, a), svld1_f16(pi, a + g->lda), svld1_f16(pj, b), svld1_f16(pj, b + g->ldb));
            if (k < hi) MOPA_PAIR(svld1_f16(pi, a), zero, svld1_f16(pj, b), zero);
            READ_TILE32(0, i0, j0);
            READ_TILE32(1, i0, j0 + T);
            READ_TILE32(2, i0 + T, j0);
            READ_TILE32(3, i0 + T, j0 + T);
        }
    }
}

#else /* EMG_SME_F16, non-widening */

/* Widen one za16 row (T halves) to two fp32 vectors and store it. FCVT reads the even halves, so
 * zip1/zip2 of the row with itself put halves 0..T/2-1 and T/2..T-1 there in order. Rows come out two
 * per instruction (SME2 VG2 MOVA); with Ct, columns likewise by vertical slices. */
#define PUT16(put, r, c, plo, phi, v, add, last)                                                 \
    do {                                                                                        \
        put(g, r, c, plo, svcvt_f32_f16_x(all32, svzip1_f16(v, v)), add, last);                  \
        put(g, r, c + T / 2, phi, svcvt_f32_f16_x(all32, svzip2_f16(v, v)), add, last);          \
    } while (0)
#define READ_TILE16(tile, r0, c0)                                                               \
    do {                                                                                        \
        const int r0_ = (r0), c0_ = (c0);                                                       \
        const svbool_t pl_ = svwhilelt_b32(c0_, g->N), ph_ = svwhilelt_b32(c0_ + T / 2, g->N);  \
        for (int s_ = 0; s_ < T && r0_ + s_ < g->M; s_ += 2) {                                  \
            const svfloat16x2_t q_ = svread_hor_za16_f16_vg2(tile, s_);                         \
            PUT16(put_row, r0_ + s_, c0_, pl_, ph_, svget2(q_, 0), add, last);                  \
            if (r0_ + s_ + 1 < g->M) PUT16(put_row, r0_ + s_ + 1, c0_, pl_, ph_, svget2(q_, 1), add, last); \
        }                                                                                       \
        if (g->Ct) {                                                                            \
            const svbool_t ql_ = svwhilelt_b32(r0_, g->M), qh_ = svwhilelt_b32(r0_ + T / 2, g->M); \
            for (int s_ = 0; s_ < T && c0_ + s_ < g->N; s_ += 2) {                              \
                const svfloat16x2_t q_ = svread_ver_za16_f16_vg2(tile, s_);                     \
                PUT16(put_col, c0_ + s_, r0_, ql_, qh_, svget2(q_, 0), add_t, last);             \
                if (c0_ + s_ + 1 < g->N) PUT16(put_col, c0_ + s_ + 1, r0_, ql_, qh_, svget2(q_, 1), add_t, last); \
            }                                                                                   \
        }                                                                                       \
    } while (0)

/* fp16: a T x 2T block per pass on both za16 tiles; products accumulate in fp16 inside ZA (the
 * non-widening FEAT_SME_F16F16 FMOPA) for EMG_F16_KCHUNK terms, then each chunk is drained into the
 * fp32 result, so long reductions (weight gradients over thousands of positions) sum in fp32. */
static void gemm_body(const emg_gemm *g) __arm_streaming __arm_inout("za") {
    const int T = (int)svcntsh();
    const svbool_t all32 = svptrue_b32();
    for (int i0 = 0; i0 < g->M; i0 += T) {
        const svbool_t pi = svwhilelt_b16(i0, g->M);
        for (int j0 = 0; j0 < g->N; j0 += 2 * T) {
            if (below_diagonal(g, i0, j0, 2 * T)) continue;
            const svbool_t pj0 = svwhilelt_b16(j0, g->N), pj1 = svwhilelt_b16(j0 + T, g->N);
            /* chunks stay where the full contraction has them (multiples of EMG_F16_KCHUNK), so a causal
             * range sums the same fp16 partials; at least one chunk runs, storing zeros for an empty range */
            const k_span ks = contraction(g, i0, T, j0, 2 * T);
            const int first = ks.lo - ks.lo % EMG_F16_KCHUNK;
            int k0 = first;
            do {
                const int kb = k0 > ks.lo ? k0 : ks.lo;
                const int k1 = k0 + EMG_F16_KCHUNK < ks.hi ? k0 + EMG_F16_KCHUNK : ks.hi;
                const op_t *a = g->A + (long)kb * g->lda + i0, *b = g->B + (long)kb * g->ldb + j0;
                svzero_za();
                for (int k = kb; k < k1; k++, a += g->lda, b += g->ldb) {
                    const svfloat16_t av = svld1_f16(pi, a);
                    svmopa_za16_f16_m(0, pi, pj0, av, svld1_f16(pj0, b));
                    svmopa_za16_f16_m(1, pi, pj1, av, svld1_f16(pj1, b + T));
                }
                const int add = k0 > first || (g->flags & GEMM_ACC), add_t = k0 > first; /* Ct never has GEMM_ACC */
                const int last = k1 == ks.hi;
                READ_TILE16(0, i0, j0);
                READ_TILE16(1, i0, j0 + T);
                k0 += EMG_F16_KCHUNK;
            } while (k0 < ks.hi);
        }
    }
}

#endif

__arm_locally_streaming __arm_new("za") void sme_gemm(const emg_gemm *g) { gemm_body(g); }

__arm_locally_streaming __arm_new("za") void sme_gemm_many(const emg_gemm *g, int n) {
    for (int i = 0; i < n; i++) gemm_body(&g[i]);
}
