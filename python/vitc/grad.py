"""Gradients of the functional ops: what torch autograd gives through
scaled_dot_product_attention and softmax, computed by libvitc.

    dq, dk, dv = vitc.sdpa_backward(q, k, v, dout, attn_mask=None, scale=None)
    out, lse = vitc.sdpa_lse(q, k, v, attn_mask=None, scale=None)
    dq, dk, dv = vitc.sdpa_backward(q, k, v, dout, out=out, lse=lse)  # no recomputed forward
    dx = vitc.softmax_backward(y, dy, dim=-1, temperature=1.0)
"""
import ctypes

import numpy as np

from ._lib import VitcError, check, fptr, lib, shape_arr
from .layers import _arr, _mask, _qkv, _view

__all__ = ["sdpa_backward", "sdpa_lse", "softmax_backward"]


def _scale(scale, name):
    sc = 0.0 if scale is None else float(scale)
    if scale is not None and not sc > 0:
        raise VitcError(-1, "%s: scale must be > 0, got %r" % (name, scale))
    return sc


def sdpa_lse(query, key, value, attn_mask=None, scale=None):
    """(out, lse): scaled_dot_product_attention's output and the natural
    log-sum-exp of each query row's scores, lse [..., L], which is what a
    training forward keeps for sdpa_backward(..., out=out, lse=lse)."""
    q, k, v = _qkv(query, key, value)
    m, mt = _mask(attn_mask, "attn_mask")
    sc = _scale(scale, "sdpa_lse")
    out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=np.float32)
    lse = np.empty(q.shape[:-1], dtype=np.float32)
    vq, vk, vv, vm = _view(q), _view(k), _view(v), _view(m)
    check(lib.vitc_sdpa_lse(ctypes.byref(vq), ctypes.byref(vk), ctypes.byref(vv), ctypes.byref(vm),
                            int(mt), sc, fptr(out), fptr(lse)))
    return out, lse


def sdpa_backward(query, key, value, grad_out, attn_mask=None, scale=None, out=None, lse=None):
    """The gradients (dq, dk, dv) of
    out = scaled_dot_product_attention(query, key, value, attn_mask, scale=scale)
    for dL/dout = grad_out, with the same shapes and mask conventions (a bool
    mask's True means the position takes part; a float mask is added; masks
    broadcast). query, key, value broadcast over their leading dims as in the
    forward; the gradients have the broadcast shapes. The forward is recomputed
    in C; no L x S matrix is stored. With out and lse from sdpa_lse on the
    same inputs the forward is not recomputed (the same gradients). A row
    with no allowed key (0 in the forward) gets a zero dq row and adds
    nothing to dk and dv, as torch 2.x's autograd gives."""
    q, k, v = _qkv(query, key, value)
    g = _arr(grad_out)
    out_shape = q.shape[:-1] + v.shape[-1:] if q.ndim >= 2 and v.ndim >= 2 else None
    if out_shape is not None and g.shape != out_shape:
        raise VitcError(-2, "sdpa_backward: grad_out has shape %s, the output %s"
                        % (tuple(g.shape), tuple(out_shape)))
    m, mt = _mask(attn_mask, "attn_mask")
    sc = _scale(scale, "sdpa_backward")
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    vq, vk, vv, vm = _view(q), _view(k), _view(v), _view(m)
    if (out is None) != (lse is None):
        raise VitcError(-1, "sdpa_backward: give both out and lse, or neither")
    if out is None:
        check(lib.vitc_sdpa_backward(ctypes.byref(vq), ctypes.byref(vk), ctypes.byref(vv),
                                     ctypes.byref(vm), int(mt), sc, fptr(g), fptr(dq), fptr(dk),
                                     fptr(dv)))
        return dq, dk, dv
    o, ls = _arr(out), _arr(lse)
    if o.shape != out_shape or ls.shape != q.shape[:-1]:
        raise VitcError(-2, "sdpa_backward: out %s / lse %s, expected %s / %s"
                        % (tuple(o.shape), tuple(ls.shape), tuple(out_shape), tuple(q.shape[:-1])))
    check(lib.vitc_sdpa_backward_lse(ctypes.byref(vq), ctypes.byref(vk), ctypes.byref(vv),
                                     ctypes.byref(vm), int(mt), sc, fptr(o), fptr(ls), fptr(g),
                                     fptr(dq), fptr(dk), fptr(dv)))
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
