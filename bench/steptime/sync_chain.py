"""What a collective costs a step when compute comes before it, by the length of that compute (diagnostic for
bench/steptime; not a test).

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/sync_chain.py [--profile bench/steptime/profile.yaml]

On 2 ranks at once, a chain like a Ulysses SP2 step's: a segment of compute (L seconds of 128 x 128 matmuls), then
a 256 KiB all_to_all_single (recipe=tiny SP2's q, k, v and output exchanges are 256 KiB), repeated; every rank
stamps where its segment starts, where it reaches the collective and where it leaves it (one clock: the ranks
share the machine). Per segment length:
  wait        mean over ranks of (last arrival - own arrival): what the plan's straggler term charges, as a
              fraction of the mean segment;
  transfer    mean over ranks of (own exit - last arrival): the collective once both are there, which the plan
              charges at the profile's all_to_all link.
Then calibrate's straggler probe as it was before 2026-11-28 (segment durations) beside the arrival stamps it uses
now, on its own block-like unit (launcher/runtime/calibrate.py _straggler), and the profile's figures.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import diagnostic_args, gather_to_rank0, on_two_ranks  # noqa: E402

CHAIN_SEGMENTS_S = (0.0002, 0.001, 0.005, 0.02)
PROBE_SEGMENTS_S = (0.005, 0.02, 0.06, 0.15)
A2A_BYTES = 256 << 10


def rank_side(out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    send = torch.ones(A2A_BYTES // 4)
    recv = torch.empty_like(send)

    def mms(k):
        for _ in range(k):
            torch.mm(a, b)

    def agreed(x: float) -> float:      # the same loop counts on both ranks, so neither leaves early
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    t0 = time.perf_counter()
    mms(300)
    mm_s = agreed((time.perf_counter() - t0) / 300)
    chain = []
    for target in CHAIN_SEGMENTS_S:
        k, n = max(1, round(target / mm_s)), max(30, int(1.5 / (target + 0.001)))
        dist.barrier()
        stamps = []
        for _ in range(n):
            s0 = time.perf_counter()
            mms(k)
            s1 = time.perf_counter()
            dist.all_to_all_single(recv, send)
            stamps.append((s0, s1, time.perf_counter()))
        chain.append({"target_s": target, "stamps": stamps[3:]})

    # calibrate's straggler probe, its unit and loop (launcher/runtime/calibrate.py _straggler), both readings
    x = torch.randn(512, 128)
    w1, w2 = torch.randn(512, 128), torch.randn(128, 512)

    def unit():
        return F.linear(F.silu(F.linear(x, w1)), w2) + x
    t0 = time.perf_counter()
    for _ in range(20):
        unit()
    unit_s = agreed((time.perf_counter() - t0) / 20)
    go = torch.zeros(1)
    probe = []
    for target in PROBE_SEGMENTS_S:
        units, repeats = max(1, round(target / unit_s)), max(8, min(100, round(1.5 / target)))
        rows = []
        for i in range(repeats + 1):
            dist.all_reduce(go)
            t0 = time.perf_counter()
            for _ in range(units):
                unit()
            if i:
                rows.append((t0, time.perf_counter()))
        probe.append({"target_s": target, "stamps": rows})
    gather_to_rank0(out, {"chain": chain, "probe": probe})


def main() -> None:
    args = diagnostic_args()
    if args.rank_side:
        return rank_side(args.rank_side)
    from launcher.plan.profile import load_profile
    from launcher.plan.steptime import gather_s
    from launcher.runtime.calibrate import wait_fraction

    prof = load_profile(args.profile)
    r0, r1 = on_two_ranks(__file__)
    mean = statistics.mean
    print(f"chain: compute, then a {A2A_BYTES >> 10} KiB all_to_all_single, 2 ranks; the profile ({args.profile}) "
          f"charges the exchange {gather_s(A2A_BYTES, 2, prof.all_to_all) * 1e3:.2f} ms")
    print("| segment (ms) | calls | wait (ms) | wait / segment | transfer after the last arrival, mean / median (ms) | "
          "the profile's straggler fraction at this segment |")
    print("|---|---|---|---|---|---|")
    for a, b in zip(r0["chain"], r1["chain"]):
        pairs = list(zip(a["stamps"], b["stamps"]))
        seg, frac = wait_fraction([[e - s for s, e, _ in r["stamps"]] for r in (a, b)],
                                  [[e for _, e, _ in r["stamps"]] for r in (a, b)], 2)
        xfer = [(x0 + x1) / 2 - max(e0, e1) for (_, e0, x0), (_, e1, x1) in pairs]
        print(f"| {seg * 1e3:.2f} | {len(pairs)} | {frac * seg * 1e3:.2f} | {frac:.1%} | {mean(xfer) * 1e3:.2f} / "
              f"{statistics.median(xfer) * 1e3:.2f} | {prof.straggler_fraction(2, seg):.1%} |")
    print("\ncalibrate's straggler probe, 2 ranks: (slowest - mean) / mean segment")
    print("| segment (ms) | by segment durations (calibrate until 2026-11-27) | by arrival stamps (calibrate now) |")
    print("|---|---|---|")
    for a, b in zip(r0["probe"], r1["probe"]):
        # calibrate's own arithmetic both ways: the durations read as if they were the arrivals (its old reading)
        durations = [[e - s for s, e in r["stamps"]] for r in (a, b)]
        seg, by_dur = wait_fraction(durations, durations, 2)
        _, by_arr = wait_fraction(durations, [[e for _, e in r["stamps"]] for r in (a, b)], 2)
        print(f"| {seg * 1e3:.1f} | {by_dur:.1%} | {by_arr:.1%} |")


if __name__ == "__main__":
    main()
