"""The run directory: where a run lives (<runs_dir>/<run_name>), and the frozen config every rank reads there.

Outside a distributed launch `launcher train` creates `<runs_dir>/<run_name>/` and freezes the composed config
there once (config.yaml + deepspeed.json); the ranks (and a requeued SLURM job) find the run through it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from launcher.config.compose import selected_name
from launcher.config.errors import ConfigError
from launcher.protocol import CONFIG_FILE, DEEPSPEED_FILE
from launcher.runtime.durable import write_atomic


def _latest_run(runs_dir: Path, prefix: str) -> Optional[Path]:
    runs = [p for p in runs_dir.glob(f"{prefix}-*") if (p / "checkpoints" / "latest").exists()]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def choose_run_dir(cfg) -> Path:
    """<runs_dir>/<run_name>; with run_name null, a new timestamped name, or for resume=auto the newest run of this recipe."""
    check_runs_dir(cfg.runs_dir)
    runs_dir = Path(cfg.runs_dir).expanduser().resolve()
    if cfg.run_name:
        name = cfg.run_name
        if not all(c.isalnum() or c in "._-" for c in name):
            raise ConfigError("run_name", name, "may only hold letters, digits, '.', '_' and '-'", "rename the run, e.g. run_name=tiny-1")
        run_dir = runs_dir / name
    else:
        prefix = selected_name(cfg) or "run"
        found = _latest_run(runs_dir, prefix) if cfg.resume == "auto" else None
        run_dir = found or runs_dir / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError("run_name", run_dir.name, f"{run_dir} exists and is not a directory", "pick another run_name")
    return run_dir


def check_runs_dir(runs_dir: str) -> None:
    """runs_dir becomes part of every path we write and of SLURM's log paths: no control characters, and a directory."""
    if any(ord(c) < 32 or ord(c) == 127 for c in str(runs_dir)):
        raise ConfigError("runs_dir", runs_dir, "holds a control character (newline, tab, ...), which would break log lines "
                          "and the paths in job scripts", "use a plain directory path, e.g. runs_dir=/scratch/$USER/runs")
    path = Path(runs_dir).expanduser().resolve()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError("runs_dir", runs_dir, f"{probe} is a file, so no run directory can be made under it",
                          "point runs_dir at a directory (it is created when missing)")


def freeze_config(cfg, run_dir: Path, ds_config: dict) -> Path:
    """Write the composed config (with its run_name and runs_dir fixed) and the DeepSpeed JSON into the run dir.

    Every rank reads this one file, and a requeued SLURM job finds the same run dir through it, so it is
    never missing or torn: a resumed run with another config keeps the previous file as config.prev.yaml,
    written (a copy) before the new config.yaml replaces the old one in one rename. A full disk fails one of
    the writes and leaves config.yaml as it was; an unchanged config is not rewritten at all.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    data = OmegaConf.to_container(cfg, resolve=True)
    data["run_name"] = run_dir.name
    data["runs_dir"] = str(run_dir.parent)
    path = run_dir / CONFIG_FILE
    text = OmegaConf.to_yaml(OmegaConf.create(data))
    old = path.read_text() if path.is_file() else None
    if old != text:
        if old is not None:
            write_atomic(run_dir / "config.prev.yaml", old)
        write_atomic(path, text, fault="config.tmp-written")
    write_atomic(run_dir / DEEPSPEED_FILE, json.dumps(ds_config, indent=2))
    return path


def run_dir_of(cfg) -> Path:
    """The run dir of a frozen config (run_name and runs_dir are fixed when it is frozen)."""
    if not cfg.run_name:
        raise ConfigError("run_name", None, "a frozen config (--config) must name its run", "freeze it with `launcher train` or set run_name")
    return Path(cfg.runs_dir).expanduser() / cfg.run_name
