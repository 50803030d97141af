"""Our tensor-parallel layers on DeepSpeed's plain engine: every tensor_degree > 1 at pipeline_degree = 1 (Megatron TP,
with or without SP, and TP x ring-attention context parallelism), with ZeRO 0-2.

Why not DeepSpeed AutoTP (which the launcher used for plain TP until issue 11): AutoTP shards a transformers model
that every rank has first built whole, so a rank's peak holds the whole model; here each rank builds and seeds only
its TP slice. AutoTP also has no SP mode and its groups cannot be laid out with CP's (below).

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
- the embedding, the head and the loss are split over the vocabulary (Megatron-LM's VocabParallelEmbedding,
  ColumnParallelLinear head with parallel_output=True and vocab_parallel_cross_entropy: launcher/parallel/tensor.py),
  so each TP rank holds V/t rows of the embedding and head, does 1/t of the head GEMMs and keeps 1/t of the fp32
  logits; every TP rank computes the same full loss (three all-reduces of one value a token) and backpropagates
  it; DeepSpeed averages only over DP. (AutoTP, in training mode, cut an untied head the same way but gathered
  the logits whole on every rank, deepspeed 0.19.8 module_inject/auto_tp.py.)
- data.document_mask: the batch's restarting position ids enter the layers with input_ids, and the embedding builds
  transformers' within-document mask from them (launcher/parallel/pipeline.py), as the transformers model does.

Activation checkpointing (model.activation_checkpointing) checkpoints each decoder block, as the pipeline does,
with torch's non-reentrant checkpoint: DeepSpeed's reentrant one is configured by the PipelineEngine, which is not
here, and the non-reentrant form needs no requires_grad input.

Context parallelism with TP (CP x TP; Megatron-LM composes them the same way, "tp-cp-dp" innermost first):
every TP rank rings its own heads' keys and values over its CP group (launcher/parallel/context.py), and the
blocks take the head-tail chunk positions (pipeline.DecoderBlockPipe). AutoTP would need DeepSpeed's
sequence-parallel groups (parallel_state_sp: consecutive ranks, the whole world one sequence-data group) and its
TP mesh (consecutive ranks too) at once; they overlap, so AutoTP x CP cannot be laid out, and our layers run it.
The grid's 'data' axis then holds CP x DP ranks; `ContextTensorGrid` is the mpu that tells DeepSpeed which is
which: gradients summed over CP and averaged over DP (the sequence-data-parallel group, sequence_parallel_size =
CP: DeepSpeed divides by |group| / CP, as for Ulysses), ZeRO-1/2 partitions over CP x DP, the batch checked
against DP, the norm's model-parallel sum over TP.

Checkpoints are the plain engine's: one mp_rank_<tp>_model_states.pt per TP rank holding this module's state dict
(names `pipe.<layer index>.<local name>`, i.e. PipelineModule names under PREFIX), plus ZeRO's optimizer files.
launcher/parallel/export.py maps those names to transformers' (hf_name) and merges the TP shards.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

# The attribute holding the PipelineModule: its parameters are saved as PREFIX + the PipelineModule's names.
PREFIX = "pipe."


def logits_vocab_group(model: nn.Module):
    """The TP group `model`'s logits are split over (this rank's V/t columns of the vocabulary), None for a model
    whose logits are whole (transformers' own). A loss computed outside the model (context.py's) needs it."""
    return model.vocab_group if isinstance(model, TensorParallelCausalLM) else None


class TensorParallelCausalLM(nn.Module):
    """A one-stage PipelineModule's layers as a causal LM: forward(input_ids, labels) -> CausalLMOutput(loss, logits),
    the logits this TP rank's columns of the vocabulary."""

    def __init__(self, pipe: nn.Module, context=None):
        super().__init__()
        self.pipe = pipe
        self.context = context  # (cp rank, cp): the blocks attend by ring attention at the head-tail positions
        # The TP group the logits are split over (pipeline.build_pipeline_module; logits_vocab_group).
        self.vocab_group = pipe.vocab_group

    def forward(self, input_ids, labels=None, position_ids=None):
        from transformers.modeling_outputs import CausalLMOutput

        from launcher.parallel.pipeline import causal_lm_loss

        inputs = input_ids
        if position_ids is not None and self.context is None:
            # data.document_mask (launcher/runtime/documents.py): positions restarting after each EOS. The embedding
            # builds transformers' within-document causal mask from them and the blocks attend with it, rotary at
            # those positions (launcher/parallel/pipeline.py EmbeddingPipe, DecoderBlockPipe).
            inputs = (input_ids, position_ids)
        elif position_ids is not None:
            # Under CP the blocks build their chunks' positions themselves (check_document_mask refuses the mask
            # with CP). context_parallel_loss passes the chunk positions: they must be the blocks'.
            from launcher.parallel.context import chunk_positions

            cp_rank, cp = self.context
            expected = chunk_positions(input_ids.shape[1] * cp, cp_rank, cp, input_ids.device)
            if not torch.equal(position_ids.reshape(-1, expected.numel())[0], expected):
                raise ValueError("position_ids are not this context-parallel rank's head-tail chunk positions")
        logits = self.pipe(inputs)
        loss = None if labels is None else causal_lm_loss(logits, labels, self.vocab_group)
        return CausalLMOutput(loss=loss, logits=logits)


class ContextTensorGrid:
    """The `mpu` of CP x TP: the PipelineModule's grid (pipe x data x model, 'data' = DP x CP with CP inside) with
    its data axis split into the CP groups and the DP groups (module docstring). Every other query (model / tensor /
    pipe parallel) is the grid's. No `initialize_sequence_parallel` attribute: DeepSpeed's groups module takes an
    mpu that has one for parallel_state_sp and then ignores its data-parallel group (utils/groups.py)."""

    def __init__(self, grid, groups):
        self._grid = grid
        (self._cp_group, self._cp_ranks), (self._dp_group, self._dp_ranks) = groups

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def get_sequence_parallel_group(self):
        return self._cp_group

    def get_sequence_parallel_rank(self):
        return self._cp_ranks.index(self._grid.get_global_rank())

    def get_sequence_parallel_world_size(self):
        return len(self._cp_ranks)

    def get_data_parallel_group(self):
        return self._dp_group

    def get_data_parallel_group_ranks(self):
        return list(self._dp_ranks)

    def get_data_parallel_rank(self):
        return self._dp_ranks.index(self._grid.get_global_rank())

    def get_data_parallel_world_size(self):
        return len(self._dp_ranks)

    # The sequence-data-parallel group (CP x DP of one TP coordinate) is the grid's own data axis.
    def get_sequence_data_parallel_group(self):
        return self._grid.get_data_parallel_group()

    def get_sequence_data_parallel_rank(self):
        return self._grid.get_data_parallel_rank()

    def get_sequence_data_parallel_world_size(self):
        return self._grid.get_data_parallel_world_size()


def build_tensor_parallel_model(cfg, layout, seed: int):
    """(model, mpu) for deepspeed.initialize: our per-rank TP(+SP) layers at pipeline_degree = 1 on the plain engine;
    with context_degree > 1 they attend by ring attention and the mpu is a ContextTensorGrid.

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
    if layout.context_degree == 1:
        return TensorParallelCausalLM(pipe), pipe._grid
    mpu = ContextTensorGrid(pipe._grid, pipe.context_groups)
    return TensorParallelCausalLM(pipe, (mpu.get_sequence_parallel_rank(), layout.context_degree)), mpu
