"""Starting a run: the run directory, the frozen config, the local ranks, the process group, preemption.

Outside a distributed launch `launcher train` resolves and validates the config,
prepares the data (so bad data fails before any rank starts), creates
`<runs_dir>/<run_name>/`, freezes the composed config there once
(config.yaml + deepspeed.json) and starts `cluster.gpus_per_node` local ranks
with torchrun, each running `launcher train --config <run_dir>/config.yaml`.
Under srun + torchrun (RANK/WORLD_SIZE set) the ranks run the loop directly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from launcher.config.compose import selected_name
from launcher.config.errors import ConfigError

from launcher.protocol import (CONFIG_FILE, DEEPSPEED_FILE, EARLY_PREEMPTION,  # noqa: F401  (re-exported)
                               PREEMPT_SIGNALS, PREEMPTED_FILE, TORCHRUN_SHUTDOWN_TIMEOUT_S, TORCHRUN_SIGNALS)


def in_distributed_launch() -> bool:
    """True inside torchrun / srun + torchrun: the loop runs in this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


# ----------------------------------------------------------------------------- run directory


def _latest_run(runs_dir: Path, prefix: str) -> Optional[Path]:
    runs = [p for p in runs_dir.glob(f"{prefix}-*") if (p / "checkpoints" / "latest").exists()]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def choose_run_dir(cfg) -> Path:
    """<runs_dir>/<run_name>; with run_name null, a new timestamped name, or for resume=auto the newest run of this recipe."""
    runs_dir = Path(cfg.runs_dir).expanduser().resolve()
    if cfg.run_name:
        name = cfg.run_name
        if not all(c.isalnum() or c in "._-" for c in name):
            raise ConfigError("run_name", name, "may only hold letters, digits, '.', '_' and '-'", "rename the run, e.g. run_name=tiny-1")
        return runs_dir / name
    prefix = selected_name(cfg) or "run"
    if cfg.resume == "auto":
        found = _latest_run(runs_dir, prefix)
        if found is not None:
            return found
    return runs_dir / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def freeze_config(cfg, run_dir: Path, ds_config: dict) -> Path:
    """Write the composed config (with its run_name and runs_dir fixed) and the DeepSpeed JSON into the run dir.

    Every rank reads this one file, and a requeued SLURM job finds the same run dir through it.
    A resumed run (same run dir) keeps the previous file as config.prev.yaml.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    data = OmegaConf.to_container(cfg, resolve=True)
    data["run_name"] = run_dir.name
    data["runs_dir"] = str(run_dir.parent)
    path = run_dir / CONFIG_FILE
    if path.exists():
        os.replace(path, run_dir / "config.prev.yaml")
    _write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(data)))
    _write_atomic(run_dir / DEEPSPEED_FILE, json.dumps(ds_config, indent=2))
    return path


def run_dir_of(cfg) -> Path:
    """The run dir of a frozen config (run_name and runs_dir are fixed when it is frozen)."""
    if not cfg.run_name:
        raise ConfigError("run_name", None, "a frozen config (--config) must name its run", "freeze it with `launcher train` or set run_name")
    return Path(cfg.runs_dir).expanduser() / cfg.run_name


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- local ranks


def torchrun_command(config_path: Path, nproc: int, overrides=()) -> list[str]:
    """torchrun, standalone rendezvous (one node), forwarding SIGUSR1 too, one worker per local rank."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            f"--signals-to-handle={TORCHRUN_SIGNALS}", f"--shutdown-timeout={TORCHRUN_SHUTDOWN_TIMEOUT_S}",
            "-m", "launcher", "train", "--config", str(config_path), *overrides]


def start_local_ranks(config_path: Path, nproc: int, run_dir: Path) -> int:
    """Run torchrun in the foreground, passing our own termination signals on; 0 also when preempted cleanly."""
    env = dict(os.environ)
    # One BLAS/OpenMP thread per CPU rank unless the user chose otherwise (torchrun would set 1 and warn).
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    proc = subprocess.Popen(torchrun_command(config_path, nproc), env=env)

    def forward(signum, _frame):
        proc.send_signal(signum)

    previous = {s: signal.signal(getattr(signal, s), forward) for s in ("SIGTERM", "SIGUSR1", "SIGINT")}
    try:
        rc = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(getattr(signal, s), handler)
    # torchrun reports a forwarded signal as a failure even when every worker saved and exited 0.
    if rc != 0 and (run_dir / PREEMPTED_FILE).exists():
        return 0
    return rc


# ----------------------------------------------------------------------------- inside a rank


def avoid_shm_comm_build(device: str) -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory comm op on CPU (~107 s on 2 cores, every fresh machine).

    TorchBackend.__init__ calls build_shm_op(), which builds ShareMemCommBuilder whenever
    deepspeed.ops.__compatible_ops__ says it is compatible (deepspeed/comm/torch.py). That op only
    serves the inference all-reduce path; training collectives go through torch.distributed (gloo).
    The probed dict is cached in the module and edits to it persist, so marking the op incompatible
    before init_distributed makes build_shm_op return None. Proven by tests/train (empty
    TORCH_EXTENSIONS_DIR stays empty).
    """
    if device != "cpu":
        return
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def init_distributed(layout, timeout_s: int) -> tuple[int, int, int]:
    """Join the process group (gloo on CPU, nccl on GPUs). Returns (rank, world size, local rank)."""
    import deepspeed
    import torch

    avoid_shm_comm_build(layout.device)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if world != layout.world_size:
        raise ConfigError("cluster.gpus_per_node", layout.gpus_per_node,
                          f"the launch started {world} ranks but cluster.nodes x cluster.gpus_per_node = {layout.world_size}",
                          "launch as many ranks as the config describes (launcher train / launcher submit do)")
    if layout.device == "cuda":
        torch.cuda.set_device(local_rank)
    deepspeed.init_distributed(dist_backend="nccl" if layout.device == "cuda" else "gloo",
                               timeout=timedelta(seconds=timeout_s), verbose=False)
    return rank, world, local_rank


class PreemptionFlag:
    """Set by SIGUSR1/SIGTERM in any rank; `agreed()` all-reduces it at a step boundary so all ranks stop together."""

    def __init__(self):
        # A signal recorded while the rank was still importing (launcher/__main__.py) counts as raised.
        self.raised = bool(EARLY_PREEMPTION)
        self.signal_name: Optional[str] = EARLY_PREEMPTION[0] if EARLY_PREEMPTION else None
        for name in PREEMPT_SIGNALS:
            signal.signal(getattr(signal, name), self._handler)

    def _handler(self, signum, _frame):
        self.raised = True
        self.signal_name = signal.Signals(signum).name
