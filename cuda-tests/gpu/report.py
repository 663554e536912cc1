"""Writes validate.sh's report: report.json and report.md under OUT, and the PASS/FAIL table.

Input: results.tsv (id, name, status, numbers json, detail; one row per verdict) and env.tsv
(key, value: date, card, driver, versions). The table is printed last, so it is the end of the
device tool's output_tail. Exit code: 0 unless a row is FAIL (1).
"""

import json
import sys


def flatten(value, prefix=""):
    if isinstance(value, dict):
        out = []
        for k in sorted(value):
            out += flatten(value[k], "%s%s." % (prefix, k))
        return out
    return [(prefix.rstrip("."), value)]


def short(numbers, width):
    text = ", ".join("%s=%s" % (k, v) for k, v in flatten(numbers) if v is not None)
    return text if len(text) <= width else text[: width - 3] + "..."


def read_tsv(path, columns):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= columns:
                    rows.append(parts[: columns - 1] + ["\t".join(parts[columns - 1:])])
    except OSError:
        pass
    return rows


def main():
    results_tsv, env_tsv, out_dir, mode = sys.argv[1:5]
    env = {k: v for k, v in read_tsv(env_tsv, 2)}
    rows = []
    for rid, name, status, numbers, detail in read_tsv(results_tsv, 5):
        try:
            parsed = json.loads(numbers) if numbers else {}
        except ValueError:
            parsed = {"unparsed": numbers}
        rows.append({"id": rid, "check": name, "status": status, "numbers": parsed, "detail": detail})
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("PASS", "FAIL", "SKIP")}
    overall = "FAIL" if counts["FAIL"] else ("PASS" if counts["PASS"] else "SKIP")
    report = {"mode": mode, "overall": overall, "counts": counts, "environment": env, "checks": rows}
    with open(out_dir + "/report.json", "w") as f:
        json.dump(report, f, indent=2, sort_keys=True)
        f.write("\n")

    md = ["# gpuslice real-GPU validation", ""]
    md.append("Mode: %s. Overall: **%s** (%d pass, %d fail, %d skip)."
              % (mode, overall, counts["PASS"], counts["FAIL"], counts["SKIP"]))
    md += ["", "| | |", "| --- | --- |"]
    md += ["| %s | %s |" % (k, str(v).replace("|", "/")) for k, v in sorted(env.items())]
    md += ["", "| id | check | status | detail |", "| --- | --- | --- | --- |"]
    md += ["| %s | %s | %s | %s |" % (r["id"], r["check"], r["status"], r["detail"].replace("|", "/"))
           for r in rows]
    md += ["", "## Numbers", ""]
    for r in rows:
        md.append("### %s %s: %s" % (r["id"], r["check"], r["status"]))
        md.append("")
        md += ["- `%s`: %s" % (k, json.dumps(v)) for k, v in flatten(r["numbers"])] or ["- (none)"]
        md.append("")
    with open(out_dir + "/report.md", "w") as f:
        f.write("\n".join(md))

    print()
    print("%-4s %-34s %-5s %s" % ("id", "check", "state", "numbers / reason"))
    print("-" * 110)
    for r in rows:
        info = short(r["numbers"], 64) if r["status"] != "SKIP" else r["detail"][:64]
        print("%-4s %-34s %-5s %s" % (r["id"], r["check"][:34], r["status"], info))
        if r["status"] == "FAIL":
            print("     why: %s" % r["detail"][:200])
    print("-" * 110)
    print("OVERALL %s: %d pass, %d fail, %d skip (mode %s; full report %s/report.md)"
          % (overall, counts["PASS"], counts["FAIL"], counts["SKIP"], mode, out_dir))
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
