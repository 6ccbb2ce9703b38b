/* The lane layout shared by attention.h and attention_pairs.h: a sequence's rows as lane rows of att_lanes(L)
 * lanes (position t in lane t), the in-register transposes into and out of it, and the softmax over keys in
 * that layout (forward and backward). */
#ifndef EMG_X86_ATTENTION_LANES_H
#define EMG_X86_ATTENTION_LANES_H

#include "expf.h"
#include "simd.h"

/* Sequences of at most SHORT_SEQ live rows (most names) only need the 8 x 8 corner of each VW x VW block:
 * their transposes go through v_transpose_lo8. */
#define SHORT_SEQ 8

/* The lane transposes are called, not inlined: each is a few dozen shuffles per block, against a call's few
 * cycles, and one copy each keeps the per-width step compiles small. */
#define LANES_FN static __attribute__((noinline, unused))

/* Lanes of a sequence's lane rows: L rounded up to whole vectors. */
AI int att_lanes(int L) { return (L + VW - 1) / VW * VW; }

/* dst[j][t] = src[t * ld + j] for t < L (lanes t >= L zero), j < n (a multiple of 8): blocks transposed in
 * registers (measured ~5% of the whole step faster than a scalar loop at d16-d64). */
LANES_FN void to_lanes(const int n, const float *src, int ld, int L, int LW, float *restrict dst) {
    if (L <= SHORT_SEQ) { /* one block of lanes; with VW = 16 its lanes 8-15 come out zero */
        for (int j0 = 0; j0 < n; j0 += 8) {
            vf r[8];
            for (int i = 0; i < 8; i++) r[i] = i < L ? v_load_lo8(src + i * ld + j0) : v_zero();
            v_transpose_lo8(r);
            for (int i = 0; i < 8; i++) v_store(dst + (j0 + i) * LW, r[i]);
        }
        return;
    }
    for (int j0 = 0; j0 < n; j0 += VW)
        for (int t0 = 0; t0 < LW; t0 += VW) {
            vf r[VW];
            for (int i = 0; i < VW; i++) r[i] = t0 + i < L ? v_load(src + (t0 + i) * ld + j0) : v_zero();
            v_transpose(r);
            for (int i = 0; i < VW; i++) v_store(dst + (j0 + i) * LW + t0, r[i]);
        }
}

/* dst[t * ld + j] = src[j][t] for t < L, j < n (a multiple of 8). */
LANES_FN void from_lanes(const int n, const float *src, int L, int LW, float *dst, int ld) {
    if (L <= SHORT_SEQ) {
        for (int j0 = 0; j0 < n; j0 += 8) {
            vf r[8];
            for (int i = 0; i < 8; i++) r[i] = v_load(src + (j0 + i) * LW);
            v_transpose_lo8(r);
            for (int i = 0; i < L; i++) v_store_lo8(dst + i * ld + j0, r[i]);
        }
        return;
    }
    for (int j0 = 0; j0 < n; j0 += VW)
        for (int t0 = 0; t0 < L; t0 += VW) {
            vf r[VW];
            for (int i = 0; i < VW; i++) r[i] = v_load(src + (j0 + i) * LW + t0);
            v_transpose(r);
            for (int i = 0; i < VW && t0 + i < L; i++) v_store(dst + (t0 + i) * ld + j0, r[i]);
        }
}

/* dst[b * LW + a] = src[a * LW + b] for the blocks of an L x LW lane matrix that causal attention uses (lane
 * block of b >= lane block of a); rows a >= L read as zero. For L <= SHORT_SEQ only the first 8 dst rows. */
LANES_FN void transpose_causal(const float *src, int L, int LW, float *restrict dst) {
    if (L <= SHORT_SEQ) {
        vf r[8];
        for (int i = 0; i < 8; i++) r[i] = i < L ? v_load(src + i * LW) : v_zero();
        v_transpose_lo8(r);
        for (int i = 0; i < 8; i++) v_store(dst + i * LW, r[i]);
        return;
    }
    for (int a0 = 0; a0 < LW; a0 += VW)
        for (int b0 = a0; b0 < LW; b0 += VW) {
            vf r[VW];
            for (int i = 0; i < VW; i++) r[i] = a0 + i < L ? v_load(src + (a0 + i) * LW + b0) : v_zero();
            v_transpose(r);
            for (int i = 0; i < VW; i++) v_store(dst + (b0 + i) * LW + a0, r[i]);
        }
}

/* The softmax over keys u < keys of the scores in att rows (g * L + u) * LW + c, one vector per group g <
 * G (a head, or attention_pairs.h's head pair) and key, given each group's maximum mx[g]: exp phase over
 * every group, then the normalisation, so the groups' exp -> sum -> division chains overlap. */
AI void softmax_keys(const int G, float *att, int L, const int LW, int c, int keys, const vf *mx) {
    vf sum[G];
    for (int g = 0; g < G; g++) sum[g] = v_zero();
    for (int u = 0; u < keys; u++)
        for (int g = 0; g < G; g++) {
            float *pt = att + (g * L + u) * LW + c;
            const vf e = v_exp(v_sub(v_load(pt), mx[g]));
            sum[g] = v_add(sum[g], e);
            v_store(pt, e);
        }
    for (int g = 0; g < G; g++) sum[g] = v_div(v_set1(1.0f), sum[g]);
    for (int u = 0; u < keys; u++)
        for (int g = 0; g < G; g++) {
            float *pt = att + (g * L + u) * LW + c;
            v_store(pt, v_mul(v_load(pt), sum[g]));
        }
}

/* The softmax backward in place, laid out as softmax_keys: dS = P (dP - sum_u P dP) * scale, with ds
 * holding dP and rowdot[g] the group's sum_u P dP. */
AI void softmax_keys_backward(const int G, const float *att, float *ds, int L, const int LW, int c, int keys,
                              const vf *rowdot, float scale) {
    for (int u = 0; u < keys; u++)
        for (int g = 0; g < G; g++) {
            float *dsg = ds + (g * L + u) * LW + c;
            const vf p = v_load(att + (g * L + u) * LW + c);
            v_store(dsg, v_mul(v_mul(p, v_sub(v_load(dsg), rowdot[g])), v_set1(scale)));
        }
}

#endif /* EMG_X86_ATTENTION_LANES_H */
