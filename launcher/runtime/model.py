"""Build the transformers model a config describes (the seeded init of runtime/build.py, or from a checkpoint).

The one mapping from our `model.*` keys to each transformers config class lives
in `hf_config`; the parameter-count formulas in launcher/plan/params.py are held
to the models built here (tests/unit/test_params.py).
"""

from __future__ import annotations

from typing import Optional


def hf_config(model_cfg, vocab_size: Optional[int] = None, seq_length: Optional[int] = None):
    """The transformers config for `model_cfg`; `vocab_size` overrides it (e.g. the TP-padded size)."""
    from transformers import BloomConfig, GPT2Config, LlamaConfig

    m = model_cfg
    vocab = vocab_size or m.vocab_size
    if m.arch == "llama":
        return LlamaConfig(
            vocab_size=vocab,
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size or 4 * m.hidden_size,
            num_hidden_layers=m.num_hidden_layers,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads or m.num_attention_heads,
            max_position_embeddings=m.max_position_embeddings,
            rms_norm_eps=m.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": m.rope_theta},
            tie_word_embeddings=m.tie_word_embeddings,
            attn_implementation="sdpa",
            use_cache=False,
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
        )
    raise ValueError(f"unknown model.arch {m.arch!r}")


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
