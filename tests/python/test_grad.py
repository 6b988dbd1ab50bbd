"""vitc.sdpa_backward and vitc.softmax_backward against torch autograd in
float64 through torch 2.x's F.scaled_dot_product_attention (its math
backend in float64; a row with no allowed key gives 0 and no gradient).
Tolerance: the issue's
max|vitc - torch| <= 1e-4 * max(1, |torch|) per element, on every CPU path
the machine has.
"""
import pathlib
import re
import unittest

import numpy as np
import torch

import vitc

from vitc._lib import lib as _clib


def _arches():
    """Every CPU path the library knows, from its one list (the
    VITC_ARCH_LIST X-macro of src/kernels/kernels.h); vitc_set_arch
    refuses those this build or machine lacks."""
    src = pathlib.Path(__file__).resolve().parents[2] / "src" / "kernels" / "kernels.h"
    line = re.search(r"#define VITC_ARCH_LIST\(X\)(.*)", src.read_text()).group(1)
    names = tuple(re.findall(r'X\(\w+, "([^"]+)"\)', line))
    assert "generic" in names, line
    return names


ARCHES = _arches()


def _set_arch(name):
    return _clib.vitc_set_arch(name.encode())


def _paths():
    """The CPU paths this machine runs (vitc_set_arch refuses the others)."""
    got = []
    for a in ARCHES:
        try:
            if _set_arch(a) == 0 and vitc.get_arch() == a:
                got.append(a)
        finally:
            _set_arch("auto")
    return got


@torch.enable_grad()  # other test modules turn autograd off globally
def additive_mask64(mask):
    """A bool (True: attend) or float mask as the float64 one added to the
    scores (-inf where a bool mask is False)."""
    m = torch.tensor(mask)
    if m.dtype == torch.bool:
        m = torch.zeros(m.shape, dtype=torch.float64).masked_fill(~m, float("-inf"))
    return m.double()


@torch.enable_grad()
def torch_sdpa_grads(q, k, v, dout, mask=None, scale=None):
    q, k, v = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    m = None if mask is None else additive_mask64(mask)
    # torch broadcasts q, k, v's batch dims only with a mask that has them all
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    qb, kb, vb = (x.expand(lead + x.shape[-2:]) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=m, scale=scale)
    out.backward(torch.tensor(dout, dtype=torch.float64).expand(out.shape))
    return q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def torch_lse(q, k, mask, scale):
    """logsumexp over keys of q k^T scale + mask, in float64 (-inf: no key)."""
    qd, kd = torch.tensor(q, dtype=torch.float64), torch.tensor(k, dtype=torch.float64)
    sc = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = qd @ kd.transpose(-1, -2) * sc
    if mask is not None:
        s = s + additive_mask64(mask)
    return torch.logsumexp(s, -1).numpy()


def rel_err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    nan_ok = np.isnan(ref) == np.isnan(got)
    if not nan_ok.all():
        return np.inf
    fin = ~np.isnan(ref)
    if not fin.any():
        return 0.0
    return float(np.max(np.abs(got[fin] - ref[fin]) / np.maximum(1.0, np.abs(ref[fin]))))


class TestSdpaBackward(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(7)

    def _rand(self, *shape):
        return self.rng.uniform(-1, 1, shape).astype(np.float32)

    def check(self, qs, ks, vs, mask=None, scale=None):
        q, k, v = self._rand(*qs), self._rand(*ks), self._rand(*vs)
        dout = self._rand(*(qs[:-1] + vs[-1:]))
        ref = torch_sdpa_grads(q, k, v, dout, mask, scale)
        for arch in _paths():
            _set_arch(arch)
            try:
                got = vitc.sdpa_backward(q, k, v, dout, attn_mask=mask, scale=scale)
                # the training pair: saved out and lse, no recomputed forward
                out, lse = vitc.sdpa_lse(q, k, v, attn_mask=mask, scale=scale)
                got2 = vitc.sdpa_backward(q, k, v, dout, attn_mask=mask, scale=scale, out=out,
                                          lse=lse)
                out_ref = vitc.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            finally:
                _set_arch("auto")
            np.testing.assert_array_equal(out, out_ref)
            lse_ref = torch_lse(q, k, mask, scale)
            np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
            fin = np.isfinite(lse_ref)
            self.assertLessEqual(rel_err(lse[fin], lse_ref[fin]), 1e-5)
            for name, g, g2, r in zip(("dq", "dk", "dv"), got, got2, ref):
                self.assertEqual(g.shape, r.shape)
                e = rel_err(g, r)
                self.assertLessEqual(e, 1e-4, "%s %s: %s q%s k%s v%s" % (arch, name, e, qs, ks, vs))
                np.testing.assert_array_equal(g2, g)  # the same kernel on the same P

    def test_self_attention(self):
        self.check((1, 12, 197, 64), (1, 12, 197, 64), (1, 12, 197, 64))
        self.check((2, 3, 33, 40), (2, 3, 33, 40), (2, 3, 33, 40))

    def test_odd_shapes(self):
        self.check((3, 17, 8), (3, 29, 8), (3, 29, 24))         # L != S, D != Dv, 3-D
        self.check((1, 1, 1, 16), (1, 1, 1, 16), (1, 1, 1, 16))  # one token
        self.check((2, 1, 300, 32), (2, 1, 257, 32), (2, 1, 257, 48), scale=0.3)  # split plan
        self.check((5, 7), (9, 7), (9, 3))                      # 2-D

    def test_masks(self):
        L, S = 37, 53
        fm = self.rng.uniform(-3, 3, (L, S)).astype(np.float32)
        self.check((2, 4, L, 16), (2, 4, S, 16), (2, 4, S, 16), mask=fm)          # float [L, S]
        bm = self.rng.uniform(0, 1, (2, 1, 1, S)) > 0.3
        bm[..., 0] = True
        self.check((2, 4, L, 16), (2, 4, S, 16), (2, 4, S, 16), mask=bm)          # bool key padding
        bm2 = self.rng.uniform(0, 1, (2, 4, L, S)) > 0.5
        bm2[..., 3] = True
        self.check((2, 4, L, 16), (2, 4, S, 16), (2, 4, S, 16), mask=bm2)         # bool full

    def test_fully_masked_row_matches_torch(self):
        bm = np.ones((6, 9), dtype=bool)
        bm[2] = False  # row 2 sees nothing: torch 2.x gives 0 there and no gradient through it
        self.check((1, 2, 6, 8), (1, 2, 9, 8), (1, 2, 9, 8), mask=bm)

    def test_errors(self):
        q = self._rand(2, 5, 4)
        with self.assertRaises(vitc.VitcError):
            vitc.sdpa_backward(q, q, q, self._rand(2, 5, 3))  # grad_out of the wrong shape
        with self.assertRaises(vitc.VitcError):
            vitc.sdpa_backward(q, self._rand(2, 5, 3), q, self._rand(2, 5, 4))  # d mismatch
        out, lse = vitc.sdpa_lse(q, q, q)
        with self.assertRaises(vitc.VitcError):
            vitc.sdpa_backward(q, q, q, self._rand(2, 5, 4), out=out)  # lse missing
        with self.assertRaises(vitc.VitcError):
            vitc.sdpa_backward(q, q, q, self._rand(2, 5, 4), out=out, lse=lse[:, :4])  # lse shape


class TestSoftmaxBackward(unittest.TestCase):
    def check(self, shape, dim, t):
        rng = np.random.default_rng(3)
        x = rng.uniform(-4, 4, shape).astype(np.float32)
        dy = rng.uniform(-1, 1, shape).astype(np.float32)
        xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        with torch.enable_grad():  # other test modules turn autograd off globally
            yt = torch.softmax(xt / t, dim)
            yt.backward(torch.tensor(dy, dtype=torch.float64))
        y = vitc.softmax(x, dim=dim, temperature=t)
        for arch in _paths():
            _set_arch(arch)
            try:
                dx = vitc.softmax_backward(y, dy, dim=dim, temperature=t)
            finally:
                _set_arch("auto")
            e = rel_err(dx, xt.grad.numpy())
            self.assertLessEqual(e, 1e-4, "%s %s dim %d t %g: %g" % (arch, shape, dim, t, e))

    def test_shapes(self):
        self.check((4, 37), -1, 1.0)
        self.check((3, 5, 100), -1, 0.5)
        self.check((3, 5, 7), 1, 2.0)     # not the last dim
        self.check((2, 300, 4), 1, 0.1)
        self.check((1,), 0, 1.0)

    def test_errors(self):
        with self.assertRaises(vitc.VitcError):
            vitc.softmax_backward(np.ones((2, 3)), np.ones((2, 3)), temperature=0.0)
        with self.assertRaises(vitc.VitcError):
            vitc.softmax_backward(np.ones((2, 3)), np.ones((2, 3)), dim=2)
        with self.assertRaises(vitc.VitcError):
            vitc.softmax_backward(np.ones((2, 3)), np.ones((3, 2)))


if __name__ == "__main__":
    unittest.main()
