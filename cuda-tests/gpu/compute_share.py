"""Compute-bound PyTorch workload for validate.sh (check 5).

A loop of bf16 matrix products on random data (N x N x N, default 8192: about 1.1 TFLOP,
roughly 1.4 ms each on an H200), at most 4 queued, for --seconds after a 1 s warm-up.
--ready/--go: after the warm-up, create READY and wait (at most 60 s) for GO, so that several
processes measure over the same interval. Prints `RESULT {json}` with matmuls/s and TFLOP/s.
"""

import argparse
import json
import os
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--ready")
    p.add_argument("--go")
    args = p.parse_args()
    try:
        import torch
    except ImportError as e:
        print("RESULT " + json.dumps({"skip": "import failed: %s" % e}))
        return 0

    gen = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16, generator=gen)
    c = torch.empty_like(a)
    depth = 4

    def run_for(seconds):
        count = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(depth):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize()
            count += depth
        return count

    run_for(1.0)
    if args.ready and args.go:
        open(args.ready, "w").close()
        deadline = time.time() + 60
        while not os.path.exists(args.go):
            if time.time() > deadline:
                print("compute_share.py: no --go file within 60 s", file=sys.stderr)
                return 1
            time.sleep(0.005)
    t0 = time.perf_counter()
    count = run_for(args.seconds)
    elapsed = time.perf_counter() - t0
    if not torch.isfinite(c[:64, :64].float()).all():
        print("compute_share.py: non-finite product", file=sys.stderr)
        return 1
    flops = 2.0 * args.n**3 * count
    print(
        "RESULT "
        + json.dumps(
            {
                "pid": os.getpid(),
                "n": args.n,
                "matmuls": count,
                "seconds": round(elapsed, 4),
                "matmuls_per_s": count / elapsed,
                "tflops": flops / elapsed / 1e12,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
