"""The search's memoised pipeline cut (plan/stages.py, functools.lru_cache) gives what the uncached functions give.

`launcher plan --search` asks for the blocks and parameters of every stage of every candidate many times over;
stages.py caches them per (model shape, padded vocab, PP, partition method[, TP, stage]). These tests hold the
cached values to the undecorated functions (`__wrapped__`) for every stage of every proposed layout, and the whole
ranked search to itself across cold caches, caches warmed by another model, and a different partition method:
a cache key that missed an input would hand one model's (or method's) cut to another here.
"""

from __future__ import annotations

import pytest

from launcher.config.compose import compose
from launcher.plan import stages
from launcher.plan.inputs import model_shape
from launcher.plan.search import search_layouts

CACHED = (stages.pipeline_layer_params, stages.stage_param_counts, stages.rank_param_count, stages.rank_param_counts,
          stages.stage_blocks)


def _clear():
    for fn in CACHED:
        fn.cache_clear()


def _ranked(overrides):
    ranked, counts = search_layouts(compose(overrides))
    return counts, [repr(c) for c in ranked]   # every field of layout, strategy, memory and time


@pytest.mark.parametrize("overrides", [["recipe=bloom-176b"],
                                       ["recipe=llama-65b", "cluster.gpu=h100-80gb", "cluster.nodes=64"]],
                         ids=lambda o: " ".join(o))
def test_cached_stage_cut_equals_uncached_for_every_proposed_layout(overrides):
    _clear()
    cfg = compose(overrides)
    ranked, _ = search_layouts(cfg)
    shape = model_shape(cfg.model)
    seen = {(c.strategy.padded_vocab_size, c.strategy.pipeline_degree, c.strategy.partition_method, c.strategy.tensor_degree)
            for c in ranked}
    assert any(pp > 1 for _, pp, _, _ in seen), "the case must propose pipelines"
    for vocab, pp, method, tp in sorted(seen):
        assert stages.pipeline_layer_params(shape, vocab) == stages.pipeline_layer_params.__wrapped__(shape, vocab)
        assert stages.stage_blocks(shape, vocab, pp, method) == stages.stage_blocks.__wrapped__(shape, vocab, pp, method)
        assert (stages.stage_param_counts(shape, vocab, pp, method)
                == stages.stage_param_counts.__wrapped__(shape, vocab, pp, method))
        for s in range(pp):
            assert (stages.rank_param_count(shape, vocab, pp, method, tp, s)
                    == stages.rank_param_count.__wrapped__(shape, vocab, pp, method, tp, s)
                    == stages.rank_param_counts(shape, vocab, pp, method, tp)[s])


def test_search_is_the_same_from_cold_and_from_caches_warmed_by_another_model():
    bloom = ["recipe=bloom-176b"]
    _clear()
    cold = _ranked(bloom)
    _ranked(["recipe=llama-65b", "cluster.gpu=h100-80gb", "cluster.nodes=64"])   # same PP degrees, another model
    warm = _ranked(bloom)
    assert warm == cold
    assert stages.stage_blocks.cache_info().hits > 0


def test_partition_method_is_part_of_the_cached_cut():
    """BLOOM-176B on 12 stages: `parameters` gives the published 5 / 10 x 6 / 5 blocks; `uniform` cuts the 74 layers
    (embedding, its norm, 70 blocks, final norm, tied copy) 74 = 12 x 6 + 2, so 7, 7, then 6 layers a stage: blocks
    5 (after the embedding and its norm), 7, 9 x 6, 4 (before the final norm and the tied copy). The cache must not
    serve one method's cut for the other."""
    shape = model_shape(compose(["recipe=bloom-176b"]).model)
    vocab = 250880
    _clear()
    by_params = stages.stage_blocks(shape, vocab, 12, "parameters")
    uniform = stages.stage_blocks(shape, vocab, 12, "uniform")
    assert by_params == (5,) + (6,) * 10 + (5,)
    assert uniform == (5, 7) + (6,) * 9 + (4,)
    assert uniform == stages.stage_blocks.__wrapped__(shape, vocab, 12, "uniform")
    assert stages.stage_blocks(shape, vocab, 12, "parameters") == by_params   # both cuts now cached side by side
