"""Helpers the Python tests share: where the tree and the CLI are, running
the CLI, and the exporter's command line for the tests' tiny models."""
import os
import resource
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VITC = os.path.join(ROOT, "build", "vitc")
EXPORT = os.path.join(ROOT, "tools", "export_safetensors.py")


def run_vitc(*args, fsize=None, timeout=None):
    """build/vitc with args (made strings); (returncode, stdout, stderr).
    fsize: RLIMIT_FSIZE for the child (a full disk), or None."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    p = subprocess.run([VITC] + [str(a) for a in args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout,
                       preexec_fn=limit if fsize is not None else None)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def export_cmd(pth, out, *extra, num_heads=2):
    """The command line of tools/export_safetensors.py from pth to out."""
    return [sys.executable, EXPORT, pth, out, "--num-heads", str(num_heads)] + list(extra)


def assert_close(test, got, ref, what, tol=1e-4):
    """got equals ref (same shape) within tol·max(1, |ref|), DESIGN.md's
    parity rule; the message names what and the largest error."""
    import numpy as np
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    test.assertEqual(got.shape, ref.shape, what)
    err = np.abs(got - ref) / np.maximum(1.0, np.abs(ref))
    test.assertLess(err.max(), tol, "%s: max rel err %g" % (what, err.max()))
