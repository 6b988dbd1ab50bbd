"""Training pieces against PyTorch (torch 2.x from requirements-dev.txt, float64 where exact):
cross-entropy with label smoothing (loss and dlogits vs autograd), AdamW and
SGD with every option over 10 steps (vs torch.optim on the same parameters
and gradients), clip_grad_norm_, and the schedules over a full cycle (vs
torch's OneCycleLR and a SequentialLR of LinearLR + CosineAnnealingLR).

The optimizer tests drive a small vitc.VisionTransformer, writing its
parameters and gradients in place, so they test the C optimizer over a real
model's parameter table (names and no-decay flags).

Needs torch (the .venv that scripts/install-deps.sh makes); skipped without.
"""
import re
import unittest
import warnings

import numpy as np

import vitc
from vitc._lib import lib

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    torch = None



class _Vit:
    """A small vitc.VisionTransformer with its parameters and gradients as
    writable numpy views by torch name (the optimizer tests write them)."""

    def __init__(self, seed=0, image_size=8, patch_size=4, in_channels=1, hidden_dim=8, depth=1,
                 num_heads=2, mlp_dim=12, num_classes=3):
        self.model = vitc.VisionTransformer(image_size=image_size, patch_size=patch_size,
                                            num_layers=depth, num_heads=num_heads,
                                            hidden_dim=hidden_dim, mlp_dim=mlp_dim,
                                            num_classes=num_classes, in_channels=in_channels,
                                            seed=seed)

    def free(self):
        """Free the C model now (as vitc_vit_free), whoever still refers to it."""
        m = self.model
        if m._h is not None and m._h.value:
            lib.vitc_vit_free(m._h)
            m._h = None

    def tensors(self):
        """[(name, param view, grad view or None)] in state_dict order."""
        m = self.model
        return [(n, m._view(d, s), m._view(g, s) if g else None) for n, s, d, g in m._params()]


# What vitc leaves undecayed by default: biases, norm weights, the class
# token and the position embedding.
NO_DECAY = re.compile(r"(bias$|(^|\.)ln(_\d)?\.weight$|^class_token$|pos_embedding$)")


@unittest.skipIf(torch is None, "needs torch")
class TestCrossEntropy(unittest.TestCase):
    def check(self, B, C, scale, eps, seed):
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal((B, C)) * scale).astype(np.float32)
        y = rng.integers(0, C, B)
        loss, d = vitc.cross_entropy(x, y, label_smoothing=eps)
        with torch.enable_grad():  # another test module may have turned autograd off
            t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
            ref = F.cross_entropy(t, torch.tensor(y), label_smoothing=eps)
            ref.backward()
        self.assertLessEqual(abs(loss - ref.item()), 1e-6 * max(1.0, abs(ref.item())),
                             (B, C, scale, eps))
        np.testing.assert_allclose(d, t.grad.numpy(), rtol=0, atol=1e-7 + 1e-6 * np.abs(t.grad.numpy()).max())
        self.assertEqual(d.dtype, np.float32)

    def test_against_torch(self):
        for B, C in [(1, 1), (1, 10), (5, 7), (13, 1000), (128, 10)]:
            for eps in (0.0, 0.1, 0.5, 1.0):
                self.check(B, C, 3.0, eps, B * C)

    def test_large_logits(self):
        for eps in (0.0, 0.1):
            self.check(7, 11, 3000.0, eps, 1)

    def test_bad_labels(self):
        x = np.zeros((3, 4), np.float32)
        with self.assertRaisesRegex(vitc.VitcError, r"labels\[2\] = 4"):
            vitc.cross_entropy(x, [0, 1, 4])
        with self.assertRaisesRegex(vitc.VitcError, r"labels\[0\] = -1"):
            vitc.cross_entropy(x, [-1, 1, 2])
        with self.assertRaises(ValueError):
            vitc.cross_entropy(x, [0, 1])
        with self.assertRaises(TypeError):
            vitc.cross_entropy(x, [0.5, 1, 2])
        with self.assertRaisesRegex(vitc.VitcError, "label_smoothing"):
            vitc.cross_entropy(x, [0, 1, 2], label_smoothing=-0.1)


def _torch_groups(names, params, decay_all, wd):
    if decay_all:
        return [{"params": params, "weight_decay": wd}]
    dec = [p for n, p in zip(names, params) if not NO_DECAY.search(n)]
    nod = [p for n, p in zip(names, params) if NO_DECAY.search(n)]
    return [{"params": dec, "weight_decay": wd}, {"params": nod, "weight_decay": 0.0}]


@unittest.skipIf(torch is None, "needs torch")
class TestOptimizers(unittest.TestCase):
    """10 steps on random parameters and gradients, vitc vs torch.optim in
    float64: every parameter within 1e-6 relative (max(1, |ref|))."""

    def run_case(self, make_vitc, make_torch, decay_all, wd, steps=10, clip=None):
        m = _Vit(seed=3)
        rng = np.random.default_rng(7)
        tensors = m.tensors()
        for _, p, _ in tensors:
            p[...] = rng.standard_normal(p.shape).astype(np.float32)
        opt = make_vitc(m.model)
        tensors = m.tensors()  # gradients exist now
        names = [n for n, _, _ in tensors]
        self.assertTrue(any(NO_DECAY.search(n) for n in names))
        tp = [torch.tensor(p.astype(np.float64), requires_grad=True) for _, p, _ in tensors]
        topt = make_torch(_torch_groups(names, tp, decay_all, wd))
        for step in range(steps):
            opt.zero_grad()
            for (n, p, g), t in zip(tensors, tp):
                self.assertTrue(np.all(g == 0))
                scale = 1e-3 if step % 4 == 3 else 1.0
                g[...] = (rng.standard_normal(g.shape) * scale).astype(np.float32)
                t.grad = torch.tensor(g.astype(np.float64))
            if clip is not None:
                total = vitc.clip_grad_norm_(m.model, clip)
                ttotal = torch.nn.utils.clip_grad_norm_(tp, clip)
                self.assertLessEqual(abs(total - ttotal.item()), 1e-6 * ttotal.item())
                for (n, p, g), t in zip(tensors, tp):
                    np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-6, atol=1e-7, err_msg=n)
            opt.step()
            topt.step()
            for (n, p, g), t in zip(tensors, tp):
                ref = t.detach().numpy()
                err = np.abs(p - ref).max() / max(1.0, np.abs(ref).max())
                self.assertLessEqual(err, 1e-6, "step %d %s" % (step, n))
        self.assertEqual(opt.step_count, steps)
        del opt
        m.free()

    def test_adamw(self):
        for decay_all in (False, True):
            for amsgrad in (False, True):
                for lr, betas, eps, wd in [(1e-2, (0.9, 0.999), 1e-8, 1e-2),
                                           (3e-2, (0.5, 0.9), 1e-3, 0.3)]:
                    with self.subTest(decay_all=decay_all, amsgrad=amsgrad, lr=lr):
                        self.run_case(
                            lambda m: vitc.AdamW(m, lr=lr, betas=betas, eps=eps, weight_decay=wd,
                                                 amsgrad=amsgrad, decay_all=decay_all),
                            lambda g: torch.optim.AdamW(g, lr=lr, betas=betas, eps=eps,
                                                        amsgrad=amsgrad),
                            decay_all, wd)

    def test_sgd(self):
        cases = [dict(), dict(momentum=0.9), dict(momentum=0.9, dampening=0.3),
                 dict(momentum=0.8, nesterov=True), dict(weight_decay=0.1),
                 dict(momentum=0.9, weight_decay=0.05, nesterov=True)]
        for kw in cases:
            for decay_all in (False, True):
                with self.subTest(decay_all=decay_all, **kw):
                    wd = kw.get("weight_decay", 0.0)
                    tkw = {k: v for k, v in kw.items() if k != "weight_decay"}
                    self.run_case(lambda m: vitc.SGD(m, lr=0.05, decay_all=decay_all, **kw),
                                  lambda g: torch.optim.SGD(g, lr=0.05, **tkw), decay_all, wd)

    def test_clip_grad_norm(self):
        for max_norm in (0.5, 1e6):
            self.run_case(lambda m: vitc.SGD(m, lr=0.1, momentum=0.9),
                          lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9), False, 0.0,
                          steps=3, clip=max_norm)

    def test_state_roundtrip_and_errors(self):
        m = _Vit(seed=1)
        opt = vitc.AdamW(m.model, lr=1e-2)
        for _, _, g in m.tensors():
            g[...] = 0.25
        opt.step()
        sd = opt.state_dict()
        self.assertEqual(sd["step"], 1)
        self.assertEqual(sorted(sd["state"]), ["exp_avg", "exp_avg_sq"])
        self.assertTrue(np.any(sd["state"]["exp_avg"] != 0))
        opt2 = vitc.AdamW(m.model, lr=1e-2)
        opt2.load_state_dict(sd)
        self.assertEqual(opt2.step_count, 1)
        np.testing.assert_array_equal(opt2.state_dict()["state"]["exp_avg_sq"],
                                      sd["state"]["exp_avg_sq"])
        opt.lr = 0.5
        self.assertEqual(opt.lr, 0.5)
        with self.assertRaisesRegex(vitc.VitcError, "learning rate"):
            opt.lr = -1.0
        with self.assertRaisesRegex(vitc.VitcError, "nesterov"):
            vitc.SGD(m.model, lr=0.1, nesterov=True)
        with self.assertRaisesRegex(vitc.VitcError, "beta"):
            vitc.AdamW(m.model, betas=(0.9, 1.0))
        # The model freed under the optimizer: an error, never a crash.
        m.free()
        with self.assertRaisesRegex(vitc.VitcError, "freed"):
            opt.step()
        with self.assertRaisesRegex(vitc.VitcError, "freed"):
            opt.zero_grad()
        with self.assertRaises(TypeError):
            vitc.AdamW(object())
        # Python values are checked before ctypes would wrap or round them.
        with self.assertRaisesRegex(ValueError, "lr"):
            vitc.AdamW(m.model, lr=float("inf"))
        with self.assertRaisesRegex(ValueError, "total_steps"):
            vitc.lr.OneCycleLR(opt, max_lr=1.0, total_steps=0)
        with self.assertRaises(TypeError):
            vitc.SGD(m.model, lr="0.1")


class TestLayerOptimizer(unittest.TestCase):
    """An optimizer over a layer (vitc_optimizer_create_layer): with zero
    gradients AdamW only decays, so matrices shrink by 1 - lr*wd, vectors
    (biases, norms, gamma) stay, and BatchNorm's running statistics are no
    parameters at all; decay_all shrinks the vectors too."""

    def check_layer(self, layer):
        before = {k: np.array(v, copy=True) for k, v in layer.state_dict().items()}
        for decay_all in (False, True):
            layer.load_state_dict(before)
            opt = vitc.AdamW(layer, lr=0.1, weight_decay=0.5, decay_all=decay_all)
            opt.zero_grad()
            opt.step()
            after = layer.state_dict()
            for k, v in before.items():
                if "running" in k or "num_batches" in k:
                    np.testing.assert_array_equal(after[k], v, err_msg=k)
                elif v.ndim >= 2 or decay_all:
                    np.testing.assert_allclose(after[k], v * (1 - 0.1 * 0.5), rtol=1e-6,
                                               atol=1e-7, err_msg=k)
                else:
                    np.testing.assert_array_equal(after[k], v, err_msg=k)
            del opt

    def test_layers(self):
        self.check_layer(vitc.MultiheadAttention(16, 2))
        sa = vitc.SelfAttention(16, norm="batch")
        sd = sa.state_dict()
        sa.load_state_dict({k: (np.full_like(v, 0.7) if "running" in k or k.endswith("weight")
                                and v.ndim == 1 else v) for k, v in sd.items()})
        self.check_layer(sa)
        self.check_layer(vitc.ConvSABlock(16))


@unittest.skipIf(torch is None, "needs torch")
class TestSchedules(unittest.TestCase):
    """lr (and momentum) at every step of a full cycle, vitc vs torch, within
    1e-12 relative (both are float64 formulas of the step)."""

    def assert_close(self, a, b, what):
        self.assertLessEqual(abs(a - b), 1e-12 * max(1e-30, abs(b)) + 1e-300, what)

    def onecycle(self, kind, total, **kw):
        m = _Vit()
        w = torch.zeros(1, requires_grad=True)
        if kind == "sgd":
            opt = vitc.SGD(m.model, lr=0.1, momentum=0.9)
            topt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
        else:
            opt = vitc.AdamW(m.model)
            topt = torch.optim.AdamW([w])
        sched = vitc.lr.OneCycleLR(opt, max_lr=0.7, total_steps=total, **kw)
        tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.7, total_steps=total, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for step in range(total):
                g = topt.param_groups[0]
                what = "%s %s step %d" % (kind, kw, step)
                self.assert_close(opt.lr, g["lr"], what)
                self.assert_close(sched.get_last_lr()[0], tsched.get_last_lr()[0], what)
                tmom = g["momentum"] if kind == "sgd" else g["betas"][0]
                # momentum is stored as given (double) in the C config
                self.assert_close(opt.momentum, tmom, what + " momentum")
                topt.step()
                opt.step()
                if step + 1 < total:
                    tsched.step()
                    sched.step()
        del opt
        m.free()

    def test_onecycle(self):
        for kind in ("sgd", "adamw"):
            self.onecycle(kind, 100)
            self.onecycle(kind, 37, pct_start=0.25, anneal_strategy="linear")
            self.onecycle(kind, 50, three_phase=True, div_factor=10.0, final_div_factor=100.0)
            self.onecycle(kind, 20, base_momentum=0.8, max_momentum=0.99)

    def test_onecycle_no_cycle_momentum(self):
        m = _Vit()
        opt = vitc.SGD(m.model, lr=0.1, momentum=0.9)
        vitc.lr.OneCycleLR(opt, max_lr=1.0, total_steps=10, cycle_momentum=False)
        self.assertEqual(opt.momentum, 0.9)
        with self.assertRaisesRegex(vitc.VitcError, "total steps is 3"):
            s = vitc.lr.OneCycleLR(opt, max_lr=1.0, total_steps=3)
            for _ in range(4):
                s.step()
        del opt
        m.free()

    def test_warmup_cosine(self):
        for W, T, min_lr in [(5, 40, 0.0), (1, 10, 1e-4), (10, 11, 0.01), (0, 30, 0.0)]:
            m = _Vit()
            opt = vitc.AdamW(m.model, lr=0.3)
            sched = vitc.lr.WarmupCosine(opt, W, T, min_lr=min_lr)
            w = torch.zeros(1, requires_grad=True)
            topt = torch.optim.AdamW([w], lr=0.3)
            cos = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=T - W, eta_min=min_lr)
            if W > 0:
                lin = torch.optim.lr_scheduler.LinearLR(topt, start_factor=1.0 / W,
                                                        total_iters=max(W - 1, 1) if W > 1 else 0)
                tsched = torch.optim.lr_scheduler.SequentialLR(topt, [lin, cos], milestones=[W])
            else:
                tsched = cos
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for step in range(T):
                    ref = topt.param_groups[0]["lr"]
                    self.assertLessEqual(abs(opt.lr - ref), 1e-9 * 0.3, (W, T, step))
                    topt.step()
                    tsched.step()
                    sched.step()
            # past the end: min_lr
            self.assertEqual(opt.lr, min_lr)
            del opt
            m.free()


if __name__ == "__main__":
    unittest.main()
