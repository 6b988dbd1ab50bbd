/*
 * siglip.c — SigLIP's vision tower (model_type "siglip", nested in
 * vision_config, or "siglip_vision_model"): no class token, an
 * attention-pooling (MAP) head giving the embedding. Its grid goes to the
 * new size as ViT's does: transformers 5's SiglipVisionEmbeddings no
 * longer has the +0.1 scale factor of 4.x.
 */
#include "../family.h"

static const char *const siglip_model[VIT_P_T2T0] = {
    VITC__WB(VIT_P_CONV, "%sembeddings.patch_embedding"),
    [VIT_P_POS] = "%sembeddings.position_embedding.weight",
    VITC__WB(VIT_P_LN, "%spost_layernorm"),
    VITC__MAP_NAMES("%shead.probe", "%shead.attention.in_proj_weight",
                    "%shead.attention.in_proj_bias", "%shead.attention.out_proj",
                    "%shead.layernorm", "%shead.mlp.fc1", "%shead.mlp.fc2"),
};

static const vitc__hub_names siglip_types[] = {
    {.type = "siglip", .vision_type = "siglip_vision_model", .family = "hf-siglip",
     .prefix = "vision_model.", .kind = HUB_KIND_SIGLIP, .model = siglip_model,
     .layer = vitc__hf_clip_layer_names, .layer_fmt = "encoder.layers.%d.",
     .qkv = vitc__qkv_short, .eps = 1e-6f, .patch = 16, .pos = VIT_POS_HALF_PIXEL},
};

/* the m->family strings of a saved model (vitc.family) */
static const char *const saved_names[] = {"hf-siglip", NULL};

/* A classifier over the MAP head's embedding ([K, C]); a tower without
 * its head (vision_use_head false) gets one on the class-less features
 * the same way: VIT_HEAD_LINEAR over the embedding; its weight
 * normal_(0, 0.02), bias zeros. */
const vitc__family vitc__family_siglip = {
    .name = "hf-siglip",
    VITC__HUB_FAMILY(siglip_types, saved_names),
    .fresh_head = VIT_HEAD_LINEAR,
    .head_std = 0.02,
};
