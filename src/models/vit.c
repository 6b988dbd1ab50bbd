/*
 * vit.c — the Vision Transformer forward (torchvision 0.14's
 * VisionTransformer in eval mode), batched: all B*N token rows of a batch go
 * through each GEMM together.
 *
 *   x = conv_proj(images) as im2col @ W^T        [B, P, C], P = (H/p)(W/p)
 *   x = cat(class_token, x) + pos_embedding      [B, N, C], N = 1 + P
 *   per block:  x = x + out_proj(MHA(ln_1(x)))
 *               x = x + mlp(ln_2(x))             Linear, GELU(erf), Linear
 *   logits = heads(ln(x)[:, 0])                  [B, classes]
 *
 * The blocks themselves (patch embedding and position resampling, the
 * encoder block, attention, MLP), each beside its backward, are src/nn/'s;
 * this file runs them per family (tokens, heads, embeddings). Loading:
 * load.c (the router), families/ and model.c (the parameter table); the
 * backward: vit_backward.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "../rng.h"
#include "../train/train.h"
#include "family.h"
#include "text.h"
#include "vit_internal.h"

void vitc_vit_free(vitc_vit *m) {
    if (!m)
        return;
    vitc__handle_unregister(m->id);
    vitc__vit_pack_free(m);
    if (!m->weights_file)
        vitc__free(m->params);
    vitc_safetensors_free(m->weights_file);
    vitc__free(m->grad);
    free(m->table);
    free(m->names);
    free(m->blocks);
    free(m->gblocks);
    free(m->labels);
    free(m->label_text);
    vitc_session_free(m->own);
    vitc__text_free(m->text);
    free(m->ignored);
    free(m);
}

const vitc_vit_config *vitc_vit_get_config(const vitc_vit *m) { return m ? &m->cfg : NULL; }
const char *vitc_vit_arch_name(const vitc_vit *m) { return m ? m->arch : NULL; }

const char *vitc_vit_label(const vitc_vit *m, int index) {
    if (!m || !m->labels || index < 0 || index >= m->cfg.num_classes)
        return NULL;
    return m->labels[index];
}

/* ------------------------------------------------------------------ */
/* Position embedding resampling                                      */
/* ------------------------------------------------------------------ */

vitc_status vitc__vit_pos_backward(const vitc_vit *m, float *dsrc, const float *ddst, int64_t gh,
                                   int64_t gw) {
    int64_t g = m->cfg.image_size / m->cfg.patch_size;
    return vitc__nn_resample_backward((int)m->pos_rule, dsrc, ddst, m->cfg.hidden_dim, g, g, gh,
                                      gw);
}

/* s->pos_used for a gh x gw grid: the checkpoint's own when it matches,
 * else resampled as torchvision's interpolate_embeddings does (the class
 * token's row kept, the patch rows as a [C, g, g] image, bicubic), once per
 * grid while the parameters do not move (wversion: vitc_vit_param, loading
 * a state, an optimizer step). */
static vitc_status vit_position_embedding(const vitc_vit *m, vitc__session *s, int64_t gh,
                                         int64_t gw) {
    int64_t g = m->cfg.image_size / m->cfg.patch_size, C = m->cfg.hidden_dim;
    int64_t np = m->n_prefix - m->n_reg; /* rows before the patch rows: registers have none */
    if (gh == g && gw == g) {
        s->pos_used = m->w.pos;
        return VITC_OK;
    }
    if (s->pos_buf.p && s->pos_ver == m->wversion + 1 && s->pos_gh == gh && s->pos_gw == gw) {
        s->pos_used = s->pos_buf.p;
        return VITC_OK;
    }
    int aa = m->pos_rule == VIT_POS_ANTIALIAS;
    if (aa && (gh > 1024 || gw > 1024 || g > 15 * gh || g > 15 * gw))
        return vitc__err(VITC_ERR_SHAPE, "antialiased position embedding from a %lldx%lld grid "
                         "to %lldx%lld is out of vitc's range (grids up to 1024, shrinking at "
                         "most 15x)", (long long)g, (long long)g, (long long)gh, (long long)gw);
    size_t n, t;
    if (!vitc__mul_size((size_t)(gh * gw + np), (size_t)C, &n) ||
        !vitc__mul_size((size_t)(g * gw), (size_t)C, &t) || !vitc__add_size(n, t, &t))
        return vitc__err(VITC_ERR_NOMEM, "position embedding for a %lldx%lld grid overflows",
                         (long long)gh, (long long)gw);
    s->pos_gh = s->pos_gw = 0;
    VITC_TRY(vitc__buf_reserve(&s->pos_buf, aa ? t : n));
    /* The class (and distillation) rows are kept as they are. */
    memcpy(s->pos_buf.p, m->w.pos, (size_t)(np * C) * sizeof(float));
    VITC_TRY(vitc__nn_resample((int)m->pos_rule, s->pos_buf.p + np * C, s->pos_buf.p + n,
                               m->w.pos + np * C, C, g, g, gh, gw));
    s->pos_gh = (int)gh;
    s->pos_gw = (int)gw;
    s->pos_ver = m->wversion + 1;
    s->pos_used = s->pos_buf.p;
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Activations                                                        */
/* ------------------------------------------------------------------ */

/* Carve s->act for a forward of B images of P patches: training keeps
 * every block's activations (depth + 1 blocks, the last only VA_X),
 * inference one block with the aliases of vitc__vit_acts. Each buffer is
 * rounded to 16 floats (64 bytes). */
static vitc_status vit_activations(const vitc_vit *m, vitc__session *s, int64_t B, int64_t P,
                                  int training) {
    const vitc_vit_config *c = &m->cfg;
    size_t N = (size_t)P + (size_t)m->n_prefix, C = (size_t)c->hidden_dim, K = 0, rows = 0, prow = 0,
           sz[VA_COUNT] = {0}, patches = 0,
           cls = 0, block = 0, total = 0, nblocks = training ? (size_t)c->depth + 1 : 1;
    int ok = vitc__mul_size((size_t)c->in_channels * (size_t)c->patch_size,
                            (size_t)c->patch_size, &K) &&
             vitc__mul_size((size_t)B, N, &rows) && vitc__mul_size((size_t)B, (size_t)P, &prow) &&
             vitc__mul_size(prow, K, &patches) && vitc__mul_size((size_t)B, C, &cls) &&
             vitc__mul_size(rows, C, &sz[VA_X]) && vitc__mul_size(rows, 3 * C, &sz[VA_QKV]) &&
             vitc__mul_size(rows, (size_t)c->mlp_dim, &sz[VA_HPRE]) &&
             vitc__mul_size(rows, (size_t)c->num_heads, &sz[VA_LSE]);
    sz[VA_LN1] = sz[VA_ATT] = sz[VA_MID] = sz[VA_LN2] = sz[VA_X];
    sz[VA_HACT] = sz[VA_HPRE];
    int probs = training && m->attention_dropout > 0.0f;
    ok = ok && vitc__mul_size(sz[VA_LSE], N, &sz[VA_PROBS]);
    /* Inference: what backward alone needs shares a buffer. */
    int alias[VA_COUNT] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    if (!training)
        alias[VA_LN2] = VA_LN1, alias[VA_HACT] = VA_HPRE, alias[VA_LSE] = VA_X;
    if (!probs)
        alias[VA_PROBS] = VA_X;
    for (int k = 0; ok && k < VA_COUNT; k++) {
        if (alias[k] >= 0) {
            s->a.off[k] = s->a.off[alias[k]];
            continue;
        }
        s->a.off[k] = block;
        ok = vitc__add_size(sz[k], 15, &sz[k]) && vitc__add_size(block, sz[k] & ~(size_t)15, &block);
    }
    size_t layers;
    ok = ok && vitc__mul_size(block, nblocks, &layers) && vitc__add_size(patches, 15, &patches) &&
         vitc__add_size(cls, 15, &cls) && vitc__add_size(layers, patches & ~(size_t)15, &total) &&
         vitc__add_size(total, 2 * (cls & ~(size_t)15), &total);
    if (!ok)
        return vitc__err(VITC_ERR_NOMEM, "ViT activations for batch %lld, %lld patches overflow",
                         (long long)B, (long long)P);
    VITC_TRY(vitc__buf_reserve(&s->act, total));
    vitc__vit_acts *a = &s->a;
    a->B = B, a->N = (int64_t)N, a->P = P, a->training = training, a->probs = probs;
    a->layers = s->act.p;
    a->stride = training ? block : 0;
    a->patches = a->layers + layers;
    a->cls_in = a->patches + (patches & ~(size_t)15);
    a->cls_out = a->cls_in + (cls & ~(size_t)15);
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Forward                                                            */
/* ------------------------------------------------------------------ */

typedef struct vit_tokens_ctx {
    const vitc_vit *m;
    const float *pos;  /* [N, C] the position embedding used */
    const float *proj; /* [B*P, C] */
    float *x;          /* [B, N, C] */
    int64_t P, N, C;
} vit_tokens_ctx;

/* Image b's tokens [cls, dist (DeiT), registers (DINOv2), patches] plus
 * the position embedding; registers get none, npos rows of it come before
 * the patches'. */
static void vit_tokens_task(void *ctx, int64_t b, int tid) {
    const vit_tokens_ctx *t = ctx;
    const vitc_vit *m = t->m;
    const float *pos = t->pos;
    int64_t C = t->C, np = m->n_prefix, npos = np - m->n_reg, nc = m->n_cls;
    float *xb = t->x + b * t->N * C; /* [N, C] */
    (void)tid;
    if (nc)
        for (int64_t j = 0; j < C; j++) xb[j] = m->w.cls[j] + pos[j];
    if (m->n_dist)
        for (int64_t j = 0; j < C; j++) xb[nc * C + j] = m->w.dist[j] + pos[nc * C + j];
    if (m->n_reg)
        memcpy(xb + npos * C, m->w.reg, (size_t)(m->n_reg * C) * sizeof(float));
    for (int64_t p = 0; p < t->P; p++) {
        const float *src = t->proj + (b * t->P + p) * C;
        float *dst = xb + (p + np) * C;
        for (int64_t j = 0; j < C; j++) dst[j] = src[j] + pos[(p + npos) * C + j];
    }
}

/* Folds one layer's probabilities into the rollout (see docs/vit.md):
 * A = mean over heads + I, rows renormalised, R = A @ R. */
static void vit_rollout_step(const vitc_vit *m, vitc__session *s, const float *probs, int64_t B,
                             int64_t N, int first) {
    int64_t Hh = m->cfg.num_heads;
    float *R = s->roll_buf.p;       /* [B, N, N] */
    float *A = R + B * N * N;       /* [N, N] */
    float *T = A + N * N;           /* [N, N] */
    float inv_h = 1.0f / (float)Hh;
    for (int64_t b = 0; b < B; b++) {
        const float *pb = probs + b * Hh * N * N; /* [H, N, N] */
        for (int64_t i = 0; i < N * N; i++) {
            float s = 0.0f;
            for (int64_t h = 0; h < Hh; h++) s += pb[h * N * N + i];
            A[i] = s * inv_h;
        }
        for (int64_t i = 0; i < N; i++) {
            float *row = A + i * N, sum = 0.0f;
            row[i] += 1.0f;
            for (int64_t j = 0; j < N; j++) sum += row[j];
            for (int64_t j = 0; j < N; j++) row[j] /= sum;
        }
        float *Rb = R + b * N * N;
        if (first) {
            memcpy(Rb, A, (size_t)(N * N) * sizeof(float));
        } else {
            vitc__gemm(0, 0, N, N, N, 1.0f, A, N, Rb, N, 0.0f, T, N);
            memcpy(Rb, T, (size_t)(N * N) * sizeof(float));
        }
    }
}

/* timm's stochastic depth rule: rates rising linearly from 0 at the first
 * block to drop_path at the last (torch.linspace(0, drop_path, depth)). */
static float vit_drop_path_rate(const vitc_vit *m, int l) {
    int d = m->cfg.depth;
    return d > 1 ? m->drop_path * (float)l / (float)(d - 1) : 0.0f;
}

vitc__nn_block vitc__vit_block_desc(const vitc_vit *m, vitc__session *s, int l, float *probs) {
    const vitc_vit_config *c = &m->cfg;
    const vitc__vit_acts *a = &s->a;
    vitc__vit_mask k = vitc__vit_block_mask(m, s, l); /* training with regularisation */
    vitc__nn_block b = {
        .w = &m->blocks[l], .pw = s->use_packed ? &m->pw[l * VIT_PW_COUNT] : NULL,
        .B = a->B, .N = a->N, .C = c->hidden_dim, .H = c->num_heads, .M = c->mlp_dim,
        .eps = c->norm_eps, .attn_scale = m->attn_scale, .act = m->mlp_act, .swiglu = m->swiglu,
        .attn_prec = a->training ? VITC_PRECISION_FP32 : vitc_vit_get_attention_precision(m),
        .dropout = m->dropout, .attention_dropout = m->attention_dropout,
        .drop_path = vit_drop_path_rate(m, l), .rng = s->rng,
        .k = {k.att, k.hid, k.out, k.dp_att, k.dp_mlp, k.probs},
        .x = vitc__va(a, l, VA_X), .ln1 = vitc__va(a, l, VA_LN1), .qkv = vitc__va(a, l, VA_QKV),
        .att = vitc__va(a, l, VA_ATT), .lse = vitc__va(a, l, VA_LSE), .mid = vitc__va(a, l, VA_MID),
        .ln2 = vitc__va(a, l, VA_LN2), .hpre = vitc__va(a, l, VA_HPRE),
        .hact = vitc__va(a, l, VA_HACT), .y = vitc__va(a, l + (a->training ? 1 : 0), VA_X),
        .pkeep = vitc__va(a, l, VA_PROBS), .probs = probs, .tmp = &s->pdrop,
        .mask_buf = &s->mask_buf,
    };
    return b;
}

/* One encoder block l on s->a (nn/block.c). cls_only: queries, out_proj,
 * LayerNorm and MLP only for the class token (row 0 of each image; every
 * row's keys and values still) — the same numbers for those rows, ~7%
 * fewer FLOPs for the last block of ViT-B/16; the rows after the attention
 * are then [B, C] compact and *out points at them. probs [B, H, N, N] may
 * be NULL. */
static vitc_status vit_block(const vitc_vit *m, vitc__session *s, int l, int cls_only, float *probs,
                            const float **out) {
    vitc__nn_block b = vitc__vit_block_desc(m, s, l, probs);
    VITC_TRY(vitc__nn_block_forward(&b, cls_only));
    if (out)
        *out = b.y;
    return VITC_OK;
}

/* A classifier: CLIP's projection and SigLIP's head give embeddings. */
int vitc_vit_has_head(const vitc_vit *m) {
    return m && (m->head == VIT_HEAD_CLS || m->head == VIT_HEAD_MEAN2 ||
                 m->head == VIT_HEAD_CLS_MEAN || m->head == VIT_HEAD_LINEAR);
}

void vitc__vit_cls_mean(float *in, const float *h, int64_t B, int64_t N, int64_t C, int64_t np) {
    for (int64_t b = 0; b < B; b++) {
        float *r = in + b * 2 * C; /* [2C] */
        memcpy(r, h + b * N * C, (size_t)C * sizeof(float));
        for (int64_t j = 0; j < C; j++) r[C + j] = 0.0f;
        for (int64_t tk = np; tk < N; tk++)
            for (int64_t j = 0; j < C; j++) r[C + j] += h[(b * N + tk) * C + j];
        for (int64_t j = 0; j < C; j++) r[C + j] /= (float)(N - np);
    }
}

/* Dinov2ForImageClassification: logits = head([h[:, 0], mean(h[:, np:])]),
 * h = ln(y) on every token (registers excluded from the mean). */
static vitc_status vit_logits_cls_mean(const vitc_vit *m, vitc__session *s, const float *y,
                                      float *logits) {
    const vitc_vit_config *c = &m->cfg;
    int64_t B = s->a.B, N = s->a.N, C = c->hidden_dim, K = c->num_classes, np = m->n_prefix;
    size_t n, t;
    if (!vitc__mul_size((size_t)(B * N), (size_t)C, &n) ||
        !vitc__mul_size((size_t)B, (size_t)(2 * C), &t) || !vitc__add_size(n, t, &n))
        return vitc__err(VITC_ERR_NOMEM, "DINOv2 head for batch %lld overflows", (long long)B);
    VITC_TRY(vitc__buf_reserve(&s->feat_buf, n));
    float *h = s->feat_buf.p, *in = h + B * N * C; /* [B, N, C], [B, 2C] */
    vitc__layernorm(h, y, m->w.ln_w, m->w.ln_b, B * N, C, c->norm_eps);
    vitc__vit_cls_mean(in, h, B, N, C, np);
    vitc__linear(logits, K, in, 2 * C, m->w.head_w, m->w.head_b, NULL, 0, B, K, 2 * C);
    return VITC_OK;
}

/* DeiT with teacher: logits = (head(ln(x)[:, 0]) + head2(ln(x)[:, 1])) / 2,
 * y the last block's [B, N, C] output. */
static vitc_status vit_logits_mean2(const vitc_vit *m, vitc__session *s, const float *y,
                                   float *logits) {
    const vitc_vit_config *c = &m->cfg;
    int64_t B = s->a.B, N = s->a.N, C = c->hidden_dim, K = c->num_classes;
    size_t n;
    if (!vitc__mul_size((size_t)B, (size_t)(2 * C + K), &n))
        return vitc__err(VITC_ERR_NOMEM, "DeiT heads for batch %lld overflow", (long long)B);
    VITC_TRY(vitc__buf_reserve(&s->feat_buf, n));
    float *t = s->feat_buf.p, *d = t + 2 * B * C; /* [B, 2, C], [B, K] */
    for (int64_t b = 0; b < B; b++)
        memcpy(t + b * 2 * C, y + b * N * C, (size_t)(2 * C) * sizeof(float));
    vitc__layernorm(t, t, m->w.ln_w, m->w.ln_b, 2 * B, C, c->norm_eps);
    vitc__linear(logits, K, t, 2 * C, m->w.head_w, m->w.head_b, NULL, 0, B, K, C);
    vitc__linear(d, K, t + C, 2 * C, m->w.head2_w, m->w.head2_b, NULL, 0, B, K, C);
    for (int64_t i = 0; i < B * K; i++) logits[i] = (logits[i] + d[i]) * 0.5f;
    return VITC_OK;
}

/* The whole forward. logits, attn, rollout, features ([B, N, C]: every
 * token after the final LayerNorm) may each be NULL. cls: the class tokens
 * after the final LayerNorm into s->a.cls_out [B, C] (embeddings that need
 * no other token: the last block then runs for the class rows only). */
static vitc_status vit_embed(const vitc_vit *m, vitc__session *s, const float *images, int B,
                             int H, int W, vitc_pool pool, float *out);

/* VIT_HEAD_LINEAR (vitc_vit_reset_head on an embedding tower): logits =
 * clf(embedding) [B, K], the embedding [B, E] kept in s->clf_buf (a training
 * forward records the tower under it for backward). */
static vitc_status vit_linear_head(const vitc_vit *m, vitc__session *s, const float *images,
                                   int B, int H, int W, float *logits) {
    int64_t E = m->embed_dim, K = m->cfg.num_classes;
    size_t n;
    if (B < 1 || !vitc__mul_size((size_t)B, 2 * (size_t)E, &n))
        return vitc__err(VITC_ERR_SHAPE, "ViT forward: batch %d of %lld-wide embeddings", B,
                         (long long)E);
    VITC_TRY(vitc__buf_reserve(&s->clf_buf, n));
    float *e = s->clf_buf.p; /* [B, E] */
    int want = s->rec_want;
    s->rec_want = m->training;
    vitc_status st = vit_embed(m, s, images, B, H, W, VITC_POOL_DEFAULT, e);
    s->rec_want = want;
    VITC_TRY(st);
    vitc__linear(logits, K, e, E, m->w.clf_w, m->w.clf_b, NULL, 0, B, K, E);
    return VITC_OK;
}

/* The hidden state after `stage` blocks (0: the embeddings), y [B, N, C],
 * into every tap that asks for it: the inference activations are reused
 * block to block, so the rows are copied out as each block ends. */
static void vit_taps(const vitc_vit *m, const vitc__session *s, const float *y, int stage) {
    int64_t rows = s->a.B * s->a.N, C = m->cfg.hidden_dim;
    for (int i = 0; i < s->n_taps; i++) {
        if (s->taps[i] != stage)
            continue;
        float *o = s->tap_out + (size_t)i * (size_t)(rows * C); /* [B, N, C] */
        if (s->tap_norm)
            vitc__layernorm(o, y, m->w.ln_w, m->w.ln_b, rows, C, m->cfg.norm_eps);
        else
            memcpy(o, y, (size_t)(rows * C) * sizeof(float));
    }
}

static vitc_status vit_run(const vitc_vit *m, vitc__session *s, const float *images, int B_, int H_,
                           int W_, float *logits, float *attn, float *rollout, float *features,
                           int cls) {
    if (!m || !s || !images)
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT forward: NULL model or images");
    if (logits && !vitc_vit_has_head(m))
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT forward: this %s model is a backbone with no "
                         "classification head; ask for embeddings (vitc_vit_embed)", m->family);
    if (logits && m->head == VIT_HEAD_LINEAR)
        return vit_linear_head(m, s, images, B_, H_, W_, logits);
    const vitc_vit_config *c = &m->cfg;
    if (B_ < 1 || H_ < 1 || W_ < 1)
        return vitc__err(VITC_ERR_SHAPE, "ViT forward: images [%d, %d, %d, %d] must be non-empty",
                         B_, c->in_channels, H_, W_);
    if (H_ % c->patch_size || W_ % c->patch_size)
        return vitc__err(VITC_ERR_SHAPE,
                         "ViT forward: images [%d, %d, %d, %d]: height and width must be "
                         "multiples of the patch size %d",
                         B_, c->in_channels, H_, W_, c->patch_size);
    int64_t B = B_, H = H_, W = W_, p = c->patch_size, Cin = c->in_channels;
    int64_t gh = H / p, gw = W / p, P = gh * gw, np = m->n_prefix, N = P + np, C = c->hidden_dim;
    int64_t Hh = c->num_heads, K = Cin * p * p;
    if (m->t2t && (gh != c->image_size / p || gw != c->image_size / p))
        return vitc__err(VITC_ERR_SHAPE, "T2T-ViT forward: images [%d, %d, %d, %d]: this model "
                         "takes %dx%d images (its sinusoid position table has %d tokens)", B_,
                         c->in_channels, H_, W_, c->image_size, c->image_size,
                         (c->image_size / c->patch_size) * (c->image_size / c->patch_size));
    /* A training forward of logits (or of the primary embedding: vitc_vit_run sets
     * rec_want) on the model's own session records every block for backward. */
    int record = s->own && m->training && (logits || s->rec_want) && !attn && !rollout;
    s->recorded = 0;
    /* The weights as the model API or vitc_vit_prepare left them: this
     * forward only reads the model. */
    VITC_TRY(vitc__vit_weights_check(m, &s->use_packed));
    VITC_TRY(vit_activations(m, s, B, P, record));
    VITC_TRY(vit_position_embedding(m, s, gh, gw));
    const vitc__vit_acts *a = &s->a;
    s->mask_stride = 0;
    if (record && (m->dropout > 0.0f || m->drop_path > 0.0f || m->attention_dropout > 0.0f)) {
        /* Keep masks, bytes: the embedding's, then per block (vitc__vit_mask). */
        size_t BNC, BNM, BHNN = 0, per = 0, total = 0;
        int ok = vitc__mul_size((size_t)(B * N), (size_t)C, &BNC) &&
                 vitc__mul_size((size_t)(B * N), (size_t)c->mlp_dim, &BNM) &&
                 (!a->probs || vitc__mul_size((size_t)(B * N * Hh), (size_t)N, &BHNN)) &&
                 vitc__add_size(2 * BNC, BNM, &per) && vitc__add_size(per, 2 * (size_t)B, &per) &&
                 vitc__add_size(per, BHNN, &per) &&
                 vitc__mul_size(per, (size_t)c->depth, &total) &&
                 vitc__add_size(total, BNC + 3, &total);
        if (!ok)
            return vitc__err(VITC_ERR_NOMEM, "ViT dropout masks overflow");
        VITC_TRY(vitc__buf_reserve(&s->masks, total / 4 + 1));
        s->mask_stride = per;
    }

    size_t per_layer = 0, roll = 0;
    if (attn || rollout) {
        /* B*H*N*N and B*N*N + 2*N*N, checked (N*N itself fits: N <= B*N). */
        size_t nn;
        int ok = vitc__mul_size((size_t)N, (size_t)N, &nn) &&
                 vitc__mul_size(nn, (size_t)(B * Hh), &per_layer) &&
                 vitc__mul_size(nn, (size_t)B + 2, &roll);
        if (!ok)
            return vitc__err(VITC_ERR_NOMEM, "attention maps [%lld, %lld, %lld, %lld] overflow",
                             (long long)B, (long long)Hh, (long long)N, (long long)N);
        if (!attn)
            VITC_TRY(vitc__buf_reserve(&s->probs_buf, per_layer));
        if (rollout)
            VITC_TRY(vitc__buf_reserve(&s->roll_buf, roll));
    }

    float *proj = vitc__va(a, 0, VA_LN1); /* [B*P, C] */
    if (m->fam && m->fam->embed) { /* the family's own (T2T-ViT's tokens_to_token) */
        VITC_TRY(m->fam->embed(m, s, images, B, H, W, proj));
    } else { /* Patch embedding: conv k = s = p is one GEMM over im2col rows. */
        vitc__nn_unfold(a->patches, images, 0, B, Cin, H, W, p, p, 0);
        const vitc__pweight *pconv = s->use_packed && m->pconv.data ? &m->pconv : NULL;
        VITC_TRY(vitc__linear_pw(proj, C, a->patches, K, pconv,
                                 m->w.conv_w, m->w.conv_b, NULL, 0, B * P, C, K, 0));
    }
    /* [cls, dist (DeiT), registers (DINOv2), patches] plus position embeddings */
    vit_tokens_ctx tc = {m, s->pos_used, proj, vitc__va(a, 0, VA_X), P, N, C};
    vitc__parallel_for(B, vit_tokens_task, &tc);

    if (m->pre_norm && record) { /* backward reads pre_layrnorm's input */
        VITC_TRY(vitc__buf_reserve(&s->pre_buf, (size_t)(B * N * C)));
        memcpy(s->pre_buf.p, vitc__va(a, 0, VA_X), (size_t)(B * N * C) * sizeof(float));
    }
    if (m->pre_norm) /* CLIP's pre_layrnorm */
        vitc__layernorm(vitc__va(a, 0, VA_X), vitc__va(a, 0, VA_X), m->w.pre_w, m->w.pre_b, B * N, C,
                        c->norm_eps);
    uint8_t *emb = vitc__vit_emb_mask(s); /* Encoder's dropout(input + pos) */
    if (emb && m->dropout > 0.0f) {
        vitc__dropout_mask(emb, B * N * C, m->dropout, s->rng);
        vitc__dropout_apply(vitc__va(a, 0, VA_X), vitc__va(a, 0, VA_X), emb, B * N * C, m->dropout);
    }

    /* Logits and class-token embeddings need only the class tokens out of
     * the last block; the maps need every row. So does a training forward
     * whose last block is regularised (masks over every row); else backward
     * reads the class rows alone too (vit_backward.c). */
    if (s->n_taps) /* stage 0: the embeddings */
        vit_taps(m, s, vitc__va(a, 0, VA_X), 0);
    const float *y = NULL; /* the last block's output: [B, C] cls_only, else [B, N, C] */
    /* ... with the built-in GEMM only, whose rows do not depend on the
     * others: OpenBLAS picks its kernels by shape, and on a Zen 3 the class
     * rows computed alone differed in their last bits from the same rows
     * in the whole batch (embed and features then disagreed). */
    int compact = ((logits && m->head == VIT_HEAD_CLS) || cls) && !features && !attn &&
                  !rollout && m->n_cls && !strcmp(vitc_get_gemm_backend(), "builtin") &&
                  (!record || (m->dropout == 0.0f && m->drop_path == 0.0f &&
                               m->attention_dropout == 0.0f));
    for (int l = 0; l < c->depth; l++) {
        int cls_only = compact && l == c->depth - 1;
        float *probs = NULL; /* [B, H, N, N] */
        if (attn)
            probs = attn + (size_t)l * per_layer;
        else if (rollout)
            probs = s->probs_buf.p;
        VITC_TRY(vit_block(m, s, l, cls_only, probs, &y));
        if (s->n_taps)
            vit_taps(m, s, y, l + 1);
        if (rollout)
            vit_rollout_step(m, s, probs, B, N, l == 0);
    }

    if (rollout)
        memcpy(rollout, s->roll_buf.p, (size_t)(B * N * N) * sizeof(float));
    if (features && m->final_cls_only) /* CLIP's last_hidden_state is not normed */
        memcpy(features, y, (size_t)(B * N * C) * sizeof(float));
    else if (features) /* HF's last_hidden_state: every token through the final LayerNorm */
        vitc__layernorm(features, y, m->w.ln_w, m->w.ln_b, B * N, C, c->norm_eps);
    if (logits && m->head == VIT_HEAD_MEAN2) {
        VITC_TRY(vit_logits_mean2(m, s, y, logits));
    } else if (logits && m->head == VIT_HEAD_CLS_MEAN) {
        VITC_TRY(vit_logits_cls_mean(m, s, y, logits));
    } else if (logits || cls) {
        int64_t ys = compact ? C : N * C; /* class rows of y */
        for (int64_t b = 0; b < B; b++)
            memcpy(a->cls_in + b * C, y + b * ys, (size_t)C * sizeof(float));
        vitc__layernorm(a->cls_out, a->cls_in, m->w.ln_w, m->w.ln_b, B, C, c->norm_eps);
    }
    if (logits && m->head == VIT_HEAD_CLS) {
        const vitc__pweight *phead = s->use_packed && m->phead.data ? &m->phead : NULL;
        VITC_TRY(vitc__linear_pw(logits, c->num_classes, a->cls_out, C, phead, m->w.head_w,
                                 m->w.head_b, NULL, 0, B, c->num_classes, C, 0));
    }
    if (record) {
        s->recorded = 1;
        s->rec_cls_only = compact;
        s->rec_gh = (int)gh;
        s->rec_gw = (int)gw;
    }
    return VITC_OK;
}

vitc_status vitc__vit_forward_layers(const vitc_vit *m, vitc__session *s, const float *images,
                                     int B, int H, int W, const int *stages, int n, int norm,
                                     float *outs) {
    if (!m || !s || !images || !stages || !outs || n < 1)
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT hidden states: NULL argument or no stage");
    if (m->t2t)
        return vitc__err(VITC_ERR_UNSUPPORTED, "ViT hidden states: not available for T2T-ViT "
                         "(its token module has no per-block taps)");
    for (int i = 0; i < n; i++)
        if (stages[i] < 0 || stages[i] > m->cfg.depth)
            return vitc__err(VITC_ERR_INVALID_ARG, "ViT hidden states: stage %d is outside "
                             "0..%d (the embeddings, then each block)", stages[i], m->cfg.depth);
    s->taps = stages, s->n_taps = n, s->tap_out = outs, s->tap_norm = norm;
    vitc_status st = vit_run(m, s, images, B, H, W, NULL, NULL, NULL, NULL, 0);
    s->taps = NULL, s->n_taps = 0, s->tap_out = NULL;
    return st;
}

/* ------------------------------------------------------------------ */
/* Sessions                                                           */
/* ------------------------------------------------------------------ */

static vitc_status vit_session_new(const vitc_vit *m, vitc__session **out) {
    vitc__session *s = calloc(1, sizeof *s);
    if (!s)
        return vitc__err(VITC_ERR_NOMEM, "vitc_session_create: out of memory");
    s->m = m;
    s->model_id = m->id;
    *out = s;
    return VITC_OK;
}

vitc_status vitc_session_create(const vitc_vit *m, vitc_session **out) {
    if (!m || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_session_create: NULL model or out");
    *out = NULL;
    return vit_session_new(m, out);
}

void vitc_session_free(vitc_session *s) {
    if (!s)
        return;
    vitc__buf *bufs[] = {&s->act, &s->bwd, &s->masks, &s->pdrop, &s->pos_buf, &s->probs_buf,
                         &s->roll_buf, &s->feat_buf, &s->head_buf, &s->mask_buf, &s->pre_buf,
                         &s->t2t_buf, &s->clf_buf, &s->text_buf};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) vitc__buf_free(bufs[i]);
    free(s);
}

vitc_status vitc__vit_own(vitc_vit *m, vitc__session **out) {
    if (!m->own) {
        VITC_TRY(vit_session_new(m, &m->own));
        m->own->own = 1;
        m->own->rng = &m->rng; /* training draws its masks from the model's stream */
    }
    *out = m->own;
    return VITC_OK;
}

vitc_status vitc_vit_prepare(vitc_vit *m) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_prepare: NULL model");
    if (m->training) { /* training forwards read the row-major weights */
        vitc__vit_rowmajor(m);
        return VITC_OK;
    }
    return vitc__vit_prepare_inference(m);
}

/* The model API: its own session, after bringing the weights up to date
 * (the model is the caller's alone here, so it may be written). */
static vitc_status vit_owner(vitc_vit *m, const char *fn, vitc__session **s) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL model", fn);
    VITC_TRY(vitc_vit_prepare(m));
    return vitc__vit_own(m, s);
}

/* A session's model, refused once freed (its id is never reused). */
static vitc_status vit_session_model(const vitc_session *s, const char *fn, const vitc_vit **m) {
    if (!s)
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL session", fn);
    if (!vitc__handle_alive(s->model_id))
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: the session's model was freed (free its "
                         "sessions before the model)", fn);
    *m = s->m;
    return VITC_OK;
}

/* The logits, or (features) the tokens forward_features gives, into out. */
static vitc_status vit_output(const vitc_vit *m, vitc__session *s, const float *images, int B,
                              int H, int W, float *out, int features) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT %s: NULL %s",
                         features ? "forward_features" : "forward", features ? "out" : "logits");
    return vit_run(m, s, images, B, H, W, features ? NULL : out, NULL, NULL, features ? out : NULL,
                   0);
}

static vitc_status vit_attention_maps(const vitc_vit *m, vitc__session *s, const float *images,
                                      int B, int H, int W, float *attn, float *rollout) {
    if (!attn && !rollout)
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT attention maps: attn and rollout are both "
                                               "NULL");
    return vit_run(m, s, images, B, H, W, NULL, attn, rollout, NULL, 0);
}

vitc_status vitc_vit_forward(vitc_vit *m, const float *images, int B, int H, int W,
                             float *logits) {
    vitc__session *s;
    VITC_TRY(vit_owner(m, "vitc_vit_forward", &s));
    return vit_output(m, s, images, B, H, W, logits, 0);
}

vitc_status vitc_vit_attention_maps(vitc_vit *m, const float *images, int B, int H, int W,
                                    float *attn, float *rollout) {
    vitc__session *s;
    VITC_TRY(vit_owner(m, "vitc_vit_attention_maps", &s));
    return vit_attention_maps(m, s, images, B, H, W, attn, rollout);
}

vitc_status vitc_session_forward(vitc_session *s, const float *images, int B, int H, int W,
                                 float *logits) {
    const vitc_vit *m = NULL;
    VITC_TRY(vit_session_model(s, "vitc_session_forward", &m));
    return vit_output(m, s, images, B, H, W, logits, 0);
}

vitc_status vitc_session_attention_maps(vitc_session *s, const float *images, int B, int H, int W,
                                        float *attn, float *rollout) {
    const vitc_vit *m = NULL;
    VITC_TRY(vit_session_model(s, "vitc_session_attention_maps", &m));
    return vit_attention_maps(m, s, images, B, H, W, attn, rollout);
}

/* ------------------------------------------------------------------ */
/* Embeddings                                                         */
/* ------------------------------------------------------------------ */

int vitc_vit_num_prefix_tokens(const vitc_vit *m) { return m ? m->n_prefix : 0; }
/* A classifier: CLIP's projection gives an embedding, not logits. */


/* SigLIP's attention-pooling head (SiglipMultiheadAttentionPoolingHead) on
 * the normed tokens h [B, N, C]:
 *   a = out_proj(MHA(query = probe, keys and values = h))   [B, C]
 *   out = a + fc2(act(fc1(layernorm(a))))                   [B, C] */
vitc__nn_cross vitc__vit_map_attn(const vitc_vit *m, const vitc__vit_w *w, int64_t B, int64_t N) {
    const vitc_vit_config *c = &m->cfg;
    vitc__nn_cross p = {.probe = w->map_probe, .in_w = w->map_qkv_w, .in_b = w->map_qkv_b,
                        .out_w = w->map_proj_w, .out_b = w->map_proj_b, .B = B, .L = 1, .S = N,
                        .C = c->hidden_dim, .H = c->num_heads};
    return p;
}

vitc__nn_mlp vitc__vit_map_mlp(const vitc_vit *m, const vitc__vit_w *w) {
    vitc__nn_mlp p = {.fc1_w = w->map_fc1_w, .fc1_b = w->map_fc1_b, .fc2_w = w->map_fc2_w,
                      .fc2_b = w->map_fc2_b, .C = m->cfg.hidden_dim, .M = m->cfg.mlp_dim,
                      .act = m->mlp_act};
    return p;
}

vitc_status vitc__vit_map_head(const vitc_vit *m, vitc__session *s, const float *h, int64_t B,
                               int64_t N, float *out, vitc__vit_map_rec *r) {
    const vitc_vit_config *c = &m->cfg;
    int64_t C = c->hidden_dim, M = c->mlp_dim, Hh = c->num_heads;
    size_t kv, rest, n;
    if (!vitc__mul_size((size_t)(B * N), (size_t)(2 * C), &kv) ||
        !vitc__mul_size((size_t)B, (size_t)(3 * C + 2 * M + Hh), &rest) ||
        !vitc__add_size(kv, rest, &n) || !vitc__add_size(n, (size_t)C, &n))
        return vitc__err(VITC_ERR_NOMEM, "attention-pooling head for [%lld, %lld, %lld] overflows",
                         (long long)B, (long long)N, (long long)C);
    VITC_TRY(vitc__buf_reserve(&s->head_buf, n));
    vitc__vit_map_rec t;
    t.x.kv = s->head_buf.p, t.x.q = t.x.kv + kv, t.x.att = t.x.q + C, t.a = t.x.att + B * C;
    t.ln = t.a + B * C, t.hpre = t.ln + B * C, t.hact = r ? t.hpre + B * M : t.hpre;
    t.x.lse = r ? t.hpre + 2 * B * M : NULL; /* inference: none asked (the same o) */
    /* a = out_proj(MHA(query = probe, keys and values = h)); out = a + mlp(layernorm(a)) */
    vitc__nn_cross p = vitc__vit_map_attn(m, &m->w, B, N);
    VITC_TRY(vitc__nn_cross_forward(&p, t.a, h, &t.x, &s->mask_buf));
    vitc__layernorm(t.ln, t.a, m->w.map_ln_w, m->w.map_ln_b, B, C, c->norm_eps);
    vitc__nn_mlp f = vitc__vit_map_mlp(m, &m->w);
    vitc__nn_mlp_forward(&f, out, t.ln, t.a, B, t.hpre, t.hact);
    if (r)
        *r = t;
    return VITC_OK;
}
const char *vitc_vit_family(const vitc_vit *m) { return m ? m->family : NULL; }
int vitc_vit_num_ignored(const vitc_vit *m) { return m ? m->n_ignored : 0; }

const char *vitc_vit_ignored(const vitc_vit *m, int i) {
    if (!m || i < 0 || i >= m->n_ignored)
        return NULL;
    const char *p = m->ignored;
    while (i--) p += strlen(p) + 1;
    return p;
}

vitc_status vitc_vit_forward_features(vitc_vit *m, const float *images, int B, int H, int W,
                                      float *out) {
    vitc__session *s;
    VITC_TRY(vit_owner(m, "vitc_vit_forward_features", &s));
    return vit_output(m, s, images, B, H, W, out, 1);
}

vitc_status vitc_session_forward_features(vitc_session *s, const float *images, int B, int H,
                                          int W, float *out) {
    const vitc_vit *m = NULL;
    VITC_TRY(vit_session_model(s, "vitc_session_forward_features", &m));
    return vit_output(m, s, images, B, H, W, out, 1);
}

vitc_status vitc_vit_embed_size(const vitc_vit *m, vitc_pool pool, int H, int W, int64_t *floats) {
    if (!m || !floats)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_embed_size: NULL argument");
    int64_t C = m->cfg.hidden_dim, p = m->cfg.patch_size;
    if (H < p || W < p)
        return vitc__err(VITC_ERR_SHAPE, "vitc_vit_embed_size: %dx%d is smaller than the patch "
                         "size %lld", H, W, (long long)p);
    switch (pool) {
    case VITC_POOL_DEFAULT:
        *floats = vitc__vit_emb_head(m) == VIT_HEAD_PROJ ? vitc__vit_head_rows(m) : C;
        return VITC_OK;
    case VITC_POOL_CLS:
    case VITC_POOL_MEAN: *floats = C; return VITC_OK;
    case VITC_POOL_TOKENS: *floats = (int64_t)(H / p) * (W / p) * C; return VITC_OK;
    }
    return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_embed: unknown pool %d", (int)pool);
}

static vitc_status vit_embed(const vitc_vit *m, vitc__session *s, const float *images, int B,
                             int H, int W, vitc_pool pool, float *out) {
    int64_t per;
    vitc__vit_head eh = m ? vitc__vit_emb_head(m) : VIT_HEAD_NONE; /* the embedding's head */
    if (!m || !images || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_embed: NULL argument");
    if (B < 1)
        return vitc__err(VITC_ERR_SHAPE, "vitc_vit_embed: batch %d must be positive", B);
    VITC_TRY(vitc_vit_embed_size(m, pool, H, W, &per));
    int64_t C = m->cfg.hidden_dim, p = m->cfg.patch_size, P = (int64_t)(H / p) * (W / p);
    int64_t np = m->n_prefix, N = P + np;
    size_t n;
    if (!vitc__mul_size((size_t)B * (size_t)N, (size_t)C, &n))
        return vitc__err(VITC_ERR_NOMEM, "vitc_vit_embed: [%d, %lld, %lld] overflows", B,
                         (long long)N, (long long)C);
    if (pool == VITC_POOL_CLS && !m->n_cls)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_embed: this %s model has no class token "
                         "(pool default, mean or tokens)", m->family);
    if (pool == VITC_POOL_DEFAULT && !m->n_cls && eh != VIT_HEAD_MAP)
        pool = VITC_POOL_MEAN; /* no class token, no head: the mean of the tokens */
    if (pool == VITC_POOL_CLS || (pool == VITC_POOL_DEFAULT && eh != VIT_HEAD_MAP)) {
        /* The class token after the final LayerNorm (CLIP's post_layernorm),
         * projected for CLIP's image_embeds: the last block's other rows are
         * not needed, so it runs for the class rows only. */
        VITC_TRY(vit_run(m, s, images, B, H, W, NULL, NULL, NULL, NULL, 1));
        if (pool == VITC_POOL_DEFAULT && eh == VIT_HEAD_PROJ)
            vitc__linear(out, per, s->a.cls_out, C, m->w.head_w, m->w.head_b, NULL, 0, B, per, C);
        else
            memcpy(out, s->a.cls_out, (size_t)(B * C) * sizeof(float));
        return VITC_OK;
    }
    /* feat_buf is the DeiT heads' scratch, unused on this path. */
    VITC_TRY(vitc__buf_reserve(&s->feat_buf, n));
    float *f = s->feat_buf.p;
    VITC_TRY(vit_run(m, s, images, B, H, W, NULL, NULL, NULL, f, 0));
    if (pool == VITC_POOL_DEFAULT) /* SigLIP */
        return vitc__vit_map_head(m, s, f, B, N, out, NULL);
    for (int64_t b = 0; b < B; b++) {
        const float *fb = f + b * N * C;
        float *o = out + b * per;
        if (pool == VITC_POOL_TOKENS) {
            memcpy(o, fb + np * C, (size_t)(P * C) * sizeof(float));
        } else { /* mean of the normed patch tokens */
            for (int64_t j = 0; j < C; j++) o[j] = 0.0f;
            for (int64_t t = np; t < N; t++)
                for (int64_t j = 0; j < C; j++) o[j] += fb[t * C + j];
            for (int64_t j = 0; j < C; j++) o[j] /= (float)P;
        }
    }
    return VITC_OK;
}

vitc_status vitc_vit_embed(vitc_vit *m, const float *images, int B, int H, int W, vitc_pool pool,
                           float *out) {
    vitc__session *s;
    VITC_TRY(vit_owner(m, "vitc_vit_embed", &s));
    return vit_embed(m, s, images, B, H, W, pool, out);
}

vitc_status vitc_session_embed(vitc_session *s, const float *images, int B, int H, int W,
                               vitc_pool pool, float *out) {
    const vitc_vit *m = NULL;
    VITC_TRY(vit_session_model(s, "vitc_session_embed", &m));
    return vit_embed(m, s, images, B, H, W, pool, out);
}

/* ------------------------------------------------------------------ */
/* The model's own image processor (Hub models)                       */
/* ------------------------------------------------------------------ */

int vitc_vit_has_processor(const vitc_vit *m) { return m && m->proc.present; }

int vitc_vit_image_flags(const vitc_vit *m) {
    return m && m->proc.present && m->proc.convert_rgb ? VITC_IMAGE_ALPHA_WHITE : 0;
}

vitc_status vitc_vit_preprocess_size(const vitc_vit *m, int width, int height, int *H, int *W) {
    int rh, rw;
    if (!m || !H || !W)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_preprocess_size: NULL argument");
    if (!m->proc.present)
        return vitc__err(VITC_ERR_INVALID_ARG, "this %s model has no image processor", m->family);
    if (width < 1 || height < 1)
        return vitc__err(VITC_ERR_SHAPE, "image %dx%d is empty", width, height);
    return vitc__hf_output_size(&m->proc, width, height, H, W, &rh, &rw);
}

vitc_status vitc_vit_preprocess(const vitc_vit *m, const vitc_image *img, float *out) {
    if (!m || !img || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_preprocess: NULL argument");
    if (!m->proc.present)
        return vitc__err(VITC_ERR_INVALID_ARG, "this %s model has no image processor", m->family);
    return vitc__hf_preprocess_channels(&m->proc, img, m->cfg.in_channels, out);
}

/* ------------------------------------------------------------------ */
/* The primary output                                                 */
/* ------------------------------------------------------------------ */

vitc_status vitc_vit_output_size(const vitc_vit *m, int H, int W, int64_t *floats) {
    if (!m || !floats)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_output_size: NULL argument");
    if (vitc_vit_has_head(m)) {
        int64_t p = m->cfg.patch_size;
        if (H < p || W < p)
            return vitc__err(VITC_ERR_SHAPE, "vitc_vit_output_size: %dx%d is smaller than the "
                             "patch size %lld", H, W, (long long)p);
        *floats = m->cfg.num_classes;
        return VITC_OK;
    }
    return vitc_vit_embed_size(m, VITC_POOL_DEFAULT, H, W, floats);
}

static vitc_status vit_primary(const vitc_vit *m, vitc__session *s, const float *images, int B,
                               int H, int W, float *out) {
    if (!images || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT run: NULL images or out");
    if (vitc_vit_has_head(m))
        return vit_run(m, s, images, B, H, W, out, NULL, NULL, NULL, 0);
    s->rec_want = m->training;
    vitc_status st = vit_embed(m, s, images, B, H, W, VITC_POOL_DEFAULT, out);
    s->rec_want = 0;
    return st;
}

vitc_status vitc_vit_run(vitc_vit *m, const float *images, int B, int H, int W, float *out) {
    vitc__session *s;
    VITC_TRY(vit_owner(m, "vitc_vit_run", &s));
    return vit_primary(m, s, images, B, H, W, out);
}

vitc_status vitc_session_run(vitc_session *s, const float *images, int B, int H, int W,
                             float *out) {
    const vitc_vit *m = NULL;
    VITC_TRY(vit_session_model(s, "vitc_session_run", &m));
    return vit_primary(m, s, images, B, H, W, out);
}
