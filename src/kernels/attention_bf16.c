/*
 * attention_bf16.c — softmax(scale q k^T + mask) v with both products on
 * bfloat16 operands (issue 11): S = scale bf16(q) bf16(k)^T and O =
 * bf16(P) bf16(v), each through the bf16 GEMM microkernel of gemm_lp.h
 * (vdpbf16ps with fp32 sums, or its portable reference: the same bits);
 * the mask, the softmax (max, exp, sum) in fp32 between them, by the
 * arch's softmax_rows_exp2, its normalisation fused into P's rounding. Chosen by vitc__sdpa_desc.bf16, in
 * inference only (no log-sum-exp for a backward).
 *
 * Unlike the fp32 kernel (attention_tmpl.h, online softmax over key
 * blocks), a task holds the whole key row of MR query rows: the exact
 * softmax needs no rescaling, and P is normalised before it is rounded to
 * bf16 (values in [0, 1], so its rounding error is relative). One task is
 * one (b, h) and a block of its query rows (all of them when there are as
 * many heads as threads, else VITC_ATTN_BF16_BR); it converts the head's
 * K and V once into the microkernel's B layout:
 *   kb: [ceil(S/NR)][kgD][NR] words, word (p, key j) = k[j][2p], k[j][2p+1]
 *   vb: [ceil(Dv/NR)][kgS][NR] words, word (p, column c) = v[2p][c], v[2p+1][c]
 * (kgD = ceil(D/2), kgS = ceil(S/2); entries past the edges are zero).
 * The A operands, MR rows of q and of P, are converted row by row in place
 * (qa [MR][kgD], pa [MR][kgS] words; the row-major microkernel).
 */
#include <stdlib.h>
#include <string.h>

#include "attention_impl.h"
#include "gemm_lp.h"

#define MR VITC_LP_MR
#define NR VITC_LP_NR
/* Query rows per task, at most: K and V are converted once per task,
 * O(S (D + Dv)), against O(Br S (D + Dv)) products. A multiple of MR. With
 * enough heads for the threads a task takes a head's rows whole (ViT's 197
 * rows had been two tasks of 192 and 5 rows, each converting K and V). */
#define VITC_ATTN_BF16_BR 192

typedef struct vitc__attn_bf16_job {
    const vitc__sdpa_desc *d;
    const vitc__lp_kernel *kn;
    vitc__lp_row_fn row;
    vitc__lp_ukr_rm_fn ukr;
    vitc__lp_pairs_fn pairs;
    void (*softmax_rows_exp2)(float *x, int64_t rows, int64_t n, float s, float *inv);
    int64_t nqb, br;                /* query blocks per head, of br rows */
    int64_t kgD, kgS, Sp, Dvp;      /* Sp, Dvp: S, Dv rounded up to NR (B strips) */
    size_t need;                    /* scratch bytes per task */
    int failed;
} vitc__attn_bf16_job;

static int64_t bf16_round(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Scratch bytes of one task: kb, vb, qa, pa (words), st (floats),
 * carved in this order (kb first: the microkernel loads B aligned; kb's
 * size is a multiple of 32 words, so vb stays aligned too); 0 on overflow. */
static size_t bf16_need(const vitc__attn_bf16_job *g) {
    const vitc__sdpa_desc *d = g->d;
    size_t kb, vb, qa, pa, st, n = 0;
    int ok = vitc__mul_size((size_t)g->Sp, (size_t)g->kgD, &kb) &&
             vitc__mul_size((size_t)g->Dvp, (size_t)g->kgS, &vb) &&
             vitc__mul_size((size_t)g->kgD, MR, &qa) && vitc__mul_size((size_t)g->kgS, MR, &pa) &&
             vitc__mul_size((size_t)d->S, MR, &st) &&
             vitc__add_size(kb, vb, &n) && vitc__add_size(n, qa, &n) &&
             vitc__add_size(n, pa, &n) && vitc__add_size(n, st, &n) &&
             vitc__mul_size(n, 4, &n);
    return ok ? n : 0;
}

/* K of head (b, h) into kb and V into vb (layouts above). K: each strip of
 * NR keys as two halves of 16 rows, transposed by the strip converter; V:
 * word (p, c) pairs keys 2p and 2p + 1 of column c, which the pairs
 * converter builds from two rows of V as they lie (no transpose). */
static void bf16_pack_kv(const vitc__attn_bf16_job *g, int64_t b, int64_t h, uint32_t *kb,
                         uint32_t *vb) {
    const vitc__sdpa_desc *d = g->d;
    const int64_t S = d->S, Dv = d->Dv, kgD = g->kgD, kgS = g->kgS;
    const float *k = d->k + b * d->k_sb + h * d->k_sh; /* [S, D] */
    const float *v = d->v + b * d->v_sb + h * d->v_sh; /* [S, Dv] */
    for (int64_t j = 0; j < g->Sp; j += 16) {
        int64_t rows = S - j < 0 ? 0 : S - j < 16 ? S - j : 16;
        vitc__lp_strip(g->kn, VITC_PRECISION_BF16, kb + (j / NR) * kgD * NR + j % NR, NR, 16,
                       rows ? k + j * d->k_sr : k, d->k_sr, rows, d->D, NULL, NULL);
    }
    for (int64_t c = 0; c < g->Dvp; c += NR) {
        int64_t n = Dv - c < NR ? Dv - c : NR;
        for (int64_t p = 0; p < kgS; p++) {
            uint32_t *dst = vb + (c / NR) * kgS * NR + p * NR; /* [NR] words */
            g->pairs(dst, v + 2 * p * d->v_sr + c, 2 * p + 1 < S ? v + (2 * p + 1) * d->v_sr + c : NULL,
                     n);
            for (int64_t q = n; q < NR; q++) dst[q] = 0;
        }
    }
}

/* Rows [l0, l1) of head (b, h), MR at a time. */
static void bf16_rows(const vitc__attn_bf16_job *g, uint32_t *buf, int64_t b, int64_t h,
                      int64_t l0, int64_t l1) {
    const vitc__sdpa_desc *d = g->d;
    const int64_t S = d->S, D = d->D, Dv = d->Dv, kgD = g->kgD, kgS = g->kgS, Sp = g->Sp;
    uint32_t *kb = buf, *vb = kb + Sp * kgD, *qa = vb + g->Dvp * kgS, *pa = qa + kgD * MR;
    float *st = (float *)(pa + kgS * MR); /* [MR, S] scores, then probabilities */
    bf16_pack_kv(g, b, h, kb, vb);
    const float *q = d->q + b * d->q_sb + h * d->q_sh; /* [L, D] */
    float *o = d->o + b * d->o_sb + h * d->o_sh;       /* [L, Dv] */
    for (int64_t i = l0; i < l1; i += MR) {
        const int64_t mr = l1 - i < MR ? l1 - i : MR;
        if (mr < MR) { /* rows the microkernel reads but does not store */
            memset(qa + mr * kgD, 0, (size_t)((MR - mr) * kgD) * sizeof *qa);
            memset(pa + mr * kgS, 0, (size_t)((MR - mr) * kgS) * sizeof *pa);
        }
        for (int64_t r = 0; r < mr; r++)
            g->row(qa + r * kgD, 1, q + (i + r) * d->q_sr, D, NULL, NULL);
        for (int64_t j = 0; j < S; j += NR)
            g->ukr(kgD, qa, kgD, kb + (j / NR) * kgD * NR, st + j, S, mr, S - j < NR ? S - j : NR);
        /* the scale multiplies the fp32 scores (q is converted as it is, with
         * no copy): softmax_rows_exp2 does it first when there is no mask */
        float temp = d->scale;
        uint32_t dead = 0; /* bit r: row r has no allowed key */
        if (d->mask) {
            for (int64_t r = 0; r < mr; r++) {
                float *srow = st + r * S;
                const float *mrow = d->mask + b * d->m_sb + h * d->m_sh + (i + r) * d->m_sr;
                float mx = -INFINITY;
                for (int64_t j = 0; j < S; j++) {
                    srow[j] = srow[j] * d->scale + mrow[j];
                    if (srow[j] > mx) mx = srow[j];
                }
                if (mx == -INFINITY) dead |= 1u << r;
            }
            temp = 1.0f;
        }
        float inv[MR]; /* 1 / each row's sum: P = st inv, applied as P is rounded */
        g->softmax_rows_exp2(st, mr, S, temp * 1.44269504088896341f, inv);
        for (int64_t r = 0; r < mr; r++) {
            float *prow = st + r * S;
            /* torch 2.x: a row with no allowed key gives 0, unless its
             * weights are returned (then NaN, as softmax gives them) */
            if ((dead >> r & 1) && !d->probs) {
                memset(pa + r * kgS, 0, (size_t)kgS * sizeof *pa);
                continue;
            }
            if (d->probs) {
                float *pr = d->probs + b * d->p_sb + h * d->p_sh + (i + r) * d->p_sr; /* [S] */
                for (int64_t j = 0; j < S; j++) pr[j] = prow[j] * inv[r];
            }
            g->row(pa + r * kgS, 1, prow, S, &inv[r], NULL);
        }
        for (int64_t c = 0; c < Dv; c += NR)
            g->ukr(kgS, pa, kgS, vb + (c / NR) * kgS * NR, o + i * d->o_sr + c, d->o_sr, mr,
                   Dv - c < NR ? Dv - c : NR);
    }
}

static void bf16_task(void *ctx, int64_t t, int tid) {
    vitc__attn_bf16_job *g = ctx;
    (void)tid;
    if (__atomic_load_n(&g->failed, __ATOMIC_RELAXED)) return;
    uint32_t *buf = vitc__lp_get(g->need);
    if (!buf) {
        __atomic_store_n(&g->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const vitc__sdpa_desc *d = g->d;
    int64_t bh = t / g->nqb, qb = t % g->nqb;
    int64_t l0 = qb * g->br;
    int64_t l1 = l0 + g->br < d->L ? l0 + g->br : d->L;
    bf16_rows(g, buf, bh / d->H, bh % d->H, l0, l1);
}

vitc_status vitc__sdpa_bf16(const vitc__sdpa_desc *d, const struct vitc__lp_kernel *kn) {
    vitc__attn_bf16_job g = {.d = d, .kn = kn ? kn : vitc__lp_kernel_for(VITC_PRECISION_BF16)};
    g.row = g.kn->row ? g.kn->row : vitc__lp_bf16_ref.row;
    g.ukr = g.kn->ukr_rm ? g.kn->ukr_rm : vitc__lp_bf16_ref.ukr_rm;
    g.pairs = g.kn->pairs ? g.kn->pairs : vitc__lp_bf16_ref.pairs;
    g.softmax_rows_exp2 = vitc__kern()->softmax_rows_exp2;
    g.br = d->B * d->H >= vitc__num_threads() ? bf16_round(d->L, MR) : VITC_ATTN_BF16_BR;
    g.nqb = (d->L + g.br - 1) / g.br;
    g.kgD = (d->D + 1) / 2;
    g.kgS = (d->S + 1) / 2;
    g.Sp = bf16_round(d->S, NR);
    g.Dvp = bf16_round(d->Dv, NR);
    if (!(g.need = bf16_need(&g)))
        return vitc__err(VITC_ERR_NOMEM, "sdpa (bf16): scratch size overflows");
    vitc__parallel_for(d->B * d->H * g.nqb, bf16_task, &g);
    if (g.failed)
        return vitc__err(VITC_ERR_NOMEM, "sdpa (bf16): out of memory for %zu bytes of scratch",
                         g.need);
    return VITC_OK;
}
