"""Inside a rank: joining the process group, and the loop's one collective per step (StepAgreement)."""

from __future__ import annotations

import os
import re
import sys
from datetime import timedelta

from launcher.config.errors import ConfigError


def in_distributed_launch() -> bool:
    """True inside torchrun / srun + torchrun: the loop runs in this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def avoid_shm_comm_build(device: str) -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory comm op on CPU (~107 s on 2 cores, every fresh machine).

    TorchBackend.__init__ calls build_shm_op(), which builds ShareMemCommBuilder whenever
    deepspeed.ops.__compatible_ops__ says it is compatible (deepspeed/comm/torch.py). That op only
    serves the inference all-reduce path; training collectives go through torch.distributed (gloo).
    The probed dict is cached in the module and edits to it persist, so marking the op incompatible
    before init_distributed makes build_shm_op return None. Proven by tests/train (empty
    TORCH_EXTENSIONS_DIR stays empty).
    """
    if device != "cpu":
        return
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def deepspeed_arch_list(value: str):
    """TORCH_CUDA_ARCH_LIST rewritten so that DeepSpeed's JIT builder can read it, or None when it already can.

    torch takes arch-specific entries such as "9.0a" (sm_90a: Hopper's wgmma / TMA instructions). DeepSpeed
    0.19.8's op_builder/builder.py reads each entry's minor number with int() and fails ("invalid literal for int()
    with base 10: '0a'") when it JIT-builds FusedAdam, which a GPU run's engine does first: seen on the GPU
    image, whose TORCH_CUDA_ARCH_LIST is "9.0a" (bench/gpu/results.md). DeepSpeed's ops use no sm_90a-only
    instruction, so the plain arch ("9.0", "+PTX" kept) builds the same kernels.
    """
    entries = [e.strip() for e in value.replace(" ", ";").split(";") if e.strip()]
    fixed = [re.sub(r"^(\d+\.\d+)[a-z]+", r"\1", e) for e in entries]
    return ";".join(dict.fromkeys(fixed)) if fixed != entries else None


def readable_arch_list_for_deepspeed() -> None:
    """Rewrite this process's TORCH_CUDA_ARCH_LIST as deepspeed_arch_list says, where it must be; before DeepSpeed
    JIT-builds an op (a GPU rank's engine, FusedAdam)."""
    if (arch_list := deepspeed_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST", ""))) is not None:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list


def init_distributed(layout, timeout_s: int) -> tuple[int, int, int]:
    """Join the process group (gloo on CPU, nccl on GPUs). Returns (rank, world size, local rank)."""
    import deepspeed
    import torch

    avoid_shm_comm_build(layout.device)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if world != layout.world_size:
        raise ConfigError("cluster.gpus_per_node", layout.gpus_per_node,
                          f"the launch started {world} ranks but cluster.nodes x cluster.gpus_per_node = {layout.world_size}",
                          "launch as many ranks as the config describes (launcher train / launcher submit do)")
    if layout.device == "cuda":
        torch.cuda.set_device(local_rank)
    apply_default_group_timeout(timeout_s)
    deepspeed.init_distributed(dist_backend="nccl" if layout.device == "cuda" else "gloo",
                               timeout=timedelta(seconds=timeout_s), verbose=False)
    return rank, world, local_rank


def leave_rank(rc: int = 0):
    """End a rank whose results are already on disk: tear the process group down, then exit without the
    interpreter's own teardown.

    Destroying the group here rather than at interpreter exit, because gloo's threads were seen to abort a rank
    that had finished ("terminate called without an active exception", SIGABRT). Even after destroying it, a
    finished rank was still seen to abort the same way in C++ static destructors at interpreter exit: once in well
    over 100 `launcher train` launches (2026-11-23), and in CI on 2026-11-29 in tests/parallel/build_memory_driver.py
    (ZeRO-3 on 4 ranks), after every rank had printed its result. A torchrun whose rank dies by a signal fails the
    whole launch, so every rank entry point (the loop's, calibrate's, the test and bench drivers') leaves through here
    once its files are written and closed: os._exit skips atexit handlers and buffered streams, so flush first.
    """
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 -- the rank's result is recorded; teardown must not change it
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def apply_default_group_timeout(timeout_s: int) -> None:
    """Make train.dist_timeout_s the timeout of every process group, not only the world group.

    init_process_group(timeout=...) sets the world group's timeout only. Every group created later with
    new_group(timeout=None) -- DeepSpeed's data-parallel, ZeRO and pipeline groups (deepspeed/comm/torch.py
    new_group, deepspeed/utils/groups.py) -- gets torch's module default instead
    (torch/distributed/distributed_c10d.py `_get_default_timeout`: 30 min for gloo, 10 min for nccl).
    Measured here: with one of two CPU ranks SIGSTOPped, the other waited in ZeRO's gradient all-reduce
    for more than 10 minutes with dist_timeout_s=20. `_get_default_timeout` reads these module globals
    at call time, so setting them before DeepSpeed builds its groups is enough.
    """
    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = timedelta(seconds=timeout_s)
    distributed_c10d.default_pg_nccl_timeout = timedelta(seconds=timeout_s)


class StepAgreement:
    """The loop's one collective per step: the mean loss over all ranks, and whether any rank was asked to stop.

    `start(local mean loss)` begins an asynchronous all-reduce of (loss, preemption flag); `.wait()` on its
    result gives (global mean loss, stop). train_step starts it right after the last forward and waits just
    before the optimizer step, so the all-reduce runs during the backward instead of after it: blocking on
    it there took ~1% of rank 0's wall time on 2 CPU ranks, mostly waiting for the other rank to finish its
    backward (bench/train_overhead.py, rank-0 profile). Every rank reads the same sum, so all decide alike
    (veto the update, stop for preemption). NaN and inf survive the sum.
    """

    def __init__(self, world: int, stop_requested):
        self.world = world
        self.stop_requested = stop_requested  # () -> bool: this rank got SIGUSR1/SIGTERM

    def start(self, local_loss) -> "StepAgreement.Pending":
        import torch
        import torch.distributed as dist

        local_loss = local_loss.detach().to(torch.float64).reshape(1)
        flag = torch.ones_like(local_loss) if self.stop_requested() else torch.zeros_like(local_loss)
        values = torch.cat([local_loss, flag])
        return self.Pending(dist.all_reduce(values, async_op=True), values, self.world)

    class Pending:
        def __init__(self, work, values, world: int):
            self.work, self.values, self.world = work, values, world

        def wait(self) -> tuple[float, bool]:
            self.work.wait()
            loss_sum, stops = self.values.tolist()
            return loss_sum / self.world, stops > 0
