#!/usr/bin/env python3
"""`vitc serve` under load, on loopback only, bounded in time.

    PYTHONPATH=python .venv/bin/python bench/serve_load.py            # the full run
    PYTHONPATH=python .venv/bin/python bench/serve_load.py --quick    # a check of the driver

What it measures, each in the same run on the same machine:

1. Load: wrk (Debian's `wrk`, bench/serve_load.lua) POSTs a real photo
   (skimage's coffee, 600x400 JPEG, as a base64 data: URL in JSON) to
   /v1/embeddings at concurrency 1, 8, 64 and 256 for --duration seconds
   each: throughput (images/s, one image a request), p50/p99 latency,
   errors, and the batch sizes the server formed (its /metrics histogram,
   the difference over the run).
2. Overhead at saturation: the best images/s through the server against
   the model's own speed, `vitc bench --only vit_b16_b8` (ViT-B/16 forward
   at batch 8 = --max-batch, same threads), run while the server is down.
   Target: the server loses at most 5%. The server's own figure is given
   too: images / the summed time of its forwards (vitc_inference_seconds),
   so the time outside the model (HTTP, JSON, base64, decoding,
   preprocessing, batching) shows whether it overlaps the forwards.
3. Memory: a small model (the tests' tiny ViT), a small image, --mem-requests
   requests (default 100,000) at concurrency 8; the server's VmRSS
   (/proc/PID/status) after a warm-up and at the end.
4. Faults: tests/python/test_serve_faults.py, each case with its expected
   status, run and reported pass/fail.

Writes OUT.md (a markdown table, printed too) and OUT.json, with the CPU
(lscpu's model name, family, model) and the command to rerun. The default
model is a random-weight ViT-B/16 made here with tools/export_safetensors.py
(the weights do not change the time); --model takes another (then the
overhead row compares it with vit_b16_b8 only if it is a ViT-B/16).
"""
import argparse
import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
VITC = os.path.join(ROOT, "build", "vitc")
LUA = os.path.join(ROOT, "bench", "serve_load.lua")
EXPORT = os.path.join(ROOT, "tools", "export_safetensors.py")


def cpu_info():
    info = {}
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU family", "Model", "CPU(s)",
                             "Thread(s) per core"):
                info[k.strip()] = v.strip()
    except OSError:
        pass
    return info


class Server:
    """build/vitc serve on a free loopback port; its stderr drained."""

    def __init__(self, model, *args):
        self.p = subprocess.Popen([VITC, "serve", "--model", model, "--port", "0"]
                                  + [str(a) for a in args],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.port, lines = None, []
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.p.stderr.readline().decode()
            if not line:
                break
            lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "serve: ready" in line:
                break
        if self.port is None or "serve: ready" not in "".join(lines):
            self.p.kill()
            raise RuntimeError("vitc serve did not start: " + "".join(lines))
        self.reader = threading.Thread(target=lambda: [None for _ in self.p.stderr],
                                       daemon=True)
        self.reader.start()
        self.url = "http://127.0.0.1:%d" % self.port

    def metrics(self):
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        m = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                m[k] = float(v)
        return m

    def rss_kb(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait()


def batch_hist(before, after):
    """The batch sizes formed between two /metrics snapshots: {le: count}."""
    out, prev = {}, 0.0
    keys = [k for k in after if k.startswith("vitc_batch_size_bucket")]
    for k in keys:  # in the server's order: le ascending, cumulative
        cum = after[k] - before.get(k, 0.0)
        le = re.search(r'le="([^"]+)"', k).group(1)
        if cum - prev > 0:
            out[le] = int(cum - prev)
        prev = cum
    return out


def photo_body(path, small=False):
    import numpy as np
    from PIL import Image
    try:
        from skimage import data
        img = data.coffee()
    except ImportError:  # pragma: no cover
        img = np.asarray(Image.open(os.path.join(ROOT, "tests", "data", "photo.jpg")))
    im = Image.fromarray(img)
    if small:
        im = im.resize((32, 24))
    b = io.BytesIO()
    im.save(b, "JPEG", quality=90)
    url = "data:image/jpeg;base64," + base64.b64encode(b.getvalue()).decode()
    with open(path, "w") as f:
        json.dump({"input": [url]}, f)
    return len(b.getvalue())


def wrk(url, body, conns, secs, limit=None, threads=None, until=None):
    """wrk's result; with until (a function), wrk is stopped (SIGINT, after
    which it reports) once until() is true: its own threads stop at limit
    replies each, but its main thread sleeps out the duration."""
    threads = threads or max(1, min(conns, os.cpu_count() or 1, 4))
    env = dict(os.environ, VITC_BODY=body)
    if limit:
        env["VITC_LIMIT"] = str(limit)
    cmd = ["wrk", "-t", str(threads), "-c", str(conns), "-d", "%ds" % secs, "--timeout", "30s",
           "-s", LUA, url]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    if until:
        deadline = time.time() + secs
        while p.poll() is None and time.time() < deadline and not until():
            time.sleep(0.5)
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    out = p.communicate(timeout=secs + 120)[0]
    m = re.search(r"^VITC-JSON (.*)$", out, re.M)
    if not m:
        raise RuntimeError("wrk gave no result:\n" + out)
    return json.loads(m.group(1))


def make_models(tmp, quick):
    """The load model (random ViT-B/16, or the tests' tiny ViT with --quick)
    and the memory run's tiny model."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import torch
    from test_cli import tiny_vit
    tiny = os.path.join(tmp, "tiny.safetensors")
    pth = os.path.join(tmp, "tiny.pth")
    torch.save(tiny_vit(0).state_dict(), pth)
    subprocess.run([sys.executable, EXPORT, pth, tiny, "--num-heads", "2"], check=True,
                   stdout=subprocess.DEVNULL)
    if quick:
        return tiny, tiny
    big = os.path.join(tmp, "vit_b_16.safetensors")
    subprocess.run([sys.executable, EXPORT, "--torchvision", "vit_b_16", big, "--random-init"],
                   check=True, stdout=subprocess.DEVNULL)
    return big, tiny


def bench_b8(model, threads, max_batch):
    """The model's own images/s: `vitc bench` ViT-B/16 at batch 8 (the
    vit_* workloads need the checkpoint)."""
    if max_batch != 8:
        return None
    out = subprocess.run([VITC, "bench", "--only", "vit_b16_b8", "--json", "--no-peak",
                          "--quiet", "--threads", str(threads), "--model", model],
                         stdout=subprocess.PIPE,
                         check=True, text=True).stdout
    w = json.loads(out)["workloads"][0]
    return {"median_ms": w["median_ms"], "images_per_s": 8 / (w["median_ms"] * 1e-3)}


def run_faults():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, "-m", "unittest", "-v", "tests.python.test_serve_faults"],
                       cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600)
    res = {}
    for m in re.finditer(r"^(test_\w+) \(.*?\)(?: \.\.\.|\n.*?\.\.\.) (ok|FAIL|ERROR|skipped.*)$",
                         p.stdout, re.M):
        res[m.group(1)] = m.group(2)
    return res, p.returncode


FAULTS = [
    ("test_body_over_limit_413_before_reading", "body over --max-body-mb",
     "413 from the headers, before the body (chunked: closed at the limit)"),
    ("test_queue_full_429_and_sigterm_drain", "queue full; then SIGTERM",
     "429 + Retry-After: 1 in < 1 s; SIGTERM: the queued request gets 200, exit 0"),
    ("test_bad_inputs_400", "malformed JSON, bad base64, undecodable or oversized image",
     "400 naming the problem"),
    ("test_api_key", "no or wrong API key", "401 + WWW-Authenticate: Bearer"),
    ("test_slow_client_dropped", "slowloris (headers never finished)",
     "closed after --timeout-s"),
    ("test_slow_body_cut_off_batcher_free", "a body trickled byte by byte",
     "closed after --body-timeout-s (408 counted); others served meanwhile"),
    ("test_slow_reader_holds_nothing", "a client that never reads its replies",
     "others served at once"),
    ("test_connection_limits_answer_at_once", "over --max-connections / -per-ip",
     "closed at once"),
    ("test_disconnected_client_dropped", "a client that disconnects while queued",
     "its images leave the queue, never run (499 counted)"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="checkpoint or Hub directory (default: random ViT-B/16)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny model, 3 s per concurrency, 5,000 requests for memory")
    ap.add_argument("--duration", type=int, help="seconds per concurrency (default 20)")
    ap.add_argument("--concurrency", default="1,8,64,256")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="the forward's threads (server and vitc bench)")
    ap.add_argument("--mem-requests", type=int, help="default 100000 (--quick: 5000)")
    ap.add_argument("--skip-faults", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results-serve"),
                    help="OUT.md and OUT.json (default bench/results-serve)")
    a = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("serve_load: wrk is not installed (apt-get install wrk, or "
                 "scripts/install-deps.sh --system)")
    if not os.path.exists(VITC):
        sys.exit("serve_load: build/vitc is missing: run make")
    duration = a.duration or (3 if a.quick else 20)
    mem_n = a.mem_requests or (5000 if a.quick else 100000)
    concs = [int(c) for c in a.concurrency.split(",")]
    tmp = tempfile.mkdtemp(prefix="vitc-serve-load-")
    res = {"cpu": cpu_info(), "command": " ".join(["bench/serve_load.py"] + sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "max_batch": a.max_batch, "threads": a.threads, "duration_s": duration}
    try:
        big, tiny = make_models(tmp, a.quick)
        model = a.model or big
        res["model"] = a.model or ("tiny ViT (48x48)" if a.quick else "ViT-B/16 (random)")
        body = os.path.join(tmp, "body.json")
        res["photo_bytes"] = photo_body(body)

        # the model alone first, while nothing else runs
        res["bench"] = None if (a.quick or (a.model and "b_16" not in a.model)) else \
            bench_b8(model, a.threads, a.max_batch)

        srv = Server(model, "--max-batch", a.max_batch, "--max-wait-ms", 5, "--max-queue", 4096,
                     "--max-connections", 1024, "--threads", a.threads)
        rows = []
        try:
            wrk(srv.url + "/v1/embeddings", body, 8, 2)  # warm-up
            for c in concs:
                before = srv.metrics()
                r = wrk(srv.url + "/v1/embeddings", body, c, duration)
                after = srv.metrics()
                secs = r["duration_us"] * 1e-6
                imgs = after.get("vitc_images_total", 0) - before.get("vitc_images_total", 0)
                infer = (after.get("vitc_inference_seconds_sum", 0)
                         - before.get("vitc_inference_seconds_sum", 0))
                errors = sum(r["errors"].values())
                rows.append({"concurrency": c, "requests": r["requests"], "errors": errors,
                             "images_per_s": (r["requests"] - r["errors"]["status"]) / secs,
                             "p50_ms": r["latency_us"]["50"] / 1e3,
                             "p99_ms": r["latency_us"]["99"] / 1e3,
                             "batches": batch_hist(before, after),
                             "model_images_per_s": imgs / infer if infer > 0 else None,
                             "model_busy": infer / secs})
                print("c=%d: %.1f images/s, p50 %.1f ms, p99 %.1f ms, batches %s" % (
                    c, rows[-1]["images_per_s"], rows[-1]["p50_ms"], rows[-1]["p99_ms"],
                    rows[-1]["batches"]), file=sys.stderr)
        finally:
            res["exit_code"] = srv.stop()
        res["load"] = rows
        best = max(rows, key=lambda r: r["images_per_s"])
        res["saturation"] = {"concurrency": best["concurrency"],
                             "images_per_s": best["images_per_s"]}
        if res["bench"]:
            res["saturation"]["overhead"] = 1 - best["images_per_s"] / \
                res["bench"]["images_per_s"]

        # memory over many requests: a small model and image, a fast endpoint
        small = os.path.join(tmp, "small.json")
        photo_body(small, small=True)
        srv = Server(tiny, "--max-batch", a.max_batch, "--threads", 1)
        try:
            conns = 8

            def count():
                return srv.metrics().get("vitc_images_total", 0)
            wrk(srv.url + "/v1/embeddings", small, conns, 120, limit=1000 // conns,
                threads=conns, until=lambda: count() >= 1000)
            rss0, t0 = srv.rss_kb(), time.time()
            n0 = count()
            wrk(srv.url + "/v1/embeddings", small, conns, 3600, limit=mem_n // conns,
                threads=conns, until=lambda: count() >= n0 + mem_n // conns * conns)
            n1 = srv.metrics().get("vitc_images_total", 0)
            rss1 = srv.rss_kb()
            res["memory"] = {"requests": int(n1 - n0), "rss_before_kb": rss0,
                             "rss_after_kb": rss1, "seconds": time.time() - t0}
        finally:
            srv.stop()

        if not a.skip_faults:
            faults, rc = run_faults()
            res["faults"] = faults
            res["faults_rc"] = rc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    md = markdown(res)
    print(md)
    with open(a.out + ".md", "w") as f:
        f.write(md)
    with open(a.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


def markdown(res):
    cpu = res["cpu"]
    L = ["# `vitc serve` under load", "",
         "CPU: %s (family %s, model %s; %s CPUs). %s. Model: %s, `--max-batch %d`, "
         "`--threads %d`, /v1/embeddings with one %d-byte JPEG (skimage's coffee) per "
         "request, %d s per row." % (
             cpu.get("Model name", "?"), cpu.get("CPU family", "?"), cpu.get("Model", "?"),
             cpu.get("CPU(s)", "?"), res["date"], res["model"], res["max_batch"], res["threads"],
             res["photo_bytes"], res["duration_s"]),
         "", "Rerun: `PYTHONPATH=python .venv/bin/python %s`" % res["command"], "",
         "| concurrency | images/s | p50 ms | p99 ms | errors | batch sizes (le: count) "
         "| model busy |", "|---:|---:|---:|---:|---:|---|---:|"]
    for r in res["load"]:
        L.append("| %d | %.1f | %.1f | %.1f | %d | %s | %.1f%% |" % (
            r["concurrency"], r["images_per_s"], r["p50_ms"], r["p99_ms"], r["errors"],
            ", ".join("%s: %d" % kv for kv in r["batches"].items()), 100 * r["model_busy"]))
    s = res["saturation"]
    L.append("")
    if res.get("bench"):
        L.append("Overhead at saturation: %.1f images/s through the server (concurrency %d) "
                 "against %.1f images/s of `vitc bench` vit_b16_b8 (batch 8, median %.1f ms): "
                 "**%.1f%%** (target <= 5%%)." % (
                     s["images_per_s"], s["concurrency"], res["bench"]["images_per_s"],
                     res["bench"]["median_ms"], 100 * s["overhead"]))
    else:
        L.append("Overhead against `vitc bench`: not measured (--quick, or a model other than "
                 "ViT-B/16 at --max-batch 8).")
    L.append("\"model busy\": the summed time of the server's forwards over the run's; where "
             "it is near 100%, the HTTP side (JSON, base64, decoding, preprocessing on the "
             "connections' threads) overlaps the forwards.")
    m = res.get("memory")
    if m:
        L += ["", "Memory: %d requests (tiny ViT, 32x24 JPEG, concurrency 8) in %.0f s: VmRSS "
              "%.1f MB after a 1,000-request warm-up, %.1f MB after (%+.1f MB)." % (
                  m["requests"], m["seconds"], m["rss_before_kb"] / 1024,
                  m["rss_after_kb"] / 1024, (m["rss_after_kb"] - m["rss_before_kb"]) / 1024)]
    if "faults" in res:
        L += ["", "| fault | expected | result |", "|---|---|---|"]
        for name, what, want in FAULTS:
            L.append("| %s | %s | %s |" % (what, want, res["faults"].get(name, "not run")))
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
