"""Ulysses sequence parallelism (Jacobs et al. 2023, "DeepSpeed Ulysses", section 3) for model.arch=llama.

Each of the `sp` ranks of a sequence-parallel group holds S/sp consecutive tokens of every sample. Every
layer outside attention is per token, so it runs on the local chunk unchanged. Attention needs the whole
sequence: DeepSpeed's DistributedAttention all-to-alls q, k, v from (B, S/sp, H, D) to (B, S, H/sp, D),
each rank attends over the full sequence with its H/sp heads, and a second all-to-all brings the output
back to (B, S/sp, H, D). It is plugged into transformers through its attention registry, so the
transformers model itself is used (no wrapper model).

What the chunking changes outside attention, and how it is kept exact:
- positions: rotary embeddings get the chunk's global positions (position_ids);
- the causal mask: full-sequence causal attention after the all-to-all (is_causal over S);
- the loss: next-token targets are shifted over the whole sequence before chunking (the last token of
  chunk r predicts the first token of chunk r+1), and each rank's loss is its chunk's summed cross
  entropy divided by the replica's predicted-token count, so the SP ranks' losses add up to the
  replica's mean loss. DeepSpeed sums gradients over the sequence-parallel ranks and averages only
  over data-parallel replicas (runtime/engine.py, _reduce_non_expert_gradients: dp_world_size =
  |seq-data group| / sp), which is the gradient of that sum. (DeepSpeed's HF integration gathers the
  full loss on every rank instead, and must then divide by sp: issue 4.)
Groups: deepspeed.runtime.sequence_parallel.parallel_state_sp, SP groups of consecutive ranks, the order of
launcher/plan/rankmap.py with tensor_degree 1 (SP innermost, then DP). No pipeline, no TP (layout.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ATTN_NAME = "launcher_ulysses"
_STATE: dict = {}


def _local_causal_attention(q, k, v, *args, **kwargs):
    """(B, S, h, D) full-sequence tensors of this rank's heads -> (B, S, h, D) causal SDPA output.

    Under grouped-query attention k and v may arrive with this rank's h_kv = kv/sp heads: the all-to-all
    gave rank r query heads [r a/sp, (r+1) a/sp) and KV heads [r kv/sp, (r+1) kv/sp), and query head i reads
    KV head i // (a/kv), so repeating each local KV head a/kv times lines them up."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=_STATE["scaling"])
    return out.transpose(1, 2)


def ulysses_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention function: q/k/v (B, H, S/sp, D) in, (B, S/sp, H, D) out (like sdpa_attention_forward)."""
    _STATE["scaling"] = scaling
    # Grouped-query attention: k and v cross the all-to-all with their own kv heads when sp divides them (a/kv
    # times fewer bytes than q; _local_causal_attention repeats them after), else repeated to all heads first.
    if key.shape[1] != query.shape[1] and key.shape[1] % _STATE["sp"]:
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (query, key, value))
    return _STATE["dist_attn"](q, k, v, 0), None


def setup_sequence_parallel(sp: int):
    """Create the SP groups and register the attention; returns the `mpu` module for deepspeed.initialize."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.sequence.layer import DistributedAttention
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    parallel_state_sp.initialize_sequence_parallel(sp)
    _STATE["sp"] = sp
    # scatter heads (dim 2), gather the sequence (dim 1) on (B, S, H, D) tensors, batch dim 0.
    _STATE["dist_attn"] = DistributedAttention(_local_causal_attention, parallel_state_sp.get_sequence_parallel_group(),
                                               scatter_idx=2, gather_idx=1)
    AttentionInterface.register(ATTN_NAME, ulysses_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_NAME, sdpa_mask)  # built by LlamaModel, unused by the attention above
    return parallel_state_sp


def build_sequence_parallel_model(model_cfg, seed: int, vocab_size: int, zero3_config=None):
    """The transformers model (same seeded weights as one rank) with Ulysses attention; under ZeRO-3
    (`zero3_config`: the run's DeepSpeed config) built as this rank's partitions only."""
    from launcher.runtime.model import build_model_with_attention

    return build_model_with_attention(model_cfg, seed, vocab_size, ATTN_NAME, "sequence parallelism", zero3_config)


def local_chunk(input_ids: torch.Tensor, sp_rank: int, sp: int):
    """(inputs, position_ids, targets) of this rank's S/sp tokens; targets shifted over the whole sequence."""
    seq = input_ids.shape[1]
    n = seq // sp
    lo, hi = sp_rank * n, (sp_rank + 1) * n
    targets = torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], -100)], dim=1)
    positions = torch.arange(lo, hi, device=input_ids.device).unsqueeze(0)
    return input_ids[:, lo:hi], positions, targets[:, lo:hi]


def sequence_parallel_loss(model, input_ids: torch.Tensor, sp_rank: int, sp: int) -> torch.Tensor:
    """This rank's share of the replica's mean next-token loss (the SP ranks' shares sum to it)."""
    from launcher.parallel.pipeline import local_tokens_loss_sum

    ids, positions, targets = local_chunk(input_ids, sp_rank, sp)
    predicted = input_ids.shape[0] * (input_ids.shape[1] - 1)
    return local_tokens_loss_sum(model, ids, positions, targets) / predicted
