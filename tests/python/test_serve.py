"""`vitc serve` on a loopback port with a tiny random-weight ViT: each
endpoint's numbers equal the CLI's on the same image (`vitc embed`,
`vitc classify`), requests at once form batches, the metrics are there.
The limits and faults (statuses, slow and vanishing clients, SIGTERM) are
tests/python/test_serve_faults.py's."""
import base64
import json
import os
import subprocess
import threading
import unittest

try:
    import numpy as np
    import torch
except ImportError:  # pragma: no cover
    torch = None

try:
    from .util import DATA, VITC, TmpDirCase, assert_close
    from .serve_util import ServeCase, Server, data_url, have_serve, tiny_clip_dir, \
        tiny_vit_safetensors, write_key
except ImportError:  # run as a script
    from util import DATA, VITC, TmpDirCase, assert_close
    from serve_util import ServeCase, Server, data_url, have_serve, tiny_clip_dir, \
        tiny_vit_safetensors, write_key


@unittest.skipIf(torch is None or not have_serve(), "needs torch and build/vitc with serve")
class TestServe(ServeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = tiny_vit_safetensors(cls.tmp)
        cls.key = write_key(os.path.join(cls.tmp, "key"), "s3cret-key")
        cls.srv = cls.serve(cls.model, "--max-body-mb", 1, "--max-batch", 4, "--threads", 1)

    def cli_json(self, cmd, *args):
        p = subprocess.run([VITC, cmd, "--model", self.model, "--json", "--threads", "1"]
                           + list(args), stdout=subprocess.PIPE, check=True)
        return [json.loads(l) for l in p.stdout.decode().splitlines()]

    def test_health_and_routes(self):
        status, _, data = self.srv.request("GET", "/health")
        self.assertEqual((status, json.loads(data)["status"]), (200, "ok"))
        self.assertEqual(self.srv.request("GET", "/nope")[0], 404)
        self.assertEqual(self.srv.request("GET", "/v1/embeddings")[0], 405)

    def test_embeddings_equal_cli(self):
        images = [("photo.jpg", "image/jpeg"), ("photo.png", "image/png")]
        ref = self.cli_json("embed", *[os.path.join(DATA, n) for n, _ in images])
        inputs = [data_url(n, m) for n, m in images]
        # a bare base64 string is an image too
        inputs.append(inputs[0].split(",", 1)[1])
        status, _, got = self.srv.post("/v1/embeddings", {"input": inputs, "model": "x"})
        self.assertEqual(status, 200, got)
        self.assertEqual(got["object"], "list")
        self.assertEqual(got["model"], "m.safetensors")
        self.assertEqual([d["index"] for d in got["data"]], [0, 1, 2])
        self.assertEqual({d["object"] for d in got["data"]}, {"embedding"})
        for i, r in enumerate([ref[0], ref[1], ref[0]]):
            assert_close(self, got["data"][i]["embedding"], r["embedding"], "embedding %d" % i)
        status, _, b64 = self.srv.post("/v1/embeddings",
                                       {"input": inputs[0], "encoding_format": "base64"})
        self.assertEqual(status, 200, b64)
        v = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4")
        assert_close(self, v, ref[0]["embedding"], "base64 embedding")

    def test_classify_equal_cli(self):
        ref = self.cli_json("classify", "--topk", "3", os.path.join(DATA, "photo.jpg"))[0]
        status, _, got = self.srv.post("/v1/classify", {"input": [data_url("photo.jpg",
                                                                           "image/jpeg")],
                                                        "top_k": 3})
        self.assertEqual(status, 200, got)
        top = got["data"][0]["topk"]
        self.assertEqual([t["index"] for t in top], [t["index"] for t in ref["topk"]])
        assert_close(self, [t["prob"] for t in top], [t["prob"] for t in ref["topk"]], "prob")
        assert_close(self, [t["logit"] for t in top], [t["logit"] for t in ref["topk"]], "logit")

    def test_raw_image_body(self):
        ref = self.cli_json("classify", "--topk", "2", os.path.join(DATA, "photo.png"))[0]
        with open(os.path.join(DATA, "photo.png"), "rb") as f:
            png = f.read()
        status, _, got = self.srv.post("/v1/classify?top_k=2", png,
                                       headers={"Content-Type": "image/png"})
        self.assertEqual(status, 200, got)
        self.assertEqual([t["index"] for t in got["data"][0]["topk"]],
                         [t["index"] for t in ref["topk"]])
        assert_close(self, [t["prob"] for t in got["data"][0]["topk"]],
                     [t["prob"] for t in ref["topk"]], "prob")
        status, _, got = self.srv.post("/v1/embeddings", b"GIF89a....",
                                       headers={"Content-Type": "image/gif"})
        self.assertEqual(status, 400, got)
        self.assertIn("cannot decode the image", got["error"]["message"])

    def test_concurrent_requests_batched(self):
        # 8 clients at once, a batch waits up to 1 s to fill: fewer
        # forwards than requests, each result still the CLI's
        srv = Server(self.model, "--max-batch", 8, "--max-wait-ms", 1000, "--threads", 1)
        names = [("photo.jpg", "image/jpeg"), ("photo.png", "image/png")] * 4
        ref = self.cli_json("embed", *[os.path.join(DATA, n) for n, _ in names[:2]])
        got = [None] * len(names)

        def one(i):
            got[i] = srv.post("/v1/embeddings", {"input": [data_url(*names[i])]})
        try:
            ts = [threading.Thread(target=one, args=(i,)) for i in range(len(names))]
            for t in ts:
                t.start()
            for t in ts:
                t.join(30)
            for i, r in enumerate(got):
                self.assertEqual(r[0], 200, r)
                assert_close(self, r[2]["data"][0]["embedding"], ref[i % 2]["embedding"],
                             "request %d" % i)
            self.assertEqual(srv.metric("vitc_images_total"), 8)
            self.assertLess(srv.metric("vitc_batch_size_count"), 8)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_metrics(self):
        self.srv.post("/v1/embeddings", {"input": [data_url("photo.png", "image/png")]})
        _, headers, data = self.srv.request("GET", "/metrics")
        text = data.decode()
        self.assertTrue(headers["Content-Type"].startswith("text/plain"))
        self.assertRegex(text, r'vitc_requests_total\{endpoint="/v1/embeddings",status="200"\} '
                               r'[1-9]')
        for name in ("vitc_batch_size", "vitc_queue_seconds", "vitc_inference_seconds"):
            self.assertIn("# TYPE %s histogram" % name, text)
            self.assertRegex(text, r'%s_bucket\{le="\+Inf"\} [1-9]' % name)
        self.assertIn("vitc_queue_size 0", text)



try:
    from transformers import CLIPModel
    try:
        from .test_zero_shot import VISION
    except ImportError:  # run as a script
        from test_zero_shot import VISION
except (ImportError, OSError):  # pragma: no cover (OSError: no libvitc.so built)
    CLIPModel = None


@unittest.skipIf(torch is None or CLIPModel is None or not have_serve(),
                 "needs torch, transformers and build/vitc with serve")
class TestServeText(TmpDirCase):
    """A CLIP Hub directory with its tokenizer: bare strings are texts,
    data: URLs images, in one request; each equals `vitc embed`'s."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        torch.manual_seed(0)
        cls.dir = tiny_clip_dir(os.path.join(cls.tmp, "clip"), VISION)

    def test_texts_and_images(self):
        texts = ["a photo of a cat", "two dogs on a beach"]
        tf = os.path.join(self.tmp, "texts.txt")
        with open(tf, "w") as f:
            f.write("\n".join(texts) + "\n")
        p = subprocess.run([VITC, "embed", "--model", self.dir, "--json", "--text-file", tf],
                           stdout=subprocess.PIPE, check=True)
        ref_t = [json.loads(l)["embedding"] for l in p.stdout.decode().splitlines()]
        p = subprocess.run([VITC, "embed", "--model", self.dir, "--json",
                            os.path.join(DATA, "photo.jpg")], stdout=subprocess.PIPE, check=True)
        ref_i = json.loads(p.stdout.decode())["embedding"]
        srv = Server(self.dir, "--threads", 1)
        try:
            status, _, got = srv.post("/v1/embeddings", {"input": [
                texts[0], data_url("photo.jpg", "image/jpeg"), {"text": texts[1]}]})
            self.assertEqual(status, 200, got)
            for i, ref in enumerate([ref_t[0], ref_i, ref_t[1]]):
                self.assertEqual(len(got["data"][i]["embedding"]), 24)
                assert_close(self, got["data"][i]["embedding"], ref, "row %d" % i)
            status, _, got = srv.post("/v1/classify", {"input": ["a cat"]})
            self.assertEqual(status, 400, got)
        finally:
            self.assertEqual(srv.stop(), 0)


if __name__ == "__main__":
    unittest.main()
