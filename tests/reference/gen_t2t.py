"""Reference numbers for T2T-ViT, written by PyTorch (tests/reference/t2t_ref.py,
the original's modules re-implemented), for tests/test_t2t.c.

    .venv/bin/python tests/reference/gen_t2t.py     (writes tests/reference/t2t/)

Two tiny random models at 32 px (token_dim 8, embed 32, depth 2, 2 heads,
MLP ratio 2, 5 classes), every parameter random, through st_write
(independent of vitc):

  transformer.safetensors  tokens_type "transformer", qk_scale null, vitc.config
  performer.safetensors    tokens_type "performer", qk_scale 0.2, qkv_bias true
  t2t_io.safetensors       input [2,3,32,32]; per model: <mode>_logits [2,5],
                           <mode>_cls [2,32] (norm(x)[:, 0])
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_write  # noqa: E402
import t2t_ref  # noqa: E402


def main():
    out = os.path.join(HERE, "t2t")
    os.makedirs(out, exist_ok=True)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(11))
    io = {"input": x}
    for seed, (mode, extra) in enumerate([("transformer", {}),
                                          ("performer", {"qk_scale": 0.2, "qkv_bias": True})]):
        cfg = t2t_ref.t2t_config(mode, img_size=32, embed_dim=32, depth=2, num_heads=2,
                                 mlp_ratio=2.0, token_dim=8, num_classes=5, **extra)
        sd = t2t_ref.random_state(cfg, seed + 20)
        st_write.write(os.path.join(out, mode + ".safetensors"), sd, t2t_ref.metadata(cfg))
        logits, cls, _ = t2t_ref.forward(sd, cfg, x)
        io[mode + "_logits"], io[mode + "_cls"] = logits, cls
    st_write.write(os.path.join(out, "t2t_io.safetensors"), io)


if __name__ == "__main__":
    main()
