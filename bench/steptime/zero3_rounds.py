"""How much calibrate's ZeRO-3 hook probe moves between back-to-back timings, over every rank (as calibrate runs it)
and with each rank alone in its groups (diagnostic for bench/steptime; not a test).

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/zero3_rounds.py [--rounds 5]

On 2 ranks at once, `--rounds` times, launcher/runtime/calibrate.py _zero3_hooks: a DeepSpeed ZeRO-3 engine over 8
and 40 small Linear units (bare and wrapped) against the same units plain, at 1 and 3 micro-batches a step; once
over the world group, once with each rank its own data-parallel group (_AloneGroups: no collective). One line a
timing (cost per unit, ms), then each figure's range and the split of the median (zero3_split).

2026-12-01, 20:36 UTC, 5 rounds (bench/steptime/results.md): over the world a Linear at 1 micro-batch cost 0.82-1.41
ms, alone 0.23-0.33 ms. Most of the hook figure on CPU ranks is the collectives of DeepSpeed's ZeRO-3 gradient
path, so its spread is the collectives' and calibrate keeps the world group.
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
    gather_to_rank0(out, timings)


def main() -> None:
    args = rounds_args()
    if args.rank_side:
        return rank_side(args.rank_side, args.rounds)
    from launcher.runtime.calibrate import zero3_split

    timings = on_two_ranks(__file__, ["--rounds", str(args.rounds)])[0]
    for name, rounds in timings.items():
        for i, slope in enumerate(rounds, 1):
            print(f"{name} timing {i}: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in slope.items()) + " ms a unit")
        for k in rounds[0]:
            vals = [r[k] for r in rounds]
            print(f"  {name} {k}: {min(vals) * 1e3:.2f}-{max(vals) * 1e3:.2f} ms ({max(vals) / min(vals):.2f}x)")
        print(f"  {name} split of the median: "
              + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in zero3_split(rounds).items()))


if __name__ == "__main__":
    main()
