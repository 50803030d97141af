"""Where the DP2 ZeRO-0 step's time goes beyond the model's own compute (diagnostic for bench/steptime; not a test).

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/layers.py [--profile bench/steptime/profile.yaml]

Three loops over recipe=tiny's model (launcher's build_model, seeded) and batch shape (8 x 128 tokens per rank),
on 2 CPU ranks at once, each timed per phase (forward, backward, step; median of 24 steps after 6), with the main
thread's CPU time beside the wall time (what the rank computed, apart from waiting in a collective or for a core):
  1. plain       the transformers model and torch AdamW, no communication: the compute the per-operator
                 model (launcher/plan/steptime.py) describes;
  2. deepspeed   the same model under deepspeed.initialize with the launcher's own DeepSpeed JSON for
                 `recipe=tiny parallel.zero_stage=0` (gradient all-reduce, clipping, LR schedule), the ranks
                 free-running as in training;
  3. launcher    `launcher train recipe=tiny parallel.zero_stage=0` itself, its end-of-run median step;
and `launcher plan` of the same layout with --profile, its breakdown. Then the element-wise rates the plan's
memory term stands for, by tensor size, on one rank: a copy into a preallocated tensor (what calibrate's
memory_gbps measures), an out-of-place multiply (a fresh output, as every op of a step allocates one), SiLU,
and log-softmax forward + backward over 2,048-wide rows (the loss).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import LAUNCHER, MEASURE, REPO, diagnostic_args, on_two_ranks  # noqa: E402

LAYOUT = ["recipe=tiny", "cluster.gpus_per_node=2", "parallel.zero_stage=0"]


def _phases(step_fns, n: int = 30, warm: int = 6) -> dict:
    """Median phase times; the ranks run freely, as in training (no barrier between steps: a barrier outside the
    timed span would hide the wait for the slower rank, which a step pays at its collectives)."""
    fwd, bwd, stp = step_fns
    rows, cpu = [], []
    for i in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        loss = fwd()
        t1, c1 = time.perf_counter(), time.thread_time()
        bwd(loss)
        t2, c2 = time.perf_counter(), time.thread_time()
        stp()
        t3, c3 = time.perf_counter(), time.thread_time()
        if i >= warm:
            rows.append((t1 - t0, t2 - t1, t3 - t2))
            cpu.append((c1 - c0, c2 - c1, c3 - c2))
    def medians(prefix: str, table: list) -> dict:
        med = statistics.median
        return {f"{prefix}forward_ms": med(r[0] for r in table) * 1e3, f"{prefix}backward_ms": med(r[1] for r in table) * 1e3,
                f"{prefix}step_ms": med(r[2] for r in table) * 1e3, f"{prefix}total_ms": med(sum(r) for r in table) * 1e3}
    # cpu_*: the main thread's own CPU time, what it computed, apart from waiting (a collective, the other rank) and
    # from being descheduled
    return {**medians("", rows), **medians("cpu_", cpu)}


def rank_side(out: str) -> None:
    import launcher  # noqa: F401  (first, as a rank imports it: keeps DeepSpeed's autotuner imports lean)
    import deepspeed
    import torch
    import torch.distributed as dist

    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime.distributed import avoid_shm_comm_build
    from launcher.runtime.model import build_model

    torch.set_num_threads(1)
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = compose(LAYOUT)
    layout = resolve_layout(cfg)
    ids = torch.randint(0, cfg.model.vocab_size, (cfg.batch.micro_batch_size, cfg.data.seq_length))
    result = {}

    model = build_model(cfg.model, seed=0, vocab_size=cfg.model.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def plain_step():
        opt.step()
        opt.zero_grad(set_to_none=True)
    result["plain"] = _phases((lambda: model(input_ids=ids, labels=ids).loss, lambda l: l.backward(), plain_step))

    model = build_model(cfg.model, seed=0, vocab_size=cfg.model.vocab_size)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=build_deepspeed_config(cfg, layout))
    result["deepspeed"] = _phases((lambda: engine(input_ids=ids, labels=ids).loss, engine.backward, engine.step))
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(result))
    dist.barrier()


def elementwise_rates() -> list:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)

    def t(fn, n=20):
        fn()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    rows = []
    for mib in (0.5, 2, 8, 64):
        n = int(mib * (1 << 20)) // 4
        a, b, dst = torch.ones(n), torch.ones(n), torch.empty(n)
        logits = torch.randn(n // 2048, 2048, requires_grad=True)

        def lsm():
            torch.log_softmax(logits, -1).sum().backward()
        rows.append({"tensor_mib": mib, "copy_into_gbps": 2 * n * 4 / t(lambda: dst.copy_(a)) / 1e9,
                     "mul_fresh_gbps": 3 * n * 4 / t(lambda: a * b) / 1e9,
                     "silu_gbps": 2 * n * 4 / t(lambda: F.silu(a)) / 1e9,
                     "log_softmax_fwd_bwd_ms": t(lsm, 8) * 1e3})
    return rows


def main() -> None:
    args = diagnostic_args()
    if args.rank_side:
        return rank_side(args.rank_side)
    loops = on_two_ranks(__file__)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([LAUNCHER, "train", *LAYOUT, f"runs_dir={tmp}", "run_name=l", "train.steps=40", *MEASURE],
                       cwd=REPO, check=True, capture_output=True)
        records = [json.loads(line) for line in (Path(tmp) / "l" / "metrics.jsonl").read_text().splitlines()]
        summary = next(r for r in records if r.get("kind") == "summary")
    plan = json.loads(subprocess.run([LAUNCHER, "plan", *LAYOUT, f"cluster.profile={args.profile}", "--json"], cwd=REPO,
                                     check=True, capture_output=True, text=True).stdout)
    for name, r in loops.items():
        print(f"{name:10s} forward {r['forward_ms']:6.1f}  backward {r['backward_ms']:6.1f}  step {r['step_ms']:5.1f}  "
              f"total {r['total_ms']:6.1f} ms; main thread's CPU {r['cpu_forward_ms']:6.1f} / {r['cpu_backward_ms']:6.1f} / "
              f"{r['cpu_step_ms']:5.1f} = {r['cpu_total_ms']:6.1f} ms")
    print(f"launcher   median step {summary['step_time_s'] * 1e3:6.1f} ms (40 steps)")
    bd = {k: round(v * 1e3, 1) for k, v in plan["step_time_breakdown_s"].items() if v}
    print(f"plan       {plan['step_time_s'] * 1e3:6.1f} ms {bd}")
    for r in elementwise_rates():
        print(f"{r['tensor_mib']:5.1f} MiB: copy_ into {r['copy_into_gbps']:5.1f} GB/s, a*b fresh {r['mul_fresh_gbps']:5.1f} GB/s, "
              f"silu {r['silu_gbps']:5.1f} GB/s, log_softmax fwd+bwd {r['log_softmax_fwd_bwd_ms']:7.2f} ms")


if __name__ == "__main__":
    main()
