/*
 * text.c — the text towers of CLIP and SigLIP checkpoints, loaded with the
 * vision tower from the same files and run on nn/'s shared pre-norm block:
 *
 *   x = token_embedding[ids] + position_embedding[0..L)      [B, L, C]
 *   x = block_N(... block_1(x))   CLIP: causal mask; SigLIP: none
 *   pooled = final_layer_norm(x[b, p_b])                     [B, C]
 *   out = pooled P^T (+ bias)                                [B, E]
 *
 * p_b: CLIP the first end-of-text id (transformers; the largest id for
 * OpenAI / open_clip and for transformers' configs with the legacy
 * eos_token_id 2), SigLIP the last position (its padding is read). Only the
 * pooled rows leave the last block, so it runs its queries, out_proj and
 * MLP for them alone (every row still gives keys and values; CLIP's causal
 * mask becomes one mask per text there), and a CLIP batch runs only up to
 * its last pooled position: with the causal mask the rows after it cannot
 * change the pooled ones (the same numbers up to summation order).
 *
 * Layouts: transformers' CLIPModel and SiglipModel (text_model.*,
 * text_projection, logit_scale, logit_bias) and open_clip's CLIP
 * (token_embedding, positional_embedding, transformer.resblocks.N,
 * ln_final, text_projection [width, embed], logit_scale), as a Hub
 * directory (open_clip_config.json) or a single file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "../train/train.h"
#include "family.h"
#include "text.h"

#define TEXT_MAX_VOCAB (1 << 24)
#define TEXT_MAX_CONTEXT (1 << 16)

/* ------------------------------------------------------------------ */
/* Reading                                                            */
/* ------------------------------------------------------------------ */

/* cfg[key] as an integer in [lo, hi] (def when absent or null). */
static vitc_status tj_int(json_t *cfg, const char *what, const char *key, int64_t def, int64_t lo,
                          int64_t hi, int *out) {
    json_t *v = json_object_get(cfg, key);
    int64_t x = def;
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
            return vitc__err(VITC_ERR_FORMAT, "%s: \"%s\" must be an integer in [%lld, %lld]",
                             what, key, (long long)lo, (long long)hi);
        x = json_integer_value(v);
    }
    *out = (int)x;
    return VITC_OK;
}

/* Tensor name of shape want [nd] (nd 0: a scalar, [] or [1]) into dst;
 * dst NULL: only checked (the pass before anything is allocated). */
static vitc_status text_take(const vitc__shards *h, const char *name, int nd, const int64_t *want,
                             float *dst) {
    const float *data;
    const int64_t *shape;
    int fnd;
    char a[96], b[96];
    if (!vitc__shards_find(h, name, &data, &fnd, &shape))
        return vitc__err(VITC_ERR_KEY, "missing tensor %s (expected %s): the text tower is "
                         "incomplete", name, vitc__shape_str(a, sizeof a, nd, want));
    int same = data != NULL;
    if (nd == 0)
        same = same && (fnd == 0 || (fnd == 1 && shape[0] == 1));
    else
        same = same && fnd == nd;
    for (int k = 0; same && nd && k < nd; k++) same = shape[k] == want[k];
    if (!same)
        return vitc__err(VITC_ERR_SHAPE, "tensor %s: expected %s, file has %s", name,
                         vitc__shape_str(a, sizeof a, nd, want),
                         vitc__shape_str(b, sizeof b, fnd, shape));
    /* the file's own shape (a scalar may be [] or [1]): the read is the Hub's */
    return dst ? vitc__hub_take(h, name, shape, fnd, 0, dst) : VITC_OK;
}

/* The shape of tensor name when present (marks it used: it is read next). */
static int text_shape(const vitc__shards *h, const char *name, int *nd, const int64_t **shape) {
    const float *d;
    return vitc__shards_find(h, name, &d, nd, shape);
}

/* Any tensor of the shards whose name starts with prefix. */
static int text_any(const vitc__shards *h, const char *prefix) {
    size_t n = strlen(prefix);
    for (int i = 0; i < h->n; i++)
        for (int j = 0; j < vitc_safetensors_count(h->st[i]); j++) {
            const char *nm, *dt;
            int nd;
            const int64_t *shape;
            const float *data;
            if (vitc_safetensors_tensor(h->st[i], j, &nm, &dt, &nd, &shape, &data) == VITC_OK &&
                !strncmp(nm, prefix, n))
                return 1;
        }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Layouts                                                            */
/* ------------------------------------------------------------------ */

/* The names of one layout: model tensors, then a block's (after the
 * block prefix fmt; qkv: "%s" takes q/k/v, or one fused in_proj). */
typedef struct text_names {
    const char *tok, *pos, *lnf, *proj_w, *proj_b, *scale, *bias;
    const char *block_fmt;
    const char *const *layer; /* [VIT_L_COUNT] */
    const char *const *qkv;   /* q/k/v names, or NULL: fused */
    int proj_t;               /* proj stored [width, embed] */
} text_names;

static const char *const openclip_layer[VIT_L_COUNT] = {
    VITC__BLOCK_NAMES("ln_1", "attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj",
                      "ln_2", "mlp.c_fc", "mlp.c_proj"),
};
static const text_names hf_clip_names = {
    "text_model.embeddings.token_embedding.weight",
    "text_model.embeddings.position_embedding.weight", "text_model.final_layer_norm",
    "text_projection.weight", NULL, "logit_scale", NULL, "text_model.encoder.layers.%d.",
    vitc__hf_clip_layer_names, vitc__qkv_short, 0};
static const text_names hf_siglip_names = {
    "text_model.embeddings.token_embedding.weight",
    "text_model.embeddings.position_embedding.weight", "text_model.final_layer_norm",
    "text_model.head.weight", "text_model.head.bias", "logit_scale", "logit_bias",
    "text_model.encoder.layers.%d.", vitc__hf_clip_layer_names, vitc__qkv_short, 0};
static const text_names openclip_names = {
    "token_embedding.weight", "positional_embedding", "ln_final", "text_projection", NULL,
    "logit_scale", NULL, "transformer.resblocks.%d.", openclip_layer, NULL, 1};
/* open_clip with proj_bias: text_projection is a Linear. */
static const text_names openclip_linear_names = {
    "token_embedding.weight", "positional_embedding", "ln_final", "text_projection.weight",
    "text_projection.bias", "logit_scale", NULL, "transformer.resblocks.%d.", openclip_layer,
    NULL, 0};

/* The activation of a transformers hidden_act. */
static vitc_status text_act(json_t *cfg, const char *def, int *act) {
    json_t *a = json_object_get(cfg, "hidden_act");
    const char *an = json_is_string(a) ? json_string_value(a) : a ? "(not a string)" : def;
    if (!strcmp(an, "gelu"))
        *act = VITC__NN_GELU;
    else if (!strcmp(an, "quick_gelu"))
        *act = VITC__NN_QUICK_GELU;
    else if (!strcmp(an, "gelu_pytorch_tanh") || !strcmp(an, "gelu_new"))
        *act = VITC__NN_GELU_TANH;
    else
        return vitc__err(VITC_ERR_UNSUPPORTED, "config.json: text_config.hidden_act %.40s is not "
                         "supported (vitc reads gelu, quick_gelu, gelu_pytorch_tanh, gelu_new)", an);
    return VITC_OK;
}

/* transformers' CLIPModel / SiglipModel: text_config over CLIPTextConfig's
 * / SiglipTextConfig's defaults (transformers 5), which Hub configs leave
 * out; the projection width from the tensor. */
static vitc_status text_config_hf(vitc__text *t, const vitc__src *src, int siglip,
                                  const text_names **names) {
    const char *what = "config.json: text_config";
    const vitc__shards *h = &src->shards;
    json_t *tc = json_object_get(src->config, "text_config");
    json_t *td = json_object_get(src->config, "text_config_dict"); /* legacy files: it wins */
    if (json_is_object(td))
        tc = td;
    if (tc && !json_is_object(tc))
        return vitc__err(VITC_ERR_FORMAT, "%s is not an object", what);
    VITC_TRY(tj_int(tc, what, "vocab_size", siglip ? 32000 : 49408, 1, TEXT_MAX_VOCAB, &t->vocab));
    VITC_TRY(tj_int(tc, what, "hidden_size", siglip ? 768 : 512, 1, VIT_MAX_DIM, &t->width));
    VITC_TRY(tj_int(tc, what, "intermediate_size", siglip ? 3072 : 2048, 1, VIT_MAX_DIM, &t->mlp));
    VITC_TRY(tj_int(tc, what, "num_hidden_layers", 12, 1, VIT_MAX_DEPTH, &t->layers));
    VITC_TRY(tj_int(tc, what, "num_attention_heads", siglip ? 12 : 8, 1, VIT_MAX_DIM, &t->heads));
    VITC_TRY(tj_int(tc, what, "max_position_embeddings", siglip ? 64 : 77, 1, TEXT_MAX_CONTEXT,
                    &t->context));
    VITC_TRY(text_act(tc, siglip ? "gelu_pytorch_tanh" : "quick_gelu", &t->act));
    json_t *eps = json_object_get(tc, "layer_norm_eps");
    t->eps = json_is_number(eps) ? (float)json_number_value(eps) : siglip ? 1e-6f : 1e-5f;
    if (!(t->eps >= 0.0f && t->eps < 1.0f))
        return vitc__err(VITC_ERR_FORMAT, "%s: layer_norm_eps %g is out of range", what,
                         (double)t->eps);
    t->causal = !siglip;
    if (siglip) {
        t->pool = VITC__TEXT_POOL_LAST;
    } else {
        /* eos_token_id 2: a config from before transformers' PR #24773, pooled by argmax */
        json_t *e = json_object_get(tc, "eos_token_id");
        int64_t eos = json_is_integer(e) ? json_integer_value(e) : 49407;
        t->pool = eos == 2 ? VITC__TEXT_POOL_ARGMAX : VITC__TEXT_POOL_EOS;
        t->eos_id = (int32_t)eos;
    }
    *names = siglip ? &hf_siglip_names : &hf_clip_names;
    int nd;
    const int64_t *sh;
    const char *pn = (*names)->proj_w;
    if (!text_shape(h, pn, &nd, &sh) || nd != 2 || sh[0] < 1 || sh[0] > VIT_MAX_DIM)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (expected [embed_dim, "
                         "%d]): the text tower is incomplete", pn, t->width);
    t->embed = (int)sh[0];
    snprintf(t->layout, sizeof t->layout, "%s", siglip ? "hf-siglip" : "hf-clip");
    return VITC_OK;
}

/* open_clip's CLIP: shapes from the tensors, heads / activation / pooling
 * from open_clip_config.json (model_cfg.text_cfg, quick_gelu) when there
 * is one, else OpenAI's (width / 64 heads, QuickGELU, argmax). */
static vitc_status text_config_openclip(vitc__text *t, const vitc__src *src,
                                        const text_names **names) {
    const vitc__shards *h = &src->shards;
    json_t *mc = json_object_get(src->aux, "model_cfg");
    json_t *tc = json_object_get(mc, "text_cfg");
    const char *what = "open_clip_config.json: model_cfg.text_cfg";
    static const char *const refused[] = {"hf_model_name", "embed_cls", "final_ln_after_pool",
                                          "ls_init_value", "attn_pooler_heads", "norm_kwargs",
                                          "act_kwargs"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        json_t *v = json_object_get(tc, refused[i]);
        if (v && !json_is_null(v) && !json_is_false(v))
            return vitc__err(VITC_ERR_UNSUPPORTED, "%s: \"%s\" is not supported (vitc reads "
                             "open_clip's CLIP text transformer)", what, refused[i]);
    }
    *names = json_is_true(json_object_get(tc, "proj_bias")) ? &openclip_linear_names
                                                             : &openclip_names;
    int nd;
    const int64_t *sh;
    if (!text_shape(h, (*names)->tok, &nd, &sh) || nd != 2 || sh[0] < 1 ||
        sh[0] > TEXT_MAX_VOCAB || sh[1] < 1 || sh[1] > VIT_MAX_DIM)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (expected [vocab, "
                         "width]): the text tower is incomplete", (*names)->tok);
    t->vocab = (int)sh[0], t->width = (int)sh[1];
    if (!text_shape(h, (*names)->pos, &nd, &sh) || nd != 2 || sh[0] < 1 ||
        sh[0] > TEXT_MAX_CONTEXT)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (expected [context, %d])"
                         ": the text tower is incomplete", (*names)->pos, t->width);
    t->context = (int)sh[0];
    char name[200];
    for (t->layers = 0; t->layers < VIT_MAX_DEPTH; t->layers++) {
        int k = snprintf(name, sizeof name, (*names)->block_fmt, t->layers);
        snprintf(name + k, sizeof name - (size_t)k, "%s", openclip_layer[VIT_L_QKV_W]);
        if (!text_shape(h, name, &nd, &sh))
            break;
    }
    int k = snprintf(name, sizeof name, (*names)->block_fmt, 0);
    snprintf(name + k, sizeof name - (size_t)k, "%s", openclip_layer[VIT_L_FC1_W]);
    if (!t->layers || !text_shape(h, name, &nd, &sh) || nd != 2 || sh[0] < 1 ||
        sh[0] > VIT_MAX_DIM)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s: the text tower is "
                         "incomplete", name);
    t->mlp = (int)sh[0];
    const char *pn = (*names)->proj_w;
    int pt = (*names)->proj_t;
    if (!text_shape(h, pn, &nd, &sh) || nd != 2 || sh[pt ? 0 : 1] != t->width ||
        sh[pt ? 1 : 0] < 1 || sh[pt ? 1 : 0] > VIT_MAX_DIM)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (expected %s): the text "
                         "tower is incomplete", pn, pt ? "[width, embed_dim]" : "[embed_dim, width]");
    t->embed = (int)sh[pt ? 1 : 0];
    /* open_clip's CLIPTextCfg: heads 8; OpenAI's build_model: width // 64 */
    VITC_TRY(tj_int(tc, what, "heads", tc ? 8 : (t->width >= 64 ? t->width / 64 : 1), 1,
                    VIT_MAX_DIM, &t->heads));
    int quick = src->aux ? json_is_true(json_object_get(mc, "quick_gelu")) : 1;
    t->act = quick ? VITC__NN_QUICK_GELU : VITC__NN_GELU;
    t->eps = 1e-5f;
    t->causal = !json_is_true(json_object_get(tc, "no_causal_mask"));
    json_t *pool = json_object_get(tc, "pool_type");
    const char *pl = json_is_string(pool) ? json_string_value(pool) : "argmax";
    if (!strcmp(pl, "argmax"))
        t->pool = VITC__TEXT_POOL_ARGMAX;
    else if (!strcmp(pl, "last"))
        t->pool = VITC__TEXT_POOL_LAST;
    else
        return vitc__err(VITC_ERR_UNSUPPORTED, "%s: pool_type \"%.20s\" is not supported (vitc "
                         "reads argmax and last)", what, pl);
    snprintf(t->layout, sizeof t->layout, "open-clip");
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Weights                                                            */
/* ------------------------------------------------------------------ */

/* The next n floats of the arena (64-byte aligned), or the size so far. */
static float *text_slot(vitc__text *t, size_t *at, size_t n) {
    float *p = t->params ? t->params + *at : NULL;
    *at += (n + 15) & ~(size_t)15;
    return p;
}

/* Binds every tensor pointer to the arena (t->params NULL: sizes only). */
static void text_bind(vitc__text *t, size_t *total) {
    size_t at = 0, C = (size_t)t->width, M = (size_t)t->mlp;
    t->tok = text_slot(t, &at, (size_t)t->vocab * C);
    t->pos = text_slot(t, &at, (size_t)t->context * C);
    for (int l = 0; l < t->layers; l++) {
        vitc__nn_block_w *w = t->params ? &t->blocks[l] : NULL;
        float *p[12];
        size_t n[12] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, M * C, M, C * M, C};
        for (int k = 0; k < 12; k++) p[k] = text_slot(t, &at, n[k]);
        if (w)
            *w = (vitc__nn_block_w){p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8],
                                    p[9], p[10], p[11], NULL, NULL};
    }
    t->lnf_w = text_slot(t, &at, C);
    t->lnf_b = text_slot(t, &at, C);
    t->proj_w = text_slot(t, &at, (size_t)t->embed * C);
    t->proj_b = text_slot(t, &at, (size_t)t->embed);
    *total = at;
}

/* A block's tensor of role into dst (q/k/v: the three thirds of the rows). */
static vitc_status text_take_block(const vitc__text *t, const vitc__shards *h,
                                   const text_names *nm, int l, int role, float *dst) {
    int64_t C = t->width, M = t->mlp;
    char name[256];
    int k = snprintf(name, sizeof name, nm->block_fmt, l);
    int64_t shape[2];
    int nd = 1;
    switch (role) {
    case VIT_L_QKV_W: shape[0] = 3 * C, shape[1] = C, nd = 2; break;
    case VIT_L_QKV_B: shape[0] = 3 * C; break;
    case VIT_L_PROJ_W: shape[0] = C, shape[1] = C, nd = 2; break;
    case VIT_L_FC1_W: shape[0] = M, shape[1] = C, nd = 2; break;
    case VIT_L_FC1_B: shape[0] = M; break;
    case VIT_L_FC2_W: shape[0] = C, shape[1] = M, nd = 2; break;
    default: shape[0] = C; break;
    }
    if ((role != VIT_L_QKV_W && role != VIT_L_QKV_B) || !nm->qkv) {
        snprintf(name + k, sizeof name - (size_t)k, "%s", nm->layer[role]);
        return text_take(h, name, nd, shape, dst);
    }
    shape[0] = C; /* one third per q, k, v Linear */
    size_t third = (size_t)(role == VIT_L_QKV_W ? C * C : C);
    for (int i = 0; i < 3; i++) {
        snprintf(name + k, sizeof name - (size_t)k, nm->layer[role], nm->qkv[i]);
        VITC_TRY(text_take(h, name, nd, shape, dst ? dst + i * third : NULL));
    }
    return VITC_OK;
}

/* Every tensor into the bound parameters; with none bound (t->params NULL)
 * only their names and shapes are checked, so that a config declaring far
 * more than the file holds fails before the tower is allocated. */
static vitc_status text_read(vitc__text *t, const vitc__shards *h, const text_names *nm) {
    int64_t C = t->width, E = t->embed;
    int check = t->params == NULL;
    int64_t s_tok[2] = {t->vocab, C}, s_pos[2] = {t->context, C}, s_c[1] = {C};
    char name[256];
    VITC_TRY(text_take(h, nm->tok, 2, s_tok, t->tok));
    VITC_TRY(text_take(h, nm->pos, 2, s_pos, t->pos));
    for (int l = 0; l < t->layers; l++) {
        float *dst[12] = {0};
        if (!check) {
            const vitc__nn_block_w *w = &t->blocks[l];
            float *bound[12] = {w->ln1_w, w->ln1_b, w->qkv_w, w->qkv_b, w->proj_w, w->proj_b,
                                w->ln2_w, w->ln2_b, w->fc1_w, w->fc1_b, w->fc2_w, w->fc2_b};
            memcpy(dst, bound, sizeof dst);
        }
        for (int r = 0; r < 12; r++) VITC_TRY(text_take_block(t, h, nm, l, r, dst[r]));
    }
    snprintf(name, sizeof name, "%s.weight", nm->lnf);
    VITC_TRY(text_take(h, name, 1, s_c, t->lnf_w));
    snprintf(name, sizeof name, "%s.bias", nm->lnf);
    VITC_TRY(text_take(h, name, 1, s_c, t->lnf_b));
    if (check) {
        int64_t s_p[2] = {nm->proj_t ? C : E, nm->proj_t ? E : C}, s_b[1] = {E};
        VITC_TRY(text_take(h, nm->proj_w, 2, s_p, NULL));
        if (nm->proj_b)
            VITC_TRY(text_take(h, nm->proj_b, 1, s_b, NULL));
        VITC_TRY(text_take(h, nm->scale, 0, NULL, NULL));
        return nm->bias ? text_take(h, nm->bias, 0, NULL, NULL) : VITC_OK;
    }
    if (nm->proj_t) { /* x @ P, P [C, E]: stored here as the Linear's [E, C] */
        int64_t s_p[2] = {C, E};
        float *tmp = malloc((size_t)(C * E) * sizeof(float));
        if (!tmp)
            return vitc__err(VITC_ERR_NOMEM, "cannot transpose %s", nm->proj_w);
        vitc_status s = text_take(h, nm->proj_w, 2, s_p, tmp);
        for (int64_t i = 0; s == VITC_OK && i < C; i++)
            for (int64_t j = 0; j < E; j++) t->proj_w[j * C + i] = tmp[i * E + j];
        free(tmp);
        VITC_TRY(s);
    } else {
        int64_t s_p[2] = {E, C};
        VITC_TRY(text_take(h, nm->proj_w, 2, s_p, t->proj_w));
    }
    if (nm->proj_b) {
        int64_t s_b[1] = {E};
        VITC_TRY(text_take(h, nm->proj_b, 1, s_b, t->proj_b));
    } else {
        memset(t->proj_b, 0, (size_t)E * sizeof(float));
    }
    VITC_TRY(text_take(h, nm->scale, 0, NULL, &t->logit_scale));
    t->has_scale = 1;
    if (nm->bias) {
        VITC_TRY(text_take(h, nm->bias, 0, NULL, &t->logit_bias));
        t->has_bias = 1;
    }
    if (!nm->proj_b)
        t->proj_b = NULL; /* CLIP's projection has no bias */
    return VITC_OK;
}

/* The directory's tokenizer: none (no file of any tokenizer): NULL with a
 * message naming what to add; a file there that does not load: NULL with
 * its error (the model stays usable for ids and images). */
static vitc_status text_tokenizer(vitc__text *t, const char *dir) {
    static const char *const files[] = {"tokenizer.json", "vocab.json", "merges.txt",
                                        "spiece.model", "bpe_simple_vocab_16e6.txt.gz"};
    int any = 0;
    for (size_t i = 0; dir && i < sizeof files / sizeof *files && !any; i++) {
        char *p = vitc__hub_join(dir, files[i]);
        if (!p)
            return vitc__err(VITC_ERR_NOMEM, "out of memory");
        struct stat sb;
        any = stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
        free(p);
    }
    char msg[1024];
    if (!any) {
        snprintf(msg, sizeof msg, "%s has no tokenizer: add its tokenizer.json (or vocab.json + "
                 "merges.txt, spiece.model, bpe_simple_vocab_16e6.txt.gz) beside the weights, "
                 "or encode token ids (vitc_vit_encode_text_ids)", dir ? dir : "the model");
    } else {
        if (vitc_tokenizer_load(dir, &t->tok_h) == VITC_OK)
            return VITC_OK;
        t->tok_h = NULL;
        snprintf(msg, sizeof msg, "the model's tokenizer did not load: %s", vitc_last_error());
    }
    size_t n = strlen(msg) + 1;
    if (!(t->tok_err = malloc(n)))
        return vitc__err(VITC_ERR_NOMEM, "out of memory");
    memcpy(t->tok_err, msg, n);
    return VITC_OK;
}

void vitc__text_free(vitc__text *t) {
    if (!t)
        return;
    if (t->pw) {
        for (int i = 0; i < t->layers * VITC__NN_PW_COUNT; i++) vitc__pweight_free(&t->pw[i]);
        free(t->pw);
    }
    vitc_tokenizer_free(t->tok_h);
    free(t->tok_err);
    vitc__free(t->params);
    free(t->blocks);
    free(t);
}

vitc_status vitc__text_load(vitc_vit *m, vitc__src *src) {
    const vitc__shards *h = &src->shards;
    int hf_clip = !strcmp(m->family, "hf-clip"), siglip = !strcmp(m->family, "hf-siglip");
    int openclip = !strcmp(m->family, "open-clip");
    if (!h->n || !(hf_clip || siglip || openclip))
        return VITC_OK;
    /* Text tensors present: the tower is read (all of it, or an error). */
    if (hf_clip || siglip) {
        const char *type = vitc__hub_model_type(src);
        if (!type || (strcmp(type, "clip") && strcmp(type, "siglip")) || !text_any(h, "text_model."))
            return VITC_OK;
    } else if (!text_any(h, "token_embedding.") && !text_any(h, "transformer.resblocks.") &&
               !text_any(h, "ln_final.") && !text_any(h, "text_projection")) {
        return VITC_OK;
    }
    vitc__text *t = calloc(1, sizeof *t);
    if (!t)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate the text tower");
    const text_names *nm = NULL;
    vitc_status s = openclip ? text_config_openclip(t, src, &nm)
                             : text_config_hf(t, src, siglip, &nm);
    if (s == VITC_OK && t->width % t->heads)
        s = vitc__err(VITC_ERR_FORMAT, "the text tower's width %d is not a multiple of its %d "
                      "heads", t->width, t->heads);
    size_t total = 0, bytes;
    if (s == VITC_OK)
        s = text_read(t, h, nm); /* params NULL: names and shapes checked, nothing read */
    if (s == VITC_OK) {
        text_bind(t, &total);
        t->n_params = total;
        if (!vitc__mul_size(total, sizeof(float), &bytes) || !(t->params = vitc__alloc(bytes)) ||
            !(t->blocks = calloc((size_t)t->layers, sizeof *t->blocks)))
            s = vitc__err(VITC_ERR_NOMEM, "cannot allocate the text tower's %zu parameters",
                          total);
    }
    if (s == VITC_OK) {
        memset(t->params, 0, bytes);
        text_bind(t, &total);
        s = text_read(t, h, nm);
    }
    if (s == VITC_OK)
        s = text_tokenizer(t, src->dir);
    if (s != VITC_OK) {
        vitc__text_free(t);
        return s;
    }
    m->text = t;
    return vitc__text_prepare(m);
}

/* ------------------------------------------------------------------ */
/* Packed weights                                                     */
/* ------------------------------------------------------------------ */

static int text_packs_current(const vitc_vit *m, const vitc__text *t) {
    return t->packed && t->pprec == m->precision && t->pkern == vitc__gemm_pack_kernel();
}

static void text_pack_free(vitc__text *t) {
    if (t->pw) {
        for (int i = 0; i < t->layers * VITC__NN_PW_COUNT; i++) vitc__pweight_free(&t->pw[i]);
        free(t->pw);
    }
    t->pw = NULL;
    t->packed = 0;
}

vitc_status vitc__text_prepare(vitc_vit *m) {
    vitc__text *t = m ? m->text : NULL;
    if (!t || text_packs_current(m, t))
        return VITC_OK;
    const struct vitc__gemm_kernel *kern = vitc__gemm_pack_kernel();
    text_pack_free(t);
    /* fp32 panels only help the built-in GEMM; bf16 / int8 always run ours */
    if (kern || m->precision != VITC_PRECISION_FP32) {
        int n = t->layers * VITC__NN_PW_COUNT;
        if (!(t->pw = calloc((size_t)n, sizeof *t->pw)))
            return vitc__err(VITC_ERR_NOMEM, "text tower packed weights: out of memory");
        int64_t C = t->width, M = t->mlp;
        for (int i = 0; i < n; i++) {
            const vitc__nn_block_w *w = &t->blocks[i / VITC__NN_PW_COUNT];
            int k = i % VITC__NN_PW_COUNT;
            const float *W = k == VITC__NN_PW_QKV    ? w->qkv_w
                             : k == VITC__NN_PW_PROJ ? w->proj_w
                             : k == VITC__NN_PW_FC1  ? w->fc1_w
                                                     : w->fc2_w;
            int64_t N = k == VITC__NN_PW_QKV ? 3 * C : k == VITC__NN_PW_FC1 ? M : C;
            int64_t K = k == VITC__NN_PW_FC2 ? M : C;
            vitc_status s = vitc__pweight_pack(&t->pw[i], W, N, K, m->precision);
            if (s != VITC_OK) {
                text_pack_free(t);
                return s;
            }
        }
    }
    t->packed = 1;
    t->pprec = m->precision;
    t->pkern = kern;
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Forward                                                            */
/* ------------------------------------------------------------------ */

/* The pooled position of each row of ids [B, L] into pos [B]. */
static void text_pool_positions(const vitc__text *t, const int32_t *ids, int64_t B, int64_t L,
                                int64_t *pos) {
    for (int64_t b = 0; b < B; b++) {
        const int32_t *r = ids + b * L;
        int64_t p = 0;
        if (t->pool == VITC__TEXT_POOL_LAST) {
            p = L - 1;
        } else if (t->pool == VITC__TEXT_POOL_ARGMAX) {
            for (int64_t i = 1; i < L; i++)
                if (r[i] > r[p])
                    p = i;
        } else { /* no end-of-text id: position 0, as transformers' argmax of all-false */
            for (int64_t i = 0; i < L; i++)
                if (r[i] == t->eos_id) {
                    p = i;
                    break;
                }
        }
        pos[b] = p;
    }
}

/* The last block's mask when its query is the pooled row moved first
 * (text_pooled_first): image b's query sees its rows 0..pos[b] there (the
 * pooled row itself and the rows before it), not the rows after. */
typedef struct text_tail_mask {
    const int64_t *pos; /* [B] */
    int64_t B;
} text_tail_mask;
static void text_tail_fill(void *ctx, float *mask /* [B, 1, S] */, int64_t L, int64_t S) {
    const text_tail_mask *c = ctx;
    (void)L;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t j = 0; j < S; j++) mask[b * S + j] = j <= c->pos[b] ? 0.0f : -INFINITY;
}

/* Row pos[b] of each image first, the rows before it one down: the last
 * block then runs its queries, out_proj and MLP on row 0 alone (the
 * block's class-row mode) while every row still gives keys and values;
 * attention does not depend on the keys' order. tmp: [C]. */
static void text_pooled_first(float *x /* [B, N, C] */, const int64_t *pos, int64_t B, int64_t N,
                              int64_t C, float *tmp) {
    for (int64_t b = 0; b < B; b++) {
        float *r = x + b * N * C;
        if (pos[b] == 0)
            continue;
        memcpy(tmp, r + pos[b] * C, (size_t)C * sizeof(float));
        memmove(r + C, r, (size_t)(pos[b] * C) * sizeof(float));
        memcpy(r, tmp, (size_t)C * sizeof(float));
    }
}

static vitc_status text_forward(const vitc_vit *m, vitc__session *s, const int32_t *ids, int B,
                                int L, float *out) {
    const vitc__text *t = m->text;
    if (!t)
        return vitc__err(VITC_ERR_UNSUPPORTED, "the %s model has no text tower (a vision-only "
                         "checkpoint: load a CLIPModel / SiglipModel directory or an open_clip "
                         "checkpoint with both towers)", m->arch);
    if (!ids || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "encode_text_ids: NULL ids or out");
    if (B <= 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "encode_text_ids: batch %d must be positive", B);
    if (L <= 0 || L > t->context)
        return vitc__err(VITC_ERR_INVALID_ARG, "encode_text_ids: length %d must be in [1, %d] "
                         "(the text tower's context)", L, t->context);
    for (int64_t i = 0; i < (int64_t)B * L; i++)
        if (ids[i] < 0 || ids[i] >= t->vocab)
            return vitc__err(VITC_ERR_INVALID_ARG, "encode_text_ids: id %d (text %lld, position "
                             "%lld) is outside the vocabulary [0, %d)", (int)ids[i],
                             (long long)(i / L), (long long)(i % L), t->vocab);
    int64_t C = t->width, M = t->mlp, E = t->embed;
    int64_t *pos = malloc((size_t)B * sizeof *pos);
    if (!pos)
        return vitc__err(VITC_ERR_NOMEM, "encode_text_ids: out of memory");
    text_pool_positions(t, ids, B, L, pos);
    /* Causal CLIP: rows past the last pooled one cannot reach it. */
    int64_t N = L;
    if (t->causal && t->pool != VITC__TEXT_POOL_LAST) {
        N = 1;
        for (int64_t b = 0; b < B; b++) N = pos[b] + 1 > N ? pos[b] + 1 : N;
    }
    int64_t BN = (int64_t)B * N;
    size_t need = (size_t)(BN * (8 * C + M) + (int64_t)B * C);
    vitc_status st = vitc__buf_reserve(&s->text_buf, need);
    if (st != VITC_OK) {
        free(pos);
        return st;
    }
    float *x = s->text_buf.p;  /* [B, N, C] the residual stream */
    float *ln1 = x + BN * C;   /* [B, N, C] */
    float *qkv = ln1 + BN * C; /* [B, N, 3C] */
    float *att = qkv + 3 * BN * C; /* [B, N, C] */
    float *mid = att + BN * C; /* [B, N, C] */
    float *ln2 = mid + BN * C; /* [B, N, C] */
    float *hid = ln2 + BN * C; /* [B, N, M] */
    float *normed = hid + BN * M; /* [B, C] */
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < N; i++) {
            const float *e = t->tok + (int64_t)ids[b * L + i] * C, *p = t->pos + i * C;
            float *r = x + (b * N + i) * C;
            for (int64_t j = 0; j < C; j++) r[j] = e[j] + p[j];
        }
    int packed = text_packs_current(m, t);
    text_tail_mask tail_ctx = {pos, B};
    for (int l = 0; l < t->layers && st == VITC_OK; l++) {
        /* Only the pooled rows leave the last block: it runs for them alone. */
        int tail = l == t->layers - 1;
        if (tail)
            text_pooled_first(x, pos, B, N, C, normed);
        vitc__nn_block blk = {
            .w = &t->blocks[l], .pw = packed && t->pw ? &t->pw[l * VITC__NN_PW_COUNT] : NULL,
            .B = B, .N = N, .C = C, .H = t->heads, .M = M, .eps = t->eps, .act = t->act,
            .attn_prec = vitc_vit_get_attention_precision(m),
            .mask = {.kind = t->causal && !tail ? VITC__NN_MASK_CAUSAL : VITC__NN_MASK_NONE,
                     .fill = t->causal && tail ? text_tail_fill : NULL, .ctx = &tail_ctx,
                     .per_image = 1},
            .x = x, .ln1 = ln1, .qkv = qkv, .att = att, .mid = mid, .ln2 = ln2, .hpre = hid,
            .hact = hid, .y = x, .tmp = &s->pdrop, .mask_buf = &s->mask_buf,
        };
        st = vitc__nn_block_forward(&blk, tail);
    }
    if (st == VITC_OK) { /* the last block left the pooled rows compact: x [B, C] */
        vitc__layernorm(normed, x, t->lnf_w, t->lnf_b, B, C, t->eps);
        vitc__linear(out, E, normed, C, t->proj_w, t->proj_b, NULL, 0, B, E, C);
    }
    free(pos);
    return st;
}

/* ------------------------------------------------------------------ */
/* Public API                                                         */
/* ------------------------------------------------------------------ */

int vitc_vit_has_text(const vitc_vit *m) { return m && m->text; }
int vitc_vit_text_dim(const vitc_vit *m) { return m && m->text ? m->text->embed : 0; }
int vitc_vit_text_context(const vitc_vit *m) { return m && m->text ? m->text->context : 0; }
const vitc_tokenizer *vitc_vit_tokenizer(const vitc_vit *m) {
    return m && m->text ? m->text->tok_h : NULL;
}

vitc_status vitc_vit_logit_params(const vitc_vit *m, float *scale, float *bias, int *has_bias) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_logit_params: NULL model");
    if (!m->text)
        return vitc__err(VITC_ERR_UNSUPPORTED, "the %s model has no text tower, hence no "
                         "logit_scale", m->arch);
    if (scale)
        *scale = expf(m->text->logit_scale);
    if (bias)
        *bias = m->text->has_bias ? m->text->logit_bias : 0.0f;
    if (has_bias)
        *has_bias = m->text->has_bias;
    return VITC_OK;
}

vitc_status vitc_vit_encode_text_ids(vitc_vit *m, const int32_t *ids, int B, int L, float *out) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_encode_text_ids: NULL model");
    vitc__session *s;
    if (m->text) /* the owner may repack (precision or GEMM path moved) */
        VITC_TRY(vitc__text_prepare(m));
    VITC_TRY(vitc__vit_own(m, &s));
    return text_forward(m, s, ids, B, L, out);
}

vitc_status vitc_session_encode_text_ids(vitc_session *s, const int32_t *ids, int B, int L,
                                         float *out) {
    if (!s)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_session_encode_text_ids: NULL session");
    if (!vitc__handle_alive(s->model_id))
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_session_encode_text_ids: the session's "
                         "model was freed (free its sessions before the model)");
    return text_forward(s->m, s, ids, B, L, out);
}

vitc_status vitc_vit_encode_text(vitc_vit *m, const char *const *texts, int B, float *out) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_encode_text: NULL model");
    const vitc__text *t = m->text;
    if (!t)
        return text_forward(m, NULL, NULL, B, 0, out); /* its error */
    if (!texts || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_encode_text: NULL texts or out");
    if (B <= 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_encode_text: batch %d must be positive",
                         B);
    if (!t->tok_h)
        return vitc__err(VITC_ERR_UNSUPPORTED, "%s", t->tok_err ? t->tok_err : "no tokenizer");
    size_t n;
    if (!vitc__mul_size((size_t)B, (size_t)t->context, &n))
        return vitc__err(VITC_ERR_NOMEM, "vitc_vit_encode_text: batch %d overflows", B);
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids)
        return vitc__err(VITC_ERR_NOMEM, "vitc_vit_encode_text: out of memory");
    vitc_status s = VITC_OK;
    for (int b = 0; b < B && s == VITC_OK; b++) {
        if (!texts[b])
            s = vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_encode_text: text %d is NULL", b);
        else if ((s = vitc_tokenizer_encode(t->tok_h, texts[b], -1, ids + (size_t)b * t->context,
                                            t->context, NULL)) != VITC_OK)
            vitc__err_prefix(s, "text %d", b);
    }
    if (s == VITC_OK)
        s = vitc_vit_encode_text_ids(m, ids, B, t->context, out);
    free(ids);
    return s;
}
