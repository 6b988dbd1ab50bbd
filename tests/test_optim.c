/* test_optim.c — the optimizer core (src/train/optim.c) on hand-built
 * parameter sets against a float64 transcription of torch.optim's update
 * rules (the PyTorch parity tests are in tests/python/test_train_optim.py),
 * gradient clipping against a float64 norm, cross-entropy against float64,
 * and the errors: a freed model, bad configs, bad labels. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "rng.h"
#include "train/optim.h"
#include "testutil.h"

enum { N = 37, STEPS = 10 };

/* Three tensors: a weight (decays), a bias (no_decay), an odd-sized one. */
static const vitc__pseg segs[3] = {
    {.name = "w", .offset = 0, .numel = 20, .ndim = 2, .shape = {4, 5}},
    {.name = "b", .offset = 20, .numel = 4, .ndim = 1, .shape = {4}, .no_decay = 1},
    {.name = "z", .offset = 24, .numel = 13, .ndim = 1, .shape = {13}},
};

typedef struct fixture {
    float param[N], grad[N];
    vitc__paramset ps;
} fixture;

static void make(fixture *f, uint64_t seed) {
    vitc__rng r = {seed};
    for (int i = 0; i < N; i++)
        f->param[i] = (float)(2.0 * vitc__rng_uniform(&r) - 1.0);
    memset(f->grad, 0, sizeof f->grad);
    f->ps = (vitc__paramset){f->param, f->grad, N, segs, 3, vitc__handle_register(), NULL, NULL, NULL};
}

static int decays(int i, int decay_all) { return decay_all || !(i >= 20 && i < 24); }

/* torch.optim.AdamW / SGD in float64, one tensor element at a time. */
typedef struct ref {
    double p[N], m[N], v[N], vmax[N], buf[N];
    int started;
} ref;

static void ref_adamw(ref *R, const float *g, const vitc_optim_config *c, int t) {
    double bc1 = 1.0 - pow(c->beta1, t), bc2 = 1.0 - pow(c->beta2, t);
    for (int i = 0; i < N; i++) {
        double wd = decays(i, c->decay_all) ? c->weight_decay : 0.0;
        R->p[i] *= 1.0 - c->lr * wd;
        R->m[i] = c->beta1 * R->m[i] + (1.0 - c->beta1) * g[i];
        R->v[i] = c->beta2 * R->v[i] + (1.0 - c->beta2) * (double)g[i] * g[i];
        R->vmax[i] = fmax(R->vmax[i], R->v[i]);
        double denom = sqrt(c->amsgrad ? R->vmax[i] : R->v[i]) / sqrt(bc2) + c->eps;
        R->p[i] -= c->lr / bc1 * R->m[i] / denom;
    }
}

static void ref_sgd(ref *R, const float *g, const vitc_optim_config *c) {
    for (int i = 0; i < N; i++) {
        double wd = decays(i, c->decay_all) ? c->weight_decay : 0.0;
        double d = g[i] + wd * R->p[i];
        if (c->momentum != 0.0) {
            R->buf[i] = R->started ? c->momentum * R->buf[i] + (1.0 - c->dampening) * d : d;
            d = c->nesterov ? d + c->momentum * R->buf[i] : R->buf[i];
        }
        R->p[i] -= c->lr * d;
    }
    if (c->momentum != 0.0)
        R->started = 1;
}

static void run_against_ref(const vitc_optim_config *c) {
    fixture f;
    make(&f, 1);
    ref R;
    memset(&R, 0, sizeof R);
    for (int i = 0; i < N; i++)
        R.p[i] = f.param[i];
    vitc_optimizer *o;
    assert_int_equal(vitc__optimizer_create(&f.ps, c, &o), VITC_OK);
    vitc__rng r = {2};
    for (int t = 1; t <= STEPS; t++) {
        assert_int_equal(vitc_optimizer_zero_grad(o), VITC_OK);
        for (int i = 0; i < N; i++) {
            assert_true(f.grad[i] == 0.0f);
            f.grad[i] = (float)(vitc__rng_uniform(&r) - 0.5) * (t % 3 == 0 ? 1e-3f : 1.0f);
        }
        assert_int_equal(vitc_optimizer_step(o), VITC_OK);
        if (c->kind == VITC_OPTIM_ADAMW)
            ref_adamw(&R, f.grad, c, t);
        else
            ref_sgd(&R, f.grad, c);
        for (int i = 0; i < N; i++)
            if (!(fabs(f.param[i] - R.p[i]) <= 1e-6 * fmax(1.0, fabs(R.p[i]))))
                fail_msg("kind %d step %d param %d: %.9g vs float64 %.9g", (int)c->kind, t, i,
                         (double)f.param[i], R.p[i]);
    }
    assert_int_equal(vitc_optimizer_get_step(o), STEPS);
    vitc_optimizer_free(o);
    vitc__handle_unregister(f.ps.owner_id);
}

static void test_adamw(void **st) {
    (void)st;
    vitc_optim_config c = vitc_optim_default_config(VITC_OPTIM_ADAMW);
    c.lr = 0.05;
    c.weight_decay = 0.1;
    for (int decay_all = 0; decay_all < 2; decay_all++)
        for (int ams = 0; ams < 2; ams++) {
            c.decay_all = decay_all, c.amsgrad = ams;
            run_against_ref(&c);
        }
    c.beta1 = 0.5, c.beta2 = 0.9, c.eps = 1e-3, c.amsgrad = 0;
    run_against_ref(&c);
}

static void test_sgd(void **st) {
    (void)st;
    vitc_optim_config c = vitc_optim_default_config(VITC_OPTIM_SGD);
    c.lr = 0.1;
    run_against_ref(&c);
    c.momentum = 0.9;
    run_against_ref(&c);
    c.dampening = 0.3, c.weight_decay = 0.01;
    run_against_ref(&c);
    c.dampening = 0.0, c.nesterov = 1, c.decay_all = 1;
    run_against_ref(&c);
}

static void test_state_and_momentum(void **st) {
    (void)st;
    fixture f;
    make(&f, 3);
    vitc_optim_config c = vitc_optim_default_config(VITC_OPTIM_ADAMW);
    c.amsgrad = 1;
    vitc_optimizer *o;
    assert_int_equal(vitc__optimizer_create(&f.ps, &c, &o), VITC_OK);
    assert_int_equal(vitc_optimizer_num_states(o), 3);
    assert_int_equal(vitc_optimizer_num_params(o), N);
    const char *name;
    float *data;
    assert_int_equal(vitc_optimizer_state(o, 1, &name, &data), VITC_OK);
    assert_string_equal(name, "exp_avg_sq");
    assert_int_equal(vitc_optimizer_state(o, 3, &name, &data), VITC_ERR_INVALID_ARG);
    for (int i = 0; i < N; i++)
        f.grad[i] = 0.5f;
    assert_int_equal(vitc_optimizer_step(o), VITC_OK);
    assert_int_equal(vitc_optimizer_state(o, 0, &name, &data), VITC_OK);
    assert_true(fabs(data[0] - 0.05) < 1e-7); /* (1 - 0.9) * 0.5 */
    assert_int_equal(vitc_optimizer_set_momentum(o, 0.8), VITC_OK);
    assert_true(vitc_optimizer_get_momentum(o) == 0.8);
    assert_int_equal(vitc_optimizer_set_momentum(o, 1.0), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_optimizer_set_lr(o, 0.25), VITC_OK);
    assert_true(vitc_optimizer_get_lr(o) == 0.25);
    assert_int_equal(vitc_optimizer_set_lr(o, -1.0), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_optimizer_set_step(o, -1), VITC_ERR_INVALID_ARG);
    vitc_optimizer_free(o);
    /* SGD without momentum keeps no state; with it, "momentum_buffer". */
    c = vitc_optim_default_config(VITC_OPTIM_SGD);
    assert_int_equal(vitc__optimizer_create(&f.ps, &c, &o), VITC_OK);
    assert_int_equal(vitc_optimizer_num_states(o), 0);
    assert_int_equal(vitc_optimizer_set_momentum(o, 0.9), VITC_OK);
    assert_int_equal(vitc_optimizer_num_states(o), 1);
    assert_int_equal(vitc_optimizer_state(o, 0, &name, &data), VITC_OK);
    assert_string_equal(name, "momentum_buffer");
    vitc_optimizer_free(o);
    vitc__handle_unregister(f.ps.owner_id);
}

/* A checkpointed optimizer (state arrays + step) continues exactly like
 * the one that kept running. */
static void test_restore(void **st) {
    (void)st;
    vitc_optim_config cs[2] = {vitc_optim_default_config(VITC_OPTIM_ADAMW),
                               vitc_optim_default_config(VITC_OPTIM_SGD)};
    cs[1].momentum = 0.9, cs[1].lr = 0.1;
    for (int k = 0; k < 2; k++) {
        fixture a, b;
        make(&a, 4);
        make(&b, 4);
        vitc_optimizer *oa, *ob;
        assert_int_equal(vitc__optimizer_create(&a.ps, &cs[k], &oa), VITC_OK);
        assert_int_equal(vitc__optimizer_create(&b.ps, &cs[k], &ob), VITC_OK);
        vitc__rng r = {5};
        for (int t = 0; t < 6; t++) {
            for (int i = 0; i < N; i++)
                a.grad[i] = b.grad[i] = (float)(vitc__rng_uniform(&r) - 0.5);
            assert_int_equal(vitc_optimizer_step(oa), VITC_OK);
            if (t < 3) {
                assert_int_equal(vitc_optimizer_step(ob), VITC_OK);
            } else if (t == 3) { /* b restarts from a's checkpoint */
                vitc_optimizer_free(ob);
                memcpy(b.param, a.param, sizeof a.param);
                assert_int_equal(vitc__optimizer_create(&b.ps, &cs[k], &ob), VITC_OK);
                for (int s = 0; s < vitc_optimizer_num_states(oa); s++) {
                    float *da, *db;
                    assert_int_equal(vitc_optimizer_state(oa, s, NULL, &da), VITC_OK);
                    assert_int_equal(vitc_optimizer_state(ob, s, NULL, &db), VITC_OK);
                    memcpy(db, da, N * sizeof(float));
                }
                assert_int_equal(vitc_optimizer_set_step(ob, vitc_optimizer_get_step(oa)), VITC_OK);
            } else {
                assert_int_equal(vitc_optimizer_step(ob), VITC_OK);
            }
        }
        assert_memory_equal(a.param, b.param, sizeof a.param);
        vitc_optimizer_free(oa);
        vitc_optimizer_free(ob);
        vitc__handle_unregister(a.ps.owner_id);
        vitc__handle_unregister(b.ps.owner_id);
    }
}

static void test_errors(void **st) {
    (void)st;
    fixture f;
    make(&f, 6);
    vitc_optimizer *o = (vitc_optimizer *)&f; /* must be overwritten with NULL */
    vitc_optim_config c = vitc_optim_default_config(VITC_OPTIM_SGD);
    c.nesterov = 1;
    assert_int_equal(vitc__optimizer_create(&f.ps, &c, &o), VITC_ERR_INVALID_ARG);
    assert_null(o);
    assert_non_null(strstr(vitc_last_error(), "nesterov"));
    c = vitc_optim_default_config(VITC_OPTIM_ADAMW);
    c.beta2 = 1.0;
    assert_int_equal(vitc__optimizer_create(&f.ps, &c, &o), VITC_ERR_INVALID_ARG);
    c.beta2 = 0.999, c.lr = NAN;
    assert_int_equal(vitc__optimizer_create(&f.ps, &c, &o), VITC_ERR_INVALID_ARG);
    c.lr = 1e-3;
    vitc__pseg bad[1] = {{.name = "w", .offset = 30, .numel = 20, .ndim = 1, .shape = {20}}};
    vitc__paramset ps = f.ps;
    ps.seg = bad, ps.nseg = 1;
    assert_int_equal(vitc__optimizer_create(&ps, &c, &o), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "\"w\""));
    /* The model is freed under the optimizer: every call fails cleanly. */
    assert_int_equal(vitc__optimizer_create(&f.ps, &c, &o), VITC_OK);
    vitc__handle_unregister(f.ps.owner_id);
    assert_int_equal(vitc_optimizer_step(o), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "freed"));
    assert_int_equal(vitc_optimizer_zero_grad(o), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_clip_grad_norm_optimizer(o, 1.0f, NULL), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_optimizer_state(o, 0, NULL, NULL), VITC_ERR_INVALID_ARG);
    vitc_optimizer_free(o);
    assert_int_equal(vitc__optimizer_create(&f.ps, &c, &o), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_optimizer_step(NULL), VITC_ERR_INVALID_ARG);
    vitc_optimizer_free(NULL);
}

static void test_clip_grad_norm(void **st) {
    (void)st;
    fixture f;
    make(&f, 7);
    vitc__rng r = {8};
    for (int i = 0; i < N; i++)
        f.grad[i] = (float)(vitc__rng_uniform(&r) - 0.5) * 4.0f;
    float g0[N];
    memcpy(g0, f.grad, sizeof g0);
    double ss = 0.0;
    for (int i = 0; i < N; i++)
        ss += (double)g0[i] * g0[i];
    const double norm = sqrt(ss);
    float total;
    /* Above the norm: nothing changes, the norm is returned. */
    assert_int_equal(vitc__clip_grad_norm(&f.ps, (float)(2.0 * norm), &total), VITC_OK);
    assert_true(fabs(total - norm) <= 1e-6 * norm);
    assert_memory_equal(f.grad, g0, sizeof g0);
    /* Below: scaled by max_norm / (norm + 1e-6). */
    assert_int_equal(vitc__clip_grad_norm(&f.ps, 1.0f, &total), VITC_OK);
    assert_true(fabs(total - norm) <= 1e-6 * norm);
    double ss2 = 0.0;
    for (int i = 0; i < N; i++) {
        double want = g0[i] * (1.0 / (norm + 1e-6));
        assert_true(fabs(f.grad[i] - want) <= 1e-6 * fmax(1.0, fabs(want)));
        ss2 += (double)f.grad[i] * f.grad[i];
    }
    assert_true(fabs(sqrt(ss2) - 1.0) < 1e-5);
    assert_int_equal(vitc__clip_grad_norm(&f.ps, -1.0f, &total), VITC_ERR_INVALID_ARG);
    vitc__handle_unregister(f.ps.owner_id);
}

/* Cross-entropy against float64, including logits in the thousands where
 * exp overflows without the max shift, and a label naming the bad index. */
static void test_cross_entropy(void **st) {
    (void)st;
    enum { B = 5, C = 7 };
    float x[B * C], d[B * C];
    int64_t y[B] = {0, 6, 3, 3, 1};
    vitc__rng r = {9};
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < B * C; i++)
            x[i] = (float)((vitc__rng_uniform(&r) - 0.5) * (s ? 4000.0 : 6.0));
        for (int k = 0; k < 3; k++) {
            const double eps = k * 0.2;
            float loss;
            assert_int_equal(vitc_cross_entropy(x, y, B, C, (float)eps, &loss, d), VITC_OK);
            double want = 0.0;
            for (int b = 0; b < B; b++) {
                long double mx = -INFINITY, se = 0.0L, sx = 0.0L;
                for (int c = 0; c < C; c++)
                    mx = fmaxl(mx, x[b * C + c]);
                for (int c = 0; c < C; c++)
                    se += expl(x[b * C + c] - mx), sx += x[b * C + c];
                long double lse = mx + logl(se);
                want += (double)((1.0L - eps) * (lse - x[b * C + y[b]]) + eps * (lse - sx / C)) / B;
                for (int c = 0; c < C; c++) {
                    long double g = (expl(x[b * C + c] - lse) - eps / C - (c == y[b]) * (1.0L - eps)) / B;
                    assert_true(fabsl(d[b * C + c] - g) <= 1e-7L);
                }
            }
            assert_true(isfinite(loss));
            assert_true(fabs(loss - want) <= 1e-6 * fmax(1.0, fabs(want)));
        }
    }
    float loss = 123.0f;
    y[3] = 7;
    assert_int_equal(vitc_cross_entropy(x, y, B, C, 0.0f, &loss, d), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "labels[3] = 7"));
    assert_true(loss == 123.0f);
    y[3] = -1;
    assert_int_equal(vitc_cross_entropy(x, y, B, C, 0.0f, &loss, d), VITC_ERR_INVALID_ARG);
    y[3] = 2;
    assert_int_equal(vitc_cross_entropy(x, y, B, C, 1.5f, &loss, d), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_cross_entropy(x, y, 0, C, 0.0f, &loss, d), VITC_ERR_SHAPE);
    assert_int_equal(vitc_cross_entropy(NULL, y, B, C, 0.0f, &loss, d), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_cross_entropy(x, y, INT64_MAX / 2, C, 0.0f, &loss, d), VITC_ERR_NOMEM);
}

/* Buffers (BatchNorm running statistics) are in the table but are no
 * parameters: no update, no decay, not in the gradient norm. */
static void test_buffers_skipped(void **st) {
    (void)st;
    float p[8], g[8];
    for (int i = 0; i < 8; i++)
        p[i] = 1.0f + (float)i, g[i] = 3.0f;
    const vitc__pseg s2[2] = {{.name = "w", .offset = 0, .numel = 4, .ndim = 1, .shape = {4}},
                              {.name = "running_var", .offset = 4, .numel = 4, .ndim = 1,
                               .shape = {4}, .buffer = 1}};
    vitc__paramset ps = {p, g, 8, s2, 2, vitc__handle_register(), NULL, NULL, NULL};
    float total;
    assert_int_equal(vitc__clip_grad_norm(&ps, 1e9f, &total), VITC_OK);
    assert_true(fabs(total - 6.0) < 1e-6); /* sqrt(4 * 9), the buffer's 3s left out */
    vitc_optim_config c = vitc_optim_default_config(VITC_OPTIM_SGD);
    c.lr = 0.5, c.weight_decay = 0.1, c.decay_all = 1;
    vitc_optimizer *o;
    assert_int_equal(vitc__optimizer_create(&ps, &c, &o), VITC_OK);
    assert_int_equal(vitc_optimizer_step(o), VITC_OK);
    for (int i = 0; i < 4; i++)
        assert_true(fabs(p[i] - ((1.0 + i) - 0.5 * (3.0 + 0.1 * (1.0 + i)))) < 1e-6);
    for (int i = 4; i < 8; i++)
        assert_true(p[i] == 1.0f + (float)i);
    vitc_optimizer_free(o);
    vitc__handle_unregister(ps.owner_id);
}

/* The public front ends over a real ViT: create, step, clip, and the
 * model freed under the optimizer. */
static void test_vit_front_end(void **st) {
    (void)st;
    vitc_vit_config g = vitc_vit_default_config();
    g.image_size = 8, g.patch_size = 4, g.in_channels = 1, g.hidden_dim = 8, g.depth = 1;
    g.num_heads = 2, g.mlp_dim = 8, g.num_classes = 3;
    vitc_vit *m;
    assert_int_equal(vitc_vit_create(&g, 1, &m), VITC_OK);
    vitc_optim_config c = vitc_optim_default_config(VITC_OPTIM_ADAMW);
    vitc_optimizer *o;
    assert_int_equal(vitc_optimizer_create_vit(NULL, &c, &o), VITC_ERR_INVALID_ARG);
    assert_null(o);
    assert_int_equal(vitc_optimizer_create_vit(m, &c, &o), VITC_OK);
    float *data, *grad;
    const char *name;
    int i = vitc_vit_find_param(m, "heads.head.weight");
    assert_true(i >= 0);
    assert_int_equal(vitc_vit_param(m, i, &name, NULL, NULL, &data, &grad), VITC_OK);
    assert_non_null(grad); /* the optimizer allocated the gradients */
    const float w0 = data[0];
    grad[0] = 3.0f, grad[1] = 4.0f;
    float total;
    assert_int_equal(vitc_clip_grad_norm_vit(m, 1.0f, &total), VITC_OK);
    assert_true(fabs(total - 5.0) < 1e-6);
    assert_true(fabs(grad[0] - 3.0 / (5.0 + 1e-6)) < 1e-6);
    assert_int_equal(vitc_optimizer_step(o), VITC_OK);
    /* Adam's first step moves by lr (sign of the gradient) after decay. */
    assert_true(fabs(data[0] - (w0 * (1.0 - 1e-3 * 1e-2) - 1e-3)) < 1e-6);
    assert_int_equal(vitc_optimizer_zero_grad(o), VITC_OK);
    assert_true(grad[0] == 0.0f);
    vitc_vit_free(m);
    assert_int_equal(vitc_optimizer_step(o), VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "freed"));
    vitc_optimizer_free(o);
}

/* The kernel table's AdamW (SIMD on avx2 and avx512) is bitwise vitc__adamw_ref,
 * with and without amsgrad, over a length with a tail; with extreme and
 * special values (zeros, huge, tiny, a NaN gradient). */
static void test_adamw_kernels_bitwise(void **state) {
    (void)state;
    enum { n = 1003 };
    static float p0[n], m0[n], v0[n], x0[n], g[n], p[2][n], m[2][n], v[2][n], x[2][n];
    vitc__rng r = {99};
    for (int i = 0; i < n; i++) {
        double u = vitc__rng_uniform(&r) * 2 - 1;
        p0[i] = (float)(u * 3), m0[i] = (float)(u * 0.1), v0[i] = (float)(u * u * 0.01);
        x0[i] = (float)(u * u * 0.02), g[i] = (float)(u * (i % 7 == 0 ? 1e20 : 1e-3));
    }
    g[5] = 0.0f, g[6] = NAN, g[7] = 1e-30f, v0[8] = 0.0f;
    vitc__adamw_coef c = {.shrink = 1 - 1e-3 * 0.05, .step_size = 1e-3 / (1 - 0.9 * 0.9),
                          .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .bc2_sqrt = 0.0447};
    for (int ams = 0; ams < 2; ams++)
        for (int a = 0; a < TU_NARCH; a++) {
            if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
            for (int k = 0; k < 2; k++) {
                memcpy(p[k], p0, sizeof p0), memcpy(m[k], m0, sizeof m0);
                memcpy(v[k], v0, sizeof v0), memcpy(x[k], x0, sizeof x0);
            }
            vitc__adamw_ref(p[0], m[0], v[0], ams ? x[0] : NULL, g, n, &c);
            vitc__kern()->adamw(p[1], m[1], v[1], ams ? x[1] : NULL, g, n, &c);
            assert_memory_equal(p[0], p[1], sizeof p0);
            assert_memory_equal(m[0], m[1], sizeof m0);
            assert_memory_equal(v[0], v[1], sizeof v0);
            assert_memory_equal(x[0], x[1], sizeof x0);
        }
    vitc_set_arch(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw),           cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_state_and_momentum), cmocka_unit_test(test_restore),
        cmocka_unit_test(test_errors),          cmocka_unit_test(test_clip_grad_norm),
        cmocka_unit_test(test_cross_entropy),   cmocka_unit_test(test_buffers_skipped),
        cmocka_unit_test(test_vit_front_end),   cmocka_unit_test(test_adamw_kernels_bitwise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
