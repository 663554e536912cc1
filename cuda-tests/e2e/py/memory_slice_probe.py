"""pynvml inside a memory slice: prints one JSON line with what NVML reports for device 0
(memory v1 and v2, compute processes as [pid, used]). Run under LD_PRELOAD=libgpuslice.so."""
import json

import pynvml

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
memory_v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
processes = [
    [p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
]
print(json.dumps({
    "total": memory.total,
    "used": memory.used,
    "free": memory.free,
    "v2_total": memory_v2.total,
    "v2_used": memory_v2.used,
    "v2_free": memory_v2.free,
    "processes": processes,
}))
pynvml.nvmlShutdown()
