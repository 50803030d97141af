"""`launcher calibrate`: measure this machine and write a hardware profile (launcher/plan/profile.py).

    launcher calibrate cluster=cpu cluster.gpus_per_node=2 --out profiles/this-box.yaml

Starts cluster.gpus_per_node ranks with torchrun (gloo on CPU ranks, NCCL on GPUs), the way `launcher train`
starts them (same OMP_NUM_THREADS per rank), and on every rank at once, so that the ranks share the
memory bus and cores as they will in training, measures:

    GEMM rate          a Linear(d, d)'s three GEMMs on 2,048 tokens (GPU: 16,384) as autograd issues them (forward
                       X W^T, input gradient dY W, weight gradient dY^T X), d = 32..512 (GPU: 256..8192), in fp32
                       and bf16, operands rotated through 64 MiB (read from beyond the cache, as in a step);
                       the table by d, and a fit to rate = P d / (d + d_half) (1/rate = 1/P + (d_half / P) / d)
    attention rate     causal SDPA forward + backward, head dim 64, sequence 64..1024 (GPU: head dim 128, to
                       4096, bf16 to 16384); same fit; and the table at head dims 32 and 128 (GPU: 64, bf16) beside
                       it (attention_table_by_head_dim), the heads x head dim kept
    memory bandwidth   a 64 MiB copy (read + write), every rank copying for 0.25 s at once, the ranks' mean
                       rate (GPU: 256 MiB, the median of 10)
    kernel overhead    a chain of tiny autograd ops, forward + backward, seconds per op (GPU: the device's gap
                       between kernels, 200 tiny kernels replayed from a CUDA graph; the host's chain kept beside)
    (GPU: every compute rate with 20 calls queued between two synchronisations, as a step queues its kernels;
    more CPU ranks than cores: each GEMM and attention shape timed over 0.1 s with every rank busy, the ranks'
    mean rate, _window_s)
    collectives        all-reduce and all-to-all of 4 KiB .. 16 MiB over all ranks, each right after a ~1 ms
                       GEMM on every rank, as in a training step (its cost: the pair's mean time minus the
                       GEMM's alone, means since a step's total is count x mean). A collective that follows
                       compute also pays for the ranks arriving out of step, which back-to-back microbenchmarks
                       hide: on this 2-core box 0.4 ms bare against 1-5 ms between compute
                       (bench/steptime/results.md). Fitted to latency + 2 (r-1)/r B / bus bandwidth
                       (all-to-all: (r-1)/r B), least squares in B, the forms steptime.py charges. On
                       several nodes (`launcher submit --calibrate`, one torchrun per node) every group runs
                       at once: each node's ranks (intra, all-to-all), one rank a node (inter), and all ranks
                       (kept, not charged); on one node the inter-node link is taken equal to the intra one
    stragglers         every rank runs the same segment of block-like compute (two GEMMs, SiLU, a residual add on
                       fresh outputs) of 5-150 ms (GPU: 0.5-50 ms), started together by an all-reduce, and times
                       its own segment; for groups of 2, 4, ... consecutive ranks: (slowest - mean) / mean, the
                       share of a segment a group waits at its next synchronisation (profile.straggler)
    release            the same segments, each group of 2, 4, ... consecutive ranks (and the node's) then
                       all-reducing 4 KiB within itself, every group at once: the mean time from its last
                       arrival to its exit, by segment length (profile.release; the plan charges what it
                       exceeds the link's latency by). On one node with more CPU ranks than cores, both again
                       with only the first cores' worth of ranks busy, the rest idle (straggler_unshared,
                       release_unshared: a pipeline's fill and drain, steptime._shared_pipeline)
    ZeRO-3 hooks       a DeepSpeed ZeRO-3 engine over 8 and 40 small Linear modules (bare, then each in a
                       wrapper module) against the same modules plain, forward + backward, at 1 and 3
                       micro-batches a step: seconds per module and per parameter tensor, every micro-batch
                       (zero3_module_s, zero3_param_s) and once a step (zero3_module_step_s, zero3_param_step_s);
                       then the wrapped Linear under a non-reentrant checkpoint: what the recompute's hooks add
                       a parameter tensor (zero3_recompute_param_s)
    engine per element a DeepSpeed engine at each ZeRO stage 0-3, fp32 and bf16, over 8 and 40 Linear(d, d)
                       against the same layers plain with the same SGD step, each rank its own data-parallel
                       group (no collective: the plan charges traffic apart), at d = 32 and d = 384 (GPU: 2,048;
                       above ZeRO-3's persistence threshold, so gathered): seconds per parameter element and step
                       (engine_element_s), the difference of the two sizes' per-layer costs over that of their
                       elements (the per-module and per-tensor costs cancel); and per parameter tensor
                       (engine_tensor_s), the small layer's cost less its elements at that rate; each at 1 and
                       3 micro-batches a step, so that what every micro-batch pays (engine_element_micro_s,
                       engine_tensor_micro_s) comes apart from the step's rest
    framework          CPU ranks: one micro-batch through the runtime's own llama, gpt and bloom models at a
                       near-zero-compute shape (launcher/plan/steptime.py FRAMEWORK_PROBE) with 1 and 3 blocks,
                       fp32 and bf16, forward and backward timed apart: what every micro-batch pays in dispatch,
                       autograd and module Python, less what the step-time model charges for that model
                       (framework_s: per block forward, backward, and per model). On a GPU the same probe
                       times the host's issue time per micro-batch (host_s, whole): the plan's floor under
                       each micro-batch's kernels. The same models with selective checkpointing on, in the same
                       rounds: what such a block adds per micro-batch (selective_framework_s, less the recompute
                       the plan charges; on a GPU selective_host_s, whole)
    host memory        /proc/meminfo MemTotal; compute slots: cores / threads per rank (CPU ranks)

The compute rates (GEMM, attention, memory, kernel overhead), the collectives after compute, the stragglers, the
release and ZeRO-3's hooks are measured in COMPUTE_ROUNDS rounds, one of each probe a round, and each item is the
median over the rounds: one round that another process slowed is dropped, and the rate is the one a step's many
kernels meet, not the best (each round's tables are kept, measurements.probe_rounds). Each sweep's copy bandwidth, operator overhead and largest-side GEMM rates are kept (measurements.sweep_spread); where
they differ by more than launcher/plan/profile.py NOISY_SWEEPS, calibrate warns on stderr and in the profile's header that the machine was
busy, since a disturbance lasting through two sweeps moves the median too.

Rank 0 writes the raw measurements to a JSON file; the parent fits them and writes the versioned YAML
(write_profile; under SLURM the job's batch shell, `python -m launcher.runtime.calibrate --fit RAW OUT`).
Every fit is to microbenchmarks of this machine, never to training runs. Rank 0 says on stderr as each probe
ends what it took (`calibrate: ZeRO-3 hooks 8 s (30 s so far)`; `calibrate: collectives, round 2 of 3 1 s (40 s so
far)`); the profile keeps the seconds of each probe over its rounds (measurements.phase_seconds) and lists them in
its header. 2 CPU ranks: ~100 s, ~40 of them DeepSpeed's engine probe, and 4 ranks ~205 s on the 2-core machine of
2026-11; 266 s on the AVX2-only EPYC of 2026-12-02 (bf16 GEMMs there run at 1/300 of the first one's rate), 449 s
there on 2026-12-08 once the attention table reached 4,096 tokens, 263 s since those lengths run fewer heads
(ATTN_CPU_FULL_WIDTH_SEQ).

`--network-only` (network_base) runs only the collectives, the stragglers and release and ZeRO-3's hooks, and keeps
cluster.profile's other figures: 96 s of measuring on those 2 ranks of 2026-12-02, where the whole took 266 s.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.plan.profile import noisy_sweeps
from launcher.runtime.cpualloc import recycle_step_buffers
from launcher.runtime.distributed import avoid_shm_comm_build, leave_rank
from launcher.runtime.launch import rank_env

GEMM_SIDES = (32, 64, 128, 256, 512)
GEMM_SIDES_GPU = (256, 512, 1024, 2048, 4096, 8192)
GEMM_TOKENS = {"cpu": 2048, "cuda": 16384}
# CPU ranks to the 4,096 tokens their long-context layouts run (docs/training.md's CP examples): the plan clamps the
# rate past the table's end, and with the table ending at 1,024 recipe=tiny at seq 4,096 planned 2,993 ms a step
# against 2,110 measured (bench/steptime/results.md, 2026-12-07), its causal attention's rate still rising there.
ATTN_SEQS_CPU = (64, 128, 256, 512, 1024, 2048, 4096)
ATTN_SEQS_GPU = (256, 512, 1024, 2048, 4096)
# 16-bit only, at 16,384 tokens a call (batch 2, 1): long-context layouts (bench/published's 16k-65k rows) read the
# table there, and one H200's cuDNN flash kernel still gains 445 -> 491 -> 527 TFLOP/s from 4k to 8k to 16k
# (bench/gpu/long_attention.py); fp32's kernel takes ~15x as long for nothing a layout plans in fp32.
ATTN_SEQS_GPU_LONG = (8192, 16384)
# Attention's head dimensions: the profile's table at ATTN_HEAD_DIM, the others beside it (attention_table_by_head_dim)
# at the same width (heads x head dim). 2 CPU ranks, fp32, seq 128 (recipe=tiny's head dimension is 32): 28 GFLOP/s
# at 32, 36 at 64, 40 at 128; FlashAttention-2 on an A100, seq 2k: 140 TFLOP/s at 64, 155 at 128 (fig. 4(c), 4(d)).
ATTN_WIDTH = {"cpu": 256, "cuda": 2048}
ATTN_HEAD_DIM = {"cpu": 64, "cuda": 128}
ATTN_EXTRA_HEAD_DIMS = {"cpu": (32, 128), "cuda": (64,)}
# A CPU rank's attention call past 1,024 tokens times fewer heads (_attention_heads): the heads of a call run one
# after another on the rank's one thread, so its rate per FLOP is the same with one head as with all of them, while
# a call's work grows with the square of the sequence. One head over the full width, 2 ranks at once at 2,048 and
# 4,096 tokens: 0.94-1.00 in bf16 and 0.99-1.01 in fp32 at head dimensions 32 and 64, 0.89 / 1.08 in fp32 at 128
# (bench/steptime/attention_heads.py, AVX2-only EPYC, 2026-12-08). With every call at the full width that EPYC (bf16
# SDPA at ~8 GFLOP/s, 4 s a call at 4,096 tokens) spent ~100 s a compute sweep, 449 s on a 2-rank calibration.
ATTN_CPU_FULL_WIDTH_SEQ = 1024
ALLREDUCE_BYTES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
COMPUTE_ROUNDS = 3
COPY_WINDOW_S = 0.25
# GEMMs and attention on a node with more CPU ranks than cores, each timed over this window with every rank busy
# (_window_s): ~10-2,000 calls of 0.05-10 ms, ~30 of the scheduler's switches between 4 ranks on 2 cores.
SHARED_WINDOW_S = 0.1
STRAGGLER_SEGMENTS_S = {"cpu": (0.005, 0.02, 0.06, 0.15), "cuda": (0.0005, 0.005, 0.05)}
STRAGGLER_BUDGET_S = 0.5    # per segment length and round (COMPUTE_ROUNDS rounds)
GEMM_POOL_BYTES = 64 << 20
# What the ranks measure (_worker's last argument): every probe, or only those whose figures depend on how many ranks
# there are and where they sit (`--network-only`: the collectives, stragglers, release and ZeRO-3's hooks, which
# run over every rank); the rest then comes from cluster.profile (network_base).
ALL, NETWORK = "all", "network"
# The profile fields a network-only calibration measures; every other field is the base profile's.
NETWORK_FIELDS = ("intra", "inter", "inter_groups", "all_to_all", "intra_groups", "straggler", "release", "straggler_unshared",
                  "release_unshared", "zero3_module_s", "zero3_param_s", "zero3_module_step_s", "zero3_param_step_s",
                  "zero3_recompute_param_s", "host_memory_gb", "process_bytes")
# The raw measurements a profile keeps that a network-only calibration measures again (and the run's own facts).
NETWORK_MEASUREMENTS = ("all_reduce", "all_reduce_after_compute", "all_to_all_after_compute",
                        "all_reduce_groups_after_compute", "all_reduce_rail_after_compute",
                        "all_reduce_world_after_compute", "straggler", "release", "straggler_unshared",
                        "release_unshared", "zero3", "world", "local_world",
                        "nodes", "backend", "device_name", "cores", "seconds", "phase_seconds", "probe_rounds", "scope",
                        "process_bytes_before_model")


# ---- the parent: start the ranks, fit, write -----------------------------------------------------------------------

def calibrate(cfg, out: str, progress=None, network_only: bool = False) -> Path:
    """Run the measurement on cluster.gpus_per_node local ranks and write the profile YAML to `out`. `progress`
    (default: print to stderr) gets a line as each probe finishes, with its seconds: a calibration takes 1-3
    minutes, and a user (or a GPU session on a clock) sees where they go. `network_only`: measure only what
    depends on the ranks' count and placement, the rest from cluster.profile (network_base)."""
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    nproc, device = _local_ranks(cfg)
    base = network_base(cfg, network_only)
    if base:    # before any rank starts: a mismatched base would have the ranks measure for minutes, then refuse
        refuse_other_node_type(base_measurements(base), this_node_type(device), base, measured=False)
    started = time.perf_counter()
    raw = _run_ranks(nproc, device, lambda raw_path: [str(raw_path), device, str(float(cfg.optimizer.grad_clip)),
                                                     NETWORK if base else ALL], progress)
    for line in busy_warnings(raw):
        progress(f"{PHASE_PREFIX}{line}")
    return write_profile(raw, out, time.perf_counter() - started, base)


def network_base(cfg, network_only: bool) -> str | None:
    """cluster.profile, the profile whose per-rank figures a `--network-only` calibration keeps, checked before any
    rank starts; None for a whole calibration.

    The compute rates, DeepSpeed's engine costs and the framework figures are a property of one node's ranks: on a
    cluster of identical nodes, a calibration of one node measures them, and a calibration at 16 nodes needs to
    measure only what 16 nodes change (the links, the stragglers, the release, ZeRO-3's hooks over every rank),
    ~1/3 of a calibration's time (the compute sweeps, the engine and framework probes are the rest,
    measurements.phase_seconds). The base must come from the same kind of device and the same ranks a node: CPU
    compute figures are taken back to one rank alone by the ranks a node that shared the cores
    (launcher/plan/profile.py alone_rates)."""
    from launcher.config.errors import ConfigError
    from launcher.plan.profile import load_profile

    if not network_only:
        return None
    path = cfg.cluster.profile
    if not path:
        raise ConfigError("cluster.profile", None, "--network-only keeps the compute, engine and framework figures of "
                          "a profile of this node type and measures only the network, and no profile is given",
                          "add cluster.profile=PATH (a one-node `launcher calibrate --out PATH`), or drop --network-only")
    load_profile(path)     # a readable, current profile, or its own ConfigError
    measured = base_measurements(path)
    kind = _local_ranks(cfg)[1]
    base_kind = "cpu" if measured.get("device_name") == "cpu" else "cuda"
    if kind != base_kind:
        raise ConfigError("cluster.profile", path, f"was measured on {base_kind} ranks and this calibration runs "
                          f"{kind} ranks (cluster.gpu={cfg.cluster.gpu}); its compute figures do not describe them",
                          "give a profile of this node type, or drop --network-only to measure everything")
    ranks = measured.get("local_world", measured.get("world"))
    if ranks is not None and int(ranks) != int(cfg.cluster.gpus_per_node):
        raise ConfigError("cluster.gpus_per_node", cfg.cluster.gpus_per_node,
                          f"--network-only keeps cluster.profile's compute figures, which {path} measured with "
                          f"{ranks} ranks a node, and ranks sharing a node share its cores and memory bandwidth",
                          f"set cluster.gpus_per_node={ranks}, or drop --network-only to measure everything")
    return str(path)


def _local_ranks(cfg) -> tuple[int, str]:
    from launcher.config import hardware

    return int(cfg.cluster.gpus_per_node), "cpu" if cfg.cluster.gpu.lower() == hardware.CPU else "cuda"


def _run_ranks(nproc: int, device: str, args, progress) -> dict:
    """Start `nproc` local ranks of this module (`args(raw_path)`: its command line) as `launcher train` starts a
    node's ranks, pass their phase lines to `progress`, and return the JSON rank 0 wrote to raw_path."""
    with tempfile.TemporaryDirectory(prefix="launcher-calibrate-") as tmp:
        raw_path = Path(tmp) / "raw.json"
        # What `launcher train` gives each rank: the cores split between the local ranks and, on CPU, its malloc
        # settings, which _worker switches to a step's as the loop does (launcher/runtime/cpualloc.py).
        env = {**rank_env(nproc, device == "cpu"), "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               "-m", "launcher.runtime.calibrate", *args(raw_path)]
        # The ranks' stdout (DeepSpeed's banners) goes to a file; their stderr is read as it comes, the phase lines
        # passed on and the rest kept for the error message.
        tail: collections.deque = collections.deque(maxlen=200)
        with open(Path(tmp) / "stdout", "w") as sink:
            proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.PIPE, text=True)
            try:
                for line in proc.stderr:
                    if line.startswith(PHASE_PREFIX):
                        progress(line.rstrip())
                    else:
                        tail.append(line)
                proc.wait()
            except BaseException:
                # Interrupted (Ctrl-C, a timeout above us): torchrun passes SIGTERM on to its ranks, which stop at
                # once; left alone they go only at their next write to the closed stderr pipe (~2 s here).
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                raise
        if proc.returncode != 0 or not raw_path.exists():
            raise RuntimeError(f"calibration ranks failed (exit {proc.returncode}):\n{''.join(tail)[-3000:]}")
        return json.loads(raw_path.read_text())


def check(cfg) -> dict:
    """`launcher calibrate --check`: does cluster.profile still describe this machine, for the run this config
    describes? On cluster.gpus_per_node local ranks, calibrate's GEMM probe at every side the profile's table
    measured, both dtypes, and its copy window three times, beside what the profile says a rank should read
    (Profile.probe_rates), in ~7 s instead of a calibration's minutes. Then the config's plan again with the
    profile's GEMM and attention rates times the median GEMM ratio of its dtype and its memory bandwidth times the
    copy's (metrics.planned_step_s, as a run off its plan does): the verdict is that plan's move against
    RATE_TOLERANCE, so each rate counts by its share of the step (the copy alone is the noisier probe)."""
    from launcher.config.layout import resolve_layout
    from launcher.plan.profile import load_profile
    from launcher.runtime.metrics import RATE_TOLERANCE, planned_step_s

    nproc, device = _local_ranks(cfg)
    prof = load_profile(cfg.cluster.profile)
    layout = resolve_layout(cfg)        # a config error is refused here, before any rank starts
    dtypes = ("fp32", "bf16")
    sides = {d: [int(x) for x, _ in prof.gemm_table_for(d) or ()] or list(GEMM_SIDES if device == "cpu" else GEMM_SIDES_GPU)
             for d in dtypes}
    raw = _run_ranks(nproc, device, lambda raw_path: ["--check", str(raw_path), device, json.dumps(sides)],
                     lambda line: None)
    gemm = [{"dtype": d, "side": side, "now_tflops": now, "profile_tflops": prof.probe_rates(d, side, nproc)["gemm_tflops"]}
            for d in dtypes for side, now in raw["gemm"][d]]
    for row in gemm:
        row["ratio"] = row["now_tflops"] / row["profile_tflops"]
    copy = {"now_gbps": raw["memory_gbps"], "profile_gbps": prof.probe_rates("fp32", 1, nproc)["memory_gbps"]}
    copy["ratio"] = copy["now_gbps"] / copy["profile_gbps"]
    # the plan's dtype reads its own GEMM table (fp16 takes bf16's, as the profile does)
    mine = "fp32" if layout.dtype == "fp32" else "bf16"
    median = statistics.median(r["ratio"] for r in gemm if r["dtype"] == mine)
    plan = {"dtype": layout.dtype, "gemm_ratio": median, "step_s": planned_step_s(cfg, layout),
            "step_s_at_rates_now": planned_step_s(cfg, layout, median, copy["ratio"])}
    plan["shift"] = plan["step_s_at_rates_now"] / plan["step_s"]
    return {"profile": str(cfg.cluster.profile), "source": prof.source, "ranks": nproc, "device": device,
            "gemm": gemm, "copy": copy, "plan": plan, "moved": abs(plan["shift"] - 1) > RATE_TOLERANCE}


def format_check(result: dict) -> str:
    """`launcher calibrate --check`'s report: a row a rate, the config's plan at the rates read, the verdict."""
    from launcher.runtime.metrics import RATE_TOLERANCE

    lines = [f"{result['ranks']} {result['device']} rank(s) now against cluster.profile={result['profile']} "
             f"({result['source']}):"]
    lines += [f"  GEMM {r['dtype']} side {r['side']:>5}  now {r['now_tflops']:.4g} TFLOP/s, profile "
              f"{r['profile_tflops']:.4g}  x{r['ratio']:.2f}" for r in result["gemm"]]
    c, plan = result["copy"], result["plan"]
    lines.append(f"  copy 64 MiB{'':>9}now {c['now_gbps']:.3g} GB/s, profile {c['profile_gbps']:.3g}  x{c['ratio']:.2f}")
    said = (f"This config's plan ({plan['dtype']}: its GEMMs x{plan['gemm_ratio']:.2f}, the median of its dtype's "
            f"shapes; copy x{c['ratio']:.2f}) is {plan['step_s'] * 1e3:,.1f} ms a step from the profile and "
            f"{plan['step_s_at_rates_now'] * 1e3:,.1f} ms at the rates read now (x{plan['shift']:.2f})")
    if result["moved"]:
        lines.append(f"{said}: more than {RATE_TOLERANCE:.0%} apart, so the machine is not what that profile "
                     "measured (other jobs, another node type, or it changed since): run `launcher calibrate` here "
                     "again and plan with its profile")
    else:
        lines.append(f"{said}: within {RATE_TOLERANCE:.0%}, the profile still serves this config's plan")
    return "\n".join(lines)


def _check_worker(raw_path: str, device: str, sides: str) -> None:
    """A rank of `launcher calibrate --check`: every rank at once, as the calibration's sweep measures."""
    import torch.distributed as dist

    dev = _start_rank(device)
    sync, queued = _timer(device), 1 if device == "cpu" else 20
    out = {"gemm": {}}
    for dname, by in json.loads(sides).items():
        rows = _gemm_rates(dev, device, _torch_dtype(dname), by, sync, dist, queued)
        out["gemm"][dname] = [[d, statistics.median(r for x, r in rows if x == d) / 1e12] for d in by]
    out["memory_gbps"] = statistics.median(_copy_gbps(dev, device, sync, dist, queued) for _ in range(3))
    if dist.get_rank() == 0:
        Path(raw_path).write_text(json.dumps(out))
    dist.barrier()
    leave_rank(0)


PHASE_PREFIX = "calibrate: "


class _Phases:
    """Seconds each probe of _worker takes (raw["phase_seconds"], in the profile's measurements and its header), and
    a line on stderr from rank 0 as each ends, which calibrate() passes on."""

    def __init__(self, rank: int):
        self.rank, self.seconds, self._t = rank, {}, time.perf_counter()
        self._start = self._t

    def done(self, name: str, round_: int | None = None) -> None:
        """`round_`: the probe runs once in each of COMPUTE_ROUNDS rounds; its seconds add up under one name."""
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._t
        label = name if round_ is None else f"{name}, round {round_} of {COMPUTE_ROUNDS}"
        if self.rank == 0:
            print(f"{PHASE_PREFIX}{label} {now - self._t:.0f} s ({now - self._start:.0f} s so far)",
                  file=sys.stderr, flush=True)
        self._t = now


def _network_fit(raw: dict) -> tuple[dict, str]:
    """({NETWORK_FIELDS: fitted}, span): the profile's fields that the ranks' count and placement decide, fitted from
    the raw measurements, and the span measured ("2 nodes x 4 cuda ranks")."""
    from launcher.plan.profile import Link

    device = "cpu" if raw["device_name"] == "cpu" else "cuda"
    local, nodes = raw.get("local_world", raw["world"]), raw.get("nodes", 1)
    intra = Link(*fit_alpha_beta(raw["all_reduce_after_compute"], local))
    a2a = Link(*fit_alpha_beta(raw["all_to_all_after_compute"], local, ring_factor=False))
    inter_groups = {}
    if nodes > 1:
        # One rank a node with its peers on the other nodes: what the plan charges a group that spans nodes with one
        # rank on each; every rank of every node together: a group with `local` ranks a node (Profile.inter_for).
        inter = Link(*fit_alpha_beta(raw["all_reduce_rail_after_compute"], nodes))
        if local > 1:
            inter_groups = {local: Link(*fit_alpha_beta(raw["all_reduce_world_after_compute"], raw["world"]))}
        if local == 1:
            intra = a2a = inter    # no two ranks share a node here: nothing intra-node was measured
        span = f"{nodes} nodes x {local} {device} ranks"
    else:
        inter = intra               # one node measured: the inter-node link is unknown here (stated in the note)
        span = f"{raw['world']} {device} ranks"
    intra_groups = {int(g): Link(*fit_alpha_beta(points, int(g)))
                    for g, points in raw.get("all_reduce_groups_after_compute", {}).items()}
    fields = dict(intra=intra, inter=inter, inter_groups=inter_groups, all_to_all=a2a, intra_groups=intra_groups,
                  host_memory_gb=raw["host_memory_gb"], process_bytes=raw.get("process_bytes"),
                  zero3_module_s=raw["zero3_module_s"], zero3_param_s=raw["zero3_param_s"],
                  zero3_module_step_s=raw.get("zero3_module_step_s", 0.0),
                  zero3_param_step_s=raw.get("zero3_param_step_s", 0.0),
                  zero3_recompute_param_s=raw.get("zero3_recompute_param_s", 0.0),
                  straggler={int(g): rows for g, rows in raw["straggler"].items()},
                  release={int(g): pooled_release(rows, device) for g, rows in raw.get("release", {}).items()},
                  straggler_unshared={int(g): rows for g, rows in raw.get("straggler_unshared", {}).items()},
                  release_unshared={int(g): pooled_release(rows, device)
                                    for g, rows in raw.get("release_unshared", {}).items()})
    assert set(fields) == set(NETWORK_FIELDS)
    return fields, span


def write_profile(raw: dict, out: str, seconds: float, base: str | None = None) -> Path:
    """Fit the ranks' raw measurements (_worker's JSON) and write the versioned profile YAML to `out` (atomically:
    a plan that reads it meanwhile sees the old profile or the new one, never half of one). `base`: a network-only
    calibration's cluster.profile, whose other fields the new profile keeps (network_base)."""
    from dataclasses import replace

    from launcher.plan.profile import PROFILE_VERSION, Profile, profile_to_dict
    from launcher.plan.steptime import framework_residual, probe_split, selective_residual

    if base:
        return _write_network_profile(raw, out, seconds, base)
    device = "cpu" if raw["device_name"] == "cpu" else "cuda"
    local, nodes = raw.get("local_world", raw["world"]), raw.get("nodes", 1)
    network, span = _network_fit(raw)
    threads = int(raw["threads"])
    gemm = {d: fit_saturation(points) for d, points in raw["gemm"].items()}
    attn = {d: fit_saturation(points) for d, points in raw["attention"].items()}
    prof = Profile(
        name=f"{device}-{raw['hostname']}", gemm_tflops={d: p / 1e12 for d, (p, _) in gemm.items()},
        gemm_half_dim={d: half for d, (_, half) in gemm.items()},
        attention_tflops={d: p / 1e12 for d, (p, _) in attn.items()},
        attention_half_seq={d: half for d, (_, half) in attn.items()},
        memory_gbps=raw["memory_gbps"], kernel_overhead_s=raw["kernel_overhead_s"], **network,
        engine_element_s=raw["engine_element_s"], engine_tensor_s=raw["engine_tensor_s"],
        engine_element_micro_s=raw.get("engine_element_micro_s", {}),
        engine_tensor_micro_s=raw.get("engine_tensor_micro_s", {}),
        compute_slots=max(1, (raw["cores"] // threads)) if device == "cpu" else None,
        gemm_table={d: _median_by_size(points) for d, points in raw["gemm"].items()},
        attention_table={d: _median_by_size(points) for d, points in raw["attention"].items()},
        attention_head_dim=float(raw.get("attention_head_dim", ATTN_HEAD_DIM[device])),
        attention_table_by_head_dim={int(hd): {d: _median_by_size(points) for d, points in by.items()}
                                     for hd, by in raw.get("attention_hd", {}).items()},
        source=(f"launcher calibrate on {raw['hostname']}, {span}, {raw['backend']}, "
                f"{threads} thread(s) per rank, torch {raw['torch']}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"))
    # What a micro-batch pays beyond the operator terms (CPU ranks): the probe's measured times less what the
    # step-time model charges for the same model on the rates just fitted (launcher/plan/steptime.py
    # framework_residual). On a GPU the probe's times are the host's issue time, which the plan holds as a floor
    # under each micro-batch's kernels (host_s; steptime Cost.host), whole.
    def by_blocks(table: dict) -> dict:     # the raw JSON's block counts are strings
        return {arch: {d: {int(k): v for k, v in by_layers.items()} for d, by_layers in by_dtype.items()}
                for arch, by_dtype in table.items()}

    probe = by_blocks(raw["framework"])
    # Selectively checkpointed blocks: the same probe with selective checkpointing, per block beyond the plain one
    # (steptime.selective_residual on CPU ranks; on a GPU the issue time's difference, forward and backward).
    sel = by_blocks(raw.get("framework_selective", {}))
    if device == "cpu":
        prof = replace(prof, framework_s={arch: {d: framework_residual(arch, d, m, prof) for d, m in by_dtype.items()}
                                          for arch, by_dtype in probe.items()})
        prof = replace(prof, selective_framework_s={
            arch: {d: selective_residual(arch, d, probe[arch][d], m, prof) for d, m in by_dtype.items()}
            for arch, by_dtype in sel.items()})
    else:
        prof = replace(prof, host_s={arch: {d: probe_split(m) for d, m in by_dtype.items()}
                                     for arch, by_dtype in probe.items()})
        prof = replace(prof, selective_host_s={
            arch: {d: [max(0.0, x - y) for x, y in zip(probe_split(m)[:2], probe_split(probe[arch][d])[:2])]
                   for d, m in by_dtype.items()} for arch, by_dtype in sel.items()})
    kept = ("gemm", "attention", "attention_hd", "attention_head_dim", *NETWORK_MEASUREMENTS, "engine", "framework",
            "framework_selective", "sweep_spread", "cpu_model")
    doc = profile_to_dict(prof, measured={k: raw[k] for k in kept if k in raw}
                                         | ({"kernel_host_s": raw["kernel_host_s"]} if device != "cpu" else {}))
    doc["measurements"]["note"] = _measurements_note(nodes, local)
    assert doc["version"] == PROFILE_VERSION
    noisy = noisy_sweeps(raw.get("sweep_spread", {}))
    return _write_doc(doc, out, seconds, raw, noisy)



def _write_network_profile(raw: dict, out: str, seconds: float, base: str) -> Path:
    """A network-only calibration's profile: `base`'s document (cluster.profile, checked by network_base) with
    NETWORK_FIELDS fitted from these ranks and their raw measurements in place of the base's; the measurements say
    where the rest came from (measurements.compute_from)."""
    from dataclasses import asdict

    import yaml

    from launcher.plan.profile import PROFILE_VERSION, Link

    doc = yaml.safe_load(Path(base).expanduser().read_text())     # a new dict: _parse_profile's is cached, shared
    refuse_other_node_type(doc.get("measurements") or {}, raw, base)    # again: nodes checked before (--node-type)
    network, span = _network_fit(raw)
    for name, value in network.items():
        if isinstance(value, Link):
            value = asdict(value)
        elif name in ("intra_groups", "inter_groups"):
            value = {g: asdict(link) for g, link in value.items()}
        doc[name] = value
    doc["source"] = (f"launcher calibrate --network-only on {raw['hostname']}, {span}, {raw['backend']}, "
                     f"torch {raw['torch']}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; compute, engine "
                     f"and framework figures from {base} ({doc.get('source', '')})")
    measured = {k: v for k, v in (doc.get("measurements") or {}).items() if k not in NETWORK_MEASUREMENTS}
    doc["measurements"] = measured | {k: raw[k] for k in NETWORK_MEASUREMENTS if k in raw} | {
        **({"cpu_model": raw["cpu_model"]} if raw.get("cpu_model") else {}),   # the base's, or the first record of it
        "compute_from": str(base),
        "note": _measurements_note(raw.get("nodes", 1), raw.get("local_world", raw["world"]))
                + f"; only these were measured (--network-only): {', '.join(NETWORK_FIELDS)}; the rest is {base}'s"}
    assert doc["version"] == PROFILE_VERSION
    return _write_doc(doc, out, seconds, raw, [])


def refuse_other_node_type(base_measured: dict, node: dict, base: str, measured: bool = True) -> None:
    """A network-only calibration's nodes must be the base profile's node type: the same accelerator (its name, as
    torch reports it) and the same host CPU (its model name: the host terms, the engine's per-tensor costs and CPU
    ranks' compute are the CPU's). `node`: this_node_type(), or the ranks' raw measurements (`measured`: the fit,
    after them). network_base checked the device kind and the ranks a node before the job was submitted; the names
    are known only on the nodes, so each node checks them before its ranks start (`--node-type`, the job's first
    step; calibrate() on the local node), and the fit again before it writes anything. A base written before profiles
    recorded the CPU model (2026-12-02) is checked on the accelerator's name alone."""
    from launcher.config.errors import ConfigError

    for key, what in (("device_name", "accelerator"), ("cpu_model", "CPU")):
        theirs, ours = base_measured.get(key), node.get(key)
        if theirs and ours and theirs != ours:
            host = f" ({node['hostname']})" if node.get("hostname") else ""
            raise ConfigError(
                "cluster.profile", base,
                f"--network-only keeps this profile's compute, engine and framework figures, which were measured on "
                f"{theirs!r} ({what}, measurements.{key}), and this node{host} has {ours!r}: those figures do not "
                f"describe it; nothing was {'written' if measured else 'measured or written'}",
                "calibrate one node of this type whole (`launcher calibrate --out BASE` on it, or `launcher submit "
                "--calibrate cluster.nodes=1 ... --out BASE`) and pass that as cluster.profile, or drop --network-only "
                "to measure everything")


def base_measurements(base: str) -> dict:
    """cluster.profile's `measurements` (what network_base and refuse_other_node_type read), {} where it has none;
    through profile.py's cached parse, so network_base and calibrate() parse the file once."""
    from launcher.plan.profile import _parse_profile

    return _parse_profile(Path(base).expanduser().read_text()).get("measurements") or {}


def this_node_type(device: str) -> dict:
    """{device_name, cpu_model, hostname} of this node, as _worker records them in the raw measurements."""
    import socket

    name = "cpu"
    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name()
    return {"device_name": name, "cpu_model": cpu_model(), "hostname": socket.gethostname()}


def cpu_model() -> str:
    """This host's CPU model name (/proc/cpuinfo's first "model name"; platform.processor() elsewhere), "" unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor()


def _measurements_note(nodes: int, local: int) -> str:
    """What the raw measurements' tables hold (measurements.note)."""
    return ("gemm: [side, FLOP/s]; attention: [seq, causal FLOP/s fwd+bwd]; all_reduce (bare, "
            "back to back, all ranks), *_after_compute (the fits' input): [bytes, seconds], over "
            "each node's ranks (intra, all_to_all), {size: ...} smaller groups in a node "
            "(intra_groups), one rank a node (rail: inter) and all ranks "
            "across nodes (world: inter_groups at the ranks a node); zero3: seconds "
            "per step [unit, micro-batches a step, modules, zero-3 engine, plain]; straggler: "
            "{group size: [mean segment seconds, (slowest - mean) / mean]}; the collectives, "
            "straggler, release and zero3 figures: the median over probe_rounds (each round's "
            "tables; zero3 keeps every round's rows); engine: seconds per "
            "step [dtype, ZeRO stage, side d, micro-batches a step, Linear(d, d) layers, "
            "engine, plain]; framework: {arch: {dtype: {blocks: "
            "[forward s, backward s]}} of the near-zero-compute probe model "
            "(steptime.FRAMEWORK_PROBE), framework_selective the same with every block "
            "selectively checkpointed; "
            + ("inter = intra (one node measured)" if nodes == 1 else
               f"{nodes} nodes measured" + ("; intra = inter (one rank a node)" if local == 1 else "")))


def _write_doc(doc: dict, out: str, seconds: float, raw: dict, noisy: list) -> Path:
    """The profile document to `out`, atomically, under a header of the probes' seconds and any busy-machine
    warning."""
    import yaml

    from launcher.plan.profile import PROFILE_VERSION
    from launcher.runtime.durable import write_atomic

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    phases = "".join(f"\n#   {name}: {t:.0f} s" for name, t in raw.get("phase_seconds", {}).items())
    if noisy:
        phases += ("\n# The machine was busy while this was measured (calibrate again when it is quiet):"
                   + "".join(f"\n#   {line}" for line in noisy))
    write_atomic(path, f"# hardware profile, version {PROFILE_VERSION}: written by `launcher calibrate` in "
                       f"{seconds:.0f} s; read by cluster.profile=PATH{phases}\n"
                       + yaml.safe_dump(doc, sort_keys=False))
    return path


def _median_by_size(points) -> list:
    """[[size, median TFLOP/s over the shapes of that size], ...]"""
    sizes = sorted({x for x, _ in points})
    return [[x, statistics.median(r for y, r in points if y == x) / 1e12] for x in sizes]


# A fitted plateau more than this far above every rate measured is an extrapolation the sizes do not support
# (the curve still rising steeply at the largest size, or falling again there): the plateau is then the best
# rate measured, and only the half-rate size is fitted.
PLATEAU_BEYOND_MEASURED = 1.25


def fit_saturation(points) -> tuple[float, float]:
    """(plateau, half) of rate = P x / (x + half), fitted in relative error: least squares of log rate, half searched
    in [0, largest size measured] (golden section on log half), P in closed form (the mean log residual), or the
    best rate measured where the fit would put it past PLATEAU_BEYOND_MEASURED times that.

    The plan interpolates the measured table itself (launcher/plan/steptime.py gemm_rate); these two numbers
    summarise it. Fitted as 1/rate = 1/P + (half/P) / x instead, the smallest sizes dominated, and on one H200 the
    fit said bf16 GEMMs run at 802 TFLOP/s from size 0 (half 0) and fp32 attention at 1,462 TFLOP/s where 34 was
    the best measured (bench/gpu/results.md)."""
    import math

    pts = [(float(x), float(r)) for x, r in points if x > 0 and r > 0]
    best = max(r for _, r in pts)

    def fit(log_p):
        def plateau(h: float) -> float:
            return log_p if log_p is not None else sum(math.log(r) - math.log(x / (x + h)) for x, r in pts) / len(pts)

        def sse(h: float) -> float:
            lp = plateau(h)
            return sum((math.log(r) - lp - math.log(x / (x + h))) ** 2 for x, r in pts)

        hi = max(x for x, _ in pts)
        lo_t, hi_t = math.log(hi) - 40.0, math.log(hi)  # log half; e^-40 x the largest size is half 0 in effect
        g = (math.sqrt(5) - 1) / 2
        for _ in range(200):
            a, b = hi_t - g * (hi_t - lo_t), lo_t + g * (hi_t - lo_t)
            if sse(math.exp(a)) <= sse(math.exp(b)):
                hi_t = b
            else:
                lo_t = a
        half = math.exp((lo_t + hi_t) / 2)
        half = 0.0 if half < hi * 1e-12 else half
        return math.exp(plateau(half)), half

    plateau, half = fit(None)
    return (plateau, half) if plateau <= PLATEAU_BEYOND_MEASURED * best else fit(math.log(best))


def fit_alpha_beta(points, world: int, ring_factor: bool = True) -> tuple[float, float]:
    """(latency s, bus GB/s) of t = latency + 2 (r-1)/r B / bus (all-to-all, ring_factor False: (r-1)/r B / bus),
    least squares in B."""
    if world <= 1:
        return 0.0, 1e6
    factor = (2 if ring_factor else 1) * (world - 1) / world
    slope, intercept = _least_squares([factor * b for b, _ in points], [t for _, t in points])
    return max(0.0, intercept), (1.0 / slope / 1e9) if slope > 0 else 1e6


def _least_squares(xs, ys) -> tuple[float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return slope, my - slope * mx


# ---- the ranks: measure ----------------------------------------------------------------------------------------------

def _timer(device):
    import torch

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
    return sync


def _agreement(dist, dev):
    """`agree(done) -> bool` for _median_time around a collective: True on every rank once any rank is done (one
    all-reduce of a flag)."""
    import torch

    def agree(done: bool) -> bool:
        flag = torch.tensor([1.0 if done else 0.0], device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
    return agree


def _median_time(fn, sync, repeats: int, budget_s: float = 0.5, agree=None, center=statistics.median,
                 calls: int = 1, warm: bool = True) -> float:
    """Median seconds of `fn` over up to `repeats` runs, stopping early once `budget_s` is spent.
    `center=statistics.mean` for a cost that a step pays many times over (its sum is count x the mean).

    At least 3 runs, 2 where every run alone outlasts `budget_s`. `warm`: one untimed call first (False where the
    caller's previous probe ran the same kernel).

    `calls`: `fn` is called that many times back to back within one timed run, which counts as one run of its
    per-call mean. On a GPU a training step queues its kernels ahead of the device; one call between two
    synchronisations adds the host's launch, dispatch and synchronisation to every kernel instead. On an H100
    (bench/gpu/results.md, 2026-11-27, bench/gpu/sync_probe.py), one call per synchronisation against 20 back to
    back: a 64 MiB copy 2,091 against 2,739 GB/s, a bf16 GEMM on 16,384 x 1,024 tokens 414 against 645 TFLOP/s.

    `agree(done) -> bool` (for an `fn` that issues a collective): every rank must run `fn` the same number of times,
    or one rank leaves the loop while the others wait in the collective's next call (a deadlock seen in CI: rank 0
    in the next deepspeed.initialize's broadcast, rank 1 in the ZeRO-3 step's reduce-scatter). So the ranks stop
    together, when any rank's budget is spent: the decision is all-reduced after each run, outside the timed span."""
    if warm:
        fn()
        sync()
    times = []
    deadline = time.perf_counter() + budget_s
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls)
        # 3 runs, or 2 where one run alone outlasts the budget (a CPU rank's attention at 4,096 tokens: ~1-2 s a
        # call on an AVX2-only core in bf16): the profile takes the median of COMPUTE_ROUNDS sweeps besides.
        done = time.perf_counter() > deadline and len(times) >= (2 if 0 < budget_s < min(times) * calls else 3)
        if agree is not None:
            done = agree(done)
        if done:
            break
    return center(times)


def _start_rank(device: str):
    """A calibration rank's process group and device as a training rank has them: NCCL or gloo, its local GPU with
    TF32 matmuls (as inputs.py plans fp32), and on CPU the step's malloc settings (ZeRO-3's excepted,
    launcher/runtime/cpualloc.py). Returns the torch device."""
    import torch
    import torch.distributed as dist

    # The ZeRO-3 and engine probes call deepspeed.initialize, whose first call would JIT-compile DeepSpeed's
    # shared-memory comm op on CPU (~60 s of a 2-rank calibration on this 2-core box, once per venv path).
    avoid_shm_comm_build(device)
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.backends.cuda.matmul.allow_tf32 = True
    recycle_step_buffers(device, 0)
    return torch.device(device)


def _torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _worker(raw_path: str, device: str, grad_clip: str, scope: str = "all") -> None:
    import torch
    import torch.distributed as dist

    dev = _start_rank(device)
    backend, rank, world = dist.get_backend(), dist.get_rank(), dist.get_world_size()
    process_bytes, before_model = _process_bytes(dist, dev) if device == "cpu" else (None, None)
    # Both training dtypes every time (a profile serves any precision=...): fp32 (TF32 matmuls on GPUs, as
    # inputs.py plans them) and bf16.
    dtypes = tuple((name, _torch_dtype(name)) for name in ("fp32", "bf16"))
    sync, agree = _timer(device), _agreement(dist, dev)
    started = time.perf_counter()
    out: dict = {"world": world, "backend": backend, "torch": torch.__version__,
                 "cores": _cores(),
                 **this_node_type(device)}

    # The compute rates, the median of COMPUTE_ROUNDS sweeps: one sweep's 20-run medians (milliseconds each on CPU)
    # move 2x when another process lands on it (the fp32 GEMM rate at side 128 on this 2-core box: 0.097 TFLOP/s
    # one calibration, 0.049 the next, bench/steptime/results.md); the median of three drops one such sweep.
    phases = _Phases(rank)
    local, nodes = _node_shape(world)
    out["local_world"], out["nodes"], out["threads"] = local, nodes, torch.get_num_threads()
    node_group, rail_group = _node_groups(dist, world, local)
    unit = _segment_unit(dev, device, sync, dist) if world > 1 else None
    sweeps, collectives, stragglers, releases, zero3_rows, zero3_slopes = [], [], [], [], [], []
    # One node of CPU ranks over its cores (4 ranks on 2 cores): the waits again with only `slots` ranks busy.
    slots = compute_slots()
    unshared = device == "cpu" and nodes == 1 and local > slots >= 2 and local % slots == 0
    stragglers_unshared, releases_unshared = [], []
    # COMPUTE_ROUNDS rounds, each of every probe that a step's time is read from (compute, the collectives after
    # compute, the stragglers and the release, ZeRO-3's hooks), each item the median over the rounds: a disturbance
    # of a few seconds lands in one round's compute or one round's collectives, not in the figure. All but the
    # compute were timed once until 2026-12-01; then the all-to-all's fitted latency read 0.21-0.53 ms and the
    # all-reduce's 0.75-1.51 ms in five back-to-back timings on a quiet 2-rank box (bench/steptime/probe_rounds.py),
    # one busy reading of each moved SP2's plan 25%, and one ZeRO-3 reading recipe=tiny's ZeRO-3 plan 25%
    # (bench/steptime/results.md).
    network_only = scope == NETWORK     # the rest is cluster.profile's (network_base, write_profile)
    for k in range(1, COMPUTE_ROUNDS + 1):
        if not network_only:
            sweeps.append(_compute_sweep(dev, device, dtypes, sync, dist))
            phases.done("compute rates (GEMM, attention, memory, kernel overhead)", k)
        # As a training step meets them: right after compute on every rank. On one node, over every rank. On
        # several (`launcher submit --calibrate`), every group runs at once as in training: each node's ranks among
        # themselves (the intra-node link; Ulysses' all-to-all), then each local rank with its peers on the other
        # nodes (one GPU a node: the inter-node link as the plan charges it, one NIC a GPU), then all ranks
        # together across the nodes (whether the node's NICs add up for one group, which the plan does not assume:
        # launcher/plan/profile.py NcclTuning), kept in the measurements. Smaller groups inside a node (2, 4, ...
        # consecutive ranks, every group at once, as TP groups run): with more ranks than cores a node-wide
        # all-reduce waits for every rank to be scheduled, a pair for two.
        if k == 1:      # all-reduce over every rank, back to back: kept beside the fits' input, not fitted
            out["all_reduce"] = _bare_all_reduce(dev, sync, agree, dist)
        coll = _after_compute(dev, device, sync, agree, dist, node_group, all_to_all=True)
        coll["all_reduce_groups_after_compute"] = {
            str(size): _after_compute(dev, device, sync, agree, dist,
                                      _consecutive_group(dist, size))["all_reduce_after_compute"]
            for size in _sub_node_sizes(local)}
        if nodes > 1:
            for name, group in (("all_reduce_rail_after_compute", rail_group), ("all_reduce_world_after_compute", None)):
                coll[name] = _after_compute(dev, device, sync, agree, dist, group)["all_reduce_after_compute"]
        collectives.append(coll)
        phases.done("collectives", k)
        stragglers.append(_straggler(dev, device, sync, dist, unit))
        releases.append(_release(dev, device, sync, dist, [*_sub_node_sizes(local), local], unit)
                        if local > 1 else {})
        if unshared:    # the same with only the cores' ranks busy, as a pipeline's fill and drain leave them
            stragglers_unshared.append(_straggler(dev, device, sync, dist, unit, active=slots))
            releases_unshared.append(_release(dev, device, sync, dist, [g for g in _sub_node_sizes(local) if g <= slots],
                                              unit, active=slots))
        phases.done("stragglers and release", k)
        rows, slope = _zero3_hooks(dev, sync, agree, float(grad_clip))
        zero3_rows += rows
        zero3_slopes.append(slope)
        phases.done("ZeRO-3 hooks", k)
    if not network_only:
        out.update(_median_of(sweeps))
        out["sweep_spread"] = sweep_spread(sweeps)
        out["attention_head_dim"] = ATTN_HEAD_DIM[device]
    out.update(median_rows(collectives))
    out["straggler"], out["release"] = median_rows(stragglers), median_rows(releases)
    if unshared:
        out["straggler_unshared"], out["release_unshared"] = median_rows(stragglers_unshared), median_rows(releases_unshared)
    out["zero3"] = zero3_rows
    out |= zero3_split(zero3_slopes)
    out["probe_rounds"] = {"collectives": collectives, "straggler": stragglers, "release": releases,
                           "zero3": zero3_slopes}
    if unshared:
        out["probe_rounds"] |= {"straggler_unshared": stragglers_unshared, "release_unshared": releases_unshared}
    if not network_only:
        out["engine"], engine = _engine_per_element(dev, device, dtypes, sync, agree, float(grad_clip))
        out |= engine
        phases.done("DeepSpeed engine per element and tensor")
        out["framework"], out["framework_selective"] = _framework(dev, device, dtypes)
    out["host_memory_gb"] = _host_memory_gb()
    out["process_bytes"], out["process_bytes_before_model"] = process_bytes, before_model
    phases.done("host memory" if network_only else "framework / host issue time")
    out["scope"] = scope
    out["phase_seconds"] = phases.seconds
    out["seconds"] = time.perf_counter() - started
    if rank == 0:
        Path(raw_path).write_text(json.dumps(out))
    dist.barrier()
    leave_rank(0)


def _node_shape(world: int) -> tuple[int, int]:
    """(ranks a node, nodes): torchrun's LOCAL_WORLD_SIZE, the same on every node (one torchrun per node, each with
    --nproc_per_node = cluster.gpus_per_node)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return local, world // local


def _sub_node_sizes(local: int) -> list:
    """The group sizes below a node's rank count that calibrate measures apart: 2, 4, 8, ... dividing it."""
    return [g for g in (2, 4, 8, 16, 32) if g < local and local % g == 0]


_GROUPS: dict = {}     # (world, size) -> this rank's group: made once a process (_consecutive_group)


def _consecutive_group(dist, size: int):
    """This rank's group of `size` consecutive ranks (ranks // size); None (the default group) for the whole world.
    new_group is collective: every rank creates every group, in the same order. Made once per size and kept: every
    round of the probes asks again, and each new gloo group starts its own threads, never freed while the process
    runs (4 CPU ranks, 2026-12-06: a rank's threads grew 4 -> 16 over three rounds, bench/steptime/window_share.py),
    which then compete for the cores the later probes time."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if size >= world:
        return None
    if (world, size) not in _GROUPS:
        mine = None
        for first in range(0, world, size):
            g = dist.new_group(list(range(first, first + size)))
            mine = g if first <= rank < first + size else mine
        _GROUPS[world, size] = mine
    return _GROUPS[world, size]


def _node_groups(dist, world: int, local: int):
    """(this rank's node group, its rail group): a node's ranks are consecutive (torchrun numbers a node's ranks
    group_rank x local + local_rank), a rail is the same local rank on every node. One node: (None, None), the
    default group. new_group is collective: every rank creates every group, in the same order."""
    if local == world:
        return None, None
    rank = dist.get_rank()
    node, rail = _consecutive_group(dist, local), None
    for lr in range(local):
        g = dist.new_group(list(range(lr, world, local)))
        rail = g if rank % local == lr else rail
    return node, rail


def _bare_all_reduce(dev, sync, agree, dist) -> list:
    """[[bytes, seconds], ...]: all-reduce over every rank, back to back, the slowest rank's median."""
    import torch

    rows = []
    for nbytes in ALLREDUCE_BYTES:
        buf = torch.ones(nbytes // 4, device=dev, dtype=torch.float32)
        dist.barrier()
        t = _median_time(lambda: dist.all_reduce(buf), sync, 10, agree=agree)
        tt = torch.tensor([t], dtype=torch.float64, device=dev)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)   # the slowest rank's time is the collective's
        rows.append([nbytes, float(tt.item())])
    return rows


def _after_compute(dev, device: str, sync, agree, dist, group, all_to_all: bool = False, sequence: bool = False) -> dict:
    """{"all_reduce_after_compute": [[bytes, s], ...] (and "all_to_all_after_compute"; with `sequence`
    "all_gather_after_compute" and "reduce_scatter_after_compute")}: each collective over `group` right after ~1 ms
    of GEMMs on every rank, its cost the pair's mean time less the GEMMs' alone."""
    import torch

    chunk_a = torch.randn(256, 256, device=dev)
    chunk_b = torch.randn(256, 256, device=dev)

    def chunk():
        for _ in range(2 if device == "cpu" else 200):
            torch.mm(chunk_a, chunk_b)
    kinds = [("all_reduce_after_compute", lambda buf, res: lambda: dist.all_reduce(buf, group=group))]
    if all_to_all:
        kinds.append(("all_to_all_after_compute", lambda buf, res: lambda: dist.all_to_all_single(res, buf, group=group)))
    if sequence:
        # Megatron SP's all-gather and reduce-scatter by the runtime's own functions (list forms, the copies around
        # them) on a (2, s, 64) tensor split over s: measured by bench/steptime/probe_rounds.py, not by calibrate's
        # ranks. The plan prices both at (r-1)/r of the all-reduce's link; on gloo the reduce-scatter costs ~3x the
        # all-gather, yet charging each its own link moved TP2-SP's plan further from its measured steps
        # (bench/steptime/xeon-amx-2026-12-05c/README.md).
        from launcher.parallel.tensor import _gather_sequence, _reduce_scatter_sequence

        ranks = dist.get_world_size(group)
        kinds += [("all_gather_after_compute", lambda buf, res: (lambda x: lambda: _gather_sequence(x, group))(
                       buf.view(2, -1, 64).chunk(ranks, dim=1)[0].contiguous())),
                  ("reduce_scatter_after_compute", lambda buf, res: (lambda x: lambda: _reduce_scatter_sequence(
                      x, group))(buf.view(2, -1, 64)))]
    out: dict = {}
    for name, make in kinds:
        out[name] = []
        for nbytes in ALLREDUCE_BYTES:
            buf = torch.ones(nbytes // 4, device=dev, dtype=torch.float32)
            res = torch.empty_like(buf)
            coll = make(buf, res)
            # The mean, not the median: a step pays tens of these in a row, so its total is count x the mean, and
            # the wait for the other rank has a long tail (2 gloo ranks, 512 KiB all-reduce after 0.3-21 ms of
            # GEMMs: median 0.6-2.8 ms, mean 1.4-2.9 ms; TP2's in-step all-reduces cost ~2 ms each).
            dist.barrier()
            alone = _median_time(chunk, sync, 20, center=statistics.mean)
            pair = _median_time(lambda: (chunk(), coll()), sync, 20, agree=agree, center=statistics.mean)
            tt = torch.tensor([max(0.0, pair - alone)], dtype=torch.float64, device=dev)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)   # the slowest group's
            out[name].append([nbytes, float(tt.item())])
    return out


def _segment_unit(dev, device: str, sync, dist):
    """(unit, seconds): the block-like compute the straggler and release probes build their segments from (two
    GEMMs, SiLU and a residual add on fresh outputs), and its time on the slowest rank, so that every rank runs the
    same number of units."""
    import torch
    import torch.nn.functional as F

    tokens, h = (512, 128) if device == "cpu" else (8192, 1024)
    x = torch.randn(tokens, h, device=dev)
    w1, w2 = torch.randn(4 * h, h, device=dev), torch.randn(h, 4 * h, device=dev)

    def unit():
        return F.linear(F.silu(F.linear(x, w1)), w2) + x
    t = torch.tensor([_median_time(unit, sync, 20)], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return unit, float(t.item())


def probe_repeats(target_s: float) -> int:
    """Segments the straggler and release probes time at a target length in one round: STRAGGLER_BUDGET_S of
    them, 4 to 100."""
    return max(4, min(100, round(STRAGGLER_BUDGET_S / target_s)))


def median_rows(rounds: list) -> dict:
    """Per item the median over the rounds of a probe's tables ({name: [[x, y], ...]} or {name: {size: [[x, y],
    ...]}}, the same names, sizes and row count in every round): each row's x and y the medians of that row's."""
    def rows(tables):
        return [[statistics.median(r[i][0] for r in tables), statistics.median(r[i][1] for r in tables)]
                for i in range(len(tables[0]))]
    first = rounds[0]
    return {k: {g: rows([r[k][g] for r in rounds]) for g in v} if isinstance(v, dict) else rows([r[k] for r in rounds])
            for k, v in first.items()}


def _straggler(dev, device: str, sync, dist, unit, active: int | None = None) -> dict:
    """{group size: [[mean segment seconds, fraction], ...]}: the wait for the slowest rank at a synchronisation.

    Two CPU ranks here, each computing the same 150 ms of a step's work between two collectives, finish 12-24 ms
    apart (their own times alone vary by 13-38% from one segment to the next) while the gradient all-reduce itself,
    once both arrive, takes what calibrate's all-reduce does (bench/steptime/results.md). The step pays the
    slowest. So every rank runs the same segment of block-like compute, all starting once an all-reduce has
    released them, and stamps when it arrives at the next one (one clock: calibrate's ranks share a node, and
    perf_counter is the system-wide monotonic clock); the stamps are gathered, and for groups of g consecutive
    ranks (g = 2, 4, ... and the world; TP and sequence groups are consecutive in the rank order) the fraction is
    the mean over repeats and groups of (last arrival - mean arrival) / the mean segment. Arrivals, not segment
    durations: the all-reduce that released the ranks does not release them at once, and a step pays that skew too
    (2 CPU ranks here, 2026-11-27: 6.3% and 12.9% of a 3.3 ms segment by arrival where the durations alone give
    4.0% and 8.2%, the same at 20-160 ms; in a recipe=tiny SP2 step the ranks waited 0.52 ms at each of 64
    all-to-alls a step, ~10% of the ~5 ms between them, bench/steptime/results.md). The same repeat count on every
    rank (from the target length and the slowest rank's unit time), so none leaves the loop early. `unit`:
    _segment_unit's (unit, seconds). `active`: only ranks below it compute (the rest join each release and the
    gather idle), and only groups among them count: a pipeline's fill and drain on shared cores
    (profile.straggler_unshared)."""
    import torch

    world = dist.get_world_size()
    if world == 1:
        return {}           # one rank waits for nobody (a one-GPU calibrate)
    unit, unit_s = unit
    busy = active or world
    computes = dist.get_rank() < busy
    sizes = sorted({g for g in (2, 4, 8, 16, 32, 64) if g <= busy} | {busy})
    go = torch.zeros(1, device=dev)
    table: dict = {g: [] for g in sizes}
    for target in STRAGGLER_SEGMENTS_S[device]:
        units = max(1, round(target / unit_s))
        repeats = probe_repeats(target)
        times, arrivals = [], []
        for i in range(repeats + 1):        # the first is a warm-up
            dist.all_reduce(go)
            sync()
            t0 = time.perf_counter()
            for _ in range(units if computes else 0):
                unit()
            sync()
            t1 = time.perf_counter()
            if i:
                times.append(t1 - t0)
                arrivals.append(t1)
        mine = torch.tensor([times, arrivals], dtype=torch.float64, device=dev)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        durations, arrivals = zip(*torch.stack(every).cpu().tolist()[:busy])     # each [rank][repeat]
        for g in sizes:
            table[g].append(wait_fraction(durations, arrivals, g))
    return {str(g): rows for g, rows in table.items()}


def _release(dev, device: str, sync, dist, sizes: list, unit, active: int | None = None) -> dict:
    """{group size: [[mean segment seconds, seconds], ...]}: what a synchronisation costs after its group's last
    rank arrives, by the compute before it.

    The *_after_compute collectives follow ~1 ms of GEMMs; a step's follow 2-150 ms. On 2 CPU ranks here a 4 KiB
    all-reduce took 0.3-0.4 ms (median) once both ranks had arrived after 0.75 ms of compute and 0.6-1.6 ms after
    22 ms, means 1.1-1.7 and 1.5-2.3 ms: occasional 5-8 ms stalls, a scheduler quantum for the gloo thread, come
    more often after longer compute (2026-11-28, bench/steptime/results.md). So every group of `size` consecutive
    ranks (every group at once, as TP groups run) computes a block-like segment, stamps its arrival, all-reduces
    4 KiB within the group and stamps the exit; per segment length, the mean over repeats and groups of (mean exit
    - last arrival). The plan charges a synchronisation what this exceeds its link's fitted latency by. `unit`:
    _segment_unit's (unit, seconds). `active`: only the groups of ranks below it run (the rest wait at the gather
    idle): a pipeline's fill and drain on shared cores (profile.release_unshared)."""
    import torch

    world = dist.get_world_size()
    unit, unit_s = unit
    busy = active or world
    tiny = torch.zeros(1024, device=dev)
    table: dict = {}
    for size in sizes:
        mine = _consecutive_group(dist, size)
        table[str(size)] = []
        for target in STRAGGLER_SEGMENTS_S[device]:
            units = max(1, round(target / unit_s))
            repeats = probe_repeats(target)
            stamps = [[0.0, 0.0]] * (repeats + 1)
            dist.barrier()
            if dist.get_rank() < busy:
                stamps = []
                for i in range(repeats + 1):        # the first is a warm-up
                    for _ in range(units):
                        unit()
                    sync()
                    arrived = time.perf_counter()
                    dist.all_reduce(tiny, group=mine)
                    sync()
                    stamps.append([arrived, time.perf_counter()])
            every = [torch.zeros(repeats + 1, 2, dtype=torch.float64, device=dev) for _ in range(world)]
            dist.all_gather(every, torch.tensor(stamps, dtype=torch.float64, device=dev))
            table[str(size)].append(release_seconds(torch.stack(every).cpu().tolist()[:busy], size))
    return table


def pooled_release(rows: list, device: str) -> list:
    """The profile's release table for one group size from _release's rows ([mean segment seconds, seconds], one
    per STRAGGLER_SEGMENTS_S[device] target, in that order): every row given the same figure, the mean over all the
    group's timed synchronisations (each row weighted by the repeats _release runs at its target in a round: total
    cost over total count). Each row is the median over COMPUTE_ROUNDS rounds of a mean of 4-100 draws (before
    2026-12-01, one mean of 8-100) of a heavy-tailed time (a 0.3-0.9 ms median, stalls of 4-8
    ms), so the rows of one calibration differ mostly by chance: the pair's read 2.35, 1.53, 1.83, 0.97 ms at 5, 20,
    60, 150 ms in one and 1.28, 1.99, 1.88, 2.78 in the next. Read row by row, SP2's plan moved 195 -> 259 ms between
    two calibrations for steps of 216 ms both times. Pooled, the recorded bench/steptime runs read 45 of 48 within
    15% against 40 as interpolated (three runs before the pooling was tried), and 30 of 32 against 27 in the two runs
    after it (bench/steptime/release_variant.py, results.md). The raw rows stay in the profile's measurements."""
    weights = [probe_repeats(t) for t in STRAGGLER_SEGMENTS_S[device]][:len(rows)]
    mean = sum(c * w for (_, c), w in zip(rows, weights)) / sum(weights)
    return [[t, mean] for t, _ in rows]


def release_seconds(stamps: list, group: int) -> list:
    """[mean segment seconds, seconds] of _release from every rank's [arrival, exit] stamps ([rank][repeat][2], the
    first a warm-up): the segment is a rank's arrival less its previous exit, the cost the group's mean exit less
    its last arrival, each the mean over groups of `group` consecutive ranks and the repeats after the first."""
    ranks, repeats = len(stamps), len(stamps[0])
    groups = [range(k, k + group) for k in range(0, ranks // group * group, group)]
    segments = [stamps[r][i][0] - stamps[r][i - 1][1] for r in range(ranks) for i in range(1, repeats)]
    costs = [sum(stamps[r][i][1] for r in grp) / group - max(stamps[r][i][0] for r in grp)
             for grp in groups for i in range(1, repeats)]
    return [sum(segments) / len(segments), sum(costs) / len(costs)]


def wait_fraction(durations: list, arrivals: list, group: int) -> list:
    """[mean segment seconds, fraction] of _straggler from every rank's segment durations and arrival stamps
    ([rank][repeat]): over groups of `group` consecutive ranks and the repeats, the mean of (last arrival - mean
    arrival), over the mean segment."""
    ranks, repeats = len(arrivals), len(arrivals[0])
    mean = sum(map(sum, durations)) / (ranks * repeats)
    groups = [range(k, k + group) for k in range(0, ranks // group * group, group)]
    waits = [max(arrivals[r][i] for r in grp) - sum(arrivals[r][i] for r in grp) / group
             for grp in groups for i in range(repeats)]
    return [mean, sum(waits) / len(waits) / mean]


def _compute_sweep(dev, device, dtypes, sync, dist) -> dict:
    """One sweep of the compute microbenchmarks: GEMM and attention rates, memory bandwidth, per-operator overhead."""
    import torch

    out: dict = {}
    # Calls queued between two synchronisations (_median_time): on CPU ranks every call is synchronous anyway.
    queued = 1 if device == "cpu" else 20
    out["gemm"], out["attention"] = {}, {}
    for dname, tdtype in dtypes:
        out["gemm"][dname] = _gemm_rates(dev, device, tdtype, GEMM_SIDES if device == "cpu" else GEMM_SIDES_GPU,
                                         sync, dist, queued)

        # Causal SDPA forward + backward, counted in causal FLOPs (launcher/plan/steptime.py attention_fwd_flops).
        # On a GPU 4 sequences (16,384 tokens a call past 4,096): one has too few (heads x query tiles) blocks for
        # 132 SMs at the shorter lengths (H100, s 2,048, back to back: 215 TFLOP/s at batch 1, 317 at batch 4,
        # sync_probe.py).
        # Then the same at the other head dimensions (ATTN_EXTRA_HEAD_DIMS; the heads x head dim kept, as
        # FlashAttention-2's benchmark keeps its 2,048 hidden), bf16 only on a GPU.
        long = ATTN_SEQS_GPU_LONG if device != "cpu" and tdtype != torch.float32 else ()
        seqs = ATTN_SEQS_CPU if device == "cpu" else ATTN_SEQS_GPU + long
        main = ATTN_HEAD_DIM[device]
        out["attention"][dname] = _attention_rates(dev, tdtype, main, seqs, device, sync, dist, queued)
        for hd in ATTN_EXTRA_HEAD_DIMS[device] if device == "cpu" or tdtype != torch.float32 else ():
            out.setdefault("attention_hd", {}).setdefault(hd, {})[dname] = _attention_rates(
                dev, tdtype, hd, seqs, device, sync, dist, queued)

    out["memory_gbps"] = _copy_gbps(dev, device, sync, dist, queued)

    # Per-operator overhead: 100 tiny ops forward and their 100 backward nodes.
    dist.barrier()
    host_per_op = _median_time(tiny_op_chain(dev, 100), sync, 10) / 200
    if device == "cpu":
        out["kernel_overhead_s"] = host_per_op
        return out
    # On a GPU the host's cost per operator (H100: 15.5 us) runs ahead of the kernels a step has queued (the ~1B
    # LLaMA's micro-batch: 2,457 kernels, GPU busy 138 of 142 ms wall, sync_probe.py), so what each kernel adds to
    # the step is the device's own gap between kernels: the same 200 tiny kernels replayed from a CUDA graph (no host
    # work; H100: 1.0 us). The host's figure is kept beside it (kernel_host_s in the raw measurements).
    out["kernel_host_s"] = host_per_op
    out["kernel_overhead_s"] = _median_time(tiny_kernel_graph(dev, 200).replay, sync, 10, calls=queued) / 200
    return out


def _gemm_rates(dev, device: str, tdtype, sides, sync, dist, queued: int) -> list:
    """[[side, FLOP/s], ...]: the three GEMMs of a Linear(side, side) at each side, forward, input gradient and
    weight gradient, on GEMM_TOKENS[device] tokens."""
    import torch
    import torch.nn.functional as F

    # Every rank at once (a barrier before each shape), as the ranks of a training step share the node, and
    # as autograd issues them for a Linear(d, d) on `tokens` tokens: the forward X W^T (F.linear), the input
    # gradient dY W and the weight gradient dY^T X, transposed operands as views. The operands rotate through a
    # pool of GEMM_POOL_BYTES, so each GEMM reads them from beyond the core's cache, as a step does (a layer's
    # backward meets its inputs after the rest of the model has passed through the cache). Against one hot
    # contiguous torch.mm, 2 CPU ranks here: 4-27% slower by side (side 128, fp32: 0.096 -> 0.082 TFLOP/s), and the
    # plain model's forward + backward + AdamW is then 0.92-1.19x its plan, about calibrate's own spread from one
    # minute to the next (bench/steptime/results.md).
    tokens = GEMM_TOKENS[device]
    shared = shares_cores(device)
    rows = []
    for d in sides:
        set_bytes = (2 * tokens * d + d * d) * torch.finfo(tdtype).bits // 8
        pool = [(torch.randn(tokens, d, device=dev, dtype=tdtype), torch.randn(d, d, device=dev, dtype=tdtype),
                 torch.randn(tokens, d, device=dev, dtype=tdtype))
                for _ in range(max(2, min(16, -(-GEMM_POOL_BYTES // set_bytes))))]
        turn = itertools.count()
        for gemm in (lambda x, w, g: F.linear(x, w),        # forward
                     lambda x, w, g: torch.mm(g, w),         # input gradient
                     lambda x, w, g: torch.mm(g.t(), x)):    # weight gradient
            dist.barrier()
            call = lambda: gemm(*pool[next(turn) % len(pool)])    # noqa: E731
            t = _window_s(call, dist) if shared else _median_time(call, sync, 20, calls=queued)
            rows.append([d, 2.0 * tokens * d * d / t])
    return rows


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def compute_slots() -> int:
    """A node's compute slots for CPU ranks: its cores over the torch threads a rank runs (profile.compute_slots)."""
    import torch

    return max(1, _cores() // torch.get_num_threads())


def shares_cores(device: str) -> bool:
    """Whether this node runs more CPU ranks than it has compute slots (torchrun's LOCAL_WORLD_SIZE over
    compute_slots): then a rank's share of a core is what a probe must time (_window_s)."""
    return device == "cpu" and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > compute_slots()


def _window_s(fn, dist, window_s: float = SHARED_WINDOW_S, warm: bool = True) -> float:
    """Seconds a call of `fn` takes while every rank calls its own back to back for `window_s`: the inverse of the
    ranks' mean rate (calls a second), i.e. the node's calls a second shared out evenly (_shared_copy_s times the
    copy so, over COPY_WINDOW_S). With more ranks than cores the median of single calls reads a rank's speed alone: a
    call of a few ms mostly runs between the scheduler's switches, and the median picks those. 4 ranks on this 2-core
    VM read fp32 GEMMs of sides 32-128 at 0.77-1.38x what 2 ranks read in all 13 recorded passes with both;
    profile.alone_rates then doubled them, and TP2 x PP2's compute planned 59 ms against 104-108 spent
    (bench/steptime/results.md, 2026-12-05).

    The mean, not the slowest rank: over a window the scheduler does not split 2 cores evenly between 4 ranks. In
    twelve 0.25 s copy windows (2026-12-06, bench/steptime/results.md) the ranks' CPU shares summed to 1.97-2.08
    cores but one rank got 0.14-0.84 of a core, and each rank's copy rate followed its share (12.9-16.2 GB/s a
    CPU-second): the slowest rank read 2.0-6.7 GB/s, the ranks' mean 6.7-7.5. A training step's collectives make
    the ranks that ran ahead wait, handing the cores to the one behind; that wait is the straggler term's
    (_straggler), measured at synchronisations, so the rates are the even share. `warm`: one call first, outside
    the window."""
    if warm:
        fn()
    t0, n = time.perf_counter(), 0
    while True:
        fn()
        n += 1
        t = time.perf_counter() - t0
        if t >= window_s:
            break
    import torch

    rate = torch.tensor([n / t], dtype=torch.float64)
    dist.all_reduce(rate, op=dist.ReduceOp.SUM)
    return dist.get_world_size() / float(rate.item())


def _copy_gbps(dev, device: str, sync, dist, queued: int) -> float:
    """GB/s of a copy (it reads and writes its size), every rank at once on CPU ranks."""
    import torch

    # Memory bandwidth: a copy reads and writes its size each; 64 MiB on CPU ranks, 256 MiB on a GPU (a 1B model's
    # element-wise operands are 32-88 MiB; queued, an H100 copies 64 MiB at 2,739 GB/s, 256 MiB at 2,942, 1 GiB at
    # 2,976; silu(a) * b on [4, 2048, 5632] bf16 moves 2,871: sync_probe.py).
    # CPU ranks share the node's memory bus, so every rank copies at once for a window (_shared_copy_s); each
    # rank's median of 10 separate copies (~6 ms each) was what rank 0 met whether or not the others were copying
    # at that moment: 4 ranks on 2 cores read 9.6-36 GB/s by sweep where the window reads 10.0-10.5.
    n = ((64 if device == "cpu" else 256) << 20) // 4
    src = torch.ones(n, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    # The first write to dst faults its pages in (64 MiB is above the step's 32 MiB mmap threshold, so it is mapped
    # fresh): on a VM whose guest pages are not yet backed by the host that cost ~25 us a page, and 4 ranks on this
    # 2-core VM read the copy at 0.32-0.50 GB/s in both calibrations of a bench run where plain processes copied at
    # 12.6-13.2 (2026-11-29, bench/steptime/results.md). A step's buffers are reused from the heap, not faulted
    # in each time (launcher/runtime/cpualloc.py), so the window times copies into touched pages only.
    dst.copy_(src)
    dist.barrier()
    t = _shared_copy_s(dst, src, dist) if device == "cpu" else _median_time(lambda: dst.copy_(src), sync, 10, calls=queued)
    return 2 * n * 4 / t / 1e9


def rates_now(device: str, dtype: str, side: int, dev) -> dict:
    """This machine's GEMM rate at one side (the median of the forward, input- and weight-gradient GEMMs of a
    Linear(side, side), as _compute_sweep times them) and its copy bandwidth, measured now on every rank at once:
    a collective, every rank calls it. `launcher train` sets them beside its profile's when a run lands off its plan
    (launcher/runtime/metrics.py check_rates). COMPUTE_ROUNDS rounds of the GEMM probe and the copy window, each the
    median of its rounds, as calibrate takes its sweeps: with one reading of each, after every layout of
    bench/steptime/rate_check.py, 20 of 24 runs' plans at the rates read were within 15% of their steps, and two of
    the others were one reading off (a 4-rank copy at 0.08 of its profile where the other 4-rank run read 1.06, and
    PP2's GEMM at 0.43 where the other layouts read 0.63-0.74 of the same profile). 1-3.5 s on 2 CPU ranks."""
    import torch.distributed as dist

    tdtype = _torch_dtype(dtype)
    sync, queued = _timer(device), 1 if device == "cpu" else 20
    gemms, copies = [], []
    for _ in range(COMPUTE_ROUNDS):
        gemms.append(statistics.median(r for _, r in _gemm_rates(dev, device, tdtype, (side,), sync, dist, queued)))
        copies.append(_copy_gbps(dev, device, sync, dist, queued))
    return {"gemm_side": side, "gemm_tflops": statistics.median(gemms) / 1e12, "memory_gbps": statistics.median(copies)}


def _attention_rates(dev, tdtype, hd: int, seqs, device: str, sync, dist, queued: int) -> list:
    """[[seq, causal FLOP/s forward + backward], ...] of torch SDPA at head dimension `hd`, _attention_heads heads
    (ATTN_WIDTH[device] / hd, fewer on CPU ranks at long sequences); on a GPU 4 sequences a call (16,384 tokens past
    4,096)."""
    import torch
    import torch.nn.functional as F

    batch = 1 if device == "cpu" else 4
    shared = shares_cores(device)
    rows = []
    for s in seqs:
        b, heads = min(batch, max(1, 4 * 4096 // s)), _attention_heads(device, hd, s)
        q, k, v = (torch.randn(b, heads, s, hd, device=dev, dtype=tdtype, requires_grad=True) for _ in range(3))
        g = torch.randn(b, heads, s, hd, device=dev, dtype=tdtype)

        def step():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
        dist.barrier()
        # Past ATTN_CPU_FULL_WIDTH_SEQ on CPU ranks the previous length's calls have warmed the kernel: a call's
        # first time there is within 8% of its next ones (EPYC, 2026-12-08), and at 1-2 s a call it costs a third of
        # the probe.
        warm = device != "cpu" or s <= ATTN_CPU_FULL_WIDTH_SEQ
        t = _window_s(step, dist, warm=warm) if shared else _median_time(step, sync, 10, calls=queued, warm=warm)
        rows.append([s, b * 4.0 * s * s * heads * hd / 2 * 3.5 / t])
    return rows


def _attention_heads(device: str, hd: int, seq: int) -> int:
    """Heads in one attention probe call: ATTN_WIDTH / hd, and on CPU ranks past ATTN_CPU_FULL_WIDTH_SEQ tokens only
    as many as keep the call's work at the full width's at that length (one at least)."""
    heads = ATTN_WIDTH[device] // hd
    if device != "cpu" or seq <= ATTN_CPU_FULL_WIDTH_SEQ:
        return heads
    return max(1, heads * ATTN_CPU_FULL_WIDTH_SEQ ** 2 // seq ** 2)


def _shared_copy_s(dst, src, dist) -> float:
    """Seconds a 64 MiB copy takes while every rank copies too, as a step's ranks run their element-wise work at
    once: from the caller's barrier each rank copies for COPY_WINDOW_S (~40 copies here; the barrier's skew of a
    few ms is a small part of it), and the ranks' mean rate counts (_window_s). With more ranks than cores a rank's
    time includes its wait for a core, the share profile.alone_rates takes back out: 4 ranks on this 2-core VM read
    7.5-12.2 GB/s in ten calibrations, x 4 / 2 = 15-24 alone, where 2 ranks read 16.1-22.0 in most (and 30.0 and
    34.3 once each, the VM's own drift: in the 34.3 one the per-rank timing read 35.5-37.5 too) (2026-11-28,
    bench/steptime/results.md). The caller has touched dst's pages (_copy_gbps)."""
    return _window_s(lambda: dst.copy_(src), dist, COPY_WINDOW_S, warm=False)


def tiny_op_chain(dev, ops: int):
    """`ops` tiny autograd multiplications and their backward: what the host spends per operator (dispatch,
    autograd), the arithmetic being nil (also bench/gpu/sync_probe.py)."""
    import torch

    x = torch.ones(8, device=dev, requires_grad=True)

    def chain():
        y = x
        for _ in range(ops):
            y = y * 1.0001
        y.sum().backward()
    return chain


def tiny_kernel_graph(dev, kernels: int):
    """A CUDA graph of `kernels` tiny element-wise kernels: its replay costs the device's own gap between kernels,
    with no host work in it (also bench/gpu/sync_probe.py, which imports only this module's standard library)."""
    import torch

    z = torch.ones(8, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):       # warm up off the default stream, as CUDA graph capture requires
        for _ in range(3):
            z.mul_(1.0001)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            z.mul_(1.0001)
    graph.keep = z          # the graph's operand lives as long as the graph
    return graph


def sweep_spread(sweeps: list) -> dict:
    """Each compute sweep's headline figures side by side, kept in the profile's measurements: the copy bandwidth,
    the per-operator overhead, and per dtype the GEMM rate at the largest side (the most compute-bound shape).
    {name: [one value per sweep]}."""
    out = {"memory_gbps": [x["memory_gbps"] for x in sweeps],
           "kernel_overhead_s": [x["kernel_overhead_s"] for x in sweeps]}
    for d in sweeps[0]["gemm"]:   # rows [side, FLOP/s]: the forward, input- and weight-gradient GEMMs of each side
        side = max(row[0] for row in sweeps[0]["gemm"][d])
        out[f"gemm_{d}_side_{side}"] = [statistics.median(r for sd, r in x["gemm"][d] if sd == side) for x in sweeps]
    return out


def busy_warnings(raw: dict) -> list[str]:
    """What calibrate says (on stderr; under SLURM in the job's log) for each figure noisy_sweeps names."""
    return [f"warning: the machine was busy while it was measured: {line}. Predictions from this profile move with "
            f"it; calibrate again when the machine is quiet" for line in noisy_sweeps(raw.get("sweep_spread", {}))]


def _median_of(sweeps: list) -> dict:
    """Per item the median over the sweeps: the rate (gemm, attention [size, FLOP/s] rows; memory_gbps) and
    kernel_overhead_s a step meets. Not the best: a step is hundreds of kernels and pays the machine's usual
    interruptions, so its kernels run at the usual rate (with the best sweep's rates the tiny recipe's planned
    steps were 0.55-0.78x of the measured ones on an otherwise idle machine, bench/steptime/results.md)."""
    med = statistics.median
    out = {"kernel_overhead_s": med(x["kernel_overhead_s"] for x in sweeps),
           "memory_gbps": med(x["memory_gbps"] for x in sweeps)}
    if "kernel_host_s" in sweeps[0]:    # GPU: the host's cost per operator, kept beside the device's gap
        out["kernel_host_s"] = med(x["kernel_host_s"] for x in sweeps)
    def rows_median(pick):
        return {d: [[row[0], med(pick(x)[d][i][1] for x in sweeps)] for i, row in enumerate(rows)]
                for d, rows in pick(sweeps[0]).items()}
    for key in ("gemm", "attention"):
        out[key] = rows_median(lambda x: x[key])
    out["attention_hd"] = {hd: rows_median(lambda x: x["attention_hd"][hd]) for hd in sweeps[0].get("attention_hd", {})}
    return out


# Micro-batches a step of the engine probes' second run (ZeRO-3 hooks, engine per element): against one a step, what
# every micro-batch pays comes apart from what the step pays once (its boundary: the optimizer step and what follows).
SPLIT_MICRO_BATCHES = 3


def split_by_micro_batches(one: float, many: float) -> tuple[float, float]:
    """(per micro-batch, once a step) from a probe's cost at 1 and at SPLIT_MICRO_BATCHES micro-batches a step: the
    difference over the added micro-batches, and what is left of the first; both clipped at 0 (differences of
    medians)."""
    micro = max(0.0, (many - one) / (SPLIT_MICRO_BATCHES - 1))
    return micro, max(0.0, one - micro)


def _zero3_hooks(dev, sync, agree, grad_clip: float, mpu=None) -> tuple[list, dict]:
    """(rows, {"linear/1": seconds, ...}: the cost per unit of each unit kind at 1 and SPLIT_MICRO_BATCHES
    micro-batches a step, which zero3_split turns into zero3_module_s, zero3_param_s, zero3_module_step_s,
    zero3_param_step_s) of DeepSpeed ZeRO-3's engine work beyond a plain model, forward + backward (and an SGD step,
    on both sides): a ZeRO-3 engine over K small bias-free Linear layers (under the persistence threshold, so nothing is fetched: the hooks and the
    partitioned step alone) less the same layers plain, at K = 8 and 40, the difference of the differences over
    32 (the constant costs cancel); then the same with each Linear inside a parameter-less wrapper module. A Linear
    unit is 1 module + 1 parameter, a wrapped one 2 modules + 1 parameter: per module = wrapped - linear, per
    parameter = linear - per module. Measured apart because the cost follows the parameters more than the modules
    (2 CPU ranks: Linear with a bias 2.4 ms, without 1.1 ms, each parameter-less wrapper +0.3 ms), and a model's
    modules and parameter tensors differ in number. Each at 1 and SPLIT_MICRO_BATCHES micro-batches a step, split by
    split_by_micro_batches. On 2 CPU ranks
    the parameter's ~1.16 ms split ~0.11 a micro-batch and ~1.05 a step (bench/steptime/results.md); charged all
    per micro-batch, recipe=tiny at ZeRO-3 and micro-batch 1 (8 a step) was planned at 1.9x its measured step.
    Then, at one micro-batch a step, the wrapper's Linear under torch's non-reentrant checkpoint (the plain side
    checkpoints too, so the recompute's arithmetic cancels): over the wrapped unit, what the recompute's hooks cost
    a parameter (zero3_split: zero3_recompute_param_s). On 2 CPU ranks, 2026-12-06, the probe alone and three
    calibrations, three rounds each: 0.32 / 0.15 / 0.88, 0.29 / -0.06 / 0.87, -0.08 / -0.04 / 0.13 and 0.50 / 0.16 /
    1.04 ms a unit (medians 0.32, 0.29, 0, 0.50): noise as large as the figure.

    Over every rank, not each rank alone (`mpu`, _AloneGroups, is for bench/steptime/zero3_rounds.py): alone, the
    same units cost 3-4x less (2 CPU ranks, 2026-12-01: a Linear at 1 micro-batch 0.23-0.33 ms against 0.82-1.41),
    and the difference is one all-gather a parameter tensor a step: after the optimizer step DeepSpeed 0.19.8 gathers
    each persistent (below-threshold) parameter back whole, one all_gather_into_tensor each (40 a step for 40 units,
    counted on 2 ranks), where the gradients go in one bucketed reduce-scatter. The plan's synchronisation count
    (steptime._syncs_per_micro_batch) does not count those gathers apart, so this figure carries them."""
    import logging

    from torch import nn
    from torch.utils.checkpoint import checkpoint

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)

    class Wrap(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    class Recompute(Wrap):
        """Wrap with its Linear under torch's non-reentrant checkpoint, as transformers checkpoints a block: the
        backward runs the Linear's forward again, and with it ZeRO-3's forward hooks (fetch, trace, release)."""

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    units = {"linear": lambda: nn.Linear(32, 32, bias=False), "wrapped": lambda: Wrap(nn.Linear(32, 32, bias=False)),
             "recompute": lambda: Recompute(nn.Linear(32, 32, bias=False))}
    rows, slope = [], {}
    m = SPLIT_MICRO_BATCHES
    for kind, unit in units.items():
        # the recompute unit against the wrapped one at one micro-batch: the step's part is the same in both
        for micro_batches in ((1,) if kind == "recompute" else (1, m)):
            measured, slope[f"{kind}/{micro_batches}"] = engine_cost_per_unit(unit, 32, dev, sync, agree, mpu=mpu,
                                                                            grad_clip=grad_clip,
                                                                            micro_batches=micro_batches)
            rows += [[kind, micro_batches, *row] for row in measured]
    return rows, slope


def zero3_split(rounds: list) -> dict:
    """{zero3_module_s, zero3_param_s, zero3_module_step_s, zero3_param_step_s, zero3_recompute_param_s} from
    _zero3_hooks' costs per unit ({"linear/1": s, "linear/3": s, "wrapped/1": s, "wrapped/3": s, "recompute/1": s}),
    one dict a round: each cost the median of its rounds', then split by micro-batches and by unit kind (the
    recompute's figure below is paired by round instead). The first four figures are differences of differences of
    medians; from one timing they moved the plan of recipe=tiny as ZeRO-3 at micro-batch 2 by 25% between two
    calibrations minutes apart (engine 176 against 97 ms a step, bench/steptime/results.md, 2026-12-01)."""
    m = SPLIT_MICRO_BATCHES
    slope = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    split = {kind: split_by_micro_batches(slope[f"{kind}/1"], slope[f"{kind}/{m}"]) for kind in ("linear", "wrapped")}
    out = {}
    for part, suffix in enumerate(("_s", "_step_s")):      # (per micro-batch, once a step)
        out["zero3_module" + suffix] = module = max(0.0, split["wrapped"][part] - split["linear"][part])
        out["zero3_param" + suffix] = max(0.0, split["linear"][part] - module)
    # The recompute's hooks: what a checkpointed Linear (one module, one parameter) costs over the same Linear
    # wrapped alike, at one micro-batch a step (its forward hooks run again inside the backward). The median of
    # each round's difference, not the difference of the medians: the two run minutes apart in the same round, and
    # the paired difference is the steadier (2 CPU ranks, 2026-12-06, three rounds: 0.29 / -0.06 / 0.87 ms, median
    # 0.29; the medians' difference 0.73). Clipped at 0; 0 where the rounds lack it (a profile from before).
    paired = [r["recompute/1"] - r["wrapped/1"] for r in rounds if "recompute/1" in r]
    out["zero3_recompute_param_s"] = max(0.0, statistics.median(paired)) if paired else 0.0
    return out


def engine_cost_per_unit(unit, width: int, dev, sync, agree=None, budget_s: float = 0.5, stage: int = 3,
                         dtype=None, mpu=None, *, grad_clip: float, micro_batches: int = 1) -> tuple[list, float]:
    """([[K, engine step s, plain step s], ...], seconds per unit and step) of a DeepSpeed engine at ZeRO `stage` over
    K units `unit()` (each taking and giving `width` features) less the same units plain, each `micro_batches`
    forwards + backwards of 4 samples and one SGD step, at K = 8 and 40: the difference of the differences over 32,
    so the constant costs cancel. `dtype` torch.bfloat16 runs the engine with bf16 on (its fp32 master weights) and
    the plain units in bf16; `mpu` (_AloneGroups) makes each rank its own data-parallel group; `grad_clip`, the
    run's optimizer.grad_clip, is always written (DeepSpeed clips at 1.0 where the key is absent, and the clipping
    norm is a pass per parameter tensor the run pays). Run by _zero3_hooks, _engine_per_element and
    bench/steptime/zero3_fetch.py."""
    import deepspeed
    import torch
    from torch import nn

    from launcher.deepspeed_config import zero_optimization_base

    dtype = dtype or torch.float32
    rows, extra = [], []
    for k in (8, 40):
        torch.manual_seed(0)
        plain = nn.Sequential(*[unit() for _ in range(k)]).to(dev, dtype)
        opt = torch.optim.SGD(plain.parameters(), lr=1e-3)
        x = torch.randn(4, width, device=dev, dtype=dtype)

        def step():
            for _ in range(micro_batches):
                plain(x).float().sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        t_plain = _median_time(step, sync, 20, budget_s)
        model = nn.Sequential(*[unit() for _ in range(k)])
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3), mpu=mpu, config={
            "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": micro_batches,
            "gradient_clipping": grad_clip,
            "bf16": {"enabled": dtype == torch.bfloat16}, "zero_optimization": zero_optimization_base(stage, torch.device(dev).type),
            "zero_allow_untested_optimizer": True})

        def run():
            for _ in range(micro_batches):       # engine.step() applies the optimizer at the last one only
                engine.backward(engine(x).float().sum())
                engine.step()
        t_engine = _median_time(run, sync, 20, budget_s, agree=agree)   # the ranks stop together (collectives)
        rows.append([k, t_engine, t_plain])
        extra.append(t_engine - t_plain)
        engine.destroy()
    return rows, (extra[1] - extra[0]) / 32


class _AloneGroups:
    """The `mpu` deepspeed.initialize takes, making this rank alone in its data-parallel and model-parallel groups:
    the engine then reduces, partitions and gathers over one rank, so what it costs is its own work without any
    collective's traffic or wait (the plan charges those apart, from the measured links), while every local rank
    runs one at once and they share the node as in training."""

    def __init__(self, group, rank: int):
        self._group, self._rank = group, rank

    def get_data_parallel_group(self):
        return self._group

    get_model_parallel_group = get_tensor_model_parallel_group = get_data_parallel_group

    def get_data_parallel_group_ranks(self):
        return [self._rank]

    def get_tensor_model_parallel_src_rank(self):
        return self._rank

    def get_data_parallel_rank(self):
        return 0

    get_model_parallel_rank = get_tensor_model_parallel_rank = get_data_parallel_rank

    def get_data_parallel_world_size(self):
        return 1

    get_model_parallel_world_size = get_tensor_model_parallel_world_size = get_data_parallel_world_size
    get_pipeline_model_parallel_world_size = get_data_parallel_world_size


# The sides of the Linear(d, d) units of the engine-cost probe: a small one (per-unit costs only) and a large one,
# above ZeRO-3's persistence threshold (1e5 elements, launcher/plan/memory.py) so that stage 3 gathers it; on a GPU
# large enough that the per-element work shows above the per-module launch costs (40 x 4.2M elements: 168M
# parameters, ~3 GB with fp32 gradients and master weights).
ENGINE_UNIT_SIDES = {"cpu": (32, 384), "cuda": (32, 2048)}


def _engine_per_element(dev, device: str, dtypes, sync, agree, grad_clip: float) -> tuple[list, dict]:
    """(rows, {engine_element_s, engine_tensor_s, engine_element_micro_s, engine_tensor_micro_s}: {dtype: [seconds per
    parameter element (tensor) at ZeRO stage 0, 1, 2, 3]}): engine_cost_per_unit per stage and dtype on Linear(d, d)
    units (one weight tensor each) at a small and a large d, each rank alone in its groups, at 1 and
    SPLIT_MICRO_BATCHES micro-batches a step: what each micro-batch pays (the _micro_s figures) and the step's rest
    (split_by_micro_batches). Per element: (large unit's cost - small unit's) / (large d^2 -
    small d^2), so what a layer costs whatever its size (hooks, per-tensor Python) cancels. Per tensor: that
    size-free part, the small unit's cost less its d^2 elements at the per-element figure; at ZeRO-3 it is 0 here,
    since zero3_module_s / zero3_param_s charge it. All clipped at 0 (a difference of medians can come out below
    it). On a 2-core box, fp32: ZeRO-0 0.6-2, ZeRO-1/2 10-15, ZeRO-3 4-12 ns an element
    (bench/steptime/results.md); 0.09 (ZeRO-0), 0.26 (ZeRO-1), 0.19 (ZeRO-2) ms a tensor (14:36 profile)."""
    import importlib.util
    import logging

    import torch.distributed as dist
    from torch import nn

    if importlib.util.find_spec("deepspeed") is None:
        return [], {}, {}
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    rank = dist.get_rank()
    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]    # every rank creates every group
    mpu = _AloneGroups(groups[rank], rank)
    small, large = ENGINE_UNIT_SIDES[device]
    m = SPLIT_MICRO_BATCHES
    rows = []
    out: dict = {key: {} for key in ("engine_element_s", "engine_tensor_s", "engine_element_micro_s",
                                     "engine_tensor_micro_s")}
    for dname, tdtype in dtypes:
        for key in out:
            out[key][dname] = []
        for stage in range(4):
            per_unit = {}
            for d in (small, large):
                for micro_batches in (1, m):
                    measured, per_unit[d, micro_batches] = engine_cost_per_unit(
                        lambda: nn.Linear(d, d, bias=False), d, dev, sync, agree, stage=stage, dtype=tdtype, mpu=mpu,
                        grad_clip=grad_clip, micro_batches=micro_batches)
                    rows += [[dname, stage, d, micro_batches, *row] for row in measured]
            split = {d: split_by_micro_batches(per_unit[d, 1], per_unit[d, m]) for d in (small, large)}
            for part, suffix in enumerate(("_micro_s", "_s")):      # (per micro-batch, once a step)
                unit = {d: split[d][part] for d in (small, large)}
                element = max(0.0, unit[large] - unit[small]) / (large * large - small * small)
                out["engine_element" + suffix][dname].append(element)
                out["engine_tensor" + suffix][dname].append(
                    0.0 if stage == 3 else max(0.0, unit[small] - small * small * element))
    return rows, out


# The architectures whose transformers code paths the framework probe measures (mistral and qwen2 run llama's:
# launcher/config/supported.py LLAMA_FAMILY, which profile.framework maps to llama).
FRAMEWORK_ARCHS = ("llama", "gpt", "bloom")
FRAMEWORK_ROUNDS = 30


def _framework(dev, device: str, dtypes) -> tuple[dict, dict]:
    """({arch: {dtype: {blocks: [forward s, backward s]}}}, the same with selective checkpointing): one micro-batch through the runtime's own model (launcher/
    runtime/model.py build_model) at steptime.FRAMEWORK_PROBE's near-zero shape, with its two block counts, forward
    (the loss) and backward timed apart, medians of FRAMEWORK_ROUNDS rounds that alternate the two models (so that
    the machine's drift falls on both alike). No collective: every rank runs its own, all at once, as in training.
    On a GPU the same probe times what the host takes to issue a micro-batch (its kernels are tiny and queued; the
    device is synchronised after each round, outside the timed spans). That is not added to the kernels: the host
    runs ahead of them. It bounds a micro-batch from below instead, and where the device's work is shorter the
    step is host-bound: the ~1B LLaMA on one H100 at micro-batch 2 took 94 ms a micro-batch where its kernels need
    ~70 (bench/gpu/results.md, 2026-11-27). write_profile keeps it as host_s, the plan's floor under a micro-batch's
    kernels (launcher/plan/steptime.py Cost.host).
    The same models with every block selectively checkpointed (model.checkpoint_mode=selective: torch's dispatch
    mode over every operator, the recompute's module Python) run in the same rounds: the second dict, from which
    write_profile takes what such a block adds (profile.selective_framework_s / selective_host_s)."""
    import torch

    from launcher.config.compose import compose
    from launcher.plan.steptime import FRAMEWORK_PROBE as P
    from launcher.runtime.recompute import checkpoint_kwargs

    base = compose(["model=tiny"]).model
    out: dict = {}
    selective: dict = {}
    for arch in FRAMEWORK_ARCHS:
        out[arch], selective[arch] = {}, {}
        for dname, tdtype in dtypes:
            models = {}
            for mode in ("none", "selective"):
                for layers in P["layers"]:
                    model = _probe_model(base, arch, layers).to(dev, tdtype)
                    if mode == "selective":
                        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs(mode))
                    model.train()
                    models[mode, layers] = model
            x = torch.randint(0, P["vocab_size"], (1, P["seq_length"]), device=dev)
            times: dict = {key: ([], []) for key in models}
            for rnd in range(FRAMEWORK_ROUNDS + 2):
                for key, model in (models.items() if rnd % 2 else reversed(models.items())):
                    t0 = time.perf_counter()
                    loss = model(input_ids=x, labels=x).loss
                    t1 = time.perf_counter()
                    loss.backward()
                    t2 = time.perf_counter()
                    model.zero_grad(set_to_none=True)
                    if device != "cpu":
                        torch.cuda.synchronize()    # the next round starts on an idle device
                    if rnd >= 2:     # the first two rounds warm up
                        times[key][0].append(t1 - t0)
                        times[key][1].append(t2 - t1)
            for mode, table in (("none", out), ("selective", selective)):
                table[arch][dname] = {layers: [statistics.median(times[mode, layers][0]),
                                               statistics.median(times[mode, layers][1])] for layers in P["layers"]}
    return out, selective


def _probe_model(base, arch: str, layers: int):
    """The runtime's own model (launcher/runtime/model.py build_model) of `arch` at steptime.FRAMEWORK_PROBE's
    near-zero shape with `layers` blocks, from `base` (model=tiny's config, composed once by the caller), fp32 on the
    CPU: what _framework times and _first_steps steps."""
    from omegaconf import OmegaConf

    from launcher.plan.steptime import FRAMEWORK_PROBE as P
    from launcher.runtime.model import build_model

    cfg = OmegaConf.merge(base, {"arch": arch, "hidden_size": P["hidden_size"], "num_hidden_layers": layers,
                                 "num_attention_heads": P["num_heads"], "num_key_value_heads": P["num_heads"],
                                 "intermediate_size": P["intermediate_size"], "vocab_size": P["vocab_size"]})
    return build_model(cfg, seed=0, vocab_size=P["vocab_size"])


def _process_bytes(dist, dev) -> tuple[float, float]:
    """(what a CPU training rank holds besides its model's tensors once it has run steps: profile.process_bytes;
    the same before any model, kept in the raw measurements), the largest over the ranks, taken before any other
    probe allocates. On CPU ranks the plan's peak memory is the process's peak RSS, and this is most of it at
    recipe=tiny's size.

    Before the model: the resident set once the modules a rank runs are imported (the runtime's model builders,
    DeepSpeed's engines, transformers' modeling code) and its process group is up: 2026-11-29 on this VM, 251 MiB
    with torch and DeepSpeed imported, 363 once transformers' modeling code is (its first model module pulls in ~110
    MiB). Until 2026-12-03 that was process_bytes, and every recipe=tiny layout's peak RSS read 81-140 MiB (1.18-1.35x)
    over its plan on three machines (bench/steptime/*results.json). Part of that is what the first engine and its
    first steps add whatever the model's size: DeepSpeed's engine and ZeRO optimizer bookkeeping, and the code pages
    of autograd's, the optimizer's and the collectives' kernels (file-backed RSS 92 -> 113 MiB). _first_steps measures
    it with the runtime's own model at the framework probe's near-zero shape (kilobytes of tensors) through a ZeRO-2
    engine and AdamW, as recipe=tiny runs: +30.5 MiB here (2026-12-03, 2 ranks, twice: 361.8 -> 392.3 MiB and
    361.8 -> 392.4). What it leaves out is the freed blocks glibc keeps as a real model's steps run (launcher/plan/
    memory.py's docstring)."""
    import importlib

    import torch

    from launcher.runtime.metrics import current_rss_bytes

    for name in ("launcher.runtime.build", "launcher.runtime.model", "deepspeed.runtime.engine",
                 "deepspeed.runtime.zero.stage_1_and_2", "deepspeed.runtime.zero.stage3", "deepspeed.runtime.pipe.engine",
                 *(f"transformers.models.{m}.modeling_{m}" for m in ("llama", "gpt2", "bloom"))):
        importlib.import_module(name)
    before = float(current_rss_bytes())
    _first_steps(dev)
    t = torch.tensor([float(current_rss_bytes()), before], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0].item()), float(t[1].item())


def _first_steps(dev, steps: int = 3) -> None:
    """A few training steps of the runtime's own llama (launcher/runtime/model.py build_model) at
    steptime.FRAMEWORK_PROBE's near-zero shape through a ZeRO-2 engine over every rank (recipe=tiny's engine;
    zero_optimization_base, as a run gets it) with gradient clipping and torch's AdamW (torch_adam, as a run's
    DeepSpeed config has it on CPU ranks: FusedAdam would JIT-compile, and its library's pages are not a run's), then
    freed: what a rank holds after it is not the model's (_process_bytes)."""
    import importlib.util
    import logging

    import torch

    from launcher.config.compose import compose
    from launcher.deepspeed_config import zero_optimization_base
    from launcher.plan.steptime import FRAMEWORK_PROBE as P

    if importlib.util.find_spec("deepspeed") is None:
        return
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    model = _probe_model(compose(["model=tiny"]).model, "llama", P["layers"][0])
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True, "adam_w_mode": True}},
        "zero_optimization": zero_optimization_base(2, torch.device(dev).type)})
    x = torch.randint(0, P["vocab_size"], (1, P["seq_length"]), device=dev)
    for _ in range(steps):
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
    engine.destroy()


def _host_memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


if __name__ == "__main__":
    if sys.argv[1] == "--fit":
        # `launcher submit --calibrate`'s job, after its ranks: RAW OUT [BASE] (launcher/templates/calibrate.sbatch.tmpl).
        raw = json.loads(Path(sys.argv[2]).read_text())
        for line in busy_warnings(raw):
            print(line, flush=True)
        base = sys.argv[4] if len(sys.argv) > 4 else None     # --network-only: cluster.profile
        from launcher.config.errors import ConfigError

        try:
            written = write_profile(raw, sys.argv[3], raw["seconds"], base)
        except ConfigError as err:
            print(f"calibrate: {err}", file=sys.stderr, flush=True)
            sys.exit(2)
        print(f"wrote {written} (use it: cluster.profile={sys.argv[3]})")
    elif sys.argv[1] == "--node-type":
        # A --network-only job's first step, on every node before its ranks start: BASE DEVICE (calibrate.sbatch.tmpl).
        from launcher.config.errors import ConfigError

        try:
            refuse_other_node_type(base_measurements(sys.argv[2]), this_node_type(sys.argv[3]), sys.argv[2],
                                   measured=False)
        except ConfigError as err:
            print(f"calibrate: {err}", file=sys.stderr, flush=True)
            sys.exit(2)
    elif sys.argv[1] == "--check":
        _check_worker(*sys.argv[2:5])
    else:
        _worker(*sys.argv[1:5])
