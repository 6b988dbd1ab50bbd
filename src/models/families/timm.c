/*
 * timm.c — timm's VisionTransformer (vit_base_patch16_224 ..., DeiT's
 * distilled models, layer-scale models): cls_token, patch_embed.proj,
 * blocks.N. The file alone has timm's default mean/std 0.5; timm's Hub
 * layout (config.json naming the architecture) gives its own through
 * hub.c's vitc__hub_timm_config.
 */
#include <stdio.h>
#include <string.h>

#include "../family.h"

static const char *const timm_model[VIT_P_T2T0] = {
    VITC__MODEL_NAMES("cls_token", "patch_embed.proj", "pos_embed", "dist_token", "reg_token",
                      "norm_pre", "norm", "head", "head_dist"),
    VITC__TIMM_MAP_NAMES,
    VITC__WB(VIT_P_CLF, "classifier"),
};

static const vitc__ckpt_names timm_names = {
    .model = timm_model, .layer = vitc__timm_layer_names, .layer_fmt = "blocks.%d.", .timm = 1};

static int timm_detect(const vitc__src *src) {
    return src->st && (vitc_safetensors_find(src->st, "cls_token") >= 0 ||
                       vitc_safetensors_find(src->st, "patch_embed.proj.weight") >= 0);
}

static vitc_status timm_configure(vitc_vit *m, vitc__src *src) {
    m->naming = VIT_NAMES_TIMM;
    snprintf(m->family, sizeof m->family, "timm");
    return vitc__ckpt_configure(m, src->st, src->arch, &timm_names);
}

static const char *timm_row_name(const vitc_vit *m, const vitc__param *e, char *buf, size_t cap) {
    (void)m;
    if (e->layer < 0)
        snprintf(buf, cap, "%s", e->role < VIT_P_T2T0 ? timm_model[e->role] : "(none)");
    else
        snprintf(buf, cap, "blocks.%d.%s", e->layer, vitc__timm_layer_names[e->role]);
    return buf;
}

/* A fresh head as timm's reset_classifier makes it: a new nn.Linear with
 * torch's default init (weight and bias U(+-1/sqrt(C))). */
const vitc__family vitc__family_timm = {
    .name = "timm",
    .detect = timm_detect,
    .configure = timm_configure,
    .row_name = timm_row_name,
    .new_head = vitc__vit_head_kept,
    .head_std = -1.0,
};
