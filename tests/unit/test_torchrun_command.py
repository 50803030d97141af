"""The torchrun command `launcher train` starts local ranks with (launcher/runtime/launch.py) parses with the
installed torchrun's own argument parser, and carries --shutdown-timeout only where that torchrun has it (the
sbatch script asks the same function: tests/slurm runs it under a real SLURM).

torch 2.11's torchrun (the GPU image's, bench/gpu/results.md) has no --shutdown-timeout and refused the whole run
("unrecognized arguments"); the flag is kept where it exists because it lets the ranks finish a preemption
checkpoint (300 s, launcher/protocol.py) instead of torchrun's default 30 s before SIGKILL.
"""

from __future__ import annotations

from pathlib import Path

from torch.distributed.run import get_args_parser

from launcher.protocol import TORCHRUN_SHUTDOWN_TIMEOUT_S, torchrun_grace_flags
from launcher.runtime.launch import torchrun_command


def test_the_command_parses_with_the_installed_torchrun():
    cmd = torchrun_command(Path("/runs/r/config.yaml"), 2, ["train.steps=3"])
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    args = get_args_parser().parse_args(cmd[3:])  # exits (SystemExit) on a flag this torchrun lacks
    assert args.nproc_per_node == "2" and args.module and args.training_script == "launcher"
    assert args.training_script_args == ["train", "--config", "/runs/r/config.yaml", "train.steps=3"]


def test_shutdown_timeout_follows_what_torchrun_accepts():
    accepts = any("--shutdown-timeout" in a.option_strings for a in get_args_parser()._actions)
    flag = f"--shutdown-timeout={TORCHRUN_SHUTDOWN_TIMEOUT_S}"
    assert torchrun_grace_flags() == ([flag] if accepts else [])
    assert (flag in torchrun_command(Path("c.yaml"), 1)) == accepts
