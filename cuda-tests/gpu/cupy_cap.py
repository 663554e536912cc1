"""CuPy memory-cap probe for validate.sh (check 3).

Variants: `default` (cupy.cuda.MemoryPool over cudaMalloc) and `async`
(cupy.cuda.MemoryAsyncPool: stream-ordered cudaMallocAsync, i.e. cuMemAllocAsync /
cuMemAllocFromPoolAsync in the driver). See capcommon.py for the modes.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capcommon  # noqa: E402


class CupyBackend:
    name = "cupy"

    def __init__(self, variant):
        import cupy

        self.cupy = cupy
        self.variant = variant
        if variant == "async":
            self.pool = cupy.cuda.MemoryAsyncPool()
        elif variant == "default":
            self.pool = cupy.cuda.MemoryPool()
        else:
            raise SystemExit("cupy_cap.py: unknown variant %r" % variant)
        cupy.cuda.set_allocator(self.pool.malloc)
        # The pool raises OutOfMemoryError; a bare runtime error is accepted only when it is
        # the allocation error (checked in alloc), so nothing else is mistaken for the cap.
        self.oom_types = (cupy.cuda.memory.OutOfMemoryError, _RuntimeOOM)

    def init(self):
        self.cupy.cuda.Device(0).use()
        self.cupy.zeros(1)
        self.sync()

    def alloc(self, nbytes):
        try:
            return self.cupy.empty(nbytes, dtype=self.cupy.uint8)
        except self.cupy.cuda.runtime.CUDARuntimeError as e:
            if "cudaErrorMemoryAllocation" in str(e):
                raise _RuntimeOOM(str(e)) from e
            raise

    def sync(self):
        self.cupy.cuda.get_current_stream().synchronize()
        self.cupy.cuda.Device(0).synchronize()

    def mem_info(self):
        return self.cupy.cuda.runtime.memGetInfo()

    def reserved(self):
        total = getattr(self.pool, "total_bytes", None)
        return total() if total else None


class _RuntimeOOM(Exception):
    """cudaErrorMemoryAllocation raised past the pool."""


if __name__ == "__main__":
    sys.exit(capcommon.main(CupyBackend))
