"""Fine-tuning: the training checkpoint in the library and Python, layer-wise
lr decay, `vitc train --init MODEL` with a new head and --freeze-backbone.

- Layer-wise decay: the optimizer's lr multiplier of every tensor against a
  hand computation from the tensor's name (BEiT's rule), and one AdamW step
  against torch.optim.AdamW with one param group per tensor at lr * scale.
- Checkpoint round trip in Python: train, save mid-run, load, continue:
  bit-identical to an uninterrupted run (also for a model read by
  vitc.load_model, whose parameters lie in another memory layout).
- A linear probe (--freeze-backbone) on an ImageFolder of crops of four
  scikit-image photographs learns (train accuracy well above chance), leaves
  the backbone bit for bit, and `vitc eval` of the saved model agrees with
  the run's own evaluation; a probe resumed mid-run equals an uninterrupted
  one.
- Bad combinations of the new flags: one `vitc: error:` line each.
Tests that need vitc_vit_reset_head (a new head for other classes) skip
when the library has none.
"""
import json
import os
import sys
import unittest

import numpy as np

try:
    from .util import ROOT, VITC, TmpDirCase, reference_modules, run_vitc as run
except ImportError:  # run as a script
    from util import ROOT, VITC, TmpDirCase, reference_modules, run_vitc as run

sys.path.insert(0, os.path.join(ROOT, "python"))
import vitc  # noqa: E402
from vitc._lib import lib  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
try:
    import skimage.data
    from PIL import Image
except ImportError:  # pragma: no cover
    skimage = None

HAS_RESET_HEAD = hasattr(lib, "vitc_vit_reset_head")
TINY = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64)
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


def photo_folder(root, n_train=12, n_val=6, side=40, seed=0):
    """An ImageFolder of random square crops of four photographs, one class
    each, resized to side x side PNGs: train/<photo>/*.png, val/<photo>/*.png."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        for name in PHOTOS:
            img = getattr(skimage.data, name)()
            if img.ndim == 2:
                img = np.stack([img] * 3, -1)
            img = img[..., :3]
            d = os.path.join(root, split, name)
            os.makedirs(d, exist_ok=True)
            h, w = img.shape[:2]
            for i in range(n):
                s = int(rng.integers(min(h, w) // 3, min(h, w) // 2))
                y, x = int(rng.integers(0, h - s)), int(rng.integers(0, w - s))
                Image.fromarray(np.ascontiguousarray(img[y:y + s, x:x + s])).resize(
                    (side, side)).save(os.path.join(d, "%02d.png" % i))
    return root


def expected_scale(name, depth, decay):
    """BEiT / timm: block l of L at decay**(L - l), the embeddings (class
    token, patch projection, position embedding) decay**(L + 1), the final
    norm and the head 1."""
    if ".encoder_layer_" in name:
        layer = int(name.split(".encoder_layer_")[1].split(".")[0])
        return decay ** (depth - layer)
    if name.startswith(("class_token", "conv_proj", "encoder.pos_embedding")):
        return decay ** (depth + 1)
    assert name.startswith(("encoder.ln", "heads")), name
    return 1.0


def train_steps(m, opt, batches):
    m.train()
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss, dy = vitc.cross_entropy(m(x), y)
        m.backward(dy)
        opt.step()
        losses.append(loss)
    return losses


def batches(n, seed=0, B=4, C=3, side=32):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((B, 3, side, side)).astype(np.float32),
             rng.integers(0, C, B)) for _ in range(n)]


class TestLayerDecay(unittest.TestCase):
    def test_scales_by_hand(self):
        m = vitc.VisionTransformer(num_classes=3, seed=1, **{**TINY, "num_layers": 3})
        for decay in (0.65, 0.9, 1.0):
            opt = vitc.AdamW(m, lr=1e-3, layer_decay=decay)
            sc = opt.lr_scales
            self.assertEqual(list(sc), [p[0] for p in m._params()])
            for name, got in sc.items():
                self.assertAlmostEqual(got, expected_scale(name, 3, decay), places=15, msg=name)
        # the setting is checked, and set_lr_scale names one tensor
        with self.assertRaises(vitc.VitcError):
            vitc.AdamW(m, layer_decay=0.0)
        with self.assertRaises(vitc.VitcError):
            vitc.SGD(m, layer_decay=1.5)
        opt = vitc.SGD(m, lr=0.1)
        opt.set_lr_scale("heads.head.bias", 0.25)
        self.assertEqual(opt.lr_scales["heads.head.bias"], 0.25)
        self.assertEqual(opt.lr_scales["heads.head.weight"], 1.0)

    @unittest.skipIf(torch is None, "needs torch")
    def test_adamw_step_matches_torch_param_groups(self):
        m = vitc.VisionTransformer(num_classes=3, seed=2, **TINY)
        lr, wd, decay = 3e-3, 0.05, 0.7
        opt = vitc.AdamW(m, lr=lr, weight_decay=wd, layer_decay=decay, decay_all=True)
        before = m.state_dict()
        m.train()
        (x, y), = batches(1, seed=4)
        opt.zero_grad()
        _, dy = vitc.cross_entropy(m(x), y)
        m.backward(dy)
        grads = {k: v.copy() for k, v in m.grads().items()}
        opt.step()
        after = m.state_dict()
        params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in before.items()}
        groups = [{"params": [p], "lr": lr * expected_scale(k, 2, decay)}
                  for k, p in params.items()]
        topt = torch.optim.AdamW(groups, lr=lr, weight_decay=wd)
        for k, p in params.items():
            p.grad = torch.from_numpy(grads[k])
        topt.step()
        for k, p in params.items():
            ref = p.detach().numpy()
            np.testing.assert_allclose(after[k], ref, rtol=1e-6, atol=1e-7, err_msg=k)
        # the embeddings moved less than the head (decay**3 of its rate)
        self.assertNotEqual(np.abs(after["heads.head.bias"] - before["heads.head.bias"]).max(), 0)


class TestCheckpoint(TmpDirCase):
    def continue_equals_uninterrupted(self, make_model):
        data = batches(6, seed=7)
        mk_opt = lambda m: vitc.AdamW(m, lr=2e-3, weight_decay=0.05, layer_decay=0.8)  # noqa: E731
        ref = make_model()
        ref_losses = train_steps(ref, mk_opt(ref), data)
        m = make_model()
        opt = mk_opt(m)
        losses = train_steps(m, opt, data[:3])
        ck = self.path("ck.safetensors")
        vitc.save_checkpoint(ck, m, opt, meta={"epoch": 0, "step": 3, "note": "mid-run"})
        del m, opt
        m2, opt2, meta = vitc.load_checkpoint(ck, optimizer=mk_opt)
        self.assertEqual(meta["step"], 3)
        self.assertEqual(meta["note"], "mid-run")
        self.assertEqual(meta["optimizer_step"], "3")
        self.assertEqual(opt2.step_count, 3)
        losses += train_steps(m2, opt2, data[3:])
        self.assertEqual(losses, ref_losses)
        got, want = m2.state_dict(), ref.state_dict()
        for k in want:
            self.assertTrue(np.array_equal(got[k], want[k]), k)
        # the checkpoint is a model for every command
        rc, out, err = run("inspect", ck)
        self.assertEqual(rc, 0, err)

    def test_round_trip_bit_identical(self):
        self.continue_equals_uninterrupted(
            lambda: vitc.VisionTransformer(num_classes=3, seed=5, labels=["a", "b", "c"], **TINY))

    def test_round_trip_of_a_loaded_model(self):
        src = self.path("src.safetensors")
        vitc.VisionTransformer(num_classes=3, seed=6, **TINY).save(src)
        self.continue_equals_uninterrupted(lambda: vitc.load_model(src))

    def test_model_alone_and_mismatches(self):
        m = vitc.VisionTransformer(num_classes=3, seed=5, **TINY)
        plain = self.path("plain.safetensors")
        vitc.save_checkpoint(plain, m, meta={"epoch": 1})
        with self.assertRaisesRegex(vitc.VitcError, "no vitc.train"):
            vitc.load_checkpoint(plain)
        m2 = vitc.load_model(plain)  # still a model
        np.testing.assert_array_equal(m2.state_dict()["heads.head.weight"],
                                      m.state_dict()["heads.head.weight"])
        ck = self.path("sgd.safetensors")
        vitc.save_checkpoint(ck, m, vitc.SGD(m, lr=0.1, momentum=0.9))
        adam = vitc.AdamW(m)
        with self.assertRaisesRegex(vitc.VitcError, "exp_avg"):
            adam.load_checkpoint(ck)
        other = vitc.VisionTransformer(num_classes=5, seed=5, **TINY)
        ck2 = self.path("adam.safetensors")
        vitc.save_checkpoint(ck2, m, adam)
        with self.assertRaisesRegex(vitc.VitcError, "another model"):
            vitc.AdamW(other).load_checkpoint(ck2)
        with self.assertRaises(TypeError):
            vitc.save_checkpoint(ck2, m, meta="epoch 1")
        # the C API refuses bad arguments with a message, never a crash
        bad = self.path("bad.safetensors").encode()
        self.assertEqual(lib.vitc_checkpoint_save(bad, None, None, None, None),
                         vitc.Status.ERR_INVALID_ARG)
        self.assertEqual(lib.vitc_checkpoint_save(bad, m._h, None, None, b"[1]"),
                         vitc.Status.ERR_INVALID_ARG)
        self.assertIn("JSON object", lib.vitc_last_error().decode())
        self.assertEqual(lib.vitc_checkpoint_load_optimizer(ck2.encode(), None),
                         vitc.Status.ERR_INVALID_ARG)
        self.assertFalse(os.path.exists(bad))
        self.assertFalse([f for f in os.listdir(self.tmp) if ".tmp" in f])


@unittest.skipIf(skimage is None or not os.path.exists(VITC), "needs scikit-image and build/vitc")
class TestFinetuneCLI(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = photo_folder(os.path.join(cls.tmp, "photos"))
        # a backbone of the folder's 4 classes without names (its head is
        # kept), and one of 10 named classes (a new head: reset_head)
        cls.m4 = os.path.join(cls.tmp, "m4.safetensors")
        vitc.VisionTransformer(num_classes=4, seed=1, **TINY).save(cls.m4)
        cls.m10 = os.path.join(cls.tmp, "m10.safetensors")
        vitc.VisionTransformer(num_classes=10, seed=1, labels=[str(i) for i in range(10)],
                               **TINY).save(cls.m10)

    def probe(self, init, out, epochs, *extra):
        log = out + ".jsonl"
        rc, _, err = run("train", "--data", self.data, "--init", init, "--freeze-backbone",
                         "--epochs", epochs, "--lr", 1e-2, "--batch", 8, "--out", out,
                         "--log", log, "--quiet", *extra)
        self.assertEqual(rc, 0, err)
        with open(log) as f:
            return [r for r in map(json.loads, f) if r["type"] == "epoch"]

    def check_probe(self, init, tag):
        out = self.path(tag + ".safetensors")
        ep = self.probe(init, out, 30)
        self.assertGreaterEqual(ep[-1]["train_acc"], 0.6)  # chance: 0.25
        rc, so, err = run("eval", "--model", out, "--data", self.data, "--json", "--quiet")
        self.assertEqual(rc, 0, err)
        ev = json.loads(so)
        self.assertAlmostEqual(ev["accuracy"], ep[-1]["eval_acc"], places=6)
        self.assertAlmostEqual(ev["loss"], ep[-1]["eval_loss"], places=4)
        # only the head moved
        a, _ = vitc.load_safetensors(init)
        b, _ = vitc.load_safetensors(out)
        for k in a:
            if not k.startswith("heads."):
                self.assertTrue(np.array_equal(a[k], b[k]), k)
        self.assertFalse(np.array_equal(b["heads.head.weight"], a["heads.head.weight"])
                         if a["heads.head.weight"].shape == b["heads.head.weight"].shape else False)
        return out

    def test_freeze_backbone_learns(self):
        self.check_probe(self.m4, "probe4")

    @unittest.skipUnless(HAS_RESET_HEAD, "needs vitc_vit_reset_head")
    def test_freeze_backbone_new_head(self):
        out = self.check_probe(self.m10, "probe10")
        _, meta = vitc.load_safetensors(out)
        self.assertEqual(json.loads(meta["vitc.config"])["labels"], sorted(PHOTOS))

    @unittest.skipUnless(HAS_RESET_HEAD, "needs vitc_vit_reset_head")
    def test_finetune_new_head_whole_model(self):
        out = self.path("ft10.safetensors")
        rc, _, err = run("train", "--data", self.data, "--init", self.m10, "--epochs", 3,
                         "--batch", 8, "--lr", 1e-3, "--lr-layer-decay", 0.75, "--out", out,
                         "--quiet")
        self.assertEqual(rc, 0, err)
        m = vitc.load_model(out)
        self.assertEqual(m.config["num_classes"], 4)

    @unittest.skipUnless(HAS_RESET_HEAD and torch is not None,
                         "needs vitc_vit_reset_head (with it, saving Hub models) and torch")
    def test_freeze_backbone_hub_model_uses_its_processor(self):
        from vitc.image import load_image
        hf_ref, = reference_modules("hf_ref")
        cfg = hf_ref.vit_config("vit", "ViTForImageClassification", classes=4)
        names = sorted(PHOTOS)  # the folder's classes: the head is kept
        cfg["id2label"] = {str(i): n for i, n in enumerate(names)}
        cfg["label2id"] = {n: i for i, n in enumerate(names)}
        hub = self.path("hubvit")
        # a processor vitc's loader does not reproduce: a squashing resize
        hf_ref.save_hub(hub, hf_ref.random_state(cfg, 0), cfg, preprocessor={
            "do_resize": True, "size": {"height": 32, "width": 32}, "resample": 2,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})
        out = self.path("hubprobe.safetensors")
        ep = self.probe(hub, out, 20)
        m = vitc.load_model(out)
        right = n = 0
        for c, name in enumerate(names):
            d = os.path.join(self.data, "val", name)
            for f in sorted(os.listdir(d)):
                x = m.preprocess(load_image(os.path.join(d, f)))
                right += int(np.argmax(m(x[None])[0]) == c)
                n += 1
        self.assertAlmostEqual(right / n, ep[-1]["eval_acc"], places=6)

    def test_probe_resume_bit_identical(self):
        full, part = self.path("full.safetensors"), self.path("part.safetensors")
        self.probe(self.m4, full, 4)
        self.probe(self.m4, part, 2)
        rc, _, err = run("train", "--data", self.data, "--resume", part, "--epochs", 4, "--out",
                         part, "--quiet")
        self.assertEqual(rc, 0, err)
        with open(full, "rb") as f, open(part, "rb") as g:
            self.assertEqual(f.read(), g.read())

    def test_layer_decay_resumes(self):
        full, part = self.path("lfull.safetensors"), self.path("lpart.safetensors")
        common = ["--data", self.data, "--init", self.m4, "--batch", 8, "--lr-layer-decay", 0.7,
                  "--quiet"]
        for out, ep in ((full, 3), (part, 2)):
            rc, _, err = run("train", *common, "--epochs", ep, "--out", out)
            self.assertEqual(rc, 0, err)
        rc, _, err = run("train", "--data", self.data, "--resume", part, "--epochs", 3, "--out",
                         part, "--quiet")
        self.assertEqual(rc, 0, err)
        with open(full, "rb") as f, open(part, "rb") as g:
            self.assertEqual(f.read(), g.read())
        _, meta = vitc.load_safetensors(part)
        self.assertAlmostEqual(json.loads(meta["vitc.train"])["lr_layer_decay"], 0.7)

    def test_bad_combinations(self):
        out = self.path("bad.safetensors")
        base = ["train", "--data", self.data, "--epochs", 1, "--out", out]

        def fails(args, status, expect):
            rc, _, err = run(*args)
            self.assertEqual(rc, status, err)
            lines = [l for l in err.splitlines() if l.startswith("vitc: error:")]
            self.assertEqual(len(lines), 1, err)
            self.assertIn(expect, lines[0])

        fails(base + ["--freeze-backbone"], 2, "--init MODEL")
        fails(base + ["--init", self.m4, "--freeze-backbone", "--augment", "flip"], 2, "--augment")
        fails(base + ["--init", self.m4, "--freeze-backbone", "--lr-layer-decay", 0.8], 2,
              "--lr-layer-decay")
        fails(base + ["--lr-layer-decay", 0], 2, "--lr-layer-decay")
        fails(base + ["--lr-layer-decay", 1.5], 2, "--lr-layer-decay")
        fails(base + ["--init", self.m4, "--dim", 64], 1, "dim")
        whole = self.path("whole.safetensors")
        rc, _, err = run("train", "--data", self.data, "--init", self.m4, "--epochs", 1,
                         "--batch", 8, "--out", whole, "--quiet")
        self.assertEqual(rc, 0, err)
        fails(["train", "--data", self.data, "--resume", whole, "--freeze-backbone", "--epochs", 2,
               "--out", whole], 1, "--freeze-backbone")
        if not HAS_RESET_HEAD:
            fails(base + ["--init", self.m10], 1, "vitc_vit_reset_head")
        self.assertFalse(os.path.exists(out))


@unittest.skipUnless(HAS_RESET_HEAD, "needs vitc_vit_reset_head")
class TestFinetunePython(TmpDirCase):
    def test_load_reset_train(self):
        src = self.path("m10.safetensors")
        vitc.VisionTransformer(num_classes=10, seed=3, **TINY).save(src)
        m = vitc.load_model(src)
        m.reset_head(3)
        opt = vitc.AdamW(m, lr=3e-3, layer_decay=0.8)
        data = batches(1, seed=9, C=3) * 20
        losses = train_steps(m, opt, data)
        self.assertLess(losses[-1], 0.5 * losses[0])
        ck = self.path("ck.safetensors")
        vitc.save_checkpoint(ck, m, opt, meta={"step": 20})
        m2, opt2, _ = vitc.load_checkpoint(ck, optimizer=lambda mm: vitc.AdamW(mm, lr=3e-3))
        self.assertEqual(opt2.step_count, 20)


if __name__ == "__main__":
    unittest.main()
