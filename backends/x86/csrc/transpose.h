/* Out-of-place transpose in 16 x 16 tiles: both the 16 source rows and the 16 destination rows of a tile
 * stay in L1, where a plain row-by-row loop writes every element to a different cache line. */
#ifndef EMG_X86_TRANSPOSE_H
#define EMG_X86_TRANSPOSE_H

#include "simd.h"

#define TILE 16

/* dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols; participant tid of n does the blocks of
 * rows r0 = TILE * (tid + k * n). */
AI void transpose_part(const float *src, int rows, int cols, int ld_src, float *dst, int ld_dst, int tid, int n) {
    for (int r0 = TILE * tid; r0 < rows; r0 += TILE * n)
        for (int c0 = 0; c0 < cols; c0 += TILE) {
            const int r1 = r0 + TILE < rows ? r0 + TILE : rows, c1 = c0 + TILE < cols ? c0 + TILE : cols;
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++) dst[c * ld_dst + r] = src[r * ld_src + c];
        }
}

#endif /* EMG_X86_TRANSPOSE_H */
