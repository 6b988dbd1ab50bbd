"""Gradients of every engine layer against torch autograd in float64.

The torch modules are the seeds' own (tests/reference/gen_layers.py), run in
float64 on the float32 weights and inputs vitc sees; vitc's backward must
give the input gradient and every parameter gradient within
1e-4 * max(1, max|torch|), on odd shapes, with 1 and 2 threads.
"""
import os
import sys
import unittest

import numpy as np
import torch
import torch.nn as nn

import vitc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from gen_layers import (SeedAttentionBlock, SeedConvSABlock, SeedSelfAttentionBatch,  # noqa: E402
                        SeedSelfAttentionGroup, SeedSelfAttentionMultiHead, SeedT2TAttention,
                        randomize)


class TorchSingleHead(nn.Module):
    """The NumPy seed 002 (gen_layers.seed_single_head) as a torch module, for autograd."""

    def __init__(self, E, dk):
        super().__init__()
        for n, s in (("W_q", (E, dk)), ("W_k", (E, dk)), ("W_v", (E, dk)), ("W_o", (dk, E))):
            setattr(self, n, nn.Parameter(torch.randn(*s) * 0.1))

    def forward(self, x):
        Q, K, V = x @ self.W_q, x @ self.W_k, x @ self.W_v
        w = torch.softmax(Q @ K.transpose(1, 2) / self.W_q.shape[1] ** 0.5, dim=-1)
        return (w @ V) @ self.W_o


class GradCase(unittest.TestCase):
    def setUp(self):
        self.gen = torch.Generator().manual_seed(4321)
        # test_layers.py turns autograd off for its whole process
        self.grad_was = torch.is_grad_enabled()
        torch.set_grad_enabled(True)

    def tearDown(self):
        torch.set_grad_enabled(self.grad_was)
        vitc.set_num_threads(0)

    def close(self, got, want, what):
        want = want.detach().numpy()
        self.assertEqual(tuple(got.shape), tuple(want.shape), what)
        tol = 1e-4 * max(1.0, float(np.abs(want).max()))
        err = float(np.abs(got - want).max())
        self.assertLessEqual(err, tol, "%s: max error %g > %g" % (what, err, tol))

    def check(self, torch_mod, vitc_mod, shape, steps=2):
        """Same weights, same x and dy: dx and every gradient, accumulated over
        `steps` backward calls (torch accumulates .grad the same way)."""
        with torch.no_grad():
            torch_mod = randomize(torch_mod, self.gen).train()
        sd = {k: v.detach().float().numpy() for k, v in torch_mod.state_dict().items()}
        vitc_mod.load_state_dict(sd)
        torch_mod = torch_mod.double()
        # the float32 weights vitc holds, exactly
        with torch.no_grad():
            for k, v in torch_mod.state_dict().items():
                if v.is_floating_point():
                    v.copy_(torch.from_numpy(sd[k]).double())
        vitc_mod.train().zero_grad()
        for step in range(steps):
            x = torch.randn(*shape, generator=self.gen).float()
            xt = x.double().requires_grad_(True)
            yt = torch_mod(xt)
            dy = torch.randn(*yt.shape, generator=self.gen).float()
            yt.backward(dy.double())
            y = vitc_mod(x.numpy())
            self.close(y, yt, "%s y" % type(vitc_mod).__name__)
            dx = vitc_mod.backward(dy.numpy())
            self.close(dx, xt.grad, "%s dx (step %d)" % (type(vitc_mod).__name__, step))
        g = vitc_mod.grads()
        names = [k for k, _ in torch_mod.named_parameters()]
        self.assertEqual(sorted(g), sorted(names))
        for k, p in torch_mod.named_parameters():
            self.close(g[k], p.grad, "%s d%s" % (type(vitc_mod).__name__, k))
        vitc_mod.zero_grad()
        for k, a in vitc_mod.grads().items():
            self.assertFalse(a.any(), k)

    def each_threads(self, fn):
        for t in (1, 2):
            with self.subTest(threads=t):
                vitc.set_num_threads(t)
                fn()


class LayerGrads(GradCase):

    def test_attention_block(self):
        def run():
            self.check(SeedAttentionBlock(3, 4, 16, 1), vitc.AttentionBlock(3, 4, 16, 1), (2, 3, 8, 12))
            self.check(SeedAttentionBlock(2, 2, 12, 3), vitc.AttentionBlock(2, 2, 12, 3), (3, 2, 2, 6))
            self.check(SeedAttentionBlock(1, 3, 8, 2), vitc.AttentionBlock(1, 3, 8, 2), (1, 1, 3, 3))  # one token
        self.each_threads(run)

    def test_conv_sa_block(self):
        def run():
            self.check(SeedConvSABlock(16), vitc.ConvSABlock(16), (2, 16, 3, 5))  # gamma != 0 (randomize)
            self.check(SeedConvSABlock(8), vitc.ConvSABlock(8), (1, 8, 1, 1))
            t = SeedConvSABlock(8)  # gamma 0 as constructed: dx is dy, dgamma still flows
            v = vitc.ConvSABlock(8)
            v.load_state_dict({k: a.numpy() for k, a in t.state_dict().items()})
            x = torch.randn(3, 8, 2, 3, generator=self.gen)
            xt = x.double().requires_grad_(True)
            t = t.double()
            yt = t(xt)
            dy = torch.randn(*yt.shape, generator=self.gen)
            yt.backward(dy.double())
            v(x.numpy())
            self.close(v.backward(dy.numpy()), xt.grad, "ConvSA gamma=0 dx")
            self.close(v.grads()["gamma"], t.gamma.grad, "ConvSA gamma=0 dgamma")
        self.each_threads(run)

    def test_self_attention_group(self):
        def run():
            self.check(SeedSelfAttentionGroup(8), vitc.SelfAttention(8, "group"), (3, 8, 2, 5))
            self.check(SeedSelfAttentionGroup(5), vitc.SelfAttention(5, "group"), (1, 5, 1, 1))
        self.each_threads(run)

    def test_self_attention_batch(self):
        def run():
            self.check(SeedSelfAttentionBatch(8), vitc.SelfAttention(8, "batch"), (3, 8, 2, 5))
            self.check(SeedSelfAttentionBatch(6), vitc.SelfAttention(6, "batch"), (2, 6, 1, 3))
            self.check(SeedSelfAttentionBatch(6), vitc.SelfAttention(6, "batch"), (5, 6, 1, 1))
        self.each_threads(run)

    def test_batchnorm_batch_one(self):
        """BatchNorm presets at batch 1 (down to B*H*W = 2, a channel with
        eps-dominated statistics included). There torch 1.13's autograd
        disagrees with central differences of its own forward (the gradient
        reaching BatchNorm is a transposed view whose strides look
        channels-last at batch 1), so the reference is those differences,
        in float64."""
        for mod, vit, shape in [(SeedSelfAttentionBatch, lambda: vitc.SelfAttention(6, "batch"), (1, 6, 1, 2)),
                                (SeedSelfAttentionBatch, lambda: vitc.SelfAttention(6, "batch"), (1, 6, 2, 3)),
                                (lambda c: SeedSelfAttentionMultiHead(c, 3), lambda: vitc.SelfAttentionMultiHead(6, 3),
                                 (1, 6, 3, 1))]:
            with torch.no_grad():
                t = randomize(mod(6), self.gen).train()
            v = vit()
            v.load_state_dict({k: a.numpy() for k, a in t.state_dict().items()})
            t = t.double()
            x = torch.randn(*shape, generator=self.gen)
            x[0, 2].view(-1)[1] = x[0, 2].view(-1)[0] + 0.004  # channel 2: variance ~4e-6 < eps
            dy = torch.randn(*shape, generator=self.gen)
            v(x.numpy())
            dx = v.backward(dy.numpy())
            x0, n = x.double().numpy().ravel(), x.numel()
            fd = np.zeros(n)
            with torch.no_grad():
                for j in range(n):
                    e = np.zeros(n)
                    e[j] = 1e-7
                    lp = (t(torch.from_numpy((x0 + e).reshape(shape))) * dy.double()).sum().item()
                    lm = (t(torch.from_numpy((x0 - e).reshape(shape))) * dy.double()).sum().item()
                    fd[j] = (lp - lm) / 2e-7
            self.close(dx.ravel(), torch.from_numpy(fd), "%s %s dx" % (type(v).__name__, shape))

    def test_self_attention_multihead(self):
        def run():
            self.check(SeedSelfAttentionMultiHead(8, 2), vitc.SelfAttentionMultiHead(8, 2), (2, 8, 3, 2))
            self.check(SeedSelfAttentionMultiHead(12, 4), vitc.SelfAttentionMultiHead(12, 4), (5, 12, 1, 3))
        self.each_threads(run)

    def test_t2t_attention(self):
        def run():
            self.check(SeedT2TAttention(6, 8, 2, True), vitc.T2TAttention(6, 8, 2, True), (2, 5, 6))
            self.check(SeedT2TAttention(7, 4, 1, False), vitc.T2TAttention(7, 4, 1, False), (3, 1, 7))
            self.check(SeedT2TAttention(5, 6, 3, False, 0.3), vitc.T2TAttention(5, 6, 3, False, 0.3), (1, 4, 5))
        self.each_threads(run)

    def test_single_head(self):
        def run():
            self.check(TorchSingleHead(6, 4), vitc.SingleHeadAttention(6, 4), (2, 5, 6))
            self.check(TorchSingleHead(3, 5), vitc.SingleHeadAttention(3, 5), (7, 1, 3))
        self.each_threads(run)

    def test_errors(self):
        m = vitc.T2TAttention(6, 8, 2)
        with self.assertRaises(vitc.VitcError):
            m.backward(np.zeros((2, 5, 8), np.float32))  # no forward yet
        m(np.ones((2, 5, 6), np.float32))
        with self.assertRaisesRegex(vitc.VitcError, r"dy has shape \[2, 5, 7\]"):
            m.backward(np.zeros((2, 5, 7), np.float32))
        m.eval()(np.ones((2, 5, 6), np.float32))
        with self.assertRaises(vitc.VitcError):
            m.backward(np.zeros((2, 5, 8), np.float32))  # eval-mode forward records nothing
        b = vitc.SelfAttention(4, "batch")
        self.assertNotIn("norm.running_mean", b.grads())


class MhaGrads(GradCase):
    """nn.MultiheadAttention: d_query, d_key, d_value and every parameter."""

    def pair(self, E, H, vitc_kw=None, **kw):
        """A random torch MHA (float64, train mode) and a vitc one (train
        mode, grads zero) holding the same weights rounded to float32; kw go
        to both, vitc_kw to vitc's alone."""
        with torch.no_grad():
            t = randomize(nn.MultiheadAttention(E, H, **kw), self.gen).train()
        v = vitc.MultiheadAttention(E, H, **kw, **(vitc_kw or {}))
        sd = {k: a.detach().float().numpy() for k, a in t.state_dict().items()}
        v.load_state_dict(sd)
        t = t.double()
        with torch.no_grad():
            for k, a in t.state_dict().items():
                a.copy_(torch.from_numpy(sd[k]).double())
        v.train().zero_grad()
        return t, v

    def mha(self, E, H, shapes, self_attn=False, kpm=None, am=None, need_weights=False, **kw):
        t, v = self.pair(E, H, **kw)
        for step in range(2):
            xs = [torch.randn(*s, generator=self.gen).float() for s in shapes]
            if self_attn:
                xs = [xs[0]] * 3
            xt = [x.double().requires_grad_(True) for x in xs[:1 if self_attn else 3]]
            q, k, val = (xt * 3) if self_attn else xt
            tm = lambda m: None if m is None else (m.double() if m.is_floating_point() else m)  # noqa: E731
            yt, wt = t(q, k, val, key_padding_mask=tm(kpm), attn_mask=tm(am), need_weights=need_weights)
            dy = torch.randn(*yt.shape, generator=self.gen).float()
            yt.backward(dy.double())
            xn = xs[0].numpy()
            y, w = v(xn, xn, xn, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights) if self_attn \
                else v(xs[0].numpy(), xs[1].numpy(), xs[2].numpy(), key_padding_mask=kpm, attn_mask=am,
                       need_weights=need_weights)
            self.close(y, yt, "MHA y")
            if need_weights:
                self.close(w, wt, "MHA weights")
            dq, dk, dv = v.backward(dy.numpy())
            if self_attn:
                self.close(dq + dk + dv, xt[0].grad, "MHA dx (self, step %d)" % step)
            else:
                for name, got, x in zip(("d_query", "d_key", "d_value"), (dq, dk, dv), xt):
                    self.close(got, x.grad, "MHA %s (step %d)" % (name, step))
        g = v.grads()
        self.assertEqual(sorted(g), sorted(k for k, _ in t.named_parameters()))
        for k, p in t.named_parameters():
            self.close(g[k], p.grad, "MHA d%s" % k)

    def test_self_attention(self):
        def run():
            self.mha(8, 2, [(5, 3, 8)], self_attn=True)
            self.mha(8, 2, [(3, 5, 8)], self_attn=True, batch_first=True, need_weights=True)
            self.mha(6, 3, [(1, 1, 6)], self_attn=True)  # one token, batch 1
        self.each_threads(run)

    def test_cross_attention_kdim_vdim_masks(self):
        kpm = torch.rand(7, 4, generator=self.gen) < 0.3
        kpm[:, 0] = False  # every query keeps a key
        am = torch.randn(3, 4, generator=self.gen)

        def run():
            self.mha(8, 2, [(7, 3, 8), (7, 4, 5), (7, 4, 6)], kdim=5, vdim=6, batch_first=True,
                     kpm=kpm, am=am)
            self.mha(8, 4, [(3, 7, 8), (4, 7, 8), (4, 7, 8)], bias=False, kpm=kpm.float() * -2.5,
                     need_weights=True)
        self.each_threads(run)

    def test_unbatched_bool_mask(self):
        am = torch.rand(2 * 3, 5, 6, generator=self.gen) < 0.3
        am[..., 1] = False
        am2 = torch.rand(5, 6, generator=self.gen) < 0.4
        am2[:, 2] = False

        def run():
            self.mha(6, 2, [(5, 3, 6), (6, 3, 6), (6, 3, 6)], am=am)  # [B*heads, L, S]
            self.mha(6, 3, [(5, 6), (6, 6), (6, 6)], am=am2, need_weights=True)  # unbatched
        self.each_threads(run)

    def test_add_bias_kv_add_zero_attn(self):
        kpm = torch.rand(3, 4, generator=self.gen) < 0.4
        am = torch.rand(5, 4, generator=self.gen) < 0.3

        def run():
            for bkv, zero in ((True, False), (False, True), (True, True)):
                self.mha(8, 2, [(5, 3, 8), (4, 3, 8), (4, 3, 8)], add_bias_kv=bkv, add_zero_attn=zero,
                         kpm=kpm, am=am, need_weights=True)
                self.mha(8, 2, [(3, 5, 8)], self_attn=True, batch_first=True, add_bias_kv=bkv,
                         add_zero_attn=zero)
                self.mha(6, 3, [(3, 5, 6), (3, 4, 5), (3, 4, 7)], kdim=5, vdim=7, batch_first=True,
                         add_bias_kv=bkv, add_zero_attn=zero, am=am.float() * -1.5)
                self.mha(4, 1, [(2, 4), (3, 4), (3, 4)], add_bias_kv=bkv, add_zero_attn=zero)  # unbatched
        self.each_threads(run)

    def dropout_case(self, p, shapes, self_attn=False, **kw):
        """torch's MHA with vitc's dropout mask injected: vitc returns the
        per-head weights after dropout (as torch 1.13 does), their zeros are
        the dropped entries, and torch's F.dropout is replaced for the call by
        that mask with the same 1/(1-p) scaling."""
        E, H = 8, 2
        t, v = self.pair(E, H, vitc_kw={"seed": 7}, dropout=p, **kw)
        xs = [torch.randn(*s, generator=self.gen).float() for s in shapes]
        if self_attn:
            xs = [xs[0]] * 3
        y, w = v(*[x.numpy() for x in xs], need_weights=True, average_attn_weights=False)
        keep = torch.from_numpy(w != 0)  # softmax weights are > 0: a 0 was dropped
        keep = keep.reshape(-1, *keep.shape[-2:]).double()
        xt = [x.double().requires_grad_(True) for x in xs[:1 if self_attn else 3]]
        q, k, val = (xt * 3) if self_attn else xt
        real = torch.nn.functional.dropout
        torch.nn.functional.dropout = lambda x, p=0.5, training=True, inplace=False: x * keep / (1 - p)
        try:
            yt, wt = t(q, k, val, need_weights=True, average_attn_weights=False)
        finally:
            torch.nn.functional.dropout = real
        self.close(y, yt, "MHA dropout y")
        self.close(w, wt, "MHA dropout weights")
        dy = torch.randn(*yt.shape, generator=self.gen).float()
        yt.backward(dy.double())
        dq, dk, dv = v.backward(dy.numpy())
        if self_attn:
            self.close(dq + dk + dv, xt[0].grad, "MHA dropout dx")
        else:
            for name, got, x in zip(("d_query", "d_key", "d_value"), (dq, dk, dv), xt):
                self.close(got, x.grad, "MHA dropout " + name)
        for k_, p_ in t.named_parameters():
            self.close(v.grads()[k_], p_.grad, "MHA dropout d" + k_)
        return float(keep.mean())

    def test_dropout(self):
        def run():
            self.dropout_case(0.3, [(6, 3, 8)], self_attn=True)
            self.dropout_case(0.5, [(3, 6, 8), (3, 5, 8), (3, 5, 8)], batch_first=True)
            self.dropout_case(0.2, [(4, 8), (5, 8), (5, 8)], add_bias_kv=True)
        self.each_threads(run)

    def test_dropout_statistics_and_modes(self):
        x = np.random.default_rng(3).standard_normal((16, 4, 8)).astype(np.float32)
        ref = vitc.MultiheadAttention(8, 2, seed=5)
        m = vitc.MultiheadAttention(8, 2, dropout=0.25, seed=5)
        m.load_state_dict(ref.state_dict())
        # p > 0: the kept fraction and the 1/(1-p) scaling (a kept weight is P / 0.75)
        _, w = m.train()(x, x, x, average_attn_weights=False)
        _, p_full = ref.eval()(x, x, x, average_attn_weights=False)
        kept = w != 0
        n = kept.size
        self.assertLess(abs(kept.mean() - 0.75), 4 * np.sqrt(0.75 * 0.25 / n))
        np.testing.assert_allclose(w[kept], p_full[kept] / 0.75, rtol=1e-5, atol=1e-7)
        # eval mode: no dropout at all
        np.testing.assert_array_equal(m.eval()(x, x, x)[0], ref.eval()(x, x, x)[0])
        # p = 0 in training is the plain attention
        z = vitc.MultiheadAttention(8, 2, dropout=0.0, seed=5)
        z.load_state_dict(ref.state_dict())
        np.testing.assert_array_equal(z.train()(x, x, x)[0], ref.eval()(x, x, x)[0])
        # the same seed gives the same masks
        a = vitc.MultiheadAttention(8, 2, dropout=0.25, seed=9)
        b = vitc.MultiheadAttention(8, 2, dropout=0.25, seed=9)
        np.testing.assert_array_equal(a(x, x, x)[0], b(x, x, x)[0])

    def test_errors(self):
        m = vitc.MultiheadAttention(8, 2)
        x = np.ones((3, 2, 8), np.float32)
        with self.assertRaises(vitc.VitcError):
            m.backward(x)
        m(x, x, x)
        with self.assertRaisesRegex(vitc.VitcError, r"d_out has shape \[3, 2, 7\]"):
            m.backward(np.ones((3, 2, 7), np.float32))
        m.eval()(x, x, x)
        with self.assertRaises(vitc.VitcError):
            m.backward(x)


if __name__ == "__main__":
    unittest.main()
