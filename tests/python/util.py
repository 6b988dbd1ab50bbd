"""Helpers the Python tests share: where the tree and the CLI are, running
the CLI and the tools' scripts, the exporter's command line for the tests'
tiny models, torch when it is installed with tests/reference's modules, and
a test class with a scratch directory."""
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VITC = os.path.join(ROOT, "build", "vitc")
EXPORT = os.path.join(ROOT, "tools", "export_safetensors.py")
DATA = os.path.join(ROOT, "tests", "data")
PHOTO = os.path.join(DATA, "photo.png")
REFERENCE = os.path.join(ROOT, "tests", "reference")


def run_vitc(*args, fsize=None, timeout=None):
    """build/vitc with args (made strings); (returncode, stdout, stderr).
    fsize: RLIMIT_FSIZE for the child (a full disk), or None."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    p = subprocess.run([VITC] + [str(a) for a in args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout,
                       preexec_fn=limit if fsize is not None else None)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def run_script(script, *args):
    """A Python script (tools/*.py) under this interpreter with args (made
    strings); (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, script] + [str(a) for a in args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def reference_modules(*names):
    """tests/reference's modules (hf_ref, st_write, t2t_ref, ...; they need
    torch) by name, in that order; all None without torch."""
    if REFERENCE not in sys.path:
        sys.path.insert(0, REFERENCE)
    if torch is None:
        return tuple(None for _ in names)
    return tuple(importlib.import_module(n) for n in names)


def read_idx(path):
    """A gzip IDX file (Fashion-MNIST as Debian ships it) as a uint8 array."""
    import gzip
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def random_images(gen, sizes, batch=2):
    """{size: torch.randn(batch, 3, H, W)} drawn from the generator gen in
    the order of sizes, each an (H, W) pair or an int (square)."""
    out = {}
    for s in sizes:
        h, w = (s, s) if isinstance(s, int) else s
        out[s] = torch.randn(batch, 3, h, w, generator=gen)
    return out


class TmpDirCase(unittest.TestCase):
    """A test class with a scratch directory, cls.tmp (prefix TMP_PREFIX),
    removed after the class's last test."""
    TMP_PREFIX = "vitc_"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix=cls.TMP_PREFIX)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        """name in the scratch directory."""
        return os.path.join(self.tmp, name)


def write_json(path, obj):
    """obj as JSON in path, its directory made when missing (a model
    directory's config.json, preprocessor_config.json, ...)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f)


def export_cmd(pth, out, *extra, num_heads=2):
    """The command line of tools/export_safetensors.py from pth to out."""
    return [sys.executable, EXPORT, pth, out, "--num-heads", str(num_heads)] + list(extra)


def assert_close(test, got, ref, what, tol=1e-4):
    """got equals ref (same shape) within tol·max(1, |ref|), the project's
    parity rule; the message names what and the largest error."""
    import numpy as np
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    test.assertEqual(got.shape, ref.shape, what)
    err = np.abs(got - ref) / np.maximum(1.0, np.abs(ref))
    test.assertLess(err.max(), tol, "%s: max rel err %g" % (what, err.max()))
