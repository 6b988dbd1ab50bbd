/* test_nn.c — src/nn/'s blocks against float64 references: each MLP
 * activation's derivative and SwiGLU's by central differences of the
 * activation written in double; attention under the causal mask provider
 * against a plain double loop; the cross-attention (SigLIP's pooling)
 * backward against central differences of a double forward; the whole
 * block backward, regularised, against its forward's directional derivative. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "testutil.h"

static double act_d(int act, double x) {
    switch (act) {
    case VITC__NN_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case VITC__NN_QUICK_GELU: return x / (1.0 + exp(-1.702 * x));
    default: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    }
}

/* |a - b| <= rtol |b| + atol, or the failure names what and where. */
static void close_to(const char *what, int64_t i, double a, double b, double rtol, double atol) {
    if (!(fabs(a - b) <= rtol * fabs(b) + atol))
        fail_msg("%s [%lld]: %.9g vs reference %.9g", what, (long long)i, a, b);
}

static void test_activation_derivatives(void **st) {
    (void)st;
    const int64_t n = 2001;
    float *x = tu_falloc((size_t)n), *dy = tu_falloc((size_t)n), *dx = tu_falloc((size_t)n);
    uint64_t s = 11;
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)(-8.0 + 16.0 * (double)i / (double)(n - 1)); /* both tails and 0 */
        dy[i] = tu_urand(&s) + 1.5f;
    }
    const char *names[3] = {"erf GELU'", "tanh GELU'", "quick GELU'"};
    for (int act = 0; act < 3; act++) {
        vitc__nn_act_backward(act, dx, dy, x, n);
        for (int64_t i = 0; i < n; i++) {
            double h = 1e-6, v = x[i];
            double d = (act_d(act, v + h) - act_d(act, v - h)) / (2.0 * h);
            /* atol: float tanh saturates where the true slope is ~1e-6 */
            close_to(names[act], i, dx[i], dy[i] * d, 1e-5, 1e-5);
        }
        /* the forward is the double one, in float */
        float y[1] = {0.75f};
        vitc__nn_act_forward(act, y, 1);
        close_to(names[act], -1, y[0], act_d(act, 0.75), 1e-6, 1e-7);
    }
    free(x);
    free(dy);
    free(dx);
}

static void test_swiglu_derivative(void **st) {
    (void)st;
    const int64_t R = 3, M = 8, h2 = M / 2;
    float h[24], out[12], dout[12], dh[24];
    uint64_t s = 5;
    tu_fill(&s, h, (size_t)(R * M), 3.0f);
    tu_fill(&s, dout, (size_t)(R * h2), 1.0f);
    vitc__nn_swiglu_forward(out, h, R, M);
    /* dout in dh's back half, as the block backward hands it over */
    float packed[24];
    memcpy(packed + R * h2, dout, sizeof dout);
    vitc__nn_swiglu_backward(packed, packed + R * h2, h, R, M);
    vitc__nn_swiglu_backward(dh, dout, h, R, M);
    for (int64_t i = 0; i < R * M; i++) assert_true(packed[i] == dh[i]);
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < h2; j++) {
            double a = h[r * M + j], b = h[r * M + h2 + j], e = 1e-6;
            double silu = a / (1.0 + exp(-a));
            close_to("swiglu", r * h2 + j, out[r * h2 + j], silu * b, 1e-6, 1e-6);
            double da = ((a + e) / (1.0 + exp(-(a + e))) - (a - e) / (1.0 + exp(-(a - e)))) /
                        (2.0 * e) * b;
            close_to("swiglu d/da", r * M + j, dh[r * M + j], dout[r * h2 + j] * da, 1e-5, 1e-6);
            close_to("swiglu d/db", r * M + h2 + j, dh[r * M + h2 + j], dout[r * h2 + j] * silu,
                     1e-5, 1e-6);
        }
}

/* softmax(scale q k^T + mask) v in double, per (b, h), [B, H, L|S, D] contiguous. */
static void attn_ref(double *o, const float *q, const float *k, const float *v, int64_t B,
                     int64_t H, int64_t L, int64_t S, int64_t D, double scale, int causal) {
    double *p = malloc((size_t)S * sizeof *p);
    assert_non_null(p);
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < L; i++) {
            double mx = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j < S; j++) {
                double a = 0.0;
                for (int64_t c = 0; c < D; c++)
                    a += (double)q[(bh * L + i) * D + c] * k[(bh * S + j) * D + c];
                p[j] = causal && j > i + (S - L) ? -INFINITY : a * scale;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int64_t j = 0; j < S; j++) sum += p[j] = exp(p[j] - mx);
            for (int64_t c = 0; c < D; c++) {
                double acc = 0.0;
                for (int64_t j = 0; j < S; j++) acc += p[j] / sum * v[(bh * S + j) * D + c];
                o[(bh * L + i) * D + c] = acc;
            }
        }
    free(p);
}

static void test_causal_mask(void **st) {
    (void)st;
    const int64_t B = 2, H = 3, D = 8;
    const int64_t shapes[2][2] = {{7, 7}, {3, 9}}; /* self-attention; the last queries of 9 */
    for (int t = 0; t < 2; t++) {
        int64_t L = shapes[t][0], S = shapes[t][1];
        size_t nq = (size_t)(B * H * L * D), nk = (size_t)(B * H * S * D);
        float *q = tu_falloc(nq), *k = tu_falloc(nk), *v = tu_falloc(nk), *o = tu_falloc(nq);
        double *ref = malloc(nq * sizeof *ref);
        assert_non_null(ref);
        uint64_t s = 77 + (uint64_t)t;
        tu_fill(&s, q, nq, 1.0f);
        tu_fill(&s, k, nk, 1.0f);
        tu_fill(&s, v, nk, 1.0f);
        vitc__sdpa_desc sd = {
            .B = B, .H = H, .L = L, .S = S, .D = D, .Dv = D,
            .q = q, .q_sb = H * L * D, .q_sh = L * D, .q_sr = D,
            .k = k, .k_sb = H * S * D, .k_sh = S * D, .k_sr = D,
            .v = v, .v_sb = H * S * D, .v_sh = S * D, .v_sr = D,
            .o = o, .o_sb = H * L * D, .o_sh = L * D, .o_sr = D,
            .scale = 0.35f,
        };
        vitc__nn_mask m = {.kind = VITC__NN_MASK_CAUSAL};
        vitc__buf buf = {0};
        assert_int_equal(vitc__nn_mask_apply(&m, &buf, &sd), VITC_OK);
        assert_int_equal(vitc__sdpa(&sd), VITC_OK);
        attn_ref(ref, q, k, v, B, H, L, S, D, 0.35, 1);
        for (size_t i = 0; i < nq; i++) close_to("causal attention", (int64_t)i, o[i], ref[i], 1e-5, 1e-6);
        /* and the mask does act: without it the first row differs */
        attn_ref(ref, q, k, v, B, H, L, S, D, 0.35, 0);
        assert_true(fabs(o[0] - ref[0]) > 1e-4);
        vitc__buf_free(&buf);
        free(q);
        free(k);
        free(v);
        free(o);
        free(ref);
    }
}

/* The cross-attention's loss sum(dy * y) in double for the parameters in
 * the float arrays (probe, in_w, in_b, out_w, out_b) and x. */
static double cross_loss(const vitc__nn_cross *p, const float *x, const float *dy) {
    int64_t B = p->B, L = p->L, S = p->S, C = p->C, H = p->H, d = C / H;
    float *q = tu_falloc((size_t)(B * H * L * d)), *k = tu_falloc((size_t)(B * H * S * d));
    float *v = tu_falloc((size_t)(B * H * S * d));
    double *o = malloc((size_t)(B * H * L * d) * sizeof *o);
    assert_non_null(o);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t c = 0; c < d; c++) {
                int64_t row = h * d + c;
                for (int64_t i = 0; i < L; i++) {
                    double a = p->in_b[row];
                    for (int64_t j = 0; j < C; j++) a += (double)p->probe[i * C + j] * p->in_w[row * C + j];
                    q[((b * H + h) * L + i) * d + c] = (float)a; /* float operands, as vitc */
                }
                for (int64_t t = 0; t < S; t++) {
                    double ak = p->in_b[C + row], av = p->in_b[2 * C + row];
                    for (int64_t j = 0; j < C; j++) {
                        ak += (double)x[(b * S + t) * C + j] * p->in_w[(C + row) * C + j];
                        av += (double)x[(b * S + t) * C + j] * p->in_w[(2 * C + row) * C + j];
                    }
                    k[((b * H + h) * S + t) * d + c] = (float)ak;
                    v[((b * H + h) * S + t) * d + c] = (float)av;
                }
            }
    attn_ref(o, q, k, v, B, H, L, S, d, 1.0 / sqrt((double)d), 0);
    double loss = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t r = 0; r < C; r++) {
                double y = p->out_b[r];
                for (int64_t h = 0; h < H; h++)
                    for (int64_t c = 0; c < d; c++)
                        y += o[((b * H + h) * L + i) * d + c] * p->out_w[r * C + h * d + c];
                loss += y * dy[(b * L + i) * C + r];
            }
    free(q);
    free(k);
    free(v);
    free(o);
    return loss;
}

static void test_cross_attention_backward(void **st) {
    (void)st;
    const int64_t B = 2, L = 1, S = 5, C = 8, H = 2;
    float probe[8], in_w[192], in_b[24], out_w[64], out_b[8], x[80], dy[16], y[16];
    float g_probe[8] = {0}, g_in_w[192] = {0}, g_in_b[24] = {0}, g_out_w[64] = {0}, g_out_b[8] = {0};
    float dx[80], datt[16], dq[16], dkv[160];
    uint64_t s = 3;
    tu_fill(&s, probe, 8, 1.0f);
    tu_fill(&s, in_w, 192, 0.5f);
    tu_fill(&s, in_b, 24, 0.2f);
    tu_fill(&s, out_w, 64, 0.5f);
    tu_fill(&s, out_b, 8, 0.2f);
    tu_fill(&s, x, 80, 1.0f);
    tu_fill(&s, dy, 16, 1.0f);
    vitc__nn_cross p = {probe, in_w, in_b, out_w, out_b, B, L, S, C, H, {0}};
    vitc__nn_cross g = {g_probe, g_in_w, g_in_b, g_out_w, g_out_b, B, L, S, C, H, {0}};
    float q[8], kv[160], att[16], lse[4];
    vitc__nn_cross_rec r = {q, kv, att, lse};
    vitc__buf mb = {0};
    assert_int_equal(vitc__nn_cross_forward(&p, y, x, &r, &mb), VITC_OK);
    double fwd = 0.0;
    for (int i = 0; i < 16; i++) fwd += (double)y[i] * dy[i];
    close_to("cross forward", 0, fwd, cross_loss(&p, x, dy), 1e-5, 1e-5);
    assert_int_equal(vitc__nn_cross_backward(&p, &g, dx, dy, x, &r, datt, dq, dkv, &mb), VITC_OK);
    struct { const char *name; float *w, *gw; int n; } t[6] = {
        {"probe", probe, g_probe, 8}, {"in_proj_weight", in_w, g_in_w, 192},
        {"in_proj_bias", in_b, g_in_b, 24}, {"out_proj.weight", out_w, g_out_w, 64},
        {"out_proj.bias", out_b, g_out_b, 8}, {"x", x, dx, 80}};
    for (int k = 0; k < 6; k++)
        for (int i = 0; i < t[k].n; i++) {
            /* a float step the float operands hold exactly */
            float w0 = t[k].w[i], e = 1.0f / 1024.0f;
            t[k].w[i] = w0 + e;
            double lp = cross_loss(&p, x, dy);
            t[k].w[i] = w0 - e;
            double lm = cross_loss(&p, x, dy);
            t[k].w[i] = w0;
            close_to(t[k].name, i, t[k].gw[i], (lp - lm) / (2.0 * e), 2e-3, 2e-4);
        }
    vitc__buf_free(&mb);
}


/* The block's loss sum(dy * y) with its masks redrawn from the same
 * generator state (the same masks each call), accumulated in double. */
static double block_loss(vitc__nn_block *b, const float *dy, uint64_t seed) {
    vitc__rng r = {seed};
    b->rng = &r;
    assert_int_equal(vitc__nn_block_forward(b, 0), VITC_OK);
    double l = 0.0;
    for (int64_t i = 0; i < b->B * b->N * b->C; i++) l += (double)b->y[i] * dy[i];
    return l;
}

/* The block backward with everything on (layer scale, dropout, drop path,
 * attention dropout, each activation, SwiGLU) against the directional
 * derivative of its forward: <grad, v> vs (L(w + h v) - L(w - h v)) / 2h
 * over every parameter and the input at once. */
static void test_block_backward_directional(void **st) {
    (void)st;
    const int64_t B = 2, N = 5, C = 8, H = 2, BN = B * N;
    for (int variant = 0; variant < 4; variant++) {
        int swiglu = variant == 3, act = variant < 3 ? variant : VITC__NN_GELU;
        int64_t M = 16, M2 = swiglu ? M / 2 : M;
        /* parameters, one array, in vitc__nn_block_w's order */
        int64_t sz[14] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, M * C, M, C * M2, C, C, C};
        int64_t total = 0, off[14];
        for (int k = 0; k < 14; k++) off[k] = total, total += sz[k];
        float *w = tu_falloc((size_t)total), *gwv = calloc((size_t)total, sizeof(float));
        float *v = tu_falloc((size_t)(total + BN * C));
        assert_non_null(gwv);
        uint64_t s = 1000 + (uint64_t)variant;
        tu_fill(&s, w, (size_t)total, 0.4f);
        for (int k = 0; k < 14; k++) /* norms and layer scales near 1 */
            if (k == 0 || k == 6 || k >= 12)
                for (int64_t i = 0; i < sz[k]; i++) w[off[k] + i] += 1.0f;
        tu_fill(&s, v, (size_t)(total + BN * C), 1.0f);
        vitc__nn_block_w bw, gw;
        float **pw[14] = {&bw.ln1_w, &bw.ln1_b, &bw.qkv_w, &bw.qkv_b, &bw.proj_w, &bw.proj_b,
                          &bw.ln2_w, &bw.ln2_b, &bw.fc1_w, &bw.fc1_b, &bw.fc2_w, &bw.fc2_b,
                          &bw.ls1, &bw.ls2};
        float **pg[14] = {&gw.ln1_w, &gw.ln1_b, &gw.qkv_w, &gw.qkv_b, &gw.proj_w, &gw.proj_b,
                          &gw.ln2_w, &gw.ln2_b, &gw.fc1_w, &gw.fc1_b, &gw.fc2_w, &gw.fc2_b,
                          &gw.ls1, &gw.ls2};
        for (int k = 0; k < 14; k++) *pw[k] = w + off[k], *pg[k] = gwv + off[k];
        /* activations */
        float *x = tu_falloc((size_t)(BN * C)), *ln1 = tu_falloc((size_t)(BN * C));
        float *qkv = tu_falloc((size_t)(BN * 3 * C)), *att = tu_falloc((size_t)(BN * C));
        float *lse = tu_falloc((size_t)(B * H * N)), *mid = tu_falloc((size_t)(BN * C));
        float *ln2 = tu_falloc((size_t)(BN * C)), *hpre = tu_falloc((size_t)(BN * M));
        float *hact = tu_falloc((size_t)(BN * M)), *y = tu_falloc((size_t)(BN * C));
        float *pkeep = tu_falloc((size_t)(B * H * N * N)), *dy = tu_falloc((size_t)(BN * C));
        uint8_t *masks = malloc((size_t)(2 * BN * C + BN * M + 2 * B + B * H * N * N));
        assert_non_null(masks);
        tu_fill(&s, x, (size_t)(BN * C), 1.0f);
        tu_fill(&s, dy, (size_t)(BN * C), 1.0f);
        vitc__buf tmp = {0}, mb = {0};
        vitc__nn_block b = {.w = &bw, .B = B, .N = N, .C = C, .H = H, .M = M, .eps = 1e-6f,
                            .act = act, .swiglu = swiglu, .dropout = 0.2f,
                            .attention_dropout = 0.25f, .drop_path = 0.3f,
                            .k = {masks, masks + BN * C, masks + BN * C + BN * M,
                                  masks + 2 * BN * C + BN * M, masks + 2 * BN * C + BN * M + B,
                                  masks + 2 * BN * C + BN * M + 2 * B},
                            .x = x, .ln1 = ln1, .qkv = qkv, .att = att, .lse = lse, .mid = mid,
                            .ln2 = ln2, .hpre = hpre, .hact = hact, .y = y, .pkeep = pkeep,
                            .tmp = &tmp, .mask_buf = &mb};
        const uint64_t seed = 99;
        block_loss(&b, dy, seed);
        vitc__nn_block_bwd sc = {tu_falloc((size_t)(BN * C)), tu_falloc((size_t)(BN * C)),
                                 tu_falloc((size_t)(BN * C)), tu_falloc((size_t)(BN * C)),
                                 tu_falloc((size_t)(BN * 3 * C)), tu_falloc((size_t)(BN * M)),
                                 tu_falloc((size_t)(2 * BN))};
        memcpy(sc.g, dy, (size_t)(BN * C) * sizeof(float));
        assert_int_equal(vitc__nn_block_backward(&b, 0, &gw, &sc), VITC_OK);
        double dir = 0.0;
        for (int64_t i = 0; i < total; i++) dir += (double)gwv[i] * v[i];
        for (int64_t i = 0; i < BN * C; i++) dir += (double)sc.g[i] * v[total + i];
        /* central difference in float: h large enough for float's rounding */
        float *w0 = tu_falloc((size_t)total), *x0 = tu_falloc((size_t)(BN * C));
        memcpy(w0, w, (size_t)total * sizeof(float));
        memcpy(x0, x, (size_t)(BN * C) * sizeof(float));
        const float h = 1e-3f;
        double lp, lm;
        for (int64_t i = 0; i < total; i++) w[i] = w0[i] + h * v[i];
        for (int64_t i = 0; i < BN * C; i++) x[i] = x0[i] + h * v[total + i];
        lp = block_loss(&b, dy, seed);
        for (int64_t i = 0; i < total; i++) w[i] = w0[i] - h * v[i];
        for (int64_t i = 0; i < BN * C; i++) x[i] = x0[i] - h * v[total + i];
        lm = block_loss(&b, dy, seed);
        double fd = (lp - lm) / (2.0 * h);
        if (!(fabs(dir - fd) <= 5e-4 * fabs(fd) + 1e-3))
            fail_msg("block variant %d (act %d, swiglu %d): <grad, v> = %.7g, central difference "
                     "%.7g", variant, act, swiglu, dir, fd);
        /* and a wrong gradient would show: a 1% change of one term is outside */
        assert_true(fabs(1.01 * dir - fd) > 5e-4 * fabs(fd) + 1e-3 || fabs(dir) < 0.5);
        vitc__buf_free(&tmp);
        vitc__buf_free(&mb);
        float *fr[] = {w, gwv, v, x, ln1, qkv, att, lse, mid, ln2, hpre, hact, y, pkeep, dy, w0, x0,
                       sc.g, sc.gmid, sc.dln, sc.datt, sc.dqkv, sc.dh, sc.stats};
        for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) free(fr[i]);
        free(masks);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_activation_derivatives),
        cmocka_unit_test(test_swiglu_derivative),
        cmocka_unit_test(test_causal_mask),
        cmocka_unit_test(test_cross_attention_backward),
        cmocka_unit_test(test_block_backward_directional),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
