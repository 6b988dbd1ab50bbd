/*
 * optim_models.c — the public optimizer and clipping front ends over a ViT
 * or a layer: each takes the model's flat parameter set (train.h) and hands
 * it to the core in optim.c.
 */
#include "optim.h"

/* The flat parameter set of a ViT (m) or a layer (l, when m is NULL and
 * is_vit is 0); what names the caller in the error for a NULL model. */
static vitc_status paramset_of(vitc_vit *m, vitc_layer *l, int is_vit, int for_optimizer,
                               const char *what, vitc__paramset *ps) {
    if (is_vit ? !m : !l)
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: %s is NULL", what, is_vit ? "model" : "layer");
    return is_vit ? vitc__vit_paramset(m, for_optimizer, ps)
                  : vitc__layer_paramset(l, for_optimizer, ps);
}

static vitc_status optimizer_create(vitc_vit *m, vitc_layer *l, int is_vit,
                                    const vitc_optim_config *cfg, vitc_optimizer **out) {
    if (out)
        *out = NULL;
    vitc__paramset ps;
    VITC_TRY(paramset_of(m, l, is_vit, 1, "optimizer", &ps));
    return vitc__optimizer_create(&ps, cfg, out);
}

static vitc_status clip_grad_norm(vitc_vit *m, vitc_layer *l, int is_vit, float max_norm,
                                  float *total_norm) {
    vitc__paramset ps;
    VITC_TRY(paramset_of(m, l, is_vit, 0, "clip_grad_norm", &ps));
    return vitc__clip_grad_norm(&ps, max_norm, total_norm);
}

vitc_status vitc_optimizer_create_vit(vitc_vit *m, const vitc_optim_config *cfg,
                                      vitc_optimizer **out) {
    return optimizer_create(m, NULL, 1, cfg, out);
}

vitc_status vitc_optimizer_create_layer(vitc_layer *l, const vitc_optim_config *cfg,
                                        vitc_optimizer **out) {
    return optimizer_create(NULL, l, 0, cfg, out);
}

vitc_status vitc_clip_grad_norm_vit(vitc_vit *m, float max_norm, float *total_norm) {
    return clip_grad_norm(m, NULL, 1, max_norm, total_norm);
}

vitc_status vitc_clip_grad_norm_layer(vitc_layer *l, float max_norm, float *total_norm) {
    return clip_grad_norm(NULL, l, 0, max_norm, total_norm);
}
