"""A transformers config.json as the model's source of truth (`model.init_from`, `model.hf_config`), without torch.

When a run starts from a transformers checkpoint, the checkpoint's config.json *is* the model: rope scaling,
norm epsilon, special-token ids, `architectures` and everything else the runtime builds, trains and exports
from it unchanged (launcher/runtime/model.py, launcher/export.py). `model.*` still describes the shape to the
config layer and the planner (which never read checkpoints); so every `model.*` value must equal the loaded
config's, checked here before anything starts. A mismatch is one ConfigError naming both values (the planner
would otherwise plan another model than the one that trains).

Reading one small JSON file is the only I/O; the config keys are transformers' own (configuration_llama.py,
configuration_mistral.py, configuration_qwen2.py). transformers 4.x writes `rope_theta` and `rope_scaling`,
5.x one `rope_parameters` dict holding both: both spellings are read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from launcher.config.errors import ConfigError
from launcher.config.hubcache import local_path
from launcher.config.secrets import refuse_secrets_in_config

# transformers model_type -> model.arch. The llama family shares one decoder layout (q/k/v/o, SwiGLU, RMSNorm);
# Qwen2 adds q/k/v biases (Qwen2Attention: bias=True), Mistral a sliding window.
MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "bloom": "bloom", "gpt2": "gpt"}
LLAMA_FAMILY = ("llama", "mistral", "qwen2")

# model.* key -> (config.json key, its default when absent: the transformers class default)
_KEYS = {
    "hidden_size": ("hidden_size", None),
    "num_hidden_layers": ("num_hidden_layers", None),
    "num_attention_heads": ("num_attention_heads", None),
    "intermediate_size": ("intermediate_size", None),
    "vocab_size": ("vocab_size", None),
    "max_position_embeddings": ("max_position_embeddings", None),
    "tie_word_embeddings": ("tie_word_embeddings", False),
    "rms_norm_eps": ("rms_norm_eps", None),
}


def source_key(model_cfg) -> Optional[str]:
    """`model.init_from` or `model.hf_config`, whichever names the config (None: model.* is the model)."""
    if getattr(model_cfg, "init_from", None):
        return "model.init_from"
    if getattr(model_cfg, "hf_config", None):
        return "model.hf_config"
    return None


def config_path(key: str, value: str) -> Path:
    """The config.json a `model.init_from` / `model.hf_config` value names (a directory, for hf_config also a .json,
    or a hub name in the local Hugging Face cache: launcher/config/hubcache.py)."""
    path = Path(str(local_path(key, value))).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(key, value, f"{path} does not exist",
                          "give a local transformers model directory holding config.json, or a hub name downloaded into "
                          "the local Hugging Face cache (`hf download owner/name`)")
    return path


def read_hf_config(key: str, value: str) -> dict:
    path = config_path(key, value)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(key, value, f"{path} is not valid JSON ({exc})", "give a transformers config.json") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(key, value, f"{path} has no model_type, so it is not a transformers model config",
                          "give the directory of a transformers causal LM (its config.json names model_type)")
    return data


def rope_of(hf: dict) -> tuple[float, Optional[dict]]:
    """(rope_theta, rope scaling or None) from either spelling; `rope_type: default` is no scaling."""
    params = dict(hf.get("rope_parameters") or {})
    theta = hf.get("rope_theta", params.pop("rope_theta", 10000.0))
    params.pop("rope_theta", None)
    scaling = dict(hf.get("rope_scaling") or params)
    if "type" in scaling and "rope_type" not in scaling:   # transformers < 4.45 wrote `type`
        scaling["rope_type"] = scaling.pop("type")
    if scaling.get("rope_type", "default") == "default":
        scaling = None
    return float(theta), scaling


def model_fields(hf: dict) -> dict:
    """The `model.*` values that describe the model of a transformers config.json."""
    fields = {"arch": MODEL_TYPES.get(hf["model_type"], hf["model_type"])}
    for ours, (theirs, default) in _KEYS.items():
        fields[ours] = hf.get(theirs, default)
    if hf["model_type"] == "gpt2":
        fields.update(hidden_size=hf.get("n_embd"), num_hidden_layers=hf.get("n_layer"), num_attention_heads=hf.get("n_head"),
                      intermediate_size=hf.get("n_inner"), max_position_embeddings=hf.get("n_positions"),
                      rms_norm_eps=hf.get("layer_norm_epsilon"), tie_word_embeddings=hf.get("tie_word_embeddings", True))
    if hf["model_type"] == "bloom":
        fields.update(num_hidden_layers=hf.get("n_layer"), num_attention_heads=hf.get("n_head"),
                      rms_norm_eps=hf.get("layer_norm_epsilon"), tie_word_embeddings=hf.get("tie_word_embeddings", True))
        fields.pop("max_position_embeddings")
    if fields["intermediate_size"] is None:
        fields["intermediate_size"] = 4 * fields["hidden_size"]   # bloom, gpt2 (n_inner null)
    if fields["arch"] in LLAMA_FAMILY:
        fields["num_key_value_heads"] = hf.get("num_key_value_heads") or fields["num_attention_heads"]
        fields["rope_theta"], fields["rope_scaling"] = rope_of(hf)
    return fields


def _effective(model_cfg, key: str):
    v = getattr(model_cfg, key, None)
    if key == "num_key_value_heads" and v is None:
        return getattr(model_cfg, "num_attention_heads", None)
    if key == "intermediate_size" and v is None:
        return 4 * getattr(model_cfg, "hidden_size", None)
    if key == "rope_scaling":
        v = dict(v or {})
        if "type" in v and "rope_type" not in v:
            v["rope_type"] = v.pop("type")
        return None if v.get("rope_type", "default") == "default" else v
    return v


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and float(a) == float(b)
    return a == b


def check_model_source(cfg) -> Optional[dict]:
    """Refuse `model.*` values that differ from the loaded config.json; returns that config (None without one).

    Also refuses what the runtime would compute differently from transformers: a head_dim that is not
    hidden_size / num_attention_heads (the planner's and the TP split's assumption), llama attention/MLP biases,
    and a sliding window shorter than data.seq_length (the pipeline and Ulysses paths attend causally over the
    whole sequence; at seq_length <= window the window masks nothing, so every path computes the same).
    """
    m = cfg.model
    key = source_key(m)
    if key is None:
        return None
    if getattr(m, "init_from", None) and getattr(m, "hf_config", None):
        raise ConfigError("model.hf_config", m.hf_config, "model.init_from already names the model (its config.json); "
                          "a second config could disagree with the weights", "drop model.hf_config, or model.init_from")
    value = getattr(m, "init_from", None) or getattr(m, "hf_config", None)
    # A credential in the path (a URL with a password) is refused as such before the path is read or quoted.
    refuse_secrets_in_config({"model": {key.split(".")[1]: value}})
    hf = read_hf_config(key, value)
    fields = model_fields(hf)
    if fields["arch"] not in MODEL_TYPES.values():
        raise ConfigError(key, value, f"its model_type {hf['model_type']!r} is not one the launcher builds "
                          f"({', '.join(sorted(MODEL_TYPES))})", "start from a llama, mistral, qwen2, bloom or gpt2 checkpoint")
    for ours, theirs in fields.items():
        mine = _effective(m, ours)
        if not _same(mine, theirs):
            raise ConfigError(f"model.{ours}", mine,
                              f"{key}={value} has {ours} = {theirs!r} in its config.json, which is the model that trains and "
                              f"is exported; model.{ours} = {mine!r} would plan (and check) another model",
                              f"set model.{ours}={json.dumps(theirs) if isinstance(theirs, dict) else theirs} (or pick the "
                              f"model group of this checkpoint, e.g. model=llama3.1-8b), or drop {key}")
    tp = cfg.parallel.tensor_degree
    if tp > 1 and fields["vocab_size"] % tp:
        raise ConfigError("parallel.tensor_degree", tp,
                          f"the embedding of {key}={value} has {fields['vocab_size']} rows, not divisible by tensor_degree "
                          f"{tp} ({fields['vocab_size']} % {tp} = {fields['vocab_size'] % tp}); padding it would change the "
                          "model's shape, so neither its weights nor its config.json would fit the trained model",
                          f"set parallel.tensor_degree to a divisor of {fields['vocab_size']}")
    if fields["arch"] in LLAMA_FAMILY:
        h, heads = fields["hidden_size"], fields["num_attention_heads"]
        head_dim = hf.get("head_dim") or h // heads
        if head_dim * heads != h:
            raise ConfigError(key, value, f"its head_dim {head_dim} x num_attention_heads {heads} = {head_dim * heads} != "
                              f"hidden_size {h}; the planner and the tensor-parallel split assume head_dim = hidden/heads",
                              "use a checkpoint with head_dim = hidden_size / num_attention_heads")
        for bias in ("attention_bias", "mlp_bias"):
            if hf.get(bias):
                raise ConfigError(key, value, f"its config sets {bias}: true, which the parameter counts and the "
                                  f"pipeline/TP layers do not cover for model_type {hf['model_type']}",
                                  "use a checkpoint without these biases (qwen2's q/k/v biases are supported)")
        window = hf.get("sliding_window") if hf.get("use_sliding_window", hf["model_type"] == "mistral") else None
        seq = cfg.data.seq_length
        if window is not None and seq > window:
            raise ConfigError("data.seq_length", seq,
                              f"{key}={value} attends within a sliding window of {window} tokens, and data.seq_length "
                              f"{seq} > {window}: the pipeline and sequence-parallel paths attend over the whole sequence",
                              f"set data.seq_length <= {window}")
    return hf
