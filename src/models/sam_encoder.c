/*
 * sam_encoder.c — SAM's image encoder (transformers' SamVisionEncoder, the
 * ViT-det backbone of segment-anything):
 *
 *   x = conv_p(img) + pos                          [g*g, C]  (g = img / p)
 *   per block: t = LN1(x)
 *              windowed: t split into ws x ws windows, zero-padded to a
 *                        multiple of ws (padding after LN1: the padded
 *                        tokens' q, k, v are the qkv biases, and they take
 *                        part in the window's attention as SAM's do)
 *              mid = x + proj(attn(qkv(t)))  with decomposed relative
 *                        positions added inside the fused attention kernel
 *              x = mid + fc2(act(fc1(LN2(mid))))
 *   neck: conv1x1 -> LayerNorm2d -> conv3x3 (pad 1) -> LayerNorm2d
 *
 * Everything is channels-last rows [tokens, C], so LayerNorm2d is the row
 * LayerNorm and both neck convolutions are GEMMs (the 3x3 one on unfolded
 * rows). The windows run as one batch through the attention kernel; the
 * relative-position terms are per query row and grid line (rel_h [.., g],
 * rel_w [.., g]) and never an N x N matrix. The activations live in a few
 * grid-sized buffers reused by every block.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/nn.h"
#include "../nn/relpos.h"
#include "sam.h"

#define SAM_NECK_EPS 1e-6f /* SamLayerNorm's own default, not the config's */

/* ------------------------------------------------------------------ */
/* Loading                                                            */
/* ------------------------------------------------------------------ */

typedef struct sam_take {
    const vitc__shards *sh;
    float *arena; /* NULL: only check and count */
    size_t used;  /* floats */
    vitc__sam_enc *pack; /* non-NULL: matrices packed as soon as read */
} sam_take;

static vitc_status sam_pack_one(vitc__sam_enc *e, int i);

/* Packs matrices [i, i + n) once they are read (sam_take.pack). */
static vitc_status sam_packed(const sam_take *t, int i, int n) {
    for (int k = i; t->arena && t->pack && k < i + n; k++) VITC_TRY(sam_pack_one(t->pack, k));
    return VITC_OK;
}

static vitc_status sam_take_one(sam_take *t, float **dst, const char *name, int nd, int64_t d0,
                                int64_t d1, int64_t d2, int64_t d3) {
    const int64_t shape[4] = {d0, d1, d2, d3};
    size_t n = 1;
    for (int k = 0; k < nd; k++) n *= (size_t)shape[k];
    if (!t->arena) {
        t->used += n;
        return vitc__hub_take(t->sh, name, shape, nd, 0, NULL);
    }
    *dst = t->arena + t->used;
    t->used += n;
    return vitc__hub_take(t->sh, name, shape, nd, 0, *dst);
}

/* Every tensor of the encoder: checked (t->arena NULL) or read. */
static vitc_status sam_tensors(vitc__sam_enc *e, sam_take *t) {
    const int64_t C = e->C, M = e->M, P = e->patch, g = e->grid, O = e->O, d = e->C / e->H;
    char nm[160];
#define SAM_NAME(...) (snprintf(nm, sizeof nm, "vision_encoder." __VA_ARGS__), nm)
    VITC_TRY(sam_take_one(t, &e->patch_w, SAM_NAME("patch_embed.projection.weight"), 4, C, 3, P, P));
    VITC_TRY(sam_take_one(t, &e->patch_b, SAM_NAME("patch_embed.projection.bias"), 1, C, 0, 0, 0));
    VITC_TRY(sam_packed(t, e->depth * VITC__SAM_PW_LAYER, 1));
    if (e->use_abs)
        VITC_TRY(sam_take_one(t, &e->pos, SAM_NAME("pos_embed"), 4, 1, g, g, C));
    for (int i = 0; i < e->depth; i++) {
        vitc__sam_layer *l = &e->layers[i];
        const int64_t s = e->global[i] ? g : e->ws, r = 2 * s - 1;
#define SAM_L(field, suffix, nd, a, b)                                                        \
    VITC_TRY(sam_take_one(t, &l->field, SAM_NAME("layers.%d." suffix, i), nd, a, b, 0, 0))
        SAM_L(ln1_w, "layer_norm1.weight", 1, C, 0);
        SAM_L(ln1_b, "layer_norm1.bias", 1, C, 0);
        SAM_L(qkv_w, "attn.qkv.weight", 2, 3 * C, C);
        if (e->qkv_bias)
            SAM_L(qkv_b, "attn.qkv.bias", 1, 3 * C, 0);
        SAM_L(proj_w, "attn.proj.weight", 2, C, C);
        SAM_L(proj_b, "attn.proj.bias", 1, C, 0);
        if (e->use_rel) {
            SAM_L(rel_h, "attn.rel_pos_h", 2, r, d);
            SAM_L(rel_w, "attn.rel_pos_w", 2, r, d);
        }
        SAM_L(ln2_w, "layer_norm2.weight", 1, C, 0);
        SAM_L(ln2_b, "layer_norm2.bias", 1, C, 0);
        SAM_L(fc1_w, "mlp.lin1.weight", 2, M, C);
        SAM_L(fc1_b, "mlp.lin1.bias", 1, M, 0);
        SAM_L(fc2_w, "mlp.lin2.weight", 2, C, M);
        SAM_L(fc2_b, "mlp.lin2.bias", 1, C, 0);
#undef SAM_L
        VITC_TRY(sam_packed(t, i * VITC__SAM_PW_LAYER, VITC__SAM_PW_LAYER));
    }
    VITC_TRY(sam_take_one(t, &e->neck1_w, SAM_NAME("neck.conv1.weight"), 4, O, C, 1, 1));
    VITC_TRY(sam_take_one(t, &e->nln1_w, SAM_NAME("neck.layer_norm1.weight"), 1, O, 0, 0, 0));
    VITC_TRY(sam_take_one(t, &e->nln1_b, SAM_NAME("neck.layer_norm1.bias"), 1, O, 0, 0, 0));
    VITC_TRY(sam_take_one(t, &e->neck2_w, SAM_NAME("neck.conv2.weight"), 4, O, O, 3, 3));
    VITC_TRY(sam_take_one(t, &e->nln2_w, SAM_NAME("neck.layer_norm2.weight"), 1, O, 0, 0, 0));
    VITC_TRY(sam_take_one(t, &e->nln2_b, SAM_NAME("neck.layer_norm2.bias"), 1, O, 0, 0, 0));
    VITC_TRY(sam_packed(t, e->depth * VITC__SAM_PW_LAYER + 1, 2));
#undef SAM_NAME
    return VITC_OK;
}

/* The arena: the first tensor's slot (sam_tensors reads in order). */
static float *sam_arena(const vitc__sam_enc *e) { return e->patch_w; }

/* Row-major home of packed matrix i ([depth * VITC__SAM_PW_LAYER + 3]
 * order) and its shape [N, K]. */
static float *sam_home(const vitc__sam_enc *e, int i, int64_t *N, int64_t *K) {
    const int64_t C = e->C, M = e->M, O = e->O;
    if (i >= e->depth * VITC__SAM_PW_LAYER) {
        switch (i - e->depth * VITC__SAM_PW_LAYER) {
        case 0: *N = C, *K = 3 * (int64_t)e->patch * e->patch; return e->patch_w;
        case 1: *N = O, *K = C; return e->neck1_w;
        default: *N = O, *K = 9 * O; return e->neck2_w;
        }
    }
    const vitc__sam_layer *l = &e->layers[i / VITC__SAM_PW_LAYER];
    switch (i % VITC__SAM_PW_LAYER) {
    case VITC__SAM_PW_QKV: *N = 3 * C, *K = C; return l->qkv_w;
    case VITC__SAM_PW_PROJ: *N = C, *K = C; return l->proj_w;
    case VITC__SAM_PW_FC1: *N = M, *K = C; return l->fc1_w;
    default: *N = C, *K = M; return l->fc2_w;
    }
}

/* int8 keeps one scale per output channel (its largest |w| / 127): a NaN
 * or an infinity would turn into plausible numbers where fp32 and bf16
 * carry it to the embedding, so such a weight is refused, named. */
static vitc_status sam_int8_finite(const vitc__sam_enc *e, int i, const float *W, size_t n) {
    size_t j = 0;
    while (j < n && isfinite(W[j])) j++;
    if (j == n)
        return VITC_OK;
    static const char *const what[VITC__SAM_PW_LAYER] = {"attn.qkv", "attn.proj", "mlp.lin1",
                                                         "mlp.lin2"};
    char name[80];
    if (i >= e->depth * VITC__SAM_PW_LAYER)
        snprintf(name, sizeof name, "neck.conv%d", i - e->depth * VITC__SAM_PW_LAYER);
    else
        snprintf(name, sizeof name, "layers.%d.%s", i / VITC__SAM_PW_LAYER,
                 what[i % VITC__SAM_PW_LAYER]);
    return vitc__err(VITC_ERR_INVALID_ARG, "int8: weight vision_encoder.%s.weight holds %s at "
                     "element %zu; int8 cannot carry it (fp32 and bf16 do): fix the weights or "
                     "load SAM in another precision", name, isnan(W[j]) ? "NaN" : "an infinity", j);
}

/* Every matrix is packed as soon as its tensors are read and its
 * row-major copy given back at once (vit_precision.c's rule), so the
 * encoder holds each weight once and the load's peak is the packs plus
 * one block's fp32 weights, not the fp32 model. The blocks' Linears and
 * the neck's convolutions take e->prec; the patch embedding stays fp32
 * (one GEMM of K = 768 on the image, as the ViTs'). fp32 without a packing
 * kernel (OpenBLAS) keeps the row-major weights, which its GEMM reads:
 * sam_pack_begin leaves e->pw NULL then. */
static vitc_status sam_pack_begin(vitc__sam_enc *e, vitc_precision prec) {
    e->prec = prec;
    if (!vitc__gemm_pack_kernel() && prec == VITC_PRECISION_FP32)
        return VITC_OK;
    if (!(e->pw = calloc((size_t)e->depth * VITC__SAM_PW_LAYER + 3, sizeof *e->pw)))
        return vitc__err(VITC_ERR_NOMEM, "SAM encoder: out of memory for the packed weights");
    return VITC_OK;
}

static vitc_status sam_pack_one(vitc__sam_enc *e, int i) {
    const vitc_precision p = i == e->depth * VITC__SAM_PW_LAYER ? VITC_PRECISION_FP32 : e->prec;
    int64_t N, K;
    float *W = sam_home(e, i, &N, &K);
    if (p == VITC_PRECISION_FP32 && !vitc__gemm_pack_kernel())
        return VITC_OK; /* the patch embedding under OpenBLAS: row-major */
    if (p == VITC_PRECISION_INT8)
        VITC_TRY(sam_int8_finite(e, i, W, (size_t)N * (size_t)K));
    VITC_TRY(vitc__pweight_pack(&e->pw[i], W, N, K, p));
    vitc__vit_release(W, (size_t)N * (size_t)K);
    return VITC_OK;
}

vitc_status vitc__sam_enc_load(vitc__sam_enc *e, const vitc__shards *sh,
                               vitc_precision prec) {
    e->layers = calloc((size_t)e->depth, sizeof *e->layers);
    if (!e->layers)
        return vitc__err(VITC_ERR_NOMEM, "SAM encoder: out of memory");
    sam_take t = {.sh = sh};
    VITC_TRY(sam_tensors(e, &t)); /* every name and shape before any allocation */
    size_t bytes;
    if (!vitc__mul_size(t.used, sizeof(float), &bytes) || !(t.arena = malloc(bytes)))
        return vitc__err(VITC_ERR_NOMEM, "SAM encoder: out of memory for %zu weights", t.used);
    t.used = 0;
    vitc_status s = sam_pack_begin(e, prec);
    t.pack = e->pw ? e : NULL;
    if (s == VITC_OK)
        s = sam_tensors(e, &t);
    if (s != VITC_OK) {
        if (sam_arena(e) != t.arena) /* not one slot assigned: free it here */
            free(t.arena);
        return s;
    }
    return VITC_OK;
}

void vitc__sam_enc_free(vitc__sam_enc *e) {
    if (e->pw)
        for (int i = 0; i < e->depth * VITC__SAM_PW_LAYER + 3; i++) vitc__pweight_free(&e->pw[i]);
    free(e->pw);
    free(sam_arena(e));
    free(e->layers);
    free(e->global);
    memset(e, 0, sizeof *e);
}

/* ------------------------------------------------------------------ */
/* Forward                                                            */
/* ------------------------------------------------------------------ */

/* The weights one linear layer of the forward reads. */
typedef struct sam_wt {
    const vitc__pweight *pw;
    const float *W; /* [N, K] row-major, or NULL with a bf16 / int8 pack */
} sam_wt;

/* An fp32 pack made for another kernel than the one running now
 * (VITC_ARCH / VITC_GEMM changed after loading): its row-major copy is
 * gone, and the model is read-only, so it is unpacked per call. */
static int sam_stale(const vitc__pweight *p) {
    return p->data && p->prec == VITC_PRECISION_FP32 && p->kern != vitc__gemm_pack_kernel();
}

/* Matrix i's weights for this call (tmp: sam_stale's scratch). */
static sam_wt sam_weight(const vitc__sam_enc *e, int i, float *tmp) {
    int64_t N, K;
    sam_wt r = {NULL, sam_home(e, i, &N, &K)};
    const vitc__pweight *p = e->pw ? &e->pw[i] : NULL;
    if (!p || !p->data)
        return r; /* never packed: the row-major copy is resident */
    if (sam_stale(p)) {
        vitc__pweight_unpack(p, tmp); /* exact in fp32 */
        r.W = tmp;
        return r;
    }
    r.pw = p;
    if (p->prec != VITC_PRECISION_FP32)
        r.W = NULL;
    return r;
}

/* The windowed blocks' geometry: nw x nw windows of ws x ws tokens over
 * the grid padded to nw * ws. */
typedef struct sam_win {
    const float *src; /* [g*g, W] */
    float *dst;       /* [nw*nw, ws*ws, W] */
    const float *pad; /* [W] what padded rows hold (NULL: zeros) */
    int64_t g, ws, nw, W;
} sam_win;

static void sam_partition_one(void *ctx, int64_t w, int tid) {
    const sam_win *p = ctx;
    (void)tid;
    const int64_t wy = w / p->nw, wx = w % p->nw, W = p->W;
    for (int64_t iy = 0; iy < p->ws; iy++)
        for (int64_t ix = 0; ix < p->ws; ix++) {
            const int64_t y = wy * p->ws + iy, x = wx * p->ws + ix;
            float *d = p->dst + ((w * p->ws + iy) * p->ws + ix) * W; /* [W] */
            if (y < p->g && x < p->g)
                memcpy(d, p->src + (y * p->g + x) * W, (size_t)W * sizeof(float));
            else if (p->pad)
                memcpy(d, p->pad, (size_t)W * sizeof(float));
            else
                memset(d, 0, (size_t)W * sizeof(float));
        }
}

/* The inverse (src windows -> dst grid, padded tokens dropped). */
static void sam_unpartition_one(void *ctx, int64_t w, int tid) {
    const sam_win *p = ctx;
    (void)tid;
    const int64_t wy = w / p->nw, wx = w % p->nw, W = p->W;
    for (int64_t iy = 0; iy < p->ws; iy++)
        for (int64_t ix = 0; ix < p->ws; ix++) {
            const int64_t y = wy * p->ws + iy, x = wx * p->ws + ix;
            if (y < p->g && x < p->g)
                memcpy(p->dst + (y * p->g + x) * W, p->src + ((w * p->ws + iy) * p->ws + ix) * W,
                       (size_t)W * sizeof(float));
        }
}

/* rel_h / rel_w of one head from T = q Rh^T, q Rw^T ([B*L, 2s-1] each):
 * row l at grid (lh, lw) takes T[l][lh - a + s - 1] for a = 0..s-1. */
typedef struct sam_gather {
    const vitc__nn_relpos *rp;
    const float *th, *tw; /* [B*L, 2s-1] */
    int64_t h;
} sam_gather;

static void sam_gather_one(void *ctx, int64_t b, int tid) {
    const sam_gather *g = ctx;
    const vitc__nn_relpos *p = g->rp;
    (void)tid;
    const int64_t s = p->gh, L = s * s, r = 2 * s - 1;
    for (int64_t l = 0; l < L; l++) {
        const int64_t lh = l / s, lw = l % s;
        const float *th = g->th + (b * L + l) * r, *tw = g->tw + (b * L + l) * r;
        float *rh = p->rel_h + b * p->rh_sb + g->h * p->rh_sh + l * p->rh_sr; /* [s] */
        float *rw = p->rel_w + b * p->rw_sb + g->h * p->rw_sh + l * p->rw_sr; /* [s] */
        for (int64_t a = 0; a < s; a++) rh[a] = th[lh - a + s - 1];
        for (int64_t a = 0; a < s; a++) rw[a] = tw[lw - a + s - 1];
    }
}

/* vitc__nn_relpos_forward's terms through two GEMMs per head: every
 * query against all 2s-1 table rows (twice the dot products it needs, but
 * at GEMM speed rather than one dot at a time), then a gather. q rows of
 * all B windows are one matrix: its rows are q_sr apart throughout
 * (q_sb == L * q_sr). T: [2, B*L, 2s-1] scratch. */
static void sam_relpos(const vitc__nn_relpos *p, float *T) {
    const int64_t s = p->gh, L = s * s, r = 2 * s - 1, R = p->B * L;
    for (int64_t h = 0; h < p->H; h++) {
        const float *q = p->q + h * p->q_sh; /* [R, D] rows q_sr apart */
        vitc__gemm(0, 1, R, r, p->D, 1.0f, q, p->q_sr, p->tab_h, p->D, 0.0f, T, r);
        vitc__gemm(0, 1, R, r, p->D, 1.0f, q, p->q_sr, p->tab_w, p->D, 0.0f, T + R * r, r);
        sam_gather g = {p, T, T + R * r, h};
        vitc__parallel_for(p->B, sam_gather_one, &g);
    }
}

typedef struct sam_bufs {
    float *x, *mid, *ln; /* [N, max(C, O)] */
    float *big;          /* [N, max(3C, M, 3pp, 9O)]: qkv, the MLP's hidden, unfolded rows */
    float *qkvw, *attw;  /* [nW*ws*ws, 3C], [nW*ws*ws, C] (windowed blocks) */
    float *rh, *rw;      /* [B, H, L, s] relative terms */
    float *T;            /* [2, B*L, 2s-1] */
    float *wtmp;         /* [largest N*K] a stale fp32 pack unpacked, or NULL */
} sam_bufs;

/* o [B, L, C] = attention of the B grids of s x s tokens whose qkv rows
 * [B, L, 3C] are qkv, with block ly's relative positions. */
static vitc_status sam_attention(const vitc__sam_enc *e, const vitc__sam_layer *ly,
                                 const float *qkv, int64_t B, int64_t s, float *o,
                                 const sam_bufs *b) {
    const int64_t C = e->C, H = e->H, d = C / H, L = s * s;
    vitc__sdpa_desc sd = {
        .B = B, .H = H, .L = L, .S = L, .D = d, .Dv = d,
        .q = qkv, .q_sb = L * 3 * C, .q_sh = d, .q_sr = 3 * C,
        .k = qkv + C, .k_sb = L * 3 * C, .k_sh = d, .k_sr = 3 * C,
        .v = qkv + 2 * C, .v_sb = L * 3 * C, .v_sh = d, .v_sr = 3 * C,
        .o = o, .o_sb = L * C, .o_sh = d, .o_sr = C,
        .scale = 1.0f / sqrtf((float)d),
    };
    if (e->use_rel) {
        vitc__nn_relpos rp = {
            .B = B, .H = H, .gh = s, .gw = s, .D = d,
            .q = qkv, .q_sb = L * 3 * C, .q_sh = d, .q_sr = 3 * C,
            .tab_h = ly->rel_h, .tab_w = ly->rel_w,
            .rel_h = b->rh, .rh_sb = H * L * s, .rh_sh = L * s, .rh_sr = s,
            .rel_w = b->rw, .rw_sb = H * L * s, .rw_sh = L * s, .rw_sr = s,
        };
        sam_relpos(&rp, b->T);
        vitc__nn_relpos_view(&rp, &sd);
    }
    return vitc__sdpa(&sd);
}

static int64_t sam_max(int64_t a, int64_t b) { return a > b ? a : b; }

static vitc_status sam_forward(const vitc__sam_enc *e, const float *pixels, float *emb,
                               float *emb_cl, const sam_bufs *b) {
    const int64_t g = e->grid, N = g * g, C = e->C, M = e->M, O = e->O, P = e->patch;
    const int64_t K = 3 * P * P, ws = e->ws, nw = ws > 0 ? (g + ws - 1) / ws : 0;
    const int tail = e->depth * VITC__SAM_PW_LAYER;
    sam_wt w;
    float *x = b->x, *mid = b->mid, *ln = b->ln, *big = b->big; /* [N, .] rows */
    /* patches: a GEMM on the unfolded image, the position table in its epilogue */
    vitc__nn_unfold(big, pixels, 0, 1, 3, e->img, e->img, P, P, 0);
    w = sam_weight(e, tail, b->wtmp);
    VITC_TRY(vitc__linear_pw(x, C, big, K, w.pw, w.W, e->patch_b, e->pos, C, N, C, K,
                             VITC__ACT_NONE));
    for (int i = 0; i < e->depth; i++) {
        const vitc__sam_layer *l = &e->layers[i];
        /* ln's rows are read only by the linear layers they feed (then ln
         * is scratch): the packers may leave them unwritten (y_unused) */
        vitc__ln_pre n1 = {ln, x, l->ln1_w, l->ln1_b, e->eps, 1};
        const int pi = i * VITC__SAM_PW_LAYER;
        w = sam_weight(e, pi + VITC__SAM_PW_QKV, b->wtmp);
        VITC_TRY(vitc__linear_pw_ln(big, 3 * C, &n1, w.pw, w.W, l->qkv_b, N, 3 * C, C,
                                    VITC__ACT_NONE));
        if (e->global[i]) {
            VITC_TRY(sam_attention(e, l, big, 1, g, ln, b)); /* ln is free: att [N, C] */
        } else { /* padding after LN1: a padded token's qkv is the bias */
            sam_win pw = {big, b->qkvw, l->qkv_b, g, ws, nw, 3 * C};
            vitc__parallel_for(nw * nw, sam_partition_one, &pw);
            VITC_TRY(sam_attention(e, l, b->qkvw, nw * nw, ws, b->attw, b));
            sam_win uw = {b->attw, ln, NULL, g, ws, nw, C};
            vitc__parallel_for(nw * nw, sam_unpartition_one, &uw);
        }
        w = sam_weight(e, pi + VITC__SAM_PW_PROJ, b->wtmp);
        VITC_TRY(vitc__linear_pw(mid, C, ln, C, w.pw, w.W, l->proj_b, x, C, N, C, C,
                                 VITC__ACT_NONE));
        vitc__ln_pre n2 = {ln, mid, l->ln2_w, l->ln2_b, e->eps, 1};
        w = sam_weight(e, pi + VITC__SAM_PW_FC1, b->wtmp);
        VITC_TRY(vitc__linear_pw_ln(big, M, &n2, w.pw, w.W, l->fc1_b, N, M, C,
                                    vitc__nn_act_kernel(e->act)));
        w = sam_weight(e, pi + VITC__SAM_PW_FC2, b->wtmp);
        VITC_TRY(vitc__linear_pw(x, C, big, M, w.pw, w.W, l->fc2_b, mid, C, N, C, M,
                                 VITC__ACT_NONE));
    }
    /* neck, channels-last: LayerNorm2d is the row LayerNorm */
    w = sam_weight(e, tail + 1, b->wtmp);
    VITC_TRY(vitc__linear_pw(mid, O, x, C, w.pw, w.W, NULL, NULL, 0, N, O, C, VITC__ACT_NONE));
    vitc__layernorm(ln, mid, e->nln1_w, e->nln1_b, N, O, SAM_NECK_EPS);
    vitc__nn_unfold(big, ln, 1, 1, O, g, g, 3, 1, 1); /* [N, O*9] in conv2's (c, ky, kx) order */
    w = sam_weight(e, tail + 2, b->wtmp);
    VITC_TRY(vitc__linear_pw(mid, O, big, 9 * O, w.pw, w.W, NULL, NULL, 0, N, O, 9 * O,
                             VITC__ACT_NONE));
    vitc__layernorm(emb_cl, mid, e->nln2_w, e->nln2_b, N, O, SAM_NECK_EPS);
    for (int64_t n = 0; n < N; n++) /* emb [O, N] = emb_cl^T */
        for (int64_t c = 0; c < O; c++) emb[c * N + n] = emb_cl[n * O + c];
    return VITC_OK;
}

vitc_status vitc__sam_enc_forward(const vitc__sam_enc *e, const float *pixels, float *emb,
                                  float *emb_cl) {
    const int64_t g = e->grid, N = g * g, C = e->C, H = e->H, O = e->O, P = e->patch;
    const int64_t ws = e->ws, nw = ws > 0 ? (g + ws - 1) / ws : 0;
    int windowed = 0, global = 0;
    for (int i = 0; i < e->depth; i++) {
        if (e->global[i])
            global = 1;
        else
            windowed = 1;
    }
    const int64_t Lw = ws * ws, Np = windowed ? nw * nw * Lw : 0; /* padded window tokens */
    /* relative terms [B, H, L, s] and the GEMM scratch [2, B*L, 2s-1] of the
     * largest user: every window together, or the one grid */
    int64_t nrel = 0, nT = 0;
    if (e->use_rel) {
        if (windowed)
            nrel = Np * H * ws, nT = 2 * Np * (2 * ws - 1);
        if (global)
            nrel = sam_max(nrel, N * H * g), nT = sam_max(nT, 2 * N * (2 * g - 1));
    }
    const int64_t wide = sam_max(C, O);
    const int64_t nbig = N * sam_max(sam_max(3 * C, e->M), sam_max(3 * P * P, 9 * O));
    const int64_t sizes[8] = {N * wide, N * wide, N * wide, nbig, Np * 3 * C, Np * C, nrel, nrel};
    /* stale fp32 packs (sam_stale): room for the largest matrix */
    int64_t nw_tmp = 0;
    for (int i = 0; e->pw && i < e->depth * VITC__SAM_PW_LAYER + 3; i++) {
        int64_t Nw, Kw;
        (void)sam_home(e, i, &Nw, &Kw);
        if (sam_stale(&e->pw[i]))
            nw_tmp = sam_max(nw_tmp, Nw * Kw);
    }
    int64_t total = nT + nw_tmp;
    for (int k = 0; k < 8; k++) total += sizes[k];
    size_t bytes;
    float *arena = NULL;
    if (vitc__mul_size((size_t)total, sizeof(float), &bytes))
        arena = malloc(bytes);
    if (!arena)
        return vitc__err(VITC_ERR_NOMEM, "SAM encoder: out of memory for %.0f MiB of "
                         "activations", (double)total * 4.0 / 1048576.0);
    float *ptr[8], *q = arena;
    for (int k = 0; k < 8; k++) ptr[k] = q, q += sizes[k];
    sam_bufs b = {ptr[0], ptr[1], ptr[2], ptr[3], ptr[4], ptr[5], ptr[6], ptr[7], q,
                  nw_tmp ? q + nT : NULL};
    vitc_status s = sam_forward(e, pixels, emb, emb_cl, &b);
    free(arena);
    return s;
}
