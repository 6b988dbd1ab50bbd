"""SelfAttention at wide channels (one head of d >= 256: the SD VAE's
attention) against the seed's torch module.

At d >= 256 the fused attention packs V in column panels and runs P V on
its score microkernel's tile; the shapes here take that path with several
key blocks, several query blocks and a part last row group. Tolerance (the
project's): max|vitc - torch| <= 1e-5 * max(1, max|torch|).
"""
import os
import sys
import unittest

import numpy as np
import torch

import vitc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from gen_layers import SeedSelfAttentionGroup, randomize  # noqa: E402


class TestSelfAttentionWide(unittest.TestCase):
    def test_group_wide(self):
        gen = torch.Generator().manual_seed(4321)
        torch.manual_seed(4321)  # the modules' own weight initialisation
        # (C, shape): 300 tokens = two key blocks (256 + 44), 13 query
        # blocks of 24; 529 tokens = three key blocks, 23 rows past 22 x 24.
        for C, shape in [(256, (1, 256, 12, 25)), (288, (1, 288, 23, 23)), (512, (2, 512, 9, 9))]:
            with torch.no_grad():
                t = randomize(SeedSelfAttentionGroup(C), gen)
            v = vitc.SelfAttention(C)
            v.load_state_dict({k: x.numpy() for k, x in t.state_dict().items()})
            x = torch.randn(*shape, generator=gen) * 2.0 + 0.5
            with torch.no_grad():
                want = t(x).numpy()
            got = np.asarray(v(x.numpy()))
            self.assertEqual(got.shape, want.shape)
            err = float(np.max(np.abs(got - want)))
            bound = 1e-5 * max(1.0, float(np.max(np.abs(want))))
            self.assertLessEqual(err, bound, "SelfAttention(%d) on %s: %.3g > %.3g" % (C, shape, err, bound))


if __name__ == "__main__":
    unittest.main()
