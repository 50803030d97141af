"""Our tensor-parallel layers on DeepSpeed's plain engine: Megatron TP + SP at pipeline_degree = 1, with ZeRO 0-2.

DeepSpeed 0.19.8's PipelineEngine asserts ZeRO < 2 (runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible
with pipeline parallelism"), so running Megatron SP as a one-stage pipeline refused `recipe=tiny` (ZeRO-2). Here
the same per-rank layers -- build_pipeline_module's one-stage PipelineModule: embedding, our TP blocks
(launcher/parallel/tensor.py, SP mode), final norm, head, each built and seeded per rank (launcher/runtime/build.py),
so no rank holds the whole model -- sit inside a plain nn.Module whose forward is (input_ids, labels) -> loss.
deepspeed.initialize sees no PipelineModule and returns its plain DeepSpeedEngine; train.py's train_step drives it.

What makes the plain engine right for these layers:
- `mpu` = the PipelineModule's own grid (PipelineParallelGrid: get_data_parallel_group, get_model_parallel_*,
  get_tensor_model_parallel_*). DeepSpeed then averages gradients and (ZeRO-1/2) partitions optimizer state over
  the data-parallel group only; without it the TP ranks would be averaged as replicas (DeepSpeed's engine
  _configure_distributed_model: no mpu means every rank is a replica). It also sizes the batch check by data_degree.
- the global gradient norm: the ZeRO-1/2 optimizer (zero/stage_1_and_2.py, complete_grad_norm_calculation_for_cpu_
  offload / get_grad_norm_direct) and the fp32 clip (runtime/utils.py clip_grad_norm_) sum a parameter marked
  `tensor_model_parallel` (our shards) or `model_parallel` on every TP rank and an unmarked one on TP rank 0 only,
  then all-reduce over the model-parallel group, the TP group at one stage. build_pipeline_module's mark_for_grad_norm
  marks every parameter of TP rank 0, so each replicated tensor counts once and each shard once per rank.
- the norms under SP see s/tp tokens per rank: register_sequence_parallel_grad_hooks (applied by
  build_pipeline_module) all-reduces their gradients over TP as they are produced, before ZeRO's own hooks
  accumulate them, on this engine as on the pipeline one.
- the head is replicated over TP (the gathered hidden states times the whole padded vocabulary), so every TP rank
  computes the same full loss (causal_lm_loss, transformers' shift) and backpropagates it; DeepSpeed averages only
  over DP.

Activation checkpointing (model.activation_checkpointing) checkpoints each decoder block, as the pipeline does,
with torch's non-reentrant checkpoint: DeepSpeed's reentrant one is configured by the PipelineEngine, which is not
here, and the non-reentrant form needs no requires_grad input.

Checkpoints are the plain engine's: one mp_rank_<tp>_model_states.pt per TP rank holding this module's state dict
(names `pipe.<layer index>.<local name>`, i.e. PipelineModule names under PREFIX), plus ZeRO's optimizer files.
launcher/parallel/export.py maps those names to transformers' (hf_name) and merges the TP shards.
"""

from __future__ import annotations

import functools

from torch import nn

# The attribute holding the PipelineModule: its parameters are saved as PREFIX + the PipelineModule's names.
PREFIX = "pipe."


class TensorParallelCausalLM(nn.Module):
    """A one-stage PipelineModule's layers as a causal LM: forward(input_ids, labels) -> CausalLMOutput(loss, logits)."""

    def __init__(self, pipe: nn.Module):
        super().__init__()
        self.pipe = pipe

    def forward(self, input_ids, labels=None, position_ids=None):
        from transformers.modeling_outputs import CausalLMOutput

        from launcher.parallel.pipeline import causal_lm_loss

        if position_ids is not None:
            # Our blocks build positions 0..s-1 themselves; check_document_mask refuses data.document_mask here.
            raise NotImplementedError("position_ids (data.document_mask) with Megatron sequence parallelism")
        logits = self.pipe(input_ids)
        return CausalLMOutput(loss=None if labels is None else causal_lm_loss(logits, labels), logits=logits)


def build_tensor_parallel_model(cfg, layout, seed: int):
    """(model, mpu) for deepspeed.initialize: our per-rank TP(+SP) layers at pipeline_degree = 1 on the plain engine.

    Collective (new process groups): every rank calls it, after torch.distributed is initialised.
    """
    import torch.utils.checkpoint

    from launcher.parallel.pipeline import build_pipeline_module

    if layout.pipeline_degree != 1:
        raise ValueError(f"build_tensor_parallel_model is the pipeline_degree = 1 path, not {layout.pipeline_degree}")
    pipe = build_pipeline_module(cfg, layout, seed=seed)
    if pipe.activation_checkpoint_interval > 0:
        pipe.activation_checkpoint_func = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
        # Which layers are checkpointed (decoder blocks only); the PipelineEngine computes this in its __init__.
        pipe._precompute_checkpointable_values()
    return TensorParallelCausalLM(pipe), pipe._grid
