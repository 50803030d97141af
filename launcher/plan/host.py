"""Host (CPU) memory per node: what the ranks of one node hold in RAM, against the node's RAM (no torch).

Per rank, four terms (bytes); a node adds up its gpus_per_node ranks (launcher/plan/rankmap.py places them):

build peak (what the per-rank build materialises; launcher/runtime/build.py, counted for `train --dry-run` by
    launcher/runtime/dryrun.py, which calls build_peak_bytes below, so the plan and the ledger agree):
    our layer list (PP > 1, or TP > 1 at one stage: launcher/parallel/tensor_model.py): its own layers in fp32
        (the build dtype; DeepSpeed casts afterwards) -- its stage's blocks' TP shards, its V/TP rows of the
        embedding and the head (vocab-parallel, as Megatron-LM's VocabParallelEmbedding), the norms whole -- + one
        seeded block of BUILD_ROWS rows of its widest tensor row being generated (x 4 B)
    ZeRO-3 without TP or PP, Ulysses and ring CP included (deepspeed.zero.Init): its partition of every tensor in the training dtype
        + the fp32 rows one partition of the largest tensor is cut from + two fp32 rows of the widest tensor
    otherwise (ZeRO 0-2 without TP or PP, Ulysses and ring CP included): the whole model in fp32 -- every rank builds it whole
checkpoint save staging: torch.save writes a CUDA tensor by copying its storage to host memory one storage at a
    time (torch/serialization.py, _save: `storage.cpu()` per storage), and DeepSpeed keeps each rank's fp32
    master partition as one flat tensor per parameter group (ZeRO 1-3) or the fp32 weights themselves, so the
    largest staged storage is that partition: parameters held / DP (ZeRO >= 1) x 4 B. With the optimizer
    offloaded the states are already in host memory and nothing is staged for them.
CPU offload (ZeRO-Offload, Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training",
    section 4.1; DeepSpeed's stage_1_and_2.py / stage3.py with offload_optimizer.device=cpu):
    offload_optimizer: fp32 master + Adam momentum + variance (12 B/param, what memory.py's model_state_bytes
        takes off the GPU) + the fp32 gradient partition the CPU Adam reads (4 B/param), each / DP
    offload_param (ZeRO-3): the parameter partition in the training dtype, / DP
data loader (launcher/runtime/data.py TokenBatches): the token files are memory-mapped (page cache,
    reclaimable: not counted); the sample order is a keyed permutation evaluated per sample (no array of
    sample ids: until issue 11 it was an int64 permutation, 8 B per sample, ~3.9 GB per rank at 2T tokens of
    4096), so a rank holds one micro-batch of int64 ids and, in a blend, one cached block of source choices
    (2^18 slots x 16 B = 4 MiB); independent of the corpus size.

The terms are added although the build's host copy is mostly released once the model moves to the GPU: an
upper bound by at most the build term, chosen so the check does not rely on the allocator returning the
build's pages to the OS before DeepSpeed allocates the offloaded states.

Capacity: cluster.host_memory_gb, else the node's RAM as `launcher calibrate` read it into the profile that
cluster.profile names, else the catalog GPU's DGX node (launcher/config/hardware.py); for gpu=cpu or a GPU outside
the catalog without either it is unknown and nothing is checked (config code does not probe the machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from launcher.config import hardware
from launcher.plan.inputs import ModelShape, Strategy
from launcher.plan.memory import model_state_bytes, stage_params, weight_bytes
from launcher.plan.profile import load_profile

BUILD_ROWS = 256            # rows a seeded initialiser generates at a time (launcher/runtime/build.py)
FP32_BYTES = 4
BLEND_BLOCK_BYTES = 2**18 * 16  # data.py BLEND_BLOCK slots x (int64 source choice + int64 rank within the block)
TOKEN_ID_BYTES = 8          # a micro-batch as torch int64


def build_peak_bytes(path: str, own_params: float, whole_params: float, held_params: float, dtype: str,
                     extra_bytes: float) -> float:
    """Host bytes one rank's build allocates at its peak (the module docstring's three paths).

    path "pipeline": own_params x 4 + extra (one seeded row block);
    path "zero3":    held_params x dtype bytes + extra (the fp32 rows one partition is cut from);
    path "whole":    whole_params x 4.
    """
    if path == "pipeline":
        return own_params * FP32_BYTES + extra_bytes
    if path == "zero3":
        return held_params * weight_bytes(dtype) + extra_bytes
    return whole_params * FP32_BYTES


def build_path(st: Strategy) -> str:
    """Which of the three build paths a layout's ranks take (as launcher/runtime/dryrun.py decides)."""
    if st.pipeline_layers:  # stages, or any TP: our layer list, each rank its TP shards
        return "pipeline"
    if st.zero_stage == 3 and st.tensor_degree == 1:
        return "zero3"
    return "whole"


def whole_params(shape: ModelShape, st: Strategy) -> int:
    """The whole model's parameters with the TP-padded vocabulary (the embedding, and an untied head, padded)."""
    pad = (st.padded_vocab_size - shape.vocab_size) * shape.hidden_size
    return shape.params.total + pad * (1 if shape.tied_embeddings else 2)


def rank_params(shape: ModelShape, st: Strategy, stage: int) -> float:
    """Parameters one TP rank of pipeline stage `stage` builds, as the runtime shards them: a block's matrices
    and column-parallel biases / TP, the embedding and the head / TP (vocab-parallel: V/TP rows each), everything
    else whole (the norms and row-parallel biases: what `train --dry-run` counts as params_tp_replicated). The GPU
    plan counts the same (memory.stage_params, stages.rank_param_count), so there is one rule."""
    return stage_params(shape, st, stage)


def _widest_row(shape: ModelShape, tp: int) -> int:
    """Elements in one row of the widest tensor a TP rank builds: hidden (embedding, column-parallel
    weights [out / TP, hidden]) or the FFN width / TP (the row-parallel down projection [hidden, ffn / TP])."""
    return max(shape.hidden_size, -(-shape.intermediate_size // tp))


def rank_build_bytes(shape: ModelShape, st: Strategy, stage: int) -> float:
    """Build peak of one rank of pipeline stage `stage` (build_peak_bytes with the planner's counts)."""
    path = build_path(st)
    whole = whole_params(shape, st)
    own = rank_params(shape, st, stage)
    d = st.data_degree
    if path == "pipeline":
        extra = BUILD_ROWS * _widest_row(shape, st.tensor_degree) * FP32_BYTES
    elif path == "zero3":
        largest = st.padded_vocab_size * shape.hidden_size   # the embedding (or the untied head)
        extra = -(-largest // d) * FP32_BYTES + 2 * max(shape.hidden_size, shape.intermediate_size) * FP32_BYTES
    else:
        extra = 0.0
    return build_peak_bytes(path, own, whole, own / d, st.dtype, extra)


def rank_checkpoint_bytes(shape: ModelShape, st: Strategy, stage: int) -> float:
    """Largest storage torch.save stages in host memory for one rank: its fp32 master partition."""
    if st.offload_optimizer:
        return 0.0
    n = rank_params(shape, st, stage)
    return n / (st.data_degree if st.zero_stage >= 1 else 1) * FP32_BYTES


def rank_offload_bytes(shape: ModelShape, st: Strategy, stage: int) -> float:
    """Host bytes of what ZeRO-Offload moves off one rank's GPU (0 without offload)."""
    n = rank_params(shape, st, stage)
    on_gpu = model_state_bytes(n, st.zero_partition_degree, st.zero_stage, st.dtype, st.grad_accum_fp32, st.pipeline_degree)
    out = 0.0
    if st.offload_optimizer:
        out += on_gpu["optimizer"] + n * FP32_BYTES / st.data_degree
    if st.offload_param:
        out += on_gpu["params"]
    return out


def rank_loader_bytes(st: Strategy, train_tokens: float) -> float:
    """One rank's data-loader buffers: one int64 micro-batch + a blend's cached block; not a function of
    `train_tokens` (kept in the signature: the sample order used to be an array of train_tokens / seq_length ids)."""
    return BLEND_BLOCK_BYTES + st.micro_batch_size * st.seq_length * TOKEN_ID_BYTES


@dataclass(frozen=True)
class HostMemory:
    """The fullest node's host bytes, term by term, and the node's RAM (None: unknown, not checked)."""

    node: int
    ranks: int
    build: float
    checkpoint: float
    offload: float
    data_loader: float
    capacity_bytes: Optional[float]
    capacity_source: str
    build_path: str
    per_rank_build: tuple          # build peak of every rank on that node, in local-rank order

    @property
    def total(self) -> float:
        return self.build + self.checkpoint + self.offload + self.data_loader

    @property
    def fits(self) -> Optional[bool]:
        return None if self.capacity_bytes is None else self.total <= self.capacity_bytes

    def arithmetic(self) -> str:
        """The sum with its values, e.g. 'build 8 ranks x 14.7 GB = 117.9 GB + checkpoint ... = 130 GB of 2,000 GB'."""
        gb = 1e9
        b = self.per_rank_build
        low, high = f"{min(b) / gb:,.1f}", f"{max(b) / gb:,.1f}"
        build = f"{self.ranks} ranks x {high} GB" if low == high else f"{self.ranks} ranks, {low}..{high} GB each"
        text = (f"build ({self.build_path}) {build} = {self.build / gb:,.1f} GB + checkpoint staging "
                f"{self.checkpoint / gb:,.1f} GB + CPU offload {self.offload / gb:,.1f} GB + data loader "
                f"{self.data_loader / gb:,.1f} GB = {self.total / gb:,.1f} GB")
        if self.capacity_bytes is not None:
            text += f" on a node with {self.capacity_bytes / gb:,.1f} GB"
        return text


def host_capacity(cluster_cfg) -> tuple[Optional[float], str]:
    """(host RAM per node in bytes or None, where the number comes from): cluster.host_memory_gb, else what
    `launcher calibrate` read on the node (/proc/meminfo MemTotal, the profile cluster.profile names), else the
    catalog GPU's DGX node."""
    if cluster_cfg.host_memory_gb is not None:
        return float(cluster_cfg.host_memory_gb) * 1e9, "cluster.host_memory_gb"
    path = getattr(cluster_cfg, "profile", None)
    measured = load_profile(path).host_memory_gb if path else None
    if measured:
        return measured * 1e9, f"cluster.profile={path}: MemTotal of the node `launcher calibrate` ran on"
    spec = hardware.lookup(cluster_cfg.gpu)
    if spec is None or spec.host_memory_gb is None:
        return None, f"unknown for cluster.gpu={cluster_cfg.gpu} (set cluster.host_memory_gb to check it)"
    return spec.host_memory_gb * 1e9, f"cluster.gpu={spec.name}: {spec.host_source}"


def estimate_host_memory(shape: ModelShape, st: Strategy, stages_by_node: list[list[int]], train_tokens: float,
                         capacity: tuple[Optional[float], str]) -> HostMemory:
    """Host bytes of every node (its ranks' pipeline stages in `stages_by_node`); returns the fullest node."""
    per_stage = {}
    for stages in stages_by_node:
        for s in stages:
            if s not in per_stage:
                per_stage[s] = (rank_build_bytes(shape, st, s), rank_checkpoint_bytes(shape, st, s),
                                rank_offload_bytes(shape, st, s))
    loader = rank_loader_bytes(st, train_tokens)
    best = None
    for node, stages in enumerate(stages_by_node):
        terms = [sum(per_stage[s][i] for s in stages) for i in range(3)]
        h = HostMemory(node=node, ranks=len(stages), build=terms[0], checkpoint=terms[1], offload=terms[2],
                       data_loader=loader * len(stages), capacity_bytes=capacity[0], capacity_source=capacity[1],
                       build_path=build_path(st), per_rank_build=tuple(per_stage[s][0] for s in stages))
        if best is None or h.total > best.total:
            best = h
    return best


def stages_by_node(layout) -> list[list[int]]:
    """The pipeline stage of every rank, grouped by node (launcher/plan/rankmap.py's placement)."""
    from launcher.plan.rankmap import rank_map

    nodes: list[list[int]] = [[] for _ in range(layout.nodes)]
    for c in rank_map(layout):
        nodes[c.node].append(c.pp)
    return nodes
