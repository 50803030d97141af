"""Megatron sequence parallelism (parallel.sequence_parallel) in the planner, pure: the rank map's token slices,
the activation formula's structure, the memory and step-time changes, and the --search candidates.
The formulas themselves are held to the runtime's saved tensors in tests/plan/test_activations.py (pipe-sp)."""

from __future__ import annotations

import pytest

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.plan import activations as act
from launcher.plan.inputs import model_shape, resolve_hardware, strategy
from launcher.plan.memory import activation_bytes_per_layer, estimate_memory
from launcher.plan.rankmap import format_rank_map, rank_map, sequence_slice
from launcher.plan.search import search_layouts
from launcher.plan.steptime import estimate_step_time

TINY_SP = ["recipe=tiny", "cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.zero_stage=1"]


def test_rank_map_shows_each_tp_rank_its_sequence_slice():
    layout = resolve_layout(compose(TINY_SP + ["parallel.sequence_parallel=true"]))
    slices = [sequence_slice(layout, c) for c in rank_map(layout)]
    assert slices == [(0, 64), (64, 128), (0, 64), (64, 128)]   # seq 128 over TP 2, both replicas alike
    text = format_rank_map(layout)
    assert "Megatron SP" in text and text.splitlines()[1].endswith("tokens") and "64-128" in text
    assert "tokens" not in format_rank_map(resolve_layout(compose(TINY_SP)))


def test_sp_block_formula_saves_the_norm_side_only():
    """TP+SP keeps 2 (4h + 4 + wh) (1 - 1/t) bytes per token less than TP alone (the norms' inputs and outputs
    on s/t tokens, the gathered linear input once), and nothing changes at t = 1 or outside LLaMA's norms."""
    m = act.ActivationShape("llama", 128, 4, 2, 352, 256)
    for dtype, w in (("fp32", 4), ("bf16", 2)):
        for t in (2, 4, 8):
            tp = act.block_bytes_per_token(m, 256, dtype, t)
            sp = act.block_bytes_per_token(m, 256, dtype, t, sp=True)
            assert tp - sp == 2 * (4 * 128 + 4 + w * 128) * (1 - 1 / t)
        assert act.checkpointed_block_bytes_per_token(m, dtype, 4) == w * 128 / 4


def test_plan_memory_and_step_time_with_sp():
    # With and without stages: both run our TP layers (at pipeline_degree 1 on the plain engine, ZeRO-2 there too).
    for pp, zero in ((2, 1), (1, 2)):
        hw_cfg = ["recipe=llama-7b", "parallel.tensor_degree=4", f"parallel.pipeline_degree={pp}",
                  f"parallel.zero_stage={zero}", "model.activation_checkpointing=false"]
        out = {}
        for sp in (False, True):
            cfg = compose(hw_cfg + [f"parallel.sequence_parallel={str(sp).lower()}"])
            layout = resolve_layout(cfg)
            st, shape = strategy(cfg, layout), model_shape(cfg.model)
            hw = resolve_hardware(cfg.cluster, cfg.precision.dtype)
            out[sp] = (activation_bytes_per_layer(shape, st), estimate_memory(shape, st, hw).peak.activations,
                       estimate_step_time(shape, st, hw, layout.tokens_per_step))
        assert out[True][0] < out[False][0] and out[True][1] < out[False][1]
        # all-gather + reduce-scatter move the bytes of the all-reduce they replace at twice its latency, and the
        # norms' gradients are all-reduced every micro-batch: on NVLink (a100-80gb, TP 4) a few percent more
        no_sp, sp = out[False][2].tp_comm_s, out[True][2].tp_comm_s
        assert no_sp < sp < 1.1 * no_sp


def test_search_proposes_tp_sp_only_where_train_runs_it():
    ranked, _ = search_layouts(compose(["recipe=tiny", "cluster=a100-80gb", "cluster.nodes=1"]))
    sts = [c.strategy for c in ranked]
    with_sp = [st for st in sts if st.sequence_parallel]
    assert with_sp
    assert all(st.tensor_degree > 1 and st.zero_stage <= 2 and st.sequence_degree == 1 for st in with_sp)
    # ZeRO-2 only at one stage: the plain engine (launcher/parallel/tensor_model.py); the pipeline engine takes 0-1.
    assert all(st.pipeline_degree == 1 for st in with_sp if st.zero_stage == 2)
    assert any(st.zero_stage == 2 for st in with_sp)


def test_sp_charges_its_extra_collectives_where_latency_dominates():
    """On a link whose latency dominates (a calibrated CPU profile: gloo, ~0.7 ms a call) Megatron SP's extra
    calls are what a step pays: per block and micro-batch 4 all-gathers + 4 reduce-scatters where TP alone runs
    4 all-reduces, one all-reduce per norm parameter (2 a LLaMA block), and at the vocab-parallel ends a
    reduce-scatter of the embedding's output (its gradient all-gathered back), an all-gather of the head's input (its
    gradient reduce-scattered) and the final norm's all-reduce; TP alone all-reduces the embedding's output and the
    head input's gradient there instead. Both pay the loss's 3 all-reduces of one fp32 value a token
    (launcher/parallel/tensor.py, pipeline.py). A profiled recipe=tiny TP2 step with the replicated ends made 36
    all-gathers, 32 reduce-scatters and 18 512-byte all-reduces in its 2 micro-batches (bench/steptime/results.md,
    TP2-SP); the vocab-parallel ends make that 36, 36 and 24 (18 of them 512-byte)."""
    from dataclasses import replace

    from launcher.plan.profile import Link
    out = {}
    for sp in (False, True):
        c = compose(["recipe=tiny", "cluster.gpus_per_node=2", "parallel.tensor_degree=2", "parallel.zero_stage=1",
                     "cluster.profile=bench/steptime/profile.yaml", f"parallel.sequence_parallel={str(sp).lower()}"])
        layout = resolve_layout(c)
        st, shape = strategy(c, layout), model_shape(c.model)
        hw = resolve_hardware(c.cluster, c.precision.dtype)
        lat = 1e-3   # a latency-only link: every call costs 1 ms, bytes nothing
        link = Link(lat, 1e12)
        hw = replace(hw, profile=replace(hw.profile, intra=link, inter=link, intra_groups={}, nccl=None))
        out[sp] = estimate_step_time(shape, st, hw, layout.tokens_per_step).tp_comm_s
    blocks, micro = c.model.num_hidden_layers, layout.grad_accum_steps
    assert (blocks, micro) == (4, 2)
    assert out[False] == pytest.approx(micro * (blocks * 4 + 2 + 3) * lat)
    assert out[True] == pytest.approx(micro * (blocks * (8 + 2) + 4 + 1 + 3) * lat)
