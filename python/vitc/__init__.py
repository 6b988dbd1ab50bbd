"""vitc — self-attention for computer vision, in C.

A thin ctypes binding over libvitc: every number comes from the C library.
"""
from . import _lib
from ._lib import Status, VitcError  # noqa: F401  (public)
from .layers import *  # noqa: F401,F403  (AttentionBlock, ..., scaled_dot_product_attention, softmax)
from .grad import *  # noqa: F401,F403  (sdpa_backward, softmax_backward)
from .io import *  # noqa: F401,F403  (load_safetensors, save_safetensors)
from .vit import *  # noqa: F401,F403  (VisionTransformer)
from .image import *  # noqa: F401,F403  (load_image, preprocess_image, save_png)
from .train import *  # noqa: F401,F403  (cross_entropy, AdamW, SGD, clip_grad_norm_)
from .text import *  # noqa: F401,F403  (Tokenizer)
from .sam import Sam, SamPredictor  # noqa: F401  (Segment Anything)
from . import lr  # noqa: F401  (vitc.lr.OneCycleLR, vitc.lr.WarmupCosine)
from .cpu import cpu_info  # noqa: F401
from .depth import DepthAnything  # noqa: F401  (Depth Anything V1 / V2)

from . import layers as _layers, grad as _grad, io as _io, vit as _vit, image as _image, \
    train as _train, text as _text

__version__ = _lib.lib.vitc_version().decode()

# help(vitc) and `from vitc import *` list what each module exports, not
# only this file's own functions
__all__ = (["Status", "VitcError", "lr", "DepthAnything", "Sam", "SamPredictor",
            "set_num_threads", "get_num_threads", "get_arch", "cpu_info"]
           + _layers.__all__ + _grad.__all__ + _io.__all__ + _vit.__all__ + _image.__all__
           + _train.__all__ + _text.__all__)


def set_num_threads(n):
    """Threads used by every parallel loop of the library (n <= 0: default)."""
    _lib.lib.vitc_set_num_threads(_lib.int_arg(n, "n"))


def get_num_threads():
    return _lib.lib.vitc_get_num_threads()


def get_arch():
    """The kernel path in use: 'avx512', 'avx2' or 'generic' (VITC_ARCH forces one)."""
    return _lib.lib.vitc_get_arch().decode()
