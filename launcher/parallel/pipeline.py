"""The model as a DeepSpeed PipelineModule (model.arch=llama or bloom), optionally tensor-parallel inside each stage.

Layers, in order (what DeepSpeed partitions over the stages):
    EmbeddingPipe           input_ids -> hidden            (TiedLayerSpec "embed" when tie_word_embeddings)
    NormPipe                bloom only: word_embeddings_layernorm (a layer of its own, so the tied
                            embedding module at the head end carries no unused LayerNorm copy)
    DecoderBlockPipe x L    hidden -> hidden   llama: rotary cos/sin recomputed inside; causal attention
    BloomDecoderBlockPipe   (bloom)            ALiBi bias and causal mask built inside the block
    NormPipe                final RMSNorm (llama) / LayerNorm ln_f (bloom)
    HeadPipe                hidden -> logits               (or the tied embedding, used as F.linear)
and `causal_lm_loss(logits, labels)` as the PipelineModule's loss_fn. `layer_hf_prefixes` names the
transformers module of every layer index, for the export (launcher/parallel/export.py).

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
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

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
    "bloom": ArchModules("transformer.word_embeddings", "transformer.word_embeddings_layernorm", "transformer.h",
                         "transformer.ln_f"),
}


def layer_hf_prefixes(arch: str, num_layers: int) -> list[str]:
    """The transformers module name of every pipeline layer index (the head last, even when tied)."""
    a = ARCH_MODULES[arch]
    return ([a.embed] + ([a.embed_norm] if a.embed_norm else []) + [f"{a.blocks}.{i}" for i in range(num_layers)]
            + [a.final_norm, a.head])


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

    def __init__(self, layer: nn.Module, rotary: nn.Module, attn_implementation: str, tp=None):
        from launcher.parallel.tensor import shard_llama_decoder_layer

        super().__init__()
        # LayerSpec builds only this stage's blocks, so only they are copied and sharded.
        self.layer = shard_llama_decoder_layer(copy.deepcopy(layer), tp) if tp is not None else layer
        self.rotary = rotary
        self.explicit_mask = attn_implementation != "sdpa"

    def forward(self, hidden):
        seq = hidden.shape[1]
        position_ids = torch.arange(seq, device=hidden.device).unsqueeze(0)
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
    """A RMSNorm / LayerNorm (final, or Bloom's word-embedding LayerNorm)."""

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


def _layer_specs(full, arch: str, attn_implementation: str, tie: bool, tp=None):
    """LayerSpecs that build each layer from its slice of the full model (`tp`: shard the blocks on that group)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    names = ARCH_MODULES[arch]
    embed = full.get_submodule(names.embed)
    specs = []
    if tie:
        specs.append(TiedLayerSpec("embed", EmbeddingPipe, embed, tied_weight_attr=["weight"]))
    else:
        specs.append(LayerSpec(EmbeddingPipe, embed))
    if names.embed_norm:
        specs.append(LayerSpec(NormPipe, full.get_submodule(names.embed_norm)))
    for layer in full.get_submodule(names.blocks):
        if arch == "llama":
            specs.append(LayerSpec(DecoderBlockPipe, layer, full.model.rotary_emb, attn_implementation, tp))
        else:
            specs.append(LayerSpec(BloomDecoderBlockPipe, layer, full.config.n_head, tp))
    specs.append(LayerSpec(NormPipe, full.get_submodule(names.final_norm)))
    if tie:
        specs.append(TiedLayerSpec("embed", EmbeddingPipe, embed, forward_fn=tied_head_forward,
                                   tied_weight_attr=["weight"]))
    else:
        specs.append(LayerSpec(HeadPipe, full.get_submodule(names.head)))
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
    """The PipelineModule for `cfg.model` (arch=llama or bloom) on `layout`'s grid (PP x DP, and TP inside the blocks).

    The grid is DeepSpeed's PipeModelDataParallelTopology(num_pp, num_mp, num_dp), axes
    ['pipe', 'data', 'model']: TP innermost, the order of launcher/plan/rankmap.py.
    Must be called on every rank after torch.distributed is initialised.
    """
    import torch.distributed as dist
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from launcher.parallel.tensor import tensor_parallel_group
    from launcher.runtime.model import attn_implementation, build_model

    if cfg.model.arch not in ARCH_MODULES:
        raise NotImplementedError(f"pipeline parallelism is implemented for model.arch in {sorted(ARCH_MODULES)}, "
                                  f"not {cfg.model.arch!r}")
    if layout.sequence_degree > 1:
        raise NotImplementedError("sequence parallelism inside a pipeline (layout.py refuses it too)")
    if dist.get_world_size() != layout.world_size:
        raise RuntimeError(f"torch.distributed world size {dist.get_world_size()} != layout.world_size {layout.world_size}")

    topology = PipeModelDataParallelTopology(num_pp=layout.pipeline_degree, num_mp=layout.tensor_degree,
                                             num_dp=layout.data_degree)
    tp = tensor_parallel_group(topology) if layout.tensor_degree > 1 else None

    # The padded vocabulary keeps shapes equal to the unpipelined TP model (layout.py pads to a multiple of TP).
    full = build_model(cfg.model, seed, vocab_size=layout.padded_vocab_size)
    attn = attn_implementation(cfg.model.arch)
    specs = _layer_specs(full, cfg.model.arch, attn, cfg.model.tie_word_embeddings, tp)
    module = PipelineModule(
        layers=specs,
        topology=topology,
        loss_fn=causal_lm_loss,
        partition_method=cfg.parallel.partition_method,
        # One block per checkpoint; only decoder blocks are recomputed (the embedding and head are cheap).
        activation_checkpoint_interval=1 if cfg.model.activation_checkpointing else 0,
        checkpointable_layers=BLOCK_CLASSES,
    )
    mark_for_grad_norm(module, tp.rank if tp is not None else 0)
    return module
