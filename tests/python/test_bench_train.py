"""bench.py's training rows against torch.compile, the measured peaks per
precision and the "Targets (issue 26)" section.

- `vitc bench --peak-only` measures the fp32, bf16 and int8 peaks (those
  this CPU has; AMX tiles where present), in JSON and in its text lines.
  (Their ratios, 1 : 2 : 4 on Zen 4, are not asserted: on a shared machine
  any one of the three can read low.)
- bench.py's "% peak" of a bf16 or int8 configuration is over that
  precision's own peak, and the targets section judges the targets and
  prints the bound of one the measured peak rules out (on made-up results:
  the numbers of the issue).
- The torch.compile training child end to end at --quick size. Inductor
  takes minutes to compile even the tiny model on 2 cores, so the test
  asks for the aot_eager backend: the same child and driver (the model
  wrapped in torch.compile, forward and backward traced, the first step
  timed apart), without inductor's code generation.
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
    import torchvision  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None

BENCH = os.path.join(ROOT, "bench", "bench.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench  # noqa: E402
import targets  # noqa: E402


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


@unittest.skipIf(not os.path.exists(VITC), "needs build/vitc")
class TestPeakOnly(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rc, out, err = run_vitc("bench", "--peak-only", "--json", "--quiet", "--threads", "1")
        cls.rc, cls.err = rc, err
        cls.res = json.loads(out) if rc == 0 else {}

    def test_every_precision(self):
        self.assertEqual(self.rc, 0, self.err)
        p = self.res["peaks"]
        self.assertEqual(sorted(p), ["bf16", "fp32", "int8"])
        self.assertGreater(p["fp32"]["one_thread"], 0)
        # the older key stays, the same figure
        self.assertEqual(self.res["fma_peak"]["gflops_1_thread"], p["fp32"]["one_thread"])
        flags = cpu_flags()
        for prec, flag, unit in (("bf16", "avx512_bf16", "GFLOP/s"),
                                 ("int8", "avx512_vnni", "GOP/s")):
            if flag in flags:
                self.assertIn(p[prec]["isa"], (flag, "amx"))
                self.assertEqual(p[prec]["unit"], unit)
                self.assertGreater(p[prec]["one_thread"], 0)
            elif prec == "bf16" and "amx_bf16" not in flags:
                self.assertIsNone(p[prec]["isa"])
                self.assertIn("AVX512-BF16", p[prec]["why"])

    def test_text_lines(self):
        rc, out, err = run_vitc("bench", "--peak-only", "--quiet", "--threads", "1")
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"\nFMA peak \((avx512|avx2|scalar), measured\): [0-9.]+ GFLOP/s "
                              r"on 1 core\n")
        for prec, unit in (("bf16", "GFLOP/s"), ("int8", "GOP/s")):
            line = re.search(r"^%s peak.*$" % prec, out, re.M)
            self.assertIsNotNone(line, out)
            self.assertRegex(line.group(0), r"^%s peak( \([a-z0-9_]+, measured\): [0-9.]+ %s "
                                            r"on 1 core|: none \(.+\))" % (prec, unit))

    def test_run_measures_its_precision_only(self):
        # a run of fp32 rows measures fp32's peak, not the others
        rc, out, err = run_vitc("bench", "--json", "--quiet", "--only", "mha", "--repeat", "1",
                                "--threads", "1")
        self.assertEqual(rc, 0, err)
        r = json.loads(out)
        self.assertEqual(list(r["peaks"]), ["fp32"])
        w = r["workloads"][0]
        self.assertEqual(w["peak_precision"], "fp32")
        self.assertAlmostEqual(w["peak_fraction"], w["gflops"] / r["peaks"]["fp32"]["one_thread"],
                               delta=1e-3)


def fake_child(ms, peak_kb=1024):
    return {"status": "ok", "times_ms": [ms], "base_rss_kb": 0, "built_hwm_kb": peak_kb,
            "built_rss_kb": 0, "run_hwm_kb": peak_kb, "hwm_reset": True, "_maxrss_kb": peak_kb}


# What `vitc bench --peak-only --json` prints on this Zen 4 (issue 26's figures).
PEAKS = {"fma_peak": {"isa": "avx512", "gflops_1_thread": 117.2, "gflops_all_threads": 234.4},
         "peaks": {"fp32": {"isa": "avx512", "unit": "GFLOP/s", "one_thread": 117.2,
                            "all_threads": 234.4, "threads": 2},
                   "bf16": {"isa": "avx512_bf16", "unit": "GFLOP/s", "one_thread": 234.0,
                            "all_threads": 468.0, "threads": 2},
                   "int8": {"isa": "avx512_vnni", "unit": "GOP/s", "one_thread": 467.5,
                            "all_threads": 935.0, "threads": 2}}}


class TestOwnPeak(unittest.TestCase):
    def peak(self):
        p = {"isa": "?", "p1": 0.0, "pn": 0.0, "prec": {}}
        lower = json.loads(json.dumps(PEAKS))
        for q in lower["peaks"].values():
            q["one_thread"] /= 2  # a disturbed measurement: the best is kept
        targets.merge_peaks(p, lower)
        targets.merge_peaks(p, PEAKS)
        return p

    def test_merge_and_line(self):
        p = self.peak()
        self.assertEqual((p["p1"], p["pn"]), (117.2, 234.4))
        self.assertEqual(p["prec"]["int8"]["p1"], 467.5)
        self.assertEqual(targets.peaks_line(p, 2),
                         "fp32 234.4 GFLOP/s (avx512; 117.2 on 1 core) / bf16 468.0 GFLOP/s "
                         "(avx512_bf16; 234.0 on 1 core) / int8 935.0 GOP/s (avx512_vnni; 467.5 "
                         "on 1 core) on 2 threads at once")
        p["prec"]["bf16"] = {"isa": None, "p1": 0.0, "pn": 0.0, "why": "no AVX512-BF16"}
        self.assertIn("/ bf16 none (no AVX512-BF16) /", targets.peaks_line(p, 2))

    def test_each_precision_over_its_own(self):
        flops = bench.flops_of("vit_b16_b8")  # 281 GFLOP
        runs = {c: [fake_child(ms)] for c, ms in (
            ("vitc-2", 1400.0), ("torch-2", 1900.0), ("vitc_bf16-2", 800.0),
            ("torch_bf16-2", 1500.0), ("vitc_int8-2", 500.0), ("ort_int8-2", 900.0),
            ("compile-2", 1700.0))}
        s = bench.summarize("vit_b16_b8", runs, flops, self.peak())
        own = {"fp32": 117.2, "bf16": 234.0, "int8": 467.5}
        for cfg, r in s.items():
            prec = {"vitc_bf16": "bf16", "torch_bf16": "bf16", "vitc_int8": "int8",
                    "ort_int8": "int8"}.get(cfg.split("-")[0], "fp32")
            self.assertEqual(r["precision"], prec)
            gf = flops / (r["median_ms"] * 1e-3) * 1e-9
            self.assertAlmostEqual(r["peak_frac"], gf / (own[prec] * 2), places=9)
        # vitc bf16: 351 GFLOP/s, 75% of the bf16 peak (150% of fp32's)
        self.assertAlmostEqual(s["vitc_bf16-2"]["peak_frac"], 0.750, delta=0.002)
        table = "\n".join(targets.own_peak_table({"vit_b16_b8": s}, bench.TRAIN, bench.fmt))
        self.assertIn("| vitc | bf16 | 351.3 (75%) |", table)
        self.assertIn("| ONNX Runtime | int8 | 312.2 (33%) |", table)
        self.assertIn("| torch.compile (inductor) | fp32 | 165.3 (71%) |", table)
        self.assertIn("| PyTorch eager | fp32 | 147.9 (63%) |", table)
        self.assertIn("| PyTorch eager | bf16 | 187.3 (40%) |", table)


class TestTargets(unittest.TestCase):
    """The section on bench/results.md's numbers of 2026-11-26 (issue 26)."""

    def summary(self, torch_vit_ms=5119.0):
        peak = {"isa": "avx512", "p1": 117.2, "pn": 234.4, "prec": {}}
        targets.merge_peaks(peak, PEAKS)
        # the full sizes' counts (bench.QUICK may have been set by another test)
        flops = {"train_fmnist": 3 * bench.vit_flops(128, 28, 4, 1, 96, 6, 192, 10),
                 "train_vit_b16_b8": 3 * bench.vit_flops(8, 224, 16, 3, 768, 12, 3072, 1000),
                 "vit_b16_b1": bench.vit_flops(1, 224, 16, 3, 768, 12, 3072, 1000)}
        runs = {"train_fmnist": {"vitc-2": 120.0, "torch-1": 248.0, "torch-2": 260.0,
                                 "compile-2": 150.0},
                "train_vit_b16_b8": {"vitc-2": 3987.0, "torch-2": torch_vit_ms},
                "vit_b16_b1": {"vitc-2": 160.0, "vitc_bf16-2": 81.0, "torch-2": 200.0}}
        mem = {"vitc-2": 1024 * 900, "torch-2": 1024 * 1400}
        s = {n: bench.summarize(n, {c: [fake_child(ms, mem.get(c, 1024))]
                                    for c, ms in r.items()}, flops[n], peak)
             for n, r in runs.items()}
        # vitc's last block on the class rows alone: 12.7% and 6.9% less work
        work = dict(flops)
        work["train_fmnist"] -= targets.cls_only_saving(128, 28, 4, 96, 192)
        work["train_vit_b16_b8"] -= targets.cls_only_saving(8, 224, 16, 768, 3072)
        self.assertAlmostEqual(work["train_vit_b16_b8"] / flops["train_vit_b16_b8"], 0.9308,
                               delta=1e-4)
        return s, flops, peak, work

    def test_judged(self):
        s, flops, peak, work = self.summary()
        md = "\n".join(targets.targets_section(s, flops, peak, "vitc-2", bench.VIT, False,
                                               bench.best_torch, work))
        rows = {r.split(" | ")[0][2:]: r for r in md.splitlines() if r.startswith("| ")}
        self.assertIn("2.07× (vitc 120.0 ms, torch eager 248.0 ms at 1 thr",
                      rows["train_fmnist: vitc ≥ 2.0× torch eager"])
        self.assertTrue(rows["train_fmnist: vitc ≥ 2.0× torch eager"].endswith("| yes |"))
        self.assertIn("1.25×", rows["train_fmnist: vitc ≥ 1.3× torch.compile"])
        self.assertTrue(rows["train_fmnist: vitc ≥ 1.3× torch.compile"].endswith("| **no** |"))
        # 1.5 × faster than 5,119 ms is 3,412.7 ms: 247.0 GFLOP/s of the counted 843.1
        # GFLOP, above the better of 234.4 (2 threads measured) and 2 × 117.2; but vitc
        # does 784.7 of them: 229.9 GFLOP/s, 98% of the peak, not above it
        vb = rows["train_vit_b16_b8: vitc ≥ 1.5× torch eager"]
        self.assertIn("1.28×", vb)
        self.assertIn("1.5× needs 3412.7 ms = 247.0 GFLOP/s, 229.9 of the work vitc does, 98% "
                      "of the measured fp32 peak 234.4)", vb)
        self.assertTrue(vb.endswith("| **no**: needs 98% of the measured fp32 peak over the "
                                    "whole step (norms, softmax, GELU and AdamW included) |"), vb)
        self.assertTrue(rows["train_vit_b16_b8: with less memory than torch eager"]
                        .endswith("| vitc 900 MB, torch eager 1400 MB (peak MB) | yes |"))
        # 35.13 GFLOP in 160 ms: 219.5 GFLOP/s, 93.7% of 2 × 117.2; bf16 81 ms: 433.7, 92.7%
        # of 2 × 234.0; int8 did not run: no row
        self.assertIn("| vit_b16_b1 fp32 forward: ≥ 90% of the measured fp32 peak | 93.7% "
                      "(219.5 GFLOP/s of 234.4) | yes |", md)
        self.assertIn("| vit_b16_b1 bf16 forward: ≥ 88% of the measured bf16 peak | 92.7% "
                      "(433.7 GFLOP/s of 468.0) | yes |", md)
        self.assertNotIn("int8", md)
        self.assertNotIn("| vit_b16_b8 ", md)
        # against the fastest other engine in the precision: fp32 PyTorch 200 ms; bf16 had
        # no other engine, so no row
        self.assertIn("| vit_b16_b1 fp32: vitc ≥ 1.1× the fastest other engine in fp32 | 1.25× "
                      "(vitc 160.0 ms at 2 thr; fastest: PyTorch eager 200.0 ms at 2 thr) | yes |",
                      md)
        self.assertNotIn("bf16: vitc ≥", md)

    def test_impossible(self):
        # torch eager at 4,800 ms: 1.5× needs 3,200 ms, 245.2 GFLOP/s of vitc's own work
        s, flops, peak, work = self.summary(4800.0)
        md = "\n".join(targets.targets_section(s, flops, peak, "vitc-2", bench.VIT, False,
                                               bench.best_torch, work))
        self.assertIn("| **no**: impossible on this CPU: needs 245.2 GFLOP/s > measured peak "
                      "234.4 GFLOP/s (fp32, 2 threads) |", md)
        self.assertEqual(md.count("impossible"), 1)

    def test_quick_judges_nothing(self):
        s, flops, peak, work = self.summary()
        md = "\n".join(targets.targets_section(s, flops, peak, "vitc-2", bench.VIT, True,
                                               bench.best_torch, work))
        self.assertIn("--quick", md)
        self.assertNotIn("yes", md)
        self.assertNotIn("impossible", md)


@unittest.skipIf(torch is None or not os.path.exists(VITC), "needs torch, torchvision, build/vitc")
class TestCompileChild(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        out = os.path.join(cls.tmp, "r.md")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        p = subprocess.run([sys.executable, BENCH, "--quick", "--only", "train_fmnist",
                            "--rounds", "1", "--threads", "1", "--engines", "compile",
                            "--compile-backend", "aot_eager", "--out", out],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=600)
        cls.rc, cls.err = p.returncode, p.stderr.decode()
        cls.md, cls.res = "", {}
        if os.path.exists(out):
            with open(out) as f:
                cls.md = f.read()
            with open(os.path.splitext(out)[0] + ".json") as f:
                cls.res = json.load(f)

    def test_compile_side(self):
        self.assertEqual(self.rc, 0, self.err[-2000:])
        s = self.res["summary"]["train_fmnist"]
        self.assertEqual(sorted(s), ["compile-1", "torch-1", "vitc-1"])
        c = s["compile-1"]
        self.assertEqual(c["status"], "ok", c)
        self.assertGreater(c["median_ms"], 0)
        self.assertEqual(len(c["compile_s"]), 1)
        self.assertGreater(c["compile_s"][0], 0)
        raw = self.res["raw"]["train_fmnist"]["compile-1"][0]
        self.assertEqual(raw["compile_backend"], "aot_eager")
        self.assertNotIn("compile_s", self.res["raw"]["train_fmnist"]["torch-1"][0])
        # memory measured as the eager child's
        for k in ("base_rss_kb", "built_hwm_kb", "built_rss_kb", "run_hwm_kb"):
            self.assertGreater(raw[k], 0)
        self.assertGreater(c["peak_mb"], 0)

    def test_markdown(self):
        self.assertRegex(self.md, r"\| train_fmnist vs torch\.compile \| \[128,1,28,28\] \| "
                                  r"[0-9.]+ \| [0-9.]+ \| [0-9.]+ \(1 thr\) \(compile [0-9]+ s\) \|")
        self.assertIn("backend aot_eager", self.md)
        self.assertRegex(self.md, r"\n- measured peaks: fp32 [0-9.]+ GFLOP/s \(")
        self.assertIn("## Targets (issue 26)", self.md)
        self.assertIn("| train_fmnist: vitc ≥ 1.3× torch.compile |", self.md)
        self.assertRegex(self.md, r"\| train_fmnist \| torch\.compile \(inductor\) fp32 \| 1 \|")
        # no engine ran on a forward: no own-peak table
        self.assertNotIn("### Engines", self.md)


if __name__ == "__main__":
    unittest.main()
