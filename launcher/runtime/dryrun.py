"""`launcher train ... --dry-run`: what every rank would build and hold, from the modules the runtime builds.

One process, no torch.distributed, no bytes: the whole model is built on the meta device once
(launcher/runtime/build.py meta_model), then every distinct rank role -- each pipeline stage x TP rank --
is built from it by the runtime's own code (launcher/parallel/pipeline.py layer_specs with the TP shard
functions of launcher/parallel/tensor.py), left on meta, and counted; DP and SP replicas copy their role's
record. The stage cut is launcher/plan/stages.py's, which build_pipeline_module asserts DeepSpeed agrees
with. Byte columns multiply those counts by the per-parameter rules of launcher/plan/memory.py
(model_state_bytes; ZeRO-3 partitions exactly, per tensor ceil(numel / DP)).

"host_bytes_build" is the CPU memory the rank's build allocates (launcher/plan/host.py build_peak_bytes, which
`launcher plan`'s host-memory check also uses), by path:
- our layer list (a pipeline stage, or any TP at pipeline_degree = 1): its own layers, own TP shards only, in
  fp32 (the build dtype; DeepSpeed casts to bf16 afterwards) plus one seeded 256-row block being generated;
- ZeRO-3 without TP or PP, Ulysses and CP included (deepspeed.zero.Init): its partition of every tensor in the
  training dtype, plus the fp32 rows one partition's values are cut from;
- otherwise (ZeRO 0-2 data parallelism without TP or PP, Ulysses and CP without TP included): the whole fp32
  model -- every rank holds whole weights there.
"""

from __future__ import annotations

import math

from launcher.plan.host import build_peak_bytes
from launcher.plan.memory import model_state_bytes, overlap_comm_on, weight_bytes, zero3_partition_numel
from launcher.plan.rankmap import rank_map


def _tensors(module):
    """(numel, sharded over TP) of every parameter of a meta module, tied tensors once."""
    return [(p.numel(), bool(getattr(p, "tensor_model_parallel", False))) for p in module.parameters()]


def _roles_pipeline(cfg, layout, full):
    from launcher.parallel.pipeline import ARCH_MODULES, layer_hf_prefixes, layer_specs
    from launcher.parallel.tensor import TensorParallel
    from launcher.plan.inputs import model_shape
    from launcher.plan.stages import stage_bounds
    from launcher.runtime.model import attn_implementation

    arch = cfg.model.arch
    if arch not in ARCH_MODULES:
        raise NotImplementedError(f"pipeline parallelism is implemented for model.arch in {sorted(ARCH_MODULES)}, not {arch!r}")
    bounds = stage_bounds(model_shape(cfg.model), layout.padded_vocab_size, layout.pipeline_degree,
                          cfg.parallel.partition_method)
    prefixes = layer_hf_prefixes(arch, cfg.model.num_hidden_layers)
    names = ARCH_MODULES[arch]
    roles = {}
    # With stages the pipeline engine; at one stage (any TP: plain, Megatron SP, TP x CP) the plain engine on the
    # same layers, each TP rank building only its slice (its vocabulary rows of the embedding and head; norms whole).
    build = "pipeline stage, own layers only" if layout.pipeline_degree > 1 else "own TP shards only"
    t = layout.tensor_degree
    for tp_rank in range(t):
        tp = TensorParallel(None, tp_rank, t) if t > 1 else None
        specs = layer_specs(full, arch, attn_implementation(arch), cfg.model.tie_word_embeddings, tp, init=None)
        for stage in range(layout.pipeline_degree):
            tensors, layers, largest_row = [], [], 0
            for i in range(bounds[stage], bounds[stage + 1]):
                module = specs[i].build()   # on meta: the runtime's own module, this TP rank's shards
                tensors += _tensors(module)
                layers.append(names.embed if (cfg.model.tie_word_embeddings and prefixes[i] == names.head) else prefixes[i])
                largest_row = max([largest_row] + [math.prod(p.shape[1:]) for p in module.parameters()])
            roles[(stage, tp_rank)] = {"tensors": tensors, "layers": layers, "build": build,
                                       "build_extra_bytes": 256 * largest_row * 4}
    return roles


def _roles_whole(cfg, layout, full):
    """PP = 1 without TP: every rank builds the whole model, or (ZeRO-3) its partition of every tensor."""
    if layout.tensor_degree > 1:
        raise ValueError("tensor parallelism runs on our layer list (Layout.pipeline_layers): _roles_pipeline")
    tensors = _tensors(full)
    zero3 = layout.zero_stage == 3
    largest = max(n for n, _ in tensors)
    if zero3:
        extra = zero3_partition_numel(largest, layout.zero_partition_degree) * 4 + 2 * max(p.shape[-1] for p in full.parameters()) * 4
        build = "deepspeed.zero.Init: own partition of every tensor"
    else:
        extra = None
        build = "whole model"
    layers = ["(all)"]
    return {(0, 0): {"tensors": tensors, "layers": layers, "build": build, "build_extra_bytes": extra, "zero3_build": zero3}}


def rank_ledger(cfg, layout) -> list[dict]:
    """One record per global rank: where it sits, what it holds, and the bytes that follow."""
    from launcher.runtime.build import meta_model

    full = meta_model(cfg.model, vocab_size=layout.padded_vocab_size)
    whole_numel = sum(p.numel() for p in full.parameters())
    roles = _roles_pipeline(cfg, layout, full) if layout.pipeline_layers else _roles_whole(cfg, layout, full)
    grad_fp32 = cfg.precision.grad_accum_dtype == "fp32"
    w = weight_bytes(layout.dtype)
    summary = {}
    for key, role in roles.items():
        numels = [n for n, _ in role["tensors"]]
        params = sum(numels)
        states = model_state_bytes(params, layout.zero_partition_degree, layout.zero_stage, layout.dtype, grad_fp32,
                                   layout.pipeline_degree, bool(cfg.parallel.offload_optimizer),
                                   bool(cfg.parallel.offload_param), layout.grad_accum_steps,
                                   overlap_comm_on(layout.device))
        held = params
        if layout.zero_stage == 3:
            held = sum(zero3_partition_numel(n, layout.zero_partition_degree) for n in numels)
            states["params"] = 0.0 if cfg.parallel.offload_param else held * w
        # The planner's host-memory check (launcher/plan/host.py) uses the same function with its own counts.
        path = "pipeline" if layout.pipeline_layers else ("zero3" if role.get("zero3_build") else "whole")
        host = build_peak_bytes(path, params, whole_numel, held, layout.dtype, role["build_extra_bytes"] or 0)
        summary[key] = {
            "layers": role["layers"],
            "params": params,
            "params_tp_replicated": sum(n for n, sharded in role["tensors"] if not sharded),
            "params_held": held,
            "bytes_params": int(states["params"]),
            "bytes_grads": int(states["grads"]),
            "bytes_optimizer": int(states["optimizer"]),
            "host_bytes_build": int(host),
            "build": role["build"],
        }
    records = []
    for c in rank_map(layout):
        records.append({"rank": c.rank, "node": c.node, "gpu": c.gpu, "stage": c.pp, "tp_rank": c.tp, "dp_rank": c.dp,
                        "sp_rank": c.sp, "cp_rank": c.cp, **summary[(c.pp if layout.pipeline_layers else 0, c.tp)]})
    return records


def stage_params_from_ledger(records) -> list[int]:
    """Parameters of every stage before TP sharding: the sharded parts of its TP ranks summed, the replicated
    tensors once (held identically by every TP rank). DP and SP replicas are not counted again."""
    stages: dict[int, int] = {}
    seen = set()
    for r in records:
        key = (r["stage"], r["tp_rank"])
        if key in seen:
            continue
        seen.add(key)
        sharded = r["params"] - r["params_tp_replicated"]
        stages[r["stage"]] = stages.get(r["stage"], 0) + sharded + (r["params_tp_replicated"] if r["tp_rank"] == 0 else 0)
    return [stages[s] for s in sorted(stages)]


def format_ledger(records) -> str:
    """The ledger as a fixed-width table, one line per rank."""
    gb = 1e9
    head = (f"{'rank':>5} {'node':>4} {'stage':>5} {'tp':>3} {'dp':>3} {'sp':>3} {'cp':>3}  {'layers':<40} {'params':>15} "
            f"{'params GB':>9} {'grads GB':>8} {'optim GB':>8} {'host GB at build':>16}  build")
    lines = [head]
    for r in records:
        lines.append(f"{r['rank']:>5} {r['node']:>4} {r['stage']:>5} {r['tp_rank']:>3} {r['dp_rank']:>3} {r['sp_rank']:>3} {r['cp_rank']:>3}  "
                     f"{_layers_short(r['layers']):<40} {r['params']:>15,} {r['bytes_params'] / gb:>9.2f} "
                     f"{r['bytes_grads'] / gb:>8.2f} {r['bytes_optimizer'] / gb:>8.2f} {r['host_bytes_build'] / gb:>16.2f}  "
                     f"{r['build']}")
    return "\n".join(lines)


def _layers_short(layers) -> str:
    """'word_embeddings + word_embeddings_layernorm + 5 blocks 0-4' style summary of a stage's layer names."""
    blocks = [int(n.rsplit(".", 1)[1]) for n in layers if n.rsplit(".", 1)[-1].isdigit()]
    before, after = [], []
    for n in layers:
        last = n.rsplit(".", 1)[-1]
        if not last.isdigit():
            (after if blocks and n == layers[-1] or (blocks and layers.index(n) > 0 and
                                                      layers[layers.index(n) - 1].rsplit(".", 1)[-1].isdigit()) else before).append(last)
    mid = [f"{len(blocks)} blocks {blocks[0]}-{blocks[-1]}"] if blocks else []
    return " + ".join(before + mid + after)
