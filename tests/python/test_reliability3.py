"""Reliability, third round (part A): regressions for the image, data-set,
similar / embed / eval / plot-log defects. Each test fails on the code
before its fix.

H1  a Hub model's processor (PIL path) computes only the crop's window.
H4  `similar` keeps file names as bytes: a non-UTF-8 name shifts nothing.
M2  `similar` never writes its cache through a link, nor into the folder.
M1  `similar`'s cache is keyed on the model's content, not its path.
L1  `embed --json` / `similar --json` print a non-finite value as null.
M5  `eval` never makes a label into a path.
L10 `eval` escapes control characters of labels and paths it prints.
L14 `eval` keeps no dense C x C matrix (100,000 classes ran out of memory).
L15 (C: tests/test_dataset.c) gzip IDX ratio cap; H3 (same file) links.
L8  `plot-log` clips segments to the panel before drawing them.
H2  a 1-channel Hub model gets 1-plane images in every command.
M8  the converters never run code from a checkpoint without --trust-pickle
    (already weights_only=True in both: this guards it).
"""
import json
import glob
import os
import resource
import shutil
import subprocess
import sys
import time
import unittest

import numpy as np

import vitc

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

try:
    from .util import DATA, ROOT, VITC, TmpDirCase, export_cmd, run_script, run_vitc as run
    from .test_cli import tiny_vit
except ImportError:  # run as a script
    from util import DATA, ROOT, VITC, TmpDirCase, export_cmd, run_script, run_vitc as run
    from test_cli import tiny_vit

try:
    import transformers as T
    from PIL import Image
    from transformers import AutoImageProcessor
    T.logging.set_verbosity_error()
    T.logging.disable_progress_bar()
except ImportError:  # pragma: no cover
    T = None

HAVE_VITC = os.path.exists(VITC)
TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def run_limited(args, mib=1024, timeout=120):
    """args under a RLIMIT_AS of mib MiB (set in the child only):
    (returncode, stdout, stderr). The limit turns "allocates gigabytes" into
    a failure instead of a slow machine."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))
    p = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout, preexec_fn=limit)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def save_png(path, arr):
    Image.fromarray(np.ascontiguousarray(arr)).save(path)
    return path


@unittest.skipIf(T is None or not HAVE_VITC, "needs transformers, PIL and build/vitc")
class TestH1HubWindow(TmpDirCase):
    """H1: the Hub processors' resize computes only the crop's window: a
    20000x1 PNG no longer costs gigabytes, and the window is PIL's bit for
    bit on elongated images (where it is a sliver of the resize)."""
    TMP_PREFIX = "vitc_r3h1_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dino = os.path.join(cls.tmp, "dino")
        T.Dinov2Model(T.Dinov2Config(image_size=224, patch_size=14, **TINY)).save_pretrained(cls.dino)
        T.BitImageProcessor(size={"shortest_edge": 256}).save_pretrained(cls.dino)
        cls.clip = os.path.join(cls.tmp, "clip")
        T.CLIPVisionModel(T.CLIPVisionConfig(image_size=224, patch_size=32, **TINY)).save_pretrained(cls.clip)
        T.CLIPImageProcessor().save_pretrained(cls.clip)
        cls.nocrop = os.path.join(cls.tmp, "clip_nocrop")
        T.CLIPVisionModel(T.CLIPVisionConfig(image_size=224, patch_size=32, **TINY)).save_pretrained(cls.nocrop)
        T.CLIPImageProcessor(do_center_crop=False).save_pretrained(cls.nocrop)

    def test_elongated_images_equal_pil(self):
        rng = np.random.default_rng(7)
        shapes = [(2, 1500), (1500, 2), (3, 901), (37, 600), (600, 37), (1, 3000), (230, 229)]
        for d in (self.dino, self.clip):
            m = vitc.load_model(d)
            proc = AutoImageProcessor.from_pretrained(d, backend="pil")
            for h, w in shapes:
                path = save_png(self.path("e_%dx%d.png" % (w, h)),
                                rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
                ref = proc(images=Image.open(path), return_tensors="np")["pixel_values"][0]
                got = m.preprocess(path)
                self.assertEqual(got.shape, ref.shape)
                self.assertTrue(np.array_equal(got, ref), "%s %dx%d: %d values differ" % (
                    os.path.basename(d), w, h, int((got != ref).sum())))

    def test_wide_png_is_cheap(self):
        """A 140-byte 20000x1 PNG: 3.9 GB and 24 s before the fix; now it
        runs under a 1 GiB address-space limit."""
        path = save_png(self.path("wide.png"), np.full((1, 20000, 3), 128, np.uint8))
        self.assertLess(os.path.getsize(path), 1000)
        for d in (self.dino, self.clip):
            rc, out, err = run_limited([VITC, "embed", "--model", d, "--json", path])
            self.assertEqual(rc, 0, err)
            self.assertEqual(len(json.loads(out)["embedding"]), 32, err)
            self.assertNotIn("error", err)

    def test_no_crop_output_is_bounded(self):
        """Without a crop the output is the whole resize: refused over the
        budget, with the torchvision path's message, before allocating."""
        path = save_png(self.path("wide2.png"), np.full((1, 20000, 3), 9, np.uint8))
        code = ("import vitc, sys\n"
                "try:\n    vitc.load_model(sys.argv[1]).preprocess(sys.argv[2])\n"
                "except Exception as e:\n    print(e)\n")
        rc, out, err = run_limited([sys.executable, "-c", code, self.nocrop, path], mib=2048)
        self.assertEqual(rc, 0, err)
        self.assertIn("MiB of intermediates (the limit)", out)


def export_tiny(tmp, seed, name=None):
    """The tests' tiny torchvision ViT (seed) as a vitc checkpoint in tmp."""
    pth = os.path.join(tmp, "m%d.pth" % seed)
    torch.save(tiny_vit(seed).state_dict(), pth)
    st = os.path.join(tmp, name or "m%d.safetensors" % seed)
    subprocess.run(export_cmd(pth, st), check=True, stdout=subprocess.DEVNULL)
    return st


@unittest.skipIf(torch is None or not HAVE_VITC, "needs torch and build/vitc")
class TestSimilarBytes(TmpDirCase):
    TMP_PREFIX = "vitc_r3sim_"
    # five different images; sorted, the names invalid as UTF-8 come first,
    # in the middle and last (and the bad byte opens, splits or ends a name)
    NAMES = [b"0\xc3.png", b"a.png", b"m\xfeid.png", b"n.png", b"\xffz.png"]
    SOURCES = ["photo.jpg", "photo.png", "rgb8.png", "gray8.png", "palette.png"]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.m0 = export_tiny(cls.tmp, 0)
        cls.m1 = export_tiny(cls.tmp, 1)

    def setUp(self):
        self.case = os.path.join(self.tmp, self.id().rsplit(".", 1)[-1])
        self.index = os.path.join(self.case, "images")
        os.makedirs(self.index)
        for name, src in zip(self.NAMES, self.SOURCES):
            shutil.copy(os.path.join(DATA, src), os.path.join(os.fsencode(self.index), name))
        self.xdg = os.path.join(self.case, "xdg")
        self.env = dict(os.environ, XDG_CACHE_HOME=self.xdg, HOME=os.path.join(self.case, "h"))

    def similar(self, *args, model=None):
        p = subprocess.run([VITC, "similar", "--model", model or self.m0, "--index", self.index,
                            "--quiet"] + [str(a) for a in args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=self.env)
        return p.returncode, p.stdout, p.stderr.decode(errors="replace")

    def caches(self):
        return sorted(glob.glob(os.path.join(self.xdg, "vitc", "similar", "*.safetensors")))

    def test_non_utf8_names(self):
        """Each image's own copy (outside the folder) finds that image
        first with score 1, whatever the names around it; before the fix
        every name after an invalid one was the next image's."""
        outside = os.path.join(self.case, "q")
        os.makedirs(outside)
        for mode in ("--no-cache", "build", "cached"):
            for name, src in zip(self.NAMES, self.SOURCES):
                q = os.path.join(outside, src)
                shutil.copy(os.path.join(DATA, src), q)
                extra = ["--no-cache"] if mode == "--no-cache" else []
                rc, out, err = self.similar("--json", "--topk", "5", *extra, q)
                self.assertEqual(rc, 0, err)
                lines = out.decode().splitlines()  # valid UTF-8: U+FFFD for bad bytes
                self.assertEqual(len(lines), 5, (mode, out))
                first = json.loads(lines[0])
                want = (os.fsencode(self.index) + b"/" + name).decode("utf-8", "replace")
                self.assertEqual(first["image"], want, mode)
                self.assertAlmostEqual(first["score"], 1.0, places=5)
                # text output: the name's own bytes (control characters
                # aside, which are escaped)
                rc, out, err = self.similar("--topk", "1", *extra, q)
                self.assertEqual(rc, 0, err)
                self.assertTrue(out.rstrip(b"\n").endswith(b"/" + name), (mode, out))
            if mode == "build":
                self.assertEqual(len(self.caches()), 1)
        self.assertEqual(sorted(os.listdir(os.fsencode(self.index))), sorted(self.NAMES))

    def test_cache_link_not_followed(self):
        """A link planted under the cache's name is replaced, its target
        untouched (before: the target was overwritten with the cache)."""
        q = os.path.join(DATA, "photo.png")
        rc, _, err = self.similar(q)
        self.assertEqual(rc, 0, err)
        (cache,) = self.caches()
        victim = os.path.join(self.case, "victim.bin")
        with open(victim, "wb") as f:
            f.write(b"precious")
        os.unlink(cache)
        os.symlink(victim, cache)
        shutil.copy(os.path.join(DATA, "photo.jpg"), os.path.join(self.index, "new.png"))
        rc, _, err = self.similar(q)
        self.assertEqual(rc, 0, err)
        with open(victim, "rb") as f:
            self.assertEqual(f.read(), b"precious")
        self.assertFalse(os.path.islink(cache))
        self.assertTrue(os.path.isfile(cache))
        # nothing was written into the image folder, and no temporary left
        self.assertEqual(sorted(os.listdir(os.fsencode(self.index))),
                         sorted(self.NAMES + [b"new.png"]))
        self.assertEqual(os.listdir(os.path.dirname(cache)), [os.path.basename(cache)])

    def test_cache_keyed_on_content(self):
        """Weights replaced at the same path, same size and time: a fresh
        index, not the stale one; the same model at another path: the same
        cache."""
        model = os.path.join(self.case, "model.safetensors")
        shutil.copy(self.m0, model)
        q = os.path.join(DATA, "photo.png")
        rc, out0, err = self.similar("--json", q, model=model)
        self.assertEqual(rc, 0, err)
        st = os.stat(model)
        shutil.copy(self.m1, model)
        self.assertEqual(os.path.getsize(model), st.st_size)
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
        rc, out1, err = self.similar("--json", q, model=model)
        rc, ref1, err = self.similar("--json", "--no-cache", q, model=self.m1)
        self.assertEqual(rc, 0, err)
        self.assertNotEqual(out0, ref1)
        self.assertEqual(out1, ref1)
        n = len(self.caches())
        moved = os.path.join(self.case, "moved.safetensors")
        os.rename(model, moved)
        os.utime(moved, ns=(st.st_atime_ns, st.st_mtime_ns))
        rc, out2, err = self.similar("--json", q, model=moved)
        self.assertEqual((rc, out2), (0, ref1))
        self.assertEqual(len(self.caches()), n)

    def test_non_finite_is_null(self):
        """A model whose output is NaN: `embed --json` printed `nan` (not
        JSON) and `similar --json` printed nothing; now null."""
        from safetensors.numpy import load_file, save_file
        from safetensors import safe_open
        with safe_open(self.m0, "np") as f:
            meta = f.metadata()
        t = load_file(self.m0)
        for k in t:
            if k.endswith("ln.weight"):
                t[k] = t[k].copy()
                t[k][:] = np.nan
        bad = os.path.join(self.case, "nan.safetensors")
        save_file(t, bad, metadata=meta)
        q = os.path.join(DATA, "photo.png")
        rc, out, err = run("embed", "--model", bad, "--json", q)
        self.assertEqual(rc, 0, err)
        e = json.loads(out)["embedding"]
        self.assertIn(None, e)
        rc, out, err = self.similar("--json", "--topk", "2", q, model=bad)
        self.assertEqual(rc, 0, err)
        rows = [json.loads(x) for x in out.decode().splitlines()]
        self.assertEqual(len(rows), 2)
        self.assertIsNone(rows[0]["score"])


def export_classes(tmp, name, labels=None, num_classes=None):
    """A tiny torchvision ViT with len(labels) (or num_classes) classes as a
    vitc checkpoint, its labels from a file (none: no labels)."""
    from torchvision.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    n = len(labels) if labels else num_classes
    m = VisionTransformer(image_size=48, patch_size=16, num_layers=1, num_heads=2,
                          hidden_dim=32, mlp_dim=64, num_classes=n).eval()
    pth = os.path.join(tmp, name + ".pth")
    torch.save(m.state_dict(), pth)
    st = os.path.join(tmp, name + ".safetensors")
    subprocess.run(export_cmd(pth, st, "--labels", "none"), check=True, stdout=subprocess.DEVNULL)
    if labels:  # written into vitc.config as given (a labels file cannot hold a CR)
        from safetensors import safe_open
        from safetensors.numpy import load_file, save_file
        with safe_open(st, "np") as f:
            meta = f.metadata()
        cfg = json.loads(meta["vitc.config"])
        cfg["labels"] = labels
        meta["vitc.config"] = json.dumps(cfg)
        save_file(load_file(st), st, metadata=meta)
    return st


@unittest.skipIf(torch is None or not HAVE_VITC, "needs torch and build/vitc")
class TestEval(TmpDirCase):
    TMP_PREFIX = "vitc_r3eval_"

    def folder(self, root, classes):
        for c, names in classes.items():
            os.makedirs(os.path.join(root, c), exist_ok=True)
            for n, src in names:
                shutil.copy(os.path.join(DATA, src), os.path.join(root, c, n))
        return root

    def test_labels_are_not_paths_and_are_escaped(self):
        """M5: a label "../outside" read the images beside --data (one
        naming /usr decoded system images). L10: a label with ESC and CR,
        and a skipped image whose name has them, reach the terminal
        escaped."""
        evil = "\x1b[31mred\rX"
        model = export_classes(self.tmp, "m3", ["cls", "../outside", evil])
        data = self.folder(self.path("data"), {
            "cls": [("a.png", "photo.png"), ("b.jpg", "photo.jpg")],
            evil: [("c.png", "rgb8.png")]})
        with open(os.path.join(data, "cls", "bad\x1b]0;pwn\x07.png"), "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\nbroken")
        self.folder(self.path("outside"), {".": [("o%d.png" % i, "gray8.png") for i in range(4)]})
        rc, out, err = run("eval", "--model", model, "--data", data, "--json", "--quiet")
        self.assertEqual(rc, 0, err)
        res = json.loads(out)
        self.assertEqual(res["images"], 3)  # not 7: outside/ is not read
        self.assertEqual(res["skipped"], 1)
        self.assertEqual([c["images"] for c in res["per_class"]], [2, 0, 1])
        self.assertEqual(res["per_class"][2]["label"], evil)  # JSON escapes it itself
        rc, out, err = run("eval", "--model", model, "--data", data, "--quiet")
        self.assertEqual(rc, 0, err)
        for text in (out, err):
            self.assertNotIn("\x1b", text)
            self.assertNotIn("\r", text)
            self.assertNotIn("\x07", text)
        self.assertIn("\\x1b[31mred\\x0dX", out)
        self.assertIn("bad\\x1b]0;pwn\\x07.png", err)

    def test_many_classes_no_dense_matrix(self):
        """L14: 100,000 classes asked for an 80 GB confusion matrix; now the
        counts are sparse and the run fits in 2 GiB."""
        model = export_classes(self.tmp, "m100k", num_classes=100000)
        data = self.folder(self.path("data100k"), {
            "c0": [("a.png", "photo.png")], "c1": [("b.png", "rgb8.png"), ("c.jpg", "photo.jpg")]})
        rc, out, err = run_limited([VITC, "eval", "--model", model, "--data", data, "--json",
                                    "--quiet"], mib=2048)
        self.assertEqual(rc, 0, err)
        res = json.loads(out)
        self.assertEqual(res["images"], 3)
        self.assertIsNone(res["confusion"])
        cells = res["confusion_cells"]
        self.assertEqual(sum(c[2] for c in cells), 3)
        self.assertEqual(sorted({c[0] for c in cells}), [0, 1])
        self.assertEqual(len(res["per_class"]), 100000)
        self.assertEqual(res["per_class"][1]["images"], 2)
        rc, out, err = run_limited([VITC, "eval", "--model", model, "--data", data, "--quiet"],
                                   mib=2048)
        self.assertEqual(rc, 0, err)
        self.assertIn("confusion matrix: not printed for 100000 classes", out)
        # a small model: the dense matrix as before, rows summing to the counts
        small = export_classes(self.tmp, "m2", ["c0", "c1"])
        rc, out, err = run("eval", "--model", small, "--data", data, "--json", "--quiet")
        self.assertEqual(rc, 0, err)
        res = json.loads(out)
        self.assertEqual([sum(r) for r in res["confusion"]], [1, 2])
        self.assertNotIn("confusion_cells", res)


@unittest.skipIf(not HAVE_VITC, "needs build/vitc")
class TestPlotLog(TmpDirCase):
    TMP_PREFIX = "vitc_r3plot_"

    def test_far_off_panel_values(self):
        """Step losses of -1e6 on a panel up to 1.5 (and +-1e300 elsewhere): each segment ran
        off the panel, 100,000 squares each (37 s for a 2.8 MB log), and
        lround past int's range is undefined. Clipped, it is quick."""
        log = self.path("train.jsonl")
        with open(log, "w") as f:
            for i in range(1, 30001):
                f.write(json.dumps({"type": "step", "epoch": 1, "step": i,
                                    "loss": 1.0 if i % 2 else -1e6}) + "\n")
            for e in (1, 2, 3):
                f.write(json.dumps({"type": "epoch", "epoch": e, "step": 10000 * e,
                                    "train_loss": -1e300 * e, "eval_loss": 1.5,
                                    "train_acc": -1e300, "eval_acc": 1e300}) + "\n")
        out = self.path("plot.png")
        t0 = time.monotonic()
        rc, _, err = run("plot-log", "--out", out, log, timeout=120)
        elapsed = time.monotonic() - t0
        self.assertEqual(rc, 0, err)
        self.assertLess(elapsed, 5.0)
        from PIL import Image
        with Image.open(out) as im:
            self.assertEqual(im.size, (900, 380))


@unittest.skipIf(T is None or torch is None or not HAVE_VITC, "needs transformers and build/vitc")
class TestOneChannelHub(TmpDirCase):
    """H2: a Hub model with num_channels 1 was fed the processor's 3 planes
    per image: the forward read them as 3 images' worth, so the second
    image of a batch was wrong and results changed with --batch. Now every
    command feeds 1 plane: the processor on the image as PIL's
    convert("L") gives it, as transformers' processor with a 1-value mean."""
    TMP_PREFIX = "vitc_r3gray_"
    PHOTOS = ["photo.png", "rgb8.png", "photo.jpg"]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        torch.manual_seed(0)
        cfg = T.ViTConfig(image_size=32, patch_size=8, num_channels=1, hidden_size=32,
                          num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                          num_labels=5, attn_implementation="eager")
        cls.model = T.ViTForImageClassification(cfg).eval()
        cls.d = os.path.join(cls.tmp, "gray_vit")
        cls.model.save_pretrained(cls.d)
        T.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(cls.d)
        cls.ref_proc = T.ViTImageProcessor(size={"height": 32, "width": 32},
                                           image_mean=[0.5], image_std=[0.5])
        cls.photos = [os.path.join(DATA, n) for n in cls.PHOTOS]

    def reference(self, path, **kw):
        x = self.ref_proc(images=Image.open(path).convert("L"), return_tensors="pt")
        with torch.no_grad():
            return self.model(pixel_values=x["pixel_values"], **kw)

    def test_classify(self):
        for batch in ("1", "3"):
            rc, out, err = run("classify", "--model", self.d, "--json", "--batch", batch,
                               "--topk", "5", *self.photos)
            self.assertEqual(rc, 0, err)
            rows = [json.loads(x) for x in out.splitlines()]
            self.assertEqual(len(rows), 3)
            for path, r in zip(self.photos, rows):
                ref = self.reference(path).logits[0].numpy()
                got = {p["index"]: p["logit"] for p in r["topk"]}
                np.testing.assert_allclose([got[i] for i in range(5)], ref, rtol=1e-4,
                                           atol=1e-4, err_msg="%s --batch %s" % (path, batch))

    def test_embed_and_similar(self):
        outs = {}
        for batch in ("1", "3"):
            rc, out, err = run("embed", "--model", self.d, "--json", "--batch", batch,
                               *self.photos)
            self.assertEqual(rc, 0, err)
            outs[batch] = [json.loads(x)["embedding"] for x in out.splitlines()]
        np.testing.assert_allclose(outs["1"], outs["3"], rtol=1e-5, atol=1e-6)
        index = self.path("index")
        os.makedirs(index, exist_ok=True)
        for p in self.photos:
            shutil.copy(p, index)
        res = {}
        for batch in ("1", "3"):
            rc, out, err = run("similar", "--model", self.d, "--index", index, "--no-cache",
                               "--json", "--batch", batch, "--topk", "3",
                               os.path.join(DATA, "rgb8.png"))
            self.assertEqual(rc, 0, err)
            res[batch] = [json.loads(x) for x in out.splitlines()]
            self.assertEqual(os.path.basename(res[batch][0]["image"]), "rgb8.png")
            self.assertAlmostEqual(res[batch][0]["score"], 1.0, places=5)
        self.assertEqual([r["image"] for r in res["1"]], [r["image"] for r in res["3"]])
        np.testing.assert_allclose([r["score"] for r in res["1"]],
                                   [r["score"] for r in res["3"]], atol=1e-5)

    def test_attention_map(self):
        """--method cls --raw: the last layer's class-token attention, mean
        of heads, on the 1-plane input attention-map makes (torchvision's
        transform: luminance, resize, crop; it shows the crop)."""
        import torchvision.transforms.functional as TF
        path = self.photos[0]
        raw = self.path("raw.npy")
        rc, _, err = run("attention-map", "--model", self.d, "--method", "cls", "--out",
                         self.path("a.png"), "--raw", raw, "--quiet", path)
        self.assertEqual(rc, 0, err)
        t = TF.pil_to_tensor(Image.open(path).convert("RGB"))
        t = TF.center_crop(TF.resize(TF.rgb_to_grayscale(t), 36, antialias=True), 32)
        x = TF.normalize(t.float()[None] / 255.0, [0.5], [0.5])
        with torch.no_grad():
            att = self.model(pixel_values=x, output_attentions=True).attentions[-1]
        ref = att[0, :, 0, 1:].mean(0).reshape(4, 4).numpy()
        np.testing.assert_allclose(np.load(raw), ref, rtol=1e-4, atol=1e-5)

    def test_eval(self):
        data = self.path("data")
        for k, p in enumerate(self.photos):
            os.makedirs(os.path.join(data, "LABEL_%d" % (k % 2)), exist_ok=True)
            shutil.copy(p, os.path.join(data, "LABEL_%d" % (k % 2)))
        res = {}
        for batch in ("1", "3"):
            rc, out, err = run("eval", "--model", self.d, "--data", data, "--json", "--quiet",
                               "--batch", batch)
            self.assertEqual(rc, 0, err)
            res[batch] = json.loads(out)
        self.assertEqual(res["1"]["images"], 3)
        self.assertAlmostEqual(res["1"]["loss"], res["3"]["loss"], places=5)


class _Hostile:
    """Unpickling this runs code: it writes the marker file."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@unittest.skipIf(torch is None, "needs torch")
class TestPickle(TmpDirCase):
    TMP_PREFIX = "vitc_r3pickle_"

    def test_hostile_checkpoint_runs_nothing(self):
        marker = self.path("pwned")
        pth = self.path("hostile.pth.tar")
        sd = tiny_vit(0).state_dict()
        torch.save({"state_dict": sd, "args": _Hostile(marker)}, pth)
        for script in ("export_safetensors.py", "convert_t2t.py"):
            rc, out, err = run_script(os.path.join(ROOT, "tools", script), pth,
                                      self.path("out.safetensors"))
            self.assertEqual(rc, 1, (script, err))
            self.assertIn("--trust-pickle", err, script)
            self.assertFalse(os.path.exists(marker), script)
            self.assertFalse(os.path.exists(self.path("out.safetensors")), script)


if __name__ == "__main__":
    unittest.main()
