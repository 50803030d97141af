"""Build only what this rank holds, with initial values that do not depend on the layout.

The sequence, owned here and used by every layout (STYLE.md point 11, after torchtitan):

    1. construct on the meta device            (no bytes: `meta_model`, or PipelineModule's specs on meta modules)
    2. cut this rank's part                    (pipeline stage, TP slice; ZeRO-3 builds its partition directly)
    3. materialise only that part              (`to_empty` on the rank's modules)
    4. initialise every tensor from its name   (`fill_`: seeded by (train.seed, transformers name, 256-row block))

Why our own init and not transformers' `from_config`: transformers draws every weight from one RNG stream
in module order, so a rank that holds a slice cannot reproduce its values without drawing the whole model
first (torchtitan gave layout-independent init up for this reason: pytorch/torchtitan#514). Here each
256-row block of each tensor has its own generator, seeded from sha256(f"{seed}:{name}:{block}") (Python's
str hash is salted per process, so unusable), so a rank generates only the blocks its slice overlaps and
every layout -- 1 rank, TP x PP x DP, ZeRO-3 partitions -- starts from bit-identical weights. The
distributions are transformers' `PreTrainedModel._init_weights` (transformers 5.23 modeling_utils.py
2295-2359, GPT2PreTrainedModel._init_weights): Linear / Conv1D weights and embeddings N(0, initializer_range),
GPT-2's residual projections (c_proj) N(0, initializer_range / sqrt(2 n_layer)), biases 0, norm weights 1.
The values differ from `from_config`'s (same distributions, other draws): docs/training.md, "Building the model".

Measured facts this relies on (docs/parallel-notes.md, sections 3 and 4):
- a seeded CPU generator gives the same bits across processes and thread counts (not across ISAs for
  normal_: avx2 = avx512, `default` differs), so values are generated on CPU;
- the first k values of a longer normal_ draw equal a k-draw only for k % 16 == 0, so a block is always
  generated at its full shape and then cut;
- `to_empty` leaves buffers as garbage (rotary inv_freq is rebuilt) and unties tied weights (re-tied).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

BLOCK_ROWS = 256   # rows per seeded block; a block of BLOOM's 4h x h MLP weight is 256 x 14336 fp32 = 14.7 MB


@dataclass(frozen=True)
class InitRule:
    """How transformers' _init_weights fills one tensor of the whole (unsharded) model."""

    shape: tuple
    kind: str                 # "normal", "zeros" or "ones"
    std: float = 0.0
    zero_row: Optional[int] = None   # nn.Embedding padding_idx


@dataclass(frozen=True)
class SeededInit:
    """The whole model's init rules, keyed by transformers parameter name, and the run's seed."""

    seed: int
    rules: dict

    def fill_(self, dest: torch.Tensor, name: str, rows=None, cols=None, flat=None) -> None:
        """Write into `dest` the values tensor `name` of the whole model has at rows[0]:rows[1] x cols[0]:cols[1]
        (default: all), or, with `flat=(start, stop)`, at those positions of the flattened tensor (a ZeRO-3
        partition; `dest` is then 1-D with at least stop - start elements)."""
        rule = self.rules[name]
        full_rows = rule.shape[0]
        width = math.prod(rule.shape[1:])
        with torch.no_grad():
            if flat is not None:
                start, stop = flat
                r0, r1 = start // max(width, 1), -(-stop // max(width, 1))
                block = _values(self.seed, name, rule, r0, r1, 0, width).reshape(-1)
                dest[:stop - start].copy_(block[start - r0 * width:stop - r0 * width])
                return
            r0, r1 = rows if rows is not None else (0, full_rows)
            c0, c1 = cols if cols is not None else (0, width)
            dest.view(r1 - r0, c1 - c0).copy_(_values(self.seed, name, rule, r0, r1, c0, c1))


class CheckpointSlices:
    """`model.init_from` read per rank: the same `fill_` as SeededInit, reading only the requested slice of each
    tensor from a transformers directory (model.safetensors, or shards + model.safetensors.index.json).

    safetensors' `get_slice` reads only the slice's bytes (docs/parallel-notes.md, section 6: all 129 slices of a
    0.2B checkpoint equal the same slices of the full tensors); the index's weight_map means a pipeline stage opens
    only the files holding its tensors. `opened` records which files this process opened.
    """

    def __init__(self, path):
        import json
        from pathlib import Path

        from safetensors import safe_open

        from launcher.config.hubcache import local_path

        self.root = Path(local_path("model.init_from", path))   # a hub name: its snapshot in the local HF cache
        index = self.root / "model.safetensors.index.json"
        if index.exists():
            self.weight_map = json.loads(index.read_text())["weight_map"]
        else:
            with safe_open(self.root / "model.safetensors", "pt") as f:
                self.weight_map = dict.fromkeys(f.keys(), "model.safetensors")
        self.opened: set = set()

    def fill_(self, dest: torch.Tensor, name: str, rows=None, cols=None, flat=None) -> None:
        from safetensors import safe_open

        if name not in self.weight_map:
            raise KeyError(f"{name} is not in the checkpoint {self.root} (model.init_from): its model does not match model.*")
        file = self.weight_map[name]
        self.opened.add(file)
        with safe_open(self.root / file, "pt", device="cpu") as f:
            sl = f.get_slice(name)
            shape = tuple(sl.get_shape())
            width = math.prod(shape[1:])
            with torch.no_grad():
                if flat is not None:
                    start, stop = flat
                    r0, r1 = start // max(width, 1), -(-stop // max(width, 1))
                    part = sl[r0:r1].reshape(-1)
                    dest[:stop - start].copy_(part[start - r0 * width:stop - r0 * width])
                    return
                r0, r1 = rows if rows is not None else (0, shape[0])
                if cols is None:
                    part = sl[r0:r1]
                else:
                    part = sl[r0:r1, cols[0]:cols[1]]
                if part.numel() != dest.numel():
                    raise ValueError(f"{name}: the checkpoint's {shape} does not give this rank's {tuple(dest.shape)} "
                                     f"(model.init_from={self.root}: its model does not match model.*)")
                dest.copy_(part.reshape(dest.shape))


def block_seed(seed: int, name: str, block: int) -> int:
    """63-bit seed of one 256-row block of one tensor (stable across processes, unlike hash())."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}:{block}".encode()).digest()[:8], "little") >> 1


def _values(seed: int, name: str, rule: InitRule, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
    """Rows [r0, r1) x columns [c0, c1) of the whole tensor (viewed as rows x prod(other dims)), fp32."""
    if rule.kind == "zeros":
        return torch.zeros(r1 - r0, c1 - c0)
    if rule.kind == "ones":
        return torch.ones(r1 - r0, c1 - c0)
    full_rows, width = rule.shape[0], math.prod(rule.shape[1:])
    out = torch.empty(r1 - r0, c1 - c0)
    for b in range(r0 // BLOCK_ROWS, -(-r1 // BLOCK_ROWS)):
        b0, b1 = b * BLOCK_ROWS, min((b + 1) * BLOCK_ROWS, full_rows)
        g = torch.Generator().manual_seed(block_seed(seed, name, b))
        # The whole block, contiguous, at its fixed shape, then cut (see the prefix trap above).
        vals = torch.empty(b1 - b0, width).normal_(0.0, rule.std, generator=g)
        lo, hi = max(b0, r0), min(b1, r1)
        out[lo - r0:hi - r0].copy_(vals[lo - b0:hi - b0, c0:c1])
    if rule.zero_row is not None and r0 <= rule.zero_row < r1:
        out[rule.zero_row - r0].zero_()
    return out


def init_rules(model: nn.Module) -> dict:
    """Every parameter of the (meta) transformers model -> its InitRule, as _init_weights would fill it.

    Built from module types like _init_weights is; a parameter of a module type it does not know is an
    error here rather than a silently different init.
    """
    from transformers.pytorch_utils import Conv1D

    config = model.config
    std = config.initializer_range
    residual_std = std / math.sqrt(2 * getattr(config, "n_layer", 1))   # GPT-2 only (see the module docstring)
    rules = {}
    for mname, mod in model.named_modules():
        cls = type(mod).__name__
        for pname, p in mod.named_parameters(recurse=False):
            name = f"{mname}.{pname}" if mname else pname
            shape = tuple(p.shape)
            if pname == "bias":
                rules[name] = InitRule(shape, "zeros")
            elif isinstance(mod, (nn.Linear, Conv1D)):
                s = residual_std if (config.model_type == "gpt2" and mname.endswith("c_proj")) else std
                rules[name] = InitRule(shape, "normal", s)
            elif isinstance(mod, nn.Embedding):
                rules[name] = InitRule(shape, "normal", std, mod.padding_idx)
            elif "RMSNorm" in cls or "LayerNorm" in cls:
                rules[name] = InitRule(shape, "ones")
            else:
                raise NotImplementedError(f"no init rule for {name} ({cls}); add it beside _init_weights' rules")
    return rules


def meta_params(module: nn.Module) -> int:
    """Parameters of a (meta) module, a tied tensor once."""
    return sum(p.numel() for p in module.parameters())


def meta_model(model_cfg, vocab_size: Optional[int] = None):
    """The whole transformers model on the meta device: shapes and names, no bytes (BLOOM-176B: 0.3 s)."""
    from transformers import AutoModelForCausalLM

    from launcher.runtime.model import attn_implementation, hf_config

    # fp32 whatever a loaded config.json says (a bf16 checkpoint's `dtype`): every build path makes fp32 parameters
    # and DeepSpeed casts to precision.dtype, so a bf16 checkpoint under precision=fp32 trains in fp32.
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config(model_cfg, vocab_size), dtype=torch.float32,
                                                attn_implementation=attn_implementation(model_cfg.arch))


def materialise_(module: nn.Module, init: SeededInit, hf_name, device="cpu") -> nn.Module:
    """Give every meta parameter of `module` real storage and fill it from its transformers name.

    `hf_name(local_name) -> name` maps the module's parameter names to the whole model's. A parameter
    carrying `tp_shard = (dim, rank, size)` (launcher/parallel/tensor.py) is that slice of the whole tensor.
    Not `Module.to_empty`: that makes new Parameters without their attributes (tensor_model_parallel, tp_shard)
    and would also overwrite the real buffers of shared submodules (the rotary embedding) with garbage.
    """
    for mod in module.modules():
        for key, p in list(mod._parameters.items()):
            if p is not None and p.is_meta:
                real = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device), requires_grad=p.requires_grad)
                real.__dict__.update(p.__dict__)
                mod._parameters[key] = real
        for key, b in mod._buffers.items():
            if b is not None and b.is_meta:
                raise RuntimeError(f"buffer {key} of {type(mod).__name__} is on meta: build it on CPU (e.g. rotary)")
    for local, p in module.named_parameters():
        name = hf_name(local)
        shard = getattr(p, "tp_shard", None)
        if shard is None:
            init.fill_(p.data, name)
            continue
        dim, rank, _ = shard
        n = p.shape[dim]   # the shard's extent: whole / size
        if dim == 0:
            init.fill_(p.data, name, rows=(rank * n, (rank + 1) * n))
        else:
            init.fill_(p.data, name, cols=(rank * n, (rank + 1) * n))
    return module


def rebuild_rotary_(model: nn.Module) -> None:
    """Recompute the rotary buffers `to_empty` left as garbage (inv_freq, original_inv_freq)."""
    for mod in model.modules():
        if type(mod).__name__.endswith("RotaryEmbedding"):
            fresh = type(mod)(config=mod.config)
            for bname, buf in fresh.named_buffers(recurse=False):
                getattr(mod, bname).copy_(buf)


def build_whole_model(model_cfg, seed: int, vocab_size: Optional[int] = None):
    """The whole model on CPU (every rank of a layout that holds whole weights: ZeRO 0-2 data parallelism without TP
    or a pipeline, Ulysses, CP without TP), with the seeded init or, with `model.init_from`, read tensor by tensor.

    `model.init_from` goes through CheckpointSlices into the model built here, not through `from_pretrained`:
    one tensor at a time is read from the safetensors files into its parameter, so the peak is the model plus
    one tensor (bench/build/results.md has transformers' own load beside it).
    """
    model = meta_model(model_cfg, vocab_size)
    init = CheckpointSlices(model_cfg.init_from) if model_cfg.init_from else SeededInit(seed, init_rules(model))
    model.to_empty(device="cpu")
    model.tie_weights()   # to_empty made new Parameters: re-tie the head to the embedding
    # named_parameters yields a tied tensor once, under the embedding's name: the head gets the embedding's values.
    for name, p in model.named_parameters():
        init.fill_(p.data, name)
    rebuild_rotary_(model)
    return model


def build_zero3_model(model_cfg, seed: int, ds_config: dict, vocab_size: Optional[int] = None, attn: Optional[str] = None):
    """The model built directly as ZeRO-3 partitions (deepspeed.zero.Init): a rank allocates only its
    1/DP of every tensor and fills it from the whole tensor's seeded values at that flat range.

    deepspeed.zero.Init gets the config and no `dtype=` (with an explicit dtype, DeepSpeed 0.19.8's
    Init._set_dtype ignores it on CPU and picks bf16: docs/parallel-notes.md, section 5). transformers' own
    init is skipped (no_init_weights): it would run on empty partitions and leave torch's defaults.
    `attn`: an attention registered with transformers (Ulysses, ring attention) instead of the architecture's own.
    """
    import deepspeed
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from launcher.runtime.model import attn_implementation, hf_config

    # model.init_from: each rank reads only its partitions' byte ranges (CheckpointSlices), never a whole state dict.
    init = (CheckpointSlices(model_cfg.init_from) if model_cfg.init_from
            else SeededInit(seed, init_rules(meta_model(model_cfg, vocab_size))))
    with no_init_weights(), deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = AutoModelForCausalLM.from_config(hf_config(model_cfg, vocab_size),
                                                 attn_implementation=attn or attn_implementation(model_cfg.arch))
    for name, p in model.named_parameters():
        # partition_parameters.py: rank r of the param's group holds flat elements [r * n, (r + 1) * n) of the
        # tensor padded to a multiple of the group size; n = ds_tensor.ds_numel.
        n = p.ds_tensor.ds_numel
        start = n * dist.get_rank(group=p.ds_process_group)
        stop = min(start + n, p.ds_numel)
        if stop > start:
            init.fill_(p.ds_tensor.data, name, flat=(start, stop))
    return model
