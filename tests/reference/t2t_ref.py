"""T2T-ViT (yitu-opensource/T2T-ViT, models/t2t_vit.py, token_transformer.py,
token_performer.py, transformer_block.py) re-implemented in PyTorch from
its definitions, as a function of a state dict in the original's names, for
the tests of vitc's T2T-ViT (tests/python/test_t2t.py).

    cfg = t2t_config("performer", img_size=64, embed_dim=48, ...)
    sd = random_state(cfg, seed)           # the original's state_dict names
    logits, feats = forward(sd, cfg, x)    # feats: norm(x)[:, 0]

Eval mode: dropouts and drop path are identities.
"""
import json
import math

import numpy as np
import torch
import torch.nn.functional as F

# T2T_ViT.__init__'s defaults
DEFAULTS = {"arch": "t2t_vit", "tokens_type": "performer", "img_size": 224, "in_chans": 3,
            "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4.0, "qkv_bias": False,
            "qk_scale": None, "token_dim": 64, "num_classes": 1000}

# The registry (@register_model): tokens_type, embed_dim, depth, num_heads,
# mlp_ratio, and the qk_scale dim its pretrained weights use.
PRESETS = {
    "t2t_vit_7": ("performer", 256, 7, 4, 2.0, 256), "t2t_vit_10": ("performer", 256, 10, 4, 2.0, 256),
    "t2t_vit_12": ("performer", 256, 12, 4, 2.0, 256), "t2t_vit_14": ("performer", 384, 14, 6, 3.0, 384),
    "t2t_vit_19": ("performer", 448, 19, 7, 3.0, 448), "t2t_vit_24": ("performer", 512, 24, 8, 3.0, 512),
    "t2t_vit_t_14": ("transformer", 384, 14, 6, 3.0, 384),
    "t2t_vit_t_19": ("transformer", 448, 19, 7, 3.0, 448),
    "t2t_vit_t_24": ("transformer", 512, 24, 8, 3.0, 512),
}


def t2t_config(tokens_type="performer", **kw):
    c = dict(DEFAULTS)
    c["tokens_type"] = tokens_type
    c.update(kw)
    return c


def preset_config(name, **kw):
    tt, e, d, h, r, s = PRESETS[name]
    return t2t_config(tt, embed_dim=e, depth=d, num_heads=h, mlp_ratio=r, qk_scale=s ** -0.5, **kw)


def sinusoid(n_position, d_hid):
    """get_sinusoid_encoding: [1, n_position, d_hid]."""
    t = np.array([[p / np.power(10000, 2 * (j // 2) / d_hid) for j in range(d_hid)]
                  for p in range(n_position)])
    t[:, 0::2] = np.sin(t[:, 0::2])
    t[:, 1::2] = np.cos(t[:, 1::2])
    return torch.FloatTensor(t).unsqueeze(0)


def num_patches(cfg):
    return (cfg["img_size"] // 16) ** 2


def stage_names(cfg, s):
    """(name, shape) of tokens_to_token.attention{s+1} in state_dict order."""
    T, dim = cfg["token_dim"], (cfg["in_chans"] * 49 if s == 0 else cfg["token_dim"] * 9)
    p = "tokens_to_token.attention%d." % (s + 1)
    if cfg["tokens_type"] == "transformer":
        return [(p + "norm1.weight", [dim]), (p + "norm1.bias", [dim]),
                (p + "attn.qkv.weight", [3 * T, dim]), (p + "attn.proj.weight", [T, T]),
                (p + "attn.proj.bias", [T]), (p + "norm2.weight", [T]), (p + "norm2.bias", [T]),
                (p + "mlp.fc1.weight", [T, T]), (p + "mlp.fc1.bias", [T]),
                (p + "mlp.fc2.weight", [T, T]), (p + "mlp.fc2.bias", [T])]
    return [(p + "w", [int(T * 0.5), T]), (p + "kqv.weight", [3 * T, dim]), (p + "kqv.bias", [3 * T]),
            (p + "proj.weight", [T, T]), (p + "proj.bias", [T]), (p + "norm1.weight", [dim]),
            (p + "norm1.bias", [dim]), (p + "norm2.weight", [T]), (p + "norm2.bias", [T]),
            (p + "mlp.0.weight", [T, T]), (p + "mlp.0.bias", [T]), (p + "mlp.2.weight", [T, T]),
            (p + "mlp.2.bias", [T])]


def names(cfg):
    E, M, T = cfg["embed_dim"], int(cfg["embed_dim"] * cfg["mlp_ratio"]), cfg["token_dim"]
    out = stage_names(cfg, 0) + stage_names(cfg, 1)
    out += [("tokens_to_token.project.weight", [E, 9 * T]), ("tokens_to_token.project.bias", [E]),
            ("cls_token", [1, 1, E]), ("pos_embed", [1, num_patches(cfg) + 1, E])]
    for i in range(cfg["depth"]):
        b = "blocks.%d." % i
        out += [(b + "norm1.weight", [E]), (b + "norm1.bias", [E]), (b + "attn.qkv.weight", [3 * E, E])]
        if cfg["qkv_bias"]:
            out.append((b + "attn.qkv.bias", [3 * E]))
        out += [(b + "attn.proj.weight", [E, E]), (b + "attn.proj.bias", [E]),
                (b + "norm2.weight", [E]), (b + "norm2.bias", [E]), (b + "mlp.fc1.weight", [M, E]),
                (b + "mlp.fc1.bias", [M]), (b + "mlp.fc2.weight", [E, M]), (b + "mlp.fc2.bias", [E])]
    out += [("norm.weight", [E]), ("norm.bias", [E])]
    if cfg["num_classes"]:
        out += [("head.weight", [cfg["num_classes"], E]), ("head.bias", [cfg["num_classes"]])]
    return out


def random_state(cfg, seed=0):
    """Non-trivial random weights: Linear weights U(+-1/sqrt(fan_in)) scaled
    up, norms 1 + 0.3 N(0,1), biases 0.2 N(0,1); pos_embed the sinusoid
    table (non-trainable in the original); the performer's w orthogonal *
    sqrt(m) as its __init__ draws it."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in names(cfg):
        leaf = name.rsplit(".", 1)[-1]
        if name == "pos_embed":
            t = sinusoid(shape[1], shape[2])
        elif name.endswith(".w"):
            w = torch.randn(*shape, generator=g)
            t = torch.nn.init.orthogonal_(w) * math.sqrt(shape[0])
        elif name == "cls_token":
            t = torch.randn(*shape, generator=g)
        elif "norm" in name and leaf == "weight":
            t = 1.0 + 0.3 * torch.randn(*shape, generator=g)
        elif leaf == "bias":
            t = 0.2 * torch.randn(*shape, generator=g)
        else:
            t = (torch.rand(*shape, generator=g) * 2 - 1) * 1.5 / math.sqrt(shape[-1])
        sd[name] = t.float().contiguous()
    return sd


def _ln(x, sd, p, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], sd[p + ".weight"], sd[p + ".bias"], eps)


def _lin(x, sd, p):
    return F.linear(x, sd[p + ".weight"], sd.get(p + ".bias"))


def token_transformer(x, sd, p):
    """Token_transformer: Attention (dim -> in_dim, one head, scale
    (dim // 1) ** -0.5, V skip) then x + mlp(norm2(x))."""
    h = _ln(x, sd, p + "norm1")
    B, N, dim = h.shape
    T = sd[p + "attn.proj.weight"].shape[0]
    qkv = F.linear(h, sd[p + "attn.qkv.weight"]).reshape(B, N, 3, 1, T).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    attn = ((q * dim ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
    y = (attn @ v).transpose(1, 2).reshape(B, N, T)
    x = v.squeeze(1) + _lin(y, sd, p + "attn.proj")
    return x + _lin(F.gelu(_lin(_ln(x, sd, p + "norm2"), sd, p + "mlp.fc1")), sd, p + "mlp.fc2")


def token_performer(x, sd, p):
    """Token_performer.forward, its prm_exp and single_attn as written."""
    w = sd[p + "w"]
    m, emb = w.shape

    def prm_exp(u):
        xd = ((u * u).sum(dim=-1, keepdim=True)).repeat(1, 1, m) / 2
        wtx = torch.einsum("bti,mi->btm", u.float(), w)
        return torch.exp(wtx - xd) / math.sqrt(m)

    h = _ln(x, sd, p + "norm1")
    k, q, v = torch.split(_lin(h, sd, p + "kqv"), emb, dim=-1)
    kp, qp = prm_exp(k), prm_exp(q)
    D = torch.einsum("bti,bi->bt", qp, kp.sum(dim=1)).unsqueeze(dim=2)
    kptv = torch.einsum("bin,bim->bnm", v.float(), kp)
    y = torch.einsum("bti,bni->btn", qp, kptv) / (D.repeat(1, 1, emb) + 1e-8)
    y = v + _lin(y, sd, p + "proj")
    return y + _lin(F.gelu(_lin(_ln(y, sd, p + "norm2"), sd, p + "mlp.0")), sd, p + "mlp.2")


def tokens_to_token(sd, cfg, x):
    stage = token_transformer if cfg["tokens_type"] == "transformer" else token_performer
    x = F.unfold(x, kernel_size=7, stride=4, padding=2).transpose(1, 2)
    x = stage(x, sd, "tokens_to_token.attention1.")
    B, L, C = x.shape
    x = x.transpose(1, 2).reshape(B, C, int(np.sqrt(L)), int(np.sqrt(L)))
    x = F.unfold(x, kernel_size=3, stride=2, padding=1).transpose(1, 2)
    x = stage(x, sd, "tokens_to_token.attention2.")
    B, L, C = x.shape
    x = x.transpose(1, 2).reshape(B, C, int(np.sqrt(L)), int(np.sqrt(L)))
    x = F.unfold(x, kernel_size=3, stride=2, padding=1).transpose(1, 2)
    return _lin(x, sd, "tokens_to_token.project")


def forward(sd, cfg, x):
    """(logits or None, the class token after norm [B, E], all tokens after norm)."""
    sd = {k: (v if torch.is_tensor(v) else torch.as_tensor(v)) for k, v in sd.items()}
    with torch.no_grad():
        t = tokens_to_token(sd, cfg, x)
        B, E, H = t.shape[0], cfg["embed_dim"], cfg["num_heads"]
        t = torch.cat([sd["cls_token"].expand(B, -1, -1), t], dim=1) + sd["pos_embed"]
        scale = cfg["qk_scale"] or (E // H) ** -0.5
        for i in range(cfg["depth"]):
            b = "blocks.%d." % i
            h = _ln(t, sd, b + "norm1")
            N = h.shape[1]
            qkv = F.linear(h, sd[b + "attn.qkv.weight"], sd.get(b + "attn.qkv.bias"))
            qkv = qkv.reshape(B, N, 3, H, E // H).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            a = ((q @ k.transpose(-2, -1)) * scale).softmax(dim=-1)
            t = t + _lin((a @ v).transpose(1, 2).reshape(B, N, E), sd, b + "attn.proj")
            t = t + _lin(F.gelu(_lin(_ln(t, sd, b + "norm2"), sd, b + "mlp.fc1")), sd, b + "mlp.fc2")
        h = _ln(t, sd, "norm")
        logits = _lin(h[:, 0], sd, "head") if cfg["num_classes"] else None
    return logits, h[:, 0], h


def metadata(cfg):
    """vitc.config as tools/convert_t2t.py writes it."""
    keys = ["arch", "tokens_type", "img_size", "in_chans", "embed_dim", "depth", "num_heads",
            "mlp_ratio", "qkv_bias", "qk_scale", "token_dim", "num_classes"]
    return {"vitc.config": json.dumps({k: cfg[k] for k in keys})}
