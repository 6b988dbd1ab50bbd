"""A safetensors writer independent of vitc (numpy + json only), so that
reference files written by PyTorch scripts do not go through the code they
test."""
import json
import struct

import numpy as np

_DT = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
       np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}


def write(path, tensors, metadata=None, bf16=()):
    """tensors: name -> numpy array (or torch tensor). Names in `bf16` are
    stored as BF16 (round to nearest even from float32)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        a = tensors[name]
        if hasattr(a, "detach"):
            a = a.detach().cpu().numpy()
        a = np.ascontiguousarray(a)
        if name in bf16:
            u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            b, dt = u.tobytes(), "BF16"
        else:
            b, dt = a.tobytes(), _DT[a.dtype]
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
