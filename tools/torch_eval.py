#!/usr/bin/env python3
"""Evaluate a vitc-trained ViT in PyTorch: torchvision's VisionTransformer is
built from the file's vitc.config metadata, loaded with its tensors (the
"vitc.*" optimizer state of a checkpoint is left out), and run over the
Fashion-MNIST (or MNIST-style IDX) test set with the same preprocessing as
`vitc eval` (ToTensor, Normalize with the file's mean/std).

    .venv/bin/python tools/torch_eval.py models/fashion-vit.safetensors
    build/vitc eval --model models/fashion-vit.safetensors --data fashion-mnist

Both print the same accuracy. Needs only torch, torchvision and numpy.
"""
import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np
import torch
from torchvision.models.vision_transformer import VisionTransformer

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None}


def load_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    tensors = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        raw = blob[base + a:base + b]
        if t["dtype"] == "BF16":
            u = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, DTYPES[t["dtype"]]).astype(np.float32)
        tensors[name] = arr.reshape(t["shape"]).copy()
    return tensors, meta


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(dir_, stem):
    for p in (os.path.join(dir_, stem + ".gz"), os.path.join(dir_, stem)):
        if os.path.exists(p):
            return p
    sys.exit("torch_eval: no %s(.gz) in %s" % (stem, dir_))


def build(meta, tensors):
    c = json.loads(meta["vitc.config"])
    m = VisionTransformer(image_size=c["image_size"], patch_size=c["patch_size"],
                          num_layers=c["depth"], num_heads=c["num_heads"],
                          hidden_dim=c["hidden_dim"], mlp_dim=c["mlp_dim"],
                          num_classes=c["num_classes"])
    if c["in_channels"] != 3:
        m.conv_proj = torch.nn.Conv2d(c["in_channels"], c["hidden_dim"],
                                      kernel_size=c["patch_size"], stride=c["patch_size"])
    for ln in [m.encoder.ln] + [l.ln_1 for l in m.encoder.layers] + [l.ln_2 for l in m.encoder.layers]:
        ln.eps = c.get("norm_eps", 1e-6)
    state = {k: torch.from_numpy(v) for k, v in tensors.items() if not k.startswith("vitc.")}
    m.load_state_dict(state)
    return m.eval(), c


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                    help="folder of IDX files (default: Debian's Fashion-MNIST)")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0, help="the first N test images only")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    tensors, meta = load_safetensors(a.model)
    m, c = build(meta, tensors)
    x = read_idx(find(a.data, "t10k-images-idx3-ubyte"))
    y = read_idx(find(a.data, "t10k-labels-idx1-ubyte")).astype(np.int64)
    if a.limit:
        x, y = x[:a.limit], y[:a.limit]
    C, S = c["in_channels"], c["image_size"]
    mean = torch.tensor(c["mean"][:C], dtype=torch.float32).view(1, C, 1, 1)
    std = torch.tensor(c["std"][:C], dtype=torch.float32).view(1, C, 1, 1)
    if x.shape[1] != S:
        sys.exit("torch_eval: images of %d pixels, the model takes %d" % (x.shape[1], S))
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), a.batch):
            xb = torch.from_numpy(x[i:i + a.batch].astype(np.float32)) / 255.0
            xb = xb.unsqueeze(1).expand(-1, C, -1, -1)
            pred = m((xb - mean) / std).argmax(1).numpy()
            correct += int((pred == y[i:i + a.batch]).sum())
    print("%s: PyTorch (torchvision VisionTransformer) test accuracy %.2f%% (%d of %d)"
          % (a.model, 100.0 * correct / len(x), correct, len(x)))


if __name__ == "__main__":
    main()
