"""Verdicts of validate.sh: turns the helpers' RESULT lines into PASS/FAIL/SKIP + numbers.

Each subcommand prints ONE line: STATUS<TAB>{numbers json}<TAB>detail. The thresholds are
arguments (validate.sh passes its env-overridable defaults), so a verdict is reproducible
from report.json alone. A helper output without a RESULT line is a FAIL naming the file.
Check 8's driver_facts.py judges itself and prints one JSON object; `facts` relays it.
"""

import argparse
import json
import sys

MIB = 1 << 20


def result_of(path):
    """The last `RESULT {json}` line of a helper's stdout, or None."""
    try:
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l.startswith("RESULT ")]
    except OSError:
        return None
    if not lines:
        return None
    try:
        return json.loads(lines[-1][len("RESULT "):])
    except ValueError:
        return None


def verdict(status, numbers, detail):
    print("%s\t%s\t%s" % (status, json.dumps(numbers, sort_keys=True), detail.replace("\t", " ")))
    return 0


def mib(x):
    return None if x is None else round(x / MIB, 1)


def cmd_cap(args):
    """One fill run (check 2/3): cap reported, OOM at the cap, outside view under the cap."""
    r = result_of(args.file)
    if r is None:
        return verdict("FAIL", {}, "no RESULT from %s (crash or timeout; see validate.log)" % args.file)
    if "skip" in r:
        return verdict("SKIP", {}, r["skip"])
    cap = args.cap_mib * MIB
    steps = r.get("steps") or []
    smallest = steps[-1]["chunk_mib"] if steps else None
    outside = r.get("smi_max_own_mib")
    outside_src = "own pid"
    if outside is None and r.get("smi_max_any_mib") is not None:
        outside, outside_src = r["smi_max_any_mib"], "largest process (own pid not listed)"
    used_at_oom = r["total_at_oom"] - r["free_at_oom"]
    numbers = {
        "cap_mib": args.cap_mib,
        "reported_total_mib": mib(r["total_before"]),
        "used_before_alloc_mib": mib(r["used_before"]),
        "allocated_mib": mib(r["allocated_bytes"]),
        "allocator_reserved_mib": mib(r.get("allocator_reserved")),
        "slice_used_at_oom_mib": mib(used_at_oom),
        "slice_free_at_oom_mib": mib(r["free_at_oom"]),
        "last_chunk_mib": smallest,
        "fill_fraction": round((r["allocated_bytes"] + r["used_before"]) / cap, 4),
        "smi_max_process_mib": outside,
        "smi_samples": r.get("smi_samples"),
        "oom_type": steps[-1]["oom"]["type"] if steps and steps[-1]["oom"] else None,
    }
    bad = []
    if r["total_before"] != cap:
        bad.append("reported total %s MiB, want %d" % (mib(r["total_before"]), args.cap_mib))
    if r.get("unexpected_error"):
        bad.append("unexpected error: %s" % r["unexpected_error"])
    elif not r.get("oom_raised"):
        bad.append("no out-of-memory before %s MiB (cap not enforced)" % mib(r["allocated_bytes"]))
    if r["allocated_bytes"] + r["used_before"] > cap:
        bad.append("allocated + context %s MiB > cap" % mib(r["allocated_bytes"] + r["used_before"]))
    if smallest is not None and r["free_at_oom"] >= (smallest + args.slack_mib) * MIB:
        bad.append(
            "refused early: %s MiB still free at the %d MiB refusal" % (mib(r["free_at_oom"]), smallest)
        )
    if outside is not None and outside > args.cap_mib:
        bad.append("nvidia-smi (no shim) saw %d MiB > cap %d MiB" % (outside, args.cap_mib))
    note = "outside view: %s" % (outside_src if outside is not None else "nvidia-smi listed no process")
    if bad:
        return verdict("FAIL", numbers, "; ".join(bad) + "; " + note)
    return verdict("PASS", numbers, "OOM (%s) within one %d MiB allocation of the cap; %s"
                   % (numbers["oom_type"], smallest, note))


def cmd_two(args):
    """Check 4: the second process of a slice is refused what the first one holds."""
    h, t = result_of(args.hold), result_of(args.attempt)
    if h is None or t is None:
        return verdict("FAIL", {}, "no RESULT from %s" % (args.hold if h is None else args.attempt))
    if "skip" in h or "skip" in t:
        return verdict("SKIP", {}, h.get("skip") or t.get("skip"))
    numbers = {
        "cap_mib": args.cap_mib,
        "first_holds_mib": mib(h["held_bytes"]),
        "first_smi_mib": h.get("smi_own_mib"),
        "second_sees_total_mib": mib(t["total"]),
        "second_sees_free_mib": mib(t["free"]),
        "second_big_mib": t["big"]["mib"],
        "second_big_granted": t["big"]["granted"],
        "second_small_mib": t["small"]["mib"],
        "second_small_granted": t["small"]["granted"],
    }
    bad = []
    if h["held_bytes"] != h["wanted_bytes"]:
        bad.append("first process got only %s MiB" % mib(h["held_bytes"]))
    if t["total"] != args.cap_mib * MIB:
        bad.append("second process sees total %s MiB" % mib(t["total"]))
    if t["free"] > args.cap_mib * MIB - h["held_bytes"]:
        bad.append("second process sees %s MiB free: the first one's memory is not counted"
                   % mib(t["free"]))
    if t["big"]["granted"]:
        bad.append("second process was granted %d MiB beside the first's %s MiB"
                   % (t["big"]["mib"], mib(h["held_bytes"])))
    if not t["small"]["granted"]:
        bad.append("second process refused even %d MiB (the slice has room)" % t["small"]["mib"])
    if bad:
        return verdict("FAIL", numbers, "; ".join(bad))
    return verdict("PASS", numbers, "the second process sees and is refused the first one's memory")


def share_numbers(rate_key, base, run, sample, pid_key="pid"):
    ratio = run[rate_key] / base[rate_key] if base[rate_key] else None
    util, src = None, None
    if sample and "per_pid" in sample:
        own = sample["per_pid"].get(str(run.get(pid_key)))
        if own:
            util, src = own["mean_sm"], "process"
        elif sample.get("device_util_mean") is not None:
            util, src = sample["device_util_mean"], "device"
    return ratio, util, src


def cmd_share(args):
    """Check 5 (one workload): throughput and NVML utilisation at each share vs the target."""
    base = result_of(args.baseline)
    if base is None:
        return verdict("FAIL", {}, "no RESULT from the unthrottled baseline %s" % args.baseline)
    if "skip" in base:
        return verdict("SKIP", {}, base["skip"])
    numbers = {"baseline_" + args.rate_key: round(base[args.rate_key], 3)}
    bad = []
    for spec in args.run:
        share, run_file, sample_file = spec.split(":")
        share = int(share)
        run, sample = result_of(run_file), result_of(sample_file)
        if run is None:
            bad.append("%d%%: no RESULT" % share)
            continue
        ratio, util, src = share_numbers(args.rate_key, base, run, sample)
        target = share / 100.0
        numbers["share_%d" % share] = {
            args.rate_key: round(run[args.rate_key], 3),
            "throughput_ratio": round(ratio, 3),
            "nvml_util": None if util is None else round(util, 1),
            "nvml_util_source": src,
        }
        low = target - args.tol if share < 100 else 1.0 - args.tol
        if not (low <= ratio <= target + args.tol):
            bad.append("%d%%: throughput ratio %.3f outside [%.2f, %.2f]"
                       % (share, ratio, low, target + args.tol))
        if util is not None and abs(util - share) > args.tol * 100 + args.util_slack:
            bad.append("%d%%: NVML %s utilisation %.1f%%" % (share, src, util))
    if bad:
        return verdict("FAIL", numbers, "; ".join(bad))
    return verdict("PASS", numbers, "each share within +-%.2f of its target" % args.tol)


def cmd_pair(args):
    """Check 5 (pair): a throttled process beside an unthrottled neighbour (no shim)."""
    base = result_of(args.baseline)
    slow, fast, sample = result_of(args.throttled), result_of(args.neighbour), result_of(args.sample)
    if base is None or slow is None or fast is None:
        return verdict("FAIL", {}, "a workload gave no RESULT (see validate.log)")
    if "skip" in base:
        return verdict("SKIP", {}, base["skip"])
    k = args.rate_key
    r_slow, u_slow, src_slow = share_numbers(k, base, slow, sample)
    r_fast, u_fast, src_fast = share_numbers(k, base, fast, sample)
    target = args.share / 100.0
    numbers = {
        "share": args.share,
        "baseline_" + k: round(base[k], 3),
        "throttled_ratio": round(r_slow, 3),
        "neighbour_ratio": round(r_fast, 3),
        "throttled_nvml_util": None if u_slow is None or src_slow != "process" else round(u_slow, 1),
        "neighbour_nvml_util": None if u_fast is None or src_fast != "process" else round(u_fast, 1),
        "device_util": None if not sample else sample.get("device_util_mean"),
    }
    bad = []
    if r_slow > target + args.tol:
        bad.append("throttled process got %.3f of the card (target %.2f)" % (r_slow, target))
    if r_fast < args.neighbour_min:
        bad.append("neighbour got only %.3f of its solo throughput" % r_fast)
    if numbers["throttled_nvml_util"] is not None and u_slow > args.share + args.tol * 100 + args.util_slack:
        bad.append("NVML shows the throttled process at %.1f%%" % u_slow)
    if bad:
        return verdict("FAIL", numbers, "; ".join(bad))
    return verdict("PASS", numbers, "throttled <= %.2f+%.2f, neighbour >= %.2f of solo"
                   % (target, args.tol, args.neighbour_min))


def slice_fractions(case, base):
    """Each slice's fraction of the device in one matrix case: the sum over its processes of
    kernels/s relative to the same kernel length alone on the card (so a slice mixing 10 us
    and 10 ms kernels adds up what each process took). None where a process gave no RESULT."""
    fractions = {}
    for proc in case["procs"]:
        run = result_of(proc["file"])
        solo = base.get(proc["len"])
        if run is None or not solo:
            return None
        fractions[proc["slice"]] = fractions.get(proc["slice"], 0.0) + run["kernels_per_s"] / solo
    return fractions


def cmd_matrix(args):
    """Check 9: the compute share matrix (kernel lengths x shares, several processes, a mixed
    slice, burst and priority) from spin kernels/s relative to each length's solo rate."""
    try:
        with open(args.manifest) as f:
            cases = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        return verdict("FAIL", {}, "cannot read the matrix manifest %s: %s" % (args.manifest, e))
    base = {}
    for case in (c for c in cases if c["kind"] == "base"):
        for proc in case["procs"]:
            run = result_of(proc["file"])
            if run is not None and run.get("kernels_per_s"):
                base[proc["len"]] = run["kernels_per_s"]
    numbers = {"solo_kernels_per_s": {k: round(v, 1) for k, v in base.items()}}
    bad, judged = [], 0
    for case in (c for c in cases if c["kind"] != "base"):
        name = case["case"]
        got = slice_fractions(case, base)
        if got is None:
            bad.append("%s: a process gave no RESULT (or its length no solo rate)" % name)
            continue
        judged += 1
        numbers[name] = {k: round(100 * v, 1) for k, v in got.items()}
        targets = case["targets"]
        if case["kind"] == "share":
            for slice_name, target in targets.items():
                if abs(100 * got[slice_name] - target) > args.points:
                    bad.append("%s: %.1f%% (target %d%% +-%s)"
                               % (name, 100 * got[slice_name], target, args.points))
        elif case["kind"] == "burst":
            (a, ta), (b, tb) = sorted(targets.items(), key=lambda kv: -kv[1])
            ratio = got[a] / got[b] if got[b] else float("inf")
            want = ta / float(tb)
            numbers[name]["ratio"] = round(ratio, 2)
            if abs(ratio / want - 1.0) > args.burst_tol:
                bad.append("%s: split %.2f:1 (want %.2f:1 +-%d%%)"
                           % (name, ratio, want, 100 * args.burst_tol))
            if got[a] + got[b] < args.burst_min_used:
                bad.append("%s: the pair used %.1f%% of the device"
                           % (name, 100 * (got[a] + got[b])))
        elif case["kind"] == "priority":
            high, low = got["high"], got["low"]
            if high < low + args.priority_lead:
                bad.append("%s: high %.1f%% not %d points over low %.1f%%"
                           % (name, 100 * high, 100 * args.priority_lead, 100 * low))
            if 100 * low < targets["low"] - args.points:
                bad.append("%s: low %.1f%% below its %d%% share" % (name, 100 * low, targets["low"]))
        else:
            bad.append("%s: unknown kind %s" % (name, case["kind"]))
    if not base:
        bad.insert(0, "no solo baseline gave a RESULT (see validate.log)")
    if judged == 0 and not bad:
        return verdict("SKIP", numbers, "no case ran (time budget)")
    if bad:
        return verdict("FAIL", numbers, "; ".join(bad))
    return verdict("PASS", numbers, "%d cases: shares within %s points, burst split within %d%%, "
                   "high over low" % (judged, args.points, 100 * args.burst_tol))


def cmd_overhead(args):
    """Check 6: launch and allocation rates under the shim as ratios of the bare rates."""
    numbers, bad = {}, []
    for kind, key in (("launch", "launches_per_s"), ("alloc", "pairs_per_s")):
        files = getattr(args, kind)
        res = [result_of(f) for f in files]
        if any(r is None for r in res):
            bad.append("%s: a run gave no RESULT" % kind)
            continue
        bare, unconf, limited = (r[key] for r in res)
        numbers[kind] = {
            "bare_per_s": round(bare, 1),
            "shim_unconfigured_per_s": round(unconf, 1),
            "shim_limited_per_s": round(limited, 1),
            "ratio_unconfigured": round(unconf / bare, 3),
            "ratio_limited": round(limited / bare, 3),
        }
        for label in ("ratio_unconfigured", "ratio_limited"):
            if numbers[kind][label] < args.min_ratio:
                bad.append("%s %s %.3f < %.2f" % (kind, label, numbers[kind][label], args.min_ratio))
    if bad:
        return verdict("FAIL", numbers, "; ".join(bad))
    return verdict("PASS", numbers, "every rate ratio >= %.2f" % args.min_ratio)


def facts_of(path):
    """driver_facts.py's JSON object: the last stdout line that is one with a verdict."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "verdict" in value:
            return value
    return None


def cmd_facts(args):
    """Check 8: driver_facts.py judges itself (PASS, FAIL, ERROR = could not run); this
    relays its verdict with the numbers worth a table row."""
    f = facts_of(args.file)
    if f is None:
        return verdict("FAIL", {}, "no JSON from driver_facts.py in %s (crash or timeout; see "
                       "validate.log)" % args.file)
    pa = f.get("proc_address") or {}
    reset = f.get("primary_reset") or {}
    cost = f.get("context_cost") or {}
    mismatches = pa.get("mismatches") or []
    active = [o.get("active") for o in reset.get("observed") or []]
    numbers = {
        "cuda_driver_version": f.get("cuda_driver_version"),
        "procaddr_lookups": pa.get("checked"),
        "procaddr_mismatches": len(mismatches) if pa else None,
        "procaddr_not_offered": len(pa.get("not_offered") or []) if pa else None,
        "primary_active_sequence": ",".join(str(a) for a in active) or None,
        "release_past_zero": (reset.get("release_past_zero") or {}).get("result"),
        "context_mib": cost.get("context_mib"),
        "context_source": cost.get("context_source"),
        "reset_frees_mib": cost.get("reset_frees_mib"),
        "alloc_1_byte_mib": cost.get("alloc_1_byte_mib"),
        "granularity_min_bytes": cost.get("granularity_min_bytes"),
        # The bound (context_overhead) must be at least this.
        "dearest_context_mib": ((f.get("context_variants") or {}).get("dearest") or {}).get("mib"),
        "dearest_context_variant": ((f.get("context_variants") or {}).get("dearest") or {}).get("variant"),
    }
    if mismatches:
        numbers["procaddr_mismatched"] = sorted({m.get("name") for m in mismatches})
    reasons = "; ".join(f.get("reasons") or []) or "no reason given"
    if f["verdict"] == "FAIL":
        return verdict("FAIL", numbers, reasons)
    if f["verdict"] != "PASS":
        return verdict("SKIP", numbers, "driver_facts.py could not run: " + reasons)
    return verdict("PASS", numbers,
                   "%s cuGetProcAddress lookups are the hooked exports; primary context active %s "
                   "as documented; a context costs %s MiB (%s), the dearest a tenant can make %s MiB (%s)"
                   % (pa.get("checked"), numbers["primary_active_sequence"],
                      numbers["context_mib"], numbers["context_source"] or "NVML could not tell",
                      numbers["dearest_context_mib"], numbers["dearest_context_variant"]))


def cmd_growth(args):
    """Check 11: the driver's own memory is priced before the call that places it: a lookup
    whose local memory does not fit is refused, one that fits is charged before the driver
    places it, and the card never shows the process past its cap."""
    r = result_of(args.file)
    if r is None:
        return verdict("FAIL", {}, "no RESULT line in %s" % args.file)
    numbers = {k: r.get(k) for k in ("cap_mib", "headroom_mib", "left_after_load_mib",
                                      "refused_price_mib", "refused_lookup",
                                      "driver_before_refusal_mib", "driver_after_refusal_mib",
                                      "fitting_frame_bytes", "fitting_lookup", "launch",
                                      "first_gap_mib", "max_gap_mib", "driver_peak_mib")}
    bad = []
    if r.get("static_load") != 0:
        bad.append("the static-data module within the headroom failed to load (CUresult %s)"
                   % r.get("static_load"))
    if (r.get("refused_price_mib") or 0) <= (r.get("left_after_load_mib") or 0):
        bad.append("the oversized kernel's local memory (%s MiB) fits what was left (%s MiB): "
                   "no refusal was tested" % (r.get("refused_price_mib"),
                                              r.get("left_after_load_mib")))
    elif r.get("refused_lookup") != 2:
        bad.append("the lookup of a kernel whose local memory (%s MiB) exceeds what is left "
                   "(%s MiB) returned %s, not CUDA_ERROR_OUT_OF_MEMORY"
                   % (r.get("refused_price_mib"), r.get("left_after_load_mib"),
                      r.get("refused_lookup")))
    before, after = r.get("driver_before_refusal_mib"), r.get("driver_after_refusal_mib")
    if before is not None and after is not None and after - before > args.slack_mib:
        bad.append("the driver grew the process by %s MiB at the refused lookup"
                   % (after - before))
    if r.get("fitting_lookup") != 0 or r.get("launch") != 0:
        bad.append("the kernel that fits was refused (lookup %s, launch %s)"
                   % (r.get("fitting_lookup"), r.get("launch")))
    first, worst = r.get("first_gap_mib"), r.get("max_gap_mib")
    if first is None:
        bad.append("nvidia-smi never reported the process after the launch")
    elif worst > args.bound_mib:
        bad.append("the driver held up to %s MiB more than the slice counts (first sample: %s "
                   "MiB), past the %s MiB bound" % (worst, first, args.bound_mib))
    peak, cap = r.get("driver_peak_mib"), r.get("cap_mib") or 0
    if peak is not None and peak > cap + args.bound_mib:
        bad.append("the card showed the process at %s MiB, past the %s MiB cap and the bound"
                   % (peak, cap))
    if bad:
        return verdict("FAIL", numbers, "; ".join(bad))
    return verdict("PASS", numbers,
                   "lookup needing %s MiB of local memory refused with %s MiB left; the one that "
                   "fits charged before the launch (gap %s MiB at once, at most %s MiB, bound %s); "
                   "the card's peak %s MiB under the %s MiB cap"
                   % (r.get("refused_price_mib"), r.get("left_after_load_mib"), first, worst,
                      args.bound_mib, peak, cap))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cap")
    c.add_argument("file")
    c.add_argument("--cap-mib", type=int, required=True)
    c.add_argument("--slack-mib", type=int, default=4)
    c = sub.add_parser("two")
    c.add_argument("hold")
    c.add_argument("attempt")
    c.add_argument("--cap-mib", type=int, required=True)
    c = sub.add_parser("share")
    c.add_argument("--baseline", required=True)
    c.add_argument("--run", action="append", default=[], help="SHARE:RESULT_FILE:SAMPLE_FILE")
    c.add_argument("--rate-key", required=True)
    c.add_argument("--tol", type=float, required=True)
    c.add_argument("--util-slack", type=float, default=5.0)
    c = sub.add_parser("pair")
    for name in ("baseline", "throttled", "neighbour", "sample"):
        c.add_argument("--" + name, required=True)
    c.add_argument("--share", type=int, required=True)
    c.add_argument("--rate-key", required=True)
    c.add_argument("--tol", type=float, required=True)
    c.add_argument("--util-slack", type=float, default=5.0)
    c.add_argument("--neighbour-min", type=float, default=0.5)
    c = sub.add_parser("matrix")
    c.add_argument("manifest")
    c.add_argument("--points", type=float, required=True)
    c.add_argument("--burst-tol", type=float, default=0.2)
    c.add_argument("--burst-min-used", type=float, default=0.75)
    c.add_argument("--priority-lead", type=float, default=0.10)
    c = sub.add_parser("overhead")
    c.add_argument("--launch", nargs=3, required=True, metavar=("BARE", "UNCONF", "LIMITED"))
    c.add_argument("--alloc", nargs=3, required=True, metavar=("BARE", "UNCONF", "LIMITED"))
    c.add_argument("--min-ratio", type=float, required=True)
    c = sub.add_parser("facts")
    c.add_argument("file")
    c = sub.add_parser("growth")
    c.add_argument("file")
    # gpuslice_common::unpriced::UNPRICED_BOUND_BYTES: the model's error per process and device.
    c.add_argument("--bound-mib", type=int, default=64)
    c.add_argument("--slack-mib", type=int, default=4)
    args = p.parse_args()
    try:
        return {"cap": cmd_cap, "two": cmd_two, "share": cmd_share, "pair": cmd_pair,
                "matrix": cmd_matrix, "overhead": cmd_overhead, "facts": cmd_facts,
                "growth": cmd_growth}[args.cmd](args)
    except (KeyError, TypeError, ZeroDivisionError, ValueError) as e:
        # A malformed helper output is a wrong outcome, never a crash of the whole script.
        return verdict("FAIL", {}, "cannot evaluate (%s: %s)" % (type(e).__name__, e))


if __name__ == "__main__":
    sys.exit(main())
