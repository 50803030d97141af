"""ZeRO 1's gradients in the plan follow what DeepSpeed 0.19.8 holds (launcher/plan/memory.py zero1_holds_partition):
with overlap_comm (the launcher's GPU config) and one micro-batch a step every backward is an accumulation
boundary, each bucket is reduced as the backward fills it and the rank keeps its partition, n / DP; with several
micro-batches, under the pipeline engine, or without overlap_comm (CPU ranks), the full gradients sit in p.grad
until the boundary's epilogue. The live bytes behind the rule were measured on CPU ranks, with and without
overlap_comm, by bench/steptime/live_at_peak.py (bench/steptime/results.md)."""
from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.plan import memory
from launcher.plan.inputs import model_shape, resolve_hardware, strategy
from launcher.plan.memory import stage_params

ROOT = Path(__file__).resolve().parents[2]
TINY = ["recipe=tiny", "cluster=a100-80gb", "cluster.nodes=1", "cluster.gpus_per_node=2", "precision=bf16"]


def _grads(overrides: list[str]) -> tuple[float, float, int]:
    cfg = compose([*TINY, *overrides])
    layout = resolve_layout(cfg)
    shape, hw = model_shape(cfg.model), resolve_hardware(cfg.cluster, cfg.precision.dtype)
    st = strategy(cfg, layout)
    peak = memory.estimate_memory(shape, st, hw).peak
    return peak.grads, stage_params(shape, st, peak.stage), layout.grad_accum_steps


@pytest.mark.parametrize("zero", [1, 2])
def test_one_micro_batch_a_step_holds_the_partition(zero):
    grads, n, gas = _grads([f"parallel.zero_stage={zero}", "batch.micro_batch_size=8", "batch.global_batch_size=16"])
    assert gas == 1
    assert grads == pytest.approx(n * 2 / 2, rel=1e-12)     # bf16, DP 2


def test_zero1_accumulating_holds_the_full_gradients_zero2_does_not():
    over = ["batch.micro_batch_size=4", "batch.global_batch_size=16"]
    z1, n, gas = _grads(["parallel.zero_stage=1", *over])
    z2, _, _ = _grads(["parallel.zero_stage=2", *over])
    assert gas == 2
    assert z1 == pytest.approx(n * 2, rel=1e-12)
    assert z2 == pytest.approx(n * 2 / 2, rel=1e-12)


def test_zero1_under_the_pipeline_engine_holds_the_full_gradients():
    cfg_over = ["parallel.zero_stage=1", "parallel.pipeline_degree=2", "cluster.gpus_per_node=4",
                "batch.micro_batch_size=8", "batch.global_batch_size=16"]
    grads, n, gas = _grads(cfg_over)
    assert gas == 1        # DP 2 x 8 = 16: one pipeline micro-batch, still reduced after the pipeline's backward
    assert grads == pytest.approx(n * 2, rel=1e-12)


def test_cpu_ranks_without_overlap_comm_hold_the_full_gradients():
    # a CPU profile `launcher calibrate` wrote (bench/steptime's): a CPU plan needs the measured machine
    grads, n, gas = _grads(["cluster=cpu", f"cluster.profile={ROOT / 'bench' / 'steptime' / 'profile.yaml'}",
                            "parallel.zero_stage=1", "precision=fp32", "batch.micro_batch_size=8",
                            "batch.global_batch_size=16"])
    assert gas == 1
    assert grads == pytest.approx(n * 4, rel=1e-12)


def test_the_plan_says_why():
    cfg = compose([*TINY, "parallel.zero_stage=1"])
    layout = resolve_layout(cfg)
    how = memory.explain_stage_memory(model_shape(cfg.model), strategy(cfg, layout),
                                      resolve_hardware(cfg.cluster, cfg.precision.dtype), 0)
    assert "/ DP 2 (ZeRO 1, overlap_comm, one micro-batch a step" in how["grads"]
