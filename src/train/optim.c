/*
 * optim.c — AdamW and SGD over a flat parameter set (train.h), torch.optim's
 * update rules exactly, and clip_grad_norm_. Optimizer state lives in arrays
 * of the parameters' layout (llm.c: params, grads, m, v side by side), so a
 * checkpoint saves them tensor by tensor at the parameters' offsets.
 *
 * Each element is updated in double from its float state and written back
 * as float: the float32 rounding then happens once per stored value, as in
 * torch's float32 optimizer, and never inside the bias-corrected formula.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "optim.h"

/* The update runs over the pool in chunks: [begin, end) of tensor seg. */
typedef struct optim_chunk {
    int seg;
    size_t begin, end;
} optim_chunk;
enum { OPTIM_CHUNK = 1 << 15 }; /* floats: large enough to amortise a task, small enough to balance */

struct vitc_optimizer {
    vitc_optim_config cfg;
    vitc__paramset ps;
    optim_chunk *chunks; /* [nchunks] over the non-buffer tensors */
    int64_t nchunks;
    float *state[3]; /* [n] each: exp_avg, exp_avg_sq, max_exp_avg_sq / momentum_buffer */
    int nstate;
    int buf_started; /* SGD: the momentum buffer holds a value (torch: not None) */
    int64_t step;
    /* [ps.nseg] lr multipliers (layer-wise decay); NULL: 1 for all, and the
     * update multiplies by nothing, so its numbers stay torch's exactly. */
    double *lr_scale;
};

vitc_optim_config vitc_optim_default_config(vitc_optim_kind kind) {
    vitc_optim_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.lr = 1e-3;
    c.beta1 = 0.9;
    c.beta2 = 0.999;
    c.eps = 1e-8;
    c.weight_decay = kind == VITC_OPTIM_ADAMW ? 1e-2 : 0.0;
    return c;
}

static vitc_status check_config(const vitc_optim_config *c) {
    if (c->kind != VITC_OPTIM_SGD && c->kind != VITC_OPTIM_ADAMW)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer: unknown kind %d", (int)c->kind);
    /* torch's own checks, with its wording. */
    if (!(c->lr >= 0.0))
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer: invalid learning rate: %g", c->lr);
    if (!(c->weight_decay >= 0.0))
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer: invalid weight_decay value: %g",
                         c->weight_decay);
    if (c->kind == VITC_OPTIM_ADAMW) {
        if (!(c->eps >= 0.0))
            return vitc__err(VITC_ERR_INVALID_ARG, "AdamW: invalid epsilon value: %g", c->eps);
        if (!(c->beta1 >= 0.0 && c->beta1 < 1.0))
            return vitc__err(VITC_ERR_INVALID_ARG, "AdamW: invalid beta parameter at index 0: %g",
                             c->beta1);
        if (!(c->beta2 >= 0.0 && c->beta2 < 1.0))
            return vitc__err(VITC_ERR_INVALID_ARG, "AdamW: invalid beta parameter at index 1: %g",
                             c->beta2);
    } else {
        if (!(c->momentum >= 0.0))
            return vitc__err(VITC_ERR_INVALID_ARG, "SGD: invalid momentum value: %g",
                             c->momentum);
        if (!(c->dampening >= 0.0 && c->dampening <= 1.0))
            return vitc__err(VITC_ERR_INVALID_ARG, "SGD: invalid dampening value: %g (expected [0, 1])",
                             c->dampening);
        if (c->nesterov && (c->momentum <= 0.0 || c->dampening != 0.0))
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "SGD: nesterov momentum requires a momentum and zero dampening");
    }
    return VITC_OK;
}

static int states_of(const vitc_optim_config *c) {
    if (c->kind == VITC_OPTIM_ADAMW)
        return c->amsgrad ? 3 : 2;
    return c->momentum != 0.0 ? 1 : 0;
}

vitc_status vitc__optimizer_create(const vitc__paramset *ps, const vitc_optim_config *cfg,
                                   vitc_optimizer **out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer: out is NULL");
    *out = NULL;
    if (!ps || !cfg)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer: parameters and config must not be NULL");
    VITC_TRY(check_config(cfg));
    if (!ps->param || !ps->grad || (ps->nseg > 0 && !ps->seg) || ps->nseg < 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer: the parameter set has no parameters or gradients");
    for (int i = 0; i < ps->nseg; i++) {
        size_t end;
        if (!vitc__add_size(ps->seg[i].offset, ps->seg[i].numel, &end) || end > ps->n)
            return vitc__err(VITC_ERR_INVALID_ARG, "optimizer: tensor \"%s\" lies outside the %zu parameters",
                             ps->seg[i].name ? ps->seg[i].name : "?", ps->n);
    }
    if (!vitc__handle_alive(ps->owner_id))
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer: the model has been freed");
    vitc_optimizer *o = calloc(1, sizeof *o);
    if (!o)
        return vitc__err(VITC_ERR_NOMEM, "optimizer: out of memory");
    o->cfg = *cfg;
    o->ps = *ps;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        int64_t k = 0;
        for (int i = 0; i < ps->nseg; i++)
            for (size_t b = 0; !ps->seg[i].buffer && b < ps->seg[i].numel; b += OPTIM_CHUNK, k++)
                if (pass)
                    o->chunks[k] = (optim_chunk){i, b, ps->seg[i].numel - b < OPTIM_CHUNK
                                                          ? ps->seg[i].numel
                                                          : b + OPTIM_CHUNK};
        if (!pass) {
            o->nchunks = k;
            o->chunks = malloc((size_t)(k ? k : 1) * sizeof *o->chunks);
            if (!o->chunks) {
                vitc_optimizer_free(o);
                return vitc__err(VITC_ERR_NOMEM, "optimizer: out of memory");
            }
        }
    }
    /* SGD always gets its buffer: a schedule may raise momentum from 0. */
    o->nstate = o->cfg.kind == VITC_OPTIM_ADAMW ? states_of(cfg) : 1;
    for (int i = 0; i < o->nstate; i++) {
        o->state[i] = vitc__calloc(ps->n ? ps->n : 1, sizeof(float));
        if (!o->state[i]) {
            vitc_optimizer_free(o);
            return vitc__err(VITC_ERR_NOMEM, "optimizer: out of memory for %zu state floats", ps->n);
        }
    }
    *out = o;
    return VITC_OK;
}

void vitc_optimizer_free(vitc_optimizer *o) {
    if (!o)
        return;
    for (int i = 0; i < 3; i++)
        vitc__free(o->state[i]);
    free(o->chunks);
    free(o->lr_scale);
    free(o);
}

/* Every call that touches the model's arrays checks the model is alive. */
static vitc_status live(const vitc_optimizer *o, const char *what) {
    if (!o)
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: optimizer is NULL", what);
    if (!vitc__handle_alive(o->ps.owner_id))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "%s: the optimizer's model has been freed (free the optimizer first)", what);
    return VITC_OK;
}

static double seg_lr(const vitc_optimizer *o, const vitc__pseg *s) {
    return o->lr_scale ? o->cfg.lr * o->lr_scale[s - o->ps.seg] : o->cfg.lr;
}

static double seg_decay(const vitc_optimizer *o, const vitc__pseg *s) {
    return (o->cfg.decay_all || !s->no_decay) ? (double)o->cfg.weight_decay : 0.0;
}

/* What every chunk of one step shares. */
typedef struct optim_task {
    vitc_optimizer *o;
    double bc1, bc2_sqrt; /* AdamW's bias corrections 1 - b1^t and sqrt(1 - b2^t) */
    int first;            /* SGD: the momentum buffer starts this step */
} optim_task;

void vitc__adamw_ref(float *p, float *m, float *v, float *vmax, const float *g, size_t n,
                     const vitc__adamw_coef *c) {
    const double shrink = c->shrink, step_size = c->step_size, b1 = c->b1, b2 = c->b2;
    const double eps = c->eps, bc2_sqrt = c->bc2_sqrt;
    for (size_t i = 0; i < n; i++) {
        const double gi = g[i];
        const double pi = (double)p[i] * shrink;
        const float mi = (float)(b1 * m[i] + (1.0 - b1) * gi);
        const float vi = (float)(b2 * v[i] + (1.0 - b2) * gi * gi);
        m[i] = mi, v[i] = vi;
        float vd = vi;
        if (vmax) {
            vd = vmax[i] > vi ? vmax[i] : vi;
            vmax[i] = vd;
        }
        const double denom = sqrt((double)vd) / bc2_sqrt + eps;
        p[i] = (float)(pi - step_size * (double)mi / denom);
    }
}

static void adamw_range(const optim_task *t, const vitc__pseg *s, size_t i0, size_t i1) {
    vitc_optimizer *o = t->o;
    const vitc_optim_config *c = &o->cfg;
    const double lr = seg_lr(o, s);
    const vitc__adamw_coef k = {.shrink = 1.0 - lr * seg_decay(o, s),
                                .step_size = lr / t->bc1, .b1 = c->beta1, .b2 = c->beta2,
                                .eps = c->eps, .bc2_sqrt = t->bc2_sqrt};
    size_t off = s->offset + i0;
    vitc__kern()->adamw(o->ps.param + off, o->state[0] + off, o->state[1] + off,
                        c->amsgrad ? o->state[2] + off : NULL, o->ps.grad + off, i1 - i0, &k);
}

static void sgd_range(const optim_task *t, const vitc__pseg *s, size_t i0, size_t i1) {
    vitc_optimizer *o = t->o;
    const int first = t->first;
    const vitc_optim_config *c = &o->cfg;
    const double lr = seg_lr(o, s), wd = seg_decay(o, s), mom = c->momentum, damp = c->dampening;
    float *p = o->ps.param + s->offset, *buf = o->state[0] + s->offset;
    const float *g = o->ps.grad + s->offset;
    for (size_t i = i0; i < i1; i++) {
        double d = (double)g[i] + wd * (double)p[i];
        if (mom != 0.0) {
            const float b = first ? (float)d : (float)(mom * buf[i] + (1.0 - damp) * d);
            buf[i] = b;
            d = c->nesterov ? d + mom * (double)b : (double)b;
        }
        p[i] = (float)((double)p[i] - lr * d);
    }
}

static void optim_chunk_task(void *ctx, int64_t k, int tid) {
    const optim_task *t = ctx;
    const optim_chunk *ch = &t->o->chunks[k];
    const vitc__pseg *s = &t->o->ps.seg[ch->seg];
    (void)tid;
    /* scale 0 freezes the tensor: neither it nor its moments move (torch's
     * requires_grad=False), and a linear probe's step costs only the head */
    if (t->o->lr_scale && t->o->lr_scale[ch->seg] == 0.0)
        return;
    if (t->o->cfg.kind == VITC_OPTIM_ADAMW)
        adamw_range(t, s, ch->begin, ch->end);
    else
        sgd_range(t, s, ch->begin, ch->end);
}

vitc_status vitc_optimizer_step(vitc_optimizer *o) {
    VITC_TRY(live(o, "optimizer step"));
    if (o->step == INT64_MAX)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer step: the step counter overflowed");
    const int64_t t = o->step + 1;
    if (o->ps.sync)
        o->ps.sync(o->ps.owner);
    optim_task task = {o, 1.0, 1.0, !o->buf_started};
    if (o->cfg.kind == VITC_OPTIM_ADAMW) {
        task.bc1 = 1.0 - pow(o->cfg.beta1, (double)t);
        task.bc2_sqrt = sqrt(1.0 - pow(o->cfg.beta2, (double)t));
    }
    /* Every element is updated by exactly one task, the same arithmetic
     * whatever the thread count: results do not depend on it. */
    vitc__parallel_for(o->nchunks, optim_chunk_task, &task);
    if (o->cfg.kind == VITC_OPTIM_SGD && o->cfg.momentum != 0.0)
        o->buf_started = 1;
    o->step = t;
    if (o->ps.version)
        ++*o->ps.version;
    return VITC_OK;
}

vitc_status vitc_optimizer_zero_grad(vitc_optimizer *o) {
    VITC_TRY(live(o, "optimizer zero_grad"));
    memset(o->ps.grad, 0, o->ps.n * sizeof(float));
    return VITC_OK;
}

vitc_status vitc_optimizer_set_lr(vitc_optimizer *o, double lr) {
    if (!o)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer set_lr: optimizer is NULL");
    if (!(lr >= 0.0))
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer set_lr: invalid learning rate: %g", lr);
    o->cfg.lr = lr;
    return VITC_OK;
}

double vitc_optimizer_get_lr(const vitc_optimizer *o) { return o ? o->cfg.lr : NAN; }

vitc_status vitc_optimizer_set_momentum(vitc_optimizer *o, double momentum) {
    if (!o)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer set_momentum: optimizer is NULL");
    if (o->cfg.kind == VITC_OPTIM_ADAMW) {
        if (!(momentum >= 0.0 && momentum < 1.0))
            return vitc__err(VITC_ERR_INVALID_ARG, "AdamW set_momentum: beta1 %g is not in [0, 1)",
                             momentum);
        o->cfg.beta1 = momentum;
    } else {
        if (!(momentum >= 0.0))
            return vitc__err(VITC_ERR_INVALID_ARG, "SGD set_momentum: invalid momentum value: %g",
                             momentum);
        o->cfg.momentum = momentum;
    }
    return VITC_OK;
}

double vitc_optimizer_get_momentum(const vitc_optimizer *o) {
    if (!o)
        return NAN;
    return o->cfg.kind == VITC_OPTIM_ADAMW ? o->cfg.beta1 : o->cfg.momentum;
}

const vitc_optim_config *vitc_optimizer_get_config(const vitc_optimizer *o) {
    return o ? &o->cfg : NULL;
}

size_t vitc_optimizer_num_params(const vitc_optimizer *o) { return o ? o->ps.n : 0; }

/* SGD reports its buffer only when momentum is on (torch keeps none
 * without momentum); it always has it, so a schedule can raise momentum. */
int vitc_optimizer_num_states(const vitc_optimizer *o) { return o ? states_of(&o->cfg) : 0; }

vitc_status vitc_optimizer_state(vitc_optimizer *o, int i, const char **name, float **data) {
    VITC_TRY(live(o, "optimizer state"));
    static const char *const adam[3] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    const int n = states_of(&o->cfg);
    if (i < 0 || i >= n)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer state: index %d is not in [0, %d)", i, n);
    if (name)
        *name = o->cfg.kind == VITC_OPTIM_ADAMW ? adam[i] : "momentum_buffer";
    if (data)
        *data = o->state[i];
    return VITC_OK;
}

int64_t vitc_optimizer_get_step(const vitc_optimizer *o) { return o ? o->step : -1; }

vitc_status vitc_optimizer_set_step(vitc_optimizer *o, int64_t step) {
    if (!o)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer set_step: optimizer is NULL");
    if (step < 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer set_step: step %lld is negative",
                         (long long)step);
    o->step = step;
    o->buf_started = step > 0;
    return VITC_OK;
}

vitc_status vitc__clip_grad_norm(const vitc__paramset *ps, float max_norm, float *total_norm) {
    if (!(max_norm >= 0.0)) /* torch accepts 0 (zeroes the gradients) */
        return vitc__err(VITC_ERR_INVALID_ARG, "clip_grad_norm: max_norm %g is negative or NaN",
                         (double)max_norm);
    if (!ps->grad) {
        /* No gradient yet: torch returns a norm of 0 and changes nothing. */
        if (total_norm)
            *total_norm = 0.0;
        return VITC_OK;
    }
    /* Over the tensors only: the alignment gaps between them and buffers
     * (BatchNorm running statistics) have no gradient in torch. */
    double ss = 0.0;
    for (int k = 0; k < ps->nseg; k++) {
        const vitc__pseg *s = &ps->seg[k];
        for (size_t i = 0; !s->buffer && i < s->numel; i++)
            ss += (double)ps->grad[s->offset + i] * (double)ps->grad[s->offset + i];
    }
    const float total = (float)sqrt(ss);
    /* torch: clip_coef = max_norm / (total + 1e-6), clamped to 1 and
     * applied unconditionally (a NaN norm makes NaN gradients, as there). */
    double coef = (double)max_norm / ((double)total + 1e-6);
    if (coef > 1.0)
        coef = 1.0;
    for (int k = 0; coef != 1.0 && k < ps->nseg; k++) {
        const vitc__pseg *s = &ps->seg[k];
        for (size_t i = 0; !s->buffer && i < s->numel; i++)
            ps->grad[s->offset + i] = (float)((double)ps->grad[s->offset + i] * coef);
    }
    if (total_norm)
        *total_norm = total;
    return VITC_OK;
}

vitc_status vitc_clip_grad_norm_optimizer(vitc_optimizer *o, float max_norm, float *total_norm) {
    VITC_TRY(live(o, "clip_grad_norm"));
    return vitc__clip_grad_norm(&o->ps, max_norm, total_norm);
}

static vitc_status ensure_scales(vitc_optimizer *o, const char *what) {
    if (o->lr_scale)
        return VITC_OK;
    o->lr_scale = malloc((size_t)(o->ps.nseg ? o->ps.nseg : 1) * sizeof *o->lr_scale);
    if (!o->lr_scale)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory", what);
    for (int i = 0; i < o->ps.nseg; i++) o->lr_scale[i] = 1.0;
    return VITC_OK;
}

vitc_status vitc_optimizer_set_lr_scale(vitc_optimizer *o, int i, double scale) {
    if (!o)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer set_lr_scale: optimizer is NULL");
    if (i < 0 || i >= o->ps.nseg)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "optimizer set_lr_scale: tensor %d is not in [0, %d)", i, o->ps.nseg);
    if (!(scale >= 0.0) || isinf(scale))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "optimizer set_lr_scale: scale %g must be finite and >= 0", scale);
    VITC_TRY(ensure_scales(o, "optimizer set_lr_scale"));
    o->lr_scale[i] = scale;
    return VITC_OK;
}

double vitc_optimizer_get_lr_scale(const vitc_optimizer *o, int i) {
    if (!o || i < 0 || i >= o->ps.nseg)
        return NAN;
    return o->lr_scale ? o->lr_scale[i] : 1.0;
}

/* BEiT's layer ids over the table: tensors before the first block row are
 * the embeddings (id 0), a block row of layer l has id l + 1, what follows
 * the last block row (final norm, head) id L + 1; scale = F^(L + 1 - id).
 * State-dict order puts them so for every family vitc loads. */
vitc_status vitc_optimizer_set_layer_decay(vitc_optimizer *o, double decay) {
    if (!o)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer set_layer_decay: optimizer is NULL");
    if (!(decay > 0.0 && decay <= 1.0))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "optimizer set_layer_decay: decay %g is not in (0, 1] (0.65-0.9 is usual; "
                         "1 turns it off)", decay);
    VITC_TRY(ensure_scales(o, "optimizer set_layer_decay"));
    int L = 0, first = -1;
    for (int i = 0; i < o->ps.nseg; i++)
        if (o->ps.seg[i].layer >= 0) {
            if (o->ps.seg[i].layer + 1 > L)
                L = o->ps.seg[i].layer + 1;
            if (first < 0)
                first = i;
        }
    for (int i = 0; i < o->ps.nseg; i++) {
        const int layer = o->ps.seg[i].layer;
        int id = layer >= 0 ? layer + 1 : (first >= 0 && i < first ? 0 : L + 1);
        o->lr_scale[i] = pow(decay, (double)(L + 1 - id));
    }
    return VITC_OK;
}

const vitc__paramset *vitc__optimizer_paramset(const vitc_optimizer *o) { return o ? &o->ps : NULL; }
