"""Check 11 of validate.sh: the memory the driver takes on its own account, and the bound within
which the slice charges it. Runs UNDER the shim (driver API through ctypes, no runtime).

Fills the slice to --headroom-mib below its cap, loads a PTX module with --static-mib of static
`__device__` data and a kernel whose stack frame is --local bytes per thread (the driver JITs
it, places the module at the first launch under lazy loading and grows local memory for every
resident thread), launches it once, then:
* tries a 2 MiB allocation at once (refused when the growth took the slice past its cap);
* polls, for --watch-s seconds, the driver's figure for this process (nvidia-smi outside the
  shim) against what the slice says it uses (cuMemGetInfo under the shim): the bound is the
  time from the launch's end until the slice's figure covers the driver's (to --slack-mib).
Prints one `RESULT {json}` line.
"""

import argparse
import ctypes
import json
import os
import time

import capcommon

MIB = 1 << 20


def check(rc, what):
    if rc != 0:
        raise RuntimeError("%s -> CUresult %d" % (what, rc))


def ptx(static_bytes, local_bytes):
    # Volatile stores keep ptxas from dropping the frame or the table.
    return (
        ".version 7.0\n.target sm_70\n.address_size 64\n"
        ".visible .global .align 8 .b8 table[%d];\n"
        ".visible .entry grow()\n{\n"
        "  .local .align 8 .b8 __local_depot0[%d];\n"
        "  .reg .b32 %%r<2>;\n  .reg .b64 %%rd<3>;\n"
        "  mov.u32 %%r1, 1;\n"
        "  st.volatile.local.u32 [__local_depot0+%d], %%r1;\n"
        "  mov.u64 %%rd1, table;\n"
        "  st.volatile.global.u32 [%%rd1+%d], %%r1;\n"
        "  ret;\n}\n"
        % (static_bytes, local_bytes, local_bytes - 4, static_bytes - 4)
    ).encode() + b"\0"


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--headroom-mib", type=int, default=256)
    p.add_argument("--static-mib", type=int, default=128)
    p.add_argument("--local", type=int, default=4096)
    p.add_argument("--watch-s", type=float, default=5.0)
    p.add_argument("--slack-mib", type=int, default=4)
    a = p.parse_args()
    cu = ctypes.CDLL("libcuda.so.1")
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()

    def meminfo():
        check(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        return free.value, total.value

    ptrs = []
    chunk = 64 * MIB
    while meminfo()[0] > a.headroom_mib * MIB + chunk:
        d = ctypes.c_uint64()
        if cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(chunk)) != 0:
            break
        ptrs.append(d.value)
    free_before, cap = meminfo()
    image = ptx(a.static_mib * MIB, a.local)
    module = ctypes.c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image)), "cuModuleLoadData")
    func = ctypes.c_void_p()
    check(cu.cuModuleGetFunction(ctypes.byref(func), module, b"grow"), "cuModuleGetFunction")
    launch = cu.cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, None, None, None)
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    done = time.monotonic()
    d = ctypes.c_uint64()
    after = cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(2 * MIB))
    if after == 0:
        cu.cuMemFree_v2(d)
    pid = os.getpid()
    samples, charged_after, max_gap = [], None, 0
    while time.monotonic() - done < a.watch_s:
        driver = (capcommon.smi_process_mib() or {}).get(pid)
        used = (cap - meminfo()[0]) // MIB
        t = time.monotonic() - done
        if driver is not None:
            gap = driver - used
            max_gap = max(max_gap, gap)
            samples.append([round(t, 3), driver, used])
            if charged_after is None and gap <= a.slack_mib:
                charged_after = t
        time.sleep(0.02)
    print("RESULT " + json.dumps({
        "cap_mib": cap // MIB,
        "headroom_mib": free_before // MIB,
        "launch": launch,
        "after_alloc": after,
        "charged_after_s": charged_after,
        "max_gap_mib": max_gap,
        "driver_mib": samples[-1][1] if samples else None,
        "slice_used_mib": samples[-1][2] if samples else None,
        "samples": samples[:50],
    }), flush=True)


if __name__ == "__main__":
    main()
