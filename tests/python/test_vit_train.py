"""ViT training against torchvision's VisionTransformer at the same weights:
gradients of cross-entropy (label smoothing) for every parameter, computed
by torch autograd in float64, within 1e-4 * max(1, |ref|); batch 1 and 5, 1
and 3 channels, a non-square image (interpolated position embedding);
accumulation, zero_grad, save/load, state_dict, errors, dropout."""
import os
import tempfile
import unittest

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.models.vision_transformer import VisionTransformer as TVViT

import vitc


def setUpModule():
    # Another test module may have switched autograd off for the process.
    global _grad_was
    _grad_was = torch.is_grad_enabled()
    torch.set_grad_enabled(True)


def tearDownModule():
    torch.set_grad_enabled(_grad_was)


def torch_model(cfg, seed):
    """torchvision's model (conv_proj swapped for in_channels != 3), every
    parameter perturbed so no gradient is trivially zero, in float64."""
    torch.manual_seed(seed)
    t = TVViT(image_size=cfg["image_size"], patch_size=cfg["patch_size"],
              num_layers=cfg["num_layers"], num_heads=cfg["num_heads"],
              hidden_dim=cfg["hidden_dim"], mlp_dim=cfg["mlp_dim"],
              num_classes=cfg["num_classes"])
    if cfg["in_channels"] != 3:
        p = cfg["patch_size"]
        t.conv_proj = torch.nn.Conv2d(cfg["in_channels"], cfg["hidden_dim"], p, p)
    with torch.no_grad():
        for p in t.parameters():
            p.add_(0.1 * torch.randn_like(p))
    # The weights vitc sees are float32: round them first.
    return t.float().double().eval()


def torch_logits(t, x, cfg):
    """torchvision's forward, with its interpolate_embeddings resampling of
    the position embedding for a grid other than the trained one."""
    n, _, H, W = x.shape
    p, C = cfg["patch_size"], cfg["hidden_dim"]
    gh, gw, g = H // p, W // p, cfg["image_size"] // p
    y = t.conv_proj(x).reshape(n, C, gh * gw).permute(0, 2, 1)
    y = torch.cat([t.class_token.expand(n, -1, -1), y], dim=1)
    pos = t.encoder.pos_embedding
    if (gh, gw) != (g, g):
        grid = pos[:, 1:].reshape(1, g, g, C).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(gh, gw), mode="bicubic", align_corners=True)
        pos = torch.cat([pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, gh * gw, C)], dim=1)
    y = t.encoder.ln(t.encoder.layers(y + pos))
    return t.heads(y[:, 0])


def vitc_model(cfg, t):
    m = vitc.VisionTransformer(**cfg)
    m.load_state_dict({k: v.detach().float().numpy() for k, v in t.state_dict().items()})
    return m


class TestViTGradients(unittest.TestCase):
    def check(self, cfg, B, H, W, smoothing=0.1, seed=0):
        t = torch_model(cfg, seed)
        m = vitc_model(cfg, t).train()
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((B, cfg["in_channels"], H, W)).astype(np.float32)
        labels = torch.tensor(rng.integers(0, cfg["num_classes"], B))
        xt = torch.tensor(x, dtype=torch.float64)
        logits_t = torch_logits(t, xt, cfg)
        logits_t.retain_grad()
        loss = F.cross_entropy(logits_t, labels, label_smoothing=smoothing)
        loss.backward()
        logits = m(x)
        np.testing.assert_allclose(logits, logits_t.detach().numpy(), rtol=1e-4, atol=1e-4)
        m.backward(logits_t.grad.numpy().astype(np.float32))
        grads = m.grads()
        named = dict(t.named_parameters())
        self.assertEqual(list(grads), list(t.state_dict()))
        for name, g in grads.items():
            ref = named[name].grad.numpy()
            tol = 1e-4 * np.maximum(1.0, np.abs(ref))
            err = np.abs(g - ref)
            self.assertTrue((err <= tol).all(), "%s: max error %g (max |ref| %g)"
                            % (name, err.max(), np.abs(ref).max()))
            self.assertGreater(np.abs(ref).max(), 0.0, name)
        return m, x, logits_t.grad.numpy().astype(np.float32), grads

    def test_batch1_rgb(self):
        cfg = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                   mlp_dim=24, num_classes=7, in_channels=3)
        self.check(cfg, 1, 32, 32)

    def test_batch5_gray_28(self):
        cfg = dict(image_size=28, patch_size=4, num_layers=3, num_heads=4, hidden_dim=24,
                   mlp_dim=40, num_classes=10, in_channels=1)
        self.check(cfg, 5, 28, 28, seed=1)

    def test_nonsquare_interpolated(self):
        cfg = dict(image_size=32, patch_size=8, num_layers=2, num_heads=3, hidden_dim=12,
                   mlp_dim=20, num_classes=5, in_channels=3)
        self.check(cfg, 5, 24, 40, smoothing=0.0, seed=2)

    def test_two_threads_and_accumulation(self):
        cfg = dict(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8,
                   mlp_dim=12, num_classes=3, in_channels=2)
        old = vitc.get_num_threads()
        vitc.set_num_threads(2)
        try:
            m, x, dlogits, grads = self.check(cfg, 3, 16, 16, seed=3)
        finally:
            vitc.set_num_threads(old)
        m(x)
        m.backward(dlogits)
        twice = m.grads()
        for k in grads:
            np.testing.assert_allclose(twice[k], 2 * grads[k], rtol=1e-5, atol=1e-7)
        m.zero_grad()
        self.assertTrue(all((g == 0).all() for g in m.grads().values()))


    def test_class_row_last_block(self):
        """Without regularisation the last block runs on the class rows
        alone, forward and backward; drop path 1e-9 (every sample kept,
        scale 1.0f) takes the every-row path: the same logits, and the
        same gradients up to the order of the sums."""
        cfg = dict(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8,
                   mlp_dim=12, num_classes=3, in_channels=1)
        t = torch_model(cfg, 4)
        x = np.random.default_rng(4).standard_normal((3, 1, 16, 16)).astype(np.float32)
        dlogits = np.random.default_rng(5).standard_normal((3, 3)).astype(np.float32)
        out = []
        for extra in ({}, {"drop_path": 1e-9}):
            m = vitc_model(dict(cfg, **extra), t).train()
            logits = m(x)
            m.backward(dlogits)
            out.append((logits, m.grads()))
        np.testing.assert_array_equal(out[0][0], out[1][0])
        for k, g in out[1][1].items():
            self.assertGreater(np.abs(g).max(), 0.0, k)
            np.testing.assert_allclose(out[0][1][k], g, rtol=1e-5,
                                       atol=1e-6 * np.abs(g).max(), err_msg=k)


class TestViTTrainingAPI(unittest.TestCase):
    cfg = dict(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=12,
               num_classes=3, in_channels=1)

    def test_init_like_torchvision(self):
        m = vitc.VisionTransformer(**self.cfg, seed=5)
        sd = m.state_dict()
        t = torch_model(self.cfg, 0)
        self.assertEqual([(k, v.shape) for k, v in sd.items()],
                         [(k, tuple(v.shape)) for k, v in t.state_dict().items()])
        self.assertTrue((sd["heads.head.weight"] == 0).all())
        self.assertTrue((sd["class_token"] == 0).all())
        self.assertTrue((sd["encoder.layers.encoder_layer_0.ln_1.weight"] == 1).all())
        # Another seed, other weights; the same seed, the same.
        again = vitc.VisionTransformer(**self.cfg, seed=5).state_dict()
        other = vitc.VisionTransformer(**self.cfg, seed=6).state_dict()
        self.assertTrue((again["encoder.pos_embedding"] == sd["encoder.pos_embedding"]).all())
        self.assertFalse((other["encoder.pos_embedding"] == sd["encoder.pos_embedding"]).all())

    def test_save_load(self):
        t = torch_model(self.cfg, 4)
        m = vitc_model(self.cfg, t)
        x = np.random.default_rng(0).standard_normal((2, 1, 16, 16)).astype(np.float32)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.safetensors")
            m.save(path)
            r = vitc.VisionTransformer.from_safetensors(path)
        np.testing.assert_array_equal(r(x), m(x))
        self.assertEqual(r.config["in_channels"], 1)

    def test_errors(self):
        m = vitc.VisionTransformer(**self.cfg)
        x = np.zeros((2, 1, 16, 16), np.float32)
        with self.assertRaises(RuntimeError):
            m.backward(np.zeros((2, 3), np.float32))  # no training forward
        m.eval()
        m(x)
        with self.assertRaises(RuntimeError):
            m.backward(np.zeros((2, 3), np.float32))  # eval forwards record nothing
        m.train()
        m(x)
        with self.assertRaises(ValueError):
            m.backward(np.zeros((3, 3), np.float32))
        m.backward(np.zeros((2, 3), np.float32))
        with self.assertRaises(RuntimeError):
            m.backward(np.zeros((2, 3), np.float32))  # the recording is spent
        with self.assertRaises(ValueError):
            m.load_state_dict({"class_token": np.zeros((1, 1, 9))}, strict=False)
        with self.assertRaises(KeyError):
            m.load_state_dict({"class_token": np.zeros((1, 1, 8))})
        with self.assertRaises(vitc.VitcError):
            vitc.VisionTransformer(**self.cfg, attention_dropout=-0.1)
        with self.assertRaises(vitc.VitcError):
            vitc.VisionTransformer(**self.cfg, dropout=1.0)


class TestViTTrainingSteps(unittest.TestCase):
    """Ten optimizer steps of a small ViT from the same weights and batches as
    torchvision's under torch.optim (float64; every tensor decayed, as
    torch over model.parameters()): losses within 1e-4 relative at every
    step, parameters within 1e-4 * max(1, |ref|) after."""
    cfg = dict(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=16,
               mlp_dim=24, num_classes=4, in_channels=1)

    def run_steps(self, make_vitc, make_torch):
        t = torch_model(self.cfg, 9)
        m = vitc_model(self.cfg, t).train()
        opt, topt = make_vitc(m), make_torch(t.parameters())
        rng = np.random.default_rng(4)
        for step in range(10):
            x = rng.standard_normal((6, 1, 16, 16)).astype(np.float32)
            y = rng.integers(0, 4, 6)
            opt.zero_grad()
            loss, dlogits = vitc.cross_entropy(m(x), y, label_smoothing=0.1)
            m.backward(dlogits)
            opt.step()
            topt.zero_grad()
            tloss = F.cross_entropy(torch_logits(t, torch.tensor(x, dtype=torch.float64),
                                                 self.cfg),
                                    torch.tensor(y), label_smoothing=0.1)
            tloss.backward()
            topt.step()
            self.assertLessEqual(abs(loss - tloss.item()), 1e-4 * abs(tloss.item()),
                                 "step %d" % step)
        sd = m.state_dict()
        C = self.cfg["hidden_dim"]
        for name, ref in t.state_dict().items():
            ref, got = ref.numpy(), sd[name]
            if name.endswith("in_proj_bias"):
                # The key bias's true gradient is exactly 0 (softmax ignores a
                # per-row shift, so the losses above do not see it either);
                # Adam turns its rounding noise (~1e-9 in float32, ~1e-17 in
                # float64) into +-lr steps of arbitrary sign. Compare q and v.
                ref, got = np.delete(ref, np.s_[C:2 * C]), np.delete(got, np.s_[C:2 * C])
            err = np.abs(got - ref)
            self.assertTrue((err <= 1e-4 * np.maximum(1.0, np.abs(ref))).all(),
                            "%s: max error %g" % (name, err.max()))

    def test_adamw(self):
        self.run_steps(lambda m: vitc.AdamW(m, lr=1e-2, weight_decay=0.05, decay_all=True),
                       lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05))

    def test_sgd(self):
        self.run_steps(lambda m: vitc.SGD(m, lr=0.1, momentum=0.9, nesterov=True,
                                          weight_decay=1e-3, decay_all=True),
                       lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                                 weight_decay=1e-3))


class SplitMix64:
    """libvitc's generator (src/rng.h), to rebuild the model's dropout masks."""
    GAMMA, M1, M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

    def __init__(self, s):
        self.s = np.uint64(s)

    def uniform(self, n):
        k = np.arange(1, n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z = self.s + k * np.uint64(self.GAMMA)
            self.s = self.s + np.uint64(n) * np.uint64(self.GAMMA)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(self.M1)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(self.M2)
            z = z ^ (z >> np.uint64(31))
        return (z >> np.uint64(40)).astype(np.float64) / 16777216.0

    def keep(self, shape, p):
        return (self.uniform(int(np.prod(shape))) >= float(np.float32(p))).reshape(shape)


class TestViTDropout(unittest.TestCase):
    cfg = dict(image_size=16, patch_size=4, num_layers=3, num_heads=2, hidden_dim=8,
               mlp_dim=12, num_classes=3, in_channels=1)

    def test_eval_and_p0_unaffected(self):
        t = torch_model(self.cfg, 7)
        plain = vitc_model(self.cfg, t)
        x = np.random.default_rng(1).standard_normal((4, 1, 16, 16)).astype(np.float32)
        ref = plain(x)
        m = vitc_model(dict(self.cfg, dropout=0.3, attention_dropout=0.2, drop_path=0.4), t)
        np.testing.assert_array_equal(m.eval()(x), ref)
        zero = vitc_model(dict(self.cfg, dropout=0.0, drop_path=0.0), t).train()
        np.testing.assert_array_equal(zero(x), ref)
        self.assertFalse(np.array_equal(m.train()(x), ref))

    def test_gradients_with_the_same_masks(self):
        """torch with the masks the model drew (rebuilt from its generator)
        injected: logits and every gradient agree, so the gradient flows
        through the kept elements only, scaled as forward scaled them."""
        p, pa, dp, seed, B = 0.25, 0.2, 0.5, 11, 5
        cfg = dict(self.cfg, dropout=p, attention_dropout=pa, drop_path=dp, seed=seed)
        heads = self.cfg["num_heads"]
        t = torch_model(self.cfg, 8)
        m = vitc_model(cfg, t).train()
        x = np.random.default_rng(2).standard_normal((B, 1, 16, 16)).astype(np.float32)
        N, C, M, depth = 17, self.cfg["hidden_dim"], self.cfg["mlp_dim"], self.cfg["num_layers"]
        rng = SplitMix64(seed ^ 0xD1B54A32D192ED03)
        emb = rng.keep((B, N, C), p)
        blocks = []
        for l in range(depth):
            pd = np.float32(dp) * np.float32(l) / np.float32(depth - 1)
            probs = rng.keep((B, heads, N, N), pa)
            att = rng.keep((B, N, C), p)
            dpa = rng.keep((B,), pd) if pd > 0 else np.ones(B, bool)
            hid = rng.keep((B, N, M), p)
            out = rng.keep((B, N, C), p)
            dpm = rng.keep((B,), pd) if pd > 0 else np.ones(B, bool)
            blocks.append((float(pd), probs, att, dpa, hid, out, dpm))

        def drop(z, keep, q):
            return z * torch.tensor(keep, dtype=torch.float64) / (1 - q)

        xt = torch.tensor(x, dtype=torch.float64)
        y = t.conv_proj(xt).reshape(B, C, N - 1).permute(0, 2, 1)
        y = torch.cat([t.class_token.expand(B, -1, -1), y], dim=1) + t.encoder.pos_embedding
        y = drop(y, emb, p)
        def attention(mha, h, keep):  # nn.MultiheadAttention with the dropout mask given
            q, k, v = F.linear(h, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
            d = C // heads
            q, k, v = (z.reshape(B, N, heads, d).transpose(1, 2) for z in (q, k, v))
            P = torch.softmax(q @ k.transpose(-1, -2) / np.sqrt(d), dim=-1)
            o = (drop(P, keep, pa) @ v).transpose(1, 2).reshape(B, N, C)
            return mha.out_proj(o)

        for blk, (pd, probs, att, dpa, hid, out, dpm) in zip(t.encoder.layers, blocks):
            h = blk.ln_1(y)
            a = attention(blk.self_attention, h, probs)
            a = drop(a, att, p)
            if pd > 0:
                a = drop(a, dpa[:, None, None], pd)
            mid = y + a
            z = F.gelu(blk.mlp[0](blk.ln_2(mid)))
            z = blk.mlp[3](drop(z, hid, p))
            z = drop(z, out, p)
            if pd > 0:
                z = drop(z, dpm[:, None, None], pd)
            y = mid + z
        logits_t = t.heads(t.encoder.ln(y)[:, 0])
        logits_t.retain_grad()
        labels = torch.tensor([0, 2, 1, 1, 0])
        F.cross_entropy(logits_t, labels, label_smoothing=0.1).backward()
        logits = m(x)
        np.testing.assert_allclose(logits, logits_t.detach().numpy(), rtol=1e-4, atol=1e-4)
        m.backward(logits_t.grad.numpy().astype(np.float32))
        named = dict(t.named_parameters())
        for name, g in m.grads().items():
            ref = named[name].grad.numpy()
            err = np.abs(g - ref)
            self.assertTrue((err <= 1e-4 * np.maximum(1.0, np.abs(ref))).all(),
                            "%s: max error %g" % (name, err.max()))
        self.assertTrue(any(not b[3].all() or not b[6].all() for b in blocks))  # a path dropped


if __name__ == "__main__":
    unittest.main()
