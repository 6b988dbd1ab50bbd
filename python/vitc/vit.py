"""The Vision Transformer: torchvision- or timm-named safetensors in, logits
and attention maps out. Every number comes from libvitc."""
import ctypes
import threading

import numpy as np

from ._lib import as_f32, check, fptr, int_arg, lib, path_arg, str_arg

__all__ = ["VisionTransformer"]


class VisionTransformer:
    """torchvision's VisionTransformer (eval mode) running in libvitc.

    >>> m = VisionTransformer.from_safetensors("vit_b_16.safetensors")
    >>> logits = m(images)                  # [B, 3, H, W] -> [B, num_classes]
    >>> attn, rollout = m.attention_maps(images)

    The C model keeps its activations inside itself and ctypes releases the
    GIL during a call, so every C call on the model holds self._lock: one
    model may be called from several threads.
    """

    def __init__(self, handle):
        self._lock = threading.RLock()
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
        check(lib.vitc_vit_load(path_arg(path), str_arg(arch, "arch") if arch else None,
                                ctypes.byref(h)))
        return cls(h.value)

    def __del__(self):
        if getattr(self, "_h", None) and self._h.value:
            lib.vitc_vit_free(self._h)
            self._h = None

    def _images(self, images):
        """images -> (x [B, C, H, W] float32, B, H, W) with B, H, W checked as C ints."""
        x = as_f32(images)
        if x.ndim == 3:
            x = x[None]
        c = self.config["in_channels"]
        if x.ndim != 4 or x.shape[1] != c:
            raise ValueError("images must be [B, %d, H, W] or [%d, H, W], got %s"
                             % (c, c, list(np.shape(images))))
        B, _, H, W = x.shape
        return x, int_arg(B, "batch size", 0), int_arg(H, "image height", 0), int_arg(W, "image width", 0)

    def __call__(self, images):
        """Logits [B, num_classes] (float32) for images [B, C, H, W] or
        [C, H, W], already normalised with config["mean"]/["std"]."""
        x, B, H, W = self._images(images)
        out = np.empty((B, self.config["num_classes"]), np.float32)
        with self._lock:
            check(lib.vitc_vit_forward(self._h, fptr(x), B, H, W, fptr(out)))
        return out

    forward = __call__

    def attention_maps(self, images):
        """(attn [depth, B, heads, N, N], rollout [B, N, N]), N = 1 + patches:
        every block's softmax probabilities and their attention rollout."""
        x, B, H, W = self._images(images)
        p = self.config["patch_size"]
        n = 1 + (H // p) * (W // p)
        attn = np.empty((self.config["depth"], B, self.config["num_heads"], n, n), np.float32)
        roll = np.empty((B, n, n), np.float32)
        with self._lock:
            check(lib.vitc_vit_attention_maps(self._h, fptr(x), B, H, W, fptr(attn), fptr(roll)))
        return attn, roll

    def __repr__(self):
        return "VisionTransformer(%s)" % ", ".join(
            "%s=%r" % (k, v) for k, v in self.config.items() if k not in ("mean", "std"))
