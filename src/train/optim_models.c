/*
 * optim_models.c — the public optimizer and clipping front ends over a ViT
 * or a layer: each takes the model's flat parameter set (train.h) and hands
 * it to the core in optim.c.
 */
#include "optim.h"

vitc_status vitc_optimizer_create_vit(vitc_vit *m, const vitc_optim_config *cfg,
                                      vitc_optimizer **out) {
    if (out)
        *out = NULL;
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer: model is NULL");
    vitc__paramset ps;
    VITC_TRY(vitc__vit_paramset(m, 1, &ps));
    return vitc__optimizer_create(&ps, cfg, out);
}

vitc_status vitc_optimizer_create_layer(vitc_layer *l, const vitc_optim_config *cfg,
                                        vitc_optimizer **out) {
    if (out)
        *out = NULL;
    if (!l)
        return vitc__err(VITC_ERR_INVALID_ARG, "optimizer: layer is NULL");
    vitc__paramset ps;
    VITC_TRY(vitc__layer_paramset(l, 1, &ps));
    return vitc__optimizer_create(&ps, cfg, out);
}

vitc_status vitc_clip_grad_norm_vit(vitc_vit *m, float max_norm, float *total_norm) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "clip_grad_norm: model is NULL");
    vitc__paramset ps;
    VITC_TRY(vitc__vit_paramset(m, 0, &ps));
    return vitc__clip_grad_norm(&ps, max_norm, total_norm);
}

vitc_status vitc_clip_grad_norm_layer(vitc_layer *l, float max_norm, float *total_norm) {
    if (!l)
        return vitc__err(VITC_ERR_INVALID_ARG, "clip_grad_norm: layer is NULL");
    vitc__paramset ps;
    VITC_TRY(vitc__layer_paramset(l, 0, &ps));
    return vitc__clip_grad_norm(&ps, max_norm, total_norm);
}
