"""The issue's Megatron SP command (`recipe=tiny cluster.gpus_per_node=4 parallel.tensor_degree=2
parallel.sequence_parallel=true`, ZeRO-2) resolves and renders for DeepSpeed's plain engine; ZeRO-3 stays refused.
Pure: no torch, no ranks (the runs are tests/parallel's)."""

from __future__ import annotations

import pytest

from launcher.config.compose import compose
from launcher.config.errors import ConfigError
from launcher.config.layout import resolve_layout
from launcher.config.supported import check_supported
from launcher.deepspeed_config import build_deepspeed_config

ISSUE = ["recipe=tiny", "cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.sequence_parallel=true"]


def test_issue_command_renders_zero2_for_the_plain_engine():
    cfg = compose(ISSUE)
    layout = resolve_layout(cfg)
    check_supported(cfg, layout)
    assert (layout.zero_stage, layout.tensor_degree, layout.data_degree) == (2, 2, 2)
    assert layout.pipeline_layers and not layout.pipeline_engine
    ds = build_deepspeed_config(cfg, layout)
    assert ds["zero_optimization"]["stage"] == 2
    # No pipeline section (no PipelineEngine) and no AutoTP (our TP layers); the grid is the mpu, so DeepSpeed's
    # batch check counts data-parallel ranks only: 8 micro x 1 accum x 2 replicas = the recipe's 16 sequences.
    assert "pipeline" not in ds and "tensor_parallel" not in ds
    assert ds["train_batch_size"] == 16 == cfg.batch.global_batch_size


def test_zero3_with_megatron_sp_is_refused_with_a_fix():
    cfg = compose(ISSUE + ["parallel.zero_stage=3"])
    with pytest.raises(ConfigError) as e:
        check_supported(cfg, resolve_layout(cfg))
    assert e.value.key == "parallel.zero_stage" and "zero_stage=2" in str(e.value)


def test_with_stages_zero2_stays_refused():
    with pytest.raises(ConfigError) as e:
        resolve_layout(compose(ISSUE + ["cluster.gpus_per_node=4", "parallel.pipeline_degree=2"]))
    assert e.value.key == "parallel.zero_stage" and "pipeline engine" in str(e.value)
