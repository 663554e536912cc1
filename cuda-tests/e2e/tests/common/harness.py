# Runs Python statements sent one per line (each a JSON string) in one namespace and answers
# each with one JSON line: {"ok": true, "out": <the value left in `out`>} or
# {"ok": false, "error": "<exception class>", "module": "...", "msg": "..."}.
# The tests drive PyTorch and CuPy through it step by step and check the fake's truth between.
import json
import sys
import warnings

warnings.simplefilter("ignore")
ns = {}
print(json.dumps({"ok": True, "out": "ready"}), flush=True)
for line in sys.stdin:
    ns["out"] = None
    try:
        exec(json.loads(line), ns)
        print(json.dumps({"ok": True, "out": ns.get("out")}), flush=True)
    except BaseException as e:  # noqa: BLE001 - every failure is an answer
        print(
            json.dumps(
                {
                    "ok": False,
                    "error": type(e).__name__,
                    "module": type(e).__module__,
                    "msg": str(e)[:400],
                }
            ),
            flush=True,
        )
