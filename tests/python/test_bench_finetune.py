"""The fine-tuning benchmark end to end at --quick size: bench.py's
finetune_dinov2_s14_b8 and finetune_clip_b16_b8 rows (vitc and PyTorch each
time a step, the FLOP counts of both sides agree), `vitc bench` skipping a
row whose --model is the other family, and bench/finetune_learn.py writing
its sections with a loss per epoch.

Both rows are timed on both sides: the classifier over CLIP's embedding
(VIT_HEAD_LINEAR) runs forward and backward.
"""
import json
import os
import re
import subprocess
import sys
import unittest

try:
    from .util import ROOT, VITC, TmpDirCase, run_vitc
except ImportError:  # run as a script
    from util import ROOT, VITC, TmpDirCase, run_vitc

try:
    import torch
    import transformers
except ImportError:  # pragma: no cover
    torch = transformers = None
try:
    import skimage.data  # noqa: F401
except ImportError:  # pragma: no cover
    skimage = None
else:
    import skimage

BENCH = os.path.join(ROOT, "bench", "bench.py")
LEARN = os.path.join(ROOT, "bench", "finetune_learn.py")
ROWS = ("finetune_dinov2_s14_b8", "finetune_clip_b16_b8")


def run_py(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable] + [str(a) for a in args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=env, timeout=timeout)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


@unittest.skipIf(torch is None or not os.path.exists(VITC), "needs torch, transformers, build/vitc")
class TestFinetuneRows(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        out = os.path.join(cls.tmp, "r.md")
        cls.rc, _, cls.err = run_py(BENCH, "--quick", "--only", "finetune-step", "--rounds", "1",
                                    "--threads", "1", "--engines", "none", "--out", out)
        cls.md, cls.res = "", {}
        if os.path.exists(out):
            with open(out) as f:
                cls.md = f.read()
            with open(os.path.splitext(out)[0] + ".json") as f:
                cls.res = json.load(f)

    def test_ran(self):
        self.assertEqual(self.rc, 0, self.err[-2000:])
        self.assertEqual(sorted(self.res["summary"]), sorted(ROWS))

    def test_both_sides_time_a_step(self):
        s = self.res["summary"]
        for name in ROWS:
            t = s[name]["torch-1"]
            self.assertEqual(t["status"], "ok", (name, t))
            self.assertGreater(t["median_ms"], 0)
            v = s[name]["vitc-1"]
            self.assertEqual(v["status"], "ok", (name, v))
            self.assertGreater(v["median_ms"], 0)
            self.assertGreater(v["gflops"], 0)
        for name in ROWS:
            self.assertRegex(self.md, r"\| %s \| \[8,3,224,224\] \|" % name)

    def test_flops_agree(self):
        # bench.py notes any row whose vitc bench FLOP count differs from its own
        self.assertNotIn("vitc bench counts", self.md)
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import bench
        bench.QUICK = True
        for name in ROWS:
            raw = self.res["raw"][name]["vitc-1"][0]
            self.assertAlmostEqual(raw["flops"], bench.flops_of(name), delta=1e-6 * raw["flops"])

        # and by hand: 2 layers of width 48, batch 2 of two patches a side (4 + CLS tokens)
        def fwd(p, M, head):
            P, N, D = 4, 5, 48
            return 2 * (2 * P * D * 3 * p * p + 2 * (2 * N * D * 3 * D + 4 * N * N * D
                                                     + 2 * N * D * D + 4 * N * D * M) + head)
        raw = self.res["raw"]
        # DINOv2: MLP 192, head Linear(2D, 10); CLIP: MLP 96, projection 48 -> 16, Linear(16, 10)
        self.assertEqual(raw["finetune_dinov2_s14_b8"]["vitc-1"][0]["flops"],
                         3 * fwd(14, 192, 2 * 2 * 48 * 10))
        self.assertEqual(raw["finetune_clip_b16_b8"]["vitc-1"][0]["flops"],
                         3 * fwd(16, 96, 2 * 48 * 16 + 2 * 16 * 10))

    def test_wrong_family_is_skipped(self):
        d = self.path("clip")
        cfg = transformers.CLIPVisionConfig(hidden_size=48, num_hidden_layers=1,
                                            num_attention_heads=3, intermediate_size=96,
                                            image_size=32, patch_size=16, projection_dim=16)
        transformers.CLIPVisionModelWithProjection(cfg).save_pretrained(d)
        rc, out, err = run_vitc("bench", "--quick", "--json", "--quiet", "--no-peak", "--only",
                                "finetune_dinov2_s14_b8", "--repeat", "1", "--model", d)
        self.assertEqual(rc, 0, err)
        w = json.loads(out)["workloads"][0]
        self.assertEqual(w["status"], "skipped")
        self.assertIn("needs a dinov2 one", w["note"])
        rc, out, err = run_vitc("bench", "--quick", "--json", "--quiet", "--no-peak", "--only",
                                "finetune_clip_b16_b8", "--repeat", "1")
        self.assertEqual(rc, 0, err)
        self.assertIn("needs a clip Hub model directory", json.loads(out)["workloads"][0]["note"])


@unittest.skipIf(torch is None or skimage is None or not os.path.exists(VITC),
                 "needs torch, transformers, scikit-image and build/vitc")
class TestFinetuneLearn(TmpDirCase):
    def test_quick(self):
        out = self.path("results-finetune.md")
        rc, stdout, err = run_py(LEARN, "--quick", "--out", out, "--keep", self.path("work"))
        self.assertEqual(rc, 0, err[-2000:])
        with open(out) as f:
            md = f.read()
        for sec in ("## Setup", "## Summary", "## DINOv2-S/14, full fine-tuning",
                    "## CLIP ViT-B/16, full fine-tuning",
                    "## CLIP ViT-B/16, --freeze-backbone (linear probe)"):
            self.assertIn(sec, md)
        for k in ("- cpu: ", "- threads: ", "- chance: 25.0%", "- command: "):
            self.assertIn(k, md)
        # one line of `vitc --version` (its first), not all of it in the bullet
        self.assertIn("\n- vitc: %s\n- data: " % run_vitc("--version")[1].splitlines()[0], md)
        # the exact command of each run, and every epoch with a loss and accuracies
        self.assertEqual(md.count("train --init "), 3)
        for sec, epochs in (("DINOv2-S/14, full fine-tuning", 2),
                            ("CLIP ViT-B/16, full fine-tuning", 2),
                            ("CLIP ViT-B/16, --freeze-backbone (linear probe)", 3)):
            text = md.split("## " + sec)[1].split("\n## ")[0]
            rows = re.findall(r"^\| (\d) \| (\d+\.\d+) \| (\d+\.\d)% \| (\d+\.\d+) "
                              r"\| (\d+\.\d)% \|", text, re.M)
            self.assertEqual([int(r[0]) for r in rows], list(range(1, epochs + 1)), text)
        # the images the script wrote: 4 classes, 4 training and 2 held-out each
        for split, n in (("train", 4), ("val", 2)):
            for cls in ("astronaut", "cat", "coffee", "rocket"):
                self.assertEqual(len(os.listdir(self.path("work/photos/%s/%s" % (split, cls)))), n)


if __name__ == "__main__":
    unittest.main()
