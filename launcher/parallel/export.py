"""Merge a pipelined (and tensor-parallel) model back into one transformers LlamaForCausalLM state dict.

Layer indices are those of launcher/parallel/pipeline.py's layer list; DeepSpeed registers each local
layer under its global index (PipelineModule._build: `self.add_module(str(layer_idx), ...)`) and a
tied embedding under `tied_modules.embed`:
    0.weight                      -> model.embed_tokens.weight   (tied: tied_modules.embed.weight)
    {1..L}.layer.<rest>           -> model.layers.{i-1}.<rest>
    {L+1}.norm.weight             -> model.norm.weight
    {L+2}.weight                  -> lm_head.weight              (tied: the embedding again)
Tensor-parallel shards (parameters with `tensor_model_parallel`, launcher/parallel/tensor.py) are
concatenated in TP-rank order along their `partition_dim`: rows for column-parallel, columns for
row-parallel (Megatron-LM, Shoeybi et al. 2019, section 3). Replicated tensors come from TP rank 0.
Only data-parallel replica 0 contributes; the other replicas hold the same weights.
"""

from __future__ import annotations

import re

import torch


def hf_name(pipe_name: str, num_layers: int, tied: bool) -> list[str]:
    """The transformers names of one PipelineModule parameter (two for a tied embedding)."""
    if pipe_name.startswith("tied_modules.embed."):
        return ["model.embed_tokens.weight", "lm_head.weight"]
    m = re.fullmatch(r"(\d+)\.(.+)", pipe_name)
    if m is None:
        raise KeyError(f"not a pipeline layer parameter: {pipe_name}")
    idx, rest = int(m.group(1)), m.group(2)
    if idx == 0:
        return ["model.embed_tokens.weight"]
    if 1 <= idx <= num_layers:
        return [f"model.layers.{idx - 1}.{rest.removeprefix('layer.')}"]
    if idx == num_layers + 1:
        return [f"model.{rest}"]
    if idx == num_layers + 2 and not tied:
        return ["lm_head.weight"]
    raise KeyError(f"pipeline layer {idx} is past the head ({num_layers} blocks)")


def local_shards(module, num_layers: int, tied: bool, tp_rank: int) -> dict:
    """This rank's parameters as {hf_name: (tp_rank, partition_dim or None, cpu tensor)}."""
    out = {}
    for name, p in module.named_parameters():
        dim = getattr(p, "partition_dim", None) if getattr(p, "tensor_model_parallel", False) else None
        for hf in hf_name(name, num_layers, tied):
            out[hf] = (tp_rank, dim, p.detach().to("cpu").clone())
    return out


def merge_shards(per_rank: list[dict]) -> dict[str, torch.Tensor]:
    """Concatenate TP shards and take replicated tensors once; `per_rank` as from `local_shards`."""
    parts: dict[str, list] = {}
    for shards in per_rank:
        for name, (tp_rank, dim, t) in shards.items():
            parts.setdefault(name, []).append((tp_rank, dim, t))
    merged = {}
    for name, pieces in parts.items():
        pieces.sort(key=lambda x: x[0])
        dim = pieces[0][1]
        if dim is None:
            merged[name] = pieces[0][2]
        else:
            ranks = [r for r, _, _ in pieces]
            if ranks != list(range(len(ranks))):
                raise ValueError(f"{name}: TP shards {ranks} are not 0..tp-1 exactly once")
            merged[name] = torch.cat([t for _, _, t in pieces], dim=dim)
    return merged


def gather_hf_state_dict(module, grid, num_layers: int, tied: bool):
    """Collective over all ranks: global rank 0 returns the merged transformers state dict, others None.

    Sends every shard through torch.distributed.gather_object (pickled, host memory): right for
    tests and small models; a 176B export should write per-rank files and merge offline.
    """
    import torch.distributed as dist

    mine = None
    if grid.get_data_parallel_rank() == 0:
        mine = local_shards(module, num_layers, tied, grid.get_slice_parallel_rank())
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if dist.get_rank() != 0:
        return None
    return merge_shards([g for g in gathered if g is not None])
