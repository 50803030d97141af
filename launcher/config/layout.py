"""Layout resolution: the one place where the parallel and batch arithmetic is done.

    world_size        = cluster.nodes x cluster.gpus_per_node
    model_parallel    = tensor_degree x pipeline_degree x sequence_degree x context_degree
    data_degree       = world_size / model_parallel
    grad_accum_steps  = global_batch_size / (micro_batch_size x data_degree)
    tokens_per_step   = global_batch_size x seq_length
    pipeline micro-batches m = grad_accum_steps (DeepSpeed's pipeline engine runs
                        one micro-batch per accumulation step)
    bubble_fraction   = (pipeline_degree - 1) / m   (GPipe / 1F1B idle share of
                        ideal compute; Narayanan et al. 2021, "Efficient Large-Scale
                        Language Model Training on GPU Clusters", section 2.2.1)

Sequence parallelism (DeepSpeed Ulysses) splits each sample's sequence across
`sequence_degree` ranks that all see the same samples, so it takes ranks away
from data parallelism exactly like tensor parallelism does. Context parallelism
(ring attention, `context_degree`) does the same with 2 x context_degree chunks.
Megatron sequence parallelism (parallel.sequence_parallel) takes no ranks: the
tensor_degree ranks of a TP group also split each sequence (seq_length / tp tokens
each) outside the TP regions, so seq_length must be a multiple of tensor_degree.

`resolve_layout` checks every rule before anything starts and raises
`ConfigError` naming the key, the value, the rule with the user's arithmetic and
the nearest valid values. It never writes back into the config.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from launcher.config import hardware
from launcher.config.errors import ConfigError, join_or, nearest_divisors, nearest_multiples, refuse_parallel_degrees
from launcher.config.hfmodel import check_model_source
from launcher.config.ranges import check_ranges

ARCHS = ("llama", "mistral", "qwen2", "bloom", "gpt")
# Decoders with grouped-query attention and a free MLP width (launcher/config/hfmodel.py, LLAMA_FAMILY).
GQA_ARCHS = ("llama", "mistral", "qwen2")
DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Layout:
    """Every derived number of a run, computed once by `resolve_layout`."""

    world_size: int
    nodes: int
    gpus_per_node: int
    tensor_degree: int
    pipeline_degree: int
    sequence_degree: int
    data_degree: int
    zero_stage: int
    micro_batch_size: int
    global_batch_size: int
    grad_accum_steps: int
    seq_length: int
    tokens_per_step: int
    pipeline_micro_batches: int
    bubble_fraction: float
    vocab_size: int
    padded_vocab_size: int
    device: str  # "cuda" or "cpu"
    dtype: str
    warnings: tuple[str, ...] = ()
    # Megatron sequence parallelism inside TP (parallel.sequence_parallel): no extra ranks, the TP ranks split s.
    sequence_parallel: bool = False
    context_degree: int = 1   # after the defaulted field: Layouts built by keyword elsewhere stay valid

    @property
    def pipeline_engine(self) -> bool:
        """Whether the run goes through DeepSpeed's pipeline engine (train_batch, ZeRO 0-1 only): with stages."""
        return self.pipeline_degree > 1

    @property
    def pipeline_layers(self) -> bool:
        """Whether the model is our layer list (launcher/parallel/pipeline.py, built per rank, TP from
        launcher/parallel/tensor.py): with stages, or with any TP (Megatron SP and TP x CP included). At
        pipeline_degree = 1 it runs on DeepSpeed's plain engine (launcher/parallel/tensor_model.py), so ZeRO-2 applies."""
        return self.pipeline_degree > 1 or self.tensor_degree > 1

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_degree * self.pipeline_degree * self.sequence_degree * self.context_degree

    @property
    def zero_partition_degree(self) -> int:
        """Ranks one ZeRO partition is cut over (optimizer state, gradients, ZeRO-3 parameters), and the gradient
        reduction's group: DeepSpeed's sequence-data-parallel group, data_degree x sequence_parallel_size (0.19.8
        runtime/engine.py hands seq_data_parallel_group to every ZeRO optimizer as its dp_process_group)."""
        return self.data_degree * self.sequence_parallel_size

    @property
    def sequence_parallel_size(self) -> int:
        """Ranks splitting one sample's sequence (Ulysses x CP; one of them is 1): DeepSpeed's sequence_parallel_size."""
        return self.sequence_degree * self.context_degree

    def as_dict(self) -> dict:
        return asdict(self)


def _positive(key: str, value, fix: str = "use a whole number >= 1") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "must be a whole number >= 1", fix)
    return value


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _check_names(cfg) -> None:
    # The run name becomes a directory and a SLURM job name: allow no separators, no traversal, no shell syntax.
    if cfg.run_name is not None and not RUN_NAME.fullmatch(str(cfg.run_name)):
        raise ConfigError("run_name", cfg.run_name,
                          "must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit "
                          "(it names a directory under runs_dir and the SLURM job)",
                          "pick a name such as run_name=llama-7b-lr3e-4")
    arch = cfg.model.arch
    if arch not in ARCHS:
        raise ConfigError("model.arch", arch, f"must be one of {', '.join(ARCHS)}", "set model.arch=llama (or mistral, qwen2, bloom, gpt)")
    dtype = cfg.precision.dtype
    if dtype not in DTYPES:
        raise ConfigError("precision.dtype", dtype, f"must be one of {', '.join(DTYPES)}", "select precision=bf16, precision=fp16 or precision=fp32")
    stage = cfg.parallel.zero_stage
    if stage not in (0, 1, 2, 3):
        raise ConfigError("parallel.zero_stage", stage, "DeepSpeed ZeRO has stages 0, 1, 2 and 3", "set parallel.zero_stage to 0, 1, 2 or 3")


NAN_POLICIES = ("stop", "skip")


def _check_run_settings(cfg) -> None:
    """Policies and the resume value (the numeric ranges are checked by ranges.check_ranges)."""
    t = cfg.train
    if t.nan_policy not in NAN_POLICIES:
        raise ConfigError("train.nan_policy", t.nan_policy, f"must be one of {', '.join(NAN_POLICIES)}",
                          "train.nan_policy=stop (save the last good weights and exit 3) or skip (drop the step's update)")
    if cfg.resume in ("", None):
        raise ConfigError("resume", cfg.resume, "must be never, auto or a checkpoint path", "resume=never (fresh) or resume=auto")


DATA_SOURCES = ("stdlib", "hf", "tokens", "blend")
TOKEN_DTYPES = ("uint16", "uint32")


def _check_data(cfg) -> None:
    """Which inputs each data source needs (existence of the files is checked before launch, not here)."""
    d = cfg.data
    if d.source not in DATA_SOURCES:
        raise ConfigError("data.source", d.source, f"must be one of {', '.join(DATA_SOURCES)}", "select data=stdlib, data=hf, data=tokens or data=blend")
    if d.source == "tokens" and not d.tokens_path:
        raise ConfigError("data.tokens_path", d.tokens_path, "data=tokens reads an existing packed token file and needs its path",
                          "pass data.tokens_path=/path/to/tokens.bin (written by an earlier run's pretokenization)")
    if d.source == "hf" and not d.paths and not d.hf_name:
        raise ConfigError("data.paths", list(d.paths), "data=hf needs local files (data.paths) or a hub dataset name (data.hf_name)",
                          "pass data.paths='[/data/train.jsonl]' or data.hf_name=NAME")
    if d.source == "blend":
        if not d.sources:
            raise ConfigError("data.sources", [], "data=blend draws each sample from one of data.sources, and it is empty",
                              "pass data.sources='[{path: /data/web.bin, weight: 0.7}, {path: /data/code.bin, weight: 0.3}]'")
        for i, src in enumerate(d.sources):
            keys = set(src.keys()) if hasattr(src, "keys") else None
            if keys is None or keys - {"path", "weight"} or not src.get("path"):
                raise ConfigError(f"data.sources[{i}]", src, "a blend source is a mapping with a token file `path` and a `weight`"
                                  + (f" (unknown: {', '.join(sorted(keys - {'path', 'weight'}))})" if keys and keys - {"path", "weight"} else ""),
                                  "write it as {path: /data/web.bin, weight: 0.7}")
            w = src.get("weight")
            # Each sample is drawn from source i with probability w_i / sum(w) (Megatron's BlendedDataset weights).
            if not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
                raise ConfigError(f"data.sources[{i}].weight", w, "a blend weight is a relative share of the samples and must be "
                                  "positive and finite (a source with weight 0 contributes nothing: leave it out)",
                                  f"set data.sources[{i}].weight to a positive number, e.g. 0.3, or remove the source")
    if d.token_dtype is not None and d.token_dtype not in TOKEN_DTYPES:
        raise ConfigError("data.token_dtype", d.token_dtype, f"a flat token file holds {' or '.join(TOKEN_DTYPES)} ids",
                          "set data.token_dtype=uint16 (vocabularies up to 65,536, e.g. nanoGPT's GPT-2 tokens) or uint32")


def _check_model_shape(cfg) -> None:
    m = cfg.model
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "max_position_embeddings"):
        _positive(f"model.{key}", getattr(m, key))
    heads = m.num_attention_heads
    if m.hidden_size % heads:
        lo_hi = nearest_multiples(m.hidden_size, heads)
        raise ConfigError(
            "model.hidden_size", m.hidden_size,
            f"must be divisible by model.num_attention_heads: {m.hidden_size} % {heads} = {m.hidden_size % heads}",
            f"set model.hidden_size to {join_or(lo_hi)}, or num_attention_heads to one of {join_or(nearest_divisors(m.hidden_size, heads, 3))}")
    kv = m.num_key_value_heads
    if kv is not None:
        _positive("model.num_key_value_heads", kv, "use a divisor of num_attention_heads, or null for multi-head attention")
        if heads % kv:
            raise ConfigError(
                "model.num_key_value_heads", kv,
                f"grouped-query attention needs num_attention_heads divisible by num_key_value_heads: {heads} % {kv} = {heads % kv}",
                f"set model.num_key_value_heads to one of {join_or(nearest_divisors(heads, kv, 3))}")
        if m.arch not in GQA_ARCHS and kv != heads:
            raise ConfigError("model.num_key_value_heads", kv, f"model.arch={m.arch} has no grouped-query attention",
                              f"set model.num_key_value_heads=null (or {heads}), or use model.arch=llama")
    blocks = getattr(m, "checkpoint_blocks", None)
    if blocks is not None:
        if not m.activation_checkpointing:
            raise ConfigError("model.checkpoint_blocks", blocks,
                              "counts the blocks a stage checkpoints, and model.activation_checkpointing is false",
                              "set model.activation_checkpointing=true, or model.checkpoint_blocks=null")
        if blocks > m.num_hidden_layers:
            raise ConfigError("model.checkpoint_blocks", blocks,
                              f"is more than the model's model.num_hidden_layers = {m.num_hidden_layers} blocks",
                              f"set model.checkpoint_blocks to at most {m.num_hidden_layers}, or null (every block)")
    if m.intermediate_size is not None:
        _positive("model.intermediate_size", m.intermediate_size)
        if m.arch not in GQA_ARCHS and m.intermediate_size != 4 * m.hidden_size:
            raise ConfigError("model.intermediate_size", m.intermediate_size,
                              f"model.arch={m.arch} always uses 4 x hidden_size = {4 * m.hidden_size}",
                              "set model.intermediate_size=null, or use model.arch=llama")


def _check_cluster(cfg) -> str:
    c = cfg.cluster
    _positive("cluster.nodes", c.nodes)
    _positive("cluster.gpus_per_node", c.gpus_per_node)
    if c.gpu.lower() == hardware.CPU:
        return "cpu"
    if hardware.lookup(c.gpu) is None and c.peak_tflops is None:
        raise ConfigError(
            "cluster.gpu", c.gpu,
            f"is not in the GPU catalog ({', '.join(sorted(hardware.CATALOG))}) and no peak throughput was given, so MFU and step time cannot be computed",
            "use a catalog name, or give cluster.peak_tflops=<dense TFLOP/s in the training dtype> "
            "with cluster.memory_gb, cluster.intra_node_gbps and cluster.inter_node_gbps")
    return "cuda"


def _data_degree(cfg, world: int, tp: int, pp: int, sp: int, cp: int = 1) -> int:
    mp = tp * pp * sp * cp
    if world % mp:
        c = cfg.cluster
        degrees = {"tensor_degree": tp, "pipeline_degree": pp, "sequence_degree": sp, "context_degree": cp}
        # Name the largest degree: it is the one most likely set by hand.
        name = max(degrees, key=lambda k: (degrees[k], k == "tensor_degree"))
        others = mp // degrees[name]
        room = world // others if world % others == 0 else None
        hints = []
        if room:
            hints.append(f"parallel.{name} to {join_or(nearest_divisors(room, degrees[name], 2))} "
                         f"(divisors of world / the other degrees = {world} / {others} = {room})")
        nodes = [n for n in range(1, c.nodes + 2 * mp + 1) if (n * c.gpus_per_node) % mp == 0]
        if nodes:
            hints.append(f"cluster.nodes to {join_or(sorted(nodes, key=lambda n: (abs(n - c.nodes), n))[:2])}")
        raise ConfigError(
            f"parallel.{name}", degrees[name],
            f"world size cluster.nodes x cluster.gpus_per_node = {c.nodes} x {c.gpus_per_node} = {world} is not divisible by "
            f"tensor_degree x pipeline_degree x sequence_degree x context_degree = {tp} x {pp} x {sp} x {cp} = {mp}",
            "set " + (", or ".join(hints) if hints else "the degrees so that their product divides the world size"))
    dp = world // mp
    explicit = cfg.parallel.data_degree
    if explicit is not None and explicit != dp:
        raise ConfigError(
            "parallel.data_degree", explicit,
            f"disagrees with the derived world / (tensor x pipeline x sequence x context) = {world} / ({tp} x {pp} x {sp} x {cp}) = {dp}",
            f"set parallel.data_degree=null (derived) or {dp}, or change the cluster size to "
            f"{explicit * mp} GPUs ({explicit} x {mp})")
    return dp


def _check_batch(cfg, dp: int) -> int:
    b = cfg.batch
    micro = _positive("batch.micro_batch_size", b.micro_batch_size)
    gbs = _positive("batch.global_batch_size", b.global_batch_size)
    per_step = micro * dp
    if gbs % per_step:
        micros = [m for m in range(1, min(gbs, 64) + 1) if gbs % (m * dp) == 0][-3:]
        micro_hint = f"; or set batch.micro_batch_size to {join_or(micros)}" if micros else ""
        raise ConfigError(
            "batch.global_batch_size", gbs,
            f"is not divisible by micro_batch_size x data_degree = {micro} x {dp} = {per_step}, "
            f"so the gradient accumulation steps would not be whole",
            f"nearest valid global_batch_size: {join_or(nearest_multiples(gbs, per_step))}{micro_hint}")
    return gbs // per_step


def _check_tensor_parallel(cfg, tp: int, warnings: list[str]) -> int:
    m = cfg.model
    heads = m.num_attention_heads
    kv = m.num_key_value_heads or heads
    if heads % tp:
        raise ConfigError(
            "parallel.tensor_degree", tp,
            f"each tensor-parallel rank holds whole attention heads: model.num_attention_heads % tensor_degree = {heads} % {tp} = {heads % tp}",
            f"set parallel.tensor_degree to one of {join_or(nearest_divisors(heads, tp, 3))}")
    if kv % tp:
        raise ConfigError(
            "parallel.tensor_degree", tp,
            f"each tensor-parallel rank holds whole key/value heads: model.num_key_value_heads % tensor_degree = {kv} % {tp} = {kv % tp}",
            f"set parallel.tensor_degree to one of {join_or(nearest_divisors(kv, tp, 3))}")
    inter = m.intermediate_size or 4 * m.hidden_size
    if inter % tp:
        raise ConfigError(
            "parallel.tensor_degree", tp,
            f"the MLP is split column-wise: intermediate_size % tensor_degree = {inter} % {tp} = {inter % tp}",
            f"set model.intermediate_size to {join_or(nearest_multiples(inter, tp))}, or parallel.tensor_degree to one of "
            f"{join_or(nearest_divisors(math.gcd(inter, heads), tp, 3))}")
    if tp > cfg.cluster.gpus_per_node:
        warnings.append(
            f"parallel.tensor_degree={tp} > cluster.gpus_per_node={cfg.cluster.gpus_per_node}: tensor-parallel all-reduces "
            f"will cross the inter-node network (TP belongs inside a node)")
    # Megatron pads the embedding so every TP rank gets an equal slice (Shoeybi et al. 2019, section 3;
    # BLOOM padded 250,680 tokens to 250,880).
    vocab = m.vocab_size
    padded = -(-vocab // tp) * tp
    if padded != vocab:
        warnings.append(f"model.vocab_size={vocab} is not divisible by tensor_degree={tp}: padded to {padded} rows")
    return padded


def _check_pipeline(cfg, pp: int, zero: int, accum: int, warnings: list[str]) -> None:
    layers = cfg.model.num_hidden_layers
    if pp > layers:
        raise ConfigError(
            "parallel.pipeline_degree", pp,
            f"each pipeline stage needs at least one block: pipeline_degree > model.num_hidden_layers ({pp} > {layers})",
            f"set parallel.pipeline_degree to at most {layers} (divisors of {layers}: {join_or(nearest_divisors(layers, pp, 3))})")
    if pp > 1 and layers % pp:
        warnings.append(f"model.num_hidden_layers={layers} is not divisible by pipeline_degree={pp}: stages get "
                        f"{layers // pp} or {layers // pp + 1} blocks")
    if pp > 1 and zero > 1:
        raise ConfigError(
            "parallel.zero_stage", zero,
            f"DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only (pipeline_degree={pp} > 1); "
            "stages 2 and 3 partition gradients/parameters in ways the pipeline schedule does not support",
            "set parallel.zero_stage=1 (or 0), or parallel.pipeline_degree=1")
    if pp > 1 and cfg.train.nan_policy == "skip":
        warnings.append("train.nan_policy=skip with pipeline_degree > 1: DeepSpeed's pipeline engine updates the weights "
                        "inside train_batch before the loss is known, so a non-finite loss stops the run (exit 3) "
                        "instead of skipping the step (unless DeepSpeed skipped it itself)")
    if pp > 1 and accum < pp:
        warnings.append(f"only {accum} pipeline micro-batches for {pp} stages: bubble (p-1)/m = {(pp - 1) / accum:.0%}; "
                        f"raise batch.global_batch_size or lower batch.micro_batch_size")


def _check_sequence_parallel(cfg, sp: int, pp: int) -> None:
    if sp == 1:
        return
    seq = cfg.data.seq_length
    heads = cfg.model.num_attention_heads
    if seq % sp:
        raise ConfigError("parallel.sequence_degree", sp,
                          f"Ulysses splits the sequence evenly: data.seq_length % sequence_degree = {seq} % {sp} = {seq % sp}",
                          f"set data.seq_length to {join_or(nearest_multiples(seq, sp))}, or sequence_degree to one of "
                          f"{join_or(nearest_divisors(math.gcd(seq, heads), sp, 3))} (divisors of both seq_length and the head count)")
    if heads % sp:
        raise ConfigError("parallel.sequence_degree", sp,
                          f"Ulysses' all-to-all hands each rank whole heads: model.num_attention_heads % sequence_degree = {heads} % {sp} = {heads % sp}",
                          f"set parallel.sequence_degree to one of {join_or(nearest_divisors(heads, sp, 3))}")
    if pp > 1:
        raise ConfigError("parallel.sequence_degree", sp,
                          f"sequence parallelism is not supported together with pipeline_degree={pp} > 1",
                          "set parallel.sequence_degree=1, or parallel.pipeline_degree=1")


def _check_megatron_sequence_parallel(cfg, tp: int) -> bool:
    if not cfg.parallel.sequence_parallel:
        return False
    if tp == 1:
        raise ConfigError("parallel.sequence_parallel", True,
                          "Megatron sequence parallelism splits the sequence over the tensor-parallel ranks, and "
                          "tensor_degree = 1 leaves one rank to split it over",
                          "set parallel.tensor_degree=2 (or more), or parallel.sequence_parallel=false; to split "
                          "sequences without TP use parallel.sequence_degree (Ulysses)")
    seq = cfg.data.seq_length
    if seq % tp:
        raise ConfigError("parallel.sequence_parallel", True,
                          f"each tensor-parallel rank keeps an equal share of the sequence: data.seq_length % "
                          f"tensor_degree = {seq} % {tp} = {seq % tp}",
                          f"set data.seq_length to {join_or(nearest_multiples(seq, tp))}, or parallel.sequence_parallel=false")
    return True


def _check_context_parallel(cfg, cp: int, tp: int, sp: int, device: str) -> None:
    """Ring attention (launcher/parallel/context.py): 2 x cp equal chunks per sample; what it does not compose with."""
    if cp == 1:
        return
    seq = cfg.data.seq_length
    if seq % (2 * cp):
        # Head-tail load balancing: rank r holds chunks r and 2cp-1-r of seq_length / (2 cp) tokens each.
        fits = [c for c in range(1, seq + 1) if seq % (2 * c) == 0]
        raise ConfigError("parallel.context_degree", cp,
                          f"ring attention cuts each sample into 2 x context_degree equal chunks (rank r holds chunks r "
                          f"and 2cp-1-r, which balances the causal work): data.seq_length % (2 x context_degree) = "
                          f"{seq} % {2 * cp} = {seq % (2 * cp)}",
                          f"set data.seq_length to {join_or(nearest_multiples(seq, 2 * cp))}, or parallel.context_degree "
                          f"to one of {join_or(sorted(fits, key=lambda c: (abs(c - cp), c))[:3])}")
    if sp > 1:
        raise ConfigError("parallel.sequence_degree", sp, f"context parallelism (context_degree={cp}) runs without it in "
                          "`launcher train`: Ulysses and ring attention both split the sequence, and DeepSpeed has one "
                          "sequence-parallel group per rank to reduce their gradients over",
                          "set parallel.sequence_degree=1, or parallel.context_degree=1")
    local = seq // cp
    if cfg.parallel.sequence_parallel and local % tp:
        # Megatron SP then splits each rank's seq / cp tokens (its two chunks) over the TP ranks.
        raise ConfigError("parallel.sequence_parallel", True,
                          f"with context_degree={cp} each rank holds data.seq_length / context_degree = {seq} / {cp} = "
                          f"{local} tokens, which Megatron SP splits over the tensor-parallel ranks: {local} % "
                          f"tensor_degree = {local} % {tp} = {local % tp}",
                          f"set data.seq_length to {join_or(nearest_multiples(seq, math.lcm(2 * cp, cp * tp)))}, or "
                          "parallel.sequence_parallel=false")
    if device == "cuda" and cfg.precision.dtype == "fp32":
        raise ConfigError("precision.dtype", "fp32",
                          f"context parallelism on GPUs (context_degree={cp}) runs each ring block with the CUDA "
                          "flash-attention kernel, which takes fp16/bf16 only",
                          "select precision=bf16, or parallel.context_degree=1")


def _check_precision(cfg, device: str, dtype: str) -> None:
    if dtype == "fp16" and device == "cpu":
        raise ConfigError("precision.dtype", "fp16",
                          "fp16 training needs a GPU; DeepSpeed's CPU accelerator refuses it (cluster.gpu=cpu)",
                          "select precision=bf16 or precision=fp32 for CPU ranks")
    reduce = cfg.precision.reduce_dtype
    if reduce is not None and reduce not in ("fp32", dtype):
        raise ConfigError("precision.reduce_dtype", reduce,
                          f"gradients are reduced in fp32 or in the model's dtype (precision.dtype={dtype}); a third "
                          "dtype would round them twice",
                          f"set precision.reduce_dtype=fp32 or precision.reduce_dtype=null (the model's, {dtype})")


def reduce_dtype(cfg) -> str:
    """The dtype the launcher asks DeepSpeed to reduce gradients in: precision.reduce_dtype, else the model's. The
    one answer for the DeepSpeed config it writes (deepspeed_config._precision) and the traffic the plan prices
    (plan/inputs.py Strategy.wire_dtype). DeepSpeed's own default differs by layout: the model's dtype, but fp32
    whenever sequence_parallel_size > 1 (Ulysses or CP; engine.py seq_parallel_communication_data_type), which made a
    layout's gradients twice as many bytes, and rounded differently, for splitting its sequence. The model's dtype is
    also Megatron-LM's default (grad_reduce_in_fp32 off) and NeMo's. DeepSpeed 0.19.8's ZeRO-1/2 ignore it under
    Ulysses or CP (zero12_reduces_in_fp32)."""
    return cfg.precision.reduce_dtype or cfg.precision.dtype


def zero12_reduces_in_fp32(sequence_split: int, zero: int) -> bool:
    """DeepSpeed 0.19.8's ZeRO-1/2 cast every gradient bucket to fp32 when the sequence is split (Ulysses x CP ranks
    > 1), whatever communication_data_type says (stage_1_and_2.py allreduce_bucket). Measured on 2 CPU ranks,
    recipe=tiny bf16 SP2 with the launcher's config (2026-12-06): ZeRO-0 and ZeRO-3 all-reduce 1,328,256 bf16
    elements, ZeRO-1 float32 (bench/steptime/results.md)."""
    return sequence_split > 1 and zero in (1, 2)


def _warn_fp32_reduce(cfg, sp: int, cp: int, zero: int, warnings: list[str]) -> None:
    if zero12_reduces_in_fp32(sp * cp, zero) and cfg.precision.reduce_dtype not in (None, "fp32"):
        warnings.append(f"precision.reduce_dtype={cfg.precision.reduce_dtype} is not what ZeRO-{zero} does under "
                        f"{'Ulysses' if sp > 1 else 'CP'}: DeepSpeed 0.19.8's ZeRO-1/2 reduce gradients in fp32 whenever "
                        "the sequence is split (stage_1_and_2.py allreduce_bucket), twice the bytes; ZeRO-0 and ZeRO-3 "
                        "honour it")


def _check_grad_accum_dtype(cfg, zero: int, dtype: str) -> None:
    # DeepSpeed 0.19.8 (runtime/engine.py _do_optimizer_sanity_check): without ZeRO the engine takes a gradient
    # accumulation dtype only equal to the model's ("unsupported mix of model_dtype and grad_accum_dtype" otherwise);
    # its fp32 accumulation for bf16 weights is BF16_Optimizer, which it selects at ZeRO stage 1.
    acc = cfg.precision.grad_accum_dtype
    if zero == 0 and acc is not None and acc != dtype:
        raise ConfigError("precision.grad_accum_dtype", acc,
                          f"DeepSpeed 0.19.8 accumulates gradients in the model's dtype without ZeRO "
                          f"(parallel.zero_stage=0, precision.dtype={dtype}); it refuses another at engine start "
                          f"(engine.py: unsupported mix of model_dtype and grad_accum_dtype)",
                          "set parallel.zero_stage=1 (with bf16 and fp32 accumulation DeepSpeed runs its BF16_Optimizer, "
                          "as recipe=bloom-176b does) or precision.grad_accum_dtype=null")


def pipeline_accumulates_in_bf16(pp: int, zero: int, dtype: str, grad_accum_dtype) -> bool:
    """DeepSpeed 0.19.8 picks its BF16_Optimizer (fp32 gradient accumulation and master weights, what BLOOM
    ran) for bf16 + ZeRO-1 only when data_types.grad_accum_dtype is fp32 (runtime/engine.py,
    _do_optimizer_sanity_check); otherwise the ZeRO-1 optimizer sums the pipeline's micro-batch
    gradients in bf16 (8 mantissa bits) without a word (seen on CPU ranks, tests/parallel)."""
    return pp > 1 and dtype == "bf16" and zero == 1 and grad_accum_dtype != "fp32"


def _warn_bf16_pipeline_accumulation(cfg, pp: int, zero: int, dtype: str, warnings: list[str]) -> None:
    if pipeline_accumulates_in_bf16(pp, zero, dtype, cfg.precision.grad_accum_dtype):
        warnings.append(f"bf16 with pipeline_degree={pp} and ZeRO-1 accumulates the micro-batch gradients in bf16 "
                        f"(precision.grad_accum_dtype={cfg.precision.grad_accum_dtype}); set precision.grad_accum_dtype=fp32 "
                        "for DeepSpeed's BF16_Optimizer (fp32 accumulation, as BLOOM trained)")


def _check_offload(cfg, zero: int) -> None:
    p = cfg.parallel
    if p.offload_optimizer and zero == 0:
        raise ConfigError("parallel.offload_optimizer", True, "optimizer offload is part of ZeRO and needs zero_stage >= 1",
                          "set parallel.zero_stage=1 (or 2, 3), or parallel.offload_optimizer=false")
    if p.offload_param and zero != 3:
        raise ConfigError("parallel.offload_param", True, f"parameter offload needs ZeRO stage 3 (zero_stage={zero})",
                          "set parallel.zero_stage=3, or parallel.offload_param=false")


CHECKPOINT_MODES = ("full", "selective")


def _check_checkpoint_mode(cfg, tp: int, pp: int, sp: int, cp: int) -> None:
    """model.checkpoint_mode=selective runs through torch's selective checkpoint (launcher/runtime/recompute.py) on
    the transformers model: DP / ZeRO 0-3. Our layer list (TP, stages) checkpoints with DeepSpeed's reentrant
    function, which takes no policy; Ulysses' and ring attention's exchanges and the document mask's saved set under
    it are not measured (tests/plan/test_activations.py), so they are refused, by `plan` too, rather than planned by
    guess."""
    mode = getattr(cfg.model, "checkpoint_mode", "full")
    if mode not in CHECKPOINT_MODES:
        raise ConfigError("model.checkpoint_mode", mode, f"must be one of {', '.join(CHECKPOINT_MODES)}",
                          "set model.checkpoint_mode=full (recompute whole blocks) or selective (keep the matmuls' outputs)")
    if mode == "full":
        return
    if not cfg.model.activation_checkpointing:
        raise ConfigError("model.checkpoint_mode", mode,
                          "says what a checkpointed block keeps, and model.activation_checkpointing is false",
                          "set model.activation_checkpointing=true, or model.checkpoint_mode=full")
    degrees = {"parallel.tensor_degree": (tp, "our TP layers checkpoint with DeepSpeed's reentrant "
                                          "checkpoint, which takes no selection policy"),
               "parallel.pipeline_degree": (pp, "the pipeline's layer list checkpoints with "
                                            "DeepSpeed's reentrant checkpoint, which takes no selection policy"),
               "parallel.sequence_degree": (sp, "what Ulysses' all-to-alls leave saved under it is "
                                            "not measured"),
               "parallel.context_degree": (cp, "what ring attention leaves saved under it is not "
                                           "measured")}
    refuse_parallel_degrees("model.checkpoint_mode", mode, degrees,
                            "selective checkpointing runs on the transformers model (DP / ZeRO 0-3) only",
                            "set model.checkpoint_mode=full")
    if getattr(cfg.data, "document_mask", False):
        raise ConfigError("model.checkpoint_mode", mode,
                          "selective checkpointing with data.document_mask=true is not measured (the mask's saved "
                          "set under the selection policy), so it is not run",
                          "set model.checkpoint_mode=full, or data.document_mask=false")


def _check_chunked_loss(cfg, tp: int, pp: int) -> None:
    """model.chunked_loss replaces the transformers model's head and loss (launcher/runtime/chunked_loss.py), which
    the plain engine, Ulysses and ring attention run; our layer list (TP, pipeline stages) computes its logits as
    layers of its own, so there it would not run: refused rather than ignored."""
    if not getattr(cfg.model, "chunked_loss", False):
        return
    degrees = {"parallel.tensor_degree": (tp, "our TP layers split the head and the loss over the vocabulary "
                                          "already (V / tensor_degree columns a rank)"),
               "parallel.pipeline_degree": (pp, "the pipeline's last stage computes its logits as a layer of "
                                            "its own")}
    refuse_parallel_degrees("model.chunked_loss", True, degrees,
                            "the chunked loss replaces the transformers model's head and runs on it (DP / ZeRO 0-3, "
                            "Ulysses, CP) only", "set model.chunked_loss=false")


def resolve_layout(cfg) -> Layout:
    """Check every layout rule and derive the numbers above. `cfg` is the composed config."""
    check_ranges(cfg)  # every numeric setting in its documented range first (launcher/config/ranges.py)
    _check_names(cfg)
    _check_run_settings(cfg)
    _check_data(cfg)
    _check_model_shape(cfg)
    # model.init_from / model.hf_config: model.* must be that config.json's model (reads that one small file).
    check_model_source(cfg)
    device = _check_cluster(cfg)
    warnings: list[str] = []

    p = cfg.parallel
    tp = _positive("parallel.tensor_degree", p.tensor_degree)
    pp = _positive("parallel.pipeline_degree", p.pipeline_degree)
    sp = _positive("parallel.sequence_degree", p.sequence_degree)
    cp = _positive("parallel.context_degree", p.context_degree)
    seq = _positive("data.seq_length", cfg.data.seq_length)
    if seq > cfg.model.max_position_embeddings:
        raise ConfigError("data.seq_length", seq,
                          f"is longer than model.max_position_embeddings = {cfg.model.max_position_embeddings}",
                          f"set data.seq_length <= {cfg.model.max_position_embeddings}, or raise model.max_position_embeddings")
    world = cfg.cluster.nodes * cfg.cluster.gpus_per_node

    padded_vocab = _check_tensor_parallel(cfg, tp, warnings)
    _check_sequence_parallel(cfg, sp, pp)
    megatron_sp = _check_megatron_sequence_parallel(cfg, tp)
    _check_context_parallel(cfg, cp, tp, sp, device)
    _check_checkpoint_mode(cfg, tp, pp, sp, cp)
    _check_chunked_loss(cfg, tp, pp)
    dp = _data_degree(cfg, world, tp, pp, sp, cp)
    accum = _check_batch(cfg, dp)
    _check_pipeline(cfg, pp, p.zero_stage, accum, warnings)
    _check_precision(cfg, device, cfg.precision.dtype)
    _check_grad_accum_dtype(cfg, p.zero_stage, cfg.precision.dtype)
    _warn_bf16_pipeline_accumulation(cfg, pp, p.zero_stage, cfg.precision.dtype, warnings)
    _warn_fp32_reduce(cfg, sp, cp, p.zero_stage, warnings)
    _check_offload(cfg, p.zero_stage)

    gbs = cfg.batch.global_batch_size
    return Layout(
        world_size=world,
        nodes=cfg.cluster.nodes,
        gpus_per_node=cfg.cluster.gpus_per_node,
        tensor_degree=tp,
        pipeline_degree=pp,
        sequence_degree=sp,
        data_degree=dp,
        zero_stage=p.zero_stage,
        micro_batch_size=cfg.batch.micro_batch_size,
        global_batch_size=gbs,
        grad_accum_steps=accum,
        seq_length=seq,
        tokens_per_step=gbs * seq,
        pipeline_micro_batches=accum,
        bubble_fraction=(pp - 1) / accum,
        vocab_size=cfg.model.vocab_size,
        padded_vocab_size=padded_vocab,
        device=device,
        dtype=cfg.precision.dtype,
        warnings=tuple(warnings),
        sequence_parallel=megatron_sp,
        context_degree=cp,
    )
