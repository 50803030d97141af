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

Integrity: before publishing, the ranks hash every file of the checkpoint (each
rank a share of the files) and rank 0 writes `manifest.json` (bytes + sha256 per
file). Resume and export verify it first, so a truncated, corrupted or missing
file is named in a clear error instead of being half-loaded. SHA-256 because it
is in the standard library, runs on the SHA extensions of x86 and ARM CPUs
(1.36 GB/s on this machine vs 0.74 GB/s for BLAKE2b; xxHash would be faster but
is another dependency and not tamper-evident), and `sha256sum` can check it by hand.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

from omegaconf import OmegaConf

from launcher.config.errors import ConfigError
from launcher.runtime.durable import fault_point, fsync_dir, write_atomic

STATE_FILE = "launcher_state.json"
MANIFEST = "manifest.json"
HASH = "sha256"
# `launcher train` verifies the checkpoint it resumes from before starting the ranks, and tells them (this
# variable = the tag dir) so they do not hash it again.
VERIFIED_ENV = "LAUNCHER_VERIFIED_CHECKPOINT"
LATEST = "latest"
TAG_PREFIX = "step_"
# Layout fields a DeepSpeed checkpoint is tied to: ZeRO partitions optimizer state per DP rank,
# and the batch arithmetic decides which samples each step reads.
LAYOUT_KEYS = ("world_size", "data_degree", "tensor_degree", "pipeline_degree", "sequence_degree", "zero_stage",
               "micro_batch_size", "global_batch_size", "seq_length", "dtype", "padded_vocab_size",
               "sequence_parallel", "context_degree")
# Keys added after checkpoints were written: absent from an older checkpoint, they mean the default, which is
# how that run ran (Megatron SP, ring-attention CP and the document mask did not exist), so it still resumes.
ADDED_KEY_DEFAULTS = {"parallel.sequence_parallel": False, "parallel.context_degree": 1, "data.document_mask": False,
                      "data.streaming": False, "data.shuffle_buffer": 10000}
ADDED_LAYOUT_DEFAULTS = {"sequence_parallel": False, "context_degree": 1}


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
        # samples_consumed: a streamed corpus (data.streaming) is re-read up to this window on resume.
        "data_position": {"next_step": step, "seed": cfg.train.seed, "train_samples": prepared.train_samples,
                          "samples_consumed": step * layout.global_batch_size},
        "layout": {k: getattr(layout, k) for k in LAYOUT_KEYS},
        "config": OmegaConf.to_container(cfg, resolve=True),
        "deepspeed_config": ds_config,
        "data": prepared.as_dict(),
        "versions": package_versions(),
        "git_sha": git_sha(),
        # Checkpoints with this key must have a manifest: a missing manifest.json is damage, not an old format.
        "manifest": MANIFEST,
    }


def save_checkpoint(engine, ckpt_root: Path, step: int, state: dict, keep_last: int, rank: int,
                    tokenizer_path: Optional[str]) -> dict:
    """Save atomically with a manifest (see the module docstring); all ranks call it.

    Returns {"path", "bytes", "save_s", "hash_s"} (the same on every rank).
    """
    import deepspeed.comm as dist

    t0 = time.perf_counter()
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
        write_atomic(ckpt_root / tmp_tag / STATE_FILE, json.dumps(state, indent=2))
        if tokenizer_path:
            shutil.copyfile(tokenizer_path, ckpt_root / tmp_tag / "tokenizer.json")
    dist.barrier()
    # Every file is on the shared filesystem now; each rank hashes its share (and fsyncs it: torch.save does
    # not, and a node crash after publishing must not leave a renamed directory of unwritten pages), rank 0
    # writes the manifest.
    t_hash = time.perf_counter()
    files = _checkpoint_files(ckpt_root / tmp_tag)
    world = dist.get_world_size()
    mine = {rel: _file_entry(ckpt_root / tmp_tag / rel, sync=True) for rel in files[rank::world]}
    shares = [None] * world
    dist.all_gather_object(shares, mine)
    hash_s = time.perf_counter() - t_hash
    entries = {rel: e for share in shares for rel, e in share.items()}
    if rank == 0:
        write_atomic(ckpt_root / tmp_tag / MANIFEST, json.dumps(
            {"algorithm": HASH, "files": dict(sorted(entries.items()))}, indent=1))
        for d in {(ckpt_root / tmp_tag / rel).parent for rel in files}:
            fsync_dir(d)  # the files' directory entries, before the directory is published
        _maybe_crash_for_test(tag)
        if final.exists():  # the same step saved again after a resume: the new one replaces it
            shutil.rmtree(final)
        os.rename(ckpt_root / tmp_tag, final)
        fsync_dir(ckpt_root)
        fault_point("checkpoint.renamed")  # published, `latest` not yet updated
        write_atomic(ckpt_root / LATEST, tag)
        prune(ckpt_root, keep_last)
    dist.barrier()
    return {"path": str(final), "bytes": sum(e["bytes"] for e in entries.values()),
            "save_s": time.perf_counter() - t0, "hash_s": hash_s}


def _checkpoint_files(tag_dir: Path) -> list[str]:
    """Every regular file under a checkpoint directory but the manifest, as sorted relative paths."""
    return sorted(p.relative_to(tag_dir).as_posix() for p in tag_dir.rglob("*")
                  if p.is_file() and p.name != MANIFEST and not p.name.startswith(f"{MANIFEST}.tmp"))


def _file_entry(path: Path, sync: bool = False) -> dict:
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, HASH).hexdigest()
        if sync:
            os.fsync(f.fileno())
    return {"bytes": path.stat().st_size, HASH: digest}


def verify_checkpoint(tag_dir: Path) -> list[str]:
    """What is wrong with a checkpoint directory against its manifest, one line per file; [] when intact.

    Sizes are compared first (a truncated file is named as such without reading it), then the hashes.
    A checkpoint saved before manifests existed (its launcher_state.json has no "manifest" key) has
    nothing to verify against: [] as well (its loader will be the judge).
    """
    tag_dir = Path(tag_dir)
    if not tag_dir.is_dir():
        return [f"{tag_dir.name}: the directory is missing"]
    try:
        state = load_state(tag_dir)
    except (OSError, ValueError) as exc:
        return [f"{STATE_FILE}: unreadable ({type(exc).__name__}: {exc})"]
    if "manifest" not in state:
        return []
    try:
        manifest = json.loads((tag_dir / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return [f"{MANIFEST}: missing (every checkpoint of this launcher version has one)"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{MANIFEST}: unreadable ({type(exc).__name__})"]
    _maybe_slow_for_test()
    problems, to_hash = [], []
    for rel, want in files.items():
        path = tag_dir / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = path.stat().st_size
        if size != want["bytes"]:
            how = "truncated" if size < want["bytes"] else "longer than written"
            problems.append(f"{rel}: {size:,} bytes, the manifest says {want['bytes']:,} ({how})")
            continue
        to_hash.append(rel)
    # hashlib releases the GIL on large buffers: threads hash the files in parallel (one process verifying a
    # multi-GB checkpoint before the ranks start would otherwise take ~1 s per 1.2 GB here).
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1, len(to_hash)))) as pool:
        digests = dict(zip(to_hash, pool.map(lambda rel: _file_entry(tag_dir / rel)[HASH], to_hash)))
    for rel in to_hash:
        got, want = digests[rel], files[rel][HASH]
        if got != want:
            problems.append(f"{rel}: {HASH} {got[:12]}... differs from the manifest's {want[:12]}... "
                            "(same size, changed content)")
    return problems


def _maybe_crash_for_test(tag: str) -> None:
    """Fault injection for the atomic-save test: die (as a SIGKILL would) after writing, before publishing."""
    if os.environ.get("LAUNCHER_CRASH_IN_SAVE") == tag:
        os._exit(17)


def _maybe_slow_for_test() -> None:
    """Fault injection for the verification-vs-timeout test: a verification this many seconds slower."""
    delay = os.environ.get("LAUNCHER_SLOW_VERIFY_S")
    if delay:
        time.sleep(float(delay))


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
    """The tag `latest` names; None when it is missing or damaged (latest_problem says which)."""
    return None if latest_problem(ckpt_root) else (ckpt_root / LATEST).read_text().strip()


def latest_problem(ckpt_root: Path) -> Optional[str]:
    """What is wrong with `<ckpt_root>/latest`: missing, unreadable, empty (a crash before the data reached the disk),
    or not naming a step_* tag; None when it names one (whether that directory is intact is verify_checkpoint's part)."""
    try:
        text = (Path(ckpt_root) / LATEST).read_bytes()
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not text.strip(b"\0 \t\r\n"):
        return "empty" + (f" ({len(text)} zero bytes)" if text else "")  # zero-filled: size persisted, data not
    try:
        tag = text.decode().strip()
    except UnicodeDecodeError:
        return "not a checkpoint tag (binary content)"
    if not re.fullmatch(r"step_\d+", tag):
        return f"{tag[:40]!r} is not a checkpoint tag (step_N)"
    return None


def resolve_checkpoint(path) -> Path:
    """A checkpoint tag directory from: the tag dir itself, a `latest` file, or a checkpoints dir holding `latest`."""
    p = Path(path).expanduser()
    root = p.parent if p.is_file() and p.name == LATEST else p if (p / LATEST).is_file() else p / "checkpoints"
    if p.is_dir() and (p / STATE_FILE).is_file():
        return p
    if (root / LATEST).is_file():
        problem = latest_problem(root)
        if problem:
            tags = [t.name for t in _older_tags(root, None)][:3]
            raise ConfigError("checkpoint", str(p), f"{root / LATEST} is damaged ({problem}), so it names no checkpoint",
                              "give a step_* directory" + (f" (here: {', '.join(tags)})" if tags else ""))
        return root / read_latest(root)
    raise ConfigError("checkpoint", str(p), f"is not a launcher checkpoint (no {STATE_FILE}, no '{LATEST}' file)",
                      "give <run_dir>/checkpoints/latest, a checkpoints directory, or a step_* directory")


def checkpoint_to_resume(cfg, run_dir: Path, warn: Callable[[str], None] = print) -> Optional[Path]:
    """The verified tag dir to resume from, or None for a fresh start.

    - resume=never: None (refused when the run dir already holds checkpoints);
    - resume=auto: the newest *intact* checkpoint of this run: `latest`, or when that one is damaged, the next
      older step_* (with a warning naming what is damaged); None when the run has no checkpoint yet;
    - resume=PATH: that checkpoint, refused when damaged (the user chose it; we do not substitute another).
    A checkpoint `launcher train` already verified (VERIFIED_ENV) is not hashed again.
    """
    ckpt_root = run_dir / "checkpoints"
    if cfg.resume == "never":
        held = [p.name for p in _older_tags(ckpt_root, None)] + ([LATEST] if (ckpt_root / LATEST).exists() else [])
        if held:
            raise ConfigError("resume", "never", f"the run directory {run_dir} already holds checkpoints ({', '.join(held[:3])}), "
                              "and a fresh run would overwrite them and truncate the run's metrics",
                              "continue it with resume=auto, or start another run with a different run_name")
        return None
    verified = os.environ.get(VERIFIED_ENV)
    if cfg.resume != "auto":
        try:
            tag_dir = resolve_checkpoint(cfg.resume)
        except ConfigError as err:
            raise ConfigError("resume", cfg.resume, err.rule, "resume=auto (this run's newest intact checkpoint), "
                              "resume=never, or " + err.fix) from None
        problems = [] if verified == str(tag_dir) else verify_checkpoint(tag_dir)
        if problems:
            older = [p.name for p in _older_tags(tag_dir.parent, tag_dir.name)][:3]
            raise ConfigError("resume", str(cfg.resume), f"the checkpoint {tag_dir} is damaged: {'; '.join(problems)}",
                              "resume from an intact checkpoint"
                              + (f" (older ones here: {', '.join(older)})" if older else "")
                              + ", or resume=auto to take the newest intact one of the run")
        return tag_dir
    latest = read_latest(ckpt_root)
    candidates = ([ckpt_root / latest] if latest else []) + _older_tags(ckpt_root, latest)
    if not candidates:
        return None
    # A damaged `latest` (empty after a node crash) is one more damaged checkpoint: the newest intact step_* is taken.
    # Missing with step_* present: a crash between publishing the first checkpoint and writing `latest`.
    problem = latest_problem(ckpt_root)
    damaged = [f"{LATEST}: {problem}"] if problem else []
    for tag_dir in candidates:
        problems = [] if verified == str(tag_dir) else verify_checkpoint(tag_dir)
        if not problems:
            if damaged:
                warn(f"warning: resume=auto skips damaged checkpoints ({'; '.join(damaged)}) and resumes from "
                     f"{tag_dir.name}, the newest intact one")
            return tag_dir
        damaged.append(f"{tag_dir.name}: {', '.join(problems)}")
    raise ConfigError("resume", "auto", f"no intact checkpoint in {ckpt_root}: {'; '.join(damaged)}",
                      "start a new run (resume=never with another run_name), or restore the files from a copy")


def _older_tags(ckpt_root: Path, than: Optional[str]) -> list[Path]:
    """step_* directories older than tag `than` (all of them when None), newest first."""
    tags = sorted((p for p in ckpt_root.glob(f"{TAG_PREFIX}*") if p.is_dir() and re.fullmatch(r"step_\d+", p.name)),
                  reverse=True)
    return [p for p in tags if than is None or p.name < than]


def load_state(tag_dir: Path) -> dict:
    return json.loads((tag_dir / STATE_FILE).read_text())


# What may differ between a checkpoint's config and the resuming run's (prefixes of flattened keys). Everything
# else is refused: the model shape and the tokenizer define the weights; the parallel layout, batch, precision,
# data, seed and step arithmetic define the ZeRO partitions and which samples each step reads; the optimizer and
# scheduler continue from the checkpoint's own state (DeepSpeed restores it), so a changed lr or schedule in the
# config would be silently overridden or mixed -- refused until it is supported on purpose.
RESUME_MAY_CHANGE = (
    "train.steps", "train.tokens", "train.eval_every", "train.eval_batches", "train.nan_policy", "train.dist_timeout_s",
    "logging.", "checkpoint.", "resume", "run_name", "runs_dir", "recipe_name", "extras.", "model.init_from",
    "data.cache_dir",
    # Only with the decay horizon it yields unchanged (check_schedule_kept): decay_steps pins the saved schedule.
    "scheduler.decay_steps",
    # Where the job runs and how it is planned and scheduled (not what it computes).
    "cluster.name", "cluster.gpu", "cluster.peak_tflops", "cluster.memory_gb", "cluster.intra_node_gbps",
    "cluster.inter_node_gbps", "cluster.partition", "cluster.account", "cluster.time", "cluster.signal_grace_s",
    "cluster.setup", "cluster.job_name", "cluster.master_port", "cluster.preflight", "cluster.extra_sbatch", "cluster.cpus_per_task",
)


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: tree}


def _may_change(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) or key.startswith(p + ".") for p in RESUME_MAY_CHANGE)


def resume_changes(saved: dict, cfg, layout, tag_dir: Path, prepared=None) -> list[str]:
    """Every change between a checkpoint and the run resuming it that a resume cannot absorb, as `key: saved -> now`.

    A change of DP size, TP or PP degree, ZeRO stage or micro batch is absorbed (runtime/elastic.py: through
    DeepSpeed's universal checkpoint); what it cannot carry is refused by elastic.refuse_unconvertible."""
    from launcher.runtime.elastic import ELASTIC_CONFIG_KEYS, ELASTIC_LAYOUT_KEYS

    now = _flatten(OmegaConf.to_container(cfg, resolve=True))
    then = _flatten(saved.get("config", {}))
    for k, default in ADDED_KEY_DEFAULTS.items():
        then.setdefault(k, default)   # a checkpoint from before the key existed ran as its default does
    changes = [f"{k}: {then.get(k, '(absent)')} -> {now.get(k, '(absent)')}" for k in sorted(set(now) | set(then))
               if then.get(k) != now.get(k) and not _may_change(k) and k not in ELASTIC_CONFIG_KEYS]
    old = saved["layout"]
    changes += [f"layout.{k}: {old.get(k, ADDED_LAYOUT_DEFAULTS.get(k))} -> {getattr(layout, k)}" for k in LAYOUT_KEYS
                if old.get(k, ADDED_LAYOUT_DEFAULTS.get(k)) != getattr(layout, k) and k not in ELASTIC_LAYOUT_KEYS]
    if prepared is not None:
        # The tokens and the tokenizer themselves (a config can stay equal while the files behind it change).
        data = saved.get("data", {})
        for k in ("num_tokens", "vocab_size", "eos_id", "train_samples"):
            if k in data and data[k] != getattr(prepared, k):
                changes.append(f"data.{k}: {data[k]} -> {getattr(prepared, k)}")
        if data.get("bin_path") and Path(data["bin_path"]).name != Path(prepared.bin_path).name:
            changes.append(f"packed tokens: {Path(data['bin_path']).name} -> {Path(prepared.bin_path).name} (other content)")
        saved_tok = Path(tag_dir) / "tokenizer.json"
        if prepared.tokenizer_path and saved_tok.is_file():
            a, b = _file_entry(saved_tok)[HASH], _file_entry(Path(prepared.tokenizer_path))[HASH]
            if a != b:
                changes.append(f"tokenizer: {HASH} {a[:12]}... -> {b[:12]}...")
    return changes


def _cosine_lr(step: int, lr: float, warmup: int, horizon: int, min_lr: float) -> float:
    """The lr of optimizer step `step` (1-based) under DeepSpeed 0.19.8's WarmupCosineLR as deepspeed_config.py
    configures it: iteration step-1, warmup raised to 2, cosine progress clamped to 1 (lr_schedules.py get_lr_ratio);
    warmup 0 is a 2-step warmup held at the peak (deepspeed_config.py _scheduler)."""
    it, flat, warmup = step - 1, warmup == 0, max(2, warmup)
    if it < warmup:
        return lr if flat else lr * it / warmup
    progress = min(1.0, (it - warmup + 1) / max(1, horizon - warmup))
    ratio = min_lr / lr
    return lr * max(0.0, ratio + (1 - ratio) * (1 + math.cos(math.pi * progress)) / 2)


def check_schedule_kept(saved: dict, cfg, tag_dir: Path) -> None:
    """A resume must keep the cosine decay horizon it was saved with: DeepSpeed restores only the scheduler's
    iteration, and rebuilds the curve from this config, so a changed train.steps (with scheduler.decay_steps
    null) would re-stretch the rest of the schedule without a word. Megatron-LM refuses the same change
    unless told which to use (OptimizerParamScheduler._check_and_set, --use-checkpoint-opt_param-scheduler)."""
    then = saved.get("config", {})
    old_s, s = then.get("scheduler", {}), cfg.scheduler
    if s.name != "cosine" or old_s.get("name") != "cosine":
        return  # a changed scheduler name is refused with the other changes; `constant` has no horizon
    old_h = old_s.get("decay_steps") or then.get("train", {}).get("steps")
    new_h = s.decay_steps if s.decay_steps is not None else cfg.train.steps
    step = saved.get("step", 0) + 1
    if old_h is None or old_h == new_h or step >= max(old_h, new_h):
        return  # the same curve, or both already at min_lr from the next step on (the lr of step >= horizon is min_lr)
    lr, warmup, min_lr = cfg.optimizer.lr, s.warmup_steps, s.min_lr
    key, value = ("scheduler.decay_steps", s.decay_steps) if s.decay_steps is not None else ("train.steps", cfg.train.steps)
    raise ConfigError(key, value,
                      f"resuming {tag_dir.name} would re-stretch the cosine learning-rate schedule: its decay horizon was "
                      f"{old_h} steps and would become {new_h} ({key}), so the lr of step {step} would change from "
                      f"{_cosine_lr(step, lr, warmup, old_h, min_lr):.4g} to {_cosine_lr(step, lr, warmup, new_h, min_lr):.4g} "
                      f"and every later step would follow the new curve",
                      f"keep the saved schedule with scheduler.decay_steps={old_h} (after step {old_h} the lr stays at "
                      f"scheduler.min_lr={min_lr:g}), or train under a new schedule as a new run from the exported weights "
                      f"(resume=never, model.init_from=<launcher export of this checkpoint>)")


def refuse_one_stage_pipeline_files(layout, tag_dir: Path) -> None:
    """Megatron SP at pipeline_degree=1 ran on a one-stage pipeline engine until the plain engine took it over
    (launcher/parallel/tensor_model.py): such a checkpoint holds the layers in per-layer files, which the plain
    engine does not read (it loads mp_rank_<tp> files). `launcher export` reads either format."""
    if not (layout.sequence_parallel and layout.pipeline_degree == 1):
        return
    if any(Path(tag_dir).glob("layer_*-model_*-model_states.pt")):
        raise ConfigError("resume", str(tag_dir),
                          "holds per-layer files (layer_*-model_*-model_states.pt): it was written when Megatron sequence "
                          "parallelism at parallel.pipeline_degree=1 ran on DeepSpeed's one-stage pipeline engine; this "
                          "launcher runs that layout on the plain engine, which loads the layers from mp_rank_<tp> files, "
                          "so the weights would not be found",
                          f"export it (`launcher export {tag_dir} <out>`) and start a new run from the export with "
                          "model.init_from=<out> and resume=never (the optimizer state restarts)")


def refuse_autotp_checkpoint(saved: dict, tag_dir: Path) -> None:
    """Tensor parallelism at pipeline_degree = 1 ran on DeepSpeed AutoTP until our TP layers took it over (issue 11:
    launcher/parallel/tensor_model.py). Such a checkpoint, recognised by the `tensor_parallel.autotp_size` its
    generated DeepSpeed config carried, holds AutoTP's slices of the transformers model under transformers' names
    (model.layers.0.self_attn.q_proj.weight); the layers now load `pipe.<layer>.<name>` and ZeRO's optimizer
    partitions follow that module's parameter order, so it cannot be loaded on any layout. `launcher export`
    reads it (launcher/parallel/export.py)."""
    autotp = (saved.get("deepspeed_config") or {}).get("tensor_parallel", {}).get("autotp_size")
    if autotp:
        raise ConfigError("resume", str(tag_dir),
                          f"was written by DeepSpeed AutoTP (tensor_parallel.autotp_size={autotp} in its DeepSpeed config), "
                          "with AutoTP's slices under transformers parameter names; this launcher runs tensor parallelism "
                          "on its own TP layers (each rank building only its slice, parameters named pipe.<layer>.<name>) "
                          "and loads or converts only checkpoints its own modules wrote, so that one cannot be continued "
                          "on any layout",
                          f"export it (`launcher export {tag_dir} <out>`) and start a new run from the export with "
                          "model.init_from=<out> and resume=never (the optimizer state restarts)")


def check_resume_compatible(saved: dict, cfg, layout, tag_dir: Path, prepared=None) -> None:
    """Refuse a resume that changes more than RESUME_MAY_CHANGE, with a diff of what changed (key: saved -> now),
    or that would change the learning-rate schedule (check_schedule_kept)."""
    from launcher.runtime.elastic import needs_conversion, refuse_global_batch_change, refuse_unconvertible

    check_schedule_kept(saved, cfg, tag_dir)
    refuse_autotp_checkpoint(saved, tag_dir)
    refuse_one_stage_pipeline_files(layout, tag_dir)
    refuse_global_batch_change(saved, cfg, layout, tag_dir)
    changes = resume_changes(saved, cfg, layout, tag_dir, prepared)
    if changes:
        raise ConfigError("resume", str(tag_dir),
                          f"the checkpoint was saved with another model, data or settings ({'; '.join(changes)}); the "
                          "weights fit one model shape and tokenizer, the data order follows the global batch and the "
                          "optimizer and schedule continue from the saved state, so it cannot be continued as is. A resume "
                          "may change only: the layout (cluster.nodes, cluster.gpus_per_node, parallel.*_degree, "
                          "parallel.zero_stage 1-3, batch.micro_batch_size: docs/training.md, \"Changing the layout\"), "
                          "train.steps (with the LR schedule's decay horizon kept), evaluation, logging, checkpointing, train.nan_policy, train.dist_timeout_s "
                          "and where/how the job is scheduled (cluster.partition, time, ...)",
                          "resume with the checkpoint's settings (see its launcher_state.json), or start a new run "
                          "(resume=never, model.init_from=<an exported HF directory>)")
    if needs_conversion(saved, cfg, layout):
        refuse_unconvertible(saved, cfg, layout, tag_dir)


def load_checkpoint(engine, tag_dir: Path) -> None:
    """Restore model, optimizer, scheduler and RNG state from a tag directory (all ranks), each rank reading only its own files.

    DeepSpeed 0.19.8 opens per rank only what the rank holds: its pipeline stage's layer files for its TP rank
    (PipelineModule.load_state_dir), its own mp_rank_* file, and under ZeRO its own zero_pp_rank_* files
    (engine._get_all_zero_checkpoint_state_dicts; elastic_checkpoint is off). But before each of those loads,
    SDLoaderBase.check_ckpt_list torch.loads the *first* file of the list whole, only to compare its mp_world_size
    with the number of files (runtime/state_dict_factory.py 166-175): every rank of a pipeline or TP layout reads
    mp_rank_00's optimizer state and the TP-rank-0 file of each of its layers besides its own, twice the bytes it
    needs (measured: bench/build/results.md, "Resume"). `_check_ckpt_list_mapped` makes the same check read only
    the pickle (torch.load(mmap=True) maps the tensor data and nothing touches it).

    A universal checkpoint (runtime/elastic.py) is a tag directory of the same shape, loaded by an engine
    configured with load_universal.
    """
    from deepspeed.runtime.state_dict_factory import SDLoaderBase

    # DeepSpeed 0.19.8's ZeRO-3 universal load copies the hyperparameters of param_groups[0] onto every group
    # (stage3.py load_hp_checkpoint_state_from_checkpoint_dir_stage3), so the norms and biases, which get no weight
    # decay (runtime/optimizer.py), would be decayed from then on (measured: DP4 -> DP2 grad norm 9.2e-5 off an
    # uninterrupted run one step after the resume). Each group's weight decay is this run's: put it back.
    groups = getattr(engine.optimizer, "param_groups", None) or []
    decay = [g.get("weight_decay") for g in groups]
    real_check = SDLoaderBase.check_ckpt_list
    SDLoaderBase.check_ckpt_list = _check_ckpt_list_mapped
    try:
        load_path, _ = engine.load_checkpoint(str(tag_dir.parent), tag=tag_dir.name, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
    finally:
        SDLoaderBase.check_ckpt_list = real_check
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint {tag_dir}")
    for g, wd in zip(getattr(engine.optimizer, "param_groups", None) or [], decay):
        if wd is not None:
            g["weight_decay"] = wd


def _check_ckpt_list_mapped(self) -> None:
    """SDLoaderBase.check_ckpt_list (DeepSpeed 0.19.8) with the first file mapped instead of read."""
    import torch

    assert len(self.ckpt_list) > 0
    sd = torch.load(self.ckpt_list[0], map_location="cpu", weights_only=False, mmap=True)
    if "mp_world_size" in sd:
        assert len(self.ckpt_list) == sd["mp_world_size"], (
            f"checkpoint count {len(self.ckpt_list)} is different from saved mp_world_size {sd['mp_world_size']}")


# ----------------------------------------------------------------------------- choosing it before the process group


def attempt_key() -> str:
    """The same string in every rank of one launch and another in the next: torchrun's run id (a fresh uuid per
    --standalone torchrun; the rendezvous id = SLURM job id under sbatch), SLURM's requeue count, torchrun's restarts."""
    parts = [os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_RESTART_COUNT",
                                             "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT")]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


# A waiting rank allows rank 0 this long plus VERIFY_MIN_BYTES_PER_S over the run's checkpoint bytes: 12x slower
# than the 1.2 GB/s per core measured here, for a slow shared filesystem.
VERIFY_WAIT_BASE_S = 600
VERIFY_MIN_BYTES_PER_S = 100e6


def agree_before_group(cfg, run_dir: Path, rank: int, layout, warn: Callable[[str], None] = print
                       ) -> tuple[Optional[Path], Optional[Path]]:
    """Every rank's checkpoint to resume from (or None), decided by rank 0 *before* the process group exists, and
    the universal form to load instead when it was saved on another layout (rank 0 converts it: runtime/elastic.py).

    Rank 0 runs checkpoint_to_resume (which hashes every byte of the checkpoint unless `launcher train` already
    did: minutes for a 175B optimizer state) and writes its choice or its error to `<run_dir>/.resume-<attempt>.json`;
    the other ranks wait for that file with a bound of their own (VERIFY_WAIT_BASE_S + the run's checkpoint bytes
    at VERIFY_MIN_BYTES_PER_S), not inside a collective bounded by train.dist_timeout_s, which a slow verification
    would run past on every requeue (issue 12). A rank 0 that dies meanwhile ends the job through torchrun / srun.
    """
    handoff = run_dir / f".resume-{attempt_key()}.json"
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        for old in run_dir.glob(".resume-*.json"):
            if old != handoff:
                old.unlink(missing_ok=True)
        try:
            from launcher.runtime.elastic import prepare_resume

            found = checkpoint_to_resume(cfg, run_dir, warn=warn)
            universal = prepare_resume(found, run_dir, cfg, layout, log=warn)
            rec = {"checkpoint": None if found is None else str(found), "universal": universal and str(universal)}
        except ConfigError as err:
            rec = {"error": [err.key, err.value, err.rule, err.fix]}
        write_atomic(handoff, json.dumps(rec))
    else:
        # A conversion to a universal checkpoint reads the checkpoint and writes it again (a few passes): 4x.
        limit = VERIFY_WAIT_BASE_S + 4 * _checkpoint_bytes(run_dir / "checkpoints") / VERIFY_MIN_BYTES_PER_S
        deadline = time.monotonic() + limit
        while not handoff.is_file():
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {rank}: rank 0 did not choose a checkpoint to resume from within {limit:.0f} s "
                                   f"(no {handoff})")
            time.sleep(0.2)
        rec = json.loads(handoff.read_text())
    if "error" in rec:
        raise ConfigError(*rec["error"])
    return (None if rec["checkpoint"] is None else Path(rec["checkpoint"]),
            None if rec.get("universal") is None else Path(rec["universal"]))


def clear_resume_handoff(run_dir: Path) -> None:
    (run_dir / f".resume-{attempt_key()}.json").unlink(missing_ok=True)


def _checkpoint_bytes(ckpt_root: Path) -> int:
    total = 0
    for manifest in ckpt_root.glob(f"{TAG_PREFIX}*/{MANIFEST}"):
        try:
            total += sum(int(e["bytes"]) for e in json.loads(manifest.read_text())["files"].values())
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return total
