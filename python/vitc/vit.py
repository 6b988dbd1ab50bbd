"""The Vision Transformer: torchvision- or timm-named safetensors in, logits
and attention maps out. Every number comes from libvitc."""
import ctypes

import numpy as np

from ._lib import as_f32, check, fptr, lib

__all__ = ["VisionTransformer"]


class _Config(ctypes.Structure):
    # Mirrors vitc_vit_config in include/vitc.h.
    _fields_ = [("image_size", ctypes.c_int), ("patch_size", ctypes.c_int),
                ("in_channels", ctypes.c_int), ("hidden_dim", ctypes.c_int),
                ("depth", ctypes.c_int), ("num_heads", ctypes.c_int),
                ("mlp_dim", ctypes.c_int), ("num_classes", ctypes.c_int),
                ("norm_eps", ctypes.c_float), ("mean", ctypes.c_float * 3),
                ("std", ctypes.c_float * 3)]


_p = ctypes.c_void_p
_f = ctypes.POINTER(ctypes.c_float)
_i = ctypes.c_int
lib.vitc_vit_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_p)]
lib.vitc_vit_free.argtypes = [_p]
lib.vitc_vit_free.restype = None
lib.vitc_vit_get_config.argtypes = [_p]
lib.vitc_vit_get_config.restype = ctypes.POINTER(_Config)
lib.vitc_vit_arch_name.argtypes = [_p]
lib.vitc_vit_arch_name.restype = ctypes.c_char_p
lib.vitc_vit_label.argtypes = [_p, _i]
lib.vitc_vit_label.restype = ctypes.c_char_p
lib.vitc_vit_forward.argtypes = [_p, _f, _i, _i, _i, _f]
lib.vitc_vit_attention_maps.argtypes = [_p, _f, _i, _i, _i, _f, _f]


class VisionTransformer:
    """torchvision's VisionTransformer (eval mode) running in libvitc.

    >>> m = VisionTransformer.from_safetensors("vit_b_16.safetensors")
    >>> logits = m(images)                  # [B, 3, H, W] -> [B, num_classes]
    >>> attn, rollout = m.attention_maps(images)
    """

    def __init__(self, handle):
        self._h = ctypes.c_void_p(handle)
        c = lib.vitc_vit_get_config(self._h).contents
        self.config = {
            "image_size": c.image_size, "patch_size": c.patch_size, "in_channels": c.in_channels,
            "hidden_dim": c.hidden_dim, "depth": c.depth, "num_heads": c.num_heads,
            "mlp_dim": c.mlp_dim, "num_classes": c.num_classes, "norm_eps": c.norm_eps,
            "mean": list(c.mean), "std": list(c.std),
            "arch": lib.vitc_vit_arch_name(self._h).decode(),
        }
        labels = [lib.vitc_vit_label(self._h, i) for i in range(c.num_classes)]
        self.labels = None if labels and labels[0] is None else [s.decode() for s in labels]

    @classmethod
    def from_safetensors(cls, path, arch=None):
        """Load a checkpoint; the architecture comes from its vitc.config
        metadata, else `arch` ("vit_b_16", "vit_base_patch16_224", ...),
        else the tensors' names and shapes."""
        h = ctypes.c_void_p()
        check(lib.vitc_vit_load(str(path).encode(), arch.encode() if arch else None,
                                ctypes.byref(h)))
        return cls(h.value)

    def __del__(self):
        if getattr(self, "_h", None) and self._h.value:
            lib.vitc_vit_free(self._h)
            self._h = None

    def _images(self, images):
        x = as_f32(images)
        if x.ndim == 3:
            x = x[None]
        c = self.config["in_channels"]
        if x.ndim != 4 or x.shape[1] != c:
            raise ValueError("images must be [B, %d, H, W] or [%d, H, W], got %s"
                             % (c, c, list(np.shape(images))))
        return x

    def __call__(self, images):
        """Logits [B, num_classes] (float32) for images [B, C, H, W] or
        [C, H, W], already normalised with config["mean"]/["std"]."""
        x = self._images(images)
        out = np.empty((x.shape[0], self.config["num_classes"]), np.float32)
        check(lib.vitc_vit_forward(self._h, fptr(x), *x.shape[:1], *x.shape[2:], fptr(out)))
        return out

    forward = __call__

    def attention_maps(self, images):
        """(attn [depth, B, heads, N, N], rollout [B, N, N]), N = 1 + patches:
        every block's softmax probabilities and their attention rollout."""
        x = self._images(images)
        B, _, H, W = x.shape
        p = self.config["patch_size"]
        n = 1 + (H // p) * (W // p)
        attn = np.empty((self.config["depth"], B, self.config["num_heads"], n, n), np.float32)
        roll = np.empty((B, n, n), np.float32)
        check(lib.vitc_vit_attention_maps(self._h, fptr(x), B, H, W, fptr(attn), fptr(roll)))
        return attn, roll

    def __repr__(self):
        return "VisionTransformer(%s)" % ", ".join(
            "%s=%r" % (k, v) for k, v in self.config.items() if k not in ("mean", "std"))
