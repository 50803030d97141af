"""What `launcher train` does not run yet, as pure rules on the resolved layout (no torch).

`launcher train` / `submit` (submit.validate_before_start) and `launcher plan --search` (plan/search.py) call
the same function, so the search never proposes a layout that train refuses. It lives here, not in
launcher/train.py, because the planner must not import the runtime (torch, deepspeed).
"""

from __future__ import annotations

from launcher.config.errors import ConfigError, refuse_parallel_degrees
from launcher.config.streaming import check_streaming

# The architectures launcher/parallel/pipeline.py can cut into a DeepSpeed PipelineModule (its ARCH_MODULES), and so
# the ones tensor parallelism runs for (our TP layers live in those layer lists, with or without stages);
# GPT2LMHeadModel has no stage builder there, so a gpt pipeline or TP run would fail after the ranks start.
PIPELINE_ARCHS = ("llama", "mistral", "qwen2", "bloom")

# Mistral and Qwen2 are LLaMA blocks for everything the runtime shards, saves and schedules (RMSNorm, rotary,
# SwiGLU, GQA; Qwen2's q/k/v biases are column-parallel): one family wherever a rule is per architecture.
LLAMA_FAMILY = ("llama", "mistral", "qwen2")


def check_supported(cfg, layout) -> None:
    """What this loop does not run yet, refused before any process starts."""
    check_streaming(cfg)
    if layout.sequence_parallel:
        _check_megatron_sequence_parallel(cfg, layout)
    if layout.context_degree > 1 and layout.tensor_degree > 1 and layout.zero_stage == 3:
        # The same layers and the same reason as Megatron SP below.
        raise ConfigError("parallel.zero_stage", 3,
                          f"context parallelism with tensor parallelism (context_degree={layout.context_degree} x "
                          f"tensor_degree={layout.tensor_degree}) runs on our tensor-parallel layers with ZeRO stage 0, "
                          "1 or 2; ZeRO-3's parameter partitioning of those TP-sharded layers is not implemented",
                          "set parallel.zero_stage=2 (or 1, 0), or parallel.tensor_degree=1 (ring attention runs "
                          "under ZeRO-3 without TP)")
    if layout.sequence_degree > 1 and layout.tensor_degree > 1:
        raise ConfigError("parallel.sequence_degree", layout.sequence_degree,
                          f"Ulysses sequence parallelism runs without tensor parallelism in `launcher train` "
                          f"(tensor_degree={layout.tensor_degree}: Ulysses runs on the plain transformers model, TP on "
                          "our tensor-parallel layers, and the Ulysses all-to-all is not composed with them yet)",
                          "set parallel.tensor_degree=1, or parallel.sequence_degree=1")
    if layout.tensor_degree > 1 and layout.zero_stage == 3 and layout.pipeline_degree == 1:
        # The same layers and the same reason as Megatron SP below (launcher/parallel/tensor_model.py).
        raise ConfigError("parallel.zero_stage", 3,
                          f"tensor parallelism (tensor_degree={layout.tensor_degree}, pipeline_degree=1) runs on our "
                          "tensor-parallel layers with ZeRO stage 0, 1 or 2; ZeRO-3's parameter partitioning of those "
                          "TP-sharded layers is not implemented",
                          "set parallel.zero_stage=2 (or 1, 0): the TP ranks already split the weights tensor_degree "
                          "ways, or parallel.tensor_degree=1 (ZeRO-3 alone shards every weight)")
    if layout.sequence_degree > 1 and cfg.model.arch not in LLAMA_FAMILY:
        raise ConfigError("parallel.sequence_degree", layout.sequence_degree,
                          f"Ulysses sequence parallelism is implemented for model.arch={', '.join(LLAMA_FAMILY)}, not {cfg.model.arch}",
                          "set parallel.sequence_degree=1, or model.arch=llama")
    if layout.context_degree > 1 and cfg.model.arch not in LLAMA_FAMILY:
        raise ConfigError("parallel.context_degree", layout.context_degree,
                          f"ring-attention context parallelism is implemented for model.arch={', '.join(LLAMA_FAMILY)} "
                          f"(launcher/parallel/context.py, a transformers attention function), not {cfg.model.arch}",
                          "set parallel.context_degree=1, or model.arch=llama")
    if layout.tensor_degree > 1 and layout.pipeline_degree == 1 and cfg.model.arch not in PIPELINE_ARCHS:
        raise ConfigError("parallel.tensor_degree", layout.tensor_degree,
                          f"tensor parallelism runs on our tensor-parallel layer list (launcher/parallel/pipeline.py, "
                          f"each rank building only its slice), implemented for model.arch={', '.join(PIPELINE_ARCHS)}, "
                          f"not {cfg.model.arch}",
                          "set parallel.tensor_degree=1 and shard with parallel.zero_stage=3, or use model.arch=llama")
    if layout.pipeline_degree > 1 and cfg.model.arch not in PIPELINE_ARCHS:
        raise ConfigError("parallel.pipeline_degree", layout.pipeline_degree,
                          f"pipeline parallelism is implemented for model.arch={', '.join(PIPELINE_ARCHS)} "
                          f"(launcher/parallel/pipeline.py), not {cfg.model.arch}",
                          "set parallel.pipeline_degree=1 (shard with parallel.zero_stage or tensor_degree instead), "
                          "or use model.arch=llama")
    check_document_mask(cfg, layout)


def _check_megatron_sequence_parallel(cfg, layout) -> None:
    """parallel.sequence_parallel runs our Megatron TP (launcher/parallel/tensor.py) in our layer list: on DeepSpeed's
    pipeline engine with stages, on its plain engine at pipeline_degree = 1 (launcher/parallel/tensor_model.py), like
    all TP."""
    if layout.sequence_degree > 1:
        raise ConfigError("parallel.sequence_parallel", True,
                          f"Megatron sequence parallelism (inside TP) and Ulysses (parallel.sequence_degree="
                          f"{layout.sequence_degree}) both split the sequence and are not composed: Ulysses runs on the "
                          "plain transformers model, Megatron SP on our tensor-parallel layers",
                          "set parallel.sequence_degree=1 (the TP ranks split the sequence), or parallel.sequence_parallel=false")
    if cfg.model.arch not in LLAMA_FAMILY:
        raise ConfigError("parallel.sequence_parallel", True,
                          f"Megatron sequence parallelism is implemented for the LLaMA-family decoder blocks "
                          f"(model.arch={', '.join(LLAMA_FAMILY)}), not model.arch={cfg.model.arch}",
                          "set parallel.sequence_parallel=false (tensor parallelism alone runs), or model.arch=llama")
    if layout.zero_stage == 3:
        # ZeRO-1/2 keep every parameter whole on its rank and reduce gradients over the grid's data-parallel group,
        # which tests/parallel holds to one rank (loss and gradient norm). ZeRO-3 would partition our TP shards
        # again over DP and gather them in its module hooks around layers DeepSpeed did not build; that is not
        # verified, so it is refused rather than run.
        raise ConfigError("parallel.zero_stage", 3,
                          f"parallel.sequence_parallel=true (Megatron SP over tensor_degree={layout.tensor_degree}) runs on "
                          "our tensor-parallel layers with ZeRO stage 0, 1 or 2; ZeRO-3's parameter partitioning of "
                          "those TP-sharded layers is not implemented",
                          "set parallel.zero_stage=2 (or 1, 0): the TP ranks already split the weights tensor_degree ways, "
                          "or parallel.sequence_parallel=false")


# data.document_mask reaches the model as position ids that restart after each EOS, from which transformers
# builds the within-document causal mask (launcher/runtime/documents.py); our TP layers at pipeline_degree = 1 take
# them too and build the same mask with transformers' create_causal_mask (launcher/parallel/pipeline.py
# EmbeddingPipe). These architectures take them: BLOOM has no position ids (ALiBi inside its own eager attention).
DOCUMENT_MASK_ARCHS = ("llama", "mistral", "qwen2", "gpt")


def check_document_mask(cfg, layout) -> None:
    """data.document_mask runs where the model takes the batch's position ids whole: 1 rank, ZeRO data parallelism
    (any stage) and tensor parallelism without a pipeline (our TP layers on the plain engine). Refused elsewhere,
    before any process starts."""
    if not getattr(cfg.data, "document_mask", False):
        return
    if cfg.model.arch not in DOCUMENT_MASK_ARCHS:
        raise ConfigError("data.document_mask", True,
                          f"the document mask is given to the model as position ids that restart after each EOS; "
                          f"model.arch={cfg.model.arch} takes none (BLOOM's ALiBi bias is built inside its own attention), "
                          f"so it runs for model.arch={', '.join(DOCUMENT_MASK_ARCHS)} only",
                          "set data.document_mask=false, or use model.arch=llama")
    # Tensor parallelism without a pipeline passes the position ids into our TP layers, whose embedding builds the
    # mask as the transformers model does (tests/train/test_document_mask_runs.py holds TP 2 to 1 rank); between
    # pipeline stages only the hidden states travel, so with stages it is refused.
    degrees = {"parallel.pipeline_degree": (layout.pipeline_degree, "the pipeline's stages receive only the hidden states and "
                                            "recompute positions 0..seq-1 (launcher/parallel/pipeline.py)"),
               "parallel.sequence_degree": (layout.sequence_degree, "Ulysses ranks hold a slice of the sequence and "
                                            "attend with is_causal, which cannot express document boundaries "
                                            "(launcher/parallel/sequence.py)"),
               "parallel.context_degree": (getattr(layout, "context_degree", 1), "ring-attention ranks attend over "
                                           "head-tail chunks by global position, with no document boundaries "
                                           "(launcher/parallel/context.py)"),
}
    if layout.sequence_parallel:
        raise ConfigError("data.document_mask", True,
                          "runs on 1 rank, with ZeRO data parallelism and with tensor parallelism without a pipeline "
                          "only, not with parallel.sequence_parallel=true: under Megatron SP each TP rank's embedding "
                          "output holds s/tp tokens and the blocks recompute positions 0..seq-1 "
                          "(launcher/parallel/pipeline.py)",
                          "set data.document_mask=false, or parallel.sequence_parallel=false")
    refuse_parallel_degrees("data.document_mask", True, degrees,
                            "runs on 1 rank, with ZeRO data parallelism and with tensor parallelism without a pipeline "
                            "only", "set data.document_mask=false", " (shard with parallel.zero_stage instead)")
