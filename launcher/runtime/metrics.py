"""What a run records: per-step metrics (JSONL, TensorBoard, W&B, MLflow), throughput and MFU, memory, the loss plot.

Only rank 0 writes files and prints; every rank may measure. Throughput math:

    tokens/s (global)   = tokens_per_step / step_time
    tokens/s (per rank) = tokens/s (global) / world_size
    TFLOP/s (per rank)  = model_flops_per_token x tokens/s (per rank) / 1e12
    MFU                 = TFLOP/s (per rank) / peak TFLOP/s of one accelerator in the training dtype

with model_flops_per_token from launcher/plan/flops.py (PaLM appendix B) and the
peak from launcher/config/hardware.py (or cluster.peak_tflops). CPU ranks have
no catalogued peak, so MFU is n/a there.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
from pathlib import Path
from typing import Optional

from launcher.config import hardware
from launcher.runtime.durable import FAULT_ENV, write_atomic
from launcher.plan.flops import model_flops_per_token

METRICS_FILE = "metrics.jsonl"
LOSS_PLOT_FILE = "loss.png"
STATE_BYTES_FILE = "model_state_bytes.json"
SUMMARY_FILE = "summary.json"
LIBRARY_LOG_FILE = "deepspeed.log"  # DeepSpeed's own log lines, every rank's, instead of the console


def peak_tflops(cfg, layout) -> Optional[float]:
    """Dense peak TFLOP/s of one accelerator in the training dtype; None on CPU ranks (MFU n/a)."""
    if layout.device == "cpu":
        return None
    if cfg.cluster.peak_tflops is not None:
        return float(cfg.cluster.peak_tflops)
    spec = hardware.lookup(cfg.cluster.gpu)
    return spec.peak_tflops.get(layout.dtype) if spec else None


def planned(cfg, layout) -> dict:
    """The plan's predictions for this run: step time (launcher/plan/steptime.py, from the cluster's profile) and
    peak memory per rank (launcher/plan/memory.py). Empty for CPU ranks without cluster.profile (no rates)."""
    from launcher.plan.memory import estimate_memory

    inputs = _plan_inputs(cfg, layout)
    if inputs is None:
        return {}
    shape, st, hw = inputs
    return {"predicted_step_time_s": _step_s(shape, st, hw),
            "predicted_peak_memory_bytes": int(estimate_memory(shape, st, hw).peak.total),
            # what calibrate's GEMM probe (at the model's sharded width) and copy should read here (check_rates)
            "profile_rates": hw.profile.probe_rates(layout.dtype, shape.hidden_size / st.tensor_degree,
                                                    cfg.cluster.gpus_per_node),
            "profile": (f"cluster.profile={cfg.cluster.profile}" if getattr(cfg.cluster, "profile", None)
                        else f"the built-in {cfg.cluster.gpu} profile"),
            # the figures whose calibration sweeps disagreed (launcher/plan/profile.py noisy_sweeps)
            "profile_noisy": list(hw.profile.noisy)}


def _plan_inputs(cfg, layout):
    """(model shape, strategy, hardware) as `launcher plan` reads them; None for CPU ranks without a profile."""
    from launcher.plan.inputs import model_shape, resolve_hardware, strategy

    hw = resolve_hardware(cfg.cluster, layout.dtype)
    return None if hw is None else (model_shape(cfg.model), strategy(cfg, layout), hw)


def planned_step_s(cfg, layout, gemm: float = 1.0, memory: float = 1.0) -> Optional[float]:
    """The plan's step time for this run; with `gemm` / `memory` != 1, planned from the cluster's profile with its
    GEMM and attention rates times `gemm` and its memory bandwidth times `memory` (profile.scaled): the plan had the
    machine read those rates (check_rates). Attention moves with the GEMMs: calibrate's quick probes time no
    attention, and both are the same cores' (or tensor cores') arithmetic. None without a profile."""
    inputs = _plan_inputs(cfg, layout)
    return None if inputs is None else _step_s(*inputs, gemm=gemm, memory=memory)


def _step_s(shape, st, hw, gemm: float = 1.0, memory: float = 1.0) -> float:
    from dataclasses import replace

    from launcher.plan.profile import scaled
    from launcher.plan.steptime import estimate_step_time

    if (gemm, memory) != (1.0, 1.0):
        hw = replace(hw, profile=scaled(hw.profile, compute=gemm, memory=memory))
    return estimate_step_time(shape, st, hw).step_time_s


# Steps left out of the end-of-run comparison: the first ones pay one-time costs (allocator growth, lazy
# initialisation, DeepSpeed's first-step bookkeeping) the plan does not model.
WARMUP_STEPS = 2


class Throughput:
    """Turns a step time into tokens/s, TFLOP/s per rank and MFU (formulas in the module docstring), and sets it
    beside the plan's predicted step time and peak memory (`planned`)."""

    def __init__(self, cfg, layout):
        self.cfg, self.layout = cfg, layout
        self.tokens_per_step = layout.tokens_per_step
        self.world = layout.world_size
        self.flops_per_token = model_flops_per_token(cfg.model, layout.seq_length)
        self.peak = peak_tflops(cfg, layout)
        self.plan = planned(cfg, layout)
        self.step_times: list[float] = []

    def __call__(self, step_time_s: float) -> dict:
        self.step_times.append(step_time_s)
        tokens_s = self.tokens_per_step / step_time_s
        per_rank = tokens_s / self.world
        tflops = self.flops_per_token * per_rank / 1e12
        out = {"tokens_per_s": tokens_s, "tokens_per_s_per_rank": per_rank, "tflops_per_rank": tflops,
               "mfu": tflops / self.peak if self.peak else None}
        if self.plan:
            out |= {k: self.plan[k] for k in ("predicted_step_time_s", "predicted_peak_memory_bytes")}
            out["step_time_over_predicted"] = step_time_s / self.plan["predicted_step_time_s"]
        return out

    def median_step_s(self) -> tuple[Optional[float], int]:
        """(median step time after WARMUP_STEPS, steps it is over); (None, 0) before any step."""
        timed = self.step_times[WARMUP_STEPS:] or self.step_times
        return (statistics.median(timed) if timed else None), len(timed)

    def off_plan(self) -> bool:
        """The median step is more than PLAN_TOLERANCE from the plan's."""
        measured, pred = self.median_step_s()[0], self.plan.get("predicted_step_time_s")
        return bool(measured and pred and abs(measured / pred - 1) > PLAN_TOLERANCE)

    def versus_plan(self, peak_memory_bytes_per_rank: list[int]) -> dict:
        """The end-of-run summary's fields: the median measured step time (after WARMUP_STEPS) and the largest rank's
        peak memory beside the plan's predictions (null where the plan has none).

        The largest rank's, not rank 0's: the plan's peak is its largest stage's (launcher/plan/memory.py), and under a
        pipeline that is often not rank 0's. recipe=tiny PP2 on 2 CPU ranks (2026-12-03) peaked at 485 MiB on rank 0
        and 561 MiB on rank 1 against a planned 451 MiB: rank 0's figure read x1.08, the run's x1.24."""
        measured, timed = self.median_step_s()
        pred = self.plan.get("predicted_step_time_s")
        pmem = self.plan.get("predicted_peak_memory_bytes")
        peak = max(peak_memory_bytes_per_rank)
        return {"steps_timed": timed, "step_time_s": measured, "predicted_step_time_s": pred,
                "step_time_over_predicted": measured / pred if measured and pred else None,
                "peak_memory_bytes": peak, "peak_memory_rank": peak_memory_bytes_per_rank.index(peak),
                "peak_memory_bytes_per_rank": list(peak_memory_bytes_per_rank), "predicted_peak_memory_bytes": pmem,
                "peak_memory_over_predicted": peak / pmem if pmem else None,
                "profile": self.plan.get("profile"), "profile_noisy": self.plan.get("profile_noisy") or []}


# How far a measured step may be from the plan before the summary says what to check (issue 14 part 4's target).
PLAN_TOLERANCE = 0.15


# How far a rate read now may be from the profile's before the summary calls the machine changed: above the probe's own
# spread (three recipe=tiny runs in a row, 2 CPU ranks, 2026-12-02: the GEMM 0.754-0.772 of a profile's rate, the copy
# 0.727-0.798), below what moves a step past PLAN_TOLERANCE (minutes later, against bench/steptime/profile.yaml
# calibrated 3.5 hours before: steps 0.81 and 0.91 of the plan, the GEMM and copy 1.19 and 1.24 of its rates).
# `launcher calibrate --check` holds a config's plan at the rates it reads to the same 10%.
RATE_TOLERANCE = 0.10


def check_rates(throughput: Throughput, device: str, dtype: str, dev) -> Optional[dict]:
    """Every rank (a collective): where a rank's median step is more than PLAN_TOLERANCE from the plan, measure this
    machine's GEMM rate and copy bandwidth now with calibrate's own probes (calibrate.rates_now) and set them beside
    what the profile says they are (Profile.probe_rates); None on plan, without a plan, or on a GPU.

    Why: on a calibrated machine most misses have been the machine moving after its calibration, every layout alike
    (bench/steptime/results.md: the same layouts 0.74-0.97 and 0.88-1.08 of their plans in two passes 10 minutes
    apart); rates read now say whether this miss is that (recalibrate) or a term the model gets wrong. CPU ranks
    only: on a GPU the probe's operands (~0.6 GB at side 4,096) are not free beside a run that filled its memory."""
    import torch
    import torch.distributed as dist

    if not throughput.plan or device != "cpu":
        return None
    off = torch.tensor([1.0 if throughput.off_plan() else 0.0], device=dev)
    dist.all_reduce(off, op=dist.ReduceOp.MAX)     # one rank's miss is the run's: every rank probes, or none
    if not off.item():
        return None
    from launcher.runtime.calibrate import rates_now

    expected = throughput.plan["profile_rates"]
    now = rates_now(device, dtype, expected["gemm_side"], dev)
    gemm, memory = now["gemm_tflops"] / expected["gemm_tflops"], now["memory_gbps"] / expected["memory_gbps"]
    return {"gemm_side": now["gemm_side"], "dtype": dtype,
            "gemm_tflops": now["gemm_tflops"], "profile_gemm_tflops": expected["gemm_tflops"], "gemm_over_profile": gemm,
            "memory_gbps": now["memory_gbps"], "profile_memory_gbps": expected["memory_gbps"], "memory_over_profile": memory,
            # the plan again with the rates read now: how much of the miss the machine's move explains
            "replanned_step_time_s": planned_step_s(throughput.cfg, throughput.layout, gemm, memory)}


# Who else may use the cores during the timed steps before the summary says so beside a miss: a tenth of the
# machine is more than the step's own spread between repeats (bench/steptime/results.md) and less than the shortfall
# that puts a step past PLAN_TOLERANCE when the ranks fill the cores.
CPU_SHARE_TOLERANCE = 0.10


def cpu_snapshot() -> Optional[dict]:
    """This process's CPU seconds (every thread: torch's and gloo's) and the machine's, by kind, now (psutil; on Linux
    /proc/stat, where `steal` is the time the hypervisor ran something else on this VM's cores). None where psutil
    cannot read them."""
    import socket
    import time

    import psutil

    try:
        own, machine = psutil.Process().cpu_times(), psutil.cpu_times()
    except (psutil.Error, OSError):
        return None
    return {"host": socket.gethostname(), "wall_s": time.monotonic(), "process_s": own.user + own.system,
            "machine": machine._asdict()}


def host_cpu_share(snapshots: list[tuple[dict, dict]]) -> dict:
    """One host's CPU time over a window, from (start, end) snapshots of the ranks on it: the fractions of all its
    cores' time that went to the hypervisor (steal), to the run's ranks (their processes' CPU seconds), to other
    processes (the rest of the busy time) and idle. The machine's figures are its first rank's (every rank on a host
    reads the same counters)."""
    first_start, first_end = snapshots[0]
    d = {k: first_end["machine"][k] - first_start["machine"].get(k, 0.0) for k in first_end["machine"]}
    # guest time is counted in user already (Linux proc(5)); iowait is idle waiting on a disk
    total = sum(v for k, v in d.items() if k not in ("guest", "guest_nice")) or 1e-9
    idle = d.get("idle", 0.0) + d.get("iowait", 0.0)
    steal = d.get("steal", 0.0)
    ranks = sum(end["process_s"] - start["process_s"] for start, end in snapshots)
    others = max(0.0, total - idle - steal - ranks)
    return {"window_s": first_end["wall_s"] - first_start["wall_s"], "ranks": len(snapshots),
            "steal_fraction": steal / total, "ranks_fraction": min(1.0, ranks / total),
            "others_fraction": others / total, "idle_fraction": idle / total}


def gather_cpu_share(start: Optional[dict], end: Optional[dict], device: str) -> Optional[dict]:
    """Every rank (a collective on CPU ranks): who used the CPU of each host of the run between `start` and `end`
    (this rank's cpu_snapshot at the first timed step and after the last): host_cpu_share per host, and the run's
    worst host (the most taken by the hypervisor and other processes together). None on a GPU or where a rank could
    not read its counters.

    Why: on CPU ranks a step is the cores' time, and a profile is measured with the ranks alone on them. A
    hypervisor or another job taking cores during the steps slows them while calibrate's probes, run after the
    steps (check_rates), may read normal rates: two of 26 recipe=tiny repeats ran 18-21% over the plan with the GEMM
    read at x1.04 and x1.15 of the profile (bench/steptime/results.md, 2026-12-07). This says whether the ranks had
    the cores to themselves."""
    if device != "cpu":
        return None
    import torch.distributed as dist

    mine = None if start is None or end is None else (start, end)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if any(x is None for x in every):
        return None
    by_host: dict[str, list] = {}
    for pair in every:
        by_host.setdefault(pair[0]["host"], []).append(pair)
    hosts = {h: host_cpu_share(pairs) for h, pairs in by_host.items()}
    worst = max(hosts, key=lambda h: hosts[h]["steal_fraction"] + hosts[h]["others_fraction"])
    return {**hosts[worst], "host": worst, "hosts": len(hosts)}


def format_cpu_share(share: dict) -> str:
    """'the hypervisor took S% of this machine's CPU time, other processes O%, the run's R ranks R%'."""
    where = "this machine" if share["hosts"] == 1 else f"host {share['host']} (the most taken of {share['hosts']})"
    return (f"over the timed steps ({share['window_s']:.1f} s) the hypervisor took {share['steal_fraction']:.0%} of "
            f"{where}'s CPU time (steal), other processes {share['others_fraction']:.0%}, the run's "
            f"{share['ranks']} rank(s) on it {share['ranks_fraction']:.0%}")


def _largest_rank(rec: dict) -> str:
    """" (rank R, the largest of N)" where more than one rank reported its peak."""
    ranks = rec.get("peak_memory_bytes_per_rank") or []
    return f" (rank {rec['peak_memory_rank']}, the largest of {len(ranks)})" if len(ranks) > 1 else ""


def format_versus_plan(rec: dict) -> str:
    """One line: measured vs planned step time and peak memory."""
    if rec.get("step_time_s") is None:  # no step timed (a resume with no steps left)
        return "no step timed in this launch: nothing to hold the plan to"
    if rec["predicted_step_time_s"] is None:
        return (f"median step {rec['step_time_s'] * 1e3:,.0f} ms over {rec['steps_timed']} steps (no plan prediction: "
                "CPU ranks without cluster.profile; `launcher calibrate` writes one)")
    line = (f"median step {rec['step_time_s'] * 1e3:,.0f} ms over {rec['steps_timed']} steps, planned "
            f"{rec['predicted_step_time_s'] * 1e3:,.0f} ms (x{rec['step_time_over_predicted']:.2f}); peak memory "
            f"{rec['peak_memory_bytes'] / 2**20:,.0f} MiB{_largest_rank(rec)}, planned "
            f"{rec['predicted_peak_memory_bytes'] / 2**20:,.0f} MiB "
            f"(x{rec['peak_memory_over_predicted']:.2f}; on CPU ranks the measured figure is the process's peak RSS)")
    if abs(rec["step_time_over_predicted"] - 1) <= PLAN_TOLERANCE:
        return line
    source = rec.get("profile") or "its profile"
    line += f". The step is more than {PLAN_TOLERANCE:.0%} from the plan, whose rates come from {source}"
    if rec.get("profile_noisy"):
        # calibrate said so when it wrote the profile; a miss from it may be that alone
        line += (f", measured while the machine was busy ({'; '.join(rec['profile_noisy'])}): calibrate again when "
                 "it is quiet")
    now = rec.get("rates_now")
    if now is None:
        # Most misses on a calibrated machine are the machine moving after its calibration (other load, another
        # node), which shifts every layout alike (bench/steptime/results.md): say which rates the plan read.
        return line + (": if this machine is not the one measured there, or has changed since (other jobs, another "
                       "node type), run `launcher calibrate` here and pass its profile; `launcher plan --json` with this "
                       "run's overrides breaks the planned step down (step_time_breakdown_s)")
    replanned = now["replanned_step_time_s"]
    over = rec["step_time_s"] / replanned
    line += (f". Measured after the steps with calibrate's probes, this machine's {now['dtype']} GEMM (side "
             f"{now['gemm_side']}) runs at x{now['gemm_over_profile']:.2f} of the profile's rate and its copy at "
             f"x{now['memory_over_profile']:.2f}; planned with those rates the step is {replanned * 1e3:,.0f} ms "
             f"(measured x{over:.2f}): ")
    moved = max(abs(now["gemm_over_profile"] - 1), abs(now["memory_over_profile"] - 1)) > RATE_TOLERANCE
    share = rec.get("cpu_share")
    if share is not None:
        line += format_cpu_share(share) + "; "
    shared = share is not None and share["steal_fraction"] + share["others_fraction"] > CPU_SHARE_TOLERANCE
    if abs(over - 1) <= PLAN_TOLERANCE:
        return line + ("the machine moved since that profile was measured (other jobs, another node type) and that "
                       "explains the miss: run `launcher calibrate` here and pass its profile")
    if moved:
        return line + ("the machine moved since that profile was measured, and the plan misses even at the rates read "
                       "now: run `launcher calibrate` here, and `launcher plan --json` with this run's overrides breaks "
                       "the planned step down (step_time_breakdown_s)")
    if shared:
        return line + ("those rates hold, but the ranks did not have the cores to themselves through the steps, as the "
                       "profile's measurements did: rerun on a quiet machine before reading the miss as the plan's; "
                       "`launcher plan --json` with this run's overrides breaks the planned step down "
                       "(step_time_breakdown_s)")
    return line + ("those rates hold, so the miss is in the plan's other terms (collectives, waits, framework time): "
                   "`launcher plan --json` with this run's overrides breaks the planned step down (step_time_breakdown_s)")


def peak_memory_bytes(device: str) -> int:
    """Peak accelerator memory allocated by this rank; on CPU the process's peak resident set size."""
    if device == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class IntervalLoss:
    """The mean of the step losses since the last logged record: the loss a record with logging.log_every=N carries.

    What the HF Trainer logs as `loss` (trainer.py _maybe_log_save_evaluate: tr_loss summed every step, divided
    by global_step - _globalstep_last_logged at each log) and Megatron prints as "lm loss" (training.py
    training_log: total_loss_dict summed every iteration, averaged at each log_interval). Like the HF Trainer we
    average every step of the interval, a non-finite one included (it makes the mean non-finite: the record
    says so); Megatron leaves out the iterations its loss scaler skipped. One step's loss alone is noise at
    small batch sizes.
    """

    def __init__(self):
        self.total, self.steps = 0.0, 0

    def add(self, loss: float) -> None:
        self.total += loss
        self.steps += 1

    def take(self) -> tuple[float, int]:
        """(mean over the interval, its step count), and start a new interval."""
        mean, n = self.total / max(self.steps, 1), self.steps
        self.total, self.steps = 0.0, 0
        return mean, n


def gather_peak_memory(device: str, tensor_device) -> list[int]:
    """Every rank's peak_memory_bytes, on every rank: one all_gather of one int64 (called at log steps only)."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor([peak_memory_bytes(device)], dtype=torch.int64, device=tensor_device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [int(t.item()) for t in every]


def divert_library_logs(run_dir: Path, rank: int) -> Path:
    """DeepSpeed's logger lines go to <run_dir>/deepspeed.log (every rank appends, prefixed by its rank) instead of
    the console; its warnings and errors still reach stderr as well, but for the expected ones.

    DeepSpeed logs through one logger, "DeepSpeed" (deepspeed/utils/logging.py, a StreamHandler to stdout, level
    WARNING in 0.19.8; INFO, with its config dump and checkpoint paths, when a user lowers it), in between our step
    lines. Small appends (O_APPEND) from several ranks do not interleave within a line. DeepSpeed's print()s
    (zero_to_fp32's "Processing zero checkpoint ...") are redirected into the same file where they happen.
    """
    import logging

    from deepspeed.utils import logger as ds_logger

    path = run_dir / LIBRARY_LOG_FILE
    to_file = logging.FileHandler(path, mode="a", delay=True)
    to_file.setFormatter(logging.Formatter(f"[rank {rank}] %(asctime)s %(levelname)s [%(filename)s:%(lineno)d] %(message)s"))
    to_console = logging.StreamHandler()  # stderr
    to_console.setLevel(logging.WARNING)
    # Expected at every start (launcher/train.py start_lr_schedule explains it): the file keeps it, the console not.
    to_console.addFilter(lambda r: "get learning rate from scheduler before it has started" not in r.getMessage())
    to_console.setFormatter(logging.Formatter(f"[rank {rank}] DeepSpeed %(levelname)s: %(message)s"))
    for h in list(ds_logger.handlers):
        ds_logger.removeHandler(h)
    ds_logger.addHandler(to_file)
    ds_logger.addHandler(to_console)
    ds_logger.propagate = False
    return path


def write_summary(run_dir: Path, summary: dict) -> Path:
    """<run_dir>/summary.json, atomically (launcher/runtime/durable.py): a reader never sees half of it."""
    path = run_dir / SUMMARY_FILE
    write_atomic(path, json.dumps(summary, indent=2) + "\n")
    return path


def format_summary(s: dict) -> str:
    """The end-of-run lines rank 0 prints."""
    def num(x, fmt):
        return "n/a" if x is None else format(x, fmt)

    lines = [f"summary ({s['status']}): {s['step']} steps, {s['tokens_seen']:,} tokens seen; "
             f"final train loss {num(s['final_train_loss'], '.4f')} (mean of the last {s['final_train_loss_steps']} "
             f"step(s)), val loss {num(s['final_val_loss'], '.4f')}",
             f"  wall time {s['wall_time_s']:.1f} s ({s['train_time_s']:.1f} s in the loop), "
             f"{num(s['tokens_per_s'], ',.0f')} tokens/s over this run's {s['tokens_this_run']:,} tokens",
             f"  checkpoint {s['checkpoint']}"]
    if s.get("export"):
        lines.append(f"  transformers export {s['export']}")
    lines.append(f"  metrics {s['metrics']}, summary {s['summary']}, DeepSpeed log {s['library_log']}")
    return "\n".join(lines)


def current_rss_bytes() -> int:
    """This process's resident set size now (not the peak): what a leak across checkpoints would grow."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MetricsSink:
    """Rank 0's recorder: metrics.jsonl always, TensorBoard and W&B when enabled. Other ranks get a no-op."""

    def __init__(self, cfg, run_dir: Path, enabled: bool, resumed: bool):
        self.enabled = enabled
        self.path = run_dir / METRICS_FILE
        self.tb = None
        self.wandb_run = None
        self.mlflow = None
        if not enabled:
            return
        # A resumed run appends; records of steps past the resume point (from a crash after the last save)
        # are dropped so the file reads as one run.
        self.file = open(self.path, "a" if resumed else "w", buffering=1)
        self.fault_half_line = os.environ.get(FAULT_ENV) == "metrics.half-line"  # test hook: die mid-append
        if cfg.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        if cfg.logging.wandb.enabled and wandb_mode(cfg) != "disabled":
            import wandb
            from omegaconf import OmegaConf

            # The key comes from WANDB_API_KEY in the environment (or the user's own netrc); we never write one.
            # A null project/entity/mode reaches wandb as None, so WANDB_PROJECT, WANDB_ENTITY and WANDB_MODE
            # apply as they do in any wandb script; files go to WANDB_DIR when set, else into the run dir.
            self.wandb_run = wandb.init(project=cfg.logging.wandb.project, entity=cfg.logging.wandb.entity,
                                        mode=cfg.logging.wandb.mode, dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
                                        name=run_dir.name, id=run_dir.name, resume="allow",
                                        config=OmegaConf.to_container(cfg, resolve=True))
        if cfg.logging.mlflow.enabled:
            self.mlflow = start_mlflow_run(cfg, run_dir, resumed)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps(record) + "\n"
        if self.fault_half_line and record.get("step", 0) >= 3:
            self.file.write(line[: len(line) // 2])
            self.file.flush()
            os.kill(os.getpid(), 9)
        self.file.write(line)
        if record.get("kind") == "checkpoint":
            # The records up to a checkpoint reach the disk with it (a resume keeps exactly those); between
            # checkpoints a crash may lose or tear the last lines, which read_metrics tolerates.
            os.fsync(self.file.fileno())
        step = record.get("step", 0)
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step" and v is not None}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(f"{record.get('kind', 'train')}/{k}", v, step)
        if self.wandb_run is not None:
            self.wandb_run.log({f"{record.get('kind', 'train')}/{k}": v for k, v in scalars.items()}, step=step)
        if self.mlflow is not None:
            self.mlflow.log_metrics({f"{record.get('kind', 'train')}/{k}": float(v) for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        if not self.enabled:
            return
        self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if self.mlflow is not None:
            self.mlflow.end_run()


MLFLOW_RUN_ID_FILE = "mlflow_run_id"  # a resumed run (or a requeued job) logs on into the same MLflow run


def start_mlflow_run(cfg, run_dir: Path, resumed: bool):
    """Rank 0's MLflow run (the fluent API: one active run per process), named after the run dir; returns the module.

    Our own few lines rather than accelerate's MLflowTracker: accelerate's trackers run behind its PartialState
    (the process-state singleton of an Accelerator) to decide the main process, which our ranks do not use;
    MetricsSink already runs on rank 0 only, and MLflow's API is the same three calls either way.
    The config's parameters are logged once, at the fresh start: MLflow refuses a changed value of a logged
    parameter, and a resume may change train.steps.
    """
    import mlflow
    from omegaconf import OmegaConf

    m = cfg.logging.mlflow
    if m.tracking_uri:
        mlflow.set_tracking_uri(m.tracking_uri)
    if m.experiment:
        mlflow.set_experiment(m.experiment)
    id_file = run_dir / MLFLOW_RUN_ID_FILE
    run_id = id_file.read_text().strip() if resumed and id_file.exists() else None
    run = mlflow.start_run(run_id=run_id, run_name=None if run_id else run_dir.name)
    if run_id is None:
        write_atomic(id_file, run.info.run_id + "\n")
        flat = _flatten(OmegaConf.to_container(cfg, resolve=True))
        mlflow.log_params({k: v for k, v in flat.items() if v is not None})
    return mlflow


def _flatten(tree, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def mlflow_tracking_uri(cfg) -> str:
    """Where MLflow will log: logging.mlflow.tracking_uri, else $MLFLOW_TRACKING_URI, else MLflow's default."""
    if cfg.logging.mlflow.tracking_uri:
        return cfg.logging.mlflow.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    import mlflow

    return mlflow.get_tracking_uri()


def refuse_mlflow_unusable(cfg) -> None:
    """MLflow selected: refused before any rank starts when it is not installed, or when the tracking store it would
    use cannot open here (rank 0 would die in mlflow.start_run after every rank had started).

    MLflow 3 (mlflow-skinny 3.17 measured): the default store is sqlite:///mlflow.db, which needs SQLAlchemy (the
    full `mlflow` package, not mlflow-skinny); the file store (file:/path, or a plain path) raises unless
    MLFLOW_ALLOW_FILE_STORE=true. A tracking server (http(s)://, databricks) is not contacted here.
    """
    from urllib.parse import urlsplit

    from launcher.config.errors import ConfigError

    if not cfg.logging.mlflow.enabled:
        return
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise ConfigError("logging.mlflow.enabled", True,
                          "MLflow is not installed in this environment (it is an optional extra of the launcher)",
                          "pip install 'launcher[mlflow]' (mlflow-skinny; or the full `mlflow`), or logging.mlflow.enabled=false") from None
    uri = mlflow_tracking_uri(cfg)
    scheme = urlsplit(uri).scheme if "://" in uri or uri.startswith("file:") else ""
    source = "logging.mlflow.tracking_uri" if cfg.logging.mlflow.tracking_uri else \
        ("MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "MLflow's default")
    if scheme.split("+")[0] in ("sqlite", "postgresql", "mysql", "mssql"):
        try:
            import sqlalchemy  # noqa: F401
        except ImportError:
            raise ConfigError("logging.mlflow.tracking_uri", uri, f"(from {source}) is a database store, which needs "
                              "SQLAlchemy: the full `mlflow` package, not mlflow-skinny",
                              "pip install mlflow, or log to a tracking server (logging.mlflow.tracking_uri=http://HOST:5000) "
                              "or to a file store (logging.mlflow.tracking_uri=file:/path/mlruns with "
                              "MLFLOW_ALLOW_FILE_STORE=true)") from None
    elif scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        raise ConfigError("logging.mlflow.tracking_uri", uri, f"(from {source}) is MLflow's file store, which MLflow 3 "
                          "refuses to open unless MLFLOW_ALLOW_FILE_STORE=true (it is in maintenance mode)",
                          "export MLFLOW_ALLOW_FILE_STORE=true, or log to a tracking server or a database store "
                          "(sqlite:///mlflow.db with the full mlflow package)")


def refuse_unusable_trackers(cfg) -> None:
    """The trackers' checks before any rank starts or any job is queued (W&B credentials, MLflow install and store)."""
    refuse_wandb_without_login(cfg)
    refuse_mlflow_unusable(cfg)


WANDB_MODES = ("online", "offline", "disabled", "shared")  # wandb 0.31 Settings.mode (plus the legacy "dryrun")


def wandb_mode(cfg) -> str:
    """The mode wandb.init runs in: logging.wandb.mode when set, else $WANDB_MODE, else wandb's default (online)."""
    mode = cfg.logging.wandb.mode or os.environ.get("WANDB_MODE") or "online"
    return "offline" if mode == "dryrun" else mode


def refuse_wandb_without_login(cfg) -> None:
    """A W&B run that will go online needs credentials: refused before any rank starts when there are none.

    Without this, rank 0 died in wandb.init ("No API key configured") after every rank had started, built its
    model and prepared its data. wandb 0.31 looks for credentials in this order (sdk/lib/wbauth/authenticate.py,
    wbnetrc.py): $WANDB_API_KEY or $WANDB_IDENTITY_TOKEN_FILE, then the netrc file ($NETRC, else ~/.netrc, else
    ~/_netrc) entry for the host of $WANDB_BASE_URL (default https://api.wandb.ai), which `wandb login` writes.
    Only their presence is checked here (no network); a wrong key still fails in wandb.init.
    """
    import netrc
    from urllib.parse import urlsplit

    from launcher.config.errors import ConfigError

    w = cfg.logging.wandb
    if not w.enabled:
        return
    mode = wandb_mode(cfg)
    source = "logging.wandb.mode" if w.mode else ("WANDB_MODE" if os.environ.get("WANDB_MODE") else "the default")
    if mode not in (*WANDB_MODES, "dryrun"):
        raise ConfigError("logging.wandb.mode", mode, f"(from {source}) is not a W&B mode: {', '.join(WANDB_MODES)}",
                          "logging.wandb.mode=offline to log locally (`wandb sync` uploads later), or online")
    if mode not in ("online", "shared"):
        return
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    candidates = [Path(os.environ["NETRC"])] if os.environ.get("NETRC") else \
        [Path("~/.netrc").expanduser(), Path("~/_netrc").expanduser()]
    path = next((p for p in candidates if p.exists()), candidates[0])
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        entry = None
    if entry and entry[2]:
        return
    raise ConfigError(
        "logging.wandb.enabled", True,
        f"W&B logs online (mode {mode!r} from {source}) and finds no credentials: WANDB_API_KEY is not set and "
        f"{path} has no entry for {host}, so rank 0 would stop in wandb.init after every rank had started",
        "log offline with WANDB_MODE=offline (or logging.wandb.mode=offline; `wandb sync` uploads it later), "
        "or run `wandb login` once (it writes the netrc entry), or export WANDB_API_KEY")


def read_metrics(path: Path, warn=None) -> list[dict]:
    """The records of a metrics.jsonl; lines that are not a JSON object (a line torn by a crash or a full disk
    while it was appended) are dropped, with one warning naming them."""
    records, torn = [], []
    for n, line in enumerate(Path(path).read_bytes().decode(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            records.append(rec)
        else:
            torn.append(n)
    if torn and warn is not None:
        warn(f"warning: {path}: dropped {len(torn)} damaged line(s) (torn by a crash or a full disk while being "
             f"written): line {', '.join(map(str, torn[:5]))}")
    return records


def truncate_metrics(run_dir: Path, after_step: int, warn=print) -> None:
    """Drop records past `after_step` (written after the checkpoint a resume starts from) and damaged lines."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return
    keep = [rec for rec in read_metrics(path, warn) if rec.get("step", 0) <= after_step]
    write_atomic(path, "".join(json.dumps(rec) + "\n" for rec in keep))


def plot_loss(run_dir: Path) -> Optional[Path]:
    """loss.png from metrics.jsonl: training loss per step, and validation loss where evaluated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir / METRICS_FILE)
    train = [(r["step"], r["loss"]) for r in records if r.get("kind") == "train" and math.isfinite(r.get("loss", math.nan))]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("kind") == "eval"]
    if not train:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*zip(*train), label="train loss", linewidth=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(run_dir.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = run_dir / LOSS_PLOT_FILE
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(out, buf.getvalue())
    return out
