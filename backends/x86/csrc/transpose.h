/* Out-of-place transpose in 16 x 16 tiles: both the 16 source rows and the 16 destination rows of a tile
 * stay in L1, where a plain row-by-row loop writes every element to a different cache line. */
#ifndef EMG_X86_TRANSPOSE_H
#define EMG_X86_TRANSPOSE_H

#include "simd.h"

#define TILE 16

/* dst[c * ld_dst + r] = src[r * ld_src + c] for row_lo <= r < row_hi (row_lo a multiple of TILE; row_hi one
 * too, or rows), c < cols. Whole VW x VW blocks go through registers (v_transpose): the scalar loop cost ~5%
 * of the d64 step. */
AI void transpose_rows(const float *src, int rows, int cols, int ld_src, float *dst, int ld_dst, int row_lo,
                       int row_hi) {
    for (int r0 = row_lo; r0 < row_hi; r0 += TILE)
        for (int c0 = 0; c0 < cols; c0 += TILE) {
            const int r1 = r0 + TILE < rows ? r0 + TILE : rows, c1 = c0 + TILE < cols ? c0 + TILE : cols;
            if (r1 - r0 == TILE && c1 - c0 == TILE) {
                for (int rb = r0; rb < r1; rb += VW)
                    for (int cb = c0; cb < c1; cb += VW) {
                        vf v[VW];
                        for (int i = 0; i < VW; i++) v[i] = v_load(src + (long)(rb + i) * ld_src + cb);
                        v_transpose(v);
                        for (int i = 0; i < VW; i++) v_store(dst + (long)(cb + i) * ld_dst + rb, v[i]);
                    }
                continue;
            }
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++) dst[c * ld_dst + r] = src[r * ld_src + c];
        }
}

#endif /* EMG_X86_TRANSPOSE_H */
