"""The model as a DeepSpeed PipelineModule (model.arch=llama, mistral, qwen2 or bloom), optionally tensor-parallel inside each stage.

Layers, in order (what DeepSpeed partitions over the stages):
    EmbeddingPipe           input_ids -> hidden            (TiedLayerSpec "embed" when tie_word_embeddings)
    NormPipe                bloom only: word_embeddings_layernorm (a layer of its own, so the tied
                            embedding module at the head end carries no unused LayerNorm copy)
    DecoderBlockPipe x L    hidden -> hidden   llama: rotary cos/sin recomputed inside; causal attention
    BloomDecoderBlockPipe   (bloom)            ALiBi bias and causal mask built inside the block
    NormPipe                final RMSNorm (llama) / LayerNorm ln_f (bloom)
    HeadPipe                hidden -> logits               (or the tied embedding, used as F.linear)
and `causal_lm_loss(logits, labels)` as the PipelineModule's loss_fn. Under TP the embedding, the head and the
loss are split over the vocabulary (launcher/parallel/tensor.py: each TP rank V/t rows, Megatron-LM's). `layer_hf_prefixes` names the
transformers module of every layer index, for the export (launcher/parallel/export.py).

Document masking (data.document_mask) at pipeline_degree = 1 (launcher/parallel/tensor_model.py): the module is
called with (input_ids, position_ids); EmbeddingPipe then builds the causal within-document mask once, with
transformers' own create_causal_mask (as LlamaModel.forward does: launcher/runtime/documents.py), and the LLaMA
blocks pass (hidden, position_ids, mask) on, rotary at the restarting positions; the final NormPipe drops the
two. Between pipeline stages only the hidden states travel (DeepSpeed's p2p sends the activations of a fixed
layout), so with stages the mask stays refused (config/supported.py check_document_mask).

Weights: `build_pipeline_module` builds the whole transformers model on the meta device (no bytes) and
hands each layer its (meta) modules; DeepSpeed builds only this stage's layers (LayerSpec.build), and
`SeededLayerSpec.build` then materialises just those and fills them with the launcher's seeded init
(launcher/runtime/build.py), keyed by the transformers name of every tensor (`layer_hf_prefixes`) and cut
to the rank's TP slice. So a rank holds its stage's share only, and every layout starts from the weights
a 1-rank run starts from.

Partitioning (parallel.partition_method, passed to DeepSpeed): `uniform`
(equal layer counts), `parameters` (equal parameter counts of the whole,
unsharded layers: see StagePipelineModule) or `type:DecoderBlock` (equal
numbers of decoder blocks; DeepSpeed matches the regex against the layer
class names, case-insensitively). launcher/plan/stages.py computes the same
cut without torch, for `launcher plan` and `launcher train --dry-run`.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from launcher.parallel.context import ATTN_NAME as RING_ATTENTION  # causal by its own schedule: no mask

# Class names DeepSpeed's activation checkpointing matches against; `type:DecoderBlock` partitioning
# matches both (DeepSpeed searches the regex in the class names, case-insensitively).
BLOCK_CLASSES = ["DecoderBlockPipe", "BloomDecoderBlockPipe"]


@dataclass(frozen=True)
class ArchModules:
    """Where a transformers causal LM keeps the modules the pipeline layers are cut from."""

    embed: str
    embed_norm: Optional[str]
    blocks: str
    final_norm: str
    head: str = "lm_head"


ARCH_MODULES = {
    "llama": ArchModules("model.embed_tokens", None, "model.layers", "model.norm"),
    # Mistral and Qwen2 keep LLaMA's module tree and decoder-layer signature (transformers generates their
    # modeling files from modeling_llama.py); Qwen2's q/k/v biases are sharded by ColumnParallelLinear.
    "mistral": ArchModules("model.embed_tokens", None, "model.layers", "model.norm"),
    "qwen2": ArchModules("model.embed_tokens", None, "model.layers", "model.norm"),
    "bloom": ArchModules("transformer.word_embeddings", "transformer.word_embeddings_layernorm", "transformer.h",
                         "transformer.ln_f"),
}


def layer_hf_prefixes(arch: str, num_layers: int) -> list[str]:
    """The transformers module name of every pipeline layer index (the head last, even when tied)."""
    a = ARCH_MODULES[arch]
    return ([a.embed] + ([a.embed_norm] if a.embed_norm else []) + [f"{a.blocks}.{i}" for i in range(num_layers)]
            + [a.final_norm, a.head])


class EmbeddingPipe(nn.Module):
    """Token embedding; with tied embeddings the same module also serves as the output head.

    `tp`: tensor parallelism; this rank holds its V/t rows of the vocabulary (launcher/parallel/tensor.py
    vocab_parallel_embedding: the ranks' partial embeddings are summed, or under Megatron sequence parallelism
    reduce-scattered so that each TP rank keeps its s/tp tokens, on which the blocks run).
    `mask_config`: the transformers config whose attention the blocks run (LLaMA family). Called with
    (input_ids, position_ids) (data.document_mask), the embedding returns (hidden, position_ids, mask), the mask
    from transformers' create_causal_mask exactly as LlamaModel.forward builds it: causal within each document
    that the restarting position ids delimit (None where they do not restart: SDPA's is_causal then)."""

    def __init__(self, source: nn.Embedding, tp=None, mask_config=None):
        super().__init__()
        self.weight = _vocab_rows(source.weight, tp)
        self.tp = tp
        self.mask_config = mask_config

    def _embed(self, input_ids):
        from launcher.parallel.tensor import vocab_parallel_embedding

        return F.embedding(input_ids, self.weight) if self.tp is None else \
            vocab_parallel_embedding(input_ids, self.weight, self.tp)

    def forward(self, inputs):
        if isinstance(inputs, tuple):
            from transformers.masking_utils import create_causal_mask

            input_ids, position_ids = inputs
            if self.mask_config is None or (self.tp is not None and self.tp.sequence_parallel):
                raise NotImplementedError("position ids (data.document_mask) reach the LLaMA-family blocks without "
                                          "sequence parallelism only (config/supported.py check_document_mask)")
            hidden = self._embed(input_ids)
            mask = create_causal_mask(config=self.mask_config, inputs_embeds=hidden, attention_mask=None, cache=None,
                                      position_ids=position_ids)
            return hidden, position_ids, mask
        return self._embed(inputs)


def _vocab_rows(weight: nn.Parameter, tp) -> nn.Parameter:
    """The embedding / head matrix this rank holds: whole without TP, else its V/t rows of the vocabulary (marked as
    a TP shard: launcher/runtime/build.py fills it with that slice of the seeded whole, DeepSpeed's gradient norm
    counts it on every TP rank, the export concatenates the ranks' rows)."""
    if tp is None:
        return nn.Parameter(weight.detach().clone())
    from launcher.parallel.tensor import shard_rows

    return shard_rows(weight, tp.rank, tp.size)   # layout.py pads the vocabulary to a multiple of tensor_degree


def head_logits(hidden, weight, tp):
    """hidden -> logits over this rank's vocabulary rows (all of them without TP). Under TP the input is replicated
    (Megatron's f: its gradient, a partial sum per rank, is all-reduced), or under sequence parallelism all-gathered
    by the final norm, whose backward then reduce-scatters it (NormPipe)."""
    from launcher.parallel.tensor import copy_to_tensor_parallel

    if tp is not None and not tp.sequence_parallel:
        hidden = copy_to_tensor_parallel(hidden, tp.group)
    return F.linear(hidden, weight)


def tied_head_forward(module: EmbeddingPipe, hidden):
    """The output projection through the tied embedding matrix (logits = h E^T; under TP this rank's rows of E)."""
    return head_logits(hidden, module.weight, module.tp)


class DecoderBlockPipe(nn.Module):
    """One transformers LlamaDecoderLayer taking and returning only the hidden states.

    Between pipeline stages only tensors travel, so what LlamaModel.forward computes once
    and hands every layer is recomputed here from the hidden states:
    - rotary cos/sin for positions 0..seq-1 (LlamaRotaryEmbedding, no parameters); under context parallelism
      (`context` = (cp rank, cp), with or without stages) the global positions of this rank's two head-tail
      chunks (launcher/parallel/context.py chunk_positions), whose ring attention is causal by itself;
    - the causal mask: with attn_implementation="sdpa" and attention_mask=None,
      transformers' sdpa_attention_forward sets is_causal=True (module.is_causal is
      True for Llama), exactly the path LlamaModel takes for an unpadded batch. Eager
      attention with attention_mask=None is NOT causal, so for it an explicit additive
      mask is built.
    Given (hidden, position_ids, mask) (data.document_mask at pipeline_degree = 1: EmbeddingPipe), the block
    attends with that mask and rotary at those positions instead, and returns the triple.
    """

    def __init__(self, layer: nn.Module, rotary: nn.Module, attn_implementation: str, tp=None, context=None):
        from launcher.parallel.tensor import shard_llama_decoder_layer

        super().__init__()
        # LayerSpec builds only this stage's blocks, so only they are copied and sharded.
        self.layer = shard_llama_decoder_layer(copy.deepcopy(layer), tp) if tp is not None else layer
        self.rotary = rotary
        self.explicit_mask = attn_implementation not in ("sdpa", RING_ATTENTION)
        # Under sequence parallelism the block receives s/tp tokens and its attention sees all s (gathered).
        self.seq_factor = tp.size if tp is not None and tp.sequence_parallel else 1
        self.context = context

    def forward(self, inputs):
        if isinstance(inputs, tuple):
            hidden, position_ids, mask = inputs
            cos_sin = self.rotary(hidden, position_ids)
            out = self.layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=cos_sin)
            return out, position_ids, mask
        hidden = inputs
        seq = hidden.shape[1] * self.seq_factor
        if self.context is None:
            position_ids = torch.arange(seq, device=hidden.device).unsqueeze(0)
        else:
            from launcher.parallel.context import chunk_positions

            cp_rank, cp = self.context
            position_ids = chunk_positions(seq * cp, cp_rank, cp, hidden.device).unsqueeze(0)
        cos_sin = self.rotary(hidden, position_ids)
        mask = causal_additive_mask(seq, hidden.dtype, hidden.device) if self.explicit_mask else None
        return self.layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=cos_sin)


def causal_additive_mask(seq: int, dtype, device):
    """(1, 1, seq, seq): 0 where key <= query, the dtype's minimum above the diagonal (transformers' eager mask)."""
    mask = torch.full((seq, seq), torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.triu(mask, diagonal=1)[None, None]


class BloomDecoderBlockPipe(nn.Module):
    """One transformers BloomBlock taking and returning only the hidden states.

    BloomModel.forward builds the ALiBi bias once for all blocks (Press et al. 2022, "Train Short, Test
    Long", section 3: score_ij += m_h * (j - i), of which softmax keeps only m_h * j); here it is rebuilt
    per block exactly as transformers does for an unpadded batch (modeling_bloom.py: slopes[:, None, None]
    * arange(kv_length), repeated over the batch, cast to the hidden dtype), for this rank's heads only
    under tensor parallelism (heads [rank*h/tp, (rank+1)*h/tp), the ones its qkv shard computes). The
    eager causal mask is the additive one transformers' create_causal_mask gives BloomBlock.
    """

    def __init__(self, layer: nn.Module, num_heads: int, tp=None):
        from launcher.parallel.tensor import shard_bloom_block

        super().__init__()
        self.layer = shard_bloom_block(copy.deepcopy(layer), tp) if tp is not None else layer
        local = num_heads // (tp.size if tp is not None else 1)
        first = local * (tp.rank if tp is not None else 0)
        self.num_heads, self.heads = num_heads, (first, first + local)

    def forward(self, hidden):
        from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

        batch, seq, _ = hidden.shape
        slopes = _get_alibi_slopes(self.num_heads, hidden.device)[self.heads[0]:self.heads[1]]
        alibi = (slopes[:, None, None] * torch.arange(seq, device=hidden.device)).repeat(batch, 1, 1).to(hidden.dtype)
        mask = causal_additive_mask(seq, hidden.dtype, hidden.device)
        return self.layer(hidden, alibi=alibi, attention_mask=mask)[0]


class NormPipe(nn.Module):
    """A RMSNorm / LayerNorm (final, or Bloom's word-embedding LayerNorm).

    `sp_group` (the final norm under sequence parallelism): the norm runs on this rank's s/tp tokens, its
    weight gradient is summed over the TP ranks, and the output is all-gathered for the vocabulary-parallel head,
    whose input gradient, a partial sum on each TP rank, is reduce-scattered back.
    Given the blocks' (hidden, position_ids, mask) (data.document_mask), the final norm returns the hidden states
    alone, for the head (BLOOM, whose embedding norm also is a NormPipe, takes no position ids)."""

    def __init__(self, norm: nn.Module, sp_group=None):
        from launcher.parallel.tensor import mark_sequence_parallel

        super().__init__()
        self.norm = norm
        self.sp_group = sp_group
        if sp_group is not None:
            mark_sequence_parallel(self.norm)

    def forward(self, hidden):
        from launcher.parallel.tensor import gather_from_sequence

        if isinstance(hidden, tuple):
            hidden = hidden[0]
        hidden = self.norm(hidden)
        return hidden if self.sp_group is None else gather_from_sequence(hidden, self.sp_group, partial_grads=True)


class HeadPipe(nn.Module):
    """The untied output projection hidden -> vocab logits (under TP: this rank's V/t rows, Megatron's
    ColumnParallelLinear with parallel_output=True; the loss takes the logits split)."""

    def __init__(self, lm_head: nn.Linear, tp=None):
        super().__init__()
        self.weight = _vocab_rows(lm_head.weight, tp)
        self.tp = tp

    def forward(self, hidden):
        return head_logits(hidden, self.weight, self.tp)


def context_groups(grid, cp: int):
    """((CP group, its ranks), (DP group, its ranks)) of this rank on a grid whose 'data' axis is DP x CP, CP inside
    (build_pipeline_module). Collective: every rank creates every group, in one order."""
    import torch.distributed as dist

    topo = grid.topology()
    pipes, tps, dp = topo.get_dim("pipe"), topo.get_dim("model"), topo.get_dim("data") // cp
    me = dist.get_rank()
    mine = {}
    for pipe in range(pipes):
        for t in range(tps):
            for axis, lists in (("cp", [[(d, c) for c in range(cp)] for d in range(dp)]),
                                ("dp", [[(d, c) for d in range(dp)] for c in range(cp)])):
                for coords in lists:
                    ranks = [topo.get_rank(pipe=pipe, data=d * cp + c, model=t) for d, c in coords]
                    group = dist.new_group(ranks)
                    if me in ranks:
                        mine[axis] = (group, ranks)
    return mine["cp"], mine["dp"]


def context_pipeline_loss(logits, targets, cp: int, tp_group=None):
    """The pipeline engine's loss under CP: this rank's share of the replica's mean next-token loss
    (launcher/parallel/context.py context_parallel_loss: `targets` shifted over the whole sequence, then chunked),
    times cp. DeepSpeed's pipeline engine averages gradients (and the reported loss) over its grid's data axis,
    which under CP holds the DP x CP ranks; the factor cp turns that average into the sum over the CP ranks and the
    mean over the DP replicas that the replica's loss needs."""
    predicted = targets.shape[0] * (targets.shape[1] * cp - 1)
    return token_loss_sum(logits, targets, tp_group) * cp / predicted


def token_loss_sum(logits, targets, tp_group=None):
    """The summed fp32 next-token losses of `targets` (already aligned with the logits; -100 ignored), the logits
    whole or (`tp_group`) split over the vocabulary (launcher/parallel/tensor.py vocab_parallel_cross_entropy)."""
    if tp_group is not None:
        from launcher.parallel.tensor import vocab_parallel_cross_entropy

        return vocab_parallel_cross_entropy(logits, targets, tp_group).sum()
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                           reduction="sum")


def local_tokens_loss_sum(model, ids, positions, targets, tp_group=None):
    """The summed fp32 next-token losses of a rank's own tokens (Ulysses' and ring attention's losses), their
    `targets` already aligned: through the model's chunked head and loss where model.chunked_loss installed it
    (launcher/runtime/chunked_loss.py), else from its whole logits (token_loss_sum)."""
    from launcher.runtime import chunked_loss

    if chunked_loss.installed(model):
        return model(input_ids=ids, position_ids=positions, targets=targets).loss
    return token_loss_sum(model(input_ids=ids, position_ids=positions).logits, targets, tp_group)


def causal_lm_loss(logits, labels, tp_group=None):
    """Next-token cross entropy with transformers' shift (loss_utils.ForCausalLMLoss):
    position t predicts labels[t+1]; the mean is over the (batch x (seq-1)) predicted tokens,
    computed in fp32 like transformers does (logits.float()). `tp_group`: the logits are split over the vocabulary."""
    targets = labels[:, 1:]
    return token_loss_sum(logits[:, :-1], targets, tp_group) / (targets != -100).sum()


class ReleasingLoss:
    """The PipelineModule's loss_fn: `loss_fn(logits, labels)`, then the logits' storage released.

    DeepSpeed's PipelineEngine keeps each micro-batch's outputs (on the last stage the logits, w V/t bytes a token) in
    pipe_buffers['outputs'], and on the last stage its backward returns before clearing them (deepspeed 0.19.8
    runtime/pipe/engine.py _exec_backward_pass), so with the 2 buffers it reserves there (TrainSchedule.
    num_pipe_buffers) the logits of the current and the previous micro-batch stayed alive through every backward and
    past the step: 2 x 2 x 8,192 x 128,256 bytes = 4.2 GB at Llama 3's vocabulary in bf16 at micro-batch 1.
    Autograd never reads them back: the loss saves its fp32 (log-)softmax and the head its input and weight
    (tests/plan/test_loss_end_memory.py reads the peak with and without the engine's reference). DeepSpeed frees a
    non-last stage's partitioned outputs the same way (first_output.data = torch.zeros(1))."""

    def __init__(self, loss_fn):
        self.loss_fn = loss_fn

    def __call__(self, logits, labels):
        loss = self.loss_fn(logits, labels)
        logits.data = logits.new_empty(0)
        return loss


def _hf_namer(prefix: str):
    """Local parameter name inside a pipeline layer -> the whole transformers model's name.
    The Pipe wrappers keep the transformers module as `layer` or `norm`, or the tensor itself as `weight`."""
    def name(local: str) -> str:
        head, _, rest = local.partition(".")
        return f"{prefix}.{rest}" if head in ("layer", "norm") and rest else f"{prefix}.{local}"
    return name


def _seeded_spec_classes():
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    class _Seeded:
        """A LayerSpec whose module is built on meta and materialised (this rank's part only) when placed."""

        hf_prefix: str
        init = None             # SeededInit; None: stay on meta (the dry run)
        unsharded_params = 0    # what `parameters` partitioning weighs (StagePipelineModule)

        def build(self, log=False):
            from launcher.runtime.build import materialise_

            module = super().build(log)
            if self.init is not None:
                materialise_(module, self.init, _hf_namer(self.hf_prefix))
            return module

    class SeededLayerSpec(_Seeded, LayerSpec):
        pass

    class SeededTiedLayerSpec(_Seeded, TiedLayerSpec):
        pass

    return SeededLayerSpec, SeededTiedLayerSpec


def layer_specs(full, arch: str, attn_implementation: str, tie: bool, tp=None, init=None, context=None):
    """LayerSpecs that build each layer from the modules of `full` (the whole model on meta), in the order of
    `layer_hf_prefixes`; `tp`: shard the blocks on that group; `init`: materialise and fill when built;
    `context`: (cp rank, cp) of ring-attention context parallelism (the blocks' positions)."""
    from launcher.runtime.build import meta_params

    SeededLayerSpec, SeededTiedLayerSpec = _seeded_spec_classes()
    names = ARCH_MODULES[arch]
    embed = full.get_submodule(names.embed)
    rotary = None
    if arch != "bloom":
        # The rotary buffers are computed, not initialised: one real CPU copy shared by the stage's blocks.
        rotary = type(full.model.rotary_emb)(config=full.config)
    prefixes = layer_hf_prefixes(arch, full.config.num_hidden_layers)
    sp_group = tp.group if tp is not None and tp.sequence_parallel else None   # the final norm's
    mask_config = full.config if arch != "bloom" else None  # the document mask's (EmbeddingPipe)
    specs = []
    if tie:
        specs.append(SeededTiedLayerSpec("embed", EmbeddingPipe, embed, tp, mask_config,
                                         tied_weight_attr=["weight"]))
    else:
        specs.append(SeededLayerSpec(EmbeddingPipe, embed, tp, mask_config))
    if names.embed_norm:
        specs.append(SeededLayerSpec(NormPipe, full.get_submodule(names.embed_norm)))
    for layer in full.get_submodule(names.blocks):
        if arch != "bloom":
            specs.append(SeededLayerSpec(DecoderBlockPipe, layer, rotary, attn_implementation, tp, context))
        else:
            specs.append(SeededLayerSpec(BloomDecoderBlockPipe, layer, full.config.n_head, tp))
    specs.append(SeededLayerSpec(NormPipe, full.get_submodule(names.final_norm), sp_group))
    if tie:
        specs.append(SeededTiedLayerSpec("embed", EmbeddingPipe, embed, tp, mask_config,
                                         forward_fn=tied_head_forward, tied_weight_attr=["weight"]))
    else:
        specs.append(SeededLayerSpec(HeadPipe, full.get_submodule(names.head), tp))
    for spec, prefix in zip(specs, prefixes):
        # The tied head is the embedding: the same name, so the same seeded values on both end stages.
        spec.hf_prefix = names.embed if (tie and prefix == names.head) else prefix
        spec.init = init
        spec.unsharded_params = meta_params(full.get_submodule(prefix if prefix != names.head or not tie else names.embed))
    return specs


def _stage_pipeline_module_class():
    from deepspeed.pipe import PipelineModule

    class StagePipelineModule(PipelineModule):
        """DeepSpeed's PipelineModule, counting layers for `partition_method=parameters` without building them.

        DeepSpeed 0.19.8's _count_layer_params builds every layer on every rank to count it (pipe/module.py
        303-320; at BLOOM scale that is the 14.4 GB fp32 embedding on every rank: docs/parallel-
        notes.md, section 2). Our specs know each layer's size from the meta model. The count is the whole
        (unsharded) layer, so the cut does not depend on the TP degree (launcher/plan/stages.py).
        """

        def _count_layer_params(self):
            return [spec.unsharded_params for spec in self._layer_specs]

        # model.checkpoint_blocks: only the stage's first N decoder blocks are checkpointed (Megatron's
        # --recompute-method block); DeepSpeed checkpoints every checkpointable layer, so its per-layer flags
        # (one per layer at activation_checkpoint_interval 1) are cleared past the N-th block. None: all.
        checkpoint_blocks = None

        def _precompute_checkpointable_values(self):
            super()._precompute_checkpointable_values()
            if self.checkpoint_blocks is not None and self.activation_checkpoint_interval == 1:
                seen = 0
                for i, checkpointable in enumerate(self.is_checkpointable_results):
                    if checkpointable:
                        seen += 1
                        self.is_checkpointable_results[i] = seen <= self.checkpoint_blocks

    return StagePipelineModule


def mark_for_grad_norm(module: nn.Module, tensor_rank: int) -> None:
    """Make DeepSpeed's fp32 (ZeRO-0) gradient clipping count every stage's parameters once.

    deepspeed/runtime/utils.py clip_grad_norm_ counts a parameter not marked model-parallel only
    when mpu.get_model_parallel_rank() == 0, and the pipeline grid's model-parallel group spans
    pipeline stages x TP ranks, so only stage 0's replicated parameters would enter the global
    norm (the ZeRO-1 and BF16 optimizers ask for the *tensor*-parallel rank instead and are right).
    Marking everything on TP rank 0 makes both rules count each parameter exactly once; on TP
    ranks > 0 only the sharded parameters (already marked) count. Measured without it: PP2
    fp32 ZeRO-0 drifts 3.5e-4 from one rank in 6 steps; with it, 6e-7.
    """
    for p in module.parameters():
        if getattr(p, "ds_pipe_replicated", False):
            # A tied embedding's second copy (DeepSpeed sets ds_pipe_replicated on it) must stay uncounted on every
            # TP rank, its vocabulary rows too: clip_grad_norm_ does not check that flag itself (measured: counting
            # it moved PP2 x DP2 tied losses by 2e-3).
            p.model_parallel = p.tensor_model_parallel = False
        elif tensor_rank == 0:
            p.model_parallel = True


def build_pipeline_module(cfg, layout, seed: int):
    """The PipelineModule for `cfg.model` (arch=llama or bloom) on `layout`'s grid (PP x DP, and TP inside the blocks).

    The grid is DeepSpeed's PipeModelDataParallelTopology(num_pp, num_mp, num_dp), axes
    ['pipe', 'data', 'model']: TP innermost, the order of launcher/plan/rankmap.py. Under context parallelism
    its 'data' axis holds data_degree x context_degree ranks, CP inside DP (data coordinate dp x CP + cp, rankmap.py's
    order); the blocks attend by ring attention over the CP groups made here (`module.context_groups`), and the loss
    is context_pipeline_loss (the pipeline engine averages over that whole axis: the loss's factor cp says why). At
    pipeline_degree = 1 launcher/parallel/tensor_model.py tells DeepSpeed's plain engine which ranks are which.
    Must be called on every rank after torch.distributed is initialised.
    """
    import torch.distributed as dist
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from launcher.parallel.tensor import register_sequence_parallel_grad_hooks, tensor_parallel_group
    from launcher.plan.inputs import model_shape
    from launcher.plan.stages import stage_bounds
    from launcher.runtime.build import CheckpointSlices, SeededInit, init_rules, meta_model
    from launcher.runtime.model import attn_implementation

    if cfg.model.arch not in ARCH_MODULES:
        raise NotImplementedError(f"pipeline parallelism is implemented for model.arch in {sorted(ARCH_MODULES)}, "
                                  f"not {cfg.model.arch!r}")
    if layout.sequence_degree > 1:
        raise NotImplementedError("sequence parallelism inside a pipeline (layout.py refuses it too)")
    cp = layout.context_degree
    if dist.get_world_size() != layout.world_size:
        raise RuntimeError(f"torch.distributed world size {dist.get_world_size()} != layout.world_size {layout.world_size}")

    topology = PipeModelDataParallelTopology(num_pp=layout.pipeline_degree, num_mp=layout.tensor_degree,
                                             num_dp=layout.data_degree * cp)
    tp = tensor_parallel_group(topology, layout.sequence_parallel) if layout.tensor_degree > 1 else None
    tp_group = tp.group if tp is not None else None   # the loss's: the head's logits are split over the vocabulary

    # The padded vocabulary keeps shapes equal to the unpipelined TP model (layout.py pads to a multiple of TP).
    full = meta_model(cfg.model, vocab_size=layout.padded_vocab_size)
    attention, context = attn_implementation(cfg.model.arch), None
    if cp > 1:
        from launcher.parallel.context import register_ring_attention
        from launcher.plan.rankmap import rank_coord

        register_ring_attention()
        full.set_attn_implementation(RING_ATTENTION)  # copied into every block's attention config
        attention, context = RING_ATTENTION, (rank_coord(layout, dist.get_rank()).cp, cp)
    # model.init_from: each rank reads only its layers' slices; otherwise the seeded init (launcher/runtime/build.py).
    init = CheckpointSlices(cfg.model.init_from) if cfg.model.init_from else SeededInit(seed, init_rules(full))
    specs = layer_specs(full, cfg.model.arch, attention, cfg.model.tie_word_embeddings, tp, init, context)
    module = _stage_pipeline_module_class()(
        layers=specs,
        topology=topology,
        loss_fn=ReleasingLoss(functools.partial(context_pipeline_loss, cp=cp, tp_group=tp_group) if cp > 1
                              else functools.partial(causal_lm_loss, tp_group=tp_group)),
        partition_method=cfg.parallel.partition_method,
        # One block per checkpoint; only decoder blocks are recomputed (the embedding and head are cheap).
        activation_checkpoint_interval=1 if cfg.model.activation_checkpointing else 0,
        checkpointable_layers=BLOCK_CLASSES,
    )
    module.checkpoint_blocks = getattr(cfg.model, "checkpoint_blocks", None)   # before the engine reads the flags
    planned = list(stage_bounds(model_shape(cfg.model), layout.padded_vocab_size, layout.pipeline_degree,
                                cfg.parallel.partition_method))
    if [int(b) for b in module.parts] != planned:
        raise RuntimeError(f"DeepSpeed cut the pipeline at {module.parts}, launcher/plan/stages.py at {planned}: "
                           "the plan and --dry-run would misreport the stages")
    mark_for_grad_norm(module, tp.rank if tp is not None else 0)
    module.vocab_group = tp_group   # whoever computes a loss from this module's logits (tensor_model.py) needs it
    if cp > 1:
        from launcher.parallel.context import use_ring_group

        module.context_groups = context_groups(module._grid, cp)
        use_ring_group(module.context_groups[0][0])
    if tp is not None and tp.sequence_parallel:
        register_sequence_parallel_grad_hooks(module, tp.group)
    return module
