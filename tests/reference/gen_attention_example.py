"""Make docs/attention-map-example.png: a toy Vision Transformer trained to
name the colour (red, green, blue) of the one object in a noisy gray scene,
which it can only do by attending to the object, so its attention map must
line up with the object. No pretrained weights are needed (none ship here).

    make && .venv/bin/python tests/reference/gen_attention_example.py

Trains for about a minute on one CPU thread (600 steps), exports with
tools/export_safetensors.py, and runs `build/vitc attention-map`.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.models.vision_transformer import VisionTransformer

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
S = 64
YY, XX = np.mgrid[0:S, 0:S].astype(np.float32)
MEAN = np.array([0.485, 0.456, 0.406])[None, :, None, None]
STD = np.array([0.229, 0.224, 0.225])[None, :, None, None]


def scene(cls, r, center=None, size=None, kind=None):
    g = r.uniform(0.25, 0.75)
    img = np.full((S, S, 3), g) + (YY / S * r.uniform(-0.2, 0.2))[..., None]
    img += r.normal(0, 0.05, (S, S, 3))
    size = r.uniform(6, 11) if size is None else size
    cy, cx = r.uniform(size + 1, S - size - 1, 2) if center is None else center
    col = np.full(3, r.uniform(0.1, 0.3))
    col[cls] = r.uniform(0.75, 1.0)
    kind = r.integers(0, 3) if kind is None else kind
    if kind == 0:
        m = (YY - cy) ** 2 + (XX - cx) ** 2 < size ** 2
    elif kind == 1:
        m = (abs(YY - cy) < size * 0.85) & (abs(XX - cx) < size * 0.85)
    else:
        m = (YY > cy - size) & (YY < cy + size) & (abs(XX - cx) < (YY - cy + size) * 0.6)
    img[m] = col
    return np.clip(img, 0, 1)


def batch(n, r):
    ys = r.integers(0, 3, n)
    xs = np.stack([scene(c, r) for c in ys]).transpose(0, 3, 1, 2)
    return torch.tensor((xs - MEAN) / STD, dtype=torch.float32), torch.tensor(ys)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    m = VisionTransformer(image_size=S, patch_size=8, num_layers=3, num_heads=4, hidden_dim=64,
                          mlp_dim=128, num_classes=3)
    opt = torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.01)
    for step in range(600):
        x, y = batch(32, rng)
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    x, y = batch(256, np.random.default_rng(99))
    with torch.no_grad():
        acc = float((m(x).argmax(1) == y).float().mean())
    print("toy ViT: loss %.4f, held-out accuracy %.3f" % (float(loss), acc))
    with tempfile.TemporaryDirectory() as d:
        pth = os.path.join(d, "toy.pth")
        torch.save(m.state_dict(), pth)
        labels = os.path.join(d, "labels.txt")
        with open(labels, "w") as f:
            f.write("red\ngreen\nblue\n")
        st = os.path.join(d, "toy.safetensors")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_safetensors.py"), pth,
                        st, "--num-heads", "4", "--labels", labels], check=True,
                       stdout=subprocess.DEVNULL)
        img = os.path.join(d, "scene.png")
        Image.fromarray((scene(0, np.random.default_rng(7), center=(24, 38), size=9, kind=0)
                         * 255).astype(np.uint8)).save(img)
        out = os.path.join(ROOT, "docs", "attention-map-example.png")
        subprocess.run([os.path.join(ROOT, "build", "vitc"), "attention-map", "--model", st,
                        "--out", out, img], check=True)
        subprocess.run([os.path.join(ROOT, "build", "vitc"), "classify", "--model", st,
                        "--topk", "1", img], check=True)
        print("wrote", out)


if __name__ == "__main__":
    main()
