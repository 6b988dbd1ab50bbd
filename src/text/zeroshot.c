/*
 * zeroshot.c — zero-shot classification's arithmetic, shared by the CLI's
 * `vitc zero-shot` and the Python binding's Model.zero_shot: the prompt
 * template sets, the class embeddings (prompt embeddings normalised,
 * averaged over the templates, normalised again) and the probabilities
 * (CLIP: a softmax over the labels; SigLIP: one sigmoid per label).
 *
 * Sums run in double: a logit is scale (100 for a trained CLIP) times a
 * cosine, so the float rounding of a D-term dot product would show in the
 * probabilities at the 1e-6 level.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"

/* OpenAI's 80 ImageNet prompts (the CLIP paper's notebook, open_clip's
 * OPENAI_IMAGENET_TEMPLATES, big_vision's CLIP_PAPER_PROMPT_TEMPLATES), in
 * their order: the average does not depend on it, the float sum barely. */
static const char *const zs_imagenet80[] = {
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "a photo of a {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
    "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.",
    "a plushie {}.",
    "a photo of the nice {}.",
    "a photo of the small {}.",
    "a photo of the weird {}.",
    "the cartoon {}.",
    "art of the {}.",
    "a drawing of the {}.",
    "a photo of the large {}.",
    "a black and white photo of a {}.",
    "the plushie {}.",
    "a dark photo of a {}.",
    "itap of a {}.",
    "graffiti of the {}.",
    "a toy {}.",
    "itap of my {}.",
    "a photo of a cool {}.",
    "a photo of a small {}.",
    "a tattoo of the {}.",
};

/* The 7 the notebook selected (open_clip's SIMPLE_IMAGENET_TEMPLATES). */
static const char *const zs_simple[] = {
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
};

const char *const *vitc_zero_shot_templates(const char *name, int *n) {
    if (name && !strcmp(name, "imagenet80")) {
        if (n)
            *n = (int)(sizeof zs_imagenet80 / sizeof *zs_imagenet80);
        return zs_imagenet80;
    }
    if (name && !strcmp(name, "simple")) {
        if (n)
            *n = (int)(sizeof zs_simple / sizeof *zs_simple);
        return zs_simple;
    }
    if (n)
        *n = 0;
    return NULL;
}

/* max(||x||, 1e-12), as F.normalize divides by, in double. */
static double zs_norm(const float *x, int64_t D) {
    double s = 0.0;
    for (int64_t i = 0; i < D; i++) s += (double)x[i] * x[i];
    s = sqrt(s);
    return s > 1e-12 ? s : 1e-12;
}

vitc_status vitc_zero_shot_classes(const float *text, int64_t K, int64_t T, int64_t D,
                                   float *classes) {
    if (K < 0 || T < 1 || D < 1 || (K > 0 && (!text || !classes)))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_zero_shot_classes: need K >= 0 classes, T >= 1 templates and "
                         "D >= 1 (got K=%lld, T=%lld, D=%lld) and non-NULL buffers",
                         (long long)K, (long long)T, (long long)D);
    double *acc = malloc((size_t)D * sizeof *acc); /* [D] */
    if (!acc)
        return vitc__err(VITC_ERR_NOMEM, "vitc_zero_shot_classes: out of memory for D=%lld",
                         (long long)D);
    for (int64_t k = 0; k < K; k++) {
        memset(acc, 0, (size_t)D * sizeof *acc);
        for (int64_t t = 0; t < T; t++) {
            const float *x = text + (k * T + t) * D; /* [D] */
            double inv = 1.0 / zs_norm(x, D);
            for (int64_t i = 0; i < D; i++) acc[i] += x[i] * inv;
        }
        double s = 0.0;
        for (int64_t i = 0; i < D; i++) {
            acc[i] /= (double)T;
            s += acc[i] * acc[i];
        }
        s = sqrt(s);
        s = s > 1e-12 ? s : 1e-12;
        for (int64_t i = 0; i < D; i++) classes[k * D + i] = (float)(acc[i] / s);
    }
    free(acc);
    return VITC_OK;
}

vitc_status vitc_zero_shot_probs(const float *images, int64_t B, const float *classes, int64_t K,
                                 int64_t D, float scale, float bias, int sigmoid, float *probs) {
    if (B < 0 || K < 1 || D < 1 || (B > 0 && (!images || !classes || !probs)))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_zero_shot_probs: need B >= 0 images, K >= 1 classes, D >= 1 "
                         "(got B=%lld, K=%lld, D=%lld) and non-NULL buffers",
                         (long long)B, (long long)K, (long long)D);
    if (!isfinite(scale) || !isfinite(bias))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_zero_shot_probs: the logit scale and bias must be finite");
    double *z = malloc((size_t)K * sizeof *z); /* [K] */
    if (!z)
        return vitc__err(VITC_ERR_NOMEM, "vitc_zero_shot_probs: out of memory for K=%lld",
                         (long long)K);
    for (int64_t b = 0; b < B; b++) {
        const float *v = images + b * D; /* [D] */
        double inv = 1.0 / zs_norm(v, D), mx = -INFINITY;
        for (int64_t k = 0; k < K; k++) {
            const float *c = classes + k * D; /* [D], unit */
            double s = 0.0;
            for (int64_t i = 0; i < D; i++) s += (double)v[i] * c[i];
            z[k] = (double)scale * (s * inv) + (sigmoid ? (double)bias : 0.0);
            if (z[k] > mx)
                mx = z[k];
        }
        float *p = probs + b * K; /* [K] */
        if (sigmoid) {
            /* each label on its own: SigLIP was trained with a sigmoid loss */
            for (int64_t k = 0; k < K; k++)
                p[k] = (float)(z[k] >= 0 ? 1.0 / (1.0 + exp(-z[k]))
                                         : exp(z[k]) / (1.0 + exp(z[k])));
        } else {
            double sum = 0.0;
            for (int64_t k = 0; k < K; k++) sum += (z[k] = exp(z[k] - mx));
            for (int64_t k = 0; k < K; k++) p[k] = (float)(z[k] / sum);
        }
    }
    free(z);
    return VITC_OK;
}
