#!/usr/bin/env python3
"""Print, as one JSON object, what pynvml (nvidia-ml-py) sees through libnvidia-ml.so.1.

This is how most Python tooling (PyTorch's memory reports, gpustat, nvitop, DCGM exporters'
helpers) reads the GPU, so the tests compare its view with the fake GPU's state and, under
the shim, with the slice. Run with LD_LIBRARY_PATH pointing at the library to probe.

Output schema:
  {"driver_version": str, "cuda_driver_version": int, "nvml_version": str, "count": int,
   "devices": [{"index", "name", "uuid", "pci_bus_id", "compute_capability": [maj, min],
                "memory": {"total", "free", "used"},                      # v1
                "memory_v2": {"total", "reserved", "free", "used"},       # v2
                "utilization": {"gpu", "memory"},
                "processes": [{"pid", "used_memory"}],                    # compute, v3
                "process_utilization": [{"pid", "sm_util", "timestamp"}],
                "errors": {call: "NVML error text"}}]}
A call that raises NVMLError is recorded under "errors" instead of aborting the probe, so
one unsupported call cannot hide the others.
"""

import json
import sys

try:
    import pynvml
except ImportError:
    sys.stderr.write(
        "nvml_probe.py needs pynvml: run `python3 -m pip install nvidia-ml-py`\n")
    sys.exit(3)


def text(value):
    # pynvml returns str in recent versions and bytes in old ones.
    return value.decode() if isinstance(value, bytes) else value


def device_view(index):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    errors = {}
    view = {"index": index}

    def attempt(key, fn):
        try:
            return fn()
        except pynvml.NVMLError as e:
            errors[key] = str(e)
            return None

    view["name"] = attempt("name", lambda: text(pynvml.nvmlDeviceGetName(handle)))
    view["uuid"] = attempt("uuid", lambda: text(pynvml.nvmlDeviceGetUUID(handle)))
    view["pci_bus_id"] = attempt(
        "pci", lambda: text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
    view["compute_capability"] = attempt(
        "compute_capability",
        lambda: list(pynvml.nvmlDeviceGetCudaComputeCapability(handle)))

    mem = attempt("memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
    view["memory"] = mem and {"total": mem.total, "free": mem.free, "used": mem.used}
    mem2 = attempt(
        "memory_v2",
        lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2))
    view["memory_v2"] = mem2 and {
        "total": mem2.total, "reserved": mem2.reserved,
        "free": mem2.free, "used": mem2.used,
    }
    util = attempt("utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
    view["utilization"] = util and {"gpu": util.gpu, "memory": util.memory}

    procs = attempt("processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    view["processes"] = [
        {"pid": p.pid, "used_memory": p.usedGpuMemory} for p in (procs or [])
    ]
    samples = attempt(
        "process_utilization", lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, 0))
    view["process_utilization"] = [
        {"pid": s.pid, "sm_util": s.smUtil, "timestamp": s.timeStamp}
        for s in (samples or [])
    ]
    view["errors"] = errors
    return view


def main():
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        report = {
            "driver_version": text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": pynvml.nvmlSystemGetCudaDriverVersion(),
            "nvml_version": text(pynvml.nvmlSystemGetNVMLVersion()),
            "count": count,
            "devices": [device_view(i) for i in range(count)],
        }
        # Lookups by key must find the same device again.
        for dev in report["devices"]:
            by_uuid = pynvml.nvmlDeviceGetHandleByUUID(dev["uuid"])
            dev["index_by_uuid"] = pynvml.nvmlDeviceGetIndex(by_uuid)
    finally:
        pynvml.nvmlShutdown()
    json.dump(report, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
