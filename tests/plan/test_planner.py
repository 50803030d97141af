"""Planner formulas held to published numbers (each source cited beside its test) and search properties.

Expected values are computed here from the papers' own numbers, never copied from the planner's output.
"""

from __future__ import annotations

import json
import subprocess
import sys
import os
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.plan import flops, memory, steptime
from launcher.plan.inputs import model_shape, resolve_hardware, strategy
from launcher.plan.search import search_layouts

ROOT = Path(__file__).resolve().parents[2]


# ZeRO paper (Rajbhandari et al. 2020), figure 1: 7.5B parameters, N_d = 64, K = 12, mixed precision:
# baseline (2 + 2 + K) Psi = 120 GB; P_os 31.4 GB; P_os+g 16.6 GB; P_os+g+p 1.9 GB.
@pytest.mark.parametrize("stage, published_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage, published_gb):
    b = memory.model_state_bytes(7.5e9, data_degree=64, zero_stage=stage, dtype="fp16")
    assert sum(b.values()) / 1e9 == pytest.approx(published_gb, abs=0.05)


def test_fp32_adam_is_4_4_8():
    # ZeRO paper section 5's fp32 variant: weights 4, grads 4, Adam momentum + variance 8 bytes per parameter.
    assert memory.model_state_bytes(1000, 1, 0, dtype="fp32") == {"params": 4000, "grads": 4000, "optimizer": 8000}


def test_bf16_optimizer_keeps_unsharded_fp32_grads():
    # DeepSpeed BF16_Optimizer (bf16_optimizer.py): bf16 weights, a full fp32 gradient buffer, fp32 master + Adam
    # states sharded over DP: 2 + 4 + 12/8 bytes per parameter at DP 8. No bf16 gradients held: with the
    # immediate_grad_update the launcher sets each is added into the buffer and freed as the backward writes it
    # (the measured ledger: tests/plan/test_state_bytes.py llama-bf16-z1-fp32acc).
    b = memory.model_state_bytes(1000, 8, 1, dtype="bf16", grad_accum_fp32=True)
    assert (b["params"], b["grads"], b["optimizer"]) == (2000, 4000, 1500)


def test_the_plan_table_states_each_model_state_terms_arithmetic():
    # The words the plan's table shows beside each term name the factors of the bytes above, term for term.
    how = memory.model_state_how(1000, 8, 1, dtype="bf16", grad_accum_fp32=True)
    assert how == {"params": "1,000 params x 2 B (bf16)",
                   "grads": "1,000 params x 4 B: BF16_Optimizer's unsharded fp32 accumulation buffer (each bf16 "
                            "gradient added into it and freed as the backward writes it: immediate_grad_update)",
                   "optimizer": "1,000 params x (4 B fp32 master + 8 B Adam m, v) = 12 B/param (ZeRO paper section 5, "
                                "K = 12) / DP 8 (ZeRO 1)"}
    how = memory.model_state_how(1000, 4, 0, dtype="fp32")
    assert how["optimizer"] == "1,000 params x 8 B Adam m, v (fp32: the weights are the master, K = 8)"
    how = memory.model_state_how(1000, 4, 3, dtype="bf16", offload_optimizer=True)
    assert how == {"params": "1,000 params x 2 B (bf16) / DP 4 (ZeRO 3)", "grads": "1,000 params x 2 B / DP 4 (ZeRO 3)",
                   "optimizer": "in CPU memory (parallel.offload_optimizer)"}


# Narayanan et al. 2021, eq. 4: training time ~ 8 T P / (n X). GPT-3: 175B parameters, 300B tokens,
# 1,024 A100 at 312 TFLOP/s peak, 34-35 days -> utilisation U = 8TP / (n x 312e12 x seconds) ~ 0.44.
def test_gpt3_utilisation_from_eq4():
    seconds_at_peak = flops.narayanan_eq4_training_seconds(300e9, 175e9, 1024, 312.0)
    u = seconds_at_peak / (35 * 86400)
    assert u == pytest.approx(0.435, abs=0.01)


# LLaMA-65B (Touvron et al. 2023, section 2.4): 1.4T tokens on 2,048 A100-80GB, ~380 tokens/s/GPU, ~21 days.
# Under 8TP/(n F U) with the dense 312 TFLOP/s peak this is U = 0.63 (6TP, no recompute: 0.47). The issue's
# "~0.3" is what the same arithmetic gives against A100's 624 TFLOP/s *sparse* peak; we record both.
def test_llama65b_utilisation_from_eq4():
    days = 1.4e12 / (380 * 2048) / 86400
    assert days == pytest.approx(20.8, abs=0.2)  # the paper's "approximately 21 days"
    u_dense = flops.narayanan_eq4_training_seconds(1.4e12, 65e9, 2048, 312.0) / (21 * 86400)
    u_sparse = flops.narayanan_eq4_training_seconds(1.4e12, 65e9, 2048, 624.0) / (21 * 86400)
    assert u_dense == pytest.approx(0.63, abs=0.01)
    assert u_sparse == pytest.approx(0.31, abs=0.01)


def test_hardware_flops_match_narayanan_eq3():
    # With full recompute our per-token hardware FLOPs (6N + 12LHQT + a second forward of the blocks) must
    # equal eq. 3's 96 B s l h^2 (1 + s/6h + V/16lh) up to the biases/norms eq. 3 leaves out.
    cfg = compose(["recipe=gpt3-175b"])
    shape = model_shape(cfg.model)
    ours = flops.hardware_flops_per_token(shape, 2048, "full")
    eq3 = flops.narayanan_eq3_flops_per_step(1, 2048, 96, 12288, 50257) / 2048
    assert ours == pytest.approx(eq3, rel=2e-3)


def test_palm_540b_mfu():
    # PaLM appendix B: 540B (L 118, H 48, Q 256, T 2048), 238.3K tokens/s on 6,144 TPU v4 at 275 TFLOP/s: MFU 46.2%.
    n, l, hq, t = 540.35e9, 118, 48 * 256, 2048
    mfu = (6 * n + 12 * l * hq * t) * 238.3e3 / (6144 * 275e12)
    assert mfu == pytest.approx(0.462, abs=0.002)


def test_bloom_bubble_is_11_over_128():
    # BLOOM (BigScience 2022): PP 12, 128 micro-batches per step -> (p - 1)/m = 11/128.
    cfg = compose(["recipe=bloom-176b"])
    assert resolve_layout(cfg).bubble_fraction == 11 / 128


def test_plan_json_has_performance_keys():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "launcher", "plan", "recipe=bloom-176b", "--json"], cwd=ROOT,
                         env=env, capture_output=True, text=True, check=True).stdout
    s = json.loads(out)
    for key in ("params", "grads", "optimizer", "activations", "total"):
        assert s["memory_per_gpu_bytes"][key] > 0
    assert s["fits"] is True
    for key in ("flops_per_token", "step_time_s", "tokens_per_s", "tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "train_days"):
        assert s[key] > 0
    # train.tokens / tokens per s, in days
    assert s["train_days"] == pytest.approx(366e9 / s["tokens_per_s"] / 86400)
    assert s["hardware_tflops_per_gpu"] > s["tflops_per_gpu"]  # BLOOM ran with full recompute


def test_unknown_gpu_needs_bandwidths():
    from launcher.config.errors import ConfigError
    cfg = compose(["recipe=llama-7b", "cluster.gpu=mi300x", "cluster.peak_tflops=1307"])
    with pytest.raises(ConfigError) as err:
        resolve_hardware(cfg.cluster, "bf16")
    assert err.value.key == "cluster.memory_gb"
    cfg = compose(["recipe=llama-7b", "cluster.gpu=mi300x", "cluster.peak_tflops=1307", "cluster.memory_gb=192",
                   "cluster.intra_node_gbps=448", "cluster.inter_node_gbps=50"])
    hw = resolve_hardware(cfg.cluster, "bf16")
    assert (hw.peak_tflops, hw.memory_bytes) == (1307.0, 192e9)


@pytest.mark.parametrize("recipe", ["bloom-176b", "llama-65b"])
def test_search_returns_valid_fitting_layouts_and_beats_the_recipe(recipe):
    cfg = compose([f"recipe={recipe}"])
    ranked, counts = search_layouts(cfg)
    assert ranked and counts["fit"] == len(ranked)
    shape = model_shape(cfg.model)
    hw = resolve_hardware(cfg.cluster, cfg.precision.dtype)
    for c in ranked[:8] + ranked[-4:]:  # the best and the worst that still fit
        st = c.strategy
        # Re-validate through the public path: compose the candidate as overrides and resolve it.
        over = [f"recipe={recipe}", f"parallel.tensor_degree={st.tensor_degree}", f"parallel.pipeline_degree={st.pipeline_degree}",
                f"parallel.sequence_degree={st.sequence_degree}", f"parallel.context_degree={st.context_degree}",
                f"parallel.zero_stage={st.zero_stage}", f"batch.micro_batch_size={st.micro_batch_size}",
                f"model.activation_checkpointing={st.recompute == 'full'}"]
        layout = resolve_layout(compose(over))
        assert layout.data_degree == st.data_degree
        assert c.memory.peak.total <= hw.memory_bytes
    speeds = [c.time.tokens_per_s for c in ranked]
    assert speeds == sorted(speeds, reverse=True)
    from launcher.plan.steptime import estimate_step_time
    own = estimate_step_time(shape, strategy(cfg, resolve_layout(cfg)), hw)
    assert ranked[0].time.tokens_per_s >= own.tokens_per_s


@pytest.mark.parametrize("overrides, checkpointed_fraction", [
    (["recipe=llama-7b", "model.checkpoint_blocks=8"], 8 / 32),                                  # one stage of 32 blocks
    (["recipe=llama-65b", "parallel.pipeline_degree=4", "model.checkpoint_blocks=5"], 4 * 5 / 80),   # 4 stages of 20
])
def test_checkpointing_the_first_blocks_lies_between_none_and_all(overrides, checkpointed_fraction):
    """model.checkpoint_blocks: memory and time between no recompute and every block's, and the recomputed FLOPs the
    checkpointed share of every block's (the fraction counted here from the stages, not by the planner)."""
    import dataclasses

    cfg = compose([*overrides, "model.activation_checkpointing=true"])
    layout = resolve_layout(cfg)
    shape, hw = model_shape(cfg.model), resolve_hardware(cfg.cluster, cfg.precision.dtype)
    partial = strategy(cfg, layout)
    assert partial.recompute == "full" and partial.checkpoint_blocks is not None
    every = dataclasses.replace(partial, checkpoint_blocks=None)
    none = dataclasses.replace(partial, recompute="none", checkpoint_blocks=None)
    acts = [memory.estimate_memory(shape, s, hw).peak.activations for s in (every, partial, none)]
    times = [steptime.estimate_step_time(shape, s, hw) for s in (none, partial, every)]
    assert acts[0] < acts[1] < acts[2]
    assert times[0].step_time_s < times[1].step_time_s < times[2].step_time_s
    extra = [t.hardware_flops_per_token - t.flops_per_token for t in times]
    assert extra[0] == 0 and extra[1] == pytest.approx(checkpointed_fraction * extra[2], rel=1e-12)
