"""The CLI and the exporter with inputs that are not files and outputs that cannot be written.

A FIFO given where vitc expects a file must be refused at once (it used to
block forever in open); a failed write must leave the earlier file at
--out/--raw byte-identical and no temporary file behind; a device node given
as --out is refused and still exists afterwards. A full disk is simulated
with RLIMIT_FSIZE (writes past it fail with EFBIG; vitc ignores SIGXFSZ
itself), a device node with a private copy of /dev/full made by mknod in the
test's own directory (root only) — never a system path.
"""
import os
import resource
import signal
import stat
import subprocess
import tempfile
import unittest

try:
    import torch
    from torchvision.models.vision_transformer import VisionTransformer
except ImportError:  # pragma: no cover
    torch = None

try:
    from .util import DATA, VITC, TmpDirCase, export_cmd, run_vitc
except ImportError:  # run as a script
    from util import DATA, VITC, TmpDirCase, export_cmd, run_vitc

IMAGE = os.path.join(DATA, "rgb8.png")


def run(*args, fsize=None):
    return run_vitc(*args, fsize=fsize, timeout=5)


@unittest.skipIf(torch is None or not os.path.exists(VITC), "needs torch and build/vitc")
class TestFiles(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        d = cls.tmp
        torch.manual_seed(0)
        m = VisionTransformer(image_size=48, patch_size=16, num_layers=1, num_heads=2,
                              hidden_dim=32, mlp_dim=64, num_classes=4)
        cls.pth = os.path.join(d, "tiny.pth")
        torch.save(m.state_dict(), cls.pth)
        cls.model = os.path.join(d, "tiny.safetensors")
        subprocess.run(cls.export(cls.model), check=True, stdout=subprocess.DEVNULL)

    @classmethod
    def export(cls, out):
        return export_cmd(cls.pth, out)

    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=self.tmp)

    def one_error_line(self, rc, err, needle):
        self.assertEqual(rc, 1, err)
        lines = err.strip().split("\n")
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("vitc: error: "), err)
        self.assertIn(needle, lines[0])

    def test_fifo_inputs_refused_at_once(self):
        fifo = os.path.join(self.dir, "fifo")
        os.mkfifo(fifo)
        labels = os.path.join(self.dir, "labels.txt")
        with open(labels, "w") as f:
            f.write("a\nb\nc\nd\n")
        out = os.path.join(self.dir, "o.png")
        for args in (["classify", "--model", fifo, IMAGE],
                     ["classify", "--model", self.model, "--labels", fifo, IMAGE],
                     ["attention-map", "--model", fifo, "--out", out, IMAGE],
                     ["attention-map", "--model", self.model, "--out", out, fifo],
                     ["inspect", fifo]):
            rc, _, err = run(*args)  # a hang raises TimeoutExpired
            self.one_error_line(rc, err, "is a FIFO")
        # classify goes on past a bad image and then says how many failed
        rc, _, err = run("classify", "--model", self.model, fifo)
        self.assertEqual(rc, 1, err)
        self.assertTrue(err.startswith("vitc: error: %s: is a FIFO" % fifo), err)
        self.assertEqual(os.listdir(self.dir), ["fifo", "labels.txt"])

    def write_fails_and_keeps(self, args, victim, needle, fsize=None):
        others = sorted(os.listdir(self.dir))
        with open(victim, "rb") as f:
            before = f.read()
        rc, _, err = run(*args, fsize=fsize)
        self.one_error_line(rc, err, needle)
        with open(victim, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(sorted(os.listdir(self.dir)), others)  # no temporary file left

    def test_full_disk_keeps_earlier_output(self):
        out, raw = os.path.join(self.dir, "map.png"), os.path.join(self.dir, "map.npy")
        for p in (out, raw):
            with open(p, "wb") as f:
                f.write(b"an earlier result\n")
        # the PNG is several KB: 1 KB of file size is not enough
        self.write_fails_and_keeps(["attention-map", "--model", self.model, "--out", out, IMAGE],
                                   out, "map.png: write failed: File too large", fsize=1024)
        # the .npy of a 3x3 grid is 164 bytes
        self.write_fails_and_keeps(["attention-map", "--model", self.model, "--raw", raw,
                                    "--out", out, IMAGE],
                                   raw, "map.npy: write failed: File too large", fsize=100)
        # and with room, both are replaced
        rc, _, err = run("attention-map", "--model", self.model, "--raw", raw, "--out", out,
                         IMAGE)
        self.assertEqual(rc, 0, err)
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        with open(raw, "rb") as f:
            self.assertEqual(f.read(6), b"\x93NUMPY")

    def test_non_regular_outputs_left_alone(self):
        fifo, sub = os.path.join(self.dir, "fifo"), os.path.join(self.dir, "sub")
        os.mkfifo(fifo)
        os.mkdir(sub)
        targets = [(fifo, "is a FIFO", stat.S_ISFIFO), (sub, "is a directory", stat.S_ISDIR)]
        if os.geteuid() == 0:
            dev = os.path.join(self.dir, "full")
            os.mknod(dev, stat.S_IFCHR | 0o600, os.makedev(1, 7))
            targets.append((dev, "is a character device", stat.S_ISCHR))
        for path, needle, kind in targets:
            for opt in ("--out", "--raw"):
                args = ["attention-map", "--model", self.model, opt, path, IMAGE]
                if opt == "--raw":
                    args += ["--out", os.path.join(self.dir, "ok.png")]
                rc, _, err = run(*args)
                self.one_error_line(rc, err, needle)
                self.assertTrue(kind(os.lstat(path).st_mode), path)
        self.assertNotIn("ok.png", os.listdir(self.dir))  # --raw is written first

    def test_exporter_never_loses_output(self):
        fifo, out = os.path.join(self.dir, "fifo"), os.path.join(self.dir, "w.safetensors")
        os.mkfifo(fifo)
        p = subprocess.run(self.export(fifo), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"not a regular file", p.stderr)
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        with open(out, "wb") as f:
            f.write(b"an earlier export\n")

        def full_disk():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        p = subprocess.run(self.export(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=60, preexec_fn=full_disk)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(b"File too large", p.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"an earlier export\n")
        self.assertEqual(sorted(os.listdir(self.dir)), ["fifo", "w.safetensors"])


if __name__ == "__main__":
    unittest.main()
