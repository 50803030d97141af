"""Helpers of the SLURM tests: the local cluster (slurm/local/start.sh), `launcher submit` as a user runs it, job polling."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = str(Path(sys.executable).parent / "launcher")
START, STOP = REPO / "slurm" / "local" / "start.sh", REPO / "slurm" / "local" / "stop.sh"
# start.sh exits with this status when slurm is missing and cannot be installed (no apt-get, not root).
CANNOT_INSTALL = 3
# Ports of the test cluster, apart from a developer's cluster on the defaults (16817, 17001-17002).
TEST_PORTS = {"LAUNCHER_SLURM_CTLD_PORT": "16917", "LAUNCHER_SLURM_NODE_PORT": "17101"}
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}

def cpu_models() -> tuple[str, str]:
    """(this host's CPU model, another one): the host's read here from /proc/cpuinfo, not by the launcher's code, for
    the tests of --network-only's node-type check."""
    host = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    other = "AMD EPYC 7B13 64-Core Processor"
    return host, other if host != other else "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"


def profile_naming(base: Path, out: Path, key: str, value: str) -> Path:
    """A copy of the profile `base` at `out` whose measurements.`key` says `value` (another node type)."""
    import yaml

    doc = yaml.safe_load(base.read_text())
    doc["measurements"][key] = value
    out.write_text(yaml.safe_dump(doc))
    return out


# The small model of tests/train (2 layers of width 32, 300 kB of stdlib): each 2-node launch takes seconds.
MODEL = ["model.hidden_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2", "model.num_key_value_heads=2",
         "model.intermediate_size=64", "model.vocab_size=320", "model.max_position_embeddings=64"]


def two_node_overrides(cache_dir: Path, runs_dir: Path, run_name: str, steps: int, port: int,
                       time_limit: str = "10", grace_s: int = 60) -> list[str]:
    """recipe=tiny on 2 nodes x 1 CPU rank of the local cluster."""
    return ["recipe=tiny", *MODEL, "data.seq_length=32", "data.max_bytes=300000", f"data.cache_dir={cache_dir}",
            "batch.global_batch_size=8", "batch.micro_batch_size=4", f"train.steps={steps}", "train.eval_every=0",
            "scheduler.warmup_steps=2", "logging.log_every=1", "logging.progress_bar=false", "checkpoint.export_hf=false",
            "cluster.nodes=2", "cluster.gpus_per_node=1", "cluster.gpu=cpu", f"cluster.time={time_limit}", f"cluster.signal_grace_s={grace_s}",
            f"cluster.master_port={port}", f"runs_dir={runs_dir}", f"run_name={run_name}"]


def submit(args: list[str], env: dict, cwd: Path = REPO, timeout: int = 300) -> subprocess.CompletedProcess:
    """`launcher submit ARGS` through the installed console script."""
    return subprocess.run([LAUNCHER, "submit", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def job_id_of(stdout: str) -> str:
    line = next(x for x in stdout.splitlines() if x.startswith("submitted job "))
    return line.split()[2].rstrip(":")


def job_fields(job_id: str, env: dict) -> dict[str, str]:
    """`scontrol show job -o ID` as a dict (JobState, Restarts, JobName, ...)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True, timeout=30)
    text = out.stdout.strip()
    fields = {}
    # JobName may hold spaces: every other value is one token, so split on ' Key=' boundaries.
    import re

    for m in re.finditer(r"(?:^| )([A-Za-z:/]+)=(.*?)(?= [A-Za-z:/]+=|$)", text):
        fields.setdefault(m[1], m[2])
    return fields


def wait_job(job_id: str, env: dict, timeout_s: float = 240, until=None) -> dict[str, str]:
    """Poll scontrol (not `sbatch --wait`, which polls at 2/10/42/74 s) until the job ends (or `until(fields)`)."""
    deadline = time.time() + timeout_s
    fields: dict = {}
    while time.time() < deadline:
        fields = job_fields(job_id, env)
        if until(fields) if until else fields.get("JobState") in TERMINAL:
            return fields
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not done after {timeout_s} s: {fields}")


def cluster_env(state: Path) -> dict:
    env = dict(os.environ)
    env["SLURM_CONF"] = str(state / "slurm.conf")
    return env
