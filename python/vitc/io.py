"""safetensors files through the C library: load_safetensors, save_safetensors.

F32, F16 and BF16 tensors load as float32 numpy arrays; files are written as
F32. Every check (header, offsets, shapes, dtypes) is the C reader's; a bad
file raises vitc.VitcError with its message.
"""
import ctypes
import os

import numpy as np

from ._lib import (Status, TensorList, VitcError, as_f32, c_float_p, c_int64_p, check, lib, path_arg,
                   str_arg)

__all__ = ["load_safetensors", "save_safetensors"]

def load_safetensors(path):
    """Read a safetensors file -> (dict name -> float32 ndarray, metadata dict).

    The dict is in the file's order (by data offset). Arrays are copies that
    own their memory."""
    st = ctypes.c_void_p()
    check(lib.vitc_safetensors_load(path_arg(path), ctypes.byref(st)))
    try:
        tensors = {}
        name, dtype = ctypes.c_char_p(), ctypes.c_char_p()
        ndim = ctypes.c_int()
        shape = c_int64_p()
        data = c_float_p()
        for i in range(lib.vitc_safetensors_count(st)):
            check(lib.vitc_safetensors_tensor(st, i, ctypes.byref(name), ctypes.byref(dtype),
                                              ctypes.byref(ndim), ctypes.byref(shape),
                                              ctypes.byref(data)))
            shp = tuple(shape[j] for j in range(ndim.value))
            n = int(np.prod(shp, dtype=np.int64))
            try:
                arr = np.empty(shp, dtype=np.float32)
            except ValueError as e:  # numpy's own rank limit (32 in numpy 1.x)
                raise VitcError(Status.ERR_UNSUPPORTED, "%s: tensor '%s' has shape %s, which numpy "
                                "cannot hold: %s" % (os.fsdecode(path), name.value.decode("utf-8", "replace"),
                                                     list(shp), e)) from None
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
        names.append(str_arg(k, "tensor name"))
        if hasattr(v, "detach"):  # a torch tensor, without importing torch
            v = v.detach().cpu().numpy()
        arrays.append(as_f32(v))
    meta = dict(metadata or {})
    mkeys = [str_arg(k, "metadata key") for k in meta]
    mvals = [str_arg(v, "metadata value for %r" % k) for k, v in meta.items()]
    n = len(names)
    c_names = (ctypes.c_char_p * max(1, n))(*names)
    t = TensorList(arrays)
    nm = len(mkeys)
    c_mk = (ctypes.c_char_p * max(1, nm))(*mkeys)
    c_mv = (ctypes.c_char_p * max(1, nm))(*mvals)
    check(lib.vitc_safetensors_save(path_arg(path), n, c_names, t.ndims, t.shapes, t.data,
                                    nm, c_mk, c_mv))


