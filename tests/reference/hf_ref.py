"""Reference Hugging Face ViT and DeiT forwards, written in torch from the
public definitions (transformers' modeling_vit.py / modeling_deit.py, eval
mode), and writers of Hub model directories in their exact layout:
config.json, model.safetensors or a sharded model.safetensors.index.json,
backbone prefix, preprocessor_config.json.

transformers is not installable here; test_hub.py checks the ViT reference
against torchvision's VisionTransformer at the same weights.
"""
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

import st_write


def vit_config(model_type="vit", arch="ViTForImageClassification", hidden=48, layers=2, heads=3,
               mlp=96, image=32, patch=8, classes=7, eps=1e-12, qkv_bias=True):
    c = {"model_type": model_type, "architectures": [arch], "hidden_size": hidden,
         "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": mlp,
         "hidden_act": "gelu", "layer_norm_eps": eps, "image_size": image, "patch_size": patch,
         "num_channels": 3, "qkv_bias": qkv_bias, "encoder_stride": patch,
         "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
         "torch_dtype": "float32", "transformers_version": "4.46.0"}
    if "ForImageClassification" in arch:
        c["id2label"] = {str(i): "class_%d" % i for i in range(classes)}
        c["label2id"] = {"class_%d" % i: i for i in range(classes)}
    return c


def dinov2_config(registers=None, hidden=48, layers=2, heads=3, mlp_ratio=2.5, image=42, patch=6,
                  eps=1e-6, swiglu=False, classes=0):
    """Dinov2Model / Dinov2WithRegistersModel (the Hub's image_size makes a
    grid other than the inputs': 42/6 = 7x7, resampled on every call)."""
    c = {"model_type": "dinov2" if registers is None else "dinov2_with_registers",
         "architectures": ["Dinov2Model" if registers is None else "Dinov2WithRegistersModel"],
         "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
         "mlp_ratio": mlp_ratio, "hidden_act": "gelu", "layer_norm_eps": eps,
         "image_size": image, "patch_size": patch, "num_channels": 3, "qkv_bias": True,
         "layerscale_value": 1.0, "use_swiglu_ffn": swiglu, "drop_path_rate": 0.0,
         "torch_dtype": "float32"}
    if registers is not None:
        c["num_register_tokens"] = registers
    if classes:  # Dinov2ForImageClassification: a head on [CLS, mean of patch tokens]
        c["architectures"] = [c["architectures"][0].replace("Model", "ForImageClassification")]
        c["id2label"] = {str(i): "class_%d" % i for i in range(classes)}
    return c


def is_dino(cfg):
    return cfg["model_type"].startswith("dinov2")


def _draws(seed):
    """The random_state functions' two draws from one generator: r(*shape,
    std) and lin(o, i), a Linear's (weight, bias) of unit-variance output."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    def lin(o, i):
        return r(o, i, std=1.0 / math.sqrt(i)), r(o, std=0.2)
    return r, lin


def random_state(cfg, seed=0, pooler=False):
    """HF names without the backbone prefix for the backbone, head names
    as the head classes have them. Non-trivial weights: unit-variance
    activations, LayerNorm weights around 1 +- 0.3, biases ~0.2."""
    r, lin = _draws(seed)
    D, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    dino = is_dino(cfg)
    M = int(D * cfg["mlp_ratio"]) if dino else cfg["intermediate_size"]
    R = cfg.get("num_register_tokens", 0)
    P, C = cfg["patch_size"], cfg["num_channels"]
    n = (cfg["image_size"] // P) ** 2
    deit = cfg["model_type"] == "deit"
    arch = cfg["architectures"][0]

    sd = {"embeddings.cls_token": r(1, 1, D, std=0.5),
          "embeddings.position_embeddings": r(1, n + 1 + deit, D, std=0.5)}
    if deit:
        sd["embeddings.distillation_token"] = r(1, 1, D, std=0.5)
    if dino:
        sd["embeddings.mask_token"] = r(1, D)
    if R:
        sd["embeddings.register_tokens"] = r(1, R, D, std=0.5)
    sd["embeddings.patch_embeddings.projection.weight"] = r(D, C, P, P, std=1.0 / math.sqrt(C * P * P))
    sd["embeddings.patch_embeddings.projection.bias"] = r(D, std=0.2)
    for i in range(L):
        p = "encoder.layer.%d." % i
        for ln in (("norm1", "norm2") if dino else ("layernorm_before", "layernorm_after")):
            sd[p + ln + ".weight"] = 1 + r(D, std=0.3)
            sd[p + ln + ".bias"] = r(D, std=0.2)
        for q in ("query", "key", "value"):
            w, b = lin(D, D)
            sd[p + "attention.attention.%s.weight" % q] = w * 2.0  # sharper attention
            if cfg.get("qkv_bias", True):
                sd[p + "attention.attention.%s.bias" % q] = b
        sd[p + "attention.output.dense.weight"], sd[p + "attention.output.dense.bias"] = lin(D, D)
        fc1, fc2 = ("mlp.fc1", "mlp.fc2") if dino else ("intermediate.dense", "output.dense")
        if cfg.get("use_swiglu_ffn"):  # Dinov2SwiGLUFFN
            hid = (int(M * 2 / 3) + 7) // 8 * 8
            sd[p + "mlp.weights_in.weight"], sd[p + "mlp.weights_in.bias"] = lin(2 * hid, D)
            sd[p + "mlp.weights_out.weight"], sd[p + "mlp.weights_out.bias"] = lin(D, hid)
        else:
            sd[p + fc1 + ".weight"], sd[p + fc1 + ".bias"] = lin(M, D)
            sd[p + fc2 + ".weight"], sd[p + fc2 + ".bias"] = lin(D, M)
        if dino:
            sd[p + "layer_scale1.lambda1"] = 1 + r(D, std=0.5)
            sd[p + "layer_scale2.lambda1"] = 1 + r(D, std=0.5)
    sd["layernorm.weight"] = 1 + r(D, std=0.3)
    sd["layernorm.bias"] = r(D, std=0.2)
    if pooler:
        sd["pooler.dense.weight"], sd["pooler.dense.bias"] = lin(D, D)
    K = len(cfg.get("id2label", {})) or 2
    if "WithTeacher" in arch:
        sd["cls_classifier.weight"], sd["cls_classifier.bias"] = lin(K, D)
        sd["distillation_classifier.weight"], sd["distillation_classifier.bias"] = lin(K, D)
    elif "ForImageClassification" in arch:
        sd["classifier.weight"], sd["classifier.bias"] = lin(K, 2 * D if dino else D)
    return sd


def interpolate_pos(pos, n_prefix, h0, w0, antialias=False):
    """ViTEmbeddings.interpolate_pos_encoding, transformers >= 4.45 (and
    Dinov2's; antialias for Dinov2WithRegisters)."""
    num_patches, num_positions = h0 * w0, pos.shape[1] - n_prefix
    if num_patches == num_positions and h0 == w0:
        return pos
    D = pos.shape[-1]
    M = int(math.sqrt(num_positions))
    patch = pos[:, n_prefix:].reshape(1, M, M, D).permute(0, 3, 1, 2)
    patch = F.interpolate(patch.float(), size=(h0, w0), mode="bicubic", align_corners=False,
                          antialias=antialias)
    patch = patch.permute(0, 2, 3, 1).reshape(1, -1, D)
    return torch.cat([pos[:, :n_prefix], patch], dim=1)


@torch.no_grad()
def forward(sd, cfg, px):
    """(logits or None, last_hidden_state) of ViT*/DeiT* for px [B, 3, H, W];
    sd as random_state gives it (no prefix)."""
    D, Hh = cfg["hidden_size"], cfg["num_attention_heads"]
    eps, P = cfg["layer_norm_eps"], cfg["patch_size"]
    deit = cfg["model_type"] == "deit"
    B, _, H, W = px.shape
    x = F.conv2d(px, sd["embeddings.patch_embeddings.projection.weight"],
                 sd["embeddings.patch_embeddings.projection.bias"], stride=P)
    x = x.flatten(2).transpose(1, 2)
    toks = [sd["embeddings.cls_token"].expand(B, -1, -1)]
    if deit:
        toks.append(sd["embeddings.distillation_token"].expand(B, -1, -1))
    x = torch.cat(toks + [x], dim=1)
    x = x + interpolate_pos(sd["embeddings.position_embeddings"], len(toks), H // P, W // P,
                            antialias=cfg["model_type"] == "dinov2_with_registers")
    if "embeddings.register_tokens" in sd:  # after the positions, right after CLS
        R = sd["embeddings.register_tokens"]
        x = torch.cat([x[:, :1], R.expand(B, -1, -1), x[:, 1:]], dim=1)
    dino = is_dino(cfg)
    n1, n2 = ("norm1", "norm2") if dino else ("layernorm_before", "layernorm_after")
    fc1, fc2 = ("mlp.fc1", "mlp.fc2") if dino else ("intermediate.dense", "output.dense")
    hd = D // Hh
    for i in range(cfg["num_hidden_layers"]):
        p = "encoder.layer.%d." % i
        ls1 = sd.get(p + "layer_scale1.lambda1", 1.0)
        ls2 = sd.get(p + "layer_scale2.lambda1", 1.0)
        h = F.layer_norm(x, (D,), sd[p + n1 + ".weight"], sd[p + n1 + ".bias"], eps)

        def proj(name):
            y = F.linear(h, sd[p + "attention.attention.%s.weight" % name],
                         sd.get(p + "attention.attention.%s.bias" % name))
            return y.view(B, -1, Hh, hd).transpose(1, 2)

        q, k, v = proj("query"), proj("key"), proj("value")
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(B, -1, D)
        x = x + ls1 * F.linear(ctx, sd[p + "attention.output.dense.weight"],
                               sd[p + "attention.output.dense.bias"])
        h = F.layer_norm(x, (D,), sd[p + n2 + ".weight"], sd[p + n2 + ".bias"], eps)
        if cfg.get("use_swiglu_ffn"):
            a, b = F.linear(h, sd[p + "mlp.weights_in.weight"], sd[p + "mlp.weights_in.bias"]).chunk(2, dim=-1)
            x = x + ls2 * F.linear(F.silu(a) * b, sd[p + "mlp.weights_out.weight"],
                                   sd[p + "mlp.weights_out.bias"])
            continue
        h = F.gelu(F.linear(h, sd[p + fc1 + ".weight"], sd[p + fc1 + ".bias"]))
        x = x + ls2 * F.linear(h, sd[p + fc2 + ".weight"], sd[p + fc2 + ".bias"])
    h = F.layer_norm(x, (D,), sd["layernorm.weight"], sd["layernorm.bias"], eps)
    logits = None
    if "cls_classifier.weight" in sd:
        logits = (F.linear(h[:, 0], sd["cls_classifier.weight"], sd["cls_classifier.bias"]) +
                  F.linear(h[:, 1], sd["distillation_classifier.weight"],
                           sd["distillation_classifier.bias"])) / 2
    elif "classifier.weight" in sd and dino:
        R = cfg.get("num_register_tokens", 0)
        pooled = torch.cat([h[:, 0], h[:, 1 + R:].mean(dim=1)], dim=1)
        logits = F.linear(pooled, sd["classifier.weight"], sd["classifier.bias"])
    elif "classifier.weight" in sd:
        logits = F.linear(h[:, 0], sd["classifier.weight"], sd["classifier.bias"])
    return logits, h


def round_bf16(sd):
    """The values a BF16 file holds (round to nearest even), as float32."""
    out = {}
    for k, v in sd.items():
        u = v.numpy().astype(np.float32).view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        out[k] = torch.from_numpy(u.astype(np.uint32).view(np.float32))
    return out


def round_f16(sd):
    return {k: v.half().float() for k, v in sd.items()}


def round_as(sd, dtype):
    """The values a file of dtype ("F32", "F16", "BF16") holds, as float32."""
    return {"F32": dict, "F16": round_f16, "BF16": round_bf16}[dtype](sd)


def hub_names(sd, cfg, prefix=True):
    """The saved names: a head model's backbone under its base_model_prefix."""
    pre = {"deit": "deit.", "vit": "vit."}.get(cfg["model_type"], cfg["model_type"] + ".")
    pre = pre if prefix else ""
    heads = ("classifier.", "cls_classifier.", "distillation_classifier.")
    return {(k if k.startswith(heads) else pre + k): v for k, v in sd.items()}


def save_hub(d, sd, cfg, prefix=True, dtype="F32", shards=1, extra=None, preprocessor=None):
    """Write a Hub directory: config.json, weights (F32/F16/BF16, 1 file or
    `shards` files with an index), extra tensors (e.g. int64 position_ids)."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if preprocessor is not None:
        with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
            json.dump(preprocessor, f, indent=2)
    named = hub_names(sd, cfg, prefix)
    t = {k: (v.half().numpy() if dtype == "F16" else v.numpy()) for k, v in named.items()}
    if extra:
        t.update(extra)
    bf16 = set(named) if dtype == "BF16" else ()
    if shards == 1:
        st_write.write(os.path.join(d, "model.safetensors"), t, {"format": "pt"}, bf16=bf16)
        return
    names = sorted(t)
    wmap = {}
    for s in range(shards):
        fn = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = {k: t[k] for k in names[s::shards]}
        st_write.write(os.path.join(d, fn), part, {"format": "pt"},
                       bf16=[k for k in part if k in bf16])
        wmap.update({k: fn for k in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f, indent=2)


# ---- CLIP vision tower ------------------------------------------------------

# The tiny text tower a CLIPModel / SiglipModel file holds beside the vision
# tower (vitc reads it whole: every tensor of it is there).
_TEXT_CONFIG = {"hidden_size": 8, "vocab_size": 5, "num_hidden_layers": 1,
                "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 7}


def _text_state(sd, r, lin):
    """text_model.* of _TEXT_CONFIG (CLIP and SigLIP name them alike)."""
    t = "text_model."
    sd[t + "embeddings.token_embedding.weight"] = r(5, 8)
    sd[t + "embeddings.position_embedding.weight"] = r(7, 8, std=0.5)
    p = t + "encoder.layers.0."
    for ln in ("layer_norm1", "layer_norm2"):
        sd[p + ln + ".weight"], sd[p + ln + ".bias"] = 1 + r(8, std=0.3), r(8, std=0.2)
    for q in ("q", "k", "v", "out"):
        sd[p + "self_attn.%s_proj.weight" % q], sd[p + "self_attn.%s_proj.bias" % q] = lin(8, 8)
    sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"] = lin(16, 8)
    sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"] = lin(8, 16)
    sd[t + "final_layer_norm.weight"] = 1 + r(8, std=0.3)
    sd[t + "final_layer_norm.bias"] = r(8, std=0.2)

def clip_config(model_type="clip", hidden=48, layers=2, heads=3, mlp=96, image=32, patch=8,
                proj=16, act="quick_gelu", eps=1e-5):
    """CLIPModel (vision_config nested, a text tower beside it) or a
    CLIPVisionModel[WithProjection] (flat)."""
    v = {"model_type": "clip_vision_model", "hidden_size": hidden, "num_hidden_layers": layers,
         "num_attention_heads": heads, "intermediate_size": mlp, "hidden_act": act,
         "layer_norm_eps": eps, "image_size": image, "patch_size": patch, "num_channels": 3,
         "projection_dim": proj}
    if model_type == "clip":
        return {"model_type": "clip", "architectures": ["CLIPModel"], "projection_dim": proj,
                "logit_scale_init_value": 2.6592,
                "text_config": dict(_TEXT_CONFIG, model_type="clip_text_model"),
                "vision_config": v}
    v["architectures"] = ["CLIPVisionModelWithProjection" if proj else "CLIPVisionModel"]
    return v


def clip_vision_cfg(cfg):
    return cfg.get("vision_config", cfg)


def clip_random_state(cfg, seed=0, text=True, position_ids=True):
    """The Hub's names (vision_model., visual_projection, text_model.*, ...);
    int64 tensors as numpy in the second dict."""
    r, lin = _draws(seed)
    v = clip_vision_cfg(cfg)
    D, L, M, P = v["hidden_size"], v["num_hidden_layers"], v["intermediate_size"], v["patch_size"]
    n = (v["image_size"] // P) ** 2 + 1

    e = "vision_model.embeddings."
    sd = {e + "class_embedding": r(D, std=0.5),
          e + "patch_embedding.weight": r(D, 3, P, P, std=1.0 / math.sqrt(3 * P * P)),
          e + "position_embedding.weight": r(n, D, std=0.5),
          "vision_model.pre_layrnorm.weight": 1 + r(D, std=0.3),
          "vision_model.pre_layrnorm.bias": r(D, std=0.2),
          "vision_model.post_layernorm.weight": 1 + r(D, std=0.3),
          "vision_model.post_layernorm.bias": r(D, std=0.2)}
    _clip_layers_state(sd, r, lin, L, D, M)
    proj = cfg.get("projection_dim", v.get("projection_dim"))
    if cfg.get("model_type") == "clip" or "WithProjection" in cfg.get("architectures", [""])[0]:
        sd["visual_projection.weight"] = r(proj, D, std=1.0 / math.sqrt(D))
    ints = {}
    if position_ids:
        ints[e + "position_ids"] = np.arange(n, dtype=np.int64)[None]
    if text and cfg.get("model_type") == "clip":
        _text_state(sd, r, lin)
        sd["text_projection.weight"] = r(proj, 8)
        sd["logit_scale"] = torch.tensor(2.6592)
        ints["text_model.embeddings.position_ids"] = np.arange(7, dtype=np.int64)[None]
    return sd, ints


def _clip_layers_state(sd, r, lin, L, D, M):
    """The encoder layers CLIP and SigLIP name alike (vision_model.encoder.
    layers.N.*), drawn into sd in one order for both."""
    for i in range(L):
        p = "vision_model.encoder.layers.%d." % i
        for ln in ("layer_norm1", "layer_norm2"):
            sd[p + ln + ".weight"] = 1 + r(D, std=0.3)
            sd[p + ln + ".bias"] = r(D, std=0.2)
        for q in ("q", "k", "v", "out"):
            w, b = lin(D, D)
            sd[p + "self_attn.%s_proj.weight" % q] = w * (2.0 if q != "out" else 1.0)
            sd[p + "self_attn.%s_proj.bias" % q] = b
        sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"] = lin(M, D)
        sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"] = lin(D, M)


ACTS = {"quick_gelu": lambda t: t * torch.sigmoid(1.702 * t), "gelu": F.gelu,
        "gelu_pytorch_tanh": lambda t: F.gelu(t, approximate="tanh")}


def _clip_encoder(sd, v, x, scale_q_first):
    """The encoder layers of CLIP and SigLIP (pre-norm, one name scheme) on x
    [B, n, D]. They differ only in where the 1/sqrt(hd) scale goes:
    CLIPAttention multiplies q, SigLIP the scores (float32 rounds them
    differently, so the reference keeps each one's order)."""
    D, Hh, eps = v["hidden_size"], v["num_attention_heads"], v["layer_norm_eps"]
    act = ACTS[v["hidden_act"]]
    B = x.shape[0]
    hd = D // Hh
    for i in range(v["num_hidden_layers"]):
        p = "vision_model.encoder.layers.%d." % i
        h = F.layer_norm(x, (D,), sd[p + "layer_norm1.weight"], sd[p + "layer_norm1.bias"], eps)

        def proj(n):
            y = F.linear(h, sd[p + "self_attn.%s_proj.weight" % n], sd[p + "self_attn.%s_proj.bias" % n])
            return y.view(B, -1, Hh, hd).transpose(1, 2)

        q, k, vv = proj("q"), proj("k"), proj("v")
        if scale_q_first:
            probs = torch.softmax((q * hd ** -0.5) @ k.transpose(-1, -2), dim=-1)
        else:
            probs = torch.softmax(q @ k.transpose(-1, -2) * hd ** -0.5, dim=-1)
        ctx = (probs @ vv).transpose(1, 2).reshape(B, -1, D)
        x = x + F.linear(ctx, sd[p + "self_attn.out_proj.weight"], sd[p + "self_attn.out_proj.bias"])
        h = F.layer_norm(x, (D,), sd[p + "layer_norm2.weight"], sd[p + "layer_norm2.bias"], eps)
        x = x + F.linear(act(F.linear(h, sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"])),
                         sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"])
    return x


@torch.no_grad()
def clip_forward(sd, cfg, px):
    """CLIPVisionTransformer (+ visual_projection): (last_hidden_state,
    pooler_output, image_embeds or None)."""
    v = clip_vision_cfg(cfg)
    D, P, eps = v["hidden_size"], v["patch_size"], v["layer_norm_eps"]
    B, _, H, W = px.shape
    e = "vision_model.embeddings."
    x = F.conv2d(px, sd[e + "patch_embedding.weight"], None, stride=P).flatten(2).transpose(1, 2)
    x = torch.cat([sd[e + "class_embedding"].expand(B, 1, -1), x], dim=1)
    x = x + interpolate_pos(sd[e + "position_embedding.weight"][None], 1, H // P, W // P)
    x = F.layer_norm(x, (D,), sd["vision_model.pre_layrnorm.weight"],
                     sd["vision_model.pre_layrnorm.bias"], eps)
    x = _clip_encoder(sd, v, x, scale_q_first=True)  # CLIPAttention scales q first
    pooled = F.layer_norm(x[:, 0], (D,), sd["vision_model.post_layernorm.weight"],
                          sd["vision_model.post_layernorm.bias"], eps)
    emb = F.linear(pooled, sd["visual_projection.weight"]) if "visual_projection.weight" in sd else None
    return x, pooled, emb


def save_clip(d, sd, ints, cfg, dtype="F32", shards=1, prefix=True):
    """A CLIP Hub directory; prefix=False drops "vision_model." (a tower
    saved by hand), to check that both spellings load."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    t = {}
    for k, v in sd.items():
        k2 = k if prefix else k.replace("vision_model.", "", 1)
        t[k2] = v.half().numpy() if dtype == "F16" else v.numpy()
    t.update(ints)
    bf16 = [k for k in t if dtype == "BF16" and t[k].dtype == np.float32]
    st_write.write(os.path.join(d, "model.safetensors"), t, {"format": "pt"}, bf16=bf16)


# ---- SigLIP vision tower ----------------------------------------------------

def siglip_config(model_type="siglip", hidden=48, layers=2, heads=3, mlp=96, image=32, patch=8,
                  act="gelu_pytorch_tanh", eps=1e-6, use_head=None):
    v = {"model_type": "siglip_vision_model", "hidden_size": hidden,
         "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": mlp,
         "hidden_act": act, "layer_norm_eps": eps, "image_size": image, "patch_size": patch,
         "num_channels": 3}
    if use_head is not None:
        v["vision_use_head"] = use_head
    if model_type == "siglip":
        return {"model_type": "siglip", "architectures": ["SiglipModel"],
                "text_config": dict(_TEXT_CONFIG, model_type="siglip_text_model"),
                "vision_config": v}
    v["architectures"] = ["SiglipVisionModel"]
    return v


def siglip_random_state(cfg, seed=0, text=True):
    r, lin = _draws(seed)
    v = clip_vision_cfg(cfg)
    D, L, M, P = v["hidden_size"], v["num_hidden_layers"], v["intermediate_size"], v["patch_size"]
    n = (v["image_size"] // P) ** 2

    e = "vision_model.embeddings."
    sd = {e + "patch_embedding.weight": r(D, 3, P, P, std=1.0 / math.sqrt(3 * P * P)),
          e + "patch_embedding.bias": r(D, std=0.2),
          e + "position_embedding.weight": r(n, D, std=0.5),
          "vision_model.post_layernorm.weight": 1 + r(D, std=0.3),
          "vision_model.post_layernorm.bias": r(D, std=0.2)}
    _clip_layers_state(sd, r, lin, L, D, M)
    if v.get("vision_use_head", True):
        h = "vision_model.head."
        sd[h + "probe"] = r(1, 1, D)
        w = r(3 * D, D, std=2.0 / math.sqrt(D))
        sd[h + "attention.in_proj_weight"], sd[h + "attention.in_proj_bias"] = w, r(3 * D, std=0.2)
        sd[h + "attention.out_proj.weight"], sd[h + "attention.out_proj.bias"] = lin(D, D)
        sd[h + "layernorm.weight"] = 1 + r(D, std=0.3)
        sd[h + "layernorm.bias"] = r(D, std=0.2)
        sd[h + "mlp.fc1.weight"], sd[h + "mlp.fc1.bias"] = lin(M, D)
        sd[h + "mlp.fc2.weight"], sd[h + "mlp.fc2.bias"] = lin(D, M)
    ints = {}
    if text and cfg.get("model_type") == "siglip":
        _text_state(sd, r, lin)
        sd["text_model.head.weight"], sd["text_model.head.bias"] = lin(8, 8)
        sd["logit_scale"] = torch.tensor([2.3])
        sd["logit_bias"] = torch.tensor([-10.0])
        ints["text_model.embeddings.position_ids"] = np.arange(7, dtype=np.int64)[None]
    return sd, ints


def interpolate_pos_siglip(pos, h0, w0):
    """SiglipVisionEmbeddings.interpolate_pos_encoding of transformers 5
    (no class token): bicubic to the new size, as ViT's."""
    return interpolate_pos(pos, 0, h0, w0)


def interpolate_pos_legacy(pos, h0, w0):
    """The +0.1 scale factor SigLIP's resampling had in transformers 4.x
    (the output size is still h0 x w0); kept to show the two differ."""
    n, D = pos.shape[1], pos.shape[-1]
    if h0 * w0 == n and h0 == w0:
        return pos
    M = int(math.sqrt(n))
    patch = pos.reshape(1, M, M, D).permute(0, 3, 1, 2)
    patch = F.interpolate(patch, scale_factor=((h0 + 0.1) / M, (w0 + 0.1) / M), mode="bicubic",
                          align_corners=False)
    assert patch.shape[-2:] == (h0, w0)
    return patch.permute(0, 2, 3, 1).reshape(1, -1, D)


@torch.no_grad()
def siglip_forward(sd, cfg, px):
    """SiglipVisionTransformer: (last_hidden_state, pooler_output or None)."""
    v = clip_vision_cfg(cfg)
    D, Hh, P, eps = v["hidden_size"], v["num_attention_heads"], v["patch_size"], v["layer_norm_eps"]
    act = ACTS[v["hidden_act"]]
    B, _, H, W = px.shape
    e = "vision_model.embeddings."
    x = F.conv2d(px, sd[e + "patch_embedding.weight"], sd[e + "patch_embedding.bias"], stride=P)
    x = x.flatten(2).transpose(1, 2)
    x = x + interpolate_pos_siglip(sd[e + "position_embedding.weight"][None], H // P, W // P)
    x = _clip_encoder(sd, v, x, scale_q_first=False)  # SiglipAttention scales q @ k
    x = F.layer_norm(x, (D,), sd["vision_model.post_layernorm.weight"],
                     sd["vision_model.post_layernorm.bias"], eps)
    if "vision_model.head.probe" in sd:  # SiglipMultiheadAttentionPoolingHead
        h = "vision_model.head."
        mha = torch.nn.MultiheadAttention(D, Hh, batch_first=True).eval()
        mha.load_state_dict({"in_proj_weight": sd[h + "attention.in_proj_weight"],
                             "in_proj_bias": sd[h + "attention.in_proj_bias"],
                             "out_proj.weight": sd[h + "attention.out_proj.weight"],
                             "out_proj.bias": sd[h + "attention.out_proj.bias"]})
        a = mha(sd[h + "probe"].expand(B, -1, -1), x, x, need_weights=False)[0]
        y = F.layer_norm(a, (D,), sd[h + "layernorm.weight"], sd[h + "layernorm.bias"], eps)
        y = F.linear(act(F.linear(y, sd[h + "mlp.fc1.weight"], sd[h + "mlp.fc1.bias"])),
                     sd[h + "mlp.fc2.weight"], sd[h + "mlp.fc2.bias"])
        return x, (a + y)[:, 0]
    return x, None


# ---- image processors (slow PIL path) -----------------------------------------

# Class defaults as transformers 5 has them: (size, resample, crop or None,
# mean/std, default_to_square: whether an int size is a square, not the
# shortest edge; SigLIP's is false). A crop happens where do_center_crop
# says so, the class default being whether it has a crop_size.
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
PROCESSOR_DEFAULTS = {
    "vit": ({"height": 224, "width": 224}, 2, None, [0.5] * 3, [0.5] * 3, True),
    "deit": ({"height": 256, "width": 256}, 3, {"height": 224, "width": 224}, [0.5] * 3,
             [0.5] * 3, True),
    "dinov2": ({"shortest_edge": 224}, 3, {"height": 224, "width": 224}, CLIP_MEAN, CLIP_STD,
               False),
    "clip": ({"shortest_edge": 224}, 3, {"height": 224, "width": 224}, CLIP_MEAN, CLIP_STD, False),
    "siglip": ({"height": 224, "width": 224}, 3, None, [0.5] * 3, [0.5] * 3, False),
}


def process(rgb, family, pp):
    """ViTImageProcessor / DeiTImageProcessor / BitImageProcessor /
    CLIPImageProcessor / SiglipImageProcessor (slow) on a uint8 [H, W, 3]:
    PIL resize, floor center crop, float64 rescale then float32, normalize."""
    from PIL import Image
    size, resample, crop, mean, std, int_square = PROCESSOR_DEFAULTS[family]
    size = pp.get("size", size)
    if isinstance(size, int):
        size = {"height": size, "width": size} if int_square else {"shortest_edge": size}
    crop_size = pp.get("crop_size", crop)
    if isinstance(crop_size, int):
        crop_size = {"height": crop_size, "width": crop_size}
    H, W = rgb.shape[:2]
    arr = rgb
    if pp.get("do_resize", True):
        if "shortest_edge" in size:
            s = size["shortest_edge"]
            h, w = (int(s * H / W), s) if W <= H else (s, int(s * W / H))
        else:
            h, w = size["height"], size["width"]
        arr = np.array(Image.fromarray(rgb).resize((w, h), resample=pp.get("resample", resample)))
    if pp.get("do_center_crop", crop is not None):
        h, w = arr.shape[:2]
        t, l = (h - crop_size["height"]) // 2, (w - crop_size["width"]) // 2
        arr = arr[t:t + crop_size["height"], l:l + crop_size["width"]]
    x = arr.astype(np.float64)
    if pp.get("do_rescale", True):
        x = x * pp.get("rescale_factor", 1 / 255)
    x = x.astype(np.float32)
    if pp.get("do_normalize", True):
        x = (x - np.array(pp.get("image_mean", mean), np.float32)) / np.array(
            pp.get("image_std", std), np.float32)
    return x.transpose(2, 0, 1)
