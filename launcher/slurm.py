"""Config + layout -> an sbatch script (slurm/train.sbatch.tmpl), and the sbatch call. No torch.

    check_cluster(cfg, layout)          every SLURM setting checked before anything is written or submitted
    job_values(cfg, layout, paths)      the template's values, each shell-quoted; nodes / GPUs from the Layout
    render_script(values)               the filled template
    sbatch(script_path)                 submit; returns the job id

Nodes, tasks and GPUs come from the `Layout` (resolve_layout), never from the config a second time.
Quoting: every config value that reaches the script goes through shlex.quote, including the `#SBATCH`
lines: sbatch reads them with its own parser (src/sbatch/opt.c, _get_argument), which groups single- and
double-quoted text like the shell does, so `--job-name='x; touch pwned'` is one argument there too. A
newline would end the `#SBATCH` comment and start a shell line, so control characters are refused outright.
`cluster.setup` is the one exception: it is shell code by design (the site hook), written as given.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from launcher.config.errors import ConfigError
from launcher.protocol import CONFIG_FILE, CPU_MALLOC_ENV, PREEMPTED_FILE, TORCHRUN_SIGNALS

# Package data (a wheel carries it); slurm/train.sbatch.tmpl in the checkout links here.
TEMPLATE = Path(__file__).resolve().parent / "templates" / "train.sbatch.tmpl"
CALIBRATE_TEMPLATE = TEMPLATE.with_name("calibrate.sbatch.tmpl")
# A calibration takes 1-5 minutes (docs/steptime.md); its job asks for this much, or cluster.time where shorter,
# so that it does not queue as a day-long job.
CALIBRATE_TIME_S = 30 * 60
SCRIPT_FILE = "job.sbatch"
LOG_PATTERN = "slurm-%j.out"  # %j: SLURM puts the job id in (sbatch(1), "filename pattern")

# sbatch --time accepts "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes" and "days-hours:minutes:seconds" (sbatch(1), --time).
_TIME_FORMS = (
    (re.compile(r"(\d+)"), lambda m: int(m[1]) * 60),
    (re.compile(r"(\d+):(\d+)"), lambda m: int(m[1]) * 60 + int(m[2])),
    (re.compile(r"(\d+):(\d+):(\d+)"), lambda m: int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])),
    (re.compile(r"(\d+)-(\d+)"), lambda m: int(m[1]) * 86400 + int(m[2]) * 3600),
    (re.compile(r"(\d+)-(\d+):(\d+)"), lambda m: int(m[1]) * 86400 + int(m[2]) * 3600 + int(m[3]) * 60),
    (re.compile(r"(\d+)-(\d+):(\d+):(\d+)"),
     lambda m: int(m[1]) * 86400 + int(m[2]) * 3600 + int(m[3]) * 60 + int(m[4])),
)
# Partition and account names as sites create them; a partition may be a comma list (sbatch(1) --partition).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# --signal=<sig>@<sig_time>: "sig_time must be an integer value between 0 and 65535" (sbatch(1)).
# MASTER_PORT = cluster.master_port + 2 x (job id mod PORT_SLOTS): concurrent jobs on one first node get their own
# rendezvous port (a shared one joins the other job's c10d store and dies with it; seen in tests/slurm's sweep).
# Both bound settings, so they live with the ranges.
from launcher.config.ranges import PORT_SLOTS  # noqa: E402
MAX_JOB_NAME = 1024  # a sanity bound; squeue shows the first 8 characters by default


def time_limit_seconds(value: str) -> int:
    """sbatch --time text -> seconds; ConfigError for anything sbatch would not take as a finite limit."""
    for pattern, seconds in _TIME_FORMS:
        m = pattern.fullmatch(str(value))
        if m:
            return seconds(m)
    raise ConfigError("cluster.time", value,
                      "is not a SLURM time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch --time)",
                      "e.g. cluster.time=24:00:00 or cluster.time=2-00:00:00")


def preflight_enabled(cfg, layout) -> bool:
    """cluster.preflight, or by default on for GPU clusters (a CPU-rank job has no GPUs to check)."""
    if cfg.cluster.preflight is None:
        return layout.device == "cuda"
    return bool(cfg.cluster.preflight)


def job_name(cfg, run_dir: Path) -> str:
    return cfg.cluster.job_name if cfg.cluster.job_name is not None else run_dir.name


def check_cluster(cfg, layout) -> None:
    """Every SLURM setting the script needs, checked before a job dir is written or sbatch is called.

    `layout` is the resolved Layout: nodes and GPUs were checked there (resolve_layout), not here.
    """
    c = cfg.cluster
    _check_time_limit(c)
    _check_names(c)
    _check_numbers_and_options(c)


def _check_time_limit(c) -> None:
    limit = time_limit_seconds(c.time)
    if limit < 60:
        raise ConfigError("cluster.time", c.time, "a time limit under one minute: SLURM counts limits in whole minutes",
                          "give at least cluster.time=1 (one minute)")
    grace = c.signal_grace_s  # in 1..MAX_SIGNAL_TIME_S (launcher/config/ranges.py, checked by resolve_layout)
    if grace >= limit:
        raise ConfigError("cluster.signal_grace_s", grace,
                          f"the checkpoint signal would come at or before the start: grace {grace} s >= time limit "
                          f"{c.time} = {limit} s",
                          f"raise cluster.time or lower cluster.signal_grace_s below {limit}")


def _check_names(c) -> None:
    for key, value, allow_list in (("cluster.partition", c.partition, True), ("cluster.account", c.account, False)):
        if value is None:
            continue
        parts = str(value).split(",") if allow_list else [str(value)]
        if not all(_NAME.fullmatch(p) for p in parts):
            what = "comma-separated names" if allow_list else "a name"
            raise ConfigError(key, value, f"must be {what} of letters, digits, '_', '.', '+' or '-' (as SLURM sites name them)",
                              "check `sinfo -s` (partitions) or `sacctmgr show assoc user=$USER` (accounts) for the exact name")
    if c.job_name is not None:
        name = str(c.job_name)
        if _CONTROL.search(name):
            raise ConfigError("cluster.job_name", c.job_name,
                              "holds a control character (a newline would end the #SBATCH comment and start a shell line)",
                              "use a one-line name, or leave it null for the run name")
        if not 1 <= len(name) <= MAX_JOB_NAME:
            raise ConfigError("cluster.job_name", c.job_name, f"must be 1..{MAX_JOB_NAME} characters long (it has {len(name)})",
                              "shorten it, or leave it null for the run name")


def _check_numbers_and_options(c) -> None:
    # master_port and cpus_per_task ranges: launcher/config/ranges.py (checked by resolve_layout, before this).
    for i, option in enumerate(c.extra_sbatch):
        if not str(option).startswith("--") or _CONTROL.search(str(option)):
            raise ConfigError(f"cluster.extra_sbatch[{i}]", option,
                              "each entry is one long sbatch option on one line, starting with '--'",
                              "e.g. cluster.extra_sbatch=[--exclusive]")
    if c.setup is not None and "\x00" in str(c.setup):
        raise ConfigError("cluster.setup", "(text with a NUL byte)", "shell code cannot hold NUL bytes", "remove it")


@dataclass(frozen=True)
class JobPaths:
    """Where a job's files live: the run dir is the job dir (the requeued job finds its checkpoints there)."""

    run_dir: Path
    workdir: Path  # the submit directory: relative paths in the config (data paths) resolve from here
    python: str  # the interpreter on the nodes (the venv of the login node on a shared filesystem)

    @property
    def config(self) -> Path:
        return self.run_dir / CONFIG_FILE

    @property
    def script(self) -> Path:
        return self.run_dir / SCRIPT_FILE

    def log_for(self, job_id: str) -> Path:
        return self.run_dir / LOG_PATTERN.replace("%j", job_id)


def _q(value) -> str:
    return shlex.quote(str(value))


def _sbatch_line(option: str, value=None) -> str:
    return f"#SBATCH {option}" if value is None else f"#SBATCH {option}={_q(value)}"


def _output_pattern(run_dir: Path) -> str:
    """sbatch --output for the run dir: a literal '%' in the dir is written '%%' (sbatch(1), filename pattern)."""
    return str(run_dir).replace("%", "%%") + "/" + LOG_PATTERN


def _site_values(c, gpu_job: bool, gpus_per_node: int) -> dict[str, str]:
    """The placeholders both templates share: what to ask of the site (GPUs, CPUs, partition, account, extra
    options) and what to run first on the nodes (cluster.setup, CPU ranks' malloc settings)."""
    return {
        "sbatch_gpus": (_sbatch_line("--gpus-per-node", gpus_per_node) if gpu_job
                        else "# (no GPUs requested: cluster.gpu=cpu, the ranks run on CPU cores)"),
        "sbatch_cpus": (_sbatch_line("--cpus-per-task", c.cpus_per_task) if c.cpus_per_task is not None
                        else "# (--cpus-per-task: the site default; set cluster.cpus_per_task to choose)"),
        "sbatch_partition": (_sbatch_line("--partition", c.partition) if c.partition is not None
                             else "# (--partition: the site default; set cluster.partition to choose)"),
        "sbatch_account": (_sbatch_line("--account", c.account) if c.account is not None
                           else "# (--account: the site default; set cluster.account to choose)"),
        "sbatch_extra": ("\n".join(f"#SBATCH {_q(o)}" for o in c.extra_sbatch) if c.extra_sbatch
                         else "# (cluster.extra_sbatch: none)"),
        "setup": str(c.setup).rstrip("\n") if c.setup else "# (cluster.setup: none)",
        "cpu_env": ("\n".join(f'export {k}="${{{k}:-{v}}}"' for k, v in CPU_MALLOC_ENV.items()) if not gpu_job
                    else "# (GPU ranks: glibc's defaults)"),
        "master_port": str(c.master_port),
        "port_slots": str(PORT_SLOTS),
        "gpus_per_node": str(gpus_per_node),
    }


def job_values(cfg, layout, paths: JobPaths) -> dict[str, str]:
    """The template's placeholders -> text. Numbers from the Layout; config strings shell-quoted."""
    c = cfg.cluster
    gpu_job = layout.device == "cuda"
    return {
        **_site_values(c, gpu_job, layout.gpus_per_node),
        "header": (f"run {paths.run_dir.name}: {layout.nodes} nodes x {layout.gpus_per_node} "
                   f"{'GPUs' if gpu_job else 'CPU ranks'} = {layout.world_size} ranks; TP {layout.tensor_degree} x "
                   f"PP {layout.pipeline_degree} x SP {layout.sequence_degree} x DP {layout.data_degree}; "
                   f"ZeRO {layout.zero_stage}; {layout.dtype}"),
        "job_name": _q(job_name(cfg, paths.run_dir)),
        "nodes": str(layout.nodes),
        "time": _q(c.time),
        "workdir": _q(paths.workdir),
        "log_path": _q(_output_pattern(paths.run_dir)),
        "signal_grace_s": str(c.signal_grace_s),
        "run_dir": _q(paths.run_dir),
        "config_path": _q(paths.config),
        "python": _q(paths.python),
        "preempted_file": _q(PREEMPTED_FILE),
        "preflight": "1" if preflight_enabled(cfg, layout) else "0",
        "device": layout.device,
        "torchrun_signals": _q(TORCHRUN_SIGNALS),
    }


def check_calibrate_cluster(cfg) -> None:
    """The SLURM settings a calibration job uses (no training layout, no checkpoint signal), checked before any
    file is written: names, extra options, the time limit, and a node count and rank count of at least 1."""
    c = cfg.cluster
    time_limit_seconds(c.time)
    _check_names(c)
    _check_numbers_and_options(c)
    for key, value in (("cluster.nodes", c.nodes), ("cluster.gpus_per_node", c.gpus_per_node)):
        if int(value) < 1:
            raise ConfigError(key, value, "a calibration runs at least one rank on at least one node", f"set {key}=1 or more")


def calibrate_time(cfg) -> str:
    """The calibration job's --time: CALIBRATE_TIME_S, or cluster.time where that is shorter."""
    limit = min(CALIBRATE_TIME_S, time_limit_seconds(cfg.cluster.time))
    return f"{limit // 3600:02d}:{limit % 3600 // 60:02d}:{limit % 60:02d}"


def calibrate_job_values(cfg, job_dir: Path, out: Path, workdir: Path, python: str,
                         base: Optional[str] = None) -> dict[str, str]:
    """calibrate.sbatch.tmpl's placeholders -> text, config strings shell-quoted (as job_values). `base`: a
    --network-only calibration's cluster.profile (launcher/runtime/calibrate.py network_base)."""
    c = cfg.cluster
    gpu_job = str(c.gpu).lower() != "cpu"
    nodes, gpn = int(c.nodes), int(c.gpus_per_node)
    return {
        **_site_values(c, gpu_job, gpn),
        "header": (f"calibration {job_dir.name}: {nodes} nodes x {gpn} {'GPUs' if gpu_job else 'CPU ranks'} "
                   f"({c.gpu}) -> {out}"),
        "job_name": _q(c.job_name if c.job_name is not None else job_dir.name),
        "nodes": str(nodes),
        "time": _q(calibrate_time(cfg)),
        "workdir": _q(workdir),
        "log_path": _q(_output_pattern(job_dir)),
        "job_dir": _q(job_dir),
        "out": _q(out),
        "python": _q(python),
        "device": "cuda" if gpu_job else "cpu",
        "grad_clip": _q(float(cfg.optimizer.grad_clip)),
        "scope": "network" if base else "all",
        "fit_base": f" {_q(Path(base).expanduser().resolve())}" if base else "",
        "node_check": _node_check(base, "cuda" if gpu_job else "cpu"),
    }


def _node_check(base: Optional[str], device: str) -> str:
    """A --network-only job's first step: every node checks that it is `base`'s node type (accelerator and CPU
    model, launcher/runtime/calibrate.py refuse_other_node_type) before any rank measures, so that a mismatch ends
    the job in seconds, not after minutes of measuring. Nothing for a whole calibration. Without --kill-on-bad-exit:
    every node says what it found, and srun's exit is the check's 2, not the 143 of a node killed mid-check."""
    if not base:
        return ""
    return ("# ---- --network-only: each node must be cluster.profile's node type, checked before anything is measured --\n"
            "srun --ntasks-per-node=1 \"$PYTHON\" -m launcher.runtime.calibrate --node-type "
            f"{_q(Path(base).expanduser().resolve())} {device}\n")


_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def render_script(values: dict[str, str], template: Optional[Path] = None) -> str:
    """Fill `{{name}}` placeholders; a name the template uses but `values` lacks (or the reverse) is a bug here.

    Not string.Template: its `$name` would collide with the script's own shell variables.
    """
    text = (template or TEMPLATE).read_text()
    used = set(_PLACEHOLDER.findall(text))
    if used != set(values):
        raise RuntimeError(f"template {template or TEMPLATE} and launcher/slurm.py disagree: "
                           f"unfilled {sorted(used - set(values))}, unused {sorted(set(values) - used)}")
    return _PLACEHOLDER.sub(lambda m: values[m[1]], text)


def require_sbatch() -> None:
    if shutil.which("sbatch") is None:
        raise ConfigError("(submit)", "sbatch", "sbatch is not on PATH: this machine is not a SLURM login node",
                          "run launcher submit where sbatch works, or add --dry-run to see the script")


def sbatch(script: Path, test_only: bool = False, env: Optional[dict] = None) -> str:
    """Submit `script`; returns the job id (`--parsable` prints `id[;cluster]`).

    The environment of this process goes with the job (sbatch's default --export=ALL): that is how
    secrets such as WANDB_API_KEY reach the ranks without being written into the script or the job dir.
    """
    cmd = ["sbatch", "--parsable", *(["--test-only"] if test_only else []), str(script)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    except FileNotFoundError as exc:
        raise ConfigError("(submit)", "sbatch", "sbatch is not on PATH: this machine is not a SLURM login node",
                          "run launcher submit where sbatch works, or use --dry-run to see the script") from exc
    if out.returncode != 0:
        raise ConfigError("(submit)", str(script), f"sbatch refused the job: {out.stderr.strip() or out.stdout.strip()}",
                          "fix the cluster.* setting sbatch names (cluster.partition, cluster.account, cluster.time, ...)")
    if test_only:  # sbatch --test-only answers on stderr and submits nothing
        return out.stderr.strip()
    return out.stdout.strip().split(";")[0]
