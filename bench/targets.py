"""The CPU's measured peaks in bench.py's results, each precision's "% of
peak" over its own, and issue 26's targets (bench.py renders them).

`vitc bench --peak-only --json` gives fp32's FMA peak (also as the older
"fma_peak") and, where the CPU has them, the bf16 (vdpbf16ps, AMX
tdpbf16ps) and int8 (vpdpbusd, AMX tdpbusd) dot-product peaks, on 1 core and
on every thread at once. A bf16 or int8 forward's fraction of the fp32 peak
says little (it can pass 100%); over its own precision's peak it says how
much of the instructions' ceiling the whole forward reaches.
"""
import peers  # bench/peers.py, beside this file


def merge_peaks(peak, r):
    """Folds one `vitc bench --peak-only --json` answer r into peak, the
    best of each so far."""
    if "fma_peak" in r:
        p = r["fma_peak"]
        peak["isa"] = p["isa"]
        peak["p1"] = max(peak["p1"], p["gflops_1_thread"])
        peak["pn"] = max(peak["pn"], p["gflops_all_threads"])
    for prec, p in r.get("peaks", {}).items():
        q = peak["prec"].setdefault(prec, {"isa": None, "p1": 0.0, "pn": 0.0})
        if not p.get("isa"):
            q["why"] = p.get("why", "not measured")
            continue
        q.update(isa=p["isa"], unit=p["unit"], p1=max(q["p1"], p["one_thread"]),
                 pn=max(q["pn"], p["all_threads"]))
        if "vector" in p:
            v = q.setdefault("vector", {"isa": p["vector"]["isa"], "p1": 0.0, "pn": 0.0})
            v["p1"] = max(v["p1"], p["vector"]["one_thread"])
            v["pn"] = max(v["pn"], p["vector"]["all_threads"])


def precision_of(cfg):
    """The precision a configuration ("vitc_int8-2", "torch-1") computes in."""
    side = cfg.split("-")[0]
    return peers.ENGINES[side][1] if side in peers.ENGINES else "fp32"


def peak_of(peak, prec):
    """1-core peak of precision prec (fp32's from the older keys too); 0 when
    not measured."""
    p = peak.get("prec", {}).get(prec, {}).get("p1", 0.0)
    return p or (peak.get("p1", 0.0) if prec == "fp32" else 0.0)


def peaks_line(peak, cores):
    """'fp32 234.4 GFLOP/s / bf16 468.1 GFLOP/s / int8 935.0 GOP/s' on all threads."""
    out = []
    for prec in ("fp32", "bf16", "int8"):
        q = peak.get("prec", {}).get(prec)
        if prec == "fp32" and not q:
            q = {"isa": peak.get("isa"), "pn": peak.get("pn", 0.0), "p1": peak.get("p1", 0.0),
                 "unit": "GFLOP/s"}
        if not q or not q.get("isa"):
            out.append("%s none (%s)" % (prec, (q or {}).get("why", "not measured")))
            continue
        t = "%s %.1f %s (%s; %.1f on 1 core" % (prec, q["pn"], q.get("unit", "GFLOP/s"), q["isa"],
                                                q["p1"])
        if q.get("vector"):
            t += "; %s %.1f, %.1f on 1 core" % (q["vector"]["isa"], q["vector"]["pn"],
                                                q["vector"]["p1"])
        out.append(t + ")")
    return "%s on %d threads at once" % (" / ".join(out), cores)


def own_peak_table(summary, train, fmt):
    """The engines' forwards (every row with configurations beside vitc and
    PyTorch fp32, training rows aside) as GFLOP/s and % of the peak of the
    precision each computes in, at its better thread count."""
    def side(c):
        return c.split("-")[0]
    rows = [n for n in summary if n not in train
            and any(side(c) not in ("vitc", "torch") for c in summary[n])]
    if not rows:
        return []
    L = ["### Engines: GFLOP/s and % of each precision's own peak\n",
         "Each engine at its better thread count: GFLOP/s (the workload's FLOP count over its "
         "median) and, in parentheses, that over (the measured 1-core peak of the precision it "
         "computes in × threads): fp32 rows over the FMA peak, bf16 rows over the vdpbf16ps "
         "(or AMX) peak, int8 rows over the vpdpbusd (or AMX) peak.\n",
         "| engine | precision | " + " | ".join(rows) + " |",
         "|---|---|" + "---:|" * len(rows)]
    sides = sorted({side(c) for n in rows for c in summary[n]},
                   key=lambda e: list(peers.ENGINES).index(e) if e in peers.ENGINES else 99)
    for e in sides:
        cells = []
        for n in rows:
            ok = [r for c, r in summary[n].items() if side(c) == e and r.get("status") == "ok"]
            r = min(ok, key=lambda r: r["median_ms"]) if ok else None
            cells.append("%s (%s%%)" % (fmt(r["gflops"], ".1f"), fmt(
                r["peak_frac"] and 100 * r["peak_frac"], ".0f")) if r else "–")
        L.append("| %s | %s | %s |" % (peers.ENGINES.get(e, (e,))[0], precision_of(e + "-1"),
                                       " | ".join(cells)))
    return L + [""]


# Issue 26's targets: (workload, the side vitc is set against, speedup).
SPEED_TARGETS = (("train_fmnist", "torch", 2.0), ("train_fmnist", "compile", 1.3),
                 ("train_vit_b16_b8", "torch", 1.5),
                 # torch's scaled_dot_product_attention is its fused CPU kernel
                 ("sdpa", "torch", 1.5), ("sdpa_bwd", "torch", 1.5))
# vitc against the fastest other engine in the same precision, on every
# engine row (ViT-B/16, DINOv2-B/14, CLIP ViT-B/16 at batch 1 and 8).
PEER_FACTOR = 1.1
# (workload, fraction of the fp32 peak) for single layers.
LAYER_PEAK_TARGETS = (("sa_group", 0.85),)
# (precision, vitc's side, fraction of that precision's own peak) over the
# whole ViT-B/16 forward at batch 1 and 8.
PEAK_TARGETS = (("fp32", "vitc", 0.90), ("bf16", "vitc_bf16", 0.88), ("int8", "vitc_int8", 0.85))


def cls_only_saving(B, image, patch, D, M):
    """FLOPs (2 per multiply-add) a vitc training step of a ViT does not
    do: its last block computes queries, attention, out-proj and MLP for
    the class row alone (every row's keys and values still; the loss reads
    nothing else), forward and backward (3×): about 7% of ViT-B/16's
    counted work, 13% of the Fashion-MNIST model's."""
    N = (image // patch) ** 2 + 1
    R = N - 1
    return 3 * B * (2 * R * D * D + 4 * R * N * D + 2 * R * D * D + 4 * R * D * M)


def targets_section(summary, flops, peak, vmain, vit, quick, best, work=None):
    """## Targets (issue 26): each target this run measured, the value, met
    or not; a speedup the measured peak rules out is said to be impossible,
    with the bound (the FLOP rate it needs against the measured peak).
    vit: the ViT-B/16 forward rows; quick: a smoke run (nothing judged);
    best(s, side): the configuration of side with the lowest median;
    work: vitc's own FLOP count where it does less than flops counts (the
    bound is about the work vitc has to do)."""
    nth = int(vmain.split("-")[1])
    # the fp32 ceiling on vitc's threads: the better of the all-threads
    # measurement and 1 core × threads
    ceiling = max(peak.get("pn", 0.0) if nth > 1 else peak.get("p1", 0.0),
                  peak_of(peak, "fp32") * nth)
    T = []
    for name, vs, want in SPEED_TARGETS:
        s_ = summary.get(name, {})
        v = s_.get(vmain, {})
        tb = best(s_, vs)
        t = s_.get(tb, {}) if tb else {}
        if v.get("status") != "ok" or t.get("status") != "ok":
            continue
        who = "torch.compile" if vs == "compile" else "torch eager"
        vms = peers.paired_ms(v, t)
        sp = t["median_ms"] / vms
        need_ms = t["median_ms"] / want
        need_gf = flops[name] / (need_ms * 1e-3) * 1e-9
        own = (work or {}).get(name, flops[name]) / (need_ms * 1e-3) * 1e-9
        got = "%.2f× (vitc %.1f ms, %s %.1f ms at %s thr; %.1f× needs %.1f ms = %.1f GFLOP/s" % (
            sp, vms, who, t["median_ms"], tb.split("-")[1], want, need_ms, need_gf)
        if own < need_gf * 0.9999:
            got += ", %.1f of the work vitc does" % own
        if ceiling:
            got += ", %.0f%% of the measured fp32 peak %.1f" % (100 * own / ceiling, ceiling)
        got += ")"
        met = sp >= want
        why = None
        if not met and ceiling and own > ceiling:
            why = ("impossible on this CPU: needs %.1f GFLOP/s > measured peak %.1f GFLOP/s "
                   "(fp32, %d threads)" % (own, ceiling, nth))
        elif not met and ceiling and own > 0.9 * ceiling:
            why = ("needs %.0f%% of the measured fp32 peak over the whole step (norms, "
                   "softmax, GELU and AdamW included)" % (100 * own / ceiling))
        T.append(("%s: vitc ≥ %.1f× %s" % (name, want, who), got, met, why))
        if name == "train_vit_b16_b8" and vs == "torch":
            T.append(("%s: with less memory than torch eager" % name,
                      "vitc %.0f MB, torch eager %.0f MB (peak MB)" % (v["peak_mb"], t["peak_mb"]),
                      v["peak_mb"] < t["peak_mb"], None))
    for prec, side, want in PEAK_TARGETS:
        for name in vit:
            r = summary.get(name, {}).get("%s-%d" % (side, nth), {})
            if r.get("status") != "ok" or not r.get("peak_frac"):
                continue
            T.append(("%s %s forward: ≥ %.0f%% of the measured %s peak" % (name, prec, 100 * want,
                                                                            prec),
                      "%.1f%% (%.1f GFLOP/s of %.1f)" % (100 * r["peak_frac"], r["gflops"],
                                                          peak_of(peak, prec) * nth),
                      r["peak_frac"] >= want, None))
    for name, want in LAYER_PEAK_TARGETS:
        r = summary.get(name, {}).get(vmain, {})
        if r.get("status") == "ok" and r.get("peak_frac"):
            T.append(("%s: ≥ %.0f%% of the measured fp32 peak" % (name, 100 * want),
                      "%.1f%% (%.1f GFLOP/s)" % (100 * r["peak_frac"], r["gflops"]),
                      r["peak_frac"] >= want, None))
    for name in vit:
        s_ = summary.get(name, {})
        for prec, vside in (("fp32", "vitc"), ("bf16", "vitc_bf16"), ("int8", "vitc_int8")):
            v = best(s_, vside)
            others = [c for c in s_ if precision_of(c) == prec and c.split("-")[0] not in
                      peers.VITC and s_[c].get("status") == "ok"]
            if not v or not others:
                continue
            f = min(others, key=lambda c: s_[c]["median_ms"])
            vms = peers.paired_ms(s_[v], s_[f])
            sp = s_[f]["median_ms"] / vms
            side = f.split("-")[0]
            T.append(("%s %s: vitc ≥ %.1f× the fastest other engine in %s" % (
                name, prec, PEER_FACTOR, prec),
                "%.2f× (vitc %.1f ms at %s thr%s; fastest: %s %.1f ms at %s thr)" % (
                    sp, vms, v.split("-")[1],
                    " in the rounds it ran" if vms != s_[v]["median_ms"] else "",
                    peers.ENGINES[side][0] if side in peers.ENGINES else side,
                    s_[f]["median_ms"], f.split("-")[1]),
                sp >= PEER_FACTOR, None))
    if not T:
        return []
    L = ["## Targets (issue 26)\n",
         "vitc at %d thread(s); speedups against PyTorch's better thread count; %% of peak as in "
         "the tables (over the measured 1-core peak of the precision × threads).%s\n" % (
             nth, " --quick: the targets are about the full sizes; a smoke run does not judge "
             "them." if quick else ""),
         "| target | measured | met |", "|---|---|---|"]
    for what, got, met, why in T:
        m = "–" if quick else "yes" if met else "**no**"
        L.append("| %s | %s | %s |" % (what, got, m + (": " + why if why and not quick else "")))
    return L + [""]
