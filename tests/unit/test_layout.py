"""Layout resolution as tables: valid layouts with independently computed numbers, and invalid ones."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.config.errors import ConfigError
from tests.config.test_bad_configs import load as load_catalogue

# (overrides, expected derived numbers). The BLOOM row comes from the BigScience tr11-176B-ml training
# script and paper: 48 nodes x 8 GPUs, TP 4, PP 12 -> DP 8; micro 2, global 2048 -> 128 accumulation steps;
# 2048 x 2048 = 4,194,304 tokens per step; bubble (p - 1) / m = 11 / 128.
VALID = [
    (["recipe=bloom-176b"],
     dict(world_size=384, tensor_degree=4, pipeline_degree=12, data_degree=8, grad_accum_steps=128,
          tokens_per_step=4_194_304, pipeline_micro_batches=128, bubble_fraction=11 / 128)),
    # Narayanan et al. 2021, Table 1: GPT-3 175B on 1024 GPUs, TP 8, PP 8, batch 1536 -> DP 16, 96 micro-batches.
    (["recipe=gpt3-175b"],
     dict(world_size=1024, data_degree=16, grad_accum_steps=96, tokens_per_step=1536 * 2048, bubble_fraction=7 / 96)),
    (["recipe=llama-7b"], dict(world_size=64, data_degree=64, grad_accum_steps=8, tokens_per_step=2048 * 2048)),
    (["recipe=llama-65b"], dict(world_size=2048, data_degree=64, grad_accum_steps=32, bubble_fraction=3 / 32)),
    (["recipe=llama2-70b"], dict(world_size=512, data_degree=16, grad_accum_steps=64, tokens_per_step=1024 * 4096)),
    (["model=llama-65b", "cluster.nodes=256", "parallel.tensor_degree=8", "batch.global_batch_size=2048"],
     dict(world_size=2048, data_degree=256, grad_accum_steps=2, bubble_fraction=0.0)),
    (["recipe=tiny"], dict(world_size=2, data_degree=2, grad_accum_steps=1, device="cpu", tokens_per_step=16 * 128)),
    (["recipe=tiny", "batch.micro_batch_size=1", "batch.global_batch_size=8"], dict(data_degree=2, grad_accum_steps=4)),
    # Sequence parallel takes ranks like TP: 8 / (1 x 1 x 2) = 4 replicas.
    (["model=llama-7b", "parallel.sequence_degree=2", "batch.micro_batch_size=1", "batch.global_batch_size=8",
      "data.seq_length=2048"], dict(world_size=8, data_degree=4, grad_accum_steps=2)),
    (["recipe=llama-7b", "parallel.data_degree=64"], dict(data_degree=64)),
]


@pytest.mark.parametrize("overrides,expected", VALID, ids=[" ".join(o) for o, _ in VALID])
def test_valid_layouts(resolve, overrides, expected):
    _, layout = resolve(overrides)
    got = {k: getattr(layout, k) for k in expected}
    assert got == pytest.approx(expected)


def test_layout_is_frozen_and_config_untouched(resolve):
    cfg, layout = resolve(["recipe=bloom-176b"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.data_degree = 1  # type: ignore[misc]
    assert cfg.parallel.data_degree is None  # derived values are never written back


def test_bloom_warns_uneven_stages_and_gpt3_pads_vocab(resolve):
    _, bloom = resolve(["recipe=bloom-176b"])
    assert any("70" in w and "12" in w for w in bloom.warnings)
    _, gpt = resolve(["recipe=gpt3-175b"])
    # 50,257 rounded up to a multiple of TP 8: ceil(50257 / 8) * 8 = 6283 * 8.
    assert gpt.padded_vocab_size == 6283 * 8
    assert any("padded" in w for w in gpt.warnings)


def test_tp_beyond_node_is_warned(resolve):
    _, layout = resolve(["model=llama-65b", "cluster.nodes=4", "parallel.tensor_degree=16", "batch.micro_batch_size=1",
                         "batch.global_batch_size=16"])
    assert any("inter-node" in w for w in layout.warnings)


@pytest.mark.parametrize("overrides,warned", [
    (["recipe=bloom-176b", "precision.grad_accum_dtype=null"], True),   # bf16 + PP 12 + ZeRO-1, bf16 accumulation
    (["recipe=bloom-176b"], False),                                      # the recipe: fp32 accumulation
    (["recipe=bloom-176b", "precision=fp32", "precision.grad_accum_dtype=null"], False),
    (["recipe=llama-7b", "parallel.zero_stage=1"], False),              # bf16 + ZeRO-1 but no pipeline
])
def test_bf16_pipeline_zero1_without_fp32_accumulation_is_warned(resolve, overrides, warned):
    _, layout = resolve(overrides)
    assert any("grad_accum_dtype=fp32" in w for w in layout.warnings) == warned


@pytest.mark.parametrize("overrides,warned", [
    (["parallel.sequence_degree=2", "parallel.zero_stage=1", "precision.reduce_dtype=bf16"], True),
    (["parallel.sequence_degree=2", "parallel.zero_stage=2", "precision.reduce_dtype=bf16"], True),
    (["parallel.sequence_degree=2", "parallel.zero_stage=1"], False),     # not asked for: DeepSpeed's fp32 as before
    (["parallel.sequence_degree=2", "parallel.zero_stage=3", "precision.reduce_dtype=bf16"], False),  # honoured
    (["parallel.zero_stage=1", "precision.reduce_dtype=bf16"], False),     # no Ulysses / CP
])
def test_a_reduce_dtype_zero12_ignores_under_ulysses_is_warned(resolve, overrides, warned):
    _, layout = resolve(["recipe=llama-7b", *overrides])
    assert any("precision.reduce_dtype=bf16 is not what" in w for w in layout.warnings) == warned


# The invalid layouts live in the shared bad-config catalogue; here they run through resolve_layout directly.
INVALID = [(e["args"], e["key"], e["says"]) for e in load_catalogue("layout")]


@pytest.mark.parametrize("overrides,key,fragment", INVALID, ids=[" ".join(o) for o, _, _ in INVALID])
def test_invalid_layouts_name_key_rule_and_fix(resolve, overrides, key, fragment):
    with pytest.raises(ConfigError) as info:
        resolve(overrides)
    err = info.value
    message = str(err)
    assert err.key == key, message
    assert message.startswith(f"{key}="), message
    assert "\n  fix: " in message and err.fix.strip(), message
    assert fragment in message, message


def test_at_least_25_invalid_cases():
    assert len(INVALID) >= 25
