/*
 * sam.c — Segment Anything: loading a transformers SamModel directory, the
 * public vitc_sam_* calls, and the image preprocessing (SamProcessor's).
 * The image encoder is sam_encoder.c; the prompt side sam_decoder.c.
 *
 * The directory is config.json (model_type "sam"; vision_config,
 * prompt_encoder_config, mask_decoder_config, absent keys taking
 * transformers' defaults) and model.safetensors or a shard index.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../nn/nn.h"
#include "sam.h"

/* ------------------------------------------------------------------ */
/* config.json                                                        */
/* ------------------------------------------------------------------ */

/* An integer key in [lo, hi], def when absent or null. */
static vitc_status cfg_int(const json_t *o, const char *key, int def, int lo, int hi, int *out) {
    json_t *v = json_object_get(o, key);
    *out = def;
    if (!v || json_is_null(v))
        return VITC_OK;
    /* image_size / patch_size may be [h, w]: SAM's encoder is square */
    if (json_is_array(v) && json_array_size(v) == 2 &&
        json_equal(json_array_get(v, 0), json_array_get(v, 1)))
        v = json_array_get(v, 0);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return vitc__err(VITC_ERR_FORMAT, "config.json: vision_config.%s must be an integer in "
                         "[%d, %d] (a square size for image_size / patch_size)", key, lo, hi);
    *out = (int)json_integer_value(v);
    return VITC_OK;
}

static vitc_status cfg_bool(const json_t *o, const char *key, int def, int *out) {
    json_t *v = json_object_get(o, key);
    *out = def;
    if (!v || json_is_null(v))
        return VITC_OK;
    if (!json_is_boolean(v))
        return vitc__err(VITC_ERR_FORMAT, "config.json: vision_config.%s must be true or false",
                         key);
    *out = json_is_true(v);
    return VITC_OK;
}

/* transformers 5.24's SamVisionConfig defaults (facebook/sam-vit-base's
 * encoder) under what vision_config says. */
static vitc_status sam_vision_config(vitc__sam_enc *e, const json_t *root) {
    const json_t *vc = json_object_get(root, "vision_config");
    if (vc && !json_is_object(vc) && !json_is_null(vc))
        return vitc__err(VITC_ERR_FORMAT, "config.json: \"vision_config\" must be an object");
    if (!json_is_object(vc))
        vc = NULL; /* every key absent: the defaults */
    int C, L, H, M, P, S, ws, O, ch, use_rel, use_abs, qkv_bias;
    const int big = 1 << 16;
    VITC_TRY(cfg_int(vc, "hidden_size", 768, 1, big, &C));
    VITC_TRY(cfg_int(vc, "num_hidden_layers", 12, 1, 1024, &L));
    VITC_TRY(cfg_int(vc, "num_attention_heads", 12, 1, big, &H));
    VITC_TRY(cfg_int(vc, "patch_size", 16, 1, 1024, &P));
    VITC_TRY(cfg_int(vc, "image_size", 1024, 1, 16384, &S));
    VITC_TRY(cfg_int(vc, "window_size", 14, 0, 16384, &ws));
    VITC_TRY(cfg_int(vc, "output_channels", 256, 1, big, &O));
    VITC_TRY(cfg_int(vc, "num_channels", 3, 1, 3, &ch));
    VITC_TRY(cfg_bool(vc, "use_rel_pos", 1, &use_rel));
    VITC_TRY(cfg_bool(vc, "use_abs_pos", 1, &use_abs));
    VITC_TRY(cfg_bool(vc, "qkv_bias", 1, &qkv_bias));
    json_t *md = json_object_get(vc, "mlp_dim");
    if (md && !json_is_null(md)) {
        VITC_TRY(cfg_int(vc, "mlp_dim", 0, 1, 1 << 20, &M));
    } else { /* int(hidden_size * mlp_ratio) */
        json_t *r = json_object_get(vc, "mlp_ratio");
        double ratio = 4.0;
        if (r && !json_is_null(r)) {
            if (!json_is_number(r) || !(json_number_value(r) > 0) || json_number_value(r) > 64)
                return vitc__err(VITC_ERR_FORMAT, "config.json: vision_config.mlp_ratio must be "
                                 "a number in (0, 64]");
            ratio = json_number_value(r);
        }
        M = (int)(C * ratio);
        if (M < 1)
            return vitc__err(VITC_ERR_FORMAT, "config.json: vision_config.mlp_ratio %g gives "
                             "no MLP", ratio);
    }
    if (ch != 3)
        return vitc__err(VITC_ERR_UNSUPPORTED, "config.json: vision_config.num_channels %d: "
                         "SAM reads RGB images (3)", ch);
    if (C % H)
        return vitc__err(VITC_ERR_FORMAT, "config.json: hidden_size %d is not a multiple of "
                         "num_attention_heads %d", C, H);
    if (S < P)
        return vitc__err(VITC_ERR_FORMAT, "config.json: image_size %d is smaller than "
                         "patch_size %d: no patches", S, P);
    json_t *eps = json_object_get(vc, "layer_norm_eps");
    e->eps = 1e-6f;
    if (eps && !json_is_null(eps)) {
        if (!json_is_number(eps) || !(json_number_value(eps) >= 0) || json_number_value(eps) > 1)
            return vitc__err(VITC_ERR_FORMAT, "config.json: vision_config.layer_norm_eps must "
                             "be a number in [0, 1]");
        e->eps = (float)json_number_value(eps);
    }
    json_t *act = json_object_get(vc, "hidden_act");
    const char *a = json_is_string(act) ? json_string_value(act) : "gelu";
    if (act && !json_is_null(act) && !json_is_string(act))
        return vitc__err(VITC_ERR_FORMAT, "config.json: vision_config.hidden_act must be a name");
    if (!strcmp(a, "gelu"))
        e->act = VITC__NN_GELU;
    else if (!strcmp(a, "gelu_pytorch_tanh") || !strcmp(a, "gelu_new"))
        e->act = VITC__NN_GELU_TANH;
    else if (!strcmp(a, "quick_gelu"))
        e->act = VITC__NN_QUICK_GELU;
    else
        return vitc__err(VITC_ERR_UNSUPPORTED, "config.json: vision_config.hidden_act \"%s\" "
                         "(supported: gelu, gelu_pytorch_tanh, gelu_new, quick_gelu)", a);
    e->C = C, e->depth = L, e->H = H, e->M = M, e->patch = P, e->img = S;
    e->grid = S / P, e->ws = ws, e->O = O;
    e->use_rel = use_rel, e->use_abs = use_abs, e->qkv_bias = qkv_bias;
    /* global_attn_indexes: the blocks attending over the whole grid (an
     * index past the last block is ignored, as transformers does) */
    e->global = calloc((size_t)L, 1);
    if (!e->global)
        return vitc__err(VITC_ERR_NOMEM, "SAM config: out of memory");
    json_t *gi = json_object_get(vc, "global_attn_indexes");
    if (!gi || json_is_null(gi)) {
        static const int def[4] = {2, 5, 8, 11};
        for (int i = 0; i < 4; i++)
            if (def[i] < L) e->global[def[i]] = 1;
    } else {
        if (!json_is_array(gi))
            return vitc__err(VITC_ERR_FORMAT, "config.json: vision_config.global_attn_indexes "
                             "must be a list of block indices");
        size_t i;
        json_t *v;
        json_array_foreach(gi, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0)
                return vitc__err(VITC_ERR_FORMAT, "config.json: vision_config."
                                 "global_attn_indexes[%zu] must be a block index >= 0", i);
            if (json_integer_value(v) < L) e->global[json_integer_value(v)] = 1;
        }
    }
    if (ws == 0) /* window_size 0: every block global (transformers' "no window") */
        memset(e->global, 1, (size_t)L);
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Loading                                                            */
/* ------------------------------------------------------------------ */

/* path: a directory, or a file inside one (config.json, the weights or
 * their index). *dir and *weights malloc'd; *weights NULL: the dir's own. */
static vitc_status sam_paths(const char *path, char **dir, char **weights) {
    struct stat sb;
    *dir = *weights = NULL;
    if (stat(path, &sb) != 0)
        return vitc__err(VITC_ERR_IO, "%s: no such file or directory (a SAM model is a "
                         "directory: config.json and model.safetensors)", path);
    if (S_ISDIR(sb.st_mode)) {
        *dir = strdup(path);
    } else {
        const char *slash = strrchr(path, '/');
        size_t n = slash ? (size_t)(slash - path) : 1;
        *dir = malloc(n + 1);
        if (*dir) {
            memcpy(*dir, slash ? path : ".", n);
            (*dir)[n] = '\0';
        }
        size_t len = strlen(path);
        int cfg = len >= 11 && !strcmp(path + len - 11, "config.json") &&
                  (len == 11 || path[len - 12] == '/');
        if (!cfg && !(*weights = strdup(path))) {
            free(*dir);
            *dir = NULL;
        }
    }
    if (!*dir)
        return vitc__err(VITC_ERR_NOMEM, "out of memory");
    if (!*weights) {
        char *w = vitc__hub_join(*dir, "model.safetensors");
        if (w && !vitc__hub_exists(w)) {
            free(w);
            w = vitc__hub_join(*dir, "model.safetensors.index.json");
            if (w && !vitc__hub_exists(w)) {
                free(w);
                return vitc__err(VITC_ERR_IO, "%s: no model.safetensors or "
                                 "model.safetensors.index.json (convert the original "
                                 "sam_vit_*.pth with tools/convert_sam.py)", *dir);
            }
        }
        if (!w)
            return vitc__err(VITC_ERR_NOMEM, "out of memory");
        *weights = w;
    }
    return VITC_OK;
}

static vitc_status sam_load(const char *path, vitc_precision prec, vitc_sam **out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_load: NULL output");
    *out = NULL;
    if (!path || !*path)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_load: empty path");
    char *dir = NULL, *weights = NULL, *cfg_path = NULL;
    json_t *root = NULL;
    vitc__shards sh = {0};
    sh.prec = -1;
    vitc_sam *m = calloc(1, sizeof *m);
    vitc_status s = m ? VITC_OK : vitc__err(VITC_ERR_NOMEM, "vitc_sam_load: out of memory");
    if (s == VITC_OK)
        s = sam_paths(path, &dir, &weights);
    if (s == VITC_OK && !(cfg_path = vitc__hub_join(dir, "config.json")))
        s = vitc__err(VITC_ERR_NOMEM, "out of memory");
    if (s == VITC_OK && !vitc__hub_exists(cfg_path))
        s = vitc__err(VITC_ERR_IO, "%s: no config.json (a SAM model directory holds "
                      "config.json and model.safetensors; tools/convert_sam.py makes one from "
                      "sam_vit_*.pth)", dir);
    if (s == VITC_OK)
        s = vitc__hub_read_json(cfg_path, &root);
    if (s == VITC_OK) {
        json_t *mt = json_object_get(root, "model_type");
        if (!json_is_string(mt) || strcmp(json_string_value(mt), "sam"))
            s = vitc__err(VITC_ERR_UNSUPPORTED, "%s: model_type %s%s%s is not a Segment "
                          "Anything model (\"sam\"); load ViTs with vitc_vit_load", cfg_path,
                          json_is_string(mt) ? "\"" : "",
                          json_is_string(mt) ? json_string_value(mt) : "(none)",
                          json_is_string(mt) ? "\"" : "");
    }
    if (s == VITC_OK)
        s = sam_vision_config(&m->enc, root);
    if (s == VITC_OK)
        s = vitc__shards_open(&sh, dir, weights);
    if (s == VITC_OK)
        s = vitc__sam_enc_load(&m->enc, &sh, prec);
    if (s == VITC_OK)
        s = vitc__sam_dec_load(&m->dec, &sh, root);
    vitc__shards_free(&sh);
    json_decref(root);
    free(cfg_path);
    free(dir);
    free(weights);
    if (s != VITC_OK) {
        vitc_sam_free(m);
        return s;
    }
    *out = m;
    return VITC_OK;
}

vitc_status vitc_sam_load(const char *path, vitc_sam **out) {
    return sam_load(path, VITC_PRECISION_FP32, out);
}

vitc_status vitc_sam_load_precision(const char *path, const char *precision, vitc_sam **out) {
    if (out)
        *out = NULL;
    int p = precision ? vitc_precision_parse(precision) : VITC_PRECISION_FP32;
    if (p < 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_load_precision: unknown precision "
                         "\"%s\" (expected fp32, bf16 or int8)", precision);
    return sam_load(path, (vitc_precision)p, out);
}

void vitc_sam_free(vitc_sam *m) {
    if (!m)
        return;
    vitc__sam_enc_free(&m->enc);
    vitc__sam_dec_free(m->dec);
    free(m);
}

int vitc_sam_input_size(const vitc_sam *m) { return m ? m->enc.img : 0; }

void vitc_sam_embedding_shape(const vitc_sam *m, int64_t shape[3]) {
    if (!shape)
        return;
    shape[0] = m ? m->enc.O : 0;
    shape[1] = shape[2] = m ? m->enc.grid : 0;
}

/* ------------------------------------------------------------------ */
/* Images                                                             */
/* ------------------------------------------------------------------ */

/* SamImageProcessor's resized size: the longest side to S, each side
 * int(side * S / longest + 0.5). */
static void sam_resized(int w, int h, int S, int *rw, int *rh) {
    double scale = S * 1.0 / (double)(w > h ? w : h);
    *rh = (int)((double)h * scale + 0.5);
    *rw = (int)((double)w * scale + 0.5);
}

static vitc_status sam_encode(const vitc_sam *m, const float *pixels, int orig_w, int orig_h,
                              vitc_sam_image **out) {
    const vitc__sam_enc *e = &m->enc;
    vitc_sam_image *r = calloc(1, sizeof *r);
    size_t n = (size_t)e->O * (size_t)e->grid * (size_t)e->grid;
    if (r) {
        r->emb = malloc(n * sizeof(float));
        r->emb_cl = malloc(n * sizeof(float));
    }
    if (!r || !r->emb || !r->emb_cl) {
        vitc_sam_image_free(r);
        return vitc__err(VITC_ERR_NOMEM, "SAM image embedding: out of memory");
    }
    r->C = e->O, r->h = r->w = e->grid;
    r->orig_w = orig_w, r->orig_h = orig_h;
    sam_resized(orig_w, orig_h, e->img, &r->resized_w, &r->resized_h);
    vitc_status s = vitc__sam_enc_forward(e, pixels, r->emb, r->emb_cl);
    if (s != VITC_OK) {
        vitc_sam_image_free(r);
        return s;
    }
    *out = r;
    return VITC_OK;
}

vitc_status vitc_sam_set_image_tensor(const vitc_sam *m, const float *pixels, int orig_w,
                                      int orig_h, vitc_sam_image **out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_set_image_tensor: NULL output");
    *out = NULL;
    if (!m || !pixels)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_set_image_tensor: NULL model or pixels");
    if (orig_w < 1 || orig_h < 1)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_set_image_tensor: image size %dx%d "
                         "(width and height must be >= 1)", orig_w, orig_h);
    int rw, rh;
    sam_resized(orig_w, orig_h, m->enc.img, &rw, &rh);
    if (rw < 1 || rh < 1)
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM: a %dx%d image resizes to %dx%d inside "
                         "the %d-pixel input: too elongated (crop it first)", orig_w, orig_h,
                         rw, rh, m->enc.img);
    return sam_encode(m, pixels, orig_w, orig_h, out);
}

vitc_status vitc_sam_set_image(const vitc_sam *m, const vitc_image *img, vitc_sam_image **out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_set_image: NULL output");
    *out = NULL;
    if (!m || !img || !img->rgb)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_set_image: NULL model or image");
    if (img->width < 1 || img->height < 1)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_set_image: empty image (%dx%d)",
                         img->width, img->height);
    const int S = m->enc.img;
    int rw, rh;
    sam_resized(img->width, img->height, S, &rw, &rh);
    if (rw < 1 || rh < 1)
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM: a %dx%d image resizes to %dx%d inside "
                         "the %d-pixel input: too elongated (crop it first)", img->width,
                         img->height, rw, rh, S);
    /* SamImageProcessor: PIL bilinear on the uint8 image, rescale 1/255,
     * ImageNet mean / std, then zeros right and bottom to S x S. The
     * resize itself keeps to the preprocessing budget (docs/limits.md). */
    vitc__hf_proc p = {.present = 1, .do_resize = 1, .size_h = rh, .size_w = rw,
                       .resample = 2, .do_rescale = 1, .rescale = 1.0 / 255.0,
                       .do_normalize = 1, .mean = {0.485f, 0.456f, 0.406f},
                       .std = {0.229f, 0.224f, 0.225f}};
    size_t plane = (size_t)S * (size_t)S, rplane = (size_t)rw * (size_t)rh;
    float *px = calloc(3 * plane, sizeof(float));    /* [3, S, S] */
    float *small = malloc(3 * rplane * sizeof(float)); /* [3, rh, rw] */
    vitc_status s = px && small ? VITC_OK
                                : vitc__err(VITC_ERR_NOMEM, "SAM preprocessing: out of memory");
    if (s == VITC_OK)
        s = vitc__hf_preprocess(&p, img, small);
    if (s == VITC_OK) {
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < rh; y++)
                memcpy(px + c * plane + (size_t)y * S, small + c * rplane + (size_t)y * rw,
                       (size_t)rw * sizeof(float));
        free(small);
        small = NULL;
        s = sam_encode(m, px, img->width, img->height, out);
    }
    free(small);
    free(px);
    return s;
}

void vitc_sam_image_free(vitc_sam_image *e) {
    if (!e)
        return;
    free(e->emb);
    free(e->emb_cl);
    vitc__sam_dec_cache_free(e->dec_cache);
    free(e);
}

const float *vitc_sam_image_embedding(const vitc_sam_image *e) { return e ? e->emb : NULL; }

/* ------------------------------------------------------------------ */
/* Prompts                                                            */
/* ------------------------------------------------------------------ */

vitc_status vitc_sam_predict(const vitc_sam *m, const vitc_sam_image *e, const vitc_sam_prompt *p,
                             vitc_sam_result *out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_predict: NULL result");
    memset(out, 0, sizeof *out);
    if (!m || !e || !p)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_sam_predict: NULL model, image or prompt");
    if (e->C != m->enc.O || e->h != m->enc.grid || e->w != m->enc.grid)
        return vitc__err(VITC_ERR_SHAPE, "vitc_sam_predict: the image embedding [%lld, %lld, "
                         "%lld] is not this model's (set the image with the same model)",
                         (long long)e->C, (long long)e->h, (long long)e->w);
    return vitc__sam_dec_predict(m->dec, e, m->enc.img, p, out);
}

void vitc_sam_result_free(vitc_sam_result *r) {
    if (!r)
        return;
    free(r->masks);
    free(r->low_res);
    free(r->binary);
    r->masks = r->low_res = NULL;
    r->binary = NULL;
}
