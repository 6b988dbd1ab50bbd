"""Loading libvitc.so and turning its status codes into exceptions.

The binding holds no numerics of its own: every number comes from the C
library. This module is the only place that touches ctypes setup.
"""
import ctypes
import os

import numpy as np

_here = os.path.dirname(os.path.abspath(__file__))


def _find_library():
    # A source checkout first (python/vitc/ -> build/), then $VITC_LIBRARY,
    # then whatever the dynamic loader finds (an installed libvitc).
    cands = [os.path.join(_here, "..", "..", "build", "libvitc.so")]
    env = os.environ.get("VITC_LIBRARY")
    if env:
        cands.insert(0, env)
    for c in cands:
        if os.path.exists(c):
            return os.path.abspath(c)
    return "libvitc.so.0"


lib = ctypes.CDLL(_find_library())

c_float_p = ctypes.POINTER(ctypes.c_float)
c_int64_p = ctypes.POINTER(ctypes.c_int64)

lib.vitc_last_error.restype = ctypes.c_char_p
lib.vitc_status_str.restype = ctypes.c_char_p
lib.vitc_status_str.argtypes = [ctypes.c_int]
lib.vitc_version.restype = ctypes.c_char_p
lib.vitc_get_arch.restype = ctypes.c_char_p
lib.vitc_get_gemm_backend.restype = ctypes.c_char_p
lib.vitc_set_arch.argtypes = [ctypes.c_char_p]
lib.vitc_set_gemm_backend.argtypes = [ctypes.c_char_p]
lib.vitc_set_num_threads.argtypes = [ctypes.c_int]


class VitcError(RuntimeError):
    """A failure reported by libvitc; the message says what was wrong."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def check(status):
    if status != 0:
        msg = lib.vitc_last_error().decode("utf-8", "replace")
        name = lib.vitc_status_str(status).decode()
        raise VitcError(status, msg or name)


def as_f32(x):
    """Any array-like -> C-contiguous float32 ndarray."""
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def fptr(a):
    return a.ctypes.data_as(c_float_p)


def shape_arr(shape):
    return (ctypes.c_int64 * max(1, len(shape)))(*[int(s) for s in shape])


# ---- training: loss, optimizers, clipping, schedules (tr-optim) -----------

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


OPTIM_SGD, OPTIM_ADAMW = 0, 1


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
