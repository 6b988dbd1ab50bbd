/*
 * relpos.c — the decomposed relative-position terms of SAM's attention
 * (relpos.h): rel_h[l][a] = q_l . Rh[lh - a + gh - 1], rel_w likewise.
 * O(L (gh + gw) D) per head, tiny next to the attention itself; the
 * attention adds them tile by tile (attention_tmpl.h), so no [L, L] bias
 * is ever built.
 */
#include <math.h>
#include <string.h>

#include "relpos.h"

/* torch's area_pixel_compute_source_index (align_corners=False, linear):
 * output row i reads rows x0 and x1 of the input with weights 1-w, w. */
static void relpos_src(int64_t i, int64_t T, int64_t n, int64_t *x0, int64_t *x1, float *w) {
    float scale = (float)T / (float)n;
    float x = scale * ((float)i + 0.5f) - 0.5f;
    if (x < 0.0f) x = 0.0f;
    *x0 = (int64_t)x;
    if (*x0 > T - 1) *x0 = T - 1;
    *x1 = *x0 + 1 < T ? *x0 + 1 : T - 1;
    *w = x - (float)*x0;
}

static vitc_status relpos_check_resample(const void *a, const void *b, int64_t T, int64_t n,
                                         int64_t D, const char *who) {
    if (T <= 0 || n <= 0 || D <= 0 || !a || !b)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "%s: a table of %lld rows to %lld rows of %lld values, with NULL data or "
                         "a size below 1; pass the position table and sizes of at least 1",
                         who, (long long)T, (long long)n, (long long)D);
    return VITC_OK;
}

vitc_status vitc__nn_relpos_resample(float *out, const float *table, int64_t T, int64_t n,
                                     int64_t D) {
    VITC_TRY(relpos_check_resample(out, table, T, n, D, "relative-position resample"));
    if (T == n) {
        memcpy(out, table, (size_t)(n * D) * sizeof(float));
        return VITC_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t x0, x1;
        float w;
        relpos_src(i, T, n, &x0, &x1, &w);
        const float *a = table + x0 * D, *b = table + x1 * D; /* [D], [D] */
        for (int64_t c = 0; c < D; c++) out[i * D + c] = (1.0f - w) * a[c] + w * b[c];
    }
    return VITC_OK;
}

vitc_status vitc__nn_relpos_resample_backward(float *dtable, const float *dout, int64_t T,
                                              int64_t n, int64_t D) {
    VITC_TRY(relpos_check_resample(dtable, dout, T, n, D, "relative-position resample backward"));
    for (int64_t i = 0; i < n; i++) {
        int64_t x0 = i, x1 = i;
        float w = 0.0f;
        if (T != n) relpos_src(i, T, n, &x0, &x1, &w);
        float *a = dtable + x0 * D, *b = dtable + x1 * D; /* [D], [D] */
        const float *g = dout + i * D;                    /* [D] */
        for (int64_t c = 0; c < D; c++) a[c] += (1.0f - w) * g[c];
        if (w != 0.0f)
            for (int64_t c = 0; c < D; c++) b[c] += w * g[c];
    }
    return VITC_OK;
}

static vitc_status relpos_check(const vitc__nn_relpos *p, const char *who) {
    if (!p) return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL descriptor", who);
    if (p->B < 0 || p->H < 0 || p->gh <= 0 || p->gw <= 0 || p->D <= 0 ||
        p->gh >= ((int64_t)1 << 20) || p->gw >= ((int64_t)1 << 20))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "%s: B %lld, H %lld, grid %lld x %lld, D %lld: the grid and D must be "
                         "positive (and under 2^20)",
                         who, (long long)p->B, (long long)p->H, (long long)p->gh,
                         (long long)p->gw, (long long)p->D);
    if (p->B * p->H > 0 && (!p->q || !p->tab_h || !p->tab_w || !p->rel_h || !p->rel_w))
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL q, tables or rel_h / rel_w", who);
    return VITC_OK;
}

static float relpos_dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t c = 0; c < n; c++) s += a[c] * b[c];
    return s;
}

static void relpos_head(void *ctx, int64_t i, int tid) {
    const vitc__nn_relpos *p = ctx;
    (void)tid;
    const int64_t b = i / p->H, h = i % p->H, gh = p->gh, gw = p->gw, D = p->D;
    const float *q = p->q + b * p->q_sb + h * p->q_sh;            /* [L, D] */
    float *rh = p->rel_h + b * p->rh_sb + h * p->rh_sh;           /* [L, gh] */
    float *rw = p->rel_w + b * p->rw_sb + h * p->rw_sh;           /* [L, gw] */
    for (int64_t l = 0; l < gh * gw; l++) {
        const float *ql = q + l * p->q_sr;
        const int64_t lh = l / gw, lw = l % gw;
        for (int64_t a = 0; a < gh; a++)
            rh[l * p->rh_sr + a] = relpos_dot(ql, p->tab_h + (lh - a + gh - 1) * D, D);
        for (int64_t a = 0; a < gw; a++)
            rw[l * p->rw_sr + a] = relpos_dot(ql, p->tab_w + (lw - a + gw - 1) * D, D);
    }
}

vitc_status vitc__nn_relpos_forward(const vitc__nn_relpos *p) {
    VITC_TRY(relpos_check(p, "relative positions"));
    vitc__parallel_for(p->B * p->H, relpos_head, (void *)p);
    return VITC_OK;
}

void vitc__nn_relpos_view(const vitc__nn_relpos *p, vitc__sdpa_desc *sd) {
    sd->rel_h = p->rel_h, sd->rh_sb = p->rh_sb, sd->rh_sh = p->rh_sh, sd->rh_sr = p->rh_sr;
    sd->rel_w = p->rel_w, sd->rw_sb = p->rw_sb, sd->rw_sh = p->rw_sh, sd->rw_sr = p->rw_sr;
    sd->kh = p->gh, sd->kw = p->gw;
}

typedef struct relpos_bwd {
    const vitc__nn_relpos *p;
    const float *drh, *drw;
    float *dq;
    int64_t dq_sb, dq_sh, dq_sr;
} relpos_bwd;

/* dq_l += sum_a drel_h[l][a] Rh[lh - a + gh - 1] + the same over columns. */
static void relpos_head_dq(void *ctx, int64_t i, int tid) {
    const relpos_bwd *r = ctx;
    const vitc__nn_relpos *p = r->p;
    (void)tid;
    const int64_t b = i / p->H, h = i % p->H, gh = p->gh, gw = p->gw, D = p->D;
    float *dq = r->dq + b * r->dq_sb + h * r->dq_sh; /* [L, D] */
    const float *drh = r->drh ? r->drh + b * p->rh_sb + h * p->rh_sh : NULL; /* [L, gh] */
    const float *drw = r->drw ? r->drw + b * p->rw_sb + h * p->rw_sh : NULL; /* [L, gw] */
    for (int64_t l = 0; l < gh * gw; l++) {
        float *dql = dq + l * r->dq_sr;
        const int64_t lh = l / gw, lw = l % gw;
        for (int64_t a = 0; drh && a < gh; a++) {
            const float g = drh[l * p->rh_sr + a], *t = p->tab_h + (lh - a + gh - 1) * D;
            for (int64_t c = 0; c < D; c++) dql[c] += g * t[c];
        }
        for (int64_t a = 0; drw && a < gw; a++) {
            const float g = drw[l * p->rw_sr + a], *t = p->tab_w + (lw - a + gw - 1) * D;
            for (int64_t c = 0; c < D; c++) dql[c] += g * t[c];
        }
    }
}

vitc_status vitc__nn_relpos_backward(const vitc__nn_relpos *p, const float *drel_h,
                                     const float *drel_w, float *dq, int64_t dq_sb,
                                     int64_t dq_sh, int64_t dq_sr, float *dtab_h, float *dtab_w) {
    VITC_TRY(relpos_check(p, "relative positions backward"));
    const int64_t gh = p->gh, gw = p->gw, D = p->D;
    if (dq) {
        relpos_bwd r = {p, drel_h, drel_w, dq, dq_sb, dq_sh, dq_sr};
        vitc__parallel_for(p->B * p->H, relpos_head_dq, &r);
    }
    /* The tables are shared by every head: one fixed-order sum over the
     * heads (not threaded, so the result never depends on the threads). */
    for (int64_t bh = 0; bh < p->B * p->H; bh++) {
        const int64_t b = bh / p->H, h = bh % p->H;
        const float *q = p->q + b * p->q_sb + h * p->q_sh; /* [L, D] */
        for (int64_t l = 0; l < gh * gw; l++) {
            const float *ql = q + l * p->q_sr;
            const int64_t lh = l / gw, lw = l % gw;
            if (dtab_h && drel_h) {
                const float *g = drel_h + b * p->rh_sb + h * p->rh_sh + l * p->rh_sr; /* [gh] */
                for (int64_t a = 0; a < gh; a++) {
                    float *t = dtab_h + (lh - a + gh - 1) * D;
                    for (int64_t c = 0; c < D; c++) t[c] += g[a] * ql[c];
                }
            }
            if (dtab_w && drel_w) {
                const float *g = drel_w + b * p->rw_sb + h * p->rw_sh + l * p->rw_sr; /* [gw] */
                for (int64_t a = 0; a < gw; a++) {
                    float *t = dtab_w + (lw - a + gw - 1) * D;
                    for (int64_t c = 0; c < D; c++) t[c] += g[a] * ql[c];
                }
            }
        }
    }
    return VITC_OK;
}
