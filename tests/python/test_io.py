"""vitc.load_safetensors / vitc.save_safetensors against numpy, against files
written by the independent writer tests/reference/st_write.py (from torch
tensors when torch is present), and on bad files."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import vitc

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "..", "reference")
sys.path.insert(0, REF)
import st_write  # noqa: E402

try:
    import torch
except ImportError:  # the torch-written file test is skipped
    torch = None


def raw_file(path, header, data=b"", hlen=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h) if hlen is None else hlen))
        f.write(h)
        f.write(data)


class TestSafetensors(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def test_round_trip(self):
        rng = np.random.default_rng(0)
        tensors = {
            "b.weight": rng.standard_normal((3, 4, 5)).astype(np.float32),
            "a.bias": np.array([np.inf, -np.inf, -0.0, 1e-42], np.float32),
            "scalar": np.float32(3.5),
            "empty": np.zeros((2, 0), np.float32),
            "from_f64": rng.standard_normal(7),  # converted to float32
            "non_contig": np.arange(12, dtype=np.float32).reshape(3, 4).T,
            "n\u00e4me \"q\"": np.ones(2, np.float32),
        }
        meta = {"format": "pt", "vitc.config": json.dumps({"depth": 2}), "\u00fc": "\u2713\n"}
        p = self.path("rt.safetensors")
        vitc.save_safetensors(p, tensors, meta)
        got, gmeta = vitc.load_safetensors(p)
        self.assertEqual(list(got), sorted(tensors))  # the writer sorts by name
        for k, v in tensors.items():
            want = np.asarray(v, dtype=np.float32)
            self.assertEqual(got[k].dtype, np.float32)
            self.assertEqual(got[k].shape, want.shape, k)
            np.testing.assert_array_equal(got[k], want)
        self.assertEqual(gmeta, meta)
        self.assertEqual(os.listdir(self.tmp.name), ["rt.safetensors"])
        # Readable by the format's rules independently of vitc: header length
        # multiple of 8, offsets contiguous in sorted-name order.
        with open(p, "rb") as f:
            raw = f.read()
        (n,) = struct.unpack("<Q", raw[:8])
        self.assertEqual(n % 8, 0)
        hdr = json.loads(raw[8:8 + n])
        self.assertEqual(hdr.pop("__metadata__"), meta)
        off = 0
        for k in sorted(hdr):
            e = hdr[k]
            self.assertEqual(e["dtype"], "F32")
            self.assertEqual(e["data_offsets"][0], off)
            off = e["data_offsets"][1]
            a = np.frombuffer(raw[8 + n + e["data_offsets"][0]:8 + n + off], np.float32)
            np.testing.assert_array_equal(a.reshape(e["shape"]), got[k])
        self.assertEqual(8 + n + off, len(raw))

    def test_reads_independent_writer_f16_bf16(self):
        rng = np.random.default_rng(1)
        a32 = rng.standard_normal((4, 3)).astype(np.float32)
        a16 = np.array([0, 1e-7, 6.1e-5, 65504, -np.inf, 0.1], np.float16)
        abf = rng.standard_normal(9).astype(np.float32) * 1000
        p = self.path("np.safetensors")
        st_write.write(p, {"a32": a32, "a16": a16, "abf": abf}, metadata={"k": "v"},
                       bf16=("abf",))
        got, meta = vitc.load_safetensors(p)
        np.testing.assert_array_equal(got["a32"], a32)
        np.testing.assert_array_equal(got["a16"], a16.astype(np.float32))
        # BF16 = float32 with the low 16 bits rounded away (nearest even).
        u = abf.view(np.uint32).astype(np.uint64)
        want = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
        np.testing.assert_array_equal(got["abf"], want)
        self.assertFalse(np.array_equal(got["abf"], abf))  # really rounded
        self.assertEqual(meta, {"k": "v"})

    @unittest.skipIf(torch is None, "torch not installed")
    def test_torch_written_file(self):
        torch.manual_seed(0)
        m = torch.nn.MultiheadAttention(16, 4)
        sd = m.state_dict()
        sd["bf16.weight"] = torch.randn(5, 3).bfloat16()
        sd["half.weight"] = torch.randn(2, 7).half()
        p = self.path("torch.safetensors")
        tensors = {k: (v.float() if v.dtype == torch.bfloat16 else v) for k, v in sd.items()}
        st_write.write(p, tensors, metadata={"format": "pt"}, bf16=("bf16.weight",))
        got, meta = vitc.load_safetensors(p)
        self.assertEqual(set(got), set(sd))
        for k, v in sd.items():
            np.testing.assert_array_equal(got[k], v.float().numpy(), err_msg=k)
        self.assertEqual(meta, {"format": "pt"})

    def test_fixture(self):
        got, meta = vitc.load_safetensors(os.path.join(REF, "safetensors", "mixed.safetensors"))
        np.testing.assert_array_equal(got["f16"].view(np.uint32),
                                      got["f16_expect"].view(np.uint32))
        np.testing.assert_array_equal(got["bf16"], got["bf16_expect"])
        self.assertEqual(meta["unicode"], "h\u00e9llo \u2713")

    def assert_bad(self, path, needle):
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.load_safetensors(path)
        self.assertIn(needle, str(cm.exception))
        self.assertLess(cm.exception.status, 0)

    def test_bad_files(self):
        p = self.path("bad.safetensors")
        e = {"dtype": "F32", "shape": [5, 6], "data_offsets": [0, 100]}
        raw_file(p, {"q.weight": e}, b"\0" * 100)
        self.assert_bad(p, "tensor 'q.weight': data_offsets [0, 100] hold 100 bytes but "
                           "F32 [5, 6] needs 120")
        raw_file(p, {"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8)
        self.assert_bad(p, "tensor 'w' has dtype I64")
        raw_file(p, {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4)
        self.assert_bad(p, "run past the end")
        raw_file(p, b"{}", hlen=1 << 40)
        self.assert_bad(p, "header length")
        raw_file(p, b"[]")
        self.assert_bad(p, "start with '{'")
        raw_file(p, {"__metadata__": {"k": 1}})
        self.assert_bad(p, "value of 'k' is an integer")
        with open(p, "wb") as f:
            f.write(b"\x10\0\0")
        self.assert_bad(p, "too few")
        self.assert_bad(self.path("missing.safetensors"), "missing.safetensors")

    def test_bad_saves(self):
        p = self.path("out.safetensors")
        with self.assertRaises(TypeError):
            vitc.save_safetensors(p, {"a": np.ones(1)}, {"k": 1})
        with self.assertRaises(ValueError):
            vitc.save_safetensors(p, {"a\0b": np.ones(1)})
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.save_safetensors(p, {"__metadata__": np.ones(1)})
        self.assertIn("reserved", str(cm.exception))
        with self.assertRaises(vitc.VitcError) as cm:
            vitc.save_safetensors(os.path.join(self.tmp.name, "no", "dir.safetensors"),
                                  {"a": np.ones(1)})
        self.assertIn("dir.safetensors", str(cm.exception))
        self.assertEqual(os.listdir(self.tmp.name), [])


VITC_BIN = os.path.join(HERE, "..", "..", "build", "vitc")


@unittest.skipUnless(os.path.exists(VITC_BIN), "build/vitc not built")
class TestInspectCli(unittest.TestCase):
    def run_cli(self, *args):
        return subprocess.run([VITC_BIN, "inspect", *args], capture_output=True, text=True)

    def test_json_listing(self):
        path = os.path.join(REF, "safetensors", "mixed.safetensors")
        r = self.run_cli("--json", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        d = json.loads(r.stdout)
        got, meta = vitc.load_safetensors(path)
        self.assertEqual([t["name"] for t in d["tensors"]], list(got))
        for t in d["tensors"]:
            self.assertEqual(tuple(t["shape"]), got[t["name"]].shape)
        self.assertEqual({t["name"]: t["dtype"] for t in d["tensors"]}["bf16"], "BF16")
        self.assertEqual(d["metadata"], meta)
        self.assertEqual(d["parameters"], sum(a.size for a in got.values()))
        self.assertIsNone(d["architecture"])
        self.assertIn("class_token", d["not_recognised"])
        r = self.run_cli(path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("layer.0.w\u00e9ight  F32   [1, 2, 3]", r.stdout)
        self.assertIn("quote: a\"b\\c\\n\n", r.stdout)  # the newline shown escaped

    @unittest.skipIf(torch is None, "torch not installed")
    def test_recognises_vit(self):
        import torchvision
        torch.manual_seed(0)
        m = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                 num_heads=2, hidden_dim=128, mlp_dim=64,
                                                 num_classes=7)
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "vit.safetensors")
            st_write.write(p, m.state_dict())
            r = self.run_cli("--json", p)
            self.assertEqual(r.returncode, 0, r.stderr)
            cfg = json.loads(r.stdout)["config"]
            self.assertEqual((cfg["patch_size"], cfg["hidden_dim"], cfg["depth"], cfg["mlp_dim"],
                              cfg["num_classes"]), (8, 128, 2, 64, 7))
            r = self.run_cli(p)
            self.assertIn("architecture: custom", r.stdout)
            r = self.run_cli("--arch", "vit_b_16", p)
            self.assertEqual(r.returncode, 1)
            self.assertTrue(r.stderr.startswith("vitc: error: "), r.stderr)

    def test_errors(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "bad.safetensors")
            raw_file(p, {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}, b"\0" * 8)
            r = self.run_cli(p)
            self.assertEqual(r.returncode, 1)
            self.assertIn("vitc: error: " + p + ": tensor 'w'", r.stderr)
            self.assertEqual(r.stdout, "")
        self.assertEqual(self.run_cli().returncode, 2)
        self.assertEqual(self.run_cli("--nope", "x").returncode, 2)
        self.assertEqual(self.run_cli("a", "b").returncode, 2)
        r = self.run_cli("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("usage: vitc inspect", r.stdout)


if __name__ == "__main__":
    unittest.main()
