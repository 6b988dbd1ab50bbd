#!/usr/bin/env python3
"""Convert an official T2T-ViT checkpoint (yitu-opensource/T2T-ViT) to safetensors for vitc.

    convert_t2t.py T2T_ViT_14.pth.tar OUT.safetensors [--arch t2t_vit_14] [options]

The checkpoint is what the original train.py saves ({"state_dict_ema": ...}
or {"state_dict": ...}, "module." prefixes stripped) or a bare state dict.
The state_dict_ema weights are taken when present (the released files'
best), else state_dict; --weights picks. Tensors keep their names
(tokens_to_token.attention1..., blocks.N..., pos_embed, norm, head).

__metadata__["vitc.config"] holds T2T_ViT's constructor arguments:
{"arch": "t2t_vit", "tokens_type", "img_size", "in_chans", "embed_dim",
"depth", "num_heads", "mlp_ratio", "qkv_bias", "qk_scale", "token_dim",
"num_classes"}. The structure comes from the tensors; num_heads and
qk_scale from --arch (the registry's preset, with the qk_scale =
embed_dim ** -0.5 its pretrained weights were trained with), else from
the preset whose shapes these are, else --num-heads / --qk-scale.

Uses only torch and numpy (the writer is tools/export_safetensors.py's).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_safetensors import load_checkpoint, write_safetensors  # noqa: E402

# models/t2t_vit.py's registry: tokens_type, embed_dim, depth, num_heads,
# mlp_ratio, the dim of the qk_scale its pretrained weights use.
PRESETS = {
    "t2t_vit_7": ("performer", 256, 7, 4, 2.0, 256),
    "t2t_vit_10": ("performer", 256, 10, 4, 2.0, 256),
    "t2t_vit_12": ("performer", 256, 12, 4, 2.0, 256),
    "t2t_vit_14": ("performer", 384, 14, 6, 3.0, 384),
    "t2t_vit_19": ("performer", 448, 19, 7, 3.0, 448),
    "t2t_vit_24": ("performer", 512, 24, 8, 3.0, 512),
    "t2t_vit_t_14": ("transformer", 384, 14, 6, 3.0, 384),
    "t2t_vit_t_19": ("transformer", 448, 19, 7, 3.0, 448),
    "t2t_vit_t_24": ("transformer", 512, 24, 8, 3.0, 512),
    "t2t_vit_14_resnext": ("performer", 384, 14, 32, 3.0, 384),
    "t2t_vit_14_wide": ("performer", 768, 4, 12, 3.0, 512),
}


def fail(msg):
    print("convert_t2t: error: " + msg, file=sys.stderr)
    sys.exit(1)


def state_dict(obj, which):
    """The flat name -> tensor dict of a train.py checkpoint or a bare one."""
    if isinstance(obj, dict):
        keys = [which] if which else ["state_dict_ema", "state_dict", "model"]
        for k in keys:
            inner = obj.get(k)
            if isinstance(inner, dict) and any(torch.is_tensor(v) for v in inner.values()):
                obj = inner
                break
        else:
            if which:
                fail("the checkpoint has no %r state dict (keys: %s)" % (which, ", ".join(map(str, obj))))
    if not isinstance(obj, dict) or not any(torch.is_tensor(v) for v in obj.values()):
        fail("the checkpoint is not a state dict (got %s)" % type(obj).__name__)
    out = {}
    for k, v in obj.items():
        if torch.is_tensor(v):
            out[k[7:] if k.startswith("module.") else k] = v
    return out


def shape(sd, name, ndim):
    t = sd.get(name)
    if t is None or t.dim() != ndim:
        fail("missing or malformed tensor %s (is this a T2T-ViT checkpoint?)" % name)
    return list(t.shape)


def config(sd, args):
    if "tokens_to_token.attention1.w" in sd:
        tokens_type = "performer"
    elif "tokens_to_token.attention1.attn.qkv.weight" in sd:
        tokens_type = "transformer"
    else:
        fail("missing tensor tokens_to_token.attention1.w (performer) or "
             "tokens_to_token.attention1.attn.qkv.weight (transformer): not a T2T-ViT checkpoint "
             "(the 'convolution' tokens_type is not supported)")
    E, T9 = shape(sd, "tokens_to_token.project.weight", 2)
    if T9 % 9:
        fail("tokens_to_token.project.weight: %d columns is not 9 * token_dim" % T9)
    dim0 = shape(sd, "tokens_to_token.attention1.norm1.weight", 1)[0]
    n = shape(sd, "pos_embed", 3)[1] - 1
    g = int(round(n ** 0.5))
    if g * g != n:
        fail("pos_embed has %d patch rows, not a square grid" % n)
    depth = 0
    while "blocks.%d.attn.qkv.weight" % depth in sd:
        depth += 1
    M = shape(sd, "blocks.0.mlp.fc1.weight", 2)[0]
    ratio = M / E
    if int(E * ratio) != M:
        fail("mlp hidden size %d is not int(embed_dim * ratio) for any ratio vitc can store" % M)
    c = {"arch": "t2t_vit", "tokens_type": tokens_type, "img_size": args.img_size or 16 * g,
         "in_chans": dim0 // 49, "embed_dim": E, "depth": depth, "num_heads": None,
         "mlp_ratio": ratio, "qkv_bias": "blocks.0.attn.qkv.bias" in sd, "qk_scale": None,
         "token_dim": T9 // 9, "num_classes": shape(sd, "head.weight", 2)[0] if "head.weight" in sd else 0}
    preset = None
    if args.arch:
        if args.arch not in PRESETS:
            fail("unknown --arch %s (known: %s)" % (args.arch, ", ".join(PRESETS)))
        preset = PRESETS[args.arch]
        want = (preset[0], preset[1], preset[2], int(preset[1] * preset[4]))
        have = (tokens_type, E, depth, M)
        if want != have:
            fail("--arch %s is %s, embed_dim %d, depth %d, mlp %d; the checkpoint has %s, %d, %d, %d"
                 % ((args.arch,) + want + have))
    else:
        for p in PRESETS.values():
            if (p[0], p[1], p[2], int(p[1] * p[4])) == (tokens_type, E, depth, M):
                preset = p
                break
    if preset:
        c["num_heads"], c["qk_scale"] = preset[3], preset[5] ** -0.5
    if args.num_heads:
        c["num_heads"] = args.num_heads
    if args.qk_scale is not None:
        c["qk_scale"] = args.qk_scale if args.qk_scale > 0 else None
    if not c["num_heads"]:
        fail("these shapes are no preset's: give --num-heads (and --qk-scale if the model "
             "was built with one)")
    if E % c["num_heads"]:
        fail("embed_dim %d is not divisible by --num-heads %d" % (E, c["num_heads"]))
    return c


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("checkpoint", help="T2T-ViT .pth.tar (or a bare state dict)")
    ap.add_argument("out", help="OUT.safetensors")
    ap.add_argument("--arch", help="the registry's name: " + ", ".join(PRESETS))
    ap.add_argument("--weights", choices=["state_dict_ema", "state_dict"],
                    help="which of train.py's state dicts (default: state_dict_ema if present)")
    ap.add_argument("--img-size", type=int, help="img_size (default: from pos_embed)")
    ap.add_argument("--num-heads", type=int, help="num_heads when no preset fits")
    ap.add_argument("--qk-scale", type=float,
                    help="the blocks' qk_scale (0: None, head_dim ** -0.5)")
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    ap.add_argument("--trust-pickle", action="store_true",
                    help="unpickle Python objects too (train.py's saved args); can run code from the file")
    args = ap.parse_args(argv)
    try:
        obj = load_checkpoint(args.checkpoint, args.trust_pickle)
    except ValueError as e:
        fail(str(e))
    sd = state_dict(obj, args.weights)
    cfg = config(sd, args)
    write_safetensors(args.out, sd, {"vitc.config": json.dumps(cfg)}, args.dtype)
    print("%s: %s, %d tensors (%s)" % (args.out, json.dumps(cfg), len(sd), args.dtype))


if __name__ == "__main__":
    main()
