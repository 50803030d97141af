"""The model-state bytes one rank actually holds under DeepSpeed 0.19.8, measured from the engine's tensors.

The prediction this is held against is launcher.plan.memory.predict_model_state_bytes (pure Python);
its docstring carries the ledger with the DeepSpeed file/function behind each term. Here we only walk
the engine and add up *storages*: a tensor that is a view into a flat buffer contributes that buffer
once, whole, padding included, which is what the allocator really holds. Storages are deduplicated by
address across the four buckets, first come first served in the order params, grads, optimizer, buffers:

- params: each module parameter's data (under ZeRO 1/2 views into the flat 16/32-bit group buffer), and
  under ZeRO 3 its partition `ds_tensor` plus the full data of the "persistent" small parameters.
- grads: module .grad / .grad_accum, and the ZeRO / BF16 optimizer's gradient partitions and flat
  gradient buffers (including the zero tensors it pads a partition with).
- optimizer: the fp32 master weights where they are a separate copy, and every tensor in the inner
  torch optimizer's state (exp_avg, exp_avg_sq and the 4-byte `step` tensor of torch's AdamW).
- buffers: the reduce ("ipg") bucket buffers ZeRO keeps for communication; not model state (their
  size is the config's reduce_bucket_size, not a function of the model), reported separately.

Call it at the gradient-accumulation boundary after engine.backward() and before engine.step() of a
step after the first (the Adam moments are created lazily by the first step): the moment all three
kinds of state coexist.
"""

from __future__ import annotations

from pathlib import Path

# The step whose model-state bytes we record: by then the optimizer has allocated its state (at step 0)
# and the gradients of this step exist (measured between backward and the optimizer step).
MEASURE_STATE_AT_STEP = 1

BUCKETS = ("params", "grads", "optimizer", "buffers")

# Attributes of DeepSpeed 0.19.8's optimizers that hold gradients of this rank (files under deepspeed/runtime/):
# zero/stage_1_and_2.py DeepSpeedZeroOptimizer: averaged_gradients (partition lists at the boundary),
#   grads_in_partition (contiguous copy of the in-partition gradients, copy_grads_in_partition);
# zero/stage3.py DeepSpeedZeroOptimizer_Stage3: grad_partitions_flat_buffer (_setup_for_real_optimizer),
#   averaged_gradients (views into it);
# bf16_optimizer.py BF16_Optimizer: fp32_groups_gradients_flat (+ its per-param views and partitions).
_GRAD_ATTRS = ("averaged_gradients", "grads_in_partition", "grad_partitions_flat_buffer",
               "fp32_groups_gradients_flat", "fp32_groups_gradients", "fp32_groups_gradient_flat_partition")
# fp32 master weights: stage_1_and_2.py single_partition_of_fp32_groups, stage3.py fp32_partitioned_groups_flat,
# bf16_optimizer.py fp32_groups_flat_partition, fp16/unfused_optimizer.py fp32_groups.
_MASTER_ATTRS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition",
                 "fp32_groups")
# Flat low-precision parameter buffers the module's parameters are views of (stage_1_and_2.py bit16_groups_flat,
# stage3.py lp_param_buffer, bf16_optimizer.py bf16_groups_flat).
_PARAM_ATTRS = ("bit16_groups_flat", "lp_param_buffer", "bf16_groups_flat")


def _tensors(obj):
    """Every tensor inside nested lists, tuples and dicts."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class _Ledger:
    """Distinct storages per bucket; a storage is charged to the first bucket that names it."""

    def __init__(self):
        self.seen: set[int] = set()
        self.bytes = dict.fromkeys(BUCKETS, 0)

    def add(self, bucket: str, obj) -> None:
        for t in _tensors(obj):
            storage = t.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in self.seen:
                continue
            self.seen.add(storage.data_ptr())
            self.bytes[bucket] += storage.nbytes()


def model_state_tensors(engine) -> dict:
    """The tensors of each bucket (params, grads, optimizer, buffers) this rank's engine holds, in charge order."""
    module_params = list(engine.module.parameters())
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", None) or opt
    out = {b: [] for b in BUCKETS}
    out["params"] += [p.data for p in module_params]
    out["params"] += [p.ds_tensor for p in module_params if getattr(p, "ds_tensor", None) is not None]
    out["params"] += [getattr(opt, a, None) for a in _PARAM_ATTRS]
    out["grads"] += [p.grad for p in module_params] + [getattr(p, "grad_accum", None) for p in module_params]
    out["grads"] += [getattr(opt, a, None) for a in _GRAD_ATTRS]
    # stage3.py keeps the per-parameter gradient views in a name-mangled dict (__param_id_to_grad_partition).
    out["grads"] += [v for k, v in vars(opt).items() if k.endswith("__param_id_to_grad_partition")]
    masters = [getattr(opt, a, None) for a in _MASTER_ATTRS]
    out["optimizer"] += masters + [t.grad for t in _tensors(masters)]
    if inner is not None and hasattr(inner, "state"):
        out["optimizer"] += [p for g in inner.param_groups for p in g["params"]]
        out["optimizer"] += [dict(s) for s in inner.state.values()]
    out["buffers"] += [b.buffer for b in getattr(opt, "ipg_buckets", {}).values()]
    return out


def measure_model_state_bytes(engine) -> dict:
    """Bytes of params, grads, optimizer states (and ZeRO's reduce bucket buffers) this rank holds, plus total."""
    ledger = _Ledger()
    for bucket, tensors in model_state_tensors(engine).items():
        ledger.add(bucket, tensors)
    out = dict(ledger.bytes)
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def record_state_bytes(cfg, layout, run_dir: Path, rank: int, state_bytes: dict) -> None:
    """Gather every rank's measured model-state bytes; rank 0 writes them beside the planner's prediction.

    The prediction (launcher.plan.memory.predict_model_state_bytes) is exact for data-parallel layouts
    without offload; for others it says why it is not given. Every run so checks the memory model.
    """
    import json

    import deepspeed.comm as dist

    from launcher.plan.memory import predict_model_state_bytes
    from launcher.runtime.durable import write_atomic
    from launcher.runtime.metrics import STATE_BYTES_FILE

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state_bytes)
    if rank != 0:
        return
    try:
        predicted = [predict_model_state_bytes(cfg, layout, dp_rank=r) for r in range(len(gathered))]
        note = None
    except ValueError as exc:
        predicted, note = None, f"no exact prediction for this layout: {exc}"
    keys = ("params", "grads", "optimizer")
    matches = None if predicted is None else all(
        all(m[k] == p[k] for k in keys) for m, p in zip(gathered, predicted))
    write_atomic(run_dir / STATE_BYTES_FILE, json.dumps({
        "per_rank": gathered,
        "predicted_per_rank": predicted,
        "prediction_matches": matches,
        "prediction_note": note,
        "note": "bytes of parameters, gradients and optimizer state held by each rank, measured between backward "
                "and the optimizer step (launcher.runtime.state_bytes.measure_model_state_bytes); the prediction is "
                "launcher.plan.memory.predict_model_state_bytes"}, indent=2))
