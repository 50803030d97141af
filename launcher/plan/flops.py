"""FLOPs per token and the step-time model (no torch).

Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B):

    6 N + 12 L H Q T

N = all parameters (PaLM counts its 540.35B including the tied embedding/head,
and its published MFU of 46.2% reproduces only with that N), L layers, H heads,
Q head dimension, T sequence length. 6N is the forward (2N) and backward (4N)
matmul FLOPs of the weights; 12LHQT is the attention score and value matmuls
(QK^T and AV, forward + backward), which do not scale with N.

Hardware FLOPs add what recomputation repeats (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", eq. 3:
96 B s l h^2 (1 + s/6h + V/16lh) per step with full recompute, i.e. a second
forward of every block: + 2 N_blocks + 4 L H Q T per token; selective checkpointing
(model.checkpoint_mode=selective) keeps every matmul's and attention's output, so it adds none:
launcher/plan/inputs.py RECOMPUTE_MODES). With N = 12 l h^2 + V h the two agree term by term:
72 l h^2 + 6 V h + 12 l h s + 24 l h^2 + 4 l h s = 96 l h^2 + 16 l h s + 6 V h.

The step time itself is launcher/plan/steptime.py (per operator, from a hardware profile).
"""

from __future__ import annotations

from typing import Optional

from launcher.plan.inputs import ModelShape, model_shape


def flops_per_token(shape: ModelShape, seq_length: int) -> float:
    """Model FLOPs per token, 6N + 12LHQT (PaLM appendix B)."""
    return 6 * shape.params.total + 12 * shape.num_layers * shape.num_heads * shape.head_dim * seq_length


def model_flops_per_token(model_cfg, seq_length: int) -> int:
    """Training FLOPs per token without recomputation: 6N + 12*L*H*Q*T (PaLM appendix B)."""
    return int(flops_per_token(model_shape(model_cfg), seq_length))


def recompute_flops_per_token(shape: ModelShape, seq_length: int, recompute: str,
                              layers: Optional[int] = None) -> float:
    """FLOPs per token that recomputation adds (a second forward of what it drops): every block's forward under
    "full", or `layers` of them (model.checkpoint_blocks: plan/memory.py checkpointed_layers)."""
    if recompute != "full":
        return 0.0
    n = shape.num_layers if layers is None else layers
    return n * (2 * shape.params.per_layer + 4 * shape.num_heads * shape.head_dim * seq_length)


def hardware_flops_per_token(shape: ModelShape, seq_length: int, recompute: str) -> float:
    """FLOPs the GPUs execute per token: model FLOPs + recomputation (Narayanan et al. 2021, eq. 3)."""
    return flops_per_token(shape, seq_length) + recompute_flops_per_token(shape, seq_length, recompute)


def narayanan_eq3_flops_per_step(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021, eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), with full recompute."""
    return 96 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def narayanan_eq4_training_seconds(tokens: float, params: float, gpus: int, tflops_per_gpu: float) -> float:
    """Narayanan et al. 2021, eq. 4: end-to-end training time ~ 8 T P / (n X), with recompute."""
    return 8 * tokens * params / (gpus * tflops_per_gpu * 1e12)

