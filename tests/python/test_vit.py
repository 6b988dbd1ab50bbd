"""The Vision Transformer through the Python binding, live against
torchvision 0.14: checkpoints exported with tools/export_safetensors.py (the
way a user makes them), then logits within 1e-3 * max(1, |torch|) with the
same top-5, attention maps and rollout.

Needs torch and torchvision (the .venv that scripts/install-deps.sh makes); skipped without.
"""
import os
import subprocess
import sys
import unittest

import numpy as np

import vitc

try:
    import torch
    import torchvision
    from torchvision.models.vision_transformer import VisionTransformer as TVViT
except ImportError:  # pragma: no cover
    torch = None

try:
    from .util import EXPORT, TmpDirCase, reference_modules
except ImportError:  # run as a script
    from util import EXPORT, TmpDirCase, reference_modules

# gen_vit's helpers: randomize, reinit_head, attention_probs, rollout64
gen_vit, st_write = reference_modules("gen_vit", "st_write")

# torchvision -> timm (docs/vit.md): a pure rename, qkv included.
TIMM_RENAMES = [
    ("class_token", "cls_token"), ("conv_proj.", "patch_embed.proj."),
    ("encoder.pos_embedding", "pos_embed"), ("encoder.layers.encoder_layer_", "blocks."),
    ("ln_1.", "norm1."), ("ln_2.", "norm2."),
    ("self_attention.in_proj_weight", "attn.qkv.weight"),
    ("self_attention.in_proj_bias", "attn.qkv.bias"),
    ("self_attention.out_proj.", "attn.proj."), ("mlp.0.", "mlp.fc1."), ("mlp.3.", "mlp.fc2."),
    ("encoder.ln.", "norm."), ("heads.head.", "head."),
]


def to_timm(sd):
    out = {}
    for k, v in sd.items():
        for a, b in TIMM_RENAMES:
            k = k.replace(a, b)
        out[k] = v
    return out


def export(*args):
    r = subprocess.run([sys.executable, EXPORT] + [str(a) for a in args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError("export_safetensors.py %s failed:\n%s" % (args, r.stderr))
    return r


def torch_logits(model, x):
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


class Base(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        if torch is None:
            raise unittest.SkipTest("torch/torchvision not installed")
        torch.set_num_threads(2)
        super().setUpClass()

    def assertLogits(self, got, want):
        self.assertEqual(got.shape, want.shape)
        self.assertEqual(got.dtype, np.float32)
        tol = 1e-3 * np.maximum(1.0, np.abs(want))
        err = np.abs(got - want)
        self.assertTrue((err <= tol).all(), "max |vitc - torch| = %g (max |torch| %g)"
                        % (err.max(), np.abs(want).max()))
        top_g = np.argsort(-got, axis=1, kind="stable")[:, :5]
        top_w = np.argsort(-want, axis=1, kind="stable")[:, :5]
        np.testing.assert_array_equal(top_g, top_w)


class TestTinyCustom(Base):
    """A config of no preset: image 48, patch 12, hidden 96, 6 heads, 3 blocks."""

    CFG = dict(image_size=48, patch_size=12, num_layers=3, num_heads=6, hidden_dim=96,
               mlp_dim=200, num_classes=17)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        torch.manual_seed(0)
        cls.model = gen_vit.reinit_head(gen_vit.randomize(TVViT(**cls.CFG), 11), 12).eval()
        cls.pth = os.path.join(cls.tmp, "tiny.pth")
        torch.save(cls.model.state_dict(), cls.pth)
        cls.st = os.path.join(cls.tmp, "tiny.safetensors")
        export(cls.pth, cls.st, "--num-heads", 6)
        cls.vit = vitc.VisionTransformer.from_safetensors(cls.st)
        cls.x = np.random.default_rng(0).standard_normal((4, 3, 48, 48)).astype(np.float32)

    def test_config(self):
        c = self.vit.config
        self.assertEqual((c["image_size"], c["patch_size"], c["hidden_dim"], c["depth"],
                          c["num_heads"], c["mlp_dim"], c["num_classes"]),
                         (48, 12, 96, 3, 6, 200, 17))
        self.assertEqual(c["arch"], "custom")
        self.assertIsNone(self.vit.labels)

    def test_logits(self):
        self.assertLogits(self.vit(self.x), torch_logits(self.model, self.x))

    def test_single_image(self):
        want = torch_logits(self.model, self.x[2:3])
        self.assertLogits(self.vit(self.x[2]), want)
        self.assertLogits(self.vit(self.x[2].tolist()), want)
        with self.assertRaises(ValueError):
            self.vit(self.x[:, :2])

    def test_other_image_sizes(self):
        # torchvision's route: a model built for the new size, loaded with
        # the state dict through interpolate_embeddings (bicubic).
        for size in (72, 24, 60):
            with self.subTest(size=size):
                m2 = gen_vit.at_image_size(self.model, size, num_classes=17)
                x = np.random.default_rng(size).standard_normal((2, 3, size, size))
                x = x.astype(np.float32)
                self.assertLogits(self.vit(x), torch_logits(m2, x))

    def test_attention_maps(self):
        x = self.x[:3]
        attn, roll = self.vit.attention_maps(x)
        want = gen_vit.attention_probs(self.model, torch.from_numpy(x))
        self.assertEqual(attn.shape, (3, 3, 6, 17, 17))
        np.testing.assert_allclose(attn, want, rtol=0, atol=1e-5)
        # The rollout of vitc's own probabilities in float64 numpy.
        self.assertEqual(roll.shape, (3, 17, 17))
        np.testing.assert_allclose(roll, gen_vit.rollout64(attn), rtol=0, atol=1e-5)
        np.testing.assert_allclose(roll.sum(-1), 1.0, atol=1e-5)

    def test_labels_and_dtypes(self):
        labels = self.path("labels.txt")
        with open(labels, "w") as f:
            f.write("".join("thing %d\n" % i for i in range(17)))
        sd = self.model.state_dict()
        for dtype, rnd in (("bf16", torch.bfloat16), ("f16", torch.float16)):
            with self.subTest(dtype=dtype):
                out = self.path("tiny_%s.safetensors" % dtype)
                export(self.pth, out, "--num-heads", 6, "--dtype", dtype, "--labels", labels)
                vit = vitc.VisionTransformer.from_safetensors(out)
                self.assertEqual(vit.labels[16], "thing 16")
                m = TVViT(**self.CFG).eval()
                m.load_state_dict({k: v.to(rnd).to(torch.float32) for k, v in sd.items()})
                self.assertLogits(vit(self.x), torch_logits(m, self.x))

    def test_bad_checkpoint(self):
        sd = self.model.state_dict()
        del sd["encoder.layers.encoder_layer_2.mlp.3.bias"]
        bad = self.path("missing.safetensors")
        st_write.write(bad, sd, {"vitc.config": gen_vit.vitc_config(self.model)})
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.VisionTransformer.from_safetensors(bad, arch=None)
        self.assertIn("missing tensor encoder.layers.encoder_layer_2.mlp.3.bias",
                      str(cm.exception))
        st_write.write(bad, sd)  # no config: 96 hidden gives no head count
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.VisionTransformer.from_safetensors(bad)
        self.assertIn("num_heads", str(cm.exception))
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.VisionTransformer.from_safetensors(bad, arch="vit_b_16")
        self.assertIn("class_token: expected [1, 1, 768], file has [1, 1, 96]", str(cm.exception))
        sd = self.model.state_dict()
        sd["heads.head.weight"] = sd["heads.head.weight"][:, :95]
        st_write.write(bad, sd, {"vitc.config": gen_vit.vitc_config(self.model)})
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.VisionTransformer.from_safetensors(bad)
        self.assertIn("heads.head.weight: expected [17, 96], file has [17, 95]", str(cm.exception))


class TestViTB16(Base):
    """ViT-B/16 as torchvision builds it (random init, head re-initialised),
    pickled as a module and exported."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        torch.manual_seed(1)
        cls.model = gen_vit.reinit_head(torchvision.models.vit_b_16(), 2).eval()
        pt = os.path.join(cls.tmp, "vit_b_16.pt")
        torch.save(cls.model, pt)  # the whole module: its class names the preset
        cls.st = os.path.join(cls.tmp, "vit_b_16.safetensors")
        # torch >= 2.6 loads weights only unless told; the exporter says how
        r = subprocess.run([sys.executable, EXPORT, pt, cls.st], capture_output=True, text=True)
        cls.refused = (r.returncode, r.stderr, os.path.exists(cls.st))
        export(pt, cls.st, "--trust-pickle")
        os.unlink(pt)
        cls.vit = vitc.VisionTransformer.from_safetensors(cls.st)
        cls.x = np.random.default_rng(1).standard_normal((3, 3, 224, 224)).astype(np.float32)

    def test_pickled_module_needs_trust(self):
        rc, err, wrote = self.refused
        self.assertEqual(rc, 1)
        self.assertFalse(wrote)
        self.assertIn("--trust-pickle", err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_arch(self):
        c = self.vit.config
        self.assertEqual(c["arch"], "vit_b_16")
        self.assertEqual((c["image_size"], c["num_heads"], c["depth"]), (224, 12, 12))
        np.testing.assert_allclose(c["mean"], [0.485, 0.456, 0.406], rtol=1e-6)

    def test_batch_1_and_3(self):
        want = torch_logits(self.model, self.x)
        self.assertLogits(self.vit(self.x[:1]), want[:1])
        self.assertLogits(self.vit(self.x), want)

    def test_other_image_size(self):
        m2 = gen_vit.at_image_size(self.model, 160)
        x = np.random.default_rng(2).standard_normal((2, 3, 160, 160)).astype(np.float32)
        self.assertLogits(self.vit(x), torch_logits(m2, x))

    def test_attention_maps(self):
        x = self.x[:1]
        attn, roll = self.vit.attention_maps(x)
        want = gen_vit.attention_probs(self.model, torch.from_numpy(x))
        np.testing.assert_allclose(attn, want, rtol=0, atol=1e-5)
        np.testing.assert_allclose(roll, gen_vit.rollout64(attn), rtol=0, atol=1e-5)

    def test_timm_names(self):
        sd = to_timm(self.model.state_dict())
        self.assertEqual(len(sd), len(self.model.state_dict()))
        x = self.x[:2]
        want = torch_logits(self.model, x)
        # Exported (timm names detected, timm mean/std defaults).
        pth = self.path("timm.pth")
        torch.save(sd, pth)
        out = self.path("timm.safetensors")
        export(pth, out)
        os.unlink(pth)
        vit = vitc.VisionTransformer.from_safetensors(out)
        self.assertEqual(vit.config["arch"], "vit_base_patch16_224")
        np.testing.assert_allclose(vit.config["mean"], [0.5] * 3)
        self.assertLogits(vit(x), want)
        del vit
        os.unlink(out)
        # No metadata at all: inferred (heads = 768 / 64), and by preset.
        bare = self.path("timm_bare.safetensors")
        st_write.write(bare, sd)
        for arch in (None, "vit_base_patch16_224"):
            with self.subTest(arch=arch):
                vit = vitc.VisionTransformer.from_safetensors(bare, arch=arch)
                self.assertEqual(vit.config["arch"], "vit_base_patch16_224")
                self.assertEqual(vit.config["num_heads"], 12)
                self.assertLogits(vit(x), want)
                del vit
        os.unlink(bare)


class TestExportTool(Base):
    def test_torchvision_random_init(self):
        out = self.path("b32.safetensors")
        export("--torchvision", "vit_b_32", "--random-init", "--seed", 7, "--dtype", "bf16", out)
        got = gen_vit.st_read(out)
        torch.manual_seed(7)
        sd = torchvision.models.vit_b_32().state_dict()
        self.assertEqual(sorted(got), sorted(sd))
        for k in ("conv_proj.weight", "encoder.pos_embedding",
                  "encoder.layers.encoder_layer_11.mlp.3.weight"):
            np.testing.assert_array_equal(got[k], sd[k].to(torch.bfloat16).float().numpy())
        vit = vitc.VisionTransformer.from_safetensors(out)
        self.assertEqual(vit.config["arch"], "vit_b_32")
        # torchvision ships the category names offline: a random model has them too
        self.assertEqual(list(vit.labels),
                         torchvision.models.ViT_B_32_Weights.DEFAULT.meta["categories"])
        os.unlink(out)

    def test_refuses_non_vit(self):
        pth = self.path("junk.pth")
        torch.save({"a.weight": torch.zeros(3)}, pth)
        r = subprocess.run([sys.executable, EXPORT, pth, self.path("junk.safetensors")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no Vision Transformer", r.stderr)


if __name__ == "__main__":
    unittest.main()
