/* Causal multi-head attention over one packed sequence (L live rows, L <= 15), vectorised along the
 * query position t: a sequence fits one 16-lane row (MAX_SEQ = 16), so for each head the scores are
 * L rows S^T[u][t] (key u, lanes t) and the softmax over u is element-wise across rows (max, exp, sum):
 * no horizontal reductions. Row-major q/k/v/out rows are transposed into [feature][16] tiles per sequence.
 *
 * att keeps P^T per (head, key row): att[(h * L + u) * 16 + t], zero where t < u, for the backward pass.
 * HD = D / H is a compile-time constant at every call site. */
#ifndef EMG_X86_ATTENTION_H
#define EMG_X86_ATTENTION_H

#include <math.h>

#include "expf.h"

#define ATT_ROW 16 /* lanes of one attention row: MAX_SEQ */
#define ATT_ALIGN __attribute__((aligned(64)))

/* Sequences of at most SHORT_SEQ live rows (most names) only need the 8 x 8 corner of each 16 x 16 block:
 * their transposes go through v_transpose_lo8. */
#define SHORT_SEQ 8

/* Zero lanes VW..ATT_ROW-1 of a lane row whose first VW lanes were stored from v_transpose_lo8 (nothing to
 * do when VW = 16: its lanes 8-15 are zero already). */
AI void zero_upper_lanes(float *row) {
    for (int c = VW; c < ATT_ROW; c += VW) v_store(row + c, v_zero());
}

/* dst[j][t] = src[t * ld + j] for t < L (lanes t >= L zero), j < n (a multiple of VW): VW x VW blocks
 * transposed in registers (measured ~5% of the whole step faster than a scalar loop at d16-d64). */
AI void to_lanes(const int n, const float *src, int ld, int L, float *dst) {
    if (L <= SHORT_SEQ) {
        for (int j0 = 0; j0 < n; j0 += 8) {
            vf r[8];
            for (int i = 0; i < 8; i++) r[i] = i < L ? v_load_lo8(src + i * ld + j0) : v_zero();
            v_transpose_lo8(r);
            for (int i = 0; i < 8; i++) {
                v_store(dst + (j0 + i) * ATT_ROW, r[i]);
                zero_upper_lanes(dst + (j0 + i) * ATT_ROW);
            }
        }
        return;
    }
    for (int j0 = 0; j0 < n; j0 += VW)
        for (int t0 = 0; t0 < ATT_ROW; t0 += VW) {
            vf r[VW];
            for (int i = 0; i < VW; i++) r[i] = t0 + i < L ? v_load(src + (t0 + i) * ld + j0) : v_zero();
            v_transpose(r);
            for (int i = 0; i < VW; i++) v_store(dst + (j0 + i) * ATT_ROW + t0, r[i]);
        }
}

/* dst[t * ld + j] = src[j][t] for t < L, j < n (a multiple of VW). */
AI void from_lanes(const int n, const float *src, int L, float *dst, int ld) {
    if (L <= SHORT_SEQ) {
        for (int j0 = 0; j0 < n; j0 += 8) {
            vf r[8];
            for (int i = 0; i < 8; i++) r[i] = v_load(src + (j0 + i) * ATT_ROW);
            v_transpose_lo8(r);
            for (int i = 0; i < L; i++) v_store_lo8(dst + i * ld + j0, r[i]);
        }
        return;
    }
    for (int j0 = 0; j0 < n; j0 += VW)
        for (int t0 = 0; t0 < L; t0 += VW) {
            vf r[VW];
            for (int i = 0; i < VW; i++) r[i] = v_load(src + (j0 + i) * ATT_ROW + t0);
            v_transpose(r);
            for (int i = 0; i < VW && t0 + i < L; i++) v_store(dst + (t0 + i) * ld + j0, r[i]);
        }
}

/* dst[b][a] = src[a][b] for a 16 x 16 tile whose rows a >= L read as zero (all 16 dst rows written, or
 * for L <= SHORT_SEQ the first 8). */
AI void transpose_tile(const float *src, int L, float *dst) {
    if (L <= SHORT_SEQ) {
        vf r[8];
        for (int i = 0; i < 8; i++) r[i] = i < L ? v_load(src + i * ATT_ROW) : v_zero();
        v_transpose_lo8(r);
        for (int i = 0; i < 8; i++) {
            v_store(dst + i * ATT_ROW, r[i]);
            zero_upper_lanes(dst + i * ATT_ROW);
        }
        return;
    }
    for (int a0 = 0; a0 < ATT_ROW; a0 += VW)
        for (int b0 = 0; b0 < ATT_ROW; b0 += VW) {
            vf r[VW];
            for (int i = 0; i < VW; i++) r[i] = a0 + i < L ? v_load(src + (a0 + i) * ATT_ROW + b0) : v_zero();
            v_transpose(r);
            for (int i = 0; i < VW; i++) v_store(dst + (b0 + i) * ATT_ROW + a0, r[i]);
        }
}

/* out[(j0 + i) * 16 + c ...] (for i < 4, the 16 lanes) = sum over r < L of w[r * ldw + j0 + i] * rows[r][lanes]:
 * four independent register accumulators per lane chunk, so no load-add-store chain through memory. */
AI void accumulate4(const float *w, int ldw, const float *rows, int L, float *out) {
    for (int c = 0; c < ATT_ROW; c += VW) {
        vf a0 = v_zero(), a1 = v_zero(), a2 = v_zero(), a3 = v_zero();
        for (int r = 0; r < L; r++) {
            const vf x = v_load(rows + r * ATT_ROW + c);
            const float *wr = w + r * ldw;
            a0 = v_fma(v_set1(wr[0]), x, a0);
            a1 = v_fma(v_set1(wr[1]), x, a1);
            a2 = v_fma(v_set1(wr[2]), x, a2);
            a3 = v_fma(v_set1(wr[3]), x, a3);
        }
        v_store(out + 0 * ATT_ROW + c, a0);
        v_store(out + 1 * ATT_ROW + c, a1);
        v_store(out + 2 * ATT_ROW + c, a2);
        v_store(out + 3 * ATT_ROW + c, a3);
    }
}

/* Each phase (scores, exp, normalisation, weighted sum) runs over every head before the next starts: the
 * heads' chains (max over keys -> exp -> sum -> division) are independent, so short sequences keep the
 * vector units busy instead of waiting on one head's latencies (measured at d16: see the README). */
AI void attn_fwd(const int D, const int H, const float *qkv, float *o, float *att, int L) {
    const int HD = D / H, QS = 3 * D, NCH = ATT_ROW / VW;
    const float scale = 1.0f / sqrtf((float)HD);
    float qt[D * ATT_ROW] ATT_ALIGN, ot[D * ATT_ROW] ATT_ALIGN;
    vf mx[H * NCH], sum[H * NCH]; /* per head and lane chunk */
    to_lanes(D, qkv, QS, L, qt);
    for (int i = 0; i < H * NCH; i++) mx[i] = v_set1(-INFINITY), sum[i] = v_zero();
    for (int u = 0; u < L; u++) /* scores of key u against every query t (valid for t >= u) */
        for (int h = 0; h < H; h++) {
            const float *k = qkv + u * QS + D + h * HD;
            float *pt = att + h * L * ATT_ROW;
            for (int c = 0; c < ATT_ROW; c += VW) {
                vf s = v_zero();
                for (int j = 0; j < HD; j++) s = v_fma(v_set1(k[j]), v_load(qt + (h * HD + j) * ATT_ROW + c), s);
                s = v_from_n_or(v_mul(s, v_set1(scale)), u - c, -INFINITY);
                mx[h * NCH + c / VW] = v_max(mx[h * NCH + c / VW], s);
                v_store(pt + u * ATT_ROW + c, s);
            }
        }
    for (int u = 0; u < L; u++)
        for (int h = 0; h < H; h++) {
            float *pt = att + h * L * ATT_ROW;
            for (int c = 0; c < ATT_ROW; c += VW) {
                vf e = v_exp(v_sub(v_load(pt + u * ATT_ROW + c), mx[h * NCH + c / VW]));
                sum[h * NCH + c / VW] = v_add(sum[h * NCH + c / VW], e);
                v_store(pt + u * ATT_ROW + c, e);
            }
        }
    for (int i = 0; i < H * NCH; i++) sum[i] = v_div(v_set1(1.0f), sum[i]);
    for (int u = 0; u < L; u++)
        for (int h = 0; h < H; h++) {
            float *pt = att + h * L * ATT_ROW;
            for (int c = 0; c < ATT_ROW; c += VW)
                v_store(pt + u * ATT_ROW + c, v_mul(v_load(pt + u * ATT_ROW + c), sum[h * NCH + c / VW]));
        }
    for (int h = 0; h < H; h++)
        for (int j = 0; j < HD; j += 4) /* out^T[j][t] = sum_u v[u][j] P^T[u][t] */
            accumulate4(qkv + 2 * D + h * HD + j, QS, att + h * L * ATT_ROW, L, ot + (h * HD + j) * ATT_ROW);
    from_lanes(D, ot, L, o, D);
}

/* dqkv (the sequence's L rows, all 3*D columns) from the attention output gradient dout. As in attn_fwd,
 * the softmax backward runs each phase over every head. */
AI void attn_bwd(const int D, const int H, const float *qkv, const float *att, const float *dout, float *dqkv,
                 int L) {
    const int HD = D / H, QS = 3 * D, NCH = ATT_ROW / VW, TILE_F = ATT_ROW * ATT_ROW;
    const float scale = 1.0f / sqrtf((float)HD);
    float dot[D * ATT_ROW] ATT_ALIGN;                     /* dout^T: [feature][t] */
    float dqt[D * ATT_ROW] ATT_ALIGN;                     /* dq^T:   [feature][t] */
    float dkt[D * ATT_ROW] ATT_ALIGN, dvt[D * ATT_ROW] ATT_ALIGN; /* [feature][u] */
    float ds_t[H * TILE_F] ATT_ALIGN;                     /* per head: dS^T[u][t] */
    float p_r[ATT_ROW * ATT_ROW] ATT_ALIGN, ds_r[ATT_ROW * ATT_ROW] ATT_ALIGN; /* P[t][u], dS[t][u] */
    vf rowdot[H * NCH];                                   /* per head and lane chunk: sum_u P dP */
    to_lanes(D, dout, D, L, dot);
    for (int i = 0; i < H * NCH; i++) rowdot[i] = v_zero();
    for (int u = 0; u < L; u++) /* dP^T[u][t] = dout[t] . v[u] (per head) */
        for (int h = 0; h < H; h++) {
            const float *v = qkv + u * QS + 2 * D + h * HD, *pt = att + h * L * ATT_ROW;
            for (int c = 0; c < ATT_ROW; c += VW) {
                vf dp = v_zero();
                for (int j = 0; j < HD; j++) dp = v_fma(v_set1(v[j]), v_load(dot + (h * HD + j) * ATT_ROW + c), dp);
                rowdot[h * NCH + c / VW] = v_fma(v_load(pt + u * ATT_ROW + c), dp, rowdot[h * NCH + c / VW]);
                v_store(ds_t + h * TILE_F + u * ATT_ROW + c, dp);
            }
        }
    for (int u = 0; u < L; u++) /* dS = P (dP - sum_u P dP), times the score scale */
        for (int h = 0; h < H; h++) {
            const float *pt = att + h * L * ATT_ROW;
            float *dsh = ds_t + h * TILE_F;
            for (int c = 0; c < ATT_ROW; c += VW) {
                vf p = v_load(pt + u * ATT_ROW + c);
                vf ds = v_mul(v_mul(p, v_sub(v_load(dsh + u * ATT_ROW + c), rowdot[h * NCH + c / VW])), v_set1(scale));
                v_store(dsh + u * ATT_ROW + c, ds);
            }
        }
    for (int h = 0; h < H; h++) {
        const float *pt = att + h * L * ATT_ROW, *dsh = ds_t + h * TILE_F;
        for (int j = 0; j < HD; j += 4) /* dq^T[j][t] = sum_u k[u][j] dS^T[u][t] */
            accumulate4(qkv + D + h * HD + j, QS, dsh, L, dqt + (h * HD + j) * ATT_ROW);
        /* dk and dv sum over queries t: switch P and dS to lanes u. */
        transpose_tile(pt, L, p_r); /* lanes u >= L come out zero; rows t >= L are never read (nor written
                                     * for L <= SHORT_SEQ) */
        transpose_tile(dsh, L, ds_r);
        for (int j = 0; j < HD; j += 4) { /* lanes u: dk^T = sum_t q[t] dS[t], dv^T = sum_t dout[t] P[t] */
            accumulate4(qkv + h * HD + j, QS, ds_r, L, dkt + (h * HD + j) * ATT_ROW);
            accumulate4(dout + h * HD + j, D, p_r, L, dvt + (h * HD + j) * ATT_ROW);
        }
    }
    from_lanes(D, dqt, L, dqkv, QS);
    from_lanes(D, dkt, L, dqkv + D, QS);
    from_lanes(D, dvt, L, dqkv + 2 * D, QS);
}

#endif /* EMG_X86_ATTENTION_H */
