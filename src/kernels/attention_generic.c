/* attention_generic.c — the tiled attention kernel in portable C: the same
 * algorithm and blocking as the SIMD paths with a one-lane "vector", for
 * machines without AVX2 (and as a readable twin of the fast paths). */
#include <math.h>
#include <string.h>

#include "attention_impl.h"

#define VT float
#define VW 1
#define MR_S 4
#define MR_PV 4
#define ATT_SMALL_DV 0
#define NV_PV 4

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
#define v_exp2(x) exp2f(x)
#define s_exp2(x) exp2f(x)

#define ATT_FN vitc__attn_rows_generic
#include "attention_tmpl.h"
