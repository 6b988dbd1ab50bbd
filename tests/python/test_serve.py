"""`vitc serve` on a loopback port with a tiny random-weight ViT: each
endpoint's numbers equal the CLI's on the same image (`vitc embed`,
`vitc classify`), requests at once form batches, the metrics are there.
The limits and faults (statuses, slow and vanishing clients, SIGTERM) are
tests/python/test_serve_faults.py's."""
import base64
import http.client
import json
import os
import re
import signal
import struct
import subprocess
import threading
import time
import unittest
import zlib

try:
    import numpy as np
    import torch
except ImportError:  # pragma: no cover
    torch = None

try:
    from .util import DATA, VITC, TmpDirCase, assert_close, export_cmd
    from .test_cli import tiny_vit
except ImportError:  # run as a script
    from util import DATA, VITC, TmpDirCase, assert_close, export_cmd
    from test_cli import tiny_vit


def have_serve():
    if not os.path.exists(VITC):
        return False
    p = subprocess.run([VITC, "serve", "--model", "/nonexistent"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    return b"built without libmicrohttpd" not in p.stderr


def data_url(name, mime):
    with open(os.path.join(DATA, name), "rb") as f:
        return "data:%s;base64,%s" % (mime, base64.b64encode(f.read()).decode())


def huge_png(w, h):
    """A valid PNG header claiming w x h pixels with almost no data: the
    decoder's pixel bound must refuse it before allocating."""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))
            + chunk(b"IEND", b""))


class Server:
    """build/vitc serve on a free loopback port (--port 0; the port is read
    from its 'listening on' line), stopped with SIGTERM."""

    def __init__(self, model, *args):
        self.p = subprocess.Popen([VITC, "serve", "--model", model, "--port", "0"]
                                  + [str(a) for a in args],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines = []
        self.port = None
        deadline = time.time() + 20
        while time.time() < deadline:
            line = self.p.stderr.readline().decode()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "serve: ready" in line:
                break
        if self.port is None or "serve: ready" not in "".join(self.lines):
            self.p.kill()
            raise RuntimeError("vitc serve did not start: " + "".join(self.lines))
        # the rest of stderr is drained so the server never blocks on it
        self.rest = []
        self.reader = threading.Thread(target=lambda: self.rest.extend(
            l.decode() for l in self.p.stderr), daemon=True)
        self.reader.start()

    def request(self, method, path, body=None, headers=None, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def post(self, path, obj, **kw):
        status, headers, data = self.request("POST", path, obj, **kw)
        return status, headers, json.loads(data) if data else None

    def metric(self, name):
        _, _, data = self.request("GET", "/metrics")
        m = re.search(r"^%s (\S+)$" % re.escape(name), data.decode(), re.M)
        return float(m.group(1)) if m else None

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.reader.join(5)
        self.p.stderr.close()
        return self.p.returncode


@unittest.skipIf(torch is None or not have_serve(), "needs torch and build/vitc with serve")
class TestServe(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        pth = os.path.join(cls.tmp, "m.pth")
        torch.save(tiny_vit(0).state_dict(), pth)
        cls.model = os.path.join(cls.tmp, "m.safetensors")
        subprocess.run(export_cmd(pth, cls.model), check=True, stdout=subprocess.DEVNULL)
        cls.key = os.path.join(cls.tmp, "key")
        with open(cls.key, "w") as f:
            f.write("s3cret-key\n")
        cls.srv = Server(cls.model, "--max-body-mb", 1, "--max-batch", 4, "--threads", 1)

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        super().tearDownClass()
        assert rc == 0, "vitc serve exited %s" % rc

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
    from transformers import CLIPConfig, CLIPModel
    try:
        from .test_zero_shot import VISION, clip_tokenizer_files, processor
    except ImportError:  # run as a script
        from test_zero_shot import VISION, clip_tokenizer_files, processor
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
        cls.dir = os.path.join(cls.tmp, "clip")
        tc = dict(vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, max_position_embeddings=77)
        CLIPModel(CLIPConfig(text_config=tc, vision_config=VISION,
                             projection_dim=24)).eval().save_pretrained(cls.dir)
        clip_tokenizer_files(cls.dir)
        with open(os.path.join(cls.dir, "preprocessor_config.json"), "w") as f:
            json.dump(processor("clip"), f)

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
