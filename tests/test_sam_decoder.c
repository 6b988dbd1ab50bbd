/*
 * test_sam_decoder.c — SAM's prompt encoder, mask decoder and
 * post-processing (src/models/sam_decoder.c) against transformers'
 * SamModel run with image_embeddings given and SamProcessor's coordinate
 * mapping and post_process_masks (tests/reference/gen_sam_decoder.py: a
 * small random-weight model, 16 x 16 embedding, input side 256): the
 * low-resolution logits, IoU predictions and the masks at the original
 * size within 1e-4 of max|ref|; then prompts and models it must refuse.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "models/sam.h"
#include "nn/dense.h"

#include "testutil.h"

#define DIR "tests/reference/sam_decoder/"

typedef struct fixture {
    vitc__shards sh;
    json_t *config;
    vitc__sam_dec *dec;
    float *emb_cl; /* [16, 16, 32] */
} fixture;

static int setup(void **state) {
    vitc_set_num_threads(2);
    fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    *state = f;
    if (vitc__shards_open(&f->sh, DIR, DIR "model.safetensors") != VITC_OK ||
        !(f->config = json_load_file(DIR "config.json", 0, NULL))) {
        fprintf(stderr, "test_sam_decoder: cannot read %s (run from the repository root): %s\n",
                DIR, vitc_last_error());
        return -1;
    }
    if (vitc__sam_dec_load(&f->dec, &f->sh, f->config) != VITC_OK) {
        fprintf(stderr, "test_sam_decoder: load: %s\n", vitc_last_error());
        return -1;
    }
    vitc_safetensors *st;
    if (tu_ref_load("test_sam_decoder", DIR "image.safetensors", &st) != 0)
        return -1;
    int i = vitc_safetensors_find(st, "emb");
    const char *nm, *dt;
    int nd;
    const int64_t *shape;
    const float *emb;
    if (i < 0 || vitc_safetensors_tensor(st, i, &nm, &dt, &nd, &shape, &emb) != VITC_OK ||
        nd != 3 || shape[0] != 32 || shape[1] != 16 || shape[2] != 16)
        return -1;
    f->emb_cl = malloc(32 * 256 * sizeof(float));
    for (int c = 0; c < 32; c++)
        for (int p = 0; p < 256; p++) f->emb_cl[p * 32 + c] = emb[c * 256 + p];
    vitc_safetensors_free(st);
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (f) {
        vitc__sam_dec_free(f->dec);
        vitc__shards_free(&f->sh);
        json_decref(f->config);
        free(f->emb_cl);
        free(f);
    }
    return 0;
}

static struct vitc_sam_image image_of(const fixture *f, int oh, int ow, int rh, int rw) {
    struct vitc_sam_image e;
    memset(&e, 0, sizeof e);
    e.emb_cl = f->emb_cl;
    e.C = 32, e.h = 16, e.w = 16;
    e.orig_h = oh, e.orig_w = ow, e.resized_h = rh, e.resized_w = rw;
    return e;
}

/* max|got - ref| <= 1e-4 max|ref|. */
static void assert_close(const char *what, const float *got, const float *ref, int64_t n) {
    double dmax = 0.0, rmax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= dmax))
            dmax = d; /* NaN stays */
        if (fabs(ref[i]) > rmax)
            rmax = fabs(ref[i]);
    }
    if (!(dmax <= 1e-4 * rmax))
        fail_msg("%s: max|d| %g, max|ref| %g", what, dmax, rmax);
}

static const float *opt_tensor(const vitc_safetensors *st, const char *name, int64_t *n) {
    int i = vitc_safetensors_find(st, name);
    if (i < 0)
        return NULL;
    int nd;
    const int64_t *shape;
    const float *d = tu_tensor(st, name, &nd, &shape);
    *n = tu_numel(nd, shape);
    return d;
}

static void run_case(const fixture *f, const char *name) {
    char path[256];
    snprintf(path, sizeof path, DIR "%s.safetensors", name);
    vitc_safetensors *st;
    assert_int_equal(tu_ref_load(name, path, &st), 0);
    int64_t n;
    const float *meta = opt_tensor(st, "meta", &n);
    assert_non_null(meta);
    struct vitc_sam_image e =
        image_of(f, (int)meta[0], (int)meta[1], (int)meta[2], (int)meta[3]);
    vitc_sam_prompt p;
    memset(&p, 0, sizeof p);
    p.multimask = (int)meta[4];
    int labels[16];
    int64_t np = 0;
    const float *lab = opt_tensor(st, "labels", &np);
    p.points = opt_tensor(st, "points", &n);
    if (p.points) {
        p.n_points = (int)np;
        for (int64_t i = 0; i < np; i++) labels[i] = (int)lab[i];
        p.labels = labels;
    }
    p.box = opt_tensor(st, "box", &n);
    p.mask = opt_tensor(st, "mask", &n);
    vitc_sam_result r;
    if (vitc__sam_dec_predict(f->dec, &e, 256, &p, &r) != VITC_OK)
        fail_msg("%s: %s", name, vitc_last_error());
    int64_t nl, ni, nm;
    const float *low = opt_tensor(st, "low", &nl), *iou = opt_tensor(st, "iou", &ni);
    assert_int_equal(r.n_masks, ni);
    assert_int_equal(r.n_masks, p.multimask ? 3 : 1);
    assert_int_equal(nl, (int64_t)r.n_masks * 64 * 64);
    assert_int_equal(r.height, e.orig_h);
    assert_int_equal(r.width, e.orig_w);
    char what[128];
    snprintf(what, sizeof what, "%s low_res", name);
    assert_close(what, r.low_res, low, nl);
    snprintf(what, sizeof what, "%s iou", name);
    assert_close(what, r.iou, iou, ni);
    const float *masks = opt_tensor(st, "masks", &nm);
    if (masks) {
        assert_int_equal(nm, (int64_t)r.n_masks * r.height * r.width);
        snprintf(what, sizeof what, "%s masks", name);
        assert_close(what, r.masks, masks, nm);
    }
    free(r.masks);
    free(r.low_res);
    vitc__sam_dec_cache_free(e.dec_cache);
    vitc_safetensors_free(st);
}

static void test_points(void **state) {
    run_case(*state, "point");
    run_case(*state, "points_bg");
}

static void test_boxes(void **state) {
    run_case(*state, "box");
    run_case(*state, "box_points");
}

static void test_mask_prompt(void **state) {
    run_case(*state, "mask");
    run_case(*state, "mask_only");
}

/* A refused prompt: the message names the problem, nothing allocated. */
static void refused(const fixture *f, const vitc_sam_prompt *p, const char *needle) {
    struct vitc_sam_image e = image_of(f, 150, 220, 175, 256);
    vitc_sam_result r;
    memset(&r, 0x5a, sizeof r);
    assert_int_equal(vitc__sam_dec_predict(f->dec, &e, 256, p, &r), VITC_ERR_INVALID_ARG);
    tu_assert_message_has(needle);
    assert_null(r.masks);
    assert_null(r.low_res);
    assert_int_equal(r.n_masks, 0);
}

static void test_bad_prompts(void **state) {
    const fixture *f = *state;
    float pts[4] = {10, 10, 50, 60};
    int labels[2] = {1, 0};
    vitc_sam_prompt p = {.n_points = 2, .points = pts, .labels = labels, .multimask = 1};
    pts[2] = 221; /* x beyond the 220-pixel width */
    refused(f, &p, "outside the 220x150 image");
    pts[2] = 50, pts[3] = -1;
    refused(f, &p, "outside");
    pts[3] = NAN;
    refused(f, &p, "outside");
    pts[3] = INFINITY;
    refused(f, &p, "outside");
    pts[3] = 60;
    labels[1] = 2;
    refused(f, &p, "label 2");
    labels[1] = -1;
    refused(f, &p, "label -1");
    labels[1] = 0;
    p.n_points = -1;
    refused(f, &p, "0 to 1000 points");
    p.n_points = 1001;
    refused(f, &p, "0 to 1000 points");
    p.n_points = 2, p.points = NULL;
    refused(f, &p, "points is NULL");
    p.points = pts;
    float box[4] = {20, 30, 20, 90}; /* zero width */
    p.box = box;
    refused(f, &p, "no area");
    box[2] = 10; /* inverted */
    refused(f, &p, "no area");
    box[2] = 100, box[3] = 151; /* below the image */
    refused(f, &p, "outside");
    box[3] = NAN;
    refused(f, &p, "outside");
    box[3] = 90;
    float *mask = calloc(64 * 64, sizeof(float));
    mask[100] = NAN;
    p.mask = mask;
    refused(f, &p, "mask prompt");
    free(mask);
    p.mask = NULL;

    /* The prompt is fine: the image's embedding is not this model's. */
    struct vitc_sam_image e = image_of(f, 150, 220, 175, 256);
    e.h = e.w = 8;
    vitc_sam_result r;
    assert_int_equal(vitc__sam_dec_predict(f->dec, &e, 256, &p, &r), VITC_ERR_SHAPE);
    tu_assert_message_has("set the image with the same model");
    assert_null(r.masks);
    e = image_of(f, 150, 220, 175, 300); /* resized wider than the input */
    assert_int_equal(vitc__sam_dec_predict(f->dec, &e, 256, &p, &r), VITC_ERR_INVALID_ARG);
    /* The edges themselves are in the image (a box may end at the width). */
    e = image_of(f, 150, 220, 175, 256);
    pts[2] = 220, pts[3] = 150;
    box[0] = 0, box[1] = 0, box[2] = 220, box[3] = 150;
    assert_int_equal(vitc__sam_dec_predict(f->dec, &e, 256, &p, &r), VITC_OK);
    for (int64_t i = 0; i < 3 * 150 * 220; i++) assert_true(isfinite(r.masks[i]));
    free(r.masks);
    free(r.low_res);
    vitc__sam_dec_cache_free(e.dec_cache);
}

/* The config's sizes must match the tensors; unknown activations refused. */
static void test_bad_models(void **state) {
    fixture *f = *state;
    vitc__sam_dec *d = (vitc__sam_dec *)1;
    json_t *c = json_deep_copy(f->config);
    json_t *mc = json_object_get(c, "mask_decoder_config");
    json_object_set_new(mc, "mlp_dim", json_integer(48));
    assert_int_equal(vitc__sam_dec_load(&d, &f->sh, c), VITC_ERR_SHAPE);
    tu_assert_message_has("mlp.lin1.weight");
    assert_null(d);
    json_object_set_new(mc, "mlp_dim", json_integer(64));
    json_object_set_new(mc, "hidden_act", json_string("swish"));
    assert_int_equal(vitc__sam_dec_load(&d, &f->sh, c), VITC_ERR_UNSUPPORTED);
    tu_assert_message_has("hidden_act");
    json_object_set_new(mc, "hidden_act", json_string("relu"));
    json_object_set_new(mc, "num_attention_heads", json_integer(3));
    assert_int_equal(vitc__sam_dec_load(&d, &f->sh, c), VITC_ERR_FORMAT);
    tu_assert_message_has("num_attention_heads");
    json_object_set_new(mc, "num_attention_heads", json_integer(2));
    json_object_set_new(mc, "num_multimask_outputs", json_integer(9));
    assert_int_equal(vitc__sam_dec_load(&d, &f->sh, c), VITC_ERR_FORMAT);
    tu_assert_message_has("num_multimask_outputs");
    json_decref(c);
    /* Absent sections: transformers' defaults (hidden 256), which these
     * tensors do not have. */
    assert_int_equal(vitc__sam_dec_load(&d, &f->sh, NULL), VITC_ERR_SHAPE);
    tu_assert_message_has("expected [");
}

/* The folded token <-> image attention (the default while the prompt has
 * few tokens), the image's cached first-layer keys, values and queries,
 * the final attention on the rows read afterwards only, and the fused
 * upscaling (one grid row through both transposed convolutions and the
 * hypernetwork product) against the literal forms (VITC_DENSE=ref: every
 * projection as SamAttention computes it, each layer whole), within 1e-5
 * of max|literal|, for prompts of each kind, the masks at the original
 * size included; a prompt with more tokens than the fold pays for runs
 * the literal form both ways except in the final attention (4 rows). */
static void test_folded_equals_literal(void **state) {
    const fixture *f = *state;
    struct vitc_sam_image e = image_of(f, 150, 220, 174, 256);
    static const float pts[6] = {40, 30, 200, 100, 120, 140};
    static const int labs[3] = {1, 0, 1};
    static const float box[4] = {20, 10, 180, 130};
    float *mask = malloc(64 * 64 * sizeof(float));
    assert_non_null(mask);
    for (int i = 0; i < 64 * 64; i++) mask[i] = (float)sin(0.37 * i) * 3.0f;
    for (int k = 0; k < 4; k++) {
        vitc_sam_prompt p;
        memset(&p, 0, sizeof p);
        p.points = pts, p.labels = labs, p.n_points = k == 1 ? 3 : 1;
        p.box = k >= 2 ? box : NULL;
        p.mask = k == 3 ? mask : NULL;
        p.multimask = k != 2;
        vitc_sam_result a, b;
        assert_int_equal(vitc__nn_dense_force("ref"), VITC_OK);
        vitc_status s = vitc__sam_dec_predict(f->dec, &e, 256, &p, &a);
        assert_int_equal(vitc__nn_dense_force("auto"), VITC_OK);
        assert_int_equal(s, VITC_OK);
        assert_int_equal(vitc__sam_dec_predict(f->dec, &e, 256, &p, &b), VITC_OK);
        assert_int_equal(a.n_masks, b.n_masks);
        double dmax = 0.0, rmax = 0.0;
        for (int64_t i = 0; i < (int64_t)a.n_masks * 64 * 64; i++) {
            double d = fabs((double)a.low_res[i] - b.low_res[i]);
            if (!(d <= dmax))
                dmax = d;
            if (fabs(a.low_res[i]) > rmax)
                rmax = fabs(a.low_res[i]);
        }
        if (!(dmax <= 1e-5 * rmax))
            fail_msg("prompt %d low_res: max|d| %g, max|literal| %g", k, dmax, rmax);
        dmax = 0.0, rmax = 0.0;
        for (int64_t i = 0; i < (int64_t)a.n_masks * a.height * a.width; i++) {
            double d = fabs((double)a.masks[i] - b.masks[i]);
            if (!(d <= dmax))
                dmax = d;
            if (fabs(a.masks[i]) > rmax)
                rmax = fabs(a.masks[i]);
        }
        if (!(dmax <= 1e-5 * rmax) || a.height != 150 || b.width != 220)
            fail_msg("prompt %d masks: max|d| %g, max|literal| %g", k, dmax, rmax);
        for (int m = 0; m < a.n_masks; m++)
            if (!(fabs(a.iou[m] - b.iou[m]) <= 1e-5 * (fabs(a.iou[m]) + 1e-3)))
                fail_msg("prompt %d iou %d: %g vs %g", k, m, a.iou[m], b.iou[m]);
        free(a.masks), free(a.low_res), free(b.masks), free(b.low_res);
    }
    /* the first prompt without a mask made the image's cache: used since */
    assert_non_null(e.dec_cache);
    vitc__sam_dec_cache_free(e.dec_cache);
    free(mask);
}

/* Two threads predicting on one fresh image race to make its cache: one
 * copy wins, the other is freed (`make asan` or valgrind would see a leak
 * or a double free), and both get the masks a lone prompt gets. */
typedef struct race_arg {
    const fixture *f;
    struct vitc_sam_image *e;
    vitc_sam_result r;
    vitc_status s;
} race_arg;

static void *race_one(void *v) {
    race_arg *a = v;
    static const float pt[2] = {60, 40};
    static const int lab[1] = {1};
    vitc_sam_prompt p;
    memset(&p, 0, sizeof p);
    p.points = pt, p.labels = lab, p.n_points = 1, p.multimask = 1;
    a->s = vitc__sam_dec_predict(a->f->dec, a->e, 256, &p, &a->r);
    return NULL;
}

static void test_cache_race(void **state) {
    const fixture *f = *state;
    struct vitc_sam_image e = image_of(f, 150, 220, 174, 256);
    race_arg a[3] = {{f, &e, {0}, VITC_OK}, {f, &e, {0}, VITC_OK}, {f, &e, {0}, VITC_OK}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, race_one, &a[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    assert_non_null(e.dec_cache);
    vitc__sam_dec_cache_free(e.dec_cache);
    e.dec_cache = NULL;
    race_one(&a[2]); /* alone, its own cache */
    for (int i = 0; i < 3; i++) assert_int_equal(a[i].s, VITC_OK);
    for (int i = 0; i < 2; i++) {
        for (int64_t j = 0; j < 3 * 64 * 64; j++)
            if (!(fabs(a[i].r.low_res[j] - a[2].r.low_res[j]) <=
                  1e-5 * (fabs(a[2].r.low_res[j]) + 1.0)))
                fail_msg("thread %d low_res[%lld]: %g vs %g", i, (long long)j,
                         a[i].r.low_res[j], a[2].r.low_res[j]);
    }
    for (int i = 0; i < 3; i++) free(a[i].r.masks), free(a[i].r.low_res);
    vitc__sam_dec_cache_free(e.dec_cache);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_points),      cmocka_unit_test(test_boxes),
        cmocka_unit_test(test_mask_prompt), cmocka_unit_test(test_bad_prompts),
        cmocka_unit_test(test_bad_models),  cmocka_unit_test(test_folded_equals_literal),
        cmocka_unit_test(test_cache_race),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
