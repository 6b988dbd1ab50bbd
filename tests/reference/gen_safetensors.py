"""Write the safetensors fixtures of tests/test_safetensors.c and
tests/python/test_io.py with the independent writer st_write.py; expected
float32 values of the F16 and BF16 tensors come from numpy / torch, not from
vitc. Run: .venv/bin/python tests/reference/gen_safetensors.py"""
import os
import sys

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import st_write  # noqa: E402

out = os.path.join(here, "safetensors")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(1234)

# F16: specials (signed zeros, smallest/largest subnormal, smallest normal,
# max, inf, NaN with a payload) and random values.
f16_bits = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00,
                     0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7D55, 0x3555, 0x0200],
                    dtype=np.uint16)
f16 = np.concatenate([f16_bits.view(np.float16),
                      rng.standard_normal(16).astype(np.float16)]).reshape(4, 8)
f16_expect = f16.astype(np.float32)  # numpy's own half -> single

f32 = rng.standard_normal((3, 5)).astype(np.float32)

# BF16: random and special float32 values, rounded to nearest even by
# st_write; the expected values are torch's bfloat16 of the same floats.
bf_src = np.concatenate([rng.standard_normal(10).astype(np.float32) * 100,
                         np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, 3.0e38], np.float32)])
try:
    import torch
    bf_expect = torch.from_numpy(bf_src).bfloat16().float().numpy()
except ImportError:  # the same rounding, spelled out
    u = bf_src.view(np.uint32).astype(np.uint64)
    bf_expect = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)

tensors = {
    "f32": f32,
    "f16": f16,
    "f16_expect": f16_expect,
    "bf16": bf_src,
    "bf16_expect": bf_expect,
    "empty": np.zeros((0, 4), dtype=np.float32),
    "layer.0.w\u00e9ight": np.arange(6, dtype=np.float32).reshape(1, 2, 3),
}
st_write.write(os.path.join(out, "mixed.safetensors"), tensors,
               metadata={"format": "pt", "unicode": "h\u00e9llo \u2713", "quote": "a\"b\\c\n"},
               bf16=("bf16",))
print("wrote", os.path.join(out, "mixed.safetensors"))
