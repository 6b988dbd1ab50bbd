"""Every ```python block of README.md runs as pasted, from the source tree's
root (tests/data/photo.jpg is there), in a fresh namespace. Blocks that
begin with "# needs" use files a user downloads first and are only
compiled."""
import os
import re
import tempfile
import unittest

from tests.python.util import ROOT

try:
    import torch  # noqa: F401
except ImportError:
    torch = None


def readme_blocks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    out = []
    for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        line = text.count("\n", 0, m.start()) + 2
        out.append((line, m.group(1)))
    return out


class TestReadmePython(unittest.TestCase):
    def test_blocks_run(self):
        blocks = readme_blocks()
        self.assertGreaterEqual(len(blocks), 10)
        cwd = os.getcwd()
        with tempfile.TemporaryDirectory(prefix="vitc_readme_") as tmp:
            # files the snippets write land here; tests/data is where the README says
            os.symlink(os.path.join(ROOT, "tests"), os.path.join(tmp, "tests"))
            try:
                os.chdir(tmp)
                for line, code in blocks:
                    with self.subTest(readme_line=line):
                        compiled = compile(code, "README.md:%d" % line, "exec")
                        if code.startswith("# needs"):
                            continue
                        if torch is None and re.search(r"\bimport .*\btorch\b", code):
                            continue  # the C-only setups: the numpy-only blocks still run
                        exec(compiled, {"__name__": "__readme__"})
            finally:
                os.chdir(cwd)


if __name__ == "__main__":
    unittest.main()
