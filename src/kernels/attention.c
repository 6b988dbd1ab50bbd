/*
 * attention.c — the attention core: the plain reference kernel, the plan
 * (block sizes), per-thread scratch and the dispatch to the tiled kernels
 * (attention_tmpl.h instantiated in attention_{generic,avx2,avx512}.c).
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
        float *pl = d->probs ? d->probs + b * d->p_sb + h * d->p_sh + l * d->p_sr : NULL;
        float *ol = o + l * d->o_sr;
        float mx = -INFINITY;
        for (int64_t j = 0; j < d->S; j++) {
            float acc = 0.0f;
            const float *kj = k + j * d->k_sr;
            for (int64_t c = 0; c < d->D; c++) acc += ql[c] * kj[c];
            acc *= d->scale;
            if (ml) acc += ml[j];
            if (acc > mx) mx = acc;
        }
        for (int64_t c = 0; c < d->Dv; c++) ol[c] = 0.0f;
        if (d->S == 0) { /* softmax over nothing: the output is an empty sum */
            if (d->lse) d->lse[b * d->lse_sb + h * d->lse_sh + l] = -INFINITY;
            continue;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < d->S; j++) {
            float acc = 0.0f;
            const float *kj = k + j * d->k_sr;
            for (int64_t c = 0; c < d->D; c++) acc += ql[c] * kj[c];
            acc *= d->scale;
            if (ml) acc += ml[j];
            float e = expf(acc - mx); /* every score -inf: NaN, as torch */
            sum += e;
            if (pl) pl[j] = e;
            const float *vj = v + j * d->v_sr;
            for (int64_t c = 0; c < d->Dv; c++) ol[c] += e * vj[c];
        }
        float inv = 1.0f / sum;
        for (int64_t c = 0; c < d->Dv; c++) ol[c] *= inv;
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
} vitc__attn_tls;

static _Thread_local vitc__attn_tls *vitc__attn_mine;
static pthread_key_t vitc__attn_key;
static pthread_once_t vitc__attn_once = PTHREAD_ONCE_INIT;
static int vitc__attn_key_ok;

static void vitc__attn_tls_free(void *p) {
    vitc__attn_tls *t = p;
    if (!t) return;
    vitc__free(t->buf);
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
    parts[3] = vitc__attn_r16(3 * Br);
    parts[4] = vitc__attn_r16((size_t)p->kv_cols * (size_t)d->D);
    parts[5] = vitc__attn_r16((size_t)p->kv_cols * (size_t)p->Dvp);
    size_t total = 0;
    for (int i = 0; i < 6; i++)
        if (!vitc__add_size(total, parts[i], &total)) return 0;
    return total;
}

/* This thread's workspace carved for plan p, or NULL when memory ran out. */
static vitc__attn_ws *vitc__attn_ws_get(const vitc__attn_plan *p, size_t need) {
    pthread_once(&vitc__attn_once, vitc__attn_key_init);
    vitc__attn_tls *t = vitc__attn_mine;
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t) return NULL;
        vitc__attn_mine = t;
        if (vitc__attn_key_ok) pthread_setspecific(vitc__attn_key, t);
    }
    if (t->cap < need) {
        size_t bytes;
        if (!vitc__mul_size(need, sizeof(float), &bytes)) return NULL;
        float *nb = vitc__alloc(bytes);
        if (!nb) return NULL;
        vitc__free(t->buf);
        t->buf = nb;
        t->cap = need;
        t->ws.kv_gen = 0; /* the packed K/V went with the old buffer */
    }
    const vitc__sdpa_desc *d = p->d;
    size_t Br = vitc__attn_brp(p);
    float *x = t->buf;
    t->ws.qp = x, x += vitc__attn_r16(Br * (size_t)d->D);
    t->ws.st = x, x += vitc__attn_r16(Br * (size_t)p->Bcp);
    t->ws.ot = x, x += vitc__attn_r16(Br * (size_t)p->Dvp);
    t->ws.mrow = x, t->ws.lrow = x + Br, t->ws.arow = x + 2 * Br, x += vitc__attn_r16(3 * Br);
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
    if (d->Dv <= 16 && !d->mask && !d->probs && d->L < 1024) Br = 64;
    while (Br > 12 && d->B * d->H * ((d->L + Br - 1) / Br) < 8) Br = Br / 2 < 12 ? 12 : Br / 2;
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
} vitc__attn_run;

static void vitc__attn_task(void *ctx, int64_t i, int tid) {
    vitc__attn_run *rc = ctx;
    const vitc__attn_plan *p = rc->plan;
    (void)tid;
    if (__atomic_load_n(&rc->failed, __ATOMIC_RELAXED)) return;
    vitc__attn_ws *ws = vitc__attn_ws_get(p, rc->need);
    if (!ws) {
        __atomic_store_n(&rc->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    int64_t bh = i / p->nqb, qb = i % p->nqb;
    int64_t l0 = qb * p->Br, l1 = l0 + p->Br < p->d->L ? l0 + p->Br : p->d->L;
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

size_t vitc__sdpa_scratch_bytes(const vitc__sdpa_desc *d) {
    if (!d || d->B * d->H * d->L <= 0 || d->S <= 0) return 0;
    vitc__attn_plan plan;
    vitc__attn_plan_make(&plan, d);
    return vitc__attn_need(&plan) * sizeof(float);
}

static int vitc__attn_bad(int64_t n, const void *ptr) { return n > 0 && !ptr; }

vitc_status vitc__sdpa(const vitc__sdpa_desc *d) {
    if (!d) return vitc__err(VITC_ERR_INVALID_ARG, "sdpa: NULL descriptor");
    if (d->B < 0 || d->H < 0 || d->L < 0 || d->S < 0 || d->D < 0 || d->Dv < 0)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "sdpa: negative size (B %lld, H %lld, L %lld, S %lld, D %lld, Dv %lld)",
                         (long long)d->B, (long long)d->H, (long long)d->L, (long long)d->S,
                         (long long)d->D, (long long)d->Dv);
    /* Far beyond any tensor that fits in memory; keeps the plan's int64
     * products (S * D, B * H * L, ...) from overflowing. */
    const int64_t big = (int64_t)1 << 31;
    if (d->B >= big || d->H >= big || d->L >= big || d->S >= big || d->D >= big ||
        d->Dv >= big || d->B * d->H >= big || d->B * d->H * d->L >= ((int64_t)1 << 50))
        return vitc__err(VITC_ERR_INVALID_ARG, "sdpa: sizes too large");
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

    vitc__attn_plan plan;
    vitc__attn_plan_make(&plan, d);
    vitc__attn_run rc = {&plan, vitc__kern()->attn_rows, vitc__attn_need(&plan), 0};
    if (rc.need == 0) return vitc__err(VITC_ERR_NOMEM, "sdpa: scratch size overflows");
    vitc__parallel_for(d->B * d->H * plan.nqb, vitc__attn_task, &rc);
    if (rc.failed)
        return vitc__err(VITC_ERR_NOMEM, "sdpa: out of memory for %zu bytes of per-thread scratch",
                         rc.need * sizeof(float));
    return VITC_OK;
}
