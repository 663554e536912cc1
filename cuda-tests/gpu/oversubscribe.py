"""Oversubscription probe for validate.sh (check 12), run under the shim with a limit file whose
device 0 has `memory` CAP and `virtual` CAP + EXCESS.

Fills the slice with 256 MiB tensors until torch.cuda.OutOfMemoryError, times a read of the
first tensor (on the card) and of the last (placed in host memory), writes --ready, waits for
--release (validate.sh samples nvidia-smi outside the shim meanwhile) and prints one JSON line:
total (mem_get_info), filled bytes, card_read_ms and host_read_ms (mean of 3 reads each).
"""

import argparse
import json
import os
import time

import torch

CHUNK = 256 << 20


def read_ms(t):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        t.sum()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / 3 * 1000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ready", required=True)
    p.add_argument("--release", required=True)
    a = p.parse_args()
    torch.zeros(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    held = []
    try:
        while True:
            held.append(torch.ones(CHUNK, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        pass
    out = {"total": total, "free_before": free, "filled": len(held) * CHUNK,
           "pid": os.getpid()}
    if held:
        out["card_read_ms"] = read_ms(held[0])
        out["host_read_ms"] = read_ms(held[-1])
    open(a.ready, "w").close()
    deadline = time.time() + 120
    while not os.path.exists(a.release) and time.time() < deadline:
        time.sleep(0.05)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
