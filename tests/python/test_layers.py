"""Live parity of every attention layer with PyTorch.

Each torch module is the seed's own code (copied below), built with random
weights; its state_dict is loaded into the vitc layer and both run on the
same input. Tolerance (the project's):
max|vitc - torch| <= 1e-5 * max(1, max|torch|).
"""
import math
import os
import sys
import warnings
import unittest

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import vitc


# Autograd off for this module's tests only: unittest discovery imports every
# test module before running any, and the gradient tests need it on.
def setUpModule():
    global _grad_was
    _grad_was = torch.is_grad_enabled()
    torch.set_grad_enabled(False)


def tearDownModule():
    torch.set_grad_enabled(_grad_was)


warnings.filterwarnings("ignore", "Byte tensor for attn_mask")


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
# The seeds' torch modules, shared with the reference generator.
from gen_layers import (SeedAttentionBlock, SeedConvSABlock, SeedSelfAttentionBatch,  # noqa: E402
                        SeedSelfAttentionGroup, SeedSelfAttentionMultiHead, SeedT2TAttention,
                        randomize, sdpa_ref, seed_single_head)


# ---------------------------------------------------------------------------

def sd_numpy(module):
    return {k: v.numpy() for k, v in module.state_dict().items()}


class Case(unittest.TestCase):
    def setUp(self):
        self.gen = torch.Generator().manual_seed(1234)

    def randn(self, *shape, scale=1.0):
        return torch.randn(*shape, generator=self.gen) * scale

    def close(self, got, want, what=""):
        want = want.numpy() if hasattr(want, "numpy") else np.asarray(want)
        self.assertEqual(tuple(got.shape), tuple(want.shape), what)
        self.assertEqual(got.dtype, np.float32, what)
        finite = np.abs(want[~np.isnan(want)])
        tol = 1e-5 * max(1.0, float(finite.max()) if finite.size else 1.0)
        nan_g, nan_w = np.isnan(got), np.isnan(want)
        np.testing.assert_array_equal(nan_g, nan_w, "NaN positions differ " + what)
        err = float(np.max(np.abs(got[~nan_g] - want[~nan_w]))) if (~nan_g).any() else 0.0
        self.assertLessEqual(err, tol, "%s: max error %g > %g" % (what, err, tol))


class TestStateDict(Case):
    def test_round_trip_into_torch(self):
        """vitc's state_dict loads strictly into the seed's torch module and gives its numbers."""
        for t, v, shape in [(SeedAttentionBlock(3, 4, 16), vitc.AttentionBlock(3, 4, 16, seed=1), (2, 3, 8, 8)),
                            (SeedConvSABlock(16), vitc.ConvSABlock(16, seed=2), (2, 16, 3, 3)),
                            (SeedSelfAttentionGroup(8), vitc.SelfAttention(8, seed=3), (2, 8, 3, 3)),
                            (SeedSelfAttentionBatch(8), vitc.SelfAttention(8, "batch", seed=4), (2, 8, 3, 3)),
                            (SeedSelfAttentionMultiHead(8, 2), vitc.SelfAttentionMultiHead(8, 2, seed=5), (2, 8, 3, 3)),
                            (SeedT2TAttention(6, 8, 2, True), vitc.T2TAttention(6, 8, 2, True, seed=6), (2, 5, 6)),
                            (nn.MultiheadAttention(8, 2, kdim=3), vitc.MultiheadAttention(8, 2, kdim=3, seed=7), None)]:
            v.parameters()[next(iter(v.parameters()))][...] += 0.25  # a non-default value survives too
            t.load_state_dict({k: torch.from_numpy(a) for k, a in v.state_dict().items()}, strict=True)
            if shape is not None:
                x = self.randn(*shape)
                self.close(v(x), t(x), type(v).__name__)

    def test_seeded_init_is_repeatable(self):
        a, b = vitc.T2TAttention(6, 8, seed=11), vitc.T2TAttention(6, 8, seed=11)
        for k, x in a.state_dict().items():
            np.testing.assert_array_equal(x, b.state_dict()[k])
        bound = 1 / math.sqrt(6)
        self.assertLessEqual(np.abs(a.state_dict()["qkv.weight"]).max(), bound)
        self.assertGreater(np.abs(a.state_dict()["qkv.weight"]).max(), 0.9 * bound)


class TestAttentionBlock(Case):
    def test_seed_shapes(self):
        for (C, p, E, heads, shape) in [(3, 4, 64, 1, (1, 3, 32, 32)), (3, 4, 64, 1, (3, 3, 12, 20)),
                                        (5, 2, 24, 1, (2, 5, 6, 4)), (3, 4, 16, 1, (2, 3, 4, 4)),
                                        (3, 4, 64, 4, (3, 3, 16, 8)), (4, 1, 12, 3, (1, 4, 3, 5))]:
            t = randomize(SeedAttentionBlock(C, p, E, heads), self.gen)
            v = vitc.AttentionBlock(C, p, E, heads)
            v.load_state_dict(sd_numpy(t))
            x = self.randn(*shape)
            self.close(v(x.numpy()), t(x), "AttentionBlock%s on %s" % ((C, p, E, heads), shape))

    def test_errors(self):
        with self.assertRaisesRegex(vitc.VitcError, "not divisible by heads"):
            vitc.AttentionBlock(3, 4, 64, 5)
        v = vitc.AttentionBlock(3, 4, 16)
        with self.assertRaisesRegex(vitc.VitcError, "divisible by patch_size"):
            v(np.zeros((1, 3, 10, 8), np.float32))
        with self.assertRaisesRegex(vitc.VitcError, r"expected \[B, 3, H, W\]"):
            v(np.zeros((1, 4, 8, 8), np.float32))


class TestConvSABlock(Case):
    def test_parity(self):
        for C, shape in [(64, (1, 64, 32, 32)), (16, (3, 16, 5, 7)), (20, (2, 20, 3, 3)), (8, (1, 8, 1, 1))]:
            t = randomize(SeedConvSABlock(C), self.gen)
            v = vitc.ConvSABlock(C)
            v.load_state_dict(t.state_dict())  # torch tensors are accepted too
            x = self.randn(*shape)
            self.close(v(x), t(x), "ConvSABlock(%d) on %s" % (C, shape))

    def test_fresh_gamma_is_identity(self):
        x = np.random.randn(2, 16, 3, 4).astype(np.float32)
        np.testing.assert_array_equal(vitc.ConvSABlock(16)(x), x)

    def test_errors(self):
        with self.assertRaisesRegex(vitc.VitcError, "in_channels 7 < 8"):
            vitc.ConvSABlock(7)


class TestSelfAttention(Case):
    def test_group(self):
        for C, shape in [(32, (64, 32, 16, 16)), (32, (3, 32, 5, 7)), (8, (1, 8, 1, 1)), (12, (2, 12, 1, 9))]:
            t = randomize(SeedSelfAttentionGroup(C), self.gen)
            v = vitc.SelfAttention(C)
            v.load_state_dict(sd_numpy(t))
            x = self.randn(*shape, scale=2.0) + 0.5
            self.close(v(x), t(x), "SelfAttention(%d) on %s" % (C, shape))

    def test_group_diffusers_names(self):
        t = randomize(SeedSelfAttentionGroup(16), self.gen)
        ren = {"norm": "group_norm", "q": "query", "k": "key", "v": "value", "proj": "proj_attn"}
        sd = {ren[k.split(".")[0]] + "." + k.split(".")[1]: a for k, a in sd_numpy(t).items()}
        v = vitc.SelfAttention(16)
        v.load_state_dict(sd)
        x = self.randn(3, 16, 4, 6)
        self.close(v(x), t(x), "diffusers names")
        self.assertIn("norm.weight", v.state_dict())  # saved under the seed's names
        with self.assertRaisesRegex(vitc.VitcError, 'key "q.weight" duplicates "query.weight"'):
            v.load_state_dict(dict(sd, **{"q.weight": sd["query.weight"]}))

    def _batch_modes(self, t, v, shapes):
        v.load_state_dict(sd_numpy(t))
        for step, shape in enumerate(shapes):
            x = self.randn(*shape) * 1.5 + 0.3
            t.train()
            v.train()
            self.close(v(x), t(x), "train step %d on %s" % (step, shape))
            sd_t, sd_v = sd_numpy(t), v.state_dict()
            for k in ("norm.running_mean", "norm.running_var"):
                self.close(sd_v[k], sd_t[k], "%s after step %d" % (k, step))
            self.assertEqual(int(sd_v["norm.num_batches_tracked"]), int(sd_t["norm.num_batches_tracked"]))
            t.eval()
            v.eval()
            self.close(v(x), t(x), "eval after step %d on %s" % (step, shape))
        sd_before = v.state_dict()
        v(self.randn(*shapes[0]))  # eval: running stats stay
        np.testing.assert_array_equal(v.state_dict()["norm.running_var"], sd_before["norm.running_var"])

    def test_batch_train_eval(self):
        t = randomize(SeedSelfAttentionBatch(32), self.gen)
        self._batch_modes(t, vitc.SelfAttention(32, norm="batch"), [(64, 32, 16, 16), (3, 32, 5, 7), (1, 32, 1, 2)])

    def test_multihead_train_eval(self):
        for C, h, shapes in [(32, 4, [(64, 32, 16, 16), (5, 32, 3, 7)]), (12, 3, [(1, 12, 2, 1), (7, 12, 1, 1)]),
                             (8, 1, [(2, 8, 3, 3)]), (6, 6, [(3, 6, 4, 5)])]:
            t = randomize(SeedSelfAttentionMultiHead(C, h), self.gen)
            self._batch_modes(t, vitc.SelfAttentionMultiHead(C, h), shapes)

    def test_batch_one_value_per_channel(self):
        v = vitc.SelfAttention(8, norm="batch")
        with self.assertRaisesRegex(vitc.VitcError, "more than 1 value per channel"):
            v(np.zeros((1, 8, 1, 1), np.float32))
        v.eval()(np.zeros((1, 8, 1, 1), np.float32))

    def test_errors(self):
        with self.assertRaisesRegex(vitc.VitcError, "not divisible by nheads"):
            vitc.SelfAttentionMultiHead(32, 5)
        with self.assertRaises(ValueError):
            vitc.SelfAttention(8, norm="layer")
        v = vitc.SelfAttention(8)
        sd = v.state_dict()
        with self.assertRaisesRegex(vitc.VitcError, r'key "q.weight" has shape \[8, 4\], expected \[8, 8\]'):
            v.load_state_dict(dict(sd, **{"q.weight": np.zeros((8, 4), np.float32)}))
        bad = dict(sd)
        del bad["proj.bias"]
        with self.assertRaisesRegex(vitc.VitcError, r'missing key "proj.bias" \(expected shape \[8\]\)'):
            v.load_state_dict(bad)
        with self.assertRaisesRegex(vitc.VitcError, 'unexpected key "extra"'):
            v.load_state_dict(dict(sd, extra=np.zeros(3)))
        v.load_state_dict(dict(sd, extra=np.zeros(3)), strict=False)
        with self.assertRaisesRegex(vitc.VitcError, r"input has shape \[2, 8, 4\]"):
            v(np.zeros((2, 8, 4), np.float32))


class TestT2T(Case):
    def test_parity(self):
        for (dim, chan, h, bias, qs, shape) in [(49, 64, 1, False, None, (13, 100, 49)),
                                                 (49, 64, 4, False, None, (13, 100, 49)),
                                                 (10, 12, 3, True, None, (2, 7, 10)),
                                                 (10, 8, 2, True, 0.3, (3, 1, 10)),
                                                 (6, 6, 6, False, 1.7, (1, 5, 6))]:
            t = randomize(SeedT2TAttention(dim, chan, h, bias, qs), self.gen)
            v = vitc.T2TAttention(dim, chan, h, bias, qs)
            v.load_state_dict(sd_numpy(t))
            x = self.randn(*shape)
            self.close(v(x), t(x), "T2T%s on %s" % ((dim, chan, h, bias, qs), shape))

    def test_errors(self):
        with self.assertRaisesRegex(vitc.VitcError, "chan 64 is not divisible by num_heads 3"):
            vitc.T2TAttention(49, 64, 3)
        v = vitc.T2TAttention(4, 8, qkv_bias=False)
        with self.assertRaisesRegex(vitc.VitcError, 'unexpected key "qkv.bias"'):
            v.load_state_dict(dict(v.state_dict(), **{"qkv.bias": np.zeros(24, np.float32)}))


class TestSingleHead(Case):
    def test_parity(self):
        rng = np.random.default_rng(5)
        for E, dk, shape in [(768, 64, (1, 197, 768)), (20, 7, (3, 5, 20)), (4, 4, (2, 1, 4))]:
            W = {k: (rng.standard_normal(s) * 0.1).astype(np.float32)
                 for k, s in (("W_q", (E, dk)), ("W_k", (E, dk)), ("W_v", (E, dk)), ("W_o", (dk, E)))}
            x = rng.uniform(0, 1, size=shape).astype(np.float32)
            v = vitc.SingleHeadAttention(E, dk)
            v.load_state_dict(W)
            self.close(v(x), seed_single_head(x, W["W_q"], W["W_k"], W["W_v"], W["W_o"]), "SingleHead %s" % (shape,))


class TestMultiheadAttention(Case):
    def pair(self, E, H, **kw):
        t = nn.MultiheadAttention(E, H, **kw)
        randomize(t, self.gen)
        v = vitc.MultiheadAttention(E, H, **kw)
        v.load_state_dict(sd_numpy(t))
        return t, v

    def check(self, t, v, q, k, val, what, **kw):
        for train in (True, False):
            t.train(train)
            v.train(train)
            for nw in (True, False):
                for avg in (True, False):
                    to, tw = t(q, k, val, need_weights=nw, average_attn_weights=avg, **kw)
                    args = {n: (m.numpy() if m is not None else None) for n, m in kw.items()}
                    # The same array object for self-attention, as a caller would pass it.
                    qn = q.numpy()
                    kn = qn if k is q else k.numpy()
                    vn = kn if val is k else val.numpy()
                    vo, vw = v(qn, kn, vn, need_weights=nw, average_attn_weights=avg, **args)
                    tag = "%s train=%s need_weights=%s avg=%s" % (what, train, nw, avg)
                    self.close(vo, to, tag + " out")
                    if nw:
                        self.close(vw, tw, tag + " weights")
                    else:
                        self.assertIsNone(vw)

    def test_seed_self_attention(self):
        t, v = self.pair(32, 8, batch_first=True)
        x = self.randn(64, 256, 32)
        self.check(t, v, x, x, x, "seed [64,256,32]")

    def test_self_and_cross(self):
        for E, H, bf, L, S, B in [(16, 4, False, 5, 7, 3), (16, 1, True, 1, 4, 2), (12, 3, False, 6, 1, 1),
                                  (24, 6, True, 9, 9, 5)]:
            t, v = self.pair(E, H, batch_first=bf)
            qs = (B, L, E) if bf else (L, B, E)
            ks = (B, S, E) if bf else (S, B, E)
            q, k, val = self.randn(*qs), self.randn(*ks), self.randn(*ks)
            self.check(t, v, q, k, val, "cross E=%d H=%d bf=%s" % (E, H, bf))
            self.check(t, v, q, q, q, "self E=%d H=%d bf=%s" % (E, H, bf))

    def test_kdim_vdim_and_no_bias(self):
        for kw in [dict(kdim=5, vdim=7), dict(kdim=5), dict(bias=False), dict(kdim=3, vdim=9, bias=False, batch_first=True)]:
            t, v = self.pair(8, 2, **kw)
            self.assertEqual(sorted(v.state_dict()), sorted(t.state_dict()))
            bf = kw.get("batch_first", False)
            kd, vd = kw.get("kdim", 8), kw.get("vdim", 8)
            q = self.randn(*((3, 4, 8) if bf else (4, 3, 8)))
            k = self.randn(*((3, 6, kd) if bf else (6, 3, kd)))
            val = self.randn(*((3, 6, vd) if bf else (6, 3, vd)))
            self.check(t, v, q, k, val, "kw=%s" % kw)

    def test_unbatched(self):
        t, v = self.pair(12, 3)
        q, k, val = self.randn(5, 12), self.randn(4, 12), self.randn(4, 12)
        self.check(t, v, q, k, val, "unbatched")
        kpm = torch.tensor([False, True, False, False])
        am = self.randn(3, 5, 4)
        self.check(t, v, q, k, val, "unbatched masks", key_padding_mask=kpm, attn_mask=am)

    def test_masks(self):
        E, H, L, S, B = 16, 4, 5, 6, 3
        for bf in (False, True):
            t, v = self.pair(E, H, batch_first=bf)
            q = self.randn(*((B, L, E) if bf else (L, B, E)))
            k = self.randn(*((B, S, E) if bf else (S, B, E)))
            val = self.randn(*((B, S, E) if bf else (S, B, E)))
            kpm = torch.rand(B, S, generator=self.gen) < 0.3
            kpm[:, 0] = False  # keep every row with at least one key
            am_bool2 = torch.rand(L, S, generator=self.gen) < 0.3
            am_bool2[:, 1] = False
            am_bool3 = torch.rand(B * H, L, S, generator=self.gen) < 0.3
            am_bool3[:, :, 0] = False
            am_f2 = self.randn(L, S)
            am_f3 = self.randn(B * H, L, S)
            am_f3[1, 2, 3] = float("-inf")
            kpm_f = self.randn(B, S)
            cases = [dict(key_padding_mask=kpm), dict(attn_mask=am_bool2), dict(attn_mask=am_bool3),
                     dict(attn_mask=am_f2), dict(attn_mask=am_f3),
                     dict(key_padding_mask=kpm, attn_mask=am_bool2), dict(key_padding_mask=kpm, attn_mask=am_bool3),
                     dict(key_padding_mask=kpm, attn_mask=am_f2), dict(key_padding_mask=kpm, attn_mask=am_f3),
                     dict(key_padding_mask=kpm_f), dict(key_padding_mask=kpm_f, attn_mask=am_bool2)]
            for i, kw in enumerate(cases):
                self.check(t, v, q, k, val, "bf=%s mask case %d" % (bf, i), **kw)

    def test_weights_over_batch_chunks_with_masks(self):
        # [B, heads, L, S] above vitc's ~16 MB chunk: the averaged weights are
        # computed a few batch items at a time; masks must follow the chunks.
        E, H, L, S, B = 8, 2, 700, 650, 6
        t, v = self.pair(E, H)
        q, k = self.randn(L, B, E), self.randn(S, B, E)
        kpm = torch.rand(B, S, generator=self.gen) < 0.2
        kpm[:, 3] = False
        am = torch.rand(L, S, generator=self.gen) < 0.2
        am[:, 3] = False
        am3 = self.randn(B * H, L, S)
        t.train()
        for kw in (dict(key_padding_mask=kpm, attn_mask=am), dict(attn_mask=am3)):
            to, tw = t(q, k, k, **kw)
            args = {n: m.numpy() for n, m in kw.items()}
            vo, vw = v(q.numpy(), k.numpy(), k.numpy(), **args)
            self.close(vo, to, "chunked out")
            self.close(vw, tw, "chunked weights")

    def test_fully_masked_row_is_nan(self):
        t, v = self.pair(8, 2)
        q, k = self.randn(3, 2, 8), self.randn(4, 2, 8)
        am = torch.zeros(3, 4, dtype=torch.bool)
        am[1, :] = True
        t.train()  # torch's general path (not the eval fast path); documented behaviour
        to, tw = t(q, k, k, attn_mask=am)
        vo, vw = v(q.numpy(), k.numpy(), k.numpy(), attn_mask=am.numpy())
        self.assertTrue(np.isnan(vo[1]).all() and np.isnan(vw[:, 1]).all())
        self.close(vo, to, "out")
        self.close(vw, tw, "weights")
        # torch 2.x without the weights runs its SDPA: 0 in that row
        to, _ = t(q, k, k, attn_mask=am, need_weights=False)
        vo, vw = v(q.numpy(), k.numpy(), k.numpy(), attn_mask=am.numpy(), need_weights=False)
        self.assertIsNone(vw)
        self.assertFalse(np.isnan(vo).any())  # out_proj(0): the bias
        self.close(vo, to, "out, need_weights=False")

    def test_errors(self):
        with self.assertRaisesRegex(vitc.VitcError, "not divisible by num_heads"):
            vitc.MultiheadAttention(10, 3)
        v = vitc.MultiheadAttention(8, 2)
        x = np.zeros((3, 2, 8), np.float32)
        with self.assertRaisesRegex(vitc.VitcError, "do not fit"):
            v(x, np.zeros((3, 2, 7), np.float32), x)
        with self.assertRaisesRegex(vitc.VitcError, "do not fit"):
            v(x, np.zeros((4, 2, 8), np.float32), x)
        with self.assertRaisesRegex(vitc.VitcError, r"2-D attn_mask has shape \[3, 4\], expected \[3, 3\]"):
            v(x, x, x, attn_mask=np.zeros((3, 4), bool))
        with self.assertRaisesRegex(vitc.VitcError, r"3-D attn_mask has shape \[2, 3, 3\], expected \[4, 3, 3\]"):
            v(x, x, x, attn_mask=np.zeros((2, 3, 3), np.float32))
        with self.assertRaisesRegex(vitc.VitcError, r"key_padding_mask has shape \[3, 3\]"):
            v(x, x, x, key_padding_mask=np.zeros((3, 3), bool))
        with self.assertRaises(TypeError):
            v(x, x, x, key_padding_mask=np.zeros((2, 3), np.int32))
        with self.assertRaisesRegex(TypeError, "torch 2.x"):  # torch 2.x refuses uint8 masks
            v(x, x, x, attn_mask=np.zeros((3, 3), np.uint8))
        with self.assertRaisesRegex(vitc.VitcError, "3-D .batched. or 2-D"):
            v(np.zeros((8,), np.float32), x, x)


class TestSDPA(Case):
    def test_shapes_and_masks(self):
        rng = np.random.default_rng(7)
        for lead, L, S, d, dv, mshape in [((), 5, 7, 4, 3, None), ((2,), 5, 7, 4, 4, (5, 7)),
                                          ((2, 3), 6, 4, 8, 5, (2, 1, 6, 4)), ((2, 3), 6, 4, 8, 5, (3, 1, 4)),
                                          ((1, 8), 64, 64, 16, 16, (1, 8, 64, 64)), ((3, 2), 1, 9, 4, 4, (9,)),
                                          ((2, 2, 2), 3, 3, 2, 2, (2, 1, 1, 3, 1)), ((4,), 3, 5, 2, 6, (4, 3, 5))]:
            q = rng.standard_normal(lead + (L, d)).astype(np.float32)
            k = rng.standard_normal(lead + (S, d)).astype(np.float32)
            v = rng.standard_normal(lead + (S, dv)).astype(np.float32)
            self.close(vitc.scaled_dot_product_attention(q, k, v), sdpa_ref(q, k, v), "no mask %s" % (lead,))
            self.close(vitc.scaled_dot_product_attention(q, k, v, scale=0.3), sdpa_ref(q, k, v, scale=0.3), "scale")
            if mshape is None:
                continue
            mb = rng.uniform(size=mshape) < 0.7
            mb[..., 0] = True  # no fully masked rows here (a size-1 last dim broadcasts True)
            mf = rng.standard_normal(mshape).astype(np.float32)
            self.close(vitc.scaled_dot_product_attention(q, k, v, attn_mask=mb), sdpa_ref(q, k, v, mb),
                       "bool mask %s on %s" % (mshape, lead))
            self.close(vitc.scaled_dot_product_attention(q, k, v, attn_mask=mf), sdpa_ref(q, k, v, mf),
                       "float mask %s on %s" % (mshape, lead))

    def test_causal_and_broadcast_batch(self):
        rng = np.random.default_rng(8)
        q = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
        k = rng.standard_normal((1, 3, 5, 4)).astype(np.float32)
        v = rng.standard_normal((2, 1, 5, 4)).astype(np.float32)
        causal = np.tril(np.ones((5, 5), bool))
        self.close(vitc.scaled_dot_product_attention(q, k, v, is_causal=True), sdpa_ref(q, k, v, causal), "causal")

    def test_fully_masked_row_zero(self):
        """torch 2.x: a row with no allowed key gives 0 (1.13 gave NaN)."""
        q = self.randn(2, 3, 4).numpy()
        for m in (np.ones((3, 3), bool), np.zeros((3, 3), np.float32)):
            if m.dtype == bool:
                m[1] = False
            else:
                m[1] = -np.inf
            out = vitc.scaled_dot_product_attention(q, q, q, attn_mask=m)
            ref = torch.nn.functional.scaled_dot_product_attention(
                torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(q), attn_mask=torch.from_numpy(m))
            self.assertTrue((out[:, 1] == 0).all())
            self.assertFalse(np.isnan(out).any())
            self.close(out, ref, "fully masked row, %s mask" % m.dtype)

    def test_large_logits(self):
        q = np.full((1, 2, 3), 100.0, np.float32)
        k = np.array([[[100, 100, 100], [-100, 50, 100]]], np.float32)
        out = vitc.scaled_dot_product_attention(q, k, k)
        self.assertTrue(np.isfinite(out).all())
        self.close(out, sdpa_ref(q, k, k), "large")

    def test_errors(self):
        a = np.zeros((2, 3, 4), np.float32)
        with self.assertRaisesRegex(vitc.VitcError, "do not fit"):
            vitc.scaled_dot_product_attention(a, np.zeros((2, 3, 5), np.float32), a)
        with self.assertRaisesRegex(vitc.VitcError, "does not broadcast"):
            vitc.scaled_dot_product_attention(a, a, a, attn_mask=np.zeros((3, 2), bool))


class TestSoftmax(Case):
    def test_parity(self):
        rng = np.random.default_rng(3)
        for shape, dim, t in [((6, 6), -1, 1.0), ((6, 6), -1, 0.1), ((3, 4, 5), 1, 2.0), ((3, 4, 5), 0, 0.7),
                              ((7,), 0, 1.0), ((2, 3, 4, 5), -2, 3.0)]:
            x = rng.uniform(size=shape).astype(np.float32)
            self.close(vitc.softmax(x, dim, t), F.softmax(torch.from_numpy(x) / t, dim=dim), "%s dim %d t %g" % (shape, dim, t))

    def test_logits_in_the_thousands(self):
        x = np.array([[1000.0, 2000.0, 3000.0, 2999.5], [-5000.0, -5001.0, 4000.0, 4000.0]], np.float32)
        for t in (1.0, 0.1, 7.0, 1000.0):
            got = vitc.softmax(x, temperature=t)
            self.assertTrue(np.isfinite(got).all())
            self.close(got, F.softmax(torch.from_numpy(x) / t, dim=-1), "t=%g" % t)

    def test_errors(self):
        with self.assertRaisesRegex(vitc.VitcError, "dim 2 out of range"):
            vitc.softmax(np.zeros((2, 2)), dim=2)
        with self.assertRaisesRegex(vitc.VitcError, "temperature"):
            vitc.softmax(np.zeros((2, 2)), temperature=0.0)


if __name__ == "__main__":
    unittest.main()
