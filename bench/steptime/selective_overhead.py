"""What selective checkpointing (model.checkpoint_mode=selective) costs on one process, beside none and full.

torch's selective checkpoint runs a Python dispatch mode over every aten operator of a checkpointed block, in the
forward (caching the kept outputs) and in the recompute (answering them); the planner charges the recompute as the
forward's element-wise operators plus its Python (launcher/plan/steptime.py, recompute (selective)) and nothing
for the dispatch mode in the forward. This times recipe=tiny's model (fp32, micro-batch 8, seq 128: one DP2 rank's
micro-batch) forward + backward and forward alone, the modes interleaved round by round, and counts the operators
the mode sees per block. A fourth model keeps every operator's output (torch's same mechanism, nothing recomputed):
what the dispatch mode costs by itself.

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/selective_overhead.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.runtime import recompute
    from launcher.runtime.model import build_model
    from launcher.train import maybe_apply_activation_checkpointing

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    models, layout = {}, None
    for mode in ("none", "full", "selective", "keep-all"):
        ov = ["recipe=tiny"] + ([] if mode in ("none", "keep-all") else ["model.activation_checkpointing=true",
                                                                        f"model.checkpoint_mode={mode}"])
        cfg = compose(ov)
        layout = resolve_layout(cfg)
        m = build_model(cfg.model, seed=0, vocab_size=layout.padded_vocab_size)
        maybe_apply_activation_checkpointing(cfg, m)
        if mode == "keep-all":
            keep = lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE  # noqa: E731
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
                "use_reentrant": False, "context_fn": lambda: create_selective_checkpoint_contexts(keep)})
        m.train()
        models[mode] = m
    ids = torch.randint(0, layout.vocab_size, (layout.micro_batch_size, layout.seq_length))

    calls = []
    policy = recompute.policy
    recompute.policy = lambda ctx, op, *a, **k: (calls.append(ctx.is_recompute), policy(ctx, op, *a, **k))[1]

    def step(m):
        m(input_ids=ids, labels=ids).loss.backward()
        m.zero_grad(set_to_none=True)

    for m in models.values():
        step(m)
    forward_ops = calls.count(False) // cfg.model.num_hidden_layers
    recompute_ops = calls.count(True) // cfg.model.num_hidden_layers
    times = {k: [] for k in models}
    forward = {k: [] for k in models}
    for _ in range(args.rounds):
        for k, m in models.items():
            t = time.perf_counter()
            for _ in range(args.iters):
                step(m)
            times[k].append((time.perf_counter() - t) / args.iters * 1e3)
            t = time.perf_counter()
            for _ in range(args.iters):
                m(input_ids=ids, labels=ids).loss.detach()
            forward[k].append((time.perf_counter() - t) / args.iters * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"operators the selective mode sees per block: {forward_ops} in the forward, {recompute_ops} in the recompute")
    for k, v in times.items():
        print(f"{k:9s} step median {med[k]:6.1f} ms (rounds {', '.join(f'{x:.1f}' for x in v)}), "
              f"forward alone {statistics.median(forward[k]):6.1f} ms")
    blocks = cfg.model.num_hidden_layers
    print(f"per block over none: full {(med['full'] - med['none']) / blocks:.2f} ms, "
          f"selective {(med['selective'] - med['none']) / blocks:.2f} ms")


if __name__ == "__main__":
    main()
