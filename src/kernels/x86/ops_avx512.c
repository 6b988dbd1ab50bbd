/*
 * ops_avx512.c — the forward row ops and softmax's backward (ops_tmpl.h) on
 * the avx512 path, with the maths of vmath_avx512.h.
 */
#include <math.h>
#include <string.h>

#include "../ops_simd.h"
#include "vmath_avx512.h"
#define ISA_FN(name) vitc__##name##_avx512
#include "../ops_tmpl.h"
