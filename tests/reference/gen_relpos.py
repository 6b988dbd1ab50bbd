"""Reference tensors for tests/test_relpos_attention.c, written by PyTorch.

    .venv/bin/python tests/reference/gen_relpos.py    (writes tests/reference/relpos/)

transformers' SamVisionAttention (use_rel_pos=True, random weights and
position tables) on a window: its state_dict under "attn.", the input "x"
[B, H, W, C], the output "y", and the float64 autograd gradients of
sum(y * dy) for a random "dy": "dx", "d_rel_pos_h", "d_rel_pos_w". One case
runs on the layer's own grid; one on a smaller, non-square grid, so the
tables are resampled (get_rel_pos's linear interpolation).
"""
import copy
import os
import sys

import numpy as np
import torch
from transformers import SamVisionConfig
from transformers.models.sam.modeling_sam import SamVisionAttention

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_write  # noqa: E402

OUT = os.path.join(HERE, "relpos")


def case(window, heads, hidden, shape, seed):
    """The case's tensors, name -> float32 numpy array."""
    torch.manual_seed(seed)
    cfg = SamVisionConfig(hidden_size=hidden, num_attention_heads=heads, use_rel_pos=True,
                          qkv_bias=True, image_size=window * 16, patch_size=16)
    attn = SamVisionAttention(cfg, window_size=window).eval()
    with torch.no_grad():  # the tables start at zero: give them trained-like values
        attn.rel_pos_h.normal_(0.0, 0.5)
        attn.rel_pos_w.normal_(0.0, 0.5)
    x = torch.randn(*shape)
    with torch.no_grad():
        y = attn(x)[0]
    a64 = copy.deepcopy(attn).double()
    x64 = x.double().requires_grad_(True)
    dy = torch.randn(*y.shape)
    (a64(x64)[0] * dy.double()).sum().backward()
    t = {"attn." + k: v.detach().numpy().astype(np.float32) for k, v in attn.state_dict().items()}
    t["x"] = x.numpy()
    t["y"] = y.numpy()
    t["dy"] = dy.numpy()
    t["dx"] = x64.grad.numpy().astype(np.float32)
    t["d_rel_pos_h"] = a64.rel_pos_h.grad.numpy().astype(np.float32)
    t["d_rel_pos_w"] = a64.rel_pos_w.grad.numpy().astype(np.float32)
    return t


# name -> case arguments: the layer's own 7 x 7 grid (13-row tables as they
# are), and a 5 x 6 grid (the tables resampled to 9 and 11 rows)
CASES = {
    "sam_window": (7, 2, 64, (2, 7, 7, 64), 1),
    "sam_resampled": (7, 4, 64, (1, 5, 6, 64), 2),
}


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, args in CASES.items():
        st_write.write(os.path.join(OUT, name + ".safetensors"), case(*args))
