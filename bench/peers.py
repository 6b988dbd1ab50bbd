"""The other engines for bench.py: on its ViT-B/16 (vit_b16_b1 / _b8),
DINOv2-B/14 (dinov2_b14_b1 / _b8) and CLIP ViT-B/16 (clip_b16_b1 / _b8)
rows, PyTorch eager in bf16 autocast, torch.compile, ONNX Runtime and
OpenVINO, each in its own fresh process as bench.py's PyTorch children are;
and the shipped Fashion-MNIST model's accuracy on each engine and precision
(fmnist_*).

DINOv2 and CLIP are the random-weight Hub directories bench.py writes for
its dinov2/clip rows; every engine runs the embedding vitc returns
(Dinov2Model's pooler_output, CLIPVisionModelWithProjection's image_embeds),
exported from transformers' classes the same way as the ViT below.

All of them run the random-init torchvision vit_b_16 (seed 0) that vitc
loads. torchvision zero-initialises the classifier head, which would make
every engine's logits zero and any broken export agree; the checkpoint is
therefore written with a random head (std 0.02), the same file for every
engine. From it, prepare() writes once per run: the ONNX graph (the
TorchScript exporter: torch 2.14's dynamo exporter needs onnxscript, which
the pinned environment lacks; batch axis dynamic), its int8 version from
onnxruntime.quantization.quantize_dynamic, the OpenVINO IR (fp32 weights)
and the IR quantized by NNCF post-training quantization, calibrated on
ImageNet-preprocessed augmentations of scikit-image's photos.

Agreement: in round 1 each engine's logits on a fixed batch of those photos
go back to the driver, which compares them with PyTorch eager fp32's:
max |y - y_ref| / max |y_ref|, so that an export that computes something
else cannot win on speed.
"""
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# engine: (label, precision, how it is configured)
ENGINES = {
    "vitc": ("vitc", "fp32", "build/vitc bench --precision fp32"),
    "vitc_bf16": ("vitc", "bf16", "build/vitc bench --precision bf16"),
    "vitc_int8": ("vitc", "int8", "build/vitc bench --precision int8"),
    "vitc_int8w7": ("vitc, 7-bit weights", "int8",
                    "build/vitc bench --precision int8 under VITC_LP_KERNEL=avx2-w7 (weights on "
                    "[-64, 64], as ONNX Runtime's reduce_range; run on CPUs with AVX2 and no "
                    "VNNI, where it is vitc's faster int8)"),
    "torch": ("PyTorch eager", "fp32", "torch.inference_mode()"),
    "torch_bf16": ("PyTorch eager", "bf16", "torch.autocast('cpu', torch.bfloat16)"),
    "compile": ("torch.compile (inductor)", "fp32", "torch.compile(model), default mode"),
    "ort": ("ONNX Runtime", "fp32", "CPUExecutionProvider, ORT_ENABLE_ALL"),
    "ort_int8": ("ONNX Runtime", "int8", "quantize_dynamic (QInt8 weights per channel; "
                 "reduce_range, 7-bit weights, on CPUs without VNNI, as its documentation "
                 "advises there)"),
    "ov": ("OpenVINO", "fp32", "INFERENCE_PRECISION_HINT f32"),
    "ov_bf16": ("OpenVINO", "bf16", "INFERENCE_PRECISION_HINT bf16"),
    "ov_int8": ("OpenVINO", "int8", "the NNCF-quantized IR, INFERENCE_PRECISION_HINT f32"),
}
VITC = ("vitc", "vitc_bf16", "vitc_int8", "vitc_int8w7")


def vitc_env(engine):
    """The environment a vitc engine's child adds: avx2-w7's 7-bit weights."""
    return {"VITC_LP_KERNEL": "avx2-w7"} if engine == "vitc_int8w7" else {}


def vitc_prec(engine):
    return ENGINES[engine][1]


def has_vnni(flags=None):
    flags = cpu_flags() if flags is None else flags
    return "avx512_vnni" in flags or "avx_vnni" in flags


def has_w7(flags=None):
    """vitc_int8w7 is run: AVX2 without VNNI, where it is faster int8."""
    flags = cpu_flags() if flags is None else flags
    return "avx2" in flags and not has_vnni(flags)
BF16 = ("torch_bf16", "ov_bf16")
# Engines bench.py times outside its own vitc and PyTorch fp32 children.
PEERS = tuple(e for e in ENGINES if e not in ("vitc", "torch") and e not in VITC)
CALIB = 300  # NNCF calibration samples (--calib)
# The models the engines run, by kind: the section title, bench.py's rows,
# the stem of the ONNX / IR files, and whether the output is an embedding
# (agreement by nearest neighbour) or logits (agreement by top-1).
MODELS = {
    "vit": {"title": "ViT-B/16", "rows": ("vit_b16_b1", "vit_b16_b8"), "stem": "vit_b_16",
            "embedder": False, "what": "the same random-init torchvision vit_b_16"},
    "dinov2": {"title": "DINOv2-B/14", "rows": ("dinov2_b14_b1", "dinov2_b14_b8"),
               "stem": "dinov2_b14", "embedder": True,
               "what": "the random-weight DINOv2-B/14 Hub directory of the dinov2_b14 rows "
                       "(transformers' Dinov2Model, pooler_output: the class token after the "
                       "final LayerNorm, 768 wide)"},
    "clip": {"title": "CLIP ViT-B/16", "rows": ("clip_b16_b1", "clip_b16_b8"), "stem": "clip_b16",
             "embedder": True,
             "what": "the random-weight CLIP ViT-B/16 image tower of the clip_b16 rows "
                     "(transformers' CLIPVisionModelWithProjection, image_embeds, 512 wide)"},
}
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# each kind's processor: resize of the shorter side, centre crop 224, mean/std
PREPROCESS = {"vit": (256, IMAGENET), "dinov2": (256, IMAGENET),
              "clip": (224, ((0.48145466, 0.4578275, 0.40821073),
                             (0.26862954, 0.26130258, 0.27577711)))}


def kind_of(name):
    """The model kind of one of bench.py's rows ('vit', 'dinov2', 'clip')."""
    for k, m in MODELS.items():
        if name in m["rows"]:
            return k
    raise ValueError("no engines for the row %r" % name)
PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "retina.jpg",
          "hubble_deep_field.jpg", "motorcycle_left.png", "motorcycle_right.png", "ihc.png",
          "camera.png", "moon.png", "coins.png", "grass.png", "gravel.png", "brick.png",
          "cell.png")


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_bf16(flags=None):
    flags = cpu_flags() if flags is None else flags
    return "avx512_bf16" in flags or "amx_bf16" in flags


def isa_line(flags=None):
    flags = cpu_flags() if flags is None else flags
    names = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile",
             "amx_bf16", "amx_int8")
    return ", ".join("%s %s" % (n, "yes" if n in flags else "no") for n in names)


def cpu_model():
    name, fam = "?", {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "model name" and name == "?":
                    name = v.strip()
                elif k in ("cpu family", "model", "stepping") and k not in fam:
                    fam[k] = v.strip()
                elif not line.strip():
                    break
    except OSError:
        pass
    if fam:
        name += " (family %s, model %s, stepping %s)" % (
            fam.get("cpu family", "?"), fam.get("model", "?"), fam.get("stepping", "?"))
    return name


def versions():
    """Child: each engine's version, or why it cannot be imported."""
    import importlib
    out = {}
    for mod in ("torch", "torchvision", "transformers", "onnx", "onnxruntime", "openvino",
                "nncf", "numpy"):
        try:
            m = importlib.import_module(mod)
            out[mod] = getattr(m, "__version__", None) or m.get_version()
        except Exception as e:  # noqa: BLE001  (a missing engine is reported, not fatal)
            out[mod] = "unavailable (%s)" % type(e).__name__
    print(json.dumps(out))


# --------------------------------------------------------------------------
# Inputs: real photos, ImageNet's transform
# --------------------------------------------------------------------------

def _photo_dir():
    import skimage
    return os.path.join(os.path.dirname(skimage.__file__), "data")


def _photos():
    from PIL import Image
    d = _photo_dir()
    return [Image.open(os.path.join(d, p)).convert("RGB") for p in PHOTOS
            if os.path.exists(os.path.join(d, p))]


def _normalize(im, kind="vit"):
    import numpy as np
    mean, std = PREPROCESS[kind][1]
    a = np.asarray(im, dtype=np.float32) / 255.0
    a = (a - np.array(mean, np.float32)) / np.array(std, np.float32)
    return a.transpose(2, 0, 1)


def _resize_center_crop(im, resize=256, crop=224):
    from PIL import Image
    w, h = im.size
    s = resize / min(w, h)
    im = im.resize((max(crop, round(w * s)), max(crop, round(h * s))), Image.BILINEAR)
    w, h = im.size
    x0, y0 = (w - crop) // 2, (h - crop) // 2
    return im.crop((x0, y0, x0 + crop, y0 + crop))


def check_input(batch, kind="vit"):
    """[batch, 3, 224, 224]: the first `batch` photos, resize 256, centre
    crop 224, ImageNet mean/std (torchvision's eval transform; CLIP: resize
    224 and CLIP's mean/std, as its processor)."""
    import numpy as np
    ims = _photos()
    return np.stack([_normalize(_resize_center_crop(ims[i % len(ims)], PREPROCESS[kind][0]), kind)
                     for i in range(batch)]).astype(np.float32)


def photo_count():
    return len([p for p in PHOTOS if os.path.exists(os.path.join(_photo_dir(), p))])


def calibration_inputs(n, seed=0, kind="vit"):
    """n [1, 3, 224, 224] samples: random resized crops (scale 0.25-1,
    aspect 3/4-4/3, torchvision's training transform) and flips of the
    photos, in turn, then the kind's normalisation."""
    import random

    import numpy as np
    from PIL import Image
    rng = random.Random(seed)
    ims = _photos()
    out = []
    for i in range(n):
        im = ims[i % len(ims)]
        w, h = im.size
        for _ in range(10):
            area = w * h * rng.uniform(0.25, 1.0)
            ar = rng.uniform(3 / 4, 4 / 3)
            cw, ch = int(round((area * ar) ** 0.5)), int(round((area / ar) ** 0.5))
            if cw <= w and ch <= h:
                break
        else:
            cw, ch = min(w, h), min(w, h)
        x0, y0 = rng.randint(0, w - cw), rng.randint(0, h - ch)
        c = im.crop((x0, y0, x0 + cw, y0 + ch)).resize((224, 224), Image.BILINEAR)
        if rng.random() < 0.5:
            c = c.transpose(Image.FLIP_LEFT_RIGHT)
        out.append(_normalize(c, kind)[None].astype(np.float32))
    return out


# --------------------------------------------------------------------------
# Once per run: the checkpoint and every engine's model file
# --------------------------------------------------------------------------

def export_pth(path):
    """Child: the random-init vit_b_16 state_dict with a random head."""
    import torch
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.vit_b_16()
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        m.heads.head.weight.normal_(0.0, 0.02, generator=g)
        m.heads.head.bias.normal_(0.0, 0.02, generator=g)
    torch.save(m.state_dict(), path)
    print(json.dumps({"status": "ok"}))


def _vit(pth):
    import torch
    import torchvision
    m = torchvision.models.vit_b_16().eval()
    sd = torch.load(pth)
    m.load_state_dict(sd)
    del sd
    return m


def _torch_model(kind, weights, attn="sdpa"):
    """The kind's PyTorch module on [B, 3, 224, 224] -> its output: the ViT's
    logits, or the embedding vitc returns (transformers' class loaded with
    from_pretrained from the Hub directory `weights`)."""
    if kind == "vit":
        return _vit(weights)
    import torch
    import transformers
    dino = kind == "dinov2"
    cls = transformers.Dinov2Model if dino else transformers.CLIPVisionModelWithProjection
    m, info = cls.from_pretrained(weights, attn_implementation=attn, output_loading_info=True)
    if info.get("missing_keys"):
        raise SystemExit("%s: weights missing from %s: %s" % (
            kind, weights, ", ".join(sorted(info["missing_keys"]))[:300]))

    class Embed(torch.nn.Module):
        """One tensor out, so that ONNX and OpenVINO see one output."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            o = self.m(pixel_values=x)
            return o.pooler_output if dino else o.image_embeds
    return Embed(m).eval()


def _step(res, name, f):
    """One preparation step f of a prepare child: its seconds into
    res["seconds"], or why it failed into res["errors"] (the engines that
    need it are then reported as failed, the others still run)."""
    t0 = time.perf_counter()
    try:
        f()
        res["seconds"][name] = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001  (reported; the other engines still run)
        res["errors"][name] = "%s: %s" % (type(e).__name__, str(e)[-300:])


def _prepare_steps(res, stem, export_onnx, calibration):
    """A prepare child's steps, each by _step and after the one it reads:
    export_onnx() writes stem.onnx; then ONNX Runtime's dynamic int8
    (stem_int8.onnx), the OpenVINO IR (stem_ov.xml) and its NNCF int8
    (stem_ov_int8.xml) calibrated on calibration(), a list of inputs."""
    import logging
    onnx_path = stem + ".onnx"

    def ort_int8():
        from onnxruntime.quantization import QuantType, quantize_dynamic
        logging.getLogger().setLevel(logging.ERROR)  # its "run pre-processing" advice
        # reduce_range: weights in [-64, 64]; ONNX Runtime advises it on
        # CPUs without VNNI, whose u8 x s8 vpmaddubsw saturates otherwise
        # (vitc's int8 does the same there: avx2-w7)
        quantize_dynamic(onnx_path, stem + "_int8.onnx",
                         weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=not has_vnni())

    def ov_ir():
        import openvino as ov
        ov.save_model(ov.Core().read_model(onnx_path), stem + "_ov.xml", compress_to_fp16=False)

    def ov_int8():
        import nncf
        import openvino as ov
        nncf.set_log_level(logging.ERROR)
        m = ov.Core().read_model(stem + "_ov.xml")
        data = calibration()
        q = nncf.quantize(m, nncf.Dataset(data), model_type=nncf.ModelType.TRANSFORMER,
                          subset_size=len(data))
        ov.save_model(q, stem + "_ov_int8.xml", compress_to_fp16=False)

    _step(res, "onnx_export", export_onnx)
    if "onnx_export" in res["seconds"]:
        _step(res, "ort_quantize_dynamic", ort_int8)
        _step(res, "openvino_ir", ov_ir)
        if "openvino_ir" in res["seconds"]:
            _step(res, "nncf_quantize", ov_int8)


def prepare(d, pth, calib, threads, kind="vit"):
    """Child: every file the peers load, under d (pth: the kind's weights,
    a .pth for the ViT, the Hub directory for the others); one JSON line
    with each step's seconds and, for any step that failed, why (the
    engines that need it are then reported as failed, the others still
    run)."""
    import torch
    torch.set_num_threads(threads)
    res = {"status": "ok", "seconds": {}, "errors": {}}

    stem = os.path.join(d, MODELS[kind]["stem"])
    onnx_path = stem + ".onnx"

    def export_onnx():
        import warnings
        m = _torch_model(kind, pth)
        # torchvision's ViT with grad enabled: under no_grad its
        # nn.MultiheadAttention takes a fused path the exporter refuses
        import contextlib
        with warnings.catch_warnings(), \
                (contextlib.nullcontext() if kind == "vit" else torch.no_grad()):
            warnings.simplefilter("ignore")
            torch.onnx.export(m, (torch.randn(1, 3, 224, 224),), onnx_path, input_names=["x"],
                              output_names=["y"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}},
                              opset_version=17, dynamo=False)

    _prepare_steps(res, stem, export_onnx, lambda: calibration_inputs(calib, kind=kind))
    res["calibration"] = calib
    res["photos"] = photo_count()
    print(json.dumps(res))


def needs(engine):
    """The prepare() step an engine's model comes from, or None."""
    return {"ort": "onnx_export", "ort_int8": "ort_quantize_dynamic", "ov": "openvino_ir",
            "ov_bf16": "openvino_ir", "ov_int8": "nncf_quantize"}.get(engine)


# --------------------------------------------------------------------------
# The child: one engine, one batch, one thread count
# --------------------------------------------------------------------------

def _build(engine, d, pth, st, batch, threads, kind="vit"):
    """(forward on a numpy batch -> numpy logits or embeddings, compile
    seconds or None)."""
    import numpy as np
    stem = os.path.join(d or "", MODELS[kind]["stem"])
    if engine in VITC:
        os.environ.update(vitc_env(engine))  # read by libvitc at its first use
        import vitc
        vitc.set_num_threads(threads)
        prec = vitc_prec(engine)
        if kind == "vit":
            m = vitc.VisionTransformer.from_safetensors(st, precision=prec)
        else:  # the Hub directory; its primary output is the embedding
            m = vitc.load_model(st, precision=prec)
        return (lambda x: np.asarray(m(x))), None
    if engine in ("torch", "torch_bf16", "compile"):
        import contextlib

        import torch
        m = _torch_model(kind, pth)
        ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if engine == "torch_bf16" \
            else contextlib.nullcontext
        if engine == "compile":
            m = torch.compile(m)

        def fwd(x):
            with torch.inference_mode(), ctx():
                return m(torch.from_numpy(x)).float().numpy()
        compile_s = None
        if engine == "compile":
            # the first call compiles; it is timed apart from the forwards
            t0 = time.perf_counter()
            fwd(np.zeros((batch, 3, 224, 224), np.float32))
            compile_s = time.perf_counter() - t0
        return fwd, compile_s
    if engine in ("ort", "ort_int8"):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        s = ort.InferenceSession(stem + ("_int8" if engine == "ort_int8" else "") + ".onnx",
                                 so, providers=["CPUExecutionProvider"])
        return (lambda x: s.run(None, {"x": x})[0]), None
    if engine in ("ov", "ov_bf16", "ov_int8"):
        import openvino as ov
        core = ov.Core()
        m = core.read_model(stem + ("_ov_int8" if engine == "ov_int8" else "_ov") + ".xml")
        m.reshape([batch, 3, 224, 224])  # a static shape, as deployed for a fixed batch
        cm = core.compile_model(m, "CPU", {
            "INFERENCE_PRECISION_HINT": "bf16" if engine == "ov_bf16" else "f32",
            "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"})
        req = cm.create_infer_request()
        return (lambda x: req.infer([x])[0].copy()), None
    raise SystemExit("unknown engine " + engine)


def engine_child(engine, d, pth, st, batch, threads, repeat, check, budget, kind="vit"):
    """Runs in a fresh process: warm up, time `repeat` forwards, print one
    JSON line (bench.py's torch_child's fields). repeat 0: the output on
    the check input only (the ViT: the logits of the first `batch` photos;
    an embedder: the embeddings of every photo, `batch` at a time, so that
    nearest neighbours can be compared)."""
    sys.path.insert(0, HERE)
    import bench as B
    import numpy as np
    if engine in ("torch", "torch_bf16", "compile"):
        import torch
        import torchvision  # noqa: F401  (imported before the baseline)
        torch.set_num_threads(threads)
        if kind != "vit":
            import transformers
            transformers.Dinov2Model, transformers.CLIPVisionModelWithProjection  # noqa: B018
    elif engine in ("ort", "ort_int8"):
        import onnxruntime  # noqa: F401
    elif engine.startswith("ov"):
        import openvino  # noqa: F401
    else:
        import vitc  # noqa: F401
    x = check_input(batch, kind)
    hwm_reset = B._reset_hwm()
    base = B._status_kb("VmRSS")
    f, compile_s = _build(engine, d, pth, st, batch, threads, kind)
    built_hwm, built = B._status_kb("VmHWM"), B._status_kb("VmRSS")
    if hwm_reset:
        B._reset_hwm()
    res = {"name": engine, "status": "ok", "threads": threads}
    times = []
    if repeat:
        warm, i = 0.0, 0
        while i < 1 or (warm < 0.3 and i < 50):
            t0 = time.perf_counter()
            f(x)
            warm += time.perf_counter() - t0
            i += 1
        for _ in range(repeat):
            t0 = time.perf_counter()
            f(x)
            times.append(1e3 * (time.perf_counter() - t0))
            if warm + 1e-3 * sum(times) > budget:
                break
    run_hwm = B._status_kb("VmHWM")
    if check:
        if MODELS[kind]["embedder"]:
            n = photo_count()
            xs = check_input(-(-n // batch) * batch, kind)
            y = np.concatenate([np.asarray(f(xs[i:i + batch]), dtype=np.float32)
                                for i in range(0, len(xs), batch)])[:n]
            res["rows"] = n
        else:
            y = np.asarray(f(x), dtype=np.float32)
        res["out"] = [round(float(v), 6) for v in y.ravel()]
    if compile_s is not None:
        res["compile_s"] = compile_s
    res.update({"times_ms": times, "base_rss_kb": base, "built_hwm_kb": built_hwm,
                "built_rss_kb": built, "run_hwm_kb": run_hwm, "hwm_reset": hwm_reset})
    print(json.dumps(res))


def paired_ms(v, other):
    """v's median over the rounds `other` ran in: the engines other than vitc
    and PyTorch fp32 run in the first --engine-rounds only, and a slow or
    fast spell of the machine in those rounds must weigh on both sides of a
    ratio (v's pooled median over every round otherwise)."""
    n, vt = len(other.get("round_times_ms") or []), v.get("round_times_ms") or []
    times = [t for r in vt[:n] if r for t in r]
    return statistics.median(times) if times and n < len(vt) else v["median_ms"]


def render(summary, kind, engines, agree, prep, args, fmt, cell):
    """The engines table of one model kind: every engine, batch 1 and 8."""
    M = MODELS[kind]
    L = ["## Engines: %s\n" % M["title"]]
    rows = [n for n in M["rows"] if n in summary]
    threads = sorted({int(c.split("-")[1]) for n in rows for c in summary[n]})
    if M["embedder"]:
        agreement = ("Agreement: max |y − y_ref| / max |y_ref| over the embeddings of every one of "
                     "scikit-image's %s photos (run `batch` at a time) against PyTorch eager "
                     "fp32, and in parentheses, instead of a top-1 class (an embedder has none), "
                     "the share of photos whose nearest neighbour by cosine similarity among "
                     "those photos is the same as under PyTorch eager fp32" % prep.get("photos", "?"))
    else:
        agreement = ("Agreement: max |y − y_ref| / max |y_ref| over the logits of a fixed batch "
                     "of real photos against PyTorch eager fp32, and in parentheses the share of "
                     "photos whose top-1 class matches")
    L.append("%s on every engine (bench/peers.py), each "
             "measurement a fresh process, median ms. \"÷ vitc\": the engine's time at its better "
             "thread count over vitc's at its better, in the same precision, vitc's median taken "
             "over the rounds the engine ran in (above 1×: vitc is faster). Memory: peak MB as "
             "in the summary (loading the model included). %s; above 0.25 it is "
             "marked as disagreeing (its speed then means nothing).\n"
             % (M["what"][0].upper() + M["what"][1:], agreement))
    cols = ["batch %d, %d thr ms" % (b, t) for b in (1, 8) for t in threads
            if M["rows"][b > 1] in rows]
    bs = "(%s)" % " / ".join("b" + n.rsplit("_b", 1)[1] for n in rows)
    L.append("| engine | precision | " + " | ".join(cols) + " | ÷ vitc %s | peak MB %s "
             "| agreement %s |" % (bs, bs, bs))
    L.append("|---|---|" + "---:|" * len(cols) + "---:|---:|---|")
    ref_of = {"fp32": "vitc", "bf16": "vitc_bf16", "int8": "vitc_int8"}

    def best(name, e):
        ok = [summary[name][c] for c in summary[name] if c.split("-")[0] == e
              and summary[name][c].get("status") == "ok"]
        return min(ok, key=lambda r: r["median_ms"]) if ok else None

    for e in [e for e in ENGINES if e in ("vitc", "torch") or e in engines]:
        lab, prec, _ = ENGINES[e]
        cells = []
        for b in (1, 8):
            n = M["rows"][b > 1]
            if n not in rows:
                continue
            for t in threads:
                r = summary[n].get("%s-%d" % (e, t), {})
                cells.append(fmt(r.get("median_ms"), ".1f") if r.get("status") == "ok" else
                             cell(r.get("status", "not run") + (": " + r["error"]
                                                                 if r.get("error") else ""))[:80])
        sp, mem, ag = [], [], []
        for n in rows:
            me, ref = best(n, e), best(n, ref_of[prec])
            sp.append(fmt(me["median_ms"] / paired_ms(ref, me), ".2f") + "×"
                      if me and ref and e != ref_of[prec] else "–")
            mem.append(fmt(me["peak_mb"], ".0f") if me else "–")
            a = agree.get(n, {}).get(e)
            if e == "torch":
                ag.append("reference")
            elif isinstance(a, (list, tuple)) and a[0] is not None:
                # int8 lands near 5e-2 on the ViT's random weights; an
                # export that computes something else lands near 1
                ag.append("%.1e (%.0f%%)%s" % (a[0], 100 * a[1],
                                               " **disagrees**" if a[0] > 0.25 else ""))
            else:
                ag.append(cell(str(a or "–"))[:60])
        L.append("| %s | %s | %s | %s | %s | %s |" % (lab, prec, " | ".join(cells), " / ".join(sp),
                                                      " / ".join(mem), " / ".join(ag)))
    L.append("")
    L.append("How each engine ran (threads: the column's count; every child also has "
             "OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS set to it):\n")
    for e in [e for e in ENGINES if e in ("vitc", "torch") or e in engines]:
        lab, prec, how = ENGINES[e]
        extra = ""
        if e in ("torch", "torch_bf16", "compile"):
            extra = "; torch.set_num_threads(threads)"
        if e == "compile":
            cs = ["%.0f" % x for n in rows for c in summary[n] if c.startswith("compile-")
                  for x in summary[n][c].get("compile_s", [])]
            extra += ("; the first call compiles and is not timed; compile seconds per child "
                      "(the first with an empty inductor cache, the others reusing this run's "
                      "cache): %s" % (", ".join(cs) or "–"))
        if e.startswith("ort"):
            extra = "; intra_op_num_threads = threads, inter_op_num_threads 1, sequential"
        if e.startswith("ov"):
            extra = ("; INFERENCE_NUM_THREADS = threads, NUM_STREAMS 1, PERFORMANCE_HINT "
                     "LATENCY, the model reshaped to the batch's static shape")
        if e == "ov_int8":
            extra += ("; NNCF %s (model_type TRANSFORMER) calibrated on %s samples: random "
                      "resized crops (scale 0.25–1) and flips of scikit-image's %s photos, "
                      "%s normalisation" % ("quantize", prep.get("calibration", "?"),
                                            prep.get("photos", "?"),
                                            "CLIP's" if kind == "clip" else "ImageNet's"))
        L.append("- %s %s: %s%s" % (lab, prec, how, extra))
    L.append("- the ONNX graph: torch.onnx.export%s, TorchScript exporter (dynamo=False), "
             "opset 17, batch axis dynamic; OpenVINO reads it and keeps fp32 weights "
             "(save_model compress_to_fp16=False)"
             % ("" if kind == "vit" else " of transformers' class (attn_implementation sdpa) "
                "wrapped to return the embedding alone"))
    if kind != "vit":
        L.append("- inputs: resize of the shorter side to %d, centre crop 224, %s mean/std "
                 "(the model's processor)" % (PREPROCESS[kind][0],
                                              "CLIP's" if kind == "clip" else "ImageNet's"))
    if prep.get("seconds"):
        L.append("- preparing the models took %.0f s: %s" % (
            prep.get("wall_s", 0), ", ".join("%s %.0f s" % kv for kv in prep["seconds"].items())))
    if args.engine_rounds < args.rounds:
        L.append("- the engines other than vitc and PyTorch eager fp32 ran in the first %d of "
                 "the %d rounds" % (args.engine_rounds, args.rounds))
    L.append("")
    return L


def rel_err(y, ref):
    """max |y - ref| / max |ref|, over every logit of the batch."""
    if not y or not ref or len(y) != len(ref):
        return None
    m = max(abs(v) for v in ref)
    return max(abs(a - b) for a, b in zip(y, ref)) / m if m else None


def top1_agree(y, ref, classes=1000):
    if not y or not ref or len(y) != len(ref):
        return None
    n = len(ref) // classes
    am = lambda v, i: max(range(classes), key=lambda c: v[i * classes + c])  # noqa: E731
    return sum(am(y, i) == am(ref, i) for i in range(n)) / n


def nn_agree(y, ref, rows):
    """The share of the `rows` embeddings whose nearest neighbour by cosine
    similarity (itself left out) is the same under y as under ref."""
    if not y or not ref or len(y) != len(ref) or rows < 2 or len(ref) % rows:
        return None
    d = len(ref) // rows

    def nearest(v):
        e = [v[i * d:(i + 1) * d] for i in range(rows)]
        e = [[a / (sum(t * t for t in r) ** 0.5 or 1.0) for a in r] for r in e]
        return [max((j for j in range(rows) if j != i),
                    key=lambda j: sum(a * b for a, b in zip(e[i], e[j]))) for i in range(rows)]
    return sum(a == b for a, b in zip(nearest(y), nearest(ref))) / rows


# --------------------------------------------------------------------------
# The shipped Fashion-MNIST model on every engine: accuracy, not speed
# --------------------------------------------------------------------------

FASHION_DIR = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist
FASHION_MODEL = os.path.join(os.path.dirname(HERE), "models", "fashion-vit.safetensors")
FM_ENGINES = ("vitc", "vitc_bf16", "vitc_int8", "vitc_int8w7", "torch", "torch_bf16", "ort",
              "ort_int8", "ov", "ov_bf16", "ov_int8")
# each engine's own fp32, which its top-1 agreement is measured against
FM_FP32 = {"vitc_bf16": "vitc", "vitc_int8": "vitc", "vitc_int8w7": "vitc", "torch_bf16": "torch",
           "ort_int8": "ort", "ov_bf16": "ov", "ov_int8": "ov"}
FM_BATCH = 500


def fashion_available(d=FASHION_DIR):
    return all(os.path.exists(os.path.join(d, s + ".gz")) or os.path.exists(os.path.join(d, s))
               for s in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
                         "train-images-idx3-ubyte"))


def _read_idx(stem, d=FASHION_DIR):
    import gzip

    import numpy as np
    p = os.path.join(d, stem + ".gz")
    with (gzip.open(p, "rb") if os.path.exists(p) else open(os.path.join(d, stem), "rb")) as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _fm_config(st):
    """The vitc.config of the model file (its safetensors metadata)."""
    import struct
    with open(st, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(json.loads(f.read(n))["__metadata__"]["vitc.config"])


def fashion_images(st, split="t10k", limit=0):
    """[n, C, S, S] float32 as `vitc eval` preprocesses them (x / 255, then
    the file's mean/std), and the labels."""
    import numpy as np
    c = _fm_config(st)
    C = c["in_channels"]
    x = _read_idx(split + "-images-idx3-ubyte")
    y = _read_idx(split + "-labels-idx1-ubyte").astype(np.int64)
    if limit:
        x, y = x[:limit], y[:limit]
    mean = np.array(c["mean"][:C], np.float32)[None, :, None, None]
    std = np.array(c["std"][:C], np.float32)[None, :, None, None]
    xf = np.repeat((x.astype(np.float32) / np.float32(255.0))[:, None], C, 1)
    return np.ascontiguousarray((xf - mean) / std, dtype=np.float32), y


def _fm_torch(st):
    """torchvision's VisionTransformer of the file's shape with its tensors
    (tools/torch_eval.py's build, which tests/python cross-check)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
    import torch_eval
    tensors, meta = torch_eval.load_safetensors(st)
    return torch_eval.build(meta, tensors)[0]


def fmnist_prepare(d, st, calib, threads):
    """Child: the Fashion-MNIST model's ONNX graph, its ORT dynamic int8,
    its OpenVINO IR and the NNCF int8 IR calibrated on `calib` training
    images (drawn at random, seed 0); prepare()'s JSON line."""
    import warnings

    import numpy as np
    import torch
    torch.set_num_threads(threads)
    res = {"status": "ok", "seconds": {}, "errors": {}, "calibration": calib}
    stem = os.path.join(d, "fmnist")
    onnx_path = stem + ".onnx"
    c = _fm_config(st)

    def export_onnx():
        m = _fm_torch(st)
        x = torch.zeros(1, c["in_channels"], c["image_size"], c["image_size"])
        # with grad enabled: under no_grad nn.MultiheadAttention takes its
        # fused fast path, which the ONNX exporter cannot export
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(m, (x,), onnx_path, input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, opset_version=17,
                              dynamo=False)

    def calibration():
        x, _ = fashion_images(st, "train")
        pick = np.random.default_rng(0).choice(len(x), size=min(calib, len(x)), replace=False)
        return [x[i:i + 1] for i in sorted(pick)]

    _prepare_steps(res, stem, export_onnx, calibration)
    print(json.dumps(res))


def fmnist_child(engine, d, st, threads, limit=0):
    """Child: `engine` over the Fashion-MNIST test set, FM_BATCH images at a
    time; one JSON line with every prediction and the accuracy."""
    import numpy as np
    x, y = fashion_images(st, "t10k", limit)
    b = min(FM_BATCH, len(x))
    if engine in VITC:
        os.environ.update(vitc_env(engine))
        import vitc
        vitc.set_num_threads(threads)
        m = vitc.VisionTransformer.from_safetensors(st, precision=vitc_prec(engine))
        f = lambda v: np.asarray(m(v))  # noqa: E731
    elif engine in ("torch", "torch_bf16"):
        import contextlib

        import torch
        torch.set_num_threads(threads)
        m = _fm_torch(st)
        ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if engine == "torch_bf16" \
            else contextlib.nullcontext

        def f(v):
            with torch.inference_mode(), ctx():
                return m(torch.from_numpy(v)).float().numpy()
    elif engine in ("ort", "ort_int8"):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        s = ort.InferenceSession(os.path.join(d, "fmnist%s.onnx" % (
            "_int8" if engine == "ort_int8" else "")), so, providers=["CPUExecutionProvider"])
        f = lambda v: s.run(None, {"x": v})[0]  # noqa: E731
    elif engine in ("ov", "ov_bf16", "ov_int8"):
        import openvino as ov
        core = ov.Core()
        m = core.read_model(os.path.join(d, "fmnist_ov%s.xml" % (
            "_int8" if engine == "ov_int8" else "")))
        m.reshape([b] + list(x.shape[1:]))
        cm = core.compile_model(m, "CPU", {
            "INFERENCE_PRECISION_HINT": "bf16" if engine == "ov_bf16" else "f32",
            "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1})
        req = cm.create_infer_request()
        f = lambda v: req.infer([v])[0].copy()  # noqa: E731
    else:
        raise SystemExit("unknown engine " + engine)
    t0 = time.perf_counter()
    pred = []
    for i in range(0, len(x), b):
        v = x[i:i + b]
        if len(v) < b:  # OpenVINO's static shape: the last batch padded
            v = np.concatenate([v, np.zeros((b - len(v),) + v.shape[1:], np.float32)])
        pred.extend(int(k) for k in np.argmax(f(v), 1)[:min(b, len(x) - i)])
    print(json.dumps({"status": "ok", "engine": engine, "n": len(pred),
                      "acc": float(np.mean(np.array(pred) == y)), "pred": pred,
                      "seconds": time.perf_counter() - t0}))


def fmnist_agree(res):
    """engine -> top-1 agreement with the same engine's fp32 predictions."""
    out = {}
    for e, r in res.items():
        ref = res.get(FM_FP32.get(e, e), {})
        if r.get("pred") and ref.get("pred") and len(r["pred"]) == len(ref["pred"]):
            out[e] = sum(a == b for a, b in zip(r["pred"], ref["pred"])) / len(r["pred"])
    return out


def fmnist_render(fm, fmt, cell):
    """## Fashion-MNIST: accuracy and agreement per engine."""
    res, prep = fm.get("results", {}), fm.get("prepare", {})
    agree = fmnist_agree(res)
    L = ["## Fashion-MNIST: accuracy and agreement per engine\n"]
    L.append("The shipped Fashion-MNIST model (%s) on every engine and precision over %s of the "
             "test set (Debian's dataset-fashion-mnist), %d images a call, preprocessed as "
             "`vitc eval` does. Accuracy: top-1 against the labels; agreement: the share of "
             "images whose top-1 class is the one the same engine predicts in fp32 (PyTorch "
             "eager bf16 against PyTorch eager fp32, ONNX Runtime int8 against ONNX Runtime "
             "fp32, ...). The PyTorch side is torchvision's VisionTransformer of the file's shape "
             "with its tensors (tools/torch_eval.py); ONNX Runtime and OpenVINO run its ONNX "
             "export (opset 17, TorchScript exporter); no timings.\n"
             % (fm.get("model", "?"), "the first %d images" % fm["limit"] if fm.get("limit")
                else "all 10,000 images", FM_BATCH))
    L.append("| engine | precision | images | accuracy | top-1 agreement with its fp32 |")
    L.append("|---|---|---:|---:|---:|")
    for e in FM_ENGINES:
        if e not in res:
            continue
        lab, prec, _ = ENGINES[e]
        r = res[e]
        if r.get("status") != "ok":
            L.append("| %s | %s | | %s | |" % (lab, prec, cell(r.get("status", "?") + ": " +
                                                           r.get("error", ""))[:100]))
            continue
        a = agree.get(e)
        L.append("| %s | %s | %d | %s%% | %s |" % (
            lab, prec, r["n"], fmt(100 * r["acc"], ".2f"),
            "reference" if e not in FM_FP32 else (fmt(100 * a, ".2f") + "%" if a is not None
                                                  else "–")))
    L.append("")
    if any(e.startswith(("ort", "ov")) for e in res):
        L.append("- ONNX Runtime int8: quantize_dynamic (QInt8 weights per channel; reduce_range "
                 "on CPUs without VNNI); OpenVINO "
                 "int8: NNCF quantize (model_type TRANSFORMER) calibrated on %s Fashion-MNIST "
                 "training images drawn at random; OpenVINO bf16: INFERENCE_PRECISION_HINT bf16"
                 % prep.get("calibration", "?"))
    for n in fm.get("notes", []):
        L.append("- " + n)
    L.append("")
    return L
