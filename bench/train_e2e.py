#!/usr/bin/env python3
"""make bench-train: Fashion-MNIST training end to end, vitc against PyTorch.

Issue 9's targets, side by side in one run (rounds interleaved, each run a
fresh process):

1. Throughput of the recipe (the Fashion-MNIST ViT, batch 128, AdamW,
   label smoothing 0.1, RandomCrop(28, padding=4) + horizontal flip) over
   the first N training images: `vitc train` reading Debian's gzip IDX
   files against PyTorch with its own DataLoader (a Dataset over the same
   gzip IDX files, torchvision transforms, shuffle, num_workers=0: the
   loader workers would take the cores the step needs on a 2-core machine).
   PyTorch runs at 1 and 2 threads and gets its better. "loop" is the
   training loop alone (first batch requested to last optimizer step);
   "wall" is the whole process (start-up, reading and decoding the data,
   building the model, writing vitc's checkpoint). Peak memory is the
   process's maximum resident set.
2. MPI overhead (when a `make MPI=1` binary is given with --mpi-vitc):
   `mpirun -np 2` ranks x 1 thread against 1 process x 2 threads, the same
   binary, images/s of the training loop.
3. Time to 90% test accuracy: the number of epochs the recipe needs is read
   from a training log (--log90, the shipped model's run), and each side's
   time is that many epochs at its measured loop throughput plus one test
   pass per epoch. Both sides compute the same function (tests/python/
   test_train.py holds their per-step losses within 1e-4 of each other), so
   they need the same number of epochs; a full PyTorch run to 90% (about 45
   minutes on 2 cores) is not repeated here.

Writes bench/results-train.md (markdown) and prints the rows.
"""
import argparse
import datetime
import gzip
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench as B  # noqa: E402  (run_child, child_env, machine_info, loadavg, FMNIST)

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
RECIPE = ["--arch", "fashion", "--batch", "128", "--lr", "1e-3", "--weight-decay", "0.05",
          "--label-smoothing", "0.1", "--augment", "crop,flip", "--seed", "0"]


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    import numpy as np
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def torch_child(images, threads, epochs):
    """One PyTorch training run as a Fashion-MNIST user writes it; prints JSON."""
    t_start = time.monotonic()
    import torch
    import torch.nn.functional as F
    import torchvision.transforms as T
    from torchvision.models.vision_transformer import VisionTransformer
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = read_idx(os.path.join(DATA, "train-images-idx3-ubyte.gz"))[:images]
    y = read_idx(os.path.join(DATA, "train-labels-idx1-ubyte.gz"))[:images]

    class IDX(torch.utils.data.Dataset):
        def __init__(self, x, y):
            self.x, self.y = torch.from_numpy(x.copy()), torch.from_numpy(y.astype("int64"))
            self.tf = T.Compose([T.RandomCrop(28, padding=4), T.RandomHorizontalFlip(),
                                 T.Normalize((MEAN,), (STD,))])

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.tf(self.x[i].unsqueeze(0).float().div_(255)), self.y[i]

    loader = torch.utils.data.DataLoader(IDX(x, y), batch_size=128, shuffle=True, num_workers=0)
    f = B.FMNIST
    m = VisionTransformer(f["image_size"], f["patch_size"], f["num_layers"], f["num_heads"],
                          f["hidden_dim"], f["mlp_dim"], num_classes=f["num_classes"])
    m.conv_proj = torch.nn.Conv2d(1, f["hidden_dim"], f["patch_size"], f["patch_size"])
    m.train()
    decay = [p for n, p in m.named_parameters() if p.ndim > 1 and "pos_embedding" not in n]
    rest = [p for n, p in m.named_parameters() if not (p.ndim > 1 and "pos_embedding" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-3)
    seen = 0
    t0 = time.monotonic()
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(m(xb), yb, label_smoothing=0.1)
            loss.backward()
            opt.step()
            seen += len(yb)
    loop = time.monotonic() - t0
    print(json.dumps({"loop_s": loop, "images": seen, "startup_s": t0 - t_start,
                      "loss": float(loss)}))


def vitc_run(argv, env, log):
    """(loop seconds, images, wall seconds, max RSS KiB) of one vitc train run."""
    t = time.monotonic()
    res, rss = B.run_child(argv, env, timeout=3600)
    wall = time.monotonic() - t
    if res.get("status") == "failed":
        raise SystemExit("vitc train failed: " + res.get("error", ""))
    loop = images = 0.0
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "epoch":
                loop += r["seconds"]
                images += r["images_per_s"] * r["seconds"]
    os.unlink(log)
    return loop, round(images), wall, rss


def epochs_to(log, acc):
    if not log or not os.path.exists(log):
        return None
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "epoch" and r.get("eval_acc", 0) >= acc:
                return r["epoch"]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vitc", default=os.path.join(ROOT, "build", "vitc"))
    ap.add_argument("--mpi-vitc", default=None, help="a `make MPI=1` build of vitc")
    ap.add_argument("--images", type=int, default=12800, help="training images per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--log90", default=None, help="a vitc train --log of the recipe")
    ap.add_argument("--out", default=os.path.join(HERE, "results-train.md"))
    ap.add_argument("--torch-child", nargs=3, type=int, metavar=("IMAGES", "THREADS", "EPOCHS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_child:
        return torch_child(*args.torch_child)
    if not os.path.isdir(DATA):
        raise SystemExit(DATA + ": missing (apt-get install dataset-fashion-mnist)")
    started = time.time()
    load0 = B.loadavg()
    tmp = tempfile.mkdtemp(prefix="vitc-bench-train-")
    rows = {}  # (side, threads) -> list of (loop_s, images, wall_s, rss_kb)

    def vitc_argv(binary, threads, log, mpi=False):
        a = [binary, "train", "--data", "fashion-mnist"] + RECIPE + [
            "--subset", str(args.images), "--epochs", "1", "--eval-every", "0",
            "--eval-subset", "128", "--threads", str(threads), "--quiet",
            "--out", os.path.join(tmp, "ck.safetensors"), "--log", log]
        if mpi:
            a = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                 "-np", "2"] + a
        return a

    try:
        for r in range(args.rounds):
            order = [("vitc", 2), ("vitc", 1), ("torch", 1), ("torch", 2)]
            if args.mpi_vitc:
                order += [("mpi 2x1", 1), ("mpi 1x2", 2)]
            order = order[r % len(order):] + order[:r % len(order)]
            for side, t in order:
                env = B.child_env(t, "auto")
                log = os.path.join(tmp, "log.jsonl")
                if side == "torch":
                    tt = time.monotonic()
                    res, rss = B.run_child([sys.executable, __file__, "--torch-child",
                                            str(args.images), str(t), "1"], env, timeout=3600)
                    wall = time.monotonic() - tt
                    if res.get("status") == "failed":
                        raise SystemExit("PyTorch child failed: " + res.get("error", ""))
                    m = (res["loop_s"], res["images"], wall, rss)
                elif side == "vitc":
                    m = vitc_run(vitc_argv(args.vitc, t, log), env, log)
                else:
                    m = vitc_run(vitc_argv(args.mpi_vitc, t, log, mpi=side.startswith("mpi 2")),
                                 env, log)
                rows.setdefault((side, t), []).append(m)
                print("round %d %-8s %d thr: loop %.2f s (%.0f img/s), wall %.2f s, %.0f MB" % (
                    r + 1, side, t, m[0], m[1] / m[0], m[2], m[3] / 1024), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def summary(key):
        ms = rows.get(key)
        if not ms:
            return None
        loop = B._median([m[0] for m in ms])
        return {"loop_s": loop, "ips": ms[0][1] / loop, "wall_s": B._median([m[2] for m in ms]),
                "mb": max(m[3] for m in ms) / 1024}

    S = {k: summary(k) for k in rows}
    tbest = max((S[k] for k in S if k[0] == "torch"), key=lambda s: s["ips"])
    tthr = [k[1] for k in S if k[0] == "torch" and S[k] is tbest][0]
    v = S[("vitc", 2)]
    info = B.machine_info(args.vitc, B.child_env(2, "auto"))
    lines = ["# Fashion-MNIST training end to end: vitc train vs PyTorch", "",
             "Written by `make bench-train` (bench/train_e2e.py; the method is in its docstring).",
             "", "- date: %s UTC (run took %.0f s)" % (
                 datetime.datetime.utcfromtimestamp(started).strftime("%Y-%m-%d %H:%M"),
                 time.time() - started),
             "- machine: %s, %d cores usable; %s" % (info["cpu"], info["cores"], info["vitc"]),
             "- load average (1 min) at start and end: %s and %s" % (load0, B.loadavg()),
             "- recipe: `vitc train --data fashion-mnist %s --subset %d --epochs 1`; "
             "PyTorch: the same model, AdamW (decay on weights only), label smoothing, "
             "RandomCrop(28, padding=4) + RandomHorizontalFlip in a DataLoader (batch 128, "
             "shuffle, num_workers=0); %d rounds, medians" % (" ".join(RECIPE), args.images,
                                                              args.rounds), "",
             "| run | threads | loop images/s | loop s | wall s | peak MB |",
             "|---|---:|---:|---:|---:|---:|"]
    for k in sorted(S):
        s = S[k]
        lines.append("| %s | %d | %.0f | %.2f | %.2f | %.0f |" % (
            {"vitc": "vitc train", "torch": "PyTorch + DataLoader"}.get(k[0], "vitc " + k[0]),
            k[1], s["ips"], s["loop_s"], s["wall_s"], s["mb"]))
    lines += ["", "- vitc (2 threads) vs PyTorch's best (%d thread(s)): **%.2f×** images/s in "
              "the loop, %.2f× end to end (wall), peak memory %.0f MB vs %.0f MB" % (
                  tthr, v["ips"] / tbest["ips"], tbest["wall_s"] / v["wall_s"], v["mb"],
                  tbest["mb"])]
    if ("mpi 2x1", 1) in S and ("mpi 1x2", 2) in S:
        a, b = S[("mpi 2x1", 1)], S[("mpi 1x2", 2)]
        lines.append("- MPI: 2 ranks × 1 thread %.0f images/s, 1 rank × 2 threads %.0f: "
                     "the ranks reach %.0f%% of the threaded run" % (
                         a["ips"], b["ips"], 100 * a["ips"] / b["ips"]))
    e90 = epochs_to(args.log90, 0.90)
    if e90:
        test_s = 10000 / (v["ips"] * 3)  # a test pass: forward only, ~1/3 of a step's work
        tv = e90 * (60000 / v["ips"] + test_s)
        tp = e90 * (60000 / tbest["ips"] + 10000 / (tbest["ips"] * 3))
        lines.append("- time to 90%% test accuracy (the recipe reaches it after %d epochs in "
                     "`%s`): vitc %.1f min, PyTorch %.1f min (each side's measured loop "
                     "throughput × %d epochs of 60,000 images, plus a test pass per epoch)" % (
                         e90, os.path.basename(args.log90), tv / 60, tp / 60, e90))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out + ".tmp", "w") as f:
        f.write(text)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
