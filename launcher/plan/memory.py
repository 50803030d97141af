"""Memory per GPU, per pipeline stage: model states, activations, logits and a stated overhead (no torch).

Model states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", section 5 and figure 1), bytes per parameter held by one rank, Psi parameters, N_d = DP ranks:

    mixed precision (bf16/fp16) Adam:  2 (weights) + 2 (grads) + K=12 (fp32 master, momentum, variance)
        ZeRO 0: 2 + 2 + 12         ZeRO 1: 2 + 2 + 12/N_d
        ZeRO 2: 2 + (2 + 12)/N_d   ZeRO 3: (2 + 2 + 12)/N_d
    fp32 Adam: 4 + 4 + 8 at ZeRO 0 (torch AdamW on the model's own fp32 weights: no master copy);
        at ZeRO 1/2 DeepSpeed still clones an fp32 master partition, so K = 12 again; at ZeRO 3 the launcher
        has it use the fp32 partition itself (launcher/runtime/zero3.py), so 4 + 4 + 8 all over N_d.
    bf16 with fp32 gradient accumulation (DeepSpeed's BF16_Optimizer, deepspeed/runtime/bf16_optimizer.py,
        what BLOOM ran): 4 bytes of fp32 gradient buffer per parameter, NOT sharded (fp32_groups_gradients_flat
        is the full flat group), in place of the 2 of bf16 gradients (immediate_grad_update, set by the launcher,
        frees each as it is added), master weights and Adam states sharded over DP as in ZeRO 1.
    offload_optimizer: master weights and Adam states (and the fp32 gradient partition) live in CPU memory.
    offload_param (ZeRO 3): the weights' partition lives in CPU memory; GPUs hold only gathered layers.

Weights per rank come from the exact counts in params.py, as the runtime holds them (stages.rank_param_count):
a stage's block matrices / TP, the block norms whole, the embedding (padded vocabulary) on the first stage and the
head on the last / TP (our TP layers split them over the vocabulary as Megatron-LM's VocabParallelEmbedding and
ColumnParallelLinear(parallel_output=True) do, Shoeybi et al. 2019, section 3), the final norm whole, and with
tied embeddings and PP > 1 a second copy of the embedding (its same V/TP rows) on the last stage
(Megatron/DeepSpeed keep both and all-reduce their gradients). The layers per stage are DeepSpeed's cut with parallel.partition_method
(launcher/plan/stages.py, the cut the runtime builds; BLOOM-176B: embedding + 5 blocks, 6, ..., 6, 5 blocks +
embedding).

Activations (launcher/plan/activations.py: every term derived from the tensors the runtime's modules save for
backward, held to a saved_tensors_hooks measurement by tests/plan/test_activations.py; Korthikanti et al.
2022's Megatron-GPT count, 34 s b h + 5 a s^2 b per block, is what they depart from, and why, is written
there). Per stage and rank: the stage's saved bytes for one micro-batch (its blocks, plus the embedding on the
first stage and the final norm, head and the loss's fp32 log-softmax, or under TP its softmax over this rank's V/TP
columns, on the last) x the micro-batches in flight; with
activation checkpointing the checkpointed blocks (all, or the first model.checkpoint_blocks of each stage) keep
only their inputs (selective: and their matmuls' and attention's outputs) and, where every block of the stage is
checkpointed, one block's full set is live while it is recomputed (the working set); the last stage adds the
loss end's transient (activations.loss_end_transient_bytes, measured on torch's memory timeline: without TP the
two fp32 gradients of the log-probabilities at the start of backward, 8V a token; under TP the loss's forward,
the logits, their fp32 copy and exp's temporary), and its peak is the larger of that moment and the recompute of
its last block, by when the head's saved tensors and the logits' gradient are freed (the two do not add: the 1B
LLaMA on one H200 with checkpointing, 21.14 GB measured, was planned 22.32 GB when they did, 21.55 GB after;
bench/gpu/results.md).

Under 1F1B (Narayanan et al. 2021, section 2.2.1) stage i holds the activations of min(PP - i, m)
micro-batches: the first stage holds PP of them (Korthikanti et al. 2022, section 4.2.3). DeepSpeed's
PipelineEngine adds, per micro-batch in flight, the stage's output and (where the first block does not save it) its
input, and, once a stage, the buffer it receives into (activations.py, "pipeline buffers", "receive buffer").

Framework overhead (stated allowance, not measured): 2 GB for the CUDA context, cuBLAS/NCCL workspaces and
allocator fragmentation, plus DeepSpeed's communication buffers: every ZeRO stage's reduce bucket (our DeepSpeed
config's reduce_bucket_size = 5e8 elements, launcher/deepspeed_config.py; ZeRO 3 holds its for the engine's life),
twice for ZeRO 1/2 under overlap_comm (on for GPUs: its double buffer), and the tensors ZeRO 3 holds whole at the
top of the backward over more than one rank: its persistent ones, those its forward kept for their backward and those
it prefetched (zero3_gathered replays its parameter coordinator; up to its 1e9-element live limit, where the plan
had charged two blocks); under Ulysses / CP ZeRO 3's bucket is raised to the largest parameter
(reduce_bucket_for). Not counted: the copies a reduction makes (its flattened bucket, fp32 under Ulysses / CP),
which bench/steptime/live_at_peak.py saw only after the peak.

On CPU ranks (a `launcher calibrate` profile with process_bytes) the peak is the process's resident set, so the
overhead is what calibrate measured a rank to hold besides its model's tensors (interpreter, torch, DeepSpeed,
transformers' modeling code, and since 2026-12-03 what a near-zero model's engine and first steps add: its
bookkeeping and the kernels' code pages, +30 MiB; ~0.41 GB here) in place of the CUDA allowance, and the ZeRO 1/2
bucket counts only the pages the stage's gradients are copied into: DeepSpeed allocates it with torch.empty
(stage_1_and_2.py ipg buffer), and an untouched page is not resident. The plan's terms hold the live tensors:
torch's memory timeline of a recipe=tiny step peaks at 49.0 / 82.8 / 150.4 MiB at micro-batch 4 / 8 / 16
(parameters, optimizer state, saved activations and autograd's buffers at the top of the backward) where the terms
without overhead are 50.1 / 79.9 / 139.5 (bench/steptime/memory_timeline.py). What they do not count on CPU is the
freed blocks glibc keeps: the ranks' peak RSS grew 1.6x the planned activations from micro-batch 4 to 16 (492 / 535
/ 638 MiB), and recipe=tiny's layouts read 1.12-1.22x their plan in peak RSS, 57-66 MiB over it in the data-parallel
layouts and 70-100 in those with TP, PP or SP (2026-12-03, bench/steptime/xeon-amx-2026-12-03; 1.18-1.35x on three
machines before process_bytes counted the first steps). Measured at each rank's peak (bench/steptime/malloc_at_peak.py,
2026-12-04): glibc's heaps held 50-127 MiB free there, 1-32 of it at a heap's top, against +23 .. +93 MiB over the
plan, the ranks with the most free the furthest over: holes the step's allocation order leaves, which no term here
gives a size to.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

from launcher.config.layout import reduce_dtype
from launcher.plan import activations as act
from launcher.plan.inputs import Hardware, ModelShape, Strategy
from launcher.plan.params import param_group_numels
from launcher.config.supported import LLAMA_FAMILY, PIPELINE_ARCHS
from launcher.plan.stages import rank_param_counts, stage_blocks

FRAMEWORK_OVERHEAD_BYTES = 2e9
# zero_optimization.reduce_bucket_size in elements: launcher/deepspeed_config.py's REDUCE_BUCKET_SIZE is this value,
# raised for ZeRO 3 with the sequence split (reduce_bucket_for).
REDUCE_BUCKET_ELEMENTS = 500_000_000


def weight_bytes(dtype: str) -> int:
    """Bytes of one weight (and one gradient) in the training dtype."""
    return 4 if dtype == "fp32" else 2


# Whether BF16_Optimizer runs with bf16.immediate_grad_update (deepspeed_config._precision writes it): each bf16
# gradient is added into the accumulation gradient by a hook as autograd writes it, and freed. The same adds as
# DeepSpeed's default (tests/plan/test_bf16_accumulation.py); what the plan charges for it (steptime.bf16_accumulation,
# the gradients _model_states and predict_model_state_bytes hold) follows this one value.
BF16_IMMEDIATE_GRAD_UPDATE = True


def uses_bf16_optimizer(dtype: str, zero_stage: int, grad_accum_fp32: bool, pipeline_degree: int) -> bool:
    """Whether DeepSpeed 0.19.8 wraps the optimizer in BF16_Optimizer (engine._do_optimizer_sanity_check):
    bf16 + fp32 gradient accumulation + ZeRO 1, or bf16 + ZeRO 0 + bf16 accumulation under the pipeline engine."""
    if dtype != "bf16":
        return False
    return (grad_accum_fp32 and zero_stage == 1) or (zero_stage == 0 and not grad_accum_fp32 and pipeline_degree > 1)


def model_state_bytes(n_params: float, data_degree: int, zero_stage: int, dtype: str = "bf16",
                      grad_accum_fp32: bool = False, pipeline_degree: int = 1,
                      offload_optimizer: bool = False, offload_param: bool = False,
                      grad_accum_steps: int = 0, overlap: bool = False) -> dict:
    """GPU bytes of params, grads and optimizer states for `n_params` parameters on one rank (ZeRO section 5).
    grad_accum_steps (micro-batches per optimizer step; 0: not known, charged as several) and overlap (DeepSpeed's
    overlap_comm): zero1_holds_partition."""
    return _model_states(n_params, data_degree, zero_stage, dtype, grad_accum_fp32, pipeline_degree,
                         offload_optimizer, offload_param, grad_accum_steps, overlap)[0]


def model_state_how(n_params: float, data_degree: int, zero_stage: int, dtype: str = "bf16",
                    grad_accum_fp32: bool = False, pipeline_degree: int = 1,
                    offload_optimizer: bool = False, offload_param: bool = False,
                    grad_accum_steps: int = 0, overlap: bool = False) -> dict:
    """The arithmetic behind each of model_state_bytes's terms, in words, for the plan's table."""
    return _model_states(n_params, data_degree, zero_stage, dtype, grad_accum_fp32, pipeline_degree,
                         offload_optimizer, offload_param, grad_accum_steps, overlap, explain=True)[1]


def overlap_comm_on(device: str) -> bool:
    """DeepSpeed's overlap_comm as the launcher sets it (launcher/deepspeed_config.py asks here): on for GPUs, off for
    CPU ranks. The plan's buckets and ZeRO 1's gradients follow it (_overhead, zero1_holds_partition)."""
    return device == "cuda"


def overlap_comm(hw: Hardware) -> bool:
    """overlap_comm_on for the planned hardware."""
    return overlap_comm_on(hw.device)


def reduce_bucket_for(bucket: int, largest_param: int, zero_stage: int, sequence_split: int) -> int:
    """reduce_bucket_size for a layout: `bucket`, raised to the largest parameter under ZeRO 3 with the sequence split
    (Ulysses x CP ranks > 1), where a parameter larger than the bucket would take DeepSpeed's reduce-scatter path and
    come out 1/sp of its gradient (launcher/deepspeed_config.py zero3_sequence_parallel_reduction says why). The
    DeepSpeed config and the plan's memory both ask here."""
    return max(bucket, largest_param) if zero_stage == 3 and sequence_split > 1 else bucket


def largest_param(shape: ModelShape, st: Strategy) -> int:
    """The largest parameter tensor of the whole model at the layout's padded vocabulary (what
    max(launcher.plan.params.param_numels(model, padded_vocab)) gives; tests/plan/test_reduce_bucket.py)."""
    return max(shape.largest_param_but_vocab, st.padded_vocab_size * shape.hidden_size)


def block_matrices(shape: ModelShape) -> list:
    """Weight elements of a block's linears in forward order: LLaMA's q, k, v, o, gate, up, down; GPT's and
    BLOOM's qkv, dense, fc, proj (norms and biases are far below ZeRO-3's persistence threshold)."""
    h, a, kv, d, f = shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.intermediate_size
    if shape.arch in LLAMA_FAMILY:
        return [h * a * d, h * kv * d, h * kv * d, a * d * h, h * f, h * f, f * h]
    return [h * (a + 2 * kv) * d, a * d * h, h * f, f * h]


@dataclass(frozen=True)
class Zero3Gathered:
    """Parameter elements a ZeRO-3 rank holds whole, beyond its partitions, at the top of its backward."""
    persistent: float   # tensors of <= parallel.zero3_param_persistence_threshold elements: whole on every rank
    kept: float         # modules gathered in the forward and not released (their reuse comes soon, or prefetch saw it)
    prefetched: float   # modules gathered ahead for the backward
    # the all-gathers of one forward and one backward: (collectives, elements); a fetch gathers its module in one,
    # a prefetch walk what it passes in another (partition_parameters.py all_gather_coalesced)
    forward_gathers: tuple = (0, 0.0)
    backward_gathers: tuple = (0, 0.0)

    @property
    def total(self) -> float:
        return self.persistent + self.kept + self.prefetched


def zero3_gathered(shape: ModelShape, st: Strategy) -> Zero3Gathered:
    """What DeepSpeed 0.19.8's ZeRO 3 holds gathered at the top of the backward (the step's peak), per rank: its
    parameter coordinator replayed over the model's module trace (_zero3_replay), and the all-gathers it issues
    (the checkpointed blocks' recompute included). Elements are this rank's (/ TP for the split matrices and the
    vocabulary); ZeRO 3 runs without a pipeline, so the stage is the whole model."""
    return _zero3_replay(shape, st.tensor_degree, st.padded_vocab_size, st.zero3_max_reuse_distance,
                         st.zero3_prefetch_bucket_size, st.zero3_param_persistence_threshold,
                         st.zero3_max_live_parameters, checkpointed_layers(shape, st))


@functools.lru_cache(maxsize=256)
def _zero3_replay(shape: ModelShape, t: int, padded_vocab: int, reuse_distance: float, prefetch_bucket: float,
                  persistence: float, max_live: float, recomputed: int = 0) -> Zero3Gathered:
    """DeepSpeed 0.19.8's zero/partitioned_param_coordinator.py over one step's module trace, as it runs once the
    first step has recorded the trace:

    - fetch_sub_module: a module's parameters are gathered before it runs, then the coordinator walks its queue of
      upcoming parameter uses from where the last walk stopped and gathers those not yet gathered, module by module
      until prefetch_bucket elements (the last one whole), only while fewer than max_live are gathered;
    - release_sub_module: after a module runs its parameters are released unless they are persistent, a prefetch
      walk has already passed a later use of them (__most_recent_step_id_param_fetched_for), or their next use comes
      within reuse_distance parameters of the trace (__params_to_release sums ds_numel module by module).

    The trace, as DeepSpeed records it (bench/steptime/live_at_peak.py LIVE_AT_PEAK_TRACE=1 dumps its own): the
    model's modules in forward order, those without parameters of their own too (their fetches walk ahead): the
    CausalLM wrapper, the base model, the embedding (and learned positions), the rotary embedding, then per block
    the block, its first norm, the attention and its linears, its second norm, the MLP and its linears with the
    activation between them; the final norm, the head. The backward in autograd's order (a container's
    pre-backward hook fires before its children's): the wrapper, the head, the base model, the final norm, per
    block from the last the block, the MLP, its modules in reverse, the second norm, the attention, its linears in
    reverse, the first norm; the embedding. A checkpointed block (the first checkpointed_layers, transformers'
    non-reentrant checkpoint, full or selective alike) runs its forward again inside that backward, after the
    last linear's backward fetch: see the loop below. Norms are persistent where their h-element tensors are within
    the threshold; the linears' biases are counted with the norms. A tied head is the embedding's tensor.
    Returned: what is gathered right after the head's backward fetch, with the loss end's tensors live: the step's
    peak (module docstring); and the all-gathers of the whole trace, recompute included.

    The plan had charged two blocks (the one computing and the one prefetched). At the defaults (5e7-element
    prefetch bucket, 1e9 reuse distance and live limit) the forward's prefetch walks run ahead of the compute by up
    to 5e7 elements a module fetched, so for a model of modules below 5e7 elements the gathered set grows to the
    live limit; modules above it are prefetched one ahead. Held to the allocations of 2 CPU ranks, and to DeepSpeed's
    all-gathers call for call (forward and backward, with and without recompute), by tests/plan/test_live_at_peak.py
    (bench/steptime/live_at_peak.py --zero3); hand-counted cases in tests/plan/test_zero3_gathered.py."""
    h = shape.hidden_size
    vocab = padded_vocab * h / t
    positions = shape.params.embedding - shape.vocab_size * h     # learned positions, BLOOM's embedding norm
    vectors = shape.params.per_layer - sum(block_matrices(shape))   # a block's norms and biases
    sizes, persistent, forward = [], [], []

    def run(size: float, whole: bool) -> int:
        sizes.append(size)
        persistent.append(whole)
        forward.append(len(sizes) - 1)
        return len(sizes) - 1

    container = (0.0, True)     # a module without parameters of its own: its fetch gathers nothing, its walk runs
    run(*container)             # the CausalLM wrapper
    run(*container)             # the base model
    embedding = run(vocab, vocab <= persistence)
    if positions:
        run(positions, positions <= persistence)
    run(*container)             # rotary embedding / dropout
    matrices = [x / t for x in block_matrices(shape)]
    attention, (up_in, down) = matrices[:-3] if shape.arch in LLAMA_FAMILY else matrices[:-2], matrices[-2:]
    # a norm's tensors are h elements each (persistent at DeepSpeed's default threshold for every model up to
    # h = 1e5); the linears' biases are counted with the norms and taken to follow them
    norm_whole = h <= persistence
    blocks = []     # each block's modules: (the block, first norm, attention, its linears, second norm, MLP, its modules)
    for _ in range(shape.num_layers):
        block = run(*container)
        norm1 = run(vectors / 2, norm_whole)
        attn = run(*container)
        linears = [run(x, x <= persistence) for x in attention]
        norm2 = run(vectors / 2, norm_whole)
        mlp = run(*container)
        if shape.arch in LLAMA_FAMILY:          # down(act(gate(x)) * up(x))
            gate = matrices[-3]
            ffn = [run(gate, gate <= persistence), run(*container), run(up_in, up_in <= persistence)]
        else:                                   # proj(act(fc(x)))
            ffn = [run(up_in, up_in <= persistence), run(*container)]
        ffn.append(run(down, down <= persistence))
        blocks.append((block, norm1, attn, linears, norm2, mlp, ffn))
    run(shape.params.final_norm, norm_whole)
    if shape.tied_embeddings:
        forward.append(embedding)
    else:
        run(vocab, vocab <= persistence)
    # The backward as autograd runs it: a module's pre-backward hook fires as the gradient reaches its output, so
    # a container comes before its children (the CausalLM wrapper, the head, the base model, the final norm; per
    # block the block, the MLP, then the MLP's modules in reverse, the second norm, the attention, its linears in
    # reverse, the first norm); at the far end the embedding's own tensors in reverse.
    backward, held = [forward[0], forward[-1], forward[1], forward[-2]], set()
    for b in range(shape.num_layers - 1, -1, -1):
        block, norm1, attn, linears, norm2, mlp, ffn = blocks[b]
        rest = ffn[::-1][1:] + [norm2, attn] + linears[::-1] + [norm1]
        backward += [block, mlp, ffn[-1]]
        if b < recomputed:
            # transformers' non-reentrant checkpoint recomputes the block's forward (its modules, not the block
            # itself) when the last linear's backward unpacks its first saved tensor, after that linear's
            # pre-backward fetch; torch stops the recompute (early stop) as that linear's forward saves its tensors,
            # before its post-forward release. So the fetch before the recompute releases nothing, and the release
            # after the linear's backward comes at the step the recompute's fetch of it ends (DeepSpeed's step_id).
            held.add(len(forward) + len(backward) - 1)
            backward += [norm1, attn] + linears + [norm2, mlp] + ffn
        backward += rest
    backward += [m for m in forward[2:blocks[0][0]] if sizes[m]][::-1]
    trace = forward + backward
    prefix = [0.0]
    for m in trace:
        prefix.append(prefix[-1] + sizes[m])
    next_use, seen = [None] * len(trace), {}
    for i in range(len(trace) - 1, -1, -1):
        next_use[i] = seen.get(trace[i])
        seen[trace[i]] = i
    gathered = {m: -1 for m in range(len(sizes)) if persistent[m]}   # module -> trace position it was gathered at
    walked_to = [-1] * len(sizes)   # the latest use of each module a prefetch walk has passed
    live = sum(sizes[m] for m in gathered)
    queue, peak = 0, None
    calls = [[0, 0.0], [0, 0.0]]    # forward, backward: collectives, elements
    for i, m in enumerate(trace):
        phase = calls[i >= len(forward)]
        if m not in gathered:
            gathered[m] = i
            live += sizes[m]
            phase[0], phase[1] = phase[0] + 1, phase[1] + sizes[m]
        queue = max(queue, i + 1)
        limit, walked = min(max_live - live, prefetch_bucket), 0.0
        while queue < len(trace) and walked < limit:
            u = trace[queue]
            walked_to[u] = max(walked_to[u], queue)
            if u not in gathered:
                gathered[u] = i
                live += sizes[u]
                walked += sizes[u]
            queue += 1
        if walked:
            phase[0], phase[1] = phase[0] + 1, phase[1] + walked
        if i == len(forward) + 1:   # the head's backward fetch and its prefetch walk: the peak
            peak = (sum(x for x, p in zip(sizes, persistent) if p),
                    sum(sizes[u] for u, at in gathered.items() if not persistent[u] and at < len(forward)),
                    sum(sizes[u] for u, at in gathered.items() if at >= len(forward)))
        if persistent[m] or walked_to[m] > i or i in held:
            continue
        j = next_use[i]
        if j is not None and prefix[j] - prefix[i + 1] < reuse_distance:
            continue
        del gathered[m]
        live -= sizes[m]
    return Zero3Gathered(*peak, forward_gathers=tuple(calls[0]), backward_gathers=tuple(calls[1]))


def zero1_holds_partition(zero_stage: int, grad_accum_steps: int, pipeline_degree: int, bf16_opt: bool,
                          overlap: bool) -> bool:
    """Whether ZeRO 1 holds only its rank's gradient partition through the step, as ZeRO 2 does.

    DeepSpeed 0.19.8's ZeRO 1 reduces gradients inside the backward only with overlap_comm (stage_1_and_2.py
    process_gradients: `partition_gradients or overlap_comm`), and then only at the accumulation boundary
    (reduce_ready_partitions_and_remove_grads): between the micro-batches of an accumulation the full gradients
    stay in p.grad. With overlap_comm (on for GPUs) and one micro-batch a step every backward is a boundary: each
    gradient is copied into the reduce bucket as it is produced, each full bucket is reduced and the rank keeps its
    partition (copy_grads_in_partition, n / DP), so a full set of gradients never exists outside the buckets
    (which _overhead charges). Without overlap_comm (CPU ranks) the full gradients wait in p.grad for the
    backward's epilogue. The pipeline engine reduces after all its micro-batches (reduce_gradients), and the
    BF16_Optimizer keeps its own full buffer. Measured on 2 CPU ranks, recipe=tiny bf16 with a 200,000-element
    bucket (bench/steptime/live_at_peak.py, results.md): at the end of the backward, before the epilogue's
    reductions, 2.53 MiB of full gradients live without overlap_comm; with it, reductions bucket by bucket during
    the backward and the 1.27 MiB partition after it."""
    return zero_stage == 1 and overlap and grad_accum_steps == 1 and pipeline_degree == 1 and not bf16_opt


def _model_states(n_params, data_degree, zero_stage, dtype, grad_accum_fp32, pipeline_degree, offload_optimizer,
                  offload_param, grad_accum_steps: int = 0, overlap: bool = False,
                  explain: bool = False) -> tuple[dict, dict]:
    """({term: bytes}, {term: how}): the bytes and, with explain (the plan's table; --search asks for bytes only,
    thousands of times), the same factors in words (module docstring)."""
    w = weight_bytes(dtype)
    d = data_degree
    bf16_opt = uses_bf16_optimizer(dtype, zero_stage, grad_accum_fp32, pipeline_degree)
    params = n_params * w / (d if zero_stage == 3 else 1)
    partition = zero_stage >= 2 or zero1_holds_partition(zero_stage, grad_accum_steps, pipeline_degree, bf16_opt,
                                                          overlap)
    # BF16_Optimizer: a full (unsharded) flat gradient buffer in the accumulation dtype, and with its
    # immediate_grad_update (BF16_IMMEDIATE_GRAD_UPDATE) no gradients in the model dtype: each is added into that
    # buffer and freed as autograd writes it.
    acc = (4 if grad_accum_fp32 else 2) if bf16_opt else 0
    held = not (bf16_opt and BF16_IMMEDIATE_GRAD_UPDATE)
    grads = (n_params * w / (d if partition else 1) if held else 0) + n_params * acc
    # fp32 weights are the master weights at ZeRO 0 (torch's optimizer on the model) and ZeRO 3
    # (launcher/runtime/zero3.py); ZeRO 1/2 keep an fp32 clone.
    master = 0 if (dtype == "fp32" and zero_stage in (0, 3)) else 4
    sharded = zero_stage >= 1 or bf16_opt
    optimizer = n_params * (master + 8) / (d if sharded else 1)
    if offload_optimizer:
        optimizer = 0.0
    if offload_param:
        params = 0.0
    how = {}
    if explain:
        n = f"{n_params:,.0f} params"
        how["params"] = (f"{n} x {w} B ({dtype})" + (f" / DP {d} (ZeRO 3)" if zero_stage == 3 else "")
                         if not offload_param else "in CPU memory (parallel.offload_param)")
        how["grads"] = (f"{n} x {acc} B: BF16_Optimizer's unsharded {'fp32' if acc == 4 else 'bf16'} accumulation "
                        "buffer (each bf16 gradient added into it and freed as the backward writes it: "
                        "immediate_grad_update)" if not held else
                        f"{n} x {w} B" + (f" / DP {d} (ZeRO {zero_stage}" + (
                            ", overlap_comm, one micro-batch a step: each bucket reduced as the backward fills it"
                            if zero_stage == 1 else "") + ")" if partition else "") + (
                            f" + BF16_Optimizer's unsharded {'fp32' if acc == 4 else 'bf16'} accumulation buffer "
                            f"{n} x {acc} B" if acc else ""))
        how["optimizer"] = ("in CPU memory (parallel.offload_optimizer)" if offload_optimizer else
                            (f"{n} x (4 B fp32 master + 8 B Adam m, v) = 12 B/param (ZeRO paper section 5, K = 12)"
                             if master else f"{n} x 8 B Adam m, v (fp32: the weights are the master, K = 8)")
                            + (f" / DP {d} ({'BF16_Optimizer' if bf16_opt and zero_stage == 0 else f'ZeRO {zero_stage}'})"
                               if sharded else ""))
    return {"params": params, "grads": grads, "optimizer": optimizer}, how


def activation_shape(shape: ModelShape, st: Strategy) -> act.ActivationShape:
    return act.ActivationShape(arch=shape.arch, hidden_size=shape.hidden_size, num_heads=shape.num_heads,
                               num_kv_heads=shape.num_kv_heads, intermediate_size=shape.intermediate_size,
                               vocab_size=st.padded_vocab_size)


def activation_bytes_per_layer(shape: ModelShape, st: Strategy) -> float:
    """Bytes one block keeps for backward per micro-batch on one rank (launcher/plan/activations.py): its whole
    saved set, or with activation checkpointing only its input. Pipeline blocks add their own rotary cos/sin."""
    m = activation_shape(shape, st)
    tokens = st.seq_length * st.micro_batch_size / st.sequence_split
    if st.checkpointing:
        return tokens * act.checkpointed_block_bytes_per_token(m, st.dtype, st.tensor_degree if st.sequence_parallel else 1,
                                                               st.seq_length, st.recompute)
    per_block = tokens * act.block_bytes_per_token(m, st.seq_length, st.dtype, st.tensor_degree, st.sequence_degree,
                                                   st.sequence_parallel, st.document_mask)
    if st.pipeline_layers:
        per_block += act.rotary_bytes(m, st.seq_length, st.dtype, st.sequence_split)
    return per_block


def layers_in_stage(num_layers: int, pipeline_degree: int, stage: int) -> int:
    """Blocks on pipeline stage `stage` when blocks are spread evenly."""
    return num_layers // pipeline_degree + (1 if stage < num_layers % pipeline_degree else 0)


def stage_params(shape: ModelShape, st: Strategy, stage: int) -> float:
    """Parameters one rank of pipeline stage `stage` holds (TP-sharded, before ZeRO): the stage's exact count
    as DeepSpeed cuts the layers and the runtime shards them (launcher/plan/stages.py rank_param_count)."""
    if st.pipeline_degree == 1 or shape.arch in PIPELINE_ARCHS:
        return rank_param_counts(shape, st.padded_vocab_size, st.pipeline_degree, st.partition_method,
                                 st.tensor_degree)[stage]
    # No pipeline implementation for the architecture (gpt): blocks spread evenly, as a plan only.
    p, t = st.pipeline_degree, st.tensor_degree
    h, pc = shape.hidden_size, shape.params
    n = layers_in_stage(shape.num_layers, p, stage) * pc.per_layer / t
    vocab_rows = st.padded_vocab_size * h / t
    if stage == 0:
        n += vocab_rows + (pc.embedding - shape.vocab_size * h)  # + learned positions / embedding norm
    if stage == p - 1:
        n += pc.final_norm
        if not shape.tied_embeddings or p > 1:
            n += vocab_rows  # the untied head, or the tied embedding's copy on the last stage
    return n


def params_per_stage(shape: ModelShape, st: Strategy) -> tuple[float, ...]:
    """stage_params of every stage."""
    if st.pipeline_degree == 1 or shape.arch in PIPELINE_ARCHS:
        return rank_param_counts(shape, st.padded_vocab_size, st.pipeline_degree, st.partition_method,
                                 st.tensor_degree)
    return tuple(stage_params(shape, st, stage) for stage in range(st.pipeline_degree))


def blocks_in_stage(shape: ModelShape, st: Strategy, stage: int) -> int:
    """Decoder blocks on pipeline stage `stage`, as DeepSpeed cuts the layers (evenly where there is no pipeline)."""
    return blocks_per_stage(shape, st)[stage]


def blocks_per_stage(shape: ModelShape, st: Strategy) -> tuple[int, ...]:
    """blocks_in_stage of every stage, cut once."""
    if st.pipeline_degree == 1 or shape.arch in PIPELINE_ARCHS:
        return stage_blocks(shape, st.padded_vocab_size, st.pipeline_degree, st.partition_method)
    return tuple(layers_in_stage(shape.num_layers, st.pipeline_degree, stage) for stage in range(st.pipeline_degree))


def checkpointed_in_stage(shape: ModelShape, st: Strategy, stage: int) -> int:
    """Decoder blocks of stage `stage` that activation checkpointing recomputes (checkpointed_of its blocks)."""
    return checkpointed_of(st, blocks_in_stage(shape, st, stage)) if st.checkpointing else 0


def checkpointed_of(st: Strategy, blocks: int) -> int:
    """Of a stage's `blocks`, those activation checkpointing recomputes: none without it, else the stage's first
    model.checkpoint_blocks (all of them where that is null or larger), as the runtime picks them
    (launcher/train.py checkpoint_first_blocks, launcher/parallel/pipeline.py StagePipelineModule)."""
    if not st.checkpointing:
        return 0
    return blocks if st.checkpoint_blocks is None else min(blocks, st.checkpoint_blocks)


def checkpointed_layers(shape: ModelShape, st: Strategy) -> int:
    """Decoder blocks recomputed over the whole model (every stage's checkpointed_in_stage)."""
    if not st.checkpointing:
        return 0
    if st.checkpoint_blocks is None:
        return shape.num_layers
    return sum(checkpointed_of(st, blocks) for blocks in blocks_per_stage(shape, st))


def in_flight_micro_batches(st: Strategy, stage: int) -> int:
    """Micro-batches whose activations stage `stage` holds at its peak under 1F1B."""
    if st.pipeline_degree == 1:
        return 1
    return min(st.pipeline_degree - stage, st.grad_accum_steps)


@dataclass(frozen=True)
class StageMemory:
    stage: int
    params: float
    grads: float
    optimizer: float
    activations: float   # saved tensors x in-flight micro-batches + recompute working set + loss end's transient
    logits: float        # of which the loss end: its saved fp32 (log-)softmax and targets + its transient peak
    overhead: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.overhead


@dataclass(frozen=True)
class MemoryEstimate:
    stages: tuple[StageMemory, ...]
    capacity_bytes: float

    @property
    def peak(self) -> StageMemory:
        """The stage that needs the most memory: every GPU must hold it."""
        return max(self.stages, key=lambda m: m.total)

    @property
    def fits(self) -> bool:
        return self.peak.total <= self.capacity_bytes

    @property
    def headroom_bytes(self) -> float:
        """Capacity minus the peak stage's need (negative: short by that much)."""
        return self.capacity_bytes - self.peak.total

    def per_gpu(self) -> dict:
        m = self.peak
        return {"params": m.params, "grads": m.grads, "optimizer": m.optimizer, "activations": m.activations,
                "overhead": m.overhead, "total": m.total}


def _stage_memory(shape: ModelShape, st: Strategy, stage: int, working_set: float,
                  process_bytes: Optional[float] = None, overlap: bool = False) -> StageMemory:
    n = stage_params(shape, st, stage)
    states = model_state_bytes(*_state_args(st, n, overlap))
    blocks = blocks_in_stage(shape, st, stage)
    m = activation_shape(shape, st)
    first, last = stage == 0, stage == st.pipeline_degree - 1
    s, b, u = st.seq_length, st.micro_batch_size, st.sequence_split
    ckpt = checkpointed_in_stage(shape, st, stage)
    saved = act.stage_saved_bytes(m, blocks, s, b, st.dtype, st.recompute, st.tensor_degree, st.sequence_degree,
                                  first=first, last=last, pipeline=st.pipeline_layers, sp=st.sequence_parallel,
                                  context=st.context_degree, document_mask=st.document_mask, checkpointed=ckpt,
                                  chunked=st.chunked_loss)
    flight = in_flight_micro_batches(st, stage)
    kept = saved * flight
    if st.pipeline_degree > 1:
        # DeepSpeed's PipelineEngine holds the stage's output and input per in-flight micro-batch (activations.py,
        # "pipeline buffers").
        kept += flight * act.pipeline_buffer_bytes(m, s, b, st.dtype, st.tensor_degree, u, st.sequence_parallel,
                                                   first, last, act.stage_input_saved(m, st.dtype, bool(ckpt)))
        # ... and, once for the whole run, the buffer it receives activations and gradients into ("receive buffer").
        kept += act.pipeline_receive_bytes(m, s, b, st.dtype, st.tensor_degree, u, st.sequence_parallel)
    # The recompute's working set peaks above the saved set only where every block is checkpointed: with the first
    # N of them, the backward has freed the later blocks' whole sets before it recomputes the N-th.
    working = working_set if ckpt and ckpt == blocks else 0.0
    acts, logits = kept + working, 0.0
    if last:
        # Under TP each rank's logits are its V/TP columns of the vocabulary (vocab-parallel head and loss,
        # activations.loss_bytes_per_token), and so are the loss's saved softmax and the logits' gradient.
        shifted = act.loss_shifted(st.pipeline_layers, u)
        predicted = act.predicted_tokens(s, b, u, shifted)
        transient = act.loss_end_transient_bytes(m, s, b, st.dtype, u, st.tensor_degree, shifted, st.chunked_loss)
        # Two moments (the last stage holds one micro-batch): the loss end's peak (t = 1 the start of the backward,
        # TP the loss's forward), everything saved plus the transient; and the recompute of the last block, by when
        # the backward has freed the head's saved tensors (its fp32 log-softmax) and the logits' gradient. One block's
        # working set does not come on top of the loss end's transient (recipe=tiny at micro-batch 8, all 4 blocks
        # checkpointed: live peak 42.8 MiB, the same 10 MiB below no checkpointing per block checkpointed;
        # bench/steptime/memory_timeline.py).
        head = act.head_bytes(m, s, b, st.dtype, u, shifted, st.tensor_degree if st.sequence_parallel else 1,
                              st.tensor_degree, st.chunked_loss)
        loss_peak, last_recompute = kept + transient, kept - head + working
        acts = max(loss_peak, last_recompute)
        if loss_peak >= last_recompute:
            logits = predicted * act.loss_bytes_per_token(m, st.tensor_degree, st.chunked_loss) + transient
    return StageMemory(stage=stage, params=states["params"], grads=states["grads"], optimizer=states["optimizer"],
                       activations=acts, logits=logits, overhead=_overhead(shape, st, n, process_bytes, overlap)[0])


def _state_args(st: Strategy, n: float, overlap: bool) -> tuple:
    return (n, st.zero_partition_degree, st.zero_stage, st.dtype, st.grad_accum_fp32, st.pipeline_degree,
            st.offload_optimizer, st.offload_param, st.grad_accum_steps, overlap)


def explain_stage_memory(shape: ModelShape, st: Strategy, hw: Hardware, stage: int) -> dict:
    """{params, grads, optimizer, overhead: the arithmetic in words} of a stage's memory, for the plan's table."""
    n = stage_params(shape, st, stage)
    return {**model_state_how(*_state_args(st, n, overlap_comm(hw))),
            "overhead": _overhead(shape, st, n, _process_bytes(hw), overlap_comm(hw), True)[1]}


def _process_bytes(hw: Hardware) -> Optional[float]:
    """CPU ranks plan the process calibrate measured in place of the CUDA allowance (module docstring)."""
    return hw.profile.process_bytes if hw.device == "cpu" else None


def _overhead(shape: ModelShape, st: Strategy, n: float, process_bytes: Optional[float], overlap: bool = False,
              explain: bool = False) -> tuple[float, str]:
    """(bytes, how: "" unless explain) of what a rank holds besides its model states and activations: the framework
    (the stated GPU allowance, or on CPU ranks the profile's measured process_bytes) plus DeepSpeed's communication
    buffers for a stage of n parameters (module docstring)."""
    w = weight_bytes(st.dtype)
    base = FRAMEWORK_OVERHEAD_BYTES if process_bytes is None else process_bytes
    elements = gathered = 0.0
    copies = 2 if overlap and st.zero_stage in (1, 2) else 1
    if st.zero_stage in (1, 2, 3):
        # Every ZeRO stage stages gradients in a bucket of reduce_bucket_size elements in the communication dtype
        # (ipg_buckets): ZeRO 1/2 per backward (stage_1_and_2.py setup_buckets), two of them under overlap_comm
        # (its double buffer), ZeRO 3 one for the engine's life (stage3.py, after initialize_optimizer_states).
        # Measured (bench/steptime/live_at_peak.py): a bf16 DP2 ZeRO-3 rank holds 953.67 MiB = 5e8 x 2 B before
        # its step; ZeRO 1 allocates two buckets with overlap_comm, one without. On CPU ranks only the pages the
        # stage's gradients fill are resident (module docstring).
        bucket = reduce_bucket_for(REDUCE_BUCKET_ELEMENTS, largest_param(shape, st), st.zero_stage,
                                   st.sequence_degree * st.context_degree)
        elements = bucket if process_bytes is None else min(bucket, n)
        buffers = copies * elements * weight_bytes(st.comm_dtype)
    else:
        buffers = 0.0
    if st.zero_stage == 3 and st.zero_partition_degree > 1:
        # Tensors ZeRO 3 holds whole beside their partitions at the peak (zero3_gathered); over one rank it gathers
        # nothing (partition_parameters.py all_gather_coalesced: _no_gather_coalesced, the partition is the tensor).
        g = zero3_gathered(shape, st)
        gathered = g.total * w
        buffers += gathered
    if not explain:
        return base + buffers, ""
    terms = [f"{_size(base)} stated allowance (CUDA context, cuBLAS/NCCL workspaces, allocator fragmentation)"
             if process_bytes is None else
             f"{_size(base)} measured by launcher calibrate (the profile's process_bytes; glibc's kept free blocks "
             "not counted)"]
    if st.zero_stage in (1, 2, 3):
        cw = weight_bytes(st.comm_dtype)
        terms.append(f"ZeRO {st.zero_stage}'s reduce bucket" + (" x 2 (overlap_comm's double buffer)" if copies == 2
                                                                else "") + " " + (
            f"{bucket:,} elements" if elements == bucket
            else f"pages its {elements:,.0f} gradients fill") + f" x {cw} B = {_size(copies * elements * cw)}")
    if gathered:
        terms.append(f"ZeRO 3's whole tensors at the top of the backward: {g.persistent:,.0f} persistent + "
                     f"{g.kept:,.0f} gathered in the forward and kept + {g.prefetched:,.0f} prefetched = "
                     f"{g.total:,.0f} elements x {w} B = {_size(gathered)} (parallel.zero3_max_live_parameters and "
                     "zero3_max_reuse_distance bound it)")
    return base + buffers, " + ".join(terms)


def _size(x: float) -> str:
    """Bytes for the table's explanations: GB, or MB for the small terms of a CPU plan (report.py's _gb would print
    0.0 GB for recipe=tiny's 5.3 MB bucket)."""
    return f"{x / 1e9:,.2f} GB" if x >= 1e8 else f"{x / 1e6:,.1f} MB"


def estimate_memory(shape: ModelShape, st: Strategy, hw: Hardware) -> MemoryEstimate:
    """Memory of every pipeline stage of one rank, and whether the worst one fits the GPU."""
    # Recompute rebuilds one block's activations at a time in backward: that block's full set is live (on a stage
    # that checkpoints any), less the outputs selective checkpointing kept (already in the saved set).
    working_set = 0.0
    if st.checkpointing:
        m = activation_shape(shape, st)
        per_token = act.block_bytes_per_token(m, st.seq_length, st.dtype, st.tensor_degree, st.sequence_degree,
                                              st.sequence_parallel, st.document_mask)
        if st.recompute == "selective":
            per_token -= act.selective_kept_bytes_per_token(m, st.seq_length, st.dtype)
        working_set = st.seq_length * st.micro_batch_size / st.sequence_split * per_token
    # Stages other than the first and last differ only in in-flight micro-batches and block count, so the
    # first, the last and (for the block-count remainder) stage 1 bound them all; evaluating every stage
    # would cost O(PP) per candidate in --search for no new maximum.
    stages = sorted({0, min(1, st.pipeline_degree - 1), st.pipeline_degree - 1})
    process_bytes = _process_bytes(hw)
    return MemoryEstimate(stages=tuple(_stage_memory(shape, st, i, working_set, process_bytes, overlap_comm(hw))
                                       for i in stages),
                          capacity_bytes=hw.memory_bytes)


# --- The exact per-rank ledger (DeepSpeed 0.19.8) ------------------------------------------------------------
# model_state_bytes above is the ZeRO paper's continuous approximation (bytes per parameter x Psi / N_d), what
# the planner uses at scale. predict_model_state_bytes below is the exact count of what one rank's tensors hold,
# padding and per-tensor effects included; tests/plan/test_state_bytes.py holds it to real engines on CPU ranks.
# Per-byte sizes and the optimizer-class rule are shared with the approximation (weight_bytes,
# uses_bf16_optimizer), so the two differ only by DeepSpeed's alignment and bookkeeping.

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ADAM_STEP_BYTES = 4               # torch AdamW keeps state["step"] as a float32 scalar tensor per parameter tensor
NCCL_START_ALIGNMENT_FACTOR = 2   # stage_1_and_2.py / bf16_optimizer.py: flat buffers align to 2 x DP elements


def zero3_partition_numel(numel: int, data_degree: int) -> int:
    """Elements of one tensor's ZeRO-3 partition: ceil(numel / DP) (partition_parameters.py _aligned_size / DP)."""
    return -(-numel // data_degree)


def zero3_sub_groups(partition_numels, sub_group_size: int = 1_000_000_000) -> int:
    """ZeRO-3 optimizer sub-groups (stage3.py _create_fp16_sub_groups, default sub_group_size 1e9):
    a sub-group closes once its partitions reach sub_group_size elements, or at the last tensor."""
    total = sum(partition_numels)
    if total <= sub_group_size:
        return 1
    groups, running = 0, 0
    for i, n in enumerate(partition_numels):
        running += n
        if running >= sub_group_size or i == len(partition_numels) - 1:
            groups, running = groups + 1, 0
    return groups


def zero12_gradient_elements(numels, data_degree: int, dp_rank: int) -> tuple[int, int]:
    """(elements of whole tensors overlapping this rank's partition, zero padding elements) under ZeRO 1/2.

    stage_1_and_2.py: the flat buffer of aligned = ceil(N / (2 DP)) x 2 DP elements is cut into DP equal
    partitions (get_data_parallel_partitions); copy_grads_in_partition allocates grads_in_partition for the
    *whole* gradients of every tensor that overlaps the partition (params_in_partition, get_partition_info),
    so a tensor straddling a boundary is kept whole by both neighbours; get_flat_partition pads the last
    partition past the end of the tensors with a separate torch.zeros (or, on a rank with no tensor, a
    zero buffer of the whole partition).
    """
    n = sum(numels)
    align = NCCL_START_ALIGNMENT_FACTOR * data_degree
    part = -(-n // align) * align // data_degree
    lo, hi = dp_rank * part, (dp_rank + 1) * part
    whole, offset = 0, 0
    for numel in numels:
        if offset < hi and offset + numel > lo:
            whole += numel
        offset += numel
    pad = max(0, hi - max(n, lo))
    return whole, pad


def predict_model_state_bytes(cfg, layout, dp_rank: int = 0) -> dict:
    """Exact bytes of parameters, gradients and optimizer states rank `dp_rank` holds under DeepSpeed 0.19.8.

    Measured point: after backward at the accumulation boundary, before optimizer step 2 or later (Adam's
    moments exist). At that point ZeRO 1, like ZeRO 2, holds only its gradient partition; ZeRO 0 holds the full
    gradients through the step, and ZeRO 1 between the micro-batches of an accumulation, which is the peak that
    model_state_bytes charges (zero1_holds_partition). Covers no TP/PP/SP, no offload.
    Our engine passes two parameter groups (decayed tensors, then norm weights and biases: params.param_group_numels);
    ZeRO 1/2 and the BF16_Optimizer flatten, align and partition each group on its own, and keep one Adam step per
    group: the ZeRO 1/2 and bf16 terms below are summed over the groups (N, a, p of each group).
    N = sum of tensor sizes, T = number of tensors, D = DP degree, w = bytes of the training dtype,
    a = ceil(N / 2D) x 2D (flat-buffer alignment), p = a / D, p_i = ceil(n_i / D) per tensor (ZeRO 3).

    ZeRO 0, fp32 (torch AdamW on the model's weights, engine.py _configure_optimizer):
        params 4N, grads 4N (p.grad), optimizer 8N + 4T (exp_avg, exp_avg_sq, a float32 step per tensor).
    ZeRO 0, bf16/fp16 (fp16/unfused_optimizer.py FP16_UnfusedOptimizer: per-tensor fp32 copies fp32_groups):
        params 2N, grads 2N, optimizer 12N + 4T.
    ZeRO 1/2 (zero/stage_1_and_2.py DeepSpeedZeroOptimizer.__init__):
        params w a (bit16_groups_flat, flatten_dense_tensors_aligned; the model's tensors are views into it),
        optimizer 12 p + 4 (single_partition_of_fp32_groups: an fp32 *clone* even in fp32, + Adam's m, v, step),
        grads w (whole overlapping tensors + tail padding) from zero12_gradient_elements: grads_in_partition
        (copy_grads_in_partition) and get_flat_partition's zero pad, both in the gradient accumulation dtype.
    bf16 + fp32 accumulation at ZeRO 1 (bf16_optimizer.py BF16_Optimizer._setup_for_real_optimizer):
        params 2a (bf16_groups_flat), grads 4a (fp32_groups_gradients_flat, full and unsharded; no bf16 p.grad:
        with immediate_grad_update, which the launcher sets, each is added into it and freed as the backward
        writes it), optimizer 12 p + 4.
    ZeRO 3 (zero/partition_parameters.py _partition_param, zero/stage3.py):
        params w sum(p_i) (ds_tensor partitions, defragmented into lp_param_buffer) + w sum(D p_i) over
        "persistent" tensors (n_i <= stage3_param_persistence_threshold = 1e5, parameter_offload.py
        mark_persistent_parameters): they stay gathered on every rank after the first forward, each in a
        buffer of its padded size ceil(n_i / D) x D (partition_parameters.py all_gather_coalesced ->
        _all_gather_sequential; the GPT case of tests/plan/test_state_bytes.py, with odd-sized norms, pins it);
        grads w_acc sum(p_i) (grad_partitions_flat_buffer, _setup_for_real_optimizer);
        optimizer 12 sum(p_i) + 4 per sub-group (fp32_partitioned_groups_flat, an fp32 clone of the partitions),
        8 sum(p_i) + 4 per sub-group in fp32: there `launcher train` makes DeepSpeed use the fp32 partitions
        themselves as the master weights (launcher/runtime/zero3.py: the reuse branch in _create_fp32_partitions
        compares a torch.device to a str and never runs on its own).
    Buffers (returned apart, not model state): ZeRO 3 keeps one reduce bucket of reduce_bucket_size elements in
    the communication dtype for the engine's life (_setup_for_real_optimizer, ipg_buckets); ZeRO 1/2 allocate
    theirs per backward in setup_buckets and free them in _release_ipg_buffers, so none is held here (with
    overlap_comm on GPUs two are live *during* backward: the planner's overhead allowance, not this ledger).
    Bucket buffers are not "gradients held": their size is a config constant, not a function of the model,
    and the gradients they stage end up in grads_in_partition / grad_partitions_flat_buffer, counted above.
    """
    if layout.tensor_degree > 1 or layout.pipeline_degree > 1 or layout.sequence_parallel_size > 1:
        raise ValueError("the exact ledger covers data parallelism only (tensor/pipeline/sequence degree 1)")
    if cfg.parallel.offload_optimizer or cfg.parallel.offload_param:
        raise ValueError("the exact ledger does not cover CPU offload")
    groups = param_group_numels(cfg.model, layout.padded_vocab_size)
    numels = [x for g in groups for x in g]
    n, t, d, stage = sum(numels), len(numels), layout.data_degree, layout.zero_stage
    w = DTYPE_BYTES[layout.dtype]
    w_acc = DTYPE_BYTES[cfg.precision.grad_accum_dtype or layout.dtype]
    adam = 8   # fp32 exp_avg + exp_avg_sq per element
    master = 4
    align = NCCL_START_ALIGNMENT_FACTOR * d
    aligned_g = [-(-sum(g) // align) * align for g in groups]  # each group's flat buffer
    aligned, part = sum(aligned_g), sum(a // d for a in aligned_g)
    steps = ADAM_STEP_BYTES * len(groups)  # one flat fp32 partition, hence one Adam step, per group
    buffers = 0
    if uses_bf16_optimizer(layout.dtype, stage, cfg.precision.grad_accum_dtype == "fp32", layout.pipeline_degree):
        params, grads = w * aligned, w_acc * aligned + (0 if BF16_IMMEDIATE_GRAD_UPDATE else w * n)
        optimizer = (master + adam) * part + steps
    elif stage == 0:
        if w_acc != w:
            raise ValueError("DeepSpeed 0.19.8 refuses a grad_accum_dtype other than the model dtype without ZeRO")
        params, grads = w * n, w * n
        optimizer = (adam + (master if w != 4 else 0)) * n + ADAM_STEP_BYTES * t
    elif stage in (1, 2):
        if w_acc != w:
            raise ValueError("the exact ledger does not cover ZeRO 2 with a separate gradient accumulation dtype")
        whole_pad = [zero12_gradient_elements(g, d, dp_rank) for g in groups]
        params, grads = w * aligned, w_acc * sum(whole + pad for whole, pad in whole_pad)
        optimizer = (master + adam) * part + steps
    else:
        parts_g = [[zero3_partition_numel(x, d) for x in g] for g in groups]
        parts = [p for g in parts_g for p in g]
        persistent = sum(d * p for x, p in zip(numels, parts) if x <= cfg.parallel.zero3_param_persistence_threshold)
        params = w * (sum(parts) + persistent)
        grads = w_acc * sum(parts)
        # stage3.py _create_fp16_sub_groups runs per parameter group; fp32 weights are their own master
        # (launcher/runtime/zero3.py).
        optimizer = ((master if w != 4 else 0) + adam) * sum(parts) + ADAM_STEP_BYTES * sum(zero3_sub_groups(g) for g in parts_g)
        buffers = REDUCE_BUCKET_ELEMENTS * DTYPE_BYTES[reduce_dtype(cfg)]   # in the communication dtype
    return {"params": params, "grads": grads, "optimizer": optimizer, "buffers": buffers,
            "total": params + grads + optimizer}
