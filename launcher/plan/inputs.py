"""What the planner's formulas read, as plain frozen objects (no torch, no OmegaConf in the hot path).

`launcher plan --search` evaluates thousands of candidate layouts; reading an
OmegaConf node costs microseconds per attribute, so the model shape, the
cluster's hardware numbers and each candidate's strategy are copied once into
these small dataclasses and every formula in memory.py / flops.py reads them.

    ModelShape  the network: widths, counts and the exact parameter split (params.py)
    Hardware    the GPU: peak for the training dtype, memory, links, and its rate profile (profile.py)
    Strategy    one layout: TP/PP/SP/DP degrees, ZeRO stage, batch, precision, recompute, offload
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from launcher.config import hardware
from launcher.config.errors import ConfigError
from launcher.config.layout import reduce_dtype, zero12_reduces_in_fp32
from launcher.config.schema import (ZERO3_MAX_LIVE_PARAMETERS, ZERO3_MAX_REUSE_DISTANCE, ZERO3_PARAM_PERSISTENCE_THRESHOLD,
                                    ZERO3_PREFETCH_BUCKET_SIZE)
from launcher.plan.params import ParamCount, count_params, param_numels
from launcher.plan.profile import BUILTIN, Profile, generic_profile, load_profile, nics_added, scaled

# Architectures whose attention runs through PyTorch SDPA (launcher/runtime/model.py, attn_implementation):
# on GPUs that is a flash / memory-efficient kernel that never stores the a x s x s score matrices.
# transformers' Bloom computes ALiBi attention eagerly, so BLOOM stores the scores (launcher/plan/activations.py).
SDPA_ARCHS = frozenset({"llama", "mistral", "qwen2", "gpt"})

# What `launcher train` can run: model.activation_checkpointing off ("none"), or on with model.checkpoint_mode "full"
# (whole blocks) or "selective" (the matmuls' and attention's outputs kept, the element-wise operators recomputed:
# launcher/runtime/recompute.py; the transformers model only, config/layout.py _check_checkpoint_mode).
# Korthikanti et al.'s selective recomputation (the attention core) is what a flash / memory-efficient SDPA kernel
# already does; the runtime has no separate mode for it.
RECOMPUTE_MODES = ("none", "full", "selective")


# parallel.* keys that Strategy copies as they are: ZeRO 3's fetching knobs
ZERO3_KNOBS = ("zero3_max_live_parameters", "zero3_max_reuse_distance", "zero3_prefetch_bucket_size",
               "zero3_param_persistence_threshold")


@dataclass(frozen=True)
class ModelShape:
    arch: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    params: ParamCount
    # the largest parameter tensor but the vocabulary's (embedding, untied head): with the padded vocabulary's
    # v x h, the largest tensor DeepSpeed sees (memory.largest_param; launcher/deepspeed_config.py raises ZeRO 3's
    # bucket to it under Ulysses / CP)
    largest_param_but_vocab: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def flash_attention(self) -> bool:
        return self.arch in SDPA_ARCHS


def model_shape(model_cfg) -> ModelShape:
    """Copy the model config into a ModelShape, with its exact parameter count."""
    m = model_cfg
    return ModelShape(
        arch=m.arch, hidden_size=m.hidden_size, num_layers=m.num_hidden_layers, num_heads=m.num_attention_heads,
        num_kv_heads=m.num_key_value_heads or m.num_attention_heads,
        intermediate_size=m.intermediate_size or 4 * m.hidden_size, vocab_size=m.vocab_size,
        tied_embeddings=bool(m.tie_word_embeddings), params=count_params(m),
        # at a vocabulary of 1 the vocabulary's tensors are 1 x h, below every other (tests/plan/test_reduce_bucket.py)
        largest_param_but_vocab=max(param_numels(m, vocab_size=1)))


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_tflops: float          # dense, in the training dtype
    memory_bytes: float
    intra_node_gbps: float
    inter_node_gbps: float
    source: str
    profile: Profile            # the per-operator rates the step-time model reads (launcher/plan/profile.py)
    device: str = "cuda"        # "cpu" for CPU ranks planned from a `launcher calibrate` profile


def _dtype_peak(spec: hardware.GpuSpec, dtype: str) -> float:
    # fp32 training runs its matmuls in TF32 on Ampere and later (PyTorch's allow_tf32 for cuDNN, and what
    # DeepSpeed users set for matmuls); the catalog's plain fp32 figure is the non-tensor-core peak.
    return spec.peak_tflops["tf32" if dtype == "fp32" else dtype]


def resolve_hardware(cluster_cfg, dtype: str) -> Optional[Hardware]:
    """The GPU numbers the planner uses: the catalog entry and its built-in profile, each value overridable from
    cluster.*, or the profile file `cluster.profile` names (written by `launcher calibrate`).

    None for CPU ranks without a profile (no rates to plan against). An unknown GPU must bring its own peak
    (layout.py refuses it otherwise), memory and bandwidths: we never guess them.
    """
    c = cluster_cfg
    path = getattr(c, "profile", None)
    measured = load_profile(path) if path else None
    if c.gpu.lower() == hardware.CPU:
        if measured is None:
            return None
        # CPU ranks: the "accelerator memory" is the node's RAM shared by its ranks.
        host = c.host_memory_gb or measured.host_memory_gb or 0.0
        return Hardware(name="cpu", peak_tflops=0.0, memory_bytes=host * 1e9 / max(1, c.gpus_per_node),
                        intra_node_gbps=measured.intra.bus_gbps, inter_node_gbps=measured.inter.bus_gbps,
                        source=measured.source, profile=measured, device="cpu")
    spec = hardware.lookup(c.gpu)
    if spec is None:
        for key in ("peak_tflops", "memory_gb", "intra_node_gbps", "inter_node_gbps"):
            if getattr(c, key) is None:
                raise ConfigError(
                    f"cluster.{key}", None,
                    f"cluster.gpu={c.gpu} is not in the GPU catalog ({', '.join(sorted(hardware.CATALOG))}), so the planner "
                    "needs its peak, memory and link bandwidths from you",
                    "give cluster.peak_tflops (dense, training dtype), cluster.memory_gb, cluster.intra_node_gbps and "
                    "cluster.inter_node_gbps (GB/s per GPU, one direction), or use a catalog name")
        prof = measured or generic_profile(c.gpu, float(c.peak_tflops), float(c.intra_node_gbps), float(c.inter_node_gbps))
        return Hardware(name=c.gpu, peak_tflops=float(c.peak_tflops), memory_bytes=float(c.memory_gb) * 1e9,
                        intra_node_gbps=float(c.intra_node_gbps), inter_node_gbps=float(c.inter_node_gbps),
                        source="user-given cluster.* values; " + prof.source, profile=prof)

    def pick(key, default):
        value = getattr(c, key)
        return float(value) if value is not None else default

    peak = _dtype_peak(spec, dtype)
    prof = measured or scaled(BUILTIN[spec.name], compute=pick("peak_tflops", peak) / peak,
                              intra_gbps=c.intra_node_gbps, inter_gbps=c.inter_node_gbps)
    return Hardware(
        name=spec.name,
        peak_tflops=pick("peak_tflops", peak),
        memory_bytes=pick("memory_gb", spec.memory_gb) * 1e9,
        intra_node_gbps=pick("intra_node_gbps", spec.intra_node_gbps),
        inter_node_gbps=pick("inter_node_gbps", spec.inter_node_gbps),
        source=spec.source,
        profile=prof,
    )


def nics_added_hardware(hw: Optional[Hardware], nodes: int, gpus_per_node: int) -> Optional[Hardware]:
    """`hw` at the network's other end (profile.nics_added: a group spanning nodes gets its GPUs' NICs together,
    where the plan charges one NIC a GPU), or None where the plan has no other end: one node, one-GPU nodes, no
    hardware, or a profile that measured its groups across nodes. `launcher plan` and `--search` both ask here."""
    if hw is None or nodes <= 1:
        return None
    added = nics_added(hw.profile, gpus_per_node)
    return None if added is hw.profile else replace(hw, profile=added)


@dataclass(frozen=True)
class Strategy:
    """One layout as the formulas need it (a view of config.layout.Layout plus what Layout does not carry)."""

    tensor_degree: int
    pipeline_degree: int
    sequence_degree: int
    data_degree: int
    zero_stage: int
    micro_batch_size: int
    grad_accum_steps: int
    global_batch_size: int
    seq_length: int
    padded_vocab_size: int
    gpus_per_node: int
    dtype: str
    grad_accum_fp32: bool       # precision.grad_accum_dtype=fp32 (with bf16: DeepSpeed's BF16_Optimizer)
    recompute: str              # "none", "full" or "selective" (RECOMPUTE_MODES)
    checkpoint_blocks: Optional[int] = None  # model.checkpoint_blocks: when checkpointing, the first N blocks of each stage
    offload_optimizer: bool = False
    offload_param: bool = False
    partition_method: str = "parameters"   # parallel.partition_method: how DeepSpeed cuts the pipeline (plan/stages.py)
    sequence_parallel: bool = False        # parallel.sequence_parallel: Megatron SP over the TP ranks
    context_degree: int = 1     # ring-attention CP ranks (launcher/parallel/context.py)
    chunked_loss: bool = False             # model.chunked_loss: head and loss a chunk at a time (plan/activations.py)
    document_mask: bool = False            # data.document_mask: a (micro, 1, s, s) mask reaches every block (plan/activations.py)
    reduce_dtype: Optional[str] = None     # gradients' dtype on the wire (config.layout.reduce_dtype); None = dtype
    # ZeRO 3's parameter fetching (parallel.zero3_*; memory.zero3_gathered replays what they keep gathered)
    zero3_max_live_parameters: int = ZERO3_MAX_LIVE_PARAMETERS
    zero3_max_reuse_distance: int = ZERO3_MAX_REUSE_DISTANCE
    zero3_prefetch_bucket_size: int = ZERO3_PREFETCH_BUCKET_SIZE
    zero3_param_persistence_threshold: int = ZERO3_PARAM_PERSISTENCE_THRESHOLD

    @property
    def checkpointing(self) -> bool:
        """Activation checkpointing on (full or selective)."""
        return self.recompute != "none"

    @property
    def pipeline_layers(self) -> bool:
        """Runs as our layer list (config.layout.Layout.pipeline_layers: stages, or any TP on the plain engine):
        blocks recompute rotary."""
        return self.pipeline_degree > 1 or self.tensor_degree > 1

    @property
    def comm_dtype(self) -> str:
        """DeepSpeed's communication dtype, as the launcher sets it (config.layout.reduce_dtype): its reduce buckets'."""
        return self.reduce_dtype or self.dtype

    @property
    def wire_dtype(self) -> str:
        """The dtype gradients cross the wire in: the communication dtype, but fp32 under ZeRO-1/2 with Ulysses or CP,
        where DeepSpeed 0.19.8 casts each bucket to fp32 whatever it is told (stage_1_and_2.py allreduce_bucket)."""
        return "fp32" if zero12_reduces_in_fp32(self.sequence_split, self.zero_stage) else self.comm_dtype

    @property
    def world_size(self) -> int:
        return self.tensor_degree * self.pipeline_degree * self.sequence_degree * self.context_degree * self.data_degree

    @property
    def zero_partition_degree(self) -> int:
        """Ranks ZeRO partitions over: data x sequence split (config.layout.Layout.zero_partition_degree says why)."""
        return self.data_degree * self.sequence_split

    @property
    def sequence_split(self) -> int:
        """Ranks holding one sample's tokens between them (Ulysses x CP, one of them 1): a rank holds s / split."""
        return self.sequence_degree * self.context_degree

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_length


def strategy(cfg, layout, recompute: Optional[str] = None) -> Strategy:
    """The Strategy of a composed config and its resolved layout.

    `model.activation_checkpointing` maps to model.checkpoint_mode's recomputation ("full": DeepSpeed / transformers
    checkpoint whole blocks; "selective": they keep the matmuls' outputs too), on all blocks or the first
    model.checkpoint_blocks of each stage; `recompute` overrides it with one of RECOMPUTE_MODES.
    """
    if recompute is None:
        recompute = getattr(cfg.model, "checkpoint_mode", "full") if cfg.model.activation_checkpointing else "none"
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r}: the runtime runs {RECOMPUTE_MODES}")
    return Strategy(
        tensor_degree=layout.tensor_degree, pipeline_degree=layout.pipeline_degree,
        sequence_degree=layout.sequence_degree, data_degree=layout.data_degree, zero_stage=layout.zero_stage,
        micro_batch_size=layout.micro_batch_size, grad_accum_steps=layout.grad_accum_steps,
        global_batch_size=layout.global_batch_size, seq_length=layout.seq_length,
        padded_vocab_size=layout.padded_vocab_size, gpus_per_node=layout.gpus_per_node, dtype=layout.dtype,
        grad_accum_fp32=cfg.precision.grad_accum_dtype == "fp32", recompute=recompute,
        checkpoint_blocks=getattr(cfg.model, "checkpoint_blocks", None) if recompute != "none" else None,
        offload_optimizer=bool(cfg.parallel.offload_optimizer), offload_param=bool(cfg.parallel.offload_param),
        partition_method=cfg.parallel.partition_method, sequence_parallel=layout.sequence_parallel,
        context_degree=layout.context_degree, document_mask=bool(getattr(cfg.data, "document_mask", False)),
        chunked_loss=bool(getattr(cfg.model, "chunked_loss", False)),
        reduce_dtype=reduce_dtype(cfg), **{k: getattr(cfg.parallel, k) for k in ZERO3_KNOBS})
