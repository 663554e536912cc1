#!/usr/bin/env python3
"""Print, as one JSON object, what NVIDIA's cuda-bindings (`cuda.bindings.driver`, the
driver layer of cuda-python) gets from libcuda.so.1. It builds its whole function table
through cuGetProcAddress_v2, like the CUDA runtime, so it shows what a refused lookup does
to such a binding. Run with LD_LIBRARY_PATH pointing at the library to probe.

Output schema:
  {"cuInit": result name, "cuDriverGetVersion": [result name, version],
   "cuGetErrorString": [result name, text of CUDA_ERROR_NOT_INITIALIZED],
   "cuMemGetInfo": [result name, total]        # only when cuInit succeeded
   "exception": "Type: message"}               # only when the binding raised
"""

import json
import sys

try:
    from cuda.bindings import driver as cu
except ImportError:
    sys.stderr.write(
        "cuda_bindings_probe.py needs cuda-bindings: run "
        "`python3 -m pip install 'cuda-bindings<14'`\n")
    sys.exit(3)


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def main():
    out = {}
    try:
        err, = cu.cuInit(0)
        out["cuInit"] = err.name
        err, version = cu.cuDriverGetVersion()
        out["cuDriverGetVersion"] = [err.name, version]
        err, message = cu.cuGetErrorString(cu.CUresult.CUDA_ERROR_NOT_INITIALIZED)
        out["cuGetErrorString"] = [err.name, text(message)]
        if out["cuInit"] == "CUDA_SUCCESS":
            err, dev = cu.cuDeviceGet(0)
            err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
            cu.cuCtxSetCurrent(ctx)
            err, _free, total = cu.cuMemGetInfo()
            out["cuMemGetInfo"] = [err.name, total]
    except Exception as e:  # the binding's own errors are what this probe reports
        out["exception"] = "%s: %s" % (type(e).__name__, e)
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
