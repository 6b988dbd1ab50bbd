/*
 * attention.c — the attention core, forward and backward: the plain
 * reference kernels, the plans (block sizes), per-thread scratch and the
 * dispatch to the tiled kernels (attention_tmpl.h and attention_bwd_tmpl.h,
 * instantiated in attention_{generic,avx2,avx512}.c).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define VITC_ATTN_HAVE_MXCSR 1
#endif

#include "attention_impl.h"

/* ---- reference ------------------------------------------------------ */

/* Score j of query row ql: scale * ql . kj (+ the mask row ml), as the max
 * pass and the exponent pass both compute it. */
static inline float sdpa_score(const vitc__sdpa_desc *d, const float *ql, const float *kj,
                               const float *ml, const float *rh, const float *rw, int64_t j) {
    float acc = 0.0f;
    for (int64_t c = 0; c < d->D; c++) acc += ql[c] * kj[c];
    acc *= d->scale;
    if (rh) acc += rh[j / d->kw] + rw[j % d->kw];
    if (ml) acc += ml[j];
    return acc;
}

/* Row l's decomposed relative-position rows of head (b, h), or NULLs. */
static inline void sdpa_rel_rows(const vitc__sdpa_desc *d, int64_t b, int64_t h, int64_t l,
                                 const float **rh, const float **rw) {
    *rh = d->rel_h ? d->rel_h + b * d->rh_sb + h * d->rh_sh + l * d->rh_sr : NULL; /* [kh] */
    *rw = d->rel_h ? d->rel_w + b * d->rw_sb + h * d->rw_sh + l * d->rw_sr : NULL; /* [kw] */
}

/* Two passes over the keys per query row, recomputing the scores instead of
 * storing them, so it needs no scratch: (1) the row max, (2) exp, sum and the
 * weighted sum of V; the output is divided by the sum at the end. */
void vitc__sdpa_ref_rows(const vitc__sdpa_desc *d, int64_t b, int64_t h, int64_t l0, int64_t l1) {
    const float *q = d->q + b * d->q_sb + h * d->q_sh; /* [L, D] */
    const float *k = d->k + b * d->k_sb + h * d->k_sh; /* [S, D] */
    const float *v = d->v + b * d->v_sb + h * d->v_sh; /* [S, Dv] */
    float *o = d->o + b * d->o_sb + h * d->o_sh;       /* [L, Dv] */
    for (int64_t l = l0; l < l1; l++) {
        const float *ql = q + l * d->q_sr;
        const float *ml = d->mask ? d->mask + b * d->m_sb + h * d->m_sh + l * d->m_sr : NULL;
        const float *rh, *rw;
        sdpa_rel_rows(d, b, h, l, &rh, &rw);
        float *pl = d->probs ? d->probs + b * d->p_sb + h * d->p_sh + l * d->p_sr : NULL;
        float *ol = o + l * d->o_sr;
        float mx = -INFINITY;
        for (int64_t j = 0; j < d->S; j++) {
            float acc = sdpa_score(d, ql, k + j * d->k_sr, ml, rh, rw, j);
            if (acc > mx) mx = acc;
        }
        for (int64_t c = 0; c < d->Dv; c++) ol[c] = 0.0f;
        if (d->S == 0) { /* softmax over nothing: the output is an empty sum */
            if (d->lse) d->lse[b * d->lse_sb + h * d->lse_sh + l] = -INFINITY;
            continue;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < d->S; j++) {
            float acc = sdpa_score(d, ql, k + j * d->k_sr, ml, rh, rw, j);
            /* every score -inf: NaN weights, as torch's softmax */
            float e = expf(acc - mx);
            sum += e;
            if (pl) pl[j] = e;
            const float *vj = v + j * d->v_sr;
            for (int64_t c = 0; c < d->Dv; c++) ol[c] += e * vj[c];
        }
        float inv = 1.0f / sum;
        /* torch 2.x's SDPA: a row with no allowed key gives 0 (NaN only
         * when its weights are returned) */
        float oinv = mx == -INFINITY && !pl ? 0.0f : inv;
        for (int64_t c = 0; c < d->Dv; c++) ol[c] = oinv == 0.0f ? 0.0f : ol[c] * oinv;
        if (d->lse) d->lse[b * d->lse_sb + h * d->lse_sh + l] = mx == -INFINITY ? -INFINITY : mx + logf(sum);
        if (pl)
            for (int64_t j = 0; j < d->S; j++) pl[j] *= inv;
    }
}

/* ---- per-thread scratch ------------------------------------------- */

/* Thread-local rather than indexed by pool tid: two user threads may run
 * attention at once (distinct layers), each through its own pool call. The
 * key's destructor frees a worker's buffer when the worker exits. */
typedef struct vitc__attn_tls {
    vitc__attn_ws ws;
    float *buf;
    size_t cap; /* floats */
    float *bbuf; /* the backward's, apart: it would clobber the forward's cached K/V */
    size_t bcap;
} vitc__attn_tls;

static _Thread_local vitc__attn_tls *vitc__attn_mine;
static pthread_key_t vitc__attn_key;
static pthread_once_t vitc__attn_once = PTHREAD_ONCE_INIT;
static int vitc__attn_key_ok;

static void vitc__attn_tls_free(void *p) {
    vitc__attn_tls *t = p;
    if (!t) return;
    vitc__free(t->buf);
    vitc__free(t->bbuf);
    free(t);
}

static void vitc__attn_key_init(void) {
    vitc__attn_key_ok = pthread_key_create(&vitc__attn_key, vitc__attn_tls_free) == 0;
}

static size_t vitc__attn_r16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Query rows the scratch is sized for: Br rounded up to 32, because the
 * small-Dv path works on groups of 2 vectors of rows (32 on AVX-512). */
static size_t vitc__attn_brp(const vitc__attn_plan *p) { return ((size_t)p->Br + 31) & ~(size_t)31; }

/* Scratch floats one thread needs for plan p (0 on overflow). */
static size_t vitc__attn_need(const vitc__attn_plan *p) {
    const vitc__sdpa_desc *d = p->d;
    size_t Br = vitc__attn_brp(p), parts[6];
    parts[0] = vitc__attn_r16(Br * (size_t)d->D);
    parts[1] = vitc__attn_r16(Br * (size_t)p->Bcp);
    parts[2] = vitc__attn_r16(Br * (size_t)p->Dvp);
    parts[3] = vitc__attn_r16(4 * Br);
    parts[4] = vitc__attn_r16((size_t)p->kv_cols * (size_t)d->D);
    parts[5] = vitc__attn_r16((size_t)p->kv_cols * (size_t)p->Dvp);
    size_t total = 0;
    for (int i = 0; i < 6; i++)
        if (!vitc__add_size(total, parts[i], &total)) return 0;
    return total;
}

static vitc__attn_tls *vitc__attn_tls_get(void) {
    pthread_once(&vitc__attn_once, vitc__attn_key_init);
    vitc__attn_tls *t = vitc__attn_mine;
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t) return NULL;
        vitc__attn_mine = t;
        if (vitc__attn_key_ok) pthread_setspecific(vitc__attn_key, t);
    }
    return t;
}

/* Grows *buf (capacity *cap floats) to need floats; 0 when memory ran out. */
static int vitc__attn_grow(float **buf, size_t *cap, size_t need) {
    if (*cap >= need) return 1;
    size_t bytes;
    if (!vitc__mul_size(need, sizeof(float), &bytes)) return 0;
    float *nb = vitc__alloc(bytes);
    if (!nb) return 0;
    vitc__free(*buf);
    *buf = nb;
    *cap = need;
    return 1;
}

/* This thread's workspace carved for plan p, or NULL when memory ran out. */
static vitc__attn_ws *vitc__attn_ws_get(const vitc__attn_plan *p, size_t need) {
    vitc__attn_tls *t = vitc__attn_tls_get();
    if (!t) return NULL;
    if (t->cap < need) {
        if (!vitc__attn_grow(&t->buf, &t->cap, need)) return NULL;
        t->ws.kv_gen = 0; /* the packed K/V went with the old buffer */
    }
    const vitc__sdpa_desc *d = p->d;
    size_t Br = vitc__attn_brp(p);
    float *x = t->buf;
    t->ws.qp = x, x += vitc__attn_r16(Br * (size_t)d->D);
    t->ws.st = x, x += vitc__attn_r16(Br * (size_t)p->Bcp);
    t->ws.ot = x, x += vitc__attn_r16(Br * (size_t)p->Dvp);
    t->ws.mrow = x, t->ws.lrow = x + Br, t->ws.arow = x + 2 * Br, t->ws.orow = x + 3 * Br;
    x += vitc__attn_r16(4 * Br);
    t->ws.kt = x, x += vitc__attn_r16((size_t)p->kv_cols * (size_t)d->D);
    t->ws.vp = x;
    return &t->ws;
}

/* ---- plan and dispatch -------------------------------------------- */

static int64_t vitc__attn_round(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Whole-head K/V packing is kept per thread up to this size; beyond it a
 * task repacks each key block (the packing is O(S d), the math O(Br S d)). */
#define VITC_ATTN_WHOLE_BYTES ((int64_t)16 << 20)

static uint64_t vitc__attn_gen;

static void vitc__attn_plan_make(vitc__attn_plan *p, const vitc__sdpa_desc *d) {
    memset(p, 0, sizeof *p);
    p->d = d;
    /* One block when a whole key row is short: an exact softmax, no
     * rescaling. Otherwise 256 keys: the S tile and a K/V block stay in L2. */
    p->Bc = d->S <= 256 ? d->S : 256;
    p->nkb = (d->S + p->Bc - 1) / p->Bc;
    p->Bcp = vitc__attn_round(p->Bc, VITC_ATTN_PANEL);
    p->Dvp = vitc__attn_round(d->Dv, VITC_ATTN_DV_ALIGN);
    /* Long query rows reuse each key block for more rows (K/V re-streamed
     * once per query block); short ones keep enough tasks for the threads.
     * A multiple of the microkernels' 12 and 6 rows. Never depends on the
     * thread count, so neither does any rounding. */
    int64_t Br = d->L >= 1024 ? 192 : 48;
    /* The small-Dv path (attention_tmpl.h) takes rows 32 at a time. */
    if (d->Dv <= 16 && !d->mask && !d->rel_h && !d->probs && d->L < 1024) Br = 64;
    while (Br > 12 && d->B * d->H * ((d->L + Br - 1) / Br) < 8) Br = Br / 2 < 12 ? 12 : Br / 2;
    /* A short head (L up to 1.5 Br) in one block rather than a full one and
     * a sliver (ViT on 28 px images: 50 = 48 + 2 rows), when there are tasks
     * enough anyway. Rows are computed independently: the same numbers. */
    if (d->L <= Br + Br / 2 && d->B * d->H >= 8) Br = d->L;
    if (Br > d->L) Br = d->L;
    p->Br = Br;
    p->nqb = (d->L + Br - 1) / Br;
    int64_t whole_cols = vitc__attn_round(d->S, VITC_ATTN_PANEL);
    /* Worth keeping when some thread will reuse it: several key blocks per
     * task, or several tasks per head. */
    p->whole_head = (p->nkb > 1 || p->nqb > 1) &&
                    whole_cols * (d->D + p->Dvp) * 4 <= VITC_ATTN_WHOLE_BYTES;
    p->kv_cols = p->whole_head ? whole_cols : p->Bcp;
    p->gen = __atomic_add_fetch(&vitc__attn_gen, 1, __ATOMIC_RELAXED);
    p->qscale = (float)((double)d->scale * 1.442695040888963407359924681001892137);
}

typedef struct vitc__attn_run {
    const vitc__attn_plan *plan;
    vitc__attn_rows_fn fn;
    size_t need;
    int failed;
    /* Work units, claimed one at a time (vitc__attn_claim): units below
     * whole are a head each (its nqb tasks in a row, sharing the packed
     * K/V); the rest are single tasks. The last head's rows from fine_from
     * on come in tasks of fine_br rows (the run's tail, see vitc__sdpa). */
    int64_t units, whole, next;
    int64_t fine_from, fine_br, coarse_units;
} vitc__attn_run;

/* Rows [l0, l0 + n) of head bh (b * H + h), cut at the head's last row. */
static void vitc__attn_task(vitc__attn_run *rc, int64_t bh, int64_t l0, int64_t n) {
    const vitc__attn_plan *p = rc->plan;
    const int64_t l1 = l0 + n < p->d->L ? l0 + n : p->d->L;
    if (__atomic_load_n(&rc->failed, __ATOMIC_RELAXED)) return;
    vitc__attn_ws *ws = vitc__attn_ws_get(p, rc->need);
    if (!ws) {
        __atomic_store_n(&rc->failed, 1, __ATOMIC_RELAXED);
        return;
    }
#ifdef VITC_ATTN_HAVE_MXCSR
    /* FTZ+DAZ: a denormal operand costs an FMA assist of ~100 cycles, and
     * the vector exp2 relies on FTZ to return exactly 0. MXCSR is per
     * thread, so each task sets and restores it around its own work. */
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);
#endif
    rc->fn(p, ws, bh / p->d->H, bh % p->d->H, l0, l1);
#ifdef VITC_ATTN_HAVE_MXCSR
    _mm_setcsr(csr);
#endif
}

/* A thread's share of the call: units claimed from the shared counter as it
 * comes free, so a thread that starts late (waking, or its core taken)
 * leaves more to the other. */
static void vitc__attn_claim(void *ctx, int64_t begin, int64_t end, int tid) {
    vitc__attn_run *rc = ctx;
    const vitc__attn_plan *p = rc->plan;
    const int64_t nqb = p->nqb, Br = p->Br, L = p->d->L;
    (void)begin, (void)end, (void)tid;
    for (int64_t u; (u = __atomic_fetch_add(&rc->next, 1, __ATOMIC_RELAXED)) < rc->units;) {
        if (u < rc->whole) {
            for (int64_t l0 = 0; l0 < L; l0 += Br)
                vitc__attn_task(rc, u, l0, Br);
            continue;
        }
        int64_t i = rc->whole * nqb + (u - rc->whole), bh = i / nqb, l0 = (i % nqb) * Br, n = Br;
        if (u >= rc->coarse_units) { /* the tail */
            bh = p->d->B * p->d->H - 1;
            l0 = rc->fine_from + (u - rc->coarse_units) * rc->fine_br;
            n = rc->fine_br;
        }
        vitc__attn_task(rc, bh, l0, n);
    }
}

size_t vitc__sdpa_scratch_bytes(const vitc__sdpa_desc *d) {
    if (!d || d->B * d->H * d->L <= 0 || d->S <= 0) return 0;
    vitc__attn_plan plan;
    vitc__attn_plan_make(&plan, d);
    return vitc__attn_need(&plan) * sizeof(float);
}

static int vitc__attn_bad(int64_t n, const void *ptr) { return n > 0 && !ptr; }

/* The size checks the forward and the backward share. */
static vitc_status vitc__sdpa_check_sizes(const vitc__sdpa_desc *d, const char *who) {
    if (d->B < 0 || d->H < 0 || d->L < 0 || d->S < 0 || d->D < 0 || d->Dv < 0)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "%s: negative size (B %lld, H %lld, L %lld, S %lld, D %lld, Dv %lld)",
                         who, (long long)d->B, (long long)d->H, (long long)d->L, (long long)d->S,
                         (long long)d->D, (long long)d->Dv);
    /* Far beyond any tensor that fits in memory; keeps the plan's int64
     * products (S * D, B * H * L, ...) from overflowing. */
    const int64_t big = (int64_t)1 << 31;
    if (d->B >= big || d->H >= big || d->L >= big || d->S >= big || d->D >= big ||
        d->Dv >= big || d->B * d->H >= big || d->B * d->H * d->L >= ((int64_t)1 << 50) ||
        d->B * d->H * d->S >= ((int64_t)1 << 50))
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: sizes too large", who);
    return VITC_OK;
}

/* The relative-position views, when given, must describe the key grid. */
static vitc_status vitc__sdpa_check_rel(const vitc__sdpa_desc *d, const char *who) {
    if (!d->rel_h) return VITC_OK;
    if (!d->rel_w)
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: rel_h given without rel_w; pass both", who);
    if (d->kh <= 0 || d->kw <= 0 || d->kh * d->kw != d->S)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "%s: the key grid %lld x %lld does not hold the %lld keys; set kh, kw "
                         "with kh * kw == S",
                         who, (long long)d->kh, (long long)d->kw, (long long)d->S);
    return VITC_OK;
}

vitc_status vitc__sdpa(const vitc__sdpa_desc *d) {
    if (!d) return vitc__err(VITC_ERR_INVALID_ARG, "sdpa: NULL descriptor");
    VITC_TRY(vitc__sdpa_check_sizes(d, "sdpa"));
    VITC_TRY(vitc__sdpa_check_rel(d, "sdpa"));
    int64_t rows = d->B * d->H * d->L;
    if (rows == 0) return VITC_OK;
    if (vitc__attn_bad(d->D * d->S, d->q) || vitc__attn_bad(d->D * d->S, d->k) ||
        vitc__attn_bad(d->Dv * d->S, d->v) || vitc__attn_bad(d->Dv, d->o))
        return vitc__err(VITC_ERR_INVALID_ARG, "sdpa: NULL q, k, v or o");
    if (d->S == 0) { /* softmax over no keys: an empty weighted sum */
        for (int64_t b = 0; b < d->B; b++)
            for (int64_t h = 0; h < d->H; h++)
                for (int64_t l = 0; l < d->L; l++) {
                    for (int64_t c = 0; c < d->Dv; c++)
                        d->o[b * d->o_sb + h * d->o_sh + l * d->o_sr + c] = 0.0f;
                    if (d->lse) d->lse[b * d->lse_sb + h * d->lse_sh + l] = -INFINITY;
                }
        return VITC_OK;
    }

    if (d->prec != VITC_PRECISION_FP32 && !d->lse && !d->rel_h) return vitc__sdpa_lp(d, NULL);
    vitc__attn_plan plan;
    vitc__attn_plan_make(&plan, d);
    vitc__attn_run rc = {
        .plan = &plan, .fn = vitc__kern()->attn_rows, .need = vitc__attn_need(&plan)};
    if (rc.need == 0) return vitc__err(VITC_ERR_NOMEM, "sdpa: scratch size overflows");
    /* Claimed as threads come free, a head (its query blocks, sharing its
     * packed K/V) at a time when there are heads enough, but the last nt
     * heads a query block at a time: with whole heads the threads ended
     * up to a head apart, half a head on average (ViT-B batch 1, 2
     * threads: 6 heads each, 4 % of the region's thread time idle at its
     * end). A split head's K/V is packed by each thread that takes part of
     * it, once per thread. Each task's numbers do not depend on its
     * thread or on the split. */
    const int64_t heads = d->B * d->H, nt = vitc__num_threads();
    rc.whole = heads >= 4 * nt ? heads - nt : 0;
    rc.units = rc.whole + (heads - rc.whole) * plan.nqb;
    /* The tail: the last head's last nt query blocks (whole blocks from the
     * head's end) in quarter blocks, so that the threads finish at most a
     * quarter block apart. With [1,1,4096,512] on 2 threads the 22 blocks
     * of 192 rows had split 2112 : 1984 rows, 3 % of the call idle. */
    rc.coarse_units = rc.units;
    rc.fine_br = vitc__attn_round(plan.Br / 4, 12);
    if (nt > 1 && plan.nqb > nt && plan.Br >= 2 * rc.fine_br) {
        int64_t keep = plan.nqb - nt; /* coarse blocks kept in the last head */
        rc.fine_from = keep * plan.Br;
        rc.coarse_units = rc.units - plan.nqb + keep;
        rc.units = rc.coarse_units + (d->L - rc.fine_from + rc.fine_br - 1) / rc.fine_br;
    }
    vitc__parallel_range(nt < rc.units ? nt : rc.units, vitc__attn_claim, &rc);
    if (rc.failed)
        return vitc__err(VITC_ERR_NOMEM, "sdpa: out of memory for %zu bytes of per-thread scratch",
                         rc.need * sizeof(float));
    return VITC_OK;
}

/* ==== backward ======================================================= */

/* Per head: D_l = dO_l . O_l, then for every (l, j) the recomputed
 * p = e^(s - lse_l), dV_j += p dO_l, ds = p (dO_l . V_j - D_l),
 * dQ_l += scale ds K_j, dK_j += scale ds Q_l. */
void vitc__sdpa_backward_ref(const vitc__sdpa_bwd_desc *bd) { vitc__sdpa_backward_ref_rel(bd, NULL); }

void vitc__sdpa_backward_ref_rel(const vitc__sdpa_bwd_desc *bd, const vitc__sdpa_rel_grad *rg) {
    const vitc__sdpa_desc *d = &bd->f;
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->H; h++) {
            const float *q = d->q + b * d->q_sb + h * d->q_sh;          /* [L, D] */
            const float *k = d->k + b * d->k_sb + h * d->k_sh;          /* [S, D] */
            const float *v = d->v + b * d->v_sb + h * d->v_sh;          /* [S, Dv] */
            const float *o = d->o + b * d->o_sb + h * d->o_sh;          /* [L, Dv] */
            const float *lse = d->lse + b * d->lse_sb + h * d->lse_sh;  /* [L] */
            const float *dO = bd->dout + b * bd->do_sb + h * bd->do_sh; /* [L, Dv] */
            float *dq = bd->dq + b * bd->dq_sb + h * bd->dq_sh;         /* [L, D] */
            float *dk = bd->dk + b * bd->dk_sb + h * bd->dk_sh;         /* [S, D] */
            float *dv = bd->dv + b * bd->dv_sb + h * bd->dv_sh;         /* [S, Dv] */
            for (int64_t j = 0; j < d->S; j++) {
                for (int64_t c = 0; c < d->D; c++) dk[j * bd->dk_sr + c] = 0.0f;
                for (int64_t c = 0; c < d->Dv; c++) dv[j * bd->dv_sr + c] = 0.0f;
            }
            for (int64_t l = 0; l < d->L; l++) {
                const float *ql = q + l * d->q_sr, *dol = dO + l * bd->do_sr;
                const float *ml = d->mask ? d->mask + b * d->m_sb + h * d->m_sh + l * d->m_sr : NULL;
                const float *rh, *rw;
                sdpa_rel_rows(d, b, h, l, &rh, &rw);
                /* [kh], [kw] or NULL */
                float *drh = rh && rg && rg->drel_h
                                 ? rg->drel_h + b * rg->drh_sb + h * rg->drh_sh + l * rg->drh_sr : NULL;
                float *drw = rh && rg && rg->drel_w
                                 ? rg->drel_w + b * rg->drw_sb + h * rg->drw_sh + l * rg->drw_sr : NULL;
                for (int64_t a = 0; drh && a < d->kh; a++) drh[a] = 0.0f;
                for (int64_t a = 0; drw && a < d->kw; a++) drw[a] = 0.0f;
                float *dql = dq + l * bd->dq_sr;
                float Dl = 0.0f;
                for (int64_t c = 0; c < d->Dv; c++) Dl += dol[c] * o[l * d->o_sr + c];
                for (int64_t c = 0; c < d->D; c++) dql[c] = 0.0f;
                for (int64_t j = 0; j < d->S; j++) {
                    const float *kj = k + j * d->k_sr, *vj = v + j * d->v_sr;
                    float s = 0.0f, dp = 0.0f;
                    for (int64_t c = 0; c < d->D; c++) s += ql[c] * kj[c];
                    s *= d->scale;
                    if (rh) s += rh[j / d->kw] + rw[j % d->kw];
                    if (ml) s += ml[j];
                    /* a row with no allowed key: its output is a constant 0
                     * (torch 2.x), so nothing flows back through it */
                    float p = lse[l] == -INFINITY ? 0.0f : expf(s - lse[l]);
                    for (int64_t c = 0; c < d->Dv; c++) {
                        dp += dol[c] * vj[c];
                        dv[j * bd->dv_sr + c] += p * dol[c];
                    }
                    if (drh) drh[j / d->kw] += p * (dp - Dl);
                    if (drw) drw[j % d->kw] += p * (dp - Dl);
                    float ds = p * (dp - Dl) * d->scale;
                    for (int64_t c = 0; c < d->D; c++) {
                        dql[c] += ds * kj[c];
                        dk[j * bd->dk_sr + c] += ds * ql[c];
                    }
                }
            }
        }
}

static size_t vitc__attn_r32(size_t n) { return (n + 31) & ~(size_t)31; }

/* Floats of each view, in carving order (vitc__attn_bwd_carve). */
static int vitc__attn_bwd_parts(const vitc__attn_bwd_plan *p, int64_t rows, size_t *parts,
                                size_t *Lp) {
    const vitc__sdpa_desc *d = &p->d->f;
    size_t lp = vitc__attn_r32((size_t)rows), Bc = (size_t)p->Bc, Br = (size_t)p->ldt;
    size_t D = (size_t)d->D, Dv = (size_t)d->Dv, Dp = (size_t)p->Dp, Dvp = (size_t)p->Dvp;
    size_t dims[12][2] = {{D, lp},  {Dv, lp},  {lp, Dp}, {lp, Dvp}, {lp, Dp}, {Bc, Dp},
                          {Bc, Dp}, {Bc, Dvp}, {Bc, Br}, {Bc, Br},  {lp, 1},  {lp, 1}};
    for (int i = 0; i < 12; i++) {
        if (!vitc__mul_size(dims[i][0], dims[i][1], &parts[i]) ||
            !vitc__add_size(parts[i], 15, &parts[i]))
            return 0;
        parts[i] &= ~(size_t)15;
    }
    *Lp = lp;
    return 1;
}

size_t vitc__attn_bwd_need(const vitc__attn_bwd_plan *p, int64_t rows) {
    size_t parts[12], Lp, total = 0;
    if (!vitc__attn_bwd_parts(p, rows, parts, &Lp)) return 0;
    for (int i = 0; i < 12; i++)
        if (!vitc__add_size(total, parts[i], &total)) return 0;
    return total;
}

void vitc__attn_bwd_carve(const vitc__attn_bwd_plan *p, int64_t rows, float *buf,
                          vitc__attn_bwd_ws *ws) {
    size_t parts[12], Lp;
    vitc__attn_bwd_parts(p, rows, parts, &Lp); /* checked by vitc__attn_bwd_need */
    float **views[12] = {&ws->qt, &ws->dot, &ws->qr, &ws->dor, &ws->dq,   &ws->kr,
                         &ws->dk, &ws->dv,  &ws->pt, &ws->dst, &ws->lse2, &ws->dd};
    for (int i = 0; i < 12; i++) *views[i] = buf, buf += parts[i];
    ws->Lp = (int64_t)Lp;
}

/* Heads below which one head is split over tasks: key chunks first (dK,
 * dV), then query chunks (dQ), which recomputes S and dP once more. */
#define VITC_ATTN_BWD_MIN_TASKS 8

static void vitc__attn_bwd_plan_make(vitc__attn_bwd_plan *p, const vitc__sdpa_bwd_desc *bd) {
    const vitc__sdpa_desc *d = &bd->f;
    memset(p, 0, sizeof *p);
    p->d = bd;
    /* 192 keys: a multiple of every path's tile rows (12, 6, 4); the
     * task's packed query rows are streamed once per key block, so longer
     * blocks stream them less (measured: 192 beats 96 at N = 4096 and ties
     * at 2048). 128 query rows: the P^T and dS^T tiles (110 KB each) stay
     * in L2 with the block's dK and dV. */
    p->Bc = 192;
    p->Br = 128;
    p->ldt = p->Br + 16;
    p->Dp = vitc__attn_round(d->D, 16);
    p->Dvp = vitc__attn_round(d->Dv, 16);
    p->qscale = (float)((double)d->scale * 1.442695040888963407359924681001892137);
    p->rows_max = d->L;
    int64_t BH = d->B * d->H;
    int64_t parts = (VITC_ATTN_BWD_MIN_TASKS + BH - 1) / BH;
    p->kchunk = vitc__attn_round((d->S + parts - 1) / parts, p->Bc);
    p->qchunk = vitc__attn_round((d->L + parts - 1) / parts, p->Br);
    p->split = BH < VITC_ATTN_BWD_MIN_TASKS && (d->S > p->kchunk || d->L > p->qchunk);
}

typedef struct vitc__attn_bwd_run {
    const vitc__attn_bwd_plan *plan;
    vitc__attn_bwd_fn fn;
    size_t need;
    int phase; /* split plans: 1 = key chunks, 2 = query chunks */
    int64_t nchunk;
    int failed;
} vitc__attn_bwd_run;

static void vitc__attn_bwd_task(void *ctx, int64_t i, int tid) {
    vitc__attn_bwd_run *rc = ctx;
    const vitc__attn_bwd_plan *p = rc->plan;
    const vitc__sdpa_desc *d = &p->d->f;
    (void)tid;
    if (__atomic_load_n(&rc->failed, __ATOMIC_RELAXED)) return;
    vitc__attn_tls *t = vitc__attn_tls_get();
    if (!t || !vitc__attn_grow(&t->bbuf, &t->bcap, rc->need)) {
        __atomic_store_n(&rc->failed, 1, __ATOMIC_RELAXED);
        return;
    }
#ifdef VITC_ATTN_HAVE_MXCSR
    unsigned int csr = _mm_getcsr(); /* FTZ+DAZ, as the forward (vitc__attn_task) */
    _mm_setcsr(csr | 0x8040u);
#endif
    int64_t bh = i / rc->nchunk, c = i % rc->nchunk, b = bh / d->H, h = bh % d->H;
    if (!p->split) {
        rc->fn(p, t->bbuf, b, h, 0, d->L, 0, d->S, VITC_ATTN_BWD_DKV | VITC_ATTN_BWD_DQ);
    } else if (rc->phase == 1) {
        int64_t s0 = c * p->kchunk, s1 = s0 + p->kchunk < d->S ? s0 + p->kchunk : d->S;
        rc->fn(p, t->bbuf, b, h, 0, d->L, s0, s1, VITC_ATTN_BWD_DKV);
    } else {
        int64_t l0 = c * p->qchunk, l1 = l0 + p->qchunk < d->L ? l0 + p->qchunk : d->L;
        rc->fn(p, t->bbuf, b, h, l0, l1, 0, d->S, VITC_ATTN_BWD_DQ);
    }
#ifdef VITC_ATTN_HAVE_MXCSR
    _mm_setcsr(csr);
#endif
}

size_t vitc__sdpa_backward_scratch_bytes(const vitc__sdpa_bwd_desc *d) {
    if (!d || d->f.B * d->f.H * d->f.L <= 0 || d->f.S <= 0) return 0;
    vitc__attn_bwd_plan plan;
    vitc__attn_bwd_plan_make(&plan, d);
    return vitc__attn_bwd_need(&plan, plan.rows_max) * sizeof(float);
}

/* Zeros rows [0, n) of c columns of every head of x. */
static void vitc__attn_zero(float *x, int64_t sb, int64_t sh, int64_t sr, int64_t B, int64_t H,
                            int64_t n, int64_t c) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t r = 0; r < n; r++)
                if (c > 0) memset(x + b * sb + h * sh + r * sr, 0, (size_t)c * sizeof(float));
}

vitc_status vitc__sdpa_backward(const vitc__sdpa_bwd_desc *bd) { return vitc__sdpa_backward_rel(bd, NULL); }

vitc_status vitc__sdpa_backward_rel(const vitc__sdpa_bwd_desc *bd, const vitc__sdpa_rel_grad *rg) {
    if (!bd) return vitc__err(VITC_ERR_INVALID_ARG, "sdpa backward: NULL descriptor");
    const vitc__sdpa_desc *d = &bd->f;
    VITC_TRY(vitc__sdpa_check_sizes(d, "sdpa backward"));
    VITC_TRY(vitc__sdpa_check_rel(d, "sdpa backward"));
    if (d->B * d->H == 0) return VITC_OK;
    int64_t L = d->L, S = d->S;
    if (vitc__attn_bad(L * d->D, bd->dq) || vitc__attn_bad(S * d->D, bd->dk) ||
        vitc__attn_bad(S * d->Dv, bd->dv))
        return vitc__err(VITC_ERR_INVALID_ARG, "sdpa backward: NULL dq, dk or dv");
    /* No keys: q had no influence. No queries: neither had k or v. */
    if (S == 0 || L == 0) {
        vitc__attn_zero(bd->dq, bd->dq_sb, bd->dq_sh, bd->dq_sr, d->B, d->H, L, d->D);
        vitc__attn_zero(bd->dk, bd->dk_sb, bd->dk_sh, bd->dk_sr, d->B, d->H, S, d->D);
        vitc__attn_zero(bd->dv, bd->dv_sb, bd->dv_sh, bd->dv_sr, d->B, d->H, S, d->Dv);
        return VITC_OK;
    }
    if (vitc__attn_bad(d->D, d->q) || vitc__attn_bad(d->D, d->k) || vitc__attn_bad(d->Dv, d->v) ||
        vitc__attn_bad(d->Dv, d->o) || vitc__attn_bad(d->Dv, bd->dout) || !d->lse)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "sdpa backward: NULL q, k, v, o, lse or dout (the forward's o and lse are needed)");
    vitc__attn_bwd_plan plan;
    vitc__attn_bwd_plan_make(&plan, bd);
    plan.rg = rg;
    vitc__attn_bwd_run rc = {&plan, vitc__kern()->attn_bwd, vitc__attn_bwd_need(&plan, plan.rows_max),
                             1, 1, 0};
    if (rc.need == 0) return vitc__err(VITC_ERR_NOMEM, "sdpa backward: scratch size overflows");
    int64_t BH = d->B * d->H;
    /* Tasks claimed in grains as threads come free (a task's result does
     * not depend on its thread): fixed halves of a Fashion-MNIST step's
     * 512 heads had left one thread idle whenever the other was slowed. */
    const int64_t per = 8 * (int64_t)vitc__num_threads();
    if (!plan.split) {
        vitc__parallel_for_dynamic(BH, BH / per, vitc__attn_bwd_task, &rc);
    } else {
        rc.nchunk = (S + plan.kchunk - 1) / plan.kchunk;
        vitc__parallel_for_dynamic(BH * rc.nchunk, BH * rc.nchunk / per, vitc__attn_bwd_task, &rc);
        rc.phase = 2;
        rc.nchunk = (L + plan.qchunk - 1) / plan.qchunk;
        if (!rc.failed)
            vitc__parallel_for_dynamic(BH * rc.nchunk, BH * rc.nchunk / per, vitc__attn_bwd_task,
                                       &rc);
    }
    if (rc.failed)
        return vitc__err(VITC_ERR_NOMEM,
                         "sdpa backward: out of memory for %zu bytes of per-thread scratch",
                         rc.need * sizeof(float));
    return VITC_OK;
}
