"""`model.init_from` / `model.hf_config`: the loaded config.json is the model; model.* must equal it (no torch here).

Each config.json is written by the test as transformers writes one (5.x: `rope_parameters`; 4.x: `rope_theta` +
`rope_scaling`), and each refusal must name the key, both values and a fix before anything starts.
"""

import json

import pytest

from launcher.config.errors import ConfigError

LLAMA31_8B = {  # meta-llama/Llama-3.1-8B config.json as transformers 4.43 wrote it
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16", "use_cache": True,
}


def write(tmp_path, cfg: dict, name="ckpt"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_recipe_matches_the_released_config(resolve, tmp_path):
    d = write(tmp_path, LLAMA31_8B)
    cfg, layout = resolve(["recipe=llama3.1-8b", f"model.init_from={d}"])
    assert layout.padded_vocab_size == 128256
    # model.hf_config: the same, naming the .json file itself
    resolve(["recipe=llama3.1-8b", f"model.hf_config={d / 'config.json'}"])


@pytest.mark.parametrize("override,key,says", [
    ("model.rope_theta=10000", "model.rope_theta", "rope_theta = 500000.0"),
    ("model.rope_scaling=null", "model.rope_scaling", "'rope_type': 'llama3'"),
    ("model.rms_norm_eps=1e-6", "model.rms_norm_eps", "rms_norm_eps = 1e-05"),
    ("model.num_key_value_heads=32", "model.num_key_value_heads", "num_key_value_heads = 8"),
    ("model.vocab_size=128000", "model.vocab_size", "vocab_size = 128256"),
    ("model.max_position_embeddings=8192", "model.max_position_embeddings", "131072"),
    ("model.arch=mistral", "model.arch", "arch = 'llama'"),
])
def test_mismatch_names_both_values(resolve, tmp_path, override, key, says):
    d = write(tmp_path, LLAMA31_8B)
    with pytest.raises(ConfigError) as err:
        resolve(["recipe=llama3.1-8b", f"model.init_from={d}", override])
    assert err.value.key == key and says in str(err.value) and "fix:" in str(err.value)


def test_transformers5_rope_parameters_read(resolve, tmp_path):
    hf = {k: v for k, v in LLAMA31_8B.items() if k not in ("rope_theta", "rope_scaling")}
    hf["rope_parameters"] = {"rope_theta": 500000.0, **LLAMA31_8B["rope_scaling"]}
    resolve(["recipe=llama3.1-8b", f"model.init_from={write(tmp_path, hf)}"])


def test_missing_path_and_hub_name(resolve, tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve(["recipe=llama3.1-8b", "model.init_from=meta-llama/Llama-3.1-8B"])
    assert err.value.key == "model.init_from" and "hub name" in str(err.value) and "`hf download meta-llama/Llama-3.1-8B`" in str(err.value)
    with pytest.raises(ConfigError) as err:
        resolve(["recipe=llama3.1-8b", f"model.hf_config={tmp_path / 'none.json'}"])
    assert err.value.key == "model.hf_config"


@pytest.mark.parametrize("change,overrides,key,says", [
    ({"attention_bias": True}, [], "model.init_from", "attention_bias"),
    ({"head_dim": 64}, [], "model.init_from", "head_dim 64"),
    ({"vocab_size": 128257}, ["parallel.tensor_degree=2", "model.vocab_size=128257"], "parallel.tensor_degree",
     "128257 % 2"),
])
def test_unsupported_checkpoints_refused(resolve, tmp_path, change, overrides, key, says):
    d = write(tmp_path, {**LLAMA31_8B, **change})
    with pytest.raises(ConfigError) as err:
        resolve(["recipe=llama3.1-8b", f"model.init_from={d}", *overrides])
    assert err.value.key == key and says in str(err.value)


def test_sliding_window_shorter_than_the_sequence(resolve, tmp_path):
    mistral = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
               "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False}
    d = write(tmp_path, mistral)
    resolve(["recipe=mistral-7b", f"model.init_from={d}"])
    with pytest.raises(ConfigError) as err:
        resolve(["recipe=mistral-7b", f"model.init_from={d}", "data.seq_length=8192"])
    assert err.value.key == "data.seq_length" and "sliding window of 4096" in str(err.value)


def test_qwen2_config(resolve, tmp_path):
    qwen = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "use_sliding_window": False,
            "tie_word_embeddings": False}
    resolve(["recipe=qwen2.5-7b", f"model.init_from={write(tmp_path, qwen)}"])
