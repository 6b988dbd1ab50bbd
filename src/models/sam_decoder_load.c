/*
 * sam_decoder_load.c — SAM's prompt encoder and mask decoder read from a
 * checkpoint (transformers' SamModel names) and config.json, and the
 * constants the decoder's folded forms use, made once at load.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../kernels/kernels.h"
#include "../nn/dense.h"
#include "sam.h"
#include "sam_decoder_impl.h"

/* ------------------------------------------------------------------ */
/* Loading                                                            */
/* ------------------------------------------------------------------ */

float *vitc__sam_dec_alloc(vitc__sam_dec *d, int64_t n) {
    if (d->n_bufs == d->cap_bufs) {
        int cap = d->cap_bufs ? 2 * d->cap_bufs : 64;
        void *a = realloc(d->bufs, (size_t)cap * sizeof *d->bufs);
        if (!a)
            return NULL;
        d->bufs = a;
        d->cap_bufs = cap;
    }
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (p)
        d->bufs[d->n_bufs++] = p;
    return p;
}

/* The tensor name (printf-style) of shape want[nd] into a new buffer. */
static vitc_status take(vitc__sam_dec *d, const vitc__shards *sh, float **dst, const int64_t *want,
                        int nd, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static vitc_status take(vitc__sam_dec *d, const vitc__shards *sh, float **dst, const int64_t *want,
                        int nd, const char *fmt, ...) {
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= want[i];
    float *p = vitc__sam_dec_alloc(d, n);
    if (!p)
        return vitc__err(VITC_ERR_NOMEM, "out of memory for SAM tensor %s", name);
    *dst = p;
    return vitc__hub_take(sh, name, want, nd, 0, p);
}

/* A shape as take's (want, nd) pair. */
#define SHAPE(...)                                                                                 \
    ((const int64_t[]){__VA_ARGS__}),                                                              \
        (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

static vitc_status take_linear(vitc__sam_dec *d, const vitc__shards *sh, sam_wb *l, int64_t out,
                               int64_t in, const char *module) {
    VITC_TRY(take(d, sh, &l->w, SHAPE(out, in), "%s.weight", module));
    VITC_TRY(take(d, sh, &l->b, SHAPE(out), "%s.bias", module));
    if (!vitc__gemm_pack_kernel())
        return VITC_OK;
    if (d->n_packed == d->cap_packed) {
        int cap = d->cap_packed ? 2 * d->cap_packed : 64;
        void *a = realloc(d->packed, (size_t)cap * sizeof *d->packed);
        if (!a)
            return vitc__err(VITC_ERR_NOMEM, "out of memory packing %s", module);
        d->packed = a;
        d->cap_packed = cap;
    }
    VITC_TRY(vitc__pweight_pack(&l->pw, l->w, out, in, VITC_PRECISION_FP32));
    d->packed[d->n_packed++] = l;
    return VITC_OK;
}

static vitc_status take_ln(vitc__sam_dec *d, const vitc__shards *sh, sam_wb *l, int64_t C,
                           const char *module) {
    VITC_TRY(take(d, sh, &l->w, SHAPE(C), "%s.weight", module));
    return take(d, sh, &l->b, SHAPE(C), "%s.bias", module);
}

static vitc_status take_attn(vitc__sam_dec *d, const vitc__shards *sh, sam_attn *a, int64_t ds,
                             const char *module) {
    char n[160];
    a->I = d->C / ds;
    if (a->I * ds != d->C || a->I % d->heads)
        return vitc__err(VITC_ERR_FORMAT,
                         "config.json: mask_decoder_config's hidden_size %lld / downsample %lld "
                         "is not divisible by num_attention_heads %lld",
                         (long long)d->C, (long long)ds, (long long)d->heads);
    static const char *const proj[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    sam_wb *wb[4] = {&a->q, &a->k, &a->v, &a->o};
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "%s.%s", module, proj[i]);
        VITC_TRY(take_linear(d, sh, wb[i], i < 3 ? a->I : d->C, i < 3 ? d->C : a->I, n));
    }
    return VITC_OK;
}

static vitc_status take_ffn(vitc__sam_dec *d, const vitc__shards *sh, sam_ffn *f, int64_t in,
                            int64_t hidden, int64_t out, int depth, const char *module) {
    char n[160];
    f->hidden = hidden, f->out_dim = out, f->n_mid = depth - 2;
    snprintf(n, sizeof n, "%s.proj_in", module);
    VITC_TRY(take_linear(d, sh, &f->in, hidden, in, n));
    for (int i = 0; i < f->n_mid; i++) {
        snprintf(n, sizeof n, "%s.layers.%d", module, i);
        VITC_TRY(take_linear(d, sh, &f->mid[i], hidden, hidden, n));
    }
    snprintf(n, sizeof n, "%s.proj_out", module);
    return take_linear(d, sh, &f->out, out, hidden, n);
}

/* A 2x2 convolution's weight in the dense layers' layout: torch's Conv2d
 * [O, Cin, 2, 2] as [O, 2, 2, Cin], or (tr) ConvTranspose2d [Cin, O, 2, 2]
 * as [2, 2, O, Cin]. */
static vitc_status take_conv(vitc__sam_dec *d, const vitc__shards *sh, sam_wb *l, int64_t O,
                             int64_t Cin, int tr, const char *module) {
    float *t;
    if (tr)
        VITC_TRY(take(d, sh, &t, SHAPE(Cin, O, 2, 2), "%s.weight", module));
    else
        VITC_TRY(take(d, sh, &t, SHAPE(O, Cin, 2, 2), "%s.weight", module));
    if (!(l->w = vitc__sam_dec_alloc(d, O * Cin * 4)))
        return vitc__err(VITC_ERR_NOMEM, "out of memory for %s", module);
    if (tr)
        vitc__nn_convt_pack(l->w, t, Cin, O, 2, 2);
    else
        vitc__nn_conv_pack(l->w, t, O, Cin, 2, 2);
    return take(d, sh, &l->b, SHAPE(O), "%s.bias", module);
}

static vitc_status cfg_int(const json_t *sec, const char *sname, const char *key, int64_t def,
                           int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = sec ? json_object_get(sec, key) : NULL;
    *out = def;
    if (!v || json_is_null(v))
        return VITC_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return vitc__err(VITC_ERR_FORMAT, "config.json: %s.%s must be an integer in [%lld, %lld]",
                         sname, key, (long long)lo, (long long)hi);
    *out = json_integer_value(v);
    return VITC_OK;
}

static vitc_status cfg_eps(const json_t *sec, const char *sname, const char *key, double def,
                           float *out) {
    json_t *v = sec ? json_object_get(sec, key) : NULL;
    *out = (float)def;
    if (!v || json_is_null(v))
        return VITC_OK;
    if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > 1)
        return vitc__err(VITC_ERR_FORMAT, "config.json: %s.%s must be a number in (0, 1]", sname,
                         key);
    *out = (float)json_number_value(v);
    return VITC_OK;
}

static vitc_status cfg_act(const json_t *sec, const char *sname, const char *def, int *out) {
    json_t *v = sec ? json_object_get(sec, "hidden_act") : NULL;
    const char *s = v && json_is_string(v) ? json_string_value(v) : def;
    if (v && !json_is_null(v) && !json_is_string(v))
        return vitc__err(VITC_ERR_FORMAT, "config.json: %s.hidden_act must be a string", sname);
    if (!strcmp(s, "gelu"))
        *out = SAM_ACT_GELU;
    else if (!strcmp(s, "relu"))
        *out = SAM_ACT_RELU;
    else
        return vitc__err(VITC_ERR_UNSUPPORTED,
                         "config.json: %s.hidden_act \"%.40s\" is not supported (gelu or relu)",
                         sname, s);
    return VITC_OK;
}

/* The positional encoding of one point normalised to [0, 1]^2 after the
 * 2c - 1 map (u, v), as SamPositionalEmbedding: [sin(2 pi f), cos(2 pi
 * f)], f = (u, v) @ pe. The product in double then rounded: what a GEMM
 * with K = 2 and a fused multiply-add gives. */
void vitc__sam_pos_encode(const vitc__sam_dec *d, float u, float v, float *out) {
    const int64_t F = d->C / 2;
    for (int64_t j = 0; j < F; j++) {
        float f = (float)((double)u * d->pe[j] + (double)v * d->pe[F + j]);
        float t = f * (float)(2.0 * 3.14159265358979323846);
        out[j] = sinf(t);
        out[F + j] = cosf(t);
    }
}

/* One layer's layer_norm4 folded into a weight W [N, C] that reads its
 * output: wout [N, C] = W with column c scaled by w[c]; per row, in
 * double, g = wout . beta (the layer's i2t out_proj bias), h = wout's row
 * sum and e = W . b (w, b the LayerNorm's); any of g, h, e may be NULL. */
static void ln4_fold(float *wout, double *g, double *h, double *e, const float *W, int64_t N,
                     int64_t C, const sam_layer *L) {
    for (int64_t o = 0; o < N; o++) {
        double sg = 0, sh = 0, se = 0;
        for (int64_t c = 0; c < C; c++) {
            const float v = W[o * C + c] * L->ln4.w[c];
            wout[o * C + c] = v;
            sg += (double)L->i2t.o.b[c] * v, sh += v, se += (double)L->ln4.b[c] * W[o * C + c];
        }
        if (g)
            g[o] = sg;
        if (h)
            h[o] = sh;
        if (e)
            e[o] = se;
    }
}

/* The decoder's folded up1 (the upf_* fields; left NULL when out of
 * memory). */
static void upf_make(vitc__sam_dec *d, double *g, double *h, double *e) {
    const int64_t L = d->n_layers, C = d->C, N = C; /* up1: [4 C/4 = C, C] */
    float *w = vitc__sam_dec_alloc(d, L * N * C), *u = vitc__sam_dec_alloc(d, (L + 1) * N),
          *hs = vitc__sam_dec_alloc(d, L * N);
    if (!w || !u || !hs)
        return;
    for (int64_t o = 0; o < N; o++) u[L * N + o] = d->up1_b4[o];
    for (int64_t i = L - 1; i >= 0; i--) {
        ln4_fold(w + i * N * C, g, h, e, i + 1 < L ? w + (i + 1) * N * C : d->up1.w, N, C,
                 &d->layers[i]);
        /* u_i = g_i (+ e_{i-1}, added by the next step), u_{i+1} += e_i */
        for (int64_t o = 0; o < N; o++) {
            u[i * N + o] = (float)g[o];
            u[(i + 1) * N + o] += (float)e[o];
            hs[i * N + o] = (float)h[o];
        }
    }
    float *wo = vitc__sam_dec_alloc(d, L * N * d->layers[0].i2t.I);
    if (!wo)
        return;
    for (int64_t i = 0; i < L; i++) {
        const int64_t I = d->layers[i].i2t.I;
        vitc__gemm(1, 1, I, N, C, 1.0f, d->layers[i].i2t.o.w, I, w + i * N * C, C, 0.0f,
                   wo + i * N * I, N);
    }
    d->upf_w = w, d->upf_u = u, d->upf_h = hs, d->upf_wo = wo;
}

/* The decoder's t1_* (left NULL when out of memory or with one layer);
 * g, h, e: [C] scratch. */
static void t1_make(vitc__sam_dec *d, double *g, double *h, double *e) {
    if (d->n_layers < 2)
        return;
    const sam_layer *L0 = &d->layers[0];
    const sam_attn *a = &d->layers[1].t2i, *b = &d->layers[1].i2t;
    const int64_t C = d->C, I = a->I;
    float *w[3], *cst = vitc__sam_dec_alloc(d, 7 * I);
    for (int k = 0; k < 3; k++) w[k] = vitc__sam_dec_alloc(d, I * C);
    if (!w[0] || !w[1] || !w[2] || !cst || b->I != I)
        return;
    /* rows of cst: g, h of the keys; g, h of the values, W_v b_0 + b_v;
     * g, h of the image -> token queries */
    const float *W[3] = {a->k.w, a->v.w, b->q.w};
    const int row[3] = {0, 2, 5};
    for (int k = 0; k < 3; k++) {
        ln4_fold(w[k], g, h, e, W[k], I, C, L0);
        for (int64_t o = 0; o < I; o++) {
            cst[row[k] * I + o] = (float)g[o], cst[(row[k] + 1) * I + o] = (float)h[o];
            if (k == 1)
                cst[4 * I + o] = (float)(a->v.b[o] + e[o]);
        }
        if (vitc__pweight_pack(&d->fold_pw[k], w[k], I, C, VITC_PRECISION_FP32) != VITC_OK)
            memset(&d->fold_pw[k], 0, sizeof d->fold_pw[k]);
    }
    d->t1_wk = w[0], d->t1_wv = w[1], d->t1_wq = w[2], d->t1_c = cst;
}

/* The decoder's fin_* (left NULL when out of memory or without exactly
 * two layers); g, h, e: [2, C] scratch. */
static void fin_make(vitc__sam_dec *d, double *g, double *h, double *e) {
    if (d->n_layers != 2)
        return;
    const sam_attn *a = &d->final;
    const int64_t C = d->C, I = a->I;
    float *w[4], *cst = vitc__sam_dec_alloc(d, 9 * I);
    for (int k = 0; k < 4; k++) w[k] = vitc__sam_dec_alloc(d, I * C);
    if (!w[0] || !w[1] || !w[2] || !w[3] || !cst)
        return;
    for (int kv = 0; kv < 2; kv++) { /* keys, values */
        float *w0 = w[2 * kv], *w1 = w[2 * kv + 1], *cs = cst + 4 * kv * I;
        /* w1 = W D_1 (e: W b_1), then w0 = w1 D_0 (e: w1 b_0) */
        ln4_fold(w1, g + C, h + C, e + C, kv ? a->v.w : a->k.w, I, C, &d->layers[1]);
        ln4_fold(w0, g, h, e, w1, I, C, &d->layers[0]);
        for (int64_t o = 0; o < I; o++) {
            cs[o] = (float)g[o], cs[I + o] = (float)h[o];
            cs[2 * I + o] = (float)(e[o] + g[C + o]), cs[3 * I + o] = (float)h[C + o];
            if (kv)
                cst[8 * I + o] = (float)(a->v.b[o] + e[C + o]);
        }
    }
    for (int k = 0; k < 4; k++) {
        d->fin_w[k] = w[k];
        if (vitc__pweight_pack(&d->fold_pw[3 + k], w[k], I, C, VITC_PRECISION_FP32) != VITC_OK)
            memset(&d->fold_pw[3 + k], 0, sizeof d->fold_pw[3 + k]);
    }
    d->fin_c = cst;
}

/* The statistics' constants (sam_stats.c; two layers only, else or out of
 * memory sf_v stays NULL and the statistics are not computed that way):
 * sf_v [3, C] gamma^2, gamma e, e and sf_s the sums over C of gamma,
 * gamma^2, gamma e, e, e^2, gamma the first layer_norm4's weight, e its
 * bias plus the second layer's i2t out_proj bias. */
static void sf_make(vitc__sam_dec *d) {
    if (d->n_layers != 2)
        return;
    const int64_t C = d->C;
    const float *g = d->layers[0].ln4.w, *b = d->layers[0].ln4.b, *b1 = d->layers[1].i2t.o.b;
    float *v = vitc__sam_dec_alloc(d, 3 * C);
    if (!v)
        return;
    double *sm = d->sf_s;
    for (int64_t j = 0; j < C; j++) {
        const float e = b[j] + b1[j];
        v[j] = g[j] * g[j], v[C + j] = g[j] * e, v[2 * C + j] = e;
        const double gd = g[j], ed = (double)b[j] + b1[j];
        sm[0] += gd, sm[1] += gd * gd, sm[2] += gd * ed, sm[3] += ed, sm[4] += ed * ed;
    }
    d->sf_v = v;
}

vitc_status vitc__sam_dec_load(vitc__sam_dec **out, const vitc__shards *sh,
                               const struct json_t *config) {
    if (!out || !sh)
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM decoder load: NULL argument");
    *out = NULL;
    vitc__sam_dec *d = calloc(1, sizeof *d);
    if (!d)
        return vitc__err(VITC_ERR_NOMEM, "out of memory for SAM's decoder");
    const json_t *pc = config ? json_object_get(config, "prompt_encoder_config") : NULL;
    const json_t *mc = config ? json_object_get(config, "mask_decoder_config") : NULL;
    const char *P = "prompt_encoder_config", *M = "mask_decoder_config";
    vitc_status s = VITC_OK;
    int64_t pC, patch, npe;
#define TRY(e)                                                                                     \
    do {                                                                                           \
        if ((s = (e)) != VITC_OK)                                                                  \
            goto fail;                                                                             \
    } while (0)
    TRY(cfg_int(pc, P, "hidden_size", 256, 2, 1 << 16, &pC));
    TRY(cfg_int(pc, P, "image_size", 1024, 1, 1 << 16, &d->image_size));
    TRY(cfg_int(pc, P, "patch_size", 16, 1, 1 << 16, &patch));
    TRY(cfg_int(pc, P, "mask_input_channels", 16, 4, 1 << 16, &d->mc));
    TRY(cfg_int(pc, P, "num_point_embeddings", 4, 4, 64, &npe));
    TRY(cfg_act(pc, P, "gelu", &d->act_prompt));
    TRY(cfg_eps(pc, P, "layer_norm_eps", 1e-6, &d->eps_prompt));
    TRY(cfg_int(mc, M, "hidden_size", 256, 2, 1 << 16, &d->C));
    TRY(cfg_act(mc, M, "relu", &d->act_mlp));
    TRY(cfg_int(mc, M, "mlp_dim", 2048, 1, 1 << 20, &d->mlp));
    TRY(cfg_int(mc, M, "num_hidden_layers", 2, 1, 64, &d->n_layers));
    TRY(cfg_int(mc, M, "num_attention_heads", 8, 1, 1 << 10, &d->heads));
    TRY(cfg_int(mc, M, "attention_downsample_rate", 2, 1, 1 << 10, &d->ds));
    TRY(cfg_int(mc, M, "num_multimask_outputs", 3, 1, 3, &d->T));
    TRY(cfg_int(mc, M, "iou_head_depth", 3, 2, SAM_MAX_FFN + 2, &d->iou_depth));
    TRY(cfg_int(mc, M, "iou_head_hidden_dim", 256, 1, 1 << 16, &d->iou_hidden));
    TRY(cfg_eps(mc, M, "layer_norm_eps", 1e-6, &d->eps_dec));
    d->T += 1; /* the single-mask token first */
    d->grid = d->image_size / patch;
    if (pC != d->C || d->C % 8 || d->mc % 4 || d->grid < 1) {
        s = vitc__err(VITC_ERR_FORMAT,
                      "config.json: SAM's prompt encoder hidden_size %lld and mask decoder's %lld "
                      "must be equal and divisible by 8, mask_input_channels %lld by 4, and "
                      "image_size %lld at least patch_size %lld",
                      (long long)pC, (long long)d->C, (long long)d->mc,
                      (long long)d->image_size, (long long)patch);
        goto fail;
    }
    const int64_t C = d->C, C4 = C / 4, C8 = C / 8, mc4 = d->mc / 4;
    char n[160];
    /* Tied to prompt_encoder.shared_embedding.positional_embedding, which
     * save_pretrained leaves out. */
    const float *pd;
    const int64_t *ps;
    int pn;
    if (vitc__shards_find(sh, "shared_image_embedding.positional_embedding", &pd, &pn, &ps) ||
        !vitc__shards_find(sh, "prompt_encoder.shared_embedding.positional_embedding", &pd, &pn,
                           &ps))
        TRY(take(d, sh, &d->pe, SHAPE(2, C / 2), "shared_image_embedding.positional_embedding"));
    else
        TRY(take(d, sh, &d->pe, SHAPE(2, C / 2),
                 "prompt_encoder.shared_embedding.positional_embedding"));
    for (int i = 0; i < 4; i++)
        TRY(take(d, sh, &d->point_embed[i], SHAPE(1, C), "prompt_encoder.point_embed.%d.weight",
                 i));
    TRY(take(d, sh, &d->not_a_point, SHAPE(1, C), "prompt_encoder.not_a_point_embed.weight"));
    TRY(take(d, sh, &d->no_mask, SHAPE(1, C), "prompt_encoder.no_mask_embed.weight"));
    TRY(take_conv(d, sh, &d->mconv1, mc4, 1, 0, "prompt_encoder.mask_embed.conv1"));
    TRY(take_ln(d, sh, &d->mln1, mc4, "prompt_encoder.mask_embed.layer_norm1"));
    TRY(take_conv(d, sh, &d->mconv2, d->mc, mc4, 0, "prompt_encoder.mask_embed.conv2"));
    TRY(take_ln(d, sh, &d->mln2, d->mc, "prompt_encoder.mask_embed.layer_norm2"));
    TRY(take(d, sh, &d->mconv3.w, SHAPE(C, d->mc, 1, 1), "prompt_encoder.mask_embed.conv3.weight"));
    TRY(take(d, sh, &d->mconv3.b, SHAPE(C), "prompt_encoder.mask_embed.conv3.bias"));

    TRY(take(d, sh, &d->iou_token, SHAPE(1, C), "mask_decoder.iou_token.weight"));
    TRY(take(d, sh, &d->mask_tokens, SHAPE(d->T, C), "mask_decoder.mask_tokens.weight"));
    if (!(d->layers = calloc((size_t)d->n_layers, sizeof *d->layers))) {
        s = vitc__err(VITC_ERR_NOMEM, "out of memory for SAM's decoder layers");
        goto fail;
    }
    for (int64_t i = 0; i < d->n_layers; i++) {
        sam_layer *L = &d->layers[i];
        const char *pre = "mask_decoder.transformer.layers";
#define LN(f, name)                                                                                \
    snprintf(n, sizeof n, "%s.%lld." name, pre, (long long)i);                                     \
    TRY(take_ln(d, sh, &L->f, C, n))
        snprintf(n, sizeof n, "%s.%lld.self_attn", pre, (long long)i);
        TRY(take_attn(d, sh, &L->self, 1, n));
        snprintf(n, sizeof n, "%s.%lld.cross_attn_token_to_image", pre, (long long)i);
        TRY(take_attn(d, sh, &L->t2i, d->ds, n));
        snprintf(n, sizeof n, "%s.%lld.cross_attn_image_to_token", pre, (long long)i);
        TRY(take_attn(d, sh, &L->i2t, d->ds, n));
        LN(ln1, "layer_norm1");
        LN(ln2, "layer_norm2");
        LN(ln3, "layer_norm3");
        LN(ln4, "layer_norm4");
#undef LN
        snprintf(n, sizeof n, "%s.%lld.mlp.lin1", pre, (long long)i);
        TRY(take_linear(d, sh, &L->lin1, d->mlp, C, n));
        snprintf(n, sizeof n, "%s.%lld.mlp.lin2", pre, (long long)i);
        TRY(take_linear(d, sh, &L->lin2, C, d->mlp, n));
    }
    TRY(take_attn(d, sh, &d->final, d->ds, "mask_decoder.transformer.final_attn_token_to_image"));
    TRY(take_ln(d, sh, &d->ln_final, C, "mask_decoder.transformer.layer_norm_final_attn"));
    TRY(take_conv(d, sh, &d->up1, C4, C, 1, "mask_decoder.upscale_conv1"));
    TRY(take_ln(d, sh, &d->up_ln, C4, "mask_decoder.upscale_layer_norm"));
    TRY(take_conv(d, sh, &d->up2, C8, C4, 1, "mask_decoder.upscale_conv2"));
    if (!(d->up1_b4 = vitc__sam_dec_alloc(d, 4 * C4)) ||
        !(d->up2_b4 = vitc__sam_dec_alloc(d, 4 * C8))) {
        s = vitc__err(VITC_ERR_NOMEM, "out of memory for SAM's upscaling biases");
        goto fail;
    }
    for (int64_t k = 0; k < 4 * C4; k++) d->up1_b4[k] = d->up1.b[k % C4];
    for (int64_t k = 0; k < 4 * C8; k++) d->up2_b4[k] = d->up2.b[k % C8];
    TRY(vitc__pweight_pack(&d->up1_pw, d->up1.w, 4 * C4, C, VITC_PRECISION_FP32));
    TRY(vitc__pweight_pack(&d->up2_pw, d->up2.w, 4 * C8, C4, VITC_PRECISION_FP32));
    /* the folded forms' constants; without memory for their scratch the
     * forms are not made (the prompt runs without them) */
    double *fs = malloc((size_t)(6 * C) * sizeof(double));
    if (fs) {
        upf_make(d, fs, fs + 2 * C, fs + 4 * C);
        t1_make(d, fs, fs + 2 * C, fs + 4 * C);
        fin_make(d, fs, fs + 2 * C, fs + 4 * C);
        free(fs);
    }
    sf_make(d);
    for (int64_t t = 0; t < d->T; t++) {
        snprintf(n, sizeof n, "mask_decoder.output_hypernetworks_mlps.%lld", (long long)t);
        TRY(take_ffn(d, sh, &d->hyper[t], C, C, C8, 3, n));
    }
    TRY(take_ffn(d, sh, &d->iou, C, d->iou_hidden, d->T, (int)d->iou_depth,
                 "mask_decoder.iou_prediction_head"));
#undef TRY

    /* get_image_wide_positional_embeddings: pixel centres of the grid, in
     * float as the cumsum computes them. */
    const int64_t G = d->grid;
    if (!(d->pe_img = vitc__sam_dec_alloc(d, G * G * C))) {
        s = vitc__err(VITC_ERR_NOMEM, "out of memory for SAM's positional embedding");
        goto fail;
    }
    for (int64_t y = 0; y < G; y++)
        for (int64_t x = 0; x < G; x++) {
            float fx = ((float)(x + 1) - 0.5f) / (float)G, fy = ((float)(y + 1) - 0.5f) / (float)G;
            vitc__sam_pos_encode(d, 2.0f * fx - 1.0f, 2.0f * fy - 1.0f,
                                 d->pe_img + (y * G + x) * C);
        }
    *out = d;
    return VITC_OK;
fail:
    vitc__sam_dec_free(d);
    return s;
}

void vitc__sam_dec_free(vitc__sam_dec *d) {
    if (!d)
        return;
    vitc__pweight_free(&d->up1_pw);
    vitc__pweight_free(&d->up2_pw);
    for (int k = 0; k < 7; k++) vitc__pweight_free(&d->fold_pw[k]);
    for (int i = 0; i < d->n_packed; i++) vitc__pweight_free(&d->packed[i]->pw);
    free(d->packed);
    for (int i = 0; i < d->n_bufs; i++) free(d->bufs[i]);
    free(d->bufs);
    free(d->layers);
    free(d);
}
