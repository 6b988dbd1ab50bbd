"""Loading libvitc.so, its C declarations, and turning statuses into exceptions.

The binding holds no numerics of its own: every number comes from the C
library. This module is the only place that touches ctypes setup: every
struct mirror, enum value and function signature of include/vitc.h that the
binding uses is declared here, so one file is checked against the header
(tests/python/test_binding.py compiles C to compare sizes and offsets).

Every Python value that reaches a C integer or float goes through int_arg() /
float_arg() first: ctypes itself silently wraps 2**32 + 8 to 8 and rounds
1e39 to inf.
"""
import ctypes
import enum
import math
import operator
import os
import weakref

import numpy as np

_here = os.path.dirname(os.path.abspath(__file__))


def _find_library():
    """The libvitc to load: $VITC_LIBRARY when set (a path, or a name for the
    dynamic loader), else the copy `pip install .` put in the package
    (vitc/_native/), else a source checkout's build/ (python/vitc/ ->
    build/, after `make`), else whatever the dynamic loader finds (an
    installed libvitc, `make install`)."""
    env = os.environ.get("VITC_LIBRARY")
    if env:
        return env
    for c in (os.path.join(_here, "_native", "libvitc.so.0"),
              os.path.join(_here, "..", "..", "build", "libvitc.so")):
        if os.path.exists(c):
            return os.path.abspath(c)
    return "libvitc.so.0"


# What was loaded, for error messages and for telling an installed package
# from a checkout.
library_path = _find_library()
lib = ctypes.CDLL(library_path)


# ---- enums (values of include/vitc.h) -----------------------------------

class Status(enum.IntEnum):
    """vitc_status: VITC_OK and VITC_ERR_*."""
    OK = 0
    ERR_INVALID_ARG = -1
    ERR_SHAPE = -2
    ERR_NOMEM = -3
    ERR_IO = -4
    ERR_FORMAT = -5
    ERR_KEY = -6
    ERR_UNSUPPORTED = -7

    @property
    def c_name(self):
        return "VITC_" + self.name


class LayerKind(enum.IntEnum):
    """vitc_layer_kind."""
    ATTENTION_BLOCK = 0
    CONV_SA_BLOCK = 1
    SELF_ATTENTION_GROUP = 2
    SELF_ATTENTION_BATCH = 3
    SELF_ATTENTION_MULTIHEAD = 4
    MULTIHEAD_ATTENTION = 5
    T2T_ATTENTION = 6
    SINGLE_HEAD_ATTENTION = 7


class MaskType(enum.IntEnum):
    """vitc_mask_type."""
    NONE = 0
    BOOL = 1
    FLOAT = 2


# (C prefix, enum) for the layout test.
ENUMS = [("VITC_", Status), ("VITC_", LayerKind), ("VITC_MASK_", MaskType)]

# Dimensions of vitc_tensor_view.shape and of every out_shape[8].
MAX_NDIM = 8


# ---- struct mirrors -------------------------------------------------------

class LayerConfig(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("in_channels", ctypes.c_int), ("embed_dim", ctypes.c_int),
                ("num_heads", ctypes.c_int), ("patch_size", ctypes.c_int), ("kdim", ctypes.c_int),
                ("vdim", ctypes.c_int), ("bias", ctypes.c_int), ("batch_first", ctypes.c_int),
                ("qk_scale", ctypes.c_float), ("eps", ctypes.c_float), ("momentum", ctypes.c_float),
                ("add_bias_kv", ctypes.c_int), ("add_zero_attn", ctypes.c_int),
                ("dropout", ctypes.c_float)]


class TensorView(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_NDIM)]


class MhaArgs(ctypes.Structure):
    _fields_ = [("query", TensorView), ("key", TensorView), ("value", TensorView),
                ("key_padding_mask", TensorView), ("key_padding_mask_type", ctypes.c_int),
                ("attn_mask", TensorView), ("attn_mask_type", ctypes.c_int),
                ("need_weights", ctypes.c_int), ("average_attn_weights", ctypes.c_int)]


class VitConfig(ctypes.Structure):
    _fields_ = [("image_size", ctypes.c_int), ("patch_size", ctypes.c_int),
                ("in_channels", ctypes.c_int), ("hidden_dim", ctypes.c_int),
                ("depth", ctypes.c_int), ("num_heads", ctypes.c_int),
                ("mlp_dim", ctypes.c_int), ("num_classes", ctypes.c_int),
                ("norm_eps", ctypes.c_float), ("mean", ctypes.c_float * 3),
                ("std", ctypes.c_float * 3)]


class Image(ctypes.Structure):
    _fields_ = [("width", ctypes.c_int), ("height", ctypes.c_int),
                ("rgb", ctypes.POINTER(ctypes.c_uint8))]


# C type name -> mirror, for the layout test.
STRUCTS = {"vitc_layer_config": LayerConfig, "vitc_tensor_view": TensorView,
           "vitc_mha_args": MhaArgs, "vitc_vit_config": VitConfig, "vitc_image": Image}


# ---- function signatures ---------------------------------------------------

_P = ctypes.POINTER
_vp, _int, _i64, _f32, _cs = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_char_p
c_float_p = _P(_f32)
c_int64_p = _P(_i64)
_st = _int  # vitc_status
_cspp = _P(_cs)

# name: (restype, argtypes). Handles (vitc_layer *, vitc_vit *, ...) are void *.
_SIGNATURES = {
    "vitc_status_str": (_cs, [_int]),
    "vitc_last_error": (_cs, []),
    "vitc_version": (_cs, []),
    "vitc_set_num_threads": (None, [_int]),
    "vitc_get_num_threads": (_int, []),
    "vitc_get_arch": (_cs, []),
    "vitc_set_arch": (_st, [_cs]),
    "vitc_get_gemm_backend": (_cs, []),
    "vitc_set_gemm_backend": (_st, [_cs]),
    # safetensors
    "vitc_safetensors_load": (_st, [_cs, _P(_vp)]),
    "vitc_safetensors_free": (None, [_vp]),
    "vitc_safetensors_count": (_int, [_vp]),
    "vitc_safetensors_tensor": (_st, [_vp, _int, _cspp, _cspp, _P(_int), _P(c_int64_p),
                                      _P(c_float_p)]),
    "vitc_safetensors_metadata_count": (_int, [_vp]),
    "vitc_safetensors_metadata": (_st, [_vp, _int, _cspp, _cspp]),
    "vitc_safetensors_save": (_st, [_cs, _int, _cspp, _P(_int), _P(c_int64_p), _P(c_float_p),
                                    _int, _cspp, _cspp]),
    # layers
    "vitc_layer_default_config": (LayerConfig, [_int]),
    "vitc_layer_create": (_st, [_P(LayerConfig), _P(_vp)]),
    "vitc_layer_free": (None, [_vp]),
    "vitc_layer_reset_parameters": (_st, [_vp, ctypes.c_uint64]),
    "vitc_layer_num_params": (_int, [_vp]),
    "vitc_layer_param": (_st, [_vp, _int, _cspp, _P(_int), _P(c_int64_p), _P(c_float_p)]),
    "vitc_layer_load": (_st, [_vp, _int, _cspp, _P(_int), _P(c_int64_p), _P(c_float_p), _int]),
    "vitc_layer_set_training": (None, [_vp, _int]),
    "vitc_layer_output_shape": (_st, [_vp, _int, c_int64_p, _P(_int), c_int64_p]),
    "vitc_layer_forward": (_st, [_vp, c_float_p, _int, c_int64_p, c_float_p]),
    "vitc_mha_output_shapes": (_st, [_vp, _P(MhaArgs), _P(_int), c_int64_p, _P(_int), c_int64_p]),
    "vitc_mha_forward": (_st, [_vp, _P(MhaArgs), c_float_p, c_float_p]),
    # layer training
    "vitc_layer_backward": (_st, [_vp, c_float_p, _int, c_int64_p, c_float_p]),
    "vitc_layer_zero_grad": (_st, [_vp]),
    "vitc_layer_grad": (_st, [_vp, _cs, _P(_int), _P(c_int64_p), _P(c_float_p)]),
    "vitc_mha_backward": (_st, [_vp, _P(TensorView), c_float_p, c_float_p, c_float_p]),
    "vitc_sdpa": (_st, [_P(TensorView)] * 4 + [_int, _f32, c_float_p]),
    "vitc_softmax": (_st, [c_float_p, _int, c_int64_p, _int, _f32, c_float_p]),
    # gradients of the functional attention and softmax
    "vitc_sdpa_backward": (_st, [_P(TensorView)] * 4 + [_int, _f32, c_float_p, c_float_p,
                                                        c_float_p, c_float_p]),
    "vitc_softmax_backward": (_st, [c_float_p, c_float_p, _int, c_int64_p, _int, _f32, c_float_p]),
    "vitc_sdpa_lse": (_st, [_P(TensorView)] * 4 + [_int, _f32, c_float_p, c_float_p]),
    "vitc_sdpa_backward_lse": (_st, [_P(TensorView)] * 4 + [_int, _f32] + [c_float_p] * 6),
    # images
    "vitc_image_load": (_st, [_cs, _i64, _P(Image)]),
    "vitc_image_load_flags": (_st, [_cs, _i64, _int, _P(Image)]),
    "vitc_image_free": (None, [_P(Image)]),
    "vitc_image_save_png": (_st, [_cs, _vp, _int, _int]),
    "vitc_image_preprocess": (_st, [_P(Image), _int, _int, c_float_p, c_float_p, c_float_p]),
    "vitc_image_preprocess_channels": (_st, [_P(Image), _int, _int, _int, c_float_p, c_float_p,
                                             c_float_p]),
    # Vision Transformer
    "vitc_vit_load": (_st, [_cs, _cs, _P(_vp)]),
    "vitc_vit_load_precision": (_st, [_cs, _cs, _int, _P(_vp)]),
    "vitc_vit_free": (None, [_vp]),
    "vitc_vit_get_config": (_P(VitConfig), [_vp]),
    "vitc_vit_arch_name": (_cs, [_vp]),
    "vitc_vit_label": (_cs, [_vp, _int]),
    "vitc_vit_forward": (_st, [_vp, c_float_p, _int, _int, _int, c_float_p]),
    "vitc_vit_attention_maps": (_st, [_vp, c_float_p, _int, _int, _int, c_float_p, c_float_p]),
    "vitc_vit_set_precision": (_st, [_vp, _int]),
    "vitc_vit_get_precision": (_int, [_vp]),
    "vitc_vit_set_attention_precision": (_st, [_vp, _int]),
    "vitc_vit_set_attention_precision_auto": (_st, [_vp]),
    "vitc_vit_get_attention_precision": (_int, [_vp]),
    "vitc_precision_parse": (_int, [_cs]),
    "vitc_get_precision_paths": (_cs, []),
    # ViT training
    "vitc_vit_default_config": (VitConfig, []),
    "vitc_vit_create": (_st, [_P(VitConfig), ctypes.c_uint64, _P(_vp)]),
    "vitc_vit_set_training": (None, [_vp, _int]),
    "vitc_vit_is_training": (_int, [_vp]),
    "vitc_vit_set_dropout": (_st, [_vp, _f32, _f32, _f32]),
    "vitc_vit_backward": (_st, [_vp, c_float_p]),
    "vitc_vit_output_size": (_st, [_vp, _int, _int, c_int64_p]),
    "vitc_vit_run": (_st, [_vp, c_float_p, _int, _int, _int, c_float_p]),
    "vitc_vit_zero_grad": (_st, [_vp]),
    "vitc_vit_num_params": (_int, [_vp]),
    "vitc_vit_param": (_st, [_vp, _int, _cspp, _P(_int), _P(c_int64_p), _P(c_float_p),
                             _P(c_float_p)]),
    "vitc_vit_save": (_st, [_vp, _cs]),
    "vitc_vit_reset_head": (_st, [_vp, _int, _cspp, ctypes.c_uint64]),
    # Hub models and embeddings
    "vitc_vit_family": (_cs, [_vp]),
    "vitc_vit_has_head": (_int, [_vp]),
    "vitc_vit_num_prefix_tokens": (_int, [_vp]),
    "vitc_vit_num_ignored": (_int, [_vp]),
    "vitc_vit_ignored": (_cs, [_vp, _int]),
    "vitc_vit_embed_size": (_st, [_vp, _int, _int, _int, c_int64_p]),
    "vitc_vit_embed": (_st, [_vp, c_float_p, _int, _int, _int, _int, c_float_p]),
    "vitc_vit_forward_features": (_st, [_vp, c_float_p, _int, _int, _int, c_float_p]),
    # Sessions: inference on one model from several threads
    "vitc_session_create": (_st, [_vp, _P(_vp)]),
    "vitc_session_free": (None, [_vp]),
    "vitc_session_run": (_st, [_vp, c_float_p, _int, _int, _int, c_float_p]),
    "vitc_session_forward": (_st, [_vp, c_float_p, _int, _int, _int, c_float_p]),
    "vitc_session_embed": (_st, [_vp, c_float_p, _int, _int, _int, _int, c_float_p]),
    "vitc_session_forward_features": (_st, [_vp, c_float_p, _int, _int, _int, c_float_p]),
    "vitc_session_attention_maps": (_st, [_vp, c_float_p, _int, _int, _int, c_float_p,
                                          c_float_p]),
    "vitc_vit_prepare": (_st, [_vp]),
    "vitc_vit_is_prepared": (_int, [_vp]),
    "vitc_vit_has_processor": (_int, [_vp]),
    "vitc_vit_image_flags": (_int, [_vp]),
    "vitc_vit_preprocess_size": (_st, [_vp, _int, _int, _P(_int), _P(_int)]),
    "vitc_vit_preprocess": (_st, [_vp, _P(Image), c_float_p]),
}

for _name, (_res, _args) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


# ---- errors ----------------------------------------------------------------

class VitcError(RuntimeError):
    """A failure reported by libvitc; the message says what was wrong.

    status is a Status (an int: -2 == Status.ERR_SHAPE), status_name its C
    name ("VITC_ERR_SHAPE")."""

    def __init__(self, status, message):
        super().__init__(message)
        try:
            self.status = Status(status)
            self.status_name = self.status.c_name
        except ValueError:  # a status this binding does not know (a newer library)
            self.status = int(status)
            self.status_name = "VITC_STATUS_%d" % self.status


def check(status):
    if status != 0:
        msg = lib.vitc_last_error().decode("utf-8", "replace")
        name = lib.vitc_status_str(status).decode()
        raise VitcError(status, msg or name)


# ---- arguments -------------------------------------------------------------

INT_MIN, INT_MAX = -2**31, 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
_FLT_MAX = float(np.finfo(np.float32).max)


def int_arg(value, name, lo=INT_MIN, hi=INT_MAX):
    """value as a Python int in [lo, hi] (default: C int), for ctypes.

    TypeError for a non-integer (8.0 included, as torch's sizes), ValueError
    naming the argument when out of range."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError("%s must be an integer, got %s" % (name, type(value).__name__)) from None
    if not lo <= v <= hi:
        if lo == 0 and v < 0:
            raise ValueError("%s must be >= 0, got %d" % (name, v))
        raise ValueError("%s must be in [%d, %d], got %d" % (name, lo, hi, v))
    return v


def size_arg(value, name, lo=1):
    """A size or count (channels, heads, dims): int_arg with lo 1 unless told."""
    return int_arg(value, name, lo, INT_MAX)


def float_arg(value, name):
    """value as a finite Python float that float32 holds without becoming inf."""
    try:
        if isinstance(value, (str, bytes)):  # float() would parse them
            raise TypeError
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError("%s must be a real number, got %r" % (name, value)) from None
    if not math.isfinite(v) or abs(v) > _FLT_MAX:
        raise ValueError("%s must be finite in float32, got %r" % (name, value))
    return v


def path_arg(path, name="path"):
    """A path (str, bytes or os.PathLike) as bytes for a C string; an
    embedded NUL (which C would silently cut at) is a ValueError, as open()'s."""
    b = os.fsencode(path)
    if b"\0" in b:
        raise ValueError("%s contains a NUL byte: %r" % (name, path))
    return b


def str_arg(s, name):
    """A str as UTF-8 bytes for a C string; TypeError for a non-str, ValueError for a NUL."""
    if not isinstance(s, str):
        raise TypeError("%s must be a str, got %s" % (name, type(s).__name__))
    if "\0" in s:
        raise ValueError("%s %r contains a NUL character" % (name, s))
    return s.encode("utf-8")


def as_f32(x):
    """Any array-like -> C-contiguous, aligned float32 ndarray of the same shape.

    Not np.ascontiguousarray: it turns a 0-d array into shape (1,)."""
    return np.require(np.asarray(x, dtype=np.float32), requirements=("C", "A"))


def fptr(a):
    return a.ctypes.data_as(c_float_p)


def owned_array(addr, shape, ctype, dtype):
    """A numpy array over a buffer the library malloc'd and hands over (not
    copied), at address addr (an int): libc's free runs once neither the
    array nor a view of it is left. The caller must not free it itself."""
    n = 1
    for d in shape:
        n *= int(d)
    if not addr or n <= 0:
        raise ValueError("owned_array: no buffer (%s, %s elements)" % (addr, n))
    buf = (ctype * n).from_address(addr)
    weakref.finalize(buf, libc_free, addr)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def shape_arr(shape):
    return (ctypes.c_int64 * max(1, len(shape)))(*[int(s) for s in shape])


class TensorList:
    """float32 arrays as C's (const int *ndims, const int64_t *const *shapes,
    const float *const *data), for vitc_layer_load and vitc_safetensors_save.
    Keep the object alive until the call returns: the pointers point into it."""

    def __init__(self, arrays):
        n = max(1, len(arrays))
        self._arrays = arrays
        self._shapes = [shape_arr(a.shape) for a in arrays]
        self.ndims = (ctypes.c_int * n)(*[a.ndim for a in arrays])
        self.shapes = (c_int64_p * n)(*[ctypes.cast(b, c_int64_p) for b in self._shapes])
        self.data = (c_float_p * n)(*[fptr(a) for a in arrays])


# ---- training: loss, optimizers, clipping, schedules -----------------------

class OptimConfig(ctypes.Structure):
    """vitc_optim_config."""
    _fields_ = [("kind", ctypes.c_int), ("lr", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("beta1", ctypes.c_double),
                ("beta2", ctypes.c_double), ("eps", ctypes.c_double), ("amsgrad", ctypes.c_int),
                ("momentum", ctypes.c_double), ("dampening", ctypes.c_double),
                ("nesterov", ctypes.c_int), ("decay_all", ctypes.c_int)]


class OneCycleConfig(ctypes.Structure):
    """vitc_onecycle_config."""
    _fields_ = [("max_lr", ctypes.c_double), ("total_steps", ctypes.c_int64),
                ("pct_start", ctypes.c_double), ("anneal_linear", ctypes.c_int),
                ("div_factor", ctypes.c_double), ("final_div_factor", ctypes.c_double),
                ("three_phase", ctypes.c_int), ("cycle_momentum", ctypes.c_int),
                ("base_momentum", ctypes.c_double), ("max_momentum", ctypes.c_double)]


class OptimKind(enum.IntEnum):
    """vitc_optim_kind."""
    SGD = 0
    ADAMW = 1


OPTIM_SGD, OPTIM_ADAMW = OptimKind.SGD, OptimKind.ADAMW
STRUCTS.update({"vitc_optim_config": OptimConfig, "vitc_onecycle_config": OneCycleConfig})
ENUMS.append(("VITC_OPTIM_", OptimKind))


def _train_signatures():
    P, vp, i, i64, d, f = (ctypes.POINTER, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                           ctypes.c_double, ctypes.c_float)
    sigs = {
        "vitc_cross_entropy": (i, [P(f), P(i64), i64, i64, f, P(f), P(f)]),
        "vitc_optim_default_config": (OptimConfig, [i]),
        "vitc_optimizer_create_vit": (i, [vp, P(OptimConfig), P(vp)]),
        "vitc_optimizer_create_layer": (i, [vp, P(OptimConfig), P(vp)]),
        "vitc_optimizer_free": (None, [vp]),
        "vitc_optimizer_step": (i, [vp]),
        "vitc_optimizer_zero_grad": (i, [vp]),
        "vitc_optimizer_set_lr": (i, [vp, d]),
        "vitc_optimizer_get_lr": (d, [vp]),
        "vitc_optimizer_set_momentum": (i, [vp, d]),
        "vitc_optimizer_get_momentum": (d, [vp]),
        "vitc_optimizer_get_config": (P(OptimConfig), [vp]),
        "vitc_optimizer_num_params": (ctypes.c_size_t, [vp]),
        "vitc_optimizer_num_states": (i, [vp]),
        "vitc_optimizer_state": (i, [vp, i, P(ctypes.c_char_p), P(P(f))]),
        "vitc_optimizer_get_step": (i64, [vp]),
        "vitc_optimizer_set_step": (i, [vp, i64]),
        "vitc_clip_grad_norm_optimizer": (i, [vp, f, P(f)]),
        "vitc_clip_grad_norm_vit": (i, [vp, f, P(f)]),
        "vitc_clip_grad_norm_layer": (i, [vp, f, P(f)]),
        "vitc_lr_warmup_cosine": (i, [i64, i64, i64, d, d, P(d)]),
        "vitc_onecycle_default_config": (OneCycleConfig, [d, i64]),
        "vitc_lr_onecycle": (i, [P(OneCycleConfig), i64, P(d), P(d)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


_train_signatures()


# ---- training checkpoints and per-tensor learning rates (src/train/checkpoint.c, optim.c)
def _checkpoint_signatures():
    P, vp, i, d, cp = (ctypes.POINTER, ctypes.c_void_p, ctypes.c_int, ctypes.c_double,
                       ctypes.c_char_p)
    sigs = {
        "vitc_checkpoint_save": (i, [cp, vp, vp, P(cp), cp]),
        # the record comes back as a pointer to free, not a converted bytes
        "vitc_checkpoint_load": (i, [cp, P(vp), P(vp)]),
        "vitc_checkpoint_load_optimizer": (i, [cp, vp]),
        "vitc_checkpoint_free_meta": (None, [vp]),
        "vitc_optimizer_set_layer_decay": (i, [vp, d]),
        "vitc_optimizer_set_lr_scale": (i, [vp, i, d]),
        "vitc_optimizer_get_lr_scale": (d, [vp, i]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


_checkpoint_signatures()



# ---- tokenizers and text towers (src/text/, src/models/text.c)
def _text_signatures():
    P, vp, i, i64, f, cp = (ctypes.POINTER, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                            ctypes.c_float, ctypes.c_char_p)
    i32 = ctypes.c_int32
    sigs = {
        "vitc_tokenizer_load": (i, [cp, P(vp)]),
        "vitc_tokenizer_free": (None, [vp]),
        "vitc_tokenizer_encode": (i, [vp, cp, i64, P(i32), i, P(i)]),
        "vitc_tokenizer_context": (i, [vp]),
        "vitc_tokenizer_vocab_size": (i, [vp]),
        "vitc_tokenizer_kind": (cp, [vp]),
        "vitc_vit_has_text": (i, [vp]),
        "vitc_vit_text_dim": (i, [vp]),
        "vitc_vit_text_context": (i, [vp]),
        "vitc_vit_tokenizer": (vp, [vp]),
        "vitc_vit_logit_params": (i, [vp, P(f), P(f), P(i)]),
        "vitc_vit_encode_text_ids": (i, [vp, P(i32), i, i, P(f)]),
        "vitc_vit_encode_text": (i, [vp, P(cp), i, P(f)]),
        "vitc_session_encode_text_ids": (i, [vp, P(i32), i, i, P(f)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


_text_signatures()


# ---- zero-shot classification (src/text/zeroshot.c)
def _zero_shot_signatures():
    P, i, i64, f, cp = (ctypes.POINTER, ctypes.c_int, ctypes.c_int64, ctypes.c_float,
                        ctypes.c_char_p)
    sigs = {
        "vitc_zero_shot_templates": (P(cp), [cp, P(i)]),
        "vitc_zero_shot_classes": (i, [P(f), i64, i64, i64, P(f)]),
        "vitc_zero_shot_probs": (i, [P(f), i64, P(f), i64, i64, f, f, i, P(f)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


_zero_shot_signatures()


# ---- CPU (src/kernels/cpu.c)
def _cpu_signatures():
    fn = lib.vitc_cpu_info
    fn.restype, fn.argtypes = ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]


_cpu_signatures()


# ---- Depth Anything (src/models/depth.c)
def _depth_signatures():
    P, vp, i, f, cp = (ctypes.POINTER, ctypes.c_void_p, ctypes.c_int, ctypes.c_float,
                       ctypes.c_char_p)
    sigs = {
        "vitc_depth_load": (i, [cp, P(vp)]),
        "vitc_depth_free": (None, [vp]),
        "vitc_depth_input_size": (i, [vp, i, i, P(i), P(i)]),
        "vitc_depth_forward": (i, [vp, P(f), i, i, i, P(f)]),
        "vitc_depth_predict": (i, [vp, P(Image), P(P(f))]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


_depth_signatures()

# vitc_depth_predict's map is malloc'd by the library: libc's free gives it back.
libc_free = ctypes.CDLL(None).free
libc_free.restype, libc_free.argtypes = None, [ctypes.c_void_p]


# ---- SAM (src/models/sam.c; Segment Anything)
class SamPrompt(ctypes.Structure):
    """vitc_sam_prompt."""
    _fields_ = [("n_points", ctypes.c_int), ("points", c_float_p),
                ("labels", ctypes.POINTER(ctypes.c_int)), ("box", c_float_p),
                ("mask", c_float_p), ("multimask", ctypes.c_int), ("binary", ctypes.c_int)]


class SamResult(ctypes.Structure):
    """vitc_sam_result."""
    _fields_ = [("n_masks", ctypes.c_int), ("height", ctypes.c_int), ("width", ctypes.c_int),
                ("masks", ctypes.c_void_p), ("low_res", ctypes.c_void_p),
                ("iou", ctypes.c_float * 4), ("binary", ctypes.c_void_p)]


STRUCTS.update({"vitc_sam_prompt": SamPrompt, "vitc_sam_result": SamResult})


def _sam_signatures():
    P, i, i64, vp, cp = ctypes.POINTER, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p
    sigs = {
        "vitc_sam_load": (i, [cp, P(vp)]),
        "vitc_sam_load_precision": (i, [cp, cp, P(vp)]),
        "vitc_sam_free": (None, [vp]),
        "vitc_sam_input_size": (i, [vp]),
        "vitc_sam_embedding_shape": (None, [vp, P(i64)]),
        "vitc_sam_set_image": (i, [vp, P(Image), P(vp)]),
        "vitc_sam_set_image_tensor": (i, [vp, c_float_p, i, i, P(vp)]),
        "vitc_sam_image_free": (None, [vp]),
        "vitc_sam_image_embedding": (c_float_p, [vp]),
        "vitc_sam_predict": (i, [vp, vp, P(SamPrompt), P(SamResult)]),
        "vitc_sam_result_free": (None, [P(SamResult)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


_sam_signatures()
