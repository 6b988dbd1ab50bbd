/*
 * rng.h — the one random number generator of libvitc: splitmix64. Small,
 * deterministic, the same stream on every platform, so a seed gives the
 * same layer initialisation, dropout masks and benchmark inputs everywhere.
 * Header-only (static inline) so kernels, tools and tests share the engine
 * without an exported symbol.
 */
#ifndef VITC_RNG_H
#define VITC_RNG_H

#include <stdint.h>

typedef struct vitc__rng {
    uint64_t s;
} vitc__rng;

static inline uint64_t vitc__rng_next(vitc__rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 random bits: exactly representable in float, so
 * comparing it with a float probability never rounds differently in float
 * and double. */
static inline double vitc__rng_uniform(vitc__rng *r) {
    return (double)(vitc__rng_next(r) >> 40) / 16777216.0;
}

/* Uniform in [0, 1) with 53 random bits (a full double mantissa). */
static inline double vitc__rng_uniform53(vitc__rng *r) {
    return (double)(vitc__rng_next(r) >> 11) / 9007199254740992.0;
}

/* ---- dropout and drop path (src/train/dropout.c) --------------------
 * nn.Dropout / timm DropPath semantics: an element (dropout) or a whole
 * sample (drop path) is kept with probability 1 - p and the kept values are
 * scaled by 1 / (1 - p) ("inverted" dropout), so eval mode is the identity.
 * p = 1 drops everything (output 0, as torch), p = 0 keeps everything
 * without touching the generator's result (every uniform draw is >= 0).
 * The backward of an apply is the same apply on dy with the same mask. */

/* keep[i] = 1 with probability 1 - p: one generator draw per element, kept
 * when uniform >= p. */
void vitc__dropout_mask(uint8_t *keep /* [n] */, int64_t n, float p, vitc__rng *r);
/* y = x * keep / (1 - p) (0 where dropped). y may equal x. */
void vitc__dropout_apply(float *y /* [n] */, const float *x /* [n] */,
                         const uint8_t *keep /* [n] */, int64_t n, float p);
/* Drop path (stochastic depth) over B samples of `per_sample` floats each:
 * y[b] (+)= x[b] * keep[b] / (1 - p). accumulate = 1 adds into y (the
 * residual branch `x + drop_path(f(x))`), 0 writes it. The mask comes from
 * vitc__dropout_mask(keep, B, p, r). y may equal x when accumulate is 0. */
void vitc__drop_path_apply(float *y /* [B, per_sample] */, const float *x /* [B, per_sample] */,
                           const uint8_t *keep /* [B] */, int64_t B, int64_t per_sample,
                           float p, int accumulate);

#endif
