"""The plan held to training runs measured on a GPU (bench/gpu/results/2026-11-26-h200: a ~1B LLaMA, bf16, on one
NVIDIA H200 with `launcher train`, run by bench/gpu/train_1b.py; the numbers are the runs' own metrics.jsonl).

The built-in h200 profile is what `launcher calibrate` measured on that machine before the runs (its GEMM, SDPA,
copy and ZeRO-3-hook micro-benchmarks, launcher/plan/profile.py); the runs themselves fed nothing into it. No GPU
is needed here: the test plans, and reads the committed measurements.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.plan.report import plan_summary

RESULTS = Path(__file__).parents[2] / "bench" / "gpu" / "results" / "2026-11-26-h200"
H100_RESULTS = RESULTS.parent / "2026-11-27-h100"
WARMUP_STEPS = 10  # bench/gpu/train_1b.py: the first steps carry the allocator's growth and cuBLAS's heuristics

# planned / measured step time: (low, high). ZeRO-3 on one GPU is under-planned (0.81): its hooks run on the host
# while the GPU waits, and the per-module cost calibrate measured on a Linear stack covers about half of what
# the 1B model's step pays (bench/gpu/results.md). The bound keeps that gap from growing unseen.
STEP_BOUNDS = {"train-1b": (0.93, 1.10), "train-1b-base": (0.93, 1.10), "train-1b-ckpt": (0.93, 1.10),
               "train-1b-seq4096": (0.93, 1.10), "train-1b-zero3": (0.75, 1.10)}


def measured(name: str, results: Path = RESULTS) -> tuple[list[str], float, int]:
    """(overrides, median step seconds after the warm-up, peak bytes) from the run's own step records."""
    run = json.loads((results / f"{name}.json").read_text())
    recs = [json.loads(line) for line in (results / f"{name}-metrics.jsonl").read_text().splitlines() if line.strip()]
    steady = [r for r in recs if r.get("kind") == "train" and r["step"] > WARMUP_STEPS]
    assert len(steady) >= 10, name
    return run["overrides"], statistics.median(r["step_time_s"] for r in steady), max(r["peak_memory_bytes"] for r in steady)


@pytest.mark.parametrize("name", sorted(STEP_BOUNDS))
def test_plan_matches_the_h200_runs(name):
    overrides, step_s, peak = measured(name)
    cfg = compose(overrides)
    plan = plan_summary(cfg, resolve_layout(cfg))
    assert "measured by `launcher calibrate`" in plan["profile"]
    low, high = STEP_BOUNDS[name]
    assert low <= plan["step_time_s"] / step_s <= high, (name, plan["step_time_s"], step_s)
    # Peak memory: params, grads, AdamW state, activations and overhead against torch.cuda.max_memory_allocated.
    assert 0.98 <= plan["memory_per_gpu_bytes"]["total"] / peak <= 1.08, (name, plan["memory_per_gpu_bytes"], peak)


def test_the_calibrated_profile_file_plans_as_the_builtin():
    """The committed profile file (what `cluster.profile=` reads) and the built-in constants copied from it agree."""
    overrides, _, _ = measured("train-1b-base")
    cfg = compose(overrides)
    builtin = plan_summary(cfg, resolve_layout(cfg))["step_time_s"]
    cfg = compose(overrides + [f"cluster.profile={RESULTS / 'profile-h200.yaml'}"])
    from_file = plan_summary(cfg, resolve_layout(cfg))["step_time_s"]
    assert from_file == pytest.approx(builtin, rel=0.01)


# The H100 runs (2026-11-27) against the built-in h100-80gb profile, which is datasheet constants (never calibrated
# into the built-ins: the calibrate that ran there used the one-call-per-sync timing since corrected,
# bench/gpu/results.md). Memory is held as on the H200; step time only from below, so that the known under-plan
# (0.88 base; micro-batch 2 host-bound, 0.73; ZeRO-3's host hooks, 0.49) cannot grow unseen.
H100_STEP_LOW = {"train-1b-base": 0.83, "train-1b-mb2": 0.68, "train-1b-zero3": 0.45}


@pytest.mark.parametrize("name", sorted(H100_STEP_LOW))
def test_plan_against_the_h100_runs(name):
    overrides, step_s, peak = measured(name, H100_RESULTS)
    assert "cluster=h100-80gb" in overrides
    cfg = compose(overrides)
    plan = plan_summary(cfg, resolve_layout(cfg))
    assert H100_STEP_LOW[name] <= plan["step_time_s"] / step_s <= 1.10, (name, plan["step_time_s"], step_s)
    assert 0.98 <= plan["memory_per_gpu_bytes"]["total"] / peak <= 1.08, (name, plan["memory_per_gpu_bytes"], peak)
