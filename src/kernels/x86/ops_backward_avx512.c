/*
 * ops_backward_avx512.c — the backward row ops (ops_bwd_tmpl.h) on the
 * avx512 path, with the maths of vmath_avx512.h.
 */
#include <math.h>
#include <string.h>

#include "../ops_simd.h"
#include "vmath_avx512.h"
#define ISA_FN(name) vitc__##name##_avx512
#include "../ops_bwd_tmpl.h"
