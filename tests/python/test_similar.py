"""`vitc similar`'s index cache and results: the cache lives in the user's
cache directory (or --cache DIR), never in the image folder; one file per
folder, model and precision, each reused; the query image is left out of its
own results; an unusable cache directory costs one warning, not the run."""
import glob
import json
import os
import shutil
import stat
import subprocess
import time
import unittest

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

try:
    from .util import DATA, VITC, TmpDirCase, export_cmd
    from .test_cli import tiny_vit
except ImportError:  # run as a script
    from util import DATA, VITC, TmpDirCase, export_cmd
    from test_cli import tiny_vit

IMAGES = ("photo.jpg", "photo.png", "rgb8.png", "gray8.png", "palette.png")


@unittest.skipIf(torch is None or not os.path.exists(VITC), "needs torch and build/vitc")
class TestSimilar(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.models = []
        for seed in (0, 1):
            pth = os.path.join(cls.tmp, "m%d.pth" % seed)
            torch.save(tiny_vit(seed).state_dict(), pth)
            st = os.path.join(cls.tmp, "m%d.safetensors" % seed)
            subprocess.run(export_cmd(pth, st), check=True, stdout=subprocess.DEVNULL)
            cls.models.append(st)

    def setUp(self):
        # a fresh folder and cache home per test: no test sees another's cache
        self.case = os.path.join(self.tmp, self.id().rsplit(".", 1)[-1])
        self.index = os.path.join(self.case, "images")
        os.makedirs(self.index)
        for n in IMAGES:
            shutil.copy(os.path.join(DATA, n), self.index)
        self.xdg = os.path.join(self.case, "xdg")
        self.env = dict(os.environ, XDG_CACHE_HOME=self.xdg, HOME=os.path.join(self.case, "home"))

    def run_similar(self, *args, model=None, env=None):
        p = subprocess.run([VITC, "similar", "--model", model or self.models[0], "--index",
                            self.index] + [str(a) for a in args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or self.env)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def caches(self, d=None):
        return sorted(glob.glob(os.path.join(d or os.path.join(self.xdg, "vitc", "similar"),
                                             "*.safetensors")))

    def test_cache_in_xdg_not_in_folder(self):
        before = sorted(os.listdir(self.index))
        rc, out, err = self.run_similar("--json", os.path.join(DATA, "gray.jpg"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(out.splitlines()), 5)
        self.assertEqual(sorted(os.listdir(self.index)), before)
        self.assertEqual(len(self.caches()), 1)
        d = os.path.join(self.xdg, "vitc", "similar")
        self.assertEqual(stat.S_IMODE(os.stat(d).st_mode), 0o700)
        self.assertEqual(err, "")

    def test_home_cache_when_no_xdg(self):
        env = dict(self.env)
        del env["XDG_CACHE_HOME"]
        rc, _, err = self.run_similar(os.path.join(DATA, "gray.jpg"), env=env)
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(self.caches(os.path.join(env["HOME"], ".cache", "vitc",
                                                      "similar"))), 1)

    def test_read_only_folder(self):
        before = sorted(os.listdir(self.index))
        os.chmod(self.index, 0o555)
        try:
            for _ in range(2):
                rc, _, err = self.run_similar(os.path.join(DATA, "gray.jpg"))
                self.assertEqual(rc, 0, err)
                self.assertEqual(err, "")
        finally:
            os.chmod(self.index, 0o755)
        self.assertEqual(sorted(os.listdir(self.index)), before)
        self.assertEqual(len(self.caches()), 1)

    def test_old_cache_beside_images_ignored(self):
        old = os.path.join(self.index, ".vitc-similar.safetensors")
        with open(old, "wb") as f:
            f.write(b"not a cache")
        rc, _, err = self.run_similar(os.path.join(DATA, "gray.jpg"))
        self.assertEqual(rc, 0, err)
        with open(old, "rb") as f:
            self.assertEqual(f.read(), b"not a cache")

    def test_two_models_two_caches_each_reused(self):
        q = os.path.join(DATA, "gray.jpg")
        outs = {}
        for m in self.models:
            rc, outs[m], err = self.run_similar("--json", q, model=m)
            self.assertEqual(rc, 0, err)
        files = self.caches()
        self.assertEqual(len(files), 2)
        self.assertNotEqual(outs[self.models[0]], outs[self.models[1]])
        mtimes = {f: os.stat(f).st_mtime_ns for f in files}
        time.sleep(0.01)
        for m in self.models:  # switching back and forth re-embeds nothing
            rc, out, err = self.run_similar("--json", q, model=m)
            self.assertEqual(rc, 0, err)
            self.assertEqual(out, outs[m])
        self.assertEqual({f: os.stat(f).st_mtime_ns for f in self.caches()}, mtimes)
        # a precision is a third cache; a changed folder rewrites its own file
        rc, _, err = self.run_similar("--precision", "bf16", q)
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(self.caches()), 3)
        shutil.copy(os.path.join(DATA, "rgba8.png"), self.index)
        rc, out, err = self.run_similar("--json", "--topk", "10", q)
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(out.splitlines()), 6)
        self.assertEqual(len(self.caches()), 3)

    def test_query_in_folder_excluded(self):
        q = os.path.join(self.index, "photo.png")
        rc, out, err = self.run_similar("--json", "--topk", "10", q)
        self.assertEqual(rc, 0, err)
        got = [os.path.basename(json.loads(s)["image"]) for s in out.splitlines()]
        self.assertEqual(sorted(got), sorted(set(IMAGES) - {"photo.png"}))
        # also through another path to the same file (a symlink, ./)
        link = os.path.join(self.case, "link.png")
        os.symlink(q, link)
        rc, out2, err = self.run_similar("--json", "--topk", "10", link)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out2, out)
        # a copy elsewhere is another file: it finds its twin first
        rc, out, err = self.run_similar("--json", "--topk", "1", os.path.join(DATA, "photo.png"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(os.path.basename(json.loads(out)["image"]), "photo.png")
        self.assertAlmostEqual(json.loads(out)["score"], 1.0, places=5)

    def test_cache_option_and_no_cache(self):
        d = os.path.join(self.case, "mycache", "sub")
        rc, _, err = self.run_similar("--cache", d, os.path.join(DATA, "gray.jpg"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(self.caches(d)), 1)
        self.assertFalse(os.path.exists(self.xdg))
        rc, out, err = self.run_similar("--no-cache", "--json", os.path.join(DATA, "gray.jpg"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(out.splitlines()), 5)
        self.assertFalse(os.path.exists(self.xdg))
        rc, _, err = self.run_similar("--no-cache", "--cache", d, os.path.join(DATA, "gray.jpg"))
        self.assertEqual(rc, 2)

    def test_unusable_cache_dir_warns_once(self):
        blocker = os.path.join(self.case, "file")
        with open(blocker, "w") as f:
            f.write("x")
        env = dict(self.env, XDG_CACHE_HOME=blocker, HOME=blocker)
        before = sorted(os.listdir(self.index))
        rc, out, err = self.run_similar("--json", os.path.join(DATA, "gray.jpg"), env=env)
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(out.splitlines()), 5)
        lines = err.splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertIn("warning: no index cache", lines[0])
        self.assertEqual(sorted(os.listdir(self.index)), before)
        rc, _, err = self.run_similar("--cache", os.path.join(blocker, "c"),
                                      os.path.join(DATA, "gray.jpg"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn("--cache", err)


if __name__ == "__main__":
    unittest.main()
