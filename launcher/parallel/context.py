"""Context parallelism by ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"), causal and
load-balanced, for model.arch=llama / mistral / qwen2.

Each of the `cp` ranks of a context-parallel group holds 2 chunks of S/(2 cp) tokens of every sample of its replica:
rank r holds chunks r and 2cp-1-r ("head-tail"). Every layer outside attention is per token, so it runs on the
local S/cp tokens unchanged. Attention keeps the local queries and passes the keys and values around the ring:
cp - 1 rotations, each rank attending its queries to one rank's keys/values per step and merging the partial
outputs by their logsumexp (the online softmax of flash attention). Causal work is then equal on every rank:
with contiguous chunks rank r would attend r + 1 blocks (at CP4, S=256: [2048, 6144, 10240, 14336] score entries
per rank); head-tail gives every rank the same (8192 each) (counted in the investigation for issue 13;
Llama 3, Dubey et al. 2024, section 3.3.2, uses the same 2 x CP chunking).

Which kernel, and why:
- torch's own ring: `_templated_ring_attention` / `_templated_ring_attention_backward` (torch 2.13,
  torch/distributed/tensor/experimental/_context_parallel/_attention.py), called on plain local tensors inside
  the autograd.Function below. Not the public `context_parallel()`: it runs SDPA on DTensors and its sharding
  strategies cover only the CUDA flash / efficient / cuDNN ops ("Operator
  aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy registered").
  The private functions are the same ring with the head-tail schedule (`_cp_options.enable_load_balance`, a
  module global we set to match the layout fed in), and are exact: out / dq / dk / dv within 2e-6 of full causal
  SDPA on 2 and 4 ranks with grouped-query attention (measured for issue 13); tests/parallel/test_context_parallel.py
  holds whole runs to 1 rank.
- the per-block op: `aten._scaled_dot_product_flash_attention_for_cpu` (+ _backward) on CPU ranks; on CUDA
  `aten._scaled_dot_product_flash_attention` through torch's own wrapper for it, as its `context_parallel` uses
  (that path has not been run here: this project's CI has no GPU).
- fallback if torch moves or drops the private API: a hand-written ring of about 45 lines (P2P rotation by
  `batch_isend_irecv`, per-block masked matmul + logsumexp with `pos_q >= pos_k`, `logaddexp` merge; fully
  masked blocks need a finite fill, -inf gives NaN). It was measured equally exact but saves more for backward
  (78 % of 1 rank at CP2 against 57 %), because it keeps the scores per block. `_ring_functions` names the
  import that would fail.

What the chunking changes outside attention, and how it stays exact (as for Ulysses, launcher/parallel/sequence.py):
- positions: rotary embeddings get the chunks' global positions (position_ids), both chunks;
- the loss: targets are shifted over the whole sequence before chunking, and each rank's loss is its tokens'
  summed cross entropy divided by the replica's predicted-token count, so the cp shares add up to the replica's
  mean loss; DeepSpeed (mpu = parallel_state_sp, "sequence_parallel_size" = cp) sums the gradients over the CP
  ranks and averages over the data-parallel replicas, which is the gradient of that sum. ZeRO-3 needs
  reduce_scatter off for that sum (launcher/deepspeed_config.py, zero3_sequence_parallel_reduction).
Groups: parallel_state_sp's consecutive-rank groups, the order of launcher/plan/rankmap.py (CP inside DP). With
tensor parallelism or a pipeline (CP x TP on the plain engine, launcher/parallel/tensor_model.py; CP x PP on the
pipeline engine, launcher/parallel/pipeline.py) the CP group is the ranks of one TP coordinate, one stage and one
replica, TP ranks apart (pipeline.context_groups); each TP rank rings its own heads.
"""

from __future__ import annotations

import torch

ATTN_NAME = "launcher_ring"
_STATE: dict = {}


def _ring_functions():
    """torch's private ring kernel (the module docstring says why, and what replaces it if this import fails)."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

    return cp_attention


class _GroupMesh:
    """What torch's ring wrappers read from their DeviceMesh argument: only get_group()."""

    def __init__(self, group):
        self._group = group

    def get_group(self):
        return self._group


def _repeat_kv(q, k, v):
    """k, v repeated to q's head count for grouped-query attention (the block kernels take equal head counts)."""
    rep = q.shape[1] // k.shape[1]
    return (k, v) if rep == 1 else (k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1))


class RingAttention(torch.autograd.Function):
    """Causal ring attention over the CP group: local q (B, H, S/cp, D), k, v (B, Hkv, S/cp, D) -> out (B, S/cp, H, D).

    Saves q, k, v as given (k, v not repeated for grouped-query attention), the output and the fp32 logsumexp:
    per local token what one-rank SDPA saves. The output is stored (B, S, H, D)-contiguous, the layout o_proj
    reads, so it is also o_proj's saved input (one storage, as with SDPA on one rank).
    CPU: torch's templated ring with the CPU flash op. CUDA: torch's own wrappers of that ring around the CUDA flash
    op (what its `context_parallel` dispatches to; 16-bit only, so layout checks refuse fp32 CP on GPUs), with the
    forward's extra outputs (philox state, cumulative lengths) handed to the backward as its autograd formula does.
    """

    @staticmethod
    def forward(ctx, q, k, v, scale):
        ring = _ring_functions()
        group = _STATE["group"]
        kr, vr = _repeat_kv(q, k, v)
        if q.device.type == "cpu":
            out, lse = ring._templated_ring_attention(group, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                                                      q, kr, vr, is_causal=True, dropout_p=0.0, scale=scale)[:2]
            ctx.rest = ()
        else:
            out, lse, *rest = ring._scaled_dot_product_ring_flash_attention(_GroupMesh(group), q, kr, vr, dropout_p=0.0,
                                                                            is_causal=True, scale=scale)
            ctx.rest = tuple(rest[:6])  # cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset
        out = out.transpose(1, 2).contiguous()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        ring = _ring_functions()
        q, k, v, out, lse = ctx.saved_tensors
        kr, vr = _repeat_kv(q, k, v)
        grad_out, out = grad_out.transpose(1, 2).contiguous(), out.transpose(1, 2)
        if q.device.type == "cpu":
            dq, dk, dv = ring._templated_ring_attention_backward(
                _STATE["group"], 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                grad_out, "grad_out", q, kr, vr, out.contiguous(), lse, is_causal=True, dropout_p=0.0, scale=ctx.scale)[:3]
        else:
            cq, ck, mq, mk, seed, offset = ctx.rest
            dq, dk, dv = ring._scaled_dot_product_ring_flash_attention_backward(
                _GroupMesh(_STATE["group"]), grad_out, q, kr, vr, out, lse, cq, ck, mq, mk, 0.0, True, seed, offset,
                scale=ctx.scale)[:3]
        rep = q.shape[1] // k.shape[1]
        if rep > 1:  # each kv head served `rep` query heads: its gradient is their sum
            dk = dk.unflatten(1, (k.shape[1], rep)).sum(2)
            dv = dv.unflatten(1, (v.shape[1], rep)).sum(2)
        return dq, dk, dv, None


def ring_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention function: q/k/v (B, H, S/cp, D) in, (B, S/cp, H, D) out (like sdpa_attention_forward).

    The causal mask is implied by the head-tail schedule (the mask transformers builds is not used)."""
    if dropout:
        raise NotImplementedError("launcher_ring runs without attention dropout (the llama family has none)")
    return RingAttention.apply(query, key, value, scaling), None


def _exchange_synchronously_on_cpu(ring) -> None:
    """Make torch's ring rotaters exchange CPU tensors (K/V, and dK/dV in the backward) with plain blocking c10d calls
    instead of its asynchronous functional collectives.

    Why: on gloo, CP launches on CPU ranks died, rarely, inside the functional collectives' `wait_tensor` (its work
    registry): first SIGABRT / SIGSEGV in `dkv_rotater.next_buffer()` with two exchanges in flight (3 of some 40 test
    launches on the 2-core machine), then, with each exchange waited for as soon as it was issued, `free(): invalid
    pointer` in `wait_tensor` under the forward's K/V exchange (one rank of the cp2-dp2 launch in a CI run of
    2026-12-07, faulthandler's stack in tests/parallel/test_context_parallel.py's message; a few in a thousand
    launches). The blocking calls move the same bytes between the same ranks without that registry: the K/V rotation
    is all_to_all_single with one non-empty split (what permute_tensor issues), the gather all_gather_into_tensor.
    On CPU ranks gloo moves the bytes on the same cores, so there is no compute to overlap with. CUDA tensors keep
    torch's asynchronous path."""
    import torch.distributed as dist

    def permute(self, curr_buffer, _issue=ring._AllToAllRotater.exchange_buffers):
        if curr_buffer.device.type != "cpu":
            return _issue(self, curr_buffer)
        flat = curr_buffer.contiguous().reshape(-1)
        size, me = dist.get_world_size(self._pg), dist.get_rank(self._pg)
        send, recv = [0] * size, [0] * size
        send[(me + 1) % size], recv[(me - 1) % size] = flat.numel(), flat.numel()   # rank r sends to r + 1
        out = torch.empty_like(flat)
        dist.all_to_all_single(out, flat, output_split_sizes=recv, input_split_sizes=send, group=self._pg)
        self._buffer = out.view(curr_buffer.shape)

    def gather(self, curr_buffer, _issue=ring._AllGatherRotater.exchange_buffers):
        if curr_buffer.device.type != "cpu":
            return _issue(self, curr_buffer)
        self._idx += 1
        if self._aggregated_buffer is None:     # one gather serves every step, as torch's
            x = curr_buffer.contiguous()
            out = x.new_empty((x.shape[0] * dist.get_world_size(self._pg), *x.shape[1:]))
            dist.all_gather_into_tensor(out, x, group=self._pg)
            self._aggregated_buffer = out

    for cls, fn in ((ring._AllToAllRotater, permute), (ring._AllGatherRotater, gather)):
        if not getattr(cls.exchange_buffers, "_launcher_blocking", False):
            fn._launcher_blocking = True
            cls.exchange_buffers = fn


def register_ring_attention() -> None:
    """Register the ring as transformers attention `ATTN_NAME` and set torch's ring to head-tail."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    ring = _ring_functions()
    # Module-global in torch: the ring's causal schedule must match the head-tail chunks local_chunk feeds it.
    ring._cp_options.enable_load_balance = True
    _exchange_synchronously_on_cpu(ring)
    AttentionInterface.register(ATTN_NAME, ring_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_NAME, sdpa_mask)  # built by LlamaModel, unused by ring_attention


def use_ring_group(group) -> None:
    """Make ring attention rotate over `group`, this rank's CP ranks: DeepSpeed's sequence-parallel group
    (setup_context_parallel), or under CP x TP the CP group of our TP grid (launcher/parallel/tensor_model.py)."""
    register_ring_attention()
    _STATE["group"] = group


def setup_context_parallel(cp: int):
    """Create the CP groups (DeepSpeed's sequence-parallel groups) and point ring attention at this rank's; returns
    the `mpu` module for deepspeed.initialize."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    parallel_state_sp.initialize_sequence_parallel(cp)
    use_ring_group(parallel_state_sp.get_sequence_parallel_group())
    return parallel_state_sp


def build_context_parallel_model(model_cfg, seed: int, vocab_size: int, zero3_config=None):
    """The transformers model (same seeded weights as one rank) with ring attention; under ZeRO-3
    (`zero3_config`: the run's DeepSpeed config) built as this rank's partitions only."""
    from launcher.runtime.model import build_model_with_attention

    return build_model_with_attention(model_cfg, seed, vocab_size, ATTN_NAME, "context parallelism", zero3_config)


def chunk_positions(seq: int, cp_rank: int, cp: int, device=None) -> torch.Tensor:
    """The global positions rank `cp_rank` holds: chunks cp_rank and 2cp-1-cp_rank of S/(2cp) tokens each."""
    n = seq // (2 * cp)
    head = torch.arange(cp_rank * n, (cp_rank + 1) * n, device=device)
    tail = torch.arange((2 * cp - 1 - cp_rank) * n, (2 * cp - cp_rank) * n, device=device)
    return torch.cat([head, tail])


def local_chunk(input_ids: torch.Tensor, cp_rank: int, cp: int):
    """(inputs, position_ids, targets) of this rank's S/cp tokens; targets shifted over the whole sequence."""
    positions = chunk_positions(input_ids.shape[1], cp_rank, cp, input_ids.device)
    targets = torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], -100)], dim=1)
    return input_ids[:, positions], positions.unsqueeze(0), targets[:, positions]


def context_parallel_loss(model, input_ids: torch.Tensor, cp_rank: int, cp: int, vocab_group) -> torch.Tensor:
    """This rank's share of the replica's mean next-token loss (the CP ranks' shares sum to it). `vocab_group`: the
    TP group the model's logits are split over (CP x TP, launcher/parallel/tensor_model.py logits_vocab_group), None
    when they are whole."""
    ids, positions, targets = local_chunk(input_ids, cp_rank, cp)
    from launcher.parallel.pipeline import local_tokens_loss_sum

    predicted = input_ids.shape[0] * (input_ids.shape[1] - 1)
    return local_tokens_loss_sum(model, ids, positions, targets, vocab_group) / predicted
