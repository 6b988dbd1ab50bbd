/*
 * vit_precision.c — the ViT's inference weights: each Linear's weight packed
 * once for the chosen precision (kernels.h vitc__pweight) and rebuilt when
 * the parameters, the precision, the kernel path or the GEMM backend moved.
 *
 * Memory: once a matrix is packed (in a model without gradients, i.e. not
 * being trained) its row-major copy is given back to the OS (madvise MADV_DONTNEED on the pages wholly inside it), so an inference
 * model holds one copy of each weight: fp32 panels (the same size), bf16
 * (half) or int8 (a quarter). Whoever needs the row-major parameters
 * (training, vitc_vit_param, saving, OpenBLAS) calls vitc__vit_rowmajor,
 * which unpacks them: exactly in fp32; in bf16 / int8 the model's weights
 * then are the converted values (the fp32 originals are gone, as after any
 * quantization).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "text.h"
#include "vit_internal.h"

void vitc__vit_pack_free(vitc_vit *m) {
    if (!m)
        return;
    if (m->pw) {
        for (int i = 0; i < m->cfg.depth * VIT_PW_COUNT; i++)
            vitc__pweight_free(&m->pw[i]);
        free(m->pw);
        m->pw = NULL;
    }
    vitc__pweight_free(&m->pconv);
    vitc__pweight_free(&m->phead);
    m->packed = 0;
}

/* Row-major home of each packed matrix: block weights, conv, head. */
static float *vit_pw_home(vitc_vit *m, int i) {
    const vitc__vit_block *w = &m->blocks[i / VIT_PW_COUNT];
    switch (i % VIT_PW_COUNT) {
    case VIT_PW_QKV: return w->qkv_w;
    case VIT_PW_PROJ: return w->proj_w;
    case VIT_PW_FC1: return w->fc1_w;
    default: return w->fc2_w;
    }
}

/* Gives back the pages wholly inside W's n floats (the edges stay). */
void vitc__vit_release(const float *W, size_t n) {
#ifdef __linux__
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0)
        return;
    uintptr_t b = ((uintptr_t)W + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    uintptr_t e = ((uintptr_t)(W + n)) & ~((uintptr_t)pg - 1);
    if (e > b)
        (void)madvise((void *)b, e - b, MADV_DONTNEED); /* a failure only keeps the memory */
#else
    (void)W, (void)n;
#endif
}

/* Unpacks each pack into its home. */
static void vit_unpack_all(vitc_vit *m) {
    int n = m->pw ? m->cfg.depth * VIT_PW_COUNT : 0;
    for (int i = -2; i < n; i++) {
        vitc__pweight *p = i == -2 ? &m->pconv : i == -1 ? &m->phead : &m->pw[i];
        float *home = i == -2 ? m->w.conv_w : i == -1 ? m->w.head_w : vit_pw_home(m, i);
        if (!p->data)
            continue;
        vitc__pweight_unpack(p, home);
    }
}

void vitc__vit_rowmajor(vitc_vit *m) {
    if (!m)
        return;
    if (m->released)
        vit_unpack_all(m);
    m->released = 0;
    vitc__vit_pack_free(m);
}

/* Packs W [N, K] into p and gives W's pages back at once, so the peak
 * holds one matrix twice, not the model. A model being trained (it has
 * gradients) keeps its row-major weights: the optimizer's fp32 master
 * copy, never replaced by bf16 / int8 values. */
static vitc_status vit_pack_one(vitc_vit *m, vitc__pweight *p, float *W, int64_t N, int64_t K,
                                vitc_precision prec) {
    VITC_TRY(vitc__pweight_pack(p, W, N, K, prec));
    if (!m->grad) {
        m->released = 1;
        vitc__vit_release(W, (size_t)N * (size_t)K);
    }
    return VITC_OK;
}

/* Row-major copies gone; the packs allocated for m->precision (none for
 * fp32 with no packing kernel: fp32 panels only help the built-in GEMM;
 * bf16 / int8 always run ours). */
static vitc_status vit_pack_begin(vitc_vit *m, const struct vitc__gemm_kernel *kern) {
    vitc__vit_rowmajor(m);
    if (kern || m->precision != VITC_PRECISION_FP32) {
        m->pw = calloc((size_t)m->cfg.depth * VIT_PW_COUNT, sizeof *m->pw);
        if (!m->pw)
            return vitc__err(VITC_ERR_NOMEM, "ViT packed weights: out of memory");
    }
    return VITC_OK;
}

/* int8 keeps one scale per row (its largest |w| / 127): a NaN or an
 * infinity would turn into plausible numbers where fp32 and bf16 carry it
 * to the output. Such a weight is refused, named, before packing. */
static vitc_status vit_int8_finite(const vitc_vit *m, int i, const float *W, size_t n) {
    size_t j = 0;
    while (j < n && isfinite(W[j])) j++;
    if (j == n)
        return VITC_OK;
    static const int roles[VIT_PW_COUNT] = {
        [VIT_PW_QKV] = VIT_L_QKV_W, [VIT_PW_PROJ] = VIT_L_PROJ_W, [VIT_PW_FC1] = VIT_L_FC1_W,
        [VIT_PW_FC2] = VIT_L_FC2_W};
    static const char *const what[VIT_PW_COUNT] = {
        [VIT_PW_QKV] = "attention's q/k/v projection",
        [VIT_PW_PROJ] = "attention's output projection",
        [VIT_PW_FC1] = "MLP's first Linear",
        [VIT_PW_FC2] = "MLP's second Linear",
    };
    int layer = i < 0 ? -1 : i / VIT_PW_COUNT;
    int role = i < 0 ? VIT_P_CONV_W : roles[i % VIT_PW_COUNT];
    char name[200] = "", where[80] = "the patch embedding";
    for (int e = 0; e < m->n_entries; e++)
        if (m->table[e].layer == layer && m->table[e].role == role)
            vitc__vit_entry_name(m, &m->table[e], name, sizeof name);
    if (i >= 0)
        snprintf(where, sizeof where, "block %d, the %s", layer, what[i % VIT_PW_COUNT]);
    return vitc__err(VITC_ERR_INVALID_ARG, "int8: weight %s (%s) holds %s at element %zu; int8 "
                     "cannot carry it (fp32 and bf16 do): fix the weights or use another "
                     "precision", *name ? name : "?", where, isnan(W[j]) ? "NaN" : "an infinity",
                     j);
}

/* Packs matrix i: a block weight (i >= 0, m->pw[i]) or the patch
 * embedding (i == -1), both in the model's precision. The patch embedding
 * (3% of ViT-B's FLOPs) in fp32 had become 4-5% of the int8 forward; int8
 * there, its input (the pixels) quantized per patch as any other
 * activation, as ONNX Runtime's dynamic quantization (ConvInteger) and
 * NNCF do, gives ViT-B/16's int8 forward 4-5% (docs/precision.md has the
 * accuracy). The heads (several shapes across families, 0.2%) stay
 * row-major fp32. */
static vitc_status vit_pack_matrix(vitc_vit *m, int i, const struct vitc__gemm_kernel *kern) {
    const vitc_vit_config *c = &m->cfg;
    int64_t C = c->hidden_dim, M = c->mlp_dim;
    float *W; /* [N, K] */
    vitc__pweight *dst;
    int64_t N, K;
    if (i < 0) {
        if (!m->w.conv_w || (!kern && m->precision == VITC_PRECISION_FP32))
            return VITC_OK; /* T2T-ViT: no patch conv */
        W = m->w.conv_w, dst = &m->pconv;
        N = C, K = (int64_t)c->in_channels * c->patch_size * c->patch_size;
    } else {
        if (!m->pw)
            return VITC_OK;
        static const int rows[VIT_PW_COUNT] = {3, 1, 0, 1}; /* N in units of C (FC1: M) */
        int k = i % VIT_PW_COUNT;
        W = vit_pw_home(m, i), dst = &m->pw[i];
        N = k == VIT_PW_FC1 ? M : rows[k] * C;
        K = k != VIT_PW_FC2 ? C : m->swiglu ? M / 2 : M;
    }
    if (m->precision == VITC_PRECISION_INT8)
        VITC_TRY(vit_int8_finite(m, i, W, (size_t)N * (size_t)K));
    return vit_pack_one(m, dst, W, N, K, m->precision);
}

static void vit_pack_done(vitc_vit *m, const struct vitc__gemm_kernel *kern) {
    m->packed = 1;
    m->packed_prec = m->precision;
    m->packed_for = kern;
    m->pversion = m->wversion;
}

static vitc_status vit_pack(vitc_vit *m, const struct vitc__gemm_kernel *kern) {
    vitc_status s = vit_pack_begin(m, kern);
    int n = m->cfg.depth * VIT_PW_COUNT;
    for (int i = 0; s == VITC_OK && i < n; i++) s = vit_pack_matrix(m, i, kern);
    if (s == VITC_OK)
        s = vit_pack_matrix(m, -1, kern);
    if (s != VITC_OK) {
        vitc__vit_rowmajor(m); /* what was packed (and released) goes back */
        return s;
    }
    vit_pack_done(m, kern);
    return VITC_OK;
}

/* ---- packing while loading (vitc_vit_load_precision) -------------- */

vitc_status vitc__vit_load_pack_begin(vitc_vit *m, vitc_precision p) {
    m->precision = p;
    return vit_pack_begin(m, vitc__gemm_pack_kernel());
}

vitc_status vitc__vit_load_pack_row(vitc_vit *m, int entry) {
    const vitc__param *e = &m->table[entry];
    const struct vitc__gemm_kernel *kern = vitc__gemm_pack_kernel();
    if (e->layer < 0)
        return e->role == VIT_P_CONV_W ? vit_pack_matrix(m, -1, kern) : VITC_OK;
    int k = e->role == VIT_L_QKV_W    ? VIT_PW_QKV
            : e->role == VIT_L_PROJ_W ? VIT_PW_PROJ
            : e->role == VIT_L_FC1_W  ? VIT_PW_FC1
            : e->role == VIT_L_FC2_W  ? VIT_PW_FC2
                                      : -1;
    return k < 0 ? VITC_OK : vit_pack_matrix(m, e->layer * VIT_PW_COUNT + k, kern);
}

vitc_status vitc__vit_load_pack_end(vitc_vit *m, vitc_status s) {
    if (s != VITC_OK) {
        vitc__vit_rowmajor(m);
        return s;
    }
    vit_pack_done(m, vitc__gemm_pack_kernel());
    return vitc__vit_prepare_inference(m);
}

/* The packs match the parameters, the precision and the GEMM path. */
static int vit_packs_current(const vitc_vit *m, const struct vitc__gemm_kernel *kern) {
    return m->packed && m->pversion == m->wversion && m->packed_prec == m->precision &&
           m->packed_for == kern;
}

vitc_status vitc__vit_prepare_inference(vitc_vit *m) {
    const struct vitc__gemm_kernel *kern = vitc__gemm_pack_kernel();
    if (!vit_packs_current(m, kern)) {
        vitc_status s = vit_pack(m, kern);
        /* fp32 does without packs (the same numbers from row-major W). */
        if (s != VITC_OK && m->precision != VITC_PRECISION_FP32)
            return s;
    }
    return vitc__text_prepare(m); /* the text tower's packs follow the model's precision */
}

int vitc_vit_is_prepared(const vitc_vit *m) {
    if (!m)
        return 0;
    if (m->training)
        return !m->released;
    return vit_packs_current(m, vitc__gemm_pack_kernel());
}

/* Read-only, so that any number of sessions may ask at once: the packs
 * when current, else the row-major weights where they are the same
 * numbers (fp32, pages not given back), else an error (packing would
 * write the model under the other sessions' feet). */
vitc_status vitc__vit_weights_check(const vitc_vit *m, int *use_packed) {
    const struct vitc__gemm_kernel *kern = vitc__gemm_pack_kernel();
    *use_packed = 0;
    if (!m->training && vit_packs_current(m, kern)) {
        *use_packed = m->pw != NULL;
        return VITC_OK;
    }
    if ((m->training || m->precision == VITC_PRECISION_FP32) && !m->released)
        return VITC_OK;
    return vitc__err(VITC_ERR_INVALID_ARG,
                     "the %s model's weights are not packed for its precision %s (its parameters, "
                     "precision, mode or GEMM backend changed since): call vitc_vit_prepare(m), "
                     "or any vitc_vit_* forward, before running sessions on it", m->arch,
                     vitc_precision_name(m->precision));
}

vitc_status vitc_vit_set_precision(vitc_vit *m, vitc_precision p) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_set_precision: NULL model");
    if (!vitc_precision_name(p))
        return vitc__err(VITC_ERR_INVALID_ARG, "unknown precision %d (expected fp32, bf16 or int8)",
                         (int)p);
    m->precision = p;
    if (m->training)
        return VITC_OK; /* packed at the next inference forward */
    return vitc__vit_prepare_inference(m);
}

vitc_precision vitc_vit_get_precision(const vitc_vit *m) {
    return m ? m->precision : VITC_PRECISION_FP32;
}

/* Nothing to pack: q, k and v are converted per call (attention_lp.c). */
vitc_status vitc_vit_set_attention_precision(vitc_vit *m, vitc_precision p) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_set_attention_precision: NULL model");
    if (p != VITC_PRECISION_FP32 && p != VITC_PRECISION_BF16 && p != VITC_PRECISION_INT8)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "attention precision %d: expected fp32, bf16 or int8", (int)p);
    m->attn_precision = p;
    m->attn_precision_set = 1;
    return VITC_OK;
}

vitc_status vitc_vit_set_attention_precision_auto(vitc_vit *m) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_set_attention_precision_auto: NULL model");
    m->attn_precision_set = 0;
    return VITC_OK;
}

/* Unless set: bf16 under bf16 weights, as torch.autocast runs
 * scaled_dot_product_attention in bf16, and int8 under int8 weights (as
 * NNCF quantizes the attention's MatMuls), where the CPU runs it faster
 * than fp32 (vitc__attention_pays: AMD's AVX-512 cores, not Intel's), else
 * bf16 under int8 where that pays. The attention is 4-10% of a ViT-B's
 * products; left at half the weights' rate it held batch 8 at 85% of the
 * bf16 peak (90% with bf16 attention) and below 80% of the int8 peak on a
 * Zen 4, and its rounding is the weights' (top-1 and nearest neighbours
 * kept on the benchmark's photos and Fashion-MNIST: docs/precision.md). */
vitc_precision vitc_vit_get_attention_precision(const vitc_vit *m) {
    if (!m) return VITC_PRECISION_FP32;
    if (m->attn_precision_set) return m->attn_precision;
    if (m->precision == VITC_PRECISION_INT8 && vitc__attention_pays(VITC_PRECISION_INT8))
        return VITC_PRECISION_INT8;
    return m->precision == VITC_PRECISION_FP32 || !vitc__attention_pays(VITC_PRECISION_BF16)
               ? VITC_PRECISION_FP32
               : VITC_PRECISION_BF16;
}
