/*
 * ops_avx2.c — the forward row ops and softmax's backward (ops_tmpl.h) on
 * the avx2 path, with the maths of vmath_avx2.h.
 */
#include <math.h>
#include <string.h>

#include "../ops_simd.h"
#include "vmath_avx2.h"
#define ISA_FN(name) vitc__##name##_avx2
#include "../ops_tmpl.h"
