"""Segment Anything: a SamModel directory, an image's embedding computed once,
masks for any number of prompts (segment-anything's SamPredictor), in C."""
import ctypes

import numpy as np

from ._lib import SamPrompt, SamResult, as_f32, check, fptr, int_arg, lib, owned_array, path_arg
from .image import _as_image

__all__ = ["Sam", "SamPredictor"]


class Sam:
    """A loaded SAM (transformers' SamModel directory: config.json and
    model.safetensors; tools/convert_sam.py makes one from sam_vit_*.pth).
    precision: "fp32" (default), "bf16" or "int8" for the image encoder's
    weight GEMMs (vitc_sam_load_precision; docs/segment.md, "Precision")."""

    def __init__(self, path, precision="fp32"):
        self._h = ctypes.c_void_p()
        if not isinstance(precision, str):
            raise TypeError("precision must be \"fp32\", \"bf16\" or \"int8\", got %r"
                            % (precision,))
        check(lib.vitc_sam_load_precision(path_arg(path), precision.encode(),
                                          ctypes.byref(self._h)))

    @property
    def low_res_size(self):
        """The side of the masks' low-resolution logits: 4x the embedding's
        grid (256 for the released models)."""
        lo = getattr(self, "_lo", None)
        if lo is None:
            lo = self._lo = 4 * self.embedding_shape[1]
        return lo

    @property
    def input_size(self):
        """The encoder's input side (1024 for the released models)."""
        return lib.vitc_sam_input_size(self._h)

    @property
    def embedding_shape(self):
        """The image embedding's shape (C, h, w)."""
        s = (ctypes.c_int64 * 3)()
        lib.vitc_sam_embedding_shape(self._h, s)
        return tuple(int(v) for v in s)

    def close(self):
        if getattr(self, "_h", None):
            lib.vitc_sam_free(self._h)
            self._h = None

    def __del__(self):
        self.close()


class SamPredictor:
    """set_image once, then predict for any number of prompts."""

    def __init__(self, sam):
        if not isinstance(sam, Sam):
            raise TypeError("SamPredictor needs a vitc.Sam, got %s" % type(sam).__name__)
        self.model = sam
        self._e = None
        self.original_size = None

    def _replace(self, e, size):
        self.reset_image()
        self._e, self.original_size = e, size

    def set_image(self, image):
        """image: uint8 RGB array [H, W, 3] or a PNG / JPEG path; preprocessed
        as SamProcessor does and encoded."""
        img, arr = _as_image(image)
        e = ctypes.c_void_p()
        check(lib.vitc_sam_set_image(self.model._h, ctypes.byref(img), ctypes.byref(e)))
        self._replace(e, (arr.shape[0], arr.shape[1]))

    def set_image_tensor(self, pixels, original_size):
        """An already preprocessed float tensor [3, S, S] of an image of
        original_size (height, width)."""
        S = self.model.input_size
        px = as_f32(pixels)
        if px.shape != (3, S, S):
            raise ValueError("pixels must be [3, %d, %d], got %s" % (S, S, px.shape))
        h, w = (int_arg(v, "original_size") for v in original_size)
        e = ctypes.c_void_p()
        check(lib.vitc_sam_set_image_tensor(self.model._h, fptr(px), w, h, ctypes.byref(e)))
        self._replace(e, (h, w))

    def _need(self):
        if not self._e:
            raise RuntimeError("no image: call set_image first")

    @property
    def embedding(self):
        """The image embedding, numpy [C, h, w] (SamModel.get_image_embeddings)."""
        self._need()
        C, h, w = self.model.embedding_shape
        p = lib.vitc_sam_image_embedding(self._e)
        return np.ctypeslib.as_array(p, shape=(C * h * w,)).copy().reshape(C, h, w)

    def predict(self, points=None, labels=None, box=None, mask_input=None,
                multimask_output=True, return_logits=False):
        """Masks for one prompt, as segment-anything's SamPredictor.predict:
        (masks [n, H, W] bool (logits with return_logits), iou [n],
        low_res [n, 256, 256] logits). points [[x, y], ...] in the image's
        pixels with labels (1 foreground, 0 background); box [x0, y0, x1, y1];
        mask_input: a previous low_res mask [256, 256] (or [1, 256, 256]).
        low_res is 4x the embedding's grid a side (256 for the released
        models)."""
        self._need()
        lo = self.model.low_res_size
        pr = SamPrompt()
        keep = []
        if points is not None:
            pts = as_f32(points).reshape(-1, 2) if np.size(points) else np.zeros((0, 2), np.float32)
            if labels is None:
                raise ValueError("points need labels (1 foreground, 0 background)")
            lab = np.ascontiguousarray(np.asarray(labels).reshape(-1), dtype=np.intc)
            if lab.shape[0] != pts.shape[0]:
                raise ValueError("%d points but %d labels" % (pts.shape[0], lab.shape[0]))
            keep += [pts, lab]
            pr.n_points = int_arg(pts.shape[0], "number of points", 0)
            pr.points = fptr(pts)
            pr.labels = lab.ctypes.data_as(ctypes.POINTER(ctypes.c_int))
        if box is not None:
            b = as_f32(box).reshape(-1)
            if b.shape[0] != 4:
                raise ValueError("box must be [x0, y0, x1, y1], got %d numbers" % b.shape[0])
            keep.append(b)
            pr.box = fptr(b)
        if mask_input is not None:
            m = as_f32(mask_input)
            if m.size != lo * lo:
                raise ValueError("mask_input must be [%d, %d] low-resolution logits, got "
                                 "shape %s" % (lo, lo, m.shape))
            m = m.reshape(lo, lo)
            keep.append(m)
            pr.mask = fptr(m)
        pr.multimask = 1 if multimask_output else 0
        # the boolean masks thresholded in C while the logits are in cache
        pr.binary = 0 if return_logits else 1
        r = SamResult()
        check(lib.vitc_sam_predict(self.model._h, self._e, ctypes.byref(pr), ctypes.byref(r)))
        # the arrays are the C buffers themselves (freed with the arrays):
        # no copies of the masks' megabytes
        try:
            n, H, W = r.n_masks, r.height, r.width
            low = owned_array(r.low_res, (n, lo, lo), ctypes.c_float, np.float32)
            r.low_res = None
            if return_logits:
                masks = owned_array(r.masks, (n, H, W), ctypes.c_float, np.float32)
                r.masks = None
            else:
                masks = owned_array(r.binary, (n, H, W), ctypes.c_ubyte, np.bool_)
                r.binary = None
            iou = np.array(r.iou[:n], dtype=np.float32)
        finally:
            lib.vitc_sam_result_free(ctypes.byref(r))
        return masks, iou, low

    def reset_image(self):
        if self._e:
            lib.vitc_sam_image_free(self._e)
        self._e, self.original_size = None, None

    def __del__(self):
        self.reset_image()
