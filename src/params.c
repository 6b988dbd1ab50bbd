/*
 * params.c — layout, binding and initialisation of the parameter table
 * (params.h), the same code for every layer and the ViT.
 */
#include <math.h>
#include <string.h>

#include "carve.h"
#include "params.h"
#include "rng.h"

vitc_status vitc__params_layout(vitc__param *t, int n, size_t *total) {
    vitc__carve c = {0, 1};
    for (int i = 0; i < n; i++) {
        int ok;
        t[i].numel = vitc__numel(t[i].ndim, t[i].shape, &ok);
        t[i].offset = vitc__take(&c, t[i].numel, 1);
        if (!ok || !c.ok)
            return vitc__err(VITC_ERR_NOMEM, "parameter %s: size overflows", t[i].name);
    }
    *total = c.used;
    return VITC_OK;
}

void vitc__params_bind(const vitc__param *t, int n, float *base, void *obj, void *blocks,
                       size_t block_size) {
    for (int i = 0; i < n; i++) {
        char *owner = t[i].layer < 0 ? (char *)obj : (char *)blocks + (size_t)t[i].layer * block_size;
        float *p = base ? base + t[i].offset : NULL;
        memcpy(owner + t[i].slot, &p, sizeof p);
    }
}

/* Box-Muller; 1 - u keeps the log argument in (0, 1]. */
static double params_normal(vitc__rng *s) {
    double u1 = 1.0 - vitc__rng_uniform(s), u2 = vitc__rng_uniform(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void vitc__params_init(const vitc__param *t, int n, float *base, uint64_t seed) {
    vitc__rng s = {seed};
    for (int i = 0; i < n; i++) {
        const vitc__param *p = &t[i];
        float *d = base + p->offset;
        double bound = 0.0;
        if (p->init == VITC__INIT_KAIMING)
            bound = p->fan_in > 0 ? 1.0 / sqrt((double)p->fan_in) : 0.0;
        else if (p->init == VITC__INIT_XAVIER)
            bound = sqrt(6.0 / (double)(p->fan_in + p->fan_out));
        for (size_t j = 0; j < p->numel; j++) {
            switch (p->init) {
            case VITC__INIT_ZERO: d[j] = 0.0f; break;
            case VITC__INIT_ONE: d[j] = 1.0f; break;
            case VITC__INIT_KAIMING:
            case VITC__INIT_XAVIER: d[j] = (float)((2.0 * vitc__rng_uniform(&s) - 1.0) * bound); break;
            case VITC__INIT_NORMAL01: d[j] = (float)(0.1 * params_normal(&s)); break;
            case VITC__INIT_NORMAL: d[j] = (float)(p->init_std * params_normal(&s)); break;
            case VITC__INIT_TRUNC: {
                /* Rejection keeps the normal's shape inside [-2, 2]. */
                double v;
                do v = p->init_std * params_normal(&s);
                while (v < -2.0 || v > 2.0);
                d[j] = (float)v;
                break;
            }
            }
        }
    }
}

const char *vitc__param_shape_str(const vitc__param *p, char *buf, size_t cap) {
    return vitc__shape_str(buf, cap, p->ndim, p->shape);
}
