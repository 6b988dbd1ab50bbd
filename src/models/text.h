/*
 * text.h — the text tower of a CLIP or SigLIP checkpoint (text.c), hung on
 * the model (m->text, NULL for a vision-only model): its config, its
 * weights (one allocation of its own, read from the same safetensors as
 * the vision tower), its packed inference weights and the tokenizer read
 * from the model's directory. The forward runs on nn/'s shared blocks; its
 * activations live in the session (s->text_buf), never in the model.
 */
#ifndef VITC_MODELS_TEXT_H
#define VITC_MODELS_TEXT_H

#include "vit_internal.h"

struct vitc__src;

/* Which row of the last hidden state is pooled. */
typedef enum vitc__text_pool {
    VITC__TEXT_POOL_EOS = 0,    /* the first position whose id is eos_id, else 0 (transformers) */
    VITC__TEXT_POOL_ARGMAX = 1, /* the first position of the largest id (OpenAI, open_clip,
                                 * transformers' CLIP with the legacy eos_token_id 2) */
    VITC__TEXT_POOL_LAST = 2    /* position L-1, padding included (SigLIP) */
} vitc__text_pool;

typedef struct vitc__text {
    int vocab, context, width, layers, heads, mlp, embed;
    int act;          /* VITC__NN_* */
    float eps;
    int causal;       /* CLIP: the causal mask; SigLIP: none */
    vitc__text_pool pool;
    int32_t eos_id;   /* VITC__TEXT_POOL_EOS's id */
    char layout[16];  /* "hf-clip", "open-clip", "hf-siglip" (errors, docs) */
    float logit_scale; /* as stored: a log */
    float logit_bias;
    int has_scale, has_bias;

    float *params;    /* [n_params] every tensor below, 64-byte aligned rows */
    size_t n_params;
    float *tok;       /* [vocab, width] token embedding */
    float *pos;       /* [context, width] position embedding */
    float *lnf_w, *lnf_b; /* [width] final LayerNorm */
    float *proj_w;    /* [embed, width] (open_clip's [width, embed] transposed at load) */
    float *proj_b;    /* [embed] SigLIP's head bias, NULL for CLIP */
    vitc__nn_block_w *blocks; /* [layers] into params */

    /* Inference weights packed for prec (kernels.h), rebuilt by
     * vitc__text_prepare when the model's precision or GEMM path moved;
     * the row-major weights stay (they are the fp32 fallback). */
    vitc__pweight *pw; /* [layers * VITC__NN_PW_COUNT] or NULL */
    int packed;
    vitc_precision pprec;
    const struct vitc__gemm_kernel *pkern;

    vitc_tokenizer *tok_h; /* the directory's tokenizer, or NULL */
    char *tok_err;         /* why the directory's tokenizer did not load, or NULL */
} vitc__text;

/* The text tower of src's checkpoint (after the vision rows were read,
 * before the leftover tensors are listed): its tensors are consumed, so
 * they are not left over. No text tensors: m->text stays NULL. Text
 * tensors that are there but incomplete or mis-shaped: an error. */
vitc_status vitc__text_load(vitc_vit *m, struct vitc__src *src);
void vitc__text_free(vitc__text *t);
/* The packs current for m->precision and the GEMM path (the owner's step,
 * beside the vision weights' vitc__vit_prepare_inference). */
vitc_status vitc__text_prepare(vitc_vit *m);

#endif
