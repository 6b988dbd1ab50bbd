"""`vitc serve` with a SAM or a Depth Anything model: POST /v1/segment and
POST /v1/depth against the CLI's --raw output (`vitc segment`, `vitc
depth`) for the same image and prompt, the embedding cache, the prompt
errors, /v1/info's capabilities and the endpoints such a model lacks.
Small random-weight models saved with save_pretrained, served on free
loopback ports."""

import base64
import io
import json
import os
import subprocess
import unittest

import numpy as np

try:
    from .util import VITC, TmpDirCase
    from .test_serve import Server, have_serve
except ImportError:  # run as a script
    from util import VITC, TmpDirCase
    from test_serve import Server, have_serve

try:
    import torch
    import skimage.data
    from PIL import Image
    try:
        from .test_segment_cli import small_sam, read_npy
        from .test_depth import make_model
    except ImportError:
        from test_segment_cli import small_sam, read_npy
        from test_depth import make_model
    HAVE_PEERS = True
except ImportError:  # pragma: no cover
    HAVE_PEERS = False

TOL = 1e-5


def b64(path):
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


@unittest.skipUnless(HAVE_PEERS and os.path.exists(VITC) and have_serve(),
                     "needs torch, transformers, skimage and build/vitc with serve")
class TestServeDense(TmpDirCase):
    TMP_PREFIX = "vitc_dense_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.servers = []
        # small photos keep the CLI and server runs short
        coffee = Image.fromarray(skimage.data.coffee()).convert("RGB")
        cls.photo = os.path.join(cls.tmp, "coffee.png")
        coffee.resize((120, 80), Image.BILINEAR).save(cls.photo)
        cls.photo2 = os.path.join(cls.tmp, "astronaut.png")
        Image.fromarray(skimage.data.astronaut()).convert("RGB").resize(
            (64, 72), Image.BILINEAR).save(cls.photo2)
        cls.sam = os.path.join(cls.tmp, "sam")
        small_sam().save_pretrained(cls.sam)
        cls.depth = os.path.join(cls.tmp, "depth")
        make_model(cls.depth, 0, [1, 2, 3, 4], [8, 16, 32, 32], [4, 2, 1, 0.5])
        cls.sam_server = Server(cls.sam)
        cls.servers.append(cls.sam_server)
        cls.depth_server = Server(cls.depth)
        cls.servers.append(cls.depth_server)

    @classmethod
    def tearDownClass(cls):
        for s in cls.servers:
            s.stop()
        super().tearDownClass()

    def cli(self, *args):
        p = subprocess.run([VITC] + [str(a) for a in args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 0, p.stderr.decode())

    def test_info_capabilities(self):
        for srv, seg, dep in ((self.sam_server, True, False), (self.depth_server, False, True)):
            st, _, data = srv.request("GET", "/v1/info")
            self.assertEqual(st, 200)
            caps = json.loads(data)["capabilities"]
            self.assertEqual(caps["segment"], seg)
            self.assertEqual(caps["depth"], dep)
            self.assertFalse(caps["embeddings"])

    def test_segment_equals_cli(self):
        for multimask in (False, True):
            raw = os.path.join(self.tmp, "seg%d.npy" % multimask)
            args = ["segment", "--model", self.sam, "--point", "60,40,1", "--point", "10,70,0",
                    "--box", "20,10,100,70", "--out", os.path.join(self.tmp, "o.png"),
                    "--raw", raw, "--quiet", self.photo]
            if multimask:
                args.insert(-1, "--multimask")
            self.cli(*args)
            ref = read_npy(raw)
            req = {"input": "data:image/png;base64," + b64(self.photo),
                   "points": [[60, 40], [10, 70]], "labels": [1, 0], "box": [20, 10, 100, 70],
                   "multimask": multimask}
            st, _, j = self.sam_server.post("/v1/segment", dict(req, format="logits"))
            self.assertEqual(st, 200, j)
            got = np.frombuffer(base64.b64decode(j["logits"]), "<f4").reshape(j["shape"])
            self.assertEqual(got.shape, ref.shape)
            self.assertEqual((j["width"], j["height"]), (120, 80))
            np.testing.assert_allclose(got, ref, atol=TOL, rtol=TOL)
            st, _, jp = self.sam_server.post("/v1/segment", req)
            self.assertEqual(st, 200, jp)
            self.assertTrue(jp["cached"])
            self.assertEqual(len(jp["masks"]), ref.shape[0])
            for k, m in enumerate(jp["masks"]):
                im = Image.open(io.BytesIO(base64.b64decode(m["png"])))
                self.assertEqual(im.mode, "L")
                self.assertTrue(np.array_equal(np.asarray(im) == 255, got[k] > 0))
                self.assertAlmostEqual(m["iou"], j["iou"][k], places=5)

    def test_cache_and_image_id(self):
        req = {"input": b64(self.photo2), "points": [[30, 30]], "labels": [1]}
        st, _, a = self.sam_server.post("/v1/segment", req)
        self.assertEqual(st, 200, a)
        st, _, b = self.sam_server.post("/v1/segment", req)
        self.assertTrue(b["cached"])
        self.assertEqual(a["image_id"], b["image_id"])
        st, _, c = self.sam_server.post("/v1/segment", {"image_id": a["image_id"],
                                                        "points": [[30, 30]], "labels": [1]})
        self.assertEqual(st, 200, c)
        self.assertTrue(c["cached"])
        self.assertEqual(c["masks"][0]["png"], a["masks"][0]["png"])
        st, _, e = self.sam_server.post("/v1/segment", {"image_id": "0123456789abcdef",
                                                        "points": [[1, 1]], "labels": [1]})
        self.assertEqual(st, 400)
        self.assertIn("image_id", e["error"]["message"])

    def test_bad_prompts(self):
        img = b64(self.photo2)
        cases = [({"points": [[1, 2]], "labels": [1, 0]}, "labels"),
                 ({"points": [[1]], "labels": [1]}, "points"),
                 ({"points": [[1, 2]], "labels": [2]}, "labels"),
                 ({"box": [1, 2, 3]}, "box"),
                 ({"points": [[1, 2]], "labels": [1], "format": "jpeg"}, "format"),
                 ({"points": [[1, 2]], "labels": [1], "multimask": 1}, "multimask")]
        for extra, word in cases:
            st, _, j = self.sam_server.post("/v1/segment", dict(extra, input=img))
            self.assertEqual(st, 400, extra)
            self.assertIn(word, j["error"]["message"], extra)
        # the library's checks come back as 400 with its message
        st, _, j = self.sam_server.post("/v1/segment", {"input": img, "box": [50, 50, 10, 10]})
        self.assertEqual(st, 400)
        self.assertTrue(j["error"]["message"])
        st, _, j = self.sam_server.post("/v1/segment", {"input": "bm90IGFuIGltYWdl",
                                                        "points": [[1, 2]], "labels": [1]})
        self.assertEqual(st, 400)
        self.assertIn("input", j["error"]["message"])

    def test_depth_equals_cli(self):
        npy = os.path.join(self.tmp, "d.npy")
        png = os.path.join(self.tmp, "d16.png")
        self.cli("depth", "--model", self.depth, "--raw", npy, "--quiet", self.photo)
        self.cli("depth", "--model", self.depth, "--raw", png, "--quiet", self.photo)
        ref = read_npy(npy)
        st, _, j = self.depth_server.post("/v1/depth", {"input": b64(self.photo),
                                                        "format": "float32"})
        self.assertEqual(st, 200, j)
        got = np.frombuffer(base64.b64decode(j["depth"]), "<f4").reshape(j["height"], j["width"])
        np.testing.assert_allclose(got, ref, atol=TOL, rtol=TOL)
        self.assertAlmostEqual(j["min"], float(ref.min()), places=4)
        self.assertAlmostEqual(j["max"], float(ref.max()), places=4)
        st, _, j = self.depth_server.post("/v1/depth", {"input": b64(self.photo)})
        self.assertEqual(st, 200, j)
        got16 = np.asarray(Image.open(io.BytesIO(base64.b64decode(j["depth"]))))
        ref16 = np.asarray(Image.open(png))
        self.assertEqual(got16.shape, (80, 120))
        self.assertLessEqual(np.abs(got16.astype(np.int64) - ref16.astype(np.int64)).max(), 1)
        st, _, j = self.depth_server.post("/v1/depth", {"input": b64(self.photo),
                                                        "format": "npy"})
        self.assertEqual(st, 400)
        self.assertIn("format", j["error"]["message"])

    def test_wrong_endpoint(self):
        img = b64(self.photo2)
        for srv, path in ((self.sam_server, "/v1/depth"), (self.sam_server, "/v1/embeddings"),
                          (self.depth_server, "/v1/segment"),
                          (self.depth_server, "/v1/classify")):
            st, _, j = srv.post(path, {"input": img})
            self.assertEqual(st, 400, path)
            self.assertIn("answers only", j["error"]["message"])
        st, _, _ = self.sam_server.request("GET", "/health")
        self.assertEqual(st, 200)


if __name__ == "__main__":
    unittest.main()
