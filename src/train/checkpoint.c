/*
 * checkpoint.c — the training checkpoint: one safetensors file that is a
 * model for every vitc command (tensors under the model's names, vitc.config
 * metadata) and also the state a run resumes from: the optimizer's arrays as
 * "vitc.optim.<state name>" tensors (flat, in the parameter layout) and the
 * caller's run record as "vitc.train" metadata, to which the optimizer's step
 * count is added as "optimizer_step" (a string: int64 is beyond a JSON
 * double). A model saved without an optimizer keeps that record under
 * "vitc.trained_by" instead, so that it is never mistaken for something to
 * resume.
 *
 * This is the format `vitc train` has always written; its files still load.
 * vitc_safetensors_save replaces the file atomically (temporary, fsync,
 * rename): a crash mid-save leaves the previous checkpoint whole.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../models/vit_config.h"
#include "optim.h"

/* The file keeps optimizer state in one layout whatever the model's in
 * memory: tensors in state_dict order, each at a multiple of 16 floats (the
 * layout of a model vitc_vit_create or a checkpoint load builds, so earlier
 * files read unchanged). A model loaded another way (vitc_vit_load packing
 * weights as it reads) places its tensors elsewhere; its state is moved
 * tensor by tensor. *total: the layout's length; off [nseg] (may be NULL)
 * each tensor's place. 1 when ps already has this layout. */
static int file_layout(const vitc__paramset *ps, size_t *off, size_t *total) {
    size_t o = 0;
    int same = 1;
    for (int i = 0; i < ps->nseg; i++) {
        if (off)
            off[i] = o;
        same &= ps->seg[i].offset == o;
        o += (ps->seg[i].numel + 15) & ~(size_t)15;
    }
    *total = o;
    return same && ps->n == o;
}

/* meta_json ("{}" when NULL) with optimizer_step added when opt is given:
 * malloc'ed compact JSON, NULL (error set) when it is not a JSON object. */
static char *run_record(const char *meta_json, const vitc_optimizer *opt, vitc_status *s) {
    json_error_t jerr;
    json_t *o = json_loads(meta_json ? meta_json : "{}", 0, &jerr);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        *s = vitc__err(VITC_ERR_INVALID_ARG,
                  "checkpoint: meta_json must be a JSON object (%s); pass NULL for none",
                  o ? "got another JSON value" : jerr.text);
        return NULL;
    }
    if (opt) {
        char step[32];
        snprintf(step, sizeof step, "%lld", (long long)vitc_optimizer_get_step(opt));
        json_object_set_new(o, "optimizer_step", json_string(step));
    }
    char *t = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!t)
        *s = vitc__err(VITC_ERR_NOMEM, "checkpoint: out of memory");
    return t;
}

/* The model's own file for a family vitc.config cannot describe (a Hub
 * model): written by vitc_vit_save beside path, read back, removed. Its
 * tensors and metadata then go into the checkpoint unchanged, so the
 * checkpoint loads as that model does. */
static vitc_status model_file(const char *path, vitc_vit *m, vitc_safetensors **st) {
    size_t cap = strlen(path) + 48;
    char *tmp = malloc(cap);
    if (!tmp)
        return vitc__err(VITC_ERR_NOMEM, "checkpoint: out of memory");
    snprintf(tmp, cap, "%s.model%ld.tmp", path, (long)getpid());
    vitc_status s = vitc_vit_save(m, tmp);
    if (s == VITC_OK)
        s = vitc_safetensors_load(tmp, st);
    unlink(tmp);
    free(tmp);
    return s;
}

vitc_status vitc_checkpoint_save(const char *path, vitc_vit *m, vitc_optimizer *opt,
                                 const char *const *labels, const char *meta_json) {
    if (!path || !m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_checkpoint_save: path and model must not be NULL");
    int np = vitc_vit_num_params(m), ns = opt ? vitc_optimizer_num_states(opt) : 0;
    if (opt && vitc_optimizer_num_params(opt) == 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_checkpoint_save: the optimizer has no parameters");
    /* A run killed while writing (SIGKILL, the OOM killer) left its
     * temporary beside path; the next save of path removes it. */
    vitc__remove_stale_temps(path);
    vitc_safetensors *own = NULL;
    if (vitc_vit_has_processor(m)) {
        VITC_TRY(model_file(path, m, &own));
        np = vitc_safetensors_count(own);
    }
    int nmeta_own = own ? vitc_safetensors_metadata_count(own) : 0;
    int n = np + ns, nmeta = (own ? nmeta_own : 1) + 1;
    const char **names = calloc((size_t)(n ? n : 1), sizeof *names);
    char **onames = calloc((size_t)(ns ? ns : 1), sizeof *onames);
    int *ndims = calloc((size_t)(n ? n : 1), sizeof *ndims);
    const int64_t **shapes = calloc((size_t)(n ? n : 1), sizeof *shapes);
    const float **data = calloc((size_t)(n ? n : 1), sizeof *data);
    const char **keys = calloc((size_t)nmeta, sizeof *keys);
    const char **vals = calloc((size_t)nmeta, sizeof *vals);
    const vitc__paramset *ps = opt ? vitc__optimizer_paramset(opt) : NULL;
    size_t total = 0, *off = NULL;
    float *moved[3] = {NULL, NULL, NULL};
    int same = ps ? file_layout(ps, NULL, &total) : 1;
    int64_t flat = (int64_t)total;
    vitc_status s = VITC_OK;
    char *cfg = NULL, *rec = run_record(meta_json, opt, &s);
    const char **lab = NULL;
    if (!rec)
        goto done;
    if (!names || !onames || !ndims || !shapes || !data || !keys || !vals) {
        s = vitc__err(VITC_ERR_NOMEM, "checkpoint: out of memory");
        goto done;
    }
    if (own) {
        for (int i = 0; i < np && s == VITC_OK; i++) {
            const char *dt;
            s = vitc_safetensors_tensor(own, i, &names[i], &dt, &ndims[i], &shapes[i], &data[i]);
        }
        for (int i = 0; i < nmeta_own && s == VITC_OK; i++)
            s = vitc_safetensors_metadata(own, i, &keys[i], &vals[i]);
    } else {
        const vitc_vit_config *c = vitc_vit_get_config(m);
        /* the model's own labels unless the caller names them (a new
         * model trained on a folder has none of its own) */
        if (!labels && c->num_classes > 0 && vitc_vit_label(m, 0)) {
            if (!(lab = calloc((size_t)c->num_classes, sizeof *lab))) {
                s = vitc__err(VITC_ERR_NOMEM, "checkpoint: out of memory");
                goto done;
            }
            for (int i = 0; i < c->num_classes; i++) lab[i] = vitc_vit_label(m, i);
            labels = lab;
        }
        if (!(cfg = vitc__vit_config_json(c, labels))) {
            s = vitc__err(VITC_ERR_NOMEM, "checkpoint: out of memory");
            goto done;
        }
        for (int i = 0; i < np && s == VITC_OK; i++) {
            float *d, *g;
            s = vitc_vit_param(m, i, &names[i], &ndims[i], &shapes[i], &d, &g);
            data[i] = d;
        }
        keys[0] = "vitc.config", vals[0] = cfg;
    }
    if (opt && ps->nseg != vitc_vit_num_params(m)) {
        s = vitc__err(VITC_ERR_INVALID_ARG, "vitc_checkpoint_save: the optimizer is not over this "
                      "model (%d tensors, the model %d)", ps->nseg, vitc_vit_num_params(m));
        goto done;
    }
    if (!same && !(off = malloc((size_t)ps->nseg * sizeof *off))) {
        s = vitc__err(VITC_ERR_NOMEM, "checkpoint: out of memory");
        goto done;
    }
    if (!same)
        file_layout(ps, off, &total);
    for (int i = 0; i < ns && i < 3 && s == VITC_OK; i++) {
        const char *sn;
        float *d;
        if ((s = vitc_optimizer_state(opt, i, &sn, &d)) != VITC_OK)
            break;
        if (!same) {
            if (!(moved[i] = calloc(total ? total : 1, sizeof(float)))) {
                s = vitc__err(VITC_ERR_NOMEM, "checkpoint: out of memory");
                break;
            }
            for (int k = 0; k < ps->nseg; k++)
                memcpy(moved[i] + off[k], d + ps->seg[k].offset, ps->seg[k].numel * sizeof(float));
            d = moved[i];
        }
        size_t len = strlen(sn) + 16;
        if (!(onames[i] = malloc(len))) {
            s = vitc__err(VITC_ERR_NOMEM, "checkpoint: out of memory");
            break;
        }
        snprintf(onames[i], len, "vitc.optim.%s", sn);
        names[np + i] = onames[i];
        ndims[np + i] = 1;
        shapes[np + i] = &flat;
        data[np + i] = d;
    }
    if (s != VITC_OK)
        goto done;
    keys[nmeta - 1] = opt ? "vitc.train" : "vitc.trained_by";
    vals[nmeta - 1] = rec;
    s = vitc_safetensors_save(path, n, names, ndims, shapes, data, nmeta, keys, vals);
done:
    if (onames)
        for (int i = 0; i < ns; i++) free(onames[i]);
    free(onames), free(names), free(ndims), free(shapes), free(data), free(keys), free(vals);
    free(cfg), free(rec), free(lab), free(off);
    for (int i = 0; i < 3; i++) free(moved[i]);
    vitc_safetensors_free(own);
    return s;
}

vitc_status vitc_checkpoint_load(const char *path, vitc_vit **m, char **meta_json) {
    if (m)
        *m = NULL;
    if (meta_json)
        *meta_json = NULL;
    if (!path || !m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_checkpoint_load: path and m must not be NULL");
    vitc_safetensors *st;
    VITC_TRY(vitc_safetensors_load(path, &st));
    const char *meta = vitc_safetensors_get_metadata(st, "vitc.train");
    vitc_status s = VITC_OK;
    if (!meta)
        s = vitc__err(VITC_ERR_FORMAT,
                      "%s: a model without training state (no vitc.train metadata); load it "
                      "with vitc_vit_load and start a new run from its weights", path);
    else if (meta_json && !(*meta_json = strdup(meta)))
        s = vitc__err(VITC_ERR_NOMEM, "checkpoint: out of memory");
    if (s == VITC_OK)
        s = vitc_vit_from_safetensors(st, NULL, m);
    if (s != VITC_OK && meta_json) {
        free(*meta_json);
        *meta_json = NULL;
    }
    vitc_safetensors_free(st);
    return s;
}

/* An optimizer state read from a file: every value finite, and a second
 * moment (a state named *_sq: AdamW's exp_avg_sq) never negative, whose
 * square root the step takes. A damaged or edited file is refused here
 * rather than turning the first step's update into NaN. */
static vitc_status check_state(const char *path, const char *key, const float *v, size_t n) {
    size_t len = strlen(key);
    int sq = len > 3 && !strcmp(key + len - 3, "_sq");
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]) || (sq && v[i] < 0))
            return vitc__err(VITC_ERR_FORMAT, "%s: %s[%zu] is %g; %s (a damaged or edited "
                             "checkpoint)", path, key, i, (double)v[i],
                             sq ? "a second moment is finite and >= 0" : "the state is finite");
    return VITC_OK;
}

vitc_status vitc_checkpoint_load_optimizer(const char *path, vitc_optimizer *opt) {
    if (!path || !opt)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_checkpoint_load_optimizer: path and optimizer must not be NULL");
    vitc_safetensors *st;
    VITC_TRY(vitc_safetensors_load(path, &st));
    vitc_status s = VITC_OK;
    int ns = vitc_optimizer_num_states(opt);
    const vitc__paramset *ps = vitc__optimizer_paramset(opt);
    size_t flat;
    int same = file_layout(ps, NULL, &flat);
    size_t *off = malloc((size_t)(ps->nseg ? ps->nseg : 1) * sizeof *off);
    if (!off) {
        vitc_safetensors_free(st);
        return vitc__err(VITC_ERR_NOMEM, "checkpoint: out of memory");
    }
    file_layout(ps, off, &flat);
    /* Everything is checked before anything is written: a refused file
     * leaves the optimizer as it was. */
    const float *src[3] = {NULL, NULL, NULL};
    float *dst[3] = {NULL, NULL, NULL};
    for (int i = 0; i < ns && i < 3 && s == VITC_OK; i++) {
        const char *sn, *nm, *dt;
        int nd;
        const int64_t *shape;
        char key[128];
        if ((s = vitc_optimizer_state(opt, i, &sn, &dst[i])) != VITC_OK)
            break;
        snprintf(key, sizeof key, "vitc.optim.%s", sn);
        int j = vitc_safetensors_find(st, key);
        if (j < 0) {
            s = vitc__err(VITC_ERR_FORMAT, "%s: no tensor %s (a checkpoint of another optimizer, "
                          "or a model alone?)", path, key);
            break;
        }
        if ((s = vitc_safetensors_tensor(st, j, &nm, &dt, &nd, &shape, &src[i])) != VITC_OK)
            break;
        if (nd != 1 || shape[0] != (int64_t)flat) {
            s = vitc__err(VITC_ERR_SHAPE, "%s: %s has %lld values, the optimizer %zu (a "
                          "checkpoint of another model?)", path, key,
                          nd == 1 ? (long long)shape[0] : -1LL, flat);
            break;
        }
        s = check_state(path, key, src[i], flat);
    }
    long long step = -1;
    if (s == VITC_OK) {
        const char *meta = vitc_safetensors_get_metadata(st, "vitc.train");
        json_t *o = meta ? json_loads(meta, 0, NULL) : NULL;
        json_t *v = o ? json_object_get(o, "optimizer_step") : NULL;
        const char *t = v && json_is_string(v) ? json_string_value(v) : "";
        char *end = NULL;
        errno = 0;
        step = *t >= '0' && *t <= '9' ? strtoll(t, &end, 10) : -1;
        if (errno || (end && *end))
            step = -1;
        json_decref(o);
        if (step < 0)
            s = vitc__err(VITC_ERR_FORMAT, "%s: no optimizer_step (a string of decimal digits) in "
                          "its vitc.train metadata", path);
    }
    for (int i = 0; i < ns && i < 3 && s == VITC_OK; i++) {
        if (same)
            memcpy(dst[i], src[i], flat * sizeof *dst[i]);
        else
            for (int k = 0; k < ps->nseg; k++)
                memcpy(dst[i] + ps->seg[k].offset, src[i] + off[k], ps->seg[k].numel * sizeof(float));
    }
    free(off);
    if (s == VITC_OK)
        s = vitc_optimizer_set_step(opt, step);
    vitc_safetensors_free(st);
    return s;
}

void vitc_checkpoint_free_meta(char *meta_json) { free(meta_json); }
