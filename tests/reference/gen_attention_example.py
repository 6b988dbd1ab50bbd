"""Make docs/attention-map-example.png: the shipped Fashion-MNIST model
(models/fashion-vit.safetensors) on a real image of Fashion-MNIST's test
set, the first of its class, with `vitc attention-map`'s caption.

    make && .venv/bin/python tests/reference/gen_attention_example.py [CLASS]

CLASS is a label of the model (default "Sneaker"). No pretrained photo model
ships with vitc, and a photo through a 28-pixel grayscale model says
nothing, so the example is the data the model was trained for; the data set
comes from Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FASHION = "/usr/share/datasets/fashion-mnist"
MODEL = os.path.join(ROOT, "models", "fashion-vit.safetensors")
VITC = os.path.join(ROOT, "build", "vitc")
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from util import read_idx  # noqa: E402  (the tests' IDX reader)


def main():
    want = sys.argv[1] if len(sys.argv) > 1 else "Sneaker"
    x = read_idx(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz"))
    p = subprocess.run([VITC, "inspect", "--json", MODEL], check=True, capture_output=True,
                       text=True)
    labels = json.loads(json.loads(p.stdout)["metadata"]["vitc.config"])["labels"]
    cls = labels.index(want)
    i = int(np.nonzero(y == cls)[0][0])
    with tempfile.TemporaryDirectory() as d:
        # the name carries into the caption: the set, the index, the class
        img = os.path.join(d, "fashion-mnist-test-%d-%s.png"
                           % (i, want.lower().replace(" ", "-").replace("/", "-")))
        Image.fromarray(x[i]).save(img)
        out = os.path.join(ROOT, "docs", "attention-map-example.png")
        subprocess.run([VITC, "attention-map", "--model", MODEL, "--out", out, img], check=True)
        subprocess.run([VITC, "classify", "--model", MODEL, "--topk", "1", img], check=True)
        print("test image %d (%s) -> %s" % (i, want, out))


if __name__ == "__main__":
    main()
