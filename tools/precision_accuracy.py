#!/usr/bin/env python3
"""bf16 and int8 inference against fp32, measured: top-1 agreement with the
fp32 prediction, top-5 overlap, relative logits error and (with labels) the
accuracy of each precision. Prints markdown tables (docs/precision.md).

    PYTHONPATH=python .venv/bin/python tools/precision_accuracy.py            # Fashion-MNIST
    PYTHONPATH=python .venv/bin/python tools/precision_accuracy.py --photos   # + ViT-B/16 photos

(a) the trained Fashion-MNIST model (--model, default models/fashion-vit.safetensors,
    whichever file is shipped) over the whole test set (10,000 images; --limit N
    for the first N), preprocessed as `vitc eval` does (ToTensor, Normalize with
    the file's mean/std; tools/torch_eval.py's reader).
(b) --photos: torchvision's ViT-B/16, random init (torch seed 0, its own
    initialisation; the zero-initialised head given seeded random weights, or
    every logit would tie): no pretrained weights are available offline. The
    images are crops and flips of the photos in tests/data and of
    skimage.data's photographs (when python3-skimage is installed), through
    torchvision's eval transform (Resize 256, CenterCrop 224, Normalize).
    A random model separates its classes by tiny margins, so its agreement
    understates a trained model's.

tests/python/test_precision_accuracy.py runs (a) in `make test` and asserts the
targets (bf16 top-1 agreement >= 99.5%, int8 >= 99%, accuracy change <= 0.3 points).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import vitc  # noqa: E402

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MODEL = os.path.join(ROOT, "models", "fashion-vit.safetensors")
PRECISIONS = ("fp32", "bf16", "int8")


def idx_path(data_dir, stem):
    """DIR/stem.gz or DIR/stem, or None."""
    for p in (os.path.join(data_dir, stem + ".gz"), os.path.join(data_dir, stem)):
        if os.path.exists(p):
            return p
    return None


def fashion_available(data_dir=FASHION_DIR):
    return all(idx_path(data_dir, s) for s in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))


def compare(got, ref):
    """Relative L2 error of the logits [n, C], top-1 agreement, mean top-5 overlap."""
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    top1 = float(np.mean(np.argmax(got, 1) == np.argmax(ref, 1)))
    k = min(5, ref.shape[1])
    tg, tr = np.argsort(-got, 1)[:, :k], np.argsort(-ref, 1)[:, :k]
    top5 = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(tg, tr)]))
    return {"rel": rel, "top1": top1, "top5": top5}


# --attention-precision: the bf16 / int8 models' attention; "auto", the
# library's default, is bf16 there (the fp32 model keeps fp32 always)
ATTENTION = "auto"


def logits_by_precision(path, x, batch, precisions=PRECISIONS):
    """{precision: logits [n, C]} of the model file at each precision."""
    out = {}
    for p in precisions:
        m = vitc.VisionTransformer.from_safetensors(
            path, precision=p, attention_precision="fp32" if p == "fp32" else ATTENTION)
        out[p] = np.concatenate([m(x[i:i + batch]) for i in range(0, len(x), batch)])
        del m
    return out


def fashion_stats(model=FASHION_MODEL, data_dir=FASHION_DIR, limit=0, batch=500):
    """Per precision: compare() against fp32 plus acc (and n): the Fashion-MNIST
    test set, preprocessed as `vitc eval` (x / 255, then (x - mean) / std)."""
    from torch_eval import read_idx
    x = read_idx(idx_path(data_dir, "t10k-images-idx3-ubyte"))
    y = read_idx(idx_path(data_dir, "t10k-labels-idx1-ubyte")).astype(np.int64)
    if limit:
        x, y = x[:limit], y[:limit]
    cfg = vitc.VisionTransformer.from_safetensors(model).config
    C, S = cfg["in_channels"], cfg["image_size"]
    if x.shape[1:] != (S, S):
        raise ValueError("%s takes %dx%d images, the data set has %dx%d"
                         % (model, S, S, x.shape[1], x.shape[2]))
    mean = np.array(cfg["mean"][:C], np.float32)[None, :, None, None]
    std = np.array(cfg["std"][:C], np.float32)[None, :, None, None]
    xf = np.repeat((x.astype(np.float32) / np.float32(255.0))[:, None], C, 1)
    xf = np.ascontiguousarray((xf - mean) / std, dtype=np.float32)
    logits = logits_by_precision(model, xf, batch)
    res = {}
    for p in PRECISIONS:
        r = compare(logits[p], logits["fp32"])
        r["acc"] = float(np.mean(np.argmax(logits[p], 1) == y))
        r["n"] = len(x)
        res[p] = r
    return res


def photo_images():
    """Crops (whole, and 60% at three places) and their mirror images of
    tests/data's photos and skimage.data's photographs, as PIL images; and
    where they came from."""
    from PIL import Image
    srcs = []
    for n in ("photo.png", "photo.jpg", "progressive.jpg", "rgb444.jpg", "gray.jpg"):
        srcs.append(("tests/data/" + n, Image.open(os.path.join(ROOT, "tests", "data", n))))
    try:
        import skimage.data as sd
        for n in ("astronaut", "camera", "chelsea", "coffee", "rocket", "motorcycle_left",
                  "hubble_deep_field", "immunohistochemistry", "retina"):
            try:
                a = getattr(sd, n)()
            except Exception:  # not bundled (fetched on demand; offline here)
                continue
            srcs.append(("skimage.data." + n, Image.fromarray(a)))
    except ImportError:
        pass
    out = []
    for _, im in srcs:
        im = im.convert("RGB")
        w, h = im.size
        s = int(min(w, h) * 0.6)
        boxes = [(0, 0, w, h), (0, 0, s, s), (w - s, h - s, w, h),
                 ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)]
        for b in boxes:
            c = im.crop(b)
            out += [c, c.transpose(Image.FLIP_LEFT_RIGHT)]
    return out, [n for n, _ in srcs]


def vitb_stats(workdir, batch=8):
    """Per precision: compare() against fp32, ViT-B/16 random init, photos."""
    import torch
    import torchvision
    from torchvision import transforms as T
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    from gen_vit import reinit_head
    st = os.path.join(workdir, "vitb_random_seed0.safetensors")
    if not os.path.exists(st):
        torch.manual_seed(0)
        m = reinit_head(torchvision.models.vit_b_16(), 1).eval()
        pth = st + ".pth"
        torch.save(m.state_dict(), pth)
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_safetensors.py"),
                        pth, st, "--arch", "vit_b_16"], check=True, stdout=subprocess.DEVNULL)
        os.remove(pth)
    tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                    T.Normalize(vitc.image.IMAGENET_MEAN, vitc.image.IMAGENET_STD)])
    imgs, names = photo_images()
    x = np.ascontiguousarray(torch.stack([tf(i) for i in imgs]).numpy(), dtype=np.float32)
    logits = logits_by_precision(st, x, batch)
    res = {p: compare(logits[p], logits["fp32"]) for p in PRECISIONS}
    for p in PRECISIONS:
        res[p]["n"] = len(x)
    return res, names


def fashion_table(res, model):
    acc0 = res["fp32"]["acc"]
    rows = ["| precision | images | accuracy | change (points) | top-1 agreement with fp32 "
            "| top-5 overlap | relative logits error (L2) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for p in PRECISIONS:
        r = res[p]
        if p == "fp32":
            rows.append("| fp32 | %d | %.2f%% | | | | |" % (r["n"], 100 * r["acc"]))
        else:
            rows.append("| %s | %d | %.2f%% | %+.2f | %.2f%% | %.2f%% | %.4f |"
                        % (p, r["n"], 100 * r["acc"], 100 * (r["acc"] - acc0), 100 * r["top1"],
                           100 * r["top5"], r["rel"]))
    return "Fashion-MNIST test set, %s:\n\n%s" % (os.path.relpath(model, ROOT), "\n".join(rows))


def photo_table(res, names):
    rows = ["| precision | images | top-1 agreement with fp32 | top-5 overlap "
            "| relative logits error (L2) |", "|---|---:|---:|---:|---:|"]
    for p in PRECISIONS[1:]:
        r = res[p]
        rows.append("| %s | %d | %.2f%% | %.2f%% | %.4f |"
                    % (p, r["n"], 100 * r["top1"], 100 * r["top5"], r["rel"]))
    return ("ViT-B/16, random init (seed 0), %d crops and flips of %d photos (%s):\n\n%s"
            % (res["fp32"]["n"], len(names), ", ".join(names), "\n".join(rows)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=FASHION_MODEL, help="the Fashion-MNIST model")
    ap.add_argument("--data", default=FASHION_DIR, help="folder of the IDX test files")
    ap.add_argument("--limit", type=int, default=0, help="the first N test images only")
    ap.add_argument("--photos", action="store_true", help="also ViT-B/16 over photos")
    ap.add_argument("--no-fashion", action="store_true")
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build", "precision-accuracy"),
                    help="where the ViT-B/16 file is kept")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--attention-precision", default="auto", choices=("auto", "fp32", "bf16", "int8"),
                    help="the attention of the bf16 and int8 models (the fp32 one keeps fp32; "
                         "default auto: the library's, bf16 there)")
    a = ap.parse_args()
    global ATTENTION
    ATTENTION = a.attention_precision
    if a.threads:
        vitc.set_num_threads(a.threads)
    print("kernels: %s\n" % vitc.VisionTransformer.precision_paths())
    if not a.no_fashion:
        if not fashion_available(a.data):
            sys.exit("precision_accuracy: no Fashion-MNIST test files in %s" % a.data)
        t = time.time()
        res = fashion_stats(a.model, a.data, a.limit)
        print(fashion_table(res, a.model))
        print("\n(%.1f s)\n" % (time.time() - t))
    if a.photos:
        os.makedirs(a.workdir, exist_ok=True)
        t = time.time()
        res, names = vitb_stats(a.workdir)
        print(photo_table(res, names))
        print("\n(%.1f s)" % (time.time() - t))


if __name__ == "__main__":
    main()
