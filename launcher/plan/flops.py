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
forward of every block: + 2 N_blocks + 4 L H Q T per token). Selective
recompute repeats only the attention-score forward (+ 4 L H Q T; Korthikanti et
al. 2022, section 5). With N = 12 l h^2 + V h the two agree term by term:
72 l h^2 + 6 V h + 12 l h s + 24 l h^2 + 4 l h s = 96 l h^2 + 16 l h s + 6 V h.

Step-time model, per optimizer step, for one rank (every rank does the same work):

    compute per micro-batch  t_c = b s F_hw(stage) / (t sp) / (peak x efficiency)
    TP all-reduces           4 per block per micro-batch (2 forward, 2 backward; + 2 with full recompute),
                             each a ring 2(t-1)/t x b s h x bytes over the intra-node link (Shoeybi et al. 2019, section 3)
    PP point-to-point        activations forward + gradients backward, b s h x bytes / t each (DeepSpeed's
                             pipe_partitioned scatters them over the TP ranks), on the inter-node link once a
                             replica spans nodes
    1F1B schedule            (m + p - 1) x (t_c + t_tp + t_p2p): the bubble (p - 1)/m (Narayanan et al. 2021,
                             section 2.2.1); (p - 1)/(v m) for v interleaved chunks, which DeepSpeed's
                             pipeline engine does not implement, so v = 1 here
    DP gradients             ring all-reduce 2(n-1)/n x gradient bytes over the inter-node link (Patarasuk &
                             Yuan 2009), once per step at the accumulation boundary. Overlap (stated): without a
                             pipeline, DeepSpeed's overlap_comm (on for GPUs in our config) hides it behind the
                             last micro-batch's backward; the pipeline engine reduces after the flush, exposed.
    ZeRO 2                   gradients reduce-scattered in every micro-batch's backward (n-1)/n x Psi, hidden
                             behind that backward; parameters all-gathered once after the step, exposed.
    ZeRO 3                   per micro-batch: all-gather forward + all-gather backward + reduce-scatter =
                             3 x (n-1)/n x Psi (against 2x for ZeRO 0-2; Rajbhandari et al. 2020, section 7.2.2),
                             prefetched behind that micro-batch's compute.

Compute efficiency per GPU type lives in launcher/config/hardware.py with its calibration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from launcher.plan.inputs import Hardware, ModelShape, Strategy, model_shape
from launcher.plan.memory import blocks_in_stage, stage_params, weight_bytes


def flops_per_token(shape: ModelShape, seq_length: int) -> float:
    """Model FLOPs per token, 6N + 12LHQT (PaLM appendix B)."""
    return 6 * shape.params.total + 12 * shape.num_layers * shape.num_heads * shape.head_dim * seq_length


def model_flops_per_token(model_cfg, seq_length: int) -> int:
    """Training FLOPs per token without recomputation: 6N + 12*L*H*Q*T (PaLM appendix B)."""
    return int(flops_per_token(model_shape(model_cfg), seq_length))


def recompute_flops_per_token(shape: ModelShape, seq_length: int, recompute: str) -> float:
    """FLOPs per token that recomputation adds (a second forward of what it drops)."""
    attention_forward = 4 * shape.num_layers * shape.num_heads * shape.head_dim * seq_length
    if recompute == "full":
        return 2 * shape.num_layers * shape.params.per_layer + attention_forward
    if recompute == "selective":
        return attention_forward
    return 0.0


def hardware_flops_per_token(shape: ModelShape, seq_length: int, recompute: str) -> float:
    """FLOPs the GPUs execute per token: model FLOPs + recomputation (Narayanan et al. 2021, eq. 3)."""
    return flops_per_token(shape, seq_length) + recompute_flops_per_token(shape, seq_length, recompute)


def narayanan_eq3_flops_per_step(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021, eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), with full recompute."""
    return 96 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def narayanan_eq4_training_seconds(tokens: float, params: float, gpus: int, tflops_per_gpu: float) -> float:
    """Narayanan et al. 2021, eq. 4: end-to-end training time ~ 8 T P / (n X), with recompute."""
    return 8 * tokens * params / (gpus * tflops_per_gpu * 1e12)


def ring_allreduce_s(nbytes: float, ranks: int, gbps: float) -> float:
    """Ring all-reduce time: each rank sends and receives 2(n-1)/n x bytes (Patarasuk & Yuan 2009)."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / (gbps * 1e9)


def ring_collective_s(nbytes: float, ranks: int, gbps: float) -> float:
    """Ring all-gather or reduce-scatter of a `nbytes` buffer: (n-1)/n x bytes per rank."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * nbytes / (gbps * 1e9)


@dataclass(frozen=True)
class StepTime:
    step_time_s: float
    compute_s: float        # the ideal: hardware FLOPs at peak x efficiency, no bubble, no communication
    bubble_s: float
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_exposed_s: float
    tokens_per_s: float
    flops_per_token: float
    hardware_flops_per_token: float
    tflops_per_gpu: float            # model FLOPs
    hardware_tflops_per_gpu: float   # with recompute
    mfu: float
    train_tokens: float
    train_days: float


def estimate_step_time(shape: ModelShape, st: Strategy, hw: Hardware, train_tokens: Optional[float] = None) -> StepTime:
    """Step time, throughput, TFLOP/s per GPU, MFU and training days for one layout (see module docstring)."""
    t, p, sp, d = st.tensor_degree, st.pipeline_degree, st.sequence_degree, st.data_degree
    m, b, s, h = st.grad_accum_steps, st.micro_batch_size, st.seq_length, shape.hidden_size
    w = weight_bytes(st.dtype)
    world = st.world_size
    f_model = flops_per_token(shape, s)
    f_hw = f_model + recompute_flops_per_token(shape, s, st.recompute)
    rate = hw.peak_tflops * 1e12 * hw.compute_efficiency

    # Compute of one micro-batch on one rank: the replica's work spread over its t x p x sp ranks.
    t_c = b * s * f_hw / (t * p * sp) / rate
    # Backward share of one micro-batch (2/3 of the model FLOPs) is what overlapped DP traffic hides behind.
    t_bwd = b * s * (f_model * 2 / 3) / (t * p * sp) / rate

    blocks = blocks_in_stage(shape, st, 0)
    intra_tp = t <= st.gpus_per_node
    act_bytes = b * s / sp * h * w
    n_ar = 4 + (2 if st.recompute == "full" else 0)
    t_tp = blocks * n_ar * ring_allreduce_s(act_bytes, t, hw.intra_node_gbps if intra_tp else hw.inter_node_gbps)

    p2p_link = hw.intra_node_gbps if t * p <= st.gpus_per_node else hw.inter_node_gbps
    t_p2p = 2 * act_bytes / t / (p2p_link * 1e9) if p > 1 else 0.0

    per_mb = t_c + t_tp + t_p2p
    pipeline_s = (m + p - 1) * per_mb
    bubble_s = (p - 1) * per_mb

    # DP traffic: the gradients / parameters of the largest stage's rank (before ZeRO sharding).
    n_rank = max(stage_params(shape, st, 0), stage_params(shape, st, p - 1))
    dp_link = hw.inter_node_gbps if world > st.gpus_per_node else hw.intra_node_gbps
    grad_bytes = n_rank * (4 if st.grad_accum_fp32 else w)
    param_bytes = n_rank * w
    if st.zero_stage <= 1:
        t_dp = ring_allreduce_s(grad_bytes, d, dp_link)
        exposed = t_dp if p > 1 else max(0.0, t_dp - t_bwd)
    elif st.zero_stage == 2:
        per_mb_rs = ring_collective_s(grad_bytes, d, dp_link)
        exposed = m * max(0.0, per_mb_rs - t_bwd) + ring_collective_s(param_bytes, d, dp_link)
    else:
        per_mb_z3 = 2 * ring_collective_s(param_bytes, d, dp_link) + ring_collective_s(grad_bytes, d, dp_link)
        exposed = m * max(0.0, per_mb_z3 - t_c)

    step = pipeline_s + exposed
    tokens_per_s = st.tokens_per_step / step
    tflops = f_model * tokens_per_s / world / 1e12
    hw_tflops = f_hw * tokens_per_s / world / 1e12
    tokens = float(train_tokens) if train_tokens else 0.0
    return StepTime(
        step_time_s=step, compute_s=m * t_c, bubble_s=bubble_s, tp_comm_s=(m + p - 1) * t_tp,
        pp_comm_s=(m + p - 1) * t_p2p, dp_comm_exposed_s=exposed, tokens_per_s=tokens_per_s,
        flops_per_token=f_model, hardware_flops_per_token=f_hw, tflops_per_gpu=tflops,
        hardware_tflops_per_gpu=hw_tflops, mfu=tflops / hw.peak_tflops, train_tokens=tokens,
        train_days=tokens / tokens_per_s / 86400 if tokens else 0.0)
