"""The text side of `make bench`: CLIP's text tower, its tokenizer and
zero-shot's class-embedding cache, vitc beside the peers in one run, with
the CPU's fp32 FMA peak measured in the same run. Writes
bench/results-text.md (and .json).

    .venv/bin/python bench/text.py [--threads 2] [--prompts 1000] [--rounds 3]
        [--out bench/results-text.md]

Rows:
  encode    1,000 prompts at batch 32 through CLIP ViT-B/16's text tower
            (random weights, width 512, 12 layers; the real CLIP vocabulary):
            vitc vs torch eager (transformers) vs ONNX Runtime
            (bench/text_encode.py; every batch padded to its longest prompt
            for every engine)
  tokenize  10,000 captions, one thread: vitc vs transformers' Rust fast
            tokenizer (bench/text_tokenize.py)
  zero-shot `vitc zero-shot` on one photo with 100 labels x 80 templates
            (8,000 prompts, CLIP B/16 both towers): the first call, and the
            second, which finds the class embeddings in the cache
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

import text_encode  # noqa: E402


def cpu_name():
    import peers
    return peers.cpu_model()


def run(argv, env=None, timeout=1800):
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit("bench/text.py: %s failed (exit %d)" % (argv[:3], r.returncode))
    return r


def peak(vitc, threads):
    env = dict(os.environ, VITC_NUM_THREADS=str(threads))
    r = run([vitc, "bench", "--peak-only", "--json", "--threads", str(threads)], env=env)
    return json.loads(r.stdout)["fma_peak"]


def zero_shot_rows(vitc, threads, tmp, n_labels):
    """CLIP B/16 with both towers and the real vocabulary; 100 labels x 80
    templates on one photo, twice, with a cache folder of its own."""
    import numpy as np
    import torch
    from skimage import data
    from PIL import Image
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    cfg = CLIPConfig(
        text_config=dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=8, max_position_embeddings=77,
                         hidden_act="quick_gelu"),
        vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                           num_attention_heads=12, image_size=224, patch_size=16,
                           hidden_act="quick_gelu"),
        projection_dim=512)
    mdir = os.path.join(tmp, "clip-b16")
    CLIPModel(cfg).eval().save_pretrained(mdir)
    text_encode.clip_tokenizer().save_pretrained(mdir)
    photo = os.path.join(tmp, "coffee.png")
    Image.fromarray(np.asarray(data.coffee())).save(photo)
    labels = os.path.join(tmp, "labels.txt")
    with open(labels, "w") as f:
        for i in range(n_labels):
            f.write("object number %d\n" % i)
    cache = os.path.join(tmp, "cache")
    argv = [vitc, "zero-shot", "--model", mdir, "--labels-file", labels, "--templates",
            "imagenet80", "--threads", str(threads), "--cache", cache, "--verbose", photo]
    out = {}
    for name in ("first", "second"):
        t0 = time.perf_counter()
        r = run(argv)
        out[name + "_s"] = time.perf_counter() - t0
        out[name + "_log"] = [l for l in r.stderr.splitlines() if "class embeddings" in l]
    return out


def versions():
    import importlib.metadata as md
    v = {}
    for p in ("torch", "transformers", "onnxruntime", "tokenizers", "open_clip_torch"):
        try:
            v[p] = md.version(p)
        except md.PackageNotFoundError:
            v[p] = None
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--labels", type=int, default=100, help="zero-shot labels (x 80 templates)")
    ap.add_argument("--vitc", default=os.path.join(ROOT, "build", "vitc"))
    ap.add_argument("--out", default=os.path.join(HERE, "results-text.md"))
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t_start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="vitc_bench_text_")
    try:
        res = {"cpu": cpu_name(), "cores": len(os.sched_getaffinity(0)),
               "vitc": run([a.vitc, "--version"]).stdout.strip().splitlines()[0],
               "versions": versions(), "threads": a.threads, "started": started}
        res["peak_before"] = peak(a.vitc, a.threads)
        enc = os.path.join(tmp, "encode.json")
        run([sys.executable, os.path.join(HERE, "text_encode.py"), "--prompts", str(a.prompts),
             "--batch", "32", "--threads", str(a.threads), "--rounds", str(a.rounds),
             "--json", enc])
        with open(enc) as f:
            res["encode"] = json.load(f)
        tokj = os.path.join(tmp, "tokenize.json")
        run([sys.executable, os.path.join(HERE, "text_tokenize.py"), "--n", "10000",
             "--rounds", "5", "--out", tokj])
        with open(tokj) as f:
            res["tokenize"] = json.load(f)
        res["zero_shot"] = zero_shot_rows(a.vitc, a.threads, tmp, a.labels)
        res["zero_shot"]["labels"] = a.labels
        res["peak_after"] = peak(a.vitc, a.threads)
        res["elapsed_s"] = time.perf_counter() - t_start
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump(res, f, indent=1)
    with open(a.out, "w") as f:
        f.write(render(res, a))
    print(render(res, a))


def render(r, a):
    e, t, z = r["encode"], r["tokenize"], r["zero_shot"]
    ms = e["median_ms"]
    pk = max(r["peak_before"]["gflops_all_threads"], r["peak_after"]["gflops_all_threads"])
    p1 = max(r["peak_before"]["gflops_1_thread"], r["peak_after"]["gflops_1_thread"])
    v = r["versions"]
    L = ["# Text towers and tokenizers: vitc beside the peers", "",
         "`make bench` (bench/text.py), %s, %.0f s. CPU: **%s**, %d cores; %d threads per engine."
         % (r["started"], r["elapsed_s"], r["cpu"], r["cores"], r["threads"]),
         "Measured fp32 FMA peak in the same run (`vitc bench --peak-only`, best of before and "
         "after): %.1f GFLOP/s on 1 core, %.1f on %d threads." % (p1, pk, r["threads"]),
         "%s; torch %s, transformers %s, ONNX Runtime %s, tokenizers %s." % (
             r["vitc"], v["torch"], v["transformers"], v["onnxruntime"], v["tokenizers"]), "",
         "## Encoding prompts (CLIP ViT-B/16 text tower, random weights, real vocabulary)", "",
         "%d prompts at batch %d, every batch padded to its longest prompt for every engine; "
         "median of %d rounds, the engines taking turns. Features agree: vitc vs torch "
         "max|d|/max|ref| = %.1e%s." % (
             e["prompts"], e["batch"], e["rounds"], e["max_rel_diff"]["vitc_vs_torch"],
             ", ORT vs torch %.1e" % e["max_rel_diff"]["ort_vs_torch"]
             if "ort_vs_torch" in e["max_rel_diff"] else ""), "",
         "| engine | ms for the %d prompts | prompts/s | %% of fp32 peak | vitc speed-up |"
         % e["prompts"], "|---|---:|---:|---:|---:|"]
    frac = {k: e["gflop"] / (t_ms / 1e3) / pk for k, t_ms in ms.items()}
    for k, name in (("vitc", "vitc"), ("torch", "PyTorch %s eager" % v["torch"]),
                    ("ort", "ONNX Runtime %s" % v["onnxruntime"])):
        if k in ms:
            L.append("| %s | %.0f | %.0f | %.0f%% | %s |" % (
                name, ms[k], e["prompts"] / ms[k] * 1e3, 100 * frac[k],
                "-" if k == "vitc" else "%.2fx" % (ms[k] / ms["vitc"])))
    # vitc's least work: the last block's queries and MLP on the pooled rows
    # alone (3/8 of that block: the qkv GEMM still runs over every row).
    least = (e["layers"] - 1 + 3.0 / 8) / e["layers"]
    L += ["", "%% of peak: the %.0f GFLOP of the blocks' Linear layers over the %d padded "
          "positions (what every engine computes; vitc skips most of the last block for the "
          "non-pooled rows, %.1f%% less), over the measured %d-thread peak. Bound: at 100%% of "
          "the peak, with that least work, vitc would take %.0f ms, %.2fx PyTorch eager's "
          "measured time and %.2fx ONNX Runtime's." % (
              e["gflop"], e["positions"], 100 * (1 - least), r["threads"],
              e["gflop"] * least / pk * 1e3, ms["torch"] / (e["gflop"] * least / pk * 1e3),
              ms["ort"] / (e["gflop"] * least / pk * 1e3) if "ort" in ms else float("nan"))]
    names = {"vitc_loop": "vitc (a Python loop of Tokenizer.encode: one ctypes call per prompt)",
             "rust_batch": "tokenizers %s Rust encode_batch, RAYON_NUM_THREADS=1" % v["tokenizers"],
             "hf_call": "transformers tok(texts, padding=\"max_length\", truncation=True)"}
    L += ["", "## Tokenizing (one thread, %d captions, padded [N, 77] ids)" % t["n"], "",
          "| tokenizer | prompts/s | vitc speed-up |", "|---|---:|---:|"]
    for k, per_s in t["prompts_per_s"].items():
        L.append("| %s | %.0f | %s |" % (names.get(k, k), per_s, "-" if k == "vitc_loop" else
                                         "%.2fx" % (t["prompts_per_s"]["vitc_loop"] / per_s)))
    L += ["",
          "## Zero-shot: %d labels x 80 templates (%d prompts), one photo, CLIP B/16" % (
              z["labels"], 80 * z["labels"]), "",
          "| call | seconds (wall, whole command) | class embeddings |", "|---|---:|---|",
          "| first | %.2f | %s |" % (z["first_s"], "; ".join(z["first_log"]) or "-"),
          "| second | %.2f | %s |" % (z["second_s"], "; ".join(z["second_log"]) or "-"), "",
          "Rerun: `make bench-text` (or `make bench`)."]
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
