/* The token and position embeddings: each packed row's input is tok_emb[token] + pos_emb[position]. */
#ifndef EMG_X86_ENCODER_H
#define EMG_X86_ENCODER_H

#include <string.h>

#include "norm.h"
#include "simd.h"

/* x[p] = tok_emb[tok[p]] + pos_emb[pos[p]] for p < P, zero for padding rows P <= p < Pp; ms[p] = mean(x[p]^2)
 * (the embedding norm's input). */
AI void encoder_forward(const int D, const float *tok_emb, const float *pos_emb, const int *tok, const int *pos,
                        int P, int Pp, float *x, float *ms) {
    for (int p = 0; p < Pp; p++) {
        float *e = x + p * D;
        if (p < P) {
            const float *te = tok_emb + tok[p] * D, *pe = pos_emb + pos[p] * D;
            for (int i = 0; i < D; i += VW) v_store(e + i, v_add(v_load(te + i), v_load(pe + i)));
        } else {
            memset(e, 0, sizeof(float) * D);
        }
        ms[p] = rmsnorm_mean_sq(D, e);
    }
}

/* The gradient of one row's embedding sum, de, scattered into both tables' rows. */
AI void encoder_backward(const int D, const float *de, float *g_tok_row, float *g_pos_row) {
    for (int i = 0; i < D; i += VW) {
        const vf d = v_load(de + i);
        v_store(g_tok_row + i, v_add(v_load(g_tok_row + i), d));
        v_store(g_pos_row + i, v_add(v_load(g_pos_row + i), d));
    }
}

#endif /* EMG_X86_ENCODER_H */
