"""Build the transformers model a config describes (the seeded init of runtime/build.py, or from a checkpoint).

The one mapping from our `model.*` keys to each transformers config class lives
in `hf_config`; the parameter-count formulas in launcher/plan/params.py are held
to the models built here (tests/unit/test_params.py).
"""

from __future__ import annotations

from typing import Optional

# model.arch -> the class transformers (and vLLM/TGI, which read config.json's `architectures`) build.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "bloom": "BloomForCausalLM", "gpt": "GPT2LMHeadModel"}


def loaded_config(model_cfg):
    """The transformers config `model.init_from` / `model.hf_config` names, as it is on disk (None without one).

    This is what the export writes back (launcher/export.py); `hf_config` derives the training copy from it.
    """
    from transformers import AutoConfig

    from launcher.config.hfmodel import config_path, source_key

    key = source_key(model_cfg)
    if key is None:
        return None
    path = config_path(key, getattr(model_cfg, "init_from", None) or getattr(model_cfg, "hf_config", None))
    # A directory for init_from; model.hf_config may name the .json file itself (from_pretrained reads either).
    return AutoConfig.from_pretrained(str(path.parent if path.name == "config.json" else path))


def hf_config(model_cfg, vocab_size: Optional[int] = None, seq_length: Optional[int] = None):
    """The transformers config for `model_cfg`; `vocab_size` overrides it (e.g. the TP-padded size).

    With `model.init_from` / `model.hf_config` it is that config.json (model.* was checked equal to it by
    launcher/config/hfmodel.py), with only what training needs changed: no KV cache, SDPA attention.
    """
    from transformers import BloomConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    m = model_cfg
    vocab = vocab_size or m.vocab_size
    loaded = loaded_config(m)
    if loaded is not None:
        loaded.vocab_size = vocab
        loaded.use_cache = False
        return loaded
    if m.arch in ("llama", "mistral", "qwen2"):
        rope = {"rope_type": "default", "rope_theta": m.rope_theta}
        if getattr(m, "rope_scaling", None):
            rope = {**{k: v for k, v in dict(m.rope_scaling).items() if k != "type"},
                    "rope_type": m.rope_scaling.get("rope_type", m.rope_scaling.get("type")), "rope_theta": m.rope_theta}
        cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}[m.arch]
        # model.* has no sliding-window key: full causal attention, as every layout computes it (the pipeline and
        # Ulysses paths have no window). MistralConfig's default window (4096, Mistral-7B-v0.1) would apply to the
        # whole-model path only; at seq_length <= 4096 the two are the same model.
        window = {"sliding_window": None} if m.arch in ("mistral", "qwen2") else {}
        return cls(
            **window,
            vocab_size=vocab,
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size or 4 * m.hidden_size,
            num_hidden_layers=m.num_hidden_layers,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads or m.num_attention_heads,
            head_dim=m.hidden_size // m.num_attention_heads,
            max_position_embeddings=m.max_position_embeddings,
            rms_norm_eps=m.rms_norm_eps,
            rope_parameters=rope,
            tie_word_embeddings=m.tie_word_embeddings,
            attn_implementation="sdpa",
            use_cache=False,
            architectures=[ARCHITECTURES[m.arch]],
            bos_token_id=None, eos_token_id=None, pad_token_id=None,
        )
    if m.arch == "bloom":
        return BloomConfig(
            vocab_size=vocab,
            hidden_size=m.hidden_size,
            n_layer=m.num_hidden_layers,
            n_head=m.num_attention_heads,
            layer_norm_epsilon=m.rms_norm_eps,
            tie_word_embeddings=m.tie_word_embeddings,
            use_cache=False,
            # transformers' Bloom has no SDPA path (ALiBi is added inside its own attention).
            attn_implementation="eager",
            architectures=[ARCHITECTURES[m.arch]],
        )
    if m.arch == "gpt":
        return GPT2Config(
            vocab_size=vocab,
            n_embd=m.hidden_size,
            n_layer=m.num_hidden_layers,
            n_head=m.num_attention_heads,
            n_positions=m.max_position_embeddings,
            n_inner=m.intermediate_size,
            layer_norm_epsilon=m.rms_norm_eps,
            tie_word_embeddings=m.tie_word_embeddings,
            # Dropout off: pretraining at scale runs without it (LLaMA), and exactness tests need determinism.
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            use_cache=False,
            attn_implementation="sdpa",
            architectures=[ARCHITECTURES[m.arch]],
        )
    raise ValueError(f"unknown model.arch {m.arch!r}")


# The tokenizer's own files besides tokenizer.json (which every checkpoint carries): special tokens, BOS/EOS
# handling, chat template. Small text files, kept in launcher_state.json so a checkpoint exports on its own.
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")


def hf_meta(cfg) -> dict:
    """What an export writes beside the weights, fixed at the start of the run and stored in every checkpoint:
    the loaded config.json and generation_config.json exactly as read (null without model.init_from /
    model.hf_config), and the tokenizer directory's own files (data.tokenizer_path as a directory)."""
    import json

    from launcher.config.hfmodel import config_path, source_key

    meta = {"config": None, "generation_config": None, "tokenizer_files": {}}
    key = source_key(cfg.model)
    if key is not None:
        path = config_path(key, getattr(cfg.model, "init_from", None) or getattr(cfg.model, "hf_config", None))
        meta["config"] = json.loads(path.read_text(encoding="utf-8"))
        gen = path.parent / "generation_config.json"
        if gen.is_file():
            meta["generation_config"] = json.loads(gen.read_text(encoding="utf-8"))
    from launcher.runtime.data import tokenizer_location

    tok = tokenizer_location(cfg) if getattr(cfg.data, "tokenizer_path", None) else None
    if tok is not None and tok.is_dir():
        meta["tokenizer_files"] = {n: (tok / n).read_text(encoding="utf-8") for n in TOKENIZER_FILES if (tok / n).is_file()}
    return meta


def attn_implementation(arch: str) -> str:
    """PyTorch SDPA wherever transformers supports it for the architecture."""
    return "eager" if arch == "bloom" else "sdpa"


def build_model(model_cfg, seed: int, vocab_size: Optional[int] = None, device=None):
    """The whole causal LM, identical on every rank for the same seed: from `model.init_from`, or with the
    launcher's own layout-independent seeded init (launcher/runtime/build.py); `device="meta"`: shapes only."""
    from launcher.runtime.build import build_whole_model, meta_model

    if device is not None and str(device) == "meta":
        return meta_model(model_cfg, vocab_size)
    return build_whole_model(model_cfg, seed, vocab_size)
def build_model_with_attention(model_cfg, seed: int, vocab_size: int, attn_name: str, what: str,
                               zero3_config: Optional[dict] = None):
    """The transformers model (the same seeded weights as one rank) with its attention replaced by the function
    registered as `attn_name` in transformers' attention registry (Ulysses: launcher/parallel/sequence.py; ring
    attention: launcher/parallel/context.py). `what` names the feature in the refusal for other architectures.

    `zero3_config` (the run's DeepSpeed config, under ZeRO-3): built directly as this rank's partitions
    (deepspeed.zero.Init, launcher/runtime/build.py build_zero3_model), never whole, as plan/host.py's build path
    and the dry-run ledger say. Without TP or PP the SP/CP ranks are all ranks of ZeRO-3's partition group (its
    sequence-data-parallel group = the world), which is zero.Init's default group, so the partitions are the
    engine's."""
    if model_cfg.arch not in ("llama", "mistral", "qwen2"):
        raise NotImplementedError(f"{what} is implemented for the llama family, not {model_cfg.arch!r}")
    if zero3_config is not None:
        from launcher.runtime.build import build_zero3_model

        return build_zero3_model(model_cfg, seed, zero3_config, vocab_size=vocab_size, attn=attn_name)
    model = build_model(model_cfg, seed, vocab_size=vocab_size)
    model.set_attn_implementation(attn_name)
    return model


