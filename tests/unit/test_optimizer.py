"""Optimizer conventions (issue 15): no weight decay on norm weights and biases; torch's fused AdamW on GPU ranks.

The groups are read off real models built by the runtime (launcher.runtime.model.build_model); the names
expected without decay are written out here by hand from the transformers classes' module names.
"""

from __future__ import annotations

import pytest

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout

SMALL = ["model=tiny", "model.hidden_size=32", "model.num_attention_heads=2", "model.num_key_value_heads=2",
         "model.num_hidden_layers=2", "model.intermediate_size=64", "model.vocab_size=320", "cluster=cpu"]
GPT = SMALL + ["model.arch=gpt", "model.num_key_value_heads=null", "model.intermediate_size=null",
               "model.max_position_embeddings=64", "model.tie_word_embeddings=true", "data.seq_length=64"]
BLOOM = SMALL + ["model.arch=bloom", "model.num_key_value_heads=null", "model.intermediate_size=null",
                 "model.tie_word_embeddings=true"]


def _built(overrides):
    from launcher.runtime.model import build_model

    cfg = compose(overrides)
    return cfg, build_model(cfg.model, 1, vocab_size=resolve_layout(cfg).padded_vocab_size)


def test_llama_norm_weights_get_no_decay():
    from launcher.runtime.optimizer import no_decay_names, param_groups

    cfg, model = _built(SMALL)
    expected = [f"model.layers.{i}.{n}.weight" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm")]
    assert no_decay_names(model) == expected + ["model.norm.weight"]
    groups = param_groups(model, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    decayed = {id(p) for p in groups[0]["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    # Every matrix and the embedding decay (Megatron, HF, nanoGPT alike).
    assert "model.embed_tokens.weight" in names and "model.layers.1.mlp.down_proj.weight" in names
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(list(model.parameters()))


def test_gpt_biases_and_layernorms_get_no_decay():
    from launcher.runtime.optimizer import no_decay_names

    _, model = _built(GPT)
    names = no_decay_names(model)
    per_block = ["ln_1.weight", "ln_1.bias", "attn.c_attn.bias", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                 "mlp.c_fc.bias", "mlp.c_proj.bias"]
    assert names == [f"transformer.h.{i}.{n}" for i in range(2) for n in per_block] + \
        ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    assert "transformer.wpe.weight" not in names and "transformer.wte.weight" not in names


@pytest.mark.parametrize("overrides", [SMALL, SMALL + ["model.arch=mistral"], SMALL + ["model.arch=qwen2"], GPT, BLOOM],
                         ids=["llama", "mistral", "qwen2", "gpt", "bloom"])
def test_planner_groups_match_the_built_model(overrides):
    """The planner's exact memory ledger (no torch) sizes the same two groups the engine gets."""
    from launcher.plan.params import param_decays, param_group_numels
    from launcher.runtime.optimizer import decays, param_groups

    cfg, model = _built(overrides)
    named = list(model.named_parameters())
    assert list(param_decays(cfg.model)) == [decays(n, p) for n, p in named]
    vocab = resolve_layout(cfg).padded_vocab_size
    assert param_group_numels(cfg.model, vocab) == [tuple(p.numel() for p in g["params"]) for g in param_groups(model, 0.1)]


@pytest.mark.parametrize("overrides, fused", [
    (["recipe=llama-7b"], True),                                    # GPU ranks: torch's fused AdamW
    (["recipe=llama-7b", "parallel.offload_optimizer=true", "parallel.zero_stage=2"], None),  # the step runs on the CPU
    (["recipe=tiny", "cluster=cpu"], None),                         # CPU ranks: torch's default (foreach)
    (["recipe=tiny", "cluster=cpu", "optimizer.fused=true"], True),  # asked for
    (["recipe=llama-7b", "optimizer.fused=false"], None),
    (["recipe=llama-7b", "optimizer.torch_adam=false"], None),      # DeepSpeed's FusedAdam: fused by construction
])
def test_fused_adamw_on_gpu_ranks_by_default(overrides, fused):
    from launcher.deepspeed_config import build_deepspeed_config

    cfg = compose(overrides)
    params = build_deepspeed_config(cfg, resolve_layout(cfg))["optimizer"]["params"]
    assert params.get("fused") == fused
