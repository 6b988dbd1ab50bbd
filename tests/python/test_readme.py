"""Every ```python block of README.md, and of the docs pages that took the
README's examples (the layers, the Python tour, the training pieces), runs
as pasted, from the source tree's root (tests/data/photo.jpg is there), in
a fresh namespace. Blocks that begin with "# needs" use files a user
downloads first and are only compiled."""
import os
import re
import tempfile
import unittest

from tests.python.util import ROOT

try:
    import torch  # noqa: F401
except ImportError:
    torch = None


# The pages whose examples run, with the fewest blocks each must hold, so
# that a page losing its examples fails here instead of passing vacuously.
PAGES = {"README.md": 2, "docs/layers.md": 10, "docs/python.md": 2,
         "docs/training-api.md": 1}


def readme_blocks():
    out = []
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            text = f.read()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, m.start()) + 2
            out.append(("%s:%d" % (page, line), m.group(1)))
    return out


class TestReadmePython(unittest.TestCase):
    def test_blocks_run(self):
        blocks = readme_blocks()
        for page, least in PAGES.items():
            n = sum(1 for where, _ in blocks if where.startswith(page + ":"))
            self.assertGreaterEqual(n, least, "%s has %d python blocks" % (page, n))
        cwd = os.getcwd()
        with tempfile.TemporaryDirectory(prefix="vitc_readme_") as tmp:
            # files the snippets write land here; tests/data is where the README says
            os.symlink(os.path.join(ROOT, "tests"), os.path.join(tmp, "tests"))
            try:
                os.chdir(tmp)
                for where, code in blocks:
                    with self.subTest(block=where):
                        compiled = compile(code, where, "exec")
                        if code.startswith("# needs"):
                            continue
                        if torch is None and re.search(r"\bimport .*\btorch\b", code):
                            continue  # the C-only setups: the numpy-only blocks still run
                        exec(compiled, {"__name__": "__readme__"})
            finally:
                os.chdir(cwd)


if __name__ == "__main__":
    unittest.main()
