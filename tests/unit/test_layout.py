"""Layout resolution as tables: valid layouts with independently computed numbers, and invalid ones."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.config.errors import ConfigError

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


# (overrides, key the message must name, fragment of the rule or fix the message must contain)
INVALID = [
    (["recipe=llama-7b", "batch.global_batch_size=1000"], "batch.global_batch_size", "nearest valid global_batch_size: 768 or 1024"),
    (["recipe=llama-7b", "batch.micro_batch_size=3"], "batch.global_batch_size", "3 x 64 = 192"),
    (["recipe=llama-7b", "parallel.tensor_degree=3"], "parallel.tensor_degree", "32 % 3"),
    (["recipe=llama-7b", "parallel.tensor_degree=5", "cluster.nodes=5"], "parallel.tensor_degree", "32 % 5"),
    (["recipe=llama-7b", "parallel.pipeline_degree=3"], "parallel.pipeline_degree", "parallel.pipeline_degree to 2 or 4"),
    (["recipe=llama2-70b", "parallel.tensor_degree=16", "cluster.nodes=128"], "parallel.tensor_degree", "key/value heads: model.num_key_value_heads % tensor_degree = 8 % 16"),
    (["recipe=tiny", "parallel.pipeline_degree=8", "cluster.gpus_per_node=8", "batch.global_batch_size=8", "batch.micro_batch_size=1", "parallel.zero_stage=1"],
     "parallel.pipeline_degree", "pipeline_degree > model.num_hidden_layers (8 > 4)"),
    (["recipe=bloom-176b", "parallel.zero_stage=2"], "parallel.zero_stage", "stage 0 or 1"),
    (["recipe=bloom-176b", "parallel.zero_stage=3"], "parallel.zero_stage", "parallel.pipeline_degree=1"),
    (["recipe=tiny", "precision=fp16"], "precision.dtype", "bf16"),
    (["recipe=llama-7b", "parallel.sequence_degree=3", "cluster.nodes=3"], "parallel.sequence_degree", "2048 % 3"),
    (["recipe=llama-7b", "parallel.sequence_degree=2", "data.seq_length=2047"], "parallel.sequence_degree", "2047 % 2"),
    (["recipe=llama-33b", "parallel.pipeline_degree=1", "parallel.sequence_degree=8", "parallel.tensor_degree=1"],
     "parallel.sequence_degree", "52 % 8"),
    (["recipe=bloom-176b", "parallel.sequence_degree=2"], "parallel.sequence_degree", "pipeline_degree=12"),
    (["recipe=llama-7b", "parallel.data_degree=32"], "parallel.data_degree", "= 64"),
    (["recipe=llama-7b", "parallel.zero_stage=4"], "parallel.zero_stage", "0, 1, 2 or 3"),
    (["recipe=llama-7b", "parallel.zero_stage=-1"], "parallel.zero_stage", "0, 1, 2 or 3"),
    (["recipe=llama-7b", "cluster.nodes=0"], "cluster.nodes", ">= 1"),
    (["recipe=llama-7b", "cluster.gpus_per_node=-8"], "cluster.gpus_per_node", ">= 1"),
    (["recipe=llama-7b", "batch.micro_batch_size=0"], "batch.micro_batch_size", ">= 1"),
    (["recipe=llama-7b", "batch.global_batch_size=-2048"], "batch.global_batch_size", ">= 1"),
    (["recipe=llama-7b", "parallel.tensor_degree=0"], "parallel.tensor_degree", ">= 1"),
    (["recipe=llama-7b", "data.seq_length=0"], "data.seq_length", ">= 1"),
    (["recipe=llama-7b", "data.seq_length=4096"], "data.seq_length", "max_position_embeddings = 2048"),
    (["recipe=llama-7b", "model.hidden_size=4100"], "model.hidden_size", "4100 % 32"),
    (["recipe=llama-7b", "model.num_key_value_heads=5"], "model.num_key_value_heads", "32 % 5"),
    (["recipe=bloom-176b", "model.num_key_value_heads=8"], "model.num_key_value_heads", "no grouped-query attention"),
    (["recipe=gpt3-175b", "model.intermediate_size=1000"], "model.intermediate_size", "4 x hidden_size"),
    (["recipe=llama-7b", "model.arch=mamba"], "model.arch", "llama"),
    (["recipe=llama-7b", "model.vocab_size=0"], "model.vocab_size", ">= 1"),
    (["recipe=llama-7b", "model.num_hidden_layers=0"], "model.num_hidden_layers", ">= 1"),
    (["recipe=llama-7b", "cluster.gpu=tpu-v9"], "cluster.gpu", "cluster.peak_tflops"),
    (["recipe=llama-7b", "parallel.offload_param=true"], "parallel.offload_param", "zero_stage=3"),
    (["recipe=llama-7b", "parallel.zero_stage=0", "parallel.offload_optimizer=true"], "parallel.offload_optimizer", "zero_stage >= 1"),
    (["recipe=llama-7b", "precision.dtype=fp8"], "precision.dtype", "fp32, bf16, fp16"),
    (["recipe=llama-13b", "model.intermediate_size=13825"], "parallel.tensor_degree", "13825 % 2"),
]


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
