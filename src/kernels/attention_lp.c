/*
 * attention_lp.c — softmax(scale q k^T + mask) v with both products on
 * low-precision operands (vitc__sdpa_desc.prec), each through the GEMM
 * microkernel of that precision (gemm_lp.h; or its portable reference: the
 * same bits); the mask, the softmax (max, exp, sum) in fp32 between them,
 * by the arch's softmax_rows_exp2, its normalisation applied as P is
 * converted (bf16) or in the second product's row scales (int8). Inference
 * only (no log-sum-exp for a backward).
 *
 *   BF16: S = scale bf16(q) bf16(k)^T, O = bf16(P) bf16(v), fp32 sums.
 *   INT8: q and P as the GEMM's activations (u8 per row, with a zero
 *     point: P's is 0, its scale 1/255 of the row's largest, which is 1);
 *     k per key and v per channel as s8, symmetric (vitc__s8); int32 sums,
 *     dequantized in the tile's epilogue (gemm_lp.h). A half of bf16's
 *     product time on AVX512-VNNI, at 8-bit steps of P and V.
 *
 * Unlike the fp32 kernel (attention_tmpl.h, online softmax over key
 * blocks), a task holds the whole key row of MR query rows: the exact
 * softmax needs no rescaling, and P is normalised before it is rounded
 * (values in [0, 1]). One task is one (b, h) and a block of its query rows
 * (all of them when there are as many heads as threads, else
 * VITC_ATTN_LP_BR); it converts the head's K and V once into the
 * microkernel's B layout, g words a 32-bit word (g = 2 bf16, 4 int8):
 *   kb: [ceil(S/NR)][kgD][NR] words, word (p, key j) = k[j][g p .. g p + g)
 *   vb: [ceil(Dv/NR)][kgS][NR] words, word (p, column c) = v[g p .. g p + g)[c]
 * (kgD = ceil(D/g), kgS = ceil(S/g); entries past the edges are zero).
 * The A operands, MR rows of q and of P: bf16 converted row by row in place
 * (qa [MR][kgD], pa [MR][kgS] words; the row-major microkernel); int8 as
 * the GEMM's A strips (qa [kgD][MR], pa [kgS][MR] words).
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
#define VITC_ATTN_LP_BR 192

typedef struct vitc__attn_lp_job {
    const vitc__sdpa_desc *d;
    const vitc__lp_kernel *kn;
    int int8;
    vitc__lp_row_fn row;            /* bf16 */
    vitc__lp_ukr_rm_fn ukr_rm;      /* bf16 */
    vitc__lp_pairs_fn pairs;        /* bf16 */
    vitc__lp_s8_rows_fn s8_rows;    /* int8 */
    vitc__lp_s8_quads_fn s8_quads;  /* int8 */
    vitc__lp_strip_fn strip_unit;   /* int8 */
    void (*softmax_rows_exp2)(float *x, int64_t rows, int64_t n, float s, float *inv);
    int64_t nqb, br;                /* query blocks per head, of br rows */
    int64_t kgD, kgS, Sp, Dvp;      /* Sp, Dvp: S, Dv rounded up to NR (B strips) */
    size_t need;                    /* scratch bytes per task */
    int failed;
} vitc__attn_lp_job;

static int64_t lp_round(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Scratch bytes of one task: kb, vb, qa, pa (words), st (floats), and for
 * int8 the scales and sums of k (Sp), v (Dvp), q and P (MR each), carved
 * in this order (kb first: the microkernel loads B aligned; kb's size is a
 * multiple of 32 words, so vb stays aligned too); 0 on overflow. */
static size_t lp_need(const vitc__attn_lp_job *g) {
    const vitc__sdpa_desc *d = g->d;
    size_t kb, vb, qa, pa, st, n = 0, q8 = g->int8 ? 2 * (size_t)(g->Sp + g->Dvp) + 4 * MR : 0;
    int ok = vitc__mul_size((size_t)g->Sp, (size_t)g->kgD, &kb) &&
             vitc__mul_size((size_t)g->Dvp, (size_t)g->kgS, &vb) &&
             vitc__mul_size((size_t)g->kgD, MR, &qa) && vitc__mul_size((size_t)g->kgS, MR, &pa) &&
             vitc__mul_size((size_t)d->S, MR, &st) &&
             vitc__add_size(kb, vb, &n) && vitc__add_size(n, qa, &n) &&
             vitc__add_size(n, pa, &n) && vitc__add_size(n, st, &n) &&
             vitc__add_size(n, q8, &n) && vitc__mul_size(n, 4, &n);
    return ok ? n : 0;
}

/* The per-task buffers, carved from one scratch (lp_need's order). */
typedef struct {
    uint32_t *kb, *vb, *qa, *pa;
    float *st;                   /* [MR, S] scores, then probabilities */
    float *ks, *vs, *qs, *ps;    /* int8: scales of k [Sp], v [Dvp], q and P rows [MR] */
    int32_t *ksum, *vsum, *qz, *pz; /* int8: sums of k, v; zero points of q, P */
} lp_bufs;

static lp_bufs lp_carve(const vitc__attn_lp_job *g, uint32_t *buf) {
    lp_bufs u;
    u.kb = buf;
    u.vb = u.kb + g->Sp * g->kgD;
    u.qa = u.vb + g->Dvp * g->kgS;
    u.pa = u.qa + g->kgD * MR;
    u.st = (float *)(u.pa + g->kgS * MR);
    u.ks = u.st + g->d->S * MR;
    u.vs = u.ks + g->Sp;
    u.qs = u.vs + g->Dvp;
    u.ps = u.qs + MR;
    u.ksum = (int32_t *)(u.ps + MR);
    u.vsum = u.ksum + g->Sp;
    u.qz = u.vsum + g->Dvp;
    u.pz = u.qz + MR;
    return u;
}

/* K of head (b, h) into kb and V into vb (layouts above). bf16 K: each
 * strip of NR keys as two halves of 16 rows, transposed by the strip
 * converter; bf16 V: word (p, c) pairs keys 2p and 2p + 1 of column c,
 * which the pairs converter builds from two rows of V as they lie (no
 * transpose). int8: the s8 converters, the same halves of keys for K, a
 * strip of NR channels over all keys for V. */
static void lp_pack_kv(const vitc__attn_lp_job *g, int64_t b, int64_t h, const lp_bufs *u) {
    const vitc__sdpa_desc *d = g->d;
    const int64_t S = d->S, Dv = d->Dv, kgD = g->kgD, kgS = g->kgS;
    const float *k = d->k + b * d->k_sb + h * d->k_sh; /* [S, D] */
    const float *v = d->v + b * d->v_sb + h * d->v_sh; /* [S, Dv] */
    for (int64_t j = 0; j < g->Sp; j += 16) {
        int64_t rows = S - j < 0 ? 0 : S - j < 16 ? S - j : 16;
        uint32_t *dst = u->kb + (j / NR) * kgD * NR + j % NR;
        const float *kj = rows ? k + j * d->k_sr : k;
        /* The next 16 keys' rows of k, and these keys' rows of v (read
         * after k's), asked for meanwhile: rows a projection's width apart
         * (qkv's 2304 floats in ViT-B) outrun the hardware prefetchers, and
         * converting k, v and q (lp_task) had been 6.7% of the microkernel's
         * samples in batch 8's int8 forward, mostly waiting on them: 6.0% now
         * (k's and v's converters a quarter to a third shorter). */
        for (int64_t r = j + 16; r < j + 32 && r < S; r++)
            for (int64_t c = 0; c < d->D; c += 16) __builtin_prefetch(k + r * d->k_sr + c, 0, 3);
        for (int64_t r = j; r < j + 16 && r < S; r++)
            for (int64_t c = 0; c < Dv; c += 16) __builtin_prefetch(v + r * d->v_sr + c, 0, 2);
        if (g->int8) {
            g->s8_rows(dst, NR, kj, d->k_sr, rows, d->D, u->ks + j, u->ksum + j);
            for (int64_t r = rows; r < 16; r++) u->ks[j + r] = 0.0f, u->ksum[j + r] = 0;
        } else {
            vitc__lp_strip(g->kn, VITC_PRECISION_BF16, dst, NR, 16, kj, d->k_sr, rows, d->D,
                           NULL, NULL);
        }
    }
    for (int64_t c = 0; c < g->Dvp; c += NR) {
        int64_t n = Dv - c < NR ? Dv - c : NR;
        uint32_t *dst = u->vb + (c / NR) * kgS * NR; /* [kgS][NR] words */
        if (g->int8) {
            g->s8_quads(dst, v + c, d->v_sr, S, n, u->vs + c, u->vsum + c);
            continue;
        }
        for (int64_t p = 0; p < kgS; p++, dst += NR) {
            g->pairs(dst, v + 2 * p * d->v_sr + c,
                     2 * p + 1 < S ? v + (2 * p + 1) * d->v_sr + c : NULL, n);
            for (int64_t q = n; q < NR; q++) dst[q] = 0;
        }
    }
}

/* The mask and the unnormalised softmax of st's mr rows (query rows i..):
 * inv[r] = 1 / row r's sum; returns the rows with no allowed key (bit r). */
static uint32_t lp_softmax(const vitc__attn_lp_job *g, float *st, int64_t b, int64_t h,
                           int64_t i, int64_t mr, float *inv) {
    const vitc__sdpa_desc *d = g->d;
    const int64_t S = d->S;
    /* the scale multiplies the fp32 scores (q is converted as it is, with
     * no copy): softmax_rows_exp2 does it first when there is no mask */
    float temp = d->scale;
    uint32_t dead = 0;
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
    g->softmax_rows_exp2(st, mr, S, temp * 1.44269504088896341f, inv);
    if (d->probs)
        for (int64_t r = 0; r < mr; r++) {
            const float *prow = st + r * S;
            float *pr = d->probs + b * d->p_sb + h * d->p_sh + (i + r) * d->p_sr; /* [S] */
            for (int64_t j = 0; j < S; j++) pr[j] = prow[j] * inv[r];
        }
    return dead;
}

/* Rows [i, i + mr) of head (b, h), bf16. torch 2.x: a row with no allowed
 * key gives 0, unless its weights are returned (then NaN, as softmax gives
 * them). */
static void bf16_tile(const vitc__attn_lp_job *g, const lp_bufs *u, int64_t b, int64_t h,
                      int64_t i, int64_t mr) {
    const vitc__sdpa_desc *d = g->d;
    const int64_t S = d->S, D = d->D, Dv = d->Dv, kgD = g->kgD, kgS = g->kgS;
    const float *q = d->q + b * d->q_sb + h * d->q_sh; /* [L, D] */
    float *o = d->o + b * d->o_sb + h * d->o_sh;       /* [L, Dv] */
    if (mr < MR) { /* rows the microkernel reads but does not store */
        memset(u->qa + mr * kgD, 0, (size_t)((MR - mr) * kgD) * sizeof *u->qa);
        memset(u->pa + mr * kgS, 0, (size_t)((MR - mr) * kgS) * sizeof *u->pa);
    }
    for (int64_t r = 0; r < mr; r++)
        g->row(u->qa + r * kgD, 1, q + (i + r) * d->q_sr, D, NULL, NULL);
    for (int64_t j = 0; j < S; j += NR)
        g->ukr_rm(kgD, u->qa, kgD, u->kb + (j / NR) * kgD * NR, u->st + j, S, mr,
                  S - j < NR ? S - j : NR);
    float inv[MR]; /* 1 / each row's sum: P = st inv, applied as P is rounded */
    uint32_t dead = lp_softmax(g, u->st, b, h, i, mr, inv);
    for (int64_t r = 0; r < mr; r++) {
        if ((dead >> r & 1) && !d->probs)
            memset(u->pa + r * kgS, 0, (size_t)kgS * sizeof *u->pa);
        else
            g->row(u->pa + r * kgS, 1, u->st + r * S, S, &inv[r], NULL);
    }
    for (int64_t c = 0; c < Dv; c += NR)
        g->ukr_rm(kgS, u->pa, kgS, u->vb + (c / NR) * kgS * NR, o + i * d->o_sr + c, d->o_sr, mr,
                  Dv - c < NR ? Dv - c : NR);
}

/* The same, int8: q's rows quantized as the GEMM's activations, S
 * dequantized by the tile's epilogue with k's per-key scales; P's rows
 * quantized (each row's largest is 1: scale 1/255, zero point 0), its
 * normalisation folded into their scales. A row with no allowed key: 0
 * (NaN with its weights returned, as bf16's). */
static void int8_tile(const vitc__attn_lp_job *g, const lp_bufs *u, int64_t b, int64_t h,
                      int64_t i, int64_t mr) {
    const vitc__sdpa_desc *d = g->d;
    const int64_t S = d->S, Dv = d->Dv, kgD = g->kgD, kgS = g->kgS;
    const float *q = d->q + b * d->q_sb + h * d->q_sh; /* [L, D] */
    float *o = d->o + b * d->o_sb + h * d->o_sh;       /* [L, Dv] */
    vitc__lp_strip(g->kn, VITC_PRECISION_INT8, u->qa, MR, MR, q + i * d->q_sr, d->q_sr, mr, d->D,
                   u->qs, u->qz);
    vitc__lp_epi e = {.ascale = u->qs, .azp = u->qz};
    for (int64_t j = 0; j < S; j += NR) {
        e.wscale = u->ks + j, e.wsum = u->ksum + j;
        g->kn->ukr(kgD, u->qa, u->kb + (j / NR) * kgD * NR, u->st + j, S, mr,
                   S - j < NR ? S - j : NR, &e);
    }
    float inv[MR];
    uint32_t dead = lp_softmax(g, u->st, b, h, i, mr, inv);
    g->strip_unit(u->pa, MR, MR, u->st, S, mr, S, NULL, NULL);
    for (int64_t r = 0; r < mr; r++) {
        u->ps[r] = inv[r] * (1.0f / 255.0f), u->pz[r] = 0;
        if ((dead >> r & 1) && !d->probs) {
            u->ps[r] = 0.0f;
            for (int64_t p = 0; p < kgS; p++) u->pa[p * MR + r] = 0;
        }
    }
    e = (vitc__lp_epi){.ascale = u->ps, .azp = u->pz};
    for (int64_t c = 0; c < Dv; c += NR) {
        e.wscale = u->vs + c, e.wsum = u->vsum + c;
        g->kn->ukr(kgS, u->pa, u->vb + (c / NR) * kgS * NR, o + i * d->o_sr + c, d->o_sr, mr,
                   Dv - c < NR ? Dv - c : NR, &e);
    }
}

static void lp_task(void *ctx, int64_t t, int tid) {
    vitc__attn_lp_job *g = ctx;
    (void)tid;
    if (__atomic_load_n(&g->failed, __ATOMIC_RELAXED)) return;
    uint32_t *buf = vitc__lp_get(g->need);
    if (!buf) {
        __atomic_store_n(&g->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const vitc__sdpa_desc *d = g->d;
    int64_t bh = t / g->nqb, qb = t % g->nqb, b = bh / d->H, h = bh % d->H;
    int64_t l0 = qb * g->br;
    int64_t l1 = l0 + g->br < d->L ? l0 + g->br : d->L;
    lp_bufs u = lp_carve(g, buf);
    lp_pack_kv(g, b, h, &u);
    const float *q = d->q + b * d->q_sb + h * d->q_sh; /* [L, D] */
    for (int64_t i = l0; i < l1; i += MR) {
        int64_t mr = l1 - i < MR ? l1 - i : MR;
        /* the next tile's rows of q meanwhile (as k's, lp_pack_kv) */
        for (int64_t r = i + MR; r < i + 2 * MR && r < l1; r++)
            for (int64_t c = 0; c < d->D; c += 16) __builtin_prefetch(q + r * d->q_sr + c, 0, 3);
        (g->int8 ? int8_tile : bf16_tile)(g, &u, b, h, i, mr);
    }
}

vitc_status vitc__sdpa_lp(const vitc__sdpa_desc *d, const struct vitc__lp_kernel *kn) {
    /* int32 sums: |q k| <= D 255 127 and |P v| <= S 255 127, and the zero
     * points' terms as large: fit while D, S <= 33000 (the GEMM's bound) */
    vitc_precision p = d->prec == VITC_PRECISION_INT8 && (d->D > 33000 || d->S > 33000)
                           ? VITC_PRECISION_BF16
                           : d->prec;
    /* a kernel given is of d->prec (and, for int8, takes [kg][MR] A
     * strips, as vitc__lp_attention_kernel's do): not for the fallback */
    vitc__attn_lp_job g = {.d = d, .kn = kn && p == d->prec ? kn : vitc__lp_attention_kernel(p),
                           .int8 = p == VITC_PRECISION_INT8};
    const vitc__lp_kernel *ref = g.int8 ? &vitc__lp_int8_ref : &vitc__lp_bf16_ref;
    g.row = g.kn->row ? g.kn->row : ref->row;
    g.ukr_rm = g.kn->ukr_rm ? g.kn->ukr_rm : ref->ukr_rm;
    g.pairs = g.kn->pairs ? g.kn->pairs : ref->pairs;
    g.s8_rows = g.kn->s8_rows ? g.kn->s8_rows : ref->s8_rows;
    g.s8_quads = g.kn->s8_quads ? g.kn->s8_quads : ref->s8_quads;
    g.strip_unit = g.kn->strip_unit ? g.kn->strip_unit : ref->strip_unit;
    g.softmax_rows_exp2 = vitc__kern()->softmax_rows_exp2;
    int gw = g.int8 ? 4 : 2; /* values a word */
    g.br = d->B * d->H >= vitc__num_threads() ? lp_round(d->L, MR) : VITC_ATTN_LP_BR;
    g.nqb = (d->L + g.br - 1) / g.br;
    g.kgD = (d->D + gw - 1) / gw;
    g.kgS = (d->S + gw - 1) / gw;
    g.Sp = lp_round(d->S, NR);
    g.Dvp = lp_round(d->Dv, NR);
    const char *who = g.int8 ? "sdpa (int8)" : "sdpa (bf16)";
    if (!(g.need = lp_need(&g)))
        return vitc__err(VITC_ERR_NOMEM, "%s: scratch size overflows", who);
    /* Tasks claimed one at a time as threads come free: a static half
     * each left one thread idle 6% of batch 8's attention (96 heads), the
     * two vCPUs running at different speeds. A task's bits do not depend on
     * its thread. */
    vitc__parallel_for_dynamic(d->B * d->H * g.nqb, 1, lp_task, &g);
    if (g.failed)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for %zu bytes of scratch", who, g.need);
    return VITC_OK;
}
