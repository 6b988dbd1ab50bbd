"""The bad-input corpus (tests/badinput/): every case through the real `vitc`.

Each case of tests/badinput/manifest.json runs in a fresh child process and
must: exit as expected (1 with exactly one "vitc: error: ..." line on stderr,
or 2 for a usage error), finish within 5 s, peak at no more than 100 MB
(vitc's own ru_maxrss, from wait4 in a small launcher), and leave every output path that
existed before the run byte for byte as it was. FIFOs, device nodes, a full
file system and very large headers are made here, in a private temporary
directory, never at a system path.

Two stderr lines are allowed after the error line because they are fixed
summaries, not second messages: "Try 'vitc ... --help'." after a usage error
and classify's "vitc: N of M images could not be classified".
"""
import functools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VITC = os.path.join(ROOT, "build", "vitc")
HERE = os.path.join(ROOT, "tests", "badinput")
FILES = os.path.join(HERE, "files")
TIME_LIMIT_S = 5.0
MEMORY_LIMIT_KB = 100 * 1024

# Defects whose fix is not in main yet, {number: branch}: their cases are
# expected to fail until it lands (then the entry goes, or the run reports
# an unexpected success). Empty: every fix of issue 7 is in.
PENDING = {}

with open(os.path.join(HERE, "manifest.json")) as f:
    CASES = json.load(f)

SUMMARY = re.compile(r"^(Try 'vitc .*--help'\.|vitc: \d+ of \d+ images could not be classified)$")


# Runs in a fresh small interpreter and forks vitc from there: Linux carries
# the memory high-water mark of the process that exec()s into the new
# program, so vitc forked from this (torch-sized) test process would inherit
# its peak. Writes "exit-code-or-None seconds maxrss-kB" to argv[2].
LAUNCHER = r"""
import os, sys, time
limit, result, argv = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
t0 = time.monotonic()
pid = os.fork()
if pid == 0:
    try:
        os.execv(argv[0], argv)
    finally:
        os._exit(127)
code = None
while True:
    done, status, usage = os.wait4(pid, os.WNOHANG)
    if done:
        code = os.waitstatus_to_exitcode(status)
        break
    if time.monotonic() - t0 > limit:
        os.kill(pid, 9)
        done, status, usage = os.wait4(pid, 0)
        break
    time.sleep(0.005)
with open(result, "w") as f:
    f.write("%s %f %d" % (code, time.monotonic() - t0, usage.ru_maxrss))
"""


def run_bounded(args, cwd):
    """Run vitc; return (exit code or None on timeout, stdout, stderr, seconds, max RSS in KB)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as res:
        subprocess.run([sys.executable, "-S", "-c", LAUNCHER, str(TIME_LIMIT_S), res.name, VITC]
                       + args, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd,
                       check=True)
        code, secs, rss = res.read().split()
        out.seek(0)
        err.seek(0)
        return (None if code == "None" else int(code)), out.read(), err.read(), float(secs), \
            int(rss)


class Workspace:
    """A private directory with what a case's placeholders name."""

    def __init__(self, case):
        self.dir = tempfile.mkdtemp(prefix="vitc-bad-")
        self.mounts = []
        self.preexisting = {}
        self.devices = []
        self.values = {"tmp": os.path.join(self.dir, "scratch"),
                       "model": os.path.join(FILES, "model_ok.safetensors"),
                       "labels": os.path.join(FILES, "labels_ok.txt"),
                       "f": os.path.join(FILES, case["name"])}
        os.mkdir(self.values["tmp"])
        # Named as attention-map writes them (--out PNG, --raw .npy): it
        # refuses any other extension before reading anything.
        for key, name in (("out", "out.png"), ("raw", "raw.npy")):
            path = os.path.join(self.dir, name)
            self.keep(path, os.urandom(64) + b"the user's earlier output\n")
            self.values[key] = path
        setup = case.get("setup")
        if setup:
            self.values["setup"] = getattr(self, "setup_" + setup["kind"])(setup)

    def keep(self, path, data):
        with open(path, "wb") as f:
            f.write(data)
        self.preexisting[path] = data

    def setup_fifo(self, spec):
        path = os.path.join(self.dir, "fifo")
        os.mkfifo(path)
        return path

    def setup_device(self, spec):
        if os.geteuid() != 0:
            raise unittest.SkipTest("making a device node needs root")
        path = os.path.join(self.dir, "full")
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # a private /dev/full
        self.devices.append(path)
        return path

    def setup_full_fs(self, spec):
        mnt = os.path.join(self.dir, "fs")
        os.mkdir(mnt)
        if os.geteuid() != 0 or subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt],
                stderr=subprocess.DEVNULL).returncode != 0:
            raise unittest.SkipTest("mounting a small tmpfs needs root")
        self.mounts.append(mnt)
        target = os.path.join(mnt, "out.png")
        self.keep(target, b"\x89PNG earlier output " * 100)
        try:  # fill what is left, so any new file fails with ENOSPC
            with open(os.path.join(mnt, "filler"), "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass
        return target

    def setup_huge_header(self, spec):
        path = os.path.join(self.dir, "huge.safetensors")
        h = b"{" + b",".join(b'"%d":{}' % i for i in range(spec["objects"])) + b"}"
        with open(path, "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h)
        return path

    def args(self, case):
        return [re.sub(r"\{(\w+)\}", lambda m: self.values[m.group(1)], a) for a in case["args"]]

    def close(self):
        for m in self.mounts:
            subprocess.run(["umount", m])
        shutil.rmtree(self.dir, ignore_errors=True)


def check_case(self, case):
    ws = Workspace(case)
    try:
        args = ws.args(case)
        code, out, err, secs, rss_kb = run_bounded(args, ROOT)
        what = "vitc %s" % " ".join(args)
        self.assertIsNotNone(code, "%s: still running after %.0f s" % (what, TIME_LIMIT_S))
        self.assertLessEqual(secs, TIME_LIMIT_S, what)
        self.assertLessEqual(rss_kb, MEMORY_LIMIT_KB, "%s: peak %d MB" % (what, rss_kb // 1024))
        lines = err.decode("utf-8", "replace").splitlines()
        expect = case["expect"]
        if expect == "bounded" and code == 0:
            return
        if expect == "clean":
            self.assertEqual(code, 0, "%s: exit %s, stderr %r" % (what, code, err))
            self.assertIsNone(re.search(rb"[\x00-\x08\x0b-\x1f\x7f]", out),
                              "%s: control characters on stdout: %r" % (what, out))
            return
        want = 2 if expect == "usage" else 1
        self.assertEqual(code, want, "%s: exit %s (want %d), stderr %r" % (what, code, want, err))
        self.assertTrue(lines and lines[0].startswith("vitc: error: "),
                        "%s: stderr %r" % (what, err))
        self.assertTrue(all(SUMMARY.match(l) for l in lines[1:]),
                        "%s: more than one message on stderr: %r" % (what, err))
        for path, data in ws.preexisting.items():
            with open(path, "rb") as f:
                self.assertEqual(f.read(), data, "%s: %s changed" % (what, path))
        for path in ws.devices:
            self.assertTrue(stat.S_ISCHR(os.lstat(path).st_mode), "%s: %s replaced" % (what, path))
    finally:
        ws.close()


@unittest.skipIf(not os.path.exists(VITC), "needs build/vitc")
class TestBadInput(unittest.TestCase):
    def test_corpus_is_complete(self):
        self.assertGreaterEqual(len(os.listdir(FILES)), 60)
        for c in CASES:
            if "{f}" in " ".join(c["args"]):
                self.assertTrue(os.path.exists(os.path.join(FILES, c["name"])), c["name"])


def _add_cases():
    seen = {}
    for c in CASES:
        n = seen[c["name"]] = seen.get(c["name"], 0) + 1
        name = "test_" + re.sub(r"\W", "_", c["name"]) + ("_%d" % n if n > 1 else "")

        def test(self, c=c):
            check_case(self, c)

        test = functools.update_wrapper(test, check_case)
        test.__name__ = name
        test.__doc__ = "%s: vitc %s" % (c["name"], " ".join(c["args"]))
        if c.get("defect") in PENDING:
            test = unittest.expectedFailure(test)
        setattr(TestBadInput, name, test)


_add_cases()

if __name__ == "__main__":
    unittest.main()
