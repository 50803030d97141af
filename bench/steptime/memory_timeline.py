"""Where a CPU rank's memory goes in a step, by the torch profiler's own categories (diagnostic for the plan's
memory on CPU ranks; not a test).

    .venv/bin/python bench/steptime/memory_timeline.py 4 8 16      # recipe=tiny at these micro-batch sizes
    .venv/bin/python bench/steptime/memory_timeline.py --checkpointing 8   # none, the first 1-3 of 4 blocks, all

One process builds recipe=tiny's model as the runtime does (launcher/runtime/model.py), runs one AdamW step to create
the optimizer state, then profiles a second step with profile_memory=True and reads torch's memory timeline
(torch.profiler._memory_profiler.MemoryProfileTimeline: every tensor allocation classed as parameter, optimizer state,
input, temporary, activation, gradient or autograd detail). It prints the live tensor bytes at their peak by class,
beside the plan's per-rank terms for ZeRO-0 at the same micro-batch (`launcher plan --json` memory_per_gpu_bytes,
without the overhead). A rank's peak RSS is this peak plus the process (profile.process_bytes) plus what the
allocator keeps of freed blocks; bench/steptime/results.md has the readings.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

sys.path.insert(0, str(Path(__file__).parent))
from run import HERE, LAUNCHER, REPO  # noqa: E402

from launcher.config.compose import compose  # noqa: E402
from launcher.runtime.model import build_model  # noqa: E402

MIB = 2 ** 20


def live_peak(mb: int, extra: tuple = ()) -> dict:
    cfg = compose(["recipe=tiny", *extra])
    model = build_model(cfg.model, seed=0, vocab_size=2048)
    if cfg.model.activation_checkpointing:
        from launcher.train import maybe_apply_activation_checkpointing

        maybe_apply_activation_checkpointing(cfg, model)
    x = torch.randint(0, 2048, (mb, cfg.data.seq_length))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    # each row: a column torch leaves at 0, then one per category at _CATEGORY_TO_INDEX's index + 1 (torch 2.13)
    at = max(range(len(sizes)), key=lambda i: sum(sizes[i]))
    names = {i + 1: (c.name.lower() if c is not None else "unknown") for c, i in _CATEGORY_TO_INDEX.items()}
    return {"total": sum(sizes[at]), **{names.get(j, f"column {j}"): v for j, v in enumerate(sizes[at]) if v}}


def planned(mb: int, extra: tuple = ()) -> dict:
    out = subprocess.run([LAUNCHER, "plan", "recipe=tiny", *extra, "parallel.zero_stage=0",
                          f"batch.micro_batch_size={mb}", f"batch.global_batch_size={2 * mb}",
                          f"cluster.profile={HERE / 'profile.yaml'}", "--json"],
                         capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout)["memory_per_gpu_bytes"]


# model.checkpoint_blocks against none and every block: the plan counts the recompute's working set (one block's whole
# saved set) only where every block is checkpointed (plan/memory.py _stage_memory).
CHECKPOINTING = {"none": (), **{f"first {n} of 4": ("model.activation_checkpointing=true", f"model.checkpoint_blocks={n}")
                                for n in (1, 2, 3)}, "all 4": ("model.activation_checkpointing=true",)}


def main() -> None:
    if sys.argv[1:2] == ["--checkpointing"]:
        mb = int(sys.argv[2]) if len(sys.argv) > 2 else 8
        for name, extra in CHECKPOINTING.items():
            live, plan = live_peak(mb, extra), planned(mb, extra)
            print(f"micro-batch {mb}, {name} checkpointed: live peak {live['total'] / MIB:.1f} MiB (activation "
                  f"{live.get('activation', 0) / MIB:.1f}, temporary {live.get('temporary', 0) / MIB:.1f}, autograd "
                  f"detail {live.get('autograd_detail', 0) / MIB:.1f}); planned activations {plan['activations'] / MIB:.1f}, "
                  f"without overhead {(plan['params'] + plan['grads'] + plan['optimizer'] + plan['activations']) / MIB:.1f} MiB")
        return
    for mb in [int(a) for a in sys.argv[1:]] or [8]:
        live, plan = live_peak(mb), planned(mb)
        terms = plan["params"] + plan["grads"] + plan["optimizer"] + plan["activations"]
        print(f"micro-batch {mb}: live peak {live['total'] / MIB:.1f} MiB ("
              + ", ".join(f"{k} {v / MIB:.1f}" for k, v in live.items() if k != "total")
              + f"); planned without overhead {terms / MIB:.1f} MiB (activations {plan['activations'] / MIB:.1f})")


if __name__ == "__main__":
    main()
