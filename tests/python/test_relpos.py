"""SAM's decomposed relative-position attention: the references that
tests/test_relpos_attention.c holds the fused kernel to.

vitc's relative-position attention has no Python entry point yet (it is
the internal kernel SAM's image encoder will run), so the comparison with
transformers' SamVisionAttention runs in C, from the tensors
tests/reference/gen_relpos.py wrote. This test keeps those tensors honest:
they must be what the installed torch and transformers compute now, and
they must be a case where the relative positions matter (the output
without them differs).
"""
import os
import sys
import unittest

import numpy as np
import torch
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "reference")
sys.path.insert(0, REF)
import gen_relpos  # noqa: E402


class TestRelposReferences(unittest.TestCase):
    def test_references_match_transformers(self):
        for name, args in gen_relpos.CASES.items():
            with self.subTest(case=name):
                stored = load_file(os.path.join(REF, "relpos", name + ".safetensors"))
                now = gen_relpos.case(*args)
                self.assertEqual(sorted(stored), sorted(now))
                for k in now:
                    np.testing.assert_allclose(stored[k], now[k], rtol=1e-5, atol=1e-6, err_msg=k)

    def test_relative_positions_matter(self):
        from transformers import SamVisionConfig
        from transformers.models.sam.modeling_sam import SamVisionAttention

        for name in gen_relpos.CASES:
            with self.subTest(case=name):
                t = load_file(os.path.join(REF, "relpos", name + ".safetensors"))
                C = t["x"].shape[-1]
                heads = {"sam_window": 2, "sam_resampled": 4}[name]
                cfg = SamVisionConfig(hidden_size=C, num_attention_heads=heads, use_rel_pos=False,
                                      qkv_bias=True)
                attn = SamVisionAttention(cfg, window_size=7).eval()
                sd = {k[len("attn."):]: torch.from_numpy(v) for k, v in t.items()
                      if k.startswith("attn.") and "rel_pos" not in k}
                attn.load_state_dict(sd)
                with torch.no_grad():
                    y = attn(torch.from_numpy(t["x"]))[0].numpy()
                self.assertGreater(np.abs(y - t["y"]).max(), 1e-2)


if __name__ == "__main__":
    unittest.main()
