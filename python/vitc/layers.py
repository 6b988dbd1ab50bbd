"""The attention layers of the seeds, as torch-like classes over libvitc.

Each class is a preset of the C attention engine (src/layers/engine.c):
construct it like its PyTorch module, load a PyTorch state_dict with
load_state_dict (numpy arrays or torch tensors under the torch key names),
switch train()/eval(), and call it on any array-like; outputs are float32
numpy arrays. Every number comes from the C library.

    >>> import numpy as np, vitc
    >>> sa = vitc.SelfAttention(32, norm="group").eval()
    >>> y = sa(np.random.randn(2, 32, 16, 16))
    >>> y.shape
    (2, 32, 16, 16)
"""
import ctypes
import threading

import numpy as np

from ._lib import (MAX_NDIM, LayerConfig, LayerKind, MaskType, MhaArgs, Status, TensorList,
                   TensorView, VitcError, as_f32, c_float_p, c_int64_p, check, float_arg, fptr,
                   int_arg, lib, shape_arr, size_arg, str_arg)

__all__ = ["AttentionBlock", "ConvSABlock", "SelfAttention", "SelfAttentionMultiHead",
           "MultiheadAttention", "T2TAttention", "SingleHeadAttention",
           "scaled_dot_product_attention", "softmax"]

_ATTENTION_BLOCK, _CONV_SA_BLOCK, _SA_GROUP, _SA_BATCH, _SA_MULTIHEAD, _MHA, _T2T, _SINGLE_HEAD = LayerKind


def _view(a):
    v = TensorView()
    if a is not None:
        if a.ndim > MAX_NDIM:
            raise VitcError(Status.ERR_SHAPE, "arrays of more than %d dimensions are not supported "
                            "(got %d)" % (MAX_NDIM, a.ndim))
        v.data = a.ctypes.data
        v.ndim = a.ndim
        for i, s in enumerate(a.shape):
            v.shape[i] = s
    return v


def _mask(m, name):
    """A mask as (contiguous array, vitc_mask_type): bool -> 0/1 bytes, float -> float32.
    uint8 and other integer masks are refused, as torch 2.x refuses them."""
    if m is None:
        return None, MaskType.NONE
    if hasattr(m, "detach"):
        m = m.detach().cpu().numpy()
    m = np.asarray(m)
    if m.dtype == np.bool_:
        return np.require(m, np.uint8, ("C", "A")), MaskType.BOOL
    if np.issubdtype(m.dtype, np.floating):
        return as_f32(m), MaskType.FLOAT
    raise TypeError("%s must be bool or floating point, got %s (as in torch 2.x; for a 0/1 mask "
                    "pass mask.astype(bool))" % (name, m.dtype))


def _arr(x, name=None):
    """x (numpy or torch) as a float32 array; with a name, one of at most
    MAX_NDIM dims (the layer calls' limit)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    x = as_f32(x)
    if name is not None and x.ndim > MAX_NDIM:
        raise VitcError(Status.ERR_SHAPE, "%s has %d dimensions (at most %d)" % (name, x.ndim, MAX_NDIM))
    return x


def _qkv(query, key, value):
    """query, key, value as float32 arrays, their leading dims broadcast to
    one shape (contiguous) when all three have >= 2 dims."""
    q, k, v = _arr(query), _arr(key), _arr(value)
    if q.ndim >= 2 and k.ndim >= 2 and v.ndim >= 2:
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        q = np.ascontiguousarray(np.broadcast_to(q, lead + q.shape[-2:]))
        k = np.ascontiguousarray(np.broadcast_to(k, lead + k.shape[-2:]))
        v = np.ascontiguousarray(np.broadcast_to(v, lead + v.shape[-2:]))
    return q, k, v


class _Layer:
    """One vitc_layer: the engine configured as a seed block.

    The C layer keeps its scratch (and BatchNorm statistics) inside itself and
    ctypes releases the GIL during a call, so every C call on self._ptr holds
    self._lock: one module may be called from several threads."""

    _norm_prefix = None  # "norm." for BatchNorm presets (num_batches_tracked)

    def __init__(self, kind, seed=None, **fields):
        """fields: vitc_layer_config values, already checked with size_arg/int_arg/float_arg
        under the user's argument names."""
        # Like torch: a fresh module has random weights; np.random.seed makes them repeatable.
        if seed is None:
            seed = int(np.random.randint(0, 2**62, dtype=np.int64))
        # torch.manual_seed's range; a negative seed wraps to uint64 as there.
        seed = int_arg(seed, "seed", -2**63, 2**64 - 1) % 2**64
        cfg = lib.vitc_layer_default_config(kind)
        for k, v in fields.items():
            setattr(cfg, k, v)
        self._cfg = cfg
        self._lock = threading.RLock()
        self._ptr = ctypes.c_void_p()
        check(lib.vitc_layer_create(ctypes.byref(cfg), ctypes.byref(self._ptr)))
        check(lib.vitc_layer_reset_parameters(self._ptr, seed))
        self.training = True
        self.num_batches_tracked = 0

    def __repr__(self):
        c = self._cfg
        norm = c.kind in (_SA_GROUP, _SA_BATCH, _SA_MULTIHEAD)
        shown = [f for f, _ in LayerConfig._fields_[1:] if getattr(c, f) and (norm or f not in ("eps", "momentum"))]
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%g" % (f, getattr(c, f)) for f in shown))

    def __del__(self):
        p = getattr(self, "_ptr", None)
        if p:
            lib.vitc_layer_free(p)
            self._ptr = None

    # -- parameters ----------------------------------------------------
    def _params(self):
        """[(name, view into the layer's memory)]; call with self._lock held."""
        name, ndim = ctypes.c_char_p(), ctypes.c_int()
        shape, data = c_int64_p(), c_float_p()
        out = []
        for i in range(lib.vitc_layer_num_params(self._ptr)):
            check(lib.vitc_layer_param(self._ptr, i, ctypes.byref(name), ctypes.byref(ndim),
                                       ctypes.byref(shape), ctypes.byref(data)))
            shp = tuple(shape[j] for j in range(ndim.value))
            n = int(np.prod(shp, dtype=np.int64))
            buf = (ctypes.c_float * max(n, 1)).from_address(ctypes.addressof(data.contents))
            buf._owner = self  # a view keeps the layer (and so its memory) alive
            out.append((name.value.decode(), np.frombuffer(buf, np.float32, n).reshape(shp)))
        return out

    def state_dict(self):
        """Parameters and buffers under the PyTorch key names (copies), in torch's order."""
        sd = {}
        with self._lock:  # a consistent snapshot: no forward updates running stats meanwhile
            for k, a in self._params():
                sd[k] = a.copy()
                if self._norm_prefix and k == self._norm_prefix + "running_var":
                    sd[self._norm_prefix + "num_batches_tracked"] = np.array(self.num_batches_tracked, dtype=np.int64)
        return sd

    def parameters(self):
        """Views into the layer's own memory (writes change the layer)."""
        with self._lock:
            return dict(self._params())

    def load_state_dict(self, state_dict, strict=True):
        """Load tensors by PyTorch key name. Missing or mis-shaped keys raise
        VitcError naming the key and both shapes; unexpected keys too when strict."""
        names, arrays = [], []
        for k, v in state_dict.items():
            names.append(str(k))
            arrays.append(_arr(v))
        n = len(names)
        c_names = (ctypes.c_char_p * max(n, 1))(*[str_arg(s, "key") for s in names])
        t = TensorList(arrays)
        with self._lock:
            check(lib.vitc_layer_load(self._ptr, n, c_names, t.ndims, t.shapes, t.data, 1 if strict else 0))
            if self._norm_prefix:
                nbt = state_dict.get(self._norm_prefix + "num_batches_tracked")
                if nbt is not None:
                    self.num_batches_tracked = int(np.asarray(_arr(nbt)).reshape(-1)[0]) if np.size(nbt) else 0

    # -- modes ----------------------------------------------------------
    def train(self, mode=True):
        with self._lock:
            self.training = bool(mode)
            lib.vitc_layer_set_training(self._ptr, 1 if mode else 0)
        return self

    def eval(self):
        return self.train(False)

    # -- forward --------------------------------------------------------
    def forward(self, x):
        x = _arr(x, "input")
        shp = shape_arr(x.shape)
        ond = ctypes.c_int()
        osh = (ctypes.c_int64 * MAX_NDIM)()
        with self._lock:
            check(lib.vitc_layer_output_shape(self._ptr, x.ndim, shp, ctypes.byref(ond), osh))
            out = np.empty(tuple(osh[i] for i in range(ond.value)), dtype=np.float32)
            check(lib.vitc_layer_forward(self._ptr, fptr(x), x.ndim, shp, fptr(out)))
            if self._norm_prefix and self.training:
                self.num_batches_tracked += 1
            self._in_shape = x.shape if self.training else None
        return out

    # -- training -------------------------------------------------------
    def backward(self, dy):
        """Gradient of the last training-mode forward: returns dx (the input's
        shape) and accumulates every parameter's gradient (see grads())."""
        dy = _arr(dy, "dy")
        with self._lock:
            shape = self._recorded()
            dx = np.empty(shape, dtype=np.float32)
            check(lib.vitc_layer_backward(self._ptr, fptr(dy), dy.ndim, shape_arr(dy.shape), fptr(dx)))
        return dx

    def _recorded(self):
        """The input shape(s) the last training-mode forward kept (under the lock)."""
        shape = getattr(self, "_in_shape", None)
        if shape is None:
            raise VitcError(Status.ERR_INVALID_ARG, "%s.backward: no training-mode forward recorded "
                            "(call train() and forward first)" % type(self).__name__)
        return shape

    def grads(self):
        """Accumulated gradients (copies) under the torch key names; buffers have none."""
        out = {}
        ndim, shape, data = ctypes.c_int(), c_int64_p(), c_float_p()
        with self._lock:
            for k, _ in self._params():
                if k.endswith("running_mean") or k.endswith("running_var"):
                    continue
                check(lib.vitc_layer_grad(self._ptr, k.encode(), ctypes.byref(ndim), ctypes.byref(shape),
                                          ctypes.byref(data)))
                shp = tuple(shape[j] for j in range(ndim.value))
                n = int(np.prod(shp, dtype=np.int64))
                out[k] = np.ctypeslib.as_array(data, shape=(max(n, 1),))[:n].reshape(shp).copy()
        return out

    def zero_grad(self):
        with self._lock:
            check(lib.vitc_layer_zero_grad(self._ptr))

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class AttentionBlock(_Layer):
    """Patch conv (kernel = stride = patch_size) then single- or multi-head
    self-attention with to_q/to_k/to_v/to_out: [B, C, H, W] -> [B, N, embed_dim]."""

    def __init__(self, in_channels=3, patch_size=4, embed_dim=64, heads=1, seed=None):
        super().__init__(_ATTENTION_BLOCK, seed, in_channels=size_arg(in_channels, "in_channels"),
                         patch_size=size_arg(patch_size, "patch_size"),
                         embed_dim=size_arg(embed_dim, "embed_dim"), num_heads=size_arg(heads, "heads"))


class ConvSABlock(_Layer):
    """SAGAN-style attention with 1x1 convs: gamma * attn + x, [B, C, H, W] -> same."""

    def __init__(self, in_channels, seed=None):
        super().__init__(_CONV_SA_BLOCK, seed, in_channels=size_arg(in_channels, "in_channels"))


class SelfAttention(_Layer):
    """Norm, q/k/v, attention, proj, + input on [B, ni, H, W]. norm="group":
    GroupNorm(1, ni) and separate q/k/v (diffusers' AttentionBlock names are
    accepted too); norm="batch": BatchNorm2d(ni) and a fused qkv Linear."""

    def __init__(self, ni, norm="group", seed=None):
        if norm not in ("group", "batch"):
            raise ValueError('norm must be "group" or "batch", got %r' % (norm,))
        self._norm_prefix = "norm." if norm == "batch" else None
        super().__init__(_SA_GROUP if norm == "group" else _SA_BATCH, seed, in_channels=size_arg(ni, "ni"))


class SelfAttentionMultiHead(_Layer):
    """SelfAttention with BatchNorm and nheads heads in the seed's per-head qkv layout."""

    _norm_prefix = "norm."

    def __init__(self, ni, nheads, seed=None):
        super().__init__(_SA_MULTIHEAD, seed, in_channels=size_arg(ni, "ni"),
                         num_heads=size_arg(nheads, "nheads"))


class T2TAttention(_Layer):
    """Tokens-to-Token ViT attention: [B, N, dim] -> [B, N, chan], out = v + proj(attn)."""

    def __init__(self, dim, chan, num_heads=1, qkv_bias=False, qk_scale=None, seed=None):
        super().__init__(_T2T, seed, in_channels=size_arg(dim, "dim"), embed_dim=size_arg(chan, "chan"),
                         num_heads=size_arg(num_heads, "num_heads"), bias=1 if qkv_bias else 0,
                         qk_scale=float_arg(qk_scale or 0.0, "qk_scale"))


class SingleHeadAttention(_Layer):
    """The NumPy seed: x @ W_q, x @ W_k, x @ W_v, attention, @ W_o (no biases)."""

    def __init__(self, embedding_dim, d_k, seed=None):
        super().__init__(_SINGLE_HEAD, seed, in_channels=size_arg(embedding_dim, "embedding_dim"),
                         embed_dim=size_arg(d_k, "d_k"))


class MultiheadAttention(_Layer):
    """torch.nn.MultiheadAttention (torch 2.x forward semantics, its general path).

    Bool masks: True means "not allowed"; float masks are added to the
    scores; both masks are made float and added (uint8 masks are refused, as
    in torch 2.x). A query row whose keys are all masked gives NaN when the
    weights are returned (need_weights=True), else 0 (torch's SDPA path);
    torch's eval-mode fast path gives NaN there in both cases."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, seed=None):
        dropout = float_arg(dropout, "dropout")
        if not 0.0 <= dropout <= 1.0:
            raise VitcError(Status.ERR_INVALID_ARG, "MultiheadAttention: dropout must be in [0, 1], got %r" % (dropout,))
        embed_dim, num_heads = size_arg(embed_dim, "embed_dim"), size_arg(num_heads, "num_heads")
        super().__init__(_MHA, seed, embed_dim=embed_dim, num_heads=num_heads, bias=1 if bias else 0,
                         kdim=0 if kdim is None else size_arg(kdim, "kdim"),
                         vdim=0 if vdim is None else size_arg(vdim, "vdim"),
                         batch_first=1 if batch_first else 0,
                         add_bias_kv=1 if add_bias_kv else 0, add_zero_attn=1 if add_zero_attn else 0,
                         dropout=dropout)
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True):
        q = _arr(query)
        # Same object in, same buffer out: the C side then projects q, k, v with one GEMM.
        k = q if key is query else _arr(key)
        v = k if value is key else (q if value is query else _arr(value))
        kpm, kpm_t = _mask(key_padding_mask, "key_padding_mask")
        am, am_t = _mask(attn_mask, "attn_mask")
        a = MhaArgs()
        a.query, a.key, a.value = _view(q), _view(k), _view(v)
        a.key_padding_mask, a.key_padding_mask_type = _view(kpm), kpm_t
        a.attn_mask, a.attn_mask_type = _view(am), am_t
        a.need_weights = 1 if need_weights else 0
        a.average_attn_weights = 1 if average_attn_weights else 0
        ond, wnd = ctypes.c_int(), ctypes.c_int()
        osh, wsh = (ctypes.c_int64 * MAX_NDIM)(), (ctypes.c_int64 * MAX_NDIM)()
        with self._lock:
            check(lib.vitc_mha_output_shapes(self._ptr, ctypes.byref(a), ctypes.byref(ond), osh,
                                             ctypes.byref(wnd), wsh))
            out = np.empty(tuple(osh[i] for i in range(ond.value)), dtype=np.float32)
            w = np.empty(tuple(wsh[i] for i in range(wnd.value)), dtype=np.float32) if need_weights else None
            check(lib.vitc_mha_forward(self._ptr, ctypes.byref(a), fptr(out),
                                       fptr(w) if w is not None else None))
            self._in_shape = (q.shape, k.shape, v.shape) if self.training else None
        return out, w

    def backward(self, dy):
        """Gradients of the last training-mode forward: (d_query, d_key, d_value),
        and every parameter's gradient accumulates (grads()). When query, key
        and value were one array, its gradient is the sum of the three."""
        dy = _arr(dy, "dy")
        with self._lock:
            dq, dk, dv = (np.empty(s, dtype=np.float32) for s in self._recorded())
            vd = _view(dy)
            check(lib.vitc_mha_backward(self._ptr, ctypes.byref(vd), fptr(dq), fptr(dk), fptr(dv)))
        return dq, dk, dv


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None):
    """torch 2.x F.scaled_dot_product_attention: softmax(q k^T * scale + mask) v.

    query [..., L, d], key [..., S, d], value [..., S, dv]; leading dims
    broadcast. A bool mask's True means the position takes part (the
    opposite of MultiheadAttention's); a float mask is added; masks
    broadcast to [..., L, S]. scale defaults to 1/sqrt(d); a given scale
    must be finite and > 0. A row with no allowed key gives 0 (torch 2.x)."""
    if dropout_p:
        raise VitcError(Status.ERR_UNSUPPORTED, "scaled_dot_product_attention: dropout is not supported")
    # 0.0 is the C library's "not given" (include/vitc.h), so an explicit one,
    # or one that float32 rounds to 0 (1e-50), is refused here.
    sc = 0.0 if scale is None else float_arg(scale, "scale")
    if scale is not None and not np.float32(sc) > 0:
        raise VitcError(Status.ERR_INVALID_ARG, "scaled_dot_product_attention: scale must be > 0, got %r" % (scale,))
    q, k, v = _qkv(query, key, value)
    if is_causal:
        if attn_mask is not None:
            raise VitcError(Status.ERR_INVALID_ARG, "scaled_dot_product_attention: attn_mask and is_causal are exclusive")
        attn_mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
    m, mt = _mask(attn_mask, "attn_mask")
    out_shape = q.shape[:-1] + v.shape[-1:] if q.ndim >= 2 and v.ndim >= 2 else ()
    out = np.empty(out_shape, dtype=np.float32)
    vq, vk, vv, vm = _view(q), _view(k), _view(v), _view(m)
    check(lib.vitc_sdpa(ctypes.byref(vq), ctypes.byref(vk), ctypes.byref(vv), ctypes.byref(vm), mt,
                        sc, fptr(out)))
    return out


def softmax(x, dim=-1, temperature=1.0):
    """softmax(x / temperature) along dim, numerically stable. A 0-d x gives
    a 0-d result (dim 0 or -1), as torch.softmax."""
    x = _arr(x)
    dim, temperature = int_arg(dim, "dim"), float_arg(temperature, "temperature")
    out = np.empty_like(x)
    check(lib.vitc_softmax(fptr(x), x.ndim, shape_arr(x.shape), dim, temperature, fptr(out)))
    return out
