"""`launcher export CKPT OUT`: a launcher checkpoint (any ZeRO stage, any layout) -> a transformers model directory.

Runs offline in one process, without a process group, and streams: tensors are read from the checkpoint one at a
time (mmap-loaded module files, or DeepSpeed's zero_to_fp32 in lazy mode for ZeRO-3 partitions) and written into
safetensors shards of at most 5 GB (save_pretrained's default; `--max-shard-size` changes it), so peak memory is one shard plus one tensor, never a
whole state dict. Weights are written in the training dtype: the values the forward pass used (a bf16 run's bf16
module weights = bf16(fp32 master)), which is what a model trained in bf16 is published as.

The config is the run's own: with model.init_from / model.hf_config the loaded config.json and
generation_config.json, stored in every checkpoint's launcher_state.json (key "hf"), written back unchanged through
save_pretrained (rope scaling, eps, special-token ids, `architectures`); otherwise the `hf_config` mapping of
model.* the run trained. The tensor names and shapes come from that config's model built on the meta device.

Pipelined or tensor-parallel checkpoints hold one file per layer (or per TP rank) with the module's own weights;
launcher/parallel/export.py merges the stages and TP shards per tensor (checked against the meta model's shapes).
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

from launcher.config.errors import ConfigError
from launcher.runtime.checkpoint import LATEST, MANIFEST, STATE_FILE, load_state, resolve_checkpoint, verify_checkpoint
from launcher.runtime.durable import fault_point, fsync_dir, fsync_file
from launcher.runtime.runlock import LOCK_FILE, describe, owned_by_us, read_lock, stale_reason

MODEL_STATES = "mp_rank_00_model_states.pt"


def check_export_target(out: Path, tag_dir: Path) -> None:
    """Refuse an output directory that would write into a checkpoint or into a run dir another process owns.

    Inside any checkpoint (a directory with launcher_state.json or manifest.json, a step_* or .tmp-step_* directory,
    a checkpoints directory with `latest`; the one being read included) the export would change files the manifest
    covers, so that checkpoint would fail verification; inside a run dir owned by a live run the export would race
    its saves. A directory holding something else than an earlier export is not overwritten either.
    """
    out = out.resolve()
    tag_dir = tag_dir.resolve()
    for d in (out, *out.parents):
        if (d / STATE_FILE).exists() or (d / MANIFEST).exists() or re.fullmatch(r"(\.tmp-)?step_\d+", d.name) \
                or (d.name == "checkpoints" and (d / LATEST).exists()) or d == tag_dir:
            raise ConfigError("out", str(out), f"is inside the checkpoint directory {d}; writing there would change "
                              "files its manifest covers (and the checkpoint would fail verification)",
                              "export to a directory outside every checkpoint, e.g. <run_dir>/hf or out/hf-model")
        if (d / LOCK_FILE).exists() and not owned_by_us(d):
            rec = read_lock(d)
            if rec and "damaged" not in rec and stale_reason(rec, d / LOCK_FILE) is None:
                raise ConfigError("out", str(out), f"is inside the run directory {d}, which {describe(rec)} owns and "
                                  "writes to", "export outside it, or after that run has ended")
    if out.is_dir() and any(out.iterdir()) and not (out / "config.json").is_file():
        raise ConfigError("out", str(out), "is a non-empty directory that does not hold an earlier export "
                          "(no config.json); an export replaces the whole directory",
                          "give a new or empty directory, or an earlier export's directory")


DEFAULT_MAX_SHARD_BYTES = 5 * 10**9   # transformers' save_pretrained default max_shard_size ("5GB")
# transformers' units (transformers.utils.hub.convert_file_size_to_int): GB/MB/KB are powers of 10, GiB/MiB/KiB of
# 2; a lowercase final "b" (e.g. "5Gb") means bits, as there.
SIZE_UNITS = {"GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def parse_shard_size(text: str) -> int:
    """`--max-shard-size` in bytes: an integer followed by transformers' unit ("5GB", "500MB", "2GiB"), or a plain
    number of bytes. Anything else, or a size below 1 byte, is refused naming the flag, the value and the rule."""
    value = str(text).strip()
    upper = value.upper()
    for unit, scale in SIZE_UNITS.items():
        if upper.endswith(unit) and value[:-len(unit)].strip().isdigit():
            n = int(value[:-len(unit)]) * scale
            n = n // 8 if unit in ("GB", "MB", "KB") and value.endswith("b") else n
            break
    else:
        n = int(value) if value.isdigit() else None
    if not n:
        raise ConfigError("--max-shard-size", text, "is not a shard size: an integer followed by a unit (KB, MB, GB = "
                          "10^3, 10^6, 10^9 bytes; KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes) or a number of bytes, at "
                          "least 1 byte, as transformers' save_pretrained(max_shard_size=...) reads it",
                          "e.g. --max-shard-size 5GB (the default) or --max-shard-size 500MB")
    return n
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def export_config(state: dict, cfg, padded_vocab: int, dtype: str):
    """The transformers config the export writes: the run's loaded config.json unchanged (model.init_from /
    model.hf_config, stored in every checkpoint), else the one `hf_config` built from model.* with what a user of
    the model expects set: `architectures`, EOS from the run's tokenizer, the KV cache on. `dtype`: the weights'."""
    from transformers import AutoConfig

    from launcher.runtime.model import hf_config

    stored = (state.get("hf") or {}).get("config")
    if stored is not None:
        config = AutoConfig.for_model(**stored)
    else:
        config = hf_config(cfg.model, vocab_size=padded_vocab)
        config.use_cache = True   # hf_config turns it off for training; generation wants it
        eos = (state.get("data") or {}).get("eos_id")
        if eos is not None:
            config.eos_token_id = eos
    config.dtype = TORCH_DTYPES[dtype]
    return config


def plan_shards(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Tensor names in order, cut into consecutive shards of at most `max_bytes` (a larger tensor alone in one),
    as transformers' split_torch_state_dict_into_shards does."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, n in sizes.items():
        if shards[-1] and used + n > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += n
    return shards


def write_sharded(out: Path, names_sizes: dict[str, int], get, dtype, max_bytes: int) -> dict:
    """Write safetensors shards holding one shard's tensors at a time: peak memory one shard plus one tensor.

    `get(name)` returns one tensor (read from the checkpoint on demand, mmap-backed where possible). The file
    names and the index are transformers' (model.safetensors alone, else model-0000i-of-0000N.safetensors and
    model.safetensors.index.json with metadata.total_size), so from_pretrained and vLLM read them as their own.
    """
    import json

    import torch
    from safetensors.torch import save_file

    shards = plan_shards(names_sizes, max_bytes)
    weight_map, total = {}, 0
    for i, names in enumerate(shards, 1):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        part = {}
        for name in names:
            with torch.no_grad():
                part[name] = get(name).detach().to(dtype).contiguous()
            total += part[name].numel() * part[name].element_size()
            weight_map[name] = fname
        save_file(part, str(out / fname), metadata={"format": "pt"})
        del part
    if len(shards) > 1:
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n")
    return {"shards": len(shards), "bytes": total}


def tensor_source(tag_dir: Path, layout: dict, cfg, shapes: dict):
    """name -> tensor getter over a checkpoint, reading one tensor at a time.

    - pipelined / tensor-parallel: the per-layer (or per-TP-rank) module files, mmap-loaded, merged per tensor
      (launcher/parallel/export.py);
    - ZeRO-3: DeepSpeed's zero_to_fp32 in lazy mode (the ranks' flat fp32 partitions mmap-loaded; one tensor
      gathered per call), cast to the training dtype on write -- the values the forward used;
    - ZeRO 0-2: the module the engine saved (mp_rank_00_model_states.pt): the training-dtype weights themselves.
    """
    import torch

    if layout["pipeline_degree"] > 1 or layout["tensor_degree"] > 1:
        from launcher.parallel.export import LAYER_FILE, checkpoint_shards, merge_one

        # Per-layer files with stages; Megatron SP at one stage saves them too in checkpoints written while it ran
        # on a one-stage pipeline engine, and mp_rank files of our layer list on the plain engine since.
        pipelined = layout["pipeline_degree"] > 1 or any(LAYER_FILE.fullmatch(f.name) for f in tag_dir.iterdir())
        shards = checkpoint_shards(tag_dir, cfg.model.arch, cfg.model.num_hidden_layers, cfg.model.tie_word_embeddings,
                                   pipelined=pipelined)
        return set(shards), lambda name: merge_one(name, shards[name], shapes[name])
    if layout["zero_stage"] == 3:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        lazy = get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name, lazy_mode=True)
        return set(lazy), lambda name: lazy[name].contiguous()
    module = torch.load(tag_dir / MODEL_STATES, map_location="cpu", mmap=True, weights_only=False)["module"]
    return set(module), lambda name: module[name]


def export_checkpoint(ckpt, out, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Write a transformers directory for checkpoint `ckpt`: config.json and generation_config.json (the run's
    loaded ones unchanged), safetensors shards in the training dtype, the run's tokenizer; files 0644."""
    import tempfile

    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

    from launcher.runtime.data import EOS_CANDIDATES
    from launcher.runtime.model import attn_implementation

    tag_dir = resolve_checkpoint(ckpt)
    problems = verify_checkpoint(tag_dir)  # never export a half-written or corrupted checkpoint
    if problems:
        raise ConfigError("checkpoint", str(ckpt), f"{tag_dir} is damaged: {'; '.join(problems)}",
                          "export an intact checkpoint (an older step_* of the run)")
    out = Path(out).expanduser().absolute()
    check_export_target(out, tag_dir)
    state = load_state(tag_dir)
    cfg = OmegaConf.create(state["config"])
    layout = state["layout"]
    # Written into a sibling directory, then renamed into place: a killed export leaves `.OUT.partial-PID` and
    # OUT as it was (absent, or the earlier export), never a config.json beside a torn model.safetensors.
    final = out
    out = final.parent / f".{final.name}.partial-{os.getpid()}"
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()

    config = export_config(state, cfg, layout["padded_vocab_size"], layout["dtype"])
    dtype = getattr(torch, TORCH_DTYPES[layout["dtype"]])
    # The model built on the meta device costs nothing and names exactly the tensors transformers expects.
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation(cfg.model.arch))
    shapes = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    expected = dict(shapes)
    if config.tie_word_embeddings:
        # A tied head is one tensor; transformers re-ties it on load, and safetensors refuses shared storage.
        for k in (getattr(reference, "_tied_weights_keys", None) or ["lm_head.weight"]):
            expected.pop(k, None)
    available, get = tensor_source(tag_dir, layout, cfg, shapes)
    missing, unexpected = sorted(set(expected) - available), sorted(available - set(shapes))
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {tag_dir} does not match the model: missing {missing}, unexpected {unexpected}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    sizes = {k: math.prod(shape) * itemsize for k, shape in expected.items()}
    write_sharded(out, sizes, get, dtype, max_shard_bytes)
    fault_point("export.model-written")
    config.save_pretrained(out)
    hf = state.get("hf") or {}
    if hf.get("generation_config") is not None:
        GenerationConfig.from_dict(hf["generation_config"]).save_pretrained(out)
    else:
        GenerationConfig.from_model_config(config).save_pretrained(out)

    tok_file = tag_dir / "tokenizer.json"
    if tok_file.is_file() and hf.get("tokenizer_files"):
        # The model's own tokenizer (a directory): its tokenizer_config.json and special tokens beside the
        # tokenizer.json the run tokenized with, loaded and saved by transformers as one tokenizer.
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copyfile(tok_file, Path(tmp) / "tokenizer.json")
            for name, text in hf["tokenizer_files"].items():
                (Path(tmp) / name).write_text(text, encoding="utf-8")
            AutoTokenizer.from_pretrained(tmp, local_files_only=True).save_pretrained(out)
    elif tok_file.is_file():
        tok = PreTrainedTokenizerFast(tokenizer_file=str(tok_file))
        eos = next((t for t in EOS_CANDIDATES if tok.convert_tokens_to_ids(t) not in (None, tok.unk_token_id)), None)
        if eos is not None:
            tok.eos_token = eos
        tok.save_pretrained(out)
    for f in out.iterdir():
        os.chmod(f, 0o644)   # a model directory is shared: readable by the serving user, like save_pretrained's
    os.chmod(out, 0o755)
    return _publish(out, final)


def _publish(partial: Path, final: Path) -> Path:
    """fsync every file of the finished export, then rename it to `final` (an earlier export there is replaced)."""
    for f in partial.iterdir():
        if f.is_file():
            fsync_file(f)
    fsync_dir(partial)
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.rename(final, old)
    os.rename(partial, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final
