"""Depth Anything (vitc.DepthAnything, `vitc depth`) against transformers:
random-weight DepthAnythingForDepthEstimation models saved with
save_pretrained (small V1-like and V2-like configs, a metric head, the
depth-anything-small shape once), their predicted_depth within 1e-4
relative (max |d| / max |ref|); the pipeline end to end on skimage's photos
against DPTImageProcessorPil + the model + post_process_depth_estimation;
the CLI's outputs; bad input refused in one line with nothing written.

The neck and head weights are redrawn at the scale of a trained network
(std 1/sqrt(fan_in)) and the last bias set positive, so the ReLU'd depth
is neither all zeros nor dominated by a constant.
"""
import json
import math
import os
import struct
import subprocess
import unittest
import zlib

import numpy as np

try:
    from .util import VITC, TmpDirCase
except ImportError:  # run as a script
    from util import VITC, TmpDirCase

try:
    import torch
    import skimage
    from PIL import Image
    from transformers import (DepthAnythingConfig, DepthAnythingForDepthEstimation,
                              Dinov2Config, DPTImageProcessorPil)
    HAVE_PEERS = True
except ImportError:  # pragma: no cover
    HAVE_PEERS = False

import vitc

PHOTOS = (os.path.join(os.path.dirname(skimage.__file__), "data", "astronaut.png"),
          os.path.join(os.path.dirname(skimage.__file__), "data", "coffee.png")) \
    if HAVE_PEERS else ()


def make_model(path, seed, out_indices, necks, factors, hidden=32, layers=4, heads=2,
               fusion=16, head_hidden=8, image_size=56, metric=False, mlp_ratio=2):
    torch.manual_seed(seed)
    bb = Dinov2Config(image_size=image_size, patch_size=14, hidden_size=hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      out_indices=out_indices, reshape_hidden_states=False, mlp_ratio=mlp_ratio)
    kw = dict(depth_estimation_type="metric", max_depth=20) if metric else {}
    cfg = DepthAnythingConfig(backbone_config=bb, reassemble_hidden_size=hidden,
                              neck_hidden_sizes=necks, reassemble_factors=factors,
                              fusion_hidden_size=fusion, head_hidden_size=head_hidden,
                              patch_size=14, **kw)
    m = DepthAnythingForDepthEstimation(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.startswith("backbone"):
                continue
            if p.ndim >= 2:  # ConvTranspose2d's fan-in is its first dim
                fan = p.shape[0] if "resize" in name and p.shape[-1] != 3 else p[0].numel()
                p.normal_(0, 1 / math.sqrt(fan))
            else:
                p.normal_(0, 0.1)
        m.head.conv3.bias.fill_(0.0 if metric else 1.0)
    m.save_pretrained(path)
    DPTImageProcessorPil(size={"height": 518, "width": 518}, keep_aspect_ratio=True,
                         ensure_multiple_of=14, resample=3, do_pad=False,
                         image_mean=[0.485, 0.456, 0.406],
                         image_std=[0.229, 0.224, 0.225]).save_pretrained(path)
    return m


def rel_err(got, ref):
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


@unittest.skipUnless(HAVE_PEERS, "needs torch, transformers, skimage and PIL")
class TestDepthAnything(TmpDirCase):
    TMP_PREFIX = "vitc_depth_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.v1 = os.path.join(cls.tmp, "v1")
        # V1-small reads the last four blocks; V2 spreads them (3, 6, 9, 12)
        cls.m_v1 = make_model(cls.v1, 0, [3, 4, 5, 6], [8, 16, 24, 32], [4, 2, 1, 0.5],
                              layers=6)
        cls.v2 = os.path.join(cls.tmp, "v2")
        cls.m_v2 = make_model(cls.v2, 1, [1, 3, 4, 6], [16, 16, 32, 48], [4, 2, 1, 0.5],
                              hidden=48, layers=6, heads=3, fusion=24, head_hidden=16)
        cls.metric = os.path.join(cls.tmp, "metric")
        cls.m_metric = make_model(cls.metric, 2, [2, 4], [8, 16], [2, 0.5], metric=True)

    def check_forward(self, path, model, sizes, batch=2):
        d = vitc.DepthAnything(path)
        gen = torch.Generator().manual_seed(7)
        for (h, w) in sizes:
            x = torch.randn(batch, 3, h, w, generator=gen)
            with torch.no_grad():
                ref = model(pixel_values=x).predicted_depth.numpy().astype(np.float64)
            got = d.forward(x.numpy())
            self.assertEqual(got.shape, ref.shape)
            self.assertGreater(ref.std(), 1e-3, "a degenerate reference")
            self.assertLess(rel_err(got, ref), 1e-4, "%s at %dx%d" % (path, h, w))

    def test_v1_like(self):
        self.check_forward(self.v1, self.m_v1, [(56, 56), (42, 70)])

    def test_v2_like(self):
        # 70 x 98: the position grid resampled from 4x4 to 5x7
        self.check_forward(self.v2, self.m_v2, [(70, 98), (28, 28)])

    def test_metric_head(self):
        self.check_forward(self.metric, self.m_metric, [(56, 84)])

    def test_depth_anything_small_shape(self):
        """DINOv2-S/14 (12 layers, 384 wide, 6 heads), the neck 48/96/192/384,
        fusion 64, head 32, at 518 x 518: depth-anything-small's config."""
        path = os.path.join(self.tmp, "small")
        m = make_model(path, 3, [9, 10, 11, 12], [48, 96, 192, 384], [4, 2, 1, 0.5],
                       hidden=384, layers=12, heads=6, fusion=64, head_hidden=32,
                       image_size=518, mlp_ratio=4)
        self.check_forward(path, m, [(518, 518)], batch=1)

    def test_other_paths(self):
        """The convolutions' other paths on the V2-like and metric models:
        VITC_DENSE=ref (the definitions as loops, conv3 as a layer of its
        own after a ReLU pass), OpenBLAS's GEMM and the AVX2 kernels (no
        row-wise forward: im2col), each in a process of its own (the
        environment is read once), against transformers and against the
        default path within the same 1e-4."""
        import sys
        gen = torch.Generator().manual_seed(5)
        x = torch.randn(2, 3, 42, 56, generator=gen)
        xp = os.path.join(self.tmp, "paths_x.npy")
        np.save(xp, x.numpy())
        code = ("import sys, numpy as np, vitc\n"
                "x = np.load(sys.argv[1])\n"
                "for i, m in enumerate(sys.argv[2:]):\n"
                "    np.save(sys.argv[1] + '.%d.npy' % i, vitc.DepthAnything(m).forward(x))\n")
        models = ((self.v2, self.m_v2), (self.metric, self.m_metric))
        refs = []
        for path, model in models:
            with torch.no_grad():
                refs.append(model(pixel_values=x).predicted_depth.numpy().astype(np.float64))
        fast = [vitc.DepthAnything(path).forward(x.numpy()) for path, _ in models]
        # (a build without OpenBLAS takes VITC_GEMM=openblas as the default)
        for extra in ({"VITC_DENSE": "ref"}, {"VITC_ARCH": "avx2"}, {"VITC_GEMM": "openblas"}):
            env = dict(os.environ, **extra)
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
            subprocess.run([sys.executable, "-c", code, xp] + [m for m, _ in models], env=env,
                           check=True)
            for i in range(len(models)):
                got = np.load(xp + ".%d.npy" % i)
                self.assertLess(rel_err(got, refs[i]), 1e-4, "%s, %s" % (extra, models[i][0]))
                self.assertLess(rel_err(got, fast[i].astype(np.float64)), 1e-4,
                                "%s against the default path, %s" % (extra, models[i][0]))

    def test_threads_share_a_model(self):
        """Concurrent forwards on one model (one takes the model's workspace,
        the others their own) give the numbers of one alone."""
        import threading
        d = vitc.DepthAnything(self.v2)
        gen = torch.Generator().manual_seed(11)
        xs = [torch.randn(1, 3, 42, 56, generator=gen).numpy() for _ in range(4)]
        want = [d.forward(x) for x in xs]
        got = [None] * len(xs)

        def work(i):
            for _ in range(3):
                got[i] = d.forward(xs[i])
        ts = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)

    def reference_pipeline(self, path, model, photo):
        proc = DPTImageProcessorPil.from_pretrained(path)
        img = Image.open(photo).convert("RGB")
        inp = proc(images=img, return_tensors="pt")
        with torch.no_grad():
            out = model(**inp)
        post = proc.post_process_depth_estimation(out, target_sizes=[(img.height, img.width)])
        return post[0]["predicted_depth"].numpy().astype(np.float64), inp["pixel_values"].shape

    def test_predict_python(self):
        d = vitc.DepthAnything(self.v1)
        for photo in PHOTOS:
            ref, shape = self.reference_pipeline(self.v1, self.m_v1, photo)
            img = Image.open(photo)
            self.assertEqual(d.input_size(img.width, img.height), tuple(shape[2:]))
            got = d.predict(np.asarray(img.convert("RGB")))
            self.assertEqual(got.shape, ref.shape)
            self.assertLess(rel_err(got, ref), 1e-4, photo)

    def run_cli(self, *args):
        p = subprocess.run([VITC, "depth"] + [str(a) for a in args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def test_cli_end_to_end(self):
        """coffee (600 x 400) goes through at 350 x 518: aspect kept."""
        for photo in PHOTOS:
            ref, _ = self.reference_pipeline(self.v2, self.m_v2, photo)
            tag = os.path.splitext(os.path.basename(photo))[0]
            out, npy, png16 = (self.path(tag + s) for s in (".png", ".npy", "-raw.png"))
            rc, so, se = self.run_cli("--model", self.v2, "--out", out, "--raw", npy, "--json",
                                      "--quiet", photo)
            self.assertEqual(rc, 0, se)
            got = np.load(npy)
            self.assertEqual(got.dtype, np.float32)
            self.assertLess(rel_err(got, ref), 1e-4, photo)
            info = json.loads(so)
            self.assertEqual((info["image"], info["height"], info["width"]),
                             (photo,) + ref.shape)
            self.assertAlmostEqual(info["min"], float(got.min()), places=5)
            self.assertAlmostEqual(info["max"], float(got.max()), places=5)
            pic = Image.open(out)
            self.assertEqual(pic.mode, "RGB")
            self.assertEqual(pic.height, ref.shape[0])
            self.assertGreater(pic.width, ref.shape[1])  # the legend beside the map
            a = np.asarray(pic)[:, :ref.shape[1]].astype(np.float64).sum(axis=2)
            # near (the largest relative depth) is bright
            self.assertGreater(a.flat[np.argmax(got)], a.flat[np.argmin(got)])
            rc, _, se = self.run_cli("--model", self.v2, "--raw", png16, "--quiet", photo)
            self.assertEqual(rc, 0, se)
            g = Image.open(png16)
            self.assertIn(g.mode, ("I;16", "I;16B", "I"))
            g = np.asarray(g).astype(np.float64)
            want = np.rint((got.astype(np.float64) - got.min()) / (got.max() - got.min())
                           * 65535)
            self.assertLessEqual(np.abs(g - want).max(), 1.0)
            self.assertEqual((g.min(), g.max()), (0.0, 65535.0))

    def huge_header_png(self, path, w, h):
        def chunk(kind, data):
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data)))
        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n"
                    + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(b"\0" * 7)) + chunk(b"IEND", b""))

    def test_bad_input(self):
        tiny = self.path("tiny.png")
        Image.new("RGB", (1, 1), (10, 20, 30)).save(tiny)
        huge = self.path("huge.png")
        self.huge_header_png(huge, 20000, 20000)
        vit_dir = os.path.join(self.tmp, "not-depth")
        os.makedirs(vit_dir, exist_ok=True)
        with open(os.path.join(vit_dir, "config.json"), "w") as f:
            json.dump({"model_type": "vit", "hidden_size": 32}, f)
        cases = [((self.v1, tiny), "smaller than one 14x14 patch"),
                 ((self.v1, huge), "20000"),
                 ((vit_dir, PHOTOS[0]), "not a Depth Anything model"),
                 ((os.path.join(self.tmp, "missing"), PHOTOS[0]), "config.json")]
        for (model, image), says in cases:
            out, raw = self.path("bad.png"), self.path("bad.npy")
            rc, so, se = self.run_cli("--model", model, "--out", out, "--raw", raw, "--json",
                                      image)
            self.assertEqual(rc, 1, se)
            self.assertEqual(so, "")
            self.assertEqual(len(se.strip().splitlines()), 1, se)
            self.assertIn(says, se)
            self.assertFalse(os.path.exists(out) or os.path.exists(raw), se)
        d = vitc.DepthAnything(self.v1)
        with self.assertRaises(vitc.VitcError) as e:
            d.forward(np.zeros((1, 3, 50, 56), np.float32))
        self.assertIn("multiples of the patch size 14", str(e.exception))
        with self.assertRaises(vitc.VitcError):
            d.predict(np.zeros((5, 5, 3), np.uint8))


if __name__ == "__main__":
    unittest.main()
