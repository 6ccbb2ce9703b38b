/* Softmax cross-entropy over the packed logit rows, one row per vector lane: VW rows are transposed in
 * registers so that each of the vocabulary's classes is one vector across the rows; max, exp and sum are then
 * element-wise across those vectors, with no horizontal reduction, scalar log or division per row (the
 * per-row version was ~8% of the d16 step). The log-partitions are summed as the log of their product:
 * every sum of exp(logit - max) lies in [1, vocab], their product is kept in double with its binary
 * exponent split off, and one log at the end gives the sum of their logs. */
#ifndef EMG_X86_XENT_H
#define EMG_X86_XENT_H

#include <math.h>

#include "expf.h"

#include "eemicrogpt.h"

#define XENT_MAX_LD EMG_MAX_VOCAB /* widest logit row: the padded vocabulary */

/* For rows p < P of logits (row stride ld, classes 0..n-1, columns n..ld-1 written as 0; ld a multiple of VW,
 * <= XENT_MAX_LD): the row becomes (softmax - onehot(tgt[p])) * scale, the gradient of the loss. Returns the
 * sum over rows of log(sum exp(logit)) - logit[tgt[p]]. */
AI double crossentropy_forward_backward(float *logits, const int ld, const int n, const int *tgt, const int P,
                                       const float scale) {
    float cols[XENT_MAX_LD * VW] __attribute__((aligned(64))); /* cols[c * VW + i]: class c of row p0 + i */
    double shifted = 0.0, prod = 1.0;                  /* sum of (max - target logit); product of the sums */
    int exponent = 0;
    for (int p0 = 0; p0 < P; p0 += VW) {
        const int live = P - p0 < VW ? P - p0 : VW;
        float *block = logits + (long)p0 * ld;
        for (int c0 = 0; c0 < ld; c0 += VW) {
            vf r[VW];
            for (int i = 0; i < VW; i++) r[i] = i < live ? v_load(block + (long)i * ld + c0) : v_zero();
            v_transpose(r);
            for (int i = 0; i < VW; i++) v_store(cols + (c0 + i) * VW, r[i]);
        }
        vf mx = v_load(cols);
        for (int c = 1; c < n; c++) mx = v_max(mx, v_load(cols + c * VW));
        vf sum = v_zero(), target = v_zero();
        float tg[VW];
        for (int i = 0; i < VW; i++) tg[i] = i < live ? (float)tgt[p0 + i] : -1.0f;
        const vf tv = v_load(tg);
        for (int c = 0; c < n; c++) {
            const vf x = v_load(cols + c * VW);
            const vf e = v_exp(v_sub(x, mx));
            target = v_select_eq(tv, v_set1((float)c), x, target);
            sum = v_add(sum, e);
            v_store(cols + c * VW, e);
        }
        const vf inv = v_div(v_set1(1.0f), sum), vscale = v_set1(scale);
        for (int c = 0; c < n; c++) {
            const vf pr = v_mul(v_load(cols + c * VW), inv);
            const vf g = v_select_eq(tv, v_set1((float)c), v_sub(pr, v_set1(1.0f)), pr);
            v_store(cols + c * VW, v_mul(g, vscale));
        }
        for (int c = n; c < ld; c++) v_store(cols + c * VW, v_zero());
        float m_s[VW], t_s[VW], s_s[VW];
        v_store(m_s, mx);
        v_store(t_s, target);
        v_store(s_s, sum);
        double block_prod = 1.0;
        for (int i = 0; i < live; i++) {
            shifted += (double)m_s[i] - (double)t_s[i];
            block_prod *= (double)s_s[i]; /* <= 256^VW: no overflow */
        }
        int e;
        prod = frexp(prod * block_prod, &e);
        exponent += e;
        for (int c0 = 0; c0 < ld; c0 += VW) {
            vf r[VW];
            for (int i = 0; i < VW; i++) r[i] = v_load(cols + (c0 + i) * VW);
            v_transpose(r);
            for (int i = 0; i < live; i++) v_store(block + (long)i * ld + c0, r[i]);
        }
    }
    return shifted + log(prod) + (double)exponent * M_LN2;
}

#endif /* EMG_X86_XENT_H */
