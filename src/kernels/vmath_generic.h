/*
 * vmath_generic.h — the vector vocabulary of x86/vmath_avx512.h with a one-lane
 * "vector" in portable C: the templates instantiated over it are the
 * readable twins of the SIMD paths. The maths is libm's.
 */
#ifndef VITC_VMATH_GENERIC_H
#define VITC_VMATH_GENERIC_H

#include <math.h>

#define VT float
#define VW 1

#define v_zero() 0.0f
#define v_set1(x) (x)
#define v_load(p) (*(p))
#define v_store(p, x) (*(p) = (x))
#define v_loadu(p) (*(p))
#define v_storeu(p, x) (*(p) = (x))
#define v_fma(a, b, c) ((a) * (b) + (c))
#define v_mul(a, b) ((a) * (b))
#define v_add(a, b) ((a) + (b))
#define v_sub(a, b) ((a) - (b))
/* As vmaxps: NaN in b comes through. */
#define v_max(a, b) ((a) > (b) ? (a) : (b))
/* One lane: a partial vector never occurs. */
#define v_loadu_n(p, n) (*(p))
#define v_storeu_n(p, x, n) (*(p) = (x))
#define v_tail(x, n, f) (x)
#define v_hmax(x) (x)
#define v_hsum(x) (x)
#define v_exp(x) expf(x)
#define v_exp2(x) exp2f(x)
#define v_exp2_lp(x) exp2f(x)
#define s_exp2(x) exp2f(x)
#define v_div(a, b) ((a) / (b))
#define v_zero_gt(x, z, f) ((z) > (f) ? 0.0f : (x))
#define V_MASKED_TAIL 0

#endif
