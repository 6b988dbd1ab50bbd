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

import numpy as np

from ._lib import VitcError, as_f32, check, fptr, lib, shape_arr

__all__ = ["AttentionBlock", "ConvSABlock", "SelfAttention", "SelfAttentionMultiHead",
           "MultiheadAttention", "T2TAttention", "SingleHeadAttention",
           "scaled_dot_product_attention", "softmax"]

# vitc_layer_kind
_ATTENTION_BLOCK, _CONV_SA_BLOCK, _SA_GROUP, _SA_BATCH, _SA_MULTIHEAD, _MHA, _T2T, _SINGLE_HEAD = range(8)
# vitc_mask_type
_MASK_NONE, _MASK_BOOL, _MASK_FLOAT = 0, 1, 2


class _Config(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("in_channels", ctypes.c_int), ("embed_dim", ctypes.c_int),
                ("num_heads", ctypes.c_int), ("patch_size", ctypes.c_int), ("kdim", ctypes.c_int),
                ("vdim", ctypes.c_int), ("bias", ctypes.c_int), ("batch_first", ctypes.c_int),
                ("qk_scale", ctypes.c_float), ("eps", ctypes.c_float), ("momentum", ctypes.c_float),
                ("add_bias_kv", ctypes.c_int), ("add_zero_attn", ctypes.c_int)]


class _View(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int), ("shape", ctypes.c_int64 * 8)]


class _MhaArgs(ctypes.Structure):
    _fields_ = [("query", _View), ("key", _View), ("value", _View),
                ("key_padding_mask", _View), ("key_padding_mask_type", ctypes.c_int),
                ("attn_mask", _View), ("attn_mask_type", ctypes.c_int),
                ("need_weights", ctypes.c_int), ("average_attn_weights", ctypes.c_int)]


_vp, _ip, _i64p, _fp = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_float)
lib.vitc_layer_default_config.argtypes = [ctypes.c_int]
lib.vitc_layer_default_config.restype = _Config
lib.vitc_layer_create.argtypes = [ctypes.POINTER(_Config), ctypes.POINTER(_vp)]
lib.vitc_layer_free.argtypes = [_vp]
lib.vitc_layer_free.restype = None
lib.vitc_layer_reset_parameters.argtypes = [_vp, ctypes.c_uint64]
lib.vitc_layer_num_params.argtypes = [_vp]
lib.vitc_layer_param.argtypes = [_vp, _ip, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_ip),
                                 ctypes.POINTER(_i64p), ctypes.POINTER(_fp)]
lib.vitc_layer_load.argtypes = [_vp, _ip, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_ip),
                                ctypes.POINTER(_i64p), ctypes.POINTER(_fp), _ip]
lib.vitc_layer_set_training.argtypes = [_vp, _ip]
lib.vitc_layer_set_training.restype = None
lib.vitc_layer_output_shape.argtypes = [_vp, _ip, _i64p, ctypes.POINTER(_ip), _i64p]
lib.vitc_layer_forward.argtypes = [_vp, _fp, _ip, _i64p, _fp]
lib.vitc_mha_output_shapes.argtypes = [_vp, ctypes.POINTER(_MhaArgs), ctypes.POINTER(_ip), _i64p,
                                       ctypes.POINTER(_ip), _i64p]
lib.vitc_mha_forward.argtypes = [_vp, ctypes.POINTER(_MhaArgs), _fp, _fp]
lib.vitc_sdpa.argtypes = [ctypes.POINTER(_View)] * 4 + [ctypes.c_int, ctypes.c_float, _fp]
lib.vitc_softmax.argtypes = [_fp, _ip, _i64p, _ip, ctypes.c_float, _fp]


def _view(a):
    v = _View()
    if a is not None:
        if a.ndim > 8:
            raise VitcError(-2, "arrays of more than 8 dimensions are not supported (got %d)" % a.ndim)
        v.data = a.ctypes.data
        v.ndim = a.ndim
        for i, s in enumerate(a.shape):
            v.shape[i] = s
    return v


def _mask(m, name):
    """A mask as (contiguous array, vitc_mask_type): bool/uint8 -> 0/1 bytes, float -> float32."""
    if m is None:
        return None, _MASK_NONE
    if hasattr(m, "detach"):
        m = m.detach().cpu().numpy()
    m = np.asarray(m)
    if m.dtype == np.bool_ or m.dtype == np.uint8:
        return np.ascontiguousarray(m.astype(np.uint8) != 0).view(np.uint8), _MASK_BOOL
    if np.issubdtype(m.dtype, np.floating):
        return as_f32(m), _MASK_FLOAT
    raise TypeError("%s must be bool or floating point, got %s" % (name, m.dtype))


def _arr(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return as_f32(x)


class _Layer:
    """One vitc_layer: the engine configured as a seed block."""

    _norm_prefix = None  # "norm." for BatchNorm presets (num_batches_tracked)

    def __init__(self, kind, seed=None, **fields):
        cfg = lib.vitc_layer_default_config(kind)
        for k, v in fields.items():
            setattr(cfg, k, v)
        self._cfg = cfg
        self._ptr = ctypes.c_void_p()
        check(lib.vitc_layer_create(ctypes.byref(cfg), ctypes.byref(self._ptr)))
        # Like torch: a fresh module has random weights; np.random.seed makes them repeatable.
        if seed is None:
            seed = int(np.random.randint(0, 2**62, dtype=np.int64))
        check(lib.vitc_layer_reset_parameters(self._ptr, int(seed) & (2**64 - 1)))
        self.training = True
        self.num_batches_tracked = 0

    def __repr__(self):
        c = self._cfg
        norm = c.kind in (_SA_GROUP, _SA_BATCH, _SA_MULTIHEAD)
        shown = [f for f, _ in _Config._fields_[1:] if getattr(c, f) and (norm or f not in ("eps", "momentum"))]
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%g" % (f, getattr(c, f)) for f in shown))

    def __del__(self):
        p = getattr(self, "_ptr", None)
        if p:
            lib.vitc_layer_free(p)
            self._ptr = None

    # -- parameters ----------------------------------------------------
    def _params(self):
        name, ndim = ctypes.c_char_p(), ctypes.c_int()
        shape, data = _i64p(), _fp()
        for i in range(lib.vitc_layer_num_params(self._ptr)):
            check(lib.vitc_layer_param(self._ptr, i, ctypes.byref(name), ctypes.byref(ndim),
                                       ctypes.byref(shape), ctypes.byref(data)))
            shp = tuple(shape[j] for j in range(ndim.value))
            n = int(np.prod(shp, dtype=np.int64))
            arr = np.ctypeslib.as_array(data, shape=(max(n, 1),))[:n].reshape(shp)
            yield name.value.decode(), arr

    def state_dict(self):
        """Parameters and buffers under the PyTorch key names (copies), in torch's order."""
        sd = {}
        for k, a in self._params():
            sd[k] = a.copy()
            if self._norm_prefix and k == self._norm_prefix + "running_var":
                sd[self._norm_prefix + "num_batches_tracked"] = np.array(self.num_batches_tracked, dtype=np.int64)
        return sd

    def parameters(self):
        """Views into the layer's own memory (writes change the layer)."""
        return dict(self._params())

    def load_state_dict(self, state_dict, strict=True):
        """Load tensors by PyTorch key name. Missing or mis-shaped keys raise
        VitcError naming the key and both shapes; unexpected keys too when strict."""
        names, arrays = [], []
        for k, v in state_dict.items():
            names.append(str(k))
            arrays.append(_arr(v))
        n = len(names)
        c_names = (ctypes.c_char_p * max(n, 1))(*[s.encode() for s in names])
        ndims = (ctypes.c_int * max(n, 1))(*[a.ndim for a in arrays])
        shape_bufs = [shape_arr(a.shape) for a in arrays]  # kept alive until the call returns
        shapes = (_i64p * max(n, 1))(*[ctypes.cast(b, _i64p) for b in shape_bufs])
        datas = (_fp * max(n, 1))(*[fptr(a) for a in arrays])
        check(lib.vitc_layer_load(self._ptr, n, c_names, ndims, shapes, datas, 1 if strict else 0))
        if self._norm_prefix:
            nbt = state_dict.get(self._norm_prefix + "num_batches_tracked")
            if nbt is not None:
                self.num_batches_tracked = int(np.asarray(_arr(nbt)).reshape(-1)[0]) if np.size(nbt) else 0

    # -- modes ----------------------------------------------------------
    def train(self, mode=True):
        self.training = bool(mode)
        lib.vitc_layer_set_training(self._ptr, 1 if mode else 0)
        return self

    def eval(self):
        return self.train(False)

    # -- forward --------------------------------------------------------
    def forward(self, x):
        x = _arr(x)
        if x.ndim > 8:
            raise VitcError(-2, "input has %d dimensions" % x.ndim)
        shp = shape_arr(x.shape)
        ond = ctypes.c_int()
        osh = (ctypes.c_int64 * 8)()
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
        dy = _arr(dy)
        shape = getattr(self, "_in_shape", None)
        if shape is None:
            raise VitcError(-1, "%s.backward: no training-mode forward recorded (call train() "
                                "and forward first)" % type(self).__name__)
        dx = np.empty(shape, dtype=np.float32)
        check(lib.vitc_layer_backward(self._ptr, fptr(dy), dy.ndim, shape_arr(dy.shape), fptr(dx)))
        return dx

    def grads(self):
        """Accumulated gradients (copies) under the torch key names; buffers have none."""
        out = {}
        ndim, shape, data = ctypes.c_int(), _i64p(), _fp()
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
        check(lib.vitc_layer_zero_grad(self._ptr))

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class AttentionBlock(_Layer):
    """Patch conv (kernel = stride = patch_size) then single- or multi-head
    self-attention with to_q/to_k/to_v/to_out: [B, C, H, W] -> [B, N, embed_dim]."""

    def __init__(self, in_channels=3, patch_size=4, embed_dim=64, heads=1, seed=None):
        super().__init__(_ATTENTION_BLOCK, seed, in_channels=in_channels, patch_size=patch_size,
                         embed_dim=embed_dim, num_heads=heads)


class ConvSABlock(_Layer):
    """SAGAN-style attention with 1x1 convs: gamma * attn + x, [B, C, H, W] -> same."""

    def __init__(self, in_channels, seed=None):
        super().__init__(_CONV_SA_BLOCK, seed, in_channels=in_channels)


class SelfAttention(_Layer):
    """Norm, q/k/v, attention, proj, + input on [B, ni, H, W]. norm="group":
    GroupNorm(1, ni) and separate q/k/v (diffusers' AttentionBlock names are
    accepted too); norm="batch": BatchNorm2d(ni) and a fused qkv Linear."""

    def __init__(self, ni, norm="group", seed=None):
        if norm not in ("group", "batch"):
            raise ValueError('norm must be "group" or "batch", got %r' % (norm,))
        self._norm_prefix = "norm." if norm == "batch" else None
        super().__init__(_SA_GROUP if norm == "group" else _SA_BATCH, seed, in_channels=ni)


class SelfAttentionMultiHead(_Layer):
    """SelfAttention with BatchNorm and nheads heads in the seed's per-head qkv layout."""

    _norm_prefix = "norm."

    def __init__(self, ni, nheads, seed=None):
        super().__init__(_SA_MULTIHEAD, seed, in_channels=ni, num_heads=nheads)


class T2TAttention(_Layer):
    """Tokens-to-Token ViT attention: [B, N, dim] -> [B, N, chan], out = v + proj(attn)."""

    def __init__(self, dim, chan, num_heads=1, qkv_bias=False, qk_scale=None, seed=None):
        super().__init__(_T2T, seed, in_channels=dim, embed_dim=chan, num_heads=num_heads,
                         bias=1 if qkv_bias else 0, qk_scale=float(qk_scale or 0.0))


class SingleHeadAttention(_Layer):
    """The NumPy seed: x @ W_q, x @ W_k, x @ W_v, attention, @ W_o (no biases)."""

    def __init__(self, embedding_dim, d_k, seed=None):
        super().__init__(_SINGLE_HEAD, seed, in_channels=embedding_dim, embed_dim=d_k)


class MultiheadAttention(_Layer):
    """torch.nn.MultiheadAttention (torch 1.13 forward semantics).

    Bool masks: True means "not allowed"; float masks are added to the
    scores. A query row whose keys are all masked gives NaN, as torch 1.13's
    general path does."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, seed=None):
        if dropout:
            raise VitcError(-7, "MultiheadAttention: dropout is not supported (inference only)")
        super().__init__(_MHA, seed, embed_dim=embed_dim, num_heads=num_heads, bias=1 if bias else 0,
                         kdim=int(kdim or 0), vdim=int(vdim or 0), batch_first=1 if batch_first else 0,
                         add_bias_kv=1 if add_bias_kv else 0, add_zero_attn=1 if add_zero_attn else 0)
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True):
        q = _arr(query)
        # Same object in, same buffer out: the C side then projects q, k, v with one GEMM.
        k = q if key is query else _arr(key)
        v = k if value is key else (q if value is query else _arr(value))
        kpm, kpm_t = _mask(key_padding_mask, "key_padding_mask")
        am, am_t = _mask(attn_mask, "attn_mask")
        a = _MhaArgs()
        a.query, a.key, a.value = _view(q), _view(k), _view(v)
        a.key_padding_mask, a.key_padding_mask_type = _view(kpm), kpm_t
        a.attn_mask, a.attn_mask_type = _view(am), am_t
        a.need_weights = 1 if need_weights else 0
        a.average_attn_weights = 1 if average_attn_weights else 0
        ond, wnd = ctypes.c_int(), ctypes.c_int()
        osh, wsh = (ctypes.c_int64 * 8)(), (ctypes.c_int64 * 8)()
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
        dy = _arr(dy)
        shapes = getattr(self, "_in_shape", None)
        if shapes is None:
            raise VitcError(-1, "MultiheadAttention.backward: no training-mode forward recorded "
                                "(call train() and forward first)")
        dq, dk, dv = (np.empty(s, dtype=np.float32) for s in shapes)
        vd = _view(dy)
        check(lib.vitc_mha_backward(self._ptr, ctypes.byref(vd), fptr(dq), fptr(dk), fptr(dv)))
        return dq, dk, dv


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None):
    """torch 2.x F.scaled_dot_product_attention: softmax(q k^T * scale + mask) v.

    query [..., L, d], key [..., S, d], value [..., S, dv]; leading dims
    broadcast. A bool mask's True means the position takes part (the
    opposite of MultiheadAttention's); a float mask is added; masks
    broadcast to [..., L, S]. scale defaults to 1/sqrt(d). A row with no
    allowed key gives NaN."""
    if dropout_p:
        raise VitcError(-7, "scaled_dot_product_attention: dropout is not supported")
    q, k, v = _arr(query), _arr(key), _arr(value)
    if q.ndim >= 2 and k.ndim >= 2 and v.ndim >= 2:
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        q = np.ascontiguousarray(np.broadcast_to(q, lead + q.shape[-2:]))
        k = np.ascontiguousarray(np.broadcast_to(k, lead + k.shape[-2:]))
        v = np.ascontiguousarray(np.broadcast_to(v, lead + v.shape[-2:]))
    if is_causal:
        if attn_mask is not None:
            raise VitcError(-1, "scaled_dot_product_attention: attn_mask and is_causal are exclusive")
        attn_mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
    m, mt = _mask(attn_mask, "attn_mask")
    out_shape = q.shape[:-1] + v.shape[-1:] if q.ndim >= 2 and v.ndim >= 2 else ()
    out = np.empty(out_shape, dtype=np.float32)
    vq, vk, vv, vm = _view(q), _view(k), _view(v), _view(m)
    sc = 0.0 if scale is None else float(scale)
    if scale is not None and not sc > 0:
        raise VitcError(-1, "scaled_dot_product_attention: scale must be > 0, got %r" % (scale,))
    check(lib.vitc_sdpa(ctypes.byref(vq), ctypes.byref(vk), ctypes.byref(vv), ctypes.byref(vm), mt,
                        sc, fptr(out)))
    return out


def softmax(x, dim=-1, temperature=1.0):
    """softmax(x / temperature) along dim, numerically stable."""
    x = _arr(x)
    out = np.empty_like(x)
    check(lib.vitc_softmax(fptr(x), x.ndim, shape_arr(x.shape), int(dim), float(temperature), fptr(out)))
    return out
