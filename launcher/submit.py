"""The submit flow, next to slurm.py (which renders and queues one script): validate every job of a submission,
claim the run directories, write each job dir and sbatch it (`launcher submit`, launcher/cli.py cmd_submit).

validate_before_start and verified_resume are the checks `launcher train` shares with it, before any rank
starts or any job is queued; sweep_points expands a Hydra sweep (-m) for plan, submit and --cfg.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from launcher.config.errors import ConfigError


def validate_before_start(cfg):
    """The checks `launcher train` and `launcher submit` share, before any rank starts or any job is queued.

    The layout rules (resolve_layout), what the loop does not run yet, credentials in config values, and
    model states that cannot fit the GPU; returns the Layout with the planner's memory warning, if any,
    added to its warnings.
    """
    from launcher.config.layout import resolve_layout
    from launcher.plan.report import check_memory
    from launcher.config.secrets import refuse_secrets_in_config
    from launcher.config.supported import check_supported

    layout = resolve_layout(cfg)
    check_supported(cfg, layout)
    refuse_secrets_in_config(cfg)  # config.yaml, checkpoints, job scripts and logs all carry config values
    from launcher.runtime.inputs import check_writable_dir
    from launcher.runtime.metrics import refuse_unusable_trackers

    # Online W&B without credentials, MLflow not installed or its store unusable: rank 0 would die after every
    # rank started (under `submit`, after the job waited in the queue).
    refuse_unusable_trackers(cfg)

    check_writable_dir("runs_dir", cfg.runs_dir)  # the cache dir is checked by prepare_data, which uses it
    memory_warning = check_memory(cfg, layout)  # refuses model states that cannot fit; warns on activations
    return replace(layout, warnings=(*layout.warnings, memory_warning)) if memory_warning else layout


def verified_resume(cfg, run_dir, layout, warn):
    """(checkpoint to resume from or None, its launcher_state or None), verified against its manifest
    (resume=auto falls back to the newest intact one) and checked against this config's model and layout."""
    from launcher.runtime import checkpoint as ckpt

    resume_from = ckpt.checkpoint_to_resume(cfg, run_dir, warn=warn)
    if resume_from is None:
        return None, None
    saved = ckpt.load_state(resume_from)
    ckpt.check_resume_compatible(saved, cfg, layout, resume_from)
    return resume_from, saved


def sweep_points(overrides: Sequence[str]) -> list[list[str]]:
    """Hydra multirun: `a=1,2 b=x,y` -> the 4 override lists, in Hydra's order.

    Hydra's own override grammar and BasicSweeper expansion (what `python app.py -m` runs), so quoting,
    ranges and choice() mean here what they mean in Hydra. BasicSweeper is in hydra._internal; its
    split_arguments is a static method with no launcher state (hydra-core 1.3, pinned in pyproject.toml).
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from launcher.config.compose import _translate

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        (points,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    except Exception as exc:
        raise _translate(exc) from exc
    return points


@dataclass
class PlannedJob:
    cfg: object
    layout: object
    paths: object
    script: str
    new_dir: bool = False  # an unnamed run's new directory: made exclusively when submitted (claim_unnamed_run_dirs)


def plan_job(cfg, taken: set) -> PlannedJob:
    """Validate one job (layout, SLURM settings, resume) and render its script; writes nothing.

    The job dir is the run dir (<runs_dir>/<run_name>): the frozen config.yaml and deepspeed.json, the
    rendered job.sbatch, the slurm-<jobid>.out log, then the checkpoints and metrics of the run. The job
    runs `launcher train --config <run dir>/config.yaml resume=auto`, so a requeued job continues there.
    """
    from launcher.protocol import CONFIG_FILE
    from launcher.runtime.rundir import choose_run_dir
    from launcher.slurm import JobPaths, check_cluster, job_values, render_script

    layout = validate_before_start(cfg)
    check_cluster(cfg, layout)
    run_dir = choose_run_dir(cfg)
    new_dir = cfg.run_name is None and not (run_dir / CONFIG_FILE).exists()
    if new_dir:
        # A timestamped name has one-second resolution: sweep points submitted together get -2, -3, ...
        base, n = run_dir, 1
        while run_dir in taken or run_dir.exists():
            n += 1
            run_dir = base.with_name(f"{base.name}-{n}")
    if run_dir in taken:
        raise ConfigError("run_name", run_dir.name, "two jobs of this submission would share one run directory",
                          "leave run_name null in a sweep (each point gets its own directory), or sweep run_name too")
    taken.add(run_dir)
    from launcher.runtime.runlock import refuse_if_owned

    refuse_if_owned(run_dir)  # a queued or running job (or `launcher train`) owns it: refused before any job is queued
    # The job's rank 0 verifies again when it starts (the files may change while the job queues).
    verified_resume(cfg, run_dir, layout, warn=lambda m: print(m, file=sys.stderr, flush=True))
    paths = JobPaths(run_dir=run_dir, workdir=Path.cwd().resolve(), python=sys.executable)
    return PlannedJob(cfg, layout, paths, render_script(job_values(cfg, layout, paths)), new_dir=new_dir)


def claim_unnamed_run_dirs(jobs: list) -> list:
    """Make each unnamed job's new directory exclusively (another start may have taken the planned name since:
    then it gets the next free -2, -3, ... and its script is rendered again for it); the jobs are not validated
    again (plan_job did, and a new directory holds nothing to verify). On any failure the directories made here go."""
    from launcher.runtime.runlock import claim_new_dir
    from launcher.slurm import job_values, render_script

    claimed: list = []
    out = []
    try:
        for job in jobs:
            if job.new_dir:
                run_dir = claim_new_dir(job.paths.run_dir)
                claimed.append(run_dir)
                if run_dir != job.paths.run_dir:
                    paths = replace(job.paths, run_dir=run_dir)
                    job = replace(job, paths=paths, script=render_script(job_values(job.cfg, job.layout, paths)))
            out.append(job)
        return out
    except BaseException:
        for d in claimed:
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise


def submit_job(job: PlannedJob, con) -> str:
    """Prepare the data here on the login node (bad data fails before the queue), write the job dir, sbatch."""
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime.data import prepare_data
    from launcher.runtime.rundir import freeze_config
    from launcher.slurm import sbatch

    from launcher.runtime.durable import write_atomic
    from launcher.runtime.runlock import acquire

    # The run dir is the job's from here on: a second submit or `launcher train` into it is refused while the
    # job is queued or runs; the job's rank 0 takes the lock over (same SLURM job id).
    lock = acquire(job.paths.run_dir, "submit")
    try:
        prepared = prepare_data(job.cfg, job.layout, progress=False, console=con)
        freeze_config(job.cfg, job.paths.run_dir, build_deepspeed_config(job.cfg, job.layout))
        write_atomic(job.paths.run_dir / "data.json", json.dumps(prepared.as_dict(), indent=2))
        write_atomic(job.paths.script, job.script)
        job.paths.script.chmod(0o755)
        job_id = sbatch(job.paths.script)
    except BaseException:
        lock.release()
        raise
    lock.update(job_id=str(job_id))
    lock.keep()
    con.print(f"submitted job {job_id}: {job.layout.nodes} nodes x {job.layout.gpus_per_node} ranks, "
              f"run dir {job.paths.run_dir}, log {job.paths.log_for(job_id)}", markup=False)
    return job_id


def submit_calibration(cfg, out: str, dry_run: bool, con, network_only: bool = False) -> int:
    """`launcher submit --calibrate --out PATH`: one `launcher calibrate` across cluster.nodes x cluster.gpus_per_node
    ranks as a SLURM job (launcher/templates/calibrate.sbatch.tmpl), which writes the profile to PATH when it ends.

    On one node it measures what `launcher calibrate` does there; on several it also measures the inter-node link
    (launcher/runtime/calibrate.py _after_compute). The job's files (job.sbatch, slurm-<id>.out, the ranks' raw
    measurements) go to a new <runs_dir>/calibrate-<time> directory, made exclusively: no run's directory is used.
    --dry-run prints the script and writes nothing. `network_only`: measure only what the nodes change, keeping
    cluster.profile's per-rank figures (launcher/runtime/calibrate.py network_base)."""
    import time

    from launcher.config.secrets import refuse_secrets_in_config
    from launcher.runtime.durable import write_atomic
    from launcher.runtime.inputs import check_writable_dir
    from launcher.runtime.rundir import check_runs_dir
    from launcher.runtime.runlock import claim_new_dir
    from launcher.slurm import (CALIBRATE_TEMPLATE, SCRIPT_FILE, calibrate_job_values, check_calibrate_cluster,
                                render_script, require_sbatch, sbatch)

    from launcher.runtime.calibrate import network_base

    check_calibrate_cluster(cfg)
    base_profile = network_base(cfg, network_only)
    refuse_secrets_in_config(cfg)   # cluster.setup and the other values are written into the script
    profile = (Path.cwd() / Path(out).expanduser()).resolve()
    if profile.is_dir():
        raise ConfigError("--out", out, f"{profile} is a directory; the profile is one YAML file",
                          "give a file path, e.g. --out profiles/<partition>.yaml")
    check_writable_dir("--out", str(profile.parent))
    check_runs_dir(cfg.runs_dir)
    check_writable_dir("runs_dir", cfg.runs_dir)
    base = Path(cfg.runs_dir).expanduser().resolve() / f"calibrate-{time.strftime('%Y%m%d-%H%M%S')}"

    def script_for(job_dir: Path) -> str:
        return render_script(calibrate_job_values(cfg, job_dir, profile, Path.cwd().resolve(), sys.executable,
                                                  base_profile), CALIBRATE_TEMPLATE)
    if dry_run:
        print(script_for(base), end="")
        return 0
    require_sbatch()
    job_dir = claim_new_dir(base)
    script = job_dir / SCRIPT_FILE
    try:
        write_atomic(script, script_for(job_dir))
        script.chmod(0o755)
        job_id = sbatch(script)
    except BaseException:
        script.unlink(missing_ok=True)
        job_dir.rmdir()
        raise
    con.print(f"submitted job {job_id}: {'network-only ' if base_profile else ''}calibration on {cfg.cluster.nodes} nodes x {cfg.cluster.gpus_per_node} ranks, "
              f"job dir {job_dir}, log {job_dir / ('slurm-' + job_id + '.out')}; it writes {profile} "
              f"(then: cluster.profile={out})", markup=False)
    return 0
