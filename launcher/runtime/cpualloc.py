"""glibc malloc on CPU ranks: lean while the engine is built, recycling once the steps run.

The ranks start under launcher/protocol.py CPU_MALLOC_ENV (2 arenas, a fixed 4 MiB mmap threshold): a buffer above
4 MiB is mapped fresh and unmapped on free, which keeps the build's transients (ZeRO-3's whole parameters, the
flattening copies) from staying in the heaps. The 0.8B LLaMA as ZeRO-3 x DP4 on 4 CPU ranks peaks at 2.11 GiB a rank
before its first step that way, and at 3.2-3.55 GiB with the step settings below from the start
(bench/build/results.md, "glibc").

In the steps the same policy costs time: every use of a tensor above 4 MiB (the logits, their fp32 log-softmax and
gradients: 8 MiB each for recipe=tiny) is mapped again and zero-filled by the kernel page by page, and glibc gives
back (trims) the top of a heap whenever more than 128 KiB of it is free, so the next step faults those pages in
again. Measured with the ranks' own minor page faults (bench/steptime/breakdown.py, 2026-11-27): TP2 21,500-29,600 a
step, DP2 ZeRO-0 10,900-11,600, at 2.0-2.1 us each on this VM (bench/steptime/pagefault.py), ~58 ms of TP2's step.
So once the engine is built, the rank raises the mmap threshold to 32 MiB (glibc's largest, HEAP_MAX_SIZE / 2 on
64-bit) and the trim threshold to 64 MiB: a step's buffers are reused from the heap the next step (500-1,600 faults
a step; TP2's step 309 ms against 370, the mean of two runs each).

Not under ZeRO-3 where its steps gather a buffer the build's threshold would map, as they gather and free whole
parameters at every layer: the 0.8B ZeRO-3 x DP4 rank's peak after one step went from 2.52-2.54 GiB to 3.22-4.15
GiB with the step settings (freed 16 MiB gathers left between live buffers, where no trim reaches them), against
2.95-2.98 -> 3.10-3.15 GiB for the same model as PP2 x TP2, whose step took 16.0 s instead of 19.5
(bench/build/results.md, "glibc"). Where every parameter ZeRO-3 gathers, all together, stays under that threshold
(zero3_gathered_bytes: one all-gather's flat buffer holds at most all of them), its gathers come from the heaps
under either setting, and the step settings change only the other buffers: recipe=tiny as DP2 ZeRO-3 (2 MiB of
gathered embedding and head) faulted 12,300-13,200 pages a step against ZeRO-1's 1,300-1,800 (bench/steptime
breakdown.py, 2026-12-06), the fp32 logits' 8 MiB tensors mapped afresh every step, ~24 ms at the VM's 2 us a fault.
"""
from __future__ import annotations

import ctypes
import os

from launcher.protocol import CPU_MALLOC_ENV

# mallopt(3) parameters (malloc.h) and the values the steps run with
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
STEP_MMAP_THRESHOLD = 32 << 20
STEP_TRIM_THRESHOLD = 64 << 20


BUILD_MMAP_THRESHOLD = int(CPU_MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"])


def zero3_gathered_bytes(module) -> int:
    """Bytes of every parameter of `module` that DeepSpeed ZeRO-3 gathers (not persistent: over
    stage3_param_persistence_threshold), whole, in the dtype it gathers them in (the parameter's): the most one
    all-gather's flat buffer can hold (partition_parameters.py _all_gather_params coalesces a fetch's parameters)."""
    return sum(p.ds_numel * p.element_size() for p in module.parameters() if not getattr(p, "ds_persist", True))


def recycle_step_buffers(device: str, zero_stage: int, zero3_gathered: int | None = None) -> bool:
    """On a CPU rank started with CPU_MALLOC_ENV's values, switch glibc to the step settings, under ZeRO-3 only where
    everything it gathers (`zero3_gathered`, zero3_gathered_bytes; None: not known) stays under the build's mmap
    threshold; True when it did. A user's own MALLOC_* settings win (nothing changes), as does a libc without
    mallopt."""
    if device != "cpu" or any(os.environ.get(k) != v for k, v in CPU_MALLOC_ENV.items()):
        return False
    if zero_stage >= 3 and (zero3_gathered is None or zero3_gathered >= BUILD_MMAP_THRESHOLD):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt(M_MMAP_THRESHOLD, STEP_MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, STEP_TRIM_THRESHOLD) == 1
