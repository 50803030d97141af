"""Model FLOPs per token: the one formula behind TFLOP/s, MFU and step-time estimates (no torch).

PaLM (Chowdhery et al. 2022, appendix B "Model FLOPs utilization"):

    flops_per_token = 6 N + 12 L H Q T

- 6 N: a forward (2 N) plus a backward (4 N) multiply-add per matmul weight
  (Kaplan et al. 2020, section 2.1). N counts the weights that take part in a
  matmul: every block weight plus the output projection (V x h, tied or not).
  The input embedding is a table lookup, not a matmul, so it is left out, like
  the learned positions of GPT-2 (nanoGPT's estimate_mfu does the same).
- 12 L H Q T: the attention scores QK^T and the weighted sum AV, forward and
  backward, with L layers, H heads, Q head dim and T the sequence length.

This is *model* FLOPs: activation recomputation is not counted, so MFU stays
comparable across activation-checkpointing settings (PaLM's point).
"""

from __future__ import annotations

from launcher.plan.params import count_params


def matmul_params(model_cfg) -> int:
    """N of the formula: block weights plus the output projection (the input lookup excluded)."""
    counts = count_params(model_cfg)
    return counts.non_embedding + model_cfg.vocab_size * model_cfg.hidden_size


def model_flops_per_token(model_cfg, seq_length: int) -> int:
    """6N + 12*L*H*Q*T model FLOPs per trained token (PaLM appendix B)."""
    n = matmul_params(model_cfg)
    layers = model_cfg.num_hidden_layers
    heads = model_cfg.num_attention_heads
    head_dim = model_cfg.hidden_size // heads
    return 6 * n + 12 * layers * heads * head_dim * seq_length
