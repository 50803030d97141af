"""Multi-rank driver for ring-attention context parallelism: `torchrun --nproc_per_node N context_driver.py OUT.json CASE...`.

Each CASE is `name:key=value,...`: Hydra overrides on top of tests/parallel/driver.py's BASE (with `opt=sgd` as
there), run through launcher/parallel/context.py the way `launcher train` runs it (setup_context_parallel as the
`mpu`, or with tensor_degree > 1 launcher/parallel/tensor_model.py's layers and ContextTensorGrid; the generated
DeepSpeed config, context_parallel_loss per micro-batch). For every case every rank also trains
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

from launcher.runtime import chunked_loss
from launcher.train import maybe_chunk_the_loss
from tests.parallel import driver as base

# Long enough that every rank holds several tokens of each of its two chunks at CP4 (64 / 8 = 8).
SEQ = 64


def tensor_parallel_grad_norm(engine, tp_group, tp_rank: int) -> float:
    """The global norm of the reduced gradients a ZeRO-0 step applies, over TP-sharded parameters: every rank's shards
    plus the replicated tensors once (TP rank 0), summed over the TP group (DeepSpeed's own counting rule)."""
    sq = torch.zeros((), dtype=torch.float64)
    for p in engine.module.parameters():
        if p.grad is not None and (tp_rank == 0 or getattr(p, "tensor_model_parallel", False)):
            sq += p.grad.double().pow(2).sum()
    dist.all_reduce(sq, group=tp_group)
    return sq.sqrt().item()


def build_ring_engine(cfg, layout, sgd):
    """(engine, mpu, the module whose input is the embedded token ids, the attention config) as train.py builds
    them: without TP the transformers model with ring attention and DeepSpeed's sequence-parallel groups; with TP our
    TP layers on the plain engine (launcher/parallel/tensor_model.py), with its ContextTensorGrid as mpu."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    from launcher.parallel.context import build_context_parallel_model, setup_context_parallel

    if layout.tensor_degree > 1:
        from launcher.parallel.pipeline import DecoderBlockPipe, EmbeddingPipe
        from launcher.parallel.tensor_model import build_tensor_parallel_model

        model, mpu = build_tensor_parallel_model(cfg, layout, base.SEED)
        embed = next(m for m in model.modules() if isinstance(m, EmbeddingPipe))
        config = next(m for m in model.modules() if isinstance(m, DecoderBlockPipe)).layer.self_attn.config
    else:
        parallel_state_sp._release_sequence_parallel_groups()
        mpu = setup_context_parallel(layout.context_degree)
        model = build_context_parallel_model(cfg.model, base.SEED, layout.padded_vocab_size, base.zero3_config(cfg, layout))
        base.assert_built_partitioned(model, layout)
        maybe_chunk_the_loss(cfg, model)       # model.chunked_loss, as train.build_engine does
        embed, config = model.model.embed_tokens, model.config
    return base.initialize(model, cfg, layout, sgd, mpu=mpu), mpu, embed, config


def run_ring_pipeline(cfg, layout, sgd):
    """CP x PP: launcher/parallel/pipeline.py's stages on DeepSpeed's pipeline engine, fed as train.py feeds it
    (train.pipeline_pairs: each rank's head-tail chunk of the ids and of the targets), the engine's own loss and
    gradient norm (ZeRO-1; None at ZeRO-0)."""
    from launcher.parallel.pipeline import EmbeddingPipe, DecoderBlockPipe, build_pipeline_module
    from launcher.plan.rankmap import rank_coord
    from launcher.runtime.state_bytes import MEASURE_STATE_AT_STEP, measure_model_state_bytes
    from launcher.train import pipeline_pairs

    cp = layout.context_degree
    module = build_pipeline_module(cfg, layout, base.SEED)
    engine = base.initialize(module, cfg, layout, sgd)
    coord = rank_coord(layout, dist.get_rank())
    (_, cp_ranks), (_, dp_ranks) = module.context_groups
    assert cp_ranks.index(dist.get_rank()) == coord.cp and dp_ranks.index(dist.get_rank()) == coord.dp
    assert engine.grid.get_stage_id() == coord.pp
    seen = []  # the tokens of the sequence this rank's first layer works on (a block under Megatron SP gets 1/tp of them)
    first = next(m for m in module.modules() if isinstance(m, (EmbeddingPipe, DecoderBlockPipe)))
    factor = getattr(first, "seq_factor", 1)
    first.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[1] * factor))
    losses, norms, state = [], [], None
    for step in range(base.STEPS):
        micro = base.my_micro_batches(step, layout, coord.dp)
        losses.append(engine.train_batch(data_iter=iter(pipeline_pairs(micro, coord.cp, cp))).item())
        norms.append(base.grad_norm(engine))
        if step == MEASURE_STATE_AT_STEP:
            state = measure_model_state_bytes(engine)  # after the update: the optimizer state (gradients are gone)
    config = next((m.layer.self_attn.config for m in module.modules() if isinstance(m, DecoderBlockPipe)), None)
    info = {"tokens_per_rank": sorted(set(seen)), "cp_rank": coord.cp, "dp_rank": coord.dp, "tp_rank": coord.tp,
            "stage": coord.pp, "attn_implementation": config._attn_implementation,
            "optimizer": type(engine.optimizer).__name__, "engine": type(engine).__name__,
            "params": sum(p.numel() for p in module.parameters()), "state_bytes": state}
    return engine, losses, norms, info


def run_ring(cfg, layout, sgd):
    from launcher.parallel.context import context_parallel_loss
    from launcher.parallel.tensor_model import logits_vocab_group
    from launcher.plan.rankmap import rank_coord
    from launcher.runtime.state_bytes import MEASURE_STATE_AT_STEP, measure_model_state_bytes

    if layout.pipeline_degree > 1:
        return run_ring_pipeline(cfg, layout, sgd)
    cp = layout.context_degree
    engine, mpu, embed, config = build_ring_engine(cfg, layout, sgd)
    coord = rank_coord(layout, dist.get_rank())
    assert coord.cp == mpu.get_sequence_parallel_rank()
    if layout.tensor_degree > 1:  # the grid's coordinates are the rank map's
        assert (coord.tp, coord.dp) == (mpu.get_tensor_model_parallel_rank(), mpu.get_data_parallel_rank())
    seen = []  # the positions this rank really embeds
    embed.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[1]))
    losses, norms, state = [], [], None
    for step in range(base.STEPS):
        micro = []
        batches = base.my_micro_batches(step, layout, coord.dp)
        for j, mb in enumerate(batches):
            loss = context_parallel_loss(engine, mb, coord.cp, cp, logits_vocab_group(engine.module))
            engine.backward(loss)
            if step == MEASURE_STATE_AT_STEP and j == len(batches) - 1:
                state = measure_model_state_bytes(engine)  # what ZeRO partitioned over which ranks
            if layout.zero_stage == 0 and j == len(batches) - 1:
                # ZeRO-0 fp32 reports no norm: take it from the reduced gradients the step is about to apply.
                manual_norm = (tensor_parallel_grad_norm(engine, mpu.get_slice_parallel_group(), coord.tp)
                               if layout.tensor_degree > 1 else
                               torch.nn.utils.get_total_norm([p.grad for p in engine.module.parameters()]).item())
            engine.step()
            replica = loss.detach().clone()
            dist.all_reduce(replica, group=mpu.get_sequence_parallel_group())  # the CP shares add up to the replica loss
            micro.append(replica)
        avg = torch.stack(micro).mean()
        dist.all_reduce(avg)  # TP ranks hold equal replica losses: the world mean is the mean over the replicas
        losses.append(avg.item() / dist.get_world_size())
        norms.append(manual_norm if layout.zero_stage == 0 else base.grad_norm(engine))
    info = {"tokens_per_rank": sorted(set(seen)), "cp_rank": coord.cp, "dp_rank": coord.dp, "tp_rank": coord.tp,
            "attn_implementation": config._attn_implementation, "optimizer": type(engine.optimizer).__name__,
            "chunked_loss": chunked_loss.installed(engine),
            "engine": type(engine).__name__, "params": sum(p.numel() for p in engine.module.parameters()),
            "state_bytes": state}
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
    ref_cfg = compose(overrides + ["parallel.context_degree=1", "parallel.tensor_degree=1", "parallel.sequence_parallel=false",
                                   "parallel.pipeline_degree=1", "cluster.gpus_per_node=1"])
    zero_cfg = base.dsc.build_deepspeed_config(cfg, layout)["zero_optimization"]
    t0 = time.perf_counter()
    engine, losses, norms, info = run_ring(cfg, layout, sgd)
    seconds = time.perf_counter() - t0
    infos = [None] * dist.get_world_size()
    dist.all_gather_object(infos, info)
    del engine
    gc.collect()
    ref, ref_norms, ref_model = base.reference_run(ref_cfg, resolve_layout(ref_cfg), sgd)
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref))
    norm_diff = max((abs(a - b) for a, b in zip(norms, ref_norms) if a is not None), default=None)
    return {"name": name, "overrides": overrides, "optimizer": "sgd" if sgd else "adamw", "losses": losses,
            "reference": ref, "grad_norms": norms, "reference_grad_norms": ref_norms, "max_abs_loss_diff": loss_diff,
            "max_abs_grad_norm_diff": norm_diff,
            "reference_params": sum(p.numel() for p in ref_model.parameters()), "reduce_scatter": zero_cfg["reduce_scatter"], "per_rank": infos,
            "seconds": seconds, "layout": {k: getattr(layout, k) for k in ("context_degree", "tensor_degree", "pipeline_degree", "data_degree", "zero_stage",
                                                                             "zero_partition_degree",
                                                                             "grad_accum_steps", "seq_length")}}


def main() -> None:
    base.main(run_case, lambda r: f"[context_driver] {r['name']}: loss diff {r['max_abs_loss_diff']:.2e}, grad-norm diff "
                                  f"{r['max_abs_grad_norm_diff']}, {r['seconds']:.1f}s")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
