"""Check 11 of validate.sh: the memory the driver places on its own account is priced BEFORE
the call that places it. Runs UNDER the shim (driver API through ctypes, no runtime).

The shim prices a module's static data at its load (refused with CUDA_ERROR_OUT_OF_MEMORY, the
load not made, when it does not fit) and a kernel's local memory (its per-thread local size
past the context's first stack, times SMs times max threads per SM) at the kernel's lookup
(`cuModuleGetFunction`: refused with OUT_OF_MEMORY and the handle taken back when it does not
fit, so the kernel never launches and the driver never grows local memory for it), reserving
it in the slice before the driver places it (docs/architecture.md, "The driver's own
memory"). So, with the slice filled to --headroom-mib below its cap:
* a PTX module with --static-mib of static `__device__` data loads (it fits);
* the lookup of a kernel whose stack frame (--local bytes per thread; by default sized so that
  the local memory of every resident thread is --over-mib more than the slice has left) is
  refused with OUT_OF_MEMORY, and the driver's figure for the process does not grow;
* the lookup of a kernel whose frame is sized to what is left less --spare-mib succeeds, and
  so does its launch, at which the driver places the local memory;
* from the launch's end, for --watch-s seconds, the driver's figure for this process
  (nvidia-smi outside the shim) is compared with what the slice says it uses (cuMemGetInfo
  under the shim): priced before the call, the slice covers the driver from the first sample.
The driver's figure is also sampled after every step, to show it never passed the cap.
Prints one `RESULT {json}` line; evaluate.py `growth` gives the verdict.
"""

import argparse
import ctypes
import json
import os
import time

import capcommon

MIB = 1 << 20
CUDA_ERROR_OUT_OF_MEMORY = 2
CU_LIMIT_STACK_SIZE = 0
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39
CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3


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


def frame_for(bytes_, threads, stack):
    """The per-thread frame (16-byte aligned) whose growth past `stack` over `threads` is
    about `bytes_`."""
    per_thread = stack + max(0, bytes_) // threads
    return max(16, per_thread // 16 * 16)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--headroom-mib", type=int, default=256)
    p.add_argument("--static-mib", type=int, default=128)
    p.add_argument("--local", type=int, default=0,
                   help="frame of the refused kernel, bytes per thread (0: sized by --over-mib)")
    p.add_argument("--over-mib", type=int, default=64)
    p.add_argument("--spare-mib", type=int, default=16)
    p.add_argument("--watch-s", type=float, default=3.0)
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

    def attribute(which):
        v = ctypes.c_int()
        check(cu.cuDeviceGetAttribute(ctypes.byref(v), which, dev), "cuDeviceGetAttribute")
        return v.value

    pid = os.getpid()
    peaks = {}

    def driver_mib(step):
        """The driver's figure for this process (nvidia-smi outside the shim); the largest one
        of each step is kept."""
        mib = (capcommon.smi_process_mib() or {}).get(pid)
        if mib is not None:
            peaks[step] = max(peaks.get(step, 0), mib)
        return mib

    threads = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) * attribute(
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
    stack = ctypes.c_size_t()
    check(cu.cuCtxGetLimit(ctypes.byref(stack), CU_LIMIT_STACK_SIZE), "cuCtxGetLimit")
    stack = stack.value

    ptrs = []
    chunk = 64 * MIB
    while meminfo()[0] > a.headroom_mib * MIB + chunk:
        d = ctypes.c_uint64()
        if cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(chunk)) != 0:
            break
        ptrs.append(d.value)
    free_before, cap = meminfo()
    driver_mib("filled")

    # A module's static data is priced at its load; it fits the headroom.
    data = ctypes.c_void_p()
    load = cu.cuModuleLoadData(ctypes.byref(data), ctypes.c_char_p(ptx(a.static_mib * MIB, 16)))
    left = meminfo()[0]

    # A kernel whose local memory does not fit what is left (its module's few bytes of image
    # are within --over-mib): its lookup is refused, the handle taken back, so it never
    # launches and the driver never grows local memory for it.
    big_frame = a.local or frame_for(left + a.over_mib * MIB, threads, stack)
    big_price = max(0, big_frame - stack) * threads
    deep = ctypes.c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(deep), ctypes.c_char_p(ptx(16, big_frame))),
          "cuModuleLoadData (oversized frame)")
    before_refusal = driver_mib("loaded")
    func = ctypes.c_void_p()
    refused = cu.cuModuleGetFunction(ctypes.byref(func), deep, b"grow")
    after_refusal = driver_mib("refused")

    # A kernel whose local memory fits: looked up, launched, placed by the driver.
    small_frame = frame_for(meminfo()[0] - a.spare_mib * MIB, threads, stack)
    small = ctypes.c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(small), ctypes.c_char_p(ptx(16, small_frame))),
          "cuModuleLoadData (small frame)")
    fits = ctypes.c_void_p()
    lookup = cu.cuModuleGetFunction(ctypes.byref(fits), small, b"grow")
    local_size = ctypes.c_int(-1)
    launch = None
    if lookup == 0:
        cu.cuFuncGetAttribute(ctypes.byref(local_size), CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fits)
        launch = cu.cuLaunchKernel(fits, 1, 1, 1, 32, 1, 1, 0, None, None, None)
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    done = time.monotonic()
    free_after_launch = meminfo()[0]

    samples = []
    while time.monotonic() - done < a.watch_s:
        driver = driver_mib("launched")
        used = (cap - meminfo()[0]) // MIB
        if driver is not None:
            samples.append([round(time.monotonic() - done, 3), driver, used])
        time.sleep(0.05)
    gaps = [driver - used for _, driver, used in samples]
    print("RESULT " + json.dumps({
        "cap_mib": cap // MIB,
        "headroom_mib": free_before // MIB,
        "resident_threads": threads,
        "first_stack_bytes": stack,
        "static_load": load,
        "left_after_load_mib": left // MIB,
        "refused_frame_bytes": big_frame,
        "refused_price_mib": big_price // MIB,
        "refused_lookup": refused,
        "driver_before_refusal_mib": before_refusal,
        "driver_after_refusal_mib": after_refusal,
        "fitting_frame_bytes": small_frame,
        "fitting_local_size": local_size.value,
        "fitting_lookup": lookup,
        "launch": launch,
        "left_after_launch_mib": free_after_launch // MIB,
        "first_gap_mib": gaps[0] if gaps else None,
        "max_gap_mib": max(gaps) if gaps else None,
        "driver_peak_mib": max(peaks.values()) if peaks else None,
        "driver_by_step_mib": peaks,
        "samples": samples[:50],
    }), flush=True)


if __name__ == "__main__":
    main()
