"""Which pipeline layers each stage holds, and its exact parameter count (no torch).

The runtime hands DeepSpeed's PipelineModule one layer per entry of `pipeline_layer_params`
(launcher/parallel/pipeline.py: embedding, [Bloom's embedding LayerNorm], the blocks, the final norm, the
head or the tied embedding's second copy) and DeepSpeed cuts that list into stages with the
`parallel.partition_method` named in the config. The cut is reproduced here with DeepSpeed 0.19.8's own
algorithms (deepspeed/runtime/utils.py partition_uniform / partition_balanced, pipe/module.py
_partition_layers), so `launcher plan` and `launcher train --dry-run` name the same layers per stage;
tests/unit/test_stages.py holds the two against each other for every recipe, and the runtime asserts
DeepSpeed's `parts` equal these bounds when it builds (pipeline.build_pipeline_module).

`parameters` balances the layers' *unsharded* parameter counts (our PipelineModule counts the full layer,
not this rank's TP slice): the partition then does not depend on the TP degree, as in Megatron-DeepSpeed,
where every layer including the vocab-parallel embedding is divided by TP. For BLOOM-176B on 12 stages it
gives the published partition: embedding + 5 blocks, 10 x 6 blocks, 5 blocks + the tied embedding
(BigScience 2022, arXiv:2211.05100, section 3.4.2).
"""

from __future__ import annotations

import re
from functools import lru_cache

from launcher.config.supported import LLAMA_FAMILY


@lru_cache(maxsize=256)
def pipeline_layer_params(shape, padded_vocab_size: int) -> tuple[tuple[str, int], ...]:
    """(layer class name, unsharded parameter count) of every pipeline layer, in pipeline.py's order."""
    h, pc = shape.hidden_size, shape.params
    vocab = padded_vocab_size * h
    layers = [("EmbeddingPipe", vocab)]
    if shape.arch == "bloom":
        layers.append(("NormPipe", pc.embedding - shape.vocab_size * h))   # word_embeddings_layernorm
    block = "BloomDecoderBlockPipe" if shape.arch == "bloom" else "DecoderBlockPipe"
    layers += [(block, pc.per_layer)] * shape.num_layers
    layers.append(("NormPipe", pc.final_norm))
    layers.append(("EmbeddingPipe" if shape.tied_embeddings else "HeadPipe", vocab))
    return tuple(layers)


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """deepspeed.runtime.utils.partition_uniform: equal counts, the first `num_items % num_parts` parts one more."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def partition_balanced(weights, num_parts: int) -> list[int]:
    """deepspeed.runtime.utils.partition_balanced (numpy float64 = Python float): the split into `num_parts`
    contiguous parts minimising (heaviest part - lightest part), ties to the later cut.

    DeepSpeed's dynamic programme, cell for cell, with two changes that leave every cut the same
    (tests/unit/test_stages.py holds it to DeepSpeed's function): the tables are held by parts (column) rather
    than by items, and a cell [i][j] only looks at k >= j - 1 items before the last part: a k < j - 1 has no
    finite [k][j - 1] (fewer items than parts), so its cost is inf and DeepSpeed's `>=` lets the first finite k
    overwrite whatever it left. Python's max/min become comparisons that return the same operand they do. Llama
    3 405B on 64 stages (130 layers) is half a second of `--search` in DeepSpeed's form on this machine."""
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    inf = float("inf")
    # by_part[j][i] is DeepSpeed's dp[i][j]
    cost_by_part = [[inf] * (n + 1) for _ in range(m + 1)]
    max_by_part = [[inf] * (n + 1) for _ in range(m + 1)]
    min_by_part = [[inf] * (n + 1) for _ in range(m + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    prefix = [0.0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + float(w)
    max_by_part[0][0] = 0
    cost_by_part[0][0] = 0
    for i in range(1, n + 1):
        total = prefix[i]
        for j in range(1, min(i, m) + 1):
            prev_max, prev_min = max_by_part[j - 1], min_by_part[j - 1]
            best_cost, best_max, best_min, best_k = inf, inf, inf, 0   # the cell's initial values
            for k in range(j - 1, i):
                part = total - prefix[k]
                a, b = prev_max[k], prev_min[k]
                max_sum = part if part > a else a   # max(a, part)
                min_sum = part if part < b else b   # min(b, part)
                cost = max_sum - min_sum
                if best_cost >= cost:
                    best_cost, best_max, best_min, best_k = cost, max_sum, min_sum, k
            cost_by_part[j][i], max_by_part[j][i], min_by_part[j][i], position[i][j] = best_cost, best_max, best_min, best_k
    parts = [n]
    for i in reversed(range(1, m + 1)):
        parts.append(position[parts[-1]][i])
    parts.reverse()
    return [int(p) for p in parts]


@lru_cache(maxsize=256)
def _bounds(layers: tuple, num_stages: int, method: str) -> tuple[int, ...]:
    method = method.lower()
    if method == "uniform":
        return tuple(partition_uniform(len(layers), num_stages))
    if method == "parameters":
        return tuple(partition_balanced([n for _, n in layers], num_stages))
    if method.startswith("type:"):
        # pipe/module.py _find_layer_type: the regex is searched in the class name, case-insensitively.
        rx = re.compile(method.split(":", 1)[1], re.IGNORECASE)
        return tuple(partition_balanced([1 if rx.search(name) else 0 for name, _ in layers], num_stages))
    raise ValueError(f"partition method {method!r}: DeepSpeed knows uniform, parameters and type:<regex>")


def stage_bounds(shape, padded_vocab_size: int, pipeline_degree: int, method: str) -> tuple[int, ...]:
    """DeepSpeed's `parts`: stage s holds pipeline layers [bounds[s], bounds[s+1])."""
    return _bounds(pipeline_layer_params(shape, padded_vocab_size), pipeline_degree, method)


@lru_cache(maxsize=1024)
def stage_param_counts(shape, padded_vocab_size: int, pipeline_degree: int, method: str) -> tuple[int, ...]:
    """Exact parameters of every stage before TP sharding (summed over the stage's TP ranks, replicated
    tensors once). With PP > 1 and tied embeddings both end stages count the embedding (DeepSpeed keeps a copy
    on each); with PP = 1 the tied head is the embedding tensor itself and counts once."""
    layers = pipeline_layer_params(shape, padded_vocab_size)
    if pipeline_degree == 1:
        return (sum(n for _, n in layers[:-1]) + (0 if shape.tied_embeddings else layers[-1][1]),)
    b = stage_bounds(shape, padded_vocab_size, pipeline_degree, method)
    return tuple(sum(n for _, n in layers[b[s]:b[s + 1]]) for s in range(pipeline_degree))


# Parameters of one decoder block that tensor parallelism leaves whole on every TP rank, per hidden unit
# (launcher/parallel/tensor.py shards the block's matrices and column-parallel biases): LLaMA its two RMSNorm
# weights (2h); BLOOM/GPT two LayerNorms with bias (4h) + the row-parallel output biases of attention and MLP (2h).
BLOCK_TP_REPLICATED_PER_HIDDEN = {**{arch: 2 for arch in LLAMA_FAMILY}, "bloom": 6, "gpt": 6}


def stage_vocab_matrices(shape, pipeline_degree: int, stage: int) -> int:
    """How many padded-vocabulary x hidden matrices stage `stage` holds: the embedding on the first stage, the
    untied head (or, with PP > 1, the tied embedding's copy) on the last; one on a 1-stage run with tied embeddings,
    where the head is the embedding tensor itself."""
    first, last = stage == 0, stage == pipeline_degree - 1
    return int(first) + int(last and (not shape.tied_embeddings or pipeline_degree > 1))


@lru_cache(maxsize=16384)
def rank_param_count(shape, padded_vocab_size: int, pipeline_degree: int, method: str, tensor_degree: int,
                     stage: int) -> float:
    """Parameters one TP rank of stage `stage` holds, as the runtime shards them: its blocks' matrices and
    column-parallel biases / TP, the vocabulary matrices (embedding, head or the tied embedding's copy) / TP,
    everything else (norms, row-parallel biases, BLOOM's embedding LayerNorm, GPT-2's learned positions) whole on
    every TP rank. Our TP (launcher/parallel/tensor.py, with stages and at pipeline_degree = 1) splits the ends
    over the vocabulary as Megatron-LM does (Shoeybi et al. 2019, section 3; core/tensor_parallel/layers.py
    VocabParallelEmbedding and ColumnParallelLinear(parallel_output=True)): rank r of t holds rows
    [r V/t, (r+1) V/t) of the padded vocabulary V (launcher/config/layout.py pads V to a multiple of t). So
    BLOOM-176B's end stages hold 3.98B per TP4 rank, the published figure (the replicated ends held 6.68B).
    `launcher train --dry-run` counts the same from the modules it builds (tests/unit/test_stages.py)."""
    rep = BLOCK_TP_REPLICATED_PER_HIDDEN[shape.arch] * shape.hidden_size
    blocks = stage_blocks(shape, padded_vocab_size, pipeline_degree, method)[stage]
    sharded = blocks * (shape.params.per_layer - rep) \
        + stage_vocab_matrices(shape, pipeline_degree, stage) * padded_vocab_size * shape.hidden_size
    return stage_param_counts(shape, padded_vocab_size, pipeline_degree, method)[stage] - sharded + sharded / tensor_degree


@lru_cache(maxsize=1024)
def rank_param_counts(shape, padded_vocab_size: int, pipeline_degree: int, method: str,
                      tensor_degree: int) -> tuple[float, ...]:
    """rank_param_count of every stage (--search reads each stage of thousands of candidates)."""
    return tuple(rank_param_count(shape, padded_vocab_size, pipeline_degree, method, tensor_degree, stage)
                 for stage in range(pipeline_degree))


@lru_cache(maxsize=1024)
def stage_blocks(shape, padded_vocab_size: int, pipeline_degree: int, method: str) -> tuple[int, ...]:
    """Decoder blocks per stage."""
    layers = pipeline_layer_params(shape, padded_vocab_size)
    if pipeline_degree == 1:
        return (shape.num_layers,)
    b = stage_bounds(shape, padded_vocab_size, pipeline_degree, method)
    return tuple(sum(1 for name, _ in layers[b[s]:b[s + 1]] if "Decoder" in name) for s in range(pipeline_degree))
