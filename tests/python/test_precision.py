"""bf16 and int8 inference against fp32 (and fp32 against PyTorch) on a small
random ViT: real photos (tests/data) and noise images. The tolerances are
the accuracy docs/precision.md states, with margin over what was measured."""
import json
import os
import subprocess
import sys
import unittest

import numpy as np

import vitc

try:
    import torch
    from torchvision.models.vision_transformer import VisionTransformer as TVViT
except ImportError:  # pragma: no cover
    torch = None

try:
    from .util import DATA, EXPORT, ROOT, TmpDirCase, reference_modules
except ImportError:  # run as a script
    from util import DATA, EXPORT, ROOT, TmpDirCase, reference_modules

gen_vit, = reference_modules("gen_vit")

PHOTOS = ["photo.png", "photo.jpg", "progressive.jpg", "rgb444.jpg", "gray.jpg"]
SIZE = 64


def photo_batch():
    """Crops of the test photos at SIZE x SIZE (several offsets, scales and
    flips each), normalised with ImageNet's statistics."""
    mean = np.array(vitc.image.IMAGENET_MEAN, np.float32)[:, None, None]
    std = np.array(vitc.image.IMAGENET_STD, np.float32)[:, None, None]
    out = []
    for name in PHOTOS:
        img = vitc.load_image(os.path.join(DATA, name)).astype(np.float32) / 255.0
        h, w, _ = img.shape
        for frac in (1.0, 0.6):
            s = max(1, int(min(h, w) * frac))
            for oy, ox in ((0, 0), (h - s, w - s), ((h - s) // 2, (w - s) // 2)):
                crop = img[oy:oy + s, ox:ox + s]
                idx = (np.arange(SIZE) * s) // SIZE  # nearest-neighbour resize
                x = crop[idx][:, idx].transpose(2, 0, 1)
                out.append(x)
                out.append(x[:, :, ::-1])
    return (np.stack(out) - mean) / std


def stats(got, ref):
    """Relative L2 error of the logits, top-1 agreement, mean top-5 overlap."""
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    top1 = np.mean(np.argmax(got, 1) == np.argmax(ref, 1))
    t5g = np.argsort(-got, 1)[:, :5]
    t5r = np.argsort(-ref, 1)[:, :5]
    top5 = np.mean([len(set(a) & set(b)) / 5.0 for a, b in zip(t5g, t5r)])
    return rel, top1, top5


# (max relative logits error, min top-1 agreement) per precision.
TOL = {"bf16": (0.01, 0.93), "int8": (0.04, 0.85)}


@unittest.skipIf(torch is None, "torch/torchvision not installed")
class TestPrecision(TmpDirCase):
    CFG = dict(image_size=SIZE, patch_size=8, num_layers=4, num_heads=4, hidden_dim=128,
               mlp_dim=384, num_classes=100)

    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(2)
        super().setUpClass()
        torch.manual_seed(0)
        cls.model = gen_vit.reinit_head(gen_vit.randomize(TVViT(**cls.CFG), 21), 22).eval()
        pth = os.path.join(cls.tmp, "m.pth")
        cls.st = os.path.join(cls.tmp, "m.safetensors")
        torch.save(cls.model.state_dict(), pth)
        r = subprocess.run([sys.executable, EXPORT, pth, cls.st, "--num-heads", "4"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(r.stderr)
        rng = np.random.default_rng(5)
        cls.photos = photo_batch().astype(np.float32)
        cls.noise = rng.standard_normal((32, 3, SIZE, SIZE)).astype(np.float32)
        with torch.no_grad():
            cls.torch_photos = cls.model(torch.from_numpy(cls.photos)).numpy()
        cls.fp32 = vitc.VisionTransformer.from_safetensors(cls.st)
        cls.ref = {"photos": cls.fp32(cls.photos), "noise": cls.fp32(cls.noise)}

    def test_fp32_matches_torch(self):
        got, want = self.ref["photos"], self.torch_photos
        err = np.abs(got - want).max()
        self.assertLess(err, 1e-3 * max(1.0, np.abs(want).max()))
        np.testing.assert_array_equal(np.argmax(got, 1), np.argmax(want, 1))

    def check(self, prec):
        m = vitc.VisionTransformer.from_safetensors(self.st, precision=prec)
        self.assertEqual(m.precision, prec)
        max_rel, min_top1 = TOL[prec]
        for name, x in (("photos", self.photos), ("noise", self.noise)):
            got = m(x)
            rel, top1, top5 = stats(got, self.ref[name])
            print("\n%s %s: %d images, relative logits error %.4f, top-1 agreement %.3f, "
                  "top-5 overlap %.3f" % (prec, name, len(x), rel, top1, top5), file=sys.stderr)
            self.assertLess(rel, max_rel)
            self.assertGreaterEqual(top1, min_top1)
            self.assertGreater(rel, 0.0)  # it did run in another precision
            # batch independent: rows are quantized on their own (bitwise with the
            # built-in GEMM; OpenBLAS's fp32 embedding and head block by batch)
            np.testing.assert_allclose(m(x[:3]), got[:3], rtol=1e-4, atol=1e-5)
        return m

    def test_bf16(self):
        self.check("bf16")

    def test_int8(self):
        self.check("int8")

    def test_switch_and_weights(self):
        m = vitc.VisionTransformer.from_safetensors(self.st)
        before = m.state_dict()
        m.precision = "bf16"
        a = m(self.photos[:4])
        m.precision = "fp32"  # the weights are bf16 values now
        b = m(self.photos[:4])
        w = m.state_dict()["encoder.layers.encoder_layer_0.mlp.0.weight"]
        w0 = before["encoder.layers.encoder_layer_0.mlp.0.weight"]
        self.assertLess(np.abs(w - w0).max(), np.abs(w0).max() / 128)
        bits = w.view(np.uint32)
        self.assertTrue((bits & 0xFFFF == 0).all(), "fp32 weights after bf16 should be bf16 values")
        # fp32 on bf16 weights: close to the bf16 forward (activations not rounded)
        self.assertLess(np.linalg.norm(a - b) / np.linalg.norm(b), 0.02)
        # fp32 packing is exact: state_dict after a forward is the weights
        f = vitc.VisionTransformer.from_safetensors(self.st)
        f(self.photos[:2])
        for k, v in f.state_dict().items():
            np.testing.assert_array_equal(v, before[k], err_msg=k)

    @unittest.skipUnless(os.path.exists(os.path.join(ROOT, "build", "vitc")), "needs build/vitc")
    def test_cli(self):
        vitc_bin = os.path.join(ROOT, "build", "vitc")

        def run(*args):
            p = subprocess.run([vitc_bin] + list(args), capture_output=True, text=True)
            return p.returncode, p.stdout, p.stderr

        rc, out, _ = run("--version")
        self.assertEqual(rc, 0)
        self.assertIn("bf16: ", out)
        self.assertIn("int8: ", out)
        photo = os.path.join(DATA, "photo.png")
        tops = {}
        for prec in ("fp32", "bf16", "int8"):
            rc, out, err = run("classify", "--model", self.st, "--precision", prec, "--topk", "1",
                               "--json", "--quiet", photo)
            self.assertEqual(rc, 0, err)
            tops[prec] = json.loads(out)["topk"][0]["logit"]
        self.assertNotEqual(tops["fp32"], tops["int8"])
        self.assertLess(abs(tops["int8"] - tops["fp32"]), 0.1 * abs(tops["fp32"]) + 0.1)
        rc, _, err = run("classify", "--model", self.st, "--precision", "fp16", photo)
        self.assertEqual(rc, 2)
        self.assertIn("--precision", err)
        out_png = self.path("map.png")
        rc, _, err = run("attention-map", "--model", self.st, "--precision", "bf16", "--out",
                         out_png, photo)
        self.assertEqual(rc, 0, err)
        self.assertTrue(os.path.getsize(out_png) > 0)

    @unittest.skipUnless(os.path.exists(os.path.join(ROOT, "build", "vitc")), "needs build/vitc")
    def test_cli_lp_kernel(self):
        """VITC_LP_KERNEL=amx-emulated runs the AMX kernel source on the C
        emulation of the tile instructions: vitc --version says so, int8
        logits are the default path's bit for bit (exact sums), bf16's
        close (another order of the fp32 sums); an unknown name is
        ignored, and said to be."""
        vitc_bin = os.path.join(ROOT, "build", "vitc")

        def run(kernel, *args):
            env = dict(os.environ)
            env.pop("VITC_LP_KERNEL", None)
            if kernel:
                env["VITC_LP_KERNEL"] = kernel
            p = subprocess.run([vitc_bin] + list(args), capture_output=True, text=True, env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            return p.stdout

        self.assertIn("bf16: amx-emulated", run("amx-emulated", "--version"))
        self.assertIn("VITC_LP_KERNEL=bogus unknown: ignored", run("bogus", "--version"))
        # A default int8 kernel on weights in [-64, 64] (avx2-w7, CPUs
        # without VNNI) packs other values than amx-emulated's [-127, 127]:
        # int8 is then compared with the reference, packed as amx-emulated.
        w7 = "int8: avx2-w7" in run(None, "--version")
        photo = os.path.join(DATA, "photo.png")
        fp32 = None
        for prec in ("fp32", "int8", "bf16"):
            got = {}
            for kernel in (None, "amx-emulated"):
                if kernel is None and prec == "int8" and w7:
                    kernel = "reference"
                out = run(kernel, "classify", "--model", self.st, "--precision", prec, "--topk",
                          "5", "--json", "--quiet", photo)
                got[None if kernel == "reference" else kernel] = [
                    t["logit"] for t in json.loads(out)["topk"]]
            if prec == "fp32":
                fp32 = got[None]
            elif prec == "int8":
                self.assertEqual(got[None], got["amx-emulated"])
            else:
                # Another order of the fp32 sums flips a few bf16 roundings
                # of activations (the patch embedding's among them), so the
                # two bf16 paths differ by about what each differs from fp32
                # (~7e-3 of 2.1 here), and each stays that close to fp32.
                np.testing.assert_allclose(got["amx-emulated"], got[None], rtol=5e-3, atol=1e-3)
                for k in (None, "amx-emulated"):
                    np.testing.assert_allclose(got[k], fp32, rtol=1e-2, atol=1e-3)

    @unittest.skipUnless(os.path.exists(os.path.join(ROOT, "build", "vitc")), "needs build/vitc")
    def test_cli_eval_embed_similar(self):
        """--precision on eval, embed and similar: each runs in that precision
        (results differ from fp32's) and stays close to fp32."""
        import shutil
        vitc_bin = os.path.join(ROOT, "build", "vitc")

        def run(*args):
            p = subprocess.run([vitc_bin] + list(args), capture_output=True, text=True)
            return p.returncode, p.stdout, p.stderr

        # an ImageFolder of two classes (the model has 100): eval's loss per precision
        root = self.path("folder")
        for k, names in enumerate((PHOTOS[:3], PHOTOS[3:])):
            os.makedirs(os.path.join(root, "c%d" % k), exist_ok=True)
            for n in names:
                shutil.copy(os.path.join(DATA, n), os.path.join(root, "c%d" % k, n))
        ev, emb = {}, {}
        photos = [os.path.join(DATA, n) for n in PHOTOS]
        for prec in ("fp32", "bf16", "int8"):
            rc, out, err = run("eval", "--model", self.st, "--data", root, "--precision", prec,
                               "--json", "--quiet")
            self.assertEqual(rc, 0, err)
            ev[prec] = json.loads(out)
            self.assertEqual(ev[prec]["precision"], prec)
            self.assertEqual(ev[prec]["images"], len(PHOTOS))
            rc, out, err = run("embed", "--model", self.st, "--precision", prec, "--json",
                               "--quiet", *photos)
            self.assertEqual(rc, 0, err)
            emb[prec] = np.array([json.loads(line)["embedding"] for line in out.splitlines()])
            self.assertEqual(emb[prec].shape, (len(PHOTOS), self.CFG["hidden_dim"]))
        for prec in ("bf16", "int8"):
            max_rel = TOL[prec][0]
            loss, loss0 = ev[prec]["loss"], ev["fp32"]["loss"]
            self.assertNotEqual(loss, loss0)
            self.assertLess(abs(loss - loss0), max_rel * abs(loss0), prec)
            rel = np.linalg.norm(emb[prec] - emb["fp32"]) / np.linalg.norm(emb["fp32"])
            self.assertGreater(rel, 0.0, prec)
            self.assertLess(rel, max_rel, prec)
        # similar: the cache is per precision; the query's twin is the nearest
        index = os.path.join(root, "c0")
        scores = {}
        for prec in ("fp32", "int8", "fp32"):
            rc, out, err = run("similar", "--model", self.st, "--index", index, "--precision",
                               prec, "--json", "--quiet", "--topk", "3", "--cache",
                               self.path("similar_cache"), os.path.join(DATA, PHOTOS[0]))
            self.assertEqual(rc, 0, err)
            res = [json.loads(line) for line in out.splitlines()]
            self.assertEqual(os.path.basename(res[0]["image"]), PHOTOS[0])
            scores.setdefault(prec, []).append([r["score"] for r in res])
        self.assertEqual(scores["fp32"][0], scores["fp32"][1])  # rebuilt for fp32 again
        self.assertNotEqual(scores["int8"][0], scores["fp32"][0])
        np.testing.assert_allclose(scores["int8"][0], scores["fp32"][0], atol=0.05)
        for cmd in (["eval", "--model", self.st, "--data", root],
                    ["embed", "--model", self.st, photos[0]],
                    ["similar", "--model", self.st, "--index", index, photos[0]]):
            rc, _, err = run(*(cmd + ["--precision", "fp16"]))
            self.assertEqual(rc, 2, (cmd, err))
            self.assertIn("--precision must be fp32, bf16 or int8", err)
            rc, out, _ = run(cmd[0], "--help")
            self.assertIn("--precision", out)

    def test_attention_precision(self):
        """bf16 q k^T and P v: close to fp32 (bf16's error bound), set apart
        from the weights' precision, in the loaders and the CLI."""
        m = vitc.VisionTransformer.from_safetensors(self.st, attention_precision="bf16")
        self.assertEqual((m.precision, m.attention_precision), ("fp32", "bf16"))
        for name, x in (("photos", self.photos), ("noise", self.noise)):
            rel, top1, _ = stats(m(x), self.ref[name])
            print("\nbf16 attention %s: relative logits error %.4f, top-1 agreement %.3f"
                  % (name, rel, top1), file=sys.stderr)
            self.assertGreater(rel, 0.0)
            self.assertLess(rel, TOL["bf16"][0])
        m.attention_precision = "fp32"
        np.testing.assert_array_equal(m(self.photos), self.ref["photos"])
        both = vitc.load_model(self.st, precision="int8", attention_precision="bf16")
        int8 = vitc.VisionTransformer.from_safetensors(self.st, precision="int8",
                                                       attention_precision="fp32")
        all8 = vitc.load_model(self.st, precision="int8", attention_precision="int8")
        a, b, c = both(self.photos), int8(self.photos), all8(self.photos)
        self.assertGreater(np.abs(a - b).max(), 0.0)
        self.assertGreater(np.abs(c - a).max(), 0.0)
        self.assertLess(stats(a, self.ref["photos"])[0], TOL["int8"][0])
        self.assertLess(stats(c, self.ref["photos"])[0], TOL["int8"][0])
        # "auto" (the default) follows the weights: under bf16 bf16 where
        # the CPU runs it faster (AMD's AVX512-BF16; Intel's cores run
        # vdpbf16ps at half their fp32 rate: fp32), under int8 int8 there
        # (AVX512-VNNI), fp32 under fp32; a value set stays through
        # precision changes.
        info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
        amd = "AuthenticAMD" in info and "avx512_bf16" in info and "avx512_vnni" in info
        lp = "bf16" if amd else "fp32" if "GenuineIntel" in info else None
        lp8 = "int8" if amd else "fp32" if "GenuineIntel" in info else None
        auto = vitc.VisionTransformer.from_safetensors(self.st, precision="int8")
        lp8 = lp8 or auto.attention_precision
        self.assertEqual(auto.attention_precision, lp8)
        np.testing.assert_array_equal(auto(self.photos), {"int8": c, "bf16": a}.get(lp8, b))
        auto.precision = "fp32"  # (the weights stay int8's values)
        self.assertEqual(auto.attention_precision, "fp32")
        auto.precision = "bf16"
        lp = lp or auto.attention_precision
        self.assertEqual(auto.attention_precision, lp)
        int8.precision = "bf16"
        self.assertEqual(int8.attention_precision, "fp32")
        int8.attention_precision = "auto"
        self.assertEqual(int8.attention_precision, lp)
        for bad in ("int4", "fp16"):
            with self.assertRaises(ValueError):
                m.attention_precision = bad
        if os.path.exists(os.path.join(ROOT, "build", "vitc")):
            vitc_bin = os.path.join(ROOT, "build", "vitc")
            photo = os.path.join(DATA, "photo.png")
            outs = {}
            for ap in ("fp32", "bf16"):
                p = subprocess.run([vitc_bin, "classify", "--model", self.st, "--topk", "1",
                                    "--attention-precision", ap, "--json", "--quiet", photo],
                                   capture_output=True, text=True)
                self.assertEqual(p.returncode, 0, p.stderr)
                outs[ap] = json.loads(p.stdout)["topk"][0]["logit"]
            self.assertNotEqual(outs["fp32"], outs["bf16"])
            self.assertLess(abs(outs["fp32"] - outs["bf16"]), 0.02 * abs(outs["fp32"]) + 0.02)
            p = subprocess.run([vitc_bin, "classify", "--model", self.st,
                                "--attention-precision", "int4", photo],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 2)
            self.assertIn("--attention-precision must be auto, fp32, bf16 or int8", p.stderr)
            p = subprocess.run([vitc_bin, "classify", "--model", self.st, "--topk", "1",
                                "--precision", "bf16", "--json", "--quiet", photo],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            bf16_auto = json.loads(p.stdout)["topk"][0]["logit"]
            # auto: the bf16 attention where it beats fp32's (AVX512-BF16 on
            # a CPU not Intel's: dispatch.c), else fp32's
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
            lp_attn = "avx512_bf16" in cpuinfo and "GenuineIntel" not in cpuinfo
            p = subprocess.run([vitc_bin, "classify", "--model", self.st, "--topk", "1",
                                "--precision", "bf16", "--attention-precision",
                                "bf16" if lp_attn else "fp32", "--json",
                                "--quiet", photo], capture_output=True, text=True)
            self.assertEqual(bf16_auto, json.loads(p.stdout)["topk"][0]["logit"])

    def test_bad_precision(self):
        m = vitc.VisionTransformer.from_safetensors(self.st)
        with self.assertRaises(ValueError):
            m.precision = "fp16"
        with self.assertRaises(TypeError):
            m.precision = 8
        self.assertIn("bf16: ", vitc.VisionTransformer.precision_paths())


if __name__ == "__main__":
    unittest.main()
