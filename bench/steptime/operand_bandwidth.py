"""Diagnostic, not the benchmark: the memory bandwidth recipe=tiny's element-wise operators see, by operand size, and
what the committed bench/steptime runs would read with it.

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/operand_bandwidth.py

`launcher calibrate` times one 64 MiB copy on CPU ranks and the plan charges every element-wise operator's bytes at
that rate (launcher/plan/steptime.py memory_s). recipe=tiny's activations are 0.5 MiB ([8, 128, 128] fp32) and
1.4 MiB (the SwiGLU width, 352), so they stay in the caches, where a copy runs several times faster. This script
(1) on 2 processes at once, as 2 ranks share the box: times a copy by buffer size and the runtime's own eager
operators at tiny's shapes (median of repeats, bytes read + written over the time); (2) re-predicts every run of
results.json (each pass with its own calibration, pass_profiles) twice: as committed, and with memory_s charging each
operator's bytes at the copy rate of its own size (the traffic per kernel, read off (1)'s table, log-interpolated).
The variant replaces memory_s in the imported module only; nothing is fitted. results.md ("Element-wise rates by
operand size") quotes its output.
"""
from __future__ import annotations

import contextlib
import io
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
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


def _probe(queue) -> None:
    import torch
    import torch.nn.functional as F

    from launcher.runtime.cpualloc import recycle_step_buffers
    torch.set_num_threads(1)
    assert recycle_step_buffers("cpu", 0), "not started under CPU_MALLOC_ENV"   # the step's malloc settings
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
    turn = iter(range(10 ** 9))
    cold = {"silu(a) * b, ffn width": _median_rate(lambda: (lambda p: F.silu(p[0]) * p[1])(ring[next(turn) % 40]),
                                                   5 * a.numel() * 4, 200),
            "a * b, ffn width": _median_rate(lambda: (lambda p: p[0] * p[1])(ring[next(turn) % 40]), 3 * a.numel() * 4, 200),
            "x + y, hidden width": _median_rate(lambda: (lambda p: p[0] + p[1])(hring[next(turn) % 40]),
                                                3 * x.numel() * 4, 200)}
    queue.put({"copy": copy, "ops": ops, "cold": cold})


def probe() -> list:
    from launcher.protocol import CPU_MALLOC_ENV
    os.environ.update(CPU_MALLOC_ENV)        # glibc reads it at start: the ranks' allocator, as launcher train starts them
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_probe, args=(queue,)) for _ in range(2)]
    for p in procs:
        p.start()
    out = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return out


def repredict(table: list) -> None:
    from launcher.cli import main
    from launcher.plan import steptime
    from launcher.plan.profile import interpolate

    committed = steptime.memory_s
    by_size = {"on": False}

    def memory_s(nbytes, kernels, prof):
        if not by_size["on"] or kernels <= 0:
            return committed(nbytes, kernels, prof)
        return nbytes / (interpolate(table, nbytes / kernels) * 1e9) + kernels * prof.kernel_overhead_s
    steptime.memory_s = memory_s

    doc = json.loads((HERE / "results.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        for i, profiles in enumerate(doc["pass_profiles"]):
            for ranks, text in profiles.items():
                (Path(tmp) / f"{i}-{ranks}.yaml").write_text(text)
        for variant in ("as committed (64 MiB copy rate)", "by operand size"):
            by_size["on"] = variant != "as committed (64 MiB copy rate)"
            ratios = []
            for i in range(len(doc["pass_profiles"])):
                for r in doc["results"]:
                    args = [a for a in r["command"].split()[2:] if not a.startswith("cluster.profile=")]
                    buf = io.StringIO()
                    with contextlib.redirect_stdout(buf):
                        main(["plan", *args, f"cluster.profile={tmp}/{i}-{r['ranks']}.yaml", "--json"])
                    ratios.append((r["layout"], i, r["repeats_measured_s"][i] / json.loads(buf.getvalue())["step_time_s"]))
            inside = sum(abs(x - 1) <= 0.15 for _, _, x in ratios)
            print(f"{variant}: {inside} of {len(ratios)} within 15%; measured / predicted "
                  + ", ".join(f"{name} {x:.2f}" for name, _, x in ratios))


def main() -> None:
    ranks = probe()
    for k, r in enumerate(ranks):
        print(f"process {k}: copy " + ", ".join(f"{b / 2 / MiB:g} MiB {g:.0f} GB/s" for b, g in r["copy"]))
        print(f"process {k}: tiny's operators " + ", ".join(f"{n} {g:.0f} GB/s" for n, g in r["ops"].items()))
        print(f"process {k}: the same, operands out of cache " + ", ".join(f"{n} {g:.0f} GB/s" for n, g in r["cold"].items()))
    table = [[b, statistics.median(r["copy"][i][1] for r in ranks)] for i, (b, _) in enumerate(ranks[0]["copy"])]
    repredict(table)


if __name__ == "__main__":
    sys.exit(main())
