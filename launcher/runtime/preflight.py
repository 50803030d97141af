"""The per-node preflight of an sbatch job: `srun --ntasks-per-node=1 python -m launcher.runtime.preflight`.

One task per node checks, in order, what most often breaks a large job in its first minutes: torch imports,
the node shows the GPUs the layout needs, and a small all-reduce across all nodes completes (NCCL on GPUs,
gloo on CPU ranks) within a timeout. A failure prints one line naming the node and exits 1; the script's
`srun --kill-on-bad-exit=1` then ends the other nodes' tasks and the job stops before training starts.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta


def refuse_missing_local_gpus(cfg, layout) -> None:
    """`launcher train` on this machine: the GPUs the layout starts ranks on must be here, before any rank starts.

    Without this, a GPU cluster config (the default is cluster=a100-80gb) on a machine without those GPUs
    started every rank, and each died in torch.cuda.set_device (`_cuda_setDevice`) after its imports, about
    95 s later. torch is imported only for GPU layouts (`launcher train` imports it later anyway); CPU layouts
    and `launcher plan` / `show` do not pay for it.
    """
    from launcher.config.errors import ConfigError

    if layout.device != "cuda":
        return
    import torch

    found = torch.cuda.device_count()
    if found >= layout.gpus_per_node:
        return
    raise ConfigError(
        "cluster.gpu", cfg.cluster.gpu,
        f"cluster={cfg.cluster.name} starts cluster.gpus_per_node={layout.gpus_per_node} GPU ranks on this machine, "
        f"and torch sees {found} GPUs here (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}, "
        f"torch {torch.__version__}{', a CPU-only build' if torch.version.cuda is None else ''})",
        "train on CPU ranks here with cluster=cpu (e.g. `launcher train recipe=tiny`, or add cluster=cpu), "
        f"set cluster.gpus_per_node={found} if that many GPUs are enough" if found else
        "train on CPU ranks here with cluster=cpu (e.g. `launcher train recipe=tiny`, or add cluster=cpu), "
        "or submit the job to the GPU cluster with `launcher submit`")


# bf16 on CPU ranks is only worth it where torch has a fast bf16 matmul: oneDNN's, which torch uses where the CPU has
# AVX-512 (BF16 / AMX run it natively). Elsewhere torch takes its reference kernel: on the AVX2-only EPYC of 2026-12-02
# a side-512 bf16 GEMM ran at 1.1 GFLOP/s against fp32's 52 (one thread), and with oneDNN off on an AMX Xeon a side-256
# bf16 GEMM ran at 2.2 against fp32's 120. A run is correct either way, so this warns rather than refuses; the rule is
# the rate measured here, not a CPU flag, so it holds for whatever kernel the installed torch picks.
BF16_SLOWER_THAN_FP32 = 2.0  # warn when bf16 GEMMs run at under half fp32's rate: precision=fp32 is then faster


def _gemm_gflops(torch, dtype, side: int = 256, repeats: int = 3) -> float:
    """The best of `repeats` side x side x side matmuls in `dtype` on one thread, in GFLOP/s (2 n^3 FLOPs).

    One thread, whatever the process runs with: the warning compares two kernels, and a multi-threaded matmul of
    ~0.3 ms waits whenever one of its threads is not scheduled. On a 2-core box that CI's test workers were loading
    (2026-12-03) fp32 on 2 threads read 2.4-9.0 GFLOP/s in most of ten runs a minute apart (best of 3, and of as many
    as fit in 50 ms), once 199, and bf16 0.7-1.4, so the ratio fell to ~2 and the warning nearly did not fire; on
    one thread the same runs read fp32 98-127 and bf16 0.86-1.3 every time."""
    a, b = torch.randn(side, side).to(dtype), torch.randn(side, side).to(dtype)
    best = float("inf")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            a @ b  # first call: oneDNN picks and caches its kernel
            for _ in range(repeats):
                t0 = time.perf_counter()
                a @ b
                best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return 2 * side ** 3 / max(best, 1e-9) / 1e9


def slow_cpu_bf16_warning(layout) -> str | None:
    """CPU ranks asked to train in bf16, where this CPU runs bf16 GEMMs at under 1 / BF16_SLOWER_THAN_FP32 of fp32's
    rate: one paragraph with the two rates measured now (0.1-0.2 s on such a CPU, a few ms where bf16 is fast), or None.
    GPU ranks and fp32 runs measure nothing."""
    if layout.device != "cpu" or layout.dtype != "bf16":
        return None
    import torch

    fp32, bf16 = _gemm_gflops(torch, torch.float32), _gemm_gflops(torch, torch.bfloat16)
    if bf16 * BF16_SLOWER_THAN_FP32 >= fp32:
        return None
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported() and torch.backends.mkldnn.enabled
    return (f"precision.dtype=bf16 on CPU ranks, and bf16 matmuls are {fp32 / bf16:.0f}x slower than fp32 on this CPU: "
            f"a 256 x 256 x 256 matmul measured now on rank 0 ran at {bf16:.1f} GFLOP/s in bf16 against {fp32:.1f} in "
            f"fp32 (one thread each; oneDNN's bf16 path is "
            f"{'on' if native else 'off: torch takes it only on CPUs with AVX-512, with oneDNN enabled'}). The run trains correctly, "
            f"at the bf16 rate; precision=fp32 (recipe=tiny's) trains these ranks faster, or train bf16 on a CPU with "
            f"AVX-512 (BF16 / AMX) or on GPUs.")


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def fail(stage: str, detail: str) -> int:
    print(f"preflight FAILED on node {node_name()} ({stage}): {detail}", file=sys.stderr, flush=True)
    return 1


def check(device: str, gpus_per_node: int, port: int, timeout_s: int) -> int:
    t0 = time.perf_counter()
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # a broken site environment: the most common first-minute failure
        return fail("torch import", f"{type(exc).__name__}: {exc}")
    if device == "cuda":
        found = torch.cuda.device_count()
        if found < gpus_per_node:
            return fail("GPU count", f"torch sees {found} GPUs, the layout needs cluster.gpus_per_node={gpus_per_node} "
                                     f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], port, world, is_master=rank == 0,
                              timeout=timedelta(seconds=timeout_s))
        backend = "nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
        tensor_device = "cuda:0" if device == "cuda" else "cpu"
        if device == "cuda":
            torch.cuda.set_device(0)
        t = torch.ones(1024, device=tensor_device) * (rank + 1)
        dist.all_reduce(t)
        expected = world * (world + 1) / 2
        if float(t[0]) != expected:
            return fail("all-reduce", f"got {float(t[0])}, expected {expected} over {world} nodes")
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:
        return fail(f"all-reduce over {world} nodes via {os.environ['MASTER_ADDR']}:{port}", f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    print(f"preflight ok on node {node_name()}: torch {torch.__version__}, "
          f"{'%d GPUs' % torch.cuda.device_count() if device == 'cuda' else 'CPU'}, "
          f"all-reduce over {world} nodes, {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.runtime.preflight", description=__doc__)
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--port", type=int, required=True, help="TCP port on MASTER_ADDR for the check's store")
    p.add_argument("--timeout-s", type=int, default=120, help="give up on the all-reduce after this long")
    args = p.parse_args(argv)
    return check(args.device, args.gpus_per_node, args.port, args.timeout_s)


if __name__ == "__main__":
    from launcher.runtime.distributed import leave_rank

    leave_rank(main())   # every line is printed and flushed; skip the interpreter's teardown (see leave_rank)
