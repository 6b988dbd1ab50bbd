#!/usr/bin/env python3
"""Export a torchvision or timm Vision Transformer to safetensors for vitc.

    export_safetensors.py CHECKPOINT.pth OUT.safetensors [options]
    export_safetensors.py --torchvision vit_b_16 OUT.safetensors [--random-init --seed S]

CHECKPOINT is a state_dict (also one wrapped as {"model": ...} or
{"state_dict": ...}, "module." prefixes stripped) or a pickled nn.Module,
torchvision- or timm-named. The tensors keep their names; the architecture
goes into __metadata__["vitc.config"] as JSON (image_size, patch_size,
in_channels, hidden_dim, depth, num_heads, mlp_dim, num_classes, norm_eps,
mean, std, labels), so vitc needs no --arch to load the file.

Labels: a torchvision-named checkpoint with 1000 classes, and every
--torchvision export (--random-init too), get torchvision's ImageNet-1k
category names, which torchvision ships offline; --labels FILE replaces
them, --labels imagenet asks for them (a timm ImageNet model), --labels
none writes none.

Uses only torch and numpy (the file format is written here, no safetensors
package).
"""
import argparse
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np
import torch

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]

# name: (timm, patch, hidden, depth, heads, mlp), as in src/models/vit_load.c
PRESETS = {
    "vit_b_16": (False, 16, 768, 12, 12, 3072),
    "vit_b_32": (False, 32, 768, 12, 12, 3072),
    "vit_l_16": (False, 16, 1024, 24, 16, 4096),
    "vit_l_32": (False, 32, 1024, 24, 16, 4096),
    "vit_h_14": (False, 14, 1280, 32, 16, 5120),
    "vit_tiny_patch16_224": (True, 16, 192, 12, 3, 768),
    "vit_small_patch16_224": (True, 16, 384, 12, 6, 1536),
    "vit_base_patch16_224": (True, 16, 768, 12, 12, 3072),
}

TV = {"cls": "class_token", "conv": "conv_proj.weight", "pos": "encoder.pos_embedding",
      "head": "heads.head.weight", "qkv": "encoder.layers.encoder_layer_{}.self_attention.in_proj_weight",
      "fc1": ["encoder.layers.encoder_layer_0.mlp.0.weight",
              "encoder.layers.encoder_layer_0.mlp.linear_1.weight"]}
TIMM = {"cls": "cls_token", "conv": "patch_embed.proj.weight", "pos": "pos_embed",
        "head": "head.weight", "qkv": "blocks.{}.attn.qkv.weight",
        "fc1": ["blocks.0.mlp.fc1.weight"]}


def imagenet_categories(arch="vit_b_16"):
    import torchvision
    return list(torchvision.models.get_model_weights(arch).DEFAULT.meta["categories"])


def fail(msg):
    print("export_safetensors: error: " + msg, file=sys.stderr)
    sys.exit(1)


def load_checkpoint(path, trust_pickle=False):
    """torch.load as torch 2.6+ does it by default (weights_only: tensors and
    plain containers, no code run); trust_pickle=True also unpickles whole
    modules and other Python objects, which can run code. ValueError with a
    one-line message when the file cannot be read."""
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except Exception as e:  # unpickling errors come in many types
        msg = str(e).split("\n")[0].strip()
        if not trust_pickle and "Weights only load failed" in str(e):
            raise ValueError("cannot read %s without running code from it: it holds pickled Python "
                             "objects (a whole model or training state, not only tensors). If you "
                             "trust the file, rerun with --trust-pickle; or save model.state_dict() "
                             "instead" % path) from None
        raise ValueError("cannot read %s: %s" % (path, msg)) from None


def _tensor_dict(obj):
    """A flat name -> tensor dict from whatever torch.load returned."""
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict()
    if isinstance(obj, dict):
        for key in ("model", "state_dict", "model_state", "module"):
            inner = obj.get(key)
            if isinstance(inner, torch.nn.Module):
                return inner.state_dict()
            if isinstance(inner, dict) and any(torch.is_tensor(v) for v in inner.values()):
                return inner
        if any(torch.is_tensor(v) for v in obj.values()):
            return obj
    fail("the checkpoint is neither a state_dict nor an nn.Module (got %s)" % type(obj).__name__)


def module_hints(obj):
    """num_heads, image_size, mean, std a pickled module knows about."""
    hints = {}
    m = obj if isinstance(obj, torch.nn.Module) else None
    if m is None and isinstance(obj, dict):
        m = next((v for v in obj.values() if isinstance(v, torch.nn.Module)), None)
    if m is None:
        return hints
    if hasattr(m, "image_size"):  # torchvision
        hints["image_size"] = int(m.image_size)
    for sub in m.modules():
        if hasattr(sub, "num_heads"):  # torchvision EncoderBlock, timm Attention
            hints["num_heads"] = int(sub.num_heads)
            break
    cfg = getattr(m, "pretrained_cfg", None) or getattr(m, "default_cfg", None)
    if isinstance(cfg, dict):  # timm
        if "mean" in cfg and "std" in cfg:
            hints["mean"], hints["std"] = list(cfg["mean"]), list(cfg["std"])
        if "input_size" in cfg:
            hints["image_size"] = int(cfg["input_size"][-1])
    return hints


def infer_config(sd, hints, args):
    names = TIMM if ("cls_token" in sd or "patch_embed.proj.weight" in sd) else TV
    if names["cls"] not in sd or names["conv"] not in sd or names["pos"] not in sd:
        fail("no Vision Transformer here: expected %s, %s and %s (torchvision or timm names)"
             % (names["cls"], names["conv"], names["pos"]))
    conv = sd[names["conv"]].shape
    hidden, in_ch, patch = int(conv[0]), int(conv[1]), int(conv[2])
    g = math.isqrt(int(sd[names["pos"]].shape[1]) - 1)
    depth = 0
    while names["qkv"].format(depth) in sd:
        depth += 1
    fc1 = next((sd[n] for n in names["fc1"] if n in sd), None)
    if depth == 0 or fc1 is None:
        fail("no encoder blocks found (%s)" % names["qkv"].format(0))
    if names["head"] not in sd:
        fail("no classification head (%s)" % names["head"])
    timm = names is TIMM
    cfg = {
        "image_size": g * patch, "patch_size": patch, "in_channels": in_ch,
        "hidden_dim": hidden, "depth": depth, "num_heads": hidden // 64 if hidden % 64 == 0 else 0,
        "mlp_dim": int(fc1.shape[0]), "num_classes": int(sd[names["head"]].shape[0]),
        "norm_eps": 1e-6,
        "mean": [0.5] * 3 if timm else IMAGENET_MEAN, "std": [0.5] * 3 if timm else IMAGENET_STD,
    }
    if args.arch:
        if args.arch not in PRESETS:
            fail("unknown --arch %s (known: %s)" % (args.arch, ", ".join(PRESETS)))
        p_timm, p_patch, p_hidden, p_depth, p_heads, p_mlp = PRESETS[args.arch]
        want = {"patch_size": p_patch, "hidden_dim": p_hidden, "depth": p_depth, "mlp_dim": p_mlp}
        for k, v in want.items():
            if cfg[k] != v:
                fail("--arch %s has %s %d, the checkpoint %d" % (args.arch, k, v, cfg[k]))
        cfg["num_heads"] = p_heads
        cfg["mean"], cfg["std"] = ([0.5] * 3, [0.5] * 3) if p_timm else (IMAGENET_MEAN, IMAGENET_STD)
    for k in ("num_heads", "mean", "std"):
        if k in hints:
            cfg[k] = hints[k]
    if args.num_heads:
        cfg["num_heads"] = args.num_heads
    if args.mean:
        cfg["mean"] = args.mean
    if args.std:
        cfg["std"] = args.std
    if not cfg["num_heads"] or hidden % cfg["num_heads"]:
        fail("cannot tell num_heads for hidden_dim %d: pass --num-heads or --arch" % hidden)
    if "image_size" in hints and hints["image_size"] != cfg["image_size"]:
        fail("the module says image_size %d, the position embedding %d"
             % (hints["image_size"], cfg["image_size"]))
    return cfg


def tensor_bytes(t, dtype):
    t = t.detach().cpu().to(torch.float32).contiguous()
    if dtype == "f32":
        return "F32", t.numpy().astype("<f4").tobytes()
    if dtype == "f16":
        return "F16", t.numpy().astype("<f2").tobytes()
    # BF16: torch rounds to nearest even; its bits viewed as int16.
    return "BF16", t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()


def write_safetensors(path, sd, metadata, dtype):
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, t in sd.items():
        dt, b = tensor_bytes(t, dtype)
        header[name] = {"dtype": dt, "shape": [int(s) for s in t.shape],
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)  # the data starts 8-byte aligned
    # As vitc's own writer (src/io/file.c): a temporary file beside path,
    # fsync, rename, so a failed export never destroys an earlier file, and
    # a path that is a device, FIFO or directory is refused, not replaced.
    real = os.path.realpath(path)
    if os.path.exists(real) and not os.path.isfile(real):
        fail("%s: exists and is not a regular file; not replacing it" % path)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(real) + ".tmp",
                               dir=os.path.dirname(real))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, real)
    except BaseException:
        os.unlink(tmp)
        raise


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("paths", nargs="+", metavar="PATH", help="[CHECKPOINT] OUT.safetensors")
    ap.add_argument("--torchvision", metavar="NAME",
                    help="build torchvision's NAME (vit_b_16, ...) instead of reading a file; "
                         "its pretrained weights unless --random-init")
    ap.add_argument("--random-init", action="store_true", help="with --torchvision: no weights")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed for --random-init")
    ap.add_argument("--arch", help="architecture preset (num_heads, mean/std)")
    ap.add_argument("--num-heads", type=int)
    ap.add_argument("--mean", type=float, nargs="+",
                    help="3 values, or 1 for every channel (a gray model's)")
    ap.add_argument("--std", type=float, nargs="+",
                    help="3 values, or 1 for every channel (a gray model's)")
    ap.add_argument("--labels", metavar="FILE",
                    help="class names, one per line; imagenet: torchvision's ImageNet-1k names; "
                         "none: no labels (default: ImageNet names for a torchvision 1000-class ViT)")
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    ap.add_argument("--trust-pickle", action="store_true",
                    help="unpickle Python objects too (a whole saved model); can run code from the file")
    args = ap.parse_args(argv)
    for k in ("mean", "std"):
        if getattr(args, k) and len(getattr(args, k)) not in (1, 3):
            ap.error("--%s takes 1 or 3 values" % k)

    if args.torchvision:
        if len(args.paths) != 1:
            ap.error("with --torchvision give only OUT.safetensors")
        import torchvision
        builder = getattr(torchvision.models, args.torchvision, None)
        if args.torchvision not in PRESETS or PRESETS[args.torchvision][0] or builder is None:
            ap.error("--torchvision takes vit_b_16, vit_b_32, vit_l_16, vit_l_32 or vit_h_14")
        torch.manual_seed(args.seed)
        weights = torchvision.models.get_model_weights(args.torchvision).DEFAULT
        try:
            obj = builder(weights=None if args.random_init else weights)
        except Exception as e:  # urllib's URLError, HTTPError, timeouts, a bad cache file
            reason = str(getattr(e, "reason", None) or e).split("\n")[0].strip()
            fail("cannot download torchvision's %s weights (%s): fetch them with `curl -LO %s` "
                 "and convert that file (export_safetensors.py %s OUT.safetensors), or pass "
                 "--random-init for a random model"
                 % (args.torchvision, reason, weights.url, weights.url.rsplit("/", 1)[-1]))
        out = args.paths[0]
    else:
        if len(args.paths) != 2:
            ap.error("give CHECKPOINT and OUT.safetensors")
        try:
            obj = load_checkpoint(args.paths[0], args.trust_pickle)
        except ValueError as e:
            fail(str(e))
        out = args.paths[1]

    sd = {}
    for k, v in _tensor_dict(obj).items():
        if not torch.is_tensor(v) or not v.is_floating_point():
            continue  # counters such as num_batches_tracked
        sd[k[len("module."):] if k.startswith("module.") else k] = v
    cfg = infer_config(sd, module_hints(obj), args)
    labels, source = None, None
    if args.labels == "imagenet" and not os.path.exists(args.labels):
        labels, source = imagenet_categories(), "torchvision's ImageNet-1k category names"
    elif args.labels and not (args.labels == "none" and not os.path.exists(args.labels)):
        try:
            with open(args.labels, encoding="utf-8") as f:
                labels = [line.rstrip("\r\n") for line in f if line.strip()]
        except OSError as e:
            fail("cannot read --labels %s: %s (a file of class names, one per line, or "
                 "imagenet, or none)" % (args.labels, e.strerror or e))
        source = args.labels
    elif not args.labels and "heads.head.weight" in sd and cfg["num_classes"] == 1000:
        # torchvision's ViTs are ImageNet-1k classifiers and torchvision ships
        # their category names, so the common case needs no labels file.
        labels = imagenet_categories(args.torchvision or "vit_b_16")
        source = "torchvision's ImageNet-1k category names (--labels FILE or none to change)"
    if labels is not None:
        if len(labels) != cfg["num_classes"]:
            fail("%s has %d labels for %d classes" % (args.labels, len(labels), cfg["num_classes"]))
        cfg["labels"] = labels
    write_safetensors(out, sd, {"vitc.config": json.dumps(cfg), "format": "pt"}, args.dtype)
    print("wrote %s: %d tensors, %s, %s" % (out, len(sd), args.dtype,
                                            json.dumps({k: v for k, v in cfg.items() if k != "labels"})))
    if source:
        print("labels: " + source)
    if args.random_init:
        print("note: torchvision initialises the classification head to zeros, so this random "
              "model gives every class the same score (0.10% each of 1000); train it or export "
              "pretrained weights")


if __name__ == "__main__":
    main()
