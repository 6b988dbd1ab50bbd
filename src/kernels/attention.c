/* attention.c — the attention core: reference kernel and dispatch. */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"

/* Scores for one row go to a stack-free scratch: rows are at most S long. */
void vitc__sdpa_ref_rows(const vitc__sdpa_desc *d, int64_t b, int64_t h, int64_t l0, int64_t l1) {
    const float *q = d->q + b * d->q_sb + h * d->q_sh;
    const float *k = d->k + b * d->k_sb + h * d->k_sh;
    const float *v = d->v + b * d->v_sb + h * d->v_sh;
    float *o = d->o + b * d->o_sb + h * d->o_sh;
    float *s = d->probs ? d->probs + b * d->p_sb + h * d->p_sh : NULL;
    float *tmp = s ? NULL : malloc((size_t)d->S * sizeof(float));
    for (int64_t l = l0; l < l1; l++) {
        float *row = s ? s + l * d->p_sr : tmp;
        const float *ql = q + l * d->q_sr;
        const float *ml = d->mask ? d->mask + b * d->m_sb + h * d->m_sh + l * d->m_sr : NULL;
        float mx = -INFINITY;
        for (int64_t j = 0; j < d->S; j++) {
            float acc = 0.0f;
            const float *kj = k + j * d->k_sr;
            for (int64_t c = 0; c < d->D; c++) acc += ql[c] * kj[c];
            acc *= d->scale;
            if (ml) acc += ml[j];
            row[j] = acc;
            if (acc > mx) mx = acc;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < d->S; j++) {
            row[j] = expf(row[j] - mx); /* all -inf: NaN, as torch */
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < d->S; j++) row[j] *= inv;
        float *ol = o + l * d->o_sr;
        for (int64_t c = 0; c < d->Dv; c++) ol[c] = 0.0f;
        for (int64_t j = 0; j < d->S; j++) {
            const float *vj = v + j * d->v_sr;
            for (int64_t c = 0; c < d->Dv; c++) ol[c] += row[j] * vj[c];
        }
    }
    free(tmp);
}

static void vitc__sdpa_task(void *ctx, int64_t i, int tid) {
    const vitc__sdpa_desc *d = ctx;
    (void)tid;
    vitc__sdpa_ref_rows(d, i / d->H, i % d->H, 0, d->L);
}

vitc_status vitc__sdpa(const vitc__sdpa_desc *d) {
    vitc__parallel_for(d->B * d->H, vitc__sdpa_task, (void *)d);
    return VITC_OK;
}
