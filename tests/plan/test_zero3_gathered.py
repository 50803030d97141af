"""What ZeRO 3 holds whole at the top of the backward (launcher/plan/memory.py zero3_gathered, a replay of DeepSpeed's
parameter coordinator), against counts worked out by hand from its rules, and the knobs shared with DeepSpeed.

The rules (zero/partitioned_param_coordinator.py, DeepSpeed 0.19.8): after a module runs, its parameters are released
unless persistent (<= stage3_param_persistence_threshold elements), passed by a prefetch walk at a later use, or used
again within stage3_max_reuse_distance parameters of the module trace; each fetch walks ahead, gathering up to
stage3_prefetch_bucket_size elements while fewer than stage3_max_live_parameters are gathered. The same replay is
held to a real engine's allocations on 2 CPU ranks by tests/plan/test_live_at_peak.py.

recipe=tiny (hidden 128, 4 blocks, ffn 352, vocabulary 2,048, untied), in elements: the embedding and the head
262,144 each; per block q, k, v, o 16,384 each, gate, up, down 45,056 each (200,704), norms 256; final norm 128.
"""
from __future__ import annotations

import pytest

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.deepspeed_config import build_deepspeed_config
from launcher.plan import memory
from launcher.plan.inputs import model_shape, resolve_hardware, strategy

VOCAB, BLOCK, FFN, ATTN = 262_144, 200_704, 45_056, 16_384
WHOLE_MODEL = 2 * VOCAB + 4 * BLOCK     # every tensor above 1e5 elements or, at persistence 1,000, every linear


def tiny(*overrides):
    cfg = compose(["recipe=tiny", "parallel.zero_stage=3", "precision=bf16", *overrides])
    layout = resolve_layout(cfg)
    return cfg, layout, model_shape(cfg.model), strategy(cfg, layout)


def replay(shape, st, reuse, prefetch, live=1e9, persistence=1000, recomputed=0):
    return memory._zero3_replay(shape, st.tensor_degree, st.padded_vocab_size, reuse, prefetch, persistence, live,
                                recomputed)


def test_the_reuse_distance_keeps_the_last_modules_for_their_backward():
    _, _, shape, st = tiny()
    # No prefetch walks: only the distance rule. A module is kept where 2 x (parameters after it) < the distance.
    # 6e5: the head (nothing after it) and block 4's down (after it the final norm and the head, 262,272: 524,544);
    # its up has 307,328 after it (614,656) and is released.
    g = replay(shape, st, reuse=600_000, prefetch=0)
    assert g.kept == VOCAB + FFN and g.prefetched == 0
    # 1e6: all of block 4 (q has 446,592 after it: 893,184) and block 3's down (463,232: 926,464), not its up
    # (508,288: 1,016,576)
    assert replay(shape, st, reuse=1_000_000, prefetch=0).kept == VOCAB + BLOCK + FFN
    # Nothing kept: the head is gathered again for its own backward, the peak's moment
    g = replay(shape, st, reuse=0, prefetch=0)
    assert g.kept == 0 and g.prefetched == VOCAB


def test_a_prefetch_walk_keeps_what_it_passes():
    _, _, shape, st = tiny()
    # Walks of at least 20,000 elements: past two attention modules (16,384 each) where the compute uses one, so
    # the walks run further ahead at every attention fetch; with room under the live limit they reach the
    # backward's uses, and a module whose later use a walk has passed is not released: everything is kept.
    assert replay(shape, st, reuse=0, prefetch=20_000).kept == WHOLE_MODEL
    # At a live limit of 3e5 a walk gathers only while fewer are live: the lead stays a module or two, and at the
    # head's forward (262,144 live) its walk passes the head's backward use and gathers block 4's down, and stops.
    assert replay(shape, st, reuse=0, prefetch=20_000, live=300_000).kept == VOCAB + FFN


def test_a_recomputed_block_is_gathered_again_but_its_last_linear():
    """Under activation checkpointing the backward of a block runs its forward again (transformers' non-reentrant
    checkpoint), after the last linear's backward fetch; torch stops the recompute as that linear saves its
    tensors, before DeepSpeed's release, so it is gathered once for both."""
    _, _, shape, st = tiny()
    block_linears = 4 * ATTN + 3 * FFN          # 200,704 a block: q, k, v, o, gate, up, down
    # Nothing kept (reuse 0, no walks). Without recompute the backward gathers each of the 30 fetched modules again
    # (the head, 4 x 7 linears, the embedding).
    plain = replay(shape, st, reuse=0, prefetch=0)
    assert plain.forward_gathers == (30, 2 * VOCAB + 4 * block_linears)
    assert plain.backward_gathers == (30, 2 * VOCAB + 4 * block_linears)
    # With every block recomputed, a block's backward gathers its down (1), the recompute its other six (the down
    # is whole already), and after each of those six's recomputed forward DeepSpeed releases it (reuse 0) to gather
    # it for its backward once more: 13 calls, down + 2 x (q, k, v, o, gate, up) elements. Measured on 2 CPU ranks:
    # 54 all-gathers, 1,949,696 elements (bench/steptime/results.md, 2026-12-06 16:30 UTC). steptime's separate
    # count before (a third gather of every linear followed by >= the distance) charged 58 and 2,129,920.
    g = replay(shape, st, reuse=0, prefetch=0, recomputed=4)
    assert g.forward_gathers == plain.forward_gathers
    assert g.backward_gathers == (2 + 4 * 13, 2 * VOCAB + 4 * (FFN + 2 * (4 * ATTN + 2 * FFN)))
    # model.checkpoint_blocks=2: the first two blocks recompute, the last two do not (measured: 42, 1,638,400)
    g = replay(shape, st, reuse=0, prefetch=0, recomputed=2)
    assert g.backward_gathers == (2 + 2 * 13 + 2 * 7, 2 * VOCAB + 2 * (FFN + 2 * (4 * ATTN + 2 * FFN)) + 2 * block_linears)
    # Reuse 6e5: the forward keeps the head and block 4's down (their next uses, the backward's head and down
    # fetches, come within 524,544 elements); the recompute's gathers are kept to their backward (q's is 323,840
    # elements away: k, v, o, the norm, gate, up, down, then up, gate, the norm, o, v, k). The backward gathers
    # block 4's six other linears, blocks 1-3 whole and the embedding: 28 calls, as without recompute.
    g = replay(shape, st, reuse=600_000, prefetch=0, recomputed=4)
    assert g.kept == VOCAB + FFN
    assert g.backward_gathers == (6 + 3 * 7 + 1, 4 * ATTN + 2 * FFN + 3 * block_linears + VOCAB)
    assert g.backward_gathers == replay(shape, st, reuse=600_000, prefetch=0).backward_gathers


def test_the_plan_replays_the_recompute_it_runs():
    """zero3_gathered counts the checkpointed blocks the runtime recomputes (memory.checkpointed_layers)."""
    base = ["parallel.zero3_param_persistence_threshold=1000", "parallel.zero3_max_reuse_distance=0",
            "parallel.zero3_prefetch_bucket_size=0"]
    counts = {}
    for name, extra in (("none", []), ("full", ["model.activation_checkpointing=true"]),
                        ("first 2", ["model.activation_checkpointing=true", "model.checkpoint_blocks=2"]),
                        ("selective", ["model.activation_checkpointing=true", "model.checkpoint_mode=selective"])):
        _, _, shape, st = tiny(*base, *extra)
        counts[name] = memory.zero3_gathered(shape, st).backward_gathers[0]
    assert counts == {"none": 30, "full": 54, "first 2": 42, "selective": 54}


def test_a_recomputed_gpt3_block_gathers_qkv_and_dense_a_third_time():
    # GPT-175B's block (h 12288, 96 heads): qkv 3h^2 = 453M, dense h^2 = 151M, fc and proj 4h^2 = 604M elements.
    # Without prefetch walks (parallel.zero3_prefetch_bucket_size=0) and at the 1e9 reuse distance, a block far from
    # the head is released after its forward and, without recompute, gathered once for its backward: 4 calls, 12h^2.
    # Under full recompute: proj for its backward (1), the recompute qkv, dense, fc (3; proj is whole, and torch's
    # early stop skips its release); after each recomputed module DeepSpeed keeps it only if its backward comes
    # within 1e9 elements: fc's (proj between) does, dense's (fc, proj, fc: 1.8e9) and qkv's (2.1e9) do not, so
    # those two are gathered a third time: 6 calls, 4h^2 + 8h^2 + 4h^2 = 16h^2 elements. One more block at the
    # front adds exactly that. (steptime's separate count before charged qkv, dense and fc a third time.)
    h = 12288

    def backward_gathers(layers, *extra):
        _, _, shape, st = tiny("model=gpt3-175b", f"model.num_hidden_layers={layers}",
                               "parallel.zero3_prefetch_bucket_size=0", *extra)
        return memory.zero3_gathered(shape, st).backward_gathers

    for extra, calls, elements in (((), 4, 12 * h * h), (("model.activation_checkpointing=true",), 6, 16 * h * h)):
        (c1, e1), (c2, e2) = backward_gathers(8, *extra), backward_gathers(9, *extra)
        assert (c2 - c1, e2 - e1) == (calls, elements), extra
    # recipe=tiny at the defaults keeps everything it fetches (the embedding and the head): recompute adds nothing
    _, _, shape, st = tiny("model.activation_checkpointing=true")
    _, _, plain_shape, plain_st = tiny()
    assert memory.zero3_gathered(shape, st).backward_gathers == memory.zero3_gathered(plain_shape, plain_st).backward_gathers


def test_persistent_tensors_are_whole_on_every_rank_and_never_fetched():
    _, _, shape, st = tiny()
    g = memory.zero3_gathered(shape, st)
    # At the default threshold (1e5) every linear of tiny's blocks is persistent, with the norms: 4 x (200,704 + 256)
    # + 128; the embedding and the head are fetched and, far inside the 1e9 reuse distance, kept.
    assert g.persistent == 4 * (BLOCK + 256) + 128
    assert g.kept == 2 * VOCAB and g.prefetched == 0


def test_a_tied_head_is_the_embeddings_tensor_gathered_once():
    _, _, shape, st = tiny("model.tie_word_embeddings=true")
    assert replay(shape, st, reuse=1e9, prefetch=0).kept == VOCAB + 4 * BLOCK


def test_at_deepspeeds_defaults_a_large_model_fills_the_live_limit():
    """LLaMA-7B over 8 ranks: modules of 16.8M-45.1M elements, below the 5e7 prefetch bucket, so every fetch walks a
    module or more further ahead until 1e9 are gathered; the last walk overshoots by at most one module."""
    cfg = compose(["model=llama-7b", "cluster=h100-80gb", "cluster.nodes=1", "precision=bf16",
                   "parallel.zero_stage=3", "batch.micro_batch_size=1", "batch.global_batch_size=8"])
    shape, st = model_shape(cfg.model), strategy(cfg, resolve_layout(cfg))
    g = memory.zero3_gathered(shape, st)
    largest_module = 4096 * 11008
    assert 1e9 <= g.kept + g.prefetched <= 1e9 + largest_module
    assert g.total > 2 * shape.params.per_layer      # the two blocks the plan charged before 2026-12-06
    # The backward gathers again exactly what the forward did not keep: the fetched tensors (the embedding, the
    # head, 32 blocks' linears) less the kept ones; the step time charges that, not a second whole model.
    fetched = 2 * 32000 * 4096 + 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert g.backward_gathers[1] == fetched - g.kept
    assert g.forward_gathers[1] >= fetched


def test_one_rank_gathers_nothing():
    """Over one rank DeepSpeed points each parameter at its partition (partition_parameters.py
    _no_gather_coalesced): no whole copies, and the plan charges none."""
    cfg = compose(["recipe=tiny", "cluster=h200", "cluster.nodes=1", "cluster.gpus_per_node=1", "precision=bf16",
                   "parallel.zero_stage=3"])
    layout = resolve_layout(cfg)
    shape, st = model_shape(cfg.model), strategy(cfg, layout)
    hw = resolve_hardware(cfg.cluster, cfg.precision.dtype)
    assert st.zero_partition_degree == 1
    assert "whole tensors" not in memory.explain_stage_memory(shape, st, hw, 0)["overhead"]
    assert memory.estimate_memory(shape, st, hw).peak.overhead == pytest.approx(
        memory.FRAMEWORK_OVERHEAD_BYTES + memory.REDUCE_BUCKET_ELEMENTS * 2)


def test_the_knobs_default_to_deepspeeds_and_reach_deepspeed_and_the_plan():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from launcher.config import schema

    defaults = DeepSpeedZeroConfig()
    assert (defaults.param_persistence_threshold, defaults.max_reuse_distance, defaults.prefetch_bucket_size,
            defaults.max_live_parameters) == (schema.ZERO3_PARAM_PERSISTENCE_THRESHOLD, schema.ZERO3_MAX_REUSE_DISTANCE,
                                              schema.ZERO3_PREFETCH_BUCKET_SIZE, schema.ZERO3_MAX_LIVE_PARAMETERS)
    cfg, layout, _, _ = tiny()
    zero = build_deepspeed_config(cfg, layout)["zero_optimization"]
    assert (zero["stage3_param_persistence_threshold"], zero["stage3_max_reuse_distance"],
            zero["stage3_prefetch_bucket_size"], zero["stage3_max_live_parameters"]) == (
        100_000, 1_000_000_000, 50_000_000, 1_000_000_000)
    knobs = ["parallel.zero3_param_persistence_threshold=1000", "parallel.zero3_max_reuse_distance=0",
             "parallel.zero3_prefetch_bucket_size=20000", "parallel.zero3_max_live_parameters=300000"]
    cfg, layout, shape, st = tiny(*knobs)
    zero = build_deepspeed_config(cfg, layout)["zero_optimization"]
    assert (zero["stage3_param_persistence_threshold"], zero["stage3_max_reuse_distance"],
            zero["stage3_prefetch_bucket_size"], zero["stage3_max_live_parameters"]) == (1000, 0, 20_000, 300_000)
    # the plan replays the same: the walks under a live limit of 3e5 keep the head and block 4's down
    assert memory.zero3_gathered(shape, st).kept == VOCAB + FFN


def test_lower_limits_lower_the_plan():
    """LLaMA-7B over 8 H100s (head 32,000 x 4,096 = 131,072,000; a block's q, k, v, o 16,777,216 each, gate, up,
    down 45,088,768 each). The default keeps 1.03e9 gathered. A live limit of 2e8 stops the prefetch walks, but the
    reuse distance (1e9) still keeps every module with under 5e8 after it: the head, block 32, and block 31's down,
    up, gate, o and v (its k has 502,267,904 after it). With the distance at 4e8 as well: the head and block 32's
    down and up (its gate has 221,249,536 after it). The plan's peak falls by the difference in bf16."""
    base = ["model=llama-7b", "cluster=h100-80gb", "cluster.nodes=1", "precision=bf16", "parallel.zero_stage=3",
            "batch.micro_batch_size=1", "batch.global_batch_size=8"]
    head, qkvo, ffn = 32000 * 4096, 4096 * 4096, 4096 * 11008
    expected = [None, head + (4 * qkvo + 3 * ffn) + (3 * ffn + 2 * qkvo), head + 2 * ffn]
    plans = []
    for extra, kept in zip(([], ["parallel.zero3_max_live_parameters=200000000"],
                            ["parallel.zero3_max_live_parameters=200000000",
                             "parallel.zero3_max_reuse_distance=400000000"]), expected):
        cfg = compose(base + extra)
        shape, st = model_shape(cfg.model), strategy(cfg, resolve_layout(cfg))
        g = memory.zero3_gathered(shape, st)
        if kept is not None:
            assert (g.kept, g.prefetched) == (kept, 0)
        plans.append((g, memory.estimate_memory(shape, st, resolve_hardware(cfg.cluster, cfg.precision.dtype)).peak))
    for (g0, m0), (g1, m1) in zip(plans, plans[1:]):
        assert m0.total - m1.total == pytest.approx((g0.total - g1.total) * 2)
    assert plans[0][1].total - plans[2][1].total > 1.6e9
