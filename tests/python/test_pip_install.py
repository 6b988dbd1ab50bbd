"""`pip install .` as users run it, with build isolation, from a copy of the
tree as a fresh clone has it (no build/): the wheel is built once and
installed into a new virtual environment with numpy 1.26, and the tree
itself is pip-installed into another with numpy 2. In each, a script run
outside the tree (no PYTHONPATH) checks that `import vitc` comes from that
environment and loads the library inside the package, and compares two
computations with NumPy in float64; the `vitc` console command runs the
bundled tool.

The build requirements come from the configured package index; without one
(no network) the tests are skipped, saying so.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest
import zipfile

import numpy as np

try:
    from .util import ROOT
except ImportError:  # run as a script
    from util import ROOT

# numpy 1.26 is the oldest the package allows (pyproject.toml); numpy 2 is
# the version this interpreter has, so the test needs nothing new from the
# index but the build requirements and numpy 1.26.
NUMPY_OLD = "1.26.0"
NUMPY_NEW = np.__version__ if np.__version__.startswith("2.") else None

# Run inside each environment, from a directory outside the tree; prints one
# JSON object for the test to check.
CHECK_SCRIPT = r'''
import json, math, os, sys
import numpy as np
import vitc
from vitc import _lib

def softmax64(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

rng = np.random.default_rng(19)
x = rng.standard_normal((3, 5, 7)).astype(np.float32)
q = rng.standard_normal((2, 4, 6, 8)).astype(np.float32)
k = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
v = rng.standard_normal((2, 4, 9, 5)).astype(np.float32)
sm = vitc.softmax(x, dim=-1)
att = vitc.scaled_dot_product_attention(q, k, v)
q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
att_ref = softmax64(q64 @ k64.swapaxes(-1, -2) / math.sqrt(8)) @ v64

vitc.save_safetensors(sys.argv[1], {"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
                      {"who": "test_pip_install"})
with open("/proc/self/maps") as f:
    loaded = sorted({l.split()[-1] for l in f if "libvitc" in l})
print(json.dumps({
    "prefix": os.path.realpath(sys.prefix),
    "vitc_file": os.path.realpath(vitc.__file__),
    "version": vitc.__version__,
    "numpy": np.__version__,
    "library_path": os.path.realpath(_lib.library_path),
    "loaded": [os.path.realpath(p) for p in loaded],
    "softmax_shape": list(sm.shape), "softmax_dtype": str(sm.dtype),
    "softmax_err": float(np.abs(sm - softmax64(x.astype(np.float64))).max()),
    "sdpa_shape": list(att.shape),
    "sdpa_err": float(np.abs(att - att_ref).max()),
}))
'''


def clean_env():
    """The environment of a user's shell: nothing pointing at this tree."""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "VITC_LIBRARY", "PYTHONHOME", "VIRTUAL_ENV",
              "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        env.pop(k, None)
    return env


def run(cmd, cwd, timeout=900):
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=clean_env(), timeout=timeout,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def base_python():
    """The interpreter this one's virtual environment was made from: a new
    environment made from it stands alone, not on top of the test's."""
    return getattr(sys, "_base_executable", None) or sys.executable


def build_requires():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        return ["setuptools>=77"]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["build-system"]["requires"]


def copy_checkout(dst):
    """The files a clone of this tree would have, uncommitted edits
    included: git's tracked and untracked-but-not-ignored files; without
    git, the tree less its build outputs and environments."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "-co", "--exclude-standard"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "build-*", "__pycache__", "*.egg-info"))
        return
    for rel in filter(None, out.decode().split("\0")):
        src = os.path.join(ROOT, rel)
        # A deleted tracked file, or the .venv symlink (.gitignore's .venv/
        # matches directories only).
        if not os.path.isfile(src) or rel.split("/")[0] == ".venv":
            continue
        os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dst, rel))


class PipInstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="vitc_pip_")
        try:
            cls._build_wheel()
        except BaseException:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def _build_wheel(cls):
        tmp = cls.tmp
        # Build isolation fetches these from the index; only when pip cannot
        # is this skipped (a machine without network or index).
        rc, out, err = run([sys.executable, "-m", "pip", "download", "--no-deps",
                            "-d", os.path.join(tmp, "probe")] + build_requires(), tmp, timeout=300)
        if rc != 0:
            last = (err.strip().splitlines() or ["(no message)"])[-1]
            raise unittest.SkipTest("pip cannot fetch the build requirements %s from the configured "
                                    "index (no network?): %s" % (build_requires(), last))
        cls.src = os.path.join(tmp, "src")
        copy_checkout(cls.src)
        assert not os.path.exists(os.path.join(cls.src, "build")), "the copy must start without build/"
        cls.run_dir = os.path.join(tmp, "run")
        os.makedirs(cls.run_dir)
        with open(os.path.join(tmp, "check.py"), "w") as f:
            f.write(CHECK_SCRIPT)
        rc, out, err = run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "-w", os.path.join(tmp, "wheels"), cls.src], tmp)
        if rc != 0:
            raise AssertionError("pip wheel failed (%d):\n%s\n%s" % (rc, out[-4000:], err[-4000:]))
        wheels = glob.glob(os.path.join(tmp, "wheels", "vitc-*.whl"))
        assert len(wheels) == 1, wheels
        cls.wheel = wheels[0]
        # Recorded now: the numpy-2 test adds a build/ of its own later.
        cls.src_build_after_wheel = os.path.exists(os.path.join(cls.src, "build"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def make_venv(self, name, *pip_args):
        venv = os.path.join(self.tmp, name)
        rc, out, err = run([base_python(), "-m", "venv", venv], self.tmp)
        self.assertEqual(rc, 0, "python -m venv failed:\n" + err)
        py = os.path.join(venv, "bin", "python")
        rc, out, err = run([py, "-m", "pip", "install"] + list(pip_args), self.tmp)
        self.assertEqual(rc, 0, "pip install %s failed:\n%s\n%s" % (pip_args, out[-4000:], err[-4000:]))
        return venv, out

    def check_venv(self, venv, numpy_version):
        """The binding and the console command in venv, run from outside
        the tree."""
        venv = os.path.realpath(venv)
        st = os.path.join(self.tmp, os.path.basename(venv) + ".safetensors")
        rc, out, err = run([os.path.join(venv, "bin", "python"), os.path.join(self.tmp, "check.py"), st],
                           self.run_dir)
        self.assertEqual(rc, 0, "the check script failed:\n" + err)
        r = json.loads(out)
        self.assertEqual(r["prefix"], venv)
        self.assertTrue(r["vitc_file"].startswith(venv + os.sep), r["vitc_file"])
        native = os.path.join(os.path.dirname(r["vitc_file"]), "_native")
        bundled = os.path.join(native, "libvitc.so.0")
        self.assertEqual(r["loaded"], [bundled], "the process mapped another libvitc")
        self.assertEqual(r["library_path"], bundled)
        self.assertEqual(r["numpy"], numpy_version)
        with open(os.path.join(ROOT, "Makefile")) as f:
            version = re.search(r"^VERSION\s*:=\s*(\S+)", f.read(), re.M).group(1)
        self.assertEqual(r["version"], version)
        self.assertEqual((r["softmax_shape"], r["softmax_dtype"]), ([3, 5, 7], "float32"))
        self.assertLess(r["softmax_err"], 1e-6)
        self.assertEqual(r["sdpa_shape"], [2, 4, 6, 5])
        self.assertLess(r["sdpa_err"], 1e-5)

        cmd = os.path.join(venv, "bin", "vitc")
        rc, out, err = run([cmd, "--help"], self.run_dir)
        self.assertEqual(rc, 0, err)
        self.assertIn("usage: vitc COMMAND", out)
        rc, out, err = run([cmd, "--version"], self.run_dir)
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.startswith("vitc %s (" % version), out)
        rc, out, err = run([cmd, "inspect", st], self.run_dir)
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"\n\s*w\s+F32\s+\[2, 3\]")
        self.assertIn("who: test_pip_install", out)
        # The tool's failure comes back unchanged: status and message.
        missing = os.path.join(self.tmp, "missing.safetensors")
        rc_tool, _, err_tool = run([os.path.join(native, "vitc"), "inspect", missing], self.run_dir)
        rc, out, err = run([cmd, "inspect", missing], self.run_dir)
        self.assertNotEqual(rc, 0)
        self.assertEqual((rc, err), (rc_tool, err_tool))
        return native

    def test_wheel(self):
        name = os.path.basename(self.wheel)
        plat = re.sub(r"[-.]", "_", sysconfig.get_platform())
        self.assertTrue(name.endswith("-py3-none-%s.whl" % plat), name)
        with zipfile.ZipFile(self.wheel) as z:
            modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
            meta = z.read([n for n in modes if n.endswith(".dist-info/METADATA")][0]).decode()
            wheel = z.read([n for n in modes if n.endswith(".dist-info/WHEEL")][0]).decode()
            entry = z.read([n for n in modes if n.endswith(".dist-info/entry_points.txt")][0]).decode()
        for f in ("vitc/_native/libvitc.so.0", "vitc/_native/vitc"):
            self.assertIn(f, modes)
            self.assertTrue(modes[f] & 0o111, "%s is not executable in the wheel" % f)
        self.assertIn("vitc/_cli.py", modes)
        self.assertIn("Root-Is-Purelib: false", wheel)
        self.assertIn("Requires-Dist: numpy>=1.26", meta)
        self.assertIn("vitc = vitc._cli:main", entry)
        self.assertFalse(self.src_build_after_wheel, "the package build wrote the Makefile's build/")

    @unittest.skipIf(NUMPY_NEW is None, "this interpreter's numpy is not 2.x")
    def test_install_tree_numpy2(self):
        # setuptools' default build folder is build/, the Makefile's: a stale
        # file there must not reach the installed package.
        stale = os.path.join(self.src, "build", "lib", "vitc", "stale_from_make_build.py")
        os.makedirs(os.path.dirname(stale))
        with open(stale, "w") as f:
            f.write("raise ImportError\n")
        venv, out = self.make_venv("venv-numpy2", "numpy==" + NUMPY_NEW, self.src)
        self.assertIn("Building wheel for vitc", out)
        native = self.check_venv(venv, NUMPY_NEW)
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(native), "stale_from_make_build.py")))

        # Without the tool, the command says so in one line.
        os.rename(os.path.join(native, "vitc"), os.path.join(native, "vitc.away"))
        try:
            rc, out, err = run([os.path.join(venv, "bin", "vitc"), "--help"], self.run_dir)
        finally:
            os.rename(os.path.join(native, "vitc.away"), os.path.join(native, "vitc"))
        self.assertEqual(rc, 127)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn("command-line tool is missing", err)

    def test_install_wheel_numpy126(self):
        venv, _ = self.make_venv("venv-numpy126", "numpy==" + NUMPY_OLD, self.wheel)
        self.check_venv(venv, NUMPY_OLD)


if __name__ == "__main__":
    unittest.main()
