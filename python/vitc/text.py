"""Tokenizers of CLIP and SigLIP checkpoints (the C library's, exact ids).

    tok = vitc.Tokenizer("path/to/hub-dir")       # or tokenizer.json, spiece.model, ...gz
    ids = tok("a photo of a cat")                 # int32 [context], padded as the model pads
    ids = tok(["a cat", "a dog"])                 # [2, context]
    ids, n = tok.encode("a cat")                  # n: ids before padding
"""
import ctypes

import numpy as np

from . import _lib
from ._lib import lib, check

__all__ = ["Tokenizer"]


class Tokenizer:
    """A checkpoint's tokenizer read by libvitc (vitc_tokenizer_load)."""

    def __init__(self, path=None, _handle=None, _owner=None):
        if _handle is not None:
            # borrowed from a model (vitc_vit_tokenizer): the model owns it
            self._h, self._owned, self._owner = ctypes.c_void_p(_handle), False, _owner
            return
        h = ctypes.c_void_p()
        check(lib.vitc_tokenizer_load(_lib.path_arg(path), ctypes.byref(h)))
        self._h, self._owned, self._owner = h, True, None

    def __del__(self):
        if getattr(self, "_owned", False) and self._h:
            lib.vitc_tokenizer_free(self._h)
            self._h = None

    @property
    def context(self):
        return lib.vitc_tokenizer_context(self._h)

    @property
    def vocab_size(self):
        return lib.vitc_tokenizer_vocab_size(self._h)

    @property
    def kind(self):
        return lib.vitc_tokenizer_kind(self._h).decode()

    def encode(self, text, context=0):
        """(ids int32 [context], n): the ids the model sees and how many
        precede the padding."""
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ctx = _lib.int_arg(context, "context", 0) or self.context
        ids = np.zeros(ctx, dtype=np.int32)
        n = ctypes.c_int()
        check(lib.vitc_tokenizer_encode(self._h, b, len(b),
                                        ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                        ctx, ctypes.byref(n)))
        return ids, n.value

    def __call__(self, text, context=0):
        if isinstance(text, (str, bytes)):
            return self.encode(text, context)[0]
        return np.stack([self.encode(t, context)[0] for t in text]) if len(text) else \
            np.zeros((0, context or self.context), dtype=np.int32)
