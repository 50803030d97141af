"""The wait for the slower rank in a real training loop, against the profile's straggler fraction (diagnostic for
bench/steptime; not a test).

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/straggler.py [--profile bench/steptime/profile.yaml]

On 2 ranks at once, recipe=tiny's model (launcher's build_model) on its 8 x 128-token micro-batch: forward,
backward, the gradients flattened into one buffer (DeepSpeed ZeRO-0's bucket), an all-reduce of it, AdamW: 40
steps, the first 6 dropped. Every rank stamps when it reaches the all-reduce and when it leaves it (one clock: the
ranks share the machine), so per step:
  compute      each rank's forward + backward + flatten;
  wait         slowest arrival - mean arrival: what the step pays beyond the ranks' mean compute, the quantity
               profile.straggler describes (as a fraction of the mean compute);
  transfer     from the later arrival to the earlier exit: the all-reduce once both are there;
and a bare all-reduce of the same buffer after a barrier. Then the profile's fraction at the same segment length
(launcher/plan/profile.py straggler_fraction), which the plan charges for DP2 ZeRO-0.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import REPO, diagnostic_args, gather_to_rank0, on_two_ranks  # noqa: E402


def rank_side(out: str) -> None:
    import launcher  # noqa: F401
    import torch
    import torch.distributed as dist

    from launcher.config.compose import compose
    from launcher.runtime.model import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    cfg = compose(["recipe=tiny", "cluster.gpus_per_node=2", "parallel.zero_stage=0"])
    ids = torch.randint(0, cfg.model.vocab_size, (cfg.batch.micro_batch_size, cfg.data.seq_length))
    model = build_model(cfg.model, seed=0, vocab_size=cfg.model.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    stamps = []
    for _ in range(40):
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        torch.cat([p.grad.reshape(-1) for p in model.parameters()], out=flat)
        t1 = time.perf_counter()
        dist.all_reduce(flat)
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stamps.append((t0, t1, t2))
    bare = []
    for _ in range(20):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(flat)
        bare.append(time.perf_counter() - t)
    gather_to_rank0(out, {"stamps": stamps, "bare": bare})


def main() -> None:
    args = diagnostic_args()
    if args.rank_side:
        return rank_side(args.rank_side)
    from launcher.plan.profile import load_profile
    from launcher.runtime.calibrate import wait_fraction

    a, b = on_two_ranks(__file__)
    med = statistics.median
    rows = list(zip(a["stamps"], b["stamps"]))[6:]
    compute = [((r0 - s0) + (r1 - s1)) / 2 for (s0, r0, _), (s1, r1, _) in rows]
    wait = [max(r0, r1) - (r0 + r1) / 2 for (_, r0, _), (_, r1, _) in rows]   # per step, for the mean and median in ms
    transfer = [min(e0, e1) - max(r0, r1) for (_, r0, e0), (_, r1, e1) in rows]
    # The fraction as calibrate's probe computes it (mean wait over mean compute), from each rank's own stamps.
    ranks = list(zip(*rows))
    mean_c, frac = wait_fraction([[r - s for s, r, _ in rank] for rank in ranks],
                                 [[r for _, r, _ in rank] for rank in ranks], 2)
    planned = load_profile(str(REPO / args.profile)).straggler_fraction(2, mean_c)
    print(f"compute (mean of the ranks) median {med(compute) * 1e3:.1f} ms; wait for the slower rank mean "
          f"{statistics.mean(wait) * 1e3:.1f} ms, median {med(wait) * 1e3:.1f} ms = {frac:.1%} of the mean compute; "
          f"all-reduce once both arrive {med(transfer) * 1e3:.1f} ms (bare {med(a['bare']) * 1e3:.1f} ms)")
    print(f"profile {args.profile}: straggler fraction at {mean_c * 1e3:.0f} ms = {planned:.1%}")


if __name__ == "__main__":
    main()
