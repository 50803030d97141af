"""Atomic, resumable checkpoints: DeepSpeed's save_checkpoint plus our own state.

Layout under <run_dir>/checkpoints/:

    step_00000100/      DeepSpeed files (model, optimizer, scheduler, RNG) + launcher_state.json + tokenizer.json
    latest              the tag of the newest complete checkpoint (DeepSpeed's own format, so
                        deepspeed.load_checkpoint and zero_to_fp32 read it too)

Atomicity: every rank saves into `.tmp-<tag>/`; after a barrier rank 0 renames it
to `<tag>/` and only then replaces `latest` (write a temp file + os.replace).
A crash anywhere before that leaves `latest` naming the previous, complete
checkpoint; a leftover `.tmp-*` is removed by the next save. The directory
rename assumes all ranks write to one shared filesystem (as on SLURM clusters).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from launcher.config.errors import ConfigError

STATE_FILE = "launcher_state.json"
LATEST = "latest"
TAG_PREFIX = "step_"
# Layout fields a DeepSpeed checkpoint is tied to: ZeRO partitions optimizer state per DP rank,
# and the batch arithmetic decides which samples each step reads.
LAYOUT_KEYS = ("world_size", "data_degree", "tensor_degree", "pipeline_degree", "sequence_degree", "zero_stage",
               "micro_batch_size", "global_batch_size", "seq_length", "dtype", "padded_vocab_size")


def tag_for(step: int) -> str:
    return f"{TAG_PREFIX}{step:08d}"


def package_versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "deepspeed", "transformers", "tokenizers", "datasets", "launcher"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def git_sha() -> Optional[str]:
    repo = Path(__file__).resolve().parents[2]
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def build_state(cfg, layout, ds_config: dict, step: int, tokens_seen: int, prepared) -> dict:
    """Our part of a checkpoint: where training is, and everything needed to rebuild or audit it."""
    return {
        "step": step,
        "tokens_seen": tokens_seen,
        # Batches are a pure function of (seed, step): the step is the whole data position.
        "data_position": {"next_step": step, "seed": cfg.train.seed, "train_samples": prepared.train_samples},
        "layout": {k: getattr(layout, k) for k in LAYOUT_KEYS},
        "config": OmegaConf.to_container(cfg, resolve=True),
        "deepspeed_config": ds_config,
        "data": prepared.as_dict(),
        "versions": package_versions(),
        "git_sha": git_sha(),
    }


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(engine, ckpt_root: Path, step: int, state: dict, keep_last: int, rank: int,
                    tokenizer_path: Optional[str]) -> Path:
    """Save atomically (see the module docstring); all ranks call it. Returns the final tag directory."""
    import deepspeed.comm as dist

    tag = tag_for(step)
    tmp_tag = f".tmp-{tag}"
    final = ckpt_root / tag
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        for stale in ckpt_root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
    dist.barrier()
    engine.save_checkpoint(str(ckpt_root), tag=tmp_tag, client_state={"launcher_step": step}, save_latest=False)
    if rank == 0:
        _write_atomic(ckpt_root / tmp_tag / STATE_FILE, json.dumps(state, indent=2))
        if tokenizer_path:
            shutil.copyfile(tokenizer_path, ckpt_root / tmp_tag / "tokenizer.json")
        _maybe_crash_for_test(tag)
    dist.barrier()
    if rank == 0:
        if final.exists():  # the same step saved again after a resume: the new one replaces it
            shutil.rmtree(final)
        os.rename(ckpt_root / tmp_tag, final)
        _write_atomic(ckpt_root / LATEST, tag)
        prune(ckpt_root, keep_last)
    dist.barrier()
    return final


def _maybe_crash_for_test(tag: str) -> None:
    """Fault injection for the atomic-save test: die (as a SIGKILL would) after writing, before publishing."""
    if os.environ.get("LAUNCHER_CRASH_IN_SAVE") == tag:
        os._exit(17)


def prune(ckpt_root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints (never the one `latest` names)."""
    if keep_last <= 0:
        return
    latest = read_latest(ckpt_root)
    tags = sorted(p for p in ckpt_root.glob(f"{TAG_PREFIX}*") if p.is_dir())
    for old in tags[:-keep_last]:
        if old.name != latest:
            shutil.rmtree(old, ignore_errors=True)


def read_latest(ckpt_root: Path) -> Optional[str]:
    path = ckpt_root / LATEST
    return path.read_text().strip() if path.is_file() else None


def resolve_checkpoint(path) -> Path:
    """A checkpoint tag directory from: the tag dir itself, a `latest` file, or a checkpoints dir holding `latest`."""
    p = Path(path).expanduser()
    if p.is_file() and p.name == LATEST:
        return p.parent / p.read_text().strip()
    if p.is_dir() and (p / STATE_FILE).is_file():
        return p
    if p.is_dir() and (p / LATEST).is_file():
        return p / read_latest(p)
    if p.is_dir() and (p / "checkpoints" / LATEST).is_file():
        return p / "checkpoints" / read_latest(p / "checkpoints")
    raise ConfigError("checkpoint", str(p), f"is not a launcher checkpoint (no {STATE_FILE}, no '{LATEST}' file)",
                      "give <run_dir>/checkpoints/latest, a checkpoints directory, or a step_* directory")


def checkpoint_to_resume(cfg, run_dir: Path) -> Optional[Path]:
    """The tag dir to resume from: `resume=auto` -> latest of this run (None if there is none yet), or a path."""
    ckpt_root = run_dir / "checkpoints"
    if cfg.resume == "never":
        if read_latest(ckpt_root) is not None:
            raise ConfigError("resume", "never", f"the run directory {run_dir} already holds checkpoints, and a fresh run would mix with them",
                              "continue it with resume=auto, or start another run with a different run_name")
        return None
    if cfg.resume == "auto":
        tag = read_latest(ckpt_root)
        return ckpt_root / tag if tag else None
    return resolve_checkpoint(cfg.resume)


def load_state(tag_dir: Path) -> dict:
    return json.loads((tag_dir / STATE_FILE).read_text())


def check_layout_unchanged(saved: dict, layout, tag_dir: Path) -> None:
    """Refuse a resume whose layout differs from the checkpoint's, naming every change."""
    old = saved["layout"]
    changed = [f"{k}: {old.get(k)} -> {getattr(layout, k)}" for k in LAYOUT_KEYS if old.get(k) != getattr(layout, k)]
    if changed:
        raise ConfigError("resume", str(tag_dir),
                          f"the checkpoint was saved with another layout ({'; '.join(changed)}); ZeRO optimizer state is "
                          "partitioned per data-parallel rank and the data order follows the batch layout, so it cannot be continued as is",
                          "resume with the checkpoint's layout (see its launcher_state.json), or start a new run (resume=never, "
                          "model.init_from=<an exported HF directory>)")


def load_checkpoint(engine, tag_dir: Path) -> None:
    """Restore model, optimizer, scheduler and RNG state from a tag directory (all ranks)."""
    load_path, _ = engine.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name, load_optimizer_states=True,
                                          load_lr_scheduler_states=True)
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint {tag_dir}")
