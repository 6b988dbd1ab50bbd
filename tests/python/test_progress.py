"""What the commands say on stderr: train's closing line and its run-wide
ETA, the lines naming what attention-map and embed --out wrote, no progress
lines when stderr is not a terminal, and train --resume keeping
--eval-subset as it keeps --subset."""
import json
import os
import re
import subprocess
import unittest

import numpy as np

try:
    from PIL import Image
except ImportError:  # pragma: no cover
    Image = None

try:
    from .util import DATA, VITC, TmpDirCase, run_vitc as run
except ImportError:  # run as a script
    from util import DATA, VITC, TmpDirCase, run_vitc as run

ARCH = ["--arch", "fashion", "--image-size", "16", "--patch", "8", "--depth", "1", "--dim",
        "16", "--heads", "1", "--mlp", "16", "--channels", "3", "--batch", "4"]


def epochs(log):
    with open(log) as f:
        return [r for r in map(json.loads, f) if r["type"] == "epoch"]


@unittest.skipIf(Image is None or not os.path.exists(VITC), "needs PIL and build/vitc")
class TestProgress(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = os.path.join(cls.tmp, "folder")
        rng = np.random.default_rng(0)
        for split, n in (("train", 6), ("val", 4)):
            for c, level in (("dark", 40), ("light", 210)):
                os.makedirs(os.path.join(cls.data, split, c))
                for i in range(n):
                    px = np.clip(level + rng.normal(0, 10, (16, 16, 3)), 0, 255)
                    Image.fromarray(px.astype(np.uint8)).save(
                        os.path.join(cls.data, split, c, "%d.png" % i))

    def train(self, *args):
        rc, out, err = run("train", "--data", self.data, *args)
        self.assertEqual(rc, 0, err)
        return err

    def test_resume_keeps_eval_subset(self):
        a, b, log = self.path("r1.safetensors"), self.path("r2.safetensors"), self.path("r.jsonl")
        self.train(*ARCH, "--subset", 6, "--eval-subset", 3, "--epochs", 1, "--out", a, "--log",
                   log, "--quiet")
        self.train("--resume", a, "--epochs", 2, "--out", b, "--log", log, "--quiet")
        self.assertEqual([r["eval_images"] for r in epochs(log)], [3, 3])
        # given again, it wins
        c = self.path("r3.safetensors")
        self.train("--resume", b, "--epochs", 3, "--eval-subset", 5, "--out", c, "--log", log,
                   "--quiet")
        self.assertEqual([r["eval_images"] for r in epochs(log)], [3, 3, 5])

    def model(self):
        m = self.path("model.safetensors")
        if not os.path.exists(m):
            self.train(*ARCH, "--epochs", 1, "--out", m, "--quiet")
        return m

    def test_train_closing_line(self):
        out, ship, log = self.path("c.safetensors"), self.path("c_ship.safetensors"), \
            self.path("c.jsonl")
        err = self.train(*ARCH, "--epochs", 2, "--out", out, "--model-out", ship, "--log", log,
                         "--quiet")
        last = err.splitlines()[-1]
        m = re.fullmatch(r"vitc: trained 2 epochs in [0-9.]+s; best val accuracy ([0-9.]+)% "
                         r"\(epoch ([12])\); wrote (.*) and (.*)", last)
        self.assertIsNotNone(m, err)
        accs = [r["eval_acc"] for r in epochs(log)]
        self.assertAlmostEqual(float(m.group(1)), 100 * max(accs), places=1)
        self.assertEqual(int(m.group(2)), accs.index(max(accs)) + 1)
        self.assertEqual((m.group(3), m.group(4)), (out, ship))
        # a resumed run counts its own epochs
        err = self.train("--resume", out, "--epochs", 3, "--out", out, "--quiet")
        self.assertRegex(err.splitlines()[-1], r"^vitc: trained 1 epoch in .*; wrote %s$"
                         % re.escape(out))

    def test_train_progress_off_a_terminal(self):
        # stderr not a terminal: one progress line an epoch (its end), not
        # one a step
        err = self.train(*ARCH, "--epochs", 2, "--out", self.path("e.safetensors"))
        bars = [l for l in err.splitlines() if l.startswith("epoch ") and "ETA" in l]
        self.assertEqual(len(bars), 2, err)

    def test_success_lines(self):
        m = self.model()
        png, raw = self.path("am.png"), self.path("am.npy")
        rc, out, err = run("attention-map", "--model", m, "--out", png, "--raw", raw,
                           os.path.join(DATA, "photo.png"))
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "")
        self.assertRegex(err, r"^vitc: wrote %s \(\d+x\d+, rollout attention; the raw map in %s\)\n$"
                         % (re.escape(png), re.escape(raw)))
        rc, out, err = run("attention-map", "--model", m, "--out", png, "--quiet",
                           os.path.join(DATA, "photo.png"))
        self.assertEqual((rc, out, err), (0, "", ""))
        npy = self.path("e.npy")
        imgs = [os.path.join(DATA, n) for n in ("photo.png", "photo.jpg", "rgb8.png")]
        rc, out, err = run("embed", "--model", m, "--out", npy, *imgs)
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "vitc: wrote %s (3 embeddings of 16 floats)\n" % npy)
        rc, out, err = run("embed", "--model", m, "--out", npy, "--quiet", *imgs)
        self.assertEqual((rc, err), (0, ""))

    def test_no_progress_lines_off_a_terminal(self):
        m = self.model()
        imgs = [os.path.join(DATA, n) for n in ("photo.png", "photo.jpg", "rgb8.png")] * 4
        rc, out, err = run("embed", "--model", m, "--batch", 1, "--json", *imgs)
        self.assertEqual((rc, err), (0, ""))
        rc, out, err = run("eval", "--model", m, "--data", self.data)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("img/s", err)
        idx = os.path.join(self.data, "train", "dark")
        rc, out, err = run("similar", "--model", m, "--index", idx, "--no-cache", "--batch", 1,
                           os.path.join(DATA, "photo.png"))
        self.assertEqual((rc, err), (0, ""))

    def test_progress_on_a_terminal(self):
        import pty
        m = self.model()
        imgs = [os.path.join(DATA, n) for n in ("photo.png", "photo.jpg", "rgb8.png")] * 3
        master, slave = pty.openpty()
        p = subprocess.Popen([VITC, "embed", "--model", m, "--batch", "1", "--json", *imgs],
                             stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        chunks = []
        while True:
            try:
                b = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not b:
                break
            chunks.append(b)
        os.close(master)
        self.assertEqual(p.wait(), 0)
        text = b"".join(chunks).decode()
        self.assertRegex(text, r"embed: 9/9 images, [0-9.]+ img/s, ETA 0:00")
        self.assertTrue(text.endswith("\r\x1b[K"), repr(text[-40:]))


if __name__ == "__main__":
    unittest.main()
