"""Reference numbers for the Vision Transformer, written by PyTorch.

    .venv/bin/python tests/reference/gen_vit.py     (writes tests/reference/vit/)

A tiny torchvision VisionTransformer (image 32, patch 8, hidden 64, 2 blocks,
4 heads, MLP 128, 10 classes) with every parameter random (torchvision zeroes
the head and the class token and starts LayerNorms at 1/0, which would hide
swapped or ignored tensors). Files, all through st_write (independent of
vitc):

  tiny.safetensors       weights, F32, with vitc.config metadata and labels
  tiny_bf16.safetensors  the same weights stored as BF16
  tiny_io.safetensors    input [2,3,32,32], logits; input48 [2,3,48,48] and
                         logits48 (torchvision built at image_size 48 on the
                         state dict passed through interpolate_embeddings);
                         attn [2,2,4,17,17] (per-layer softmax probabilities,
                         from forward hooks), rollout [2,17,17] (float64
                         numpy), logits_bf16 (torch on the BF16-rounded
                         weights); interp_src [1,3,4,4] and interp_7x7,
                         interp_3x3, interp_5x6 (F.interpolate bicubic,
                         align_corners=True)

The helpers are imported by tests/python/test_vit.py.
"""
import json
import os
import sys

import numpy as np
import torch
from torchvision.models.vision_transformer import VisionTransformer, interpolate_embeddings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_write  # noqa: E402

TINY = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
            num_classes=10)


def randomize(model, seed):
    """Every parameter random and O(1)-scaled, so each one matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.dim() == 1:  # LayerNorm scale
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1 or "token" in name or "pos_embedding" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
    return model


def reinit_head(model, seed):
    """torchvision zeroes heads.head: give it random weights (and bias)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = model.heads.head.weight
        w.copy_(torch.randn(w.shape, generator=g) / w.shape[1] ** 0.5)
        model.heads.head.bias.copy_(0.1 * torch.randn(w.shape[0], generator=g))
    return model


def vitc_config(model, labels=None, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
    cfg = dict(image_size=model.image_size, patch_size=model.patch_size, in_channels=3,
               hidden_dim=model.hidden_dim, depth=len(model.encoder.layers),
               num_heads=model.encoder.layers[0].num_heads, mlp_dim=model.mlp_dim,
               num_classes=model.num_classes, norm_eps=1e-6, mean=list(mean), std=list(std))
    if labels is not None:
        cfg["labels"] = labels
    return json.dumps(cfg)


def at_image_size(model, image_size, **kw):
    """torchvision's own route to another resolution: a model built for it,
    loaded with the interpolated state dict."""
    cfg = dict(image_size=image_size, patch_size=model.patch_size,
               num_layers=len(model.encoder.layers), num_heads=model.encoder.layers[0].num_heads,
               hidden_dim=model.hidden_dim, mlp_dim=model.mlp_dim, num_classes=model.num_classes)
    cfg.update(kw)
    m2 = VisionTransformer(**cfg).eval()
    m2.load_state_dict(interpolate_embeddings(image_size, model.patch_size, model.state_dict()))
    return m2


def attention_probs(model, x):
    """[L, B, heads, N, N]: each block's softmax, recomputed by its own
    MultiheadAttention (need_weights=True) on the input a forward hook saw."""
    seen = []
    hooks = [blk.ln_1.register_forward_hook(lambda mod, inp, out: seen.append(out))
             for blk in model.encoder.layers]
    with torch.no_grad():
        model(x)
        probs = [blk.self_attention(h, h, h, need_weights=True, average_attn_weights=False)[1]
                 for blk, h in zip(model.encoder.layers, seen)]
    for h in hooks:
        h.remove()
    return torch.stack(probs).numpy()


def rollout64(attn):
    """Attention rollout (Abnar & Zuidema 2020) in float64: per layer
    A = mean over heads + I, rows renormalised, R = A_L ... A_1."""
    a = attn.astype(np.float64)
    L, B, _, N, _ = a.shape
    eye = np.eye(N)
    R = np.broadcast_to(eye, (B, N, N)).copy()
    for layer in range(L):
        A = a[layer].mean(axis=1) + eye
        A /= A.sum(axis=-1, keepdims=True)
        R = A @ R
    return R


def st_read(path):
    """name -> float32 array of an F32/F16/BF16 safetensors file, read with
    numpy alone (independent of vitc's reader)."""
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        b = data[h["data_offsets"][0]:h["data_offsets"][1]]
        if h["dtype"] == "BF16":
            a = (np.frombuffer(b, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(b, {"F32": "<f4", "F16": "<f2"}[h["dtype"]]).astype(np.float32)
        out[name] = a.reshape(h["shape"])
    return out


def bf16_round(sd):
    return {k: v.to(torch.bfloat16).to(torch.float32) for k, v in sd.items()}


def main():
    out = os.path.join(HERE, "vit")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    model = reinit_head(randomize(VisionTransformer(**TINY), 1), 2).eval()
    sd = model.state_dict()
    labels = ["class %d" % i for i in range(TINY["num_classes"])]
    meta = {"vitc.config": vitc_config(model, labels)}
    st_write.write(os.path.join(out, "tiny.safetensors"), sd, meta)
    st_write.write(os.path.join(out, "tiny_bf16.safetensors"), sd, meta, bf16=set(sd))

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 32, 32, generator=g)
    x48 = torch.randn(2, 3, 48, 48, generator=g)
    with torch.no_grad():
        logits = model(x)
        logits48 = at_image_size(model, 48)(x48)
        mb = VisionTransformer(**TINY).eval()
        mb.load_state_dict(bf16_round(sd))
        logits_bf16 = mb(x)
    attn = attention_probs(model, x)
    io = {"input": x, "logits": logits, "input48": x48, "logits48": logits48,
          "attn": attn, "rollout": rollout64(attn).astype(np.float32), "logits_bf16": logits_bf16}
    # F.interpolate(bicubic, align_corners=True) of a [1, 3, 4, 4] grid, up,
    # down and to a non-square size: the position-embedding resampler alone.
    grid = torch.randn(1, 3, 4, 4, generator=g)
    io["interp_src"] = grid
    for h, w in ((7, 7), (3, 3), (5, 6)):
        io["interp_%dx%d" % (h, w)] = torch.nn.functional.interpolate(
            grid, size=(h, w), mode="bicubic", align_corners=True)
    st_write.write(os.path.join(out, "tiny_io.safetensors"), io)
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print("wrote %s (%d bytes)" % (out, total))


if __name__ == "__main__":
    main()
