"""Entry points only: parse the command line, compose, resolve, and hand off.

    launcher show  [overrides]            resolved config, layout, DeepSpeed JSON
    launcher plan  [overrides] [--json]   the layout table (or one JSON object)
    launcher plan  [overrides] --search   the best layouts for the model and cluster, ranked
    launcher plan  [overrides] --rank-map [--rank-map-png PATH]   node/GPU -> rank -> (tp, pp, dp)
    launcher plan -m [sweep overrides]          one plan per point of a Hydra sweep (compare layouts)
    launcher train [overrides]            train: freeze the config into a run dir, start the local ranks
    launcher train --config PATH [overrides]   run a frozen config (inside srun + torchrun: the loop itself)
    launcher train [overrides] --dry-run [--json]  what every rank would build and hold (meta device, no ranks)
    launcher submit [overrides] [--dry-run]     validate, write the job dir, sbatch (or print the script)
    launcher submit -m [sweep overrides]        one job per point of a Hydra sweep (a=1,2 b=x,y: 4 jobs)
    launcher export CKPT OUT              a checkpoint -> a transformers directory
    launcher calibrate [overrides] --out PATH   measure this machine (cluster.gpus_per_node ranks) -> a profile YAML
    launcher calibrate --check cluster.profile=PATH [overrides]   does that profile still plan this config? (~7 s)
    launcher submit --calibrate [overrides] --out PATH   the same as a SLURM job on cluster.nodes nodes (several:
                                          the inter-node link measured too)
    launcher submit --calibrate --network-only cluster.profile=NODE.yaml cluster.nodes=N --out PATH
                                          only what N nodes change (links, stragglers, ZeRO-3's hooks); the
                                          compute figures are NODE.yaml's
    launcher plan|show|train|submit [overrides] --cfg job|hydra|all [-p KEY] | --info   Hydra's flags: the
                                          composed YAML / the search path, chosen options and groups; nothing else runs

Bad input exits with status 2 and a message naming the key, the value, the
rule and a fix; the Python traceback only with --debug (or LAUNCHER_DEBUG=1).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Optional, Sequence

from launcher.config.errors import ConfigError
# The submit flow and the checks before a start live next to slurm.py (launcher/submit.py).
from launcher.submit import sweep_points, validate_before_start, verified_resume

EXIT_CONFIG_ERROR = 2


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _resolve(overrides: Sequence[str]):
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout

    cfg = compose(overrides)
    return cfg, resolve_layout(cfg)


def cmd_show(args) -> int:
    from launcher.config.compose import to_yaml
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.plan.report import plan_summary, render_plan

    from launcher.config.secrets import refuse_secrets_in_config

    cfg, layout = _resolve(args.overrides)
    refuse_secrets_in_config(cfg)
    con = _console()
    con.rule("resolved config")
    con.print(to_yaml(cfg), markup=False)
    con.rule("layout")
    render_plan(plan_summary(cfg, layout), con)
    con.rule("DeepSpeed config")
    con.print(json.dumps(build_deepspeed_config(cfg, layout), indent=2), markup=False)
    return 0


def cmd_plan(args) -> int:
    if args.multirun:
        return _plan_sweep(args)
    return _plan_one(args)


def _plan_sweep(args) -> int:
    """`plan -m a=1,2 b=x,y`: one plan per point of the Hydra sweep, in Hydra's order, to compare layouts.

    A point that is not a valid layout prints its config error and the sweep goes on (exit 2 at the end):
    which points are invalid, and why, is part of the comparison. --json prints one list.
    """
    from launcher.plan.report import plan_summary

    if args.json and (args.search or args.rank_map or args.rank_map_png):
        raise ConfigError("(command line)", "-m --json", "a JSON sweep prints the plan of each point only",
                          "drop --search/--rank-map, or drop --json to see them point by point")
    points = sweep_points(args.overrides)
    failed, results = 0, []
    for i, point in enumerate(points):
        if not args.json:
            _console().rule(f"sweep point {i + 1}/{len(points)}: {' '.join(point)}", characters="=")
        try:
            if args.json:
                cfg, layout = _resolve(point)
                results.append({"overrides": point, "plan": plan_summary(cfg, layout)})
            else:
                _plan_one(argparse.Namespace(**{**vars(args), "overrides": point}))
        except ConfigError as err:
            failed += 1
            _print_config_error(err)
            if args.json:
                results.append({"overrides": point, "error": str(err)})
    if args.json:
        print(json.dumps(results, indent=2))
    return EXIT_CONFIG_ERROR if failed else 0


def _plan_one(args) -> int:
    from launcher.plan.report import plan_summary, render_plan

    if args.search:
        from launcher.config.compose import compose

        # The search replaces the configured TP/PP/ZeRO/micro-batch with every valid choice, keeping the global
        # batch (and so the tokens per step): the starting layout need not be valid itself.
        return _plan_search(compose(args.overrides), args)
    cfg, layout = _resolve(args.overrides)
    if args.rank_map or args.rank_map_png:
        return _rank_map(layout, args)
    summary = plan_summary(cfg, layout)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        render_plan(summary, _console())
    return 0


def _plan_search(cfg, args) -> int:
    from launcher.plan.report import render_search, search_track_records
    from launcher.plan.search import fp32_accumulation, held_batch, network_ends, search_layouts, search_rows

    ranked, counts = search_layouts(cfg)
    rows = search_rows(ranked, args.top)
    fp32_accumulation(cfg, ranked, rows)
    ends = network_ends(cfg, ranked, rows)
    record = search_track_records(cfg, rows)
    held = held_batch(cfg, args.overrides)
    if args.json:
        print(json.dumps({"counts": counts, "held": held, "layouts": rows, "step_time_track_record_note": record,
                          "network_ends": ends}, indent=2))
    else:
        render_search(rows, counts, _console(), held, record, ends)
    return 0


def _rank_map(layout, args) -> int:
    from launcher.plan.rankmap import format_rank_map, write_rank_map_png

    if args.rank_map:
        print(format_rank_map(layout))
    if args.rank_map_png:
        print(f"rank map written to {write_rank_map_png(layout, args.rank_map_png)}", file=sys.stderr)
    return 0


def _frozen_with_overrides(path: str, overrides: Sequence[str]):
    """A frozen config file plus key=value overrides (e.g. resume=auto), typed against the schema."""
    from launcher.config.compose import load_frozen

    return load_frozen(path, overrides)


def cmd_train(args) -> int:
    from launcher.runtime.distributed import in_distributed_launch

    if args.config:
        cfg = _frozen_with_overrides(args.config, args.overrides)
    else:
        from launcher.config.compose import compose

        cfg = compose(args.overrides)
    if args.dry_run:
        return dry_run_training(cfg, as_json=args.json)
    if in_distributed_launch():
        return run_rank(cfg)
    return launch_training(cfg)


def dry_run_training(cfg, as_json: bool) -> int:
    """Validate as `launcher train` does, then build every rank's part on the meta device and print the ledger."""
    from launcher.runtime.dryrun import format_ledger, rank_ledger

    layout = validate_before_start(cfg)
    # DeepSpeed's logger prints to the stdout it finds at import time: keep stdout for the ledger alone.
    with contextlib.redirect_stdout(sys.stderr):
        records = rank_ledger(cfg, layout)
    if as_json:
        print(json.dumps({"ranks": records}, indent=1))
        return 0
    con = _console()
    for warning in layout.warnings:
        con.print(f"warning: {warning}", markup=False)
    con.print(format_ledger(records), markup=False, highlight=False, soft_wrap=True)
    return 0


def run_rank(cfg) -> int:
    """One rank: the loop, with its registration and exit record for the `launcher train` parent (RankWatch).

    Does not return when the loop returns: the process exits with its status (see the end).
    """
    from launcher.runtime.distributed import leave_rank
    from launcher.runtime.launch import die_with_parent, record_crash_stacks, record_rank_exit, register_rank
    from launcher.train import run

    die_with_parent()  # torchrun gone (killed) -> this rank goes too, instead of training on as an orphan
    record = register_rank()
    record_crash_stacks(record)
    lock = None
    try:
        lock = maybe_own_run_dir_as_rank(cfg)
        rc = run(cfg)
    except BaseException as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        record_rank_exit(record, EXIT_CONFIG_ERROR if isinstance(exc, ConfigError) else 1, f"{type(exc).__name__}: {first}")
        if lock is not None:
            lock.release()
        raise
    record_rank_exit(record, rc)
    if lock is not None:
        lock.release()
    # Everything is on disk by here (checkpoint, metrics closed, W&B finished, exit recorded).
    leave_rank(rc)


def maybe_own_run_dir_as_rank(cfg):
    """Under srun + torchrun (no `launcher train` parent holding the run dir), global rank 0 owns it while it runs:
    a second job or `launcher train` into the same run dir is refused. A requeued attempt of the same job takes
    its own lock over (launcher/runtime/runlock.py). Returns the lock, or None where the parent holds it."""
    from launcher.runtime.rundir import run_dir_of
    from launcher.runtime.runlock import LOCK_TOKEN_ENV, acquire

    if os.environ.get("RANK") != "0" or os.environ.get(LOCK_TOKEN_ENV):
        return None
    return acquire(run_dir_of(cfg), "train").start_heartbeat()


def launch_training(cfg) -> int:
    """Validate everything, own the run dir, prepare the data, freeze the config into the run dir, start the local ranks."""
    from launcher.runtime.data import prepare_data
    from launcher.runtime.rundir import choose_run_dir
    from launcher.runtime.preflight import refuse_missing_local_gpus
    from launcher.runtime.runlock import acquire, claim_new_dir, refuse_if_owned

    layout = validate_before_start(cfg)
    if cfg.cluster.nodes > 1:
        raise ConfigError("cluster.nodes", cfg.cluster.nodes, "`launcher train` starts ranks on this machine only",
                          "submit multi-node runs with `launcher submit` (SLURM), or set cluster.nodes=1")
    refuse_missing_local_gpus(cfg, layout)
    con = _console()
    from rich.markup import escape

    for warning in layout.warnings:
        con.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    run_dir = choose_run_dir(cfg)
    refuse_if_owned(run_dir)  # cheap and read-only: an owned run dir is refused before the data is prepared
    # Read-only checks first, so a refused start leaves no run directory: the checkpoint to resume (verified;
    # the ranks are told which, so they neither choose nor hash again), then the data. acquire() below still
    # refuses a run that took the directory meanwhile.
    resume_from, saved = verified_resume(cfg, run_dir, layout, warn=lambda m: con.print(f"[yellow]{escape(m)}[/yellow]"))
    prepared = prepare_data(cfg, layout, progress=True, console=con)
    if saved is not None:
        from launcher.runtime.checkpoint import check_resume_compatible

        check_resume_compatible(saved, cfg, layout, resume_from, prepared)  # the tokens and the tokenizer too
    claimed = cfg.run_name is None and not run_dir.exists()
    if claimed:  # a new timestamped name: another start in the same second gets -2, -3, ...
        run_dir = claim_new_dir(run_dir)
    lock = acquire(run_dir, "train").start_heartbeat()  # refused (exit 2) while another run owns the directory
    try:
        return _train_in_run_dir(cfg, layout, run_dir, lock, con, prepared, resume_from)
    finally:
        lock.release()
        if claimed and not any(run_dir.iterdir()):
            run_dir.rmdir()  # refused before anything was written: leave no empty run directory behind


def _train_in_run_dir(cfg, layout, run_dir, lock, con, prepared, resume_from) -> int:
    """Write the run's files into the owned run dir and start the local ranks."""
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime import checkpoint as ckpt
    from launcher.runtime.durable import write_atomic
    from launcher.runtime.launch import start_local_ranks
    from launcher.runtime.rundir import freeze_config

    con.print(f"data: streamed ({prepared.source}), tokenized in every rank, windows of {prepared.seq_length}"
              if prepared.format == "stream" else
              f"data: {prepared.num_tokens:,} tokens ({prepared.source}), {prepared.train_samples:,} train / "
              f"{prepared.val_samples:,} val samples of {prepared.seq_length}", markup=False)
    config_path = freeze_config(cfg, run_dir, build_deepspeed_config(cfg, layout))
    write_atomic(run_dir / "data.json", json.dumps(prepared.as_dict(), indent=2))
    con.print(f"run dir {run_dir}; starting {layout.gpus_per_node} local ranks"
              + (f", resuming from {resume_from}" if resume_from else ""), markup=False)
    if resume_from is None:
        return start_local_ranks(config_path, layout.gpus_per_node, run_dir, lock_token=lock.token,
                                 cpu=layout.device == "cpu")
    return start_local_ranks(config_path, layout.gpus_per_node, run_dir, overrides=[f"resume={resume_from}"],
                             extra_env={ckpt.VERIFIED_ENV: str(resume_from)}, lock_token=lock.token,
                             cpu=layout.device == "cpu")


def cmd_submit(args) -> int:
    from launcher.config.compose import compose

    from launcher.submit import claim_unnamed_run_dirs, plan_job, submit_job

    con = _console(stderr=args.dry_run)  # --dry-run: only the script on stdout
    if args.calibrate or args.out:
        from launcher.submit import submit_calibration

        if not (args.calibrate and args.out) or args.multirun:
            raise ConfigError("(command line)", "--calibrate" if args.calibrate else f"--out {args.out}",
                              "a calibration job takes --calibrate with --out PATH (the profile to write), without -m",
                              "launcher submit --calibrate cluster=... --out profiles/<partition>.yaml")
        return submit_calibration(compose(args.overrides), args.out, args.dry_run, con, args.network_only)
    if args.network_only:
        raise ConfigError("(command line)", "--network-only", "only a calibration job measures the network alone",
                          "launcher submit --calibrate --network-only cluster.profile=PATH cluster.nodes=N --out NEW")
    points = sweep_points(args.overrides) if args.multirun else [list(args.overrides)]
    # Compose and validate every point before submitting any: a sweep with one bad point submits nothing.
    jobs, taken = [], set()
    for i, point in enumerate(points):
        if args.multirun:
            con.print(f"sweep point {i + 1}/{len(points)}: {' '.join(point)}", markup=False)
        jobs.append(plan_job(compose(point), taken))  # validates; writes nothing
    if not args.dry_run:
        from launcher.slurm import require_sbatch

        # The user's own mistakes (layout, config) first, the machine's after; still before anything is written.
        require_sbatch()
        jobs = claim_unnamed_run_dirs(jobs)
    from rich.markup import escape

    for job in jobs:
        for warning in job.layout.warnings:
            con.print(f"[yellow]warning:[/yellow] {escape(warning)}")
        if args.dry_run:
            print(job.script, end="")
        else:
            submit_job(job, con)
    return 0


def print_cfg_or_info(args) -> int:
    """Hydra's `--cfg job` and `--info` (launcher/config/info.py): print, exit, start nothing."""
    from launcher.config.compose import compose
    from launcher.config.info import cfg_yaml, config_info
    from launcher.config.secrets import refuse_secrets_in_config

    if args.info:
        if getattr(args, "multirun", False):
            raise ConfigError("(command line)", "-m --info", "the search path and groups do not depend on the sweep",
                              "drop -m; `--cfg job -m ...` prints the config of every sweep point")
        sys.stdout.write(config_info(args.overrides))
        return 0
    if args.cfg != "job" and getattr(args, "config", None):
        raise ConfigError("--cfg", args.cfg, f"--config {args.config} is a frozen config: no Hydra composition made it",
                          "use --cfg job to print it (with the overrides applied)")
    points = sweep_points(args.overrides) if getattr(args, "multirun", False) else [list(args.overrides)]
    for point in points:
        cfg = _frozen_with_overrides(args.config, point) if getattr(args, "config", None) else compose(point)
        refuse_secrets_in_config(cfg)
        if len(points) > 1:
            sys.stdout.write(f"# sweep point: {' '.join(point)}\n")
        sys.stdout.write(cfg_yaml(args.cfg, cfg, point, args.package))
        if len(points) > 1 and point is not points[-1]:
            sys.stdout.write("---\n")  # one YAML document per point
    return 0


def cmd_export(args) -> int:
    from launcher.export import export_checkpoint, parse_shard_size

    max_bytes = parse_shard_size(args.max_shard_size)   # refused before the checkpoint is read
    out = export_checkpoint(args.checkpoint, args.out, max_shard_bytes=max_bytes)
    _console().print(f"wrote {out}", markup=False)
    return 0


def cmd_calibrate(args) -> int:
    from launcher.config.compose import compose
    from launcher.runtime.calibrate import calibrate, check, format_check

    cfg = compose(args.overrides)
    if args.check:
        if args.network_only:
            raise ConfigError("(command line)", "--network-only", "--check times compute against cluster.profile; "
                              "--network-only writes a new profile", "drop one of them")
        if args.out:
            raise ConfigError("(command line)", f"--out {args.out}", "--check measures this machine against "
                              "cluster.profile and writes nothing", "drop --out, or drop --check to write a new profile")
        if not cfg.cluster.profile:
            raise ConfigError("cluster.profile", None, "--check compares this machine with a profile, and none is given",
                              "add cluster.profile=PATH (a file `launcher calibrate --out PATH` wrote)")
        result = check(cfg)
        _console().print(format_check(result), markup=False)
        return 1 if result["moved"] else 0
    if not args.out:
        raise ConfigError("(command line)", None, "launcher calibrate writes a profile and needs --out PATH for it",
                          "add --out profiles/<machine>.yaml (or --check cluster.profile=PATH to test an existing one)")
    path = calibrate(cfg, args.out, network_only=args.network_only)
    _console().print(f"wrote {path} (use it: cluster.profile={path})", markup=False)
    return 0


NETWORK_ONLY_HELP = ("measure only what the ranks' count and placement change (the links, stragglers, release, "
                     "ZeRO-3's hooks) and keep cluster.profile=PATH's compute, engine and framework figures "
                     "(a calibration of one node of the same type, at the same ranks a node)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launcher", description="Validated LLM pretraining layouts on DeepSpeed + SLURM.")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("overrides", nargs="*", help="Hydra overrides: recipe=NAME, model=NAME, key=value ...")
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        # Hydra's own flags, same names and meanings (launcher/config/info.py).
        p.add_argument("-c", "--cfg", choices=["job", "hydra", "all"],
                       help="print the composed config (job), Hydra's config of the composition (hydra) or both (all) "
                            "as YAML and exit (Hydra's --cfg)")
        p.add_argument("-p", "--package", metavar="KEY", help="with --cfg: print only this key (e.g. parallel)")
        p.add_argument("-i", "--info", action="store_true",
                       help="print the config search path ($LAUNCHER_CONF_PATH included), the chosen options and every group's options")
        p.set_defaults(func=func)
        return p

    add("show", cmd_show, "print the resolved config, the derived layout and the DeepSpeed JSON")
    plan = add("plan", cmd_plan, "print the layout: world, TP/PP/DP, batch arithmetic, parameters, bubble")
    plan.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    plan.add_argument("--search", action="store_true",
                      help="enumerate every valid TP/PP/DP/ZeRO/micro-batch/recompute layout, keep what fits, rank by throughput")
    plan.add_argument("--top", type=int, default=10, help="--search: how many layouts to print (default 10)")
    plan.add_argument("--rank-map", action="store_true", help="print node/GPU -> global rank -> (tp, pp, dp), one line per rank")
    plan.add_argument("--rank-map-png", metavar="PATH", help="draw the rank map as an image (PNG)")
    plan.add_argument("-m", "--multirun", action="store_true", help="Hydra sweep: one plan per point (a=1,2 b=x,y -> 4 plans)")
    train = add("train", cmd_train, "train: validate, freeze the config into the run dir, start the local ranks (or, under torchrun, run the loop)")
    train.add_argument("--config", default=None, help="a frozen config.yaml (run or job dir) instead of composing conf/")
    train.add_argument("--dry-run", action="store_true",
                       help="validate, build every rank's part on the meta device, print the per-rank ledger; start nothing")
    train.add_argument("--json", action="store_true", help="--dry-run: print the ledger as one JSON object {\"ranks\": [...]}")
    submit = add("submit", cmd_submit, "validate, write the job dir (frozen config, DeepSpeed JSON, sbatch script) and sbatch it")
    submit.add_argument("--dry-run", action="store_true", help="print the sbatch script; write and submit nothing")
    submit.add_argument("-m", "--multirun", action="store_true", help="Hydra sweep: one job per point (a=1,2 b=x,y -> 4 jobs)")
    submit.add_argument("--calibrate", action="store_true",
                        help="submit `launcher calibrate` on cluster.nodes x cluster.gpus_per_node instead of training "
                             "(with --out PATH: the profile the job writes; several nodes also measure the inter-node link)")
    submit.add_argument("--out", default=None, help="--calibrate: where the job writes the profile YAML")
    submit.add_argument("--network-only", action="store_true", help=NETWORK_ONLY_HELP)
    cal = add("calibrate", cmd_calibrate, "measure this machine (GEMM, attention, memory, collectives on "
              "cluster.gpus_per_node local ranks) and write a hardware profile for cluster.profile=PATH")
    cal.add_argument("--out", default=None, help="where to write the profile YAML")
    cal.add_argument("--network-only", action="store_true", help=NETWORK_ONLY_HELP)
    cal.add_argument("--check", action="store_true",
                     help="measure GEMM and copy rates now (~7 s) against cluster.profile=PATH and plan this config "
                          "at them; exit 1 when that plan moves more than 10%% (calibrate again), 0 when within")
    export = sub.add_parser("export", help="write a transformers directory from a checkpoint",
                            description="write a transformers directory (safetensors, config, tokenizer) from a checkpoint of any ZeRO stage")
    export.add_argument("checkpoint", help="<run_dir>/checkpoints/latest, a checkpoints dir or a step_* dir")
    export.add_argument("out", help="output directory")
    export.add_argument("--max-shard-size", default="5GB", metavar="SIZE",
                        help="largest safetensors shard, in transformers' units: 5GB (default), 500MB, 2GiB")
    export.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    export.set_defaults(func=cmd_export)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    # Flags may sit between overrides (`plan recipe=x --json y=1`): argparse stops the positional list at a
    # flag, so the overrides after it come back as extras.
    args, extra = parser.parse_known_args(argv)
    unknown = [e for e in extra if e.startswith("-") or not hasattr(args, "overrides")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if hasattr(args, "overrides"):
        args.overrides = list(args.overrides) + extra
    if getattr(args, "package", None) and not args.cfg:
        parser.error("--package/-p goes with --cfg job|hydra|all")
    debug = args.debug or os.environ.get("LAUNCHER_DEBUG") == "1"
    try:
        if getattr(args, "cfg", None) or getattr(args, "info", False):
            return print_cfg_or_info(args)
        return args.func(args)
    except BrokenPipeError:
        # `launcher plan --rank-map | head`: the reader left; that is not an error.
        sys.stdout = open(os.devnull, "w")
        return 0
    except ConfigError as err:
        if debug:
            raise
        _print_config_error(err)
        return EXIT_CONFIG_ERROR


def _print_config_error(err: ConfigError) -> None:
    from rich.markup import escape

    # The message holds user values (e.g. '[a, b]'): escape them so rich does not read them as markup.
    _console(stderr=True).print(f"[bold red]config error:[/bold red] {escape(str(err))}", highlight=False)


if __name__ == "__main__":
    sys.exit(main())
