"""Merge a pipelined and/or tensor-parallel model back into one transformers state dict.

Layer indices are those of launcher/parallel/pipeline.py's layer list (`layer_hf_prefixes`); DeepSpeed
registers each local layer under its global index (PipelineModule._build: `self.add_module(str(layer_idx), ...)`)
and a tied embedding under `tied_modules.embed`. For llama with L blocks:
    0.weight                      -> model.embed_tokens.weight   (tied: tied_modules.embed.weight)
    {1..L}.layer.<rest>           -> model.layers.{i-1}.<rest>
    {L+1}.norm.weight             -> model.norm.weight
    {L+2}.weight                  -> lm_head.weight              (tied: the embedding again)
and for bloom one more layer after the embedding (its LayerNorm), everything under transformer.*.
Tensor-parallel shards are concatenated in TP-rank order along their partition dim: rows for
column-parallel, columns for row-parallel (Megatron-LM, Shoeybi et al. 2019, section 3). Replicated
tensors come from TP rank 0. Only data-parallel replica 0 contributes; the other replicas hold the same
weights.

Two sources: a live module (`gather_hf_state_dict`, a collective, used by the tests), or a checkpoint on
disk (`checkpoint_state_dict`, offline, one process, used by `launcher export`). On disk the partition dim
is not stored, so it is read off the shapes: the one dim where a shard differs from the full tensor
(a full tensor's shape comes from the transformers model built on the meta device).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from launcher.parallel.pipeline import layer_hf_prefixes
from launcher.parallel.tensor_model import PREFIX

# layer_{idx:02d}-model_{tp:02d}-model_states.pt: PipelineModule.ckpt_layer_path (the grid's rank repr
# keeps only the 'model' axis, i.e. the TP rank).
LAYER_FILE = re.compile(r"layer_(\d+)-model_(\d+)-model_states\.pt")
MP_FILE = re.compile(r"mp_rank_(\d+)_model_states\.pt")


def hf_name(pipe_name: str, num_layers: int, tied: bool, arch: str = "llama") -> list[str]:
    """The transformers names of one PipelineModule parameter (two for a tied embedding)."""
    prefixes = layer_hf_prefixes(arch, num_layers)
    if pipe_name.startswith("tied_modules.embed."):
        return [f"{prefixes[0]}.weight", f"{prefixes[-1]}.weight"]
    m = re.fullmatch(r"(\d+)\.(.+)", pipe_name)
    if m is None:
        raise KeyError(f"not a pipeline layer parameter: {pipe_name}")
    idx, rest = int(m.group(1)), m.group(2)
    if idx >= len(prefixes) or (idx == len(prefixes) - 1 and tied):
        raise KeyError(f"pipeline layer {idx} is past the head ({num_layers} blocks)")
    # The wrappers hold the transformers module as .layer (blocks) / .norm (norms) or the weight itself.
    rest = rest.removeprefix("layer.").removeprefix("norm.")
    return [f"{prefixes[idx]}.{rest}"]


def local_shards(module, num_layers: int, tied: bool, tp_rank: int, arch: str = "llama") -> dict:
    """This rank's parameters as {hf_name: (tp_rank, the dim a TP shard is cut along or None, cpu tensor)}."""
    out = {}
    for name, p in module.named_parameters():
        if getattr(p, "ds_pipe_replicated", False):
            continue   # a tied embedding's copy on the last stage: the first stage's gives both names
        dim = p.tp_shard[0] if hasattr(p, "tp_shard") else None   # launcher/parallel/tensor.py _mark_sharded
        for hf in hf_name(name, num_layers, tied, arch):
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


def gather_hf_state_dict(module, grid, num_layers: int, tied: bool, arch: str = "llama"):
    """Collective over all ranks: global rank 0 returns the merged transformers state dict, others None.

    Sends every shard through torch.distributed.gather_object (pickled, host memory): right for
    tests and small models; a 176B export should write per-rank files and merge offline.
    """
    import torch.distributed as dist

    mine = None
    if grid.get_data_parallel_rank() == 0:
        mine = local_shards(module, num_layers, tied, grid.get_slice_parallel_rank(), arch)
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if dist.get_rank() != 0:
        return None
    return merge_shards([g for g in gathered if g is not None])


def merge_one(name: str, by_rank: dict[int, torch.Tensor], full: tuple) -> torch.Tensor:
    """One tensor from its TP shards {tp_rank: tensor}: TP rank 0's copy when a shard already has the full shape
    (replicated), else the shards concatenated along the one dim that differs."""
    full = tuple(full)
    ranks = sorted(by_rank)
    first = by_rank[ranks[0]]
    if tuple(first.shape) == full:
        return first
    dims = [d for d, (a, b) in enumerate(zip(first.shape, full)) if a != b]
    if len(dims) != 1 or ranks != list(range(len(ranks))):
        raise ValueError(f"{name}: shards of shape {tuple(first.shape)} on TP ranks {ranks} do not tile {full}")
    merged = torch.cat([by_rank[r] for r in ranks], dim=dims[0])
    if tuple(merged.shape) != full:
        raise ValueError(f"{name}: {len(ranks)} shards give {tuple(merged.shape)}, expected {full}")
    return merged


def merge_by_shape(shards: dict[str, dict[int, torch.Tensor]], full_shapes: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """{name: {tp_rank: tensor}} -> {name: full tensor}: a shard whose shape equals the full shape is
    replicated (TP rank 0's copy is taken); otherwise the shards are concatenated along the one dim that differs."""
    return {name: merge_one(name, by_rank, full_shapes[name]) for name, by_rank in shards.items()}


def checkpoint_state_dict(tag_dir: Path, arch: str, num_layers: int, tied: bool, pipelined: bool,
                          full_shapes: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """The merged transformers state dict of a pipelined or tensor-parallel checkpoint tag directory.

    The module weights are read (what the training forward used; bf16 under bf16 training):
    - pipelined: one file per layer and TP rank (PipelineModule.save_state_dict, written by DP rank 0);
      a tied head is not saved separately (its forward is the embedding's), transformers re-ties it;
    - tensor parallelism at pipeline_degree = 1 (launcher/parallel/tensor_model.py, with or without Megatron SP):
      one mp_rank_XX_model_states.pt per TP rank (DeepSpeed's engine saves `module` under the tensor-parallel
      rank), holding our layer list under its PREFIX ("pipe.<layer index>.<local name>"), named through hf_name
      like the layer files;
    - checkpoints written by DeepSpeed AutoTP (how plain TP ran before issue 11; `launcher train` no longer resumes
      them: checkpoint.refuse_autotp_checkpoint): the same mp_rank files, already under transformers' names.
    """
    return merge_by_shape(checkpoint_shards(tag_dir, arch, num_layers, tied, pipelined), full_shapes)


def checkpoint_shards(tag_dir: Path, arch: str, num_layers: int, tied: bool, pipelined: bool) -> dict[str, dict[int, torch.Tensor]]:
    """{transformers name: {tp_rank: tensor}} of a pipelined or tensor-parallel checkpoint, mmap-loaded: nothing is
    read into memory until a tensor is used (the export merges and writes one tensor at a time)."""
    shards: dict[str, dict[int, torch.Tensor]] = {}
    files = sorted(tag_dir.iterdir())
    if pipelined:
        for f in files:
            m = LAYER_FILE.fullmatch(f.name)
            if m is None:
                continue
            idx, tp = int(m.group(1)), int(m.group(2))
            for key, t in torch.load(f, map_location="cpu", mmap=True, weights_only=False).items():
                for name in hf_name(f"{idx}.{key}", num_layers, tied, arch):
                    shards.setdefault(name, {})[tp] = t
    else:
        for f in files:
            m = MP_FILE.fullmatch(f.name)
            if m is not None:
                for key, t in torch.load(f, map_location="cpu", mmap=True, weights_only=False)["module"].items():
                    names = hf_name(key.removeprefix(PREFIX), num_layers, tied, arch) if key.startswith(PREFIX) else [key]
                    for name in names:
                        shards.setdefault(name, {})[int(m.group(1))] = t
    if not shards:
        raise FileNotFoundError(f"{tag_dir}: no {'layer_*-model_*' if pipelined else 'mp_rank_*'}_model_states.pt files")
    return shards
