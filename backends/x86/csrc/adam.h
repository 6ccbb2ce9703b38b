/* Fused AdamW with the session's emg_optimizer: one pass reads g, m, v, p and writes m, v, p (the optimiser's
 * whole memory traffic once). The arithmetic follows eemicrogpt_core.model.optim.adam_update in float32, except
 * that the two bias corrections are multiplications by reciprocals computed in double (lr / bc1 and 1 / bc2):
 * one division per element instead of three (zmm divisions dominated Adam; the result moves by at most an ulp
 * or two), and that weight decay and the step are one FMA, p * (1 - lr wd) - step (one rounding where the
 * reference rounds twice: at most half an ulp of p apart). Clipping arrives as the factor the gradient is
 * multiplied by (emg_clip_scale of the whole gradient's sum of squares, grad_sum_squares below). */
#ifndef EMG_X86_ADAM_H
#define EMG_X86_ADAM_H

#include <math.h>
#include <stdint.h>

#include "simd.h"
#include "eemicrogpt.h"

/* The per-update values, as floats (the decay factor and the clipping factor are 1 when off). */
struct adam_consts {
    float b1, b2, c1, c2, lr_bc1, inv_bc2, eps, decay, scale;
};

/* The loop, with the decay and the clipping factor compiled in (1) or out (0): with both out it is the
 * original Adam's loop, operation for operation, so the default optimiser trains the same bits at the same
 * speed. Returns 0 when every updated parameter is finite, else 1: emg_all_finite's rule (x * 0 is NaN exactly
 * for Inf and NaN), judged in this pass so the fused step need not read the parameters again. */
AI int adam_loop(const int decayed, const int scaled, float *p, float *m, float *v, const float *g, long n,
                 const struct adam_consts *k) {
    const vf b1 = v_set1(k->b1), b2 = v_set1(k->b2), c1 = v_set1(k->c1), c2 = v_set1(k->c2);
    const vf lr_bc1 = v_set1(decayed ? -k->lr_bc1 : k->lr_bc1), inv_bc2 = v_set1(k->inv_bc2);
    const vf eps = v_set1(k->eps), decay = v_set1(k->decay), scale = v_set1(k->scale);
    vf check = v_zero(); /* stays 0 unless some parameter is Inf/NaN (then x*0 is NaN) */
    for (long i = 0; i < n; i += VW) {
        vf gi = v_load(g + i);
        if (scaled) gi = v_mul(gi, scale);
        vf mi = v_fma(c1, gi, v_mul(b1, v_load(m + i)));
        vf vi = v_fma(c2, v_mul(gi, gi), v_mul(b2, v_load(v + i)));
        /* decayed: the step's negation, exactly (lr_bc1 negated), so p * decay - step is one FMA */
        vf step_ = v_div(v_mul(lr_bc1, mi), v_add(v_sqrt(v_mul(vi, inv_bc2)), eps));
        vf pi = decayed ? v_fma(v_load(p + i), decay, step_) : v_sub(v_load(p + i), step_);
        v_store(m + i, mi);
        v_store(v + i, vi);
        v_store(p + i, pi);
        check = v_add(check, v_mul(pi, v_zero()));
    }
    float c = v_hsum(check);
    return c != c;
}

/* Update `step` (1-based) of p[0..n) with the optimiser `o` and learning rate lr, from the gradient g times
 * `scale` (the clipping factor, 1 when clipping is off or does not engage). n: a multiple of VW. Returns 1 when
 * some updated parameter is not finite. */
static int adam_update(float *p, float *m, float *v, const float *g, long n, int64_t step, float lr,
                       const emg_optimizer *o, float scale) {
    const double bc1 = 1.0 - pow((double)o->beta1, (double)step);
    const double bc2 = 1.0 - pow((double)o->beta2, (double)step);
    const struct adam_consts k = {
        .b1 = o->beta1, .b2 = o->beta2, .c1 = (float)(1.0 - (double)o->beta1), .c2 = (float)(1.0 - (double)o->beta2),
        .lr_bc1 = (float)((double)lr / bc1), .inv_bc2 = (float)(1.0 / bc2), .eps = o->eps,
        .decay = (float)(1.0 - (double)lr * (double)o->weight_decay), .scale = scale};
    const int decayed = o->weight_decay > 0.0f, scaled = scale != 1.0f;
    if (decayed) return scaled ? adam_loop(1, 1, p, m, v, g, n, &k) : adam_loop(1, 0, p, m, v, g, n, &k);
    return scaled ? adam_loop(0, 1, p, m, v, g, n, &k) : adam_loop(0, 0, p, m, v, g, n, &k);
}

/* The sum of g[0..n) squared, in double: eight running sums over the elements i % 8 (exact products: a float's
 * square fits a double's mantissa, so contraction into FMAs cannot change a bit), added in a fixed order. The
 * same bits on every ISA and for any vectorisation. */
static double grad_sum_squares(const float *g, long n) {
    double acc[8] = {0.0};
    long i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)g[i + j] * g[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += (double)g[i] * g[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

#endif /* EMG_X86_ADAM_H */
