"""vitc.cpu_info(): the CPU and the GEMM blocking, against sysfs, the
rules worked out here independently, and the forcing variables."""
import json
import os
import subprocess
import sys
import unittest

import vitc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read(path):
    with open(path) as f:
        return f.read().strip()


def sysfs_cache(level):
    base = "/sys/devices/system/cpu/cpu0/cache"
    for i in range(8):
        d = os.path.join(base, "index%d" % i)
        try:
            lv = int(read(os.path.join(d, "level")))
            kind = read(os.path.join(d, "type"))
            size = read(os.path.join(d, "size"))
        except OSError:
            return None
        if lv == level and kind != "Instruction":
            mul = {"K": 1024, "M": 1 << 20}.get(size[-1], 1)
            return int(size.rstrip("KM")) * mul
    return None


def child_info(**env):
    """cpu_info() in a fresh process with the environment given."""
    e = dict(os.environ, **env)
    e["PYTHONPATH"] = os.path.join(ROOT, "python")
    p = subprocess.run([sys.executable, "-c", "import json, vitc; print(json.dumps(vitc.cpu_info()))"],
                       capture_output=True, text=True, env=e, check=True)
    return json.loads(p.stdout)


class TestCpuInfo(unittest.TestCase):
    def test_keys_and_caches(self):
        if os.environ.get("VITC_CACHE") or os.environ.get("VITC_BLOCKING"):
            self.skipTest("forcing variables set")
        c = vitc.cpu_info()
        for k in ("id", "vendor", "brand", "uarch", "datapath", "cache_from", "arch",
                  "blocking_from"):
            self.assertIsInstance(c[k], str, k)
        self.assertEqual(c["arch"], vitc.get_arch())
        self.assertIn(c["datapath"], ("256", "512", "none", "unknown"))
        self.assertTrue(c["id"].endswith("-f%dm%d" % (c["family"], c["model"])), c["id"])
        if c["cache_from"] == "cpuid":
            for level, key in ((1, "l1d"), (2, "l2")):
                s = sysfs_cache(level)
                if s:
                    self.assertEqual(c[key], s, key)
        text = vitc.cpu_info(text=True)
        self.assertIn("[%s]" % c["id"], text)
        self.assertIn("fp32 kc %d mc %d nc %d" % (c["kc"], c["mc"], c["nc"]), text)

    def test_forced(self):
        # an Intel core's caches pretended: the A block grows with L2, kc
        # stays the kernel's deepest (the rules in docs/kernels.md)
        c = child_info(VITC_CACHE="l1d=48K,l2=2M,l3=105M", VITC_ARCH="avx512")
        self.assertEqual((c["l1d"], c["l2"], c["cache_from"]), (48 << 10, 2 << 20, "VITC_CACHE"))
        if c["arch"] == "avx512":
            self.assertEqual((c["kc"], c["mc"], c["nc"]), (1024, 144, 1024))
        self.assertEqual((c["lp_mc"], c["lp_nb"]), (288, 768 << 10))
        c = child_info(VITC_BLOCKING="kc=256,mc=100,nc=500,lp_nb=64K")
        self.assertEqual(c["kc"], 256)
        self.assertEqual(c["lp_nb"], 64 << 10)
        mr = {"avx512": 12}.get(c["arch"], 6)
        self.assertEqual(c["mc"], 100 // mr * mr)
        self.assertIn("VITC_BLOCKING=", c["blocking_from"])
        c = child_info(VITC_BLOCKING="kc=lots")
        self.assertIn("ignored", c["blocking_from"])

    @unittest.skipUnless(os.path.exists(os.path.join(ROOT, "build", "vitc")), "needs build/vitc")
    def test_bench_names_the_cpu_as_vitc(self):
        """bench.py's per-CPU file is named from `vitc --version`, as the
        library names the CPU; the index lists each file's CPU and date."""
        import tempfile
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        try:
            import bench
        finally:
            sys.path.pop(0)
        ver = subprocess.run([os.path.join(ROOT, "build", "vitc"), "--version"],
                             capture_output=True, text=True, check=True).stdout
        info = bench.parse_version(ver)
        self.assertEqual(info["cpu_id"], vitc.cpu_info()["id"])
        self.assertTrue(info["vitc"].startswith("vitc "))
        self.assertIn("blocking", info["caches_line"])
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "x-f1m2.md"), "w") as f:
                f.write("# x\n\n- date: 2026-01-02 03:04 UTC (run took 5 s)\n"
                        "- CPU (as vitc reads it): Some CPU [x-f1m2]\n"
                        "- measured FMA peak (avx512, fp32): 1.0 GFLOP/s on 1 core "
                        "(`vitc bench --peak-only`, ...)\n")
            bench.cpu_results_index(d)
            index = read(os.path.join(d, "README.md"))
        self.assertIn("| [x-f1m2](x-f1m2.md) | Some CPU [x-f1m2] | 2026-01-02 03:04 UTC | "
                      "1.0 GFLOP/s on 1 core |", index)


if __name__ == "__main__":
    unittest.main()
