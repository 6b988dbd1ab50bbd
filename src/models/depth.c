/*
 * depth.c — Depth Anything (transformers' DepthAnythingForDepthEstimation,
 * V1 and V2: the same modules, V2 other config values): a DINOv2 backbone
 * read at four stages, the DPT neck and head, and the DPT image processor
 * around them.
 *
 *   h_i = layernorm(hidden_states[out_indices[i]])[:, 1:]  [B, gh*gw, C]
 *   reassemble: 1x1 conv to neck_i, then conv-transpose f x f / f (f > 1),
 *               identity (f = 1) or conv 3x3 / (1 / f), pad 1 (f < 1)
 *   neck: conv 3x3 (no bias) to F = fusion_hidden_size
 *   fusion, deepest first: h = prev + RCU1(feature) (feature resized to
 *               prev's size when they differ), h = RCU2(h), bilinear to
 *               the next feature's size (x2 for the last), 1x1 conv
 *   head: conv 3x3 to F/2, bilinear to the input size, conv 3x3, ReLU,
 *         conv 1x1 to 1, ReLU (relative) or sigmoid (metric), * max_depth
 *
 * Every map is channels-last [B, h, w, C] (src/nn/dense.h), so the
 * backbone's token rows are already the first map and nothing is permuted
 * but the checkpoint's conv weights, once, while loading. The backbone is
 * vitc's DINOv2 model (its Hub reader with the "backbone." prefix), run
 * through vitc__vit_forward_layers so its blocks run once for all four
 * taps.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../nn/dense.h"
#include "family.h"
#include "vit_internal.h"

#define DEPTH_MAX_LEVELS 8
/* The largest preprocessed input: the head's 3x3 convolutions run at the
 * input resolution (their im2col is 9 * channels floats per pixel), so
 * this bounds a forward's memory near 2 GiB for the large model. */
#define DEPTH_MAX_INPUT_PIXELS (2048 * 2048)
/* A forward's maps (the batch's head at full resolution, the backbone's
 * taps): 4 GiB. */
#define DEPTH_MAX_FORWARD_BYTES (4LL << 30)
/* The largest depth map predict returns (float32, the image's size). */
#define DEPTH_MAX_OUTPUT_PIXELS (100LL * 1000 * 1000)

/* A pre-activation residual conv unit: x + conv2(relu(conv1(relu(x)))). */
typedef struct depth_rcu {
    vitc__nn_conv c1, c2;
} depth_rcu;

typedef struct depth_level {
    vitc__nn_conv proj; /* reassemble's 1x1 projection C -> neck_i */
    int resize;         /* 0 identity, 1 transposed conv, 2 strided conv */
    vitc__nn_convt up;
    vitc__nn_conv down;
    vitc__nn_conv conv; /* the neck's 3x3 to F, no bias */
    /* fusion_stage.layers[i]: layer 0 takes the deepest feature */
    vitc__nn_conv fproj;
    depth_rcu res1, res2;
} depth_level;

/* What a forward writes: the encoder's session and taps, the maps' slots,
 * the convolutions' im2col; grown for the largest shape, then reused. */
#define DEPTH_SLOTS 48
typedef struct depth_ws {
    vitc_session *sess;
    vitc__buf hid;     /* [n, B, N, C] the encoder's taps */
    vitc__buf scratch; /* the convolutions' im2col blocks */
    vitc__buf slot[DEPTH_SLOTS];
    unsigned char used[DEPTH_SLOTS];
} depth_ws;

static void depth_ws_free(depth_ws *ws) {
    vitc_session_free(ws->sess);
    ws->sess = NULL;
    vitc__buf_free(&ws->hid);
    vitc__buf_free(&ws->scratch);
    for (int i = 0; i < DEPTH_SLOTS; i++) vitc__buf_free(&ws->slot[i]);
}

/* The model's own workspace, taken by one call at a time (a call that
 * finds it taken works in one of its own): a model stays shareable by
 * threads while a single caller allocates nothing after its first call. */
typedef struct depth_cache {
    pthread_mutex_t lock;
    depth_ws ws;
} depth_cache;

struct vitc_depth {
    vitc_vit *vit;
    depth_cache *cache;
    int n;                      /* levels: len(neck_hidden_sizes) = len(out_indices) */
    int stages[DEPTH_MAX_LEVELS];
    int norm;                   /* apply_layernorm */
    int patch;
    int fusion, head_hidden, head_in;
    int metric;
    float max_depth;
    depth_level lv[DEPTH_MAX_LEVELS];
    vitc__nn_conv h1, h2, h3;
    /* the processor (preprocessor_config.json over the Depth Anything
     * checkpoints' values) */
    int size_h, size_w, keep_aspect, multiple, do_resize, resample;
    vitc__hf_proc proc;         /* rescale, normalize; size set per image */
    float **bufs;               /* every weight allocation */
    int n_bufs, cap_bufs;
};

/* ------------------------------------------------------------------ */
/* Loading                                                            */
/* ------------------------------------------------------------------ */

static vitc_status depth_keep(vitc_depth *d, float *p) {
    if (d->n_bufs == d->cap_bufs) {
        int cap = d->cap_bufs ? 2 * d->cap_bufs : 64;
        float **nb = realloc(d->bufs, (size_t)cap * sizeof *nb);
        if (!nb) {
            vitc__free(p);
            return vitc__err(VITC_ERR_NOMEM, "Depth Anything: out of memory for the weights");
        }
        d->bufs = nb, d->cap_bufs = cap;
    }
    d->bufs[d->n_bufs++] = p;
    return VITC_OK;
}

/* A tensor of the given torch shape, read into a new allocation. */
static vitc_status depth_take(vitc_depth *d, const vitc__shards *h, const char *name,
                              const int64_t *shape, int nd, float **out) {
    size_t n = 1;
    for (int k = 0; k < nd; k++) n *= (size_t)shape[k];
    float *p = vitc__alloc(n * sizeof(float));
    if (!p)
        return vitc__err(VITC_ERR_NOMEM, "Depth Anything: out of memory for %s", name);
    vitc_status s = vitc__hub_take(h, name, shape, nd, 0, p);
    if (s != VITC_OK) {
        vitc__free(p);
        return s;
    }
    *out = p;
    return depth_keep(d, p);
}

/* nn.Conv2d(C, O, k, stride, padding) called name, packed channels-last. */
static vitc_status depth_conv(vitc_depth *d, const vitc__shards *h, const char *name, int64_t C,
                              int64_t O, int64_t k, int64_t stride, int64_t pad, int bias,
                              vitc__nn_conv *c) {
    char nm[200];
    float *t = NULL, *w = NULL;
    int64_t ws[4] = {O, C, k, k}, bs[1] = {O};
    snprintf(nm, sizeof nm, "%s.weight", name);
    VITC_TRY(depth_take(d, h, nm, ws, 4, &t));
    if (!(w = vitc__alloc((size_t)(O * C * k * k) * sizeof(float))))
        return vitc__err(VITC_ERR_NOMEM, "Depth Anything: out of memory for %s", nm);
    VITC_TRY(depth_keep(d, w));
    vitc__nn_conv_pack(w, t, O, C, k, k);
    memset(c, 0, sizeof *c);
    c->w = w, c->C = C, c->O = O, c->kh = c->kw = k, c->sh = c->sw = stride, c->ph = c->pw = pad;
    if (bias) {
        float *b = NULL;
        snprintf(nm, sizeof nm, "%s.bias", name);
        VITC_TRY(depth_take(d, h, nm, bs, 1, &b));
        c->b = b;
    }
    /* the weights stay as loaded: their row-wise GEMM panels, once */
    return vitc__nn_conv_prepare(c);
}

/* nn.ConvTranspose2d(C, O, k, stride k), weight [C, O, k, k]. */
static vitc_status depth_convt(vitc_depth *d, const vitc__shards *h, const char *name, int64_t C,
                               int64_t O, int64_t k, vitc__nn_convt *c) {
    char nm[200];
    float *t = NULL, *w = NULL, *b = NULL;
    int64_t ws[4] = {C, O, k, k}, bs[1] = {O};
    snprintf(nm, sizeof nm, "%s.weight", name);
    VITC_TRY(depth_take(d, h, nm, ws, 4, &t));
    if (!(w = vitc__alloc((size_t)(O * C * k * k) * sizeof(float))))
        return vitc__err(VITC_ERR_NOMEM, "Depth Anything: out of memory for %s", nm);
    VITC_TRY(depth_keep(d, w));
    vitc__nn_convt_pack(w, t, C, O, k, k);
    snprintf(nm, sizeof nm, "%s.bias", name);
    VITC_TRY(depth_take(d, h, nm, bs, 1, &b));
    memset(c, 0, sizeof *c);
    c->w = w, c->b = b, c->C = C, c->O = O, c->kh = c->kw = c->sh = c->sw = k;
    return VITC_OK;
}

/* A positive integer config value (absent: def). */
static vitc_status depth_int(json_t *cfg, const char *key, int def, int lo, int hi, int *out) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return VITC_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return vitc__err(VITC_ERR_FORMAT, "config.json: %s must be an integer in [%d, %d]", key,
                         lo, hi);
    *out = (int)json_integer_value(v);
    return VITC_OK;
}

/* Which hidden states the backbone hands the neck: backbone_config's
 * out_indices, else its out_features ("stage9"), else the last stage. */
static vitc_status depth_stages(vitc_depth *d, json_t *bb, int depth) {
    json_t *oi = json_object_get(bb, "out_indices"), *of = json_object_get(bb, "out_features");
    json_t *list = json_is_array(oi) ? oi : json_is_array(of) ? of : NULL;
    int n = list ? (int)json_array_size(list) : 1;
    if (n != d->n)
        return vitc__err(VITC_ERR_FORMAT, "config.json: the backbone hands %d hidden states "
                         "(out_indices) but neck_hidden_sizes has %d", n, d->n);
    for (int i = 0; i < n; i++) {
        json_t *v = list ? json_array_get(list, (size_t)i) : NULL;
        long long st = depth;
        int ok = !list;
        char *end = NULL;
        if (list == oi && json_is_integer(v)) {
            st = json_integer_value(v), ok = 1;
            if (st < 0) /* Python's negative index into the depth + 1 stages */
                st += depth + 1;
        } else if (list == of && json_is_string(v) && !strncmp(json_string_value(v), "stage", 5)) {
            st = strtoll(json_string_value(v) + 5, &end, 10);
            ok = end && end != json_string_value(v) + 5 && !*end;
        }
        if (!ok || st < 0 || st > depth)
            return vitc__err(VITC_ERR_FORMAT, "config.json: backbone_config out_indices[%d] is "
                             "not a stage of a %d-layer backbone", i, depth);
        d->stages[i] = (int)st;
    }
    return VITC_OK;
}

/* config.json's Depth Anything values (the neck and head shapes). */
static vitc_status depth_config(vitc_depth *d, json_t *cfg, json_t *bb, int C) {
    json_t *nh = json_object_get(cfg, "neck_hidden_sizes");
    json_t *rf = json_object_get(cfg, "reassemble_factors");
    static const int def_neck[4] = {48, 96, 192, 384};
    static const double def_fac[4] = {4, 2, 1, 0.5};
    int n = nh ? (int)json_array_size(nh) : 4, nf = rf ? (int)json_array_size(rf) : 4;
    if ((nh && !json_is_array(nh)) || (rf && !json_is_array(rf)) || n < 1 ||
        n > DEPTH_MAX_LEVELS || nf != n)
        return vitc__err(VITC_ERR_FORMAT, "config.json: neck_hidden_sizes and reassemble_factors "
                         "must be lists of the same length, 1 to %d", DEPTH_MAX_LEVELS);
    d->n = n;
    int rh;
    VITC_TRY(depth_int(cfg, "reassemble_hidden_size", C, 1, 1 << 16, &rh));
    if (rh != C)
        return vitc__err(VITC_ERR_FORMAT, "config.json: reassemble_hidden_size %d differs from "
                         "the backbone's hidden_size %d", rh, C);
    VITC_TRY(depth_int(cfg, "fusion_hidden_size", 64, 2, 1 << 14, &d->fusion));
    VITC_TRY(depth_int(cfg, "head_hidden_size", 32, 1, 1 << 14, &d->head_hidden));
    VITC_TRY(depth_int(cfg, "patch_size", 14, 1, 1024, &d->patch));
    json_t *hi = json_object_get(cfg, "head_in_index");
    int head_in = json_is_integer(hi) ? (int)json_integer_value(hi) : -1;
    if (hi && !json_is_integer(hi))
        return vitc__err(VITC_ERR_FORMAT, "config.json: head_in_index must be an integer");
    d->head_in = head_in < 0 ? head_in + n : head_in;
    if (d->head_in < 0 || d->head_in >= n)
        return vitc__err(VITC_ERR_FORMAT, "config.json: head_in_index %d is outside the %d "
                         "fusion outputs", head_in, n);
    json_t *t = json_object_get(cfg, "depth_estimation_type");
    const char *type = json_is_string(t) ? json_string_value(t) : "relative";
    if (strcmp(type, "relative") && strcmp(type, "metric"))
        return vitc__err(VITC_ERR_FORMAT, "config.json: depth_estimation_type \"%.40s\" (expected "
                         "relative or metric)", type);
    d->metric = !strcmp(type, "metric");
    json_t *md = json_object_get(cfg, "max_depth");
    d->max_depth = json_is_number(md) ? (float)json_number_value(md) : 1.0f;
    if (md && !json_is_null(md) && (!json_is_number(md) || !isfinite(d->max_depth)))
        return vitc__err(VITC_ERR_FORMAT, "config.json: max_depth must be a number");
    for (int i = 0; i < n; i++) {
        json_t *a = nh ? json_array_get(nh, (size_t)i) : NULL;
        json_t *f = rf ? json_array_get(rf, (size_t)i) : NULL;
        int ch = a ? (json_is_integer(a) ? (int)json_integer_value(a) : -1) : def_neck[i];
        double fac = f ? (json_is_number(f) ? json_number_value(f) : -1) : def_fac[i];
        if (ch < 1 || ch > (1 << 14))
            return vitc__err(VITC_ERR_FORMAT, "config.json: neck_hidden_sizes[%d] must be a "
                             "positive integer", i);
        /* > 1: a transposed conv of kernel and stride int(f); < 1: a conv of stride int(1/f) */
        int ok = fac > 0 && fac <= 64 && (fac >= 1 ? fac == floor(fac) : (int)(1 / fac) >= 1);
        if (!ok)
            return vitc__err(VITC_ERR_FORMAT, "config.json: reassemble_factors[%d] must be a "
                             "positive integer or a fraction 1/s", i);
        d->lv[i].resize = fac > 1 ? 1 : fac == 1 ? 0 : 2;
        d->lv[i].proj.O = ch;
        d->lv[i].up.kh = fac > 1 ? (int64_t)fac : 0;
        d->lv[i].down.sh = fac < 1 ? (int64_t)(1 / fac) : 0;
    }
    if (json_is_true(json_object_get(bb, "reshape_hidden_states")))
        return vitc__err(VITC_ERR_UNSUPPORTED, "config.json: backbone_config.reshape_hidden_states "
                         "true (Depth Anything's neck takes the token rows; transformers "
                         "fails on it too)");
    json_t *al = json_object_get(bb, "apply_layernorm");
    d->norm = !json_is_false(al);
    return VITC_OK;
}

/* The neck's and head's tensors (marked read, so the backbone's reader
 * finds no leftovers). */
static vitc_status depth_weights(vitc_depth *d, const vitc__shards *h, int64_t C) {
    char nm[160];
    int64_t F = d->fusion;
    for (int i = 0; i < d->n; i++) {
        depth_level *l = &d->lv[i];
        int64_t ch = l->proj.O, k = l->up.kh, s = l->down.sh;
        snprintf(nm, sizeof nm, "neck.reassemble_stage.layers.%d.projection", i);
        VITC_TRY(depth_conv(d, h, nm, C, ch, 1, 1, 0, 1, &l->proj));
        snprintf(nm, sizeof nm, "neck.reassemble_stage.layers.%d.resize", i);
        if (l->resize == 1)
            VITC_TRY(depth_convt(d, h, nm, ch, ch, k, &l->up));
        else if (l->resize == 2)
            VITC_TRY(depth_conv(d, h, nm, ch, ch, 3, s, 1, 1, &l->down));
        snprintf(nm, sizeof nm, "neck.convs.%d", i);
        VITC_TRY(depth_conv(d, h, nm, ch, F, 3, 1, 1, 0, &l->conv));
        snprintf(nm, sizeof nm, "neck.fusion_stage.layers.%d.projection", i);
        VITC_TRY(depth_conv(d, h, nm, F, F, 1, 1, 0, 1, &l->fproj));
        depth_rcu *r[2] = {&l->res1, &l->res2};
        for (int j = 0; j < 2; j++) {
            snprintf(nm, sizeof nm, "neck.fusion_stage.layers.%d.residual_layer%d.convolution1",
                     i, j + 1);
            VITC_TRY(depth_conv(d, h, nm, F, F, 3, 1, 1, 1, &r[j]->c1));
            snprintf(nm, sizeof nm, "neck.fusion_stage.layers.%d.residual_layer%d.convolution2",
                     i, j + 1);
            VITC_TRY(depth_conv(d, h, nm, F, F, 3, 1, 1, 1, &r[j]->c2));
        }
    }
    VITC_TRY(depth_conv(d, h, "head.conv1", F, F / 2, 3, 1, 1, 1, &d->h1));
    VITC_TRY(depth_conv(d, h, "head.conv2", F / 2, d->head_hidden, 3, 1, 1, 1, &d->h2));
    return depth_conv(d, h, "head.conv3", d->head_hidden, 1, 1, 1, 0, 1, &d->h3);
}

/* preprocessor_config.json (DPTImageProcessor) over the values the Depth
 * Anything checkpoints ship: 518 x 518, aspect kept, multiples of 14,
 * bicubic, ImageNet mean / std. */
static vitc_status depth_processor(vitc_depth *d, const char *dir) {
    static const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    vitc__hf_proc *p = &d->proc;
    memset(p, 0, sizeof *p);
    p->present = 1;
    p->do_resize = p->do_rescale = p->do_normalize = 1;
    p->rescale = 1.0 / 255.0;
    p->resample = 3;
    memcpy(p->mean, mean, sizeof mean);
    memcpy(p->std, sd, sizeof sd);
    d->size_h = d->size_w = 518, d->keep_aspect = 1, d->multiple = 14, d->do_resize = 1;
    char *path = vitc__hub_join(dir, "preprocessor_config.json");
    json_t *pp = NULL;
    vitc_status s = VITC_OK;
    if (!path)
        return vitc__err(VITC_ERR_NOMEM, "out of memory");
    if (vitc__hub_exists(path))
        s = vitc__hub_read_json(path, &pp);
    free(path);
    if (s != VITC_OK || !pp)
        return s;
    json_t *v;
    if ((v = json_object_get(pp, "do_resize")) && json_is_boolean(v))
        d->do_resize = json_is_true(v);
    if ((v = json_object_get(pp, "keep_aspect_ratio")) && json_is_boolean(v))
        d->keep_aspect = json_is_true(v);
    if ((v = json_object_get(pp, "do_rescale")) && json_is_boolean(v))
        p->do_rescale = json_is_true(v);
    if ((v = json_object_get(pp, "do_normalize")) && json_is_boolean(v))
        p->do_normalize = json_is_true(v);
    if (json_is_true(json_object_get(pp, "do_pad")))
        s = vitc__err(VITC_ERR_UNSUPPORTED, "preprocessor_config.json: do_pad true is not "
                      "supported (Depth Anything's processors do not pad)");
    if (s == VITC_OK && (v = json_object_get(pp, "ensure_multiple_of")) &&
        (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1024))
        s = vitc__err(VITC_ERR_FORMAT, "preprocessor_config.json: ensure_multiple_of must be an "
                      "integer in [1, 1024]");
    else if (v)
        d->multiple = (int)json_integer_value(v);
    if (s == VITC_OK && (v = json_object_get(pp, "size"))) {
        json_t *hh = json_object_get(v, "height"), *ww = json_object_get(v, "width");
        if (json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 8192)
            d->size_h = d->size_w = (int)json_integer_value(v);
        else if (json_is_integer(hh) && json_is_integer(ww) && json_integer_value(hh) >= 1 &&
                 json_integer_value(ww) >= 1 && json_integer_value(hh) <= 8192 &&
                 json_integer_value(ww) <= 8192)
            d->size_h = (int)json_integer_value(hh), d->size_w = (int)json_integer_value(ww);
        else
            s = vitc__err(VITC_ERR_FORMAT, "preprocessor_config.json: size must be "
                          "{\"height\", \"width\"} of 1 to 8192");
    }
    if (s == VITC_OK && (v = json_object_get(pp, "resample"))) {
        if (!json_is_integer(v) || (json_integer_value(v) != 2 && json_integer_value(v) != 3))
            s = vitc__err(VITC_ERR_UNSUPPORTED, "preprocessor_config.json: resample must be 2 "
                          "(bilinear) or 3 (bicubic)");
        else
            p->resample = (int)json_integer_value(v);
    }
    if (s == VITC_OK && (v = json_object_get(pp, "rescale_factor"))) {
        if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
            s = vitc__err(VITC_ERR_FORMAT, "preprocessor_config.json: rescale_factor must be a "
                          "positive number");
        else
            p->rescale = json_number_value(v);
    }
    static const char *const keys[2] = {"image_mean", "image_std"};
    for (int k = 0; k < 2 && s == VITC_OK; k++) {
        json_t *a = json_object_get(pp, keys[k]);
        if (!a)
            continue;
        size_t n = json_is_array(a) ? json_array_size(a) : 0;
        int ok = json_is_number(a) || n == 1 || n == 3;
        for (size_t i = 0; ok && i < n; i++) ok = json_is_number(json_array_get(a, i));
        if (!ok) {
            s = vitc__err(VITC_ERR_FORMAT, "preprocessor_config.json: %s must be a number or a "
                          "list of 1 or 3 numbers", keys[k]);
            break;
        }
        float *dst = k ? p->std : p->mean;
        for (size_t i = 0; i < 3; i++)
            dst[i] = (float)json_number_value(json_is_number(a) ? a
                                              : json_array_get(a, n == 3 ? i : 0));
    }
    for (int i = 0; i < 3 && s == VITC_OK; i++)
        if (!(p->std[i] > 0.0f) || !isfinite(p->mean[i]) || !isfinite(p->std[i]))
            s = vitc__err(VITC_ERR_FORMAT, "preprocessor_config.json: mean/std[%d] is invalid", i);
    json_decref(pp);
    return s;
}

void vitc_depth_free(vitc_depth *d) {
    if (!d)
        return;
    for (int i = 0; i < DEPTH_MAX_LEVELS; i++) {
        depth_level *l = &d->lv[i];
        vitc__nn_conv *c[8] = {&l->proj, &l->down, &l->conv, &l->fproj,
                               &l->res1.c1, &l->res1.c2, &l->res2.c1, &l->res2.c2};
        for (int j = 0; j < 8; j++) vitc__nn_conv_unprepare(c[j]);
    }
    vitc__nn_conv_unprepare(&d->h1);
    vitc__nn_conv_unprepare(&d->h2);
    vitc__nn_conv_unprepare(&d->h3);
    if (d->cache) { /* its session before the model it reads */
        depth_ws_free(&d->cache->ws);
        pthread_mutex_destroy(&d->cache->lock);
        free(d->cache);
    }
    vitc_vit_free(d->vit);
    for (int i = 0; i < d->n_bufs; i++) vitc__free(d->bufs[i]);
    free(d->bufs);
    free(d);
}

static vitc_status depth_load(const char *path, vitc_depth *d) {
    json_t *cfg = NULL;
    vitc__src src = {.path = path, .prec = -1};
    src.shards.prec = -1;
    char *cp = vitc__hub_join(path, "config.json"), *wp = NULL;
    vitc_status s = VITC_OK;
    if (!cp)
        return vitc__err(VITC_ERR_NOMEM, "out of memory");
    if (!vitc__hub_exists(cp))
        s = vitc__err(VITC_ERR_IO, "no config.json (a Depth Anything directory holds "
                      "config.json and model.safetensors)");
    if (s == VITC_OK)
        s = vitc__hub_read_json(cp, &cfg);
    free(cp);
    VITC_TRY(s);
    json_t *mt = json_object_get(cfg, "model_type");
    const char *type = json_is_string(mt) ? json_string_value(mt) : NULL;
    json_t *bb = json_object_get(cfg, "backbone_config");
    json_t *bt = json_object_get(bb, "model_type");
    if (!type || strcmp(type, "depth_anything")) {
        s = vitc__err(VITC_ERR_UNSUPPORTED, "config.json: model_type \"%.64s\" is not a Depth "
                      "Anything model (expected depth_anything)", type ? type : "(none)");
    } else if (!json_is_object(bb)) {
        s = vitc__err(VITC_ERR_UNSUPPORTED, "config.json: no backbone_config object (vitc reads "
                      "Depth Anything with its DINOv2 backbone_config)");
    } else if (bt && (!json_is_string(bt) || strcmp(json_string_value(bt), "dinov2"))) {
        s = vitc__err(VITC_ERR_UNSUPPORTED, "config.json: backbone model_type \"%.40s\" (vitc "
                      "reads Depth Anything's dinov2 backbone)",
                      json_is_string(bt) ? json_string_value(bt) : "?");
    }
    if (s == VITC_OK && !(src.dir = malloc(strlen(path) + 1)))
        s = vitc__err(VITC_ERR_NOMEM, "out of memory");
    if (s == VITC_OK) {
        memcpy(src.dir, path, strlen(path) + 1);
        wp = vitc__hub_join(path, "model.safetensors");
        if (wp && !vitc__hub_exists(wp)) {
            free(wp);
            wp = vitc__hub_join(path, "model.safetensors.index.json");
            if (wp && !vitc__hub_exists(wp))
                s = vitc__err(VITC_ERR_IO, "no model.safetensors or model.safetensors.index.json");
        }
        if (s == VITC_OK && !wp)
            s = vitc__err(VITC_ERR_NOMEM, "out of memory");
    }
    if (s == VITC_OK)
        s = vitc__shards_open(&src.shards, src.dir, wp);
    /* The backbone: vitc's DINOv2 reader on backbone_config, with the
     * tensors under "backbone." (DepthAnythingForDepthEstimation.backbone). */
    vitc__hub_names names = vitc__family_dinov2.hub_types[0];
    names.prefix = "backbone.";
    src.config = bb;
    if (s == VITC_OK && !(d->vit = vitc__vit_alloc()))
        s = vitc__err(VITC_ERR_NOMEM, "cannot allocate the backbone");
    if (s == VITC_OK) {
        d->vit->fam = &vitc__family_dinov2;
        s = vitc__hub_configure(d->vit, &src, &names);
    }
    if (s == VITC_OK && strcmp(src.pre, "backbone."))
        s = vitc__err(VITC_ERR_KEY, "missing tensor backbone.embeddings.patch_embeddings."
                      "projection.weight (not a DepthAnythingForDepthEstimation checkpoint)");
    if (s == VITC_OK)
        s = vitc__vit_table_build(d->vit);
    const vitc_vit_config *vc = d->vit ? &d->vit->cfg : NULL;
    if (s == VITC_OK)
        s = depth_config(d, cfg, bb, vc->hidden_dim);
    if (s == VITC_OK && d->patch != vc->patch_size)
        s = vitc__err(VITC_ERR_FORMAT, "config.json: patch_size %d differs from the backbone's %d",
                      d->patch, vc->patch_size);
    if (s == VITC_OK)
        s = depth_stages(d, bb, vc->depth);
    if (s == VITC_OK)
        s = depth_weights(d, &src.shards, vc->hidden_dim);
    if (s == VITC_OK)
        s = vitc__hub_read(d->vit, &src);
    if (s == VITC_OK)
        s = depth_processor(d, path);
    if (s == VITC_OK)
        s = vitc_vit_prepare(d->vit);
    vitc__shards_free(&src.shards);
    free(src.dir);
    free(wp);
    json_decref(cfg);
    return s;
}

vitc_status vitc_depth_load(const char *path, vitc_depth **out) {
    if (!path || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_depth_load: NULL argument");
    *out = NULL;
    vitc_depth *d = calloc(1, sizeof *d);
    depth_cache *c = calloc(1, sizeof *c);
    if (!d || !c || pthread_mutex_init(&c->lock, NULL) != 0) {
        free(d);
        free(c);
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate a Depth Anything model");
    }
    d->cache = c;
    vitc_status s = depth_load(path, d);
    if (s != VITC_OK) {
        vitc_depth_free(d);
        if (!strstr(vitc_last_error(), path))
            vitc__err_prefix(s, "%s", path);
        return s;
    }
    *out = d;
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Forward: the neck and the head on channels-last maps               */
/* ------------------------------------------------------------------ */

/* A map [B, h, w, C] in one of the workspace's slots (owner: its in-use
 * flag; NULL for a view of another buffer). */
typedef struct depth_map {
    float *p;
    int64_t h, w, c;
    unsigned char *owner;
} depth_map;

typedef struct depth_run {
    const vitc_depth *d;
    int64_t B;
    depth_ws *ws;
} depth_run;

/* Built with -DVITC_DEPTH_TIMING: each forward prints its stages' process
 * CPU time (ms) on stderr, the breakdown docs/depth.md quotes (CPU time:
 * wall time on a shared machine measures the other processes too). */
#ifdef VITC_DEPTH_TIMING
#include <time.h>
/* stage k: 0 the backbone, 1 + i level i's reassemble, 1 + MAX + j fusion
 * layer j, 1 + 2 MAX + h the head's steps (one forward at a time) */
#define DT_N (1 + 2 * DEPTH_MAX_LEVELS + 4)
static double dt_acc[DT_N];
static double dt_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
#define DT_START double dt_t0 = dt_now()
#define DT_MARK(k) (dt_acc[k] += dt_now() - dt_t0, dt_t0 = dt_now())
static void dt_dump(int n) {
    static const char *const head[4] = {"conv1", "resize", "conv2", "conv3"};
    fprintf(stderr, "depth stages (CPU ms): backbone=%.2f", dt_acc[0]);
    for (int i = 0; i < n; i++) fprintf(stderr, " reassemble%d=%.2f", i, dt_acc[1 + i]);
    for (int j = 0; j < n; j++)
        fprintf(stderr, " fusion%d=%.2f", j, dt_acc[1 + DEPTH_MAX_LEVELS + j]);
    for (int h = 0; h < 4; h++)
        fprintf(stderr, " head_%s=%.2f", head[h], dt_acc[1 + 2 * DEPTH_MAX_LEVELS + h]);
    fprintf(stderr, "\n");
    memset(dt_acc, 0, sizeof dt_acc);
}
#else
#define DT_START (void)0
#define DT_MARK(k) (void)0
static void dt_dump(int n) { (void)n; }
#endif

static void map_free(depth_map *m) {
    if (m->owner)
        *m->owner = 0;
    m->p = NULL;
    m->owner = NULL;
}

/* A slot for the map: the first free one large enough, else the first
 * free one, grown. The forward asks for the same sizes in the same order
 * every time, so after the first call of a shape nothing is allocated (a
 * fresh allocation costs the kernel's zeroing of every page). */
static vitc_status map_new(depth_run *r, depth_map *m, int64_t h, int64_t w, int64_t c) {
    depth_ws *ws = r->ws;
    size_t n;
    int k = -1;
    if (!vitc__mul_size((size_t)(r->B * h), (size_t)(w * c), &n))
        return vitc__err(VITC_ERR_NOMEM, "Depth Anything: a [%lld, %lld, %lld, %lld] map "
                         "overflows", (long long)r->B, (long long)h, (long long)w, (long long)c);
    for (int i = 0; i < DEPTH_SLOTS; i++)
        if (!ws->used[i] && (k < 0 || (ws->slot[i].cap >= n && ws->slot[k].cap < n)))
            k = i;
    if (k < 0)
        return vitc__err(VITC_ERR_NOMEM, "Depth Anything: more than %d maps at once",
                         DEPTH_SLOTS);
    VITC_TRY(vitc__buf_reserve(&ws->slot[k], n));
    ws->used[k] = 1;
    m->p = ws->slot[k].p;
    m->h = h, m->w = w, m->c = c;
    m->owner = &ws->used[k];
    return VITC_OK;
}

/* y = conv(relu_in ? relu(x) : x) + res (res NULL or a map of y's shape). */
static vitc_status run_conv_ex(depth_run *r, const vitc__nn_conv *c, const depth_map *x,
                               int relu_in, const depth_map *res, depth_map *y) {
    int64_t oh = vitc__nn_conv_out(x->h, c->kh, c->sh, c->ph);
    int64_t ow = vitc__nn_conv_out(x->w, c->kw, c->sw, c->pw);
    int64_t sc = vitc__nn_conv_scratch(c, r->B, x->h, x->w);
    VITC_TRY(map_new(r, y, oh, ow, c->O));
    if (sc > 0)
        VITC_TRY(vitc__buf_reserve(&r->ws->scratch, (size_t)sc));
    return vitc__nn_conv_forward_ex(c, y->p, x->p, r->B, x->h, x->w, relu_in,
                                    res ? res->p : NULL, r->ws->scratch.p, sc);
}

/* fn on each row of conv(x), the rows never a map (dense.h's
 * vitc__nn_conv_forward_rows without y). */
static vitc_status run_conv_rows(depth_run *r, const vitc__nn_conv *c, const depth_map *x,
                                 vitc__nn_row_fn fn, void *ctx) {
    int64_t sc = vitc__nn_conv_scratch(c, r->B, x->h, x->w);
    if (sc > 0)
        VITC_TRY(vitc__buf_reserve(&r->ws->scratch, (size_t)sc));
    return vitc__nn_conv_forward_rows(c, NULL, x->p, r->B, x->h, x->w, 0, fn, ctx,
                                      r->ws->scratch.p, sc);
}

static vitc_status run_conv(depth_run *r, const vitc__nn_conv *c, const depth_map *x,
                            depth_map *y) {
    return run_conv_ex(r, c, x, 0, NULL, y);
}

static vitc_status run_convt(depth_run *r, const vitc__nn_convt *c, const depth_map *x,
                             depth_map *y) {
    int64_t oh = (x->h - 1) * c->sh - 2 * c->ph + c->kh;
    int64_t ow = (x->w - 1) * c->sw - 2 * c->pw + c->kw;
    int64_t sc = vitc__nn_convt_scratch(c, r->B, x->h, x->w);
    VITC_TRY(map_new(r, y, oh, ow, c->O));
    if (sc > 0)
        VITC_TRY(vitc__buf_reserve(&r->ws->scratch, (size_t)sc));
    return vitc__nn_convt_forward(c, y->p, x->p, r->B, x->h, x->w, r->ws->scratch.p, sc);
}

static vitc_status run_bilinear(depth_run *r, const depth_map *x, int64_t oh, int64_t ow, int ac,
                                depth_map *y) {
    VITC_TRY(map_new(r, y, oh, ow, x->c));
    return vitc__nn_bilinear(y->p, x->p, r->B, x->c, x->h, x->w, oh, ow, ac);
}

static size_t map_len(const depth_run *r, const depth_map *m) {
    return (size_t)(r->B * m->h * m->w * m->c);
}

/* y = relu(x) (b NULL) or y = x + b over n floats, in chunks across the
 * threads: the maps reach millions of floats. */
typedef struct map_op {
    float *y;
    const float *x, *b;
    size_t n;
} map_op;
#define MAP_CHUNK ((size_t)1 << 16)

static void map_op_task(void *ctx, int64_t t, int tid) {
    const map_op *o = ctx;
    size_t i0 = (size_t)t * MAP_CHUNK, i1 = i0 + MAP_CHUNK < o->n ? i0 + MAP_CHUNK : o->n;
    (void)tid;
    if (o->b)
        for (size_t i = i0; i < i1; i++) o->y[i] = o->x[i] + o->b[i];
    else
        for (size_t i = i0; i < i1; i++) o->y[i] = o->x[i] > 0.0f ? o->x[i] : 0.0f;
}

static void map_apply(float *y, const float *x, const float *b, size_t n) {
    map_op o = {y, x, b, n};
    vitc__parallel_for((int64_t)((n + MAP_CHUNK - 1) / MAP_CHUNK), map_op_task, &o);
}

static void relu_into(float *y, const float *x, size_t n) { map_apply(y, x, NULL, n); }

/* predicted_depth from conv3's output z [n] (a NULL) or, a given, conv3
 * itself on relu(a) [n, C] (a GEMM of one column runs at a fraction of
 * the GEMM's speed, and the ReLU would be a pass): relative depth
 * relu(z) * max_depth, metric sigmoid(z) * max_depth. */
typedef float depth_v4 __attribute__((vector_size(16)));
typedef int depth_v4i __attribute__((vector_size(16)));

static void depth_out(const vitc_depth *d, float *depth, const float *z, const float *a,
                      size_t n) {
    const int64_t C = d->h3.C, C4 = C / 4 * 4;
    const float md = d->max_depth, *w = d->h3.w, b = d->h3.b ? d->h3.b[0] : 0.0f;
    const depth_v4 zero = {0, 0, 0, 0};
    for (size_t k = 0; k < n; k++) {
        float v;
        if (a) {
            const float *ak = a + k * (size_t)C; /* [C] */
            depth_v4 acc = zero;
            for (int64_t c = 0; c < C4; c += 4) { /* four partial sums: no chain of C adds */
                depth_v4 x, wv;
                memcpy(&x, ak + c, sizeof x);
                memcpy(&wv, w + c, sizeof wv);
                x = (depth_v4)((depth_v4i)x & (x > zero));
                acc += wv * x;
            }
            float t = b + ((acc[0] + acc[1]) + (acc[2] + acc[3]));
            for (int64_t c = C4; c < C; c++) t += w[c] * (ak[c] > 0.0f ? ak[c] : 0.0f);
            v = t;
        } else {
            v = z[k];
        }
        depth[k] = d->metric ? md / (1.0f + expf(-v)) : (v > 0.0f ? v : 0.0f) * md;
    }
}

/* conv2's output row (b, oy) [W, C] -> predicted_depth's row. */
typedef struct head_ctx {
    const vitc_depth *d;
    float *depth; /* [B, H, W] */
    int64_t H, W;
} head_ctx;

static void head_row(void *ctx, int64_t b, int64_t oy, const float *row) {
    const head_ctx *h = ctx;
    depth_out(h->d, h->depth + (b * h->H + oy) * h->W, NULL, row, (size_t)h->W);
}

/* x + conv2(relu(conv1(relu(x)))) into y (a new map): the ReLUs and the
 * sum inside the convolutions. */
static vitc_status run_rcu(depth_run *r, const depth_rcu *u, const depth_map *x, depth_map *y) {
    depth_map b = {0};
    vitc_status s = run_conv_ex(r, &u->c1, x, 1, NULL, &b);
    if (s == VITC_OK)
        s = run_conv_ex(r, &u->c2, &b, 1, x, y);
    map_free(&b);
    return s;
}

/* Level i's feature for the fusion: reassemble then the neck's 3x3. */
static vitc_status run_level(depth_run *r, int i, const float *tokens, int64_t gh, int64_t gw,
                             depth_map *out) {
    const depth_level *l = &r->d->lv[i];
    depth_map t = {.p = (float *)tokens, .h = gh, .w = gw, .c = r->d->vit->cfg.hidden_dim};
    depth_map p = {0}, q = {0};
    vitc_status s = run_conv(r, &l->proj, &t, &p);
    if (s == VITC_OK && l->resize == 1)
        s = run_convt(r, &l->up, &p, &q);
    else if (s == VITC_OK && l->resize == 2)
        s = run_conv(r, &l->down, &p, &q);
    if (s == VITC_OK)
        s = run_conv(r, &l->conv, l->resize ? &q : &p, out);
    map_free(&p);
    map_free(&q);
    return s;
}

/* fusion_stage.layers[k] on prev (NULL for the first) and feature f, to
 * size (oh, ow). */
static vitc_status run_fusion(depth_run *r, int k, const depth_map *prev, const depth_map *f,
                              int64_t oh, int64_t ow, depth_map *out) {
    const depth_level *l = &r->d->lv[k];
    depth_map h = {0}, u = {0}, rs = {0}, v = {0};
    vitc_status s = VITC_OK;
    if (prev) {
        const depth_map *res = f;
        if (f->h != prev->h || f->w != prev->w) { /* transformers resizes the residual */
            s = run_bilinear(r, f, prev->h, prev->w, 0, &rs);
            res = &rs;
        }
        if (s == VITC_OK)
            s = run_rcu(r, &l->res1, res, &u);
        if (s == VITC_OK) {
            size_t n = map_len(r, &u);
            map_apply(u.p, u.p, prev->p, n);
            s = run_rcu(r, &l->res2, &u, &h);
        }
    } else {
        s = run_rcu(r, &l->res2, f, &h);
    }
    /* The 1x1 projection and the bilinear resize commute (both linear per
     * pixel, the resize's weights summing to 1 carry the bias through):
     * projecting first costs a quarter of the FLOPs at the x2 resizes. */
    if (s == VITC_OK && oh * ow >= h.h * h.w) {
        s = run_conv(r, &l->fproj, &h, &v);
        if (s == VITC_OK)
            s = run_bilinear(r, &v, oh, ow, 1, out);
    } else if (s == VITC_OK) {
        s = run_bilinear(r, &h, oh, ow, 1, &v);
        if (s == VITC_OK)
            s = run_conv(r, &l->fproj, &v, out);
    }
    map_free(&h);
    map_free(&u);
    map_free(&rs);
    map_free(&v);
    return s;
}

/* predicted_depth [B, gh*p, gw*p] from the backbone's taps hid [n, B, N, C]. */
static vitc_status depth_neck_head(const vitc_depth *d, depth_ws *ws, const float *hid, int64_t B,
                                   int64_t gh, int64_t gw, float *depth) {
    depth_run r = {.d = d, .B = B, .ws = ws};
    int n = d->n;
    int64_t C = d->vit->cfg.hidden_dim, N = gh * gw + d->vit->n_prefix;
    int64_t np = d->vit->n_prefix;
    depth_map feat[DEPTH_MAX_LEVELS] = {{0}}, fused[DEPTH_MAX_LEVELS] = {{0}};
    depth_map tok = {0}, a = {0}, b = {0}, c = {0};
    DT_START;
    /* one image's patch rows are already a map: copied only for a batch */
    vitc_status s = B > 1 ? map_new(&r, &tok, gh, gw, C) : VITC_OK;
    for (int i = 0; s == VITC_OK && i < n; i++) {
        /* the patch rows of tap i: the class token dropped */
        const float *src = hid + (size_t)i * (size_t)(B * N * C); /* [B, N, C] */
        for (int64_t bb = 0; B > 1 && bb < B; bb++)
            memcpy(tok.p + bb * gh * gw * C, src + (bb * N + np) * C,
                   (size_t)(gh * gw * C) * sizeof(float));
        s = run_level(&r, i, B > 1 ? tok.p : src + np * C, gh, gw, &feat[i]);
        DT_MARK(1 + i);
    }
    map_free(&tok);
    /* deepest first; each output sized as the next feature (x2 for the last) */
    for (int k = 0; s == VITC_OK && k < n; k++) {
        int i = n - 1 - k;
        int64_t oh = i ? feat[i - 1].h : 2 * feat[i].h, ow = i ? feat[i - 1].w : 2 * feat[i].w;
        /* fusion_stage.layers[k] takes the features deepest first */
        s = run_fusion(&r, k, k ? &fused[k - 1] : NULL, &feat[i], oh, ow, &fused[k]);
        DT_MARK(1 + DEPTH_MAX_LEVELS + k);
    }
    int64_t H = gh * d->patch, W = gw * d->patch;
    if (s == VITC_OK)
        s = run_conv(&r, &d->h1, &fused[d->head_in], &a);
    DT_MARK(1 + 2 * DEPTH_MAX_LEVELS);
    if (s == VITC_OK)
        s = run_bilinear(&r, &a, H, W, 1, &b);
    DT_MARK(2 + 2 * DEPTH_MAX_LEVELS);
    /* conv3 (1x1 to one channel) and the output on each row of conv2's
     * output while it is in cache; VITC_DENSE=ref: transformers' order */
    int ref = !strcmp(vitc__nn_dense_path(), "ref");
    head_ctx hc = {d, depth, H, W};
    if (s == VITC_OK) {
        map_free(&a);
        s = ref ? run_conv(&r, &d->h2, &b, &a) : run_conv_rows(&r, &d->h2, &b, head_row, &hc);
    }
    DT_MARK(3 + 2 * DEPTH_MAX_LEVELS);
    if (s == VITC_OK && ref) {
        relu_into(a.p, a.p, map_len(&r, &a));
        map_free(&b);
        s = run_conv(&r, &d->h3, &a, &c);
        if (s == VITC_OK)
            depth_out(d, depth, c.p, NULL, (size_t)(B * H * W));
    }
    DT_MARK(4 + 2 * DEPTH_MAX_LEVELS);
    for (int i = 0; i < n; i++) {
        map_free(&feat[i]);
        map_free(&fused[i]);
    }
    map_free(&a);
    map_free(&b);
    map_free(&c);
    return s;
}

vitc_status vitc_depth_forward(const vitc_depth *d, const float *pixels, int B, int H, int W,
                               float *depth) {
    if (!d || !pixels || !depth)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_depth_forward: NULL argument");
    int p = d->patch;
    if (B < 1 || H < p || W < p || H % p || W % p)
        return vitc__err(VITC_ERR_SHAPE, "vitc_depth_forward: pixels [%d, 3, %d, %d]: height and "
                         "width must be positive multiples of the patch size %d", B, H, W, p);
    if ((int64_t)H * W > DEPTH_MAX_INPUT_PIXELS)
        return vitc__err(VITC_ERR_SHAPE, "vitc_depth_forward: a %dx%d input is over the %d-pixel "
                         "limit of a forward (docs/limits.md)", W, H, DEPTH_MAX_INPUT_PIXELS);
    int64_t gh = H / p, gw = W / p, N = gh * gw + d->vit->n_prefix, C = d->vit->cfg.hidden_dim;
    size_t n;
    if (!vitc__mul_size((size_t)(d->n * B), (size_t)(N * C), &n))
        return vitc__err(VITC_ERR_NOMEM, "vitc_depth_forward: batch %d overflows", B);
    /* The peak is the head at full resolution: conv1's output resized
     * (F/2 channels), conv2's padded copy of it (F/2: the row-wise
     * forward's; the Winograd one reads it in place), conv2's output
     * (head_hidden: a whole map only on VITC_DENSE=ref's path) and the
     * depth, per pixel. */
    double peak = 4.0 * B * (double)H * W * (2 * (d->fusion / 2) + d->head_hidden + 1) +
                  4.0 * (double)n;
    if (peak > DEPTH_MAX_FORWARD_BYTES)
        return vitc__err(VITC_ERR_NOMEM, "vitc_depth_forward: batch %d of %dx%d needs about %.0f "
                         "MiB, over the %lld MiB limit of a forward (docs/limits.md); use smaller "
                         "batches", B, W, H, peak / 1048576.0, DEPTH_MAX_FORWARD_BYTES >> 20);
    /* The model's workspace when no other thread holds it, else one for
     * this call alone. */
    depth_ws own = {0}, *ws = &own;
    int locked = pthread_mutex_trylock(&d->cache->lock) == 0;
    if (locked)
        ws = &d->cache->ws;
    vitc_status st = vitc__buf_reserve(&ws->hid, n); /* [n, B, N, C] */
    if (st == VITC_OK && !ws->sess)
        st = vitc_session_create(d->vit, &ws->sess);
    DT_START;
    if (st == VITC_OK)
        st = vitc__vit_forward_layers(d->vit, ws->sess, pixels, B, H, W, d->stages, d->n, d->norm,
                                      ws->hid.p);
    DT_MARK(0);
    if (st == VITC_OK)
        st = depth_neck_head(d, ws, ws->hid.p, B, gh, gw, depth);
    dt_dump(d->n);
    if (locked)
        pthread_mutex_unlock(&d->cache->lock);
    else
        depth_ws_free(&own);
    return st;
}

/* ------------------------------------------------------------------ */
/* The processor and the pipeline                                     */
/* ------------------------------------------------------------------ */

/* DPTImageProcessor's constrain_to_multiple_of (min 0, no max): Python's
 * round, half to even. */
static double depth_multiple(double v, int m) { return nearbyint(v / m) * m; }

vitc_status vitc_depth_input_size(const vitc_depth *d, int width, int height, int *H, int *W) {
    if (!d || !H || !W)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_depth_input_size: NULL argument");
    if (width < 1 || height < 1)
        return vitc__err(VITC_ERR_SHAPE, "image %dx%d is empty", width, height);
    /* Upscaled to 518, a few pixels would give a map of nothing but the
     * resampling kernel: less than one patch of detail is refused. */
    if (width < d->patch || height < d->patch)
        return vitc__err(VITC_ERR_SHAPE, "image %dx%d is smaller than one %dx%d patch (Depth "
                         "Anything needs at least %dx%d pixels)", width, height, d->patch,
                         d->patch, d->patch, d->patch);
    double oh = height, ow = width;
    if (d->do_resize) {
        double sh = (double)d->size_h / height, sw = (double)d->size_w / width;
        if (d->keep_aspect) { /* scale as little as possible */
            if (fabs(1.0 - sw) < fabs(1.0 - sh))
                sh = sw;
            else
                sw = sh;
        }
        oh = depth_multiple(sh * height, d->multiple);
        ow = depth_multiple(sw * width, d->multiple);
    }
    if (oh < d->patch || ow < d->patch)
        return vitc__err(VITC_ERR_SHAPE, "image %dx%d resizes to %.0fx%.0f, smaller than the "
                         "patch size %d (use a less elongated image)", width, height, ow, oh,
                         d->patch);
    if (oh * ow > DEPTH_MAX_INPUT_PIXELS)
        return vitc__err(VITC_ERR_SHAPE, "image %dx%d resizes to %.0fx%.0f, over the %d-pixel "
                         "limit of a forward (docs/limits.md)", width, height, ow, oh,
                         DEPTH_MAX_INPUT_PIXELS);
    if (fmod(oh, d->patch) != 0 || fmod(ow, d->patch) != 0)
        return vitc__err(VITC_ERR_SHAPE, "image %dx%d resizes to %.0fx%.0f, not multiples of the "
                         "patch size %d (preprocessor_config.json's ensure_multiple_of)", width,
                         height, ow, oh, d->patch);
    *H = (int)oh, *W = (int)ow;
    return VITC_OK;
}

vitc_status vitc_depth_predict(const vitc_depth *d, const vitc_image *img, float **out) {
    if (!d || !img || !img->rgb || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_depth_predict: NULL argument");
    *out = NULL;
    int H, W;
    VITC_TRY(vitc_depth_input_size(d, img->width, img->height, &H, &W));
    if ((int64_t)img->width * img->height > DEPTH_MAX_OUTPUT_PIXELS)
        return vitc__err(VITC_ERR_SHAPE, "image %dx%d is over the %lld-pixel limit of a depth map "
                         "(docs/limits.md)", img->width, img->height,
                         (long long)DEPTH_MAX_OUTPUT_PIXELS);
    vitc__hf_proc p = d->proc;
    p.size_h = H, p.size_w = W, p.shortest = 0, p.do_resize = 1, p.do_crop = 0;
    size_t plane = (size_t)H * (size_t)W, full = (size_t)img->width * (size_t)img->height;
    float *pix = malloc(3 * plane * sizeof(float));  /* [1, 3, H, W] */
    float *dep = malloc(plane * sizeof(float));      /* [1, H, W] */
    float *res = malloc(full * sizeof(float));       /* [height, width] */
    vitc_status s = pix && dep && res ? VITC_OK
                    : vitc__err(VITC_ERR_NOMEM, "vitc_depth_predict: out of memory for a %dx%d "
                                "image", img->width, img->height);
    if (s == VITC_OK)
        s = vitc__hf_preprocess(&p, img, pix);
    if (s == VITC_OK)
        s = vitc_depth_forward(d, pix, 1, H, W, dep);
    /* post_process_depth_estimation: bicubic, align_corners=False, to the image */
    if (s == VITC_OK)
        s = vitc__nn_resample(VITC__NN_RESAMPLE_HALF_PIXEL, res, NULL, dep, 1, H, W, img->height,
                              img->width);
    free(pix);
    free(dep);
    if (s != VITC_OK) {
        free(res);
        return s;
    }
    *out = res;
    return VITC_OK;
}
