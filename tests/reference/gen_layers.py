"""Reference tensors for tests/test_layers.c, written by PyTorch.

    .venv/bin/python tests/reference/gen_layers.py    (writes tests/reference/layers/)

Each file holds one layer case, written by the independent NumPy writer
st_write.py (not by vitc): the torch module's state_dict under "block.",
the input "x" and torch's output "y" (plus, per case, more outputs: the
BatchNorm running statistics after a training step, MHA weights, ...).
Masks are stored as F32 0/1 (the C tests turn them into uint8). The torch
modules are the seeds' own code (the four tutorials' modules), also imported by
tests/python/test_layers.py.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_write  # noqa: E402

# ---------------------------------------------------------------------------
# The seeds' modules (the tutorials' code), unchanged but for formatting.

class SeedAttentionBlock(nn.Module):  # seed 000
    def __init__(self, in_channels=3, patch_size=4, embed_dim=64, heads=1):
        super().__init__()
        self.patch_size = patch_size
        self.embed_dim = embed_dim
        self.heads = heads
        self.proj = nn.Conv2d(in_channels, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.to_q = nn.Linear(embed_dim, embed_dim)
        self.to_k = nn.Linear(embed_dim, embed_dim)
        self.to_v = nn.Linear(embed_dim, embed_dim)
        self.to_out = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        x = self.proj(x)
        x = x.flatten(2)
        x = x.transpose(1, 2)
        Q = self.to_q(x)
        K = self.to_k(x)
        V = self.to_v(x)
        if self.heads > 1:  # heads > 1 splits E into heads (grouped layout)
            B, N, E = Q.shape
            h = self.heads
            Q, K, V = (t.reshape(B, N, h, E // h).transpose(1, 2) for t in (Q, K, V))
        d_k = Q.size(-1)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / (d_k ** 0.5)
        attn = F.softmax(scores, dim=-1)
        out = torch.matmul(attn, V)
        if self.heads > 1:
            out = out.transpose(1, 2).reshape(B, N, E)
        out = self.to_out(out)
        return out


class SeedConvSABlock(nn.Module):  # seed 000
    def __init__(self, in_channels):
        super().__init__()
        self.q = nn.Conv2d(in_channels, in_channels // 8, kernel_size=1)
        self.k = nn.Conv2d(in_channels, in_channels // 8, kernel_size=1)
        self.v = nn.Conv2d(in_channels, in_channels, kernel_size=1)
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        B, C, H, W = x.shape
        Q = self.q(x).view(B, -1, H * W).permute(0, 2, 1)
        K = self.k(x).view(B, -1, H * W)
        V = self.v(x).view(B, -1, H * W).permute(0, 2, 1)
        d_k = Q.size(-1)
        attention = torch.bmm(Q, K) / d_k ** 0.5
        attention = F.softmax(attention, dim=-1)
        out = torch.bmm(attention, V)
        out = out.permute(0, 2, 1).view(B, C, H, W)
        return self.gamma * out + x


class SeedSelfAttentionGroup(nn.Module):  # seed 001, first SelfAttention
    def __init__(self, ni):
        super().__init__()
        self.scale = math.sqrt(ni)
        self.norm = nn.GroupNorm(1, ni)
        self.q = nn.Linear(ni, ni)
        self.k = nn.Linear(ni, ni)
        self.v = nn.Linear(ni, ni)
        self.proj = nn.Linear(ni, ni)

    def forward(self, x):
        inp = x
        n, c, h, w = x.shape
        x = self.norm(x)
        x = x.view(n, c, -1).transpose(1, 2)
        q = self.q(x)
        k = self.k(x)
        v = self.v(x)
        s = (q @ k.transpose(1, 2)) / self.scale
        x = s.softmax(dim=-1) @ v
        x = self.proj(x)
        x = x.transpose(1, 2).reshape(n, c, h, w)
        return x + inp


class SeedSelfAttentionBatch(nn.Module):  # seed 001, second SelfAttention
    def __init__(self, ni):
        super().__init__()
        self.scale = math.sqrt(ni)
        self.norm = nn.BatchNorm2d(ni)
        self.qkv = nn.Linear(ni, ni * 3)
        self.proj = nn.Linear(ni, ni)

    def forward(self, x):
        inp = x
        n, c, h, w = x.shape
        x = self.norm(x)
        x = x.view(n, c, -1).transpose(1, 2)
        q, k, v = torch.chunk(self.qkv(x), 3, dim=-1)
        s = (q @ k.transpose(1, 2)) / self.scale
        x = s.softmax(dim=-1) @ v
        x = self.proj(x)
        x = x.transpose(1, 2).reshape(n, c, h, w)
        return x + inp


def rearrange_in(x, h):  # einops 'n s (h d) -> (n h) s d'
    n, s, hd = x.shape
    return x.reshape(n, s, h, hd // h).transpose(1, 2).reshape(n * h, s, hd // h)


def rearrange_out(x, h):  # einops '(n h) s d -> n s (h d)'
    nh, s, d = x.shape
    return x.reshape(nh // h, h, s, d).transpose(1, 2).reshape(nh // h, s, h * d)


class SeedSelfAttentionMultiHead(nn.Module):  # seed 001
    def __init__(self, ni, nheads):
        super().__init__()
        self.nheads = nheads
        self.scale = math.sqrt(ni / nheads)
        self.norm = nn.BatchNorm2d(ni)
        self.qkv = nn.Linear(ni, ni * 3)
        self.proj = nn.Linear(ni, ni)

    def forward(self, inp):
        n, c, h, w = inp.shape
        x = self.norm(inp).view(n, c, -1).transpose(1, 2)
        x = self.qkv(x)
        x = rearrange_in(x, self.nheads)
        q, k, v = torch.chunk(x, 3, dim=-1)
        s = (q @ k.transpose(1, 2)) / self.scale
        x = s.softmax(dim=-1) @ v
        x = rearrange_out(x, self.nheads)
        x = self.proj(x).transpose(1, 2).reshape(n, c, h, w)
        return x + inp


class SeedT2TAttention(nn.Module):  # seed 003
    def __init__(self, dim, chan, num_heads=1, qkv_bias=False, qk_scale=None):
        super().__init__()
        self.num_heads = num_heads
        self.chan = chan
        self.head_dim = self.chan // self.num_heads
        self.scale = qk_scale or self.head_dim ** -0.5
        assert self.chan % self.num_heads == 0
        self.qkv = nn.Linear(dim, chan * 3, bias=qkv_bias)
        self.proj = nn.Linear(chan, chan)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, self.chan)
        x = self.proj(x)
        v = v.transpose(1, 2).reshape(B, N, self.chan)
        x = v + x
        return x


def seed_single_head(x, W_q, W_k, W_v, W_o):  # seed 002 (NumPy), in float64
    x, W_q, W_k, W_v, W_o = (np.asarray(a, np.float64) for a in (x, W_q, W_k, W_v, W_o))
    d_k = W_q.shape[1]
    Q, K, V = x @ W_q, x @ W_k, x @ W_v
    s = Q @ K.transpose(0, 2, 1) / np.sqrt(d_k)
    s = np.exp(s - s.max(-1, keepdims=True))
    w = s / s.sum(-1, keepdims=True)
    return (w @ V) @ W_o


def randomize(module, gen):
    """Non-default values for everything torch initialises to constants (biases
    of MHA, gamma, norm affine, running stats); weights keep torch's own
    random initialisation, so activations have realistic magnitudes."""
    for name, p in module.named_parameters():
        if p.dim() <= 1:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    for name, b in module.named_buffers():
        if name.endswith("running_mean"):
            b.copy_(torch.randn(b.shape, generator=gen) * 0.2)
        elif name.endswith("running_var"):
            b.copy_(torch.rand(b.shape, generator=gen) + 0.5)
    return module



def sdpa_ref(q, k, v, mask=None, scale=None):
    """float64 NumPy reference with torch 2.x semantics (bool True = takes part)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        mask = np.asarray(mask)
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    with np.errstate(invalid="ignore"):
        m = s.max(-1, keepdims=True)
        e = np.exp(s - m)
        return (e / e.sum(-1, keepdims=True)) @ v


def block(module):
    return {"block." + k: v.detach().numpy().astype(np.float32) for k, v in module.state_dict().items()
            if not k.endswith("num_batches_tracked")}


def f32(t):
    return np.ascontiguousarray(np.asarray(t.detach().numpy() if hasattr(t, "detach") else t, np.float32))


def main():
    out = os.path.join(HERE, "layers")
    os.makedirs(out, exist_ok=True)
    torch.set_grad_enabled(False)
    gen = torch.Generator().manual_seed(20261122)
    torch.manual_seed(20261122)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731

    def save(name, tensors):
        st_write.write(os.path.join(out, name + ".safetensors"), {k: f32(v) for k, v in tensors.items()})

    # Image layers: seed modules, random biases/gamma/norm affine; one forward.
    cases = [("attention_block", SeedAttentionBlock(3, 4, 16, 1), (2, 3, 8, 12)),
             ("attention_block_heads", SeedAttentionBlock(3, 2, 12, 3), (1, 3, 6, 4)),
             ("conv_sa", SeedConvSABlock(16), (2, 16, 5, 7)),
             ("sa_group", SeedSelfAttentionGroup(8), (3, 8, 4, 5)),
             ("t2t", SeedT2TAttention(10, 12, 3, True, None), (2, 7, 10)),
             ("t2t_seed", SeedT2TAttention(49, 64, 4), (2, 6, 49))]
    for name, m, shape in cases:
        randomize(m, gen)
        x = rnd(*shape)
        save(name, dict(block(m), x=x, y=m(x)))

    # BatchNorm layers: a training step (batch statistics, running stats
    # updated), then eval with the updated running statistics.
    for name, m, shape in [("sa_batch", SeedSelfAttentionBatch(8), (3, 8, 4, 5)),
                           ("sa_multihead", SeedSelfAttentionMultiHead(12, 3), (2, 12, 3, 5))]:
        randomize(m, gen)
        w = block(m)
        x = rnd(*shape) * 1.5 + 0.3
        m.train()
        y_train = m(x)
        after = {"after." + k: v.numpy() for k, v in m.state_dict().items() if "running" in k}
        m.eval()
        save(name, dict(w, x=x, y_train=y_train, y_eval=m(x), **after))

    # SingleHeadAttention: the NumPy seed in float64.
    rng = np.random.default_rng(2)
    E, dk = 20, 7
    W = {k: (rng.standard_normal(s) * 0.1).astype(np.float32)
         for k, s in (("W_q", (E, dk)), ("W_k", (E, dk)), ("W_v", (E, dk)), ("W_o", (dk, E)))}
    x = rng.uniform(0, 1, size=(2, 5, E)).astype(np.float32)
    save("single_head", dict({"block." + k: v for k, v in W.items()}, x=x,
                             y=seed_single_head(x, W["W_q"], W["W_k"], W["W_v"], W["W_o"])))

    # MultiheadAttention, seq-first cross attention with both masks.
    m = randomize(nn.MultiheadAttention(16, 4), gen).eval()
    q, k, v = rnd(5, 3, 16), rnd(7, 3, 16), rnd(7, 3, 16)
    kpm = torch.rand(3, 7, generator=gen) < 0.3
    kpm[:, 0] = False
    am = rnd(5, 7)
    o, wavg = m(q, k, v, key_padding_mask=kpm, attn_mask=am)
    _, wall = m(q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False)
    oself, _ = m(q, q, q, need_weights=False)
    save("mha", dict(block(m), q=q, k=k, v=v, kpm=kpm.float(), am=am, y=o, w_avg=wavg, w_heads=wall,
                     y_self=oself))
    # kdim/vdim, batch_first, no bias, 3-D bool attn_mask.
    m = randomize(nn.MultiheadAttention(8, 2, bias=False, kdim=5, vdim=6, batch_first=True), gen).eval()
    q, k, v = rnd(2, 4, 8), rnd(2, 3, 5), rnd(2, 3, 6)
    am = torch.rand(4, 4, 3, generator=gen) < 0.4
    am[:, :, 1] = False
    o, w = m(q, k, v, attn_mask=am)
    save("mha_kv", dict(block(m), q=q, k=k, v=v, am=am.float(), y=o, w_avg=w))

    # SDPA with broadcast masks, float64 reference.
    q, k, v = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 6, 4)), rng.standard_normal((2, 3, 6, 5))
    q, k, v = (a.astype(np.float32) for a in (q, k, v))
    mb = rng.uniform(size=(3, 1, 6)) < 0.6
    mb[..., 0] = True
    mf = rng.standard_normal((5, 6)).astype(np.float32)
    save("sdpa", dict(q=q, k=k, v=v, mask_bool=mb.astype(np.float32), mask_float=mf,
                      y=sdpa_ref(q, k, v), y_bool=sdpa_ref(q, k, v, mb), y_float=sdpa_ref(q, k, v, mf),
                      y_scale=sdpa_ref(q, k, v, scale=0.25)))

    # softmax with temperature on logits in the thousands, along a middle dim.
    x = (torch.randn(3, 4, 5, generator=gen) * 2000).float()
    save("softmax", dict(x=x, y=F.softmax(x / 0.5, dim=1), y_last=F.softmax(x / 3.0, dim=-1)))
    print("wrote", out)


if __name__ == "__main__":
    main()
