"""The Vision Transformer: torchvision- or timm-named safetensors in, logits
and attention maps out. Every number comes from libvitc."""
import ctypes
import os
import threading
import warnings

import numpy as np

from ._lib import VitConfig, as_f32, check, float_arg, fptr, int_arg, lib, path_arg, size_arg, str_arg

__all__ = ["VisionTransformer", "Model", "load_model"]


class _Session:
    """One thread's vitc_session on a model: its activations and scratch.
    Freed when the thread ends or the model goes (a session only frees its
    own buffers, so the order does not matter)."""

    __slots__ = ("h",)

    def __init__(self, model):
        h = ctypes.c_void_p()
        check(lib.vitc_session_create(model, ctypes.byref(h)))
        self.h = h

    def __del__(self):
        h, self.h = getattr(self, "h", None), None
        if h is not None and h.value and lib is not None:
            lib.vitc_session_free(h)


class VisionTransformer:
    """torchvision's VisionTransformer (eval mode) running in libvitc.

    >>> m = VisionTransformer.from_safetensors("vit_b_16.safetensors")
    >>> logits = m(images)                  # [B, 3, H, W] -> [B, num_classes]
    >>> attn, rollout = m.attention_maps(images)

    Inference (m(x), attention_maps; Model's embed and forward_features) runs
    on a vitc_session per Python thread, and ctypes releases the GIL during
    the call, so several threads may run one model at once. Calls that
    change the model (training mode, its forwards and backward, precision,
    parameters) hold self._lock; they must not overlap inference in other
    threads.
    """

    def __init__(self, image_size=224, patch_size=16, num_layers=12, num_heads=12,
                 hidden_dim=768, mlp_dim=3072, num_classes=1000, in_channels=3, dropout=0.0,
                 attention_dropout=0.0, drop_path=0.0, seed=0, *, mean=None, std=None,
                 labels=None, _handle=None):
        """A new model with torchvision's VisionTransformer.__init__
        initialisation drawn from seed (torchvision's constructor names).
        dropout and attention_dropout as torchvision's; drop_path: timm's
        stochastic depth, rising linearly over the blocks to this rate.
        mean, std: the input normalisation (1 value or 3; default ImageNet's
        for 3 channels, 0.5 otherwise) and labels: num_classes class names,
        both saved by save() into the file's vitc.config for the CLI."""
        self._lock = threading.RLock()
        self._tls = threading.local()  # .s: this thread's _Session
        self._h = None
        if _handle is None:
            c = lib.vitc_vit_default_config()
            c.image_size = size_arg(image_size, "image_size")
            c.patch_size = size_arg(patch_size, "patch_size")
            c.depth = size_arg(num_layers, "num_layers")
            c.num_heads = size_arg(num_heads, "num_heads")
            c.hidden_dim = size_arg(hidden_dim, "hidden_dim")
            c.mlp_dim = size_arg(mlp_dim, "mlp_dim")
            c.num_classes = size_arg(num_classes, "num_classes")
            c.in_channels = size_arg(in_channels, "in_channels")
            if c.in_channels != 3:  # ImageNet's statistics mean nothing there
                for i in range(3):
                    c.mean[i], c.std[i] = 0.5, 0.5
            for name, vals, dst in (("mean", mean, c.mean), ("std", std, c.std)):
                if vals is not None:
                    v = list(np.asarray(vals, dtype=np.float64).ravel())
                    if len(v) not in (1, 3):
                        raise ValueError("%s must have 1 or 3 values, got %d" % (name, len(v)))
                    for i in range(3):
                        dst[i] = float_arg(v[i % len(v)], name)
                        if name == "std" and not dst[i] > 0:
                            raise ValueError("std values must be > 0, got %r" % (v[i % len(v)],))
            h = ctypes.c_void_p()
            check(lib.vitc_vit_create(ctypes.byref(c), int_arg(seed, "seed", 0, 2**64 - 1),
                                      ctypes.byref(h)))
            _handle = h.value
        self._h = ctypes.c_void_p(_handle)
        self._last_batch = None
        self.set_dropout(dropout, attention_dropout, drop_path)
        c = lib.vitc_vit_get_config(self._h).contents
        self.config = {
            "image_size": c.image_size, "patch_size": c.patch_size, "in_channels": c.in_channels,
            "hidden_dim": c.hidden_dim, "depth": c.depth, "num_heads": c.num_heads,
            "mlp_dim": c.mlp_dim, "num_classes": c.num_classes, "norm_eps": c.norm_eps,
            "mean": list(c.mean), "std": list(c.std),
            "arch": _name(lib.vitc_vit_arch_name(self._h)),
        }
        self.config["family"] = _name(lib.vitc_vit_family(self._h))
        self.config["has_head"] = bool(lib.vitc_vit_has_head(self._h))
        self.config["num_prefix_tokens"] = lib.vitc_vit_num_prefix_tokens(self._h)
        self.config["ignored"] = [_name(lib.vitc_vit_ignored(self._h, i))
                                  for i in range(lib.vitc_vit_num_ignored(self._h))]
        self.labels = self._c_labels()
        if labels is not None:
            self.labels = labels

    def _c_labels(self):
        n = self.config["num_classes"]
        labels = [lib.vitc_vit_label(self._h, i) for i in range(n)]
        return None if labels and labels[0] is None else [_name(s) for s in labels]

    @property
    def labels(self):
        """Class names (saved by save()), or None."""
        return self._labels

    @labels.setter
    def labels(self, names):
        if names is not None:
            names = [str(x) for x in names]
            if len(names) != self.config["num_classes"]:
                raise ValueError("labels has %d names for %d classes"
                                 % (len(names), self.config["num_classes"]))
        self._labels = names

    @classmethod
    def from_safetensors(cls, path, arch=None, precision="fp32", attention_precision="auto"):
        """Load a checkpoint; the architecture comes from its vitc.config
        metadata, else `arch` ("vit_b_16", "vit_base_patch16_224", ...),
        else the tensors' names and shapes. precision: "fp32", "bf16" or
        "int8" arithmetic of the weight GEMMs (see `precision`);
        attention_precision: "auto", "fp32", "bf16" or "int8" (see
        `attention_precision`)."""
        m = cls(_handle=_load(path, arch, precision))
        m.attention_precision = attention_precision
        return m

    _PRECISIONS = ("fp32", "bf16", "int8")

    @property
    def precision(self):
        """"fp32", "bf16" or "int8": the arithmetic of the blocks' weight
        GEMMs in eval mode (LayerNorm, softmax, GELU, residuals, patch
        embedding and head stay fp32). Setting it packs the weights; in bf16
        and int8 the model's weights become the converted values."""
        return self._PRECISIONS[lib.vitc_vit_get_precision(self._h)]

    @precision.setter
    def precision(self, name):
        p = lib.vitc_precision_parse(str_arg(name, "precision"))
        if p < 0:
            raise ValueError("precision must be 'fp32', 'bf16' or 'int8', got %r" % (name,))
        with self._lock:
            check(lib.vitc_vit_set_precision(self._h, p))

    @property
    def attention_precision(self):
        """"fp32", "bf16" or "int8": the operands of the attention's q k^T
        and P v in eval mode now (bf16: rounded to nearest even, fp32 sums;
        int8: q and P per row as u8, k per key and v per channel as s8,
        int32 sums; the softmax in fp32 either way). Set it to "fp32",
        "bf16" or "int8" to fix it apart from `precision`, or to "auto" (the
        default) to let it follow `precision`: bf16 under bf16 weights (as
        torch.autocast runs attention) and int8 under int8 weights, on CPUs
        where it is the faster (AMD's; fp32 on Intel's), else fp32.
        Training forwards run fp32."""
        return self._PRECISIONS[lib.vitc_vit_get_attention_precision(self._h)]

    @attention_precision.setter
    def attention_precision(self, name):
        arg = str_arg(name, "attention_precision")
        auto = arg == b"auto"
        p = -1 if auto else lib.vitc_precision_parse(arg)
        if p not in (0, 1, 2) and not auto:
            raise ValueError("attention_precision must be 'auto', 'fp32', 'bf16' or 'int8', "
                             "got %r" % (name,))
        with self._lock:
            check(lib.vitc_vit_set_attention_precision_auto(self._h) if p < 0
                  else lib.vitc_vit_set_attention_precision(self._h, p))

    @staticmethod
    def precision_paths():
        """Which kernels bf16 and int8 run on this CPU (SIMD or the reference)."""
        return lib.vitc_get_precision_paths().decode()

    def __del__(self):
        # This thread's session first (others go with their threads or the
        # threading.local: a session frees only its own buffers).
        self._tls = None
        if getattr(self, "_h", None) and self._h.value:
            lib.vitc_vit_free(self._h)
            self._h = None

    def _session(self):
        """This thread's session handle for an inference call; None in
        training mode, whose forwards record on the model (under the lock).
        Weights changed since they were packed are packed again first."""
        if self.training:
            return None
        if not lib.vitc_vit_is_prepared(self._h):
            with self._lock:
                check(lib.vitc_vit_prepare(self._h))
        s = getattr(self._tls, "s", None)
        if s is None:
            s = self._tls.s = _Session(self._h)
        return s.h

    def _images(self, images):
        """images -> (x [B, C, H, W] float32, B, H, W) with B, H, W checked as C ints."""
        x = as_f32(images)
        if x.ndim == 3:
            x = x[None]
        c = self.config["in_channels"]
        if x.ndim != 4 or x.shape[1] != c:
            raise ValueError("images must be [B, %d, H, W] or [%d, H, W], got %s"
                             % (c, c, list(np.shape(images))))
        B, _, H, W = x.shape
        return x, int_arg(B, "batch size", 0), int_arg(H, "image height", 0), int_arg(W, "image width", 0)

    def __call__(self, images):
        """Logits [B, num_classes] (float32) for images [B, C, H, W] or
        [C, H, W], already normalised with config["mean"]/["std"]. In
        training mode the forward is recorded for backward()."""
        x, B, H, W = self._images(images)
        out = np.empty((B, self.config["num_classes"]), np.float32)
        s = self._session()
        if s is not None:
            self._last_batch = None
            check(lib.vitc_session_forward(s, fptr(x), B, H, W, fptr(out)))
        else:
            with self._lock:
                self._last_batch = None
                check(lib.vitc_vit_forward(self._h, fptr(x), B, H, W, fptr(out)))
                if self.training:
                    self._last_batch = B
                    self._last_shape = out.shape
        if (not self.training and not getattr(self, "_warned_flat", False) and B
                and out.shape[1] > 1 and np.all(out == out[:, :1])):
            # torchvision zero-initialises the head: say why every class reads 1/num_classes
            self._warned_flat = True
            warnings.warn("every class gets the same score: this model's classification head is "
                          "all zeros (an untrained or --random-init model); use trained weights",
                          RuntimeWarning, stacklevel=2)
        return out

    forward = __call__

    def preprocess(self, image, resize=None, crop=None):
        """A path or a uint8 [H, W, 3] array -> float32 [C, H', W'], the
        model's input for one image, as the vitc CLI prepares it.

        A Hub model: its own image processor (preprocessor_config.json, as
        transformers' slow PIL path computes it; a path is decoded as the
        processor converts to RGB: alpha over white where it has
        do_convert_rgb, else dropped). A torchvision checkpoint (vitc's own
        included): torchvision's eval transform, the resize of
        crop * 256 / 224 (256 for 224) antialiased bilinear, center crop to
        image_size, then config["mean"]/["std"]. Passing resize and/or crop
        asks for that transform at those sizes for any model. Other
        checkpoints (timm, T2T-ViT) come with their own transform, which the
        file does not record: ValueError saying how to pass one."""
        from .image import ALPHA_WHITE, _as_image, preprocess_image
        fam = self.config["family"]
        if resize is None and crop is None and lib.vitc_vit_has_processor(self._h):
            img, keep = _as_image(image, bool(lib.vitc_vit_image_flags(self._h) & ALPHA_WHITE))
            h, w = ctypes.c_int(), ctypes.c_int()
            check(lib.vitc_vit_preprocess_size(self._h, img.width, img.height, ctypes.byref(h),
                                               ctypes.byref(w)))
            out = np.empty((self.config["in_channels"], h.value, w.value), np.float32)
            check(lib.vitc_vit_preprocess(self._h, ctypes.byref(img), fptr(out)))
            del keep
            return out
        if resize is None and crop is None and fam != "torchvision":
            raise ValueError(
                "this %s checkpoint does not record its eval transform (timm's crop_pct and "
                "interpolation): pass one, e.g. m.preprocess(image, resize=248, crop=224) for "
                "torchvision's transform with this model's mean/std (crop_pct 0.9), or give "
                "m(x) your own normalised [B, %d, H, W] array" % (fam, self.config["in_channels"]))
        crop = self.config["image_size"] if crop is None else crop
        if resize is None:
            resize = int(crop) * 256 // 224  # the CLI's default (tools/cli.c)
        return preprocess_image(image, resize=resize, crop=crop, mean=self.config["mean"],
                                std=self.config["std"], channels=self.config["in_channels"])

    def attention_maps(self, images):
        """(attn [depth, B, heads, N, N], rollout [B, N, N]), N = prefix tokens + patches:
        every block's softmax probabilities and their attention rollout."""
        x, B, H, W = self._images(images)
        p = self.config["patch_size"]
        n = self.config["num_prefix_tokens"] + (H // p) * (W // p)
        attn = np.empty((self.config["depth"], B, self.config["num_heads"], n, n), np.float32)
        roll = np.empty((B, n, n), np.float32)
        s = self._session()
        if s is not None:
            check(lib.vitc_session_attention_maps(s, fptr(x), B, H, W, fptr(attn), fptr(roll)))
        else:
            with self._lock:
                check(lib.vitc_vit_attention_maps(self._h, fptr(x), B, H, W, fptr(attn),
                                                  fptr(roll)))
        return attn, roll

    # ---- training ---------------------------------------------------------

    def set_dropout(self, dropout=0.0, attention_dropout=0.0, drop_path=0.0):
        v = [float_arg(dropout, "dropout"), float_arg(attention_dropout, "attention_dropout"),
             float_arg(drop_path, "drop_path")]
        with self._lock:
            check(lib.vitc_vit_set_dropout(self._h, *v))
        self.dropout, self.attention_dropout, self.drop_path = v

    @property
    def training(self):
        return bool(lib.vitc_vit_is_training(self._h))

    def train(self, mode=True):
        """Training mode: forwards record for backward() and apply dropout."""
        with self._lock:
            lib.vitc_vit_set_training(self._h, 1 if mode else 0)
        return self

    def eval(self):
        return self.train(False)

    def _params(self):
        """[(name, shape, data pointer, grad pointer or None)] in state_dict order."""
        out = []
        for i in range(lib.vitc_vit_num_params(self._h)):
            name, nd = ctypes.c_char_p(), ctypes.c_int()
            shape = ctypes.POINTER(ctypes.c_int64)()
            data, grad = ctypes.POINTER(ctypes.c_float)(), ctypes.POINTER(ctypes.c_float)()
            check(lib.vitc_vit_param(self._h, i, ctypes.byref(name), ctypes.byref(nd),
                                     ctypes.byref(shape), ctypes.byref(data), ctypes.byref(grad)))
            out.append((name.value.decode(), tuple(shape[k] for k in range(nd.value)), data,
                        grad if grad else None))
        return out

    @staticmethod
    def _view(ptr, shape):
        return np.ctypeslib.as_array(ptr, shape=shape)

    def state_dict(self):
        """{torch name: float32 array (a copy)} in torchvision's order."""
        with self._lock:
            return {n: self._view(d, s).copy() for n, s, d, _ in self._params()}

    def load_state_dict(self, state_dict, strict=True):
        """Copy tensors in by torch name; every shape checked before any is
        written. strict: missing or unexpected keys are errors (KeyError)."""
        with self._lock:
            params = self._params()
            names = {n for n, _, _, _ in params}
            missing = [n for n in names if n not in state_dict]
            unexpected = [k for k in state_dict if k not in names]
            if strict and (missing or unexpected):
                raise KeyError("load_state_dict: missing %s, unexpected %s"
                               % (sorted(missing), sorted(unexpected)))
            src = {}
            for n, s, _, _ in params:
                if n in state_dict:
                    a = as_f32(np.asarray(state_dict[n]))
                    if a.shape != s:
                        raise ValueError("load_state_dict: %s has shape %s, expected %s"
                                         % (n, list(a.shape), list(s)))
                    src[n] = a
            for n, s, d, _ in params:
                if n in src:
                    self._view(d, s)[...] = src[n]

    def save(self, path):
        """safetensors with torch names and vitc.config metadata (readable by
        VisionTransformer.from_safetensors and the vitc CLI)."""
        with self._lock:
            check(lib.vitc_vit_save(self._h, path_arg(path)))
        if self.labels != self._c_labels():
            # the C model keeps the labels it was loaded with; names set in
            # Python go into the file's vitc.config the CLI reads
            import json
            from .io import load_safetensors, save_safetensors
            tensors, meta = load_safetensors(path)
            cfg = json.loads(meta["vitc.config"])
            if self.labels is None:
                cfg.pop("labels", None)
            else:
                cfg["labels"] = self.labels
            meta["vitc.config"] = json.dumps(cfg)
            save_safetensors(path, tensors, meta)

    def reset_head(self, num_classes, labels=None, seed=0):
        """A fresh classification head of num_classes outputs for fine-tuning
        (vitc_vit_reset_head: the family's classifier layout and init; CLIP
        and SigLIP get a linear classifier over their embedding). Every other
        weight is kept; labels: num_classes names or None."""
        num_classes = int_arg(num_classes, "num_classes", 1, 2**20)
        if labels is not None:
            labels = [str(x) for x in labels]
            if len(labels) != num_classes:
                raise ValueError("labels has %d names for %d classes" % (len(labels), num_classes))
            arr = (ctypes.c_char_p * num_classes)(*[x.encode() for x in labels])
        else:
            arr = None
        with self._lock:
            check(lib.vitc_vit_reset_head(self._h, num_classes, arr,
                                          int_arg(seed, "seed", 0, 2**64 - 1)))
        self.config["num_classes"] = num_classes
        self.config["has_head"] = bool(lib.vitc_vit_has_head(self._h))
        self._labels = self._c_labels()

    def backward(self, dlogits):
        """Gradients of the last training forward for dlogits, the gradient of
        what it returned ([B, num_classes] logits, or a backbone's [B, dim]
        embedding), accumulated into grads() as torch accumulates .grad."""
        g = as_f32(dlogits)
        with self._lock:
            if self._last_batch is None:
                raise RuntimeError("backward() needs a forward in training mode first "
                                   "(model.train(); y = model(x)); each forward "
                                   "allows one backward")
            want = tuple(getattr(self, "_last_shape", None)
                         or (self._last_batch, self.config["num_classes"]))
            if g.shape != want:
                raise ValueError("dlogits must be %s (the last forward's output), got %s"
                                 % (list(want), list(g.shape)))
            check(lib.vitc_vit_backward(self._h, fptr(g)))
            self._last_batch = None

    def grads(self):
        """{name: accumulated gradient (a copy)}; zeros before any backward.
        Names as the checkpoint spells them (a Hub model's own, q, k and v
        apart; torchvision's or timm's for their files)."""
        with self._lock:
            out = {}
            for n, s, _, gp in self._params():
                out[n] = self._view(gp, s).copy() if gp else np.zeros(s, np.float32)
        return self._checkpoint_names(out)

    def _checkpoint_names(self, grads):
        fam = self.config.get("family", "")
        if fam not in ("hf-vit", "hf-deit", "hf-dinov2", "hf-clip", "hf-siglip") + tuple(
                _CLIP_NAMES):
            return grads
        keys = _checkpoint_keys(getattr(self, "_path", None))
        if not keys:
            return grads
        if fam in _CLIP_NAMES:
            out = {}
            for n, g in grads.items():
                f = _clip_names(fam, n, keys)
                if f is None:
                    continue  # a zero bias the file does not have
                if f == "visual.proj":  # stored [width, embed], applied as x @ proj
                    g = g.T.copy()
                elif f in ("visual.class_embedding",):
                    g = g.reshape(-1)
                elif f == "visual.positional_embedding":
                    g = g.reshape(-1, g.shape[-1])
                out[f] = g
            return out
        swiglu = any(".mlp.weights_in." in k for k in keys)
        out = {}
        for n, g in grads.items():
            names = _hub_names(fam, n, keys, swiglu)
            if names is None:
                out[n] = g
                continue
            parts = len(names)
            for name, k in names:
                if k is None:  # CLIP's class_embedding [C], position_embedding [N, C]
                    if name.endswith("class_embedding"):
                        g = g.reshape(-1)
                    elif name.endswith("position_embedding.weight"):
                        g = g.reshape(-1, g.shape[-1])
                    out[name] = g
                else:
                    rows = g.shape[0] // parts
                    out[name] = g[k * rows:(k + 1) * rows].copy()
        return out

    def zero_grad(self):
        with self._lock:
            check(lib.vitc_vit_zero_grad(self._h))

    def __repr__(self):
        return "VisionTransformer(%s)" % ", ".join(
            "%s=%r" % (k, v) for k, v in self.config.items() if k not in ("mean", "std"))


_POOLS = {"default": 0, "cls": 1, "mean": 2, "tokens": 3}


class Model(VisionTransformer):
    """Any model vitc loads (torchvision, timm, Hugging Face Hub ViT/DeiT).

    >>> m = vitc.load_model("path/to/hub-dir")
    >>> y = m(images)              # logits of a classifier, else the default embedding
    >>> e = m.embed(images)        # [B, C] the family's pooled output
    >>> h = m.forward_features(images)   # [B, N, C] HF's last_hidden_state
    """

    def __call__(self, images):
        """The primary output: logits [B, num_classes] of a classifier, else
        the default embedding [B, dim] (embed(images)). In training mode the
        forward is recorded for backward(dy), dy the gradient of this output."""
        if self.config["has_head"]:
            return super().__call__(images)
        x, B, H, W = self._images(images)
        n = ctypes.c_int64()
        check(lib.vitc_vit_output_size(self._h, H, W, ctypes.byref(n)))
        out = np.empty((B, n.value), np.float32)
        s = self._session()
        if s is not None:
            self._last_batch = None
            check(lib.vitc_session_run(s, fptr(x), B, H, W, fptr(out)))
        else:
            with self._lock:
                self._last_batch = None
                check(lib.vitc_vit_run(self._h, fptr(x), B, H, W, fptr(out)))
                if self.training:
                    self._last_batch = B
                    self._last_shape = out.shape
        return out

    forward = __call__

    def embed(self, images, pool="default", normalize=False):
        """[B, C] ([B, patches, C] for pool="tokens"): pool is "default" (the
        family's pooled output: ViT/DeiT the class token after the final
        LayerNorm), "cls", "mean" (of the normed patch tokens) or "tokens".
        normalize: L2-normalise each embedding."""
        if pool not in _POOLS:
            raise ValueError("pool must be one of %s, got %r" % (sorted(_POOLS), pool))
        x, B, H, W = self._images(images)
        n = ctypes.c_int64()
        check(lib.vitc_vit_embed_size(self._h, _POOLS[pool], H, W, ctypes.byref(n)))
        out = np.empty((B, n.value), np.float32)
        s = self._session()
        if s is not None:
            check(lib.vitc_session_embed(s, fptr(x), B, H, W, _POOLS[pool], fptr(out)))
        else:
            with self._lock:
                check(lib.vitc_vit_embed(self._h, fptr(x), B, H, W, _POOLS[pool], fptr(out)))
        if pool == "tokens":
            out = out.reshape(B, -1, self.config["hidden_dim"])
        if normalize:
            out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        return out

    def forward_features(self, images):
        """Every token after the final LayerNorm: [B, prefix + patches, C]."""
        x, B, H, W = self._images(images)
        p = self.config["patch_size"]
        n = self.config["num_prefix_tokens"] + (H // p) * (W // p)
        out = np.empty((B, n, self.config["hidden_dim"]), np.float32)
        s = self._session()
        if s is not None:
            check(lib.vitc_session_forward_features(s, fptr(x), B, H, W, fptr(out)))
        else:
            with self._lock:
                check(lib.vitc_vit_forward_features(self._h, fptr(x), B, H, W, fptr(out)))
        return out

    # ---- the text tower (CLIP, SigLIP): libvitc's vitc_vit_*text* -------

    @property
    def has_text(self):
        """Whether the checkpoint has a text tower (CLIPModel, SiglipModel, open_clip)."""
        return bool(lib.vitc_vit_has_text(self._h))

    @property
    def text_dim(self):
        """The projected text features' width (0 without a text tower)."""
        return lib.vitc_vit_text_dim(self._h)

    @property
    def text_context(self):
        """The positions the text tower has (77 CLIP, 64 SigLIP; 0 without)."""
        return lib.vitc_vit_text_context(self._h)

    def _logit_params(self):
        scale, bias, has_bias = ctypes.c_float(), ctypes.c_float(), ctypes.c_int()
        check(lib.vitc_vit_logit_params(self._h, ctypes.byref(scale), ctypes.byref(bias),
                                        ctypes.byref(has_bias)))
        return scale.value, (bias.value if has_bias.value else None)

    @property
    def logit_scale(self):
        """exp(logit_scale): the zero-shot logits are logit_scale * cos + logit_bias."""
        return self._logit_params()[0]

    @property
    def logit_bias(self):
        """SigLIP's logit_bias; None for CLIP."""
        return self._logit_params()[1]

    @property
    def tokenizer(self):
        """The checkpoint's vitc.Tokenizer (borrowed from the model), or None."""
        h = lib.vitc_vit_tokenizer(self._h)
        if not h:
            return None
        from .text import Tokenizer
        return Tokenizer(_handle=h, _owner=self)

    def tokenize(self, text):
        """The ids the text tower sees: int32 [context] for a string, [B,
        context] for a list, padded as the model pads."""
        if not self.has_text:
            raise ValueError("this model has no text tower")
        tok = self.tokenizer
        if tok is None:
            # the library's message names the files to add
            self.encode_text(["x"])
        return tok(text, self.text_context)

    def encode_text(self, texts):
        """Projected text features float32 [B, text_dim], as transformers'
        get_text_features (not normalised): texts a list of strings (or
        one string: [1, text_dim]) or token ids int [B, L] (L <= context)."""
        if isinstance(texts, (str, bytes)):
            texts = [texts]
        if isinstance(texts, np.ndarray) or (len(texts) and not isinstance(texts[0], (str, bytes))):
            ids = np.asarray(texts)
            if ids.dtype.kind not in "iu":
                raise TypeError("token ids must be integers, got %s" % ids.dtype)
            if ids.ndim == 1:
                ids = ids[None]
            if ids.ndim != 2:
                raise ValueError("token ids must be [B, L], got shape %s" % (ids.shape,))
            if ids.size and (ids.min() < -2**31 or ids.max() >= 2**31):
                raise ValueError("token ids must fit in int32")
            ids = np.ascontiguousarray(ids, dtype=np.int32)
            B, L = int_arg(ids.shape[0], "batch"), int_arg(ids.shape[1], "length")
            out = np.empty((B, max(self.text_dim, 0)), np.float32)
            ip = ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
            s = self._session()
            if s is not None:
                check(lib.vitc_session_encode_text_ids(s, ip, B, L, fptr(out)))
            else:
                with self._lock:
                    check(lib.vitc_vit_encode_text_ids(self._h, ip, B, L, fptr(out)))
            return out
        texts = list(texts)
        if not self.has_text or self.tokenizer is None or not texts:
            # the library's error (no text tower, no tokenizer, empty batch)
            arr = (ctypes.c_char_p * max(len(texts), 1))()
            out = np.empty((1, max(self.text_dim, 1)), np.float32)
            with self._lock:
                check(lib.vitc_vit_encode_text(self._h, arr, len(texts), fptr(out)))
        return self.encode_text(self.tokenize(texts))

    # ---- zero-shot classification (src/text/zeroshot.c, docs/zero-shot.md) ----

    def _zs_classes(self, labels, templates):
        """Class embeddings [K, D]: each label in each template through the
        text tower, normalised, averaged per label, normalised again
        (vitc_zero_shot_classes). The last label set's are kept."""
        key = (tuple(labels), tuple(templates))
        cached = getattr(self, "_zs_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        K, T, D = len(labels), len(templates), self.text_dim
        text = np.empty((K * T, D), np.float32)
        prompts = [t.replace("{}", lab) for lab in labels for t in templates]
        for i in range(0, len(prompts), 256):
            text[i:i + 256] = self.encode_text(prompts[i:i + 256])
        classes = np.empty((K, D), np.float32)
        check(lib.vitc_zero_shot_classes(fptr(text), K, T, D, fptr(classes)))
        self._zs_cache = (key, classes)
        return classes

    def zero_shot(self, images, labels, templates=None, top=None):
        """Zero-shot classification of images by labels, the recipe of
        `vitc zero-shot`: per image a list of (label, prob), most probable
        first (the top ones when top is given). CLIP: the softmax over the
        labels of exp(logit_scale) * cos; SigLIP: each label's own
        sigmoid(exp(logit_scale) * cos + logit_bias).

        images: a path, a list of paths (preprocessed as preprocess() does),
        or preprocessed float32 [B, C, H, W] / [C, H, W]. labels: a list of
        strings (or one string of comma-separated labels). templates: None
        ("a photo of a {}."), "simple" or "imagenet80" (open_clip's template
        sets), or a list of strings each holding "{}" where the label goes.
        The last label set's class embeddings are kept on the model."""
        if not self.has_text:
            raise ValueError("this model has no text tower: zero-shot needs a checkpoint with "
                             "both towers (a Hub CLIPModel or SiglipModel directory)")
        if isinstance(labels, str):
            labels = [x.strip(" \t") for x in labels.split(",")]
        labels = list(labels)
        if not labels:
            raise ValueError("zero_shot needs one label at least")
        for i, lab in enumerate(labels):
            if not isinstance(lab, str):
                raise TypeError("label %d is a %s, not a string" % (i, type(lab).__name__))
            if not lab:
                raise ValueError("label %d is empty" % i)
        if templates is None:
            templates = ["a photo of a {}."]
        elif isinstance(templates, str) and templates in ("simple", "imagenet80"):
            n = ctypes.c_int()
            arr = lib.vitc_zero_shot_templates(templates.encode(), ctypes.byref(n))
            templates = [arr[i].decode() for i in range(n.value)]
        elif isinstance(templates, str):
            templates = [templates]
        templates = list(templates)
        if not templates:
            raise ValueError("templates must not be empty")
        for t in templates:
            if not isinstance(t, str) or "{}" not in t:
                raise ValueError("template %r has no {} where the label goes "
                                 "(e.g. \"a photo of a {}.\")" % (t,))
        if top is not None:
            top = int_arg(top, "top", 1)
        if isinstance(images, (str, bytes, os.PathLike)):
            images = [images]
        if isinstance(images, (list, tuple)) and images and \
                isinstance(images[0], (str, bytes, os.PathLike)):
            x = np.stack([self.preprocess(p) for p in images])
        else:
            x = as_f32(images)
        emb = self.embed(x)
        D = self.text_dim
        if emb.shape[1] != D:
            raise ValueError("the image embedding has %d floats, the text embedding %d: not one "
                             "CLIP/SigLIP pair" % (emb.shape[1], D))
        classes = self._zs_classes(labels, templates)
        scale, bias = self._logit_params()
        B, K = emb.shape[0], len(labels)
        probs = np.empty((B, K), np.float32)
        check(lib.vitc_zero_shot_probs(fptr(np.ascontiguousarray(emb)), B, fptr(classes), K, D,
                                       scale, 0.0 if bias is None else bias,
                                       int(bias is not None), fptr(probs)))
        out = []
        for b in range(B):
            order = sorted(range(K), key=lambda k: (-probs[b, k], k))
            out.append([(labels[k], float(probs[b, k])) for k in order[:top]])
        return out


def load_model(path, arch=None, precision="fp32", attention_precision="auto"):
    """A model from a safetensors file (torchvision/timm names) or a Hugging
    Face Hub directory (config.json + model.safetensors or a sharded index),
    or a Hub .safetensors with config.json beside it. precision and
    attention_precision as in VisionTransformer.from_safetensors."""
    m = Model(_handle=_load(path, arch, precision))
    m.attention_precision = attention_precision
    m._path = os.fspath(path) if isinstance(path, (str, bytes, os.PathLike)) else None
    return m


# ---- the checkpoint's own names of a Hub model's tensors -----------------
# vitc holds a Hub model under torchvision's names (q, k, v fused); grads()
# gives them back under the file's names, as the loader (vit_hub.c) read them.

def _checkpoint_keys(path):
    """The tensor names of a safetensors file, a Hub directory or its
    sharded index (headers only), or None."""
    import json
    import struct
    if path is None:
        return None
    if isinstance(path, bytes):
        path = path.decode()
    files = [path]
    if os.path.isdir(path):
        idx = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                return set(json.load(f)["weight_map"])
        files = [os.path.join(path, n) for n in ("model.safetensors", "open_clip_model.safetensors")
                 if os.path.exists(os.path.join(path, n))][:1]
    elif path.endswith(".index.json"):
        with open(path) as f:
            return set(json.load(f)["weight_map"])
    keys = set()
    for fn in files:
        try:
            with open(fn, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                keys |= set(json.loads(f.read(n))) - {"__metadata__"}
        except (OSError, ValueError):
            return None
    return keys


_HUB_VIT_LAYER = {"ln_1": "layernorm_before", "ln_2": "layernorm_after",
                  "self_attention.out_proj": "attention.output.dense",
                  "mlp.0": "intermediate.dense", "mlp.3": "output.dense"}
_HUB_DINO_LAYER = {"ln_1": "norm1", "ln_2": "norm2",
                   "self_attention.out_proj": "attention.output.dense", "mlp.0": "mlp.fc1",
                   "mlp.3": "mlp.fc2", "ls1.gamma": "layer_scale1.lambda1",
                   "ls2.gamma": "layer_scale2.lambda1"}
_HUB_CLIP_LAYER = {"ln_1": "layer_norm1", "ln_2": "layer_norm2",
                   "self_attention.out_proj": "self_attn.out_proj", "mlp.0": "mlp.fc1",
                   "mlp.3": "mlp.fc2"}
_HUB_VIT_MODEL = {"class_token": "embeddings.cls_token",
                  "conv_proj": "embeddings.patch_embeddings.projection",
                  "encoder.pos_embedding": "embeddings.position_embeddings",
                  "dist_token": "embeddings.distillation_token",
                  "reg_token": "embeddings.register_tokens", "encoder.ln": "layernorm"}
_HUB_CLIP_MODEL = {"class_token": "embeddings.class_embedding",
                   "conv_proj": "embeddings.patch_embedding",
                   "encoder.pos_embedding": "embeddings.position_embedding.weight",
                   "ln_pre": "pre_layrnorm", "encoder.ln": "post_layernorm",
                   "attn_pool.latent": "head.probe", "attn_pool.qkv.weight":
                   "head.attention.in_proj_weight", "attn_pool.qkv.bias":
                   "head.attention.in_proj_bias", "attn_pool.proj": "head.attention.out_proj",
                   "attn_pool.norm": "head.layernorm", "attn_pool.mlp": "head.mlp"}


# CLIP towers in open_clip's / OpenAI's names and in timm's (vit_hub.c's
# clip_names loaders): (model names, layer format, layer names).
_CLIP_NAMES = {
    "open-clip": ({"class_token": "visual.class_embedding", "conv_proj": "visual.conv1",
                   "encoder.pos_embedding": "visual.positional_embedding",
                   "ln_pre": "visual.ln_pre", "encoder.ln": "visual.ln_post",
                   "heads.head.weight": "visual.proj"},
                  "visual.transformer.resblocks.%s.",
                  {"ln_1": "ln_1", "ln_2": "ln_2", "self_attention.in_proj_weight":
                   "attn.in_proj_weight", "self_attention.in_proj_bias": "attn.in_proj_bias",
                   "self_attention.out_proj": "attn.out_proj", "mlp.0": "mlp.c_fc",
                   "mlp.3": "mlp.c_proj"}),
    "timm-clip": ({"class_token": "cls_token", "conv_proj": "patch_embed.proj",
                   "encoder.pos_embedding": "pos_embed", "ln_pre": "norm_pre",
                   "encoder.ln": "norm", "heads.head": "head"},
                  "blocks.%s.",
                  {"ln_1": "norm1", "ln_2": "norm2", "self_attention.in_proj_weight":
                   "attn.qkv.weight", "self_attention.in_proj_bias": "attn.qkv.bias",
                   "self_attention.out_proj": "attn.proj", "mlp.0": "mlp.fc1",
                   "mlp.3": "mlp.fc2"}),
}


def _clip_names(family, name, keys):
    """The file's name of vitc's tensor in a CLIP tower file, or None when
    the file has none (a zero bias)."""
    model, fmt, layer = _CLIP_NAMES[family]
    tab, pre, rest = model, "", name
    if name.startswith("encoder.layers.encoder_layer_"):
        i, rest = name[len("encoder.layers.encoder_layer_"):].split(".", 1)
        tab, pre = layer, fmt % i
    for key in sorted(tab, key=len, reverse=True):  # the longest module prefix
        if rest == key or rest.startswith(key + "."):
            got = pre + tab[key] + rest[len(key):]
            return got if got in keys else None
    return None


def _hub_names(family, name, keys, swiglu):
    """[(checkpoint name, rows slice or None)] of vitc's tensor name, [] when
    the file has no such tensor (a zero bias vitc keeps), None when unknown."""
    clip = family in ("hf-clip", "hf-siglip")
    layer_tab = (_HUB_CLIP_LAYER if clip else _HUB_DINO_LAYER if family == "hf-dinov2"
                 else _HUB_VIT_LAYER)
    heads = {"heads.head": "visual_projection" if family == "hf-clip" else "classifier",
             "heads.head_dist": "distillation_classifier"}
    cands = []
    if name.startswith("encoder.layers.encoder_layer_"):
        rest = name[len("encoder.layers.encoder_layer_"):]
        i, tail = rest.split(".", 1)
        lay = ("encoder.layers.%s." if clip else "encoder.layer.%s.") % i
        if tail.startswith("self_attention.in_proj_"):
            kind = tail.rsplit("_", 1)[1]  # weight / bias
            qkv = ("q_proj", "k_proj", "v_proj") if clip else ("query", "key", "value")
            pre = "self_attn." if clip else "attention.attention."
            cands = [[(lay + pre + q + "." + kind, k) for k, q in enumerate(qkv)]]
        else:
            base, _, leaf = tail.rpartition(".")
            if swiglu and base in ("mlp.0", "mlp.3"):
                cands = [[(lay + ("mlp.weights_in." if base == "mlp.0" else "mlp.weights_out.")
                           + leaf, None)]]
            elif tail in layer_tab:
                cands = [[(lay + layer_tab[tail], None)]]
            elif base in layer_tab:
                cands = [[(lay + layer_tab[base] + "." + leaf, None)]]
    else:
        tab = dict(_HUB_CLIP_MODEL if clip else _HUB_VIT_MODEL)
        tab.update(heads)
        base, _, leaf = name.rpartition(".")
        for key in sorted(tab, key=len, reverse=True):  # the longest module prefix
            if name == key or name.startswith(key + "."):
                cands = [[(tab[key] + name[len(key):], None)]]
                break
        if family == "hf-deit" and base == "heads.head":
            cands.insert(0, [("cls_classifier." + leaf, None)])
    if not cands:
        return None
    for c in cands:
        for pre in ("", "vit.", "deit.", "dinov2.", "dinov2_with_registers.", "vision_model."):
            got = [(pre + n if not n.startswith(("classifier", "cls_classifier",
                                                 "distillation_classifier",
                                                 "visual_projection")) else n, k) for n, k in c]
            if all(n in keys for n, _ in got):
                return got
    return []


def _name(b):
    """A name the library keeps in a C string: bytes a file gave it may not
    be UTF-8 (a name cut short, a label), and reading a model never fails
    over one; what cannot be decoded becomes U+FFFD."""
    return b.decode("utf-8", errors="replace")


def _load(path, arch, precision):
    """A model handle loaded in `precision` (vitc_vit_load_precision: each
    weight packed as it is read, so a bf16 / int8 load peaks near the
    converted model, not the fp32 file)."""
    p = lib.vitc_precision_parse(str_arg(precision, "precision"))
    if p < 0:
        raise ValueError("precision must be 'fp32', 'bf16' or 'int8', got %r" % (precision,))
    h = ctypes.c_void_p()
    check(lib.vitc_vit_load_precision(path_arg(path), str_arg(arch, "arch") if arch else None,
                                      p, ctypes.byref(h)))
    return h.value
