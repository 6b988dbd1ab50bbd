#!/usr/bin/env python3
"""vitc against PyTorch and the other engines on the standard workloads.

Run by `make bench` (PYTHONPATH=python .venv/bin/python bench/bench.py --out
bench/results.md). Every measurement runs in a fresh process, so that peak
memory is the workload's own and neither side warms the other's caches or
thread pools: vitc through `build/vitc bench --json --only NAME`, PyTorch
through this file with --torch-child NAME. The two sides alternate
(interleaved rounds, the order rotated each round) so that a slow spell of
the machine hits both alike. PyTorch runs at 1 and 2 threads and gets its
better; vitc runs at 2 threads (its default here) and at 1.

Timings: each child warms up (at least one forward, at least 0.3 s), then
times R forwards with a monotonic clock; the timings of all rounds are
pooled and their median is reported.

Memory: inside each child, VmHWM (peak resident set, /proc/self/status) is
reset through /proc/self/clear_refs right before the workload is built, and
"peak MB" is the highest VmHWM seen while building and running it minus the
resident set before it was built: weights, inputs, outputs and workspaces,
not the interpreter, libtorch or libvitc themselves. "fwd MB" is the peak
during the forwards (warm-up and timed) minus the resident set once weights
and inputs were built: what running forwards adds, kept workspaces included.

The ViT-B/16, DINOv2-B/14 and CLIP ViT-B/16 rows also time the other
engines (bench/peers.py): vitc in bf16 and int8, PyTorch eager in bf16
autocast, torch.compile, ONNX Runtime fp32 and int8, OpenVINO fp32, bf16
and int8, each in its own fresh child, their output checked against
PyTorch eager fp32 on real photos; and the shipped Fashion-MNIST model's
accuracy is measured on each engine and precision (no timings). The
DINOv2 and CLIP rows run transformers' own classes on PyTorch's side,
loaded with from_pretrained from the Hub directory vitc loads.

Only the standard library is needed in the driver; each engine's packages
in its children.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import peers  # noqa: E402  (bench/peers.py, beside this file)
import targets  # noqa: E402  (bench/targets.py: peaks per precision, issue 26's targets)

_HUB_FLOPS = ("B·(2·P·D·3·p² + 12·(2·N·D·3D + 4·N²·D + 2·N·D² + 4·N·D·M) + 2·D·E), "
              "P = %s patches, N = %s tokens, D = 768, M = 3072, projection E = %s")
_VIT_FLOPS = ("B·(2·P·D·3·16² + 12·(2·N·D·3D + 4·N²·D + 2·N·D² + 4·N·D·M) + 2·D·1000), "
              "P = 196 patches, N = 197 tokens, D = 768, M = 3072")
# name: (what, shape, GFLOP formula text, timed forwards per child)
WORKLOADS = {
    "sdpa": ("scaled dot-product attention (PyTorch: matmul-softmax-matmul)",
             "q,k,v [1,8,4096,64]", "4·B·H·L·S·d", 3),
    "mha": ("nn.MultiheadAttention(768, 12, batch_first=True), need_weights=False",
            "(1,197,768)", "2·L·E·3E + 4·L²·E + 2·L·E²", 20),
    "convsa": ("ConvSABlock(64)", "[8,64,32,32]", "B·(2·N·C·(2·C/8 + C) + 2·N²·(C/8 + C))", 10),
    "sa_multihead": ("SelfAttentionMultiHead(32, 4), eval", "[64,32,16,16]",
                     "B·(2·N·C·4C + 4·N²·C)", 10),
    "sa_group": ('SelfAttention(512, norm="group")', "[1,512,64,64]",
                 "B·(2·N·C·4C + 4·N²·C)", 3),
    "vit_b16_b1": ("ViT-B/16 (torchvision vit_b_16), batch 1", "[1,3,224,224]", _VIT_FLOPS, 5),
    "vit_b16_b8": ("ViT-B/16 (torchvision vit_b_16), batch 8", "[8,3,224,224]", _VIT_FLOPS, 3),
    # Training (issue 8): one step = forward + cross-entropy + backward + AdamW.
    "train_fmnist": ("training step of the Fashion-MNIST ViT (28 px, patch 4, 1 channel, depth 6, "
                     "dim 96, 4 heads, MLP 192, 10 classes): forward, cross-entropy, backward, "
                     "AdamW", "[128,1,28,28]", "3 × forward (backward = 2 × forward)", 10),
    "train_vit_b16_b8": ("training step of ViT-B/16 (torchvision vit_b_16): forward, "
                         "cross-entropy, backward, AdamW", "[8,3,224,224]",
                         "3 × " + _VIT_FLOPS, 3),
    "sdpa_bwd": ("attention backward: dQ, dK, dV of softmax(QKᵀ/√d)V given dOut (vitc: from "
                 "the forward's saved output and log-sum-exp; PyTorch: autograd through "
                 "matmul-softmax-matmul, graph kept from one forward)",
                 "q,k,v [1,8,4096,64]", "10·B·H·L·S·d (vitc's five products; PyTorch, which "
                 "keeps P, does four)", 3),
    # Hub image encoders (issue 10), random weights: vitc and PyTorch
    # (transformers' classes, from_pretrained) load the same Hub directory.
    "dinov2_b14_b1": ("DINOv2-B/14 (Dinov2Model) pooler_output at 224 px, its 37×37 position grid "
                      "resampled (bicubic) as on every call; PyTorch: transformers' Dinov2Model "
                      "from_pretrained on the same directory",
                      "[1,3,224,224]", _HUB_FLOPS % ("256", "257", "0"), 5),
    "dinov2_b14_b8": ("the same, batch 8", "[8,3,224,224]", _HUB_FLOPS % ("256", "257", "0"), 3),
    "clip_b16_b1": ("CLIP ViT-B/16 image tower (CLIPVisionModelWithProjection) image_embeds; "
                    "PyTorch: transformers' class, from_pretrained on the same directory", "[1,3,224,224]",
                    _HUB_FLOPS % ("196", "197", "512"), 5),
    "clip_b16_b8": ("the same, batch 8", "[8,3,224,224]", _HUB_FLOPS % ("196", "197", "512"), 3),
    # Fine-tuning a loaded Hub model (random weights, transformers'
    # save_pretrained) with a new 10-class head: one training step.
    "finetune_dinov2_s14_b8": ("training step of a DINOv2-S/14-shaped model (Dinov2Config hidden "
                               "384, 12 layers, 6 heads, patch 14, its 37×37 position table "
                               "resampled to 16×16 as on every call) with a new 10-class head "
                               "on [CLS, mean of patch tokens]; vitc: vitc_vit_reset_head; "
                               "PyTorch: transformers' Dinov2ForImageClassification "
                               "from_pretrained on the same directory (num_labels=10, "
                               "ignore_mismatched_sizes); forward, cross-entropy, backward, AdamW",
                               "[8,3,224,224]", "3 × B·(2·P·D·3·p² + 12·(2·N·D·3D + 4·N²·D + "
                               "2·N·D² + 4·N·D·M) + 2·2D·10), P = 256 patches, N = 257 tokens, "
                               "D = 384, M = 1536 (backward = 2 × forward)", 3),
    "finetune_clip_b16_b8": ("training step of a CLIP ViT-B/16 image tower "
                             "(CLIPVisionModelWithProjection, projection 512) with a new 10-class "
                             "Linear over image_embeds; vitc: vitc_vit_reset_head; PyTorch: "
                             "transformers' class from_pretrained on the same directory and "
                             "nn.Linear(512, 10); forward, cross-entropy, backward, AdamW",
                             "[8,3,224,224]", "3 × B·(2·P·D·3·p² + 12·(2·N·D·3D + 4·N²·D + "
                             "2·N·D² + 4·N·D·M) + 2·D·E + 2·E·10), P = 196 patches, N = 197 "
                             "tokens, D = 768, M = 3072, E = 512 (backward = 2 × forward)", 3),
    "embed_1000": ("`vitc embed --out x.npy` with the DINOv2-B/14 Hub directory over 1,000 "
                   "generated photos (JPEG and PNG, 120–640 px sides): decode, the model's "
                   "processor, forward (batch 8), writing; vitc only", "1000 files",
                   "1000 × the dinov2 per-image count", 1),
}
VIT = ("vit_b16_b1", "vit_b16_b8")
# The rows the other engines (bench/peers.py) run on: ViT-B/16, DINOv2, CLIP.
ENGINE_ROWS = tuple(n for m in peers.MODELS.values() for n in m["rows"])
HUB = ("dinov2_b14_b1", "dinov2_b14_b8", "clip_b16_b1", "clip_b16_b8")
EMBED_IMAGES = 1000  # --embed-images changes it (a test of the driver)
FINETUNE = ("finetune_dinov2_s14_b8", "finetune_clip_b16_b8")
TRAIN = ("train_fmnist", "train_vit_b16_b8", "sdpa_bwd") + FINETUNE
# The training rows torch.compile also times (the model compiled, as torch
# users do; the attention backward alone has no model to compile).
TRAIN_COMPILE = ("train_fmnist", "train_vit_b16_b8") + FINETUNE
# --only accepts these group names too (make bench BENCH_ONLY=train).
GROUPS = {"train": TRAIN, "inference": tuple(n for n in WORKLOADS if n not in TRAIN),
          "hub": HUB + ("embed_1000",), "engines": VIT,
          "engines-dinov2": peers.MODELS["dinov2"]["rows"],
          "engines-clip": peers.MODELS["clip"]["rows"],
          # no row of the summary: the Fashion-MNIST accuracy table alone
          "engines-fmnist": (),
          # not "finetune": make bench BENCH_ONLY=finetune would write over
          # bench/results-finetune.md, finetune_learn.py's
          "finetune-step": FINETUNE}
# The Fashion-MNIST ViT of issue 8.
FMNIST = dict(image_size=28, patch_size=4, in_channels=1, num_layers=6, num_heads=4,
              hidden_dim=96, mlp_dim=192, num_classes=10, batch=128)
# --quick: tiny sizes of the training workloads, to test the driver only
# (`vitc bench --quick` uses the same): FMNIST at batch 4 and depth 1, a
# 32 px ViT-B/16 with 2 layers, attention backward at L = 256.
# The fine-tuning rows' models (transformers' configs) and their inputs:
# batch 8 at 224 px.
FT_MODELS = {"finetune_dinov2_s14_b8": dict(hidden_size=384, num_hidden_layers=12,
                                            num_attention_heads=6, mlp_ratio=4, image_size=518,
                                            patch_size=14),
             "finetune_clip_b16_b8": dict(hidden_size=768, num_hidden_layers=12,
                                          num_attention_heads=12, intermediate_size=3072,
                                          image_size=224, patch_size=16, projection_dim=512)}
FT_CLASSES = 10
QUICK = False
QUICK_SIZES = {"fmnist": dict(FMNIST, num_layers=1, batch=4),
               "vit_b16": dict(image_size=32, depth=2, batch=2), "sdpa_L": 256,
               # --quick fine-tuning: 2 layers of width 48, batch 2 of two patches a side
               # (`vitc bench --quick` takes the model from the directory, the input the same)
               "finetune_dinov2_s14_b8": dict(FT_MODELS["finetune_dinov2_s14_b8"], hidden_size=48,
                                              num_hidden_layers=2, num_attention_heads=3,
                                              image_size=42),
               "finetune_clip_b16_b8": dict(FT_MODELS["finetune_clip_b16_b8"], hidden_size=48,
                                            num_hidden_layers=2, num_attention_heads=3,
                                            intermediate_size=96, image_size=32,
                                            projection_dim=16)}
CHILD_TIMEOUT = 300  # seconds; a child past it is killed and reported
CHILD_BUDGET = 45    # seconds of forwards after which a PyTorch child stops timing


def flops_of(name):
    """Multiply-adds of the GEMMs and of attention, times 2 (vitc bench
    computes the same numbers; for the ViT it reads the model's config)."""
    if name == "sdpa":
        B, H, L, S, d = 1, 8, 4096, 4096, 64
        return 4 * B * H * L * S * d
    if name == "mha":
        L, E = 197, 768
        return 2 * L * E * 3 * E + 4 * L * L * E + 2 * L * E * E
    if name == "convsa":
        B, C, N = 8, 64, 32 * 32
        return B * (2 * N * C * (2 * (C // 8) + C) + 2 * N * N * (C // 8 + C))
    if name in ("sa_multihead", "sa_group"):
        B, C, N = (64, 32, 16 * 16) if name == "sa_multihead" else (1, 512, 64 * 64)
        return B * (2 * N * C * 4 * C + 4 * N * N * C)
    if name == "sdpa_bwd":
        L = QUICK_SIZES["sdpa_L"] if QUICK else 4096
        return 2 * 5 * 1 * 8 * L * L * 64
    if name == "train_fmnist":
        f = QUICK_SIZES["fmnist"] if QUICK else FMNIST
        return 3 * vit_flops(f["batch"], f["image_size"], f["patch_size"], f["in_channels"],
                             f["hidden_dim"], f["num_layers"], f["mlp_dim"], f["num_classes"])
    if name == "train_vit_b16_b8":
        q = QUICK_SIZES["vit_b16"]
        if QUICK:
            return 3 * vit_flops(q["batch"], q["image_size"], 16, 3, 768, q["depth"], 3072, 1000)
        return 3 * vit_flops(8, 224, 16, 3, 768, 12, 3072, 1000)
    if name in FINETUNE:
        c, B, H = ft_model(name)
        D, p = c["hidden_size"], c["patch_size"]
        M = D * c["mlp_ratio"] if "mlp_ratio" in c else c["intermediate_size"]
        E = c.get("projection_dim", 0)
        f = vit_flops(B, H, p, 3, D, c["num_hidden_layers"], M, 0)
        # the head: DINOv2's Linear(2D, 10) on [CLS, mean]; CLIP's projection, then Linear(E, 10)
        f += B * (2 * 2 * D * FT_CLASSES if "mlp_ratio" in c else 2 * D * E + 2 * E * FT_CLASSES)
        return 3 * f
    if name in HUB or name == "embed_1000":
        dino = name != "clip_b16_b1" and name != "clip_b16_b8"
        B = EMBED_IMAGES if name == "embed_1000" else 8 if name.endswith("_b8") else 1
        return vit_flops(B, 224, 14 if dino else 16, 3, 768, 12, 3072, 0 if dino else 512)
    B = 1 if name == "vit_b16_b1" else 8
    return vit_flops(B, 224, 16, 3, 768, 12, 3072, 1000)


def vitc_work(name):
    """vitc's own FLOP count of a row where it does less than flops_of
    counts: the training rows' last block on the class rows alone."""
    if name == "train_fmnist":
        f = QUICK_SIZES["fmnist"] if QUICK else FMNIST
        return flops_of(name) - targets.cls_only_saving(
            f["batch"], f["image_size"], f["patch_size"], f["hidden_dim"], f["mlp_dim"])
    if name == "train_vit_b16_b8":
        q = QUICK_SIZES["vit_b16"]
        B, H = (q["batch"], q["image_size"]) if QUICK else (8, 224)
        return flops_of(name) - targets.cls_only_saving(B, H, 16, 768, 3072)
    return flops_of(name)


def ft_model(name):
    """(transformers config kwargs, batch, image size) of a fine-tuning row."""
    if QUICK:
        c = QUICK_SIZES[name]
        return c, 2, 2 * c["patch_size"]
    return FT_MODELS[name], 8, 224


def export_finetune(d):
    """The fine-tuning rows' Hub directories under d, transformers' own
    random init (seed 0) written with save_pretrained."""
    import torch
    import transformers
    for name in FINETUNE:
        torch.manual_seed(0)
        c, _, _ = ft_model(name)
        if name.startswith("finetune_dinov2"):
            m = transformers.Dinov2Model(transformers.Dinov2Config(**c))
        else:
            m = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**c))
        m.save_pretrained(os.path.join(d, name))
    print(json.dumps({"status": "ok"}))


def vit_flops(B, image, patch, C, D, depth, M, classes):
    """Forward GEMM + attention FLOPs of a ViT (vitc bench counts the same)."""
    P = (image // patch) ** 2
    N = P + 1
    return B * (2 * P * D * C * patch * patch
                + depth * (2 * N * D * 3 * D + 4 * N * N * D + 2 * N * D * D + 4 * N * D * M)
                + 2 * D * classes)


# --------------------------------------------------------------------------
# Memory and timing helpers, shared by the PyTorch child
# --------------------------------------------------------------------------

def _status_kb(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def _reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


# --------------------------------------------------------------------------
# PyTorch side: the seed modules, the same code the parity tests run
# (tests/reference/gen_layers.py holds them)
# --------------------------------------------------------------------------

def _torch_modules():
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    import gen_layers
    return (gen_layers.SeedConvSABlock, gen_layers.SeedSelfAttentionGroup,
            gen_layers.SeedSelfAttentionMultiHead)


def _torch_workload(name, weights=None, compile_backend=None):
    """Forward callable for one workload, weights random (the ViT's loaded
    from `weights`, a .pth state_dict, when given: the way a checkpoint is
    loaded in PyTorch, so its peak memory counts loading as vitc's does)."""
    import torch
    ConvSABlock, SelfAttention, SelfAttentionMultiHead = _torch_modules()
    torch.manual_seed(0)
    if name == "sdpa":
        q, k, v = (torch.randn(1, 8, 4096, 64) for _ in range(3))
        scale = 1.0 / math.sqrt(64)
        # torch 1.13 has no F.scaled_dot_product_attention; this is what
        # user code writes (the scale folded into q, the cheaper place).
        return lambda: torch.softmax((q * scale) @ k.transpose(-2, -1), dim=-1) @ v
    if name == "mha":
        m = torch.nn.MultiheadAttention(768, 12, batch_first=True).eval()
        x = torch.randn(1, 197, 768)
        return lambda: m(x, x, x, need_weights=False)
    if name == "convsa":
        m = ConvSABlock(64).eval()
        with torch.no_grad():
            m.gamma.fill_(0.5)
        x = torch.randn(8, 64, 32, 32)
        return lambda: m(x)
    if name == "sa_multihead":
        m = SelfAttentionMultiHead(32, 4).eval()
        x = torch.randn(64, 32, 16, 16)
        return lambda: m(x)
    if name == "sa_group":
        m = SelfAttention(512).eval()
        x = torch.randn(1, 512, 64, 64)
        return lambda: m(x)
    if name in TRAIN:
        return _torch_train_workload(name, weights, compile_backend)
    if name in HUB:
        # transformers' own classes, loaded from the directory vitc loads
        # (so peak memory counts reading it, as on vitc's side)
        import transformers
        cls = transformers.Dinov2Model if name.startswith("dinov2") \
            else transformers.CLIPVisionModelWithProjection
        if not weights:
            raise SystemExit("no Hub directory for " + name)
        m, info = cls.from_pretrained(weights, attn_implementation="sdpa",
                                      output_loading_info=True)
        if info.get("missing_keys"):
            raise SystemExit("%s: weights missing from %s: %s" % (
                name, weights, ", ".join(sorted(info["missing_keys"]))[:300]))
        m.eval()
        # from_pretrained maps the file and pages come in on first use: read
        # every weight now, so that "fwd MB" is the forwards' own memory
        for p in m.parameters():
            p.sum()
        x = torch.randn(8 if name.endswith("_b8") else 1, 3, 224, 224)
        if name.startswith("dinov2"):
            return lambda: m(pixel_values=x).pooler_output
        return lambda: m(pixel_values=x).image_embeds
    if name in VIT:
        import torchvision
        m = torchvision.models.vit_b_16().eval()
        if weights:
            sd = torch.load(weights)
            m.load_state_dict(sd)
            del sd
        x = torch.randn(1 if name == "vit_b16_b1" else 8, 3, 224, 224)
        return lambda: m(x)
    raise SystemExit("unknown workload " + name)


def _torch_train_workload(name, weights=None, compile_backend=None):
    """One training step as PyTorch users write it (model.train(), dropout 0
    as torchvision's default, AdamW over model.parameters()); with
    compile_backend, the model wrapped in torch.compile (default mode) as
    torch users compile it, loss, backward and optimizer step left as they
    are."""
    import torch
    import torch.nn.functional as F
    if name == "sdpa_bwd":
        L = QUICK_SIZES["sdpa_L"] if QUICK else 4096
        q, k, v = (torch.randn(1, 8, L, 64, requires_grad=True) for _ in range(3))
        scale = 1.0 / math.sqrt(64)
        out = torch.softmax((q * scale) @ k.transpose(-2, -1), dim=-1) @ v
        dout = torch.randn_like(out)

        def bwd():
            q.grad = k.grad = v.grad = None
            out.backward(dout, retain_graph=True)  # the forward's graph, kept
        return bwd
    if name in FINETUNE:
        return _torch_finetune_workload(name, weights, compile_backend)
    import torchvision
    from torchvision.models.vision_transformer import VisionTransformer
    if name == "train_fmnist":
        f = QUICK_SIZES["fmnist"] if QUICK else FMNIST
        m = VisionTransformer(f["image_size"], f["patch_size"], f["num_layers"], f["num_heads"],
                              f["hidden_dim"], f["mlp_dim"], num_classes=f["num_classes"])
        # torchvision has no in_channels: a 1-channel patch embedding, as
        # Fashion-MNIST users write it.
        m.conv_proj = torch.nn.Conv2d(f["in_channels"], f["hidden_dim"], f["patch_size"],
                                      f["patch_size"])
        B, C, H = f["batch"], f["in_channels"], f["image_size"]
    elif QUICK:
        q = QUICK_SIZES["vit_b16"]
        m = VisionTransformer(q["image_size"], 16, q["depth"], 12, 768, 3072)
        B, C, H = q["batch"], 3, q["image_size"]
    else:
        m = torchvision.models.vit_b_16()
        B, C, H = 8, 3, 224
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.05)
    x = torch.randn(B, C, H, H)
    y = torch.randint(0, m.heads.head.out_features, (B,))
    fwd = _compiled(m, compile_backend)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
    return _compile_step(step, opt, compile_backend)


def _compiled(m, backend):
    """m, or torch.compile(m) (default mode; backend "inductor" unless a
    test asks for a cheaper one)."""
    if not backend:
        return m
    import torch
    return torch.compile(m, backend=backend)


COMPILE_S = {}  # the compiling step's seconds, for torch_child's JSON


def _compile_step(step, opt, backend):
    """With torch.compile: the first step compiles forward and backward and
    is timed apart (compile seconds), inside the build as the engines'
    compile rows compile (peak MB counts it); the optimizer's state it made
    is dropped so that the timed steps make it again, as the eager side's
    first steps do."""
    if not backend:
        return step
    t0 = time.perf_counter()
    step()
    COMPILE_S["s"] = time.perf_counter() - t0
    opt.zero_grad(set_to_none=True)
    opt.state.clear()
    return step


def _torch_finetune_workload(name, weights, compile_backend=None):
    """A fine-tuning step as transformers users write it: the backbone
    from_pretrained from the Hub directory vitc loads, a new 10-class head
    (Dinov2ForImageClassification's own, or nn.Linear on CLIP's
    image_embeds), AdamW over every parameter."""
    import torch
    import torch.nn.functional as F
    import transformers
    if not weights:
        raise SystemExit("no Hub directory for " + name)
    torch.manual_seed(0)
    _, B, H = ft_model(name)
    if name.startswith("finetune_dinov2"):
        m, info = transformers.Dinov2ForImageClassification.from_pretrained(
            weights, num_labels=FT_CLASSES, ignore_mismatched_sizes=True,
            attn_implementation="sdpa", output_loading_info=True)
        missing = [k for k in info.get("missing_keys", ()) if not k.startswith("classifier.")]
        params = list(m.parameters())
        cm = _compiled(m, compile_backend)

        def fwd(x):
            return cm(pixel_values=x).logits
    else:
        m, info = transformers.CLIPVisionModelWithProjection.from_pretrained(
            weights, attn_implementation="sdpa", output_loading_info=True)
        missing = list(info.get("missing_keys", ()))
        head = torch.nn.Linear(m.config.projection_dim, FT_CLASSES)
        params = list(m.parameters()) + list(head.parameters())
        cm = _compiled(m, compile_backend)

        def fwd(x):
            return head(cm(pixel_values=x).image_embeds)
    if missing:
        raise SystemExit("%s: weights missing from %s: %s" % (
            name, weights, ", ".join(sorted(missing))[:300]))
    m.train()
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)
    x = torch.randn(B, 3, H, H)
    y = torch.randint(0, FT_CLASSES, (B,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
    return _compile_step(step, opt, compile_backend)


def torch_child(name, threads, repeat, weights=None, compile_backend=None):
    """Runs in a fresh process: time one workload, print one JSON line.
    compile_backend: a training workload under torch.compile."""
    import torch
    torch.set_num_threads(threads)
    if name in VIT or name in TRAIN:
        import torchvision  # noqa: F401  (imported before the baseline)
    if name in HUB or name in FINETUNE:
        # transformers loads a class's module on first use: before the baseline
        import transformers
        transformers.Dinov2Model, transformers.CLIPVisionModelWithProjection  # noqa: B018
        transformers.Dinov2ForImageClassification  # noqa: B018
    hwm_reset = _reset_hwm()
    base = _status_kb("VmRSS")
    import contextlib
    with (contextlib.nullcontext() if name in TRAIN else torch.inference_mode()):
        f = _torch_workload(name, weights, compile_backend)
        built_hwm, built = _status_kb("VmHWM"), _status_kb("VmRSS")
        if hwm_reset:
            _reset_hwm()
        warm, i = 0.0, 0
        while i < 1 or (warm < 0.3 and i < 50):
            t0 = time.perf_counter()
            f()
            warm += time.perf_counter() - t0
            i += 1
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            f()
            times.append(1e3 * (time.perf_counter() - t0))
            # Bounded: a thread count whose OpenMP threads fight for the
            # cores can take many seconds per forward; a few samples of
            # that are plenty.
            if warm + 1e-3 * sum(times) > CHILD_BUDGET:
                break
        run_hwm = _status_kb("VmHWM")
    res = {"name": name, "status": "ok", "threads": torch.get_num_threads(),
           "times_ms": times, "base_rss_kb": base, "built_hwm_kb": built_hwm,
           "built_rss_kb": built, "run_hwm_kb": run_hwm, "hwm_reset": hwm_reset}
    if "s" in COMPILE_S:
        res.update(compile_s=COMPILE_S["s"], compile_backend=compile_backend)
    print(json.dumps(res))


def hub_config(name):
    """config.json of the random-weight DINOv2-B/14 (facebook/dinov2-base's
    shapes: image_size 518) or CLIP ViT-B/16 image tower."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    import hf_ref
    if name.startswith("dinov2") or name == "embed_1000":
        # mlp_ratio an int, as in facebook/dinov2-base's config.json:
        # transformers 5's Dinov2Config refuses 4.0
        return hf_ref.dinov2_config(hidden=768, layers=12, heads=12, mlp_ratio=4, image=518,
                                    patch=14)
    return hf_ref.clip_config("clip_vision_model", hidden=768, layers=12, heads=12, mlp=3072,
                              image=224, patch=16, proj=512)


def export_hub(d):
    """Both Hub directories (seed 0, the PyTorch children's weights) under d."""
    cfg = hub_config("dinov2_b14_b1")  # puts tests/reference on the path
    import hf_ref
    hf_ref.save_hub(os.path.join(d, "dinov2-base"), hf_ref.random_state(cfg, 0), cfg, prefix=False)
    cfg = hub_config("clip_b16_b1")
    sd, ints = hf_ref.clip_random_state(cfg, 0, text=False, position_ids=False)
    hf_ref.save_clip(os.path.join(d, "clip-vit-base-patch16"), sd, ints, cfg)
    print(json.dumps({"status": "ok"}))


def make_photos(d, n):
    """n photos of mixed sizes and formats from the test photos: random
    crops, scales and flips, every other one JPEG (quality 90) or PNG."""
    import random
    from PIL import Image
    rng = random.Random(0)
    srcs = [Image.open(os.path.join(ROOT, "tests", "data", f)).convert("RGB")
            for f in ("photo.jpg", "photo.png")]
    paths = []
    for i in range(n):
        im = srcs[i % 2]
        w, h = im.size
        cw, ch = rng.randint(w // 3, w), rng.randint(h // 3, h)
        x0, y0 = rng.randint(0, w - cw), rng.randint(0, h - ch)
        side = rng.randint(120, 640)
        s = side / max(cw, ch)
        out = im.crop((x0, y0, x0 + cw, y0 + ch)).resize((max(1, int(cw * s)), max(1, int(ch * s))),
                                                         Image.BICUBIC)
        if rng.random() < 0.5:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        p = os.path.join(d, "img%04d.%s" % (i, "jpg" if i % 2 == 0 else "png"))
        out.save(p, quality=90) if i % 2 == 0 else out.save(p)
        paths.append(p)
    print(json.dumps({"status": "ok", "n": len(paths)}))


def embed_child(vitc, model, photos, threads):
    """vitc embed over every photo in one process, timed end to end (the
    clock around the process), then the forward alone: vitc bench's
    dinov2_b14_b8 row on the same model, times the batches embed ran."""
    files = sorted(os.path.join(photos, f) for f in os.listdir(photos))
    out = os.path.join(photos, "..", "embed_1000.npy")
    argv = [vitc, "embed", "--model", model, "--out", out, "--quiet", "--batch", "8",
            "--threads", str(threads)] + files
    import resource
    times, fwd = [], None
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    times.append(1e3 * (time.perf_counter() - t0))
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # vitc embed's peak
    if p.returncode != 0:
        print(json.dumps({"status": "failed", "error": p.stderr.decode()[-300:]}))
        return
    r = subprocess.run([vitc, "bench", "--json", "--quiet", "--no-peak", "--only", "dinov2_b14_b8",
                        "--threads", str(threads), "--repeat", "3", "--model", model],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        w = json.loads(r.stdout.decode())["workloads"][0]
        fwd = w["median_ms"] * math.ceil(len(files) / 8)
    except (ValueError, KeyError, IndexError):
        pass
    print(json.dumps({"name": "embed_1000", "status": "ok", "threads": threads, "times_ms": times,
                      "images": len(files), "forward_ms": fwd, "base_rss_kb": 0,
                      "built_hwm_kb": 0, "built_rss_kb": 0, "run_hwm_kb": maxrss,
                      "hwm_reset": False}))


def export_vit(path, pth=None):
    """torchvision vit_b_16 with random weights (seed 0; the state_dict in
    pth when given) -> safetensors with the architecture in metadata, for
    `vitc bench --model`."""
    import torch
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.vit_b_16()
    if pth:
        m.load_state_dict(torch.load(pth))
    sd = {k: v.detach().contiguous().numpy() for k, v in m.state_dict().items()}
    config = {"image_size": 224, "patch_size": 16, "in_channels": 3, "hidden_dim": 768,
              "depth": 12, "num_heads": 12, "mlp_dim": 3072, "num_classes": 1000,
              "norm_eps": 1e-6, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    import st_write
    st_write.write(path, sd, metadata={"vitc.config": json.dumps(config)})
    print(json.dumps({"torch": torch.__version__, "torchvision": torchvision.__version__}))


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------



def run_fmnist(args, threads, flags, log):
    """The Fashion-MNIST table (--only engines-fmnist): the shipped model on
    every engine and precision, each a fresh child over the test set; the
    ONNX / OpenVINO / NNCF files written first into a temporary folder."""
    fm = {"model": os.path.relpath(peers.FASHION_MODEL, ROOT), "limit": args.fmnist_limit,
          "results": {}, "notes": []}
    if not os.path.exists(peers.FASHION_MODEL):
        fm["notes"].append("not run: %s is absent" % fm["model"])
        return fm
    if not peers.fashion_available():
        fm["notes"].append("not run: Fashion-MNIST is not in %s (apt install "
                           "dataset-fashion-mnist)" % peers.FASHION_DIR)
        return fm
    want = [e for e in peers.FM_ENGINES if e in peers.VITC or e == "torch"
            or args.engines == "all" or e in args.engines.split(",")]
    if "vitc_int8w7" in want and not peers.has_w7(flags):
        want.remove("vitc_int8w7")
    if "ov_bf16" in want and not peers.has_bf16(flags):
        # OpenVINO would quietly run f32 and agree with itself
        want.remove("ov_bf16")
        fm["notes"].append("OpenVINO bf16 not run: the CPU has neither avx512_bf16 nor AMX-BF16")
    env = child_env(threads, args.openblas_coretype)
    with tempfile.TemporaryDirectory(prefix="vitc-bench-fmnist-") as d:
        prep = {"seconds": {}}
        if any(peers.needs(e) for e in want):
            log("Fashion-MNIST: writing the ONNX, ONNX Runtime int8, OpenVINO and NNCF int8 "
                "models (NNCF calibrates on %d training images)" % args.calib)
            prep, _ = run_child([sys.executable, __file__, "--fmnist-prepare", d, "--child-st",
                                 peers.FASHION_MODEL, "--calib", str(args.calib),
                                 "--child-threads", str(threads)], env, 3600)
            for step_, err in prep.get("errors", {}).items():
                fm["notes"].append("%s failed: %s" % (step_, err))
            if prep.get("status") == "failed":
                fm["notes"].append("preparing the models failed: " + prep["error"][-300:])
        fm["prepare"] = prep
        for e in want:
            if peers.needs(e) and peers.needs(e) not in prep.get("seconds", {}):
                fm["results"][e] = {"status": "failed", "error": "%s failed" % peers.needs(e)}
                continue
            t0 = time.time()
            argv = [sys.executable, __file__, "--fmnist-child", e, "--child-model", d,
                    "--child-st", peers.FASHION_MODEL, "--child-threads", str(threads),
                    "--fmnist-limit", str(args.fmnist_limit)]
            r, _ = run_child(argv, env, 1200)
            fm["results"][e] = r
            log("Fashion-MNIST %-10s %s (%.1f s)" % (
                e, "accuracy %.2f%%" % (100 * r["acc"]) if r.get("status") == "ok" and "acc" in r
                else r.get("status", "?") + " " + (r.get("error") or "")[-200:], time.time() - t0))
    return fm


def run_child(argv, env, timeout=None):
    """Run one child; return (parsed JSON, max RSS of the process in KiB).
    os.wait4 gives this child's own rusage (RUSAGE_CHILDREN would sum)."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out_f:
        p = subprocess.Popen(argv, stdout=out_f, stderr=err, env=env)
        timeout = timeout or CHILD_TIMEOUT
        deadline = time.time() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.time() > deadline:
                p.kill()
                _, status, ru = os.wait4(p.pid, 0)
                p.returncode = 0
                return {"status": "failed", "error": "timed out after %d s" % timeout}, \
                    ru.ru_maxrss
            time.sleep(0.02)
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        msg = err.read().decode(errors="replace").strip()
        out_f.seek(0)
        out = out_f.read()
    if p.returncode != 0:
        return {"status": "failed", "error": msg or "exit %d" % p.returncode}, ru.ru_maxrss
    try:
        return json.loads(out), ru.ru_maxrss
    except ValueError:
        pass
    # a library's progress lines before the JSON (NNCF prints its own)
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        r = json.loads(lines[-1]) if lines else None
        if isinstance(r, dict):
            return r, ru.ru_maxrss
    except ValueError:
        pass
    return {"status": "ok", "stdout": out.decode(errors="replace")}, ru.ru_maxrss


def engine_argv(engine, name, threads, repeat, peerdir, pth, model, check):
    """A bench/peers.py child: `engine` on the workload `name` (one of
    ENGINE_ROWS; pth the PyTorch side's weights, model vitc's)."""
    argv = [sys.executable, __file__, "--engine-child", engine, "--child-batch",
            "8" if name.endswith("_b8") else "1", "--child-threads", str(threads),
            "--child-repeat", str(repeat), "--child-kind", peers.kind_of(name)]
    for flag, val in (("--child-model", peerdir), ("--child-weights", pth), ("--child-st", model)):
        if val:
            argv += [flag, val]
    return argv + (["--child-check"] if check else [])


def run_checks(name, engines, peerdir, pth, model, threads, coretype, base_env, log):
    """The output (logits or embeddings) on the fixed photos of PyTorch eager fp32 (the reference)
    and of vitc in each precision (its bench children print timings only),
    through the Python packages: one untimed child each."""
    out = {}
    for e in ["torch", "vitc"] + [e for e in engines if e in peers.VITC]:
        env = child_env(threads, coretype)
        r, _ = run_child(engine_argv(e, name, threads, 0, peerdir, pth, model, True), env)
        out[e] = r.get("out") if r.get("status") == "ok" else None
        if out[e] is None:
            log("%s: the check of %s failed: %s" % (name, e, (r.get("error") or "no output")[-200:]))
            out[e] = "failed: " + (r.get("error") or "no output")[-160:]
    return out


def agreement(runs, checks, name="vit_b16_b1"):
    """engine -> (max relative error, top-1 agreement; for an embedder the
    nearest-neighbour agreement) against PyTorch eager fp32 on the fixed
    photos, or a string saying why there is none."""
    embedder = peers.MODELS[peers.kind_of(name)]["embedder"]
    ref = checks.get("torch")
    res = {}
    outs = dict(checks)
    for cfg, rs in runs.items():
        e = cfg.split("-")[0]
        for r in rs:
            if r.get("out") and not isinstance(outs.get(e), list):
                outs[e] = r["out"]
    for e, y in outs.items():
        if e == "torch":
            continue
        if not isinstance(ref, list):
            res[e] = "no reference (%s)" % ref
        elif not isinstance(y, list):
            res[e] = y or "no output"
        elif embedder:
            res[e] = (peers.rel_err(y, ref), peers.nn_agree(y, ref, peers.photo_count()))
        else:
            res[e] = (peers.rel_err(y, ref), peers.top1_agree(y, ref))
    return res


def child_env(threads, coretype):
    env = dict(os.environ)
    # Both sides get the same BLAS and OpenMP settings for a thread count.
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    if coretype == "auto":
        env.pop("OPENBLAS_CORETYPE", None)
    elif coretype != "inherit":
        env["OPENBLAS_CORETYPE"] = coretype
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def machine_info(vitc, env):
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ver = subprocess.run([vitc, "--version"], capture_output=True, text=True, env=env).stdout
    flags = peers.cpu_flags()
    info = {"cpu": cpu, "cpu_model": peers.cpu_model(), "cores": len(os.sched_getaffinity(0)),
            "vitc": "", "kernel": platform.release(), "flags": sorted(flags),
            "isa": peers.isa_line(flags)}
    info.update(parse_version(ver))
    return info


def parse_version(text):
    """`vitc --version`'s lines: the version line, "cpu: ... [id]" and
    "caches: ..." (src/kernels/cpu.c). cpu_id names this CPU's file in
    bench/results/ (vendor-uarch-brand-f<family>m<model>)."""
    out = {"vitc": "", "cpu_line": "", "caches_line": "", "cpu_id": ""}
    for line in text.strip().splitlines():
        if line.startswith("cpu: "):
            out["cpu_line"] = line[5:].strip()
            m = re.search(r"\[([a-z0-9.-]+)\]$", line)
            out["cpu_id"] = m.group(1) if m else ""
        elif line.startswith("caches: "):
            out["caches_line"] = line[8:].strip()
        elif not out["vitc"]:
            out["vitc"] = line.strip()
    return out


CPU_RESULTS = os.path.join(HERE, "results")


def cpu_results_write(text, info, started):
    """The run kept per CPU: bench/results/<cpu_id>.md (the newest run on
    that microarchitecture replaces the older one), then the index."""
    if not info.get("cpu_id"):
        print("bench.py: no CPU id in `vitc --version`: bench/results/ left as it is",
              file=sys.stderr)
        return None
    os.makedirs(CPU_RESULTS, exist_ok=True)
    path = os.path.join(CPU_RESULTS, info["cpu_id"] + ".md")
    head = "# %s\n\nThe newest full `make bench` run on this CPU (%s).\n\n" % (
        info["cpu_id"], started)
    with open(path, "w") as f:
        f.write(head + text.split("\n", 1)[1].lstrip("\n"))
    cpu_results_index()
    return path


def cpu_results_index(folder=CPU_RESULTS):
    """bench/results/README.md: one row per CPU file, from its own lines."""
    rows = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".md") or name == "README.md":
            continue
        got = {}
        with open(os.path.join(folder, name)) as f:
            for line in f:
                for key in ("date", "CPU (as vitc reads it)", "machine", "measured FMA peak"):
                    if line.startswith("- %s: " % key) and key not in got:
                        got[key] = line[len(key) + 4:].strip()
                # "measured FMA peak (avx512, fp32): ..." (or avx2), newer runs
                m = re.match(r"- measured FMA peak \((\w+), fp32\): (.*)", line)
                if m and "fma" not in got:
                    got["fma"] = m.group(2).strip()
        peak = got.get("fma") or got.get("measured FMA peak", "?")
        peak = peak.split(" (`vitc bench")[0]
        rows.append("| [%s](%s) | %s | %s | %s |" % (
            name[:-3], name, got.get("CPU (as vitc reads it)", got.get("machine", "?")),
            got.get("date", "?").split(" (")[0], peak))
    L = ["# Benchmark results per CPU", "",
         "One file per microarchitecture measured, named as `vitc --version` names the CPU "
         "(vendor-uarch-brand-f<family>m<model>, the `[...]` of its `cpu:` line): the newest "
         "full `make bench` run on it, with its date, machine, measured peaks and the engines' "
         "versions (a file that says so at its top holds what could be measured without one, "
         "vitc alone). `make bench` writes the file of the CPU it runs on and this index; "
         "bench/results.md is always the newest run, whichever CPU it was on.", "",
         "| file | CPU | date | measured fp32 FMA peak |", "|---|---|---|---|"] + rows
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write("\n".join(L) + "\n")


def pingpong(vitc):
    """A cache line's round trip between CPUs 0 and 1 in ns (build/bench_pingpong
    beside vitc; about 6 ms), or None: where the VM's two vCPUs sit right now
    (docs/bench.md, "Reading the numbers")."""
    exe = os.path.join(os.path.dirname(os.path.abspath(vitc)), "bench_pingpong")
    if not os.access(exe, os.X_OK) or (os.cpu_count() or 1) < 2:
        return None
    try:
        out = subprocess.run([exe, "-n", "20000"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"round trip ([0-9.]+) ns", out)
    return float(m.group(1)) if m else None


PROBE_CLOSE_NS = 150  # at or below: the vCPUs close (50-105 ns typical)


def probe_section(raw):
    """vitc's children with the probe read just before and after each: which
    rounds ran with the vCPUs far apart. The medians and targets above pool
    every child; this says how many were slowed and by how much."""
    L = []
    for name, runs in raw.items():
        for cfg, rs in runs.items():
            side = cfg.split("-")[0]
            if side not in peers.VITC or int(cfg.split("-")[1]) < 2:
                continue
            got = [(_median(r["times_ms"]), r["_probe_ns"]) for r in rs
                   if r.get("status") == "ok" and r.get("times_ms") and
                   r.get("_probe_ns") and None not in r["_probe_ns"]]
            if not got:
                continue
            close = [ms for ms, p in got if max(p) <= PROBE_CLOSE_NS]
            far = [ms for ms, p in got if min(p) > PROBE_CLOSE_NS]
            L.append("| %s | %s | %s | %s | %s | %s |" % (
                name, label(side), " · ".join("%.1f (%.0f/%.0f)" % (ms, p[0], p[1])
                                              for ms, p in got),
                fmt(_median([ms for ms, _ in got]), ".1f"),
                fmt(_median(close) if close else None, ".1f") + " (%d)" % len(close),
                fmt(_median(far) if far else None, ".1f") + " (%d)" % len(far)))
    if not L:
        return []
    return ["## Where the vCPUs sat\n",
            "Each vitc child (2 threads) between two readings of `build/bench_pingpong` (a cache "
            "line's round trip between CPUs 0 and 1, ns, before/after): at or below %d ns the "
            "vCPUs sat close, above it far apart, where memory-bound work runs slower "
            "(docs/bench.md, \"Reading the numbers\"). The tables above pool every child; "
            "this shows how many ran in a far stretch and what it cost.\n" % PROBE_CLOSE_NS,
            "| workload | side | each child: median ms (probe ns) | all | close (n) | far (n) |",
            "|---|---|---|---:|---:|---:|"] + L + [""]


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def fmt(x, spec):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def summarize(name, runs, flops, peaks):
    """runs: config -> list of child results. Pooled median and memory;
    % peak over the configuration's own precision's peak."""
    out = {}
    for cfg, rs in runs.items():
        ok = [r for r in rs if r.get("status") == "ok"]
        if not ok:
            st = rs[0].get("status", "failed") if rs else "not run"
            err = rs[0].get("error", rs[0].get("note", "")) if rs else ""
            # vitc bench's note of a skipped row starts with "skipped: " already
            if err.startswith(st + ": "):
                err = err[len(st) + 2:]
            out[cfg] = {"status": st, "error": err}
            continue
        times = [t for r in ok for t in r["times_ms"]]
        med = _median(times)
        threads = int(cfg.split("-")[1])
        prec = targets.precision_of(cfg)
        peak1 = targets.peak_of(peaks, prec)
        gf = flops / (med * 1e-3) * 1e-9 if flops else None
        peak = [max(r["built_hwm_kb"], r["run_hwm_kb"]) - r["base_rss_kb"] for r in ok]
        fwd = [r["run_hwm_kb"] - r["built_rss_kb"] for r in ok]
        out[cfg] = {"status": "ok", "median_ms": med, "min_ms": min(times), "samples": len(times),
                    # per round (None: failed there), for comparisons within the
                    # rounds both sides ran (peers.paired_ms)
                    "round_times_ms": [r.get("times_ms") if r.get("status") == "ok" else None
                                       for r in rs],
                    "gflops": gf, "precision": prec,
                    "peak_frac": gf / (peak1 * threads) if gf and peak1 else None,
                    "peak_mb": max(peak) / 1024.0, "fwd_mb": max(fwd) / 1024.0,
                    "proc_mb": max(r["_maxrss_kb"] for r in ok) / 1024.0,
                    "hwm_reset": all(r.get("hwm_reset") for r in ok)}
        if any("compile_s" in r for r in ok):
            out[cfg]["compile_s"] = [r["compile_s"] for r in ok if "compile_s" in r]
    return out


def render(info, args, peak, summary, flops, notes, cmdline, started, elapsed, engines=(),
           agree=None, preps=None, fmnist=None, probes=()):
    L = []
    L.append("# vitc benchmark results\n")
    L.append("vitc against PyTorch (and, on ViT-B/16, DINOv2-B/14 and CLIP ViT-B/16, the other "
             "engines) on the standard "
             "workloads, side by side in one run "
             "(interleaved, each measurement a fresh process). See docs/bench.md for the method.\n")
    L.append("- date: %s (run took %.0f s)" % (started, elapsed))
    L.append("- command: `%s`" % cmdline)
    L.append("- machine: %s, %d cores usable, Linux %s" % (
        info.get("cpu_model", info["cpu"]), info["cores"], info["kernel"]))
    L.append("- ISA: %s" % info.get("isa", "?"))
    L.append("- vitc: %s" % info["vitc"])
    if info.get("cpu_line"):
        L.append("- CPU (as vitc reads it): %s" % info["cpu_line"])
        L.append("- caches and GEMM blocking: %s" % info["caches_line"])
        if not args.only:
            L.append("- kept per CPU in: bench/results/%s.md" % info["cpu_id"])
    L.append("- PyTorch: torch %s, torchvision %s, Python %s" % (
        info.get("torch", "?"), info.get("torchvision", "?"), platform.python_version()))
    v = info.get("versions", {})
    L.append("- the other engines: transformers %s, onnx %s, onnxruntime %s, openvino %s, nncf %s, "
             "numpy %s" % tuple(v.get(k, "?") for k in ("transformers", "onnx", "onnxruntime",
                                                        "openvino", "nncf", "numpy")))
    L.append("- OpenBLAS core type for both sides: %s" % info["coretype"])
    L.append("- load average (1 min) at start and end: %s and %s (above 0 means other processes "
             "shared the cores)" % (info.get("load_start", "?"), info.get("load_end", "?")))
    L.append("- measured FMA peak (%s, fp32): %.1f GFLOP/s on 1 core, %.1f on %d threads at once "
             "(`vitc bench --peak-only`, best of the measurements between workloads)" % (
                 peak["isa"], peak["p1"], peak["pn"], info["cores"]))
    L.append("- measured peaks: %s (vdpbf16ps: 4 flops per fp32 lane; vpdpbusd: 8 ops per "
             "int32 lane; without VNNI, vpmaddubsw + vpmaddwd + vpaddd: 8; AMX tiles where "
             "present; each precision's %% peak below is over its own)"
             % targets.peaks_line(peak, info["cores"]))
    L.append("- rounds: %d; timed forwards per child: %s" % (
        args.rounds, ", ".join("%s %d" % (n, WORKLOADS[n][3] * args.repeat_scale)
                               for n in summary)))
    L.append("")
    threads = sorted({int(c.split("-")[1]) for s_ in summary.values() for c in s_}) or \
        sorted(int(t) for t in args.threads.split(","))
    vmain, vone = "vitc-%d" % threads[-1], "vitc-%d" % threads[0]
    i_sum = len(L)  # where the timing tables start (see the end)
    L.append("## Summary\n")
    L.append("vitc at %d thread(s) against PyTorch at its best of %s thread(s). "
             "Median ms; speedup = PyTorch ms / vitc ms (vitc's median over the rounds "
             "PyTorch's side ran in: torch.compile's rows run in the first --engine-rounds "
             "only); %% peak = GFLOP/s over (measured 1-core peak of the row's precision × "
             "threads); memory = peak MB (fwd MB): the workload's "
             "peak resident memory above the process's resident set before it was built "
             "(weights and loading included), and in parentheses what the forwards add once "
             "it is built. Last column: vitc's %d-thread time over its %d-thread time.\n"
             % (threads[-1], " and ".join(map(str, threads)), threads[0], threads[-1]))
    L.append("| workload | input | GFLOP | vitc ms | PyTorch ms | speedup | vitc GFLOP/s | vitc %% peak "
             "| PyTorch GFLOP/s | PyTorch %% peak | vitc memory MB | PyTorch memory MB "
             "| vitc %d thr vs %d |" % (threads[-1], threads[0]))
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def mem(r):
        return "%s (%s)" % (fmt(r.get("peak_mb"), ".0f"), fmt(r.get("fwd_mb"), ".0f")) \
            if r.get("status") == "ok" else "–"

    compiled = []
    # A training row with torch.compile children gets a second row: vitc
    # against torch.compile, in PyTorch's columns.
    rows = [(n, side) for n in summary for side in ("torch", "compile")
            if side == "torch" or (n in TRAIN and any(c.startswith("compile-") for c in summary[n]))]
    for name, vs in rows:
        s_ = summary[name]
        v, v1 = s_.get(vmain, {}), s_.get(vone, {})
        tb = best_torch(s_, vs)
        t = s_.get(tb, {}) if tb else {}
        torch_ms = fmt(t.get("median_ms"), ".2f") + (" (%s thr)" % tb.split("-")[1] if tb else "")
        if vs == "compile":
            compiled.append(name)
            cs = ["%.0f" % x for c in sorted(s_) if c.startswith("compile-")
                  for x in s_[c].get("compile_s", [])]
            torch_ms += " (compile %s s)" % "/".join(cs) if cs else ""
        label_ = name + (" vs torch.compile" if vs == "compile" else "")
        if v.get("status") != "ok":
            L.append("| %s | %s | %s | %s | %s | | | | %s | %s | | %s | |" % (
                label_, WORKLOADS[name][1], fmt(flops[name] * 1e-9, ".2f"),
                cell(v.get("status", "not run") + (": " + v["error"] if v.get("error") else "")),
                torch_ms, fmt(t.get("gflops"), ".1f"),
                fmt(t.get("peak_frac") and 100 * t["peak_frac"], ".0f") + "%", mem(t)))
            continue
        sp = t["median_ms"] / peers.paired_ms(v, t) if t.get("status") == "ok" else None
        sc = v1["median_ms"] / v["median_ms"] if v1.get("status") == "ok" and v1 is not v else None
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            label_, WORKLOADS[name][1], fmt(flops[name] * 1e-9, ".2f"), fmt(v["median_ms"], ".2f"),
            torch_ms, fmt(sp, ".2f") + ("×" if sp else ""), fmt(v["gflops"], ".1f"),
            fmt(v["peak_frac"] and 100 * v["peak_frac"], ".0f") + "%",
            fmt(t.get("gflops"), ".1f"),
            fmt(t.get("peak_frac") and 100 * t["peak_frac"], ".0f") + "%",
            mem(v), mem(t), fmt(sc, ".2f") + ("×" if sc else "")))
    L.append("")
    if compiled:
        L.append("\"vs torch.compile\" rows (%s): PyTorch's columns are the same training step "
                 "with the model wrapped in torch.compile(model) (default mode, backend %s), "
                 "each child a fresh process with this run's own inductor cache; its first "
                 "step compiles forward and backward and is not timed (compile seconds per "
                 "child in the ms column, the first from an empty cache); its peak MB "
                 "includes compiling (compare peak MB: its fwd MB is only what the timed steps "
                 "add to the memory the compiling step already touched). It ran in the first "
                 "%d of the %d rounds, as the engines do.\n" % (
                     ", ".join(compiled), args.compile_backend,
                     min(args.engine_rounds, args.rounds), args.rounds))
    i_eng = len(L)
    if engines:
        for kind, m in peers.MODELS.items():
            if any(n in summary for n in m["rows"]):
                L.extend(peers.render(summary, kind, engines, agree or {},
                                      (preps or {}).get(kind, {}), args, fmt, cell))
    if fmnist:
        L.extend(peers.fmnist_render(fmnist, fmt, cell))
    L.extend(targets.own_peak_table(summary, TRAIN, fmt))
    L.extend(targets.targets_section(summary, flops, peak, vmain, ENGINE_ROWS, QUICK, best_torch,
                                     {n: vitc_work(n) for n in summary}))
    L.extend(probes)
    i_cfg = len(L)
    L.append("## Every configuration\n")
    L.append("| workload | side | threads | median ms | min ms | samples | GFLOP/s | % peak "
             "| peak MB | fwd MB | process MB |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, s_ in summary.items():
        order = list(peers.ENGINES)
        for cfg in sorted(s_, key=lambda c: (order.index(c.split("-")[0])
                                             if c.split("-")[0] in order else 99,
                                             -int(c.split("-")[1]) if c[0] == "v"
                                             else int(c.split("-")[1]))):
            r = s_[cfg]
            side, th = cfg.split("-")
            side = label(side)
            if r["status"] != "ok":
                L.append("| %s | %s | %s | %s | | | | | | | |" % (
                    name, side, th, cell(r["status"] + (": " + r["error"] if r.get("error")
                                                        else ""))))
                continue
            L.append("| %s | %s | %s | %s | %s | %d | %s | %s | %s | %s | %s |" % (
                name, side, th, fmt(r["median_ms"], ".3f"), fmt(r["min_ms"], ".3f"), r["samples"],
                fmt(r["gflops"], ".1f"), fmt(r["peak_frac"] and 100 * r["peak_frac"], ".0f") + "%",
                fmt(r["peak_mb"], ".1f"), fmt(r["fwd_mb"], ".1f"), fmt(r["proc_mb"], ".0f")))
    L.append("")
    L.append("GFLOP counts the multiply-adds of GEMMs and attention, 2 per multiply-add "
             "(attention: 4·B·H·L·S·d); norms, softmax, GELU and residuals are not counted. "
             "peak MB: highest resident memory while the workload was built (weights, inputs; "
             "for the ViT, loading the checkpoint) and run, above the resident set before; "
             "fwd MB: highest resident memory during the forwards above the resident set once "
             "built; process MB: the whole process's resident peak during the forwards "
             "(interpreter and libraries included). Formulas per workload:\n")
    for name in summary:
        L.append("- %s — %s on %s: %s" % (name, WORKLOADS[name][0], WORKLOADS[name][1],
                                           WORKLOADS[name][2]))
    i_notes = len(L)
    if notes:
        L.append("\nNotes:\n")
        L.extend("- " + n for n in notes)
    if not summary:  # --only engines-fmnist: no timed row, so no timing tables
        L = L[:i_sum] + L[i_eng:i_cfg] + L[i_notes:]
    return "\n".join(L) + "\n"


def prune(runs, name, notes, log):
    """After round 1: an engine's thread count more than 1.5x slower than
    its other cannot be that engine's better one; on a busy 2-core machine
    its OpenMP threads can spin for seconds per forward, so it is not run
    again. (vitc's configurations always run: its 1-thread figure gives
    the 2-thread scaling.)"""
    for engine in sorted({c.split("-")[0] for c in runs} - set(peers.VITC)):
        cfgs = [c for c in runs if c.split("-")[0] == engine and runs[c]
                and runs[c][0].get("status") == "ok" and runs[c][0].get("times_ms")]
        if len(cfgs) < 2:
            continue
        med = {c: _median(runs[c][0]["times_ms"]) for c in cfgs}
        best = min(med, key=med.get)
        for c in cfgs:
            if med[c] > 1.5 * med[best]:
                runs[c][-1]["pruned"] = True
                msg = ("%s: %s at %s thread(s) took %.1f ms in round 1 against %.1f ms at %s; "
                       "not run in later rounds" % (name, label(engine), c.split("-")[1], med[c],
                                                    med[best], best.split("-")[1]))
                notes.append(msg)
                log(msg)


def label(engine):
    """'ONNX Runtime int8' for 'ort_int8'; the fp32 ones without it, as
    the summary has always called vitc and PyTorch."""
    if engine in ("vitc", "torch"):
        return "vitc" if engine == "vitc" else "PyTorch"
    name, prec, _ = peers.ENGINES.get(engine, (engine, "fp32", ""))
    return name + " " + prec


def cell(text):
    """Text that stays inside one markdown table cell."""
    return text[-160:].replace("\n", " ").replace("|", "/")


def best_torch(s, side="torch"):
    ok = [c for c in s if c.split("-")[0] == side and s[c].get("status") == "ok"]
    return min(ok, key=lambda c: s[c]["median_ms"]) if ok else None


def main():
    global QUICK, EMBED_IMAGES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the markdown table here (and the raw data to .json)")
    ap.add_argument("--only", help="comma-separated workloads or groups (train, inference, hub, "
                    "engines, engines-dinov2, engines-clip, engines-fmnist, finetune-step; "
                    "default: all): " + ", ".join(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--repeat-scale", type=int, default=1,
                    help="multiply every workload's timed forwards per child")
    ap.add_argument("--threads", default="1,2", help="thread counts to run (default 1,2)")
    ap.add_argument("--vitc", default=os.path.join(ROOT, "build", "vitc"))
    ap.add_argument("--model", help="an existing ViT-B/16 safetensors file (default: export a "
                    "random-weight torchvision vit_b_16 to a temporary file)")
    ap.add_argument("--openblas-coretype", default="auto",
                    help="OPENBLAS_CORETYPE for both sides: 'auto' (unset: OpenBLAS detects the "
                    "CPU; default), 'inherit' (keep the environment's), or a core name")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes of the training workloads (tests the driver; not a benchmark)")
    ap.add_argument("--embed-images", type=int, default=EMBED_IMAGES,
                    help="photos for embed_1000 (default 1000; fewer only to test the driver)")
    ap.add_argument("--engines", default="all",
                    help="engines beside vitc and PyTorch fp32 on the ViT-B/16, DINOv2 and CLIP "
                    "rows and in the Fashion-MNIST table: 'all' (those "
                    "this CPU runs; the bf16 ones need avx512_bf16 or AMX), 'none', or a "
                    "comma-separated list of " + ", ".join(peers.PEERS) + "; 'compile' (in 'all' "
                    "or named) also times the training rows under torch.compile")
    ap.add_argument("--engine-rounds", type=int, default=2,
                    help="rounds the other engines run in (default 2; vitc's and PyTorch fp32's "
                    "rows run every round)")
    ap.add_argument("--calib", type=int, default=peers.CALIB,
                    help="NNCF calibration samples for OpenVINO int8 (default %d)" % peers.CALIB)
    ap.add_argument("--torch-child", metavar="NAME", help=argparse.SUPPRESS)
    ap.add_argument("--engine-child", metavar="ENGINE", help=argparse.SUPPRESS)
    ap.add_argument("--child-batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--child-check", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-st", metavar="PATH", help=argparse.SUPPRESS)
    ap.add_argument("--prepare-peers", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--versions", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--export-hub", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--export-finetune", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--make-photos", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--embed-child", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--child-model", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--child-threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--child-repeat", type=int, default=5, help=argparse.SUPPRESS)
    ap.add_argument("--export-vit", metavar="PATH", help=argparse.SUPPRESS)
    ap.add_argument("--export-vit-pth", metavar="PATH", help=argparse.SUPPRESS)
    ap.add_argument("--child-weights", metavar="PATH", help=argparse.SUPPRESS)
    ap.add_argument("--child-kind", default="vit", choices=tuple(peers.MODELS),
                    help=argparse.SUPPRESS)
    ap.add_argument("--fmnist-prepare", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--fmnist-child", metavar="ENGINE", help=argparse.SUPPRESS)
    ap.add_argument("--fmnist-limit", type=int, default=0,
                    help="the Fashion-MNIST table on the first N test images only (a test of "
                    "the driver; default: all 10,000)")
    ap.add_argument("--child-compile", metavar="BACKEND", help=argparse.SUPPRESS)
    # the training rows' torch.compile backend: inductor; the driver's test
    # asks for aot_eager (the same child, without minutes of C++ codegen)
    ap.add_argument("--compile-backend", default="inductor", help=argparse.SUPPRESS)
    args = ap.parse_args()
    QUICK = args.quick
    EMBED_IMAGES = args.embed_images
    if args.export_hub:
        return export_hub(args.export_hub)
    if args.export_finetune:
        return export_finetune(args.export_finetune)
    if args.make_photos:
        return make_photos(args.make_photos, EMBED_IMAGES)
    if args.embed_child:
        return embed_child(args.vitc, args.child_model, args.embed_child, args.child_threads)

    if args.torch_child:
        return torch_child(args.torch_child, args.child_threads, args.child_repeat,
                           args.child_weights, args.child_compile)
    if args.engine_child:
        return peers.engine_child(args.engine_child, args.child_model, args.child_weights,
                                  args.child_st, args.child_batch, args.child_threads,
                                  args.child_repeat, args.child_check, CHILD_BUDGET,
                                  args.child_kind)
    if args.prepare_peers:
        return peers.prepare(args.prepare_peers, args.child_weights, args.calib,
                             args.child_threads, args.child_kind)
    if args.fmnist_prepare:
        return peers.fmnist_prepare(args.fmnist_prepare, args.child_st, args.calib,
                                    args.child_threads)
    if args.fmnist_child:
        return peers.fmnist_child(args.fmnist_child, args.child_model, args.child_st,
                                  args.child_threads, args.fmnist_limit)
    if args.versions:
        return peers.versions()
    if args.export_vit_pth:
        return peers.export_pth(args.export_vit_pth)
    if args.export_vit:
        return export_vit(args.export_vit, args.child_weights)

    names = [w for n in args.only.split(",") for w in GROUPS.get(n, (n,))] if args.only \
        else list(WORKLOADS)
    for n in names:
        if n not in WORKLOADS:
            ap.error("unknown workload %r (known: %s)" % (n, ", ".join(WORKLOADS)))
    threads = [int(t) for t in args.threads.split(",")]
    if not os.access(args.vitc, os.X_OK):
        sys.exit("bench.py: %s not found: run make first" % args.vitc)

    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t_start = time.time()
    cmdline = "make bench" if os.environ.get("MAKELEVEL") else " ".join(
        ["bench/bench.py"] + [shlex.quote(a) for a in sys.argv[1:]])
    inherited = os.environ.get("OPENBLAS_CORETYPE")
    base_env = child_env(max(threads), args.openblas_coretype)
    info = machine_info(args.vitc, base_env)
    info["load_start"] = loadavg()
    info["coretype"] = base_env.get("OPENBLAS_CORETYPE", "detected by OpenBLAS (unset)")
    notes = []
    if QUICK:
        notes.append("--quick: the training workloads ran at tiny sizes (FMNIST batch 4 depth 1, "
                     "ViT-B/16 at 32 px depth 2 batch 2, attention backward at L = 256, the "
                     "fine-tuning rows' models 2 layers of width 48 at batch 2, two patches a "
                     "side); the "
                     "shapes above are the full ones. A test of the driver, not a benchmark.")
    if inherited and args.openblas_coretype == "auto":
        notes.append("The environment had OPENBLAS_CORETYPE=%s; it was unset for both sides so "
                     "that OpenBLAS (PyTorch's BLAS here, and vitc's when its backend is "
                     "openblas) uses the kernels for this CPU. --openblas-coretype inherit keeps "
                     "it." % inherited)

    def log(msg):
        print("bench: " + msg, file=sys.stderr, flush=True)

    # Peaks: best of a few measurements (anything lower was disturbed).
    # p1, pn: fp32's (the keys older results have); "prec": every precision's.
    peak = {"isa": "?", "p1": 0.0, "pn": 0.0, "prec": {}}

    def measure_peak():
        r, _ = run_child([args.vitc, "bench", "--peak-only", "--json", "--quiet",
                          "--threads", str(info["cores"])], base_env)
        targets.merge_peaks(peak, r)

    log("measuring the fp32, bf16 and int8 peaks")
    measure_peak()

    r, _ = run_child([sys.executable, __file__, "--versions"], base_env)
    if r.get("status") == "failed":
        log("the engines' versions: " + r["error"][-300:])
        notes.append("The engines' versions could not be read: " + r["error"][-300:])
    info["versions"] = {k: v for k, v in r.items() if k not in ("status", "error", "stdout")}
    info.update({k: r[k] for k in ("torch", "torchvision") if k in r})
    if str(info.get("torch", "")).startswith("unavailable"):
        notes.append("PyTorch could not be started: " + info["torch"])

    engines = []
    if any(n in ENGINE_ROWS for n in names) and args.engines != "none":
        want = peers.PEERS if args.engines == "all" else args.engines.split(",")
        for e in want:
            if e not in peers.PEERS:
                ap.error("unknown engine %r (known: %s)" % (e, ", ".join(peers.PEERS)))
            if e in peers.BF16 and not peers.has_bf16(info["flags"]):
                notes.append("%s not run: the CPU has neither avx512_bf16 nor AMX-BF16" % e)
                continue
            engines.append(e)
        engines = ["vitc_bf16", "vitc_int8"] + (["vitc_int8w7"] if peers.has_w7(info["flags"])
                                                else []) + engines

    tmpdir = None
    model = args.model
    pth = None
    if any(n in VIT for n in names):
        # Every engine loads one checkpoint: the random weights (seed 0,
        # the head drawn too, see bench/peers.py) as a state_dict, the way
        # torchvision weights are loaded, and the same as safetensors.
        tmpdir = tempfile.TemporaryDirectory(prefix="vitc-bench-")
        pth = os.path.join(tmpdir.name, "vit_b_16.pth")
        r, _ = run_child([sys.executable, __file__, "--export-vit-pth", pth], base_env)
        if r.get("status") == "failed" or not os.path.exists(pth):
            notes.append("PyTorch's ViT was not loaded from a file (writing the .pth failed: %s), "
                         "so its peak memory does not count loading a checkpoint"
                         % r.get("error", "")[-200:])
            pth = None
    if not model and tmpdir:
        model = os.path.join(tmpdir.name, "vit_b_16.safetensors")
        log("writing a random-weight ViT-B/16 checkpoint to " + model)
        tool = os.path.join(ROOT, "tools", "export_safetensors.py")
        r = {"status": "failed", "error": "tools/export_safetensors.py absent"}
        if os.path.exists(tool):
            r, _ = run_child([sys.executable, tool, pth, model, "--arch", "vit_b_16"] if pth else
                             [sys.executable, tool, "--torchvision", "vit_b_16", model,
                              "--random-init", "--seed", "0"], base_env)
            if r.get("status") != "failed" or not os.path.exists(model):
                r = {"status": "ok"} if os.path.exists(model) else r
        if r.get("status") == "failed":
            log("export_safetensors.py: %s; writing it with tests/reference/st_write.py"
                % r["error"][-200:])
            r, _ = run_child([sys.executable, __file__, "--export-vit", model]
                             + (["--child-weights", pth] if pth else []), base_env)
            if r.get("status") == "failed":
                notes.append("The ViT-B/16 checkpoint could not be written: " + r["error"][-300:])
    elif model and engines:
        notes.append("--model %s: vitc timed that file, the other engines the random-init "
                     "checkpoint; the agreement column compares different weights" % model)

    # torch.compile on the training rows: with the engines' compile (its
    # children the same kind: fresh process, first step compiles, untimed).
    train_compile = [n for n in names if n in TRAIN_COMPILE] if (
        args.engines == "all" or "compile" in args.engines.split(",")) else []
    if train_compile:
        if tmpdir is None:
            tmpdir = tempfile.TemporaryDirectory(prefix="vitc-bench-")
        base_env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmpdir.name, "inductor")

    hubdir = photos = None
    if any(n in HUB or n == "embed_1000" for n in names):
        if tmpdir is None:
            tmpdir = tempfile.TemporaryDirectory(prefix="vitc-bench-")
        hubdir = os.path.join(tmpdir.name, "hub")
        log("writing random-weight DINOv2-B/14 and CLIP ViT-B/16 Hub directories to " + hubdir)
        r, _ = run_child([sys.executable, __file__, "--export-hub", hubdir], base_env)
        if r.get("status") == "failed":
            notes.append("The Hub directories could not be written: " + r["error"][-300:])
    ftdir = None
    if any(n in FINETUNE for n in names):
        if tmpdir is None:
            tmpdir = tempfile.TemporaryDirectory(prefix="vitc-bench-")
        ftdir = os.path.join(tmpdir.name, "finetune")
        log("writing the fine-tuning rows' random-init Hub directories to " + ftdir)
        r, _ = run_child([sys.executable, __file__, "--export-finetune", ftdir]
                         + (["--quick"] if QUICK else []), base_env)
        if r.get("status") == "failed":
            notes.append("The fine-tuning rows' Hub directories could not be written: "
                         + r["error"][-300:])
    if "embed_1000" in names:
        photos = os.path.join(tmpdir.name, "photos")
        os.makedirs(photos, exist_ok=True)
        log("writing %d photos to %s" % (EMBED_IMAGES, photos))
        r, _ = run_child([sys.executable, __file__, "--make-photos", photos, "--embed-images",
                          str(EMBED_IMAGES)], base_env)
        if r.get("status") == "failed":
            notes.append("The photos for embed_1000 could not be written: " + r["error"][-300:])

    def hub_model(name):
        d = "clip-vit-base-patch16" if name.startswith("clip") else "dinov2-base"
        return os.path.join(hubdir, d) if hubdir else None

    # The other engines' files, per model kind of the rows selected: its
    # weights are the .pth (ViT) or the Hub directory (DINOv2, CLIP).
    peerdirs, preps = {}, {}
    for kind in [k for k, m in peers.MODELS.items() if any(n in names for n in m["rows"])]:
        weights = pth if kind == "vit" else hub_model(peers.MODELS[kind]["rows"][0])
        if not any(e in peers.PEERS for e in engines) or not weights:
            continue
        peerdirs[kind] = os.path.join(tmpdir.name, "peers", kind)
        os.makedirs(peerdirs[kind], exist_ok=True)
        log("writing the %s ONNX, ONNX Runtime int8, OpenVINO and NNCF int8 models to %s (NNCF "
            "calibrates on %d samples)" % (peers.MODELS[kind]["title"], peerdirs[kind], args.calib))
        t0 = time.time()
        prep, _ = run_child([sys.executable, __file__, "--prepare-peers", peerdirs[kind],
                             "--child-weights", weights, "--calib", str(args.calib),
                             "--child-threads", str(max(threads)), "--child-kind", kind],
                            base_env, 3600)
        prep["wall_s"] = time.time() - t0
        if prep.get("status") == "failed":
            notes.append("Preparing the other engines' %s models failed: %s"
                         % (peers.MODELS[kind]["title"], prep["error"][-300:]))
        for step_, err in prep.get("errors", {}).items():
            notes.append("%s: %s failed: %s" % (peers.MODELS[kind]["title"], step_, err))
        log("prepared in %.0f s: %s" % (prep["wall_s"], json.dumps(prep.get("seconds", {}))))
        preps[kind] = prep
    info["prepare"] = preps
    # torch.compile's children share one inductor cache, this run's own:
    # the first compiles from scratch, the later ones reuse its kernels.
    if "compile" in engines and tmpdir:
        base_env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmpdir.name, "inductor")

    configs = ["vitc-%d" % t for t in sorted(threads, reverse=True)] + \
              ["torch-%d" % t for t in sorted(threads)]
    raw, checks = {}, {}
    flops = {n: flops_of(n) for n in names}
    for name in names:
        reps = WORKLOADS[name][3] * args.repeat_scale
        kind = peers.kind_of(name) if name in ENGINE_ROWS else None
        peerdir, prep = peerdirs.get(kind), preps.get(kind, {})
        cfgs = configs + (["%s-%d" % (e, t) for e in engines for t in sorted(threads)]
                          if kind else [])
        if name in train_compile:
            cfgs = cfgs + ["compile-%d" % t for t in sorted(threads)]
        runs = {c: [] for c in cfgs}
        # the ViT's engines load the .pth and vitc its safetensors; DINOv2's
        # and CLIP's all load the Hub directory
        eweights, est = (pth, model) if kind == "vit" else (hub_model(name), hub_model(name))
        if kind and engines:
            checks[name] = run_checks(name, engines, peerdir, eweights, est, max(threads),
                                      args.openblas_coretype, base_env, log)
        for rnd in range(args.rounds):
            order = cfgs[rnd % len(cfgs):] + cfgs[:rnd % len(cfgs)]
            if rnd == 1:
                prune({c: r for c, r in runs.items()
                       if args.engine_rounds > 1 or c.split("-")[0] not in peers.PEERS},
                      name, notes, log)
            for cfg in order:
                if runs[cfg] and runs[cfg][-1].get("pruned"):
                    continue
                side, th = cfg.split("-")
                # embed_1000: vitc alone, once, at its main thread count (minutes per run)
                if name == "embed_1000" and (side == "torch" or rnd or int(th) != max(threads)):
                    continue
                if side in peers.PEERS and rnd >= args.engine_rounds:
                    continue
                env = child_env(int(th), args.openblas_coretype)
                if "TORCHINDUCTOR_CACHE_DIR" in base_env:
                    env["TORCHINDUCTOR_CACHE_DIR"] = base_env["TORCHINDUCTOR_CACHE_DIR"]
                timeout = None
                if name == "embed_1000":
                    argv = [sys.executable, __file__, "--embed-child", photos, "--child-model",
                            hub_model(name), "--child-threads", th, "--vitc", args.vitc]
                elif side in peers.VITC:
                    argv = [args.vitc, "bench", "--json", "--quiet", "--no-peak", "--only", name,
                            "--threads", th, "--repeat", str(reps)] + (["--quick"] if QUICK else [])
                    if side != "vitc":
                        argv += ["--precision", peers.ENGINES[side][1]]
                    env.update(peers.vitc_env(side))
                    if name in VIT and model:
                        argv += ["--model", model]
                    if name in HUB and hubdir:
                        argv += ["--model", hub_model(name)]
                    if name in FINETUNE and ftdir:
                        argv += ["--model", os.path.join(ftdir, name)]
                elif side == "torch":
                    argv = [sys.executable, __file__, "--torch-child", name,
                            "--child-threads", th, "--child-repeat", str(reps)] + \
                        (["--quick"] if QUICK else [])
                    if name in VIT and pth:
                        argv += ["--child-weights", pth]
                    if name in HUB and hubdir:
                        argv += ["--child-weights", hub_model(name)]
                    if name in FINETUNE and ftdir:
                        argv += ["--child-weights", os.path.join(ftdir, name)]
                elif side == "compile" and name in TRAIN:
                    argv = [sys.executable, __file__, "--torch-child", name, "--child-threads", th,
                            "--child-repeat", str(reps), "--child-compile", args.compile_backend] + \
                        (["--quick"] if QUICK else [])
                    if name in FINETUNE and ftdir:
                        argv += ["--child-weights", os.path.join(ftdir, name)]
                    timeout = 1200  # the first compiles from scratch
                else:
                    if peers.needs(side) and peers.needs(side) not in prep.get("seconds", {}):
                        runs[cfg].append({"status": "failed", "error": "%s failed (see the "
                                          "notes)" % peers.needs(side), "_maxrss_kb": 0})
                        continue
                    argv = engine_argv(side, name, th, reps, peerdir, eweights, est, rnd == 0)
                    # the first torch.compile child compiles from scratch
                    timeout = 1200 if side == "compile" else None
                t0 = time.time()
                probe0 = pingpong(args.vitc) if side in peers.VITC else None
                # embed_1000 runs minutes: 1,000 forwards plus the decoding
                r, maxrss = run_child(argv, env, 1200 if name == "embed_1000" else timeout)
                probe1 = pingpong(args.vitc) if probe0 is not None else None
                if side in peers.VITC and "workloads" in r:
                    r = r["workloads"][0]
                    if r.get("flops") and abs(r["flops"] - flops[name]) > 1e-6 * flops[name]:
                        notes.append("%s: vitc bench counts %.0f FLOP, bench.py %.0f" % (
                            name, r["flops"], flops[name]))
                elif "times_ms" not in r and r.get("status") == "ok":
                    r = {"status": "failed", "error": "no timings: " + r.get("stdout", "")[-200:]}
                elif side in peers.VITC and r.get("status") == "ok" and name != "embed_1000":
                    r = {"status": "failed", "error": "no JSON from vitc bench: "
                         + r.get("stdout", "")[-200:]}
                r["_maxrss_kb"] = maxrss
                if probe0 is not None:
                    r["_probe_ns"] = [probe0, probe1]
                if name == "embed_1000" and r.get("status") == "ok":
                    r["_maxrss_kb"] = r["run_hwm_kb"]
                    wall = r["times_ms"][0]
                    msg = "embed_1000 (%s thread(s)): %d images in %.1f s, %.1f images/s end to end" % (
                        th, r["images"], wall * 1e-3, r["images"] / (wall * 1e-3))
                    if r.get("forward_ms"):
                        msg += ("; the forward alone (vitc bench dinov2_b14_b8 × %d batches) "
                                "%.1f s, so %.0f%% of the time is outside the forward (decode, "
                                "processor, writing)" % (
                                    math.ceil(r["images"] / 8), r["forward_ms"] * 1e-3,
                                    100 * max(0.0, 1 - r["forward_ms"] / wall)))
                    notes.append(msg)
                runs[cfg].append(r)
                med = _median(r["times_ms"]) if r.get("status") == "ok" else None
                log("%-13s round %d %-8s %s (%.1f s)" % (
                    name, rnd + 1, cfg, "%.3f ms" % med if med else r.get("status", "?") + " "
                    + (r.get("error") or r.get("note") or "")[-200:], time.time() - t0))
        raw[name] = runs
        # Between workloads: another chance to catch the machine quiet (a
        # --quick run, a test of the driver, keeps its first measurement).
        if not QUICK:
            measure_peak()
    fmnist = None
    if not args.only or "engines-fmnist" in args.only.split(","):
        fmnist = run_fmnist(args, max(threads), info["flags"], log)
    if tmpdir:
        tmpdir.cleanup()
    info["load_end"] = loadavg()
    summary = {name: summarize(name, raw[name], flops.get(name), peak) for name in names}
    agree = {name: agreement(raw[name], checks.get(name, {}), name) for name in names
             if name in ENGINE_ROWS}
    probes = probe_section(raw)
    for name in raw:  # the logits went into `agree`; the .json keeps the numbers
        for rs in raw[name].values():
            for r in rs:
                r.pop("out", None)

    text = render(info, args, peak, summary, flops, notes, cmdline, started, time.time() - t_start,
                  engines, agree, preps, fmnist, probes)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump({"info": info, "peak": peak, "summary": summary, "raw": raw,
                       "agreement": agree,
                       "fmnist": fmnist and dict(fmnist, results={
                           e: {k: v for k, v in r.items() if k != "pred"}
                           for e, r in fmnist["results"].items()},
                           agreement=peers.fmnist_agree(fmnist["results"]))}, f, indent=1)
        log("wrote " + args.out)
        if not args.only:  # a full run: also kept per CPU
            path = cpu_results_write(text, info, started)
            if path:
                log("wrote " + os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
