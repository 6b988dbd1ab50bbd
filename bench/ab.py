"""Two builds of vitc side by side: `vitc bench` of each, interleaved
(A B A B ...), the median of each workload's per-round times, and B/A.

    .venv/bin/python bench/ab.py --a OLD/build/vitc --b build/vitc \
        [--rounds 3] [--threads 2] [--vit FILE] [--hub DIR] [--out F.md]

--vit FILE: a ViT-B/16 checkpoint (`bench/bench.py --export-vit FILE`) for
the vit_b16_* rows in fp32, bf16 and int8; --hub DIR: a directory holding
dinov2-base/ and clip-vit-base-patch16/ (`bench/bench.py --export-hub DIR`)
for the Hub rows. Meant for
"did this change make anything slower": both builds run on the same
machine in the same minutes, so drift hits both; quote the ratio.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# (label, vitc bench arguments): the workloads of `make bench` vitc runs alone
RUNS = [
    ("fp32", ["--only", "sdpa,mha,convsa,sa_multihead,sa_group,train_fmnist,train_vit_b16_b8,"
              "sdpa_bwd"]),
]
# With --vit (a ViT-B/16 file: `bench/bench.py --export-vit PATH`)
VIT_RUNS = [
    ("fp32", ["--only", "vit_b16_b1,vit_b16_b8"]),
    ("bf16", ["--only", "vit_b16_b1,vit_b16_b8", "--precision", "bf16",
              "--attention-precision", "bf16"]),
    ("int8", ["--only", "vit_b16_b1,vit_b16_b8", "--precision", "int8"]),
]


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def bench(vitc, args, threads):
    cmd = [vitc, "bench", "--json", "--quiet", "--no-peak", "--threads", str(threads)] + args
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()[-400:]))
    data = json.loads(r.stdout)
    rows = data.get("workloads", data.get("results", []))
    return {w["name"]: w["median_ms"] for w in rows if "median_ms" in w}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the baseline vitc binary")
    ap.add_argument("--b", required=True, help="the changed vitc binary")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hub", help="directory with dinov2-base/ and clip-vit-base-patch16/")
    ap.add_argument("--vit", help="a ViT-B/16 .safetensors for the vit_b16_* rows")
    ap.add_argument("--only-models", action="store_true",
                    help="only the rows of --vit and --hub")
    ap.add_argument("--out", help="write the markdown table here")
    args = ap.parse_args()
    runs = [] if args.only_models else list(RUNS)
    if args.vit:
        runs += [(label, extra + ["--model", args.vit]) for label, extra in VIT_RUNS]
    if args.hub:
        runs.append(("fp32", ["--only", "dinov2_b14_b1,dinov2_b14_b8", "--model",
                              os.path.join(args.hub, "dinov2-base")]))
        runs.append(("fp32", ["--only", "clip_b16_b1,clip_b16_b8", "--model",
                              os.path.join(args.hub, "clip-vit-base-patch16")]))
    times = {}  # (precision, workload) -> {"a": [...], "b": [...]}
    started = time.time()
    for rnd in range(args.rounds):
        for label, extra in runs:
            order = ("a", "b") if rnd % 2 == 0 else ("b", "a")
            for side in order:
                got = bench(getattr(args, side), extra, args.threads)
                for name, ms in got.items():
                    times.setdefault((label, name), {"a": [], "b": []})[side].append(ms)
        print("round %d/%d done (%.0f s)" % (rnd + 1, args.rounds, time.time() - started),
              file=sys.stderr)
    lines = ["# Two builds side by side (`bench/ab.py`)", "",
             "CPU: %s; %d threads; %d interleaved rounds; median ms of each build's "
             "per-round medians (`vitc bench`); %s." % (cpu_name(), args.threads, args.rounds,
                                                        time.strftime("%Y-%m-%d %H:%M UTC",
                                                                      time.gmtime())),
             "", "A: `%s`  B: `%s`" % (args.a, args.b), "",
             "| workload | precision | A ms | B ms | B / A |", "|---|---|---:|---:|---:|"]
    for (label, name), t in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if not t["a"] or not t["b"]:
            continue
        a, b = statistics.median(t["a"]), statistics.median(t["b"])
        lines.append("| %s | %s | %.2f | %.2f | %.3f |" % (name, label, a, b, b / a))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            f.write(text)
        os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
