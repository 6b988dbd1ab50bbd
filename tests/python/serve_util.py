"""What the `vitc serve` tests (tests/python/test_serve*.py) share: the
server on a free loopback port and its requests, a test class that stops
its servers, the tiny models they serve, images as base64 and data: URLs,
and the web page's headless Chromium."""
import base64
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

try:
    from .util import DATA, VITC, TmpDirCase, export_cmd
except ImportError:  # run as a script
    from util import DATA, VITC, TmpDirCase, export_cmd

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover
    webdriver = None


def have_serve():
    """build/vitc is there and was built with libmicrohttpd."""
    if not os.path.exists(VITC):
        return False
    p = subprocess.run([VITC, "serve", "--model", "/nonexistent"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    return b"built without libmicrohttpd" not in p.stderr


def b64(path):
    """A file's bytes as base64 text; path: absolute, or a name in tests/data."""
    with open(os.path.join(DATA, path), "rb") as f:
        return base64.b64encode(f.read()).decode()


def data_url(path, mime=None):
    """The image at path (absolute, or a name in tests/data) as a data:
    URL; mime: from the name's ending when None (.jpg/.jpeg JPEG, else PNG)."""
    if mime is None:
        mime = "image/jpeg" if path.lower().endswith((".jpg", ".jpeg")) else "image/png"
    return "data:%s;base64,%s" % (mime, b64(path))


def write_key(path, key):
    """An --api-key-file holding key; its path."""
    with open(path, "w") as f:
        f.write(key + "\n")
    return path


def tiny_vit_safetensors(tmp, seed=0):
    """test_cli's tiny ViT exported as tmp/m.safetensors; its path."""
    import torch
    try:
        from .test_cli import tiny_vit
    except ImportError:  # run as a script
        from test_cli import tiny_vit
    pth = os.path.join(tmp, "m.pth")
    torch.save(tiny_vit(seed).state_dict(), pth)
    out = os.path.join(tmp, "m.safetensors")
    subprocess.run(export_cmd(pth, out), check=True, stdout=subprocess.DEVNULL)
    return out


def tiny_clip_dir(path, vision, logit_scale=None, preprocessor=None):
    """A random-weight CLIP Hub directory with the real CLIP vocabulary's
    tokenizer files: a one-layer text tower of width 32, vision (a
    CLIPVisionConfig's keywords), projection 24; logit_scale: exp() of its
    logit_scale when given; preprocessor: preprocessor_config.json's
    entries over CLIP's. Draws from torch's global generator."""
    import numpy as np
    import torch
    from transformers import CLIPConfig, CLIPModel
    try:
        from .test_zero_shot import clip_tokenizer_files, processor
    except ImportError:  # run as a script
        from test_zero_shot import clip_tokenizer_files, processor
    tc = dict(vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, max_position_embeddings=77)
    m = CLIPModel(CLIPConfig(text_config=tc, vision_config=vision, projection_dim=24)).eval()
    if logit_scale is not None:
        with torch.no_grad():
            m.logit_scale.fill_(float(np.log(logit_scale)))
    m.save_pretrained(path)
    clip_tokenizer_files(path)
    pc = processor("clip")
    pc.update(preprocessor or {})
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump(pc, f)
    return path


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
            self.p.wait()
            self.p.stderr.close()
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


class ServeCase(TmpDirCase):
    """A test class whose servers (started with cls.serve) are stopped
    after its last test, each having to exit 0 on SIGTERM."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.servers = []

    @classmethod
    def serve(cls, model, *args):
        srv = Server(model, *args)
        cls.servers.append(srv)
        return srv

    @classmethod
    def tearDownClass(cls):
        rcs = [s.stop() for s in cls.servers]
        super().tearDownClass()
        assert rcs == [0] * len(rcs), "vitc serve exited %s" % rcs

    def run_cli(self, *args):
        """build/vitc with args (made strings), which must succeed; its stdout."""
        p = subprocess.run([VITC] + [str(a) for a in args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        return p.stdout.decode()


def browser(test):
    """Debian's headless Chromium through selenium at a fixed window size
    and scale (the pixel checks depend on them), or test skipped."""
    if webdriver is None:
        test.skipTest("selenium is not installed (requirements-dev.txt)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        test.skipTest("Debian's chromium and chromium-driver are not installed "
                      "(scripts/install-deps.sh installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1100,900", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    try:
        return webdriver.Chrome(service=Service(driver), options=opts)
    except Exception as e:  # noqa: BLE001 (any failure to start the browser)
        test.skipTest("headless chromium cannot run here: %s" % str(e).splitlines()[0])


def wait_state(test, drv, panel, timeout=20):
    """Waits for the page's panel to finish; it must end "done" (the
    page's status line says why not)."""
    WebDriverWait(drv, timeout).until(
        lambda d: d.find_element(By.ID, panel).get_attribute("data-state") in ("done", "error"))
    test.assertEqual(drv.find_element(By.ID, panel).get_attribute("data-state"), "done",
                     drv.find_element(By.ID, "status").text)
