"""Outside view of GPU use for validate.sh (check 5): run WITHOUT the shim.

Waits for every --wait file (at most 90 s), then samples for --seconds:
nvmlDeviceGetProcessUtilization (per-process SM %) and nvmlDeviceGetUtilizationRates (device %)
through pynvml; without pynvml, the device % from `nvidia-smi --query-gpu=utilization.gpu`.
Prints `RESULT {json}`: per_pid {pid: {mean_sm, samples}}, device_util_mean, source.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def wait_all(paths, seconds):
    deadline = time.time() + seconds
    while not all(os.path.exists(p) for p in paths):
        if time.time() > deadline:
            return False
        time.sleep(0.01)
    return True


def sample_pynvml(pynvml, seconds, interval):
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        last_seen = int(time.time() * 1e6)
        per_pid, seen, device = {}, set(), []
        end = time.time() + seconds
        errors = set()
        while time.time() < end:
            time.sleep(interval)
            device.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            try:
                samples = pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen)
            except pynvml.NVMLError as e:  # NOT_FOUND: no sample in this interval
                errors.add(str(e))
                continue
            for s in samples:
                key = (s.pid, s.timeStamp)
                if key in seen:
                    continue
                seen.add(key)
                per_pid.setdefault(str(s.pid), []).append(s.smUtil)
                last_seen = max(last_seen, s.timeStamp)
        return {
            "source": "pynvml",
            "per_pid": {
                pid: {"mean_sm": sum(v) / len(v), "samples": len(v)} for pid, v in per_pid.items()
            },
            "device_util_mean": sum(device) / len(device) if device else None,
            "device_samples": len(device),
            "process_errors": sorted(errors),
        }
    finally:
        pynvml.nvmlShutdown()


def sample_smi(seconds, interval):
    device = []
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(interval)
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-i", "0"],
                capture_output=True, text=True, timeout=10,
            ).stdout.strip()
            device.append(float(out.splitlines()[0]))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass
    return {
        "source": "nvidia-smi",
        "per_pid": {},
        "device_util_mean": sum(device) / len(device) if device else None,
        "device_samples": len(device),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--wait", action="append", default=[])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--interval", type=float, default=0.5)
    args = p.parse_args()
    if os.environ.get("LD_PRELOAD", "").find("gpuslice") >= 0:
        print("nvml_sample.py: must run outside the shim", file=sys.stderr)
        return 2
    if not wait_all(args.wait, 90):
        print("RESULT " + json.dumps({"error": "workloads never became ready"}))
        return 1
    try:
        import pynvml
    except ImportError:
        result = sample_smi(args.seconds, args.interval)
    else:
        result = sample_pynvml(pynvml, args.seconds, args.interval)
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
