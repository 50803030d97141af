"""`launcher export CKPT OUT`: a launcher checkpoint (any ZeRO stage) -> a transformers model directory.

Runs offline in one process, without a process group. The fp32 weights come from
DeepSpeed's own consolidation (deepspeed.utils.zero_to_fp32), which merges the
per-rank ZeRO partitions of stage 1, 2 and 3 (and bf16 master copies); stage 0
saves the whole module, which is read directly. The model is rebuilt from the
config stored in the checkpoint (launcher_state.json) through the same
`hf_config` mapping the training run used, loaded strictly, and written as
safetensors with its config and the run's tokenizer.

Pipelined or tensor-parallel checkpoints hold one file per layer (or per TP
rank) with the module's own weights; launcher/parallel/export.py merges the
stages and TP shards (checked against the shapes of the model built here).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from launcher.config.errors import ConfigError
from launcher.runtime.checkpoint import LATEST, MANIFEST, STATE_FILE, load_state, resolve_checkpoint, verify_checkpoint
from launcher.runtime.durable import fault_point, fsync_dir, fsync_file
from launcher.runtime.runlock import LOCK_FILE, describe, owned_by_us, read_lock, stale_reason

MODEL_STATES = "mp_rank_00_model_states.pt"


def consolidated_state_dict(tag_dir: Path, zero_stage: int, dtype: str) -> dict:
    """The full fp32 state dict of a checkpoint tag directory."""
    import torch

    if zero_stage == 0 and dtype == "fp32":
        # No ZeRO partitions and no separate master copy: the module's weights are the fp32 weights.
        return torch.load(tag_dir / MODEL_STATES, map_location="cpu", weights_only=False)["module"]
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)


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


def export_checkpoint(ckpt, out) -> Path:
    """Write a transformers directory (model.safetensors, config.json, tokenizer) for checkpoint `ckpt`."""
    import torch
    from omegaconf import OmegaConf
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from launcher.runtime.data import EOS_CANDIDATES
    from launcher.runtime.model import attn_implementation, hf_config

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

    config = hf_config(cfg.model, vocab_size=layout["padded_vocab_size"])
    # The model built on the meta device costs nothing and names exactly the tensors transformers expects.
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation(cfg.model.arch))
    if layout["pipeline_degree"] > 1 or layout["tensor_degree"] > 1:
        from launcher.parallel.export import checkpoint_state_dict

        shapes = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
        sd = checkpoint_state_dict(tag_dir, cfg.model.arch, cfg.model.num_hidden_layers, cfg.model.tie_word_embeddings,
                                   pipelined=layout["pipeline_degree"] > 1, full_shapes=shapes)
    else:
        sd = consolidated_state_dict(tag_dir, layout["zero_stage"], layout["dtype"])
    expected = set(reference.state_dict())
    if config.tie_word_embeddings:
        # A tied head is one tensor; transformers re-ties it on load, and safetensors refuses shared storage.
        tied = set(getattr(reference, "_tied_weights_keys", None) or ["lm_head.weight"])
        expected -= tied
        sd = {k: v for k, v in sd.items() if k not in tied}
    missing, unexpected = sorted(expected - set(sd)), sorted(set(sd) - expected)
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {tag_dir} does not match the model: missing {missing}, unexpected {unexpected}")
    save_file({k: v.detach().to(torch.float32).contiguous() for k, v in sd.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    fault_point("export.model-written")
    config.dtype = "float32"
    config.save_pretrained(out)

    tok_file = tag_dir / "tokenizer.json"
    if tok_file.is_file():
        tok = PreTrainedTokenizerFast(tokenizer_file=str(tok_file))
        eos = next((t for t in EOS_CANDIDATES if tok.convert_tokens_to_ids(t) not in (None, tok.unk_token_id)), None)
        if eos is not None:
            tok.eos_token = eos
        tok.save_pretrained(out)
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
