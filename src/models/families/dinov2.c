/*
 * dinov2.c — transformers' DINOv2 (model_type "dinov2",
 * "dinov2_with_registers"): layer scale, optional SwiGLU MLP, register
 * tokens (no position embedding), eps 1e-6, the 37x37 position grid
 * resampled on every call (antialiased for the registers model, PR #35411);
 * Dinov2ForImageClassification's head reads [CLS, mean of patch tokens].
 */
#include "../family.h"

static const char *const dinov2_layer[VIT_L_COUNT] = {
    VITC__BLOCK_NAMES("norm1", "attention.attention.%s.weight", "attention.attention.%s.bias",
                      "attention.output.dense", "norm2", "mlp.fc1", "mlp.fc2"),
    [VIT_L_LS1] = "layer_scale1.lambda1",
    [VIT_L_LS2] = "layer_scale2.lambda1",
};

static const vitc__hub_names dinov2_types[] = {
    {.type = "dinov2", .family = "hf-dinov2", .prefix = "dinov2.", .kind = HUB_KIND_DINO,
     .model = vitc__hf_vit_model_names, .layer = dinov2_layer, .layer_fmt = "encoder.layer.%d.",
     .qkv = vitc__qkv_long, .eps = 1e-6f, .patch = 14, .layer_scale = 1, .pos = VIT_POS_HALF_PIXEL},
    {.type = "dinov2_with_registers", .family = "hf-dinov2", .prefix = "dinov2_with_registers.",
     .kind = HUB_KIND_DINO, .model = vitc__hf_vit_model_names, .layer = dinov2_layer,
     .layer_fmt = "encoder.layer.%d.", .qkv = vitc__qkv_long, .eps = 1e-6f, .patch = 14,
     .registers = 4, .layer_scale = 1, .pos = VIT_POS_ANTIALIAS},
};

/* the m->family strings of a saved model (vitc.family) */
static const char *const saved_names[] = {"hf-dinov2", NULL};

/* Dinov2ForImageClassification: classifier [K, 2C] over [CLS, patch mean];
 * _init_weights: normal_(0, initializer_range = 0.02), bias zeros. */
const vitc__family vitc__family_dinov2 = {
    .name = "hf-dinov2",
    VITC__HUB_FAMILY(dinov2_types, saved_names),
    .fresh_head = VIT_HEAD_CLS_MEAN,
    .head_std = 0.02,
};
