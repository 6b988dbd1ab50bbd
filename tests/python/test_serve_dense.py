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
    from .util import VITC
    from .serve_util import ServeCase, b64, browser, have_serve, wait_state, write_key
except ImportError:  # run as a script
    from util import VITC
    from serve_util import ServeCase, b64, browser, have_serve, wait_state, write_key

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

try:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover (browser() skips the tests that need them)
    pass

TOL = 1e-5
INFERNO = np.array([[0x00, 0x00, 0x04], [0x1b, 0x0c, 0x42], [0x4b, 0x0c, 0x6b],
                    [0x78, 0x1c, 0x6d], [0xa5, 0x2c, 0x60], [0xcf, 0x44, 0x46],
                    [0xed, 0x69, 0x25], [0xfb, 0x9a, 0x06], [0xfc, 0xff, 0xa4]], np.float64)


def inferno(t):
    """cmd_depth.c's colour map in float64, [..., 3]."""
    x = np.clip(t, 0, 1) * 8
    i = np.minimum(7, np.floor(x)).astype(int)
    f = (x - i)[..., None]
    return (1 - f) * INFERNO[i] + f * INFERNO[i + 1]


@unittest.skipUnless(HAVE_PEERS and os.path.exists(VITC) and have_serve(),
                     "needs torch, transformers, skimage and build/vitc with serve")
class TestServeDense(ServeCase):
    TMP_PREFIX = "vitc_dense_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
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
        cls.sam_server = cls.serve(cls.sam)
        cls.depth_server = cls.serve(cls.depth)

    def cli(self, *args):
        self.run_cli(*args)

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

    def test_segment_precision(self):
        # --precision reaches SAM's load: bf16's logits are not fp32's (a
        # flag dropped on the way would serve fp32), its masks agree with
        # fp32's on nearly every pixel, and they are `vitc segment
        # --precision bf16`'s
        raw = os.path.join(self.tmp, "seg-bf16.npy")
        self.cli("segment", "--model", self.sam, "--precision", "bf16", "--point", "60,40,1",
                 "--box", "20,10,100,70", "--out", os.path.join(self.tmp, "o16.png"),
                 "--raw", raw, "--quiet", self.photo)
        ref = read_npy(raw)
        req = {"input": b64(self.photo), "points": [[60, 40]], "labels": [1],
               "box": [20, 10, 100, 70], "format": "logits"}
        got = {}
        for prec, srv in (("fp32", self.sam_server),
                          ("bf16", self.serve(self.sam, "--precision", "bf16"))):
            st, _, j = srv.post("/v1/segment", req)
            self.assertEqual(st, 200, j)
            got[prec] = np.frombuffer(base64.b64decode(j["logits"]), "<f4").reshape(j["shape"])
        np.testing.assert_allclose(got["bf16"], ref, atol=TOL, rtol=TOL)
        self.assertFalse(np.array_equal(got["bf16"], got["fp32"]))
        self.assertGreaterEqual(((got["bf16"] > 0) == (got["fp32"] > 0)).mean(), 0.95)

    def test_precision_refused(self):
        # Depth Anything has no lower-precision load: refused, saying why,
        # instead of serving fp32 under a bf16 flag; an unknown name for SAM
        for model, prec, words in ((self.depth, "bf16", ("Depth Anything", "fp32")),
                                   (self.sam, "fp16", ("--precision must be",))):
            p = subprocess.run([VITC, "serve", "--model", model, "--port", "0", "--precision",
                                prec], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=60)
            self.assertNotEqual(p.returncode, 0, prec)
            for w in words:
                self.assertIn(w, p.stderr.decode(), prec)

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
                 ({}, "no prompt"),
                 ({"points": [], "labels": []}, "no prompt"),
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
        # a raw image body: the defaults (png16)
        with open(self.photo, "rb") as f:
            st, _, data = self.depth_server.request("POST", "/v1/depth", f.read(),
                                                    headers={"Content-Type": "image/png"})
        self.assertEqual(st, 200, data)
        self.assertEqual(json.loads(data)["depth"], j["depth"])
        st, _, j = self.depth_server.post("/v1/depth", {"input": b64(self.photo),
                                                        "format": "npy"})
        self.assertEqual(st, 400)
        self.assertIn("format", j["error"]["message"])

    def test_api_key_and_drain(self):
        key = write_key(os.path.join(self.tmp, "key"), "s3cret")
        srv = self.serve(self.depth, "--api-key-file", key)
        st, _, _ = srv.post("/v1/depth", {"input": b64(self.photo2)})
        self.assertEqual(st, 401)
        st, _, j = srv.post("/v1/depth", {"input": b64(self.photo2)},
                            headers={"Authorization": "Bearer s3cret"})
        self.assertEqual(st, 200, j)
        self.assertEqual((j["width"], j["height"]), (64, 72))
        self.assertEqual(srv.stop(), 0)

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
        st, _, data = self.depth_server.request("GET", "/metrics")
        self.assertEqual(st, 200)
        self.assertRegex(data.decode(),
                         r'vitc_requests_total\{endpoint="/v1/segment",status="400"\} [1-9]')

    def pixels(self, drv, cid):
        data = drv.execute_script("""
            const c = document.getElementById(arguments[0]);
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            return [c.width, c.height, Array.from(d)];""", cid)
        return np.array(data[2], np.float64).reshape(data[1], data[0], 4)[..., :3]

    def test_page_in_chromium(self):
        drv = browser(self)
        try:
            # SAM: a click asks for the mask at that point; the best of the
            # three is drawn over the image
            drv.get("http://127.0.0.1:%d/" % self.sam_server.port)
            WebDriverWait(drv, 10).until(lambda d: d.find_element(By.TAG_NAME, "body")
                                         .get_attribute("data-ready") == "1")
            self.assertTrue(drv.find_element(By.ID, "segment-panel").is_displayed())
            self.assertFalse(drv.find_element(By.ID, "depth-panel").is_displayed())
            self.assertFalse(drv.find_element(By.ID, "classes-panel").is_displayed())
            drv.find_element(By.ID, "file").send_keys(self.photo)
            WebDriverWait(drv, 10).until(lambda d: d.find_element(By.ID, "seg-canvas")
                                         .get_attribute("data-drawn") not in (None, "", "0"))
            orig = np.asarray(Image.open(self.photo), np.float64)
            np.testing.assert_array_equal(self.pixels(drv, "seg-canvas"), orig)
            drv.execute_script("""
                const c = document.getElementById('seg-canvas'), b = c.getBoundingClientRect();
                c.dispatchEvent(new MouseEvent('click', {bubbles: true, clientX: b.left + 0.5 * b.width,
                                                         clientY: b.top + 0.5 * b.height}));""")
            wait_state(self, drv, "segment-panel")
            pts = json.loads(drv.find_element(By.ID, "seg-canvas").get_attribute("data-points"))
            self.assertEqual(len(pts), 1)
            self.assertLess(abs(pts[0][0] - 60) + abs(pts[0][1] - 40), 1, pts)
            _, _, ref = self.sam_server.post("/v1/segment", {
                "input": b64(self.photo), "points": pts, "labels": [1],
                "multimask": True, "format": "logits"})
            logits = np.frombuffer(base64.b64decode(ref["logits"]), "<f4").reshape(ref["shape"])
            best = int(np.argmax(ref["iou"]))
            iou = float(drv.find_element(By.ID, "seg-iou").get_attribute("data-iou"))
            self.assertAlmostEqual(iou, ref["iou"][best], places=3)
            got = self.pixels(drv, "seg-canvas")
            changed = np.abs(got - orig).max(-1) > 3
            mask = logits[best] > 0
            self.assertGreater(mask.sum(), 0)
            # all but the point's dot and pixels right at the edge agree
            self.assertGreater((changed == mask).mean(), 0.98)
            drv.find_element(By.ID, "seg-clear").click()
            np.testing.assert_array_equal(self.pixels(drv, "seg-canvas"), orig)

            # Depth Anything: the float32 map in cmd_depth.c's inferno
            drv.get("http://127.0.0.1:%d/" % self.depth_server.port)
            WebDriverWait(drv, 10).until(lambda d: d.find_element(By.TAG_NAME, "body")
                                         .get_attribute("data-ready") == "1")
            self.assertFalse(drv.find_element(By.ID, "segment-panel").is_displayed())
            drv.find_element(By.ID, "file").send_keys(self.photo)
            wait_state(self, drv, "depth-panel")
            _, _, ref = self.depth_server.post("/v1/depth", {"input": b64(self.photo),
                                                             "format": "float32"})
            d = np.frombuffer(base64.b64decode(ref["depth"]), "<f4").reshape(80, 120)
            want = inferno((d - ref["min"]) / (ref["max"] - ref["min"]))
            self.assertLessEqual(np.abs(self.pixels(drv, "depth-canvas") - want).max(), 1.01)
            logs = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]
            self.assertEqual(logs, [], "the page's console errors (CSP, script)")
        finally:
            drv.quit()


if __name__ == "__main__":
    unittest.main()
