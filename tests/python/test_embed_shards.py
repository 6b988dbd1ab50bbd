"""`vitc embed --files-from LIST --out DIR`, one process and `mpirun -np 2`
(build-mpi/vitc, which `make test` builds where mpicc is installed): the
shards of two ranks hold the embeddings a single-process `vitc embed` gives
for the same list, a rerun skips finished shards, a failed or killed run
leaves no partial shard, and `vitc similar --index DIR` ranks as it does
over the single-process index (and over the images' folder), refusing a
damaged, missing or foreign shard with a line naming it."""
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import unittest

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

try:
    import skimage.data
    SKIMAGE = os.path.dirname(skimage.data.__file__)
except ImportError:  # pragma: no cover
    SKIMAGE = None

try:
    from .util import ROOT, VITC, TmpDirCase, export_cmd, run_vitc
    from .test_cli import tiny_vit
except ImportError:  # run as a script
    from util import ROOT, VITC, TmpDirCase, export_cmd, run_vitc
    from test_cli import tiny_vit

VITC_MPI = os.path.join(ROOT, "build-mpi", "vitc")
# the photos skimage ships in its wheel (no download): colour, grey, JPEG
PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "camera.png",
          "hubble_deep_field.jpg", "coins.png", "horse.png")
# OpenMPI refuses root unless told (mpirun's --oversubscribe: 2 ranks on any
# core count)
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def mpi_skip_reason():
    if not shutil.which("mpirun"):
        return "no mpirun (Debian: openmpi-bin libopenmpi-dev)"
    if not os.path.exists(VITC_MPI):
        return "no build-mpi/vitc (make test builds it where mpicc is installed)"
    return None


def read_shard(path):
    """A safetensors shard read independently of vitc: (embeddings, metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    meta = head.pop("__metadata__")
    t = head["embeddings"]
    assert t["dtype"] == "F32"
    a, b = t["data_offsets"]
    emb = np.frombuffer(data[8 + n + a:8 + n + b], "<f4").reshape(t["shape"])
    return emb, meta


def read_index(d):
    """The index directory d as one array and its paths, shards in rank order."""
    with open(os.path.join(d, "index.json")) as f:
        man = json.load(f)
    embs, paths = [], []
    for s in man["shards"]:
        e, meta = read_shard(os.path.join(d, s["file"]))
        embs.append(e)
        paths += [bytes.fromhex(h).decode() for h in json.loads(meta["vitc.index.paths"])]
    return np.concatenate(embs), paths, man


_FIXTURE = {}


def fixture():
    """What both classes use, made once: two tiny models, the images, LIST,
    the single-process `vitc embed` of it (ref.npy) and its index (one/)."""
    if _FIXTURE:
        return _FIXTURE
    tmp = _FIXTURE["tmp"] = tempfile.mkdtemp(prefix="vitc_shards_")
    models, exports = [], []
    for seed in (0, 1):
        pth = os.path.join(tmp, "m%d.pth" % seed)
        torch.save(tiny_vit(seed).state_dict(), pth)
        models.append(os.path.join(tmp, "m%d.safetensors" % seed))
        exports.append(subprocess.Popen(export_cmd(pth, models[-1]), stdout=subprocess.DEVNULL))
    images = os.path.join(tmp, "images")
    os.makedirs(images)
    for n in PHOTOS:
        shutil.copy(os.path.join(SKIMAGE, n), images)
    from PIL import Image
    rng = np.random.default_rng(5)
    for i in range(12):  # small PNGs of other sizes, RGB and grey
        shape = (30 + 7 * i, 60 - 2 * i) + ((3,) if i % 3 else ())
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(
            os.path.join(images, "gen%02d.png" % i))
    # sorted: the order `similar` gives the folder's images
    files = sorted(os.path.join(images, n) for n in os.listdir(images))
    lst = os.path.join(tmp, "list.txt")
    with open(lst, "w") as f:
        f.write("".join(p + "\n" for p in files))
    for p in exports:
        assert p.wait() == 0
    ref, one = os.path.join(tmp, "ref.npy"), os.path.join(tmp, "one")
    rc, _, err = run_vitc("embed", "--model", models[0], "--threads", 1, "--quiet", "--out", ref,
                          *files)
    assert rc == 0, err
    rc, _, err = run_vitc("embed", "--model", models[0], "--threads", 1, "--files-from", lst,
                          "--out", one)
    assert rc == 0, err
    _FIXTURE.update(models=models, images=images, files=files, list=lst, ref=ref, one=one)
    return _FIXTURE


def tearDownModule():
    if _FIXTURE:
        shutil.rmtree(_FIXTURE["tmp"], ignore_errors=True)


@unittest.skipIf(torch is None or SKIMAGE is None or not os.path.exists(VITC),
                 "needs torch, skimage and build/vitc")
class TestEmbedShards(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        f = fixture()
        cls.models, cls.images, cls.files = f["models"], f["images"], f["files"]
        cls.list, cls.ref, cls.one = f["list"], f["ref"], f["one"]

    def embed(self, out, *extra, model=None, np_=None, vitc=None):
        args = ["embed", "--model", model or self.models[0], "--threads", "1",
                "--files-from", self.list, "--out", out] + [str(a) for a in extra]
        cmd = ([] if np_ is None else ["mpirun", "--oversubscribe", "-np", str(np_)]) + \
            [vitc or (VITC if np_ is None else VITC_MPI)] + args
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=MPI_ENV,
                           timeout=120)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def similar(self, index, *extra, model=None):
        return run_vitc("similar", "--model", model or self.models[0], "--index", index,
                        "--threads", 1, "--json", "--topk", 30, *extra)

    def test_one_process_index_equals_embed(self):
        emb, paths, man = read_index(self.one)
        self.assertEqual(paths, self.files)
        self.assertEqual([s["file"] for s in man["shards"]], ["shard-00000-of-00001.safetensors"])
        np.testing.assert_allclose(emb, np.load(self.ref), rtol=0, atol=1e-6)

    def test_resume_skips_a_finished_shard(self):
        d = self.path("resume")
        shutil.copytree(self.one, d)
        shard = os.path.join(d, "shard-00000-of-00001.safetensors")
        before = os.stat(shard).st_mtime_ns
        rc, _, err = self.embed(d)
        self.assertEqual(rc, 0, err)
        self.assertIn("shard-00000-of-00001.safetensors is complete (20 embeddings); skipped", err)
        self.assertEqual(os.stat(shard).st_mtime_ns, before)

    def test_torn_shard_and_stale_temp_are_redone(self):
        d = self.path("torn")
        shutil.copytree(self.one, d)
        shard = os.path.join(d, "shard-00000-of-00001.safetensors")
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) // 2)
        temp = shard + ".tmp4242.0"  # what a writer killed before its rename leaves
        with open(temp, "wb") as f:
            f.write(b"partial")
        rc, _, err = self.embed(d)
        self.assertEqual(rc, 0, err)
        self.assertIn("is damaged", err)
        self.assertFalse(os.path.exists(temp))
        np.testing.assert_array_equal(read_index(d)[0], read_index(self.one)[0])

    def test_failed_write_leaves_no_shard(self):
        d = self.path("full")
        p = subprocess.run(
            [VITC, "embed", "--model", self.models[0], "--threads", "1", "--files-from",
             self.list, "--out", d],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=lambda: __import__("resource").setrlimit(
                __import__("resource").RLIMIT_FSIZE, (1500, 1500)))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("shard-00000-of-00001.safetensors", p.stderr.decode())
        self.assertEqual(os.listdir(d), [])  # no shard, no temporary, no manifest

    def test_killed_run_leaves_no_partial_shard(self):
        # a long list, killed while it embeds: what it leaves must be nothing
        # or whole shards, and the rerun completes the index
        d, lst = self.path("killed"), self.path("long.txt")
        with open(lst, "w") as f:
            f.write("".join(p + "\n" for p in self.files * 100))
        p = subprocess.Popen([VITC, "embed", "--model", self.models[0], "--threads", "1",
                              "--files-from", lst, "--out", d, "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        p.send_signal(signal.SIGKILL)
        p.wait()
        left = os.listdir(d) if os.path.isdir(d) else []
        self.assertNotIn("index.json", left)
        self.assertEqual([n for n in left if n.startswith("shard-")], [])

    def test_index_ranks_as_the_folder(self):
        rc, out, err = self.similar(self.one, self.files[0])
        self.assertEqual(rc, 0, err)
        rc2, out2, err2 = run_vitc("similar", "--model", self.models[0], "--index", self.images,
                                   "--threads", 1, "--json", "--topk", 30, "--no-cache",
                                   self.files[0])
        self.assertEqual(rc2, 0, err2)
        a = [json.loads(ln) for ln in out.splitlines()]
        b = [json.loads(ln) for ln in out2.splitlines()]
        self.assertEqual(len(a), len(self.files) - 1)  # the query left out
        self.assertEqual([r["image"] for r in a], [r["image"] for r in b])
        np.testing.assert_allclose([r["score"] for r in a], [r["score"] for r in b], atol=1e-6)

    def test_refusals(self):
        # another model's index, a manifest of another run, pooling tokens
        rc, _, err = self.similar(self.one, self.files[0], model=self.models[1])
        self.assertEqual(rc, 1)
        self.assertIn("was made by another model than", err)
        d = self.path("refuse")
        shutil.copytree(self.one, d)
        rc, _, err = self.embed(d, model=self.models[1])
        self.assertEqual(rc, 1)
        self.assertIn("holds the index of another model", err)
        rc, _, err = self.embed(self.path("tok"), "--pool", "tokens")
        self.assertEqual(rc, 2)
        self.assertIn("one embedding per image", err)
        # another model's shard under this run's name, its manifest gone
        d = self.path("foreign_shard")
        rc, _, err = self.embed(d, model=self.models[1])
        self.assertEqual(rc, 0, err)
        os.remove(os.path.join(d, "index.json"))
        rc, _, err = self.embed(d)
        self.assertEqual(rc, 1)
        self.assertIn("shard-00000-of-00001.safetensors: a shard of another model", err)

    def test_unreadable_image_is_left_out(self):
        d, lst = self.path("unreadable"), self.path("bad.txt")
        with open(lst, "w") as f:
            f.write("%s\n%s\r\n\n%s\n" % (self.files[0], self.path("nope.png"), self.files[1]))
        p = subprocess.run([VITC, "embed", "--model", self.models[0], "--threads", "1",
                            "--files-from", lst, "--out", d], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 1)
        self.assertIn("nope.png", p.stderr.decode())
        emb, paths, man = read_index(d)
        self.assertEqual((paths, man["entries"], man["rows"]), (self.files[:2], 3, 2))
        np.testing.assert_allclose(emb, np.load(self.ref)[:2], rtol=0, atol=1e-6)


@unittest.skipIf(torch is None or SKIMAGE is None or not os.path.exists(VITC) or
                 mpi_skip_reason(), "MPI test skipped: %s" % mpi_skip_reason())
class TestEmbedShardsMPI(TestEmbedShards):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.two = cls.path(cls, "two")
        rc, _, err = cls.embed(cls, cls.two, np_=2)
        assert rc == 0, err
        cls.other = cls.path(cls, "other")  # the same list by another model
        rc, _, err = cls.embed(cls, cls.other, np_=2, model=cls.models[1])
        assert rc == 0, err

    # the single-process tests ran in the base class
    test_one_process_index_equals_embed = test_resume_skips_a_finished_shard = None
    test_torn_shard_and_stale_temp_are_redone = test_failed_write_leaves_no_shard = None
    test_killed_run_leaves_no_partial_shard = test_index_ranks_as_the_folder = None
    test_refusals = test_unreadable_image_is_left_out = None

    def test_two_ranks_equal_one_process(self):
        emb, paths, man = read_index(self.two)
        self.assertEqual(paths, self.files)
        self.assertEqual([(s["file"], s["first"], s["rows"]) for s in man["shards"]],
                         [("shard-00000-of-00002.safetensors", 0, 10),
                          ("shard-00001-of-00002.safetensors", 10, 10)])
        np.testing.assert_allclose(emb, np.load(self.ref), rtol=0, atol=1e-6)
        np.testing.assert_allclose(emb, read_index(self.one)[0], rtol=0, atol=1e-6)

    def test_similar_ranks_as_one_process(self):
        for q in (self.files[3], self.files[12]):
            rc1, out1, err1 = self.similar(self.one, q)
            rc2, out2, err2 = self.similar(self.two, q)
            self.assertEqual((rc1, rc2), (0, 0), err1 + err2)
            a = [json.loads(ln) for ln in out1.splitlines()]
            b = [json.loads(ln) for ln in out2.splitlines()]
            self.assertEqual([r["image"] for r in a], [r["image"] for r in b])
            np.testing.assert_allclose([r["score"] for r in a], [r["score"] for r in b],
                                       atol=1e-6)

    def test_resume_redoes_only_the_missing_shard(self):
        d = self.path("resume2")
        shutil.copytree(self.two, d)
        s0, s1 = (os.path.join(d, "shard-0000%d-of-00002.safetensors" % r) for r in (0, 1))
        os.remove(s1)
        os.remove(os.path.join(d, "index.json"))
        before = os.stat(s0).st_mtime_ns
        rc, _, err = self.embed(d, np_=2)
        self.assertEqual(rc, 0, err)
        self.assertIn("shard-00000-of-00002.safetensors is complete (10 embeddings); skipped", err)
        self.assertIn("wrote %s (10 embeddings" % s1, err)
        self.assertEqual(os.stat(s0).st_mtime_ns, before)
        np.testing.assert_array_equal(read_index(d)[0], read_index(self.two)[0])

    def test_another_rank_count_is_refused(self):
        d = self.path("three")
        shutil.copytree(self.two, d)
        os.remove(os.path.join(d, "index.json"))  # a killed 2-rank run
        rc, _, err = self.embed(d, np_=1)
        self.assertEqual(rc, 1)
        self.assertIn("a shard of a run with another number of ranks", err)

    def test_broken_indexes_are_refused(self):
        def broken(name, change):
            d = self.path(name)
            shutil.copytree(self.two, d)
            change(d)
            rc, out, err = self.similar(d, self.files[0])
            self.assertEqual(rc, 1, out)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            self.assertIn(os.path.join(d, "shard-00001-of-00002.safetensors"), err)
            return err

        s1 = "shard-00001-of-00002.safetensors"

        def flip(d):  # a byte of the embeddings: same size, valid header
            p = os.path.join(d, s1)
            with open(p, "r+b") as f:
                f.seek(-5, 2)
                b = f.read(1)
                f.seek(-5, 2)
                f.write(bytes([b[0] ^ 0x10]))
        self.assertIn("do not match their hash", broken("flipped", flip))
        self.assertIn("damaged", broken("truncated", lambda d: os.truncate(
            os.path.join(d, s1), 100)))
        self.assertIn("missing", broken("missing", lambda d: os.remove(os.path.join(d, s1))))

        def foreign(d):  # another model's shard in its place, sizes made to fit
            shutil.copy(os.path.join(self.other, s1), os.path.join(d, s1))
            with open(os.path.join(d, "index.json")) as f:
                man = json.load(f)
            man["shards"][1]["bytes"] = os.path.getsize(os.path.join(d, s1))
            with open(os.path.join(d, "index.json"), "w") as f:
                json.dump(man, f)
        self.assertIn("made by another model", broken("foreign", foreign))

    @unittest.skipIf(os.path.exists(VITC) and "built with MPI=1" in run_vitc("embed", "--help")[1],
                     "build/vitc is an MPI=1 build")
    def test_mpirun_without_mpi_build_is_refused(self):
        rc, _, err = self.embed(self.path("nompi"), np_=2, vitc=VITC)
        self.assertNotEqual(rc, 0)
        self.assertIn("built without MPI", err)


if __name__ == "__main__":
    unittest.main()
