"""ZeRO-3 in fp32 without a second copy of the weights: `with shared_fp32_master(): deepspeed.initialize(...)`.

DeepSpeed 0.19.8's ZeRO-3 optimizer keeps the optimizer's "fp32 master" partitions apart from the model's own
partitions (`DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions`, runtime/zero/stage3.py 1081-1180). When the
model's partitions already are fp32 on the optimizer's device -- fp32 training, no optimizer offload -- it means to
use them as the master weights and keep no copy (stage3.py 1162-1168, "we don't need another copy of the weights";
DeepSpeed PR #7651, "Deduplicate fp32 weights under torch autocast and ZeRO3"). But it tests
`partition.device == self.device` where `self.device` is the string from `get_accelerator().current_device_name()`
('cpu', 'cuda:0'), and a torch.device never equals a string (torch 2.13: `torch.device("cpu") == "cpu"` is False,
`__eq__` returns NotImplemented). So the branch never runs and every fp32 ZeRO-3 rank holds its partition twice.

Measured on the 0.8B LLaMA of tests/parallel/build_memory_driver.py, ZeRO-3 x DP4 on CPU ranks (P = one rank's fp32
partition, 210.8M elements = 0.785 GiB): peak RSS before the first step 2.89 GiB with the copy (baseline 0.36 +
partition + copy + gradient partition), under 0.7 x the 3.14 GiB model without it (bench/build/results.md, "ZeRO-3").

`shared_fp32_master` makes the comparison DeepSpeed meant for the duration of `_create_fp32_partitions` only (the
device as a torch.device, then the string again). Nothing else changes: with bf16 or fp16 weights, or with the
optimizer offloaded, DeepSpeed's own branches come first and copy as before; the optimizer's step then writes the
fp32 partitions in place and DeepSpeed's copy back into the model's partitions (stage3.py 2858) copies a tensor onto
itself.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def shared_fp32_master():
    import torch
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    real = Stage3._create_fp32_partitions

    def create_fp32_partitions(self):
        as_string = self.device
        if type(as_string) is str:   # not OffloadDeviceEnum.cpu: offloaded, DeepSpeed copies whatever the device says
            self.device = torch.device(as_string)
        try:
            return real(self)
        finally:
            self.device = as_string

    Stage3._create_fp32_partitions = create_fp32_partitions
    try:
        yield
    finally:
        Stage3._create_fp32_partitions = real
