"""What the memory drivers (build_memory_driver.py, resume_memory_driver.py) share: reading a rank's RSS and
gathering every rank's record into one JSON file plus one printed line per rank."""

from __future__ import annotations

import json
from typing import Callable

import torch.distributed as dist


def vm(key: str) -> int:
    """VmHWM / VmRSS (or another /proc/self/status field in kB) of this process in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def report_ranks(rec: dict, out_path: str, header: dict, prefix: str, line: Callable[[dict], str] | None) -> None:
    """Gather every rank's `rec`; rank 0 writes {**header, "ranks": [...]} to out_path and, with `line`, prints
    `prefix` then line(record) for each rank on one line. Ends with a barrier so no rank leaves before the file exists."""
    recs = [None] * dist.get_world_size()
    dist.all_gather_object(recs, rec)
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump({**header, "ranks": recs}, f, indent=1)
        if line is not None:
            print(prefix + ", ".join(line(r) for r in recs), flush=True)
    dist.barrier()
