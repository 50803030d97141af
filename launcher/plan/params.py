"""Exact parameter counts of the architectures transformers builds, by closed formula (no torch).

Each formula mirrors the modules of the transformers class named beside it;
tests hold every formula to the count of the real model built on the meta
device. `rough_params` is the textbook 12*L*h^2 + V*h estimate (Kaplan et al.
2020, section 2.1, plus embeddings), printed beside the exact count.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.supported import LLAMA_FAMILY


@dataclass(frozen=True)
class ParamCount:
    total: int
    embedding: int       # input embedding (+ learned positions, + embedding norm)
    per_layer: int       # one transformer block
    head: int            # output projection when untied, else 0
    final_norm: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.head


def _llama(m) -> ParamCount:
    # LlamaForCausalLM / MistralForCausalLM: q/k/v/o projections without bias, SwiGLU MLP (gate, up, down), two
    # RMSNorms per block. Qwen2ForCausalLM: the same with biases on q, k and v (Qwen2Attention: bias=True; o_proj none).
    h, v = m.hidden_size, m.vocab_size
    head_dim = h // m.num_attention_heads
    kv = (m.num_key_value_heads or m.num_attention_heads) * head_dim
    inter = m.intermediate_size or 4 * h
    attn = h * h + 2 * h * kv + h * h + ((h + 2 * kv) if m.arch == "qwen2" else 0)
    mlp = 3 * h * inter
    per_layer = attn + mlp + 2 * h
    head = 0 if m.tie_word_embeddings else v * h
    return ParamCount(total=v * h + m.num_hidden_layers * per_layer + h + head,
                      embedding=v * h, per_layer=per_layer, head=head, final_norm=h)


def _bloom(m) -> ParamCount:
    # BloomForCausalLM: word embeddings + a LayerNorm on them; per block fused qkv (with bias), dense (bias),
    # 4h MLP (biases), two LayerNorms (weight + bias); final LayerNorm; ALiBi has no parameters.
    h, v = m.hidden_size, m.vocab_size
    per_layer = (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h) + 2 * (2 * h)
    head = 0 if m.tie_word_embeddings else v * h
    embedding = v * h + 2 * h
    return ParamCount(total=embedding + m.num_hidden_layers * per_layer + 2 * h + head,
                      embedding=embedding, per_layer=per_layer, head=head, final_norm=2 * h)


def _gpt(m) -> ParamCount:
    # GPT2LMHeadModel: token + learned position embeddings; per block c_attn (h x 3h + bias), c_proj (h x h + bias),
    # c_fc (h x 4h + bias), c_proj (4h x h + bias), two LayerNorms; final LayerNorm.
    h, v = m.hidden_size, m.vocab_size
    per_layer = (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h) + 2 * (2 * h)
    head = 0 if m.tie_word_embeddings else v * h
    embedding = v * h + m.max_position_embeddings * h
    return ParamCount(total=embedding + m.num_hidden_layers * per_layer + 2 * h + head,
                      embedding=embedding, per_layer=per_layer, head=head, final_norm=2 * h)


_FORMULAS = {"llama": _llama, "mistral": _llama, "qwen2": _llama, "bloom": _bloom, "gpt": _gpt}


def count_params(model_cfg) -> ParamCount:
    """Exact parameter count of `model_cfg` as transformers would build it."""
    return _FORMULAS[model_cfg.arch](model_cfg)


def rough_params(model_cfg) -> int:
    """12 * L * h^2 + V * h: the usual back-of-envelope count (ignores biases, norms, GQA and MLP width)."""
    h = model_cfg.hidden_size
    return 12 * model_cfg.num_hidden_layers * h * h + model_cfg.vocab_size * h


def param_numels(model_cfg, vocab_size: int | None = None) -> tuple[int, ...]:
    """Element count of every parameter tensor, in the order `model.parameters()` yields them.

    The order matters to DeepSpeed: ZeRO 1/2 flattens the tensors in this order and cuts the flat buffer
    into DP partitions, so which tensors straddle a partition boundary (and how many gradient elements a
    rank keeps) depends on it; ZeRO 3 pads each tensor separately. The sum equals count_params(...).total
    (tests/unit/test_params.py holds both to the transformers models). Tied heads are the embedding
    tensor itself, which `parameters()` yields once. `vocab_size` overrides model.vocab_size (the TP-padded size).
    """
    m = model_cfg
    h, v = m.hidden_size, vocab_size or m.vocab_size
    head = () if m.tie_word_embeddings else (v * h,)
    if m.arch in LLAMA_FAMILY:
        # LlamaForCausalLM: embed_tokens; per layer q, k, v, o, gate, up, down, input/post-attention RMSNorm; norm; lm_head.
        # Qwen2: each of q, k, v followed by its bias.
        kv = (m.num_key_value_heads or m.num_attention_heads) * (h // m.num_attention_heads)
        inter = m.intermediate_size or 4 * h
        if m.arch == "qwen2":
            attn = (h * h, h, kv * h, kv, kv * h, kv, h * h)
        else:
            attn = (h * h, kv * h, kv * h, h * h)
        layer = attn + (inter * h, inter * h, h * inter, h, h)
        return (v * h,) + layer * m.num_hidden_layers + (h,) + head
    if m.arch == "gpt":
        # GPT2LMHeadModel: wte, wpe; per block ln_1 (w, b), c_attn (w, b), attn c_proj (w, b), ln_2 (w, b),
        # c_fc (w, b), mlp c_proj (w, b); ln_f (w, b); lm_head.
        inter = m.intermediate_size or 4 * h
        layer = (h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * inter, inter, inter * h, h)
        return (v * h, m.max_position_embeddings * h) + layer * m.num_hidden_layers + (h, h) + head
    if m.arch == "bloom":
        # BloomForCausalLM: word_embeddings + its LayerNorm (w, b); per block input_layernorm (w, b),
        # query_key_value (w, b), dense (w, b), post_attention_layernorm (w, b), dense_h_to_4h (w, b),
        # dense_4h_to_h (w, b); ln_f (w, b); lm_head.
        layer = (h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h)
        return (v * h, h, h) + layer * m.num_hidden_layers + (h, h) + head
    raise ValueError(f"unknown model.arch {m.arch!r}")


def param_decays(model_cfg) -> tuple[bool, ...]:
    """Per tensor, in param_numels' order: whether it gets weight decay (a matrix or embedding: yes; a norm
    weight or a bias: no; launcher/runtime/optimizer.py's rule, which tests/unit/test_optimizer.py holds to the
    built models). The optimizer's two parameter groups are the True tensors, then the False ones."""
    m = model_cfg
    head = () if m.tie_word_embeddings else (True,)
    if m.arch in LLAMA_FAMILY:
        # q k v o gate up down (Qwen2: q, k and v each followed by its bias); the two RMSNorm weights
        attn = (True, False) * 3 + (True,) if m.arch == "qwen2" else (True,) * 4
        layer = attn + (True,) * 3 + (False, False)
        return (True,) + layer * m.num_hidden_layers + (False,) + head
    # GPT-2 and BLOOM blocks: (ln w, ln b, qkv w, qkv b, proj w, proj b, ln w, ln b, fc w, fc b, proj w, proj b)
    layer = (False, False, True, False, True, False, False, False, True, False, True, False)
    if m.arch == "gpt":
        return (True, True) + layer * m.num_hidden_layers + (False, False) + head
    if m.arch == "bloom":
        return (True, False, False) + layer * m.num_hidden_layers + (False, False) + head
    raise ValueError(f"unknown model.arch {m.arch!r}")


def param_group_numels(model_cfg, vocab_size: int | None = None) -> list[tuple[int, ...]]:
    """The element counts of the optimizer's parameter groups (decayed, then not decayed), each in model order;
    an empty group is left out, as launcher.runtime.optimizer.param_groups leaves it out."""
    numels, decays = param_numels(model_cfg, vocab_size), param_decays(model_cfg)
    groups = [tuple(n for n, d in zip(numels, decays) if d), tuple(n for n, d in zip(numels, decays) if not d)]
    return [g for g in groups if g]
