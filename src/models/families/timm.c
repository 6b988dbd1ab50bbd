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
    [VIT_P_CLS] = "cls_token",
    [VIT_P_CONV_W] = "patch_embed.proj.weight",
    [VIT_P_CONV_B] = "patch_embed.proj.bias",
    [VIT_P_POS] = "pos_embed",
    [VIT_P_DIST] = "dist_token",
    [VIT_P_REG] = "reg_token",
    [VIT_P_PRE_W] = "norm_pre.weight",
    [VIT_P_PRE_B] = "norm_pre.bias",
    [VIT_P_LN_W] = "norm.weight",
    [VIT_P_LN_B] = "norm.bias",
    [VIT_P_HEAD_W] = "head.weight",
    [VIT_P_HEAD_B] = "head.bias",
    [VIT_P_HEAD2_W] = "head_dist.weight",
    [VIT_P_HEAD2_B] = "head_dist.bias",
    [VIT_P_MAP_PROBE] = "attn_pool.latent",
    [VIT_P_MAP_QKV_W] = "attn_pool.qkv.weight",
    [VIT_P_MAP_QKV_B] = "attn_pool.qkv.bias",
    [VIT_P_MAP_PROJ_W] = "attn_pool.proj.weight",
    [VIT_P_MAP_PROJ_B] = "attn_pool.proj.bias",
    [VIT_P_MAP_LN_W] = "attn_pool.norm.weight",
    [VIT_P_MAP_LN_B] = "attn_pool.norm.bias",
    [VIT_P_MAP_FC1_W] = "attn_pool.mlp.fc1.weight",
    [VIT_P_MAP_FC1_B] = "attn_pool.mlp.fc1.bias",
    [VIT_P_MAP_FC2_W] = "attn_pool.mlp.fc2.weight",
    [VIT_P_MAP_FC2_B] = "attn_pool.mlp.fc2.bias",
    [VIT_P_CLF_W] = "classifier.weight",
    [VIT_P_CLF_B] = "classifier.bias",
};
static const char *const timm_layer[VIT_L_COUNT] = {
    [VIT_L_LN1_W] = "norm1.weight",     [VIT_L_LN1_B] = "norm1.bias",
    [VIT_L_QKV_W] = "attn.qkv.weight",  [VIT_L_QKV_B] = "attn.qkv.bias",
    [VIT_L_PROJ_W] = "attn.proj.weight", [VIT_L_PROJ_B] = "attn.proj.bias",
    [VIT_L_LN2_W] = "norm2.weight",     [VIT_L_LN2_B] = "norm2.bias",
    [VIT_L_FC1_W] = "mlp.fc1.weight",   [VIT_L_FC1_B] = "mlp.fc1.bias",
    [VIT_L_FC2_W] = "mlp.fc2.weight",   [VIT_L_FC2_B] = "mlp.fc2.bias",
    [VIT_L_LS1] = "ls1.gamma",          [VIT_L_LS2] = "ls2.gamma",
};

static const vitc__ckpt_names timm_names = {
    .cls = "cls_token",
    .conv_w = "patch_embed.proj.weight",
    .pos = "pos_embed",
    .head_w = "head.weight",
    .head_b = "head.bias",
    .dist = "dist_token",
    .layer_fmt = "blocks.%d.",
    .qkv_w = "attn.qkv.weight",
    .fc1_w = "mlp.fc1.weight",
    .ls1 = "ls1.gamma",
    .timm = 1,
};

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
        snprintf(buf, cap, "blocks.%d.%s", e->layer, timm_layer[e->role]);
    return buf;
}

static vitc__vit_head timm_new_head(const vitc_vit *m) {
    return m->head == VIT_HEAD_NONE ? VIT_HEAD_CLS : m->head;
}

/* A fresh head as timm's reset_classifier makes it: a new nn.Linear with
 * torch's default init (weight and bias U(+-1/sqrt(C))). */
const vitc__family vitc__family_timm = {
    .name = "timm",
    .detect = timm_detect,
    .configure = timm_configure,
    .row_name = timm_row_name,
    .new_head = timm_new_head,
    .head_std = -1.0,
};
