/*
 * torchvision.c — torchvision's VisionTransformer (vit_b_16 ...) and every
 * file vitc writes: class_token, conv_proj, encoder.layers.encoder_layer_N
 * (mlp.0 / mlp.3; torchvision < 0.13's mlp.linear_1 / linear_2 read too).
 * Its keys are the table's canonical spelling (model.c); the config comes
 * from file_config.c (shapes, preset, vitc.config).
 */
#include <stdio.h>
#include <string.h>

#include "../family.h"

static const vitc__ckpt_names tv_names = {
    .model = vitc__canonical_model_names, .layer = vitc__canonical_layer_names,
    .layer_fmt = "encoder.layers.encoder_layer_%d.", .timm = 0};
#define TV_V1_FC1 "encoder.layers.encoder_layer_0.mlp.linear_1.weight"

static int tv_detect(const vitc__src *src) {
    return src->st && (vitc_safetensors_find(src->st, "class_token") >= 0 ||
                       vitc_safetensors_find(src->st, "conv_proj.weight") >= 0);
}

static vitc_status tv_configure(vitc_vit *m, vitc__src *src) {
    m->naming = vitc_safetensors_find(src->st, TV_V1_FC1) >= 0 ? VIT_NAMES_TORCHVISION_V1
                                                               : VIT_NAMES_TORCHVISION;
    vitc__ckpt_names n = tv_names;
    if (m->naming == VIT_NAMES_TORCHVISION_V1)
        n.fc1_w = "mlp.linear_1.weight";
    snprintf(m->family, sizeof m->family, "torchvision");
    return vitc__ckpt_configure(m, src->st, src->arch, &n);
}

/* torchvision < 0.13 names its MLP's Linears linear_1 / linear_2. */
static const char *tv_row_name(const vitc_vit *m, const vitc__param *e, char *buf, size_t cap) {
    if (m->naming == VIT_NAMES_TORCHVISION_V1 && e->layer >= 0 && e->role >= VIT_L_FC1_W &&
        e->role <= VIT_L_FC2_B) {
        static const char *const v1[4] = {"mlp.linear_1.weight", "mlp.linear_1.bias",
                                           "mlp.linear_2.weight", "mlp.linear_2.bias"};
        snprintf(buf, cap, "encoder.layers.encoder_layer_%d.%s", e->layer,
                 v1[e->role - VIT_L_FC1_W]);
        return buf;
    }
    return vitc__vit_canonical_name(e, buf, cap);
}

/* heads.head on the class token (a backbone gets one);
 * VisionTransformer.__init__ zeroes heads.head (weight and bias). */
const vitc__family vitc__family_torchvision = {
    .name = "torchvision",
    .detect = tv_detect,
    .configure = tv_configure,
    .row_name = tv_row_name,
    .new_head = vitc__vit_head_kept,
    .head_std = 0.0,
};
