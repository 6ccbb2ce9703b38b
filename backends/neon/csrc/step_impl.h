/* One training step's forward and backward pass, specialised at compile time.
 *
 * Included once per supported shape by step_d*.c after defining D_MODEL, N_HEADS and KERNEL_NAME (the
 * emg_kernel table entry to define). Everything below is static, so the copies never clash.
 *
 * Work is done one sequence at a time (its activations stay in L1) and only over its live positions
 * t < T = length - 1: padding is never touched, forward or backward (the seed's optimisation 3). Gradients
 * of all sequences accumulate into s->core.grads, already scaled by 1 / (live positions in the batch).
 */
#include <string.h>

#include "attention.h"
#include "linear.h"
#include "norm.h"
#include "session.h"

#if !defined(D_MODEL) || !defined(N_HEADS) || !defined(KERNEL_NAME)
#error "define D_MODEL, N_HEADS and KERNEL_NAME before including step_impl.h"
#endif

#define D D_MODEL
#define HD (D_MODEL / N_HEADS)
#define DFF (4 * D_MODEL)
#define D3 (3 * D_MODEL)
#define VPAD 28 /* VOCAB rounded up to a whole vector */
#define T_MAX (EMG_MAX_SEQ - 1)

_Static_assert(HD % 4 == 0, "head_dim must be a multiple of 4");

/* Offsets of the tensors in the flat parameter (and gradient) buffer: the shared layout. */
enum {
    OFF_TOK = EMG_OFF_TOK_EMB(D),
    OFF_POS = EMG_OFF_POS_EMB(D),
    OFF_QKV = EMG_OFF_WQ(D), /* Wq, Wk, Wv are adjacent: one [3D][D] matrix */
    OFF_WO = EMG_OFF_WO(D),
    OFF_WF1 = EMG_OFF_WF1(D),
    OFF_WF2 = EMG_OFF_WF2(D),
    OFF_WLM = EMG_OFF_WLM(D),
    /* transposed copies in s->wt */
    T_QKV = 0,
    T_WO = 3 * D * D,
    T_WF1 = 4 * D * D,
    T_WF2 = 8 * D * D,
};

typedef struct {
    /* forward activations, one row per live position */
    float x0[T_MAX][D], r0[T_MAX], h1[T_MAX][D], r1[T_MAX];
    float qkv[T_MAX][D3];
    float probs[N_HEADS][T_MAX][16];
    float att[T_MAX][D], x1[T_MAX][D], h2[T_MAX][D], r2[T_MAX];
    float hidden[T_MAX][DFF], x2[T_MAX][D];
    float dlogits[T_MAX][VPAD];
    /* backward */
    float dx2[T_MAX][D], dpre[T_MAX][DFF], dh[T_MAX][D], dx1[T_MAX][D], datt[T_MAX][D];
    float dqkv[T_MAX][D3], dx0[T_MAX][D];
} work_t;

/* Forward through one sequence; fills w and returns its summed weighted loss. dlogits ends up holding
 * (softmax - onehot(target)) * wgt, the gradient at the logits. */
static float seq_forward(const float *p, work_t *w, const uint8_t *tok, int T, float wgt) {
    float e[D];
    for (int t = 0; t < T; t++) {
        const float *te = p + OFF_TOK + tok[t] * D, *pe = p + OFF_POS + t * D;
        for (int i = 0; i < D; i += 4) vst1q_f32(e + i, vaddq_f32(vld1q_f32(te + i), vld1q_f32(pe + i)));
        w->r0[t] = rms_forward(w->x0[t], e, D);
        w->r1[t] = rms_forward(w->h1[t], w->x0[t], D);
    }
    matvec_rows(&w->qkv[0][0], D3, p + OFF_QKV, &w->h1[0][0], D, T, D3, D, EP_STORE, 0, 0);
    attention_forward(&w->att[0][0], &w->probs[0][0][0], &w->qkv[0][0], T, D, N_HEADS, HD);
    matvec_rows(&w->x1[0][0], D, p + OFF_WO, &w->att[0][0], D, T, D, D, EP_RESIDUAL, &w->x0[0][0], D);
    for (int t = 0; t < T; t++) w->r2[t] = rms_forward(w->h2[t], w->x1[t], D);
    matvec_rows(&w->hidden[0][0], DFF, p + OFF_WF1, &w->h2[0][0], D, T, DFF, D, EP_RELU, 0, 0);
    matvec_rows(&w->x2[0][0], D, p + OFF_WF2, &w->hidden[0][0], DFF, T, D, DFF, EP_RESIDUAL,
                &w->x1[0][0], D);
    matvec_rows(&w->dlogits[0][0], VPAD, p + OFF_WLM, &w->x2[0][0], D, T, EMG_VOCAB, D, EP_STORE, 0, 0);

    float loss = 0.0f;
    float32x4_t wv = vdupq_n_f32(wgt);
    for (int t = 0; t < T; t++) {
        float *row = w->dlogits[t], lse;
        int target = tok[t + 1];
        float picked = row[target];
        softmax_inplace(row, EMG_VOCAB, &lse);
        loss += (lse - picked) * wgt;
        row[target] -= 1.0f;
        for (int v = 0; v < VPAD; v += 4) vst1q_f32(row + v, vmulq_f32(vld1q_f32(row + v), wv));
    }
    return loss;
}

/* Backward through one sequence after seq_forward, accumulating into g. */
static void seq_backward(const float *p, const float *wt, float *g, work_t *w, const uint8_t *tok, int T) {
    /* LM head: sparse over the logits (exact zeros skipped), contiguous rows of Wlm, no transpose. */
    outer_acc(g + OFF_WLM, &w->dlogits[0][0], VPAD, &w->x2[0][0], D, T, EMG_VOCAB, D);
    for (int t = 0; t < T; t++) {
        memset(w->dx2[t], 0, sizeof w->dx2[t]);
        for (int v = 0; v < EMG_VOCAB; v++)
            if (w->dlogits[t][v] != 0.0f) axpy_f32(w->dx2[t], w->dlogits[t][v], p + OFF_WLM + v * D, D);
    }
    /* FFN: x2 = x1 + Wf2 relu(Wf1 h2). */
    outer_acc(g + OFF_WF2, &w->dx2[0][0], D, &w->hidden[0][0], DFF, T, D, DFF);
    matvec_rows(&w->dpre[0][0], DFF, wt + T_WF2, &w->dx2[0][0], D, T, DFF, D, EP_MASK, &w->hidden[0][0], DFF);
    outer_acc(g + OFF_WF1, &w->dpre[0][0], DFF, &w->h2[0][0], D, T, DFF, D);
    matvec_rows(&w->dh[0][0], D, wt + T_WF1, &w->dpre[0][0], DFF, T, D, DFF, EP_STORE, 0, 0);
    for (int t = 0; t < T; t++) rms_backward(w->dx1[t], w->dx2[t], w->dh[t], w->h2[t], w->r2[t], D);
    /* Attention output projection: x1 = x0 + Wo att. */
    outer_acc(g + OFF_WO, &w->dx1[0][0], D, &w->att[0][0], D, T, D, D);
    matvec_rows(&w->datt[0][0], D, wt + T_WO, &w->dx1[0][0], D, T, D, D, EP_STORE, 0, 0);
    attention_backward(&w->dqkv[0][0], &w->datt[0][0], &w->probs[0][0][0], &w->qkv[0][0], T, D, N_HEADS, HD);
    /* Q, K, V from h1 = rms(x0). */
    outer_acc(g + OFF_QKV, &w->dqkv[0][0], D3, &w->h1[0][0], D, T, D3, D);
    matvec_rows(&w->dh[0][0], D, wt + T_QKV, &w->dqkv[0][0], D3, T, D, D3, EP_STORE, 0, 0);
    for (int t = 0; t < T; t++) rms_backward(w->dx0[t], w->dx1[t], w->dh[t], w->h1[t], w->r1[t], D);
    /* Embeddings: x0 = rms(tok_emb[tok] + pos_emb[t]); the norm backward writes d(emb) into dh. */
    for (int t = 0; t < T; t++) {
        rms_backward(w->dh[t], 0, w->dx0[t], w->x0[t], w->r0[t], D);
        float *gt = g + OFF_TOK + tok[t] * D, *gp = g + OFF_POS + t * D;
        for (int i = 0; i < D; i += 4) {
            float32x4_t d = vld1q_f32(w->dh[t] + i);
            vst1q_f32(gt + i, vaddq_f32(vld1q_f32(gt + i), d));
            vst1q_f32(gp + i, vaddq_f32(vld1q_f32(gp + i), d));
        }
    }
}

static float loss_grad(emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths) {
    work_t *w = (work_t *)s->work;
    long n_live = 0;
    for (int b = 0; b < batch; b++) n_live += lengths[b] - 1;
    float wgt = 1.0f / (float)n_live, loss = 0.0f;
    memset(s->core.grads, 0, sizeof(float) * (size_t)s->core.layout.n_params);
    for (int b = 0; b < batch; b++) {
        const uint8_t *tok = tokens + (long)b * EMG_MAX_SEQ;
        int T = lengths[b] - 1;
        loss += seq_forward(s->core.params, w, tok, T, wgt);
        seq_backward(s->core.params, s->wt, s->core.grads, w, tok, T);
    }
    return loss;
}

static void sync_transposed(emg_session *s) {
    const float *p = s->core.params;
    transpose_f32(s->wt + T_QKV, p + OFF_QKV, D3, D);
    transpose_f32(s->wt + T_WO, p + OFF_WO, D, D);
    transpose_f32(s->wt + T_WF1, p + OFF_WF1, DFF, D);
    transpose_f32(s->wt + T_WF2, p + OFF_WF2, D, DFF);
}

const emg_kernel KERNEL_NAME = {D_MODEL, N_HEADS, sizeof(work_t), loss_grad, sync_transposed};
