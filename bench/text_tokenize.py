"""CLIP tokenizing speed, one thread: vitc.Tokenizer against transformers'
Rust fast tokenizer on the same tokenizer.json (built from open_clip's
vocabulary, as tests/python/test_tokenizer_clip.py builds it).

    .venv/bin/python bench/text_tokenize.py [--n 10000] [--rounds 5] [--out F.json]

Rows (all produce the padded [N, 77] ids, truncated at 77):
  vitc_loop      a Python loop of vitc.Tokenizer.encode (ctypes per string)
  rust_batch     backend_tokenizer.encode_batch, RAYON_NUM_THREADS=1 and
                 TOKENIZERS_PARALLELISM=false (padding and truncation set in Rust)
  hf_call        tok(texts, padding="max_length", max_length=77, truncation=True),
                 the call users write (the same Rust code plus transformers' Python)
Prints a JSON object with the median seconds of each row and prompts/s.
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import vitc  # noqa: E402
from open_clip.tokenizer import bytes_to_unicode, default_bpe  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

WORDS = ("a photo of the cat dog fox bird car house tree person man woman child red blue green "
         "small large old new bright dark picture image painting drawing sketch close-up view "
         "street city beach mountain river sunset night morning snow rain people two three "
         "playing running sitting standing on in at with and near under over beside").split()


def captions(n):
    rnd = random.Random(12345)
    out = []
    for _ in range(n):
        words = [rnd.choice(WORDS) for _ in range(rnd.randint(4, 24))]
        if rnd.random() < 0.3:
            words.insert(0, str(rnd.randint(2, 99)))
        out.append(" ".join(words).capitalize() + rnd.choice([".", "", "!", ", in 4k."]))
    return out


def build_hf(dirname):
    lines = gzip.open(default_bpe()).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    merges = [tuple(m.split()) for m in lines]
    vocab = list(bytes_to_unicode().values())
    vocab += [v + "</w>" for v in vocab] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    vm = os.path.join(dirname, "vm")
    os.makedirs(vm)
    with open(os.path.join(vm, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({v: i for i, v in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(vm, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    with open(os.path.join(vm, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "CLIPTokenizer", "model_max_length": 77}, f)
    hf = os.path.join(dirname, "hf")
    AutoTokenizer.from_pretrained(vm).save_pretrained(hf)
    return hf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    texts = captions(a.n)
    with tempfile.TemporaryDirectory() as tmp:
        hf = build_hf(tmp)
        ref = AutoTokenizer.from_pretrained(hf)
        ours = vitc.Tokenizer(hf)
    bt = ref.backend_tokenizer
    bt.enable_truncation(77)
    bt.enable_padding(length=77, pad_id=ref.pad_token_id, pad_token=ref.pad_token)

    def vitc_loop():
        for t in texts:
            ours.encode(t)

    def rust_batch():
        bt.encode_batch(texts)

    def hf_call():
        ref(texts, padding="max_length", max_length=77, truncation=True)

    rows = {"vitc_loop": vitc_loop, "rust_batch": rust_batch, "hf_call": hf_call}
    times = {k: [] for k in rows}
    for _ in range(a.rounds):  # interleaved, so drift hits every row alike
        for k, fn in rows.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    res = {"n": a.n, "rounds": a.rounds, "threads": 1, "cpu": platform.processor() or platform.machine(),
           "median_s": {k: round(statistics.median(v), 4) for k, v in times.items()}}
    res["prompts_per_s"] = {k: round(a.n / v, 1) for k, v in res["median_s"].items()}
    res["vitc_speedup_vs_rust_batch"] = round(res["median_s"]["rust_batch"] /
                                              res["median_s"]["vitc_loop"], 2)
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
