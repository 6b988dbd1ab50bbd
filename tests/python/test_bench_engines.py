"""The engines part of bench/bench.py and bench/peers.py: the groups that
select the DINOv2 / CLIP / Fashion-MNIST engine tables, the
nearest-neighbour agreement against an independent numpy computation, the
Fashion-MNIST child on vitc and PyTorch over the first test images (vitc
fp32 against the torch reference of the shipped model), and the tables'
rendering. The full engine runs (ONNX export, NNCF) take minutes and are
left to `make bench`."""
import contextlib
import io
import json
import os
import subprocess
import sys
import unittest

import numpy as np

try:
    from .util import ROOT
except ImportError:  # run as a script
    from util import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench  # noqa: E402
import peers  # noqa: E402

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None


def child_json(f, *args):
    """A peers child run in this process: its one JSON line."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        f(*args)
    return json.loads(buf.getvalue().strip().splitlines()[-1])


class TestGroups(unittest.TestCase):
    def test_groups(self):
        self.assertEqual(bench.GROUPS["engines"], bench.VIT)
        self.assertEqual(bench.GROUPS["engines-dinov2"], ("dinov2_b14_b1", "dinov2_b14_b8"))
        self.assertEqual(bench.GROUPS["engines-clip"], ("clip_b16_b1", "clip_b16_b8"))
        self.assertEqual(bench.GROUPS["engines-fmnist"], ())
        for n in bench.ENGINE_ROWS:
            self.assertIn(n, bench.WORKLOADS)
        self.assertEqual([peers.kind_of(n) for n in bench.ENGINE_ROWS],
                         ["vit", "vit", "dinov2", "dinov2", "clip", "clip"])
        with self.assertRaises(ValueError):
            peers.kind_of("sdpa")

    def test_unknown_group_refused(self):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench.py"), "--only",
                            "engines-vit"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("unknown workload 'engines-vit'", p.stderr.decode())


class TestAgreement(unittest.TestCase):
    @staticmethod
    def nearest(e):
        """numpy: each row's nearest other row by cosine similarity."""
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
        s = e @ e.T
        np.fill_diagonal(s, -np.inf)
        return s.argmax(1)

    def test_nn_agree(self):
        rng = np.random.default_rng(0)
        rows, dim = 16, 24
        ref = rng.standard_normal((rows, dim))
        for scale in (1e-3, 0.3, 1.0, 3.0):
            y = ref + scale * rng.standard_normal((rows, dim))
            want = float(np.mean(self.nearest(y) == self.nearest(ref)))
            got = peers.nn_agree(list(y.ravel()), list(ref.ravel()), rows)
            self.assertAlmostEqual(got, want, places=12, msg=scale)
        self.assertEqual(peers.nn_agree(list(ref.ravel()), list(ref.ravel()), rows), 1.0)
        # rows swapped in pairs: every nearest neighbour moves
        sw = ref.reshape(rows // 2, 2, dim)[:, ::-1].reshape(rows, dim)
        self.assertLess(peers.nn_agree(list(sw.ravel()), list(ref.ravel()), rows), 0.5)
        self.assertIsNone(peers.nn_agree([1.0] * 10, [1.0] * 12, 2))

    def test_fmnist_agree(self):
        res = {"vitc": {"pred": [0, 1, 2, 3]}, "vitc_int8": {"pred": [0, 1, 2, 4]},
               "ort": {"pred": [5, 5, 5, 5]}, "ort_int8": {"pred": [5, 5, 1, 1]},
               "ov_int8": {"pred": [1, 1, 1, 1]}}
        a = peers.fmnist_agree(res)
        self.assertEqual(a["vitc_int8"], 0.75)
        self.assertEqual(a["ort_int8"], 0.5)  # against ONNX Runtime fp32, not vitc's
        self.assertEqual(a["vitc"], 1.0)
        self.assertNotIn("ov_int8", a)  # no OpenVINO fp32 to compare with


@unittest.skipUnless(os.path.exists(peers.FASHION_MODEL), "no models/fashion-vit.safetensors")
@unittest.skipUnless(peers.fashion_available(), "Fashion-MNIST is not installed in %s"
                     % peers.FASHION_DIR)
class TestFashionChild(unittest.TestCase):
    N = 600  # two calls of FM_BATCH, the second one short

    def test_vitc_against_torch(self):
        got = {e: child_json(peers.fmnist_child, e, None, peers.FASHION_MODEL, 2, self.N)
               for e in ("vitc", "vitc_int8") + (("torch",) if torch else ())}
        x, y = peers.fashion_images(peers.FASHION_MODEL, "t10k", self.N)
        self.assertEqual(x.shape, (self.N, 1, 28, 28))
        for e, r in got.items():
            self.assertEqual(r["n"], self.N, e)
            self.assertAlmostEqual(r["acc"], float(np.mean(np.array(r["pred"]) == y)), 12)
            self.assertGreater(r["acc"], 0.85, e)  # the trained model, read right
        a = peers.fmnist_agree(got)
        self.assertGreaterEqual(a["vitc_int8"], 0.97)
        if torch:
            same = np.mean(np.array(got["vitc"]["pred"]) == np.array(got["torch"]["pred"]))
            self.assertGreaterEqual(same, 0.998)


class TestRender(unittest.TestCase):
    def test_fmnist_table(self):
        fm = {"model": "models/fashion-vit.safetensors", "limit": 0, "prepare":
              {"calibration": 300}, "notes": ["OpenVINO bf16 not run: no bf16"],
              "results": {"vitc": {"status": "ok", "n": 4, "acc": 0.75, "pred": [0, 1, 2, 3]},
                          "vitc_bf16": {"status": "ok", "n": 4, "acc": 0.5,
                                        "pred": [0, 1, 2, 2]},
                          "ort": {"status": "failed", "error": "onnx_export failed"}}}
        text = "\n".join(peers.fmnist_render(fm, bench.fmt, bench.cell))
        self.assertIn("## Fashion-MNIST: accuracy and agreement per engine", text)
        self.assertIn("| vitc | fp32 | 4 | 75.00% | reference |", text)
        self.assertIn("| vitc | bf16 | 4 | 50.00% | 75.00% |", text)
        self.assertIn("| ONNX Runtime | fp32 | | failed: onnx_export failed | |", text)
        self.assertIn("all 10,000 images", text)
        self.assertIn("- OpenVINO bf16 not run: no bf16", text)
        self.assertIn("calibrated on 300 Fashion-MNIST training images", text)

    def test_embedder_table(self):
        ok = {"status": "ok", "median_ms": 10.0, "peak_mb": 300.0}
        summary = {"dinov2_b14_b1": {"vitc-2": dict(ok), "torch-2": dict(ok, median_ms=20.0),
                                     "ort-2": dict(ok, median_ms=15.0)}}
        agree = {"dinov2_b14_b1": {"vitc": (3e-6, 1.0), "ort": (0.5, 0.25)}}

        class Args:
            engine_rounds, rounds = 2, 3
        text = "\n".join(peers.render(summary, "dinov2", ["ort"], agree, {"photos": 16}, Args,
                                      bench.fmt, bench.cell))
        self.assertIn("## Engines: DINOv2-B/14", text)
        self.assertIn("nearest neighbour by cosine similarity", text)
        self.assertIn("| vitc | fp32 | 10.0 | – | 300 | 3.0e-06 (100%) |", text)
        self.assertIn("| PyTorch eager | fp32 | 20.0 | 2.00× | 300 | reference |", text)
        self.assertIn("5.0e-01 (25%) **disagrees**", text)

    def test_ratio_within_the_engines_rounds(self):
        """An engine that ran in round 1 only is compared with vitc's round 1,
        not with vitc's median over every round: a machine twice as fast in
        round 2 must not make vitc look faster than the engine."""
        runs = {"vitc_int8-2": [{"status": "ok", "times_ms": [30.0, 31.0, 32.0]},
                                {"status": "ok", "times_ms": [15.0, 16.0, 17.0]},
                                {"status": "ok", "times_ms": [15.0, 16.0, 17.0]}],
                "ov_int8-2": [{"status": "ok", "times_ms": [33.0, 33.0, 33.0]}]}
        for r in [r for rs in runs.values() for r in rs]:
            r.update(base_rss_kb=0, built_hwm_kb=0, run_hwm_kb=0, built_rss_kb=0, _maxrss_kb=0)
        s = bench.summarize("vit_b16_b1", runs, 35.13e9, {})
        v, o = s["vitc_int8-2"], s["ov_int8-2"]
        self.assertEqual(v["median_ms"], 17.0)  # pooled over the three rounds
        self.assertEqual(peers.paired_ms(v, o), 31.0)  # round 1 alone
        self.assertEqual(peers.paired_ms(v, v), 17.0)
        summary = {"vit_b16_b1": s}

        class Args:
            engine_rounds, rounds = 1, 3
        text = "\n".join(peers.render(summary, "vit", ["ov_int8"], {}, {}, Args,
                                      bench.fmt, bench.cell))
        self.assertIn("| OpenVINO | int8 | 33.0 | 1.06× |", text)  # 33 / 31, not 33 / 17
        self.assertIn("over the rounds the engine ran in", text)

    def test_probe_section(self):
        """vitc's children sorted by the probe read around each: a child
        with both readings at or below the cut is close, both above far, one
        on each side neither; 1-thread children and the other engines are
        left out."""
        runs = {"vitc_int8-2": [{"status": "ok", "times_ms": [44.0, 45.0, 46.0],
                                 "_probe_ns": [62.0, 70.0]},
                                {"status": "ok", "times_ms": [54.0, 55.0, 56.0],
                                 "_probe_ns": [340.0, 351.0]},
                                {"status": "ok", "times_ms": [50.0], "_probe_ns": [90.0, 300.0]},
                                {"status": "failed", "_probe_ns": [60.0, 60.0]}],
                "vitc_int8-1": [{"status": "ok", "times_ms": [80.0], "_probe_ns": [60.0, 60.0]}],
                "ov_int8-2": [{"status": "ok", "times_ms": [70.0]}]}
        text = "\n".join(bench.probe_section({"vit_b16_b1": runs}))
        self.assertIn("| vit_b16_b1 | vitc int8 | 45.0 (62/70) · 55.0 (340/351) · 50.0 (90/300) "
                      "| 50.0 | 45.0 (1) | 55.0 (1) |", text)
        self.assertNotIn("80.0", text)
        self.assertNotIn("70.0 (", text)
        self.assertEqual(bench.probe_section({"vit_b16_b1": {"ov_int8-2": runs["ov_int8-2"]}}),
                         [])


@unittest.skipIf(torch is None, "needs torch, torchvision, onnx, onnxruntime, openvino, nncf")
class TestPrepareViT(unittest.TestCase):
    """The ViT-B/16's engine files: the ONNX export (torchvision's
    MultiheadAttention under no_grad takes a fused path the exporter
    refuses), ONNX Runtime's int8, OpenVINO's IR and NNCF int8 on two
    calibration samples, each step without an error."""

    def test_prepare(self):
        import tempfile

        import torchvision
        for mod in ("onnx", "onnxruntime", "openvino", "nncf"):
            try:
                __import__(mod)
            except ImportError:
                self.skipTest("no " + mod)
        with tempfile.TemporaryDirectory() as d:
            pth = os.path.join(d, "vit_b_16.pth")
            torch.manual_seed(0)
            torch.save(torchvision.models.vit_b_16().state_dict(), pth)
            out = os.path.join(d, "peers")
            os.makedirs(out)
            env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
            p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench.py"),
                                "--prepare-peers", out, "--child-weights", pth, "--calib", "2",
                                "--child-threads", "2", "--child-kind", "vit"],
                               capture_output=True, text=True, env=env, timeout=600)
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            r = json.loads(p.stdout.strip().splitlines()[-1])
            self.assertEqual(r.get("errors"), {}, r)
            self.assertEqual(set(r["seconds"]), {"onnx_export", "ort_quantize_dynamic",
                                                 "openvino_ir", "nncf_quantize"}, r)
            self.assertTrue(os.path.getsize(os.path.join(out, "vit_b_16.onnx")) > 300e6)


if __name__ == "__main__":
    unittest.main()
