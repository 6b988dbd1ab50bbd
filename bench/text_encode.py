"""Encoding prompts with CLIP ViT-B/16's text tower: vitc vs PyTorch eager
(transformers' CLIPModel.get_text_features) vs ONNX Runtime (the same
module exported with torch.onnx.export), the same weights (random, the
B/16 text config: width 512, 12 layers, 8 heads, context 77) and the same
padded ids (transformers' CLIPTokenizerFast over the real CLIP vocabulary,
rebuilt from open_clip's bpe_simple_vocab_16e6.txt.gz; each batch padded to
its longest prompt, padding=True) for every engine.

    .venv/bin/python bench/text_encode.py [--prompts 1000] [--batch 32]
        [--threads 2] [--rounds 5] [--out bench/results-text.md]

Each round encodes every prompt in batches; the median round per engine is
reported (ms per round, prompts/s) with the speed-up of vitc over each, as
JSON on stdout and a markdown row (appended to --out when given). The
features of the three engines are compared too (max|d| / max|ref|).
"""
import argparse
import atexit
import gzip
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

CLASSES = ["cat", "dog", "car", "truck", "airplane", "bird", "horse", "ship", "frog", "deer",
           "tree", "house", "bicycle", "guitar", "mountain", "river", "beach", "city street",
           "bowl of soup", "teapot", "violin", "lighthouse", "umbrella", "tiger", "penguin"]
TEMPLATES = ["a photo of a {}.", "a blurry photo of a {}.", "a close-up photo of the {}.",
             "a painting of a {}.", "a black and white photo of the {}.",
             "a photo of many {}.", "a sculpture of a {}.", "a rendering of the {}.",
             "graffiti of a {}.", "a cropped photo of a {} seen from far away on a sunny day."]


def prompts(n):
    out = []
    i = 0
    while len(out) < n:
        c = CLASSES[i % len(CLASSES)]
        t = TEMPLATES[(i // len(CLASSES)) % len(TEMPLATES)]
        extra = "" if i < len(CLASSES) * len(TEMPLATES) else " number %d" % i
        out.append(t.format(c + extra))
        i += 1
    return out


def clip_tokenizer():
    """CLIPTokenizerFast over the real vocabulary: the vocabulary and merges
    rebuilt from open_clip's bpe_simple_vocab_16e6.txt.gz (OpenAI's order)."""
    import open_clip
    from transformers import CLIPTokenizerFast
    from open_clip.tokenizer import bytes_to_unicode
    gz = os.path.join(os.path.dirname(open_clip.__file__), "bpe_simple_vocab_16e6.txt.gz")
    merges = gzip.open(gz).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab]
    vocab += ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    tok = CLIPTokenizerFast(vocab={v: i for i, v in enumerate(vocab)},
                            merges=[tuple(m.split()) for m in merges])
    tok.pad_token = "<|endoftext|>"  # openai/clip-vit-*'s pad token
    # the real vocabulary's ids (open_clip's tokenizer gives the same)
    assert tok("a photo of a cat.")["input_ids"] == [49406, 320, 1125, 539, 320, 2368, 269, 49407]
    return tok


def timed_interleaved(engines, batches, rounds):
    """Median ms per round of each engine, the engines taking turns round by
    round (A B C, A B C, ...), so that a slow minute of a shared machine
    hits every engine alike."""
    for fn in engines.values():
        fn(batches[0])  # warm-up
    times = {k: [] for k in engines}
    for _ in range(rounds):
        for k, fn in engines.items():
            t0 = time.perf_counter()
            for b in batches:
                fn(b)
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="append the markdown row to this file")
    ap.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    ap.add_argument("--json", help="write the result object to this file")
    a = ap.parse_args()

    import torch
    from transformers import CLIPConfig, CLIPModel
    import vitc

    torch.set_num_threads(a.threads)
    vitc.set_num_threads(a.threads)
    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="vitc_text_bench_")
    atexit.register(shutil.rmtree, tmp, True)  # the checkpoint and ONNX file: ~0.5 GB a run
    tok = clip_tokenizer()
    texts = prompts(a.prompts)
    # Each batch padded to its longest prompt (padding=True), as a
    # transformers user encodes: every engine gets the same ids, so none
    # computes more positions than another.
    batches = [tok(texts[i:i + a.batch], padding=True, max_length=77, truncation=True,
                   return_tensors="np")["input_ids"].astype(np.int32)
               for i in range(0, len(texts), a.batch)]

    text_cfg = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                    num_attention_heads=8, max_position_embeddings=77, hidden_act="quick_gelu")
    vision_cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=2, image_size=32, patch_size=16)
    ref = CLIPModel(CLIPConfig(text_config=text_cfg, vision_config=vision_cfg,
                               projection_dim=512)).eval()
    mdir = os.path.join(tmp, "clip")
    ref.save_pretrained(mdir)
    m = vitc.load_model(mdir)

    def run_vitc(b):
        return m.encode_text(b)

    def run_torch(b):
        with torch.inference_mode():
            out = ref.get_text_features(input_ids=torch.from_numpy(b).long())
        return getattr(out, "pooler_output", out).numpy()

    res = {"prompts": a.prompts, "batch": a.batch, "threads": a.threads, "rounds": a.rounds,
           "cpu": platform.processor() or platform.machine(), "median_ms": {}, "max_rel_diff": {}}
    ref_feats = np.concatenate([run_torch(b) for b in batches])
    vitc_feats = np.concatenate([run_vitc(b) for b in batches])
    res["max_rel_diff"]["vitc_vs_torch"] = float(np.abs(vitc_feats - ref_feats).max() /
                                                 np.abs(ref_feats).max())
    engines = {"vitc": run_vitc, "torch": run_torch}
    if not a.no_ort:
        import onnxruntime as ort

        class TextFeatures(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.m = model

            def forward(self, input_ids):
                out = self.m.get_text_features(input_ids=input_ids)
                return getattr(out, "pooler_output", out)

        onnx_path = os.path.join(tmp, "text.onnx")
        torch.onnx.export(TextFeatures(ref), (torch.from_numpy(batches[0]).long(),), onnx_path,
                          input_names=["input_ids"], output_names=["text_embeds"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "length"},
                                        "text_embeds": {0: "batch"}},
                          opset_version=17, dynamo=False)
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])

        def run_ort(b):
            return sess.run(None, {"input_ids": b.astype(np.int64)})[0]

        ort_feats = np.concatenate([run_ort(b) for b in batches])
        res["max_rel_diff"]["ort_vs_torch"] = float(np.abs(ort_feats - ref_feats).max() /
                                                    np.abs(ref_feats).max())
        engines["ort"] = run_ort
    res["median_ms"] = timed_interleaved(engines, batches, a.rounds)
    ms = res["median_ms"]
    # The work every engine does on these ids: the blocks' four Linear
    # layers over every position (attention's scores are under 1% here).
    C, M, layers = text_cfg["hidden_size"], text_cfg["intermediate_size"], \
        text_cfg["num_hidden_layers"]
    res["positions"] = int(sum(b.size for b in batches))
    res["layers"] = layers
    res["gflop"] = res["positions"] * 2.0 * layers * (4 * C * C + 2 * C * M) / 1e9
    res["speedup_vs_torch"] = ms["torch"] / ms["vitc"]
    if "ort" in ms:
        res["speedup_vs_ort"] = ms["ort"] / ms["vitc"]
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    row = "| CLIP B/16 text, %d prompts, batch %d, %d threads | %.0f | %.0f | %s | %.2fx | %s |" % (
        a.prompts, a.batch, a.threads, ms["vitc"], ms["torch"],
        "%.0f" % ms["ort"] if "ort" in ms else "-", res["speedup_vs_torch"],
        "%.2fx" % res["speedup_vs_ort"] if "ort" in ms else "-")
    header = ("| workload | vitc ms | torch eager ms | ONNX Runtime ms | vs torch | vs ORT |\n"
              "|---|---|---|---|---|---|")
    print(header + "\n" + row)
    if a.out:
        new = not os.path.exists(a.out)
        with open(a.out, "a") as f:
            f.write((header + "\n" if new else "") + row + "\n")


if __name__ == "__main__":
    main()
