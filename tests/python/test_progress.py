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


if __name__ == "__main__":
    unittest.main()
