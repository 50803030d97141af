"""The model as a DeepSpeed PipelineModule (model.arch=llama), optionally tensor-parallel inside each stage.

Layers, in order (what DeepSpeed partitions over the stages):
    EmbeddingPipe           input_ids -> hidden            (TiedLayerSpec "embed" when tie_word_embeddings)
    DecoderBlockPipe x L    hidden -> hidden               rotary cos/sin recomputed inside; causal attention
    NormPipe                final RMSNorm
    HeadPipe                hidden -> logits               (or the tied embedding, used as F.linear)
and `causal_lm_loss(logits, labels)` as the PipelineModule's loss_fn.

Weights: `build_pipeline_module` builds the full transformers model once on CPU
with the seed (launcher.runtime.model.build_model) and hands each layer its
slice. Why not "seed per layer": transformers initialises the whole model from
one RNG stream in module order, so per-layer seeds give different weights from
the unpipelined model and a PP run could not be compared with a 1-rank run for
the same seed. The cost is the full model in CPU memory on every rank while
building (fine up to a few billion parameters; at BLOOM scale start from
model.init_from or build on the meta device and load the stage's shards).
Layers built for other stages are dropped when this function returns.

Partitioning (parallel.partition_method, passed to DeepSpeed): `uniform`
(equal layer counts), `parameters` (equal parameter counts) or
`type:DecoderBlock` (equal numbers of decoder blocks; DeepSpeed matches the
regex against the layer class names, case-insensitively).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

# Class names DeepSpeed's `type:` partitioning and activation checkpointing match against.
BLOCK_CLASS = "DecoderBlockPipe"


class EmbeddingPipe(nn.Module):
    """Token embedding; with tied embeddings the same module also serves as the output head."""

    def __init__(self, source: nn.Embedding):
        super().__init__()
        self.weight = nn.Parameter(source.weight.detach().clone())

    def forward(self, input_ids):
        return F.embedding(input_ids, self.weight)


def tied_head_forward(module: EmbeddingPipe, hidden):
    """The output projection through the tied embedding matrix (logits = h E^T)."""
    return F.linear(hidden, module.weight)


class DecoderBlockPipe(nn.Module):
    """One transformers LlamaDecoderLayer taking and returning only the hidden states.

    Between pipeline stages only tensors travel, so what LlamaModel.forward computes once
    and hands every layer is recomputed here from the hidden states:
    - rotary cos/sin for positions 0..seq-1 (LlamaRotaryEmbedding, no parameters);
    - the causal mask: with attn_implementation="sdpa" and attention_mask=None,
      transformers' sdpa_attention_forward sets is_causal=True (module.is_causal is
      True for Llama), exactly the path LlamaModel takes for an unpadded batch. Eager
      attention with attention_mask=None is NOT causal, so for it an explicit additive
      mask is built.
    """

    def __init__(self, layer: nn.Module, rotary: nn.Module, attn_implementation: str, tp_shard=None):
        super().__init__()
        # LayerSpec builds only this stage's blocks, so only they are copied and sharded.
        self.layer = tp_shard(copy.deepcopy(layer)) if tp_shard is not None else layer
        self.rotary = rotary
        self.explicit_mask = attn_implementation != "sdpa"

    def forward(self, hidden):
        seq = hidden.shape[1]
        position_ids = torch.arange(seq, device=hidden.device).unsqueeze(0)
        cos_sin = self.rotary(hidden, position_ids)
        mask = None
        if self.explicit_mask:
            mask = torch.full((seq, seq), torch.finfo(hidden.dtype).min, dtype=hidden.dtype, device=hidden.device)
            mask = torch.triu(mask, diagonal=1)[None, None]
        return self.layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=cos_sin)


class NormPipe(nn.Module):
    """The final RMSNorm."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, hidden):
        return self.norm(hidden)


class HeadPipe(nn.Module):
    """The untied output projection hidden -> vocab logits."""

    def __init__(self, lm_head: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(lm_head.weight.detach().clone())

    def forward(self, hidden):
        return F.linear(hidden, self.weight)


def causal_lm_loss(logits, labels):
    """Next-token cross entropy with transformers' shift (loss_utils.ForCausalLMLoss):
    position t predicts labels[t+1]; the mean is over the (batch x (seq-1)) predicted tokens,
    computed in fp32 like transformers does (logits.float())."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, vocab), labels[:, 1:].reshape(-1), ignore_index=-100)


def _layer_specs(full, attn_implementation: str, tie: bool, tp_shard=None):
    """LayerSpecs that build each layer from its slice of the full model (`tp_shard` shards a block in place)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    inner = full.model
    specs = []
    if tie:
        specs.append(TiedLayerSpec("embed", EmbeddingPipe, inner.embed_tokens, tied_weight_attr=["weight"]))
    else:
        specs.append(LayerSpec(EmbeddingPipe, inner.embed_tokens))
    for layer in inner.layers:
        specs.append(LayerSpec(DecoderBlockPipe, layer, inner.rotary_emb, attn_implementation, tp_shard))
    specs.append(LayerSpec(NormPipe, inner.norm))
    if tie:
        specs.append(TiedLayerSpec("embed", EmbeddingPipe, inner.embed_tokens, forward_fn=tied_head_forward,
                                   tied_weight_attr=["weight"]))
    else:
        specs.append(LayerSpec(HeadPipe, full.lm_head))
    return specs


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
    if tensor_rank == 0:
        for p in module.parameters():
            # A tied embedding's second copy (DeepSpeed sets ds_pipe_replicated on it) must stay
            # uncounted: clip_grad_norm_ does not check that flag itself (measured: counting it
            # moved PP2 x DP2 tied losses by 2e-3).
            p.model_parallel = not getattr(p, "ds_pipe_replicated", False)


def build_pipeline_module(cfg, layout, seed: int):
    """The PipelineModule for `cfg.model` (arch=llama) on `layout`'s grid (PP x DP, and TP inside the blocks).

    The grid is DeepSpeed's PipeModelDataParallelTopology(num_pp, num_mp, num_dp), axes
    ['pipe', 'data', 'model']: TP innermost, the order of launcher/plan/rankmap.py.
    Must be called on every rank after torch.distributed is initialised.
    """
    import torch.distributed as dist
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from launcher.parallel.tensor import shard_llama_decoder_layer, tensor_parallel_group
    from launcher.runtime.model import attn_implementation, build_model

    if cfg.model.arch != "llama":
        raise NotImplementedError(f"pipeline parallelism is implemented for model.arch=llama, not {cfg.model.arch!r}")
    if layout.sequence_degree > 1:
        raise NotImplementedError("sequence parallelism inside a pipeline (layout.py refuses it too)")
    if dist.get_world_size() != layout.world_size:
        raise RuntimeError(f"torch.distributed world size {dist.get_world_size()} != layout.world_size {layout.world_size}")

    topology = PipeModelDataParallelTopology(num_pp=layout.pipeline_degree, num_mp=layout.tensor_degree,
                                             num_dp=layout.data_degree)
    tp_shard, tp_rank = None, 0
    if layout.tensor_degree > 1:
        group, tp_rank, size = tensor_parallel_group(topology)
        tp_shard = lambda layer: shard_llama_decoder_layer(layer, group, tp_rank, size)  # noqa: E731

    # The padded vocabulary keeps shapes equal to the unpipelined TP model (layout.py pads to a multiple of TP).
    full = build_model(cfg.model, seed, vocab_size=layout.padded_vocab_size)
    attn = attn_implementation(cfg.model.arch)
    specs = _layer_specs(full, attn, cfg.model.tie_word_embeddings, tp_shard)
    module = PipelineModule(
        layers=specs,
        topology=topology,
        loss_fn=causal_lm_loss,
        partition_method=cfg.parallel.partition_method,
        # One block per checkpoint; only decoder blocks are recomputed (the embedding and head are cheap).
        activation_checkpoint_interval=1 if cfg.model.activation_checkpointing else 0,
        checkpointable_layers=[BLOCK_CLASS],
    )
    mark_for_grad_norm(module, tp_rank)
    return module
