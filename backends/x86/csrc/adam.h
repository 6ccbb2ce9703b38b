/* Fused Adam: one pass reads g, m, v, p and writes m, v, p (the optimiser's whole memory traffic once).
 * The arithmetic follows eemicrogpt_core.model.optim.adam_update in float32, except that the two bias corrections
 * are multiplications by reciprocals computed in double (lr / bc1 and 1 / bc2): one division per element
 * instead of three (zmm divisions dominated Adam; the result moves by at most an ulp or two). */
#ifndef EMG_X86_ADAM_H
#define EMG_X86_ADAM_H

#include <math.h>
#include <stdint.h>

#include "simd.h"
#include "eemicrogpt.h"

/* Returns 0 when every updated parameter is finite, else 1: emg_all_finite's rule (x * 0 is NaN exactly for Inf
 * and NaN), judged in this pass so the fused step need not read the parameters again. n: a multiple of VW. */
static int adam_update(float *p, float *m, float *v, const float *g, long n, int64_t step, float lr) {
    const double bc1 = 1.0 - pow((double)EMG_ADAM_BETA1, (double)step);
    const double bc2 = 1.0 - pow((double)EMG_ADAM_BETA2, (double)step);
    const vf b1 = v_set1(EMG_ADAM_BETA1), b2 = v_set1(EMG_ADAM_BETA2);
    const vf c1 = v_set1((float)(1.0 - (double)EMG_ADAM_BETA1)), c2 = v_set1((float)(1.0 - (double)EMG_ADAM_BETA2));
    const vf lr_bc1 = v_set1((float)((double)lr / bc1)), inv_bc2 = v_set1((float)(1.0 / bc2));
    const vf eps = v_set1(EMG_ADAM_EPS);
    vf check = v_zero(); /* stays 0 unless some parameter is Inf/NaN (then x*0 is NaN) */
    for (long i = 0; i < n; i += VW) {
        vf gi = v_load(g + i);
        vf mi = v_fma(c1, gi, v_mul(b1, v_load(m + i)));
        vf vi = v_fma(c2, v_mul(gi, gi), v_mul(b2, v_load(v + i)));
        vf step_ = v_div(v_mul(lr_bc1, mi), v_add(v_sqrt(v_mul(vi, inv_bc2)), eps));
        vf pi = v_sub(v_load(p + i), step_);
        v_store(m + i, mi);
        v_store(v + i, vi);
        v_store(p + i, pi);
        check = v_add(check, v_mul(pi, v_zero()));
    }
    float c = v_hsum(check);
    return c != c;
}

#endif /* EMG_X86_ADAM_H */
