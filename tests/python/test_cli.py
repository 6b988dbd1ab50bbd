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
import unittest

import numpy as np

try:
    import torch
    import torchvision.transforms.functional as TF
    from PIL import Image
    from torchvision.models.vision_transformer import VisionTransformer
except ImportError:  # pragma: no cover
    torch = None

try:
    from .util import DATA, ROOT, VITC, TmpDirCase, export_cmd, run_vitc as run
except ImportError:  # run as a script
    from util import DATA, ROOT, VITC, TmpDirCase, export_cmd, run_vitc as run

sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))


def tiny_vit(seed, channels=None):
    """The tests' tiny torchvision ViT (48x48, patch 16, 2 layers, dim 32,
    12 classes, a head drawn wide enough to rank the classes), in eval mode;
    channels: a new patch embedding for that many channels."""
    torch.manual_seed(seed)
    m = VisionTransformer(image_size=48, patch_size=16, num_layers=2, num_heads=2,
                          hidden_dim=32, mlp_dim=64, num_classes=12)
    if channels is not None:
        m.conv_proj = torch.nn.Conv2d(channels, 32, 16, 16)
    torch.nn.init.normal_(m.heads.head.weight, std=0.5)
    torch.nn.init.normal_(m.heads.head.bias, std=0.5)
    return m.eval()


@unittest.skipIf(torch is None or not os.path.exists(VITC), "needs torch and build/vitc")
class TestCLI(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        d = cls.tmp
        cls.model = m = tiny_vit(0)
        pth = os.path.join(d, "tiny.pth")
        torch.save(m.state_dict(), pth)
        cls.labels = ["class %d" % i for i in range(11)] + ['tricky "quote" \\ é']
        labels = os.path.join(d, "labels.txt")
        with open(labels, "w", encoding="utf-8") as f:
            f.write("\n".join(cls.labels) + "\n")
        cls.st = os.path.join(d, "tiny.safetensors")
        cls.st_nolabels = os.path.join(d, "tiny_nolabels.safetensors")
        for out, extra in ((cls.st, ["--labels", labels]), (cls.st_nolabels, [])):
            subprocess.run(export_cmd(pth, out, *extra), check=True, stdout=subprocess.DEVNULL)
        cls.images = [os.path.join(DATA, n) for n in
                      ("photo.jpg", "photo.png", "rgb8.png", "gray8.png", "palette.png",
                       "rgba16.png", "progressive.jpg")]

    def torch_logits(self, path, resize=54, crop=48, model=None, gray=False,
                     mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
        img = np.array(Image.open(path).convert("RGB"))
        if path.endswith("16.png"):  # vitc keeps the high byte of 16-bit samples
            img = np.array(Image.open(path))[..., :3]  # PIL reads RGBA16 as RGBA8 (high byte)
        t = torch.from_numpy(img).permute(2, 0, 1).contiguous()
        if gray:  # a 1-channel model's transform: Grayscale first
            t = TF.rgb_to_grayscale(t)
        if resize:
            t = TF.resize(t, [resize], antialias=True)
        t = TF.center_crop(t, [crop])
        t = TF.normalize(TF.convert_image_dtype(t, torch.float), list(mean), list(std))
        with torch.no_grad():
            return (model or self.model)(t[None])[0].double()

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
        lab = self.path("other.txt")
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
        d = self.tmp
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
        d = self.tmp
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
                         self.path("never.png"), self.images[0]]):
                rc, out, err = run(*cmd)
                self.assertEqual(rc, 1, (cmd, err))
                self.assertTrue(err.startswith("vitc: error:"), (cmd, err))
                self.assertEqual(out, "")
        self.assertFalse(os.path.exists(self.path("never.png")))

    def test_attention_map_png_and_raw(self):
        d = self.tmp
        strips = {}
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
            # the caption strip: (7 + 10) * s rows under the panels, s = 240 // 112
            self.assertEqual(im.size[1], 48 * z + 17 * 2)
            strips[method] = arr[48 * z:]
            self.assertTrue(np.any(strips[method] < 100), "the caption strip is blank")
            m = np.load(raw)
            self.assertEqual(m.dtype, np.float32)
            self.assertEqual(m.shape, (3, 3))
            self.assertTrue(np.all(np.isfinite(m)))
            if method == "cls":
                # last layer's CLS attention over patches, mean of heads, from torch
                want = self.cls_attention()
                np.testing.assert_allclose(m.reshape(-1), want, atol=1e-5)
        # the caption names the method, so the two strips differ
        self.assertFalse(np.array_equal(strips["rollout"], strips["cls"]))

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

    # ---- issue 7: reliability ------------------------------------------

    def channel_model(self, channels, name, config):
        """The tiny ViT with a `channels`-channel patch embedding, written
        with the independent writer and `config` as its vitc.config."""
        import st_write
        m = tiny_vit(channels, channels)
        path = self.path(name)
        st_write.write(path, {k: v.numpy() for k, v in m.state_dict().items()},
                       {"vitc.config": json.dumps(config)})
        return m, path

    def test_gray_model_matches_torch_at_every_batch(self):
        # mean/std from the file (one value), else the first channel's default
        for config, mean, std in (({"num_heads": 2, "mean": [0.5], "std": [0.25]}, 0.5, 0.25),
                                  ({"num_heads": 2}, 0.485, 0.229)):
            m, path = self.channel_model(1, "gray.safetensors", config)
            images = self.images[:5]
            outs = []
            for batch in (1, 3):
                rc, out, err = run("classify", "--model", path, "--json", "--topk", 12,
                                   "--batch", batch, "--quiet", *images)
                self.assertEqual(rc, 0, err)
                outs.append(out)
                for line, img in zip(out.strip().split("\n"), images):
                    want = self.torch_logits(img, model=m, gray=True, mean=[mean], std=[std])
                    for e in json.loads(line)["topk"]:
                        self.assertAlmostEqual(e["logit"], float(want[e["index"]]), delta=1e-3)
            self.assertEqual(outs[0], outs[1])
        # the exporter writes a gray model's one-value mean/std
        pth = self.path("gray.pth")
        torch.save(m.state_dict(), pth)
        exported = self.path("gray_exported.safetensors")
        subprocess.run(export_cmd(pth, exported, "--mean", "0.485", "--std", "0.229"),
                       check=True, stdout=subprocess.DEVNULL)
        rc, out, err = run("classify", "--model", exported, "--json", "--topk", 12, "--batch", 3,
                           "--quiet", *images)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, outs[0])
        # attention-map: the left panel is the gray crop the model saw
        png = self.path("gray_am.png")
        rc, so, err = run("attention-map", "--model", path, "--out", png, self.images[0])
        self.assertEqual(rc, 0, err)
        arr = np.asarray(Image.open(png).convert("RGB"))[:48 * 5:5, :48 * 5:5]
        t = torch.from_numpy(np.array(Image.open(self.images[0]).convert("RGB")))
        g = TF.center_crop(TF.resize(TF.rgb_to_grayscale(t.permute(2, 0, 1)), [54],
                                     antialias=True), [48])[0].numpy()
        for c in range(3):
            np.testing.assert_array_equal(arr[..., c], g)

    def test_unsupported_channels_exit_1(self):
        for channels in (2, 4, 64):
            _, path = self.channel_model(channels, "c%d.safetensors" % channels,
                                         {"num_heads": 2})
            png = self.path("never_c.png")
            for cmd in (["classify", "--model", path, self.images[0]],
                        ["attention-map", "--model", path, "--out", png, self.images[0]]):
                rc, out, err = run(*cmd)
                self.assertEqual(rc, 1, (cmd, err))
                self.assertEqual(out, "")
                self.assertEqual(err.count("\n"), 1, err)
                self.assertTrue(err.startswith("vitc: error:"), err)
                self.assertIn("%d input channels" % channels, err)
            self.assertFalse(os.path.exists(png))

    def test_extreme_aspect_images_bounded(self):
        # 370 bytes of PNG, 100000x1: the whole resize was 2 GB, 1000000x1
        # ~20 GB. Peak RSS of vitc alone (a plain Python parent, no torch).
        probe = ("import json, resource, subprocess, sys, time\n"
                 "t = time.time()\n"
                 "p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, "
                 "stderr=subprocess.PIPE)\n"
                 "print(json.dumps([p.returncode, p.stderr.decode(), time.time() - t, "
                 "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))\n")
        for n in (100000, 1000000):
            for shape in ((1, n, 3), (n, 1, 3)):
                png = self.path("extreme_%dx%d.png" % shape[:2])
                Image.fromarray(np.full(shape, 90, np.uint8)).save(png)
                for cmd in (["classify", "--model", self.st, "--quiet", png],
                            ["attention-map", "--model", self.st, "--out",
                             png + ".map.png", png]):
                    p = subprocess.run([sys.executable, "-c", probe, VITC] + cmd,
                                       stdout=subprocess.PIPE, check=True)
                    rc, err, secs, rss_kb = json.loads(p.stdout)
                    self.assertIn(rc, (0, 1), (cmd, err))
                    if rc:
                        self.assertTrue(err.startswith("vitc: error:"), err)
                        self.assertEqual(err.count("\n"), 1, err)
                    self.assertLess(rss_kb, 100 * 1024, (cmd, rss_kb))
                    self.assertLess(secs, 5, cmd)

    def test_inspect_arch_mismatch_exits_1(self):
        # the file's vitc.config describes the tiny custom model
        for extra in ([], ["--json"]):
            rc, out, err = run("inspect", "--arch", "vit_b_16", *extra, self.st)
            self.assertEqual(rc, 1, err)
            self.assertEqual(out, "")
            self.assertIn("not a vit_b_16", err)
            self.assertEqual(err.count("\n"), 1, err)
        rc, out, err = run("inspect", self.st)
        self.assertEqual(rc, 0, err)
        self.assertIn("architecture: custom", out)

    def test_labels_control_characters_escaped(self):
        lab = self.path("evil.txt")
        names = ["\x1b[31mred\x1b[0m %d" % i for i in range(11)] + ["bell\x07 and \x7f"]
        names[3] = "carriage\rreturn"
        with open(lab, "w") as f:
            f.write("\n".join(names) + "\n")
        rc, out, err = run("classify", "--model", self.st, "--labels", lab, "--topk", 12,
                           self.images[0])
        self.assertEqual(rc, 0, err)
        for bad in ("\x1b", "\r", "\x07", "\x7f"):
            self.assertNotIn(bad, out)
        self.assertIn("\\x1b[31mred\\x1b[0m 0", out)
        self.assertIn("carriage\\x0dreturn", out)
        self.assertEqual(len(out.strip().split("\n")), 13)
        # the image path, printed as the header line, likewise
        odd = self.path("new\nline\x1b.png")
        with open(self.images[2], "rb") as src, open(odd, "wb") as dst:
            dst.write(src.read())
        rc, out, err = run("classify", "--model", self.st, "--topk", 1, odd)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split("\n")[0], odd.replace("\n", "\\n").replace("\x1b", "\\x1b"))

    def test_error_messages_one_line(self):
        bad = self.path("no\nsuch\x1b[2J.png")
        rc, out, err = run("classify", "--model", self.st, "--quiet", bad)
        self.assertEqual(rc, 1)
        lines = err.split("\n")
        self.assertTrue(lines[0].startswith("vitc: error:"), err)
        self.assertIn("no\\nsuch\\x1b[2J.png", lines[0])
        self.assertNotIn("\x1b", err)

    def test_every_numeric_option_is_strict(self):
        png = self.path("never_opt.png")
        base = {"classify": ["--model", self.st, self.images[0]],
                "attention-map": ["--model", self.st, "--out", png, self.images[0]],
                "bench": ["--no-peak"], "demo": []}
        numeric = {"classify": ["--topk", "--crop", "--resize", "--batch", "--threads"],
                   "attention-map": ["--alpha", "--crop", "--resize", "--threads"],
                   "bench": ["--threads", "--repeat"], "demo": ["--threads", "--repeat"]}
        bad = ["", "1x", "x1", " 5", "5 ", "5\n", "nan", "inf", "-inf", "-1", "1e999",
               "99999999999999999999", "2147483648", "1.5e3x", "0x"]
        for cmd, opts in numeric.items():
            for opt in opts:
                for v in bad + (["2", "1.01"] if opt == "--alpha" else ["1.5", "0.5"]):
                    for args in ([opt, v], [opt + "=" + v]):
                        rc, out, err = run(cmd, *(args + base[cmd]))
                        self.assertEqual(rc, 2, (cmd, args, err))
                        self.assertEqual(out, "")
                        lines = err.split("\n")
                        self.assertTrue(lines[0].startswith("vitc: error: '%s' wants" % opt),
                                        (cmd, args, err))
                        self.assertTrue(lines[1].startswith("Try 'vitc %s --help'" % cmd), err)
                        self.assertEqual(len(lines), 3, err)
        self.assertFalse(os.path.exists(png))
        # the bounds themselves are accepted
        rc, out, err = run("classify", "--model", self.st, "--resize", "0", "--topk", "1",
                           "--batch", "4096", "--threads", "1", "--json", self.images[0])
        self.assertEqual(rc, 0, err)
        rc, out, err = run("attention-map", "--model", self.st, "--out", png, "--alpha=1",
                           "--crop", "48", self.images[0])
        self.assertEqual(rc, 0, err)
        # and the other usage errors the one parser reports
        for args in (["--json=1"], ["--topk"], ["--bogus"], ["-x"]):
            rc, out, err = run("classify", *(args + base["classify"]))
            self.assertEqual(rc, 2, (args, err))
        for cmd in (["inspect", self.st, self.st], ["demo", "extra"], ["bench", "extra"],
                    ["inspect", "--full=x", self.st]):
            rc, out, err = run(*cmd)
            self.assertEqual(rc, 2, (cmd, err))
            self.assertTrue(err.startswith("vitc: error:"), err)


if __name__ == "__main__":
    unittest.main()
