"""Training pieces over libvitc: cross-entropy, AdamW / SGD and gradient
clipping with torch.optim's semantics. Every number comes from the C library
(src/train/); this module only holds handles."""
import contextlib
import ctypes
import json

import numpy as np

from ._lib import (INT64_MAX, OPTIM_ADAMW, OPTIM_SGD, as_f32, check, float_arg, fptr, int_arg,
                   lib, path_arg)

__all__ = ["cross_entropy", "AdamW", "SGD", "clip_grad_norm_", "save_checkpoint",
           "load_checkpoint"]


def cross_entropy(logits, labels, label_smoothing=0.0):
    """F.cross_entropy(logits, labels, label_smoothing=...) with mean
    reduction -> (loss: float, dlogits: float32 [B, C] = d loss / d logits).

    logits [B, C] (or [C] for one sample), labels [B] integer class indices."""
    x = as_f32(logits)
    single = x.ndim == 1
    if single:
        x = x[None]
    if x.ndim != 2:
        raise ValueError("logits must be [B, C] or [C], got shape %s" % (x.shape,))
    y = np.ascontiguousarray(np.asarray(labels).reshape(-1))
    if y.dtype.kind not in "iub":
        raise TypeError("labels must be integer class indices, got dtype %s" % y.dtype)
    y = y.astype(np.int64)
    if y.shape[0] != x.shape[0]:
        raise ValueError("labels has %d entries for %d rows of logits" % (y.shape[0], x.shape[0]))
    d = np.empty_like(x)
    loss = ctypes.c_float()
    check(lib.vitc_cross_entropy(fptr(x), y.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                                 x.shape[0], x.shape[1], float_arg(label_smoothing, "label_smoothing"),
                                 ctypes.byref(loss), fptr(d)))
    return float(loss.value), (d[0] if single else d)


def _handle(model):
    """(C handle, create function, clip function) of a vitc model or layer."""
    h = getattr(model, "_h", None)
    if h is not None:
        return h, lib.vitc_optimizer_create_vit, lib.vitc_clip_grad_norm_vit
    h = getattr(model, "_ptr", None)
    if h is not None:
        return h, lib.vitc_optimizer_create_layer, lib.vitc_clip_grad_norm_layer
    raise TypeError("expected a vitc model or layer, got %r" % type(model).__name__)


def _setting(name, doc=None):
    """A float setting of the C optimizer (vitc_optimizer_get_NAME /
    vitc_optimizer_set_NAME) as a property, under the model's lock."""
    def get(self):
        with self._lock:
            return getattr(lib, "vitc_optimizer_get_" + name)(self._o)

    def set_(self, value):
        with self._lock:
            check(getattr(lib, "vitc_optimizer_set_" + name)(self._o, float_arg(value, name)))
    return property(get, set_, doc=doc)


class _Optimizer:
    """An optimizer over every parameter of a vitc model or layer (its
    gradients accumulate until zero_grad, as torch's)."""

    def __init__(self, model, cfg, layer_decay=None):
        h, create, _ = _handle(model)
        self._model = model  # keeps the model alive as long as the optimizer
        # The model's lock (one C object, calls take turns): a step never
        # runs while another thread's forward or backward uses the weights.
        self._lock = getattr(model, "_lock", None) or contextlib.nullcontext()
        self._o = ctypes.c_void_p()
        with self._lock:
            check(create(h, ctypes.byref(cfg), ctypes.byref(self._o)))
            if layer_decay is not None:
                check(lib.vitc_optimizer_set_layer_decay(
                    self._o, float_arg(layer_decay, "layer_decay")))

    def _names(self):
        """The tensors' names in state_dict order (the optimizer's indices)."""
        with self._lock:
            return [p[0] for p in self._model._params()]

    @property
    def lr_scales(self):
        """{tensor name: its lr multiplier} (layer-wise decay; 0: frozen),
        in state_dict order. The rate tensor i gets is lr * lr_scales[name]."""
        return {n: lib.vitc_optimizer_get_lr_scale(self._o, i)
                for i, n in enumerate(self._names())}

    def set_lr_scale(self, name, scale):
        """Tensor name (or index) is updated at lr * scale from now on; 0
        freezes it (neither it nor its optimizer state moves)."""
        names = self._names()
        i = names.index(name) if isinstance(name, str) else int_arg(name, "index")
        with self._lock:
            check(lib.vitc_optimizer_set_lr_scale(self._o, i, float_arg(scale, "scale")))

    def load_checkpoint(self, path):
        """The optimizer state and step saved in checkpoint path (this
        optimizer's kind, over a model of the checkpoint's shape)."""
        with self._lock:
            check(lib.vitc_checkpoint_load_optimizer(path_arg(path), self._o))

    def __del__(self):
        if getattr(self, "_o", None) is not None and self._o.value:
            lib.vitc_optimizer_free(self._o)
            self._o = None

    def step(self):
        with self._lock:
            check(lib.vitc_optimizer_step(self._o))

    def zero_grad(self):
        with self._lock:
            check(lib.vitc_optimizer_zero_grad(self._o))

    lr = _setting("lr")
    momentum = _setting("momentum", "SGD's momentum, AdamW's beta1 (what OneCycleLR cycles).")

    @property
    def step_count(self):
        return lib.vitc_optimizer_get_step(self._o)

    def state_dict(self):
        """{"step": n, "state": {name: float32 array in the flat parameter
        layout}} — copies, for checkpoints."""
        n = lib.vitc_optimizer_num_params(self._o)
        out = {}
        for i in range(lib.vitc_optimizer_num_states(self._o)):
            name, data = ctypes.c_char_p(), ctypes.POINTER(ctypes.c_float)()
            check(lib.vitc_optimizer_state(self._o, i, ctypes.byref(name), ctypes.byref(data)))
            out[name.value.decode()] = np.ctypeslib.as_array(data, shape=(n,)).copy()
        return {"step": lib.vitc_optimizer_get_step(self._o), "state": out}

    def load_state_dict(self, sd):
        n = lib.vitc_optimizer_num_params(self._o)
        for i in range(lib.vitc_optimizer_num_states(self._o)):
            name, data = ctypes.c_char_p(), ctypes.POINTER(ctypes.c_float)()
            check(lib.vitc_optimizer_state(self._o, i, ctypes.byref(name), ctypes.byref(data)))
            src = as_f32(sd["state"][name.value.decode()]).reshape(-1)
            if src.shape[0] != n:
                raise ValueError("state %s has %d values, expected %d"
                                 % (name.value.decode(), src.shape[0], n))
            np.ctypeslib.as_array(data, shape=(n,))[:] = src
        check(lib.vitc_optimizer_set_step(self._o, int_arg(sd["step"], "step", 0, INT64_MAX)))


class AdamW(_Optimizer):
    """torch.optim.AdamW(model.parameters(), lr, betas, eps, weight_decay,
    amsgrad). decay_all=False (default) leaves biases, norm weights, the
    class token and the position embedding undecayed; True decays every
    tensor as torch over model.parameters() does. layer_decay=F (a model's
    optimizer): BEiT's layer-wise lr decay, block l of L at lr * F**(L - l),
    the embeddings F**(L + 1), the final norm and head 1 (see lr_scales)."""

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, decay_all=False, layer_decay=None):
        cfg = lib.vitc_optim_default_config(OPTIM_ADAMW)
        b1, b2 = betas
        cfg.lr, cfg.eps = float_arg(lr, "lr"), float_arg(eps, "eps")
        cfg.beta1, cfg.beta2 = float_arg(b1, "betas[0]"), float_arg(b2, "betas[1]")
        cfg.weight_decay = float_arg(weight_decay, "weight_decay")
        cfg.amsgrad, cfg.decay_all = int(bool(amsgrad)), int(bool(decay_all))
        super().__init__(model, cfg, layer_decay)

    @property
    def betas(self):
        c = lib.vitc_optimizer_get_config(self._o).contents
        return (c.beta1, c.beta2)


class SGD(_Optimizer):
    """torch.optim.SGD(model.parameters(), lr, momentum, dampening,
    weight_decay, nesterov); decay_all as for AdamW."""

    def __init__(self, model, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, decay_all=False, layer_decay=None):
        cfg = lib.vitc_optim_default_config(OPTIM_SGD)
        cfg.lr, cfg.momentum = float_arg(lr, "lr"), float_arg(momentum, "momentum")
        cfg.dampening = float_arg(dampening, "dampening")
        cfg.weight_decay = float_arg(weight_decay, "weight_decay")
        cfg.nesterov, cfg.decay_all = int(bool(nesterov)), int(bool(decay_all))
        super().__init__(model, cfg, layer_decay)


def clip_grad_norm_(model, max_norm):
    """torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm): scales
    every gradient by min(1, max_norm / (norm + 1e-6)); returns the total L2
    norm before clipping. model: a vitc model, layer or optimizer."""
    total = ctypes.c_float()
    if isinstance(model, _Optimizer):
        with model._lock:
            check(lib.vitc_clip_grad_norm_optimizer(model._o, float_arg(max_norm, "max_norm"),
                                                    ctypes.byref(total)))
    else:
        h, _, clip = _handle(model)
        with getattr(model, "_lock", None) or contextlib.nullcontext():
            check(clip(h, float_arg(max_norm, "max_norm"), ctypes.byref(total)))
    return float(total.value)


def save_checkpoint(path, model, optimizer=None, meta=None):
    """A training checkpoint (vitc_checkpoint_save): the model (a file every
    vitc command loads, with model.labels), the optimizer's state and step
    when given, and meta (a JSON-able dict: epoch, step, your
    hyperparameters) under "vitc.train". The file is replaced atomically.
    `vitc train --resume` reads the files it writes itself; a checkpoint saved
    here resumes in Python (load_checkpoint)."""
    h = getattr(model, "_h", None)
    if h is None:
        raise TypeError("save_checkpoint: expected a vitc model, got %r" % type(model).__name__)
    if optimizer is not None and not isinstance(optimizer, _Optimizer):
        raise TypeError("optimizer must be a vitc AdamW or SGD, got %r" % type(optimizer).__name__)
    if optimizer is not None and optimizer._model is not model:
        raise ValueError("save_checkpoint: the optimizer is over another model")
    if meta is not None and not isinstance(meta, dict):
        raise TypeError("meta must be a dict, got %r" % type(meta).__name__)
    text = json.dumps(meta if meta is not None else {}).encode()
    labels = getattr(model, "labels", None)
    c_labels = None
    if labels is not None and len(labels) == lib.vitc_vit_get_config(h).contents.num_classes:
        c_labels = (ctypes.c_char_p * len(labels))(*[str(x).encode() for x in labels])
    with getattr(model, "_lock", None) or contextlib.nullcontext():
        check(lib.vitc_checkpoint_save(path_arg(path), h,
                                       optimizer._o if optimizer is not None else None,
                                       c_labels, text))


def load_checkpoint(path, optimizer=None):
    """(model, meta) from a checkpoint (save_checkpoint's or `vitc train`'s):
    meta is its "vitc.train" record as a dict (with "optimizer_step").
    optimizer: a function of the model making its optimizer (AdamW, or
    lambda m: vitc.AdamW(m, lr=...)): then (model, optimizer, meta) with the
    saved state and step restored into it, so training continues exactly."""
    from .vit import Model
    h, text = ctypes.c_void_p(), ctypes.c_void_p()
    check(lib.vitc_checkpoint_load(path_arg(path), ctypes.byref(h), ctypes.byref(text)))
    try:
        meta = json.loads(ctypes.string_at(text.value).decode()) if text.value else {}
    finally:
        lib.vitc_checkpoint_free_meta(text)
    model = Model(_handle=h.value)
    if optimizer is None:
        return model, meta
    opt = optimizer(model)
    if not isinstance(opt, _Optimizer):
        raise TypeError("optimizer(model) must return a vitc AdamW or SGD, got %r"
                        % type(opt).__name__)
    opt.load_checkpoint(path)
    return model, opt, meta
