"""Gradients of the functional ops: what torch autograd gives through
scaled_dot_product_attention and softmax, computed by libvitc.

    dq, dk, dv = vitc.sdpa_backward(q, k, v, dout, attn_mask=None, scale=None)
    dx = vitc.softmax_backward(y, dy, dim=-1, temperature=1.0)
"""
import ctypes

import numpy as np

from ._lib import VitcError, check, fptr, lib, shape_arr
from .layers import _arr, _mask, _view

__all__ = ["sdpa_backward", "softmax_backward"]


def sdpa_backward(query, key, value, grad_out, attn_mask=None, scale=None):
    """The gradients (dq, dk, dv) of
    out = scaled_dot_product_attention(query, key, value, attn_mask, scale=scale)
    for dL/dout = grad_out, with the same shapes and mask conventions (a bool
    mask's True means the position takes part; a float mask is added; masks
    broadcast). query, key, value broadcast over their leading dims as in the
    forward; the gradients have the broadcast shapes. The forward is recomputed
    in C; no L x S matrix is stored. A row with no allowed key makes its dq
    row and all of its head's dk and dv NaN, as torch 1.13's autograd does."""
    q, k, v = _arr(query), _arr(key), _arr(value)
    if q.ndim >= 2 and k.ndim >= 2 and v.ndim >= 2:
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        q = np.ascontiguousarray(np.broadcast_to(q, lead + q.shape[-2:]))
        k = np.ascontiguousarray(np.broadcast_to(k, lead + k.shape[-2:]))
        v = np.ascontiguousarray(np.broadcast_to(v, lead + v.shape[-2:]))
    g = _arr(grad_out)
    out_shape = q.shape[:-1] + v.shape[-1:] if q.ndim >= 2 and v.ndim >= 2 else None
    if out_shape is not None and g.shape != out_shape:
        raise VitcError(-2, "sdpa_backward: grad_out has shape %s, the output %s"
                        % (tuple(g.shape), tuple(out_shape)))
    m, mt = _mask(attn_mask, "attn_mask")
    sc = 0.0 if scale is None else float(scale)
    if scale is not None and not sc > 0:
        raise VitcError(-1, "sdpa_backward: scale must be > 0, got %r" % (scale,))
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    vq, vk, vv, vm = _view(q), _view(k), _view(v), _view(m)
    check(lib.vitc_sdpa_backward(ctypes.addressof(vq), ctypes.addressof(vk), ctypes.addressof(vv),
                                 ctypes.addressof(vm), int(mt), sc, fptr(g), fptr(dq), fptr(dk),
                                 fptr(dv)))
    return dq, dk, dv


def softmax_backward(y, dy, dim=-1, temperature=1.0):
    """dL/dx of y = softmax(x / temperature, dim) given y and dy = dL/dy:
    y * (dy - sum(dy * y, dim)) / temperature."""
    y, dy = _arr(y), _arr(dy)
    if y.shape != dy.shape:
        raise VitcError(-2, "softmax_backward: y %s and dy %s differ in shape"
                        % (tuple(y.shape), tuple(dy.shape)))
    dx = np.empty_like(y)
    check(lib.vitc_softmax_backward(fptr(y), fptr(dy), y.ndim, shape_arr(y.shape), int(dim),
                                    float(temperature), fptr(dx)))
    return dx
