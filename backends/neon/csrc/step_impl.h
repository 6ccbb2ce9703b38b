/* One training step's forward and backward pass, compiled once per width and once for any wider width.
 *
 * Compiled once per width as its own translation unit (setup.py's NEON_WIDTHS: a generated two-line file
 * defines D_MODEL and KERNEL_NAME, the emg_neon_kernel table entry to define, then includes this file);
 * everything else is static, so the copies never clash. The width is a compile-time constant (loops over
 * d_model unroll, accumulators stay in registers); heads, layers, vocabulary and context come from
 * s->core.shape at run time. step_wide.c compiles the same code once with NEON_STEP_WIDE instead of D_MODEL:
 * the width is then read from the shape too (dims.d), for widths NEON_WIDE_MIN..EMG_MAX_D_MODEL, where each
 * GEMM's reduction is hundreds of FMAs per output and a constant width would save little for the build time
 * of 48 more units.
 *
 * The live positions t < length - 1 of consecutive sequences are packed into blocks of rows (session.h,
 * neon_pack): padding is never touched, forward or backward. A block runs forward through every layer,
 * keeping each layer's activations, then backward through the layers in reverse, while its activations are
 * still in cache. Gradients of all blocks accumulate into s->core.grads, already scaled by 1 / (live
 * positions in the batch).
 */
#include <string.h>

#include "arm_rmsnorm.h"
#include "attention.h"
#include "matmul.h"
#include "neon_math.h"
#include "session.h"

#if !(defined(D_MODEL) || defined(NEON_STEP_WIDE)) || !defined(KERNEL_NAME)
#error "define D_MODEL (or NEON_STEP_WIDE) and KERNEL_NAME before including step_impl.h"
#endif

/* D: the width, a constant or (NEON_STEP_WIDE) read from the dims every function below has in scope as dm;
 * D_MAX bounds it for arrays on the stack. */
#ifdef NEON_STEP_WIDE
#define D (dm->d)
#define D_MAX EMG_MAX_D_MODEL
#define KERNEL_D_MODEL 0
#else
#define D D_MODEL
#define D_MAX D_MODEL
#define KERNEL_D_MODEL D_MODEL
_Static_assert(D % 16 == 0, "matmul_backward_input works on 16-column tiles of d_model and 4 * d_model");
#endif
#define D3 (3 * D)
#define DFF (4 * D)

/* What every kernel of a step reads of the session's shape. */
typedef struct {
    int d, n_heads, head_dim, n_layers, vocab, vp, cp;
    int block_rows;   /* the most rows a block of packed sequences holds (neon_block_rows) */
    long head_stride; /* floats between two heads' blocks of probs */
} dims;

static dims dims_of(const emg_shape *shape) {
    const int cp = ROUND4(shape->context), rows = neon_block_rows(shape);
    return (dims){shape->d_model, shape->n_heads, shape->d_model / shape->n_heads, shape->n_layers, shape->vocab,
                  ROUND4(shape->vocab), cp, rows, (long)rows * cp};
}

/* ---- embeddings: x = rmsnorm(tok_emb[token] + pos_emb[t]) ---- */

static void encoder_forward(float *x, float *r, const float *tok_emb, const float *pos_emb, const neon_pack *pk,
                            const dims *dm) {
    for (int i = 0; i < pk->n_seq; i++) {
        for (int t = 0; t < pk->len[i]; t++) {
            const int row = pk->start[i] + t;
            const float *te = tok_emb + pk->tok[i][t] * D, *pe = pos_emb + t * D;
            float e[D_MAX];
            for (int c = 0; c < D; c += 4) vst1q_f32(e + c, vaddq_f32(vld1q_f32(te + c), vld1q_f32(pe + c)));
            rmsnorm_forward(x + row * D, r + row, e, 1, D, 1);
        }
    }
}

/* dx [rows][D] at the norm's output -> the token and position embeddings' gradients. */
static void encoder_backward(float *g_tok, float *g_pos, const float *dx, const float *x, const float *r,
                             const neon_pack *pk, const dims *dm) {
    for (int i = 0; i < pk->n_seq; i++) {
        for (int t = 0; t < pk->len[i]; t++) {
            const int row = pk->start[i] + t;
            float de[D_MAX];
            rmsnorm_backward(de, NULL, dx + row * D, x + row * D, r + row, 1, D, 1);
            float *gt = g_tok + pk->tok[i][t] * D, *gp = g_pos + t * D;
            for (int c = 0; c < D; c += 4) {
                const float32x4_t v = vld1q_f32(de + c);
                vst1q_f32(gt + c, vaddq_f32(vld1q_f32(gt + c), v));
                vst1q_f32(gp + c, vaddq_f32(vld1q_f32(gp + c), v));
            }
        }
    }
}

/* ---- the loss: softmax cross-entropy of each row's logits against the next token ---- */

/* Returns the block's summed loss times wgt and turns logits [rows][vp] into d(loss)/d(logits) =
 * (softmax - onehot(target)) * wgt, 0 in the padding columns. */
static double crossentropy_forward_backward(float *logits, const neon_pack *pk, const dims *dm, float wgt) {
    double loss = 0.0;
    const float32x4_t wv = vdupq_n_f32(wgt);
    for (int i = 0; i < pk->n_seq; i++) {
        for (int t = 0; t < pk->len[i]; t++) {
            float *row = logits + (long)(pk->start[i] + t) * dm->vp, lse;
            const int target = pk->tok[i][t + 1];
            const float picked = row[target];
            softmax_inplace(row, dm->vocab, &lse);
            loss += (double)(lse - picked);
            row[target] -= 1.0f;
            for (int v = 0; v < dm->vp; v += 4) vst1q_f32(row + v, vmulq_f32(vld1q_f32(row + v), wv));
        }
    }
    return loss * wgt;
}

/* ---- one layer ---- */

/* x_out = xm + Wf2 relu(Wf1 rmsnorm(xm)) with xm = x + Wo attention(Wqkv rmsnorm(x)); la keeps the rest. */
static void layer_forward(const float *p, const neon_layer_acts *la, float *x_out, const neon_pack *pk,
                          const dims *dm) {
    const int rows = pk->rows;
    rmsnorm_forward(la->h1, la->r1, la->x, rows, D, 1);
    /* Wq, Wk and Wv are adjacent in the layout: one [3D][D] matrix. */
    matmul_forward(la->qkv, D3, p + EMG_LAYER_WQ(D), la->h1, D, rows, D3, D, EP_STORE, 0, 0);
    for (int i = 0; i < pk->n_seq; i++) {
        const int st = pk->start[i];
        attention_forward(la->att + st * D, la->probs + (long)st * dm->cp, la->qkv + st * D3, pk->len[i], D,
                          dm->n_heads, dm->head_dim, dm->cp, dm->head_stride);
    }
    matmul_forward(la->xm, D, p + EMG_LAYER_WO(D), la->att, D, rows, D, D, EP_RESIDUAL, la->x, D);
    rmsnorm_forward(la->h2, la->r2, la->xm, rows, D, 1);
    matmul_forward(la->hidden, DFF, p + EMG_LAYER_WF1(D), la->h2, D, rows, DFF, D, EP_RELU, 0, 0);
    matmul_forward(x_out, D, p + EMG_LAYER_WF2(D), la->hidden, DFF, rows, D, DFF, EP_RESIDUAL, la->xm, D);
}

/* dx [rows][D]: in, the gradient at the layer's output; out, at its input x. g: the layer's gradients. */
static void layer_backward(const float *p, float *g, const neon_layer_acts *la, const neon_acts *a,
                           const neon_pack *pk, const dims *dm) {
    const int rows = pk->rows;
    float *dx = a->dx;
    /* MLP: x_out = xm + Wf2 hidden, hidden = relu(Wf1 h2), h2 = rmsnorm(xm). */
    matmul_backward_weight(g + EMG_LAYER_WF2(D), dx, D, la->hidden, DFF, rows, D, DFF);
    matmul_backward_input(a->dpre, DFF, dx, D, p + EMG_LAYER_WF2(D), rows, D, D, DFF, EP_RELU_MASK, la->hidden,
                          DFF);
    matmul_backward_weight(g + EMG_LAYER_WF1(D), a->dpre, DFF, la->h2, D, rows, DFF, D);
    matmul_backward_input(a->dh, D, a->dpre, DFF, p + EMG_LAYER_WF1(D), rows, DFF, DFF, D, EP_STORE, 0, 0);
    rmsnorm_backward(dx, dx, a->dh, la->h2, la->r2, rows, D, 1);
    /* Attention: xm = x + Wo att, att = attention(q, k, v), qkv = Wqkv h1, h1 = rmsnorm(x). */
    matmul_backward_weight(g + EMG_LAYER_WO(D), dx, D, la->att, D, rows, D, D);
    matmul_backward_input(a->datt, D, dx, D, p + EMG_LAYER_WO(D), rows, D, D, D, EP_STORE, 0, 0);
    for (int i = 0; i < pk->n_seq; i++) {
        const int st = pk->start[i];
        attention_backward(a->dqkv + st * D3, a->dscores, a->datt + st * D, la->probs + (long)st * dm->cp,
                           la->qkv + st * D3, pk->len[i], D, dm->n_heads, dm->head_dim, dm->cp, dm->head_stride);
    }
    matmul_backward_weight(g + EMG_LAYER_WQ(D), a->dqkv, D3, la->h1, D, rows, D3, D);
    matmul_backward_input(a->dh, D, a->dqkv, D3, p + EMG_LAYER_WQ(D), rows, D3, D3, D, EP_STORE, 0, 0);
    rmsnorm_backward(dx, dx, a->dh, la->h1, la->r1, rows, D, 1);
}

/* ---- one block of packed sequences ---- */

/* Forward through embeddings, every layer, the LM head and the loss; returns the block's weighted loss. */
static double model_forward(const emg_session *s, const neon_pack *pk, const dims *dm, float wgt) {
    const float *p = s->core.params;
    const emg_layout *ly = &s->core.layout;
    const neon_acts *a = &s->acts;
    encoder_forward(a->layer[0].x, a->r0, p + ly->tok_emb, p + ly->pos_emb, pk, dm);
    for (int l = 0; l < dm->n_layers; l++)
        layer_forward(p + emg_layer_offset(ly, l), &a->layer[l], a->layer[l + 1].x, pk, dm);
    /* LM head on the last residual, no final norm. */
    matmul_forward(a->logits, dm->vp, p + ly->wlm, a->layer[dm->n_layers].x, D, pk->rows, dm->vocab, D,
                   EP_STORE, 0, 0);
    return crossentropy_forward_backward(a->logits, pk, dm, wgt);
}

/* Backward after model_forward, accumulating into s->core.grads: the LM head, the layers in reverse, the
 * embeddings. */
static void model_backward(emg_session *s, const neon_pack *pk, const dims *dm) {
    const float *p = s->core.params;
    float *g = s->core.grads;
    const emg_layout *ly = &s->core.layout;
    const neon_acts *a = &s->acts;
    const float *x_last = a->layer[dm->n_layers].x;
    matmul_backward_weight(g + ly->wlm, a->logits, dm->vp, x_last, D, pk->rows, dm->vocab, D);
    matmul_backward_input(a->dx, D, a->logits, dm->vp, p + ly->wlm, pk->rows, dm->vp, dm->vocab, D, EP_STORE, 0, 0);
    for (int l = dm->n_layers - 1; l >= 0; l--)
        layer_backward(p + emg_layer_offset(ly, l), g + emg_layer_offset(ly, l), &a->layer[l], a, pk, dm);
    encoder_backward(g + ly->tok_emb, g + ly->pos_emb, a->dx, a->layer[0].x, a->r0, pk, dm);
}

static float loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths,
                           int want_grads) {
    const dims dm = dims_of(&s->core.shape);
    const int seq = emg_seq_len(&s->core.shape);
    long n_live = 0;
    for (int b = 0; b < batch; b++) n_live += lengths[b] - 1;
    const float wgt = 1.0f / (float)n_live;
    if (want_grads) memset(s->core.grads, 0, sizeof(float) * (size_t)s->core.layout.n_params);
    double loss = 0.0;
    neon_pack pk; /* 4 KB: only rows and n_seq need a start value */
    pk.rows = pk.n_seq = 0;
    for (int b = 0; b <= batch; b++) {
        const int T = b < batch ? lengths[b] - 1 : 0;
        if (pk.n_seq > 0 && (b == batch || pk.rows + T > dm.block_rows)) { /* the block is full: run it */
            loss += model_forward(s, &pk, &dm, wgt);
            if (want_grads) model_backward(s, &pk, &dm);
            pk.rows = pk.n_seq = 0;
        }
        if (b == batch) break;
        pk.start[pk.n_seq] = pk.rows;
        pk.len[pk.n_seq] = T;
        pk.tok[pk.n_seq] = tokens + (long)b * seq;
        pk.n_seq++;
        pk.rows += T;
    }
    return (float)loss;
}

const emg_neon_kernel KERNEL_NAME = {KERNEL_D_MODEL, loss_and_grad};
