#!/usr/bin/env python3
"""The table of `make bench-ort` from scripts/bench-ort.sh's lines
(round=R runtime=vitc|ort precision=P batch=B threads=T ms=X rss_kb=Y):
medians over rounds, the ratios issue 11 sets targets on, markdown out.

    summarize.py LINES.txt BUILD/vitc LOAD_AT_START
"""
import datetime
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench as B  # noqa: E402  (_median, loadavg)


def main():
    lines, vitc, load0 = sys.argv[1], sys.argv[2], sys.argv[3]
    runs = {}
    with open(lines) as f:
        for line in f:
            kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if "ms" not in kv:
                continue
            key = (kv["runtime"], kv["precision"], int(kv["batch"]), int(kv["threads"]))
            runs.setdefault(key, []).append((float(kv["ms"]), int(kv.get("rss_kb", 0) or 0),
                                             int(kv.get("peak_kb", 0) or 0)))
    med = {k: B._median([x[0] for x in v]) for k, v in runs.items()}
    rss = {k: max(x[1] for x in v) / 1024 for k, v in runs.items()}
    peak = {k: max(x[2] for x in v) / 1024 for k, v in runs.items()}
    rounds = max(len(v) for v in runs.values())
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ver = subprocess.run([vitc, "--version"], capture_output=True, text=True).stdout.strip()
    out = ["# ViT-B/16: vitc fp32 / bf16 / int8 against ONNX Runtime fp32 / int8", "",
           "Written by `make bench-ort` (scripts/bench-ort.sh, bench/ort/): one random-init "
           "torchvision ViT-B/16, exported to ONNX and dynamically quantized "
           "(bench/ort/quantize_int8.py), timed interleaved in one run; medians over %d "
           "rounds of each runtime's median of %s forwards (batch 1) / %s (batch 8) in one "
           "process. Memory: resident set while "
           "running (vitc: after loading, VmHWM reset; ORT: the process's peak), and vitc's "
           "peak while loading (it reads the fp32 file, then converts one matrix at a time)." % (
               rounds, os.environ.get("REPEAT_B1", "REPEAT"), os.environ.get("REPEAT_B8", "REPEAT")), "",
           "- date: %s UTC; machine: %s, %d cores usable" % (
               datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), cpu,
               len(os.sched_getaffinity(0))),
           "- %s" % ver.replace("\n", "; "),
           "- load average (1 min) at start and end: %s and %s" % (load0, B.loadavg()), "",
           "| threads | batch | vitc fp32 ms | vitc bf16 ms | vitc int8 ms | "
           "vitc bf16 / int8 ms, bf16 attention | ORT fp32 ms | "
           "ORT int8 ms | fp32 vs ORT fp32 | int8 vs ORT int8 | vitc fp32 / bf16 / int8 MB running | "
           "vitc fp32 / bf16 / int8 MB load peak | ORT fp32 / int8 MB peak |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    targets = []
    for t in sorted({k[3] for k in med}):
        for b in (1, 8):
            g = lambda rt, p: med.get((rt, p, b, t))  # noqa: E731
            m = lambda rt, p: rss.get((rt, p, b, t), 0)  # noqa: E731
            vf, vb, vi, of, oi = g("vitc", "fp32"), g("vitc", "bf16"), g("vitc", "int8"), \
                g("ort", "fp32"), g("ort", "int8")
            if None in (vf, vb, vi, of, oi):
                continue
            vba, via = g("vitc", "bf16a"), g("vitc", "int8a")
            att = "%s / %s" % tuple("%.1f" % x if x else "–" for x in (vba, via))
            out.append("| %d | %d | %.1f | %.1f | %.1f | %s | %.1f | %.1f | %.2f× | %.2f× | "
                       "%.0f / %.0f / %.0f | %s | %.0f / %.0f |" % (
                           t, b, vf, vb, vi, att, of, oi, of / vf, oi / vi, m("vitc", "fp32"),
                           m("vitc", "bf16"), m("vitc", "int8"),
                           " / ".join("%.0f" % peak[("vitc", p, b, t)]
                                      if peak.get(("vitc", p, b, t)) else "–"
                                      for p in ("fp32", "bf16", "int8")),
                           m("ort", "fp32"),
                           m("ort", "int8")))
            if t == 2:
                bf_lim = 45 if b == 1 else 360
                targets += [
                    "batch %d fp32: %.2f× ORT fp32 (target ≥ 1.2×): %s" % (
                        b, of / vf, "met" if of / vf >= 1.2 else "not met"),
                    "batch %d bf16: %.1f ms (target ≤ %d ms): %s" % (
                        b, vb, bf_lim, "met" if vb <= bf_lim else "not met"),
                    "batch %d int8: %.2f× ORT int8 (target ≥ 1.25×): %s" % (
                        b, oi / vi, "met" if oi / vi >= 1.25 else "not met")]
                if vba and via:
                    targets += [
                        "batch %d with bf16 attention: bf16 %.1f ms (%s), int8 %.2f× ORT int8 (%s)" % (
                            b, vba, "met" if vba <= bf_lim else "not met", oi / via,
                            "met" if oi / via >= 1.25 else "not met")]
    if targets:
        out += ["", "Issue 11's targets at 2 threads:", ""] + ["- " + x for x in targets]
    # The medians above hide how far one round is from another on a shared
    # VM: each row's range over rounds, and the ratio within each round
    # (vitc and ORT ran back to back, so a slow spell hits both less often).
    spread = []
    for b in (1, 8):
        ms = lambda rt, p: [x[0] for x in runs.get((rt, p, b, 2), [])]  # noqa: E731
        rows = ["%s %s %.1f–%.1f" % (rt, p, min(ms(rt, p)), max(ms(rt, p)))
                for rt, p in (("vitc", "fp32"), ("vitc", "bf16"), ("vitc", "int8"),
                              ("ort", "fp32"), ("ort", "int8")) if ms(rt, p)]
        ratios = []
        for p in ("fp32", "int8"):
            pr = [o / v for v, o in zip(ms("vitc", p), ms("ort", p))]
            if pr:
                ratios.append("%s %s" % (p, " ".join("%.2f×" % r for r in pr)))
        if rows:
            spread.append("batch %d: ms over rounds %s; ratio to ORT round by round: %s" % (
                b, ", ".join(rows), "; ".join(ratios)))
    if spread:
        out += ["", "Spread at 2 threads:", ""] + ["- " + x for x in spread]
    print("\n".join(out))


if __name__ == "__main__":
    main()
