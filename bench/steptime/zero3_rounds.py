"""How much calibrate's ZeRO-3 hook probe moves between back-to-back timings, over every rank (as calibrate runs it)
and with each rank alone in its groups (diagnostic for bench/steptime; not a test).

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/zero3_rounds.py [--rounds 5]

On 2 ranks at once, `--rounds` times, launcher/runtime/calibrate.py _zero3_hooks: a DeepSpeed ZeRO-3 engine over 8
and 40 small Linear units (bare and wrapped) against the same units plain, at 1 and 3 micro-batches a step; once
over the world group, once with each rank its own data-parallel group (_AloneGroups: no collective). One line a
timing (cost per unit, ms), then each figure's range and the split of the median (zero3_split); then
deepspeed.comm's collectives counted per step of the same engine over the world at 8 and 40 units.

2026-12-01, 20:36 UTC, 5 rounds (bench/steptime/results.md): over the world a Linear at 1 micro-batch cost 0.82-1.41
ms, alone 0.23-0.33 ms. The difference is one all-gather a parameter tensor a step (DeepSpeed gathers each
persistent parameter back after the optimizer step: 8 and 40 all_gather_into_tensor calls a step for 8 and 40
units, one reduce-scatter and one all-reduce besides), so most of the hook figure on CPU ranks is gloo collectives
with their heavy-tailed waits, and calibrate keeps the world group, where the plan's count of synchronisations
leaves them out.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import gather_to_rank0, on_two_ranks, probe_rank, rounds_args  # noqa: E402


def rank_side(out: str, rounds: int) -> None:
    C, dist, dev, sync, agree = probe_rank()
    rank, world = dist.get_rank(), dist.get_world_size()
    alone = [dist.new_group([r]) for r in range(world)]     # every rank creates every group
    mpus = {"world": None, "alone": C._AloneGroups(alone[rank], rank)}
    timings = {name: [] for name in mpus}
    for _ in range(rounds):
        for name, mpu in mpus.items():
            timings[name].append(C._zero3_hooks(dev, sync, agree, 1.0, mpu=mpu)[1])
    gather_to_rank0(out, {"timings": timings, "collectives": collectives_per_step()})


def collectives_per_step() -> dict:
    """{K: {collective: calls a step}}: deepspeed.comm's collectives counted over 5 steps of the probe's ZeRO-3 engine
    (K bias-free Linear(32, 32), world group, 1 micro-batch), after 2 untimed steps."""
    import collections

    import deepspeed
    import deepspeed.comm as dcomm
    import torch
    from torch import nn

    from launcher.deepspeed_config import zero_optimization_base

    counts = collections.Counter()
    names = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_fn", "allgather_fn", "broadcast", "all_to_all_single")
    for name in names:
        def counted(*a, _orig=getattr(dcomm, name), _name=name, **k):
            counts[_name] += 1
            return _orig(*a, **k)
        setattr(dcomm, name, counted)
    out = {}
    for k in (8, 40):
        model = nn.Sequential(*[nn.Linear(32, 32, bias=False) for _ in range(k)])
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3), config={
            "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
            "zero_optimization": zero_optimization_base(3, "cpu"), "zero_allow_untested_optimizer": True})
        x = torch.randn(4, 32)
        for i in range(7):
            if i == 2:
                counts.clear()
            engine.backward(engine(x).sum())
            engine.step()
        out[k] = {name: n / 5 for name, n in counts.items()}
        engine.destroy()
    return out


def main() -> None:
    args = rounds_args()
    if args.rank_side:
        return rank_side(args.rank_side, args.rounds)
    from launcher.runtime.calibrate import zero3_split

    got = on_two_ranks(__file__, ["--rounds", str(args.rounds)])[0]
    timings = got["timings"]
    for name, rounds in timings.items():
        for i, slope in enumerate(rounds, 1):
            print(f"{name} timing {i}: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in slope.items()) + " ms a unit")
        for k in rounds[0]:
            vals = [r[k] for r in rounds]
            print(f"  {name} {k}: {min(vals) * 1e3:.2f}-{max(vals) * 1e3:.2f} ms ({max(vals) / min(vals):.2f}x)")
        print(f"  {name} split of the median: "
              + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in zero3_split(rounds).items()))

    for k, calls in got["collectives"].items():
        print(f"world, {k} units: collectives a step " + ", ".join(f"{n} {c:g}" for n, c in calls.items()))


if __name__ == "__main__":
    main()
