"""The `vitc classify` and `vitc attention-map` commands end to end.

A tiny torchvision VisionTransformer (random weights, head re-initialised so
the logits are spread out) is exported with tools/export_safetensors.py; the
CLI's JSON is checked against torch on the same images with torchvision's
preprocessing (tensor path, antialias=True).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

try:
    import torch
    import torchvision.transforms.functional as TF
    from PIL import Image
    from torchvision.models.vision_transformer import VisionTransformer
except ImportError:  # pragma: no cover
    torch = None

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VITC = os.path.join(ROOT, "build", "vitc")
DATA = os.path.join(ROOT, "tests", "data")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))


def run(*args):
    p = subprocess.run([VITC] + [str(a) for a in args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


@unittest.skipIf(torch is None or not os.path.exists(VITC), "needs torch and build/vitc")
class TestCLI(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        torch.manual_seed(0)
        m = VisionTransformer(image_size=48, patch_size=16, num_layers=2, num_heads=2,
                              hidden_dim=32, mlp_dim=64, num_classes=12)
        torch.nn.init.normal_(m.heads.head.weight, std=0.5)
        torch.nn.init.normal_(m.heads.head.bias, std=0.5)
        m.eval()
        cls.model = m
        pth = os.path.join(d, "tiny.pth")
        torch.save(m.state_dict(), pth)
        cls.labels = ["class %d" % i for i in range(11)] + ['tricky "quote" \\ é']
        labels = os.path.join(d, "labels.txt")
        with open(labels, "w", encoding="utf-8") as f:
            f.write("\n".join(cls.labels) + "\n")
        cls.st = os.path.join(d, "tiny.safetensors")
        cls.st_nolabels = os.path.join(d, "tiny_nolabels.safetensors")
        for out, extra in ((cls.st, ["--labels", labels]), (cls.st_nolabels, [])):
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_safetensors.py"),
                            pth, out, "--num-heads", "2"] + extra,
                           check=True, stdout=subprocess.DEVNULL)
        cls.images = [os.path.join(DATA, n) for n in
                      ("photo.jpg", "photo.png", "rgb8.png", "gray8.png", "palette.png",
                       "rgba16.png", "progressive.jpg")]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def torch_logits(self, path, resize=54, crop=48):
        img = np.array(Image.open(path).convert("RGB"))
        if path.endswith("16.png"):  # vitc keeps the high byte of 16-bit samples
            img = np.array(Image.open(path))[..., :3]  # PIL reads RGBA16 as RGBA8 (high byte)
        t = torch.from_numpy(img).permute(2, 0, 1).contiguous()
        if resize:
            t = TF.resize(t, [resize], antialias=True)
        t = TF.center_crop(t, [crop])
        t = TF.normalize(TF.convert_image_dtype(t, torch.float), [0.485, 0.456, 0.406],
                         [0.229, 0.224, 0.225])
        with torch.no_grad():
            return self.model(t[None])[0].double()

    def check_json(self, out, paths, k, labels, resize=54, crop=48):
        lines = out.strip().split("\n")
        self.assertEqual(len(lines), len(paths))
        for line, path in zip(lines, paths):
            obj = json.loads(line)
            self.assertEqual(sorted(obj), ["image", "topk"])
            self.assertEqual(obj["image"], path)
            self.assertEqual(len(obj["topk"]), k)
            logits = self.torch_logits(path, resize, crop)
            prob = torch.softmax(logits, 0)
            want = torch.topk(logits, k).indices.tolist()
            got = [e["index"] for e in obj["topk"]]
            self.assertEqual(got, want, path)
            for e in obj["topk"]:
                self.assertEqual(sorted(e), ["index", "label", "logit", "prob"])
                self.assertAlmostEqual(e["logit"], float(logits[e["index"]]), delta=1e-3)
                self.assertAlmostEqual(e["prob"], float(prob[e["index"]]), delta=1e-4)
                self.assertEqual(e["label"], labels[e["index"]] if labels else None)

    def test_classify_json_matches_torch(self):
        # 7 images in batches of 3: full batches and a partial one
        rc, out, err = run("classify", "--model", self.st, "--json", "--topk", 4, "--batch", 3,
                           "--quiet", *self.images)
        self.assertEqual(rc, 0, err)
        self.check_json(out, self.images, 4, self.labels)

    def test_classify_labels_file_and_none(self):
        rc, out, err = run("classify", "--model", self.st_nolabels, "--json", "--topk", 3,
                           self.images[0])
        self.assertEqual(rc, 0, err)
        self.check_json(out, self.images[:1], 3, None)
        lab = os.path.join(self.tmp.name, "other.txt")
        names = ["n%02d" % i for i in range(12)]
        with open(lab, "w") as f:
            f.write("\r\n".join(names) + "\r\n")
        rc, out, err = run("classify", "--model", self.st, "--labels", lab, "--json",
                           self.images[0])
        self.assertEqual(rc, 0, err)
        self.check_json(out, self.images[:1], 5, names)
        with open(lab, "w") as f:
            f.write("a\nb\n")
        rc, out, err = run("classify", "--model", self.st, "--labels", lab, self.images[0])
        self.assertEqual(rc, 1)
        self.assertIn("vitc: error:", err)

    def test_classify_resize_crop_topk_clamp(self):
        # rgb8.png is 37x23: no resize, the 48 crop pads it
        rc, out, err = run("classify", "--model", self.st, "--json", "--resize", 0,
                           "--topk", 50, self.images[2])
        self.assertEqual(rc, 0, err)
        self.check_json(out, self.images[2:3], 12, self.labels, resize=0, crop=48)
        # another crop size: position embeddings interpolated (torchvision cannot run it)
        rc, out, err = run("classify", "--model", self.st, "--json", "--crop", 32,
                           self.images[0])
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(json.loads(out)["topk"]), 5)

    def test_classify_text_output(self):
        rc, out, err = run("classify", "--model", self.st, "--topk", 2, self.images[0])
        self.assertEqual(rc, 0, err)
        lines = out.strip().split("\n")
        self.assertEqual(lines[0], self.images[0])
        self.assertEqual(len(lines), 3)
        want = torch.topk(self.torch_logits(self.images[0]), 2).indices.tolist()
        self.assertIn("class %4d" % want[0], lines[1])

    def test_json_escaping(self):
        d = self.tmp.name
        odd = os.path.join(d, 'we"ird\\na\tme é.png')
        with open(self.images[2], "rb") as src, open(odd, "wb") as dst:
            dst.write(src.read())
        rc, out, err = run("classify", "--model", self.st, "--json", odd)
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["image"], odd)

    def test_bad_image_continues_exit_1(self):
        imgs = [self.images[0], os.path.join(DATA, "truncated.png"),
                os.path.join(DATA, "not_an_image.png"), self.images[2]]
        rc, out, err = run("classify", "--model", self.st, "--json", "--batch", 2, *imgs)
        self.assertEqual(rc, 1)
        self.assertIn("vitc: error:", err)
        self.assertIn("truncated.png", err)
        self.assertIn("not_an_image.png", err)
        self.check_json(out, [imgs[0], imgs[3]], 5, self.labels)

    def test_usage_errors_exit_2(self):
        for args in ([], ["--model", self.st], [self.images[0]],
                     ["--model", self.st, "--topk", "x", self.images[0]],
                     ["--model", self.st, "--topk", "0", self.images[0]],
                     ["--model", self.st, "--bogus", self.images[0]],
                     ["--model"]):
            rc, out, err = run("classify", *args)
            self.assertEqual(rc, 2, args)
            self.assertIn("vitc: error:", err)
        rc, out, err = run("classify", "--help")
        self.assertEqual(rc, 0)
        self.assertIn("--topk", out)
        for args in ([], ["--model", self.st, self.images[0]],
                     ["--model", self.st, "--out", "x.png"],
                     ["--model", self.st, "--out", "x.png", "--method", "foo", self.images[0]],
                     ["--model", self.st, "--out", "x.png", "--alpha", "2", self.images[0]],
                     ["--model", self.st, "--out", "x.png", self.images[0], self.images[1]]):
            rc, out, err = run("attention-map", *args)
            self.assertEqual(rc, 2, args)
            self.assertIn("vitc: error:", err)

    def corrupt_models(self):
        d = self.tmp.name
        with open(self.st, "rb") as f:
            raw = f.read()
        hlen = struct.unpack("<Q", raw[:8])[0]
        files = {}
        files["truncated"] = raw[: len(raw) // 2]
        files["lying_header"] = struct.pack("<Q", 1 << 40) + raw[8:]
        files["header_only"] = raw[: 8 + hlen]
        files["empty"] = b""
        files["garbage_json"] = struct.pack("<Q", 16) + b"{not json at all"
        # wrong shapes: a valid file whose conv_proj has the wrong kernel
        import st_write
        sd = {k: v.numpy() for k, v in self.model.state_dict().items()}
        sd["conv_proj.weight"] = np.zeros((32, 3, 8, 8), np.float32)
        st_write.write(os.path.join(d, "wrong_shape.safetensors"), sd)
        sd2 = {k: v.numpy() for k, v in self.model.state_dict().items()}
        del sd2["encoder.layers.encoder_layer_1.ln_2.weight"]
        st_write.write(os.path.join(d, "missing_key.safetensors"), sd2)
        paths = [os.path.join(d, "wrong_shape.safetensors"),
                 os.path.join(d, "missing_key.safetensors")]
        for name, b in files.items():
            p = os.path.join(d, name + ".safetensors")
            with open(p, "wb") as f:
                f.write(b)
            paths.append(p)
        return paths

    def test_corrupt_models_exit_1(self):
        for p in self.corrupt_models() + [os.path.join(DATA, "photo.jpg"), "/nonexistent.st"]:
            for cmd in (["classify", "--model", p, "--arch", "vit_b_16", self.images[0]],
                        ["classify", "--model", p, self.images[0]],
                        ["attention-map", "--model", p, "--out",
                         os.path.join(self.tmp.name, "never.png"), self.images[0]]):
                rc, out, err = run(*cmd)
                self.assertEqual(rc, 1, (cmd, err))
                self.assertTrue(err.startswith("vitc: error:"), (cmd, err))
                self.assertEqual(out, "")
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "never.png")))

    def test_attention_map_png_and_raw(self):
        d = self.tmp.name
        for method in ("rollout", "cls"):
            out = os.path.join(d, "am_%s.png" % method)
            raw = os.path.join(d, "am_%s.npy" % method)
            rc, so, err = run("attention-map", "--model", self.st, "--method", method,
                              "--out", out, "--raw", raw, self.images[0])
            self.assertEqual(rc, 0, err)
            im = Image.open(out)
            im.load()
            self.assertEqual(im.mode, "RGB")
            # [image | overlay | scale]: a 48 crop is shown 5x (at least 224 pixels)
            z = 5
            self.assertGreater(im.size[0], 2 * 48 * z)
            self.assertGreaterEqual(im.size[1], 48 * z)
            arr = np.asarray(im)
            # the left panel is the preprocessed image itself
            img = np.array(Image.open(self.images[0]).convert("RGB"))
            t = torch.from_numpy(img).permute(2, 0, 1).contiguous()
            t = TF.center_crop(TF.resize(t, [54], antialias=True), [48]).permute(1, 2, 0).numpy()
            np.testing.assert_array_equal(arr[:48 * z, :48 * z], t.repeat(z, 0).repeat(z, 1))
            m = np.load(raw)
            self.assertEqual(m.dtype, np.float32)
            self.assertEqual(m.shape, (3, 3))
            self.assertTrue(np.all(np.isfinite(m)))
            if method == "cls":
                # last layer's CLS attention over patches, mean of heads, from torch
                want = self.cls_attention()
                np.testing.assert_allclose(m.reshape(-1), want, atol=1e-5)

    def cls_attention(self):
        img = np.array(Image.open(self.images[0]).convert("RGB"))
        t = torch.from_numpy(img).permute(2, 0, 1).contiguous()
        t = TF.center_crop(TF.resize(t, [54], antialias=True), [48])
        x = TF.normalize(TF.convert_image_dtype(t, torch.float), [0.485, 0.456, 0.406],
                         [0.229, 0.224, 0.225])[None]
        m = self.model
        with torch.no_grad():
            h = m._process_input(x)
            h = torch.cat([m.class_token.expand(1, -1, -1), h], 1) + m.encoder.pos_embedding
            layers = list(m.encoder.layers)
            for layer in layers[:-1]:
                h = layer(h)
            last = layers[-1]
            y = last.ln_1(h)
            _, w = last.self_attention(y, y, y, need_weights=True, average_attn_weights=True)
        return w[0, 0, 1:].numpy()


if __name__ == "__main__":
    unittest.main()
