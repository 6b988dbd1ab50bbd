/*
 * dropout.c — dropout and timm's drop path (stochastic depth), declared in
 * rng.h. Masks are drawn from the model's one generator so that a seeded
 * run is reproducible; applying a mask is the forward and, on dy, the
 * backward.
 */
#include "../rng.h"

/* torch scales by 1 / (1 - p) and gives zeros for p = 1 (not NaN). */
static float keep_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

void vitc__dropout_mask(uint8_t *keep, int64_t n, float p, vitc__rng *r) {
    for (int64_t i = 0; i < n; i++)
        keep[i] = vitc__rng_uniform(r) >= (double)p;
}

void vitc__dropout_apply(float *y, const float *x, const uint8_t *keep, int64_t n, float p) {
    const float s = keep_scale(p);
    for (int64_t i = 0; i < n; i++)
        y[i] = keep[i] ? x[i] * s : 0.0f;
}

void vitc__drop_path_apply(float *y, const float *x, const uint8_t *keep, int64_t B,
                           int64_t per_sample, float p, int accumulate) {
    const float s = keep_scale(p);
    for (int64_t b = 0; b < B; b++) {
        float *yb = y + b * per_sample;
        const float *xb = x + b * per_sample;
        const float f = keep[b] ? s : 0.0f;
        if (accumulate) {
            if (f != 0.0f) /* a dropped sample leaves the residual untouched */
                for (int64_t i = 0; i < per_sample; i++)
                    yb[i] += xb[i] * f;
        } else {
            for (int64_t i = 0; i < per_sample; i++)
                yb[i] = xb[i] * f;
        }
    }
}
