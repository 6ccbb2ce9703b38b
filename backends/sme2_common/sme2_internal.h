/*
 * Internal interface between the model step (sme2_step.c, plain C / Neon, never streaming) and the
 * FMOPA kernels (sme2_gemm.c, the only translation unit built with SME flags). One source tree serves
 * the three backends: EMG_SME_F16=0 builds sme2_f32 (fp32 operands, za32 tiles), EMG_SME_F16=1 builds
 * sme2_f16 (fp16 operands, non-widening fp16 FMOPA into za16 tiles), EMG_SME_F16=1 with
 * EMG_SME_F16_WIDEN=1 builds sme2_f16w (fp16 operands, widening FMOPA into za32 tiles: fp32 accumulation).
 */
#ifndef EMG_SME2_INTERNAL_H
#define EMG_SME2_INTERNAL_H

#include <stdint.h>

#ifndef EMG_SME_F16
#error "compile with -DEMG_SME_F16=0 (sme2_f32) or -DEMG_SME_F16=1 (sme2_f16)"
#endif

#ifndef EMG_SME_F16_WIDEN
#define EMG_SME_F16_WIDEN 0
#endif
#if EMG_SME_F16_WIDEN && !EMG_SME_F16
#error "EMG_SME_F16_WIDEN=1 needs EMG_SME_F16=1 (it changes how fp16 operands are accumulated)"
#endif
/* Only the non-widening fp16 FMOPA needs FEAT_SME_F16F16; the widening one is base FEAT_SME. */
#define EMG_SME_NEEDS_F16F16 (EMG_SME_F16 && !EMG_SME_F16_WIDEN)

#if EMG_SME_F16
typedef __fp16 op_t; /* GEMM operand type */
/* fp16 ZA accumulators (non-widening build) are drained into fp32 every this many contraction terms
 * (see README). */
#define EMG_F16_KCHUNK 64
#else
typedef float op_t;
#endif

#define EMG_EXPORT __attribute__((visibility("default")))
#define EMG_HIDDEN __attribute__((visibility("hidden")))

enum { GEMM_ACC = 1, GEMM_RELU = 2, GEMM_GATE = 4 };

/* What a causal attention product may skip (emg_gemm.causal): the mask makes these products' work
 * triangular. Skipped terms are exact zeros, so a skipping GEMM returns the bits of the full one.
 *   CAUSAL_UPPER:    only C[i][j] with i <= j is wanted; register blocks wholly below the diagonal are not
 *                    computed (C keeps whatever it held there).
 *   CAUSAL_K_TO_N:   A[k][i] B[k][j] = 0 for k > j (B is P^T, zero below the diagonal).
 *   CAUSAL_K_TO_M:   the term is 0 for k > i (A is dS^T).
 *   CAUSAL_K_FROM_M: the term is 0 for k < i (A is dS or P, t-major).
 * The K modes cut each register block's contraction to the range its rows or columns need. */
enum { CAUSAL_NONE = 0, CAUSAL_UPPER, CAUSAL_K_TO_N, CAUSAL_K_TO_M, CAUSAL_K_FROM_M };

/*
 * C[i][j] = (flags & GEMM_ACC ? C[i][j] : 0) + alpha * sum_k A[k][i] * B[k][j]   (i < M, j < N, k < K)
 * with A stored k-major (A[k * lda + i]) and B stored k-major (B[k * ldb + j]): the operand layout of
 * an outer-product engine. GEMM_RELU clamps the stored result at 0 (applied after the accumulate);
 * GEMM_GATE zeroes C[i][j] wherever gate[i][j] <= 0 (the ReLU backward, gate = the ReLU output, same
 * leading dimension as C).
 * Ct, when not NULL, also receives the result transposed, Ct[j][i] (leading dimension ldct), read out of
 * the same ZA tiles by vertical slices, with the same epilogue (gate_t = the gate transposed, leading
 * dimension ldct). This hands the next GEMM its k-major operand without a transpose pass. Not with
 * GEMM_ACC (Ct would need the residual transposed).
 */
typedef struct {
    int M, N, K;
    const op_t *A;
    long lda;
    const op_t *B;
    long ldb;
    float *C;
    long ldc;
    float alpha;
    int flags;
    const float *gate;
    float *Ct;
    long ldct;
    const float *gate_t;
    int causal; /* CAUSAL_* */
} emg_gemm;

/* One GEMM in its own streaming session. */
EMG_HIDDEN void sme_gemm(const emg_gemm *g);
/* n GEMMs back to back in a single streaming session (the batch-hoisted weight gradients). */
EMG_HIDDEN void sme_gemm_many(const emg_gemm *g, int n);

/* CPU capability (sme2_cpu.c, built without SME flags so it can run anywhere): emg_create's guard, so
 * that a session on a CPU without the features fails with EMG_ERR_UNSUPPORTED instead of SIGILL. */
enum { SME_CPU_OK = 0, SME_CPU_NO_SME2 = 1, SME_CPU_NO_F16F16 = 2 };
EMG_HIDDEN int emg_sme_cpu_status(int need_f16f16);

#endif
