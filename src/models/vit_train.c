/*
 * vit_train.c — the ViT as a trainable thing: mode, the flat parameter and
 * gradient arrays seen by name, and saving. The backward itself is in
 * vit_backward.c.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../train/train.h"
#include "vit_config.h"
#include "vit_internal.h"

vitc_vit_config vitc_vit_default_config(void) {
    /* torchvision's vit_b_16 with ImageNet normalisation. */
    vitc_vit_config c = {.image_size = 224, .patch_size = 16, .in_channels = 3,
                         .hidden_dim = 768, .depth = 12, .num_heads = 12, .mlp_dim = 3072,
                         .num_classes = 1000, .norm_eps = 1e-6f,
                         .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}};
    return c;
}

void vitc_vit_set_training(vitc_vit *m, int training) {
    if (!m)
        return;
    int was = m->training;
    m->training = training != 0;
    /* Leaving training packs the weights now, so sessions find them ready
     * (a failure is reported again by the next vitc_vit_* forward). */
    if (was && !m->training)
        (void)vitc__vit_prepare_inference(m);
}
int vitc_vit_is_training(const vitc_vit *m) { return m ? m->training : 0; }

vitc_status vitc_vit_set_dropout(vitc_vit *m, float dropout, float attention_dropout,
                                 float drop_path) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_set_dropout: NULL model");
    float v[3] = {dropout, attention_dropout, drop_path};
    const char *nm[3] = {"dropout", "attention_dropout", "drop_path"};
    for (int i = 0; i < 3; i++)
        if (!(v[i] >= 0.0f && v[i] < 1.0f))
            return vitc__err(VITC_ERR_INVALID_ARG, "ViT %s = %g: must be in [0, 1)", nm[i],
                             (double)v[i]);
    m->dropout = dropout;
    m->attention_dropout = attention_dropout;
    m->drop_path = drop_path;
    return VITC_OK;
}

/* The gradient array (zeroed) and the gradient structs, on first use. */
vitc_status vitc__vit_grad_alloc(vitc_vit *m) {
    if (m->grad)
        return VITC_OK;
    size_t depth = (size_t)(m->cfg.depth > 0 ? m->cfg.depth : 1);
    m->grad = vitc__calloc(m->n_params ? m->n_params : 1, sizeof(float));
    m->gblocks = calloc(depth, sizeof *m->gblocks);
    if (!m->grad || !m->gblocks) {
        vitc__free(m->grad);
        free(m->gblocks);
        m->grad = NULL;
        m->gblocks = NULL;
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate %zu ViT gradients", m->n_params);
    }
    vitc__params_bind(m->table, m->n_entries, m->grad, &m->g, m->gblocks, sizeof *m->gblocks);
    return VITC_OK;
}

static void vit_sync(void *m) { vitc__vit_rowmajor(m); }

vitc_status vitc__vit_paramset(vitc_vit *m, int with_grad, vitc__paramset *out) {
    if (!m || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc__vit_paramset: NULL argument");
    if (with_grad)
        VITC_TRY(vitc__vit_grad_alloc(m));
    *out = (vitc__paramset){.param = m->params, .grad = m->grad, .n = m->n_params,
                            .seg = m->table, .nseg = m->n_entries, .owner_id = m->id,
                            .version = &m->wversion, .sync = vit_sync, .owner = m};
    vitc__vit_rowmajor(m);
    m->wversion++; /* the caller may write through .param */
    return VITC_OK;
}

vitc_status vitc_vit_zero_grad(vitc_vit *m) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_zero_grad: NULL model");
    if (m->grad)
        memset(m->grad, 0, m->n_params * sizeof(float));
    return vitc__vit_grad_alloc(m);
}

int vitc_vit_num_params(const vitc_vit *m) { return m ? m->n_entries : 0; }

vitc_status vitc_vit_param(vitc_vit *m, int i, const char **name, int *ndim,
                           const int64_t **shape, float **data, float **grad) {
    if (!m || i < 0 || i >= m->n_entries)
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT parameter index %d out of range [0, %d)", i,
                         m ? m->n_entries : 0);
    const vitc__param *p = &m->table[i];
    if (name) *name = p->name;
    if (ndim) *ndim = p->ndim;
    if (shape) *shape = p->shape;
    if (data) {
        vitc__vit_rowmajor(m);
        *data = m->params + p->offset;
        m->wversion++; /* may be written: packed weights are rebuilt at the next forward */
    }
    if (grad) *grad = m->grad ? m->grad + p->offset : NULL;
    return VITC_OK;
}

int vitc_vit_find_param(const vitc_vit *m, const char *name) {
    for (int i = 0; m && name && i < m->n_entries; i++)
        if (strcmp(m->table[i].name, name) == 0)
            return i;
    return -1;
}

/* vitc.config as file_config.c reads it back; also the metadata of `vitc
 * train`'s checkpoints, so that both spell it one way. */
char *vitc__vit_config_json(const vitc_vit_config *c, const char *const *labels) {
    json_t *o = json_object();
    if (!o)
        return NULL;
    struct { const char *key; int v; } ints[] = {
        {"image_size", c->image_size}, {"patch_size", c->patch_size},
        {"in_channels", c->in_channels}, {"hidden_dim", c->hidden_dim},
        {"depth", c->depth}, {"num_heads", c->num_heads},
        {"mlp_dim", c->mlp_dim}, {"num_classes", c->num_classes},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].v || strcmp(ints[i].key, "num_classes")) /* 0: a backbone, no head rows */
            bad |= json_object_set_new(o, ints[i].key, json_integer(ints[i].v));
    bad |= json_object_set_new(o, "norm_eps", json_real(c->norm_eps));
    json_t *mean = json_array(), *std = json_array();
    for (int i = 0; i < 3; i++) {
        bad |= json_array_append_new(mean, json_real(c->mean[i]));
        bad |= json_array_append_new(std, json_real(c->std[i]));
    }
    bad |= json_object_set_new(o, "mean", mean);
    bad |= json_object_set_new(o, "std", std);
    if (labels) {
        json_t *lab = json_array();
        for (int i = 0; i < c->num_classes; i++)
            bad |= json_array_append_new(lab, json_string(labels[i] ? labels[i] : ""));
        bad |= json_object_set_new(o, "labels", lab);
    }
    char *text = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(o);
    return text;
}

vitc_status vitc_vit_save(const vitc_vit *m, const char *path) {
    if (!m || !path)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_save: NULL argument");
    /* vitc.config describes torchvision's architecture; a Hub family's
     * options (tokens, norms, activation, position rule, processor) go into
     * vitc.family beside it. */
    if (m->t2t)
        return vitc__err(VITC_ERR_UNSUPPORTED, "vitc_vit_save: a %s model cannot be saved as a "
                         "torchvision-named checkpoint; keep its .safetensors", m->family);
    char *fam;
    VITC_TRY(vitc__vit_family_json(m, &fam));
    /* Saving reads the row-major parameters: unpacked from the packed
     * weights when these were released (the model is not otherwise changed). */
    vitc__vit_rowmajor((vitc_vit *)m);
    int n = m->n_entries;
    const char **names = calloc((size_t)n, sizeof *names);
    int *ndims = calloc((size_t)n, sizeof *ndims);
    const int64_t **shapes = calloc((size_t)n, sizeof *shapes);
    const float **data = calloc((size_t)n, sizeof *data);
    char *meta = vitc__vit_config_json(&m->cfg, (const char *const *)m->labels);
    vitc_status s = VITC_OK;
    if (!names || !ndims || !shapes || !data || !meta) {
        s = vitc__err(VITC_ERR_NOMEM, "vitc_vit_save: out of memory");
    } else {
        for (int i = 0; i < n; i++) {
            names[i] = m->table[i].name;
            ndims[i] = m->table[i].ndim;
            shapes[i] = m->table[i].shape;
            data[i] = m->params + m->table[i].offset;
        }
        const char *keys[2] = {"vitc.config", "vitc.family"}, *vals[2] = {meta, fam};
        s = vitc_safetensors_save(path, n, names, ndims, shapes, data, fam ? 2 : 1, keys, vals);
    }
    free(fam);
    free(names);
    free(ndims);
    free(shapes);
    free(data);
    free(meta);
    return s;
}
