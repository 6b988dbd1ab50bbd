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

# Training: layer backward (tr-layers). vitc_layer* handles are void pointers.
lib.vitc_layer_backward.argtypes = [ctypes.c_void_p, c_float_p, ctypes.c_int, c_int64_p, c_float_p]
lib.vitc_layer_zero_grad.argtypes = [ctypes.c_void_p]
lib.vitc_layer_grad.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int),
                                ctypes.POINTER(c_int64_p), ctypes.POINTER(c_float_p)]
# d_out is a vitc_tensor_view (layers._View), passed by reference.
lib.vitc_mha_backward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, c_float_p, c_float_p, c_float_p]
