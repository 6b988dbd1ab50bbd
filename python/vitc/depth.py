"""Depth Anything (V1 and V2): relative (or metric) depth maps, in C."""
import ctypes

import numpy as np

from ._lib import check, fptr, int_arg, lib, libc_free, path_arg

__all__ = ["DepthAnything"]


class DepthAnything:
    """A transformers DepthAnythingForDepthEstimation directory (config.json,
    model.safetensors, preprocessor_config.json).

    predict(image) -> float32 [height, width]: the depth-estimation pipeline
    (DPT processor, model, bicubic resize back to the image).
    forward(pixels [B, 3, H, W]) -> predicted_depth [B, H, W]."""

    def __init__(self, path):
        self._h = None
        h = ctypes.c_void_p()
        check(lib.vitc_depth_load(path_arg(path), ctypes.byref(h)))
        self._h = h

    def __del__(self):
        if getattr(self, "_h", None):
            lib.vitc_depth_free(self._h)
            self._h = None

    def input_size(self, width, height):
        """The preprocessed (H, W) of a width x height image."""
        h, w = ctypes.c_int(), ctypes.c_int()
        check(lib.vitc_depth_input_size(self._h, int_arg(width, "width"),
                                        int_arg(height, "height"), ctypes.byref(h),
                                        ctypes.byref(w)))
        return h.value, w.value

    def forward(self, pixels):
        x = np.ascontiguousarray(pixels, dtype=np.float32)
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError("pixels must be [B, 3, H, W], got shape %s" % (x.shape,))
        B, _, H, W = x.shape
        out = np.empty((B, H, W), np.float32)
        check(lib.vitc_depth_forward(self._h, fptr(x), int_arg(B, "batch"), int_arg(H, "height"),
                                     int_arg(W, "width"), fptr(out)))
        return out

    __call__ = forward

    def predict(self, image):
        """image: a path, or a uint8 array [height, width, 3]."""
        from .image import _as_image
        img, keep = _as_image(image)
        p = ctypes.POINTER(ctypes.c_float)()
        check(lib.vitc_depth_predict(self._h, ctypes.byref(img), ctypes.byref(p)))
        try:
            out = np.ctypeslib.as_array(p, shape=(img.height, img.width)).copy()
        finally:
            libc_free(p)
        del keep
        return out
