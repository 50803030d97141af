"""Multi-rank driver for ring-attention context parallelism: `torchrun --nproc_per_node N context_driver.py OUT.json CASE...`.

Each CASE is `name:key=value,...`: Hydra overrides on top of tests/parallel/driver.py's BASE (with `opt=sgd` as
there), run through launcher/parallel/context.py the way `launcher train` runs it (setup_context_parallel as the
`mpu`, the generated DeepSpeed config, context_parallel_loss per micro-batch). For every case every rank also trains
the 1-rank reference (driver.reference_run: the whole global batch, plain torch) and rank 0 writes both loss and
gradient-norm trajectories to OUT.json. Cases of several context degrees share one launch: DeepSpeed's
sequence-parallel groups are module globals, released before each case (parallel_state_sp has the function).
"""

from __future__ import annotations

import gc
import os
import time

import torch
import torch.distributed as dist

from tests.parallel import driver as base

# Long enough that every rank holds several tokens of each of its two chunks at CP4 (64 / 8 = 8).
SEQ = 64


def run_ring(cfg, layout, sgd):
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    from launcher.parallel.context import build_context_parallel_model, context_parallel_loss, setup_context_parallel
    from launcher.plan.rankmap import rank_coord

    cp = layout.context_degree
    parallel_state_sp._release_sequence_parallel_groups()
    mpu = setup_context_parallel(cp)
    model = build_context_parallel_model(cfg.model, base.SEED, layout.padded_vocab_size)
    engine = base.initialize(model, cfg, layout, sgd, mpu=mpu)
    coord = rank_coord(layout, dist.get_rank())
    assert coord.cp == mpu.get_sequence_parallel_rank()
    seen = []  # the positions this rank really embeds
    model.model.embed_tokens.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[1]))
    losses, norms = [], []
    for step in range(base.STEPS):
        micro = []
        batches = base.my_micro_batches(step, layout, coord.dp)
        for j, mb in enumerate(batches):
            loss = context_parallel_loss(engine, mb, coord.cp, cp)
            engine.backward(loss)
            if layout.zero_stage == 0 and j == len(batches) - 1:
                # ZeRO-0 fp32 reports no norm: take it from the reduced gradients the step is about to apply.
                manual_norm = torch.nn.utils.get_total_norm([p.grad for p in engine.module.parameters()]).item()
            engine.step()
            replica = loss.detach().clone()
            dist.all_reduce(replica, group=mpu.get_sequence_parallel_group())  # the CP shares add up to the replica loss
            micro.append(replica)
        avg = torch.stack(micro).mean()
        dist.all_reduce(avg)
        losses.append(avg.item() / dist.get_world_size())
        norms.append(manual_norm if layout.zero_stage == 0 else base.grad_norm(engine))
    info = {"tokens_per_rank": sorted(set(seen)), "cp_rank": coord.cp, "dp_rank": coord.dp,
            "attn_implementation": engine.module.config._attn_implementation, "optimizer": type(engine.optimizer).__name__}
    return engine, losses, norms, info


def run_case(spec: str) -> dict:
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout

    name, rest = spec.split(":", 1)
    kvs = [kv for kv in rest.split(",") if kv]
    sgd = "opt=sgd" in kvs
    kvs = [kv for kv in kvs if kv != "opt=sgd"] + (["optimizer.grad_clip=0"] if sgd else [])
    overrides = base.BASE + [f"data.seq_length={SEQ}", f"cluster.gpus_per_node={dist.get_world_size()}"] + kvs
    cfg = compose(overrides)
    layout = resolve_layout(cfg)
    ref_cfg = compose(overrides + ["parallel.context_degree=1", "cluster.gpus_per_node=1"])
    zero_cfg = base.dsc.build_deepspeed_config(cfg, layout)["zero_optimization"]
    t0 = time.perf_counter()
    engine, losses, norms, info = run_ring(cfg, layout, sgd)
    seconds = time.perf_counter() - t0
    infos = [None] * dist.get_world_size()
    dist.all_gather_object(infos, info)
    del engine
    gc.collect()
    ref, ref_norms, _ = base.reference_run(ref_cfg, resolve_layout(ref_cfg), sgd)
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref))
    norm_diff = max((abs(a - b) for a, b in zip(norms, ref_norms) if a is not None), default=None)
    return {"name": name, "overrides": overrides, "optimizer": "sgd" if sgd else "adamw", "losses": losses,
            "reference": ref, "grad_norms": norms, "reference_grad_norms": ref_norms, "max_abs_loss_diff": loss_diff,
            "max_abs_grad_norm_diff": norm_diff, "reduce_scatter": zero_cfg["reduce_scatter"], "per_rank": infos,
            "seconds": seconds, "layout": {k: getattr(layout, k) for k in ("context_degree", "data_degree", "zero_stage",
                                                                             "grad_accum_steps", "seq_length")}}


def main() -> None:
    base.main(run_case, lambda r: f"[context_driver] {r['name']}: loss diff {r['max_abs_loss_diff']:.2e}, grad-norm diff "
                                  f"{r['max_abs_grad_norm_diff']}, {r['seconds']:.1f}s")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
