"""PyTorch memory-cap probe for validate.sh (check 2 and 4).

Variants: `default` (the caching allocator over cudaMalloc) and `expandable`
(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which maps memory with cuMemCreate/cuMemMap;
validate.sh sets the variable, this file only reports it). See capcommon.py for the modes.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capcommon  # noqa: E402


class TorchBackend:
    name = "torch"

    def __init__(self, variant):
        import torch

        self.torch = torch
        self.variant = variant
        self.alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if variant == "expandable" and "expandable_segments:True" not in self.alloc_conf:
            raise SystemExit("torch_cap.py: variant expandable needs "
                             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        self.oom_types = (torch.cuda.OutOfMemoryError,)

    def init(self):
        self.torch.zeros(1, device="cuda")  # the context, outside every measured number
        self.torch.cuda.synchronize()

    def alloc(self, nbytes):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")

    def sync(self):
        self.torch.cuda.synchronize()

    def mem_info(self):
        return self.torch.cuda.mem_get_info()

    def reserved(self):
        return self.torch.cuda.memory_reserved()


if __name__ == "__main__":
    sys.exit(capcommon.main(TorchBackend))
