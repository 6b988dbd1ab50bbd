"""Reference tensors for tests/test_dense.c, written by PyTorch (float64).

    .venv/bin/python tests/reference/gen_dense.py    (writes tests/reference/dense/)

One file per op, several cases each, tensors named "<case>.<name>":
  conv.safetensors      nn.functional.conv2d
  convt.safetensors     nn.functional.conv_transpose2d
  bilinear.safetensors  nn.functional.interpolate(mode="bilinear", size=...)
  layernorm2d.safetensors  transformers' SamLayerNorm(data_format="channels_first")
Maps are stored channels-last ([B, H, W, C], vitc's layout); weights in
torch's own layout ([O, C, kh, kw] and [C, O, kh, kw]), so the test goes
through the packing functions too. "cfg" holds the case's integers as
float32. The forward "y" and the gradients of sum(y * dy) for a random
"dy" ("dx", "dw", "db") come from float64 autograd on the float32 inputs.
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_write  # noqa: E402

OUT = os.path.join(HERE, "dense")


def nhwc(t):
    return t.detach().permute(0, 2, 3, 1).contiguous().numpy().astype(np.float32)


def f32(t):
    return t.detach().numpy().astype(np.float32)


def run(fn, x, params, gen):
    """y = fn(x, *params) in float64, and the gradients of sum(y * dy)."""
    x64 = torch.from_numpy(x).double().requires_grad_(True)
    p64 = [None if p is None else torch.from_numpy(p).double().requires_grad_(True)
           for p in params]
    y = fn(x64, *p64)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float32)
    (y * dy.double()).sum().backward()
    return y, dy, x64.grad, [None if p is None else p.grad for p in p64]


def conv_case(gen, B, H, W, C, O, kh, kw, sh, sw, ph, pw, bias, transposed):
    x = torch.randn(B, C, H, W, generator=gen).numpy()
    shape = (C, O, kh, kw) if transposed else (O, C, kh, kw)
    w = (torch.randn(shape, generator=gen) / np.sqrt(C * kh * kw)).numpy()
    b = torch.randn(O, generator=gen).numpy() if bias else None
    op = F.conv_transpose2d if transposed else F.conv2d
    y, dy, dx, (dw, db) = run(lambda x_, w_, b_: op(x_, w_, b_, stride=(sh, sw), padding=(ph, pw)),
                              x, [w, b], gen)
    t = {"cfg": np.array([B, H, W, C, O, kh, kw, sh, sw, ph, pw, int(bias)], np.float32),
         "x": nhwc(torch.from_numpy(x)), "w": w, "y": nhwc(y), "dy": nhwc(dy), "dx": nhwc(dx),
         "dw": f32(dw)}
    if bias:
        t["b"] = b
        t["db"] = f32(db)
    return t


def bilinear_case(gen, B, C, ih, iw, oh, ow, ac):
    x = torch.randn(B, C, ih, iw, generator=gen).numpy()
    y, dy, dx, _ = run(lambda x_: F.interpolate(x_, size=(oh, ow), mode="bilinear",
                                                align_corners=bool(ac)), x, [], gen)
    return {"cfg": np.array([B, C, ih, iw, oh, ow, ac], np.float32),
            "x": nhwc(torch.from_numpy(x)), "y": nhwc(y), "dy": nhwc(dy), "dx": nhwc(dx)}


def layernorm2d_case(gen, B, C, H, W):
    from transformers.models.sam.modeling_sam import SamLayerNorm
    ln = SamLayerNorm(C, eps=1e-6, data_format="channels_first")
    with torch.no_grad():
        ln.weight.normal_(1.0, 0.5, generator=gen)
        ln.bias.normal_(0.0, 0.5, generator=gen)
    x = (torch.randn(B, C, H, W, generator=gen) * 3.0 + 1.0).numpy()
    w, b = ln.weight.detach().numpy().copy(), ln.bias.detach().numpy().copy()
    ln64 = ln.double()
    y, dy, dx, _ = run(lambda x_: ln64(x_), x, [], gen)
    return {"cfg": np.array([B, C, H, W], np.float32), "x": nhwc(torch.from_numpy(x)), "w": w,
            "b": b, "y": nhwc(y), "dy": nhwc(dy), "dx": nhwc(dx),
            "dw": f32(ln64.weight.grad), "db": f32(ln64.bias.grad)}


# (B, H, W, C, O, kh, kw, sh, sw, ph, pw, bias)
CONV = {
    "k3p1": (2, 7, 5, 5, 6, 3, 3, 1, 1, 1, 1, 1),
    "k3s2p1": (1, 9, 8, 4, 3, 3, 3, 2, 2, 1, 1, 1),
    "k3s2p1_odd": (2, 7, 7, 3, 5, 3, 3, 2, 2, 1, 1, 0),
    "k1": (2, 5, 6, 8, 7, 1, 1, 1, 1, 0, 0, 1),
    "k1_nobias": (1, 3, 4, 16, 9, 1, 1, 1, 1, 0, 0, 0),
    "k1s2": (1, 7, 6, 4, 5, 1, 1, 2, 2, 0, 0, 1),
    "k2x3": (1, 6, 7, 3, 4, 2, 3, 2, 1, 0, 1, 1),
    "k4s3p2": (1, 10, 9, 3, 2, 4, 4, 3, 3, 2, 2, 1),
    "k3_wide": (1, 4, 5, 37, 19, 3, 3, 1, 1, 1, 1, 1),
}
CONVT = {
    "k2s2": (2, 4, 5, 6, 4, 2, 2, 2, 2, 0, 0, 1),
    "k4s4": (1, 3, 3, 5, 3, 4, 4, 4, 4, 0, 0, 1),
    "k2x3s2x3": (1, 3, 4, 4, 5, 2, 3, 2, 3, 0, 0, 0),
    "k3s2p1": (1, 4, 5, 3, 4, 3, 3, 2, 2, 1, 1, 1),
    "k4s2p1": (2, 3, 4, 3, 2, 4, 4, 2, 2, 1, 1, 1),
    "k3s1p1": (1, 5, 4, 3, 3, 3, 3, 1, 1, 1, 1, 0),
    "k2s2_wide": (1, 3, 2, 33, 17, 2, 2, 2, 2, 0, 0, 1),
}
# (B, C, ih, iw, oh, ow, align_corners)
BILINEAR = {
    "up": (2, 3, 5, 7, 12, 9, 0),
    "up_ac": (2, 3, 5, 7, 12, 9, 1),
    "down": (1, 4, 13, 11, 5, 4, 0),
    "down_ac": (1, 4, 13, 11, 5, 4, 1),
    "x4_c1": (2, 1, 4, 6, 16, 24, 0),
    "wide_c": (1, 21, 3, 4, 7, 5, 0),
    "from1": (1, 2, 1, 1, 3, 2, 0),
    "from1_ac": (1, 2, 1, 2, 3, 1, 1),
    "to1_ac": (1, 2, 4, 5, 1, 1, 1),
}
# (B, C, H, W)
LAYERNORM2D = {
    "sam_neck": (2, 32, 5, 6),
    "odd": (1, 7, 3, 5),
}


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(1)
    for fname, cases, make in (
            ("conv", CONV, lambda a: conv_case(gen, *a, transposed=False)),
            ("convt", CONVT, lambda a: conv_case(gen, *a, transposed=True)),
            ("bilinear", BILINEAR, lambda a: bilinear_case(gen, *a)),
            ("layernorm2d", LAYERNORM2D, lambda a: layernorm2d_case(gen, *a))):
        t = {}
        for name, args in cases.items():
            for k, v in make(args).items():
                t[name + "." + k] = v
        st_write.write(os.path.join(OUT, fname + ".safetensors"), t)
