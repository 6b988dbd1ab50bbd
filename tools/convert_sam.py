#!/usr/bin/env python3
"""Convert an original Segment Anything checkpoint (sam_vit_b/l/h_*.pth) into
a transformers SamModel directory that vitc_sam_load (and SamModel) read.

    convert_sam.py SRC.pth OUT_DIR [--trust-pickle]

OUT_DIR receives config.json (model_type "sam": the vision config read from
the tensors' shapes, the prompt encoder's and mask decoder's transformers
defaults, which are the released models') and model.safetensors in
transformers' names (the renaming of transformers' convert_sam_to_hf.py).
Both are written into a temporary directory beside OUT_DIR, which then
takes OUT_DIR's place: a failed conversion leaves nothing half written.

Uses only torch and numpy (the writer is tools/export_safetensors.py's).
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_safetensors import load_checkpoint, write_safetensors  # noqa: E402

# Substrings replaced in order, as transformers' converter does.
RENAMES = [
    ("iou_prediction_head.layers.0", "iou_prediction_head.proj_in"),
    ("iou_prediction_head.layers.1", "iou_prediction_head.layers.0"),
    ("iou_prediction_head.layers.2", "iou_prediction_head.proj_out"),
    ("mask_decoder.output_upscaling.0", "mask_decoder.upscale_conv1"),
    ("mask_decoder.output_upscaling.1", "mask_decoder.upscale_layer_norm"),
    ("mask_decoder.output_upscaling.3", "mask_decoder.upscale_conv2"),
    ("mask_downscaling.0", "mask_embed.conv1"),
    ("mask_downscaling.1", "mask_embed.layer_norm1"),
    ("mask_downscaling.3", "mask_embed.conv2"),
    ("mask_downscaling.4", "mask_embed.layer_norm2"),
    ("mask_downscaling.6", "mask_embed.conv3"),
    ("point_embeddings", "point_embed"),
    ("pe_layer.positional_encoding_gaussian_matrix", "shared_embedding.positional_embedding"),
    ("image_encoder", "vision_encoder"),
    ("neck.0", "neck.conv1"),
    ("neck.1", "neck.layer_norm1"),
    ("neck.2", "neck.conv2"),
    ("neck.3", "neck.layer_norm2"),
    ("patch_embed.proj", "patch_embed.projection"),
    (".norm", ".layer_norm"),
    ("blocks", "layers"),
]
HYPER = re.compile(r".*\.output_hypernetworks_mlps\.(\d+)\.layers\.(\d+).*")
HYPER_LAYERS = {0: ("layers.0", "proj_in"), 1: ("layers.1", "layers.0"), 2: ("layers.2", "proj_out")}


def fail(msg):
    sys.stderr.write("convert_sam.py: %s\n" % msg)
    sys.exit(1)


def rename(sd):
    out = {}
    for key, value in sd.items():
        if key in ("pixel_mean", "pixel_std"):  # SamProcessor normalises instead
            continue
        for old, new in RENAMES:
            if old in key:
                key = key.replace(old, new)
        m = HYPER.match(key)
        if m:
            old, new = HYPER_LAYERS[int(m.group(2))]
            key = key.replace(old, new)
        out[key] = value.detach().to(torch.float32).contiguous()
    pe = "prompt_encoder.shared_embedding.positional_embedding"
    if pe not in out:
        fail("no prompt_encoder.pe_layer.positional_encoding_gaussian_matrix: not a Segment "
             "Anything checkpoint")
    out["shared_image_embedding.positional_embedding"] = out[pe].clone()
    return out


def vision_config(sd):
    """The encoder's structure from its tensors (sam_vit_b/l/h differ in width,
    depth, heads and where the global blocks are)."""
    need = "vision_encoder.patch_embed.projection.weight"
    if need not in sd:
        fail("no image_encoder.patch_embed.proj.weight: not a Segment Anything checkpoint")
    C, _, P, _ = sd[need].shape
    depth = 0
    while "vision_encoder.layers.%d.attn.qkv.weight" % depth in sd:
        depth += 1
    if depth == 0:
        fail("no image_encoder.blocks.0: not a Segment Anything checkpoint")
    pos = sd.get("vision_encoder.pos_embed")
    grid = pos.shape[1] if pos is not None else 64
    rel = [sd.get("vision_encoder.layers.%d.attn.rel_pos_h" % i) for i in range(depth)]
    use_rel = rel[0] is not None
    if use_rel:
        head_dim = rel[0].shape[1]
        sizes = [(r.shape[0] + 1) // 2 for r in rel]
        glob = [i for i, s in enumerate(sizes) if s == grid]
        win = [s for s in sizes if s != grid]
        window = win[0] if win else 0
    else:  # nothing in the tensors says: the released models' choices
        head_dim, glob, window = 64, [], 14
    return {
        "hidden_size": int(C), "num_hidden_layers": depth,
        "num_attention_heads": int(C // head_dim), "patch_size": int(P),
        "image_size": int(grid * P), "window_size": int(window),
        "global_attn_indexes": glob, "use_rel_pos": use_rel, "use_abs_pos": pos is not None,
        "qkv_bias": "vision_encoder.layers.0.attn.qkv.bias" in sd,
        "mlp_dim": int(sd["vision_encoder.layers.0.mlp.lin1.weight"].shape[0]),
        "output_channels": int(sd["vision_encoder.neck.conv1.weight"].shape[0]),
        "layer_norm_eps": 1e-6, "hidden_act": "gelu",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="the original checkpoint (sam_vit_*.pth)")
    ap.add_argument("out_dir", help="the SamModel directory to write")
    ap.add_argument("--trust-pickle", action="store_true",
                    help="also unpickle Python objects (runs code from the file)")
    a = ap.parse_args()
    try:
        obj = load_checkpoint(a.src, a.trust_pickle)
    except ValueError as e:
        fail(str(e))
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        fail("%s: not a state dict of tensors" % a.src)
    sd = rename(obj)
    config = {"architectures": ["SamModel"], "model_type": "sam",
              "vision_config": vision_config(sd), "prompt_encoder_config": {},
              "mask_decoder_config": {}}
    out = os.path.abspath(a.out_dir.rstrip("/") or "/")
    if os.path.exists(out) and not os.path.isdir(out):
        fail("%s exists and is not a directory; not replacing it" % a.out_dir)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".tmp", dir=os.path.dirname(out))
    try:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        write_safetensors(os.path.join(tmp, "model.safetensors"), sd, {"format": "pt"}, "f32")
        old = None
        if os.path.exists(out):  # the old directory goes only once the new one is whole
            old = tempfile.mkdtemp(prefix=os.path.basename(out) + ".old", dir=os.path.dirname(out))
            os.rename(out, os.path.join(old, "d"))
        os.rename(tmp, out)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print("%s: %d tensors, %d blocks of width %d" % (
        a.out_dir, len(sd), config["vision_config"]["num_hidden_layers"],
        config["vision_config"]["hidden_size"]))


if __name__ == "__main__":
    main()
