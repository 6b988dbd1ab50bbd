/*
 * layer.c — the layer object every kind shares: its parameter table (one
 * allocation described by rows of {torch name, shape}, which drives create,
 * load, reset and state_dict), loading, and the gradients (one array of the
 * store's layout, its roles bound like the weights'). What differs by kind
 * (the table's rows, shapes, forward, backward) comes from the kind's
 * vitc__layer_ops (kinds.c); this file calls none of it.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../train/train.h"
#include "layers.h"

/* ---- parameter table ------------------------------------------------ */

void vitc__layer_add_param(vitc_layer *l, const char *name, const char *alias, size_t slot,
                           vitc__init init, int64_t fan_in, int64_t fan_out, int ndim, int64_t d0,
                           int64_t d1, int64_t d2, int64_t d3) {
    vitc__param *p = &l->params[l->nparams++];
    p->name = name;
    p->alias = alias;
    p->slot = slot;
    p->layer = -1;
    p->role = l->nparams - 1;
    p->no_decay = ndim <= 1;
    p->init = init;
    p->fan_in = fan_in;
    p->fan_out = fan_out;
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->shape[2] = d2;
    p->shape[3] = d3;
}


vitc_status vitc__layer_bad_config(const vitc_layer *l, const char *what) {
    return vitc__err(VITC_ERR_INVALID_ARG, "%s: %s", l->ops->name, what);
}

vitc_status vitc__layer_shape_err(const vitc_layer *l, int ndim, const int64_t *shape,
                                  const char *expected) {
    char a[160];
    return vitc__err(VITC_ERR_SHAPE, "%s: input has shape %s, expected %s", l->ops->name,
                     vitc__shape_str(a, sizeof a, ndim > 8 ? 8 : ndim, shape), expected);
}

/* ---- create / free / reset ------------------------------------------ */

vitc_status vitc_layer_reset_parameters(vitc_layer *l, uint64_t seed) {
    if (!l)
        return vitc__err(VITC_ERR_INVALID_ARG, "layer is NULL");
    vitc__params_init(l->params, l->nparams, l->store, seed);
    /* dropout's own stream of the same seed, apart from the initialisation's */
    l->rng.s = seed ^ 0xD1B54A32D192ED03ull;
    return VITC_OK;
}

vitc_status vitc__layer_alloc(const vitc_layer_config *cfg, const vitc__layer_ops *ops,
                              vitc_layer **out) {
    *out = NULL;
    vitc_layer *l = calloc(1, sizeof *l);
    if (!l)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate a layer");
    l->cfg = *cfg;
    l->ops = ops;
    l->training = 1;
    const vitc_layer_config *c = cfg;
    char msg[160];
    const int64_t big = (int64_t)1 << 24; /* no real layer is wider; keeps size math far from overflow */
    if (c->in_channels < 0 || c->in_channels > big || c->embed_dim < 0 || c->embed_dim > big ||
        c->num_heads < 1 || c->num_heads > big || c->kdim < 0 || c->kdim > big || c->vdim < 0 ||
        c->vdim > big || c->patch_size < 0 || c->patch_size > 4096) {
        snprintf(msg, sizeof msg,
                 "sizes out of range (in_channels %d, embed_dim %d, num_heads %d, kdim %d, "
                 "vdim %d, patch_size %d)",
                 c->in_channels, c->embed_dim, c->num_heads, c->kdim, c->vdim, c->patch_size);
        vitc_status s = vitc__layer_bad_config(l, msg);
        free(l);
        return s;
    }
    if (!(c->eps >= 0.0f) || !(c->momentum >= 0.0f && c->momentum <= 1.0f) || !isfinite(c->qk_scale)) {
        vitc_status s = vitc__layer_bad_config(l, "eps must be >= 0, momentum in [0, 1], qk_scale finite");
        free(l);
        return s;
    }
    *out = l;
    return VITC_OK;
}

vitc_status vitc__layer_finish(vitc_layer *l) {
    size_t total = 0;
    if (vitc__params_layout(l->params, l->nparams, &total) != VITC_OK) {
        vitc__err_prefix(VITC_ERR_NOMEM, "%s", l->ops->name);
        return VITC_ERR_NOMEM;
    }
    l->store_len = total;
    l->store = vitc__calloc(total ? total : 1, sizeof(float));
    l->id = vitc__handle_register();
    if (!l->store || !l->id)
        return vitc__err(VITC_ERR_NOMEM, "%s: cannot allocate %zu parameters", l->ops->name, total);
    vitc__params_bind(l->params, l->nparams, l->store, &l->w, NULL, 0);
    for (int i = 0; i < l->nparams; i++)
        if (!l->params[i].buffer)
            l->train[l->ntrain++] = l->params[i];
    vitc_layer_reset_parameters(l, 0);
    return VITC_OK;
}

void vitc_layer_free(vitc_layer *l) {
    if (!l)
        return;
    vitc__handle_unregister(l->id);
    vitc__free(l->store);
    vitc__free(l->grad);
    vitc__buf_free(&l->scratch);
    vitc__buf_free(&l->bscratch);
    vitc__buf_free(&l->xscratch);
    free(l);
}

const vitc_layer_config *vitc_layer_get_config(const vitc_layer *l) { return l ? &l->cfg : NULL; }
int vitc_layer_num_params(const vitc_layer *l) { return l ? l->nparams : 0; }

vitc_status vitc_layer_param(vitc_layer *l, int i, const char **name, int *ndim,
                             const int64_t **shape, float **data) {
    if (!l || i < 0 || i >= l->nparams)
        return vitc__err(VITC_ERR_INVALID_ARG, "parameter index %d out of range [0, %d)", i,
                         l ? l->nparams : 0);
    const vitc__param *p = &l->params[i];
    if (name) *name = p->name;
    if (ndim) *ndim = p->ndim;
    if (shape) *shape = p->shape;
    if (data) *data = l->store + p->offset;
    return VITC_OK;
}

void vitc_layer_set_training(vitc_layer *l, int training) {
    if (l) l->training = training != 0;
}
int vitc_layer_is_training(const vitc_layer *l) { return l ? l->training : 0; }

vitc_status vitc__layer_paramset(vitc_layer *l, int with_grad, vitc__paramset *out) {
    if (!l || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc__layer_paramset: NULL argument");
    if (with_grad)
        VITC_TRY(vitc__layer_ensure_grad(l));
    *out = (vitc__paramset){.param = l->store, .grad = l->grad, .n = l->store_len,
                            .seg = l->train, .nseg = l->ntrain, .owner_id = l->id};
    return VITC_OK;
}

/* ---- load_state_dict ------------------------------------------------ */


static int ignorable(const char *name) {
    size_t n = strlen(name), m = strlen("num_batches_tracked");
    return n >= m && strcmp(name + n - m, "num_batches_tracked") == 0;
}

vitc_status vitc_layer_load(vitc_layer *l, int n, const char *const *names, const int *ndims,
                            const int64_t *const *shapes, const float *const *data, int strict) {
    if (!l || n < 0 || (n > 0 && (!names || !ndims || !shapes || !data)))
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_load: NULL layer or arrays");
    const char *kn = l->ops->name;
    int src[VITC__MAX_PARAMS];
    char a[96], b[96];
    /* Check everything first, so a failed load leaves the weights untouched. */
    for (int i = 0; i < l->nparams; i++) {
        const vitc__param *p = &l->params[i];
        src[i] = -1;
        for (int j = 0; j < n && src[i] < 0; j++) {
            if (!names[j])
                return vitc__err(VITC_ERR_INVALID_ARG, "%s: tensor name %d is NULL", kn, j);
            if (strcmp(names[j], p->name) == 0 || (p->alias && strcmp(names[j], p->alias) == 0))
                src[i] = j;
        }
        if (src[i] < 0)
            return vitc__err(VITC_ERR_KEY, "%s: missing key \"%s\" (expected shape %s)", kn,
                             p->name, vitc__param_shape_str(p, a, sizeof a));
        int j = src[i];
        int same = ndims[j] == p->ndim && (p->ndim == 0 || shapes[j]);
        for (int d = 0; same && d < p->ndim; d++) same = shapes[j][d] == p->shape[d];
        if (!same || !data[j]) {
            if (ndims[j] < 0 || ndims[j] > 8 || (ndims[j] > 0 && !shapes[j]))
                return vitc__err(VITC_ERR_SHAPE, "%s: key \"%s\" has a bad shape (ndim %d)", kn,
                                 names[j], ndims[j]);
            if (!data[j])
                return vitc__err(VITC_ERR_INVALID_ARG, "%s: key \"%s\" has no data", kn, names[j]);
            return vitc__err(VITC_ERR_SHAPE, "%s: key \"%s\" has shape %s, expected %s", kn,
                             names[j], vitc__shape_str(a, sizeof a, ndims[j], shapes[j]),
                             vitc__param_shape_str(p, b, sizeof b));
        }
    }
    for (int j = 0; j < n && strict; j++) {
        int used = ignorable(names[j]);
        for (int i = 0; i < l->nparams && !used; i++) used = src[i] == j;
        if (!used) {
            /* A second spelling of a loaded tensor ("query.weight" beside "q.weight") says so. */
            for (int i = 0; i < l->nparams; i++) {
                const vitc__param *p = &l->params[i];
                if (strcmp(names[j], p->name) == 0 || (p->alias && strcmp(names[j], p->alias) == 0))
                    return vitc__err(VITC_ERR_KEY, "%s: key \"%s\" duplicates \"%s\"", kn, names[j],
                                     names[src[i]]);
            }
            int nd = ndims[j] >= 0 && ndims[j] <= 8 && shapes[j] ? ndims[j] : 0;
            return vitc__err(VITC_ERR_KEY, "%s: unexpected key \"%s\" (shape %s)", kn, names[j],
                             vitc__shape_str(a, sizeof a, nd, shapes[j]));
        }
    }
    for (int i = 0; i < l->nparams; i++)
        memcpy(l->store + l->params[i].offset, data[src[i]], l->params[i].numel * sizeof(float));
    return VITC_OK;
}

vitc_status vitc_layer_load_safetensors(vitc_layer *l, const vitc_safetensors *st,
                                        const char *prefix, int strict) {
    if (!l || !st)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_load_safetensors: NULL argument");
    int total = vitc_safetensors_count(st), n = 0;
    size_t plen = prefix ? strlen(prefix) : 0;
    const char **names = calloc((size_t)total + 1, sizeof *names);
    int *ndims = calloc((size_t)total + 1, sizeof *ndims);
    const int64_t **shapes = calloc((size_t)total + 1, sizeof *shapes);
    const float **data = calloc((size_t)total + 1, sizeof *data);
    vitc_status s = VITC_OK;
    if (!names || !ndims || !shapes || !data) {
        s = vitc__err(VITC_ERR_NOMEM, "cannot allocate the tensor list");
        goto done;
    }
    for (int i = 0; i < total; i++) {
        const char *name, *dtype;
        s = vitc_safetensors_tensor(st, i, &name, &dtype, &ndims[n], &shapes[n], &data[n]);
        if (s != VITC_OK)
            goto done;
        /* Only the prefix's tensors belong to this layer; the rest of a file is not unexpected. */
        if (plen && strncmp(name, prefix, plen) != 0)
            continue;
        names[n++] = name + plen;
    }
    s = vitc_layer_load(l, n, names, ndims, shapes, data, strict);
done:
    free(names);
    free(ndims);
    free(shapes);
    free(data);
    return s;
}

/* ---- gradients ------------------------------------------------------- */

vitc_status vitc__layer_ensure_grad(vitc_layer *l) {
    if (l->grad)
        return VITC_OK;
    l->grad = vitc__calloc(l->store_len ? l->store_len : 1, sizeof(float));
    if (!l->grad)
        return vitc__err(VITC_ERR_NOMEM, "%s: cannot allocate %zu gradients", l->ops->name,
                         l->store_len);
    vitc__params_bind(l->params, l->nparams, l->grad, &l->g, NULL, 0);
    return VITC_OK;
}

vitc_status vitc_layer_zero_grad(vitc_layer *l) {
    if (!l)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_zero_grad: layer is NULL");
    if (l->grad)
        memset(l->grad, 0, l->store_len * sizeof(float));
    return VITC_OK;
}

vitc_status vitc_layer_grad(vitc_layer *l, const char *name, int *ndim, const int64_t **shape,
                            float **grad) {
    if (!l || !name)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_grad: NULL argument");
    for (int i = 0; i < l->nparams; i++) {
        const vitc__param *p = &l->params[i];
        if (strcmp(name, p->name) != 0 && !(p->alias && strcmp(name, p->alias) == 0))
            continue;
        if (p->buffer)
            return vitc__err(VITC_ERR_KEY, "\"%s\" is a buffer, not a parameter: it has no gradient",
                             name);
        VITC_TRY(vitc__layer_ensure_grad(l));
        if (ndim) *ndim = p->ndim;
        if (shape) *shape = p->shape;
        if (grad) *grad = l->grad + p->offset;
        return VITC_OK;
    }
    return vitc__err(VITC_ERR_KEY, "no parameter \"%s\"", name);
}
