"""How much calibrate's collective and release probes move between back-to-back timings, and what the median over
calibrate's rounds makes of them (diagnostic for bench/steptime; not a test).

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/probe_rounds.py [--rounds 5]

On 2 ranks at once, `--rounds` times in a row, calibrate's own probes (launcher/runtime/calibrate.py): the
all-reduce, all-to-all and Megatron SP's all-gather and reduce-scatter after compute (4 KiB .. 16 MiB), fitted to
latency + bytes / bandwidth as write_profile fits them (the SP pair is not in a profile: xeon-amx-2026-12-05c/
README.md), and the pair's release after 5-150 ms segments, pooled as the plan reads it. One line a timing, then
the fits of the median over the first COMPUTE_ROUNDS timings (what calibrate writes since 2026-12-01) and over
all of them. Until then calibrate kept one timing of each: on a quiet box here (2026-12-01, 19:13 UTC) five
timings fitted the all-to-all's latency at 0.21-0.53 ms and the all-reduce's at 0.75-1.51 ms, and pooled the
release at 1.54-1.89 ms (at the release's budget then, 1.5 s a segment length; a timing here is now one round's,
0.5 s); the SP2 plan charges 64 all-to-alls a step, so 0.3 ms moves it ~20 ms of ~220.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import gather_to_rank0, on_two_ranks, probe_rank, rounds_args  # noqa: E402


def rank_side(out: str, rounds: int) -> None:
    C, dist, dev, sync, agree = probe_rank()
    world = dist.get_world_size()
    node_group, _ = C._node_groups(dist, world, world)
    unit = C._segment_unit(dev, "cpu", sync, dist)
    timings = []
    for _ in range(rounds):
        coll = C._after_compute(dev, "cpu", sync, agree, dist, node_group, all_to_all=True, sequence=True)
        timings.append({"collectives": coll, "release": C._release(dev, "cpu", sync, dist, [world], unit)})
    gather_to_rank0(out, timings)


def fits(coll: dict, release: dict) -> str:
    from launcher.runtime.calibrate import fit_alpha_beta, pooled_release

    a2a_lat, a2a_bw = fit_alpha_beta(coll["all_to_all_after_compute"], 2, ring_factor=False)
    ar_lat, ar_bw = fit_alpha_beta(coll["all_reduce_after_compute"], 2)
    ag_lat, ag_bw = fit_alpha_beta(coll["all_gather_after_compute"], 2, ring_factor=False)
    rs_lat, rs_bw = fit_alpha_beta(coll["reduce_scatter_after_compute"], 2, ring_factor=False)
    pooled = pooled_release(release["2"], "cpu")[0][1]
    tp = 512 << 10     # recipe=tiny TP2's hidden-state tensor: what each SP collective of its steps moves
    at = (f"; at 512 KiB all-reduce {(ar_lat + tp / ar_bw / 1e9) * 1e3:.2f} ms, all-gather "
          f"{(ag_lat + tp / 2 / ag_bw / 1e9) * 1e3:.2f}, reduce-scatter {(rs_lat + tp / 2 / rs_bw / 1e9) * 1e3:.2f}")
    return (f"all-to-all latency {a2a_lat * 1e3:.2f} ms, {a2a_bw:.2f} GB/s; all-reduce latency {ar_lat * 1e3:.2f} ms, "
            f"{ar_bw:.2f} GB/s; SP all-gather {ag_lat * 1e3:.2f} ms, {ag_bw:.2f} GB/s; SP reduce-scatter "
            f"{rs_lat * 1e3:.2f} ms, {rs_bw:.2f} GB/s; release pooled {pooled * 1e3:.2f} ms{at}")


def main() -> None:
    args = rounds_args()
    if args.rank_side:
        return rank_side(args.rank_side, args.rounds)
    from launcher.runtime.calibrate import COMPUTE_ROUNDS, median_rows

    timings = on_two_ranks(__file__, ["--rounds", str(args.rounds)])[0]
    for i, t in enumerate(timings, 1):
        print(f"timing {i}: {fits(t['collectives'], t['release'])}")
    for label, some in ((f"median of the first {COMPUTE_ROUNDS} (calibrate)", timings[:COMPUTE_ROUNDS]),
                        (f"median of all {len(timings)}", timings)):
        print(f"{label}: {fits(median_rows([t['collectives'] for t in some]), median_rows([t['release'] for t in some]))}")
    print("4 KiB all-to-all after compute by timing (ms): "
          + ", ".join(f"{t['collectives']['all_to_all_after_compute'][0][1] * 1e3:.2f}" for t in timings)
          + f"; median {statistics.median(t['collectives']['all_to_all_after_compute'][0][1] for t in timings) * 1e3:.2f}")


if __name__ == "__main__":
    main()
