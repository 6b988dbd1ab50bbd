/*
 * ops_backward_avx2.c — the backward row ops (ops_bwd_tmpl.h) on the
 * avx2 path, with the maths of vmath_avx2.h.
 */
#include <math.h>
#include <string.h>

#include "ops_simd.h"
#if defined(__x86_64__) || defined(__i386__)
#include "vmath_avx2.h"
#define BWD_FN(name) vitc__##name##_avx2
#include "ops_bwd_tmpl.h"
#else /* not x86: dispatch never picks this path; the symbols keep the table linking */
void vitc__gelu_backward_avx2(float *dx, const float *dy, const float *x, int64_t n) {
    vitc__gelu_backward_ref(dx, dy, x, n);
}
void vitc__layernorm_backward_row_avx2(float *dx, const float *dy, const float *x,
                                       const float *w, int64_t C, float mean, float rstd) {
    vitc__layernorm_backward_row_ref(dx, dy, x, w, C, mean, rstd);
}
#endif
