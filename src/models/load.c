/*
 * load.c — the one loader router: vitc_vit_load, vitc_vit_load_precision,
 * vitc_vit_from_safetensors (and vitc_vit_create). The source is opened
 * once (a .safetensors file; a Hub directory's config.json and shards);
 * each family's detect is asked in a fixed order, strongest evidence first
 * (a Hub config.json's model_type, then a file's names); the first that
 * claims it configures the model, the core builds the table from the
 * family's rows, the weights are read (packed for a precision while read),
 * and a model comes back. Adding a family: one line in vit_families.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "../train/train.h"
#include "family.h"

static const vitc__family *const vit_families[] = {
    &vitc__family_hf_vit, &vitc__family_dinov2, &vitc__family_clip, &vitc__family_siglip,
    &vitc__family_t2t,    &vitc__family_timm,   &vitc__family_torchvision,
};
#define VIT_N_FAMILIES ((int)(sizeof vit_families / sizeof vit_families[0]))

vitc_status vitc_vit_create(const vitc_vit_config *cfg, uint64_t seed, vitc_vit **out) {
    if (!cfg || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_create: NULL argument");
    *out = NULL;
    VITC_TRY(vitc__vit_check_config(cfg, 0));
    vitc_vit *m = vitc__vit_alloc();
    if (!m)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate a ViT");
    m->cfg = *cfg;
    m->fam = &vitc__family_torchvision;
    m->naming = VIT_NAMES_TORCHVISION;
    vitc_status s = vitc__vit_table_build(m);
    if (s == VITC_OK && !(m->params = vitc__calloc(m->n_params, sizeof(float))))
        s = vitc__err(VITC_ERR_NOMEM, "cannot allocate %zu ViT parameters", m->n_params);
    if (s == VITC_OK)
        s = vitc__vit_bind(m);
    if (s != VITC_OK) {
        vitc_vit_free(m);
        return s;
    }
    vitc__params_init(m->table, m->n_entries, m->params, seed);
    /* Dropout masks continue from a stream of their own, decorrelated from init. */
    m->rng.s = seed ^ 0xD1B54A32D192ED03ull;
    vitc__ckpt_name_arch(m, 0);
    snprintf(m->family, sizeof m->family, "torchvision");
    *out = m;
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* The source                                                         */
/* ------------------------------------------------------------------ */

static void src_free(vitc__src *src) {
    vitc_safetensors_free(src->own);
    vitc__shards_free(&src->shards);
    json_decref(src->config);
    json_decref(src->aux);
    free(src->dir);
    memset(src, 0, sizeof *src);
}

/* path's directory, malloc'd ("." for a bare name). */
static char *src_dirname(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 1;
    char *d = malloc(dlen + 1);
    if (d) {
        memcpy(d, slash ? path : ".", dlen);
        d[dlen] = '\0';
    }
    return d;
}

/* A safetensors file vitc wrote (vitc.config or vitc.family metadata):
 * it says what it is, whatever lies beside it. The header only. */
static int src_is_vitc_file(const char *path) {
    vitc_safetensors *st = NULL;
    if (vitc__safetensors_load_flags(path, VITC__ST_LAZY, &st) != VITC_OK)
        return 0;
    int own = vitc_safetensors_get_metadata(st, "vitc.config") != NULL ||
              vitc_safetensors_get_metadata(st, "vitc.family") != NULL;
    vitc_safetensors_free(st);
    return own;
}

/* A Hub model at path: a directory, an index .json, or a file with a
 * config.json holding "model_type" beside it, unless the file is vitc's
 * own checkpoint (a file named explicitly is read as that file). */
static int src_is_hub(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return 0;
    size_t len = strlen(path);
    if (S_ISDIR(sb.st_mode) || (len >= 5 && !strcmp(path + len - 5, ".json")))
        return 1;
    char *d = src_dirname(path), *cfg = d ? vitc__hub_join(d, "config.json") : NULL;
    json_t *root = NULL;
    int hub = 0;
    if (cfg && stat(cfg, &sb) == 0 && vitc__hub_read_json(cfg, &root) == VITC_OK)
        hub = json_is_string(json_object_get(root, "model_type"));
    json_decref(root);
    free(cfg);
    free(d);
    return hub && !src_is_vitc_file(path);
}

/* A single .safetensors: read lazily, tensor by tensor, with a precision. */
static vitc_status src_open_file(vitc__src *src, const char *path) {
    src->weights = path;
    VITC_TRY(vitc__safetensors_load_flags(path, src->prec >= 0 ? VITC__ST_LAZY : 0, &src->own));
    src->st = src->own;
    src->adopt = 1;
    return VITC_OK;
}

/* A Hub directory (dir; weights: the file or index the caller named, or
 * NULL for dir's own): config.json and its weights, open_clip's layout, or
 * timm's (config.json naming the architecture, its model.safetensors a
 * lone file in timm's names). *wpath: a path made here, freed by the caller. */
static vitc_status src_open_hub(vitc__src *src, const char *weights, char **wpath) {
    const char *dir = src->dir;
    char *cfg_path = vitc__hub_join(dir, "config.json");
    vitc_status s = VITC_OK;
    if (!cfg_path)
        return vitc__err(VITC_ERR_NOMEM, "out of memory");
    if (!vitc__hub_exists(cfg_path)) {
        free(cfg_path);
        /* An open_clip Hub directory: open_clip_config.json and its weights. */
        char *oc = vitc__hub_join(dir, "open_clip_config.json");
        *wpath = weights ? NULL : vitc__hub_join(dir, "open_clip_model.safetensors");
        int openclip = oc && vitc__hub_exists(oc) && (weights || (*wpath && vitc__hub_exists(*wpath)));
        free(oc);
        if (!openclip)
            return vitc__err(VITC_ERR_IO, "%s: no config.json (a Hub model directory holds "
                             "config.json and model.safetensors; open_clip's, "
                             "open_clip_config.json and open_clip_model.safetensors)", dir);
        src->open_clip_dir = 1;
        src->weights = weights ? weights : *wpath;
        return vitc__shards_open(&src->shards, dir, src->weights);
    }
    s = vitc__hub_read_json(cfg_path, &src->config);
    free(cfg_path);
    VITC_TRY(s);
    if (!json_object_get(src->config, "model_type") &&
        json_is_string(json_object_get(src->config, "architecture"))) {
        /* timm's Hub layout: its model.safetensors as a lone file */
        src->timm_hub = 1;
        src->arch = NULL;
        *wpath = weights ? NULL : vitc__hub_join(dir, "model.safetensors");
        if (!weights && !*wpath)
            return vitc__err(VITC_ERR_NOMEM, "out of memory");
        return src_open_file(src, weights ? weights : *wpath);
    }
    if (!weights) {
        *wpath = vitc__hub_join(dir, "model.safetensors");
        if (*wpath && !vitc__hub_exists(*wpath)) {
            free(*wpath);
            *wpath = vitc__hub_join(dir, "model.safetensors.index.json");
            if (*wpath && !vitc__hub_exists(*wpath))
                return vitc__err(VITC_ERR_IO, "%s: no model.safetensors or "
                                 "model.safetensors.index.json (pytorch_model.bin is not read: "
                                 "convert it to safetensors)", dir);
        }
        if (!*wpath)
            return vitc__err(VITC_ERR_NOMEM, "out of memory");
        weights = *wpath;
    }
    src->weights = weights;
    return vitc__shards_open(&src->shards, dir, weights);
}

/* ------------------------------------------------------------------ */
/* Routing                                                            */
/* ------------------------------------------------------------------ */

/* The error when no family claims src. */
static vitc_status vit_no_family(const vitc__src *src) {
    const char *type = src->config && !src->timm_hub ? vitc__hub_model_type(src) : NULL;
    if (type && !strcmp(type, "sam")) /* not a classifier: its own loader */
        return vitc__err(VITC_ERR_UNSUPPORTED, "%s is a Segment Anything model: load it with "
                         "vitc_sam_load (Python vitc.Sam, CLI vitc segment)",
                         src->dir ? src->dir : "config.json");
    if (src->config && !src->timm_hub)
        return vitc__hub_unknown(src);
    return vitc__err(VITC_ERR_KEY, "not a Vision Transformer checkpoint: no class_token or "
                     "cls_token (torchvision or timm names)");
}

/* The first family that claims src: its configure, the table, the weights. */
static vitc_status vit_load_main(vitc__src *src, vitc_vit *m) {
    const vitc__family *fam = NULL;
    for (int i = 0; i < VIT_N_FAMILIES && !fam; i++)
        if (vit_families[i]->detect ? vit_families[i]->detect(src)
                                    : vitc__hub_family_detect(vit_families[i], src))
            fam = vit_families[i];
    if (!fam)
        return vit_no_family(src);
    m->fam = fam;
    VITC_TRY(fam->configure ? fam->configure(m, src) : vitc__hub_family_configure(fam, m, src));
    VITC_TRY(vitc__vit_table_build(m));
    return src->shards.n ? vitc__hub_read(m, src) : vitc__vit_read_file(m, src);
}

vitc_status vitc_vit_from_safetensors(const vitc_safetensors *st, const char *arch,
                                      vitc_vit **out) {
    if (!st || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_from_safetensors: NULL argument");
    *out = NULL;
    vitc_vit *m = vitc__vit_alloc();
    if (!m)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate a ViT");
    vitc__src src = {.arch = arch, .prec = -1, .st = st};
    src.shards.prec = -1;
    vitc_status s = vit_load_main(&src, m);
    src_free(&src);
    if (s == VITC_OK)
        s = vitc_vit_prepare(m);
    if (s != VITC_OK) {
        vitc_vit_free(m);
        return s;
    }
    *out = m;
    return VITC_OK;
}

static vitc_status vit_load_prec(const char *path, const char *arch, int prec, vitc_vit **out) {
    if (!path || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_load: NULL argument");
    *out = NULL;
    vitc__src src = {.path = path, .arch = arch, .prec = prec};
    src.shards.prec = prec;
    char *wpath = NULL;
    vitc_vit *m = NULL;
    vitc_status s = VITC_OK;
    /* What an error is prefixed with: the Hub directory, else the weights. */
    const char *label = path;
    if (src_is_hub(path)) {
        struct stat sb;
        int is_dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
        src.dir = is_dir ? malloc(strlen(path) + 1) : src_dirname(path);
        if (!src.dir) {
            s = vitc__err(VITC_ERR_NOMEM, "out of memory");
        } else {
            if (is_dir)
                memcpy(src.dir, path, strlen(path) + 1);
            s = src_open_hub(&src, is_dir ? NULL : path, &wpath);
            label = src.open_clip_dir || src.timm_hub ? src.weights : src.dir;
        }
    } else if (!(src.dir = src_dirname(path))) {
        s = vitc__err(VITC_ERR_NOMEM, "out of memory");
    } else {
        s = src_open_file(&src, path);
    }
    if (s == VITC_OK && !(m = vitc__vit_alloc()))
        s = vitc__err(VITC_ERR_NOMEM, "cannot allocate a ViT");
    if (s == VITC_OK)
        s = vit_load_main(&src, m);
    if (s != VITC_OK) {
        if (m && src.adopt)
            m->params = NULL; /* the file's arena, freed with it */
        vitc_vit_free(m);
        m = NULL;
        if (label && !strstr(vitc_last_error(), label))
            vitc__err_prefix(s, "%s", label);
    }
    if (s == VITC_OK && src.timm_hub)
        s = vitc__hub_timm_config(m, &src);
    if (s == VITC_OK && src.adopt) { /* the model keeps the file its weights live in */
        m->weights_file = src.own;
        src.own = NULL;
    }
    if (s != VITC_OK && m) {
        if (src.adopt)
            m->params = NULL;
        vitc_vit_free(m);
        m = NULL;
    }
    src_free(&src);
    free(wpath);
    /* Packed for its precision now, so sessions only read it (and a first
     * forward costs no packing). */
    if (s == VITC_OK && (s = vitc_vit_prepare(m)) != VITC_OK) {
        vitc_vit_free(m);
        m = NULL;
    }
    *out = m;
    return s;
}

vitc_status vitc_vit_load(const char *path, const char *arch, vitc_vit **out) {
    return vit_load_prec(path, arch, -1, out);
}

vitc_status vitc_vit_load_precision(const char *path, const char *arch, vitc_precision precision,
                                    vitc_vit **out) {
    if (out)
        *out = NULL;
    if (!vitc_precision_name(precision))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_vit_load_precision: unknown precision %d (expected fp32, bf16 or "
                         "int8)", (int)precision);
    return vit_load_prec(path, arch, (int)precision, out);
}
