"""Reliability, third round (part A): regressions for the image, data-set,
similar / embed / eval / plot-log defects. Each test fails on the code
before its fix.

H1  a Hub model's processor (PIL path) computes only the crop's window.
"""
import json
import os
import resource
import subprocess
import sys
import unittest

import numpy as np

import vitc

try:
    from .util import VITC, TmpDirCase, run_vitc as run
except ImportError:  # run as a script
    from util import VITC, TmpDirCase, run_vitc as run

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


if __name__ == "__main__":
    unittest.main()
