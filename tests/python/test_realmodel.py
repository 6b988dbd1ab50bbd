"""The first hour with a real model: the exporter offline, torchvision's
ImageNet labels, and the warning for an all-zero classification head."""
import json
import os
import struct
import subprocess
import sys
import unittest
import warnings

import numpy as np

from tests.python.util import EXPORT, ROOT, TmpDirCase, run_vitc

try:
    import torch
    import torchvision
except ImportError:  # the C-only setups
    torch = None

PHOTO = os.path.join(ROOT, "tests", "data", "gray.jpg")


def metadata_config(path):
    with open(path, "rb") as f:
        n, = struct.unpack("<Q", f.read(8))
        return json.loads(json.loads(f.read(n))["__metadata__"]["vitc.config"])


def export(*args, env=None):
    return subprocess.run([sys.executable, EXPORT] + list(args), capture_output=True, text=True,
                          timeout=300, env=env)


@unittest.skipIf(torch is None, "the exporter needs torch and torchvision")
class TestRealModel(TmpDirCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.categories = torchvision.models.ViT_B_16_Weights.IMAGENET1K_V1.meta["categories"]

    def small_checkpoint(self, name, num_classes=1000, zero_head=True):
        """A tiny torchvision ViT's state_dict: torchvision zeroes its head."""
        torch.manual_seed(0)
        m = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1,
                                                 num_heads=2, hidden_dim=8, mlp_dim=16,
                                                 num_classes=num_classes)
        if not zero_head:
            torch.nn.init.normal_(m.heads.head.weight)
        p = self.path(name)
        torch.save(m.state_dict(), p)
        return p

    def test_download_without_network_is_one_line(self):
        # an empty torch hub cache and a proxy on the discard port: the
        # download is refused at once, as on a machine with no network
        env = dict(os.environ, TORCH_HOME=self.path("torch_home"), https_proxy="http://127.0.0.1:9",
                   HTTPS_PROXY="http://127.0.0.1:9", no_proxy="", NO_PROXY="")
        r = export("--torchvision", "vit_b_32", self.path("vit_b_32.safetensors"), env=env)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        err = [l for l in r.stderr.splitlines() if l.startswith("export_safetensors:")]
        self.assertEqual(len(err), 1, r.stderr)
        self.assertIn("curl -LO https://download.pytorch.org/models/vit_b_32-d86f8d99.pth", err[0])
        self.assertIn("export_safetensors.py vit_b_32-d86f8d99.pth OUT.safetensors", err[0])
        self.assertIn("--random-init", err[0])
        self.assertFalse(os.path.exists(self.path("vit_b_32.safetensors")))

    def test_torchvision_checkpoint_labels(self):
        pth = self.small_checkpoint("tv1000.pth")
        out = self.path("tv1000.safetensors")
        r = export(pth, out, "--num-heads", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(metadata_config(out)["labels"], self.categories)
        self.assertIn("labels: torchvision's ImageNet-1k", r.stdout)
        r = export(pth, out, "--num-heads", "2", "--labels", "none")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("labels", metadata_config(out))
        # another task's 10 classes: no guess
        pth10 = self.small_checkpoint("tv10.pth", num_classes=10)
        r = export(pth10, out, "--num-heads", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("labels", metadata_config(out))
        r = export(pth10, out, "--num-heads", "2", "--labels", "imagenet")
        self.assertEqual(r.returncode, 1)
        self.assertIn("1000 labels for 10 classes", r.stderr)

    def test_zero_head_warns_once(self):
        import vitc
        for zero in (True, False):
            pth = self.small_checkpoint("h%d.pth" % zero, zero_head=zero)
            out = self.path("h%d.safetensors" % zero)
            r = export(pth, out, "--num-heads", "2")
            self.assertEqual(r.returncode, 0, r.stderr)
            rc, _, err = run_vitc("classify", "--model", out, "--batch", "1", PHOTO, PHOTO)
            self.assertEqual(rc, 0, err)
            self.assertEqual(err.count("classification head is all zeros"), 1 if zero else 0, err)
            m = vitc.load_model(out)
            x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                m(x)
                m(x)
            flat = [x for x in w if "classification head is all zeros" in str(x.message)]
            self.assertEqual(len(flat), 1 if zero else 0)


class TestPythonFirstHour(TmpDirCase):

    def test_all_lists_public_api(self):
        import vitc
        for name in ("VisionTransformer", "Model", "load_model", "preprocess_image",
                     "load_safetensors", "MultiheadAttention", "AdamW", "VitcError", "lr"):
            self.assertIn(name, vitc.__all__)
        self.assertEqual([n for n in vitc.__all__ if not hasattr(vitc, n)], [])
        self.assertEqual(len(set(vitc.__all__)), len(vitc.__all__))

    def test_preprocess_torchvision_is_its_eval_transform(self):
        import vitc
        m = vitc.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2,
                                   hidden_dim=8, mlp_dim=16, num_classes=3)
        x = m.preprocess(PHOTO)
        self.assertEqual(x.shape, (3, 32, 32))
        np.testing.assert_array_equal(
            x, vitc.preprocess_image(PHOTO, resize=36, crop=32, mean=m.config["mean"],
                                     std=m.config["std"]))
        self.assertEqual(m.preprocess(PHOTO, resize=0, crop=48).shape, (3, 48, 48))
        if torch is None:
            return
        from PIL import Image
        from torchvision import transforms as T
        tf = T.Compose([T.Resize(36, interpolation=T.InterpolationMode.BILINEAR, antialias=True),
                        T.CenterCrop(32), T.ToTensor(), T.Normalize(m.config["mean"], m.config["std"])])
        ref = tf(Image.open(PHOTO).convert("RGB")).numpy()
        # vitc's uint8 resize may differ from torchvision's by one step: 1/255/std
        self.assertLess(np.abs(x - ref).max(), 1.01 / 255 / min(m.config["std"]))

    def test_preprocess_timm_says_how(self):
        import vitc
        if torch is None:
            self.skipTest("the timm-named file is written with torch")
        # hidden_dim 64: a file without vitc.config gets num_heads = hidden_dim / 64
        m = vitc.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=1,
                                   hidden_dim=64, mlp_dim=16, num_classes=3)
        sd = {k.replace("heads.head", "head"): v for k, v in m.state_dict().items()}
        # the same weights under timm's names
        timm_sd = {"cls_token": sd["class_token"], "pos_embed": sd["encoder.pos_embedding"],
                   "patch_embed.proj.weight": sd["conv_proj.weight"],
                   "patch_embed.proj.bias": sd["conv_proj.bias"],
                   "norm.weight": sd["encoder.ln.weight"], "norm.bias": sd["encoder.ln.bias"],
                   "head.weight": sd["head.weight"], "head.bias": sd["head.bias"]}
        b, t = "encoder.layers.encoder_layer_0.", "blocks.0."
        for a, c in (("ln_1", "norm1"), ("ln_2", "norm2"), ("self_attention.out_proj", "attn.proj"),
                     ("mlp.0", "mlp.fc1"), ("mlp.3", "mlp.fc2")):
            for w in ("weight", "bias"):
                timm_sd[t + c + "." + w] = sd[b + a + "." + w]
        timm_sd[t + "attn.qkv.weight"] = sd[b + "self_attention.in_proj_weight"]
        timm_sd[t + "attn.qkv.bias"] = sd[b + "self_attention.in_proj_bias"]
        p = self.path("timm.safetensors")
        vitc.save_safetensors(p, timm_sd)
        tm = vitc.load_model(p)
        self.assertEqual(tm.config["family"], "timm")
        with self.assertRaisesRegex(ValueError, r"m\.preprocess\(image, resize=248, crop=224\)"):
            tm.preprocess(PHOTO)
        self.assertEqual(tm.preprocess(PHOTO, resize=36, crop=32).shape, (3, 32, 32))

    def test_trained_model_saves_labels_mean_std(self):
        import vitc
        names = ["cat", "dog", "eel"]
        m = vitc.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2,
                                   hidden_dim=8, mlp_dim=16, num_classes=3, mean=[0.5, 0.4, 0.3],
                                   std=0.25, labels=names)
        p = self.path("trained.safetensors")
        m.save(p)
        back = vitc.VisionTransformer.from_safetensors(p)
        self.assertEqual(back.labels, names)
        np.testing.assert_allclose(back.config["mean"], [0.5, 0.4, 0.3], rtol=1e-6)
        np.testing.assert_allclose(back.config["std"], [0.25] * 3, rtol=1e-6)
        for k, v in m.state_dict().items():
            np.testing.assert_array_equal(back.state_dict()[k], v)
        rc, out, err = run_vitc("classify", "--model", p, "--topk", "1", PHOTO)
        self.assertEqual(rc, 0, err)
        self.assertTrue(any(n in out for n in names), out)
        back.labels = ["a", "b", "c"]
        back.save(p)
        self.assertEqual(vitc.VisionTransformer.from_safetensors(p).labels, ["a", "b", "c"])
        with self.assertRaisesRegex(ValueError, "2 names for 3 classes"):
            back.labels = ["a", "b"]


if __name__ == "__main__":
    unittest.main()
