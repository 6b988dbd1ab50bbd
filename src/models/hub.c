/*
 * hub.c — what every Hugging Face Hub family shares: config.json and the
 * shard index, the image processor, and reading the table's rows from
 * the Hub's names (a family's vitc__hub_names): q/k/v fused into the
 * [3C, C] in_proj rows, the backbone prefix ("vit.", "deit.", "dinov2.")
 * of a head model present or absent as from_pretrained accepts both.
 * Tensors the forward never reads (pooler, position_ids, mask_token) are
 * skipped by name and listed; any other extra tensor, a missing or
 * mis-shaped one, is an error naming it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "../train/train.h"
#include "family.h"
#include "text.h"

/* The names more than one family spells alike (family.h). */
const char *const vitc__timm_layer_names[VIT_L_COUNT] = {
    VITC__BLOCK_NAMES("norm1", "attn.qkv.weight", "attn.qkv.bias", "attn.proj", "norm2",
                      "mlp.fc1", "mlp.fc2"),
    [VIT_L_LS1] = "ls1.gamma",
    [VIT_L_LS2] = "ls2.gamma",
};
const char *const vitc__hf_clip_layer_names[VIT_L_COUNT] = {
    VITC__BLOCK_NAMES("layer_norm1", "self_attn.%s_proj.weight", "self_attn.%s_proj.bias",
                      "self_attn.out_proj", "layer_norm2", "mlp.fc1", "mlp.fc2"),
};
const char *const vitc__hf_vit_model_names[VIT_P_T2T0] = {
    [VIT_P_CLS] = "%sembeddings.cls_token",
    VITC__WB(VIT_P_CONV, "%sembeddings.patch_embeddings.projection"),
    [VIT_P_POS] = "%sembeddings.position_embeddings",
    [VIT_P_DIST] = "%sembeddings.distillation_token",
    [VIT_P_REG] = "%sembeddings.register_tokens",
    VITC__WB(VIT_P_LN, "%slayernorm"),
    VITC__WB(VIT_P_HEAD, "classifier"),
    VITC__WB(VIT_P_HEAD2, "distillation_classifier"),
};
const char *const vitc__qkv_short[3] = {"q", "k", "v"};
const char *const vitc__qkv_long[3] = {"query", "key", "value"};

#define HUB_MAX_SHARDS 4096
#define HUB_MAX_DIM VIT_MAX_DIM
#define HUB_MAX_DEPTH VIT_MAX_DEPTH

/* Each Hub JSON file's bounds, set from real files with a wide margin: a
 * config.json is kilobytes (ImageNet-22k's 21,843 labels, id2label and
 * label2id both, make 1 to 2.5 MB, 44,000 values); a preprocessor_config.json or
 * open_clip_config.json well under 10 KB; an index names each tensor once
 * (a 405B-parameter LLM's: 120 KB). Checked before jansson builds its tree
 * (up to ~80x the text). */
static const struct hub_json_kind {
    const char *tail; /* the file name's end */
    uint64_t bytes;
    size_t items;
    const char *what;
} hub_json_kinds[] = {
    {"preprocessor_config.json", 1u << 20, 1u << 16, "a Hub preprocessor_config.json"},
    {"open_clip_config.json", 1u << 20, 1u << 16, "an open_clip_config.json"},
    {"config.json", 8u << 20, 1u << 18, "a Hub config.json"},
    {".json", 16u << 20, 1u << 19, "a shard index (.index.json)"},
};

void vitc__shards_free(vitc__shards *h) {
    for (int i = 0; i < h->n; i++) {
        vitc_safetensors_free(h->st[i]);
        free(h->names[i]);
        free(h->used[i]);
    }
    free(h->st);
    free(h->names);
    free(h->used);
    memset(h, 0, sizeof *h);
}

/* path's JSON object, bounded by the kind of file its name says. */
vitc_status vitc__hub_read_json(const char *path, json_t **out) {
    size_t len = strlen(path), n = sizeof hub_json_kinds / sizeof *hub_json_kinds;
    const struct hub_json_kind *k = &hub_json_kinds[n - 1];
    for (size_t i = 0; i < n; i++) {
        size_t t = strlen(hub_json_kinds[i].tail);
        if (len >= t && !strcmp(path + len - t, hub_json_kinds[i].tail)) {
            k = &hub_json_kinds[i];
            break;
        }
    }
    return vitc__json_load_capped(path, k->bytes, k->items, k->what, out);
}

void vitc__name_copy(char *dst, size_t cap, const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (!cap)
        return;
    if (n >= cap) {
        n = cap - 1;
        /* back off the continuation bytes (10xxxxxx) of a cut character */
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    }
    if (n)
        memcpy(dst, s, n);
    dst[n] = '\0';
}

char *vitc__hub_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p)
        snprintf(p, a + b + 2, "%s/%s", dir, name);
    return p;
}

int vitc__hub_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static vitc_status hub_add_shard(vitc__shards *h, const char *dir, const char *name) {
    if (h->n >= HUB_MAX_SHARDS)
        return vitc__err(VITC_ERR_FORMAT, "more than %d shards", HUB_MAX_SHARDS);
    /* A shard is a file beside the index: no directories, no way out. */
    if (!*name || strchr(name, '/') || !strcmp(name, "..") || !strcmp(name, "."))
        return vitc__err(VITC_ERR_FORMAT, "shard name \"%s\" is not a file name in %s", name, dir);
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->names[i], name))
            return VITC_OK;
    char *path = vitc__hub_join(dir, name);
    void *a = realloc(h->st, (size_t)(h->n + 1) * sizeof *h->st);
    if (a)
        h->st = a;
    void *b = a ? realloc(h->names, (size_t)(h->n + 1) * sizeof *h->names) : NULL;
    if (b)
        h->names = b;
    void *c = b ? realloc(h->used, (size_t)(h->n + 1) * sizeof *h->used) : NULL;
    if (c)
        h->used = c;
    if (!path || !c) {
        free(path);
        return vitc__err(VITC_ERR_NOMEM, "out of memory for shard %s", name);
    }
    if (!vitc__hub_exists(path)) {
        vitc_status s = vitc__err(VITC_ERR_IO, "shard %s named by the index is missing", path);
        free(path);
        return s;
    }
    vitc_safetensors *st = NULL;
    /* Lazy: each tensor is read when taken and its pages given back after
     * (vitc__hub_take), so the shards are never all resident at once. */
    vitc_status s = vitc__safetensors_load_flags(path, VITC__ST_KEEP_I64 | VITC__ST_LAZY, &st);
    free(path);
    if (s != VITC_OK)
        return s;
    int cnt = vitc_safetensors_count(st);
    unsigned char *used = calloc((size_t)(cnt > 0 ? cnt : 1), 1);
    char *nm = malloc(strlen(name) + 1);
    if (!used || !nm) {
        free(used);
        free(nm);
        vitc_safetensors_free(st);
        return vitc__err(VITC_ERR_NOMEM, "out of memory for shard %s", name);
    }
    memcpy(nm, name, strlen(name) + 1);
    h->st[h->n] = st;
    h->names[h->n] = nm;
    h->used[h->n] = used;
    h->n++;
    return VITC_OK;
}

/* weights: a .safetensors file, or an index naming shards beside it. */
vitc_status vitc__shards_open(vitc__shards *h, const char *dir, const char *weights) {
    size_t len = strlen(weights);
    if (len >= 5 && !strcmp(weights + len - 5, ".json")) {
        json_t *idx;
        VITC_TRY(vitc__hub_read_json(weights, &idx));
        json_t *map = json_object_get(idx, "weight_map");
        vitc_status s = VITC_OK;
        if (!json_is_object(map))
            s = vitc__err(VITC_ERR_FORMAT, "%s: no \"weight_map\" object", weights);
        const char *k;
        json_t *v;
        if (s == VITC_OK)
            json_object_foreach(map, k, v) {
                if (!json_is_string(v)) {
                    s = vitc__err(VITC_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name",
                                  weights, k);
                    break;
                }
                if ((s = hub_add_shard(h, dir, json_string_value(v))) != VITC_OK)
                    break;
            }
        json_decref(idx);
        return s;
    }
    const char *slash = strrchr(weights, '/');
    return hub_add_shard(h, dir, slash ? slash + 1 : weights);
}

/* The tensor called name in any shard: data (NULL for I64) and shape. */
int vitc__shards_find(const vitc__shards *h, const char *name, const float **data, int *nd,
                    const int64_t **shape) {
    for (int i = 0; i < h->n; i++) {
        int j = vitc_safetensors_find(h->st[i], name);
        if (j < 0)
            continue;
        const char *nm, *dt;
        if (vitc_safetensors_tensor(h->st[i], j, &nm, &dt, nd, shape, data) != VITC_OK)
            return 0;
        h->used[i][j] = 1;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Config                                                             */
/* ------------------------------------------------------------------ */

static vitc_status hub_int(json_t *cfg, const char *key, int def, int *out) {
    json_t *v = json_object_get(cfg, key);
    *out = def;
    if (!v || json_is_null(v))
        return VITC_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > HUB_MAX_DIM)
        return vitc__err(VITC_ERR_FORMAT, "config.json: \"%s\" must be an integer in [1, %d]",
                         key, HUB_MAX_DIM);
    *out = (int)json_integer_value(v);
    return VITC_OK;
}

static vitc_status hub_labels(vitc_vit *m, json_t *id2label, int n) {
    if (!json_is_object(id2label) || (int)json_object_size(id2label) != n)
        return VITC_OK; /* no labels, or not one per class: none kept */
    json_t *arr = json_array(); /* the labels in class order */
    if (!arr)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate %d labels", n);
    for (int i = 0; i < n; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", i);
        json_t *s = json_object_get(id2label, key);
        if (!json_is_string(s) || json_array_append(arr, s) != 0) {
            json_decref(arr);
            return json_is_string(s) ? vitc__err(VITC_ERR_NOMEM, "cannot allocate %d labels", n)
                                     : VITC_OK;
        }
    }
    vitc_status st = vitc__vit_keep_labels(m, arr, "config.json");
    json_decref(arr);
    return st;
}

/* A processor size: an int (square, or the shortest edge where the
 * processor says so), {"height", "width"} or {"shortest_edge"}. */
static vitc_status hub_size(json_t *v, const char *key, int int_square, int *h, int *w,
                            int *shortest) {
    json_t *a = json_object_get(v, "height"), *b = json_object_get(v, "width");
    json_t *se = json_object_get(v, "shortest_edge");
    *shortest = 0;
    if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) <= 16384) {
        if (int_square)
            *h = *w = (int)json_integer_value(v);
        else
            *shortest = (int)json_integer_value(v);
        return VITC_OK;
    }
    if (json_is_integer(a) && json_is_integer(b) && json_integer_value(a) > 0 &&
        json_integer_value(a) <= 16384 && json_integer_value(b) > 0 &&
        json_integer_value(b) <= 16384) {
        *h = (int)json_integer_value(a), *w = (int)json_integer_value(b);
        return VITC_OK;
    }
    if (json_is_integer(se) && !json_object_get(v, "longest_edge") && json_integer_value(se) > 0 &&
        json_integer_value(se) <= 16384) {
        *shortest = (int)json_integer_value(se);
        return VITC_OK;
    }
    return vitc__err(VITC_ERR_UNSUPPORTED, "preprocessor_config.json: \"%s\" must be an integer, "
                     "{\"height\", \"width\"} or {\"shortest_edge\"} (up to 16384)", key);
}

static int hub_bool(json_t *pp, const char *key, int def) {
    json_t *v = json_object_get(pp, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

/* The image processor: preprocessor_config.json over the family's class
 * defaults (ViTImageProcessor, DeiTImageProcessor, BitImageProcessor for
 * DINOv2, CLIPImageProcessor, SiglipImageProcessor, as transformers 5 has
 * them: an integer size is the shortest edge where default_to_square is
 * false, SigLIP's included; any family crops when the file asks); its
 * mean/std also become the config's. */
vitc_status vitc__hub_processor(vitc_vit *m, const char *dir) {
    static const float clip_mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
    static const float clip_std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    const char *f = m->family;
    /* CLIP in any spelling (hf-clip, open-clip, timm-clip) has CLIP's processor */
    int deit = !strcmp(f, "hf-deit"), bit = !strcmp(f, "hf-dinov2") || strstr(f, "clip") != NULL;
    int siglip = !strcmp(f, "hf-siglip");
    int has_crop = deit || bit, int_square = !bit && !siglip;
    vitc__hf_proc *p = &m->proc;
    memset(p, 0, sizeof *p);
    p->present = 1;
    p->convert_rgb = bit || siglip;
    p->do_resize = p->do_rescale = p->do_normalize = 1;
    p->rescale = 1.0 / 255.0;
    p->resample = !strcmp(f, "hf-vit") ? 2 : 3;
    p->size_h = p->size_w = deit ? 256 : 224;
    if (bit)
        p->shortest = 224, p->size_h = p->size_w = 0;
    p->do_crop = has_crop;
    p->crop_h = p->crop_w = 224;
    for (int i = 0; i < 3; i++) {
        p->mean[i] = bit ? clip_mean[i] : 0.5f;
        p->std[i] = bit ? clip_std[i] : 0.5f;
    }
    char *path = vitc__hub_join(dir, "preprocessor_config.json");
    json_t *pp = NULL;
    vitc_status s = VITC_OK;
    if (!path)
        return vitc__err(VITC_ERR_NOMEM, "out of memory");
    if (vitc__hub_exists(path))
        s = vitc__hub_read_json(path, &pp);
    free(path);
    if (s != VITC_OK || !pp)
        goto done;
    p->do_resize = hub_bool(pp, "do_resize", 1);
    p->do_rescale = hub_bool(pp, "do_rescale", 1);
    p->do_normalize = hub_bool(pp, "do_normalize", 1);
    p->do_crop = hub_bool(pp, "do_center_crop", has_crop);
    p->convert_rgb = hub_bool(pp, "do_convert_rgb", p->convert_rgb);
    int_square = hub_bool(pp, "default_to_square", int_square);
    json_t *v;
    if ((v = json_object_get(pp, "size")) && s == VITC_OK)
        s = hub_size(v, "size", int_square, &p->size_h, &p->size_w, &p->shortest);
    if ((v = json_object_get(pp, "crop_size")) && s == VITC_OK) {
        int sh;
        s = hub_size(v, "crop_size", 1, &p->crop_h, &p->crop_w, &sh);
        if (s == VITC_OK && sh)
            s = vitc__err(VITC_ERR_UNSUPPORTED, "preprocessor_config.json: crop_size must be "
                          "square or {\"height\", \"width\"}");
    } else if (p->do_crop && !has_crop && s == VITC_OK) {
        s = vitc__err(VITC_ERR_FORMAT, "preprocessor_config.json: do_center_crop without "
                      "crop_size (transformers refuses it too)");
    }
    if ((v = json_object_get(pp, "resample")) && s == VITC_OK) {
        if (!json_is_integer(v) || (json_integer_value(v) != 2 && json_integer_value(v) != 3))
            s = vitc__err(VITC_ERR_UNSUPPORTED, "preprocessor_config.json: resample must be 2 "
                          "(bilinear) or 3 (bicubic)");
        else
            p->resample = (int)json_integer_value(v);
    }
    if ((v = json_object_get(pp, "rescale_factor")) && s == VITC_OK) {
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
        float *dst = k ? p->std : p->mean;
        /* a number or a one-number list is every channel's, as transformers
         * broadcasts it (a gray model's processor often has [0.5]) */
        size_t n = json_is_array(a) ? json_array_size(a) : 0;
        int ok = json_is_number(a) || n == 1 || n == 3;
        for (size_t i = 0; ok && i < n; i++) ok = json_is_number(json_array_get(a, i));
        if (!ok) {
            s = vitc__err(VITC_ERR_FORMAT, "preprocessor_config.json: %s must be a number or a "
                          "list of 1 or 3 numbers", keys[k]);
            continue;
        }
        for (size_t i = 0; i < 3; i++)
            dst[i] = (float)json_number_value(json_is_number(a) ? a
                                              : json_array_get(a, n == 3 ? i : 0));
    }
    for (int i = 0; i < 3 && s == VITC_OK; i++)
        if (!(p->std[i] > 0.0f) || !isfinite(p->mean[i]) || !isfinite(p->std[i]))
            s = vitc__err(VITC_ERR_FORMAT, "preprocessor_config.json: mean/std[%d] = %g/%g is "
                          "invalid", i, (double)p->mean[i], (double)p->std[i]);
done:
    json_decref(pp);
    for (int i = 0; i < 3; i++) m->cfg.mean[i] = p->mean[i], m->cfg.std[i] = p->std[i];
    return s;
}

/* The Hub name of a model row: "%s" takes the backbone prefix; NULL: the
 * family has no such tensor (zeros: CLIP's patch conv bias and projection
 * bias). DeiT with teacher names its class head cls_classifier. */
static const char *hub_model_name(const char *const *names, int role, int mean2, const char *pre,
                                  char *buf, size_t cap) {
    const char *f = names[role];
    if (mean2 && (role == VIT_P_HEAD_W || role == VIT_P_HEAD_B))
        f = role == VIT_P_HEAD_W ? "cls_classifier.weight" : "cls_classifier.bias";
    if (!f)
        return NULL;
    snprintf(buf, cap, f, pre);
    return buf;
}

/* Copy the Hub tensor name of shape e's into dst, or the error naming it;
 * dst NULL: only check that it is there with that shape (and a float dtype). */
vitc_status vitc__hub_take(const vitc__shards *h, const char *name, const int64_t *want, int wnd,
                           int squeeze, float *dst) {
    const float *data;
    const int64_t *shape;
    int nd;
    char a[96], b[96];
    if (!vitc__shards_find(h, name, &data, &nd, &shape))
        return vitc__err(VITC_ERR_KEY, "missing tensor %s (expected %s)", name,
                         vitc__shape_str(a, sizeof a, wnd, want));
    /* squeeze: CLIP's class_embedding [C] and position_embedding.weight
     * [N, C] fill rows shaped [1, 1, C] and [1, N, C]. */
    int lead = 0;
    while (squeeze && lead < wnd - 1 && want[lead] == 1 && nd < wnd - lead) lead++;
    int same = nd == wnd - lead && data;
    for (int k = 0; same && k < nd; k++) same = shape[k] == want[lead + k];
    if (!same)
        return vitc__err(VITC_ERR_SHAPE, "tensor %s: expected %s, file has %s", name,
                         vitc__shape_str(a, sizeof a, wnd, want),
                         vitc__shape_str(b, sizeof b, nd, shape));
    if (!dst)
        return VITC_OK;
    size_t n = 1;
    for (int k = 0; k < nd; k++) n *= (size_t)shape[k]; /* checked by the table's layout */
    for (int i = 0; i < h->n; i++) { /* the shard holding it reads it; the others: no-ops */
        vitc_status s = vitc__safetensors_read_at(h->st[i], data);
        /* one descriptor at a time, whatever the number of shards */
        if (h->n > 1)
            vitc__safetensors_park(h->st[i]);
        VITC_TRY(s);
    }
    memcpy(dst, data, n * sizeof(float));
    /* Each tensor is read once: its pages go back now, so loading peaks
     * near one copy of the weights, not the file's plus the model's. */
    vitc__vit_release(data, n);
    return VITC_OK;
}

/* One table row from the Hub tensors; q/k/v fused into in_proj rows.
 * check: nothing is written (m->params may not exist yet), the row's
 * tensors are only looked up and their shapes checked. */
static vitc_status hub_fill_row(const vitc_vit *m, const vitc__src *src, const vitc__param *e,
                                int check) {
    const vitc__shards *h = &src->shards;
    const vitc__hub_names *fam = src->names;
    const char *pre = src->pre;
    int mean2 = src->mean2, qkv_bias = src->qkv_bias;
    char name[200];
    float *dst = check ? NULL : m->params + e->offset;
    if (e->layer < 0) {
        if (!hub_model_name(fam->model, e->role, mean2, pre, name, sizeof name)) {
            if (dst) /* a bias the family does not have */
                memset(dst, 0, e->numel * sizeof(float));
            return VITC_OK;
        }
        if (e->role == VIT_P_HEAD_W && fam->proj_t) { /* [C, K] in the file: transposed here */
            int64_t K = e->shape[0], C = e->shape[1], want[2] = {C, K};
            if (!dst)
                return vitc__hub_take(h, name, want, 2, 0, NULL);
            float *t = malloc((size_t)(K * C) * sizeof(float));
            if (!t)
                return vitc__err(VITC_ERR_NOMEM, "cannot transpose %s", name);
            vitc_status s = vitc__hub_take(h, name, want, 2, 0, t);
            for (int64_t i = 0; s == VITC_OK && i < C; i++)
                for (int64_t j = 0; j < K; j++) dst[j * C + i] = t[i * K + j];
            free(t);
            return s;
        }
        return vitc__hub_take(h, name, e->shape, e->ndim,
                              e->role == VIT_P_CLS || e->role == VIT_P_POS, dst);
    }
    int n = snprintf(name, sizeof name, "%s", pre);
    n += snprintf(name + n, sizeof name - (size_t)n, fam->layer_fmt, e->layer);
    if ((e->role != VIT_L_QKV_W && e->role != VIT_L_QKV_B) || !fam->qkv) {
        static const char *const swiglu[4] = {"mlp.weights_in.weight", "mlp.weights_in.bias",
                                              "mlp.weights_out.weight", "mlp.weights_out.bias"};
        int sw = m->swiglu && e->role >= VIT_L_FC1_W && e->role <= VIT_L_FC2_B;
        snprintf(name + n, sizeof name - (size_t)n, "%s",
                 sw ? swiglu[e->role - VIT_L_FC1_W] : fam->layer[e->role]);
        return vitc__hub_take(h, name, e->shape, e->ndim, 0, dst);
    }
    /* One third of in_proj per Hub Linear: rows [q; k; v]. */
    int64_t C = m->cfg.hidden_dim, part[2] = {C, C};
    size_t third = (size_t)(e->role == VIT_L_QKV_W ? C * C : C);
    if (e->role == VIT_L_QKV_B && !qkv_bias) {
        if (dst) /* qkv_bias false: no biases */
            memset(dst, 0, 3 * third * sizeof(float));
        return VITC_OK;
    }
    for (int i = 0; i < 3; i++) {
        snprintf(name + n, sizeof name - (size_t)n, fam->layer[e->role], fam->qkv[i]);
        VITC_TRY(vitc__hub_take(h, name, part, e->role == VIT_L_QKV_W ? 2 : 1, 0,
                                dst ? dst + i * third : NULL));
    }
    return VITC_OK;
}

/* Tensors a vision forward never reads: skipped by name, listed. */
static int hub_ignorable(const char *name, int clip) {
    static const char *const tails[] = {"position_ids", "mask_token"};
    /* CLIPModel's text tower and contrastive scale. */
    if (clip && (!strncmp(name, "text_model.", 11) || !strcmp(name, "text_projection.weight") ||
        !strcmp(name, "logit_scale") || !strcmp(name, "logit_bias")))
        return 1;
    for (size_t i = 0; i < sizeof tails / sizeof *tails; i++) {
        size_t a = strlen(name), b = strlen(tails[i]);
        if (a >= b && !strcmp(name + a - b, tails[i]))
            return 1;
    }
    return !strncmp(name, "pooler.", 7) || strstr(name, ".pooler.") != NULL;
}

/* Every shard tensor not consumed: ignorable ones listed, others an error. */
static vitc_status hub_leftovers(vitc_vit *m, const vitc__shards *h) {
    size_t bytes = 0;
    for (int pass = 0; pass < 2; pass++) {
        char *at = m->ignored;
        for (int i = 0; i < h->n; i++)
            for (int j = 0; j < vitc_safetensors_count(h->st[i]); j++) {
                const char *nm, *dt;
                int nd;
                const int64_t *shape;
                const float *data;
                if (h->used[i][j] ||
                    vitc_safetensors_tensor(h->st[i], j, &nm, &dt, &nd, &shape, &data) != VITC_OK)
                    continue;
                /* open_clip / OpenAI files: everything outside visual. (the
                 * text tower, logit_scale, OpenAI's ints) is not the image tower's */
                int other = !strcmp(m->family, "open-clip") && strncmp(nm, "visual.", 7) != 0;
                if (!other && !hub_ignorable(nm, !strcmp(m->family, "hf-clip") ||
                                                     !strcmp(m->family, "hf-siglip"))) {
                    char b[96];
                    return vitc__err(VITC_ERR_KEY, "unexpected tensor %s %s in %s (not part of a "
                                     "%s model with this config)", nm,
                                     vitc__shape_str(b, sizeof b, nd, shape), h->names[i],
                                     m->family);
                }
                if (pass == 0) {
                    bytes += strlen(nm) + 1;
                    m->n_ignored++;
                } else {
                    memcpy(at, nm, strlen(nm) + 1);
                    at += strlen(nm) + 1;
                }
            }
        if (pass == 0 && !(m->ignored = malloc(bytes ? bytes : 1)))
            return vitc__err(VITC_ERR_NOMEM, "cannot list %d ignored tensors", m->n_ignored);
    }
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Loading                                                            */
/* ------------------------------------------------------------------ */

/* mlp_ratio (DINOv2) as the config's number: mlp = int(D * ratio). */
static vitc_status hub_mlp_ratio(json_t *cfg, int D, int *mlp) {
    json_t *r = json_object_get(cfg, "mlp_ratio");
    double v = r ? json_number_value(r) : 4.0;
    if (!(v > 0.0 && v * D <= HUB_MAX_DIM))
        return vitc__err(VITC_ERR_FORMAT, "config.json: mlp_ratio must be a positive number");
    *mlp = (int)(v * D);
    return *mlp >= 1 ? VITC_OK : vitc__err(VITC_ERR_FORMAT, "config.json: mlp_ratio too small");
}

vitc_status vitc__hub_read(vitc_vit *m, vitc__src *src) {
    const vitc__shards *h = &src->shards;
    size_t bytes;
    /* The file's tensors against the config first (names, shapes, float
     * dtypes), reading no data: a config declaring a model far larger than
     * its weights fails here, before the model's memory is allocated and
     * touched. (Tensors left over are known only once the text tower has
     * taken its own, below.) */
    for (int i = 0; i < m->n_entries; i++)
        VITC_TRY(hub_fill_row(m, src, &m->table[i], 1));
    if (!vitc__mul_size(m->n_params, sizeof(float), &bytes) ||
        !(m->params = vitc__alloc(bytes)))
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate %zu ViT parameters", m->n_params);
    /* Not zeroed up front (that would make every page resident before
     * the file's pages go back, doubling the peak): each row is written
     * below, the padding between the aligned rows here. */
    for (int i = 0; i < m->n_entries; i++) {
        const vitc__param *e = &m->table[i];
        size_t end = i + 1 < m->n_entries ? m->table[i + 1].offset : m->n_params;
        memset(m->params + e->offset + e->numel, 0, (end - e->offset - e->numel) * sizeof(float));
    }
    vitc__params_bind(m->table, m->n_entries, m->params, &m->w, m->blocks, sizeof *m->blocks);
    /* With a precision each Linear weight is packed as soon as its row is
     * filled (its fp32 pages given back): the peak holds the converted
     * model plus about one fp32 matrix. */
    vitc_status s = h->prec >= 0 ? vitc__vit_load_pack_begin(m, (vitc_precision)h->prec) : VITC_OK;
    for (int i = 0; s == VITC_OK && i < m->n_entries; i++) {
        s = hub_fill_row(m, src, &m->table[i], 0);
        if (s == VITC_OK && h->prec >= 0)
            s = vitc__vit_load_pack_row(m, i);
    }
    if (s == VITC_OK) /* CLIPModel's / SiglipModel's / open_clip's text tower (text.c) */
        s = vitc__text_load(m, src);
    if (s == VITC_OK)
        s = hub_leftovers(m, h);
    if (h->prec >= 0)
        s = vitc__vit_load_pack_end(m, s);
    VITC_TRY(s);
    if (!(m->id = vitc__handle_register()))
        return vitc__err(VITC_ERR_NOMEM, "cannot register the model");
    return VITC_OK;
}

const char *vitc__hub_model_type(const vitc__src *src) {
    json_t *jt = src->config ? json_object_get(src->config, "model_type") : NULL;
    return json_is_string(jt) ? json_string_value(jt) : NULL;
}

const vitc__hub_names *vitc__hub_match(const vitc__src *src, const vitc__hub_names *list, int n) {
    const char *type = vitc__hub_model_type(src);
    for (int i = 0; type && src->shards.n && i < n; i++)
        if (!strcmp(type, list[i].type) ||
            (list[i].vision_type && !strcmp(type, list[i].vision_type)))
            return &list[i];
    return NULL;
}

vitc_status vitc__hub_unknown(const vitc__src *src) {
    const char *type = vitc__hub_model_type(src);
    if (!type)
        return vitc__err(VITC_ERR_FORMAT, "config.json has no \"model_type\"");
    if (!strcmp(type, "clip_text_model") || !strcmp(type, "siglip_text_model"))
        return vitc__err(VITC_ERR_UNSUPPORTED, "config.json: model_type \"%s\" is a text tower "
                         "alone; vitc loads CLIPModel / SiglipModel directories with both towers",
                         type);
    static const char *const later[] = {"siglip2"};
    for (size_t i = 0; i < sizeof later / sizeof *later; i++)
        if (!strcmp(type, later[i]))
            return vitc__err(VITC_ERR_UNSUPPORTED, "config.json: model_type \"%s\" is not "
                             "supported (vitc reads vit, deit, dinov2, "
                             "dinov2_with_registers, clip, clip_vision_model, siglip, "
                             "siglip_vision_model)", type);
    return vitc__err(VITC_ERR_UNSUPPORTED, "config.json: unknown model_type \"%.64s\" "
                     "(vitc reads vit, deit, dinov2, dinov2_with_registers, clip, clip_vision_model, "
                     "siglip, siglip_vision_model)", type);
}

vitc_status vitc__hub_configure(vitc_vit *m, vitc__src *src, const vitc__hub_names *fam) {
    json_t *cfg = src->config;
    const char *dir = src->dir;
    vitc__shards *h = &src->shards;
    const char *type = vitc__hub_model_type(src); /* fam->type or its vision_type */
    int dino = fam->kind == HUB_KIND_DINO, clip = fam->kind == HUB_KIND_CLIP;
    int siglip = fam->kind == HUB_KIND_SIGLIP;
    snprintf(m->family, sizeof m->family, "%s", fam->family);
    json_t *ja = json_array_get(json_object_get(cfg, "architectures"), 0);
    const char *arch = json_is_string(ja) ? json_string_value(ja) : "";
    json_t *top = cfg;
    if (fam->vision_type && !strcmp(type, fam->type)) { /* the tower's config is nested */
        cfg = json_object_get(top, "vision_config");
        if (!json_is_object(cfg))
            return vitc__err(VITC_ERR_FORMAT, "config.json: model_type \"%s\" without a "
                             "\"vision_config\" object", type);
    }
    json_t *act = json_object_get(cfg, "hidden_act");
    const char *an = json_is_string(act) ? json_string_value(act) : act ? "(not a string)"
                     : clip ? "quick_gelu" : siglip ? "gelu_pytorch_tanh" : "gelu";
    if (!strcmp(an, "gelu"))
        m->mlp_act = VIT_ACT_GELU;
    else if (!strcmp(an, "quick_gelu"))
        m->mlp_act = VIT_ACT_QUICK_GELU;
    else if (!strcmp(an, "gelu_pytorch_tanh") || !strcmp(an, "gelu_new"))
        m->mlp_act = VIT_ACT_GELU_TANH;
    else
        return vitc__err(VITC_ERR_UNSUPPORTED, "config.json: hidden_act %.40s is not supported "
                         "(vitc reads gelu, quick_gelu, gelu_pytorch_tanh, gelu_new)", an);
    vitc_vit_config *c = &m->cfg;
    memset(c, 0, sizeof *c);
    VITC_TRY(hub_int(cfg, "hidden_size", 768, &c->hidden_dim));
    VITC_TRY(hub_int(cfg, "num_hidden_layers", 12, &c->depth));
    VITC_TRY(hub_int(cfg, "num_attention_heads", 12, &c->num_heads));
    if (dino)
        VITC_TRY(hub_mlp_ratio(cfg, c->hidden_dim, &c->mlp_dim));
    else
        VITC_TRY(hub_int(cfg, "intermediate_size", 3072, &c->mlp_dim));
    if (dino && json_is_true(json_object_get(cfg, "use_swiglu_ffn"))) {
        /* Dinov2SwiGLUFFN: hidden (int(h * 2/3) + 7) // 8 * 8; fc1 makes both halves */
        int hid = (c->mlp_dim * 2 / 3 + 7) / 8 * 8;
        c->mlp_dim = 2 * hid;
        m->swiglu = 1;
    }
    VITC_TRY(hub_int(cfg, "image_size", 224, &c->image_size));
    VITC_TRY(hub_int(cfg, "patch_size", fam->patch, &c->patch_size));
    VITC_TRY(hub_int(cfg, "num_channels", 3, &c->in_channels));
    int reg = fam->registers;
    if (reg) {
        json_t *jr = json_object_get(cfg, "num_register_tokens");
        if (jr && (!json_is_integer(jr) || json_integer_value(jr) < 0 ||
                   json_integer_value(jr) > 1024))
            return vitc__err(VITC_ERR_FORMAT, "config.json: num_register_tokens must be an "
                             "integer in [0, 1024]");
        reg = jr ? (int)json_integer_value(jr) : reg;
    }
    json_t *eps = json_object_get(cfg, "layer_norm_eps");
    c->norm_eps = json_is_number(eps) ? (float)json_number_value(eps) : fam->eps;
    json_t *qb = json_object_get(cfg, "qkv_bias");
    int qkv_bias = !json_is_false(qb);
    if (c->depth > HUB_MAX_DEPTH || c->hidden_dim % c->num_heads ||
        c->image_size % c->patch_size || !(c->norm_eps >= 0.0f && c->norm_eps < 1.0f))
        return vitc__err(VITC_ERR_FORMAT, "config.json: inconsistent config (hidden_size %d, "
                         "num_attention_heads %d, image_size %d, patch_size %d, depth %d, "
                         "layer_norm_eps %g)", c->hidden_dim, c->num_heads, c->image_size,
                         c->patch_size, c->depth, (double)c->norm_eps);
    /* The backbone prefix, as from_pretrained: with it or without it. */
    const char *pre = fam->prefix;
    char name[200];
    const float *d;
    int nd;
    const int64_t *sh;
    if (!vitc__shards_find(h, hub_model_name(fam->model, VIT_P_CONV_W, 0, pre, name, sizeof name), &d, &nd,
                  &sh))
        pre = "";
    /* Head: by the architecture, else by the tensors. */
    int mean2 = strstr(arch, "WithTeacher") != NULL;
    int head = strstr(arch, "ForImageClassification") != NULL;
    if (!*arch && fam->kind == HUB_KIND_VIT) {
        mean2 = vitc__shards_find(h, "cls_classifier.weight", &d, &nd, &sh);
        head = mean2 || vitc__shards_find(h, "classifier.weight", &d, &nd, &sh);
    }
    m->n_dist = fam->dist;
    m->n_reg = reg;
    m->n_cls = !siglip;
    m->n_prefix = m->n_cls + fam->dist + reg;
    m->layer_scale = fam->layer_scale;
    m->pre_norm = m->final_cls_only = clip;
    if (clip) { /* an embedding model; its projection when it has one */
        head = vitc__shards_find(h, "visual_projection.weight", &d, &nd, &sh);
        m->head = head ? VIT_HEAD_PROJ : VIT_HEAD_NONE;
    }
    if (siglip) /* vision_use_head: True when absent */
        m->head = json_is_false(json_object_get(cfg, "vision_use_head")) ? VIT_HEAD_NONE
                                                                        : VIT_HEAD_MAP;
    else if (!clip) /* DINOv2's classifier reads [CLS, mean of the patch tokens] */
        m->head = mean2  ? VIT_HEAD_MEAN2
                  : head ? (dino ? VIT_HEAD_CLS_MEAN : VIT_HEAD_CLS)
                         : VIT_HEAD_NONE;
    m->pos_rule = fam->pos;
    m->naming = VIT_NAMES_TORCHVISION;
    json_t *labels = json_object_get(cfg, "id2label");
    if (m->head == VIT_HEAD_PROJ) {
        if (nd != 2 || sh[0] < 1 || sh[0] > HUB_MAX_DIM)
            return vitc__err(VITC_ERR_SHAPE, "tensor visual_projection.weight: expected "
                             "[projection_dim, %d]", c->hidden_dim);
        c->num_classes = (int)sh[0];
        json_t *pd = json_object_get(top, "projection_dim");
        if (!pd)
            pd = json_object_get(cfg, "projection_dim");
        if (json_is_integer(pd) && json_integer_value(pd) != c->num_classes)
            return vitc__err(VITC_ERR_SHAPE, "config.json: projection_dim %lld but "
                             "visual_projection.weight has %d rows",
                             (long long)json_integer_value(pd), c->num_classes);
    } else if (vitc_vit_has_head(m)) {
        const char *hn = mean2 ? "cls_classifier.weight" : "classifier.weight";
        if (!vitc__shards_find(h, hn, &d, &nd, &sh) || nd != 2 || sh[0] < 1 || sh[0] > HUB_MAX_DIM)
            return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (%s has a head)", hn,
                             arch);
        c->num_classes = (int)sh[0];
        if (json_is_object(labels) && (int)json_object_size(labels) != c->num_classes)
            return vitc__err(VITC_ERR_SHAPE, "config.json has %zu labels (id2label) but %s has "
                             "%d rows", json_object_size(labels), hn, c->num_classes);
        VITC_TRY(hub_labels(m, labels, c->num_classes));
    }
    VITC_TRY(vitc__hub_processor(m, dir));
    src->names = fam;
    src->pre = pre;
    src->mean2 = mean2;
    src->qkv_bias = qkv_bias;
    vitc__name_copy(m->arch, sizeof m->arch, *arch ? arch : type);
    return VITC_OK;
}


vitc_status vitc__hub_timm_config(vitc_vit *m, const vitc__src *src) {
    /* The file alone gets timm's default 0.5 statistics; its config has the
     * model's own (ImageNet's for DeiT and DINOv2) and name. */
    json_t *cfg = src->config;
    vitc_vit_config *c = &m->cfg;
    json_t *pc = json_object_get(cfg, "pretrained_cfg");
    float mean[3], std[3];
    memcpy(mean, c->mean, sizeof mean);
    memcpy(std, c->std, sizeof std);
    vitc__json_floats3(json_object_get(pc, "mean"), mean);
    vitc__json_floats3(json_object_get(pc, "std"), std);
    for (int i = 0; i < 3; i++)
        if (!(std[i] > 0.0f) || !isfinite(mean[i]) || !isfinite(std[i])) {
            char *cp = vitc__hub_join(src->dir, "config.json");
            vitc_status s = vitc__err(VITC_ERR_FORMAT, "%s: pretrained_cfg mean/std[%d] = %g/%g "
                                      "is invalid", cp ? cp : "config.json", i, (double)mean[i],
                                      (double)std[i]);
            free(cp);
            return s;
        }
    memcpy(c->mean, mean, sizeof mean);
    memcpy(c->std, std, sizeof std);
    vitc__name_copy(m->arch, sizeof m->arch,
                    json_string_value(json_object_get(cfg, "architecture")));
    return VITC_OK;
}

int vitc__hub_family_detect(const vitc__family *f, const vitc__src *src) {
    return vitc__ckpt_saved(src, f->saved) ||
           vitc__hub_match(src, f->hub_types, f->n_hub_types) != NULL;
}

vitc_status vitc__hub_family_configure(const vitc__family *f, vitc_vit *m, vitc__src *src) {
    if (vitc__ckpt_saved(src, f->saved))
        return vitc__ckpt_saved_configure(m, src);
    return vitc__hub_configure(m, src, vitc__hub_match(src, f->hub_types, f->n_hub_types));
}
