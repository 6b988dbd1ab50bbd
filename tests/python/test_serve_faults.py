"""`vitc serve`'s limits and faults, each with the status it answers: 400
naming malformed JSON, bad base64, an undecodable or oversized image; 401
without the API key; 413 from the headers, before the body; 429 with
Retry-After at once on a full queue; slow clients (headers, body, reading)
cut off without holding the batcher or other clients; connection limits
(total, per address) answered at once; a client that disconnects while
queued is dropped, its images never run; SIGTERM finishes the queue and
exits 0. A tiny random-weight ViT on a loopback port."""
import base64
import os
import signal
import socket
import struct
import threading
import time
import unittest
import zlib

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

try:
    from .serve_util import ServeCase, Server, data_url, have_serve, tiny_vit_safetensors, \
        write_key
except ImportError:  # run as a script
    from serve_util import ServeCase, Server, data_url, have_serve, tiny_vit_safetensors, \
        write_key


def huge_png(w, h):
    """A valid PNG header claiming w x h pixels with almost no data: the
    decoder's pixel bound must refuse it before allocating."""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))
            + chunk(b"IEND", b""))


def closed_soon(s, within):
    """Whether the server closes (or resets) the socket within `within`
    seconds without answering."""
    s.settimeout(within)
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def raw_post(port, path, body, timeout=10):
    """A POST on a socket of its own, the reply not read: the caller
    decides when to read it or to go away."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
    return s


@unittest.skipIf(torch is None or not have_serve(), "needs torch and build/vitc with serve")
class TestServeFaults(ServeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = tiny_vit_safetensors(cls.tmp)
        cls.key = write_key(os.path.join(cls.tmp, "key"), "s3cret-key")
        cls.srv = cls.serve(cls.model, "--max-body-mb", 1, "--max-batch", 4, "--threads", 1)

    def test_bad_inputs_400(self):
        cases = [
            ('{"input": [', "malformed JSON"),
            ({"nope": 1}, '"input" is required'),
            ({"input": []}, "empty"),
            ({"input": ["ab!c"]}, "bad base64"),
            ({"input": ["data:image/png,abc"]}, "base64"),
            ({"input": [base64.b64encode(b"hello, not an image").decode()]},
             "cannot decode the image"),
            ({"input": [base64.b64encode(huge_png(200000, 200000)).decode()]},
             "cannot decode the image"),
            ({"input": [data_url("photo.jpg", "image/jpeg")], "encoding_format": "hex"},
             "encoding_format"),
        ]
        for body, want in cases:
            status, _, got = self.srv.post("/v1/embeddings", body)
            self.assertEqual(status, 400, (body if isinstance(body, str) else list(body), got))
            self.assertIn(want, got["error"]["message"])
            self.assertEqual(got["error"]["code"], 400)

    def test_body_over_limit_413_before_reading(self):
        # Content-Length says 2 MiB (limit 1): the answer comes with no byte
        # of the body sent
        s = socket.create_connection(("127.0.0.1", self.srv.port), timeout=10)
        s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
        reply = s.recv(4096)
        s.close()
        self.assertTrue(reply.startswith(b"HTTP/1.1 413"), reply[:100])
        # chunked: no length up front; once past the limit the server
        # closes the connection (it cannot answer mid-body) and never
        # parses the body
        s = socket.create_connection(("127.0.0.1", self.srv.port), timeout=10)
        s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                  b"\r\n\r\n")
        chunk = b"a" * 65536
        reply = b""
        # the reply is read as it comes: once the server closes, what is
        # still unread on its side resets the connection
        for _ in range(40):
            try:
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                s.settimeout(0.05)
                reply = s.recv(4096)
                if reply:
                    break
            except socket.timeout:
                continue
            except OSError:
                break
            finally:
                s.settimeout(10)
        try:
            s.sendall(b"0\r\n\r\n")
            s.settimeout(5)
            reply += s.recv(4096)
        except OSError:
            pass
        s.close()
        self.assertEqual(reply, b"")
        self.assertEqual(self.srv.request("GET", "/health")[0], 200)

    def test_api_key(self):
        srv = Server(self.model, "--api-key-file", self.key, "--threads", 1)
        try:
            body = {"input": [data_url("photo.png", "image/png")]}
            status, headers, got = srv.post("/v1/embeddings", body)
            self.assertEqual(status, 401, got)
            self.assertEqual(headers.get("WWW-Authenticate"), "Bearer")
            status, _, _ = srv.post("/v1/classify", body,
                                    headers={"Authorization": "Bearer wrong-key!"})
            self.assertEqual(status, 401)
            status, _, got = srv.post("/v1/embeddings", body,
                                      headers={"Authorization": "Bearer s3cret-key"})
            self.assertEqual(status, 200, got)
            self.assertEqual(srv.request("GET", "/health")[0], 200)
            self.assertEqual(srv.request("GET", "/metrics")[0], 200)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_queue_full_429_and_sigterm_drain(self):
        # a batch waits 3 s to fill: the first request's 2 images fill the
        # queue of 2, the next is refused at once
        srv = Server(self.model, "--max-queue", 2, "--max-batch", 8, "--max-wait-ms", 3000,
                     "--threads", 1)
        img = data_url("photo.jpg", "image/jpeg")
        first = {}

        def send_first():
            first["r"] = srv.post("/v1/embeddings", {"input": [img, img]})
        t = threading.Thread(target=send_first)
        t.start()
        deadline = time.time() + 10
        while srv.metric("vitc_queue_size") != 2 and time.time() < deadline:
            time.sleep(0.02)
        t0 = time.time()
        status, headers, got = srv.post("/v1/embeddings", {"input": [img]})
        self.assertEqual(status, 429, got)
        self.assertLess(time.time() - t0, 1.0)
        self.assertEqual(headers.get("Retry-After"), "1")
        # SIGTERM while the first waits: it still gets its embeddings
        srv.p.send_signal(signal.SIGTERM)
        t.join(20)
        self.assertEqual(first["r"][0], 200, first["r"])
        self.assertEqual(len(first["r"][2]["data"]), 2)
        self.assertEqual(srv.stop(), 0)
        with self.assertRaises(OSError):
            srv.request("GET", "/health", timeout=2)

    def test_slow_client_dropped(self):
        srv = Server(self.model, "--timeout-s", 1, "--threads", 1)
        try:
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n")  # and nothing more
            t0 = time.time()
            data = s.recv(4096)
            self.assertLess(time.time() - t0, 5)
            self.assertFalse(data.startswith(b"HTTP/1.1 200"), data)
            s.close()
            self.assertEqual(srv.request("GET", "/health")[0], 200)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_disconnected_client_dropped(self):
        # a batch waits 3 s to fill: the client's 2 images sit in the
        # queue, the client goes away, they leave the queue without running
        srv = Server(self.model, "--max-batch", 8, "--max-wait-ms", 3000, "--threads", 1)
        img = data_url("photo.jpg", "image/jpeg")
        try:
            s = raw_post(srv.port, "/v1/embeddings",
                         ('{"input": ["%s", "%s"]}' % (img, img)).encode())
            deadline = time.time() + 10
            while srv.metric("vitc_queue_size") != 2 and time.time() < deadline:
                time.sleep(0.02)
            self.assertEqual(srv.metric("vitc_queue_size"), 2)
            t0 = time.time()
            s.close()
            while srv.metric("vitc_queue_size") != 0 and time.time() < deadline:
                time.sleep(0.02)
            self.assertLess(time.time() - t0, 1.0)
            self.assertEqual(srv.metric("vitc_dropped_images_total"), 2)
            self.assertEqual(srv.metric("vitc_dropped_requests_total"), 1)
            # the reply nobody reads is counted as nginx counts it
            self.assertEqual(srv.metric('vitc_requests_total{endpoint="/v1/embeddings",'
                                        'status="499"}'), 1)
            # the next client's image runs alone: the dropped ones never did
            status, _, got = srv.post("/v1/embeddings", {"input": [img]})
            self.assertEqual(status, 200, got)
            self.assertEqual(srv.metric("vitc_images_total"), 1)
            self.assertEqual(srv.metric("vitc_batch_size_count"), 1)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_slow_body_cut_off_batcher_free(self):
        # a body trickled a byte at a time never lets the idle timeout
        # fire; --body-timeout-s cuts it, and meanwhile others are served
        srv = Server(self.model, "--timeout-s", 2, "--body-timeout-s", 1, "--threads", 1)
        try:
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                      b"Content-Type: application/json\r\n\r\n{")
            t0 = time.time()
            t1 = None
            closed = False
            for i in range(40):
                time.sleep(0.25)
                if i == 1:
                    t1 = time.time()
                    status, _, _ = srv.post("/v1/embeddings",
                                            {"input": [data_url("photo.png", "image/png")]})
                    self.assertEqual(status, 200)
                    self.assertLess(time.time() - t1, 2.0)
                try:
                    s.sendall(b" ")
                except OSError:
                    closed = True
                    break
                if closed_soon(s, 0.01):
                    closed = True
                    break
            s.close()
            self.assertTrue(closed)
            self.assertLess(time.time() - t0, 4.0)
            self.assertEqual(srv.metric('vitc_requests_total{endpoint="/v1/embeddings",'
                                        'status="408"}'), 1)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_slow_reader_holds_nothing(self):
        # a client that sends requests and never reads the replies: the
        # others are still answered at once
        sockets = []
        body = ('{"input": ["%s"]}' % data_url("photo.png", "image/png")).encode()
        for _ in range(4):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            s.settimeout(10)
            s.connect(("127.0.0.1", self.srv.port))
            for _ in range(3):  # pipelined, none read
                s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(body), body))
            sockets.append(s)
        t0 = time.time()
        status, _, got = self.srv.post("/v1/embeddings",
                                       {"input": [data_url("photo.jpg", "image/jpeg")]})
        self.assertEqual(status, 200, got)
        self.assertLess(time.time() - t0, 2.0)
        for s in sockets:
            s.close()

    def test_connection_limits_answer_at_once(self):
        for flag in ("--max-connections", "--max-connections-per-ip"):
            srv = Server(self.model, flag, 2, "--threads", 1)
            try:
                idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                        for _ in range(2)]
                for s in idle:
                    s.sendall(b"GET /health HTTP/1.1\r\n")  # and nothing more
                time.sleep(0.2)
                t0 = time.time()
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                self.assertTrue(closed_soon(s, 2.0), flag)
                self.assertLess(time.time() - t0, 1.0, flag)
                s.close()
                for s in idle:
                    s.close()
                # the slots come back once the idle ones leave
                deadline = time.time() + 5
                while time.time() < deadline:
                    try:
                        if srv.request("GET", "/health", timeout=2)[0] == 200:
                            break
                    except OSError:
                        time.sleep(0.05)
                self.assertEqual(srv.request("GET", "/health")[0], 200, flag)
            finally:
                self.assertEqual(srv.stop(), 0)


if __name__ == "__main__":
    unittest.main()
