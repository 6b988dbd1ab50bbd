"""Write the seed corpus of the Hub directory target, tests/fuzz/corpus/fuzz_hub/
(the input's layout: tests/fuzz/fuzz_hub.c).

    .venv/bin/python tests/fuzz/fuzz_hub_seeds.py

Run once; the outputs are committed. Each seed is a tiny model of a family
the loader reads, saved by transformers (random weights) and taken apart:
config.json, preprocessor_config.json and the safetensors header; one is
split into two shards with an index, a few are near misses.
"""
import json
import os
import shutil
import struct
import sys
import tempfile

import transformers as T

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus", "fuzz_hub")
TINY = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
            image_size=8, patch_size=4)
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def dumps(o):
    return json.dumps(o, separators=(",", ":"))


def seed(name, cfg, pp, hdr, index="", hdr2=""):
    parts = [cfg, pp, hdr if isinstance(hdr, str) else dumps(hdr), index,
             hdr2 if isinstance(hdr2, str) else dumps(hdr2)]
    while parts and not parts[-1]:
        parts.pop()
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(b"\0".join(p.encode() for p in parts))


def split(hdr):
    """The header's tensors in two shards (offsets from 0 in each) and
    the index naming them."""
    names = sorted(k for k in hdr if k != "__metadata__")
    halves, wmap = [{}, {}], {}
    for i, k in enumerate(names):
        h = halves[i % 2]
        at = max([v["data_offsets"][1] for v in h.values()] + [0])
        b, e = hdr[k]["data_offsets"]
        h[k] = dict(hdr[k], data_offsets=[at, at + e - b])
        wmap[k] = SHARDS[i % 2]
    return halves, dumps({"metadata": {"total_size": 0}, "weight_map": wmap})


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    tmp = tempfile.mkdtemp()
    models = {
        "vit_head": (T.ViTForImageClassification(T.ViTConfig(num_labels=3, **TINY)),
                     T.ViTImageProcessor(size={"height": 8, "width": 8})),
        "vit_gray": (T.ViTModel(T.ViTConfig(num_channels=1, **TINY)),
                     T.ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5],
                                         image_std=[0.5])),
        "deit": (T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(num_labels=2, **TINY)),
                 T.DeiTImageProcessor(size={"height": 9, "width": 9},
                                      crop_size={"height": 8, "width": 8})),
        "dinov2": (T.Dinov2Model(T.Dinov2Config(mlp_ratio=2, **{k: v for k, v in TINY.items()
                                                                if k != "intermediate_size"})),
                   T.BitImageProcessor(size={"shortest_edge": 8}, crop_size=8)),
        "dinov2_reg": (T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(
            mlp_ratio=2, num_register_tokens=2,
            **{k: v for k, v in TINY.items() if k != "intermediate_size"})),
            T.BitImageProcessor(size={"shortest_edge": 8}, crop_size=8)),
        "clip_vision": (T.CLIPVisionModelWithProjection(T.CLIPVisionConfig(projection_dim=4,
                                                                           **TINY)),
                        T.CLIPImageProcessor(size={"shortest_edge": 8}, crop_size=8)),
        "siglip": (T.SiglipVisionModel(T.SiglipVisionConfig(**TINY)),
                   T.SiglipImageProcessor(size={"height": 8, "width": 8})),
    }
    for name, (model, proc) in models.items():
        d = os.path.join(tmp, name)
        model.save_pretrained(d)
        proc.save_pretrained(d)
        cfg = open(os.path.join(d, "config.json")).read()
        pp = open(os.path.join(d, "preprocessor_config.json")).read()
        hdr = header(os.path.join(d, "model.safetensors"))
        seed(name, cfg, pp, hdr)
        if name == "vit_head":
            (h1, h2), index = split(hdr)
            seed("vit_sharded", cfg, pp, h1, index, h2)
            seed("vit_no_processor", cfg, "", hdr)
            c = json.loads(cfg)
            c["num_hidden_layers"] = 64
            seed("vit_deep_config", dumps(c), pp, hdr)
            c = json.loads(cfg)
            c["architectures"] = ["\u00c4" * 20]
            seed("vit_utf8_arch", dumps(c), pp, hdr)
            p = json.loads(pp)
            p["image_mean"], p["image_std"] = 0.5, [0.25]
            seed("vit_mean_broadcast", cfg, dumps(p), hdr)
            missing = {k: v for k, v in hdr.items() if "classifier" not in k}
            seed("vit_missing_head", cfg, pp, missing)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    T.logging.set_verbosity_error()
    sys.exit(main())
