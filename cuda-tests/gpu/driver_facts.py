#!/usr/bin/env python3
"""Driver facts the shim relies on (validate.sh check 8). Run WITHOUT the shim.

Loads the real libcuda.so.1 (and libnvidia-ml.so.1) with ctypes and establishes:

 a) cuGetProcAddress identity: for every CUDA function the shim hooks, cuGetProcAddress_v2
    (at CUDA 12.8 = 12080 and at the driver's own version, with flags DEFAULT and
    PER_THREAD_DEFAULT_STREAM) returns exactly `dlsym` of the export the shim hooks
    (cuMemAlloc -> cuMemAlloc_v2, cuLaunchKernel + per-thread -> cuLaunchKernel_ptsz, ...).
    The shim swaps pointers by that identity; a mismatch means calls through the CUDA
    runtime's path bypass the slice on this driver: FAIL, named.
 b) primary-context reset semantics: retain, reset, retain, release, release with
    cuDevicePrimaryCtxGetState after each step. Documented ("Resetting the primary context
    does not release it"): active 1, 0, 1, 1, 0. The shim's ledger assumes it; any other
    sequence is a FAIL.
 c) numbers, never a verdict: the device memory one context costs (NVML: this process's
    entry in nvmlDeviceGetComputeRunningProcesses_v3, else the device's used-memory delta),
    the VMM allocation granularity, and what a 1-byte cuMemAlloc costs in NVML terms.
 d) numbers, never a verdict: what one context costs under settings a tenant chooses
    (creation flags, CUDA_DEVICE_MAX_CONNECTIONS), each in a fresh process of its own: the
    slice's bound on a context's cost (the limit file's context_overhead) must be at least
    the dearest, or contexts started together may pass the cap by the difference.

Prints ONE JSON object (one line) on stdout: the findings and "verdict" (PASS, FAIL, or
ERROR = could not run); a short human summary goes to stderr. Exit code 0 PASS, 1 FAIL,
2 could not run. Nothing raises: a missing library or symbol is a finding. Stdlib only.
"""

import argparse
import ctypes
import json
import os
import sys
import traceback

MIB = 1 << 20
CUDA_SUCCESS = 0
CU_GET_PROC_ADDRESS_DEFAULT = 0
CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2
PROC_STATUS = {0: "SUCCESS", 1: "SYMBOL_NOT_FOUND", 2: "VERSION_NOT_SUFFICIENT"}
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1
# The version the shim's peers (CUDA 12.8 runtimes) ask at; the driver's own version is
# asked as well, which is what a runtime as new as the driver uses.
QUERY_VERSION = 12080

# Every CUDA function the shim hooks, as (name a cuGetProcAddress caller asks for, the
# export(s) the shim hooks for flags DEFAULT, the export(s) for PER_THREAD_DEFAULT_STREAM or
# None = same as DEFAULT). A tuple accepts any of its exports (all hooked by the shim).
HOOKED = [
    ("cuMemAlloc", "cuMemAlloc_v2", None),
    ("cuMemFree", "cuMemFree_v2", None),
    ("cuMemGetInfo", "cuMemGetInfo_v2", None),
    ("cuMemAllocPitch", "cuMemAllocPitch_v2", None),
    ("cuMemAllocManaged", "cuMemAllocManaged", None),
    ("cuMemAllocAsync", "cuMemAllocAsync", "cuMemAllocAsync_ptsz"),
    ("cuMemFreeAsync", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"),
    ("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"),
    ("cuMemCreate", "cuMemCreate", None),
    ("cuMemRelease", "cuMemRelease", None),
    ("cuMemMap", "cuMemMap", None),
    ("cuMemUnmap", "cuMemUnmap", None),
    ("cuArrayCreate", "cuArrayCreate_v2", None),
    ("cuArray3DCreate", "cuArray3DCreate_v2", None),
    ("cuMipmappedArrayCreate", "cuMipmappedArrayCreate", None),
    # At 12080 and later the driver may hand out _v3 or _v4 (CUDA 12.5+ headers); the shim
    # hooks all three. The fixed 3020 query below pins the classic mapping to _v2.
    ("cuCtxCreate", ("cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4"), None),
    ("cuCtxDestroy", "cuCtxDestroy_v2", None),
    ("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", None),
    ("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", None),
    ("cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", None),
    ("cuDeviceTotalMem", "cuDeviceTotalMem_v2", None),
    ("cuLaunchKernel", "cuLaunchKernel", "cuLaunchKernel_ptsz"),
    ("cuLaunchKernelEx", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"),
    ("cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"),
    ("cuGraphLaunch", "cuGraphLaunch", "cuGraphLaunch_ptsz"),
    # The deprecated launches: one ABI, no per-thread variant.
    ("cuLaunch", "cuLaunch", None),
    ("cuLaunchGrid", "cuLaunchGrid", None),
    ("cuLaunchGridAsync", "cuLaunchGridAsync", None),
    # The rest of the shim's CUDA hooks.
    ("cuInit", "cuInit", None),
    ("cuCtxGetCurrent", "cuCtxGetCurrent", None),
    ("cuGetProcAddress", ("cuGetProcAddress_v2", "cuGetProcAddress"), None),
    ("cuMemPoolDestroy", "cuMemPoolDestroy", None),
    ("cuMemPoolTrimTo", "cuMemPoolTrimTo", None),
    ("cuMemAddressFree", "cuMemAddressFree", None),
    ("cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", None),
    ("cuArrayDestroy", "cuArrayDestroy", None),
    ("cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", None),
]
# Queries at a fixed version: (name, version, export(s)). Below the version of the suffixed
# ABI the driver answers the legacy (v1) export, which the shim hooks too (so does the _v2 one:
# either answer is covered; anything else bypasses the slice). NVIDIA's own loaders ask for
# the primary-context release/reset at 7000.
FIXED = [
    ("cuCtxCreate", 3020, "cuCtxCreate_v2"),
    ("cuCtxCreate", 3010, ("cuCtxCreate", "cuCtxCreate_v2")),
    ("cuCtxDestroy", 3020, ("cuCtxDestroy", "cuCtxDestroy_v2")),
    ("cuMemAlloc", 3010, ("cuMemAlloc", "cuMemAlloc_v2")),
    ("cuMemAllocPitch", 3010, ("cuMemAllocPitch", "cuMemAllocPitch_v2")),
    ("cuMemFree", 3010, ("cuMemFree", "cuMemFree_v2")),
    ("cuMemGetInfo", 3010, ("cuMemGetInfo", "cuMemGetInfo_v2")),
    ("cuDeviceTotalMem", 3010, ("cuDeviceTotalMem", "cuDeviceTotalMem_v2")),
    ("cuArrayCreate", 3010, ("cuArrayCreate", "cuArrayCreate_v2")),
    ("cuArray3DCreate", 3010, ("cuArray3DCreate", "cuArray3DCreate_v2")),
    ("cuDevicePrimaryCtxRelease", 7000,
     ("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2")),
    ("cuDevicePrimaryCtxReset", 7000, ("cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2")),
]
# Documented primary-context sequence: (step, active afterwards).
RESET_SEQUENCE = [
    ("initial", 0),
    ("retain", 1),
    ("reset", 0),
    ("retain", 1),
    ("release", 1),
    ("release", 0),
]
CU_RESULT_NAMES = {
    0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE", 201: "CUDA_ERROR_INVALID_CONTEXT",
    400: "CUDA_ERROR_INVALID_HANDLE", 500: "CUDA_ERROR_NOT_FOUND", 999: "CUDA_ERROR_UNKNOWN",
}


class CUmemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint), ("id", ctypes.c_int)]


class CUmemAllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class CUmemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint), ("requestedHandleTypes", ctypes.c_uint),
                ("location", CUmemLocation), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", CUmemAllocFlags)]


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class NvmlProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (_v2/_v3 lists)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class NvmlProcessInfoV1(ctypes.Structure):  # nvmlProcessInfo_v1_t (unversioned list)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def mib(x):
    return None if x is None else round(x / MIB, 2)


def func(lib, name, argtypes, restype=ctypes.c_int):
    """A fresh ctypes function for an export, or None when the library lacks it."""
    if lib is None:
        return None
    try:
        f = lib[name]
    except AttributeError:
        return None
    f.argtypes = argtypes
    f.restype = restype
    return f


def address(lib, name):
    """dlsym(handle, name) as an int, or None when not exported."""
    try:
        return ctypes.cast(lib[name], ctypes.c_void_p).value
    except AttributeError:
        return None


class Cuda:
    def __init__(self, lib):
        self.lib = lib
        self.missing = []
        self._get_error_name = func(lib, "cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])

    def fn(self, name, argtypes):
        f = func(self.lib, name, argtypes)
        if f is None and name not in self.missing:
            self.missing.append(name)
        return f

    def name(self, code):
        if code is None:
            return None
        if self._get_error_name is not None:
            s = ctypes.c_char_p()
            if self._get_error_name(code, ctypes.byref(s)) == CUDA_SUCCESS and s.value:
                return s.value.decode(errors="replace")
        return CU_RESULT_NAMES.get(code, "CUresult %d" % code)


# ---------------------------------------------------------------------------------------------
# (a) cuGetProcAddress identity
# ---------------------------------------------------------------------------------------------

def candidates(base):
    """Exports a lookup of `base` could plausibly return, to name what came back."""
    out = [base]
    for v in ("", "_v2", "_v3", "_v4"):
        for s in ("", "_ptsz", "_ptds"):
            out.append(base + v + s)
    return out


def proc_address_facts(cuda, driver_version):
    lib = cuda.lib
    p = ctypes.POINTER
    query, query_name = None, None
    v2 = func(lib, "cuGetProcAddress_v2",
              [ctypes.c_char_p, p(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64, p(ctypes.c_int)])
    if v2 is not None:
        query_name = "cuGetProcAddress_v2"

        def query(name, version, flags):
            ptr, status = ctypes.c_void_p(), ctypes.c_int(-1)
            r = v2(name.encode(), ctypes.byref(ptr), version, flags, ctypes.byref(status))
            return r, ptr.value, PROC_STATUS.get(status.value, str(status.value))
    else:
        v1 = func(lib, "cuGetProcAddress",
                  [ctypes.c_char_p, p(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64])
        if v1 is not None:
            query_name = "cuGetProcAddress"

            def query(name, version, flags):
                ptr = ctypes.c_void_p()
                r = v1(name.encode(), ctypes.byref(ptr), version, flags)
                return r, ptr.value, None
    out = {"query": query_name, "versions": [], "checked": 0, "matched": 0, "absent": [],
           "not_offered": [], "mismatches": [], "status": "PASS"}
    if query is None:
        out["status"] = "ERROR"
        out["error"] = "neither cuGetProcAddress_v2 nor cuGetProcAddress is exported"
        return out
    versions = [QUERY_VERSION]
    if driver_version and driver_version != QUERY_VERSION:
        versions.append(driver_version)
    out["versions"] = versions
    by_address = {}
    names = sorted({n for base, _, _ in HOOKED for n in candidates(base)})
    for n in names:
        a = address(lib, n)
        if a is not None:
            by_address.setdefault(a, n)

    def one(base, version, flags, expected):
        expected = expected if isinstance(expected, tuple) else (expected,)
        want = {a for a in (address(lib, e) for e in expected) if a is not None}
        r, got, status = query(base, version, flags)
        out["checked"] += 1
        where = "%s@%d%s" % (base, version, "/ptds" if flags else "")
        if r != CUDA_SUCCESS or not got:
            if not want:
                out["absent"].append(where)  # neither offered nor exported: nothing to bypass
            else:
                out["not_offered"].append("%s (%s, %s)" % (where, cuda.name(r), status))
            return
        if got in want:
            out["matched"] += 1
            return
        out["mismatches"].append({
            "name": base, "version": version, "flags": flags, "expected": list(expected),
            "expected_exported": bool(want), "got": hex(got),
            "resolved_to": by_address.get(got, "an address no candidate export has"),
            "status": status,
        })

    for version in versions:
        for base, default, per_thread in HOOKED:
            one(base, version, CU_GET_PROC_ADDRESS_DEFAULT, default)
            one(base, version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                per_thread or default)
    for base, version, export in FIXED:
        one(base, version, CU_GET_PROC_ADDRESS_DEFAULT, export)
    if out["mismatches"]:
        out["status"] = "FAIL"
    return out


# ---------------------------------------------------------------------------------------------
# NVML (for c)
# ---------------------------------------------------------------------------------------------

class Nvml:
    """This process's and the device's used memory, or None where NVML cannot tell."""

    def __init__(self, path, cuda, dev):
        self.notes = []
        self.handle = None
        self.found_by = None
        p = ctypes.POINTER
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            self.lib = None
            self.notes.append("cannot load %s: %s" % (path, e))
            return
        init = func(self.lib, "nvmlInit_v2", []) or func(self.lib, "nvmlInit", [])
        if init is None or init() != NVML_SUCCESS:
            self.notes.append("nvmlInit failed or missing")
            self.lib = None
            return
        self._mem = func(self.lib, "nvmlDeviceGetMemoryInfo", [ctypes.c_void_p, p(NvmlMemory)])
        self._procs, self._proc_struct = None, NvmlProcessInfo
        for name in ("nvmlDeviceGetComputeRunningProcesses_v3",
                     "nvmlDeviceGetComputeRunningProcesses_v2"):
            self._procs = func(self.lib, name, [ctypes.c_void_p, p(ctypes.c_uint), ctypes.c_void_p])
            if self._procs is not None:
                self.procs_call = name
                break
        if self._procs is None:
            self._procs = func(self.lib, "nvmlDeviceGetComputeRunningProcesses",
                               [ctypes.c_void_p, p(ctypes.c_uint), ctypes.c_void_p])
            self._proc_struct, self.procs_call = NvmlProcessInfoV1, "nvmlDeviceGetComputeRunningProcesses"
        self.handle, self.found_by = self._device(cuda, dev)
        if self.handle is None:
            self.notes.append("no NVML handle for CUDA device %d" % dev.value)

    def _device(self, cuda, dev):
        h, out = ctypes.c_void_p(), ctypes.POINTER(ctypes.c_void_p)
        by_uuid = func(self.lib, "nvmlDeviceGetHandleByUUID", [ctypes.c_char_p, out])
        for name in ("cuDeviceGetUuid_v2", "cuDeviceGetUuid"):
            get = func(cuda.lib, name, [ctypes.POINTER(ctypes.c_char), ctypes.c_int])
            raw = (ctypes.c_char * 16)()
            if get is not None and by_uuid is not None and get(raw, dev) == CUDA_SUCCESS:
                b = bytes(raw)
                uuid = "GPU-%s-%s-%s-%s-%s" % (b[:4].hex(), b[4:6].hex(), b[6:8].hex(),
                                               b[8:10].hex(), b[10:].hex())
                if by_uuid(uuid.encode(), ctypes.byref(h)) == NVML_SUCCESS:
                    return h, "uuid " + uuid
                break
        bus = func(cuda.lib, "cuDeviceGetPCIBusId", [ctypes.c_char_p, ctypes.c_int, ctypes.c_int])
        by_bus = func(self.lib, "nvmlDeviceGetHandleByPciBusId_v2", [ctypes.c_char_p, out])
        buf = ctypes.create_string_buffer(64)
        if bus is not None and by_bus is not None and bus(buf, 64, dev) == CUDA_SUCCESS:
            if by_bus(buf.value, ctypes.byref(h)) == NVML_SUCCESS:
                return h, "pci " + buf.value.decode(errors="replace")
        by_index = func(self.lib, "nvmlDeviceGetHandleByIndex_v2", [ctypes.c_uint, out])
        if by_index is not None and by_index(dev.value, ctypes.byref(h)) == NVML_SUCCESS:
            return h, "index %d (uuid and pci bus id did not match)" % dev.value
        return None, None

    def device_used(self):
        if self.handle is None or self._mem is None:
            return None
        m = NvmlMemory()
        return m.used if self._mem(self.handle, ctypes.byref(m)) == NVML_SUCCESS else None

    def own_used(self):
        """(listed, bytes): this pid's entry in the compute process list."""
        if self.handle is None or self._procs is None:
            return None, None
        n = 64
        for _ in range(3):
            buf = (self._proc_struct * n)()
            count = ctypes.c_uint(n)
            r = self._procs(self.handle, ctypes.byref(count), ctypes.cast(buf, ctypes.c_void_p))
            if r == NVML_ERROR_INSUFFICIENT_SIZE:
                n = count.value + 16
                continue
            if r != NVML_SUCCESS:
                return None, None
            for e in buf[: count.value]:
                if e.pid == os.getpid():
                    used = e.usedGpuMemory
                    return True, (None if used == NVML_VALUE_NOT_AVAILABLE else used)
            return False, None
        return None, None

    def snapshot(self):
        listed, own = self.own_used()
        return {"device_used": self.device_used(), "own_listed": listed, "own_used": own}

    def shutdown(self):
        if self.lib is not None:
            f = func(self.lib, "nvmlShutdown", [])
            if f is not None:
                f()


def cost(before, after):
    """(bytes, source) of what happened between two snapshots: the process's own entry when
    NVML lists it both times (absent before = 0), else the device's used-memory delta."""
    if after["own_listed"] and after["own_used"] is not None:
        base = before["own_used"] if before["own_listed"] else 0
        if base is not None:
            return after["own_used"] - base, "process"
    if before["device_used"] is not None and after["device_used"] is not None:
        return after["device_used"] - before["device_used"], "device_delta"
    return None, None


def snap_mib(s):
    return {"device_used_mib": mib(s["device_used"]), "own_listed": s["own_listed"],
            "own_used_mib": mib(s["own_used"])}


# ---------------------------------------------------------------------------------------------
# (b) primary-context reset semantics, with (c) measured along the way
# ---------------------------------------------------------------------------------------------

def context_facts(cuda, dev, nvml):
    p, i, u = ctypes.POINTER, ctypes.c_int, ctypes.c_uint
    retain = cuda.fn("cuDevicePrimaryCtxRetain", [p(ctypes.c_void_p), i])
    reset = cuda.fn("cuDevicePrimaryCtxReset_v2", [i])
    release = cuda.fn("cuDevicePrimaryCtxRelease_v2", [i])
    get_state = cuda.fn("cuDevicePrimaryCtxGetState", [i, p(u), p(i)])
    push = cuda.fn("cuCtxPushCurrent_v2", [ctypes.c_void_p])
    pop = cuda.fn("cuCtxPopCurrent_v2", [p(ctypes.c_void_p)])
    alloc = cuda.fn("cuMemAlloc_v2", [p(ctypes.c_uint64), ctypes.c_size_t])
    free = cuda.fn("cuMemFree_v2", [ctypes.c_uint64])
    granularity = cuda.fn("cuMemGetAllocationGranularity", [p(ctypes.c_size_t), p(CUmemAllocationProp), i])

    reset_out = {"status": "PASS", "expected_active": [a for _, a in RESET_SEQUENCE],
                 "observed": [], "differences": []}
    costs = {"notes": list(nvml.notes), "nvml_device": nvml.found_by,
             "nvml_process_list": getattr(nvml, "procs_call", None)}
    needed = {"cuDevicePrimaryCtxRetain": retain, "cuDevicePrimaryCtxReset_v2": reset,
              "cuDevicePrimaryCtxRelease_v2": release, "cuDevicePrimaryCtxGetState": get_state}
    lacking = [n for n, f in needed.items() if f is None]
    if lacking:
        reset_out["status"] = "ERROR"
        reset_out["error"] = "not exported: " + ", ".join(lacking)
        return reset_out, costs

    def state():
        flags, active = ctypes.c_uint(), ctypes.c_int(-1)
        r = get_state(dev, ctypes.byref(flags), ctypes.byref(active))
        return r, flags.value, active.value

    ctx = ctypes.c_void_p()
    calls = {"initial": None, "retain": lambda: retain(ctypes.byref(ctx), dev),
             "reset": lambda: reset(dev), "release": lambda: release(dev)}
    snaps = {"before_retain": nvml.snapshot()}

    def step(index, label, expected_active):
        r = calls[label]() if calls[label] else CUDA_SUCCESS
        rs, flags, active = state()
        row = {"step": label, "result": cuda.name(r), "active": active if rs == CUDA_SUCCESS else None,
               "flags": flags if rs == CUDA_SUCCESS else None}
        if rs != CUDA_SUCCESS:
            row["get_state_result"] = cuda.name(rs)
        reset_out["observed"].append(row)
        if r != CUDA_SUCCESS:
            reset_out["differences"].append("step %d (%s) returned %s" % (index, label, row["result"]))
        elif row["active"] != expected_active:
            reset_out["differences"].append("step %d (%s): active %s, documented %d"
                                            % (index, label, row["active"], expected_active))
        return r

    for index, (label, expected_active) in enumerate(RESET_SEQUENCE):
        r = step(index, label, expected_active)
        if index == 1 and r == CUDA_SUCCESS:
            # (c), measured while the first retain holds the context.
            snaps["after_retain"] = nvml.snapshot()
            measure_in_context(cuda, dev, ctx, nvml, snaps, costs, push, pop, alloc, free, granularity)
        elif index == 2:
            snaps["after_reset"] = nvml.snapshot()
        elif index == 3:
            snaps["after_second_retain"] = nvml.snapshot()
        elif index == 5:
            snaps["after_last_release"] = nvml.snapshot()
    # One release more than retains: informational (how the driver answers an over-release).
    r = release(dev)
    rs, _, active = state()
    reset_out["release_past_zero"] = {"result": cuda.name(r),
                                      "active": active if rs == CUDA_SUCCESS else None}
    if reset_out["differences"]:
        reset_out["status"] = "FAIL"

    c, src = (None, None)
    if "after_retain" in snaps:
        c, src = cost(snaps["before_retain"], snaps["after_retain"])
    costs["context_mib"] = mib(c)
    costs["context_source"] = src
    if "after_reset" in snaps and "after_retain" in snaps:
        freed, _ = cost(snaps["after_reset"], snaps["after_retain"])
        costs["reset_frees_mib"] = mib(freed)
    costs["snapshots"] = {k: snap_mib(v) for k, v in snaps.items()}
    if c is None:
        costs["notes"].append("NVML could not tell the context's cost")
    return reset_out, costs


def measure_in_context(cuda, dev, ctx, nvml, snaps, costs, push, pop, alloc, free, granularity):
    """Granularity and the NVML cost of a 1-byte cuMemAlloc, with the primary context current."""
    if push is None or pop is None or push(ctx) != CUDA_SUCCESS:
        costs["notes"].append("cuCtxPushCurrent_v2 failed or missing: no allocation measured")
        return
    try:
        if granularity is not None:
            prop = CUmemAllocationProp()
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE
            prop.location.id = dev.value
            for key, option in (("granularity_min_bytes", CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                                ("granularity_recommended_bytes", CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)):
                g = ctypes.c_size_t()
                r = granularity(ctypes.byref(g), ctypes.byref(prop), option)
                costs[key] = g.value if r == CUDA_SUCCESS else None
                if r != CUDA_SUCCESS:
                    costs["notes"].append("cuMemGetAllocationGranularity(%s): %s" % (key, cuda.name(r)))
        else:
            costs["notes"].append("cuMemGetAllocationGranularity not exported")
        if alloc is None or free is None:
            costs["notes"].append("cuMemAlloc_v2/cuMemFree_v2 not exported")
            return
        ptr = ctypes.c_uint64()
        r = alloc(ctypes.byref(ptr), 1)
        if r != CUDA_SUCCESS:
            costs["notes"].append("cuMemAlloc_v2(1 byte): %s" % cuda.name(r))
            return
        snaps["after_alloc_1b"] = nvml.snapshot()
        rf = free(ptr.value)
        if rf != CUDA_SUCCESS:
            costs["notes"].append("cuMemFree_v2: %s" % cuda.name(rf))
        snaps["after_free_1b"] = nvml.snapshot()
        c, src = cost(snaps["after_retain"], snaps["after_alloc_1b"])
        costs["alloc_1_byte_mib"] = mib(c)
        costs["alloc_1_byte_source"] = src
    finally:
        pop(ctypes.byref(ctypes.c_void_p()))


# ---------------------------------------------------------------------------------------------

def run(args):
    facts = {"check": "driver_facts", "libcuda": args.libcuda, "libnvml": args.libnvml,
             "reasons": []}
    try:
        lib = ctypes.CDLL(args.libcuda)
    except OSError as e:
        facts["reasons"].append("cannot load %s: %s" % (args.libcuda, e))
        return "ERROR", facts
    cuda = Cuda(lib)
    p, i = ctypes.POINTER, ctypes.c_int
    init = cuda.fn("cuInit", [ctypes.c_uint])
    version = cuda.fn("cuDriverGetVersion", [p(i)])
    device_get = cuda.fn("cuDeviceGet", [p(i), i])
    if init is None or device_get is None:
        facts["reasons"].append("%s lacks cuInit/cuDeviceGet: not a CUDA driver" % args.libcuda)
        return "ERROR", facts
    v = ctypes.c_int(0)
    if version is not None and version(ctypes.byref(v)) == CUDA_SUCCESS:
        facts["cuda_driver_version"] = v.value
    r = init(0)
    if r != CUDA_SUCCESS:
        facts["reasons"].append("cuInit(0): %s" % cuda.name(r))
        return "ERROR", facts
    dev = ctypes.c_int(-1)
    r = device_get(ctypes.byref(dev), args.device)
    if r != CUDA_SUCCESS:
        facts["reasons"].append("cuDeviceGet(%d): %s" % (args.device, cuda.name(r)))
        return "ERROR", facts
    get_name = func(lib, "cuDeviceGetName", [ctypes.c_char_p, i, i])
    buf = ctypes.create_string_buffer(256)
    if get_name is not None and get_name(buf, 256, dev) == CUDA_SUCCESS:
        facts["device_name"] = buf.value.decode(errors="replace")
    facts["device"] = args.device

    pa = proc_address_facts(cuda, facts.get("cuda_driver_version"))
    facts["proc_address"] = pa
    nvml = Nvml(args.libnvml, cuda, dev)
    try:
        reset, costs = context_facts(cuda, dev, nvml)
    finally:
        nvml.shutdown()
    facts["primary_reset"] = reset
    facts["context_cost"] = costs
    facts["context_variants"] = context_variants(args)
    if cuda.missing:
        facts["missing_exports"] = cuda.missing

    if pa["status"] == "FAIL":
        facts["reasons"].append(
            "cuGetProcAddress bypasses the shim's hooks for: "
            + ", ".join("%s@%d%s -> %s (want %s)" % (m["name"], m["version"], "/ptds" if m["flags"] else "",
                                                    m["resolved_to"], "|".join(m["expected"]))
                        for m in pa["mismatches"]))
    elif pa["status"] == "ERROR":
        facts["reasons"].append(pa["error"])
    if reset["status"] == "FAIL":
        facts["reasons"].append("primary-context sequence is not the documented one: "
                                + "; ".join(reset["differences"]))
    elif reset["status"] == "ERROR":
        facts["reasons"].append("primary-context sequence not run: " + reset["error"])
    statuses = (pa["status"], reset["status"])
    if "FAIL" in statuses:
        return "FAIL", facts
    if "ERROR" in statuses:
        return "ERROR", facts
    return "PASS", facts


# (d) what one context costs under settings a tenant chooses
# ---------------------------------------------------------------------------------------------

CU_CTX_SCHED_BLOCKING_SYNC = 0x4
CU_CTX_LMEM_RESIZE_TO_MAX = 0x10
# (name, creation flags, environment added): each measured in a fresh process.
CONTEXT_VARIANTS = [
    ("default", 0, {}),
    ("blocking_sync", CU_CTX_SCHED_BLOCKING_SYNC, {}),
    ("lmem_resize_to_max", CU_CTX_LMEM_RESIZE_TO_MAX, {}),
    ("max_connections_32", 0, {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}),
]


def one_context_cost(args):
    """Child mode (--context-flags): cuCtxCreate_v2 with those flags, its cost in MiB."""
    try:
        lib = ctypes.CDLL(args.libcuda)
    except OSError as e:
        return {"error": "cannot load %s: %s" % (args.libcuda, e)}
    cuda = Cuda(lib)
    p, i = ctypes.POINTER, ctypes.c_int
    init = cuda.fn("cuInit", [ctypes.c_uint])
    device_get = cuda.fn("cuDeviceGet", [p(i), i])
    create = cuda.fn("cuCtxCreate_v2", [p(ctypes.c_void_p), ctypes.c_uint, i])
    if init is None or device_get is None or create is None or init(0) != CUDA_SUCCESS:
        return {"error": "no usable cuInit/cuDeviceGet/cuCtxCreate_v2"}
    dev = ctypes.c_int(-1)
    r = device_get(ctypes.byref(dev), args.device)
    if r != CUDA_SUCCESS:
        return {"error": "cuDeviceGet: %s" % cuda.name(r)}
    nvml = Nvml(args.libnvml, cuda, dev)
    try:
        before = nvml.snapshot()
        ctx = ctypes.c_void_p()
        r = create(ctypes.byref(ctx), args.context_flags, dev)
        if r != CUDA_SUCCESS:
            return {"error": "cuCtxCreate_v2(%#x): %s" % (args.context_flags, cuda.name(r))}
        c, src = cost(before, nvml.snapshot())
        destroy = cuda.fn("cuCtxDestroy_v2", [ctypes.c_void_p])
        if destroy is not None:
            destroy(ctx)
        return {"mib": mib(c), "source": src}
    finally:
        nvml.shutdown()


def context_variants(args):
    import subprocess
    out = {}
    for name, flags, extra in CONTEXT_VARIANTS:
        env = dict(os.environ)
        env.update(extra)
        cmd = [sys.executable, os.path.abspath(__file__), "--libcuda", args.libcuda,
               "--libnvml", args.libnvml, "--device", str(args.device),
               "--context-flags", str(flags)]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            out[name] = json.loads(done.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, ValueError, IndexError) as e:
            out[name] = {"error": "%s: %s" % (type(e).__name__, e)}
    costs = [(v["mib"], n) for n, v in out.items() if v.get("mib") is not None]
    if costs:
        # The first of equals (the default when none is dearer).
        dearest_mib, dearest = max(costs, key=lambda c: c[0])
        out["dearest"] = {"mib": dearest_mib, "variant": dearest}
    return out


def summary(verdict, facts):
    lines = ["driver_facts: %s" % verdict]
    pa = facts.get("proc_address")
    if pa:
        lines.append("  cuGetProcAddress (%s at %s): %d lookups, %d identical to the hooked export, "
                     "%d mismatches, %d absent, %d not offered"
                     % (pa["query"], pa["versions"], pa["checked"], pa["matched"],
                        len(pa["mismatches"]), len(pa["absent"]), len(pa["not_offered"])))
    rs = facts.get("primary_reset")
    if rs and rs.get("observed"):
        lines.append("  primary context active after initial/retain/reset/retain/release/release: %s "
                     "(documented %s)" % ([o["active"] for o in rs["observed"]], rs["expected_active"]))
    cc = facts.get("context_cost")
    if cc:
        lines.append("  context %s MiB (%s), 1-byte cuMemAlloc %s MiB, granularity %s bytes"
                     % (cc.get("context_mib"), cc.get("context_source"), cc.get("alloc_1_byte_mib"),
                        cc.get("granularity_min_bytes")))
    cv = facts.get("context_variants")
    if cv:
        lines.append("  contexts under a tenant's settings (MiB): %s; the bound (context_overhead) "
                     "must be at least the dearest"
                     % ", ".join("%s %s" % (n, v.get("mib", v.get("error")))
                                 for n, v in cv.items() if n != "dearest"))
    for r in facts.get("reasons", []):
        lines.append("  why: " + r)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libcuda", default="libcuda.so.1")
    ap.add_argument("--libnvml", default="libnvidia-ml.so.1")
    ap.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    ap.add_argument("--context-flags", type=int, default=None,
                    help="(internal) measure one context made with these flags, print its cost")
    args = ap.parse_args()
    if args.context_flags is not None:
        try:
            print(json.dumps(one_context_cost(args), sort_keys=True))
        except Exception as e:  # the parent reads one line whatever happens
            print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
        return 0
    try:
        verdict, facts = run(args)
    except Exception as e:  # a bug here must still leave a verdict, never a bare traceback
        verdict, facts = "ERROR", {"check": "driver_facts",
                                   "reasons": ["internal error: %s: %s" % (type(e).__name__, e)],
                                   "internal_error": traceback.format_exc().splitlines()[-6:]}
    facts["verdict"] = verdict
    if os.environ.get("LD_PRELOAD"):
        facts["warning"] = "LD_PRELOAD=%s: these are facts about that, not the bare driver" % (
            os.environ["LD_PRELOAD"])
    print(json.dumps(facts, sort_keys=True))
    sys.stdout.flush()
    sys.stderr.write(summary(verdict, facts) + "\n")
    return {"PASS": 0, "FAIL": 1}.get(verdict, 2)


if __name__ == "__main__":
    sys.exit(main())
