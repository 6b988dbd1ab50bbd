#!/usr/bin/env python3
"""Does fine-tuning with `vitc train --init` learn? Measured on real photos.

Run by `make bench-finetune` (.venv/bin/python bench/finetune_learn.py --out
bench/results-finetune.md). It

1. builds a small ImageFolder from scikit-image's bundled photos
   (skimage.data: astronaut, chelsea the cat, coffee, rocket): each class is
   random crops (40-90 % of the shorter side), horizontal flips and shifts of
   one photo; train/ and a held-out val/ drawn apart (different crops of the
   same photo, never the same file);
2. writes random-init Hub directories with transformers' own init and
   save_pretrained: a DINOv2-S/14-shaped Dinov2Model and a CLIP ViT-B/16
   image tower (CLIPVisionModelWithProjection), both from random init;
3. runs `build/vitc train --init DIR --data DIR` on them: full fine-tuning of
   each (a new head for the folder's classes, the whole model trained) and a
   `--freeze-backbone` linear probe of the CLIP tower (its new head reads
   image_embeds, the embedding a probe caches; DINOv2's reads [CLS, mean of
   patch tokens], which a probe does not take);
4. writes the loss and accuracy per epoch (train, and held-out val), against
   chance, the wall time, the CPU and thread count, and each exact command.

The config's image_size is the resolution vitc trains at (a Hub model's
input size); the defaults keep the whole script near 10 minutes on 2
cores: DINOv2-S at 224 px, CLIP-B (2.9 times its FLOPs at the same size) at
112 px, its position table drawn at that size. --quick: tiny models and a
handful of images (tests the script, learns nothing to speak of).
"""
import argparse
import datetime
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# class name -> skimage.data photo
PHOTOS = {"astronaut": "astronaut", "cat": "chelsea", "coffee": "coffee", "rocket": "rocket"}


def make_data(d, n_train, n_val, side, seed=0):
    """d/train/<class>/*.png and d/val/<class>/*.png: crops of one photo per
    class, shorter side `side` (vitc resizes it to the model's size and
    center-crops)."""
    import numpy as np
    import skimage.data
    from PIL import Image
    rng = random.Random(seed)
    counts = {}
    for cls, photo in PHOTOS.items():
        im = Image.fromarray(np.asarray(getattr(skimage.data, photo)())[..., :3])
        w, h = im.size
        for split, n in (("train", n_train), ("val", n_val)):
            out = os.path.join(d, split, cls)
            os.makedirs(out, exist_ok=True)
            for i in range(n):
                c = int(min(w, h) * rng.uniform(0.4, 0.9))
                cw = min(w, int(c * rng.uniform(1.0, 1.25)))  # a little wider than tall
                x0, y0 = rng.randint(0, w - cw), rng.randint(0, h - c)
                crop = im.crop((x0, y0, x0 + cw, y0 + c))
                crop = crop.resize((max(side, round(side * cw / c)), side), Image.BICUBIC)
                if rng.random() < 0.5:
                    crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
                crop.save(os.path.join(out, "%s_%03d.png" % (split, i)))
            counts[(split, cls)] = n
    return counts


def make_models(d, quick, size_dino, size_clip):
    """Random-init Hub directories (transformers' init, seed 0). Returns
    name -> (directory, description)."""
    import torch
    import transformers
    if quick:
        dino = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, mlp_ratio=4,
                    image_size=2 * 14, patch_size=14)
        clip = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                    intermediate_size=96, image_size=2 * 16, patch_size=16, projection_dim=16)
    else:
        dino = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, mlp_ratio=4,
                    image_size=size_dino, patch_size=14)
        clip = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072, image_size=size_clip, patch_size=16,
                    projection_dim=512)
    out = {}
    torch.manual_seed(0)
    p = os.path.join(d, "dinov2-s14")
    transformers.Dinov2Model(transformers.Dinov2Config(**dino)).save_pretrained(p)
    out["dinov2"] = (p, "DINOv2-S/14-shaped Dinov2Model (hidden %d, %d layers, %d heads, patch 14, "
                     "%d px)" % (dino["hidden_size"], dino["num_hidden_layers"],
                                 dino["num_attention_heads"], dino["image_size"]))
    torch.manual_seed(0)
    p = os.path.join(d, "clip-b16")
    transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**clip)).save_pretrained(p)
    out["clip"] = (p, "CLIP ViT-B/16-shaped CLIPVisionModelWithProjection (hidden %d, %d layers, "
                   "%d heads, patch 16, projection %d, %d px)" % (
                       clip["hidden_size"], clip["num_hidden_layers"],
                       clip["num_attention_heads"], clip["projection_dim"], clip["image_size"]))
    return out


def run_train(vitc, model, data, work, tag, flags, threads):
    """One `vitc train` run; returns its record (command, epochs, wall time,
    closing line or error)."""
    log = os.path.join(work, tag + ".jsonl")
    argv = [vitc, "train", "--init", model, "--data", data, "--out",
            os.path.join(work, tag + ".safetensors"), "--log", log, "--threads", str(threads),
            "--seed", "0", "--quiet"] + flags
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True)
    wall = time.time() - t0
    epochs = []
    if os.path.exists(log):
        with open(log) as f:
            for line in f:
                r = json.loads(line)
                if r.get("type") == "epoch":
                    epochs.append(r)
    err = p.stderr.strip().splitlines()
    return {"tag": tag, "argv": argv, "rc": p.returncode, "wall_s": wall, "epochs": epochs,
            "last_line": err[-1] if err else "",
            "error": "\n".join(l for l in err if "error" in l)[-400:] if p.returncode else ""}


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def pct(x):
    return "–" if x is None else "%.1f%%" % (100 * x)


def num(x, spec=".4f"):
    return "–" if x is None else format(x, spec)


def render(info, runs, classes):
    chance = 1.0 / len(classes)
    L = ["# Fine-tuning from random init: does vitc learn?\n",
         "`vitc train --init` on random-init DINOv2-S- and CLIP-B-shaped Hub models "
         "(transformers' own init, save_pretrained), on a small ImageFolder of real photos. "
         "Written by bench/finetune_learn.py (`make bench-finetune`).\n"]
    L.append("## Setup\n")
    for k in ("date", "command", "cpu", "threads", "vitc", "data", "split", "models", "sizes",
              "took"):
        L.append("- %s: %s" % (k, info[k]))
    L.append("- chance: %s (%d classes: %s)" % (pct(chance), len(classes), ", ".join(classes)))
    if info.get("quick"):
        L.append("- **--quick**: tiny models and a handful of images, a test of the script; "
                 "the numbers say nothing about learning")
    L.append("\n## Summary\n")
    L.append("| run | epochs | train loss first → last | train acc (last) | val acc (best) "
             "| val acc (last) | vs chance | wall s |")
    L.append("|---|---:|---|---:|---:|---:|---|---:|")
    for r in runs:
        e = r["epochs"]
        if not e:
            L.append("| %s | – | failed: %s | | | | | %.0f |" % (
                r["label"], (r["error"] or r["last_line"]).replace("|", "/").replace("\n", " ")[-200:],
                r["wall_s"]))
            continue
        va = [x.get("eval_acc") for x in e if x.get("eval_acc") is not None]
        last_va = e[-1].get("eval_acc")
        L.append("| %s | %d | %s → %s%s | %s | %s | %s | %s | %.0f |" % (
            r["label"], len(e), num(e[0]["train_loss"]), num(e[-1]["train_loss"]),
            " (falling)" if e[-1]["train_loss"] < e[0]["train_loss"] else " (not falling)",
            pct(e[-1].get("train_acc")), pct(max(va) if va else None), pct(last_va),
            "%.1f× chance" % (last_va / chance) if last_va is not None else "–", r["wall_s"]))
    for r in runs:
        L.append("\n## %s\n" % r["label"])
        L.append("```\n%s\n```\n" % " ".join(shlex.quote(a) for a in r["argv"]))
        if r["rc"]:
            L.append("exit %d: %s\n" % (r["rc"], r["error"] or r["last_line"]))
        if r["epochs"]:
            L.append("| epoch | train loss | train acc | val loss | val acc | seconds |")
            L.append("|---:|---:|---:|---:|---:|---:|")
            for x in r["epochs"]:
                L.append("| %d | %s | %s | %s | %s | %s |" % (
                    x["epoch"], num(x["train_loss"]), pct(x.get("train_acc")),
                    num(x.get("eval_loss")), pct(x.get("eval_acc")), num(x.get("seconds"), ".1f")))
            L.append("")
        if r["last_line"]:
            L.append("vitc: `%s`; wall time %.1f s\n" % (r["last_line"].replace("`", "'"),
                                                           r["wall_s"]))
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results-finetune.md"))
    ap.add_argument("--vitc", default=os.path.join(ROOT, "build", "vitc"))
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--epochs", type=int, default=5, help="epochs of the full fine-tuning runs")
    # a probe's epoch is microseconds, but each writes the whole model's
    # checkpoint (350 MB for CLIP-B), so not many
    ap.add_argument("--probe-epochs", type=int, default=10,
                    help="epochs of the --freeze-backbone run")
    ap.add_argument("--train-per-class", type=int, default=24)
    ap.add_argument("--val-per-class", type=int, default=8)
    ap.add_argument("--size-dinov2", type=int, default=224, help="DINOv2's image size (x14)")
    ap.add_argument("--size-clip", type=int, default=112, help="CLIP's image size (x16)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="tiny models, 4+2 images a class, "
                    "2 epochs: tests the script")
    ap.add_argument("--keep", help="build the data and models here and keep them")
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.probe_epochs = 2, 3
        args.train_per_class, args.val_per_class = 4, 2
    if not os.access(args.vitc, os.X_OK):
        sys.exit("finetune_learn.py: %s not found: run make first" % args.vitc)
    t_start = time.time()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    tmp = None
    work = args.keep
    if not work:
        tmp = tempfile.TemporaryDirectory(prefix="vitc-finetune-")
        work = tmp.name
    os.makedirs(work, exist_ok=True)

    def log(msg):
        print("finetune_learn: " + msg, file=sys.stderr, flush=True)

    data = os.path.join(work, "photos")
    side = 64 if args.quick else max(args.size_dinov2, args.size_clip) * 8 // 7
    log("writing the photos to " + data)
    make_data(data, args.train_per_class, args.val_per_class, side)
    log("writing the random-init Hub directories")
    models = make_models(work, args.quick, args.size_dinov2, args.size_clip)

    common = ["--epochs", str(args.epochs), "--batch", str(args.batch), "--lr", str(args.lr),
              "--weight-decay", "0.05", "--schedule", "cosine", "--warmup", "1"]
    plan = [("dinov2_full", "DINOv2-S/14, full fine-tuning", models["dinov2"][0], common),
            ("clip_full", "CLIP ViT-B/16, full fine-tuning", models["clip"][0], common),
            # CLIP's new head reads image_embeds, the default embedding a probe
            # caches; DINOv2's reads [CLS, mean of patches], which vitc refuses
            # to probe (docs/train-command.md)
            ("clip_probe", "CLIP ViT-B/16, --freeze-backbone (linear probe)", models["clip"][0],
             ["--freeze-backbone", "--epochs", str(args.probe_epochs), "--batch",
              str(args.batch), "--lr", "3e-3", "--weight-decay", "0.05"])]
    runs = []
    for tag, label, model, flags in plan:
        log("%s: vitc train ..." % label)
        r = run_train(args.vitc, model, data, work, tag, flags, args.threads)
        r["label"] = label
        log("%s: %s (%.1f s)" % (label, r["last_line"] or "exit %d" % r["rc"], r["wall_s"]))
        runs.append(r)

    # the first line (version and kernels): the others (CPU, caches) would
    # break the markdown bullet, and "cpu" says the machine already
    out = subprocess.run([args.vitc, "--version"], capture_output=True, text=True).stdout
    ver = (out.strip().splitlines() or [""])[0]
    n = args.train_per_class * len(PHOTOS), args.val_per_class * len(PHOTOS)
    cmd = "make bench-finetune" if os.environ.get("MAKELEVEL") else " ".join(
        ["bench/finetune_learn.py"] + [shlex.quote(a) for a in sys.argv[1:]])
    info = {"date": started, "command": "`%s`" % cmd, "cpu": cpu_model(),
            "threads": "%d (`vitc train --threads %d`; %d CPUs usable)" % (
                args.threads, args.threads, len(os.sched_getaffinity(0))),
            "vitc": ver,
            "data": "scikit-image's photos (skimage.data: %s), one photo per class; each image "
                    "a random crop of 40–90 %% of its shorter side (up to 1.25 times as wide), "
                    "flipped half the time, saved at %d px on its shorter side" % (
                        ", ".join("%s → %s" % (p, c) for c, p in PHOTOS.items()), side),
            "split": "%d training images (%d a class), %d held-out (val/, %d a class): other "
                     "crops of the same photos, never the same file" % (
                         n[0], args.train_per_class, n[1], args.val_per_class),
            "models": "; ".join(m[1] for m in models.values()) + "; random init "
                      "(transformers' own, seed 0), save_pretrained; vitc_vit_reset_head gives "
                      "each a new head for the 4 classes",
            "sizes": "DINOv2-S at %d px, CLIP-B at %d px (the config's image_size, which vitc "
                     "trains at; CLIP-B at 224 px costs about 2.9 times DINOv2-S's step and would "
                     "take the script past 10 minutes on 2 cores)" % (
                         args.size_dinov2, args.size_clip) if not args.quick else "--quick: "
                     "two patches a side",
            "took": "%.0f s in all" % (time.time() - t_start), "quick": args.quick}
    text = render(info, runs, sorted(PHOTOS))
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    log("wrote " + args.out)
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
