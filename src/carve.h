/*
 * carve.h — one scratch buffer cut into consecutive regions: each region's
 * float offset, 64-byte aligned so SIMD rows load aligned, with every size
 * checked for overflow (ok = 0 once any overflows; the caller then reports
 * and allocates nothing).
 */
#ifndef VITC_CARVE_H
#define VITC_CARVE_H

#include <stddef.h>

#include "internal.h"

typedef struct vitc__carve { size_t used; int ok; } vitc__carve;

/* A region of a * b floats; returns its offset. */
static inline size_t vitc__take(vitc__carve *c, size_t a, size_t b) {
    size_t n, at = c->used;
    if (!vitc__mul_size(a, b, &n) || !vitc__add_size(n, 15, &n))
        c->ok = 0;
    n &= ~(size_t)15;
    if (!vitc__add_size(c->used, n, &c->used))
        c->ok = 0;
    return at;
}

#endif
