"""The dense-vision benchmark (bench/dense.py) end to end at --quick size:
tiny SAM and Depth Anything configs, vitc and PyTorch eager each in their
own child; the markdown's sections, tables and targets, the JSON's rows, and
the agreement column: vitc's image embedding, prompt masks and depth map
against transformers' on a real photo.

OpenVINO is left out here (its conversion alone takes longer than the rest
of the run); `make bench-dense` runs it.
"""
import json
import os
import re
import subprocess
import sys
import unittest

try:
    from .util import ROOT, VITC, TmpDirCase
except ImportError:  # run as a script
    from util import ROOT, VITC, TmpDirCase

try:
    import torch
    import transformers
    import skimage.data  # noqa: F401
except ImportError:  # pragma: no cover
    torch = transformers = None

import vitc

DENSE = os.path.join(ROOT, "bench", "dense.py")
HAVE_API = all(hasattr(vitc._lib.lib, f) for f in ("vitc_sam_load", "vitc_depth_load")) \
    and hasattr(vitc, "SamPredictor") and hasattr(vitc, "DepthAnything")


def run_py(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable] + [str(a) for a in args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=env, timeout=timeout)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


class TestDenseArgs(unittest.TestCase):
    def test_engines_refused(self):
        """An engine list without vitc, or with an unknown engine: refused
        before any model is built."""
        for bad in ("torch,ov", "vitc,onnx"):
            rc, out, err = run_py(DENSE, "--quick", "--engines", bad, "--out", os.devnull,
                                  timeout=60)
            self.assertNotEqual(rc, 0)
            self.assertIn("--engines takes vitc", err)
            self.assertEqual(err.count("\n"), 1, err)

    def test_only_refused(self):
        """--only with an unknown workload: refused in one line, nothing built."""
        for bad in ("sam_prompt,segment", ","):
            rc, out, err = run_py(DENSE, "--quick", "--only", bad, "--out", os.devnull,
                                  timeout=60)
            self.assertNotEqual(rc, 0)
            self.assertIn("--only takes a comma-separated subset", err)
            self.assertEqual(err.count("\n"), 1, err)


@unittest.skipUnless(HAVE_API, "the build has no Segment Anything / Depth Anything API")
@unittest.skipIf(torch is None or not os.path.exists(VITC),
                 "needs torch, transformers, skimage and build/vitc")
class TestDenseQuick(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.md = os.path.join(cls.tmp, "results-dense.md")
        rc, cls.out, cls.err = run_py(DENSE, "--quick", "--engines", "vitc,torch",
                                      "--out", cls.md)
        if rc != 0:
            raise AssertionError("bench/dense.py --quick failed:\n" + cls.err[-3000:])
        with open(cls.md) as f:
            cls.text = f.read()
        with open(os.path.splitext(cls.md)[0] + ".json") as f:
            cls.res = json.load(f)

    def table(self, title):
        """The rows of the table under the section whose title starts so:
        engine -> cells."""
        sec = self.text.split("## " + title, 1)[1].split("\n## ", 1)[0]
        rows = [l for l in sec.splitlines() if l.startswith("| ")]
        head = [c.strip() for c in rows[0].strip("|").split("|")]
        return head, {c[0]: c for c in ([x.strip() for x in r.strip("|").split("|")]
                                        for r in rows[1:])}

    def test_marked_quick(self):
        self.assertTrue(self.res["quick"])
        self.assertIn("--quick smoke run", self.text)
        self.assertIn("Rerun: `", self.text)
        # the targets are listed but not judged on tiny configs
        self.assertEqual(len(self.res["targets"]), 5)
        self.assertTrue(all(t["met"] is None for t in self.res["targets"]))
        self.assertIn("## Targets (issue 24)", self.text)

    def test_machine_lines(self):
        self.assertRegex(self.text, r"CPU: \*\*.+\(family \d+, model \d+")
        self.assertRegex(self.text, r"Measured fp32 FMA peak .*: [0-9.]+ GFLOP/s on 1 core")
        for k in ("torch", "transformers", "openvino"):
            self.assertIn(k, self.res["versions"])
        self.assertIn("torch %s" % self.res["versions"]["torch"], self.text)
        self.assertGreater(self.res["peak_gflops"], 0)

    def test_rows(self):
        for w in ("sam_encoder", "sam_prompt", "depth"):
            for e in ("vitc", "torch"):
                s = self.res["summary"][w][e]
                self.assertEqual(s["status"], "ok", (w, e, s))
                self.assertGreater(s["median_ms"], 0)
                self.assertGreaterEqual(s["n"], 1)
                self.assertTrue(s["hwm_reset"])
            if w != "sam_prompt":  # OpenVINO: not run here
                self.assertEqual(self.res["summary"][w]["ov"]["status"], "failed")

    def test_tables(self):
        for title, pct in (("SAM ViT-B image encoder", True), ("One prompt", False),
                           ("Depth Anything small", True)):
            head, rows = self.table(title)
            self.assertEqual(head[:2], ["engine", "ms"])
            self.assertEqual("% of fp32 peak" in head, pct, head)
            self.assertIn("agreement vs torch", head)
            self.assertEqual(rows["vitc"][-1], "-")
            torch_row = [k for k in rows if k.startswith("PyTorch")][0]
            self.assertRegex(rows[torch_row][-1], r"^[0-9.]+x$")
            self.assertEqual(rows[torch_row][head.index("agreement vs torch")], "reference")
            ov_rows = [k for k in rows if k.startswith("OpenVINO")]
            self.assertEqual(len(ov_rows), 0 if title == "One prompt" else 1)
            for k in ov_rows:
                self.assertIn("not run", rows[k][1])
                self.assertEqual(len(rows[k]), len(head))
            for k in rows:
                self.assertEqual(len(rows[k]), len(head), rows[k])

    def test_agreement(self):
        """vitc against transformers on the photo: the embedding, the three
        masks' logits at the photo's size, the depth map."""
        ag = self.res["agreement"]
        for w, title in (("sam_encoder", "SAM ViT-B image encoder"), ("sam_prompt", "One prompt"),
                         ("depth", "Depth Anything small")):
            e = ag[w]["vitc"]
            self.assertIsInstance(e, float, (w, e))
            self.assertLess(e, 1e-4, w)
            head, rows = self.table(title)
            cell = rows["vitc"][head.index("agreement vs torch")]
            self.assertTrue(cell.startswith("%.1e" % e), (cell, e))
        self.assertGreater(ag["sam_prompt"]["vitc_mask_iou"], 0.99)
        # masks neither empty nor the whole photo: the IoU is not trivially 1
        frac = ag["sam_prompt"]["torch_mask_fraction"]
        self.assertEqual(len(frac), 3)
        self.assertTrue(any(0.001 < f < 0.999 for f in frac), frac)
        self.assertIn("torch's masks cover", self.text)
        self.assertRegex(self.text, r"\(mask IoU [01]\.\d{4}\)")

    def test_flops(self):
        """The SAM count written out against torch's counter, which sees the
        GEMMs and convolutions but not the SAM attention's products: the
        written count is the larger, by those products alone."""
        p = self.res["prepare"]
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import dense
        v = dense.SAM_TINY
        g, n, ws, D = 10, 16, 4, v["hidden_size"]
        att = 2 * 9 * (4 * n * n * D + 2 * n * 2 * ws * D) + 4 * g ** 4 * D + 2 * g * g * 2 * g * D
        self.assertAlmostEqual(p["sam_encoder_gflop"], dense.sam_encoder_flops(v) / 1e9)
        self.assertLess(p["sam_encoder_gflop_counted"], p["sam_encoder_gflop"])
        self.assertGreater(p["sam_encoder_gflop_counted"] + att / 1e9, p["sam_encoder_gflop"])
        self.assertGreater(p["depth_gflop_counted"], 0)
        self.assertTrue(re.search(r"%% of peak: %.3g GFLOP" % p["sam_encoder_gflop"], self.text))


if __name__ == "__main__":
    unittest.main()
