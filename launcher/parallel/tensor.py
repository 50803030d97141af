"""Megatron-style tensor parallelism for the decoder blocks of our layer list: every TP in `launcher train`, inside
pipeline stages and, at pipeline_degree = 1, on the plain engine (launcher/parallel/tensor_model.py).

Why our own column/row-parallel linears and not DeepSpeed AutoTP: AutoTP shards a model every rank has first built
whole (issue 11: a rank must materialise only its slice), and AutoTP
installs its own 2-D (world/tp, tp) device mesh over all ranks
(engine._init_tp_mesh_device), which ignores the pipeline axis, so inside a
PipelineModule its "data-parallel" groups span pipeline stages and the engine's
initial broadcast copies stage-0 weights into stage-1 ranks (measured:
docs/parallel-notes.md, section 1: a gloo 65536 vs 16384 size
mismatch). Re-pointing AutoTP's groups at the pipeline grid makes it run but
shard nothing. torch DTensor TP would need a DeviceMesh built from the grid's
groups plus DTensor-aware DeepSpeed optimizers, which 0.19.8 does not have.
Four small modules on the grid's own model-parallel axis are the smallest thing
that is really tensor parallel and composes with DeepSpeed's pipeline engine,
its ZeRO-1 and its gradient clipping (which already understands the
`tensor_model_parallel` attribute: deepspeed/runtime/utils.py,
is_model_parallel_parameter).

The split is the one of Shoeybi et al. 2019, "Megatron-LM", section 3 (fig. 3):
    attention: q/k/v column-parallel (whole heads per rank), o_proj row-parallel
    MLP:       gate/up column-parallel,                     down_proj row-parallel
with f = identity forward / all-reduce backward in front of a column-parallel
group and g = all-reduce forward / identity backward after a row-parallel one.
f sits once in front of each sub-layer (q, k and v share one input, gate and up another: Megatron fuses them
into one linear), so each block costs one all-reduce forward and one backward per sub-layer.
The embedding, the head and the loss are split over the vocabulary (section 3 of the paper; the end of this
file); the norms stay replicated across the TP ranks and receive identical full gradients there.
With `sequence_parallel` (Megatron SP, the second half of this file) the TP ranks
also split the sequence outside the TP regions, and the all-reduces become
all-gathers and reduce-scatters over the sequence.

The shards are cut from the layer of the whole model on the meta device (no bytes); each keeps
`tp_shard = (dim, rank, size)`, and launcher/runtime/build.py fills it with that slice of the whole
tensor's seeded values, so a TP run starts from exactly the weights of the unsharded model.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class TensorParallel(NamedTuple):
    """This rank's tensor-parallel group, its rank in it, the group size, and whether the ranks also shard the
    sequence outside the TP regions (Megatron sequence parallelism, below)."""

    group: object
    rank: int
    size: int
    sequence_parallel: bool = False


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: the input is already replicated; the gradients from every rank's shard are summed."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: partial outputs of a row-parallel layer are summed; the gradient is already replicated."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _mark_sharded(p: nn.Parameter, dim: int, rank: int, size: int) -> nn.Parameter:
    # DeepSpeed counts a parameter with this attribute on every TP rank when it computes the global
    # gradient norm, and a replicated one only on TP rank 0 (runtime/utils.py, zero/stage_1_and_2.py).
    p.tensor_model_parallel = True
    # which slice of the whole tensor: launcher/runtime/build.py fills it from that, launcher/parallel/export.py
    # concatenates the ranks' slices along its dim
    p.tp_shard = (dim, rank, size)
    return p


def shard_rows(tensor: torch.Tensor, rank: int, size: int) -> nn.Parameter:
    """This rank's rows [rank n/size, (rank+1) n/size) of `tensor` as a marked TP shard (a column-parallel weight or
    bias, a vocabulary-parallel embedding or head)."""
    n = tensor.shape[0] // size
    return _mark_sharded(nn.Parameter(tensor.detach()[rank * n:(rank + 1) * n].clone()), 0, rank, size)


class ColumnParallelLinear(nn.Module):
    """Y_i = X A_i: this rank keeps rows [rank*n/tp, (rank+1)*n/tp) of the (out, in) weight."""

    def __init__(self, full: nn.Linear, group, rank: int, size: int, sequence_parallel: bool = False,
                 copy_input: bool = True):
        super().__init__()
        out = full.out_features
        if out % size:
            raise ValueError(f"out_features {out} not divisible by tensor-parallel size {size}")
        self.group = group
        # Under SP the input arrives all-gathered by gather_input_over_sequence, whose backward reduce-scatters (sums)
        # the input gradient: f's all-reduce would sum it a second time. copy_input=False: f is applied once in
        # front of the sub-layer (copy_input_to_tensor_parallel), for all the column-parallel linears sharing its input.
        self.copy_input = copy_input and not sequence_parallel
        self.weight = shard_rows(full.weight, rank, size)
        self.bias = None if full.bias is None else shard_rows(full.bias, rank, size)

    def forward(self, x):
        if self.copy_input:
            x = _CopyToTensorParallel.apply(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = sum_i X_i B_i: this rank keeps columns [rank*n/tp, (rank+1)*n/tp) and all-reduces its partial product."""

    def __init__(self, full: nn.Linear, group, rank: int, size: int, sequence_parallel: bool = False):
        super().__init__()
        inp = full.in_features
        if inp % size:
            raise ValueError(f"in_features {inp} not divisible by tensor-parallel size {size}")
        n = inp // size
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.weight = _mark_sharded(nn.Parameter(full.weight.detach()[:, rank * n:(rank + 1) * n].clone()), 1, rank, size)
        # The bias is added once, after the sum, so it stays replicated (and unmarked).
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        # SP: the partial sums are reduce-scattered over the sequence instead of all-reduced (same bytes on a ring).
        reduce = _ReduceScatterToSequence if self.sequence_parallel else _ReduceFromTensorParallel
        y = reduce.apply(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


def shard_llama_decoder_layer(layer: nn.Module, tp: TensorParallel) -> nn.Module:
    """Replace the seven linears of a transformers LlamaDecoderLayer by their TP shards, in place.

    LlamaAttention reshapes with `view(*shape, -1, head_dim)`, so it runs on the local
    heads without change; grouped-query attention keeps its q/kv ratio because q and kv
    heads are both split by `size` (layout.py checks both are divisible).
    """
    attn, mlp = layer.self_attn, layer.mlp
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(attn, name, ColumnParallelLinear(getattr(attn, name), *tp, copy_input=False))
    attn.o_proj = RowParallelLinear(attn.o_proj, *tp)
    for name in ("gate_proj", "up_proj"):
        setattr(mlp, name, ColumnParallelLinear(getattr(mlp, name), *tp, copy_input=False))
    mlp.down_proj = RowParallelLinear(mlp.down_proj, *tp)
    if not tp.sequence_parallel:
        copy_input_to_tensor_parallel(attn, tp.group)
        copy_input_to_tensor_parallel(mlp, tp.group)
    else:
        gather_input_over_sequence(attn, tp.group)
        gather_input_over_sequence(mlp, tp.group)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            mark_sequence_parallel(norm)
    return layer


def _map_hidden_states(fn):
    """A forward pre-hook applying `fn` to a sub-layer's input: LlamaDecoderLayer calls self_attn(hidden_states=...)
    and mlp(hidden_states). A hook rather than a wrapper module keeps the parameter names (seeded init, export)."""
    def hook(_module, args, kwargs):
        if "hidden_states" in kwargs:
            kwargs = {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}
        else:
            args = (fn(args[0]), *args[1:])
        return args, kwargs
    return hook


def copy_input_to_tensor_parallel(module: nn.Module, group) -> None:
    """Megatron's f once in front of a TP sub-layer whose column-parallel linears share the input (LLaMA's q, k, v;
    gate, up): their input gradients add up locally first, then one all-reduce sums them over the TP ranks. f per
    linear instead cost 5 backward all-reduces per block, not 2 (bench/steptime/breakdown.py TP2: 40
    _CopyToTensorParallelBackward per step of 4 blocks x 2 micro-batches, ~2 ms each on 2 CPU ranks)."""
    module.register_forward_pre_hook(_map_hidden_states(lambda x: _CopyToTensorParallel.apply(x, group)), with_kwargs=True)


def shard_bloom_block(block: nn.Module, tp: TensorParallel) -> nn.Module:
    """Replace the four linears of a transformers BloomBlock by their TP shards, in place.

    Bloom's fused query_key_value weight (3h, h) is laid out per head: BloomAttention._reshape views
    its output as (batch, seq, num_heads, 3, head_dim), i.e. rows [head 0: q, k, v | head 1: q, k, v | ...].
    A contiguous row split therefore hands each rank whole heads with their own q, k and v (Megatron-LM's
    fused QKV layout, which BLOOM was trained with), and the attention then runs on `num_heads / tp`
    heads, which is all it needs to know (the ALiBi slopes of those heads come from the block wrapper).
    dense (attention output) and dense_4h_to_h are row-parallel; their biases are added once after the sum.
    """
    attn, mlp = block.self_attention, block.mlp
    if attn.pretraining_tp > 1 and attn.slow_but_exact:
        raise NotImplementedError("BloomConfig.slow_but_exact with pretraining_tp > 1 (an inference-time emulation of TP)")
    attn.query_key_value = ColumnParallelLinear(attn.query_key_value, *tp)
    attn.dense = RowParallelLinear(attn.dense, *tp)
    attn.num_heads //= tp.size
    mlp.dense_h_to_4h = ColumnParallelLinear(mlp.dense_h_to_4h, *tp)
    mlp.dense_4h_to_h = RowParallelLinear(mlp.dense_4h_to_h, *tp)
    return block


# --- Megatron sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models", section 4.2.2, fig. 5). Outside the TP regions (norms, residual adds, dropout) every
# TP rank would hold the same (b, s, h) activations; SP keeps only its s/tp tokens there instead. Entering a
# TP region, g = all-gather over the sequence (backward: reduce-scatter); leaving it, g-bar = reduce-scatter
# (backward: all-gather). An all-reduce is a reduce-scatter followed by an all-gather, so the bytes moved
# per layer are those of TP alone; what SP saves is activation memory of the hidden-size tensors.
# The sequence is dim 1 of our (batch, seq, hidden) activations. The list forms of the collectives
# (`all_gather`, `reduce_scatter` on chunks) run on gloo (CPU ranks, checked) as on NCCL.

def _split_sequence(x, group):
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    # A copy, not .contiguous(): at micro-batch 1 the slice is already contiguous, so .contiguous() returns the view
    # and this rank's s/tp tokens would keep the whole (b, s, h) tensor alive (measured: the embedding output stayed
    # saved, 0.93% over the plan at seq 1024, bench/parallel/results.md).
    return x.chunk(size, dim=1)[rank].clone(memory_format=torch.contiguous_format)


def _gather_sequence(x, group):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def _reduce_scatter_sequence(x, group):
    chunks = [c.contiguous() for c in x.chunk(dist.get_world_size(group), dim=1)]
    out = torch.empty_like(chunks[0])
    dist.reduce_scatter(out, chunks, group=group)
    return out


class _GatherFromSequence(torch.autograd.Function):
    """(b, s/tp, h) -> the whole (b, s, h). Backward: reduce-scatter when a TP region consumed it (each rank's
    gradient is a partial sum), split when a replicated layer did (every rank's gradient is already whole)."""

    @staticmethod
    def forward(ctx, x, group, partial_grads: bool):
        ctx.group, ctx.partial_grads = group, partial_grads
        return _gather_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        back = _reduce_scatter_sequence if ctx.partial_grads else _split_sequence
        return back(grad, ctx.group), None, None


class _ReduceScatterToSequence(torch.autograd.Function):
    """Partial (b, s, h) sums of a row-parallel layer -> the summed (b, s/tp, h) of this rank; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_sequence(grad, ctx.group), None


def gather_from_sequence(x, group, partial_grads: bool = False):
    """Leave the sequence-parallel region: all-gather the whole sequence. `partial_grads`: what consumes it is split
    over the TP ranks (the vocabulary-parallel head), so the backward reduce-scatters; else it splits."""
    return _GatherFromSequence.apply(x, group, partial_grads)


def gather_input_over_sequence(module: nn.Module, group) -> None:
    """Make a TP sub-layer (attention or MLP) all-gather its (b, s/tp, h) input to the whole sequence.

    The gather sits in front of the transformers module, not inside each linear, because LlamaAttention views
    q/k/v with `hidden_states.shape[:-1]`: a local input with the gather hidden in the linears mis-shapes the
    heads without raising (a measured trap on CPU ranks). q, k and v (gate and up) share the one
    gathered input, as in Megatron. The row-parallel output layer reduce-scatters, so the output is local again.
    A forward pre-hook rather than a wrapper module keeps the parameter names (seeded init, export) unchanged.
    """
    module.register_forward_pre_hook(_map_hidden_states(lambda x: _GatherFromSequence.apply(x, group, True)), with_kwargs=True)


def mark_sequence_parallel(module: nn.Module) -> None:
    """Mark the parameters of a replicated module that runs on s/tp tokens (the norms): their gradients are
    partial sums over the TP ranks (Megatron's attribute name; register_sequence_parallel_grad_hooks sums them)."""
    for p in module.parameters():
        p.sequence_parallel = True


def register_sequence_parallel_grad_hooks(module: nn.Module, group) -> int:
    """All-reduce over the TP group the gradient of every parameter marked `sequence_parallel`; returns how many.

    Each rank's norm weight sees only its tokens, so its gradient is a partial sum; Megatron all-reduces these
    before the optimizer (megatron/core/distributed/finalize_model_grads.py, _allreduce_layernorm_grads). A
    tensor hook does it as the gradient is produced, before DeepSpeed accumulates it, so every micro-batch's
    gradient is whole. Registered after materialise_ (launcher/runtime/build.py), which replaces the meta
    Parameters and keeps their attributes but not their hooks.
    """
    def hook(grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=group)
        return grad

    marked = [p for p in module.parameters() if getattr(p, "sequence_parallel", False)]
    for p in marked:
        p.register_hook(hook)
    return len(marked)


def tensor_parallel_group(topology, sequence_parallel: bool = False) -> TensorParallel:
    """(group, rank in group, size) of this rank's TP group on a DeepSpeed ProcessTopology's 'model' axis.

    Every rank must call this in the same order (torch.distributed.new_group is collective);
    the groups hold the same ranks as PipelineParallelGrid.get_slice_parallel_group().
    """
    me = dist.get_rank()
    mine = None
    for ranks in topology.get_axis_comm_lists("model"):
        g = dist.new_group(ranks=ranks)
        if me in ranks:
            mine = TensorParallel(g, ranks.index(me), len(ranks), sequence_parallel)
    if mine is None:
        raise RuntimeError(f"rank {me} is in no 'model' group of {topology}")
    return mine


# ---- Vocabulary-parallel ends: the embedding, the head and the loss split over the vocabulary ----
#
# Shoeybi et al. 2019, section 3 ("we parallelize the input embedding weight matrix along the vocabulary
# dimension ... fuse the output of the parallel GEMM with the cross entropy loss"), as Megatron-LM builds it
# (core/tensor_parallel/layers.py VocabParallelEmbedding, ColumnParallelLinear(parallel_output=True);
# core/tensor_parallel/cross_entropy.py vocab_parallel_cross_entropy). Rank r of t holds rows [r V/t, (r+1) V/t)
# of the (padded, launcher/config/layout.py) vocabulary in the embedding, the head or the tied matrix serving
# both. Replicated ends cost every TP rank the whole V x h matrix (its gradient and optimizer state), the whole
# head GEMM and the fp32 logits of b x s x V (4.2 GB at 8,192 tokens, V = 128,256); split, each is 1/t.

def vocab_range(rows: int, rank: int) -> tuple[int, int]:
    """[start, end) of the vocabulary ids this TP rank's `rows` embedding / head rows hold."""
    return rank * rows, (rank + 1) * rows


def vocab_parallel_embedding(ids, weight, tp: TensorParallel):
    """The token embedding from this rank's rows: ids on other ranks look up zeros, and the partial embeddings are
    summed over TP (Megatron's g), or reduce-scattered to this rank's s/tp tokens under sequence parallelism."""
    start, end = vocab_range(weight.shape[0], tp.rank)
    outside = (ids < start) | (ids >= end)
    local = (ids - start).masked_fill_(outside, 0)
    partial = F.embedding(local, weight).masked_fill_(outside.unsqueeze(-1), 0.0)
    reduce = _ReduceScatterToSequence if tp.sequence_parallel else _ReduceFromTensorParallel
    return reduce.apply(partial, tp.group)


def copy_to_tensor_parallel(x, group):
    """Megatron's f in front of the head (identity forward; backward sums the ranks' partial input gradients)."""
    return _CopyToTensorParallel.apply(x, group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross entropy of fp32 logits split over the vocabulary (Megatron's vocab_parallel_cross_entropy):
    three all-reduces of one fp32 value a token (the row max, the target's logit, the sum of exponentials) instead
    of gathering the logits. Saved for backward: the softmax of this rank's columns (fp32, 4 V/t bytes a token),
    each token's target column here (int64, -1 where it is on another rank or ignored) and whether it is counted
    (bool): 4 V/t + 9 bytes a token (launcher/plan/activations.py)."""

    @staticmethod
    def forward(ctx, logits, targets, group, ignore_index):
        rank = dist.get_rank(group)
        start, end = vocab_range(logits.shape[-1], rank)
        row_max = logits.max(dim=-1).values
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - row_max.unsqueeze(-1)
        valid = targets != ignore_index
        here = valid & (targets >= start) & (targets < end)
        column = torch.where(here, targets - start, -1)
        picked = shifted.gather(-1, column.clamp(min=0).unsqueeze(-1)).squeeze(-1).masked_fill_(~here, 0.0)
        dist.all_reduce(picked, group=group)
        total = shifted.exp().sum(dim=-1)
        dist.all_reduce(total, group=group)
        log_total = total.log()
        # exp(x - max - log sum), as torch's log_softmax rounds it (the 1-rank loss's backward takes exp of that)
        softmax = shifted.sub_(log_total.unsqueeze(-1)).exp_()
        ctx.save_for_backward(softmax, column, valid)
        return (log_total - picked).masked_fill_(~valid, 0.0)

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, column, valid = ctx.saved_tensors
        scale = grad_loss.masked_fill(~valid, 0.0)
        grad = softmax.mul_(scale.unsqueeze(-1))   # d loss / d logit = softmax - one_hot(target), times the scale
        rows = torch.nonzero(column >= 0).squeeze(-1)
        grad[rows, column[rows]] -= scale[rows]
        return grad, None, None, None


def vocab_parallel_cross_entropy(logits, targets, group, ignore_index: int = -100):
    """Per-token losses (0 where the target is `ignore_index`) of (..., V/t) logits, computed in fp32 as
    transformers' loss does (logits.float())."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    return _VocabParallelCrossEntropy.apply(flat, targets.reshape(-1), group, ignore_index)
