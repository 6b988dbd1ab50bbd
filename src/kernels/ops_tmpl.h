/*
 * ops_tmpl.h — row ops written once over the vector vocabulary of
 * vmath_{avx512,avx2}.h and instantiated in ops_avx512.c and ops_avx2.c
 * (OPS_SUFFIX names the instance). The generic path runs the plain
 * references in ops.c.
 */
#define OPS_CAT2(a, b) a##b
#define OPS_CAT(a, b) OPS_CAT2(a, b)

/* dx = it * y o (dy - d), d = rowsum(dy o y): the VW products of a block
 * summed in float, the blocks in double (the reference sums in double). */
void OPS_CAT(vitc__softmax_rows_backward_, OPS_SUFFIX)(float *dx, const float *y, const float *dy,
                                                       int64_t rows, int64_t n,
                                                       float inv_temperature) {
    const VT it = v_set1(inv_temperature);
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * n, *gr = dy + r * n;
        float *xr = dx + r * n;
        double dot = 0.0;
        int64_t j = 0;
        for (; j + VW <= n; j += VW) dot += (double)v_hsum(v_mul(v_loadu(gr + j), v_loadu(yr + j)));
        for (; j < n; j++) dot += (double)(gr[j] * yr[j]);
        const VT d = v_set1((float)dot);
        for (j = 0; j + VW <= n; j += VW)
            v_storeu(xr + j, v_mul(v_mul(it, v_loadu(yr + j)), v_sub(v_loadu(gr + j), d)));
        for (; j < n; j++) xr[j] = inv_temperature * yr[j] * (gr[j] - (float)dot);
    }
}

#undef OPS_CAT
#undef OPS_CAT2
