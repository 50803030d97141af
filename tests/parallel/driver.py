"""Multi-rank driver for the parallel tests: `torchrun --nproc_per_node N tests/parallel/driver.py OUT.json CASE...`.

Each CASE is `name:mode:key=value,key=value` where mode is
    pipe    launcher.parallel.pipeline.build_pipeline_module + engine.train_batch (PP, PP x DP, TP x PP [x DP])
    tpplain launcher.parallel.tensor_model (our TP layers, with or without Megatron SP, at pipeline_degree 1: what
            `launcher train` runs for every TP without a pipeline) on DeepSpeed's plain engine with the grid as mpu,
            driven like train.py's train_step (ZeRO 0-2)
    ulysses Ulysses sequence parallelism (launcher/parallel/sequence.py); after every other case of a launch, all
            with one sequence_degree (its groups are global: DeepSpeed keeps the `mpu` of the first one)
and the key=value pairs are Hydra overrides on top of BASE, except `opt=sgd` (below) and `bucket=N` (the
generated config's default reduce_bucket_size, launcher.deepspeed_config.REDUCE_BUCKET_SIZE, for this
case: small enough that a parameter exceeds it on this tiny model). Several cases run in one launch
to pay the start-up once. For every case every rank also trains the unpipelined, unsharded model in plain torch
(the reference: one process, the whole global batch per step, torch AdamW, torch clip_grad_norm_) and
rank 0 writes both loss and gradient-norm trajectories, the per-rank parameter counts and the sharding facts
to OUT.json.

Seeing a gradient-scale error. AdamW is nearly blind to a constant factor on every gradient (its update
m / sqrt(v) cancels it, up to eps), and clipping hides it whenever both norms exceed the clip. So each case
is held to the 1-rank run by one of:
- the global gradient norm DeepSpeed reports (engine.get_global_grad_norm(): ZeRO >= 1 and bf16) against the
  reference's norm before clipping, step by step;
- `opt=sgd`: torch SGD as DeepSpeed's client optimizer and no clipping, so the update is lr x gradient and a
  factor on the gradient moves the loss trajectory (ZeRO-0 fp32, where DeepSpeed computes no norm to report).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import launcher.deepspeed_config as dsc
from launcher.train import maybe_chunk_the_loss

# The tiny shape of the brief: hidden 64, 4 heads, 4 layers, vocab 256, seq 32; lr high enough that
# the loss moves and gradient clipping at 1.0 is active in the first steps.
BASE = [
    "model=tiny", "model.hidden_size=64", "model.num_attention_heads=4", "model.num_key_value_heads=4",
    "model.num_hidden_layers=4", "model.intermediate_size=128", "model.vocab_size=256",
    "data.seq_length=32", "cluster=cpu", "precision=fp32", "batch.micro_batch_size=2", "batch.global_batch_size=8",
    "optimizer.lr=0.01", "optimizer.weight_decay=0.01", "optimizer.grad_clip=1.0", "parallel.zero_stage=0",
]
STEPS = 6
SEED = 1234
# Plain SGD needs a far larger step than AdamW to move this model: at 0.5 the 1-rank loss falls from 5.587 to
# 5.459 in 6 steps, and halving every gradient moves step 2's loss by 2.1e-3 relative (21x the tests' 1e-4).
SGD_LR = 0.5
DEFAULT_REDUCE_BUCKET_SIZE = dsc.REDUCE_BUCKET_SIZE


def global_batch(step: int, rows: int, seq: int, vocab: int) -> torch.Tensor:
    """Learnable synthetic data: each row an arithmetic progression a + b*t mod vocab (random a, b per row)."""
    g = torch.Generator().manual_seed(SEED * 1000 + step)
    a = torch.randint(0, vocab, (rows, 1), generator=g)
    b = torch.randint(1, 8, (rows, 1), generator=g)
    return (a + b * torch.arange(seq)[None, :]) % vocab


def make_optimizer(params, cfg, sgd: bool):
    o = cfg.optimizer
    if sgd:
        return torch.optim.SGD(params, lr=SGD_LR)
    return torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)


def reference_run(cfg, layout, sgd: bool):
    """The 1-rank fp32 run: whole global batch per step, same optimizer and clipping as the DeepSpeed config.

    Returns the losses, the global gradient norms before clipping, and the trained model."""
    from launcher.runtime.model import build_model

    model = build_model(cfg.model, SEED, vocab_size=layout.padded_vocab_size)
    opt = make_optimizer(model.parameters(), cfg, sgd)
    out, norms = [], []
    for step in range(STEPS):
        ids = global_batch(step, layout.global_batch_size, layout.seq_length, layout.vocab_size)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norms.append(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item())
        if cfg.optimizer.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.grad_clip)
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out, norms, model


def my_micro_batches(step, layout, dp_rank):
    """This replica's `grad_accum_steps` micro-batches of the global batch (TP ranks of a group get the same ones)."""
    ids = global_batch(step, layout.global_batch_size, layout.seq_length, layout.vocab_size)
    m, k = layout.micro_batch_size, layout.grad_accum_steps
    mine = ids[dp_rank * m * k:(dp_rank + 1) * m * k]
    return [mine[j * m:(j + 1) * m] for j in range(k)]


def zero3_config(cfg, layout):
    """The generated DeepSpeed config under ZeRO-3 (what deepspeed.zero.Init builds the partitions by), else None."""
    return dsc.build_deepspeed_config(cfg, layout) if layout.zero_stage == 3 else None


def assert_built_partitioned(model, layout):
    """Under ZeRO-3 no rank holds a whole parameter before deepspeed.initialize: each is a zero.Init partition
    (ds_tensor of ceil(numel / world) elements; the parameter itself is empty)."""
    if layout.zero_stage != 3:
        return
    world = dist.get_world_size()
    for name, p in model.named_parameters():
        assert hasattr(p, "ds_tensor") and p.numel() == 0, f"{name} was built whole"
        assert p.ds_tensor.numel() == -(-p.ds_numel // world), name


def initialize(model, cfg, layout, sgd: bool, mpu=None):
    """deepspeed.initialize with the generated config; with `sgd`, torch SGD as the client optimizer instead of
    the config's AdamW (the config's gradient_clipping is 0 then: run_case sets optimizer.grad_clip=0)."""
    import deepspeed

    ds = dsc.build_deepspeed_config(cfg, layout)
    # These tests compare parallel layouts, not schedules: a constant lr keeps the reference a plain torch optimizer.
    del ds["scheduler"]
    optimizer = None
    if sgd:
        del ds["optimizer"]
        optimizer = make_optimizer([p for p in model.parameters()], cfg, sgd)
        # ZeRO refuses client optimizers other than Adam/AdamW/Adagrad without this (SGD is element-wise,
        # so stepping flat partitions is the same update).
        ds["zero_allow_untested_optimizer"] = True
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()],
                                           optimizer=optimizer, config=ds, mpu=mpu)
    return engine


def grad_norm(engine):
    """DeepSpeed's global gradient norm of the last step (None where it computes none: ZeRO-0 fp32)."""
    norm = engine.get_global_grad_norm()
    return None if norm is None else float(norm)


def _tensors(held) -> list:
    """The tensors of an engine buffer: a tensor, a tuple or list of them (None and non-tensors skipped)."""
    return [t for t in (held if isinstance(held, (tuple, list)) else (held,)) if torch.is_tensor(t)]


def _storage_bytes(tensors) -> int:
    """Bytes of the storages behind `tensors`, each storage once (views of one buffer count once)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def watch_pipe_buffers(engine) -> dict:
    """{"inputs": bytes, "outputs": bytes}: the most the PipelineEngine's pipe_buffers referenced at the start of any
    backward pass (each storage once), the moment a stage holds its in-flight micro-batches. The engine dispatches its
    instructions through the class's _INSTRUCTION_MAP; an instance copy puts the count in front of BackwardPass."""
    from deepspeed.runtime.pipe.schedule import BackwardPass

    peak = {"inputs": 0, "outputs": 0}
    backward = type(engine)._INSTRUCTION_MAP[BackwardPass]

    def counted(self, buffer_id):
        for kind in peak:
            held = _storage_bytes(t for o in self.pipe_buffers[kind] for t in _tensors(o))
            peak[kind] = max(peak[kind], held)
        return backward(self, buffer_id)
    engine._INSTRUCTION_MAP = {**type(engine)._INSTRUCTION_MAP, BackwardPass: counted}
    return peak


def receive_buffer_bytes(engine) -> int:
    """Bytes of the buffers the PipelineEngine keeps across steps to receive into (each storage once): the activation
    buffer (pipe_recv_buf), the gradient buffer (grad_layer), both views of its _grad_layer_buf, and the partitioned
    input's shape (meta_buffer)."""
    names = ("pipe_recv_buf", "grad_layer", "_grad_layer_buf", "meta_buffer")
    return _storage_bytes(t for name in names for t in _tensors(getattr(engine, name, None)))


def run_pipe(cfg, layout, sgd):
    from launcher.parallel.pipeline import BloomDecoderBlockPipe, DecoderBlockPipe, build_pipeline_module
    from launcher.parallel.tensor import ColumnParallelLinear, RowParallelLinear

    module = build_pipeline_module(cfg, layout, SEED)
    engine = initialize(module, cfg, layout, sgd)
    grid = engine.grid
    dp_rank = grid.get_data_parallel_rank()
    block_tokens = set()  # the sequence length each decoder block of this rank receives (s/tp under Megatron SP)
    for m in module.modules():
        if isinstance(m, (DecoderBlockPipe, BloomDecoderBlockPipe)):
            m.register_forward_hook(lambda _m, args, _out: block_tokens.add(args[0].shape[1]))
    buffers = watch_pipe_buffers(engine)
    losses, norms = [], []
    for step in range(STEPS):
        batches = [(mb, mb) for mb in my_micro_batches(step, layout, dp_rank)]
        losses.append(engine.train_batch(data_iter=iter(batches)).item())
        norms.append(grad_norm(engine))
    # What the engine still references of the step's outputs (the last stage's logits: pipe_buffers['outputs'], which
    # its last-stage backward never clears; launcher/parallel/pipeline.py ReleasingLoss releases their storage).
    held = [t for o in engine.pipe_buffers["outputs"] for t in _tensors(o)]
    held_info = {"held_outputs": len(held), "held_output_bytes": sum(t.untyped_storage().nbytes() for t in held),
                 "receive_buffer_bytes": receive_buffer_bytes(engine)}
    from launcher.parallel.export import gather_hf_state_dict

    # The pipeline's own loss on one fixed batch after training: the export must reproduce it.
    eval_ids = global_batch(10_000, layout.micro_batch_size, layout.seq_length, layout.vocab_size)
    info_eval = engine.eval_batch(data_iter=iter([(eval_ids, eval_ids)] * layout.grad_accum_steps)).item()

    exported = gather_hf_state_dict(module, grid, cfg.model.num_hidden_layers, cfg.model.tie_word_embeddings, cfg.model.arch)
    blocks = [m for m in module.modules() if isinstance(m, (DecoderBlockPipe, BloomDecoderBlockPipe))]
    info = {
        "stage": grid.get_stage_id(), "dp_rank": dp_rank, "tp_rank": grid.get_slice_parallel_rank(),
        "slice_group": list(grid.slice_group), "params": sum(p.numel() for p in module.parameters()),
        "blocks": len(blocks),
        # layers the PipelineEngine checkpoints (its per-layer flags at interval 1; model.checkpoint_blocks)
        "checkpointed": sum(module.is_checkpointable_results) if module.activation_checkpoint_interval else 0,
        "column_parallel": sum(isinstance(m, ColumnParallelLinear) for m in module.modules()),
        "row_parallel": sum(isinstance(m, RowParallelLinear) for m in module.modules()),
        "plain_linear_in_blocks": sum(isinstance(m, torch.nn.Linear) for b in blocks for m in b.modules()),
        "block_linear_params": sum(p.numel() for b in blocks for n, p in b.named_parameters() if "norm" not in n),
        "sharded_params": sum(p.numel() for p in module.parameters() if getattr(p, "tensor_model_parallel", False)),
        "optimizer": type(engine.optimizer).__name__,
        "immediate_grad_update": getattr(engine.optimizer, "immediate_grad_update", None),
        "param_dtype": str(next(module.parameters()).dtype),
        "pipeline_eval_loss": info_eval,
        "block_tokens": sorted(block_tokens),
        "sequence_parallel_params": sum(p.numel() for p in module.parameters() if getattr(p, "sequence_parallel", False)),
        **held_info,
        "pipe_buffer_peak_bytes": buffers,
    }
    return engine, losses, norms, info, exported


def train_tensor_parallel(engine, layout, dp_rank):
    """STEPS steps of a plain engine whose TP ranks hold their replica's whole loss (replicated head): (losses, grad
    norms). Mean over this replica's micro-batches, then over all ranks: TP ranks hold equal losses, so the world mean
    is the mean over the replicas, i.e. over the global batch."""
    losses, norms = [], []
    for step in range(STEPS):
        micro = []
        for mb in my_micro_batches(step, layout, dp_rank):
            loss = engine(input_ids=mb, labels=mb).loss
            engine.backward(loss)
            engine.step()
            micro.append(loss.detach())
        avg = torch.stack(micro).mean()
        dist.all_reduce(avg)
        losses.append(avg.item() / dist.get_world_size())
        norms.append(grad_norm(engine))
    return losses, norms


def run_tpplain(cfg, layout, sgd):
    """Our TP layers (with or without Megatron SP) at pipeline_degree 1 on the plain engine (launcher/parallel/tensor_model.py)."""
    from launcher.parallel.export import gather_hf_state_dict
    from launcher.parallel.pipeline import DecoderBlockPipe
    from launcher.parallel.tensor import ColumnParallelLinear, RowParallelLinear
    from launcher.parallel.tensor_model import build_tensor_parallel_model

    import launcher.runtime.build as build_mod

    # What the build gives real storage (SeededLayerSpec.build -> materialise_): each tensor's element count, so
    # the test can hold that no rank ever materialises a whole sharded weight (issue 11: AutoTP built all of it).
    materialised = []
    original = build_mod.materialise_

    def counting(module, init, hf_name, device="cpu"):
        materialised.extend(p.numel() for p in module.parameters() if p.is_meta)
        return original(module, init, hf_name, device)

    build_mod.materialise_ = counting
    try:
        model, grid = build_tensor_parallel_model(cfg, layout, SEED)
    finally:
        build_mod.materialise_ = original
    engine = initialize(model, cfg, layout, sgd, mpu=grid)
    dp_rank = grid.get_data_parallel_rank()
    block_tokens = set()
    for m in model.modules():
        if isinstance(m, DecoderBlockPipe):
            m.register_forward_hook(lambda _m, args, _out: block_tokens.add(args[0].shape[1]))
    losses, norms = train_tensor_parallel(engine, layout, dp_rank)
    eval_ids = global_batch(10_000, layout.micro_batch_size, layout.seq_length, layout.vocab_size)
    with torch.no_grad():
        eval_loss = engine(input_ids=eval_ids, labels=eval_ids).loss.item()
    exported = gather_hf_state_dict(model.pipe, grid, cfg.model.num_hidden_layers, cfg.model.tie_word_embeddings,
                                    cfg.model.arch)
    blocks = [m for m in model.modules() if isinstance(m, DecoderBlockPipe)]
    info = {"stage": 0, "dp_rank": dp_rank, "tp_rank": grid.get_slice_parallel_rank(), "slice_group": list(grid.slice_group),
            "params": sum(p.numel() for p in model.parameters()), "blocks": len(blocks),
            "column_parallel": sum(isinstance(m, ColumnParallelLinear) for m in model.modules()),
            "row_parallel": sum(isinstance(m, RowParallelLinear) for m in model.modules()),
            "plain_linear_in_blocks": sum(isinstance(m, torch.nn.Linear) for b in blocks for m in b.modules()),
            "block_linear_params": sum(p.numel() for b in blocks for n, p in b.named_parameters() if "norm" not in n),
            "sharded_params": sum(p.numel() for p in model.parameters() if getattr(p, "tensor_model_parallel", False)),
            "sequence_parallel_params": sum(p.numel() for p in model.parameters() if getattr(p, "sequence_parallel", False)),
            "engine": type(engine).__name__, "optimizer": type(engine.optimizer).__name__,
            "zero_stage": engine.zero_optimization_stage(), "block_tokens": sorted(block_tokens),
            "pipeline_eval_loss": eval_loss,
            "materialised_numel": sum(materialised), "materialised_largest": max(materialised)}
    return engine, losses, norms, info, exported


_SP_GROUPS: dict = {}  # sequence_degree -> mpu: DeepSpeed's SP groups can be created once per process


def run_ulysses(cfg, layout, sgd):
    """Ulysses SP (launcher/parallel/sequence.py): each rank holds seq/sp tokens of its replica's samples."""
    from launcher.parallel.sequence import build_sequence_parallel_model, sequence_parallel_loss, setup_sequence_parallel
    from launcher.plan.rankmap import rank_coord
    from launcher.runtime import chunked_loss

    sp = layout.sequence_degree
    if sp not in _SP_GROUPS:
        assert not _SP_GROUPS, "one sequence_degree per launch"
        _SP_GROUPS[sp] = setup_sequence_parallel(sp)
    mpu = _SP_GROUPS[sp]
    # Under ZeRO-3 built as partitions (deepspeed.zero.Init), as train.build_engine builds it.
    model = build_sequence_parallel_model(cfg.model, SEED, layout.padded_vocab_size, zero3_config(cfg, layout))
    assert_built_partitioned(model, layout)
    maybe_chunk_the_loss(cfg, model)           # model.chunked_loss, as train.build_engine does
    engine = initialize(model, cfg, layout, sgd, mpu=mpu)
    coord = rank_coord(layout, dist.get_rank())
    assert coord.sp == mpu.get_sequence_parallel_rank()
    seen = []  # the token counts this rank really embeds (and so runs every per-token layer on)
    model.model.embed_tokens.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[1]))
    losses, norms = [], []
    for step in range(STEPS):
        micro = []
        for mb in my_micro_batches(step, layout, coord.dp):
            loss = sequence_parallel_loss(engine, mb, coord.sp, sp)
            engine.backward(loss)
            engine.step()
            replica = loss.detach().clone()
            dist.all_reduce(replica, group=mpu.get_sequence_parallel_group())  # the SP shares add up to the replica loss
            micro.append(replica)
        avg = torch.stack(micro).mean()
        dist.all_reduce(avg)
        losses.append(avg.item() / dist.get_world_size())
        norms.append(grad_norm(engine))
    info = {"params": sum(p.numel() for p in engine.module.parameters()), "tokens_per_rank": sorted(set(seen)),
            "attn_implementation": engine.module.config._attn_implementation, "optimizer": type(engine.optimizer).__name__,
            "chunked_loss": chunked_loss.installed(engine)}
    return engine, losses, norms, info, None


def compare_export(exported, ref_model, cfg, layout, pipeline_eval_loss) -> dict:
    """Load the merged state dict into a fresh transformers model (strict) and compare with the reference."""
    from launcher.runtime.model import build_model

    model = build_model(cfg.model, SEED + 1, vocab_size=layout.padded_vocab_size)  # other seed: every weight must come from the export
    model.load_state_dict({k: v.float() for k, v in exported.items()}, strict=True)
    ids = global_batch(10_000, layout.micro_batch_size, layout.seq_length, layout.vocab_size)
    with torch.no_grad():
        got, want = model(input_ids=ids).logits, ref_model(input_ids=ids).logits
        export_loss = model(input_ids=ids, labels=ids).loss.item()
    ref_sd = ref_model.state_dict()
    return {"keys_match": sorted(exported) == sorted(ref_sd),
            "max_weight_diff": max((exported[k].float() - ref_sd[k]).abs().max().item() for k in ref_sd),
            "max_logit_diff_vs_reference": (got - want).abs().max().item(), "max_logit": want.abs().max().item(),
            "export_loss": export_loss, "pipeline_eval_loss": pipeline_eval_loss}


def run_case(spec: str) -> dict:
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout

    name, mode, rest = spec.split(":", 2)
    kvs = [kv for kv in rest.split(",") if kv]
    sgd = "opt=sgd" in kvs
    # `break=norm_grads`: Megatron SP without the all-reduce of the norm weights' gradients (each TP rank keeps
    # the partial sum over its s/tp tokens): a negative control that the comparison sees that error.
    broken = "break=norm_grads" in kvs
    kvs = [kv for kv in kvs if kv != "break=norm_grads"]
    bucket = [int(kv.split("=")[1]) for kv in kvs if kv.startswith("bucket=")]
    kvs = [kv for kv in kvs if kv != "opt=sgd" and not kv.startswith("bucket=")] + (["optimizer.grad_clip=0"] if sgd else [])
    dsc.REDUCE_BUCKET_SIZE = bucket[0] if bucket else DEFAULT_REDUCE_BUCKET_SIZE
    overrides = BASE + [f"cluster.gpus_per_node={dist.get_world_size()}"] + kvs
    cfg = compose(overrides)
    layout = resolve_layout(cfg)
    ref_cfg = compose(overrides + ["parallel.tensor_degree=1", "parallel.pipeline_degree=1", "parallel.sequence_degree=1",
                                   "parallel.sequence_parallel=false",
                                   "precision=fp32", "precision.grad_accum_dtype=null", "cluster.gpus_per_node=1"])
    t0 = time.perf_counter()
    zero_cfg = dsc.build_deepspeed_config(cfg, layout)["zero_optimization"]
    import launcher.parallel.tensor as tensor_mod

    hooks = tensor_mod.register_sequence_parallel_grad_hooks
    if broken:
        tensor_mod.register_sequence_parallel_grad_hooks = lambda module, group: 0
    try:
        engine, losses, norms, info, exported = {"pipe": run_pipe, "tpplain": run_tpplain, "ulysses": run_ulysses}[mode](cfg, layout, sgd)
    finally:
        tensor_mod.register_sequence_parallel_grad_hooks = hooks
    seconds = time.perf_counter() - t0
    infos = [None] * dist.get_world_size()
    dist.all_gather_object(infos, info)
    del engine
    gc.collect()
    ref, ref_norms, ref_model = reference_run(ref_cfg, resolve_layout(ref_cfg), sgd)
    rel = [abs(a - b) / abs(b) for a, b in zip(losses, ref)]
    rel += [abs(a - b) / b for a, b in zip(norms, ref_norms) if a is not None]
    export = None
    if exported is not None:
        export = compare_export(exported, ref_model, ref_cfg, layout, info["pipeline_eval_loss"])
    return {"name": name, "export": export, "mode": mode, "overrides": overrides, "optimizer": "sgd" if sgd else "adamw",
            "losses": losses, "reference": ref, "grad_norms": norms, "reference_grad_norms": ref_norms,
            "max_rel_diff": max(rel), "reduce_scatter": zero_cfg["reduce_scatter"],
            "reduce_bucket_size": zero_cfg["reduce_bucket_size"], "per_rank": infos, "seconds": seconds,
            "layout": {k: getattr(layout, k) for k in ("tensor_degree", "pipeline_degree", "data_degree", "zero_stage",
                                                       "grad_accum_steps", "dtype")}}


def _describe(r: dict) -> str:
    return (f"[driver] {r['name']}: max rel diff {r['max_rel_diff']:.2e} in {r['seconds']:.1f}s; "
            f"params per rank {[i['params'] for i in r['per_rank']]}")


def main(run=run_case, describe=_describe) -> None:
    """Run every case spec of argv in this one launch (start-up paid once); rank 0 prints a line per case and
    writes the results to argv[1]. tests/parallel/context_driver.py runs its own cases through it."""
    import deepspeed

    from launcher.runtime.distributed import avoid_shm_comm_build, leave_rank

    out_path, specs = sys.argv[1], sys.argv[2:]
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    results = []
    for spec in specs:
        results.append(run(spec))
        if dist.get_rank() == 0:
            print(describe(results[-1]), flush=True)
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    leave_rank()   # results are on disk: exit without the interpreter's teardown (see leave_rank)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
