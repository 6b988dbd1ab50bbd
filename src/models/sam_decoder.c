/*
 * sam_decoder.c — SAM's prompt encoder and mask decoder, as transformers'
 * SamModel computes them with image_embeddings given and SamProcessor maps
 * prompts in (the masks out: sam_post.c).
 *
 * One prompt is one decoder run (a point batch of 1): its sparse tokens
 * (points, the padding point when there is no box, box corners) after the
 * IoU and mask tokens, the dense prompt (the mask prompt downscaled, or
 * no_mask_embed) added to the image's embedding, the two-way transformer,
 * the upscaling and the hypernetwork products. Only the masks asked for
 * are formed (multimask: tokens 1..3; single: token 0).
 *
 * Maps are channels-last ([h, w, C], the encoder's layout), as the dense
 * layers (src/nn/dense.h) take them; the convolutions' weights are put in
 * their layout once, at load.
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
/* Forward                                                            */
/* ------------------------------------------------------------------ */

/* y [M, N] = x [M, K] l->w^T + l->b (+ res), through l's pack. The pack
 * being made by this build's packers for the kernel in use, or empty,
 * the call cannot refuse its arguments. */
static void lin(float *y, int64_t ldy, const float *x, int64_t ldx, const sam_wb *l,
                const float *res, int64_t ldr, int64_t M, int64_t N, int64_t K) {
    (void)vitc__linear_pw(y, ldy, x, ldx, &l->pw, l->w, l->b, res, ldr, M, N, K,
                          VITC__ACT_NONE);
}

/* y [M, I] = x [M, C] W^T through pw, one of the decoder's fold_pw (made
 * by this build's packers, or empty: the call cannot refuse). */
static void fold_lin(float *y, const float *x, int64_t M, const float *W, const vitc__pweight *pw,
                     int64_t I, int64_t C) {
    (void)vitc__linear_pw(y, I, x, C, pw, W, NULL, NULL, 0, M, I, C, VITC__ACT_NONE);
}

static void act(float *x, int64_t n, int kind) {
    if (kind == SAM_ACT_GELU) {
        vitc__gelu(x, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/* y = a + b and y += b, y never overlapping a or b. -O2 vectorises only
 * loops it needs neither overlap checks nor a remainder for: restrict, and
 * inner loops of a fixed 8 (the image-sized sums had run a float at a
 * time). */
static void add_rows(float *restrict y, const float *restrict a, const float *restrict b,
                     int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] = a[i + k] + b[i + k];
    for (; i < n; i++) y[i] = a[i] + b[i];
}

static void acc_rows(float *restrict y, const float *restrict b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] += b[i + k];
    for (; i < n; i++) y[i] += b[i];
}

typedef struct add_ctx {
    float *y;
    const float *a, *b;
    int64_t n;
} add_ctx;

static void add_part(void *vc, int64_t b, int64_t e, int tid) {
    const add_ctx *c = vc;
    (void)tid;
    const int64_t i0 = b * 4096, i1 = e * 4096 < c->n ? e * 4096 : c->n;
    add_rows(c->y + i0, c->a + i0, c->b + i0, i1 - i0);
}

/* y = LayerNorm(y + res + bias) and z = y + pe (z may be NULL) over rows of C (res [M, C]
 * and bias [C] may be NULL), a block of rows at a time: the sums read the
 * rows while the LayerNorm has them in cache instead of more passes over
 * the image-sized map. */
typedef struct lnadd_ctx {
    float *y, *z;
    const float *w, *b, *pe, *res, *bias;
    float *stats; /* [M, 2] or NULL: each row's mean and 1 / sqrt(var + eps) */
    int stats_only; /* y left un-normalised (its stats are all that is read) */
    int64_t C;
    float eps;
} lnadd_ctx;

static void lnadd_part(void *vc, int64_t b, int64_t e, int tid) {
    const lnadd_ctx *c = vc;
    (void)tid;
    for (int64_t r0 = b; r0 < e; r0 += 32) {
        const int64_t n = e - r0 < 32 ? e - r0 : 32, o = r0 * c->C;
        if (c->res)
            acc_rows(c->y + o, c->res + o, n * c->C);
        if (c->bias)
            for (int64_t i = 0; i < n; i++) acc_rows(c->y + o + i * c->C, c->bias, c->C);
        vitc__layernorm_stats(c->stats_only ? NULL : c->y + o, c->y + o, c->w, c->b, n, c->C,
                              c->eps, c->stats ? c->stats + 2 * r0 : NULL);
        if (c->z)
            add_rows(c->z + o, c->y + o, c->pe + o, n * c->C);
    }
}

static void layernorm_add(float *y, float *z, const float *w, const float *b, const float *res,
                          const float *bias, const float *pe, int64_t M, int64_t C, float eps,
                          float *stats, int stats_only) {
    lnadd_ctx c = {y, z, w, b, pe, res, bias, stats, stats_only && stats && !z, C, eps};
    vitc__parallel_range(M, lnadd_part, &c);
}

/* add_rows over the threads: the image-sized sums (a few MB) are memory
 * bound, and one core alone does not reach the bandwidth. */
static void add_rows_par(float *y, const float *a, const float *b, int64_t n) {
    add_ctx c = {y, a, b, n};
    vitc__parallel_range((n + 4095) / 4096, add_part, &c);
}

void vitc__sam_free_packs(vitc__pweight *p, int64_t n) {
    for (int64_t i = 0; p && i < n; i++) vitc__pweight_free(&p[i]);
    free(p);
}

void vitc__sam_dec_cache_free(struct vitc__sam_dec_cache *c) {
    if (!c)
        return;
    vitc__sam_free_packs(c->kh, c->H);
    vitc__sam_free_packs(c->vh, c->H);
    vitc__sam_free_packs(c->qh, c->H);
    for (int k = 0; k < 5; k++) vitc__sam_free_packs(c->t1[k], c->H);
    for (int k = 0; k < 3; k++) vitc__sam_free_packs(c->fin[k], c->H);
    for (int k = 0; k < 3; k++) vitc__sam_free_packs(c->sf[k], c->H);
    free(c->sfc);
    free(c->K0), free(c->kk0), free(c->k), free(c->v), free(c->q), free(c->P0), free(c);
}

int vitc__sam_pack_slices(vitc__pweight *p, const float *x, int64_t HW, int64_t I, int64_t H,
                          int tr, float *t) {
    const int64_t dh = I / H;
    for (int64_t h = 0; h < H; h++) {
        if (tr)
            for (int64_t i = 0; i < HW; i++)
                for (int64_t j = 0; j < dh; j++) t[j * HW + i] = x[i * I + h * dh + j];
        else
            for (int64_t i = 0; i < HW; i++)
                memcpy(t + i * dh, x + i * I + h * dh, (size_t)dh * sizeof(float));
        if (vitc__pweight_pack(&p[h], t, tr ? dh : HW, tr ? HW : dh, VITC_PRECISION_FP32) !=
            VITC_OK)
            return 0;
    }
    return 1;
}

/* c's per-head packs of its keys and values (left NULL when they cannot
 * be made: the prompt falls back to attend_kv). */
static void pack_heads(struct vitc__sam_dec_cache *c, int64_t HW, int64_t I, int64_t I2,
                       int64_t H) {
    const int64_t dh = I / H, dh2 = I2 / H;
    if (!vitc__gemm_pack_kernel())
        return;
    /* [HW, dh] or [dh, HW] or [HW, dh2] */
    float *t = malloc((size_t)(HW * (dh > dh2 ? dh : dh2)) * sizeof(float));
    c->kh = calloc((size_t)H, sizeof *c->kh);
    c->vh = calloc((size_t)H, sizeof *c->vh);
    c->qh = calloc((size_t)H, sizeof *c->qh);
    c->H = H;
    int ok = t && c->kh && c->vh && c->qh && vitc__sam_pack_slices(c->kh, c->k, HW, I, H, 0, t) &&
             vitc__sam_pack_slices(c->vh, c->v, HW, I, H, 1, t) &&
             vitc__sam_pack_slices(c->qh, c->q, HW, I2, H, 0, t);
    free(t);
    if (!ok) {
        vitc__sam_free_packs(c->kh, H);
        vitc__sam_free_packs(c->vh, H);
        vitc__sam_free_packs(c->qh, H);
        c->kh = c->vh = c->qh = NULL;
    }
}

/* The second layer's token -> image attention's image side, per head
 * packed (c->t1[0..2]: CK_h, PK_h [HW, dh], CV_h^T [dh, HW]; see t1_make),
 * and its image -> token queries' (c->t1[3..4]: CQ_h, PQ_h [HW, dh]):
 * left NULL when it cannot be made (the folded form runs then). */
static void pack_t1(struct vitc__sam_dec_cache *c, const vitc__sam_dec *d, int64_t HW) {
    const sam_attn *a = &d->layers[1].t2i;
    const int64_t C = d->C, I = a->I, H = d->heads;
    float *x = malloc((size_t)(HW * I) * sizeof(float));
    float *pb = malloc((size_t)(HW * C) * sizeof(float)); /* pe + b0 */
    float *t = malloc((size_t)(HW * (I / H)) * sizeof(float));
    int ok = x && pb && t;
    for (int k = 0; ok && k < 5; k++) ok = (c->t1[k] = calloc((size_t)H, sizeof **c->t1)) != NULL;
    if (ok) {
        for (int64_t i = 0; i < HW; i++)
            add_rows(pb + i * C, d->pe_img + i * C, d->layers[0].ln4.b, C);
        vitc__linear(x, I, c->K0, C, d->t1_wk, NULL, NULL, 0, HW, I, C);
        ok = vitc__sam_pack_slices(c->t1[0], x, HW, I, H, 0, t);
        vitc__linear(x, I, pb, C, a->k.w, NULL, NULL, 0, HW, I, C);
        ok = ok && vitc__sam_pack_slices(c->t1[1], x, HW, I, H, 0, t);
        vitc__linear(x, I, c->K0, C, d->t1_wv, NULL, NULL, 0, HW, I, C);
        ok = ok && vitc__sam_pack_slices(c->t1[2], x, HW, I, H, 1, t);
        /* the image -> token queries (that attention's I equals this one's) */
        vitc__linear(x, I, c->K0, C, d->t1_wq, NULL, NULL, 0, HW, I, C);
        ok = ok && vitc__sam_pack_slices(c->t1[3], x, HW, I, H, 0, t);
        vitc__linear(x, I, pb, C, d->layers[1].i2t.q.w, NULL, NULL, 0, HW, I, C);
        ok = ok && vitc__sam_pack_slices(c->t1[4], x, HW, I, H, 0, t);
    }
    free(x), free(pb), free(t);
    if (!ok)
        for (int k = 0; k < 5; k++) vitc__sam_free_packs(c->t1[k], H), c->t1[k] = NULL;
}

/* The final attention's image side, per head packed (c->fin; see
 * fin_make): left NULL when it cannot be made. */
static void pack_fin(struct vitc__sam_dec_cache *c, const vitc__sam_dec *d, int64_t HW) {
    const sam_attn *a = &d->final;
    const int64_t C = d->C, I = a->I, H = d->heads;
    float *x = malloc((size_t)(HW * I) * sizeof(float));
    float *t = malloc((size_t)(HW * (I / H)) * sizeof(float));
    int ok = x && t;
    for (int k = 0; ok && k < 3; k++) ok = (c->fin[k] = calloc((size_t)H, sizeof **c->fin)) != NULL;
    if (ok) {
        vitc__linear(x, I, c->K0, C, d->fin_w[0], NULL, NULL, 0, HW, I, C);
        ok = vitc__sam_pack_slices(c->fin[0], x, HW, I, H, 0, t);
        vitc__linear(x, I, d->pe_img, C, a->k.w, NULL, NULL, 0, HW, I, C);
        ok = ok && vitc__sam_pack_slices(c->fin[1], x, HW, I, H, 0, t);
        vitc__linear(x, I, c->K0, C, d->fin_w[2], NULL, NULL, 0, HW, I, C);
        ok = ok && vitc__sam_pack_slices(c->fin[2], x, HW, I, H, 1, t);
    }
    free(x), free(t);
    if (!ok)
        for (int k = 0; k < 3; k++) vitc__sam_free_packs(c->fin[k], H), c->fin[k] = NULL;
}

/* e's cache for d; NULL when out of memory or made by another decoder
 * (the prompt then runs without it). */
static const struct vitc__sam_dec_cache *image_cache(const vitc__sam_dec *d,
                                                     const struct vitc_sam_image *e) {
    struct vitc__sam_dec_cache **slot = &((struct vitc_sam_image *)(uintptr_t)e)->dec_cache;
    struct vitc__sam_dec_cache *c = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!c) {
        const sam_attn *a = &d->layers[0].t2i, *b = &d->layers[0].i2t;
        const int64_t HW = e->h * e->w, C = d->C, I = a->I;
        c = calloc(1, sizeof *c);
        if (c) {
            c->K0 = malloc((size_t)(HW * C) * sizeof(float));
            c->kk0 = malloc((size_t)(HW * C) * sizeof(float));
            c->k = malloc((size_t)(HW * I) * sizeof(float));
            c->v = malloc((size_t)(HW * I) * sizeof(float));
            c->q = malloc((size_t)(HW * b->I) * sizeof(float));
        }
        if (!c || !c->K0 || !c->kk0 || !c->k || !c->v || !c->q) {
            vitc__sam_dec_cache_free(c);
            return NULL;
        }
        c->d = d;
        for (int64_t i = 0; i < HW; i++)
            add_rows(c->K0 + i * C, e->emb_cl + i * C, d->no_mask, C);
        add_rows(c->kk0, c->K0, d->pe_img, HW * C);
        lin(c->k, I, c->kk0, C, &a->k, NULL, 0, HW, I, C);
        lin(c->v, I, c->K0, C, &a->v, NULL, 0, HW, I, C);
        lin(c->q, b->I, c->kk0, C, &b->q, NULL, 0, HW, b->I, C);
        pack_heads(c, HW, I, b->I, d->heads);
        if (d->upf_w && (c->P0 = malloc((size_t)(HW * C) * sizeof(float))))
            vitc__linear(c->P0, C, c->K0, C, d->upf_w, NULL, NULL, 0, HW, C, C);
        if (c->P0 && c->kh && d->t1_wk)
            pack_t1(c, d, HW);
        if (c->t1[0] && d->fin_c)
            pack_fin(c, d, HW);
        if (c->fin[0] && d->n_layers == 2)
            vitc__sam_sf_cache(c, d, HW);
        struct vitc__sam_dec_cache *expected = NULL;
        if (!__atomic_compare_exchange_n(slot, &expected, c, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE)) {
            vitc__sam_dec_cache_free(c);
            c = expected;
        }
    }
    return c->d == d ? c : NULL;
}

/* y [Lq, C] = out_proj(attention(q_proj(xq), k_proj(xk), v_proj(xv))) + res
 * (res may be NULL; it may not be y). */
static vitc_status attend_kv(const vitc__sam_dec *d, const sam_attn *a, sam_run *r, float *y,
                             const float *res, const float *xq, int64_t Lq, const float *k,
                             const float *v, int64_t Lk);

static vitc_status attend(const vitc__sam_dec *d, const sam_attn *a, sam_run *r, float *y,
                          const float *res, const float *xq, int64_t Lq, const float *xk,
                          const float *xv, int64_t Lk) {
    const int64_t C = d->C, I = a->I;
    lin(r->ak, I, xk, C, &a->k, NULL, 0, Lk, I, C);
    lin(r->av, I, xv, C, &a->v, NULL, 0, Lk, I, C);
    return attend_kv(d, a, r, y, res, xq, Lq, r->ak, r->av, Lk);
}

/* attend with the keys and values already projected: k, v [Lk, I]. */
static vitc_status attend_kv(const vitc__sam_dec *d, const sam_attn *a, sam_run *r, float *y,
                             const float *res, const float *xq, int64_t Lq, const float *k,
                             const float *v, int64_t Lk) {
    const int64_t C = d->C, I = a->I, dh = I / d->heads;
    lin(r->aq, I, xq, C, &a->q, NULL, 0, Lq, I, C);
    vitc__sdpa_desc s;
    memset(&s, 0, sizeof s);
    s.B = 1, s.H = d->heads, s.L = Lq, s.S = Lk, s.D = dh, s.Dv = dh;
    s.q = r->aq, s.q_sh = dh, s.q_sr = I;
    s.k = k, s.k_sh = dh, s.k_sr = I;
    s.v = v, s.v_sh = dh, s.v_sr = I;
    s.o = r->ao, s.o_sh = dh, s.o_sr = I;
    s.scale = (float)(1.0 / sqrt((double)dh));
    VITC_TRY(vitc__sdpa(&s));
    lin(y, C, r->ao, I, &a->o, res, C, Lq, C, I);
    return VITC_OK;
}

/* The first layer's token -> image attention on an image's cache, per
 * head S_h = q_h k_h^T [Lq, HW], softmax, o_h = P_h v_h: two GEMMs a head
 * against the cache's packs (sdpa's kernel does a few query rows poorly,
 * and packs the keys and values per call). */
typedef struct t2i0_ctx {
    const struct vitc__sam_dec_cache *c;
    const float *q; /* [Lq, I] */
    float *S;       /* [H, Lq, HW] */
    float *o;       /* [Lq, I] */
    int64_t Lq, HW, I, dh;
    float scale;
    _Atomic int failed;
} t2i0_ctx;

static void t2i0_head(void *vc, int64_t h, int tid) {
    t2i0_ctx *c = vc;
    (void)tid;
    float *S = c->S + h * c->Lq * c->HW;
    /* W: never read, the packs being the current kernel's (t2i0_packed) */
    const vitc__pweight *kp = &c->c->kh[h], *vp = &c->c->vh[h];
    if (vitc__linear_pw(S, c->HW, c->q + h * c->dh, c->I, kp, kp->data, NULL, NULL, 0, c->Lq,
                        c->HW, c->dh, VITC__ACT_NONE) != VITC_OK) {
        c->failed = 1;
        return;
    }
    vitc__softmax_rows(S, c->Lq, c->HW, c->scale);
    if (vitc__linear_pw(c->o + h * c->dh, c->I, S, c->HW, vp, vp->data, NULL, NULL, 0, c->Lq,
                        c->dh, c->HW, VITC__ACT_NONE) != VITC_OK)
        c->failed = 1;
}

/* Whether t2i0_packed can run: the cache has its packs, made for the
 * kernel in use, and r->ak holds the H scores [Lq, HW]. */
static int t2i0_packs_usable(const vitc__sam_dec *d, const sam_attn *a, const sam_run *r,
                             int64_t Lq) {
    const struct vitc__sam_dec_cache *c = r->c0;
    return c && c->kh && c->H == d->heads && c->kh[0].kern &&
           c->kh[0].kern == vitc__gemm_pack_kernel() && d->heads * Lq <= a->I &&
           strcmp(vitc__nn_dense_path(), "ref") != 0;
}

/* y [Lq, C] = out_proj(attention(q_proj(xq), cached k, v)) + res. */
static vitc_status t2i0_packed(const vitc__sam_dec *d, const sam_attn *a, sam_run *r, float *y,
                               const float *res, const float *xq, int64_t Lq) {
    const int64_t C = d->C, I = a->I, dh = I / d->heads;
    lin(r->aq, I, xq, C, &a->q, NULL, 0, Lq, I, C);
    t2i0_ctx c = {.c = r->c0, .q = r->aq, .S = r->ak, .o = r->ao, .Lq = Lq, .HW = r->HW,
                  .I = I, .dh = dh, .scale = (float)(1.0 / sqrt((double)dh))};
    sam_tasks(d->heads, t2i0_head, &c);
    if (c.failed)
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM token -> image attention: a GEMM refused "
                         "its arguments");
    lin(y, C, r->ao, I, &a->o, res, C, Lq, C, I);
    return VITC_OK;
}

/* y [M, N] = alpha a [M, K] (row stride lda) @ op(b) where b is [K, N]
 * (ldb, bt 0) or [N, K] (bt 1): the token-side products of the folded
 * attentions (M a few tokens, K a head's width), too small to be worth a
 * dispatch to the thread pool and the GEMM's packing. */
static void small_mm(float *y, int64_t ldy, const float *a, int64_t lda, const float *b,
                     int64_t ldb, int bt, int64_t M, int64_t N, int64_t K, float alpha) {
    /* b's rows against a's: the kernels' dot_rows (their sums side by side
     * cost a fifth of one horizontal sum each), a's rows copied together
     * a few at a time */
    float w[4096];
    const int64_t g = bt && K > 0 && K <= 4096 ? 4096 / K : 0;
    for (int64_t i0 = 0; g && i0 < M; i0 += g) {
        const int64_t n = M - i0 < g ? M - i0 : g;
        for (int64_t i = 0; i < n; i++)
            memcpy(w + i * K, a + (i0 + i) * lda, (size_t)K * sizeof(float));
        vitc__dot_rows(y + i0 * ldy, ldy, b, ldb, w, n, K, N);
        if (alpha != 1.0f)
            for (int64_t i = i0; i < i0 + n; i++)
                for (int64_t j = 0; j < N; j++) y[i * ldy + j] *= alpha;
    }
    for (int64_t i = 0; !g && i < M; i++) {
        float *yi = y + i * ldy;
        if (bt) {
            for (int64_t j = 0; j < N; j++) yi[j] = alpha * dot8(a + i * lda, b + j * ldb, K);
        } else {
            for (int64_t j = 0; j < N; j++) yi[j] = 0.0f;
            for (int64_t k = 0; k < K; k++) axpy_row(yi, alpha * a[i * lda + k], b + k * ldb, N);
        }
    }
}

/* Whether the attention with Lq queries over Lk keys (one side the few
 * tokens, the other the image) is cheaper folded: the literal form
 * projects the image rows to I (2 HW C I multiply-adds), the folded one
 * multiplies them by one C-wide vector per (head, token) (2 H T HW C), so
 * it pays while H T <= I (16 tokens for SAM's 8 heads and I = 128). This
 * also bounds the folded scores [HW, H T] by the literal projections'
 * [HW, I] scratch. VITC_DENSE=ref keeps the literal form, which the tests
 * compare with. */
static int fold_pays(const vitc__sam_dec *d, const sam_attn *a, int64_t T) {
    return d->heads * T <= a->I && strcmp(vitc__nn_dense_path(), "ref") != 0;
}

/* Token -> image attention with the image never projected. Per head h,
 * the scores q_h (W_k,h x + b_k,h)^T = (W_k,h^T q_h) . x^T + q_h . b_k,h:
 * the last term is constant along a softmax row and drops out, so the
 * query is folded into a C-wide vector and scores the raw rows xk. The
 * values: P (x W_v,h^T + b_v,h) = (P x) W_v,h^T + b_v,h since P's rows sum
 * to 1, so the softmax averages the raw rows xv first and the projection
 * runs on T rows. y [Lq, C] = out_proj(...) + res. */
static void attend_t2i_folded(const vitc__sam_dec *d, const sam_attn *a, sam_run *r, float *y,
                              const float *res, const float *xq, int64_t Lq, const float *xk,
                              const float *xv, int64_t Lk) {
    const int64_t C = d->C, I = a->I, H = d->heads, dh = I / H;
    const float scale = (float)(1.0 / sqrt((double)dh));
    float *q = r->aq;            /* [Lq, I] */
    float *qk = r->aq + Lq * I;  /* [H, Lq, C] the folded queries */
    float *S = r->ak;            /* [H, Lq, Lk] */
    float *px = r->av;           /* [H, Lq, C] P x per head */
    lin(q, I, xq, C, &a->q, NULL, 0, Lq, I, C);
    for (int64_t h = 0; h < H; h++)
        small_mm(qk + h * Lq * C, C, q + h * dh, I, a->k.w + h * dh * C, C, 0, Lq, C, dh, scale);
    vitc__gemm(0, 1, H * Lq, Lk, C, 1.0f, qk, C, xk, C, 0.0f, S, Lk);
    vitc__softmax_rows(S, H * Lq, Lk, 1.0f);
    vitc__gemm(0, 0, H * Lq, C, Lk, 1.0f, S, Lk, xv, C, 0.0f, px, C);
    for (int64_t h = 0; h < H; h++) {
        small_mm(r->ao + h * dh, I, px + h * Lq * C, C, a->v.w + h * dh * C, C, 1, Lq, dh, C,
                 1.0f);
        for (int64_t t = 0; t < Lq; t++)
            for (int64_t j = 0; j < dh; j++) r->ao[t * I + h * dh + j] += a->v.b[h * dh + j];
    }
    lin(y, C, r->ao, I, &a->o, res, C, Lq, C, I);
}

/* s = rho (s + ss + c1 - mu c2) + sp + c3 over n floats (the second
 * layer's scores from their parts), fixed-8 loops as add_rows. */
static void t1_scores(float *restrict s, const float *restrict ss, const float *restrict sp,
                      const float *restrict rho, const float *restrict mu, float c1, float c2,
                      float c3, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[i + k] = rho[i + k] * (s[i + k] + ss[i + k] + c1 - mu[i + k] * c2) + sp[i + k] + c3;
    for (; i < n; i++) s[i] = rho[i] * (s[i] + ss[i] + c1 - mu[i] * c2) + sp[i] + c3;
}

/* p *= rho over n floats; returns sum(p rho) and, in *pm, sum(p rho mu). */
static float t1_weigh(float *restrict p, const float *restrict rho, const float *restrict mu,
                      int64_t n, float *pm) {
    float a[8] = {0}, b[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            p[i + k] *= rho[i + k];
            a[k] += p[i + k], b[k] += p[i + k] * mu[i + k];
        }
    float sa = 0, sb = 0;
    for (int k = 0; k < 8; k++) sa += a[k], sb += b[k];
    for (; i < n; i++) p[i] *= rho[i], sa += p[i], sb += p[i] * mu[i];
    *pm = sb;
    return sa;
}

/* The second layer's scores through the first layer's LayerNorm, one
 * head: S_h [T, HW] = rho (x_h CA_h^T + ss + x_h . g_h - mu x_h . h_h) +
 * x_h PA_h^T (+ x_h . bias_h), CA_h and PA_h the image cache's t1[pk],
 * t1[pk + 1] packs; x the token side (the queries for the token -> image
 * attention, the keys for the image -> token one). */
typedef struct t1_ctx {
    const sam_run *r;
    const float *x;         /* [T, I] */
    const float *ss;        /* [H T, HW] the first layer's probabilities' part */
    float *S, *sp;          /* [H T, HW] the scores, the positions' part */
    const float *g, *hs;    /* [I] each: x . g and x . hs per row, see above */
    const float *bias;      /* [I] or NULL */
    int pk;                 /* the packs: c0->t1[pk], t1[pk + 1] */
    float *o;               /* token -> image: [T, I] the output */
    /* token -> image: [H T, 2] sum(P rho), sum(P rho mu); final: [H T, 4]
     * sum(P alpha), sum(P alpha mu0), sum(P rho1), sum(P rho1 mu1) */
    float *sums;
    const float *ss1;       /* final: [H T, HW] the second layer's part */
    float *pg;              /* final: [H T, HW] P rho1 */
    const float *cst;       /* final: the decoder's fin_c */
    int64_t T, HW, I, dh;
    float scale;
    _Atomic int failed;
} t1_ctx;

static int t1_head_scores(t1_ctx *c, int64_t h) {
    const struct vitc__sam_dec_cache *k = c->r->c0;
    const vitc__pweight *ca = &k->t1[c->pk][h], *pa = &k->t1[c->pk + 1][h];
    const int64_t T = c->T, HW = c->HW, dh = c->dh, I = c->I;
    float *S = c->S + h * T * HW, *sp = c->sp + h * T * HW;
    /* W: never read, the packs being the current kernel's */
    if (vitc__linear_pw(S, HW, c->x + h * dh, I, ca, ca->data, NULL, NULL, 0, T, HW, dh,
                        VITC__ACT_NONE) != VITC_OK ||
        vitc__linear_pw(sp, HW, c->x + h * dh, I, pa, pa->data, NULL, NULL, 0, T, HW, dh,
                        VITC__ACT_NONE) != VITC_OK)
        return 0;
    for (int64_t t = 0; t < T; t++) {
        const float *xt = c->x + t * I + h * dh;
        float c1 = 0, c2 = 0, c3 = 0;
        for (int64_t j = 0; j < dh; j++) {
            c1 += xt[j] * c->g[h * dh + j], c2 += xt[j] * c->hs[h * dh + j];
            c3 += c->bias ? xt[j] * c->bias[h * dh + j] : 0.0f;
        }
        t1_scores(S + t * HW, c->ss + (h * T + t) * HW, sp + t * HW, c->r->f.rho0, c->r->f.mu0,
                  c1, c2, c3, HW);
    }
    return 1;
}

/* token -> image: the scores, their softmax, P rho and the CV product */
static void t1_head(void *vc, int64_t h, int tid) {
    t1_ctx *c = vc;
    const struct vitc__sam_dec_cache *k = c->r->c0;
    const int64_t T = c->T, HW = c->HW, dh = c->dh, I = c->I;
    float *S = c->S + h * T * HW;
    (void)tid;
    if (!t1_head_scores(c, h)) {
        c->failed = 1;
        return;
    }
    vitc__softmax_rows(S, T, HW, c->scale);
    for (int64_t t = 0; t < T; t++) {
        float *sm = c->sums + 2 * (h * T + t);
        sm[0] = t1_weigh(S + t * HW, c->r->f.rho0, c->r->f.mu0, HW, &sm[1]);
    }
    if (vitc__linear_pw(c->o + h * dh, I, S, HW, &k->t1[2][h], k->t1[2][h].data, NULL, NULL, 0,
                        T, dh, HW, VITC__ACT_NONE) != VITC_OK)
        c->failed = 1;
}

/* Two independent products side by side, one a thread: a few dozen rows
 * and columns over K = HW leave the GEMM few tiles to share, and split
 * over two threads one such product ran slower than on one (measured:
 * [32, 4096] x [4096, 56] 353 us on two threads, 269 us on one). With B
 * stored [N, K] (tb) each runs transposed, C^T = B A^T into a buffer then
 * copied over: A's rows are then the columns, and 32 of them make one
 * whole strip of the microkernel and its fast packer (167 us against 254
 * for [32, 4096] x [4096, 56] on one thread). */
typedef struct gemm2_ctx {
    int tb[2];
    int64_t M[2], N, K, lda, ldb[2], ldc;
    const float *A[2], *B[2];
    float *C[2];
    float *t[2]; /* [N, M[i]] each, for tb */
} gemm2_ctx;

static void gemm2_one(void *vc, int64_t i, int tid) {
    const gemm2_ctx *c = vc;
    (void)tid;
    if (!c->tb[i] || !c->t[i]) {
        vitc__gemm(0, c->tb[i], c->M[i], c->N, c->K, 1.0f, c->A[i], c->lda, c->B[i], c->ldb[i],
                   0.0f, c->C[i], c->ldc);
        return;
    }
    const int64_t M = c->M[i], N = c->N;
    vitc__gemm(0, 1, N, M, c->K, 1.0f, c->B[i], c->ldb[i], c->A[i], c->lda, 0.0f, c->t[i], M);
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; j < N; j++) c->C[i][r * c->ldc + j] = c->t[i][j * M + r];
}

/* gemm2_one on both, their buffers from the heap (without them: the
 * products untransposed). */
static void gemm2(gemm2_ctx *g) {
    float *t = malloc((size_t)(g->N * (g->M[0] + g->M[1])) * sizeof(float));
    g->t[0] = t, g->t[1] = t ? t + g->N * g->M[0] : NULL;
    sam_tasks(2, gemm2_one, g);
    free(t);
}

/* Whether attend_t2i_layer1 can run on r: the fold's record of the first
 * layer, the image cache's t1 packs for the kernel in use, room in aq. */
static int t1_usable(const vitc__sam_dec *d, const sam_attn *a, const sam_run *r, int64_t T) {
    const int64_t I = a->I, HT = d->heads * T;
    const struct vitc__sam_dec_cache *c = r->c0;
    return r->f.on && c && c->t1[0] && c->H == d->heads &&
           c->t1[0][0].kern == vitc__gemm_pack_kernel() && d->t1_wk &&
           2 * T * I + 2 * HT * I + 2 * HT * HT + 2 * HT <= r->abuf;
}

/* The second layer's token -> image attention with its image side K_1 =
 * LN_0(K_0 + S_0 vo_0 + beta_0) never projected: per row p, with rho, mu
 * that LayerNorm's 1 / std and mean,
 *   W_k (K_1 + pe)_p = rho_p (CK_p + S_0,p AK + g_k - mu_p h_k) + PK_p
 *   W_v K_1,p + b_v = rho_p (CV_p + S_0,p AV + g_v - mu_p h_v) + bv'
 * (CK, PK, CV per image in the cache; AK = vo_0 t1_wk^T and AV = vo_0
 * t1_wv^T [H T, I] per prompt; g, h, bv' the decoder's t1_c). So the image
 * side costs a head's CK_h, PK_h and CV_h products (2 HW dh T each) and
 * two products with S_0 [HW, H T] over all heads, instead of the fold's
 * two over K_1 [HW, C]. y [T, C] = out_proj(...) + res. */
static vitc_status attend_t2i_layer1(const vitc__sam_dec *d, const sam_attn *a, sam_run *r,
                                     float *y, const float *res, const float *xq, int64_t T) {
    const int64_t C = d->C, I = a->I, H = d->heads, dh = I / H, HT = H * T, HW = r->HW;
    const int st = (int)(r->f.St & 1); /* S_0 stored [H T, HW] */
    const float *S0 = r->f.S;
    float *q = r->aq;           /* [T, I] */
    float *AK = q + T * I;      /* [H T, I] */
    float *AV = AK + HT * I;    /* [H T, I] */
    float *ZQ = AV + HT * I;    /* [H T (h, t), H T]: q_h,t . AK_j,h */
    float *PS = ZQ + HT * HT;   /* [H T, H T]: (P rho) S_0 */
    float *o = PS + HT * HT;    /* [T, I] */
    float *sums = o + T * I;    /* [H T, 2] */
    lin(q, I, xq, C, &a->q, NULL, 0, T, I, C);
    fold_lin(AK, r->f.V0, HT, d->t1_wk, &d->fold_pw[0], I, C);
    fold_lin(AV, r->f.V0, HT, d->t1_wv, &d->fold_pw[1], I, C);
    for (int64_t h = 0; h < H; h++)
        small_mm(ZQ + h * T * HT, HT, q + h * dh, I, AK + h * dh, I, 1, T, HT, dh, 1.0f);
    /* ss [H T, HW] = ZQ S_0^T */
    vitc__gemm(0, !st, HT, HW, HT, 1.0f, ZQ, HT, S0, st ? HW : HT, 0.0f, r->av, HW);
    t1_ctx c = {.r = r, .x = q, .ss = r->av, .S = r->ak, .sp = r->ao, .g = d->t1_c,
                .hs = d->t1_c + I, .pk = 0, .o = o, .sums = sums, .T = T, .HW = HW, .I = I,
                .dh = dh, .scale = (float)(1.0 / sqrt((double)dh))};
    sam_tasks(H, t1_head, &c);
    if (c.failed)
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM token -> image attention: a GEMM refused "
                         "its arguments");
    /* PS = (P rho) S_0, its first 32 rows and the rest side by side (gemm2) */
    const int64_t M0 = HT > 32 ? 32 : HT / 2; /* a whole strip transposed (gemm2) */
    gemm2_ctx g2 = {.tb = {st, st}, .M = {M0, HT - M0}, .N = HT, .K = HW, .lda = HW,
                    .ldb = {st ? HW : HT, st ? HW : HT}, .ldc = HT, .A = {r->ak, r->ak + M0 * HW},
                    .B = {S0, S0}, .C = {PS, PS + M0 * HT}};
    gemm2(&g2);
    float *tmp = r->av; /* [T, dh] */
    for (int64_t h = 0; h < H; h++) {
        small_mm(tmp, dh, PS + h * T * HT, HT, AV + h * dh, I, 0, T, dh, HT, 1.0f);
        for (int64_t t = 0; t < T; t++) {
            const float *sm = sums + 2 * (h * T + t), *cs = d->t1_c;
            for (int64_t j = 0; j < dh; j++) {
                const int64_t m = h * dh + j;
                o[t * I + m] += tmp[t * dh + j] + sm[0] * cs[2 * I + m] - sm[1] * cs[3 * I + m] +
                                cs[4 * I + m];
            }
        }
    }
    lin(y, C, o, I, &a->o, res, C, T, C, I);
    return VITC_OK;
}

/* The token side of attend_i2t_*: k and v [Lk, I] projected into r->aq,
 * and each head's values through out_proj, vo [H, Lk, C] (the last
 * GEMM's B, not transposed). */
static void i2t_token_side(const vitc__sam_dec *d, const sam_attn *a, sam_run *r, float *vo,
                           const float *xk, const float *xv, int64_t Lk) {
    const int64_t C = d->C, I = a->I, H = d->heads, dh = I / H;
    float *k = r->aq, *v = r->aq + Lk * I;
    r->tv = v, r->vo = vo;
    lin(k, I, xk, C, &a->k, NULL, 0, Lk, I, C);
    lin(v, I, xv, C, &a->v, NULL, 0, Lk, I, C);
    for (int64_t h = 0; h < H; h++)
        small_mm(vo + h * Lk * C, C, v + h * dh, I, a->o.w + h * dh, I, 1, Lk, C, dh, 1.0f);
}

/* y [Lq, C] = S [Lq, H T] vo [H T, C] + beta y: beta 1 adds into the
 * residual already in y (a GEMM accumulating reads it once; the
 * epilogue's residual read cost more), beta 0 leaves the residual to the
 * LayerNorm's pass after, as out_proj's bias always is. */
static void i2t_out(float *y, const float *S, const float *vo, int64_t Lq, int64_t C,
                    int64_t HT, float beta) {
    vitc__gemm(0, 0, Lq, C, HT, 1.0f, S, HT, vo, C, beta, y, C);
}

/* Image -> token attention with the image side never projected: the
 * query projection is folded into the keys (scores x . (W_q,h^T k_h)^T +
 * b_q,h . k_h, a [C] vector and a bias per (head, token)), the output
 * projection into the values (v_h W_o,h^T: [T, C] per head), so the HW
 * image rows meet only xq [HW, C] @ [C, H T] and P [HW, H T] @ [H T, C].
 * y [Lq, C] = out_proj(...) + beta y without out_proj's bias (i2t_out). */
static void attend_i2t_folded(const vitc__sam_dec *d, const sam_attn *a, sam_run *r, float *y,
                              float beta, const float *xq, int64_t Lq, const float *xk,
                              const float *xv, int64_t Lk, float *S) {
    const int64_t C = d->C, I = a->I, H = d->heads, dh = I / H, HT = H * Lk;
    const float scale = (float)(1.0 / sqrt((double)dh));
    const float *k = r->aq;     /* [Lk, I] */
    float *kq = r->av;          /* [H, Lk, C] the folded keys */
    float *vo = r->av + HT * C; /* [H, Lk, C] the values through out_proj */
    float *kb = r->ao;          /* [H, Lk] the scores' bias */
    /* S [Lq, H, Lk] */
    i2t_token_side(d, a, r, vo, xk, xv, Lk);
    for (int64_t h = 0; h < H; h++) {
        small_mm(kq + h * Lk * C, C, k + h * dh, I, a->q.w + h * dh * C, C, 0, Lk, C, dh, scale);
        for (int64_t t = 0; t < Lk; t++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < dh; j++) acc += a->q.b[h * dh + j] * k[t * I + h * dh + j];
            kb[h * Lk + t] = scale * acc;
        }
    }
    /* kq is in nn.Linear's [out, in] layout: the bias rides in the GEMM's
     * epilogue */
    vitc__linear(S, HT, xq, C, kq, kb, NULL, 0, Lq, HT, C);
    /* rows of Lk: one softmax per (image row, head) */
    vitc__softmax_rows_short(S, Lq * H, Lk);
    i2t_out(y, S, vo, Lq, C, HT, beta);
}

typedef struct i2tc_ctx {
    const struct vitc__sam_dec_cache *c;
    const float *k; /* [Lk, I] */
    float *S;       /* [H, Lk, Lq] */
    int64_t Lq, Lk, I, dh;
    float scale;
    _Atomic int failed;
} i2tc_ctx;

static void i2tc_head(void *vc, int64_t h, int tid) {
    i2tc_ctx *t = vc;
    float *S = t->S + h * t->Lk * t->Lq;
    const vitc__pweight *qp = &t->c->qh[h];
    (void)tid;
    /* W: never read, the pack being the current kernel's */
    if (vitc__linear_pw(S, t->Lq, t->k + h * t->dh, t->I, qp, qp->data, NULL, NULL, 0, t->Lk,
                        t->Lq, t->dh, VITC__ACT_NONE) != VITC_OK) {
        t->failed = 1;
        return;
    }
    vitc__softmax_cols(S, t->Lk, t->Lq, t->Lq, t->scale);
}

/* Whether attend_i2t_cached's scores run transposed against the cache's
 * per-head query packs (made for the kernel in use), each head's softmax
 * down its columns: then it returns 1. The statistics (sam_stats.c) need
 * that layout, so vitc__sam_dec_predict asks this before turning them on. */
static int i2tc_usable(const vitc__sam_dec *d, const sam_run *r, int64_t Lk) {
    const struct vitc__sam_dec_cache *c = r->c0;
    return c && c->qh && c->H == d->heads && c->qh[0].kern == vitc__gemm_pack_kernel() &&
           Lk <= VITC_SOFTMAX_SHORT;
}

/* attend_i2t_folded for the first layer on an image's cache: its queries
 * q_proj(kk0) are prompt-independent and cached (q [Lq, I]), so the
 * scores are the literal per-head products q_h k_h^T (2 H T Lq dh
 * multiply-adds, a C / dh-th of the folded keys' Lq C H T) and only the
 * output projection stays folded into the values. y as attend_i2t_folded. */
static int attend_i2t_cached(const vitc__sam_dec *d, const sam_attn *a, sam_run *r, float *y,
                             float beta, const float *q, int64_t Lq, const float *xk,
                             const float *xv, int64_t Lk, float *S) {
    const int64_t C = d->C, I = a->I, H = d->heads, dh = I / H, HT = H * Lk;
    const float scale = (float)(1.0 / sqrt((double)dh));
    const float *k = r->aq; /* [Lk, I] */
    float *vo = r->av;      /* [H, Lk, C] the values through out_proj */
    /* S [Lq, H, Lk], or transposed (returns 1) */
    i2t_token_side(d, a, r, vo, xk, xv, Lk);
    const struct vitc__sam_dec_cache *c = r->c0;
    if (i2tc_usable(d, r, Lk)) {
        /* the scores transposed, S^T [H, Lk, Lq] = k_h q_h^T against the
         * cache's packs (nothing of the image packed), each head's
         * softmax down its columns while they are in cache */
        i2tc_ctx t = {.c = c, .k = k, .S = S, .Lq = Lq, .Lk = Lk, .I = I, .dh = dh,
                      .scale = scale};
        sam_tasks(H, i2tc_head, &t);
        if (!t.failed) {
            if (y) /* else the statistics alone are read (sam_stats.c) */
                vitc__gemm(1, 0, Lq, C, HT, 1.0f, S, Lq, vo, C, beta, y, C);
            return 1;
        }
    }
    for (int64_t h = 0; h < H; h++)
        vitc__gemm(0, 1, Lq, Lk, dh, scale, q + h * dh, I, k + h * dh, I, 0.0f, S + h * Lk, HT);
    vitc__softmax_rows_short(S, Lq * H, Lk);
    i2t_out(y, S, vo, Lq, C, HT, beta);
    return 0;
}

/* image -> token: the scores, each head's softmax down its columns */
static void t1q_head(void *vc, int64_t h, int tid) {
    t1_ctx *c = vc;
    (void)tid;
    if (!t1_head_scores(c, h)) {
        c->failed = 1;
        return;
    }
    vitc__softmax_cols(c->S + h * c->T * c->HW, c->T, c->HW, c->HW, c->scale);
}

/* Whether attend_i2t_layer1 can run on r (as t1_usable). */
static int t1q_usable(const vitc__sam_dec *d, const sam_attn *a, const sam_run *r, int64_t T) {
    const int64_t I = a->I, HT = d->heads * T;
    const struct vitc__sam_dec_cache *c = r->c0;
    return r->f.on && c && c->t1[3] && c->H == d->heads &&
           c->t1[3][0].kern == vitc__gemm_pack_kernel() && d->t1_wq && T <= VITC_SOFTMAX_SHORT &&
           2 * T * I + HT * I + HT * HT <= r->abuf;
}

/* The second layer's image -> token attention with its queries read
 * through the first layer's LayerNorm, as attend_t2i_layer1 its keys:
 *   W_q (K_1 + pe)_p + b_q = rho_p (CQ_p + S_0,p AQ + g_q - mu_p h_q) + PQ_p + b_q
 * so a head's scores S_h^T [T, HW] are k_h's products with its CQ_h and
 * PQ_h packs and the S_0 part one product for all heads; each head's
 * softmax runs down its columns (over the tokens). The output stays
 * S vo, added into y (beta) as attend_i2t_folded's. S [H T, HW]: the
 * probabilities, transposed (returns 1, as attend_i2t_cached). */
static int attend_i2t_layer1(const vitc__sam_dec *d, const sam_attn *a, sam_run *r, float *y,
                             float beta, const float *xk, const float *xv, int64_t T, float *S) {
    const int64_t C = d->C, I = a->I, H = d->heads, dh = I / H, HT = H * T, HW = r->HW;
    const int st = (int)(r->f.St & 1);
    float *vo = r->av;                 /* [H, T, C] */
    i2t_token_side(d, a, r, vo, xk, xv, T);
    const float *k = r->aq;            /* [T, I] */
    float *AQ = r->aq + 2 * T * I;     /* [H T, I] */
    float *ZK = AQ + HT * I;           /* [H T (j), H T (h, t)]: AQ_j,h . k_h,t */
    fold_lin(AQ, r->f.V0, HT, d->t1_wq, &d->fold_pw[2], I, C);
    for (int64_t h = 0; h < H; h++)
        small_mm(ZK + h * T, HT, AQ + h * dh, I, k + h * dh, I, 1, HT, T, dh, 1.0f);
    /* ss [H T, HW] = ZK^T S_0^T */
    vitc__gemm(1, !st, HT, HW, HT, 1.0f, ZK, HT, r->f.S, st ? HW : HT, 0.0f, r->ak, HW);
    /* q_proj's bias meets each token's key: not constant along the
     * softmax, which runs over the tokens */
    t1_ctx c = {.r = r, .x = k, .ss = r->ak, .S = S, .sp = r->ao, .g = d->t1_c + 5 * I,
                .hs = d->t1_c + 6 * I, .bias = a->q.b, .pk = 3, .T = T, .HW = HW, .I = I,
                .dh = dh, .scale = (float)(1.0 / sqrt((double)dh))};
    sam_tasks(H, t1q_head, &c);
    if (c.failed)
        return -1;
    if (y) /* else the statistics alone are read (sam_stats.c) */
        vitc__gemm(1, 0, HW, C, HT, 1.0f, S, HW, vo, C, beta, y, C);
    return 1;
}

/* s = alpha (s + ss0 + c1 - mu0 c2) + rho1 (ss1 + c3 - mu1 c4) + sp over
 * n floats (the final attention's scores from their parts). */
static void fin_scores(float *restrict s, const float *restrict ss0, const float *restrict ss1,
                       const float *restrict sp, const float *restrict alpha,
                       const float *restrict rho1, const float *restrict mu0,
                       const float *restrict mu1, const float c[4], int64_t n) {
    const float c1 = c[0], c2 = c[1], c3 = c[2], c4 = c[3];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[i + k] = alpha[i + k] * (s[i + k] + ss0[i + k] + c1 - mu0[i + k] * c2) +
                       rho1[i + k] * (ss1[i + k] + c3 - mu1[i + k] * c4) + sp[i + k];
    for (; i < n; i++)
        s[i] = alpha[i] * (s[i] + ss0[i] + c1 - mu0[i] * c2) +
               rho1[i] * (ss1[i] + c3 - mu1[i] * c4) + sp[i];
}

/* final: the scores, their softmax, P alpha and P rho1, the CV product */
static void fin_head(void *vc, int64_t h, int tid) {
    t1_ctx *c = vc;
    const sam_run *r = c->r;
    const struct vitc__sam_dec_cache *k = r->c0;
    const vitc__pweight *ck = &k->fin[0][h], *pk = &k->fin[1][h], *cv = &k->fin[2][h];
    const int64_t T = c->T, HW = c->HW, dh = c->dh, I = c->I;
    float *S = c->S + h * T * HW, *sp = c->sp + h * T * HW, *pg = c->pg + h * T * HW;
    (void)tid;
    if (vitc__linear_pw(S, HW, c->x + h * dh, I, ck, ck->data, NULL, NULL, 0, T, HW, dh,
                        VITC__ACT_NONE) != VITC_OK ||
        vitc__linear_pw(sp, HW, c->x + h * dh, I, pk, pk->data, NULL, NULL, 0, T, HW, dh,
                        VITC__ACT_NONE) != VITC_OK) {
        c->failed = 1;
        return;
    }
    for (int64_t t = 0; t < T; t++) {
        const float *qt = c->x + t * I + h * dh;
        float cc[4] = {0};
        for (int m = 0; m < 4; m++)
            for (int64_t j = 0; j < dh; j++) cc[m] += qt[j] * c->cst[m * I + h * dh + j];
        fin_scores(S + t * HW, c->ss + (h * T + t) * HW, c->ss1 + (h * T + t) * HW, sp + t * HW,
                   r->f.alpha, r->f.rho1, r->f.mu0, r->f.mu1, cc, HW);
    }
    vitc__softmax_rows(S, T, HW, c->scale);
    for (int64_t t = 0; t < T; t++) {
        float *sm = c->sums + 4 * (h * T + t);
        memcpy(pg + t * HW, S + t * HW, (size_t)HW * sizeof(float));
        sm[2] = t1_weigh(pg + t * HW, r->f.rho1, r->f.mu1, HW, &sm[3]);
        sm[0] = t1_weigh(S + t * HW, r->f.alpha, r->f.mu0, HW, &sm[1]);
    }
    if (vitc__linear_pw(c->o + h * dh, I, S, HW, cv, cv->data, NULL, NULL, 0, T, dh, HW,
                        VITC__ACT_NONE) != VITC_OK)
        c->failed = 1;
}

/* Whether attend_final can run on r for T query rows. */
static int fin_usable(const vitc__sam_dec *d, const sam_run *r, int64_t T) {
    const int64_t I = d->final.I, HT = d->heads * r->Nt, HTf = d->heads * T;
    const struct vitc__sam_dec_cache *c = r->c0;
    return r->f.on && c && c->fin[0] && c->H == d->heads &&
           c->fin[0][0].kern == vitc__gemm_pack_kernel() && d->fin_c && HTf * 2 <= I &&
           2 * T * I + 4 * HT * I + 4 * HTf * HT + 4 * HTf <= r->abuf;
}

/* Whether the final attention takes attend_final: on the kept rows, as
 * two_way runs it (then the last layer writes no K + pe). */
static int fin_pays(const vitc__sam_dec *d, const sam_run *r) {
    return d->n_layers == 2 && r->n_keep > 0 && fold_pays(d, &d->final, r->n_keep) &&
           fin_usable(d, r, r->n_keep);
}

/* The final token -> image attention with its image side K_2 = LN_1(K_1 +
 * S_1 vo_1 + beta_1), K_1 = LN_0(K_0 + S_0 vo_0 + beta_0) never read: per
 * row p, with rho_i, mu_i those LayerNorms' 1 / std and mean and alpha =
 * rho_0 rho_1,
 *   W K_2,p = alpha (K_0 M_0 + S_0 vo_0 M_0 + g_0 - mu_0 h_0)_p
 *             + rho_1 (S_1 vo_1 M_1 + e - mu_1 h_1)_p + W b_1
 * (M_0 = (W D_1 D_0)^T, M_1 = (W D_1)^T: fin_w; the vectors fin_c), for W
 * its k and v weights, K_0's products and the positions' kept per image.
 * A head's scores are two products with its packs plus the S_0 and S_1
 * parts (one product each for all heads), its values (P alpha) CV_h plus
 * ((P alpha) S_0) AV_0,h + ((P rho_1) S_1) AV_1,h. The second layer then
 * writes no K_2 + pe, and the upscaling reads K_2 through the same
 * LayerNorms, so K_2 itself is read by nothing. y [T, C] = out_proj(...)
 * + res. */
static vitc_status attend_final(const vitc__sam_dec *d, sam_run *r, float *y, const float *res,
                                const float *xq, int64_t T) {
    const sam_attn *a = &d->final;
    const int64_t C = d->C, I = a->I, H = d->heads, dh = I / H, HT = H * r->Nt, HTf = H * T;
    const int64_t HW = r->HW;
    const int st0 = (int)(r->f.St & 1), st1 = (int)(r->f.St >> 1 & 1);
    const float *S0 = r->f.S, *S1 = r->f.S + HW * HT;
    float *q = r->aq;             /* [T, I] */
    float *A = q + T * I;         /* [4][H T, I]: AK0, AK1, AV0, AV1 */
    float *Z = A + 4 * HT * I;    /* [4][H T_f, H T]: ZQ0, ZQ1, PS0, PS1 */
    float *o = Z + 4 * HTf * HT;  /* [T, I] */
    float *sums = o + T * I;      /* [H T_f, 4] */
    lin(q, I, xq, C, &a->q, NULL, 0, T, I, C);
    for (int m = 0; m < 4; m++) /* vo_0 or vo_1 through fin_w[m] */
        fold_lin(A + m * HT * I, m % 2 ? r->f.V1 : r->f.V0, HT, d->fin_w[m], &d->fold_pw[3 + m],
                 I, C);
    for (int m = 0; m < 2; m++)
        for (int64_t h = 0; h < H; h++)
            small_mm(Z + m * HTf * HT + h * T * HT, HT, q + h * dh, I, A + m * HT * I + h * dh, I,
                     1, T, HT, dh, 1.0f);
    /* ss_i [H T_f, HW] = ZQ_i S_i^T */
    float *ss0 = r->av, *ss1 = r->av + HTf * HW, *sp = r->ao, *pg = r->ao + HTf * HW;
    vitc__gemm(0, !st0, HTf, HW, HT, 1.0f, Z, HT, S0, st0 ? HW : HT, 0.0f, ss0, HW);
    vitc__gemm(0, !st1, HTf, HW, HT, 1.0f, Z + HTf * HT, HT, S1, st1 ? HW : HT, 0.0f, ss1, HW);
    t1_ctx c = {.r = r, .x = q, .ss = ss0, .ss1 = ss1, .S = r->ak, .sp = sp, .pg = pg,
                .cst = d->fin_c, .o = o, .sums = sums, .T = T, .HW = HW, .I = I, .dh = dh,
                .scale = (float)(1.0 / sqrt((double)dh))};
    sam_tasks(H, fin_head, &c);
    if (c.failed)
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM final attention: a GEMM refused its "
                         "arguments");
    /* PS_0 = (P alpha) S_0, PS_1 = (P rho_1) S_1 */
    float *PS0 = Z + 2 * HTf * HT, *PS1 = Z + 3 * HTf * HT;
    gemm2_ctx g2 = {.tb = {st0, st1}, .M = {HTf, HTf}, .N = HT, .K = HW, .lda = HW,
                    .ldb = {st0 ? HW : HT, st1 ? HW : HT}, .ldc = HT, .A = {r->ak, pg},
                    .B = {S0, S1}, .C = {PS0, PS1}};
    gemm2(&g2);
    float *tmp = r->av; /* [T, dh] twice */
    const float *cs = d->fin_c + 4 * I;
    for (int64_t h = 0; h < H; h++) {
        small_mm(tmp, dh, PS0 + h * T * HT, HT, A + 2 * HT * I + h * dh, I, 0, T, dh, HT, 1.0f);
        small_mm(tmp + T * dh, dh, PS1 + h * T * HT, HT, A + 3 * HT * I + h * dh, I, 0, T, dh, HT,
                 1.0f);
        for (int64_t t = 0; t < T; t++) {
            const float *sm = sums + 4 * (h * T + t);
            for (int64_t j = 0; j < dh; j++) {
                const int64_t m = h * dh + j;
                o[t * I + m] += tmp[t * dh + j] + tmp[(T + t) * dh + j] + sm[0] * cs[m] -
                                sm[1] * cs[I + m] + sm[2] * cs[2 * I + m] - sm[3] * cs[3 * I + m] +
                                cs[4 * I + m];
            }
        }
    }
    lin(y, C, o, I, &a->o, res, C, T, C, I);
    return VITC_OK;
}

static void swap(float **a, float **b) {
    float *t = *a;
    *a = *b;
    *b = t;
}

/* SamTwoWayTransformer: Q [Nt, C] tokens, K [HW, C] image; results in
 * r->Q, r->K. */
static vitc_status two_way(const vitc__sam_dec *d, sam_run *r) {
    const int64_t C = d->C, Nt = r->Nt, HW = r->HW;
    for (int64_t i = 0; i < d->n_layers; i++) {
        const sam_layer *L = &d->layers[i];
        if (i == 0) { /* skip_first_layer_pe: no embedding, no residual */
            VITC_TRY(attend(d, &L->self, r, r->Q2, NULL, r->Q, Nt, r->Q, r->Q, Nt));
        } else {
            add_rows(r->qq, r->Q, r->tok_pe, Nt * C);
            VITC_TRY(attend(d, &L->self, r, r->Q2, r->Q, r->qq, Nt, r->qq, r->Q, Nt));
        }
        swap(&r->Q, &r->Q2);
        vitc__layernorm(r->Q, r->Q, L->ln1.w, L->ln1.b, Nt, C, d->eps_dec);

        add_rows(r->qq, r->Q, r->tok_pe, Nt * C);
        /* the image side read by this layer: [HW, C] each */
        const float *K = r->K, *kk = r->kk;
        if (i == 0 && r->c0)
            K = r->c0->K0, kk = r->c0->kk0;
        else if (i == 0) /* later layers': with the LayerNorm before */
            add_rows_par(r->kk, r->K, d->pe_img, HW * C);
        if (i == 0 && t2i0_packs_usable(d, &L->t2i, r, Nt))
            VITC_TRY(t2i0_packed(d, &L->t2i, r, r->Q2, r->Q, r->qq, Nt));
        else if (i == 0 && r->c0)
            VITC_TRY(attend_kv(d, &L->t2i, r, r->Q2, r->Q, r->qq, Nt, r->c0->k, r->c0->v, HW));
        else if (i == 1 && t1_usable(d, &L->t2i, r, Nt))
            VITC_TRY(attend_t2i_layer1(d, &L->t2i, r, r->Q2, r->Q, r->qq, Nt));
        else if (fold_pays(d, &L->t2i, Nt))
            attend_t2i_folded(d, &L->t2i, r, r->Q2, r->Q, r->qq, Nt, r->kk, r->K, HW);
        else
            VITC_TRY(attend(d, &L->t2i, r, r->Q2, r->Q, r->qq, Nt, r->kk, r->K, HW));
        swap(&r->Q, &r->Q2);
        vitc__layernorm(r->Q, r->Q, L->ln2.w, L->ln2.b, Nt, C, d->eps_dec);

        lin(r->hid, d->mlp, r->Q, C, &L->lin1, NULL, 0, Nt, d->mlp, C);
        act(r->hid, Nt * d->mlp, d->act_mlp);
        lin(r->Q2, C, r->hid, d->mlp, &L->lin2, r->Q, C, Nt, C, d->mlp);
        swap(&r->Q, &r->Q2);
        vitc__layernorm(r->Q, r->Q, L->ln3.w, L->ln3.b, Nt, C, d->eps_dec);

        add_rows(r->qq, r->Q, r->tok_pe, Nt * C);
        /* K = LN(K + attention), and kk = K + the positional embedding,
         * the next layer's keys */
        if (fold_pays(d, &L->i2t, Nt)) {
            /* the folded forms add into K, the residual, or with the
             * cache's (read-only) write K and leave the residual to the
             * LayerNorm's pass, as out_proj's bias */
            const float beta = K == r->K ? 1.0f : 0.0f;
            /* the probabilities kept for the upscaling when it folds */
            float *S = r->f.on ? r->f.S + i * HW * r->f.HT : r->ak;
            int St = 0;
            /* with r->sf.on the outputs are not formed: their statistics
             * are computed below */
            float *yK = r->sf.on ? NULL : r->K;
            if (i == 0 && r->c0)
                St = attend_i2t_cached(d, &L->i2t, r, yK, beta, r->c0->q, HW, r->qq, r->Q, Nt, S);
            else {
                St = i == 1 && t1q_usable(d, &L->i2t, r, Nt)
                         ? attend_i2t_layer1(d, &L->i2t, r, yK, beta, r->qq, r->Q, Nt, S)
                         : -1;
                if (St < 0 && r->sf.on)
                    return vitc__err(VITC_ERR_INVALID_ARG, "SAM image -> token attention: a "
                                     "GEMM refused its arguments");
                if (St < 0) {
                    St = 0;
                    if (i == 1) /* the first layer may have left kk out */
                        add_rows_par(r->kk, r->K, d->pe_img, HW * C);
                    attend_i2t_folded(d, &L->i2t, r, r->K, beta, kk, HW, r->qq, r->Q, Nt, S);
                }
            }
            if (r->f.on) {
                /* A_i^T = M_i^T vo_i^T into the product's weight, per head
                 * (upf_wo: out_proj folded into M_i) from the token values */
                const int64_t I = L->i2t.I, dh = I / d->heads;
                r->f.St |= (uint64_t)St << i;
                float *A = r->ao; /* [H, T, C] */
                for (int64_t h = 0; h < d->heads; h++)
                    small_mm(A + h * Nt * C, C, r->tv + h * dh, I, d->upf_wo + (i * I + h * dh) * C,
                             C, 0, Nt, C, dh, 1.0f);
                for (int64_t o = 0; o < C; o++)
                    for (int64_t j = 0; j < r->f.HT; j++)
                        r->f.Bt[o * r->f.Kf + i * r->f.HT + j] = A[j * C + o];
            }
            /* K + pe, the next layer's keys and queries, unless that layer
             * reads K through this LayerNorm for both */
            const int no_kk = (i == 0 && d->n_layers > 1 &&
                               t1_usable(d, &d->layers[1].t2i, r, Nt) &&
                               t1q_usable(d, &d->layers[1].i2t, r, Nt)) ||
                              (i == d->n_layers - 1 && fin_pays(d, r));
            /* The statistics alone (r->sf.on), or the LayerNorm; the last
             * layer's K is read only through its stats when the final
             * attention and the upscaling both fold. */
            if (r->sf.on && St == 1)
                VITC_TRY(i == 0 ? vitc__sam_sf_layer0(d, r) : vitc__sam_sf_layer1(d, r));
            else if (r->sf.on)
                return vitc__err(VITC_ERR_INVALID_ARG, "SAM: the image -> token attention "
                                 "left its probabilities in an unexpected layout");
            else
                layernorm_add(r->K, no_kk ? NULL : r->kk, L->ln4.w, L->ln4.b,
                              K == r->K ? NULL : K, L->i2t.o.b, d->pe_img, HW, C, d->eps_dec,
                              r->f.on ? r->f.st + 2 * i * HW : NULL,
                              r->f.on && i == d->n_layers - 1 && fin_pays(d, r));
            if (r->f.on && i == 0) { /* for attend_t2i_layer1 */
                memcpy(r->f.V0, r->vo, (size_t)(r->f.HT * C) * sizeof(float));
                for (int64_t p = 0; p < HW; p++)
                    r->f.mu0[p] = r->f.st[2 * p], r->f.rho0[p] = r->f.st[2 * p + 1];
            }
            if (r->f.on && i == 1) { /* for attend_final */
                const float *st = r->f.st + 2 * HW;
                memcpy(r->f.V1, r->vo, (size_t)(r->f.HT * C) * sizeof(float));
                for (int64_t p = 0; p < HW; p++) {
                    r->f.mu1[p] = st[2 * p], r->f.rho1[p] = st[2 * p + 1];
                    r->f.alpha[p] = r->f.rho0[p] * r->f.rho1[p];
                }
            }
        } else {
            VITC_TRY(attend(d, &L->i2t, r, r->K2, K, kk, HW, r->qq, r->Q, Nt));
            swap(&r->K, &r->K2);
            layernorm_add(r->K, r->kk, L->ln4.w, L->ln4.b, NULL, NULL, d->pe_img, HW, C,
                          d->eps_dec, NULL, 0);
        }
    }
    add_rows(r->qq, r->Q, r->tok_pe, Nt * C);
    if (r->n_keep > 0 && fold_pays(d, &d->final, r->n_keep)) {
        /* A query row's attention reads no other query row: the rows
         * nothing reads afterwards (the prompt's own tokens, the mask
         * tokens not asked for) are left out; those of Q keep their
         * values from before. qq and Q2 hold the kept rows compacted
         * (keep ascending: a row never moves down onto one still to be
         * read). */
        const int64_t n = r->n_keep;
        for (int64_t j = 0; j < n; j++) {
            memmove(r->qq + j * C, r->qq + r->keep[j] * C, (size_t)C * sizeof(float));
            memcpy(r->Q2 + j * C, r->Q + r->keep[j] * C, (size_t)C * sizeof(float));
        }
        if (fin_pays(d, r))
            VITC_TRY(attend_final(d, r, r->ksel, r->Q2, r->qq, n));
        else
            attend_t2i_folded(d, &d->final, r, r->ksel, r->Q2, r->qq, n, r->kk, r->K, HW);
        vitc__layernorm(r->ksel, r->ksel, d->ln_final.w, d->ln_final.b, n, C, 1e-5f);
        for (int64_t j = 0; j < n; j++)
            memcpy(r->Q + r->keep[j] * C, r->ksel + j * C, (size_t)C * sizeof(float));
        return VITC_OK;
    }
    if (fold_pays(d, &d->final, Nt))
        attend_t2i_folded(d, &d->final, r, r->Q2, r->Q, r->qq, Nt, r->kk, r->K, HW);
    else
        VITC_TRY(attend(d, &d->final, r, r->Q2, r->Q, r->qq, Nt, r->kk, r->K, HW));
    swap(&r->Q, &r->Q2);
    /* layer_norm_final_attn is nn.LayerNorm(hidden_size): torch's 1e-5. */
    vitc__layernorm(r->Q, r->Q, d->ln_final.w, d->ln_final.b, Nt, C, 1e-5f);
    return VITC_OK;
}

/* SamFeedForward on one row x [in] into y [out_dim]; tmp [2 * hidden]. */
static void ffn(const sam_ffn *f, float *y, const float *x, int64_t in, float *tmp) {
    float *a = tmp, *b = tmp + f->hidden;
    lin(a, f->hidden, x, in, &f->in, NULL, 0, 1, f->hidden, in);
    act(a, f->hidden, SAM_ACT_RELU);
    for (int i = 0; i < f->n_mid; i++) {
        lin(b, f->hidden, a, f->hidden, &f->mid[i], NULL, 0, 1, f->hidden, f->hidden);
        act(b, f->hidden, SAM_ACT_RELU);
        swap(&a, &b);
    }
    lin(y, f->out_dim, a, f->hidden, &f->out, NULL, 0, 1, f->out_dim, f->hidden);
}

/* The masks' hypernetwork MLPs and the IoU head side by side, one a task:
 * each is three products of one row (a region of its own each, a dozen
 * per prompt, had cost more in waking the pool than in products). */
typedef struct mlps_ctx {
    const vitc__sam_dec *d;
    const float *Q;    /* [Nt, C] the tokens */
    float *hyper, *iou; /* [n, C/8], [T] */
    float *tmp;        /* [n + 1, tn] */
    int64_t n, first, tn;
} mlps_ctx;

static void mlps_one(void *vc, int64_t i, int tid) {
    const mlps_ctx *c = vc;
    const int64_t C = c->d->C;
    (void)tid;
    if (i < c->n)
        ffn(&c->d->hyper[c->first + i], c->hyper + i * (C / 8), c->Q + (1 + c->first + i) * C, C,
            c->tmp + i * c->tn);
    else
        ffn(&c->d->iou, c->iou, c->Q, C, c->tmp + i * c->tn);
}

/* A 2x2 / 2 convolution of x [H, W, Cin] into y [H/2, W/2, O], through
 * the dense layers (l->w already in their [O, 2, 2, Cin] layout). */
static vitc_status conv2(const sam_wb *l, float *y, const float *x, int64_t H, int64_t W,
                         int64_t Cin, int64_t O) {
    const vitc__nn_conv c = {.w = l->w, .b = l->b, .C = Cin, .O = O, .kh = 2, .kw = 2, .sh = 2,
                             .sw = 2};
    const int64_t n = vitc__nn_conv_scratch(&c, 1, H, W);
    float *scr = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!scr)
        return vitc__err(VITC_ERR_NOMEM, "out of memory for SAM's mask prompt convolution");
    vitc_status s = vitc__nn_conv_forward(&c, y, x, 1, H, W, scr, n);
    free(scr);
    return s;
}

/* A 2x2 / 2 transposed convolution of x [H, W, Cin] into y [2H, 2W, O]
 * (l->w in the dense layers' [2, 2, O, Cin]); z scratch of zn floats. */
static vitc_status convt2(const sam_wb *l, float *y, const float *x, int64_t H, int64_t W,
                          int64_t Cin, int64_t O, float *z, int64_t zn) {
    const vitc__nn_convt c = {.w = l->w, .b = l->b, .C = Cin, .O = O, .kh = 2, .kw = 2,
                              .sh = 2, .sw = 2};
    return vitc__nn_convt_forward(&c, y, x, 1, H, W, z, zn);
}

/* SamMaskEmbedding of the mask prompt m [4g, 4g] into dense [g*g, C];
 * scratch s of 2 g^2 mc floats. */
static vitc_status mask_embed(const vitc__sam_dec *d, float *dense, const float *m, float *s) {
    const int64_t g = d->grid, mc = d->mc, mc4 = mc / 4;
    float *a = s, *b = s + g * g * mc; /* a [2g, 2g, mc4], b [g, g, mc] */
    VITC_TRY(conv2(&d->mconv1, a, m, 4 * g, 4 * g, 1, mc4));
    vitc__layernorm(a, a, d->mln1.w, d->mln1.b, 4 * g * g, mc4, d->eps_prompt);
    act(a, 4 * g * g * mc4, d->act_prompt);
    VITC_TRY(conv2(&d->mconv2, b, a, 2 * g, 2 * g, mc4, mc));
    vitc__layernorm(b, b, d->mln2.w, d->mln2.b, g * g, mc, d->eps_prompt);
    act(b, g * g * mc, d->act_prompt);
    vitc__linear(dense, d->C, b, mc, d->mconv3.w, d->mconv3.b, NULL, 0, g * g, d->C, mc);
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Predict                                                            */
/* ------------------------------------------------------------------ */

static int finite2(const float *p) { return isfinite(p[0]) && isfinite(p[1]); }

static vitc_status check_prompt(const vitc__sam_dec *d, const struct vitc_sam_image *e,
                                int input_size, const vitc_sam_prompt *p) {
    if (!d || !e || !p)
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM predict: NULL model, image or prompt");
    if (!e->emb_cl || e->C != d->C || e->h != d->grid || e->w != d->grid)
        return vitc__err(VITC_ERR_SHAPE,
                         "SAM predict: the image embedding is [%lld, %lld, %lld], the decoder "
                         "expects [%lld, %lld, %lld]; set the image with the same model",
                         (long long)e->C, (long long)e->h, (long long)e->w, (long long)d->C,
                         (long long)d->grid, (long long)d->grid);
    if (input_size < 1 || e->orig_w < 1 || e->orig_h < 1 || e->resized_w < 1 ||
        e->resized_h < 1 || e->resized_w > input_size || e->resized_h > input_size)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "SAM predict: image sizes %dx%d (resized %dx%d) do not fit the input "
                         "side %d",
                         e->orig_w, e->orig_h, e->resized_w, e->resized_h, input_size);
    if (p->n_points < 0 || p->n_points > SAM_MAX_POINTS)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "SAM prompt: %d points; give 0 to %d points per prompt", p->n_points,
                         SAM_MAX_POINTS);
    if (p->n_points > 0 && !p->points)
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM prompt: n_points %d but points is NULL",
                         p->n_points);
    for (int i = 0; i < p->n_points; i++) {
        const float *q = p->points + 2 * i;
        if (!finite2(q) || q[0] < 0 || q[1] < 0 || q[0] > e->orig_w || q[1] > e->orig_h)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "SAM prompt: point %d (%g, %g) is outside the %dx%d image; give "
                             "x in [0, %d], y in [0, %d]",
                             i, (double)q[0], (double)q[1], e->orig_w, e->orig_h, e->orig_w,
                             e->orig_h);
        if (p->labels && p->labels[i] != 0 && p->labels[i] != 1)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "SAM prompt: point %d has label %d; use 1 (foreground) or 0 "
                             "(background)",
                             i, p->labels[i]);
    }
    if (p->box) {
        const float *b = p->box;
        if (!finite2(b) || !finite2(b + 2) || b[0] < 0 || b[1] < 0 || b[2] > e->orig_w ||
            b[3] > e->orig_h)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "SAM prompt: box (%g, %g, %g, %g) is outside the %dx%d image",
                             (double)b[0], (double)b[1], (double)b[2], (double)b[3], e->orig_w,
                             e->orig_h);
        if (!(b[2] > b[0]) || !(b[3] > b[1]))
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "SAM prompt: box (%g, %g, %g, %g) has no area; give x0 < x1 and "
                             "y0 < y1",
                             (double)b[0], (double)b[1], (double)b[2], (double)b[3]);
    }
    if (p->mask) {
        const int64_t n = 16 * d->grid * d->grid;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(p->mask[i]))
                return vitc__err(VITC_ERR_INVALID_ARG,
                                 "SAM prompt: the mask prompt has a NaN or infinite value at "
                                 "%lld",
                                 (long long)i);
    }
    return VITC_OK;
}

vitc_status vitc__sam_dec_predict(const vitc__sam_dec *d, const struct vitc_sam_image *e,
                                  int input_size, const vitc_sam_prompt *p, vitc_sam_result *out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "SAM predict: NULL result");
    memset(out, 0, sizeof *out);
    VITC_TRY(check_prompt(d, e, input_size, p));
    vitc__pool_prewake(); /* the prompt's setup below overlaps their wake-up */
    const int64_t C = d->C, G = d->grid, HW = G * G, lo = 4 * G;
    const int has_box = p->box != NULL, np = p->n_points;
    const int64_t n_sparse = np + (np > 0 && !has_box) + 2 * has_box;
    const int64_t Nt = 1 + d->T + n_sparse;
    const int multi = p->multimask != 0;
    const int64_t n_masks = multi ? d->T - 1 : 1, first = multi ? 1 : 0;
    const int64_t ow = e->orig_w, oh = e->orig_h;

    int64_t hidn = d->mlp > d->iou_hidden ? d->mlp : d->iou_hidden;
    if (hidn < 2 * C)
        hidn = 2 * C;
    /* Each attention buffer holds the larger of the token side (self
     * attention at width C) and the image side (width C / downsample). */
    int64_t abuf = Nt * C > HW * (C / d->ds) ? Nt * C : HW * (C / d->ds);
    if (abuf < 2 * Nt * C + 2 * C * C) /* the folded attentions' token-side products */
        abuf = 2 * Nt * C + 2 * C * C;
    const int64_t mask_scratch = p->mask ? 2 * HW * d->mc : 0;
    /* The upscaling: u2 [4G, 4G, C/8] then the transposed convolutions'
     * scratch (u1 goes where kk was). */
    const vitc__nn_convt ct1 = {.C = C, .O = C / 4, .kh = 2, .kw = 2, .sh = 2, .sw = 2},
                         ct2 = {.C = C / 4, .O = C / 8, .kh = 2, .kw = 2, .sh = 2, .sw = 2};
    int64_t zs = vitc__nn_convt_scratch(&ct1, 1, G, G);
    if (zs < vitc__nn_convt_scratch(&ct2, 1, 2 * G, 2 * G))
        zs = vitc__nn_convt_scratch(&ct2, 1, 2 * G, 2 * G);
    const int64_t up_scratch = 2 * HW * C + zs;
    int64_t big = 4 * abuf;
    if (big < up_scratch)
        big = up_scratch;
    if (big < mask_scratch)
        big = mask_scratch;
    const int64_t n_float = 5 * Nt * C + 3 * HW * C + big + Nt * hidn;
    float *buf = malloc((size_t)n_float * sizeof(float));
    float *low = malloc((size_t)(n_masks * lo * lo) * sizeof(float));
    /* the masks' logits, or (p->binary) their bytes */
    void *masks = malloc((size_t)(n_masks * oh * ow) * (p->binary ? 1 : sizeof(float)));
    if (!buf || !low || !masks) {
        free(buf), free(low), free(masks);
        return vitc__err(VITC_ERR_NOMEM,
                         "out of memory for SAM's decoder (%lld tokens, %lldx%lld masks)",
                         (long long)Nt, (long long)ow, (long long)oh);
    }
    sam_run r = {.Nt = Nt, .HW = HW, .abuf = abuf};
    float *fold = NULL; /* r.f's buffer */
    double *sfbuf = NULL; /* r.sf's */
    float *f = buf;
    r.tok_pe = f, f += Nt * C;
    r.ksel = f, f += Nt * C;
    r.keep[r.n_keep++] = 0;
    for (int64_t m = 0; m < n_masks; m++) r.keep[r.n_keep++] = 1 + first + m;
    r.Q = f, f += Nt * C;
    r.Q2 = f, f += Nt * C;
    r.qq = f, f += Nt * C;
    r.K = f, f += HW * C;
    r.K2 = f, f += HW * C;
    r.kk = f, f += HW * C;
    float *scr = f;
    r.aq = f, f += abuf;
    r.ak = f, f += abuf;
    r.av = f, f += abuf;
    r.ao = f, f += abuf;
    f = scr + big;
    r.hid = f;

    /* Tokens: IoU, mask tokens, then the sparse prompt. Coordinates as
     * SamProcessor maps them (resized / original per axis) and the prompt
     * encoder shifts them (+0.5) and normalises them (input side), in
     * double as those float64 arrays are, then rounded. */
    float *t = r.tok_pe;
    memcpy(t, d->iou_token, (size_t)C * sizeof(float));
    memcpy(t + C, d->mask_tokens, (size_t)(d->T * C) * sizeof(float));
    t += (1 + d->T) * C;
    const double sx = (double)e->resized_w / e->orig_w, sy = (double)e->resized_h / e->orig_h;
    const double isz = (double)d->image_size;
#define NORM(v, s) ((float)(2.0 * (((double)(v) * (s) + 0.5) / isz) - 1.0))
    for (int i = 0; i < np; i++, t += C) {
        vitc__sam_pos_encode(d, NORM(p->points[2 * i], sx), NORM(p->points[2 * i + 1], sy), t);
        const float *pe = d->point_embed[p->labels ? p->labels[i] : 1];
        for (int64_t c = 0; c < C; c++) t[c] += pe[c];
    }
    if (np > 0 && !has_box) { /* the padding point (label -1) */
        memcpy(t, d->not_a_point, (size_t)C * sizeof(float));
        t += C;
    }
    if (has_box)
        for (int k = 0; k < 2; k++, t += C) {
            vitc__sam_pos_encode(d, NORM(p->box[2 * k], sx), NORM(p->box[2 * k + 1], sy), t);
            for (int64_t c = 0; c < C; c++) t[c] += d->point_embed[2 + k][c];
        }
#undef NORM
    memcpy(r.Q, r.tok_pe, (size_t)(Nt * C) * sizeof(float));

    /* Keys: the embedding plus the dense prompt. */
    vitc_status s = VITC_OK;
    if (p->mask) {
        if ((s = mask_embed(d, r.K2, p->mask, scr)) != VITC_OK)
            goto done;
        add_rows(r.K, e->emb_cl, r.K2, HW * C);
    } else {
        if (strcmp(vitc__nn_dense_path(), "ref") != 0)
            r.c0 = image_cache(d, e);
        if (!r.c0) /* else the first layer reads the cache's */
            for (int64_t i = 0; i < HW; i++)
                add_rows(r.K + i * C, e->emb_cl + i * C, d->no_mask, C);
    }
    if (r.c0 && r.c0->P0 && d->upf_w) {
        /* the upscaling folds when every layer's image -> token attention
         * folds and the fold's product is the narrower */
        int on = 1;
        for (int64_t i = 0; i < d->n_layers; i++) on &= fold_pays(d, &d->layers[i].i2t, Nt);
        const int64_t L = d->n_layers, HT = d->heads * Nt, Kf = L * HT + 2 * L;
        if (on && Kf < C &&
            (fold = malloc((size_t)(L * HW * HT + 2 * L * HW + C * Kf + 2 * HT * C + 5 * HW) *
                           sizeof(float)))) {
            r.f.on = 1, r.f.HT = HT, r.f.Kf = Kf;
            r.f.S = fold, r.f.st = fold + L * HW * HT, r.f.Bt = r.f.st + 2 * L * HW;
            r.f.V0 = r.f.Bt + C * Kf, r.f.rho0 = r.f.V0 + HT * C, r.f.mu0 = r.f.rho0 + HW;
            r.f.V1 = r.f.mu0 + HW, r.f.rho1 = r.f.V1 + HT * C, r.f.mu1 = r.f.rho1 + HW;
            r.f.alpha = r.f.mu1 + HW;
            /* its constant columns: u_k, -h_i */
            for (int64_t o = 0; o < C; o++)
                for (int64_t i = 0; i < L; i++) {
                    r.f.Bt[o * Kf + L * HT + i] = d->upf_u[i * C + o];
                    r.f.Bt[o * Kf + L * HT + L + i] = -d->upf_h[i * C + o];
                }
        }
    }
    if (r.f.on && d->n_layers == 2 && r.c0->sf[0] && d->sf_v && i2tc_usable(d, &r, Nt) &&
        t1_usable(d, &d->layers[1].t2i, &r, Nt) && t1q_usable(d, &d->layers[1].i2t, &r, Nt) &&
        fin_pays(d, &r)) {
        /* every reader of K_1 and K_2 reads them through their LayerNorms:
         * their statistics alone (sam_stats.c) */
        if ((sfbuf = malloc((size_t)(2 * HW) * sizeof(double)))) {
            r.sf.on = 1;
            r.sf.z = sfbuf;
        }
    }
    if ((s = two_way(d, &r)) != VITC_OK)
        goto done;

    /* Upscaling: [G, G, C] -> [2G, 2G, C/4] -> LN, GELU -> [4G, 4G, C/8], GELU. */
    {
        const int64_t C4 = C / 4, C8 = C / 8;
        /* The hypernetwork rows of the masks asked for, then masks [n, P]
         * = hyper [n, C/8] u2^T. */
        float *hyper = r.hid, iou[4];
        int64_t tn = 2 * d->iou.hidden;
        for (int64_t m = 0; m < n_masks; m++)
            tn = tn > 2 * d->hyper[first + m].hidden ? tn : 2 * d->hyper[first + m].hidden;
        mlps_ctx mc = {.d = d, .Q = r.Q, .hyper = hyper, .iou = iou, .n = n_masks,
                       .first = first, .tn = tn,
                       .tmp = malloc((size_t)((n_masks + 1) * tn) * sizeof(float))};
        if (!mc.tmp) {
            s = vitc__err(VITC_ERR_NOMEM, "out of memory for SAM's mask heads");
            goto done;
        }
        sam_tasks(n_masks + 1, mlps_one, &mc);
        free(mc.tmp);
        if (strcmp(vitc__nn_dense_path(), "ref") != 0) {
            if ((s = vitc__sam_upscale(d, &r, r.K, hyper, n_masks, low)) != VITC_OK)
                goto done;
        } else {
            /* u1 [2G, 2G, C/4], u2 [4G, 4G, C/8], z the GEMM's [.., 4 O] */
            float *u1 = r.kk, *u2 = scr, *z = scr + 2 * HW * C;
            if ((s = convt2(&d->up1, u1, r.K, G, G, C, C4, z, zs)) != VITC_OK)
                goto done;
            vitc__layernorm(u1, u1, d->up_ln.w, d->up_ln.b, 4 * HW, C4, 1e-6f);
            vitc__gelu(u1, 4 * HW * C4);
            if ((s = convt2(&d->up2, u2, u1, 2 * G, 2 * G, C4, C8, z, zs)) != VITC_OK)
                goto done;
            vitc__gelu(u2, 16 * HW * C8);
            vitc__gemm(0, 1, n_masks, 16 * HW, C8, 1.0f, hyper, C8, u2, C8, 0.0f, low, 16 * HW);
        }
        for (int64_t m = 0; m < n_masks; m++) out->iou[m] = iou[first + m];
    }

    /* post_process_masks(binarize=False) */
    if ((s = vitc__sam_post_masks(p->binary ? NULL : masks, p->binary ? masks : NULL, low,
                                  n_masks, lo, input_size, e->resized_w, e->resized_h, ow,
                                  oh)) != VITC_OK)
        goto done;
    out->n_masks = (int)n_masks;
    out->height = (int)oh, out->width = (int)ow;
    if (p->binary)
        out->binary = masks;
    else
        out->masks = masks;
    out->low_res = low;
    masks = low = NULL;
done:
    free(buf), free(low), free(masks), free(fold), free(sfbuf);
    return s;
}
