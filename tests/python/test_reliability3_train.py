"""Reliability, third round (part B): regressions for the `vitc train`
defects. Each test fails on the code before its fix.

M6  every output (--out, --model-out, --log) is checked before the first
    step: a missing folder, a directory, a FIFO, a link, two options naming
    one file (the run used to train an epoch, then fail or clobber).
M7  data errors visible at start-up (test labels the training set lacks, a
    class folder that is not UTF-8) stop the run before the first step,
    with the right message (was: after an epoch, "out of memory").
L2  --log: a FIFO is refused at once (fopen blocked), a device and write
    errors are errors (every record was lost with exit 0).
L3  a training set with no readable image is an error (exit 0, loss 0).
L4  --resume holds the record to the options' ranges and strict types, and
    the optimizer state to finite values (exp_avg_sq >= 0).
L5  temporaries of a checkpoint writer that died are removed.
L6  two runs on one --out: the second is refused while the first runs.
L7  --resume with nothing left to do still writes --model-out.
L10 image paths in train's warnings are escaped.
SIGHUP (and SIGPIPE from a stderr whose reader is gone: an SSH drop
    without a terminal) stops a run as SIGINT/SIGTERM do, the partial epoch
    saved.
"""
import json
import os
import signal
import subprocess
import time
import unittest

import numpy as np

import vitc

try:
    from PIL import Image
except ImportError:  # pragma: no cover
    Image = None

try:
    from .util import VITC, TmpDirCase, run_vitc as run
except ImportError:  # run as a script
    from util import VITC, TmpDirCase, run_vitc as run

HAVE_VITC = os.path.exists(VITC)
FASHION = "/usr/share/datasets/fashion-mnist"
# A tiny model on 8x8 images: a run is a few milliseconds.
TINY = ["--image-size", 8, "--patch", 4, "--depth", 1, "--dim", 16, "--heads", 1, "--mlp", 16,
        "--batch", 4, "--quiet"]
# Slow enough (Fashion-MNIST, 49 tokens, batch 32) for a signal or a second
# run to land while it trains.
SLOW = ["--data", "fashion-mnist", "--subset", 6000, "--eval-subset", 64, "--patch", 4,
        "--dim", 96, "--batch", 32, "--epochs", 3, "--quiet"]


def errors(err):
    return [l for l in err.splitlines() if l.startswith("vitc: error:")]


def steps(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [l for l in f if '"type": "step"' in l]


@unittest.skipIf(Image is None or not HAVE_VITC, "needs PIL and build/vitc")
class TrainCase(TmpDirCase):
    TMP_PREFIX = "vitc_r3train_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = cls.folder(os.path.join(cls.tmp, "data"))

    @staticmethod
    def folder(root, classes=(b"a", b"b"), n=6, bad=()):
        """An ImageFolder of 8x8 PNGs: train/ and val/, classes as bytes;
        bad: extra (class, name) files that do not decode."""
        rng = np.random.default_rng(0)
        for split, k in (("train", n), ("val", 2)):
            for ci, c in enumerate(classes):
                d = os.path.join(os.fsencode(root), split.encode(), c)
                os.makedirs(d, exist_ok=True)
                for i in range(k):
                    px = np.clip(40 + 160 * ci + rng.normal(0, 10, (8, 8, 3)), 0, 255)
                    Image.fromarray(px.astype(np.uint8)).save(os.path.join(d, b"%d.png" % i))
        for c, name in bad:
            with open(os.path.join(os.fsencode(root), b"train", c, name), "wb") as f:
                f.write(b"\x89PNG\r\n\x1a\nnot a png")
        return root

    def train(self, *args, data=None, **kw):
        return run("train", "--data", data or self.data, *TINY, *args, **kw)

    def ckpt(self, name, epochs=1):
        """A checkpoint of a finished tiny run of `epochs` epochs."""
        out = self.path(name)
        rc, _, err = self.train("--epochs", epochs, "--out", out)
        self.assertEqual(rc, 0, err)
        return out

    def fails_at_start(self, args, expect, status=1, **kw):
        """The run fails with one error line holding expect, before its
        first step: no epoch was trained (nor its work lost)."""
        rc, _, err = self.train(*args, **kw)
        self.assertEqual(rc, status, err)
        lines = errors(err)
        self.assertEqual(len(lines), 1, err)
        self.assertIn(expect, lines[0])
        self.assertNotIn("epoch 1/", err)
        return err


class TestM6Outputs(TrainCase):
    def test_bad_outputs_fail_before_the_first_step(self):
        """Each used to train a whole epoch, then fail writing (or, for a
        link, write through it into the file it points at)."""
        afile = self.path("afile")
        with open(afile, "w") as f:
            f.write("x")
        fifo = self.path("fifo")
        os.mkfifo(fifo)
        target = self.path("elsewhere.safetensors")
        with open(target, "wb") as f:
            f.write(b"precious")
        link = self.path("link.safetensors")
        os.symlink(target, link)
        good = self.path("good.safetensors")
        cases = [
            (["--out", self.path("no/such/dir/m.safetensors")], "--out", "No such file"),
            (["--out", self.tmp], "--out", "is a directory"),
            (["--out", os.path.join(afile, "m.safetensors")], "--out", "Not a directory"),
            (["--out", fifo], "--out", "is a FIFO"),
            (["--out", link], "--out", "symbolic link"),
            (["--out", good, "--model-out", self.path("no/dir/m.safetensors")], "--model-out",
             "No such file"),
            (["--out", good, "--model-out", self.tmp], "--model-out", "is a directory"),
            (["--out", good, "--model-out", link], "--model-out", "symbolic link"),
            (["--out", good, "--log", self.path("no/dir/log.jsonl")], "--log", "No such file"),
            (["--out", good, "--log", link], "--log", "symbolic link"),
        ]
        for args, opt, why in cases:
            with self.subTest(args=args):
                log = self.path("steps.jsonl")
                extra = [] if "--log" in args else ["--log", log]
                err = self.fails_at_start(args + ["--epochs", 1] + extra, opt)
                self.assertIn(why, errors(err)[0])
                self.assertEqual(steps(log), [], "a step was trained")
        with open(target, "rb") as f:
            self.assertEqual(f.read(), b"precious")
        self.assertFalse(os.path.exists(good))

    def test_outputs_are_distinct_files(self):
        """--model-out equal to --out replaced the checkpoint by the model
        alone (the run then could not resume), exit 0; --log equal to the
        --resume checkpoint appended text to it."""
        ck = self.ckpt("d.safetensors")
        for args, expect in (
                (["--out", ck, "--model-out", "./" + os.path.relpath(ck)], "name the same file"),
                (["--out", self.path("d2.safetensors"), "--resume", ck, "--log", ck],
                 "is the --resume file")):
            with self.subTest(args=args):
                self.fails_at_start(args + ["--epochs", 2], expect, status=2)
        self.assertIn("vitc.train", vitc.load_safetensors(ck)[1])


class TestM7Data(TrainCase):
    def test_non_utf8_class_folder(self):
        """Was: an epoch trained, then "out of memory writing a checkpoint"."""
        data = self.folder(self.path("bytes"), classes=(b"a", b"b\xff"))
        err = self.fails_at_start(["--epochs", 1, "--out", self.path("u.safetensors")],
                                  "is not valid UTF-8", data=data)
        self.assertIn("rename the folder", err)

    def test_test_labels_the_training_set_lacks(self):
        """IDX: a test label (12) beyond the training set's classes (0..9)
        failed in the evaluation after the first epoch."""
        d = self.path("idx")
        os.makedirs(d)
        rng = np.random.default_rng(1)

        def idx(name, arr):
            hdr = bytes([0, 0, 8, arr.ndim]) + b"".join(int(x).to_bytes(4, "big")
                                                        for x in arr.shape)
            with open(os.path.join(d, name), "wb") as f:
                f.write(hdr + arr.astype(np.uint8).tobytes())
        idx("train-images-idx3-ubyte", rng.integers(0, 255, (16, 8, 8)))
        idx("train-labels-idx1-ubyte", np.arange(16) % 3)
        idx("t10k-images-idx3-ubyte", rng.integers(0, 255, (8, 8, 8)))
        idx("t10k-labels-idx1-ubyte", np.array([0, 1, 2, 3, 4, 5, 6, 12]))
        self.fails_at_start(["--epochs", 1, "--out", self.path("i.safetensors")],
                            "test labels go up to 12", data=d)


class TestL2Log(TrainCase):
    def test_fifo_and_device_refused(self):
        """A FIFO without a reader blocked fopen forever; /dev/full took
        every record and the run exited 0."""
        fifo = self.path("log.fifo")
        os.mkfifo(fifo)
        out = self.path("l.safetensors")
        rc, _, err = self.train("--epochs", 1, "--out", out, "--log", fifo, timeout=60)
        self.assertEqual(rc, 1, err)
        self.assertIn("is a FIFO", err)
        rc, _, err = self.train("--epochs", 1, "--out", out, "--log", "/dev/full")
        self.assertEqual(rc, 1, err)
        self.assertIn("is a character device", err)

    def test_write_error_stops_the_run(self):
        """A log that cannot grow (RLIMIT_FSIZE below its size: appending
        fails, the checkpoint still fits) lost every record with exit 0; now
        the run stops, saves its checkpoint and exits 1."""
        ck = self.ckpt("w.safetensors")
        size = os.path.getsize(ck)
        log = self.path("full.jsonl")
        with open(log, "w") as f:
            f.write("\n" * (4 * size))
        rc, _, err = self.train("--resume", ck, "--epochs", 3, "--out", ck, "--log", log,
                                fsize=2 * size)
        self.assertEqual(rc, 1, err)
        lines = errors(err)
        self.assertEqual(len(lines), 1, err)
        self.assertIn("--log %s: write failed: File too large" % log, lines[0])
        self.assertIn("stopped by the --log error at epoch 2, step 1", err)
        meta = json.loads(vitc.load_safetensors(ck)[1]["vitc.train"])
        self.assertEqual((meta["epoch"], meta["step_in_epoch"]), (1, 1))


class TestL3NoReadableImage(TrainCase):
    def test_all_unreadable(self):
        d = self.path("broken")
        for c in ("a", "b"):
            os.makedirs(os.path.join(d, "train", c))
            for i in range(3):
                with open(os.path.join(d, "train", c, "%d.png" % i), "wb") as f:
                    f.write(b"\x89PNG\r\n\x1a\nnot a png")
        out = self.path("none.safetensors")
        rc, _, err = self.train("--epochs", 1, "--out", out, data=d)
        self.assertEqual(rc, 1, err)
        self.assertIn("none of the 6 training images could be read", err)
        self.assertNotIn("loss 0.0000", err)
        self.assertFalse(os.path.exists(out))


class TestL4Resume(TrainCase):
    def tampered(self, name, meta=None, tensors=None):
        ck = self.ckpt(name)
        t, m = vitc.load_safetensors(ck)
        rec = json.loads(m["vitc.train"])
        rec.update(meta or {})
        m["vitc.train"] = json.dumps(rec)
        for k, f in (tensors or {}).items():
            t[k] = f(t[k])
        vitc.save_safetensors(ck, t, m)
        return ck

    def test_record_out_of_range(self):
        cases = [({"lr": 1e300}, '"lr" is 1e+300, outside [0, 10]'),
                 ({"weight_decay": 1e10}, '"weight_decay" is 1e+10'),
                 ({"schedule": "bogus"}, '"schedule" must be none, cosine or onecycle'),
                 ({"seed": "abc"}, '"seed" must be a string of decimal digits'),
                 ({"seed": "-1"}, '"seed" must be a string of decimal digits'),
                 ({"seed": "99999999999999999999999"}, '"seed" must be'),
                 ({"batch": 4.5}, '"batch" is not a number; expected an integer'),
                 ({"epoch": "0"}, '"epoch" is not a number'),
                 ({"label_smoothing": 2}, '"label_smoothing" is 2'),
                 ({"min_lr": -1}, '"min_lr" is -1'),
                 ({"lr_layer_decay": 0}, '"lr_layer_decay" is 0'),
                 ({"optimizer": "sgd"}, '"optimizer" is not "adamw"')]
        for i, (change, expect) in enumerate(cases):
            with self.subTest(change=change):
                ck = self.tampered("r%d.safetensors" % i, meta=change)
                self.fails_at_start(["--resume", ck, "--epochs", 2, "--out", ck], expect)

    def test_optimizer_state_finite(self):
        def neg(a):
            a = a.copy()
            a[3] = -1
            return a

        def nan(a):
            a = a.copy()
            a[5] = np.nan
            return a
        for i, (key, f, expect) in enumerate([
                ("vitc.optim.exp_avg_sq", neg, "vitc.optim.exp_avg_sq[3] is -1"),
                ("vitc.optim.exp_avg_sq", nan, "vitc.optim.exp_avg_sq[5] is nan"),
                ("vitc.optim.exp_avg", nan, "vitc.optim.exp_avg[5] is nan")]):
            with self.subTest(key=key, i=i):
                ck = self.tampered("o%d.safetensors" % i, tensors={key: f})
                self.fails_at_start(["--resume", ck, "--epochs", 2, "--out", ck], expect)

    def test_untampered_still_resumes(self):
        ck = self.tampered("ok.safetensors")
        rc, _, err = self.train("--resume", ck, "--epochs", 2, "--out", ck)
        self.assertEqual(rc, 0, err)


class TestL5StaleTemps(TrainCase):
    def test_dead_writers_temporaries_removed(self):
        ck = self.ckpt("t.safetensors")
        p = subprocess.Popen(["true"])
        p.wait()
        dead, alive = p.pid, os.getpid()
        left = ["t.safetensors.tmp%d.0" % dead, "t.safetensors.tmp%d.17" % dead,
                "t.safetensors.model%d.tmp" % dead, "t.safetensors.model%d.tmp.tmp%d.2" % (dead, dead)]
        kept = ["t.safetensors.tmp%d.0" % alive, "t.safetensors.tmp%dx.0" % dead,
                "other.safetensors.tmp%d.0" % dead, "t.safetensors.tmp.0"]
        for n in left + kept:
            with open(self.path(n), "wb") as f:
                f.write(b"partial")
        rc, _, err = self.train("--resume", ck, "--epochs", 2, "--out", ck)
        self.assertEqual(rc, 0, err)
        for n in left:
            self.assertFalse(os.path.exists(self.path(n)), n)
        for n in kept:
            self.assertTrue(os.path.exists(self.path(n)), n)


class TestL7NothingLeft(TrainCase):
    def test_model_out_written(self):
        ck = self.ckpt("n.safetensors", epochs=2)
        mo = self.path("n_model.safetensors")
        rc, _, err = self.train("--resume", ck, "--epochs", 2, "--out", ck, "--model-out", mo)
        self.assertEqual(rc, 0, err)
        self.assertIn("nothing to do", err)
        meta = vitc.load_safetensors(mo)[1]
        self.assertIn("vitc.trained_by", meta)
        self.assertNotIn("vitc.train", meta)


class TestL10Escaped(TrainCase):
    def test_skipped_image_path_escaped(self):
        d = self.folder(self.path("esc"), bad=[(b"a", b"x\x1b]0;pwn\x07\r.png")])
        rc, _, err = self.train("--epochs", 1, "--out", self.path("e.safetensors"), data=d)
        self.assertEqual(rc, 0, err)
        for c in "\x1b\x07\r":
            self.assertNotIn(c, err)
        self.assertIn("x\\x1b]0;pwn\\x07\\x0d.png", err)


@unittest.skipIf(not os.path.isdir(FASHION), "needs dataset-fashion-mnist")
class TestSlowRuns(TrainCase):
    def start(self, out, log):
        p = subprocess.Popen([VITC, "train", *map(str, SLOW), "--out", out, "--log", log],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        t0 = time.time()
        while not steps(log) and p.poll() is None and time.time() - t0 < 60:
            time.sleep(0.05)
        self.assertIsNone(p.poll(), "the run ended before its first step")
        return p

    def test_l6_second_run_on_one_out_refused(self):
        """Both runs used to finish with exit 0, the last writer's file
        winning."""
        out, log = self.path("lock.safetensors"), self.path("lock.jsonl")
        p = self.start(out, log)
        try:
            rc, _, err = run("train", *SLOW, "--out", out, "--log", self.path("other.jsonl"))
            self.assertEqual(rc, 1, err)
            self.assertIn("another vitc train (process %d) is writing it" % p.pid,
                          errors(err)[0])
        finally:
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=120)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM)
        self.assertFalse(os.path.exists(out + ".lock"), "the lock file was left")
        # the lock is free again
        rc, _, err = self.train("--epochs", 1, "--out", out)
        self.assertEqual(rc, 0, err)

    def test_sighup_saves_the_partial_epoch(self):
        """SIGHUP (an SSH session dropped) killed the run: the partial
        epoch was lost."""
        out, log = self.path("hup.safetensors"), self.path("hup.jsonl")
        p = self.start(out, log)
        p.send_signal(signal.SIGHUP)
        _, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 128 + signal.SIGHUP, err.decode())
        self.assertIn("stopped by signal %d" % signal.SIGHUP, err.decode())
        meta = json.loads(vitc.load_safetensors(out)[1]["vitc.train"])
        self.assertEqual(meta["epoch"], 0)
        self.assertGreater(meta["step_in_epoch"], 0)


    def test_sigpipe_saves_too(self):
        """An SSH session without a terminal drops as SIGPIPE at the next
        line written to stderr: it killed the run, losing the epoch begun."""
        out, log = self.path("pipe.safetensors"), self.path("pipe.jsonl")
        args = SLOW[:2] + ["--subset", 512] + SLOW[4:-3] + ["--epochs", 50, "--quiet"]
        p = subprocess.Popen([VITC, "train", *map(str, args), "--out", out, "--log", log],
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        t0 = time.time()
        while not steps(log) and time.time() - t0 < 60:
            time.sleep(0.05)
        p.stderr.close()  # the reader is gone: the epoch's line raises SIGPIPE
        p.wait(timeout=120)
        self.assertEqual(p.returncode, 128 + signal.SIGPIPE)
        meta = json.loads(vitc.load_safetensors(out)[1]["vitc.train"])
        self.assertEqual((meta["epoch"], meta["step_in_epoch"]), (1, 1))


if __name__ == "__main__":
    unittest.main()
