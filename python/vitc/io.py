"""safetensors files through the C library: load_safetensors, save_safetensors.

F32, F16 and BF16 tensors load as float32 numpy arrays; files are written as
F32. Every check (header, offsets, shapes, dtypes) is the C reader's; a bad
file raises vitc.VitcError with its message.
"""
import ctypes
import os

import numpy as np

from ._lib import check, lib

__all__ = ["load_safetensors", "save_safetensors"]

_c_char_pp = ctypes.POINTER(ctypes.c_char_p)

lib.vitc_safetensors_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
lib.vitc_safetensors_load.restype = ctypes.c_int
lib.vitc_safetensors_free.argtypes = [ctypes.c_void_p]
lib.vitc_safetensors_free.restype = None
lib.vitc_safetensors_count.argtypes = [ctypes.c_void_p]
lib.vitc_safetensors_count.restype = ctypes.c_int
lib.vitc_safetensors_tensor.argtypes = [
    ctypes.c_void_p, ctypes.c_int, _c_char_pp, _c_char_pp, ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.POINTER(ctypes.c_float))]
lib.vitc_safetensors_tensor.restype = ctypes.c_int
lib.vitc_safetensors_metadata_count.argtypes = [ctypes.c_void_p]
lib.vitc_safetensors_metadata_count.restype = ctypes.c_int
lib.vitc_safetensors_metadata.argtypes = [ctypes.c_void_p, ctypes.c_int, _c_char_pp, _c_char_pp]
lib.vitc_safetensors_metadata.restype = ctypes.c_int
lib.vitc_safetensors_save.argtypes = [
    ctypes.c_char_p, ctypes.c_int, _c_char_pp, ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
    ctypes.c_int, _c_char_pp, _c_char_pp]
lib.vitc_safetensors_save.restype = ctypes.c_int


def _encode(s, what):
    if not isinstance(s, str):
        raise TypeError("%s must be a str, got %s" % (what, type(s).__name__))
    if "\0" in s:
        raise ValueError("%s %r contains a NUL character" % (what, s))
    return s.encode("utf-8")


def load_safetensors(path):
    """Read a safetensors file -> (dict name -> float32 ndarray, metadata dict).

    The dict is in the file's order (by data offset). Arrays are copies that
    own their memory."""
    st = ctypes.c_void_p()
    check(lib.vitc_safetensors_load(os.fsencode(path), ctypes.byref(st)))
    try:
        tensors = {}
        name, dtype = ctypes.c_char_p(), ctypes.c_char_p()
        ndim = ctypes.c_int()
        shape = ctypes.POINTER(ctypes.c_int64)()
        data = ctypes.POINTER(ctypes.c_float)()
        for i in range(lib.vitc_safetensors_count(st)):
            check(lib.vitc_safetensors_tensor(st, i, ctypes.byref(name), ctypes.byref(dtype),
                                              ctypes.byref(ndim), ctypes.byref(shape),
                                              ctypes.byref(data)))
            shp = tuple(shape[j] for j in range(ndim.value))
            n = int(np.prod(shp, dtype=np.int64))
            arr = np.empty(shp, dtype=np.float32)
            if n:
                ctypes.memmove(arr.ctypes.data, data, n * 4)
            tensors[name.value.decode("utf-8")] = arr
        meta = {}
        key, val = ctypes.c_char_p(), ctypes.c_char_p()
        for i in range(lib.vitc_safetensors_metadata_count(st)):
            check(lib.vitc_safetensors_metadata(st, i, ctypes.byref(key), ctypes.byref(val)))
            meta[key.value.decode("utf-8")] = val.value.decode("utf-8")
        return tensors, meta
    finally:
        lib.vitc_safetensors_free(st)


def save_safetensors(path, tensors, metadata=None):
    """Write {name: array-like} (converted to float32) and optional
    {str: str} metadata as an F32 safetensors file. Tensors are stored sorted
    by name; the file appears whole or not at all."""
    if not hasattr(tensors, "items"):
        raise TypeError("tensors must be a dict of name -> array")
    names, arrays = [], []
    for k, v in tensors.items():
        names.append(_encode(k, "tensor name"))
        if hasattr(v, "detach"):  # a torch tensor, without importing torch
            v = v.detach().cpu().numpy()
        # Not as_f32: np.ascontiguousarray turns a 0-d scalar into shape (1,).
        arrays.append(np.asarray(v, dtype=np.float32, order="C"))
    meta = dict(metadata or {})
    mkeys = [_encode(k, "metadata key") for k in meta]
    mvals = [_encode(v, "metadata value for %r" % k) for k, v in meta.items()]
    n = len(names)
    c_names = (ctypes.c_char_p * max(1, n))(*names)
    c_ndims = (ctypes.c_int * max(1, n))(*[a.ndim for a in arrays])
    shape_bufs = [(ctypes.c_int64 * max(1, a.ndim))(*a.shape) for a in arrays]
    c_shapes = (ctypes.POINTER(ctypes.c_int64) * max(1, n))(
        *[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in shape_bufs])
    c_data = (ctypes.POINTER(ctypes.c_float) * max(1, n))(
        *[a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) for a in arrays])
    nm = len(mkeys)
    c_mk = (ctypes.c_char_p * max(1, nm))(*mkeys)
    c_mv = (ctypes.c_char_p * max(1, nm))(*mvals)
    check(lib.vitc_safetensors_save(os.fsencode(path), n, c_names, c_ndims, c_shapes, c_data,
                                    nm, c_mk, c_mv))


