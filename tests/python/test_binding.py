"""The binding itself (issue 7): thread safety of one object, integer and
float range checks before ctypes, rank limits, 0-d arrays, named statuses,
and the ctypes mirrors of include/vitc.h checked against a C compiler.

Runs without torch except where it compares with torch (skipped then).
"""
import ctypes
import gc
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import unittest
import weakref

import numpy as np

import vitc
from vitc import _lib

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY_VIT = os.path.join(ROOT, "tests", "reference", "vit", "tiny.safetensors")


def run_threads(fn, inputs, nthreads=4):
    """fn(x) for every x, from nthreads threads started together -> results in input order."""
    results = [None] * len(inputs)
    errors = []
    start = threading.Barrier(nthreads)

    def work(t):
        try:
            start.wait()
            for i in range(t, len(inputs), nthreads):
                results[i] = fn(inputs[i])
        except BaseException as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results


class TestThreads(unittest.TestCase):
    """One object called from 4 threads gives, call for call, exactly what
    it gives called from one (defect 6: 6 of 400 ViT logits were wrong)."""

    @classmethod
    def setUpClass(cls):
        # One library thread per call: the 4 Python threads then really run
        # their C calls at the same time (ctypes releases the GIL), the case
        # that used to mix activations.
        cls.threads = vitc.get_num_threads()
        vitc.set_num_threads(1)

    @classmethod
    def tearDownClass(cls):
        vitc.set_num_threads(cls.threads)

    def assert_same(self, fn, inputs):
        want = [fn(x) for x in inputs]
        got = run_threads(fn, inputs)
        for i, (w, g) in enumerate(zip(want, got)):
            for a, b in zip(w if isinstance(w, tuple) else (w,), g if isinstance(g, tuple) else (g,)):
                self.assertTrue(np.array_equal(a, b, equal_nan=True), "call %d differs" % i)

    def test_vit(self):
        model = vitc.VisionTransformer.from_safetensors(TINY_VIT)
        rng = np.random.default_rng(1)
        inputs = [rng.standard_normal((1, 3, 32, 32), dtype=np.float32) for _ in range(400)]
        self.assert_same(model, inputs)
        self.assert_same(model.attention_maps, inputs[:40])

    def test_self_attention(self):
        rng = np.random.default_rng(2)
        sa = vitc.SelfAttentionMultiHead(32, 4, seed=3).eval()
        self.assert_same(sa, [rng.standard_normal((2, 32, 12, 12), dtype=np.float32) for _ in range(200)])

    def test_mha(self):
        rng = np.random.default_rng(3)
        mha = vitc.MultiheadAttention(32, 4, batch_first=True, seed=4)
        self.assert_same(lambda x: mha(x, x, x), [rng.standard_normal((2, 64, 32), dtype=np.float32)
                                                 for _ in range(200)])

    def test_batchnorm_training(self):
        # In training mode every call also updates the running statistics:
        # under threads every update must land, as in 80 calls from one thread.
        x = np.random.default_rng(4).standard_normal((2, 32, 12, 12), dtype=np.float32)
        one, many = (vitc.SelfAttention(32, norm="batch", seed=5) for _ in range(2))
        want = [one(x) for _ in range(80)]
        got = run_threads(many, [x] * 80)
        for i in range(80):
            self.assertTrue(np.array_equal(want[i], got[i]), "call %d differs" % i)
        a, b = one.state_dict(), many.state_dict()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


class TestRanges(unittest.TestCase):
    """Every integer and float is range-checked before ctypes, which would
    silently wrap 2**32 + 8 to 8 (defect 9) or round 1e39 to inf."""

    def test_sizes_out_of_c_int(self):
        cases = [
            (lambda: vitc.ConvSABlock(2**32 + 8), "in_channels"),
            (lambda: vitc.SelfAttention(2**32 + 8), "ni"),
            (lambda: vitc.SelfAttentionMultiHead(16, 2**32 + 4), "nheads"),
            (lambda: vitc.AttentionBlock(3, 2**32 + 4), "patch_size"),
            (lambda: vitc.AttentionBlock(3, 4, 2**31), "embed_dim"),
            (lambda: vitc.T2TAttention(2**33, 64), "dim"),
            (lambda: vitc.SingleHeadAttention(8, 2**32 + 8), "d_k"),
            (lambda: vitc.MultiheadAttention(2**32 + 8, 1), "embed_dim"),
            (lambda: vitc.MultiheadAttention(8, 2**32 + 1), "num_heads"),
            (lambda: vitc.MultiheadAttention(8, 1, kdim=2**32 + 8), "kdim"),
            (lambda: vitc.softmax(np.ones(3), dim=2**32 - 1), "dim"),
            (lambda: vitc.set_num_threads(2**32 + 1), "n"),
            (lambda: vitc.preprocess_image(np.zeros((4, 4, 3), np.uint8), 2**32, 2), "resize"),
        ]
        for make, name in cases:
            with self.assertRaisesRegex(ValueError, "^%s must be" % name):
                make()

    def test_negative_sizes(self):
        for make, name in [(lambda: vitc.ConvSABlock(-8), "in_channels"),
                           (lambda: vitc.MultiheadAttention(8, 2, vdim=-1), "vdim"),
                           (lambda: vitc.load_image(os.path.join(ROOT, "tests", "data", "photo.png"), -1),
                            "max_pixels")]:
            with self.assertRaisesRegex(ValueError, "^%s must be" % name):
                make()

    def test_non_integers(self):
        with self.assertRaisesRegex(TypeError, "in_channels must be an integer, got float"):
            vitc.ConvSABlock(16.0)
        with self.assertRaisesRegex(TypeError, "dim must be an integer"):
            vitc.softmax(np.ones(3), dim=0.5)
        # numpy integers are integers
        self.assertEqual(vitc.ConvSABlock(np.int64(16)).state_dict()["v.weight"].shape, (16, 16, 1, 1))

    def test_seed_range(self):
        # torch.manual_seed's range; a negative seed is its uint64 image, as there.
        a = vitc.ConvSABlock(8, seed=-1).state_dict()
        b = vitc.ConvSABlock(8, seed=2**64 - 1).state_dict()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
        for seed in (2**64, -2**63 - 1):
            with self.assertRaisesRegex(ValueError, "seed must be in"):
                vitc.ConvSABlock(8, seed=seed)

    def test_floats(self):
        q = np.ones((2, 3, 4), np.float32)
        for bad in (float("inf"), float("nan"), 1e39, -float("inf")):
            with self.assertRaisesRegex(ValueError, "scale must be finite"):
                vitc.scaled_dot_product_attention(q, q, q, scale=bad)
            with self.assertRaisesRegex(ValueError, "temperature must be finite"):
                vitc.softmax(q, temperature=bad)
            with self.assertRaisesRegex(ValueError, "qk_scale must be finite"):
                vitc.T2TAttention(8, 8, qk_scale=bad)
        for bad in (0.0, -1.0, 1e-50):  # 1e-50 is 0 in float32, C's "use the default"
            with self.assertRaisesRegex(vitc.VitcError, "scale must be > 0"):
                vitc.scaled_dot_product_attention(q, q, q, scale=bad)

    def test_images(self):
        img = np.zeros((4, 4, 3), np.int64)
        img[0, 0, 0] = 256  # uint8 would wrap it to 0
        with self.assertRaisesRegex(ValueError, "image values must be in 0..255, got 0..256"):
            vitc.preprocess_image(img, 0, 2)
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(TypeError, "rgb must hold integers"):
                vitc.save_png(os.path.join(d, "a.png"), np.ones((4, 4, 3)))  # [0, 1] floats: black
            self.assertEqual(os.listdir(d), [])
        img[0, 0, 0] = 255
        np.testing.assert_array_equal(vitc.preprocess_image(img, 0, 2),
                                      vitc.preprocess_image(img.astype(np.uint8), 0, 2))
        for bad in (float("nan"), 1e39):
            with self.assertRaisesRegex(ValueError, "std must be finite"):
                vitc.preprocess_image(img, 0, 2, std=(1, bad, 1))
        with self.assertRaisesRegex(ValueError, "mean must have 3 values"):
            vitc.preprocess_image(img, 0, 2, mean=(0.5, 0.5))

    def test_nul_in_strings(self):
        # C would stop at the NUL and open another path.
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ValueError, "NUL"):
                vitc.save_safetensors(os.path.join(d, "a.st\0x"), {"w": np.ones(1)})
            self.assertEqual(os.listdir(d), [])
        for call in (lambda: vitc.load_safetensors("x\0y"), lambda: vitc.load_image("x\0y"),
                     lambda: vitc.VisionTransformer.from_safetensors("x\0y"),
                     lambda: vitc.VisionTransformer.from_safetensors(TINY_VIT, arch="vit_b_16\0"),
                     lambda: vitc.ConvSABlock(8).load_state_dict({"gamma\0": np.zeros(1)})):
            with self.assertRaisesRegex(ValueError, "NUL"):
                call()


def write_safetensors(path, shape):
    """One F32 tensor "t" of the given shape, all ones, written by hand (not by vitc)."""
    n = int(np.prod(shape, dtype=np.int64))
    hdr = json.dumps({"t": {"dtype": "F32", "shape": list(shape), "data_offsets": [0, 4 * n]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + np.ones(n, "<f4").tobytes())


class TestRank(unittest.TestCase):
    """A tensor of more dimensions than numpy holds is a VitcError, not
    numpy's ValueError (defect 10); more than C's limit, C's FORMAT error."""

    def test_ranks(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "r.safetensors")
            write_safetensors(p, (1,) * 32)
            self.assertEqual(vitc.load_safetensors(p)[0]["t"].shape, (1,) * 32)
            try:
                np.empty((1,) * 33)
                numpy_max = 64
            except ValueError:
                numpy_max = 32
            write_safetensors(p, (1,) * (numpy_max + 1))
            with self.assertRaises(vitc.VitcError) as cm:
                vitc.load_safetensors(p)
            self.assertIn("tensor 't'", str(cm.exception))
            self.assertIn("r.safetensors", str(cm.exception))
            write_safetensors(p, (1,) * 65)
            with self.assertRaisesRegex(vitc.VitcError, "65 dimensions .at most 64.") as cm:
                vitc.load_safetensors(p)
            self.assertEqual(cm.exception.status, vitc.Status.ERR_FORMAT)


class TestZeroD(unittest.TestCase):
    """0-d arrays stay 0-d, as in torch (defect 13)."""

    def test_softmax(self):
        for dim in (0, -1):
            y = vitc.softmax(np.float32(3.5), dim=dim)
            self.assertEqual(y.shape, ())
            self.assertEqual(y.dtype, np.float32)
            if torch is not None:
                self.assertEqual(float(y), float(torch.softmax(torch.tensor(3.5), dim=dim)))
        for dim in (1, -2):
            with self.assertRaisesRegex(vitc.VitcError, "dim %d out of range" % dim):
                vitc.softmax(np.float32(1), dim=dim)
            if torch is not None:
                with self.assertRaises(IndexError):
                    torch.softmax(torch.tensor(1.0), dim=dim)

    def test_sdpa_0d_mask(self):
        # A 0-d mask broadcasts to [..., L, S] as in torch.
        rng = np.random.default_rng(5)
        q, k, v = (rng.standard_normal((2, 3, 4), dtype=np.float32) for _ in range(3))
        base = vitc.scaled_dot_product_attention(q, k, v)
        np.testing.assert_allclose(vitc.scaled_dot_product_attention(q, k, v, attn_mask=np.array(True)),
                                   base, rtol=1e-6, atol=1e-6)
        # every key masked: 0, as torch 2.x's scaled_dot_product_attention
        self.assertTrue((vitc.scaled_dot_product_attention(q, k, v, attn_mask=np.array(False)) == 0).all())

    def test_state_dict_shape_checked(self):
        # A 0-d value for a [1] parameter is a shape mismatch, as in torch,
        # not silently accepted as [1].
        sa = vitc.ConvSABlock(8, seed=0)
        sd = sa.state_dict()
        sd["gamma"] = np.float32(0.5)
        with self.assertRaisesRegex(vitc.VitcError, r'"gamma" has shape \[\], expected \[1\]'):
            sa.load_state_dict(sd)

    def test_save_load_0d(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "s.safetensors")
            vitc.save_safetensors(p, {"s": np.float64(2.5)})
            t, _ = vitc.load_safetensors(p)
            self.assertEqual(t["s"].shape, ())
            self.assertEqual(float(t["s"]), 2.5)


class TestLifetime(unittest.TestCase):
    def test_parameter_views_keep_the_layer(self):
        # parameters() are views into the C layer's memory: the layer must
        # outlive them, or they read freed memory.
        layer = vitc.ConvSABlock(8, seed=1)
        want = layer.state_dict()["v.weight"]
        ref = weakref.ref(layer)
        views = layer.parameters()
        del layer
        gc.collect()
        self.assertIsNotNone(ref())
        np.testing.assert_array_equal(views["v.weight"], want)
        views["gamma"][...] = 0.25  # writes change the layer, as documented
        self.assertEqual(float(ref().state_dict()["gamma"][0]), 0.25)
        del views
        gc.collect()
        self.assertIsNone(ref())


class TestStatus(unittest.TestCase):
    def test_error_carries_name_and_number(self):
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.ConvSABlock(7)
        e = cm.exception
        self.assertIs(e.status, vitc.Status.ERR_INVALID_ARG)
        self.assertEqual(e.status, -1)
        self.assertEqual(e.status_name, "VITC_ERR_INVALID_ARG")
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.load_safetensors("/nonexistent/x.safetensors")
        self.assertEqual(cm.exception.status_name, "VITC_ERR_IO")

    def test_names_match_the_library(self):
        for s in vitc.Status:
            name = _lib.lib.vitc_status_str(s).decode()
            self.assertNotIn("unknown", name.lower(), s)
        self.assertNotEqual(_lib.lib.vitc_status_str(-99).decode(),
                            _lib.lib.vitc_status_str(vitc.Status.ERR_SHAPE).decode())


@unittest.skipIf(shutil.which("cc") is None, "needs a C compiler")
class TestMirrors(unittest.TestCase):
    """Every ctypes struct and enum of _lib.py against include/vitc.h, as a
    C compiler sees them."""

    def test_layout(self):
        lines = []
        for cname, st in _lib.STRUCTS.items():
            lines.append('printf("%s %%zu\\n", sizeof(%s));' % (cname, cname))
            for f in st._fields_:
                lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (cname, f[0], cname, f[0]))
        for prefix, enum in _lib.ENUMS:
            for m in enum:
                lines.append('printf("%s%s %%d\\n", (int)%s%s);' % (prefix, m.name, prefix, m.name))
        src = ("#include <stddef.h>\n#include <stdio.h>\n#include \"vitc.h\"\n"
               "int main(void) {\n%s\nreturn 0;\n}\n" % "\n".join(lines))
        with tempfile.TemporaryDirectory() as d:
            c, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
            with open(c, "w") as f:
                f.write(src)
            r = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I", os.path.join(ROOT, "include"),
                                c, "-o", exe], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
        c_vals = dict(line.split() for line in out.splitlines())
        py_vals = {}
        for cname, st in _lib.STRUCTS.items():
            py_vals[cname] = ctypes.sizeof(st)
            for f in st._fields_:
                py_vals["%s.%s" % (cname, f[0])] = getattr(st, f[0]).offset
        for prefix, enum in _lib.ENUMS:
            for m in enum:
                py_vals[prefix + m.name] = int(m)
        # Equal sizes as well as offsets: a field missing at the end shows too.
        self.assertEqual({k: int(v) for k, v in c_vals.items()}, py_vals)

    def test_declarations_only_in_lib(self):
        # One place declares the C signatures (structure review, item 8).
        pkg = os.path.join(ROOT, "python", "vitc")
        for name in os.listdir(pkg):
            if name.endswith(".py") and name != "_lib.py":
                with open(os.path.join(pkg, name)) as f:
                    text = f.read()
                self.assertIsNone(re.search(r"\.(argtypes|restype)\b|ctypes\.Structure", text), name)


if __name__ == "__main__":
    unittest.main()
