"""Every layout `launcher plan --search` proposes passes the checks `launcher train` runs before any rank starts.

The search applies resolve_layout, check_supported and the host-memory verdict itself; these tests hold each
proposed layout to the public path instead: the composed config with the candidate's values set, through
submit.validate_before_start (what `train` and `submit` call), so a rule added there and not to the search fails
here.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from launcher.submit import validate_before_start
from launcher.config.compose import compose
from launcher.config.errors import ConfigError
from launcher.config.layout import resolve_layout
from launcher.plan.host import stages_by_node
from launcher.plan.search import node_stage_sets, search_layouts

CASES = [
    ["model=llama-65b", "cluster.gpu=h100-80gb", "cluster.nodes=64"],          # the README example (issue 14)
    ["recipe=bloom-176b"],
    ["recipe=tiny", "model.arch=gpt", "model.num_key_value_heads=null", "model.intermediate_size=null",
     "cluster=a100-80gb", "cluster.nodes=2"],                                  # gpt: no pipeline in the runtime
    ["recipe=llama2-70b", "cluster.nodes=16"],
    ["recipe=tiny", "cluster=a100-80gb", "cluster.nodes=1"],                   # small enough for Ulysses SP candidates
    ["recipe=llama3.1-8b", "data.seq_length=131072"],                         # long context: ring-attention CP candidates
    # not a layout as configured: TP 3 divides no head count, micro 7 divides no batch
    ["recipe=llama-7b", "parallel.tensor_degree=3", "batch.micro_batch_size=7"],
]


def _candidate_config(cfg, st):
    c = cfg.copy()
    OmegaConf.set_readonly(c, False)  # compose freezes the resolved config; this copy is the candidate's
    for key, value in (("parallel.tensor_degree", st.tensor_degree), ("parallel.pipeline_degree", st.pipeline_degree),
                       ("parallel.sequence_degree", st.sequence_degree), ("parallel.data_degree", None),
                       ("parallel.sequence_parallel", st.sequence_parallel),
                       ("parallel.context_degree", st.context_degree),
                       ("parallel.zero_stage", st.zero_stage), ("batch.micro_batch_size", st.micro_batch_size),
                       ("model.activation_checkpointing", st.checkpointing),
                       ("model.checkpoint_mode", st.recompute if st.checkpointing else "full"),
                       ("model.checkpoint_blocks", st.checkpoint_blocks), ("model.chunked_loss", st.chunked_loss)):
        OmegaConf.update(c, key, value)
    OmegaConf.set_readonly(c, True)
    return c


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o))
def test_every_proposed_layout_passes_train_validation(overrides, tmp_path):
    cfg = compose([*overrides, f"runs_dir={tmp_path}"])
    ranked, counts = search_layouts(cfg)
    assert ranked, counts
    gbs, seq = cfg.batch.global_batch_size, cfg.data.seq_length
    for cand in ranked:
        st = cand.strategy
        layout = validate_before_start(_candidate_config(cfg, st))  # raises ConfigError on a refused layout
        assert (layout.tensor_degree, layout.pipeline_degree, layout.sequence_degree, layout.context_degree,
                layout.data_degree, layout.zero_stage, layout.micro_batch_size) == (
                    st.tensor_degree, st.pipeline_degree, st.sequence_degree, st.context_degree, st.data_degree,
                    st.zero_stage, st.micro_batch_size)
        assert (layout.global_batch_size, layout.seq_length) == (gbs, seq)  # tokens per step held
        assert layout.sequence_parallel == st.sequence_parallel


def test_search_proposes_ulysses_and_never_what_train_refuses():
    cfg = compose(["recipe=tiny", "cluster=a100-80gb", "cluster.nodes=1"])
    ranked, _ = search_layouts(cfg)
    sts = [c.strategy for c in ranked]
    assert any(st.sequence_degree > 1 for st in sts)
    assert not any(st.tensor_degree > 1 and st.pipeline_degree == 1 and st.zero_stage == 3 for st in sts)  # our TP: ZeRO 0-2
    assert not any(st.sequence_degree > 1 and (st.tensor_degree > 1 or st.pipeline_degree > 1) for st in sts)
    gpt, _ = search_layouts(compose(CASES[2]))
    # GPT2LMHeadModel has no layer list: no stages, and no TP (ours is that layer list)
    assert gpt and all(c.strategy.pipeline_degree == 1 and c.strategy.tensor_degree == 1 for c in gpt)


def test_search_proposes_context_parallel_at_long_context_and_never_what_train_refuses():
    """At 131,072 tokens Llama-3.1-8B fits only with the sequence split (Llama 3 trained at 131k with CP); CP candidates
    come without Ulysses (config/layout.py), with seq_length % (2 CP) = 0, and composed with TP and PP (Llama 3's
    layout) where every CP rank keeps >= COMPOSED_CP_MIN_TOKENS tokens; never CP x TP under ZeRO-3 (refused)."""
    from launcher.plan.search import COMPOSED_CP_MIN_TOKENS

    ranked, _ = search_layouts(compose(["recipe=llama3.1-8b", "data.seq_length=131072"]))
    sts = [c.strategy for c in ranked]
    assert any(st.context_degree > 1 and st.tensor_degree == st.pipeline_degree == 1 for st in sts)
    assert any(st.context_degree > 1 and st.tensor_degree > 1 for st in sts)
    for st in sts:
        if st.context_degree > 1:
            assert st.sequence_degree == 1
            assert st.seq_length % (2 * st.context_degree) == 0
            if st.tensor_degree > 1 or st.pipeline_degree > 1:
                assert st.seq_length // st.context_degree >= COMPOSED_CP_MIN_TOKENS
                assert st.zero_stage <= (1 if st.pipeline_degree > 1 else 2)
    # A CP rank holds S / CP tokens at one rank's bytes per token (activations.py): its activations are exactly 1 / CP of
    # the same layout's without CP.
    import dataclasses

    from launcher.plan.inputs import model_shape, resolve_hardware
    from launcher.plan.memory import estimate_memory

    cfg = compose(["recipe=llama3.1-8b", "data.seq_length=131072"])
    shape, hw = model_shape(cfg.model), resolve_hardware(cfg.cluster, cfg.precision.dtype)
    cand = next(c for c in ranked if c.strategy.context_degree > 1 and c.strategy.tensor_degree == c.strategy.pipeline_degree == 1)
    st = cand.strategy
    whole = dataclasses.replace(st, context_degree=1, data_degree=st.data_degree * st.context_degree)
    ratio = estimate_memory(shape, whole, hw).peak.activations / cand.memory.peak.activations
    assert ratio == pytest.approx(st.context_degree, rel=1e-9)


def test_gpt3_175b_recipe_has_no_layout_train_runs(tmp_path):
    # The recipe is Megatron's TP 8 x PP 8 on 1,024 A100. The runtime has no GPT layer list, so neither stages nor TP
    # (our TP layers are that layer list at every pipeline degree); at TP 1 and PP 1, DP 1,024 does not divide the
    # 1,536-sequence batch, so nothing is runnable: the search must say so, not propose.
    cfg = compose(["recipe=gpt3-175b", f"runs_dir={tmp_path}"])
    ranked, counts = search_layouts(cfg)
    assert ranked == [] and counts["fit"] == 0
    with pytest.raises(ConfigError) as err:
        validate_before_start(cfg)
    assert err.value.key == "parallel.pipeline_degree"


@pytest.mark.parametrize("over", [
    ["recipe=llama-65b"], ["recipe=bloom-176b"], ["recipe=tiny", "cluster.gpus_per_node=4", "parallel.pipeline_degree=2", "parallel.zero_stage=1"],
    ["recipe=llama2-70b", "cluster.nodes=6", "parallel.tensor_degree=4", "parallel.pipeline_degree=3"],
])
def test_node_stage_sets_match_the_rank_map(over):
    layout = resolve_layout(compose(over))
    assert node_stage_sets(layout) == sorted({tuple(n) for n in stages_by_node(layout)})


def test_search_proposes_the_fewest_checkpointed_blocks_that_fit():
    """Where a layout fits with every block checkpointed and not with none, the search also proposes the fewest
    checkpointed blocks a stage that fit (model.checkpoint_blocks): one fewer does not fit, and it is faster than
    checkpointing every block (less recompute). Llama 3.1 405B on 16,384 H100s, the issue's largest search."""
    import dataclasses

    from launcher.plan.inputs import model_shape, resolve_hardware
    from launcher.plan.memory import estimate_memory
    from launcher.plan.steptime import estimate_step_time

    cfg = compose(["recipe=llama3.1-405b", "cluster.gpu=h100-80gb", "cluster.nodes=2048"])
    ranked, _ = search_layouts(cfg)
    shape, hw = model_shape(cfg.model), resolve_hardware(cfg.cluster, cfg.precision.dtype)
    partial = [c for c in ranked if c.strategy.checkpoint_blocks is not None]
    assert partial and ranked[0] in partial
    for cand in partial[:20]:
        st = cand.strategy
        assert st.recompute == "full" and cand.memory.fits
        none = dataclasses.replace(st, recompute="none", checkpoint_blocks=None)
        assert not estimate_memory(shape, none, hw).fits
        if st.checkpoint_blocks > 1:
            fewer = dataclasses.replace(st, checkpoint_blocks=st.checkpoint_blocks - 1)
            assert not estimate_memory(shape, fewer, hw).fits
        every = dataclasses.replace(st, checkpoint_blocks=None)
        assert estimate_step_time(shape, st, hw).step_time_s < estimate_step_time(shape, every, hw).step_time_s


def test_search_proposes_selective_checkpointing_where_none_does_not_fit(tmp_path):
    """model.checkpoint_mode=selective: where a layout of the transformers model (no TP, PP, SP, CP) does not fit
    without recompute, the search also tries keeping the matmuls' outputs, on every block and on the fewest a stage
    that fit (where one fewer does not, and faster than every block). Each such candidate passes train's validation, holds more memory than full checkpointing and takes less time (no GEMM recomputed), and more time
    than no recompute (its element-wise operators run twice). Llama 3.1 8B's recipe on its 128 H100s."""
    import dataclasses

    from launcher.plan.inputs import model_shape, resolve_hardware
    from launcher.plan.memory import estimate_memory
    from launcher.plan.steptime import estimate_step_time

    cfg = compose(["recipe=llama3.1-8b", f"runs_dir={tmp_path}"])
    ranked, _ = search_layouts(cfg)
    shape, hw = model_shape(cfg.model), resolve_hardware(cfg.cluster, cfg.precision.dtype)
    selective = [c for c in ranked if c.strategy.recompute == "selective"]
    assert selective
    for cand in selective:
        st = cand.strategy
        assert st.tensor_degree == st.pipeline_degree == st.sequence_degree == st.context_degree == 1
        validate_before_start(_candidate_config(cfg, st))
        none, full = dataclasses.replace(st, recompute="none"), dataclasses.replace(st, recompute="full")
        assert not estimate_memory(shape, none, hw).fits and estimate_memory(shape, full, hw).fits
        assert estimate_memory(shape, full, hw).peak.total < cand.memory.peak.total
        times = [estimate_step_time(shape, x, hw).step_time_s for x in (none, st, full)]
        assert times[0] < times[1] < times[2], times
        if st.checkpoint_blocks is not None:      # the fewest selectively checkpointed blocks that fit
            fewer = dataclasses.replace(st, checkpoint_blocks=st.checkpoint_blocks - 1)
            assert st.checkpoint_blocks == 1 or not estimate_memory(shape, fewer, hw).fits
            every = dataclasses.replace(st, checkpoint_blocks=None)
            assert cand.time.step_time_s < estimate_step_time(shape, every, hw).step_time_s
    assert any(c.strategy.checkpoint_blocks is not None for c in selective)


def test_search_says_which_layouts_accumulate_gradients_in_bf16():
    # bf16 ZeRO-1 pipelines without precision.grad_accum_dtype=fp32 sum their micro-batches' gradients in bf16
    # (DeepSpeed's ZeRO-1 optimizer; fp32 is its BF16_Optimizer). The plan warns; since the step time charges
    # BF16_Optimizer its accumulation, such layouts rank first for llama-65b (2,048 A100s), so each row says so in
    # its "why" and carries its layout's warnings. ZeRO-0 pipelines (BF16_Optimizer, bf16 accumulation by its own
    # choice, no warning) and layouts without a pipeline do not.
    # Each flagged row also prices the warning's fix: the same layout planned with precision.grad_accum_dtype=fp32
    # (BF16_Optimizer), which must be what `launcher plan` says of that layout configured so.
    from launcher.plan.inputs import model_shape, resolve_hardware, strategy
    from launcher.plan.memory import estimate_memory
    from launcher.plan.search import fp32_accumulation, search_rows
    from launcher.plan.steptime import estimate_step_time

    cfg = compose(["recipe=llama-65b"])
    ranked, _ = search_layouts(cfg)
    rows = search_rows(ranked, top=40)
    fp32_accumulation(cfg, ranked, rows)
    flagged = [r for r in rows if "accumulated in bf16" in r["why"]]
    assert flagged and len(flagged) < len(rows)
    for r in rows:
        bf16_sum = r["pipeline_degree"] > 1 and r["zero_stage"] == 1
        assert ("accumulated in bf16" in r["why"]) == bf16_sum, r
        assert any("accumulates the micro-batch gradients in bf16" in w for w in r["warnings"]) == bf16_sum, r
        assert (r["fp32_accumulation"] is not None) == bf16_sum == ("grad_accum_dtype=fp32:" in r["why"]), r
    for r in flagged[:3]:
        blocks = [f"model.checkpoint_blocks={r['checkpoint_blocks']}"] if r["checkpoint_blocks"] else []
        own = compose(["recipe=llama-65b", "precision.grad_accum_dtype=fp32",
                       f"parallel.tensor_degree={r['tensor_degree']}", f"parallel.pipeline_degree={r['pipeline_degree']}",
                       f"parallel.sequence_parallel={str(r['sequence_parallel']).lower()}", "parallel.zero_stage=1",
                       f"batch.micro_batch_size={r['micro_batch_size']}",
                       f"model.activation_checkpointing={str(r['recompute'] != 'none').lower()}"] + blocks)
        st = strategy(own, resolve_layout(own))
        hw = resolve_hardware(own.cluster, own.precision.dtype)
        shape = model_shape(own.model)
        twin = r["fp32_accumulation"]
        assert twin["step_time_s"] == pytest.approx(estimate_step_time(shape, st, hw).step_time_s, rel=1e-12), r
        assert twin["memory_total_bytes"] == pytest.approx(estimate_memory(shape, st, hw).peak.total, rel=1e-12), r
        # BF16_Optimizer's fp32 add every micro-batch costs time, its whole fp32 buffer memory
        assert twin["slower"] > 0 and twin["memory_total_bytes"] > r["memory_total_bytes"], r
    # with fp32 accumulation asked for, none is flagged (ZeRO-0 layouts are then refused: DeepSpeed would be)
    ranked, _ = search_layouts(compose(["recipe=llama-65b", "precision.grad_accum_dtype=fp32"]))
    rows = search_rows(ranked, top=40)
    assert rows and not any("accumulated in bf16" in r["why"] for r in rows)
    assert all(r["zero_stage"] != 0 for r in rows)


def test_search_chunks_the_loss_where_the_runtime_can(tmp_path):
    """With model.chunked_loss=true the search keeps it on the layouts whose loss is the transformers model's (no TP
    or PP; Ulysses and CP included) and plans the others with their own loss, rather than dropping them; a chunked
    layout plans less memory than the same layout with the whole loss (Llama 3's 128,256-token vocabulary)."""
    from dataclasses import replace

    from launcher.plan.inputs import model_shape, resolve_hardware
    from launcher.plan.memory import estimate_memory

    cfg = compose(["recipe=llama3.1-8b", "model.chunked_loss=true", f"runs_dir={tmp_path}"])
    ranked, _ = search_layouts(cfg)
    plain = [c for c in ranked if c.strategy.tensor_degree == c.strategy.pipeline_degree == 1]
    assert plain and len(plain) < len(ranked)
    for cand in ranked:
        assert cand.strategy.chunked_loss == (cand in plain)
    others = [c for c in ranked if c not in plain]
    for cand in plain[:5] + others[:5]:      # what train runs accepts them as proposed
        validate_before_start(_candidate_config(cfg, cand.strategy))
    shape, hw = model_shape(cfg.model), resolve_hardware(cfg.cluster, cfg.precision.dtype)
    st = plain[0].strategy
    whole = estimate_memory(shape, replace(st, chunked_loss=False), hw)
    assert plain[0].memory.peak.total < whole.peak.total


def test_search_tries_the_chunked_loss_where_the_whole_one_does_not_fit(tmp_path):
    """With model.chunked_loss at its default (false) the search adds a layout's chunked-loss twin only where the
    runtime runs it (no TP or PP) and the whole loss does not fit: each chunked layout it proposes plans over the GPU's
    memory with the whole loss, none duplicates a whole-loss layout, train's validation accepts it as proposed, and
    its row and label say so. Llama 3.1 8B (128,256-token vocabulary, seq 8,192) gains layouts without recompute and
    with fewer checkpointed blocks than the whole loss allows."""
    from dataclasses import replace

    from launcher.plan.inputs import model_shape, resolve_hardware
    from launcher.plan.memory import estimate_memory
    from launcher.plan.search import search_rows

    cfg = compose(["recipe=llama3.1-8b", f"runs_dir={tmp_path}"])
    assert not cfg.model.chunked_loss
    ranked, _ = search_layouts(cfg)
    shape, hw = model_shape(cfg.model), resolve_hardware(cfg.cluster, cfg.precision.dtype)
    chunked = [c for c in ranked if c.strategy.chunked_loss]
    assert chunked

    def key(st):
        return replace(st, chunked_loss=False)

    whole_layouts = {key(c.strategy) for c in ranked if not c.strategy.chunked_loss}
    for cand in chunked:
        st = cand.strategy
        assert st.tensor_degree == st.pipeline_degree == 1
        assert not estimate_memory(shape, key(st), hw).fits, st
        assert key(st) not in whole_layouts
    assert any(c.strategy.recompute == "none" for c in chunked)
    assert any(c.strategy.checkpoint_blocks is not None for c in chunked)
    for cand in chunked[:5]:
        validate_before_start(_candidate_config(cfg, cand.strategy))
    rows = search_rows(chunked, top=3)
    assert all(r["chunked_loss"] and r["layout"].endswith("chunked-loss") for r in rows)
