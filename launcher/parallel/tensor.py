"""Megatron-style tensor parallelism for the decoder blocks of a pipelined model.

Why our own column/row-parallel linears and not DeepSpeed AutoTP here: AutoTP
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
So each block costs one all-reduce forward and one backward per sub-layer, and
everything outside the blocks (embedding, norms, head) stays replicated across
the TP ranks and receives identical full gradients there.

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
    """This rank's tensor-parallel group, its rank in it and the group size."""

    group: object
    rank: int
    size: int


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
    p.partition_dim = dim  # Megatron's names, for the export merge
    p.tp_shard = (dim, rank, size)  # which slice of the whole tensor: launcher/runtime/build.py fills it from that
    return p


class ColumnParallelLinear(nn.Module):
    """Y_i = X A_i: this rank keeps rows [rank*n/tp, (rank+1)*n/tp) of the (out, in) weight."""

    def __init__(self, full: nn.Linear, group, rank: int, size: int):
        super().__init__()
        out = full.out_features
        if out % size:
            raise ValueError(f"out_features {out} not divisible by tensor-parallel size {size}")
        n = out // size
        self.group = group
        self.weight = _mark_sharded(nn.Parameter(full.weight.detach()[rank * n:(rank + 1) * n].clone()), 0, rank, size)
        self.bias = None if full.bias is None else _mark_sharded(nn.Parameter(full.bias.detach()[rank * n:(rank + 1) * n].clone()), 0, rank, size)

    def forward(self, x):
        return F.linear(_CopyToTensorParallel.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = sum_i X_i B_i: this rank keeps columns [rank*n/tp, (rank+1)*n/tp) and all-reduces its partial product."""

    def __init__(self, full: nn.Linear, group, rank: int, size: int):
        super().__init__()
        inp = full.in_features
        if inp % size:
            raise ValueError(f"in_features {inp} not divisible by tensor-parallel size {size}")
        n = inp // size
        self.group = group
        self.weight = _mark_sharded(nn.Parameter(full.weight.detach()[:, rank * n:(rank + 1) * n].clone()), 1, rank, size)
        # The bias is added once, after the sum, so it stays replicated (and unmarked).
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        y = _ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


def shard_llama_decoder_layer(layer: nn.Module, tp: TensorParallel) -> nn.Module:
    """Replace the seven linears of a transformers LlamaDecoderLayer by their TP shards, in place.

    LlamaAttention reshapes with `view(*shape, -1, head_dim)`, so it runs on the local
    heads without change; grouped-query attention keeps its q/kv ratio because q and kv
    heads are both split by `size` (layout.py checks both are divisible).
    """
    attn, mlp = layer.self_attn, layer.mlp
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(attn, name, ColumnParallelLinear(getattr(attn, name), *tp))
    attn.o_proj = RowParallelLinear(attn.o_proj, *tp)
    for name in ("gate_proj", "up_proj"):
        setattr(mlp, name, ColumnParallelLinear(getattr(mlp, name), *tp))
    mlp.down_proj = RowParallelLinear(mlp.down_proj, *tp)
    return layer


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


def tensor_parallel_group(topology) -> TensorParallel:
    """(group, rank in group, size) of this rank's TP group on a DeepSpeed ProcessTopology's 'model' axis.

    Every rank must call this in the same order (torch.distributed.new_group is collective);
    the groups hold the same ranks as PipelineParallelGrid.get_slice_parallel_group().
    """
    me = dist.get_rank()
    mine = None
    for ranks in topology.get_axis_comm_lists("model"):
        g = dist.new_group(ranks=ranks)
        if me in ranks:
            mine = TensorParallel(g, ranks.index(me), len(ranks))
    if mine is None:
        raise RuntimeError(f"rank {me} is in no 'model' group of {topology}")
    return mine
