"""Diagnostic, not the benchmark: the memory bandwidth recipe=tiny's element-wise operators see, by operand size, and
what the committed bench/steptime runs would read with it.

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/operand_bandwidth.py

`launcher calibrate` times one 64 MiB copy on CPU ranks and the plan charges every element-wise operator's bytes at
that rate (launcher/plan/steptime.py memory_s). recipe=tiny's activations are 0.5 MiB ([8, 128, 128] fp32) and
1.4 MiB (the SwiGLU width, 352), so they stay in the caches, where a copy runs several times faster. This script
(1) on 2 CPU ranks at once (run.py on_two_ranks), as a step's ranks share the box: times a copy by buffer size and
the runtime's own eager operators at tiny's shapes (median of repeats, bytes read + written over the time); (2) re-predicts every run of
results.json (each pass with its own calibration, pass_profiles; run.py replan) twice: as committed, and with memory_s charging each
operator's bytes at the copy rate of its own size (the traffic per kernel, read off (1)'s table, log-interpolated).
The variant replaces memory_s in the imported module only; nothing is fitted. results.md ("Element-wise rates by
operand size") quotes its output.
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import HERE, diagnostic_args, gather_to_rank0, on_two_ranks, replan  # noqa: E402

MiB = 1 << 20
COPY_MIB = (0.25, 1, 4, 16, 64)


def _median_rate(fn, nbytes: float, repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times) / 1e9


def rank_side(out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from launcher.runtime.cpualloc import recycle_step_buffers
    torch.set_num_threads(1)
    assert recycle_step_buffers("cpu", 0), "not started under CPU_MALLOC_ENV"   # the step's malloc settings
    dist.init_process_group("gloo")
    dist.barrier()
    copy = []
    for mib in COPY_MIB:
        n = int(mib * MiB) // 4
        src, dst = torch.randn(n), torch.empty(n)
        copy.append([2 * n * 4, _median_rate(lambda: dst.copy_(src), 2 * n * 4, max(10, int(200 / mib)))])
    a, b = torch.randn(8, 128, 352), torch.randn(8, 128, 352)       # recipe=tiny: micro-batch 8, seq 128, ffn 352
    x, y = torch.randn(8, 128, 128), torch.randn(8, 128, 128)       # hidden 128
    logits = torch.randn(1024, 2048)                                # 1,024 tokens x vocab 2,048
    ops = {"silu(a) * b, ffn width": _median_rate(lambda: F.silu(a) * b, 5 * a.numel() * 4, 200),
           "a * b, ffn width": _median_rate(lambda: a * b, 3 * a.numel() * 4, 200),
           "x + y, hidden width": _median_rate(lambda: x + y, 3 * x.numel() * 4, 200),
           "x.pow(2).mean(-1), hidden width": _median_rate(lambda: x.pow(2).mean(-1, keepdim=True), 2 * x.numel() * 4, 200),
           "log_softmax, logits (8 MiB)": _median_rate(lambda: torch.log_softmax(logits, -1), 2 * logits.numel() * 4, 50)}
    # The same operators on operands last touched ~100 MiB ago (a ring of 40 pairs), as a step's backward reads
    # the activations its forward saved: out of the caches.
    ring = [(torch.randn(8, 128, 352), torch.randn(8, 128, 352)) for _ in range(40)]
    hring = [(torch.randn(8, 128, 128), torch.randn(8, 128, 128)) for _ in range(40)]

    def cold_rate(op, pairs, nbytes):
        following = itertools.cycle(pairs).__next__
        return _median_rate(lambda: op(*following()), nbytes, 200)
    cold = {"silu(a) * b, ffn width": cold_rate(lambda p, q: F.silu(p) * q, ring, 5 * a.numel() * 4),
            "a * b, ffn width": cold_rate(lambda p, q: p * q, ring, 3 * a.numel() * 4),
            "x + y, hidden width": cold_rate(lambda p, q: p + q, hring, 3 * x.numel() * 4)}
    gather_to_rank0(out, {"copy": copy, "ops": ops, "cold": cold})


def by_operand_size(table: list):
    """steptime.memory_s charging each kernel's bytes at the copy rate of its own traffic (table: [[bytes, GB/s]])."""
    from launcher.plan.profile import interpolate

    def memory_s(nbytes, kernels, prof):
        if kernels <= 0:
            return nbytes / (prof.memory_gbps * 1e9)
        return nbytes / (interpolate(table, nbytes / kernels) * 1e9) + kernels * prof.kernel_overhead_s
    return memory_s


def main() -> None:
    args = diagnostic_args()
    if args.rank_side:
        return rank_side(args.rank_side)
    from launcher.plan import steptime
    from launcher.protocol import CPU_MALLOC_ENV

    os.environ.update(CPU_MALLOC_ENV)        # glibc reads it at start: the ranks' allocator, as launcher train starts them
    ranks = on_two_ranks(__file__)
    for k, r in enumerate(ranks):
        print(f"rank {k}: copy " + ", ".join(f"{b / 2 / MiB:g} MiB {g:.0f} GB/s" for b, g in r["copy"]))
        print(f"rank {k}: tiny's operators " + ", ".join(f"{n} {g:.0f} GB/s" for n, g in r["ops"].items()))
        print(f"rank {k}: the same, operands out of cache " + ", ".join(f"{n} {g:.0f} GB/s" for n, g in r["cold"].items()))
    table = [[b, statistics.median(r["copy"][i][1] for r in ranks)] for i, (b, _) in enumerate(ranks[0]["copy"])]
    doc = json.loads((HERE / "results.json").read_text())
    print(f"as committed (64 MiB copy rate): {replan(doc)}")
    steptime.memory_s = by_operand_size(table)
    print(f"by operand size: {replan(doc)}")


if __name__ == "__main__":
    main()
