"""`vitc serve`'s web page and the endpoints it draws from.

Two servers on free loopback ports: a small random-weight torchvision ViT
exported with class names (classify, attention) and a random-weight CLIP Hub
directory with the real CLIP vocabulary (zero-shot, attention). The
endpoints' numbers are compared with the CLI's on the same photo (`vitc
attention-map --raw`, `vitc zero-shot --json`) within 1e-5; the page is
driven in Debian's headless Chromium through selenium: a real photo
(skimage's astronaut) is uploaded through the file input, and the classes,
the attention canvas and the typed zero-shot labels it shows are checked
against the API's JSON.

The screenshot in docs/images/serve-web.png is this test's: set
VITC_WEB_SCREENSHOT=docs/images/serve-web.png to write it there (by default
it goes to the scratch directory, so a test run leaves the tree clean).
"""
import base64
import json
import os
import subprocess
import threading
import unittest

import numpy as np

try:
    from .util import VITC, export_cmd
    from .serve_util import ServeCase, Server, browser, data_url, have_serve, tiny_clip_dir, \
        wait_state, write_key
except ImportError:  # run as a script
    from util import VITC, export_cmd
    from serve_util import ServeCase, Server, browser, data_url, have_serve, tiny_clip_dir, \
        wait_state, write_key

try:
    import torch
    import skimage.data
    from PIL import Image
    from torchvision.models import VisionTransformer
    from transformers import CLIPModel  # noqa: F401 (tiny_clip_dir's, checked here)
    HAVE_PEERS = True
except ImportError:  # pragma: no cover
    HAVE_PEERS = False

try:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover (browser() skips the tests that need them)
    pass

CLASSES = ["astronaut", "coffee mug", "tabby cat", "rocket", "golden retriever", "teapot",
           "space shuttle", "espresso"]
ZS_LABELS = ["an astronaut", "a cup of coffee", "a cat", "a rocket"]


def rel(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float((np.abs(got - ref) / np.maximum(1.0, np.abs(ref))).max())


@unittest.skipUnless(HAVE_PEERS and os.path.exists(VITC) and have_serve(),
                     "needs torch, transformers, open_clip, skimage and build/vitc with serve")
class TestServeWeb(ServeCase):
    TMP_PREFIX = "vitc_web_"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        torch.manual_seed(0)
        cls.photo = os.path.join(cls.tmp, "astronaut.png")
        Image.fromarray(skimage.data.astronaut()).convert("RGB").save(cls.photo)
        cls.coffee = os.path.join(cls.tmp, "coffee.png")
        Image.fromarray(skimage.data.coffee()).convert("RGB").save(cls.coffee)
        # a ViT with a head and class names: 112 px, patch 16 (a 7x7 grid)
        vit = VisionTransformer(image_size=112, patch_size=16, num_layers=2, num_heads=2,
                                hidden_dim=32, mlp_dim=64, num_classes=len(CLASSES))
        torch.nn.init.normal_(vit.heads.head.weight, std=0.5)
        torch.nn.init.normal_(vit.heads.head.bias, std=0.5)
        pth = os.path.join(cls.tmp, "vit.pth")
        torch.save(vit.eval().state_dict(), pth)
        labels = os.path.join(cls.tmp, "labels.txt")
        with open(labels, "w") as f:
            f.write("\n".join(CLASSES) + "\n")
        cls.vit = os.path.join(cls.tmp, "vit.safetensors")
        subprocess.run(export_cmd(pth, cls.vit, "--labels", labels), check=True,
                       stdout=subprocess.DEVNULL)
        # CLIP with its tokenizer: 64 px, patch 16 (a 4x4 grid)
        vc = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=64, patch_size=16)
        cls.clip = tiny_clip_dir(os.path.join(cls.tmp, "clip"), vc, logit_scale=100.0,
                                 preprocessor={"size": {"shortest_edge": 64},
                                               "crop_size": {"height": 64, "width": 64}})
        cls.srv_vit = cls.serve(cls.vit, "--threads", 1)
        cls.srv_clip = cls.serve(cls.clip, "--threads", 1)

    def cli(self, *args):
        return self.run_cli(*args, "--threads", 1)

    # ---- endpoints ------------------------------------------------------

    def test_info(self):
        status, headers, got = self.srv_vit.request("GET", "/v1/info")
        self.assertEqual(status, 200)
        got = json.loads(got)
        self.assertEqual(got["model"], "vit.safetensors")
        self.assertEqual((got["image_size"], got["patch_size"], got["num_classes"]),
                         ([112, 112], 16, len(CLASSES)))
        self.assertEqual((got["has_head"], got["has_labels"], got["has_text"]),
                         (True, True, False))
        self.assertEqual(got["embedding_dim"], 32)
        self.assertEqual(got["capabilities"], {"embeddings": True, "classify": True,
                                               "zero_shot": False, "attention": True,
                                               "segment": False, "depth": False})
        status, _, got = self.srv_clip.request("GET", "/v1/info")
        got = json.loads(got)
        self.assertEqual((got["family"], got["has_text"], got["has_head"], got["embedding_dim"]),
                         ("hf-clip", True, False, 24))
        self.assertTrue(got["capabilities"]["zero_shot"])
        self.assertFalse(got["capabilities"]["classify"])
        self.assertEqual(self.srv_vit.request("POST", "/v1/info", "{}")[0], 405)

    def test_page_files(self):
        status, h, body = self.srv_vit.request("GET", "/")
        self.assertEqual(status, 200)
        self.assertEqual(h["Content-Type"], "text/html; charset=utf-8")
        csp = h["Content-Security-Policy"]
        self.assertIn("default-src 'self'", csp)
        self.assertIn("img-src 'self' data: blob:", csp)
        self.assertEqual(h["X-Content-Type-Options"], "nosniff")
        self.assertIn("no-cache", h["Cache-Control"])
        with open(os.path.join(os.path.dirname(VITC), "..", "web", "index.html"), "rb") as f:
            self.assertEqual(body, f.read())
        self.assertNotIn(b"http://", body.replace(b"http://www.w3.org", b""))
        status, h2, _ = self.srv_vit.request("GET", "/", headers={"If-None-Match": h["ETag"]})
        self.assertEqual(status, 304)
        for path, ctype in (("/app.js", "text/javascript; charset=utf-8"),
                            ("/style.css", "text/css; charset=utf-8"),
                            ("/index.html", "text/html; charset=utf-8"),
                            ("/favicon.svg", "image/svg+xml")):
            status, h, body = self.srv_vit.request("GET", path)
            self.assertEqual((status, h["Content-Type"]), (200, ctype), path)
            self.assertTrue(body)
        self.assertEqual(self.srv_vit.request("GET", "/embed.c")[0], 404)
        self.assertEqual(self.srv_vit.request("POST", "/app.js", "x")[0], 405)

    def test_attention_equals_cli(self):
        for method in ("rollout", "cls"):
            npy = os.path.join(self.tmp, "attn-%s.npy" % method)
            self.cli("attention-map", "--model", self.vit, "--out",
                     os.path.join(self.tmp, "attn.png"), "--raw", npy, "--method", method,
                     "--quiet", self.photo)
            ref = np.load(npy)
            status, _, got = self.srv_vit.post("/v1/attention", {"input": data_url(self.photo),
                                                                 "method": method})
            self.assertEqual(status, 200, got)
            item = got["data"][0]
            self.assertEqual((item["method"], item["grid"]), (method, [7, 7]))
            self.assertLess(rel(item["map"], ref), 1e-5, method)
            img = item["image"]
            self.assertEqual((img["width"], img["height"]), (112, 112))
            rgb = np.frombuffer(base64.b64decode(img["rgb"]), np.uint8)
            self.assertEqual(rgb.size, 112 * 112 * 3)
            # the crop the CLI shows: resize to 128, centre 112 of the photo
            self.assertGreater(rgb.std(), 10)
        # a raw image body: the default method, rollout
        with open(self.photo, "rb") as f:
            status, _, got = self.srv_vit.post("/v1/attention", f.read(),
                                               headers={"Content-Type": "image/png"})
        self.assertEqual(status, 200, got)
        self.assertLess(rel(got["data"][0]["map"],
                            np.load(os.path.join(self.tmp, "attn-rollout.npy"))), 1e-5)
        status, _, got = self.srv_vit.post("/v1/attention", {"input": data_url(self.photo),
                                                             "method": "mean"})
        self.assertEqual(status, 400)
        self.assertIn("\"method\" must be", got["error"]["message"])

    def zs_cli(self, labels, *opts, image=None):
        out = self.cli("zero-shot", "--model", self.clip, "--labels", ",".join(labels),
                       "--json", "--no-cache", "--quiet", "--top", len(labels), *opts,
                       image or self.photo)
        return json.loads(out.splitlines()[0])["labels"]

    def test_zero_shot_equals_cli(self):
        for body, opts in (({}, ()), ({"templates": "simple"}, ("--templates", "simple"))):
            ref = self.zs_cli(ZS_LABELS, *opts)
            status, _, got = self.srv_clip.post("/v1/zero-shot", dict(
                body, input=[data_url(self.photo), data_url(self.coffee)], labels=ZS_LABELS,
                top_k=4))
            self.assertEqual(status, 200, got)
            self.assertEqual(got["probabilities"], "softmax")
            self.assertEqual(len(got["data"]), 2)
            row = got["data"][0]["labels"]
            self.assertEqual([r["label"] for r in row], [r["label"] for r in ref], body)
            self.assertLess(rel([r["prob"] for r in row], [r["prob"] for r in ref]), 1e-5, body)
            ref2 = self.zs_cli(ZS_LABELS, *opts, image=self.coffee)
            row = got["data"][1]["labels"]
            self.assertLess(rel([r["prob"] for r in row], [r["prob"] for r in ref2]), 1e-5)
        # a custom template list equals the CLI's --template for one template
        ref = self.zs_cli(ZS_LABELS, "--template", "itap of a {}")
        status, _, got = self.srv_clip.post("/v1/zero-shot", {
            "input": data_url(self.photo), "labels": ZS_LABELS, "templates": ["itap of a {}"],
            "top_k": 2})
        self.assertEqual(status, 200, got)
        self.assertEqual(len(got["data"][0]["labels"]), 2)
        self.assertLess(rel([r["prob"] for r in got["data"][0]["labels"]],
                            [r["prob"] for r in ref[:2]]), 1e-5)
        # the same label set again: its class embeddings come from memory
        status, _, again = self.srv_clip.post("/v1/zero-shot", {
            "input": data_url(self.photo), "labels": ZS_LABELS, "templates": ["itap of a {}"],
            "top_k": 2})
        self.assertEqual((got["cached"], again["cached"]), (False, True))
        self.assertEqual(again["data"], got["data"])

    def test_zero_shot_errors(self):
        url = data_url(self.photo)
        cases = [
            (self.srv_vit, {"input": url, "labels": ["a"]}, "no text tower"),
            (self.srv_clip, {"input": url}, "\"labels\" is required"),
            (self.srv_clip, {"input": url, "labels": []}, "\"labels\" is required"),
            (self.srv_clip, {"input": url, "labels": ["a", ""]}, "labels[1]: empty"),
            (self.srv_clip, {"input": url, "labels": ["x" * 5000]}, "longer than 4096"),
            (self.srv_clip, {"input": url, "labels": ["a", 3]}, "labels[1]: not a string"),
            (self.srv_clip, {"input": url, "labels": ["a"], "templates": "fancy"},
             "\"templates\" must be"),
            (self.srv_clip, {"input": url, "labels": ["a"], "templates": ["no slot"]},
             "templates[0]: has no {}"),
            (self.srv_clip, {"input": url, "labels": ["a"] * 300, "templates": "imagenet80"},
             "prompts; one request takes at most"),
            (self.srv_clip, {"input": url, "labels": ["a"], "top_k": 0}, "\"top_k\""),
            (self.srv_clip, {"labels": ["a"]}, "\"input\" is required"),
            (self.srv_clip, {"input": "data:image/png;base64,AAAA", "labels": ["a"]},
             "input[0]: cannot decode the image"),
        ]
        for srv, body, msg in cases:
            status, _, got = srv.post("/v1/zero-shot", body)
            self.assertEqual(status, 400, (body if len(str(body)) < 200 else msg, got))
            self.assertIn(msg, got["error"]["message"])

    def test_segment_and_depth_say_what_is_missing(self):
        for path, what in (("/v1/segment", "no mask decoder"), ("/v1/depth", "no depth head")):
            status, _, got = self.srv_vit.post(path, {"input": data_url(self.photo)})
            self.assertEqual(status, 400, got)
            self.assertIn("the loaded model has " + what, got["error"]["message"])

    def test_metrics_count_new_endpoints(self):
        self.srv_vit.request("GET", "/v1/info")
        _, _, text = self.srv_vit.request("GET", "/metrics")
        self.assertIn('vitc_requests_total{endpoint="/v1/info",status="200"}', text.decode())

    def test_concurrent_with_the_batcher(self):
        """The second session's forwards beside the batcher's: each answer
        equals the one it gets alone."""
        url = data_url(self.photo)
        alone = {
            "/v1/attention": self.srv_vit.post("/v1/attention", {"input": url})[2],
            "/v1/classify": self.srv_vit.post("/v1/classify", {"input": url})[2],
            "/v1/embeddings": self.srv_vit.post("/v1/embeddings", {"input": url})[2],
        }
        got, errors = [], []

        def one(path):
            try:
                for _ in range(3):
                    status, _, r = self.srv_vit.post(path, {"input": url})
                    got.append((path, status, r))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=one, args=(p,)) for p in list(alone) * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(len(got), 18)
        for path, status, r in got:
            self.assertEqual(status, 200, r)
            ref = alone[path]["data"][0]
            if path == "/v1/attention":
                self.assertLess(rel(r["data"][0]["map"], ref["map"]), 1e-5)
            elif path == "/v1/classify":
                self.assertLess(rel([t["prob"] for t in r["data"][0]["topk"]],
                                    [t["prob"] for t in ref["topk"]]), 1e-5)
            else:
                self.assertLess(rel(r["data"][0]["embedding"], ref["embedding"]), 1e-5)

    def test_api_key(self):
        key = write_key(os.path.join(self.tmp, "key"), "s3cret")
        srv = Server(self.vit, "--threads", 1, "--api-key-file", key)
        try:
            # the page's files are public (no data in them); the API is not
            self.assertEqual(srv.request("GET", "/")[0], 200)
            self.assertEqual(srv.request("GET", "/app.js")[0], 200)
            self.assertEqual(srv.request("GET", "/v1/info")[0], 401)
            self.assertEqual(srv.post("/v1/attention", {"input": "x"})[0], 401)
            status, _, _ = srv.request("GET", "/v1/info",
                                       headers={"Authorization": "Bearer s3cret"})
            self.assertEqual(status, 200)
        finally:
            self.assertEqual(srv.stop(), 0)

    # ---- the page in headless Chromium ----------------------------------

    def shown(self, drv, list_id):
        return [(li.get_attribute("data-label"), float(li.get_attribute("data-prob")),
                 li.find_element(By.CLASS_NAME, "pct").text)
                for li in drv.find_elements(By.CSS_SELECTOR, "#%s li" % list_id)]

    def canvas_stats(self, drv, cid):
        return drv.execute_script("""
            const c = document.getElementById(arguments[0]);
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let mn = 255, mx = 0;
            for (let i = 0; i < d.length; i += 4) { mn = Math.min(mn, d[i + 1]); mx = Math.max(mx, d[i + 1]); }
            return [c.width, c.height, mn, mx, c.dataset.drawn || '0'];""", cid)

    def test_page_in_chromium(self):
        drv = browser(self)
        try:
            # the ViT: classes and attention; no zero-shot panel
            drv.get("http://127.0.0.1:%d/" % self.srv_vit.port)
            WebDriverWait(drv, 10).until(lambda d: d.find_element(By.TAG_NAME, "body")
                                         .get_attribute("data-ready") == "1")
            self.assertFalse(drv.find_element(By.ID, "zeroshot-panel").is_displayed())
            self.assertFalse(drv.find_element(By.ID, "segment-panel").is_displayed())
            self.assertIn("vit.safetensors", drv.find_element(By.ID, "model-line").text)
            drv.find_element(By.ID, "file").send_keys(self.photo)
            wait_state(self, drv, "classes-panel")
            wait_state(self, drv, "attention-panel")
            _, _, ref = self.srv_vit.post("/v1/classify", {"input": data_url(self.photo),
                                                           "top_k": 5})
            shown = self.shown(drv, "classes")
            self.assertEqual([s[0] for s in shown], [t["label"] for t in ref["data"][0]["topk"]])
            self.assertEqual([s[1] for s in shown], [t["prob"] for t in ref["data"][0]["topk"]])
            self.assertEqual([s[2] for s in shown],
                             ["%.2f%%" % (100 * t["prob"]) for t in ref["data"][0]["topk"]])
            w, h, lo, hi, drawn = self.canvas_stats(drv, "attn-canvas")
            self.assertEqual((w, h), (448, 448))
            self.assertGreater(hi - lo, 50)
            self.assertGreaterEqual(int(drawn), 1)

            # CLIP: attention and zero-shot with labels typed in the page
            drv.get("http://127.0.0.1:%d/" % self.srv_clip.port)
            WebDriverWait(drv, 10).until(lambda d: d.find_element(By.TAG_NAME, "body")
                                         .get_attribute("data-ready") == "1")
            self.assertFalse(drv.find_element(By.ID, "classes-panel").is_displayed())
            drv.find_element(By.ID, "file").send_keys(self.photo)
            wait_state(self, drv, "zeroshot-panel")
            wait_state(self, drv, "attention-panel")
            labels = ["an astronaut in a spacesuit", "a cup of coffee", "a ginger cat",
                      "a rocket on the launch pad", "a flower"]
            box = drv.find_element(By.ID, "zs-labels")
            box.clear()
            box.send_keys(", ".join(labels))
            drv.execute_script("document.getElementById('zeroshot-panel').dataset.state = ''")
            drv.find_element(By.ID, "zs-run").click()
            wait_state(self, drv, "zeroshot-panel")
            _, _, ref = self.srv_clip.post("/v1/zero-shot", {"input": data_url(self.photo),
                                                             "labels": labels, "top_k": 5})
            shown = self.shown(drv, "zs-results")
            self.assertEqual([s[0] for s in shown], [r["label"] for r in ref["data"][0]["labels"]])
            self.assertEqual([s[1] for s in shown], [r["prob"] for r in ref["data"][0]["labels"]])
            w, h, lo, hi, drawn = self.canvas_stats(drv, "attn-canvas")
            self.assertEqual((w, h), (448, 448))
            self.assertGreater(hi - lo, 50)
            shot = os.environ.get("VITC_WEB_SCREENSHOT") or os.path.join(self.tmp, "page.png")
            drv.set_window_size(1100, 760)
            os.makedirs(os.path.dirname(os.path.abspath(shot)), exist_ok=True)
            self.assertTrue(drv.save_screenshot(shot))
            logs = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]
            self.assertEqual(logs, [], "the page's console errors (CSP, script)")
        finally:
            drv.quit()


if __name__ == "__main__":
    unittest.main()
