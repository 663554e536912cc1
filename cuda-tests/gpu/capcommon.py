"""Shared logic of the memory-cap helpers (torch_cap.py, cupy_cap.py) of validate.sh.

A backend (PyTorch or CuPy) supplies init/alloc/mem_info; this module owns what is measured:
filling the slice until the allocator raises out-of-memory, the outside view of the process
memory (nvidia-smi run WITHOUT the shim, sampled while memory is held), and the two-process
hold/try protocol. Each run prints one line `RESULT {json}` last on stdout.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

MIB = 1 << 20
# Variables that put a process under a slice; removed for the outside (card) view.
SLICE_ENV = (
    "LD_PRELOAD",
    "GPUSLICE_CONFIG",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
)


def clean_env():
    """The environment of a process outside every slice (the host's view of the card)."""
    env = dict(os.environ)
    for name in list(env):
        if name in SLICE_ENV or name.startswith("CUDA_DEVICE_MEMORY_LIMIT_") or name.startswith(
            "CUDA_DEVICE_SM_LIMIT_"
        ):
            del env[name]
    return env


def smi_process_mib():
    """pid -> used MiB of every compute process, as the real driver reports it (no shim)."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-compute-apps=pid,used_memory",
                "--format=csv,noheader,nounits",
            ],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=15,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    seen = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            seen[int(parts[0])] = seen.get(int(parts[0]), 0) + int(parts[1])
    return seen


class Sampler(threading.Thread):
    """Samples nvidia-smi's per-process memory while this process allocates."""

    def __init__(self, interval=0.2):
        super().__init__(daemon=True)
        self.interval = interval
        self.stop_event = threading.Event()
        self.samples = 0
        self.max_own_mib = None
        self.max_any_mib = None

    def sample_once(self):
        seen = smi_process_mib()
        if seen is None:
            return
        self.samples += 1
        own = seen.get(os.getpid())
        if own is not None:
            self.max_own_mib = max(own, self.max_own_mib or 0)
        if seen:
            self.max_any_mib = max(max(seen.values()), self.max_any_mib or 0)

    def run(self):
        while not self.stop_event.is_set():
            self.sample_once()
            self.stop_event.wait(self.interval)

    def finish(self):
        self.stop_event.set()
        self.join(timeout=20)
        self.sample_once()  # one sample while everything is still held
        return {
            "smi_samples": self.samples,
            "smi_max_own_mib": self.max_own_mib,
            # When the PID is not visible (another PID namespace) the largest process stands
            # in: during a check this helper is the only process on the card.
            "smi_max_any_mib": self.max_any_mib,
        }


def emit(result):
    sys.stdout.flush()
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)


def fill(backend, chunks_mib, stop_bytes):
    """Allocates chunk after chunk (largest first) until the allocator refuses each size."""
    held = []
    total = 0
    steps = []
    for chunk_mib in chunks_mib:
        count = 0
        error = None
        while total < stop_bytes:
            try:
                held.append(backend.alloc(chunk_mib * MIB))
            except backend.oom_types as e:  # the refusal we are looking for
                error = {"type": type(e).__name__, "message": str(e).splitlines()[0][:300]}
                break
            count += 1
            total += chunk_mib * MIB
        steps.append({"chunk_mib": chunk_mib, "allocated": count, "oom": error})
        if error is None:
            break  # reached stop_bytes: the cap did not hold, no point going finer
    return held, total, steps


def mode_fill(backend, args):
    backend.init()
    free0, total0 = backend.mem_info()
    sampler = Sampler()
    sampler.start()
    # Safety stop far above the cap: if the cap does not hold, do not take the whole card.
    stop_bytes = int(args.cap_mib * MIB * 1.25) + (1 << 30)
    err = None
    try:
        held, allocated, steps = fill(backend, args.chunks, stop_bytes)
    except Exception as e:  # anything but a clean OOM is a wrong outcome; report it
        held, allocated, steps = [], 0, []
        err = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "")
    backend.sync()
    free1, total1 = backend.mem_info()
    outside = sampler.finish()
    result = {
        "backend": backend.name,
        "variant": backend.variant,
        "pid": os.getpid(),
        "cap_mib": args.cap_mib,
        "total_before": total0,
        "free_before": free0,
        "used_before": total0 - free0,
        "total_at_oom": total1,
        "free_at_oom": free1,
        "allocated_bytes": allocated,
        "allocator_reserved": backend.reserved(),
        "steps": steps,
        "oom_raised": bool(steps) and steps[-1]["oom"] is not None,
        "unexpected_error": err,
    }
    result.update(outside)
    del held
    emit(result)
    return 0


def wait_for(path, seconds):
    deadline = time.time() + seconds
    while not os.path.exists(path):
        if time.time() > deadline:
            return False
        time.sleep(0.02)
    return True


def mode_hold(backend, args):
    """First process of a slice: hold --bytes, say so, wait to be released."""
    backend.init()
    held, allocated, steps = fill(backend, [args.chunks[0]], args.hold_mib * MIB)
    backend.sync()
    free, total = backend.mem_info()
    outside = smi_process_mib() or {}
    emit(
        {
            "backend": backend.name,
            "pid": os.getpid(),
            "held_bytes": allocated,
            "wanted_bytes": args.hold_mib * MIB,
            "steps": steps,
            "free": free,
            "total": total,
            "smi_own_mib": outside.get(os.getpid()),
        }
    )
    if args.ready:
        open(args.ready, "w").close()
    released = wait_for(args.release, 90) if args.release else True
    del held
    return 0 if released else 3


def mode_try(backend, args):
    """Second process of the slice: ask for --try-mib in one piece, then for --small-mib."""
    backend.init()
    free, total = backend.mem_info()
    outcome = {}
    for label, mib in (("big", args.try_mib), ("small", args.small_mib)):
        try:
            block = backend.alloc(mib * MIB)
            backend.sync()
            outcome[label] = {"mib": mib, "granted": True}
            del block
        except backend.oom_types as e:
            outcome[label] = {"mib": mib, "granted": False, "error": type(e).__name__}
    emit({"backend": backend.name, "pid": os.getpid(), "free": free, "total": total, **outcome})
    return 0


def main(backend_factory):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=["fill", "hold", "try"], default="fill")
    p.add_argument("--variant", default="default")
    p.add_argument("--cap-mib", type=int, default=8192)
    p.add_argument("--chunks", type=lambda s: [int(x) for x in s.split(",")], default=[256, 16])
    p.add_argument("--hold-mib", type=int, default=5120)
    p.add_argument("--try-mib", type=int, default=5120)
    p.add_argument("--small-mib", type=int, default=1024)
    p.add_argument("--ready")
    p.add_argument("--release")
    args = p.parse_args()
    try:
        backend = backend_factory(args.variant)
    except ImportError as e:
        emit({"skip": "import failed: %s" % e})
        return 0
    return {"fill": mode_fill, "hold": mode_hold, "try": mode_try}[args.mode](backend, args)
