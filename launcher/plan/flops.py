"""FLOPs per token and the step-time model (no torch).

Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B):

    6 N + 12 L H Q T

N = all parameters (PaLM counts its 540.35B including the tied embedding/head,
and its published MFU of 46.2% reproduces only with that N), L layers, H heads,
Q head dimension, T sequence length. 6N is the forward (2N) and backward (4N)
matmul FLOPs of the weights; 12LHQT is the attention score and value matmuls
(QK^T and AV, forward + backward), which do not scale with N.
"""

from __future__ import annotations

from launcher.plan.params import count_params


def model_flops_per_token(model_cfg, seq_length: int) -> int:
    """Training FLOPs per token without recomputation: 6N + 12*L*H*Q*T (PaLM appendix B)."""
    n = count_params(model_cfg).total
    layers, heads = model_cfg.num_hidden_layers, model_cfg.num_attention_heads
    head_dim = model_cfg.hidden_size // heads
    return 6 * n + 12 * layers * heads * head_dim * seq_length
