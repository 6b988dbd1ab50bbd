#!/usr/bin/env python3
"""The dense-vision side of `make bench`: Segment Anything's image encoder
and decoder and Depth Anything small, vitc beside PyTorch eager and
OpenVINO, with the CPU's fp32 FMA peak measured in the same run. Writes
bench/results-dense.md (and .json).

    .venv/bin/python bench/dense.py [--threads 2] [--rounds 3] [--quick]
        [--out bench/results-dense.md]

Rows (random weights, the released configs, saved with save_pretrained
into a temporary folder once per run; inputs from skimage's real photos):
  sam_encoder  SAM ViT-B image encoder, 1024x1024, batch 1: vitc
               (SamPredictor.set_image_tensor) vs torch eager
               (SamModel.get_image_embeddings) vs OpenVINO fp32 (the vision
               encoder through openvino.convert_model)
  sam_prompt   one point, multimask, through the prompt encoder, the mask
               decoder and the post-processing to the photo's size, the
               image embedding computed beforehand: vitc
               (SamPredictor.predict) vs torch (SamModel with
               image_embeddings + post_process_masks)
  depth        Depth Anything small, 518x518, batch 1: vitc
               (DepthAnything.forward) vs torch eager vs OpenVINO fp32

Every measurement runs in a fresh process (this file with --child), the
engines taking turns within each round (the order rotated every round) so
that a slow spell of the machine hits all alike; the timings of all rounds
are pooled and their median reported. Each child warms up (at least one
call, at least 0.3 s) before it times. Memory as bench/bench.py measures
it: VmHWM reset through /proc/self/clear_refs right before the model is
built; "peak MB" is the highest VmHWM while building and running minus the
resident set before (weights, inputs, outputs, workspaces; not the
interpreter or the libraries themselves). Agreement: each engine's output
of one untimed call against torch eager fp32's, max|d| / max|ref|.

--quick: tiny configs and a few calls, for a smoke run in seconds (what
tests/python/test_bench_dense.py runs); its results say so.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import peers  # noqa: E402  (cpu_model, cpu_flags; only the standard library at import)
# memory measured as bench.py measures it (only the standard library at import)
from bench import _reset_hwm, _status_kb  # noqa: E402

WORKLOADS = ("sam_encoder", "sam_prompt", "depth")
ENGINES = {"sam_encoder": ("vitc", "torch", "ov"), "sam_prompt": ("vitc", "torch"),
           "depth": ("vitc", "torch", "ov")}
NAMES = {"vitc": "vitc", "torch": "PyTorch %s eager", "ov": "OpenVINO %s fp32"}
# issue 24's targets: (workload, peer, least speed-up of vitc)
TARGETS = (("sam_encoder", "torch", 1.5), ("sam_encoder", "ov", 1.1), ("depth", "torch", 1.5))
PROMPT_MS = 10.0  # a prompt through the decoder, at most
CHILD_TIMEOUT = 900
# Fixed point prompts (fractions of the photo's width and height) for the
# timed prompt and for the mask IoU of other precisions.
POINTS = ((0.5, 0.5), (0.3, 0.4), (0.7, 0.6), (0.45, 0.25))

# The released configs, written out (SamConfig() is sam-vit-base; the
# depth-anything-small-hf config's values, DINOv2-S/14 backbone).
SAM_VIT_B = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_dim=3072,
                 image_size=1024, patch_size=16, window_size=14,
                 global_attn_indexes=[2, 5, 8, 11], output_channels=256)
DEPTH_SMALL = dict(
    backbone=dict(image_size=518, patch_size=14, hidden_size=384, num_hidden_layers=12,
                  num_attention_heads=6, mlp_ratio=4, out_indices=[9, 10, 11, 12],
                  reshape_hidden_states=False),
    reassemble_hidden_size=384, neck_hidden_sizes=[48, 96, 192, 384],
    reassemble_factors=[4, 2, 1, 0.5], fusion_hidden_size=64, head_hidden_size=32,
    patch_size=14, side=518)
# --quick: the same structures, tiny (a padded window grid and a global block;
# four taps of a 4-layer backbone).
SAM_TINY = dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4, mlp_dim=192,
                image_size=160, patch_size=16, window_size=4, global_attn_indexes=[1],
                output_channels=32)
DEPTH_TINY = dict(
    backbone=dict(image_size=56, patch_size=14, hidden_size=32, num_hidden_layers=4,
                  num_attention_heads=2, mlp_ratio=2, out_indices=[1, 2, 3, 4],
                  reshape_hidden_states=False),
    reassemble_hidden_size=32, neck_hidden_sizes=[8, 16, 32, 32],
    reassemble_factors=[4, 2, 1, 0.5], fusion_hidden_size=16, head_hidden_size=8,
    patch_size=14, side=56)


# --------------------------------------------------------------------------
# Children (fresh processes)
# --------------------------------------------------------------------------

def _photo(name):
    from skimage import data
    import numpy as np
    return np.ascontiguousarray(getattr(data, name)()[..., :3])


def _counted(model, call):
    """GFLOP of one call by torch's FLOP counter, on a copy in eager
    attention: the counter sees no FLOPs in a CPU scaled_dot_product_attention,
    explicit matmuls it counts."""
    import copy
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    m = copy.deepcopy(model)
    m.set_attn_implementation("eager")
    with torch.inference_mode(), FlopCounterMode(display=False) as fc:
        call(m)
    del m
    return fc.get_total_flops() / 1e9


def prepare_child(d, quick, threads, with_ov=True):
    """Build both models (random weights), their processors, the inputs, the
    OpenVINO IRs, and count the FLOPs of one forward with torch's counter."""
    import numpy as np
    import torch
    from PIL import Image
    from transformers import (DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config,
                              DPTImageProcessorPil, SamConfig, SamImageProcessorPil, SamModel,
                              SamProcessor)
    torch.set_num_threads(threads)
    info = {"notes": []}
    sv = SAM_TINY if quick else SAM_VIT_B
    S = sv["image_size"]
    if quick:
        cfg = SamConfig(vision_config=dict(sv, num_pos_feats=16),
                        prompt_encoder_config=dict(hidden_size=32, image_size=S, patch_size=16,
                                                   mask_input_channels=8),
                        mask_decoder_config=dict(hidden_size=32, mlp_dim=64, num_attention_heads=2,
                                                 iou_head_hidden_dim=24))
    else:
        cfg = SamConfig()
        got = {k: getattr(cfg.vision_config, k) for k in sv}
        got["global_attn_indexes"] = list(got["global_attn_indexes"])
        if got != sv:
            info["notes"].append("SamConfig() differs from sam-vit-base: %s" % got)
    torch.manual_seed(0)
    sam = SamModel(cfg).eval()
    # The default init leaves the positions at zero: drawn, so that the
    # relative-position terms are exercised as in a trained model.
    with torch.no_grad():
        for n, p in sam.named_parameters():
            if "rel_pos" in n or "pos_embed" in n:
                p.normal_(0, 0.02)
    sdir = os.path.join(d, "sam")
    sam.save_pretrained(sdir)
    proc = SamProcessor(image_processor=SamImageProcessorPil(
        size={"longest_edge": S}, pad_size={"height": S, "width": S}))
    proc.save_pretrained(sdir)
    for name in ("coffee", "astronaut"):
        img = _photo(name)
        Image.fromarray(img).save(os.path.join(d, name + ".png"))
        px = proc(images=Image.fromarray(img), return_tensors="pt")["pixel_values"]
        np.save(os.path.join(d, "sam_px_%s.npy" % name), px.numpy())
    px = torch.from_numpy(np.load(os.path.join(d, "sam_px_coffee.npy")))
    info["sam_encoder_gflop_counted"] = _counted(sam, lambda m: m.get_image_embeddings(px))
    info["sam_encoder_gflop"] = sam_encoder_flops(sv) / 1e9

    dc = DEPTH_TINY if quick else DEPTH_SMALL
    bb = Dinov2Config(**dc["backbone"])
    dcfg = DepthAnythingConfig(backbone_config=bb, **{k: v for k, v in dc.items()
                                                       if k not in ("backbone", "side")})
    torch.manual_seed(1)
    depth = DepthAnythingForDepthEstimation(dcfg).eval()
    # The default init leaves the neck's and head's biases at zero and their
    # ReLUs near half dead: drawn at fan-in scale, so that the depth map has
    # structure for the agreement to compare.
    with torch.no_grad():
        for n, p in depth.named_parameters():
            if n.startswith("backbone"):
                continue
            if p.ndim >= 2:  # ConvTranspose2d's fan-in is its first dim
                fan = p.shape[0] if "resize" in n and p.shape[-1] != 3 else p[0].numel()
                p.normal_(0, fan ** -0.5)
            else:
                p.normal_(0, 0.1)
        depth.head.conv3.bias.fill_(1.0)
    ddir = os.path.join(d, "depth")
    depth.save_pretrained(ddir)
    side = dc["side"]
    DPTImageProcessorPil(size={"height": side, "width": side}, keep_aspect_ratio=False,
                         ensure_multiple_of=14, resample=3, do_pad=False,
                         image_mean=[0.485, 0.456, 0.406],
                         image_std=[0.229, 0.224, 0.225]).save_pretrained(ddir)
    img = Image.fromarray(_photo("coffee")).resize((side, side), Image.BICUBIC)
    x = (np.asarray(img, np.float32) / 255 - np.float32([0.485, 0.456, 0.406])) \
        / np.float32([0.229, 0.224, 0.225])
    dpx = np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)
    np.save(os.path.join(d, "depth_px.npy"), dpx)
    info["depth_gflop_counted"] = _counted(depth, lambda m: m(torch.from_numpy(dpx)))
    info["sam_side"], info["depth_side"] = S, side

    # OpenVINO: the torch modules converted with an example input, saved as
    # IR (fp32 weights) so that each timed child only reads and compiles it.
    info["ov"] = {}
    if not with_ov:
        info["ov"] = {w: "not run (--engines)" for w in ("sam_encoder", "depth")}
        return info
    try:
        import openvino as ov
    except Exception as e:  # noqa: BLE001  (a missing engine is reported, not fatal)
        info["ov"] = {w: "openvino unavailable (%s)" % e for w in ("sam_encoder", "depth")}
        return info

    class Enc(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m.get_image_embeddings(x)

    class Dep(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(pixel_values=x).predicted_depth

    for w, mod, ex in (("sam_encoder", Enc(sam), px), ("depth", Dep(depth), torch.from_numpy(dpx))):
        try:
            with torch.no_grad():
                om = ov.convert_model(mod, example_input=ex)
            ov.save_model(om, os.path.join(d, "%s_ov.xml" % w), compress_to_fp16=False)
            info["ov"][w] = "ok"
        except Exception as e:  # noqa: BLE001
            info["ov"][w] = "conversion failed: %s: %s" % (type(e).__name__,
                                                           str(e).splitlines()[0][:200]
                                                           if str(e) else "")
    return info


def _points(shape):
    import numpy as np
    H, W = shape[:2]
    return [np.float32([[fx * W, fy * H]]) for fx, fy in POINTS]


def _build(engine, work, d, threads):
    """-> (call, untimed output for the agreement)."""
    import numpy as np
    if engine == "vitc":
        import vitc
        vitc.set_num_threads(threads)
        if work == "depth":
            m = vitc.DepthAnything(os.path.join(d, "depth"))
            x = np.load(os.path.join(d, "depth_px.npy"))
            return (lambda: m.forward(x)), None
        pred = vitc.SamPredictor(vitc.Sam(os.path.join(d, "sam")))
        px = np.load(os.path.join(d, "sam_px_coffee.npy"))[0]
        shape = _photo("coffee").shape
        if work == "sam_encoder":
            def enc():
                pred.set_image_tensor(px, shape[:2])
                return pred.embedding[None]  # [1, C, h, w] as the peers
            return enc, None
        pred.set_image_tensor(px, shape[:2])
        pt = _points(shape)[0]
        return (lambda: pred.predict(points=pt, labels=[1], multimask_output=True)), \
            (lambda: pred.predict(points=pt, labels=[1], multimask_output=True,
                                  return_logits=True)[0])
    if engine == "ov":  # no torch in this process: its memory is not OpenVINO's
        import openvino as ov
        core = ov.Core()
        cm = core.compile_model(core.read_model(os.path.join(d, "%s_ov.xml" % work)), "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"})
        req = cm.create_infer_request()
        x = np.load(os.path.join(d, "depth_px.npy" if work == "depth" else "sam_px_coffee.npy"))
        return (lambda: req.infer([x])[0].copy()), None
    import torch
    from transformers import DepthAnythingForDepthEstimation, SamModel, SamProcessor
    torch.set_num_threads(threads)
    if work == "depth":
        m = DepthAnythingForDepthEstimation.from_pretrained(os.path.join(d, "depth")).eval()
        x = torch.from_numpy(np.load(os.path.join(d, "depth_px.npy")))
        return (lambda: m(pixel_values=x).predicted_depth.numpy()), None
    m = SamModel.from_pretrained(os.path.join(d, "sam")).eval()
    px = torch.from_numpy(np.load(os.path.join(d, "sam_px_coffee.npy")))
    if work == "sam_encoder":
        return (lambda: m.get_image_embeddings(px).numpy()), None
    proc = SamProcessor.from_pretrained(os.path.join(d, "sam"))
    from PIL import Image
    img = _photo("coffee")
    # The point's coordinates normalised once by the processor (a few
    # multiplications; its image preprocessing is the encoder's side).
    inp = proc(images=Image.fromarray(img), input_points=[[_points(img.shape)[0].tolist()]],
               input_labels=[[[1]]], return_tensors="pt")
    emb = m.get_image_embeddings(inp["pixel_values"])

    def prompt(binarize=True):
        out = m(image_embeddings=emb, input_points=inp["input_points"],
                input_labels=inp["input_labels"], multimask_output=True)
        return proc.post_process_masks(out.pred_masks, inp["original_sizes"],
                                       inp["reshaped_input_sizes"], binarize=binarize)[0]
    return prompt, (lambda: prompt(False)[0].numpy())


def child(engine, work, d, threads, repeat, out_npy, budget):
    """Runs in a fresh process: build, warm up, time `repeat` calls, print
    one JSON line; out_npy: where the untimed output goes (agreement)."""
    import contextlib
    import numpy as np
    if engine == "vitc":
        import vitc  # noqa: F401  (loaded before the baseline)
    elif engine == "torch":
        import torch  # noqa: F401
        import transformers
        transformers.SamModel, transformers.DepthAnythingForDepthEstimation  # noqa: B018
    else:
        import openvino  # noqa: F401
    hwm_reset = _reset_hwm()
    base = _status_kb("VmRSS")
    ctx = contextlib.nullcontext()
    if engine == "torch":
        import torch
        ctx = torch.inference_mode()
    with ctx:
        f, check = _build(engine, work, d, threads)
        built_hwm, built = _status_kb("VmHWM"), _status_kb("VmRSS")
        warm, i = 0.0, 0
        while i < 1 or (warm < 0.3 and i < 50):
            t0 = time.perf_counter()
            y = f()
            warm += time.perf_counter() - t0
            i += 1
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            f()
            times.append(1e3 * (time.perf_counter() - t0))
            if warm + 1e-3 * sum(times) > budget:
                break
        run_hwm = _status_kb("VmHWM")
        if out_npy:
            y = check() if check else y
            np.save(out_npy, np.asarray(y, np.float32))
    print(json.dumps({"status": "ok", "times_ms": times, "base_rss_kb": base,
                      "built_hwm_kb": built_hwm, "built_rss_kb": built, "run_hwm_kb": run_hwm,
                      "hwm_reset": hwm_reset}))


def iou_child(d, threads):
    """Mask IoU of each vitc precision other than fp32 against fp32, on
    coffee and astronaut for the fixed point prompts (the best of the
    three multimask outputs each), where the SAM API offers a precision:
    vitc.Sam(path, precision=...). Where it does not, the row says so."""
    import inspect
    import numpy as np
    import vitc
    vitc.set_num_threads(threads)
    if "precision" not in inspect.signature(vitc.Sam).parameters:
        why = "not available: vitc's SAM API has no precision choice (vitc.Sam / vitc_sam_load " \
              "take none)"
        print(json.dumps({"bf16": why, "int8": why}))
        return
    path = os.path.join(d, "sam")
    photos = [np.asarray(_photo(n)) for n in ("coffee", "astronaut")]

    def masks(precision):
        pred = vitc.SamPredictor(vitc.Sam(path, precision=precision))
        out = []
        for img in photos:
            pred.set_image(img)
            for pt in _points(img.shape):
                m, iou, _ = pred.predict(points=pt, labels=[1], multimask_output=True)
                out.append(m[int(np.argmax(iou))])
        return out

    ref, res = masks("fp32"), {}
    for p in ("bf16", "int8"):
        try:
            got = masks(p)
            ious = [mask_iou(a, b) for a, b in zip(got, ref)]
            res[p] = "mask IoU against fp32: mean %.4f, lowest %.4f (%d prompts)" % (
                float(np.mean(ious)), min(ious), len(ious))
        except Exception as e:  # noqa: BLE001  (a precision refused is reported)
            res[p] = "failed: %s" % str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    print(json.dumps(res))


def versions():
    """Each engine's version from its package metadata (nothing imported)."""
    import importlib.metadata as md
    out = {}
    for p in ("torch", "transformers", "openvino", "numpy"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = "not installed"
    return out


# --------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------

def sam_encoder_flops(v):
    """Multiply-adds x 2 of SAM's image encoder: patch embedding, each
    block's qkv and proj GEMMs over its tokens (a windowed block's grid
    padded to whole windows), the MLP over the grid's tokens, attention
    (QK^T and PV) and the decomposed relative-position terms (each query
    against a row and a column table),
    the neck's 1x1 and 3x3 convolutions."""
    g = v["image_size"] // v["patch_size"]
    D, M, ws = v["hidden_size"], v["mlp_dim"], v["window_size"]
    f = 2 * g * g * D * 3 * v["patch_size"] ** 2
    for i in range(v["num_hidden_layers"]):
        if ws and i not in v["global_attn_indexes"]:
            gp = -(-g // ws) * ws
            n, nw, side = ws * ws, (gp // ws) ** 2, ws
        else:
            n, nw, side = g * g, 1, g
        N = n * nw
        f += 2 * N * D * 3 * D + 2 * N * D * D + 4 * g * g * D * M
        f += nw * (4 * n * n * D + 2 * n * 2 * side * D)
    C = v["output_channels"]
    return f + 2 * g * g * D * C + 2 * g * g * C * C * 9


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------

def run_child(argv, env, timeout):
    """(parsed JSON or a failure, max RSS of the child in KiB)."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out_f:
        p = subprocess.Popen(argv, stdout=out_f, stderr=err, env=env)
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
        lines = out_f.read().decode(errors="replace").strip().splitlines()
    if p.returncode != 0:
        return {"status": "failed", "error": (msg or "exit %d" % p.returncode)[-600:]}, \
            ru.ru_maxrss
    try:
        return json.loads(lines[-1]), ru.ru_maxrss
    except (ValueError, IndexError):
        return {"status": "failed", "error": "no JSON line: " + msg[-300:]}, ru.ru_maxrss


def child_env(threads):
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VITC_NUM_THREADS"):
        env[k] = str(threads)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def peak(vitc_bin, threads, env):
    try:
        r = subprocess.run([vitc_bin, "bench", "--peak-only", "--json", "--threads", str(threads)],
                           capture_output=True, text=True, env=env, timeout=300)
        return json.loads(r.stdout)["fma_peak"]
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        return {"error": "%s: %s" % (type(e).__name__, e)}


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if not n:
        return None
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def rel_err(y, ref):
    import numpy as np
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    if y.shape != ref.shape:
        return "shape %s vs torch %s" % (y.shape, ref.shape)
    return float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))


def mask_iou(a, b):
    import numpy as np
    a, b = np.asarray(a) > 0, np.asarray(b) > 0
    u = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / u) if u else 1.0


def measure(a, tmp, env, ov_ok, log):
    me = [sys.executable, os.path.abspath(__file__)]
    res = {"runs": {}, "agreement": {}}
    quick = a.quick
    budget = 5.0 if quick else 120.0
    for w in a.only:
        res["runs"][w] = {e: [] for e in ENGINES[w]}
    for rnd in range(a.rounds):
        for w in a.only:
            engines = [e for e in ENGINES[w] if e in a.engines]
            k = rnd % len(engines)
            for e in engines[k:] + engines[:k]:
                if e == "ov" and ov_ok.get(w) != "ok":
                    continue
                rep = a.prompt_repeat if w == "sam_prompt" else a.repeat
                out = os.path.join(tmp, "out_%s_%s.npy" % (w, e)) if rnd == 0 else None
                argv = me + ["--child", e, "--child-work", w, "--child-dir", tmp,
                             "--threads", str(a.threads), "--child-repeat", str(rep),
                             "--child-budget", str(budget)] + (["--child-out", out] if out else [])
                t0 = time.perf_counter()
                r, maxrss = run_child(argv, env, a.child_timeout)
                r["maxrss_kb"], r["wall_s"] = maxrss, time.perf_counter() - t0
                res["runs"][w][e].append(r)
                ok = r.get("status") == "ok" and r.get("times_ms")
                log("round %d %s %s (%.1f s): %s" % (
                    rnd + 1, w, e, r["wall_s"], "median %.2f ms" % median(r["times_ms"]) if ok
                    else r.get("error", "?")[-300:]))
    for w in a.only:
        ref = os.path.join(tmp, "out_%s_torch.npy" % w)
        agree = {}
        for e in ENGINES[w]:
            if e == "torch":
                continue
            y = os.path.join(tmp, "out_%s_%s.npy" % (w, e))
            if not os.path.exists(ref) or not os.path.exists(y):
                agree[e] = "no output (%s)" % ("torch" if not os.path.exists(ref) else e)
                continue
            import numpy as np
            Y, R = np.load(y), np.load(ref)
            agree[e] = rel_err(Y, R)
            if w == "sam_prompt":
                agree[e + "_mask_iou"] = min(mask_iou(Y[i], R[i]) for i in range(len(R))) \
                    if Y.shape == R.shape else None
                # an empty mask would agree trivially: its share of the photo
                agree["torch_mask_fraction"] = [float((R[i] > 0).mean()) for i in range(len(R))]
        res["agreement"][w] = agree
    return res


def summarize(res, peak_gf):
    s = {}
    for w, engines in res["runs"].items():
        s[w] = {}
        for e, rs in engines.items():
            ok = [r for r in rs if r.get("status") == "ok" and r.get("times_ms")]
            if not ok:
                errs = [r.get("error", "no timings") for r in rs]
                s[w][e] = {"status": "failed", "error": errs[0][-300:] if errs else "not run"}
                continue
            times = [t for r in ok for t in r["times_ms"]]
            peak_kb = [max(r["built_hwm_kb"], r["run_hwm_kb"]) - r["base_rss_kb"] for r in ok]
            fwd_kb = [r["run_hwm_kb"] - r["built_rss_kb"] for r in ok]
            s[w][e] = {"status": "ok", "median_ms": median(times), "n": len(times),
                       "peak_mb": median(peak_kb) / 1024, "fwd_mb": median(fwd_kb) / 1024,
                       "maxrss_mb": max(r["maxrss_kb"] for r in ok) / 1024,
                       "hwm_reset": all(r.get("hwm_reset") for r in ok)}
            gf = res["gflop"].get(w)
            if gf and peak_gf:
                s[w][e]["pct_peak"] = 100 * gf / (s[w][e]["median_ms"] / 1e3) / peak_gf
    return s


def verdicts(s):
    out = []
    peer_name = {"torch": "torch eager", "ov": "OpenVINO fp32"}
    for w, peer, want in TARGETS:
        if w not in s:  # not in this run's --only
            continue
        v, p = s.get(w, {}).get("vitc", {}), s.get(w, {}).get(peer, {})
        if v.get("status") == "ok" and p.get("status") == "ok":
            x = p["median_ms"] / v["median_ms"]
            out.append({"what": "%s: vitc >= %.1fx %s" % (w, want, peer_name[peer]),
                        "got": "%.2fx" % x,
                        "met": x >= want})
        else:
            out.append({"what": "%s: vitc >= %.1fx %s" % (w, want, peer_name[peer]),
                        "got": "not measured",
                        "met": None})
    v, p = s.get("sam_encoder", {}).get("vitc", {}), s.get("sam_encoder", {}).get("torch", {})
    if v.get("status") == "ok" and p.get("status") == "ok":
        out.append({"what": "sam_encoder: vitc's peak memory below torch's",
                    "got": "%.0f MB vs %.0f MB" % (v["peak_mb"], p["peak_mb"]),
                    "met": v["peak_mb"] < p["peak_mb"]})
    v = s.get("sam_prompt", {}).get("vitc", {})
    if "sam_prompt" in s:
        out.append({"what": "sam_prompt: vitc <= %.0f ms per prompt" % PROMPT_MS,
                    "got": "%.2f ms" % v["median_ms"] if v.get("status") == "ok" else
                    "not measured",
                    "met": v["median_ms"] <= PROMPT_MS if v.get("status") == "ok" else None})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5, help="timed forwards per child")
    ap.add_argument("--prompt-repeat", type=int, default=50, help="timed prompts per child")
    ap.add_argument("--child-timeout", type=int, default=CHILD_TIMEOUT)
    ap.add_argument("--engines", default="vitc,torch,ov",
                    help="comma-separated subset of vitc,torch,ov (torch: the reference)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny configs, 1 round, a few calls: a smoke run in seconds")
    ap.add_argument("--only", default=",".join(WORKLOADS),
                    help="comma-separated subset of %s (default: all)" % ",".join(WORKLOADS))
    ap.add_argument("--vitc", default=os.path.join(ROOT, "build", "vitc"))
    ap.add_argument("--out", default=os.path.join(HERE, "results-dense.md"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-work", help=argparse.SUPPRESS)
    ap.add_argument("--child-dir", help=argparse.SUPPRESS)
    ap.add_argument("--child-repeat", type=int, default=5, help=argparse.SUPPRESS)
    ap.add_argument("--child-budget", type=float, default=120.0, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--no-ov", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.only_arg = a.only
    if a.child == "prepare":
        print(json.dumps(prepare_child(a.child_dir, a.quick, a.threads, not a.no_ov)))
        return
    if a.child == "iou":
        return iou_child(a.child_dir, a.threads)
    if a.child:
        return child(a.child, a.child_work, a.child_dir, a.threads, a.child_repeat,
                     a.child_out, a.child_budget)
    a.engines = [e for e in a.engines.split(",") if e]
    if set(a.engines) - {"vitc", "torch", "ov"} or "vitc" not in a.engines:
        raise SystemExit("bench/dense.py: --engines takes vitc (always) and any of torch, ov; "
                         "got %s" % ",".join(a.engines))
    a.only = [w for w in WORKLOADS if w in a.only.split(",")]
    if not a.only or set(a.only) != set(x for x in a.only_arg.split(",") if x):
        raise SystemExit("bench/dense.py: --only takes a comma-separated subset of %s; got %s"
                         % (",".join(WORKLOADS), a.only_arg))
    if a.quick:
        a.rounds, a.repeat, a.prompt_repeat = 1, 2, 3
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t_start = time.perf_counter()
    env = child_env(a.threads)

    def log(msg):
        sys.stderr.write("bench/dense.py: %s\n" % msg)
        sys.stderr.flush()

    me = [sys.executable, os.path.abspath(__file__), "--threads", str(a.threads)]
    tmp = tempfile.mkdtemp(prefix="vitc_bench_dense_")
    try:
        ver = subprocess.run([a.vitc, "--version"], capture_output=True, text=True, env=env)
        vers = versions()
        res = {"quick": a.quick, "cpu": peers.cpu_model(), "isa": peers.isa_line(),
               "cores": len(os.sched_getaffinity(0)), "threads": a.threads, "started": started,
               "vitc": (ver.stdout.strip().splitlines() or ["?"])[0], "versions": vers,
               "rounds": a.rounds, "repeat": a.repeat, "prompt_repeat": a.prompt_repeat}
        res["peak_before"] = peak(a.vitc, a.threads, env)
        log("preparing the models (random weights) and the OpenVINO IRs in %s" % tmp)
        t0 = time.perf_counter()
        prep, _ = run_child(me + ["--child", "prepare", "--child-dir", tmp]
                            + (["--quick"] if a.quick else [])
                            + ([] if "ov" in a.engines else ["--no-ov"]), env, a.child_timeout)
        log("prepared in %.1f s" % (time.perf_counter() - t0))
        if prep.get("status") == "failed":
            raise SystemExit("bench/dense.py: preparing the models failed: " + prep["error"])
        res["prepare"] = prep
        res["ov"] = prep.get("ov", {})
        res["gflop"] = {"sam_encoder": prep["sam_encoder_gflop"],
                        "depth": prep["depth_gflop_counted"]}
        res.update(measure(a, tmp, env, res["ov"], log))
        # the encoder's other precisions go with the encoder's row
        res["precisions"] = run_child(me + ["--child", "iou", "--child-dir", tmp], env, 600)[0] \
            if "sam_encoder" in a.only else {}
        res["only"] = a.only
        res["peak_after"] = peak(a.vitc, a.threads, env)
        res["elapsed_s"] = time.perf_counter() - t_start
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pk = [p.get("gflops_all_threads") for p in (res["peak_before"], res["peak_after"])
          if isinstance(p, dict) and p.get("gflops_all_threads")]
    res["peak_gflops"] = max(pk) if pk else None
    res["summary"] = summarize(res, res["peak_gflops"])
    res["targets"] = verdicts(res["summary"])
    if a.quick:  # tiny configs: the targets are about the released ones
        for t in res["targets"]:
            t["met"] = None
    res["command"] = "make bench-dense" if not a.quick else \
        "PYTHONPATH=python .venv/bin/python bench/dense.py --quick"
    if a.only != list(WORKLOADS):
        res["command"] = "PYTHONPATH=python .venv/bin/python bench/dense.py --only %s%s" % (
            ",".join(a.only), " --quick" if a.quick else "")
    text = render(res)
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump({k: v for k, v in res.items() if k != "runs"} | {"runs": {
            w: {e: [{k: v for k, v in r.items() if k != "error"} | (
                {"error": r["error"][-300:]} if "error" in r else {}) for r in rs]
                for e, rs in es.items()} for w, es in res["runs"].items()}}, f, indent=1)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)


def _f(x, spec):
    return "–" if x is None else format(x, spec)


def render(r):
    v, s = r["versions"], r["summary"]
    q = r["quick"]
    tv, ovv = v.get("torch", "?"), v.get("openvino", "?")
    L = ["# Dense vision: Segment Anything and Depth Anything, vitc beside the peers", ""]
    if q:
        L += ["**--quick smoke run: tiny configs, one round, a few calls. These numbers say "
              "nothing about speed; `make bench-dense` gives the real ones.**", ""]
    pb, pa = r["peak_before"], r["peak_after"]
    p1 = max([p.get("gflops_1_thread", 0) for p in (pb, pa) if isinstance(p, dict)] or [0])
    L += ["`bench/dense.py`, %s, %.0f s. CPU: **%s**, %d cores; %d threads per engine."
          % (r["started"], r["elapsed_s"], r["cpu"], r["cores"], r["threads"]),
          "ISA: %s." % r["isa"],
          "Measured fp32 FMA peak in the same run (`vitc bench --peak-only`, best of before and "
          "after): %s GFLOP/s on 1 core, %s on %d threads." % (
              _f(p1 or None, ".1f"), _f(r["peak_gflops"], ".1f"), r["threads"]),
          "%s; torch %s, transformers %s, OpenVINO %s, numpy %s." % (
              r["vitc"], tv, v.get("transformers", "?"), ovv, v.get("numpy", "?")),
          "Every engine in its own fresh process, the engines taking turns in each of %d "
          "round(s) (order rotated); median of all timed calls (%d per child for the "
          "encoders, %d for the prompt). Random weights from the released configs%s."
          % (r["rounds"], r["repeat"], r["prompt_repeat"],
             " (here: tiny configs)" if q else
             " (SamConfig() = sam-vit-base; depth-anything-small-hf's config written out)"), ""]
    names = {"vitc": "vitc", "torch": "PyTorch %s eager" % tv, "ov": "OpenVINO %s fp32" % ovv}
    titles = {
        "sam_encoder": "SAM ViT-B image encoder, %dx%d, batch 1" % (
            r["prepare"]["sam_side"], r["prepare"]["sam_side"]),
        "sam_prompt": "One prompt (one point, multimask) through the prompt encoder, mask "
                      "decoder and post-processing to the photo's size (600x400)",
        "depth": "Depth Anything small, %dx%d, batch 1" % (r["prepare"]["depth_side"],
                                                           r["prepare"]["depth_side"])}
    for w in r.get("only", WORKLOADS):
        L += ["## " + titles[w], ""]
        gf = r["gflop"].get(w)
        hdr = "| engine | ms | %speak MB | fwd MB | agreement vs torch | vitc speed-up |" % (
            "% of fp32 peak | " if gf else "")
        L += [hdr, "|---|---:|%s---:|---:|---|---:|" % ("---:|" if gf else "")]
        ag = r["agreement"].get(w, {})
        vt = s[w].get("vitc", {})
        for e in ENGINES[w]:
            x = s[w].get(e)
            blank = " |" * (hdr.count("|") - 3)  # the cells after ms
            if e == "ov" and r["ov"].get(w) != "ok":
                why = r["ov"].get(w, "not run").replace("|", "/").replace("\n", " ")
                L.append("| %s | %s |%s" % (names[e], why, blank))
                continue
            if not x or x["status"] != "ok":
                L.append("| %s | failed: %s |%s" % (
                    names[e], (x or {}).get("error", "not run").replace("|", "/")
                    .replace("\n", " ")[-200:], blank))
                continue
            a = ag.get(e)
            agree = "reference" if e == "torch" else (
                "%.1e" % a if isinstance(a, float) else str(a))
            if w == "sam_prompt" and isinstance(ag.get(e + "_mask_iou"), float):
                agree += " (mask IoU %.4f)" % ag[e + "_mask_iou"]
            sp = "-" if e == "vitc" or vt.get("status") != "ok" else \
                "%.2fx" % (x["median_ms"] / vt["median_ms"])
            L.append("| %s | %.2f | %s%.0f | %.0f | %s | %s |" % (
                names[e], x["median_ms"], ("%.0f%% | " % x["pct_peak"]) if gf and
                "pct_peak" in x else ("– | " if gf else ""), x["peak_mb"], x["fwd_mb"],
                agree, sp))
        L.append("")
        if w == "sam_encoder":
            L += ["%% of peak: %.3g GFLOP (patch embedding; qkv, projection and MLP GEMMs over "
                  "each block's tokens, a windowed block's grid padded to whole windows; QKᵀ and "
                  "PV; the decomposed relative-position terms; the neck's 1x1 and 3x3 "
                  "convolutions), %.3g by torch's FLOP counter. Agreement: the image embedding, "
                  "max|d| / max|ref|. OpenVINO: the vision encoder through "
                  "openvino.convert_model (example input), INFERENCE_PRECISION_HINT f32, "
                  "INFERENCE_NUM_THREADS = threads, NUM_STREAMS 1." % (
                      r["gflop"]["sam_encoder"], r["prepare"]["sam_encoder_gflop_counted"]), ""]
            pr = r.get("precisions") or {}
            L += ["Other precisions (mask IoU against vitc fp32, the fixed point prompts on "
                  "coffee and astronaut): bf16: %s; int8: %s." % (
                      pr.get("bf16", pr.get("error", "?")), pr.get("int8", pr.get("error", "?"))),
                  ""]
        elif w == "sam_prompt":
            L += ["The image embedding computed before the timing (the encoder's row). vitc: "
                  "SamPredictor.predict (boolean masks at the photo's size); PyTorch: "
                  "SamModel(image_embeddings=..., input_points, input_labels, "
                  "multimask_output=True) + SamProcessor.post_process_masks (binarized), the "
                  "point's coordinates normalised once beforehand. Agreement: the three masks' "
                  "logits at the photo's size, max|d| / max|ref|, and the lowest mask IoU "
                  "(torch's masks cover %s of the photo)." % (
                      ", ".join("%.0f%%" % (100 * f) for f in
                                r["agreement"]["sam_prompt"].get("torch_mask_fraction", []))
                      or "?"), ""]
        else:
            L += ["%% of peak: %.3g GFLOP, torch's FLOP counter over one forward (GEMMs and "
                  "convolutions). Agreement: predicted_depth, max|d| / max|ref|. OpenVINO: the "
                  "model (predicted_depth) through openvino.convert_model." % (
                      r["gflop"]["depth"]), ""]
    L += ["## Targets (issue 24)", "", "| target | measured | met |", "|---|---|---|"]
    for t in r["targets"]:
        L.append("| %s | %s | %s |" % (t["what"], t["got"], {True: "yes", False: "**no**",
                                                              None: "–"}[t["met"]]))
    notes = list(r["prepare"].get("notes", []))
    if q:
        notes.append("--quick: the targets are about the real configs; they are not judged "
                     "by a smoke run.")
    L += [""] + ["Note: " + n for n in notes] + ([""] if notes else [])
    L += ["Peak MB: the highest VmHWM while building the model and running it, minus the "
          "resident set before building (weights, inputs, outputs, workspaces); fwd MB: what the "
          "calls add once the model is built.", "",
          "Rerun: `%s`." % r["command"]]
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
