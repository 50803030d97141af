"""Hardware profiles: the rates the per-operator step-time model (launcher/plan/steptime.py) reads (no torch).

A profile says how fast one accelerator (or one CPU rank) runs each kind of operator:

    gemm_tflops[dtype]      plateau rate of a large dense GEMM, TFLOP/s
    gemm_half_dim[dtype]    the GEMM's smallest dimension (M, N or K) at which it runs at half the plateau:
                            rate(M, N, K) = plateau x d / (d + gemm_half_dim), d = min(M, N, K)
    attention_tflops[dtype] plateau rate of causal fused attention (SDPA / flash), forward + backward,
                            counted in causal FLOPs (half the square)
    attention_half_seq[dt]  sequence length at which attention runs at half its plateau
    attention_head_dim      the head dimension attention_table (and the curve) was measured at (128 for the GPU
                            built-ins and a GPU calibration, 64 for a CPU one)
    attention_table_by_head_dim  optional {head dim: {dtype: table}}: the same rates at other head dimensions; a
                            model's head dimension then reads the two nearest, log-linear in the head dimension,
                            clamped outside them (a FlashAttention kernel's rate falls with the head dimension:
                            fewer FLOPs per byte of q, k, v it loads; FlashAttention-2 fig. 4(c) / 4(d), A100
                            at seq 2k, 140 TFLOP/s at 64 against 155 at 128)
    memory_gbps             attainable memory bandwidth for element-wise operators (GB/s, read + write)
    kernel_overhead_s       fixed cost of one operator (kernel launch on a GPU, dispatch + autograd on a CPU)
    intra / inter           collective link inside / across nodes: latency_s per collective call and
                            bus_gbps, the NCCL-tests "bus bandwidth" (a ring all-reduce of B bytes on n ranks
                            takes latency + 2 (n-1)/n B / bus bandwidth)
    all_to_all              optional: the all-to-all inside a node, where calibrate measured it apart
    intra_groups            optional {ranks: link}: the all-reduce inside a node for groups of fewer ranks than the
                            node's, where calibrate measured them apart (more than 2 ranks a node)
    nccl                    optional (NcclTuning): where present, a TP or data-parallel collective costs what
                            NCCL's own model says for its group's ranks, nodes and message size (latency that
                            grows with the ring, the cheapest algorithm and protocol) instead of the link's
                            fixed latency_s; the built-in GPU profiles have it, a calibrated file only if
                            written in by hand (calibrate measures the latency at its own world size, one node)
    host_memory_gb          RAM per node; compute_slots: ranks per node that compute at once (CPU cores for
                            CPU ranks; None for GPUs, one per GPU)
    process_bytes           CPU ranks: a rank's resident bytes besides its model's tensors (interpreter, torch,
                            DeepSpeed, transformers' modeling code, the process group, and what an engine and its
                            first steps add at a near-zero model's size), measured by `launcher calibrate`;
                            the plan's memory overhead on CPU ranks in place of the GPU's CUDA allowance
                            (launcher/plan/memory.py). None on GPUs and in older files
    zero3_module_s          DeepSpeed ZeRO-3's hook cost per module per micro-batch (forward + backward),
                            measured by `launcher calibrate` on a ZeRO-3 engine against the same model plain;
                            the H200's is measured (a 1B LLaMA on one H200 ran ZeRO-3 at 2.1x its ZeRO-1 step:
                            the hooks are not hidden), and the A100 / H100 built-ins take it (host work)
    zero3_param_s           the same per parameter tensor, on top of its module's (a profile without it, from
                            before it was measured apart: zero3_module_s then covers a module's parameters too)
    zero3_module_step_s     the part of ZeRO-3's engine work per module (and zero3_param_step_s: per parameter
    zero3_param_step_s      tensor) that comes once a step, not every micro-batch (the boundary's partitioned
                            optimizer step and what follows it), measured by running the same probe at 1 and 3
                            micro-batches a step; then zero3_module_s / zero3_param_s are the per-micro-batch part.
                            0 where not measured apart (the built-ins, older files): all of it every micro-batch
    zero3_recompute_param_s what a checkpointed block's recompute adds to ZeRO-3's hooks per parameter tensor of the
                            block: the recompute runs every module's forward again, and DeepSpeed's forward hooks
                            (fetch, trace, release) with it. Measured by `launcher calibrate` (a Linear, one module
                            and one parameter, under torch's non-reentrant checkpoint against the same Linear
                            wrapped alike) and charged per parameter tensor, as ZeRO-3's cost follows the
                            parameters more than the modules (calibrate._zero3_hooks); 0 where not measured (the
                            built-ins, older files: not charged)
    engine_element_s[dtype] DeepSpeed's own work per parameter element and optimizer step, by ZeRO stage 0..3
                            (a list of 4): what its engine does beyond a plain forward + backward + optimizer
                            step (gradient buckets flattened and copied, fp32 partitions, the clipping norm, ZeRO-3
                            gathers into flat buffers), measured by `launcher calibrate` with no collective in it
                            (each rank its own data-parallel group); {} where not measured (the built-in A100 /
                            H100: device work)
    engine_tensor_s[dtype]  the same engine's work per parameter tensor and step, by ZeRO stage 0..3, whatever the
                            tensor's size (per-tensor gradient hooks, bucket bookkeeping, fp32 copies launched one
                            tensor at a time): the probe's cost of its smallest Linear less that Linear's elements
                            x engine_element_s; stage 3 is 0 (ZeRO-3's per-tensor cost is zero3_param_s); host
                            work, so the built-in A100 / H100 take the H200 node's
    engine_element_micro_s  the part of engine_element_s (and engine_tensor_micro_s: of engine_tensor_s) that
    engine_tensor_micro_s   recurs every micro-batch, by dtype and ZeRO stage 0..3, measured by running the same
                            probe at 1 and 3 micro-batches a step; where a dtype has it, engine_element_s /
                            engine_tensor_s are the rest, paid once a step at every stage. {} where not measured
                            apart (the built-ins, older files): ZeRO 2 / 3 pay the whole figure every micro-batch,
                            ZeRO 0 / 1 once a step
    framework_s[arch][dt]   [block forward, block backward, model] seconds per micro-batch that the operator terms
                            do not count: the PyTorch dispatch, autograd and transformers module Python of the
                            runtime's own model classes (views, reshapes, casts, masks: ~2,400 operators a
                            micro-batch for recipe=tiny's 4 blocks where the terms count ~250 kernels),
                            measured by `launcher calibrate` on a near-zero-compute model of the architecture
                            (steptime.FRAMEWORK_PROBE) less what the step-time model charges for that same model
                            (steptime.framework_residual); {} on a GPU, where the Python runs ahead of the
                            kernels (host_s), and where not measured
    host_s[arch][dt]        [block forward, block backward, model] seconds the host takes to issue one micro-batch
                            on a GPU: the same probe, its times kept whole. They are not added to the kernels
                            (the host runs ahead of them) but bound a micro-batch from below (steptime's host
                            floor); {} on CPU ranks and where not measured. The host's speed is the node's CPU,
                            not the GPU's: the built-in A100 / H100 take the H200 node's (the only GPU host
                            calibrated), which the H100 runs held out of sample (BUILTIN below)
    selective_framework_s[arch][dt]  [block forward, block backward] seconds per micro-batch that a selectively
                            checkpointed block (model.checkpoint_mode=selective) adds beyond the terms: torch's
                            dispatch mode over every operator in the forward, the module Python and the mode again
                            in the recompute; the framework probe run again with selective checkpointing on, less
                            the probe without it and the recomputed element-wise operators the plan charges
                            (steptime.selective_residual). CPU ranks; {} where not measured (the plan then charges
                            the recompute's operators and module Python only, an under-charge on CPU ranks)
    selective_host_s[arch][dt]  the same on a GPU, as host issue time (the probe's difference whole); {} where not
                            measured (the built-ins: the recompute's issue time is taken as the forward's)
    release[g]              optional: what a synchronisation of g ranks costs once the last arrived, by the compute
                            before it (seconds by segment seconds; calibrate's _release, which writes one figure
                            at every length, its rows pooled: calibrate.pooled_release): the plan charges what it
                            exceeds the group's link latency by, per synchronisation (steptime stragglers)
    straggler[g]            the wait of a group of g ranks at a synchronisation for its slowest rank: the expected
                            slowest-minus-mean time of a segment of the same compute on every rank, as a fraction
                            of the segment, by segment length ([[seconds, fraction], ...]), measured by `launcher
                            calibrate` on groups of consecutive ranks; {} where not measured (the built-ins)
    straggler_unshared[g], release_unshared[g]  optional, CPU ranks on a node with more ranks than compute slots:
                            the same two measured with only the first compute_slots ranks busy, the rest idle,
                            as a pipeline's fill and drain leave one stage computing (steptime._shared_pipeline
                            charges them where a stage computed unshared; {} elsewhere: the tables above)

The built-in GPU profiles cite every constant below. `launcher calibrate` writes the same fields,
measured, to a YAML file (PROFILE_VERSION); `cluster.profile=PATH` selects it.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional

from launcher.config.errors import ConfigError
from launcher.config.supported import LLAMA_FAMILY

PROFILE_VERSION = 1


@dataclass(frozen=True)
class Link:
    latency_s: float
    bus_gbps: float


# NCCL's latency constants, us, by protocol: (base, per step on NVLink, per step on the network).
# src/graph/tuning.cc (NCCL 2.18-2.19), baseLat and hwLat for Ring and Tree.
_NCCL_RING = {"LL": (6.6, 0.6, 2.7), "LL128": (14.0, 1.9, 4.0), "Simple": (8.4, 3.4, 14.0)}
_NCCL_TREE = {"LL": (6.8, 0.6, 5.0), "LL128": (14.0, 1.25, 8.5), "Simple": (0.0, 28.0, 28.0)}


@dataclass(frozen=True)
class NcclTuning:
    """NCCL's own cost model of a collective (src/graph/tuning.cc, ncclTopoTuneModel and ncclTopoGetAlgoTime,
    NCCL 2.18-2.19), by which NCCL itself picks an algorithm and protocol: time = latency + bytes / bandwidth,
    the cheapest of ring (LL, LL128, Simple) and, for an all-reduce, tree.

    Latency, for r ranks on N nodes (r / N a node): a ring all-gather or reduce-scatter takes r - 1 steps, N - 1
    of them across nodes; a ring all-reduce 2 (r - 1), 2N of them across (N > 1; all of them at one rank a node,
    where NCCL's count would exceed the steps): base + intra steps x NVLink step + inter steps x network step,
    the NVLink step raised to the host's network post overhead (x 3 for Simple) once the ring leaves the node
    (net_overhead_s: NCCL's 1 us for Intel hosts, 2 us for AMD, NCCL_NET_OVERHEAD). A tree all-reduce: base +
    2 ((r/N - 1) NVLink steps + floor(log2 N) network steps). Simple on a ring: 8.4 us + 3.4 / 14 us a step, so an
    8-rank all-gather pays 32 us and a 512-rank one on 64 nodes 2.4 ms; LL: 6.6 us + 0.6 / 2.7 us a step.

    Bandwidth, as a fraction of the link's bus bandwidth: Simple 1; LL128 0.92 (0.7 at one rank a node); LL 1/4
    (1/3 for an all-gather or reduce-scatter inside a node); tree 0.92 of the ring's, LL x 1/3.8, LL128 x 7/9
    (one node) or 120/128, at algorithm bandwidth = bus / 2. NCCL's per-channel caps (llMaxBws, perChMax*Bws)
    are left out: they bind only where LL and LL128 lose on bandwidth anyway; so are NVLink SHARP, CollNet and
    PAT (NCCL >= 2.23's all-gather / reduce-scatter at one GPU a node). LL128 is taken as enabled, as NCCL enables
    it on A100 / H100 nodes with NVLink and a NIC beside each GPU (DGX / HGX).

    The link's bus bandwidth across nodes is one GPU's NIC (launcher/plan/profile.py, the links' comment):
    NCCL's graph gives a ring the node's NICs together (nChannels x per-NIC speed), which did not fit the
    published runs (bench/published/results.md); a calibrated profile's measured groups several ranks a node
    across nodes replace it (Profile.inter_for)."""

    net_overhead_s: float = 1e-6

    def options(self, all_reduce: bool, ranks: int, nodes: int) -> tuple:
        """((latency s, fraction of the bus bandwidth in the ring formula), ...) of every algorithm and protocol."""
        return _nccl_options(self, all_reduce, ranks, nodes)


@functools.lru_cache(maxsize=4096)   # the search asks for the same few groups thousands of times
def _nccl_options(nccl: NcclTuning, all_reduce: bool, ranks: int, nodes: int) -> tuple:
    if all_reduce:
        steps = 2 * (ranks - 1)
        across = min(2 * nodes, steps) if nodes > 1 else 0
    else:
        steps, across = ranks - 1, nodes - 1
    out = []
    for proto, (base, nvlink, net) in _NCCL_RING.items():
        intra = nvlink
        if nodes > 1:
            intra = max(nvlink, nccl.net_overhead_s * 1e6 * (3 if proto == "Simple" else 1))
        bw = {"Simple": 1.0, "LL128": 0.92 if ranks / nodes >= 2 else 0.7,
              "LL": 0.25 if nodes > 1 or all_reduce else 1 / 3}[proto]
        out.append(((base + (steps - across) * intra + across * net) * 1e-6, bw))
    if all_reduce:
        levels = int(math.log2(nodes))
        for proto, (base, nvlink, net) in _NCCL_TREE.items():
            tree = 0.92 * {"Simple": 1.0, "LL": 1 / 3.8, "LL128": 7 / 9 if nodes == 1 else 120 / 128}[proto]
            # the tree moves 2 B at half its bus bandwidth; in the ring formula's 2 (r-1)/r B that is x (r-1)/r
            out.append(((base + 2 * ((ranks // nodes - 1) * nvlink + levels * net)) * 1e-6,
                        tree * (ranks - 1) / ranks))
    return tuple(out)


@dataclass(frozen=True)
class Profile:
    name: str
    gemm_tflops: dict
    gemm_half_dim: dict
    attention_tflops: dict
    attention_half_seq: dict
    memory_gbps: float
    kernel_overhead_s: float
    intra: Link
    inter: Link
    host_memory_gb: Optional[float] = None
    compute_slots: Optional[int] = None
    process_bytes: Optional[float] = None
    source: str = ""        # where the numbers come from (printed in the plan's step-time row)
    # A calibrated profile whose sweeps disagreed (noisy_sweeps: the machine was busy while it was measured): one
    # line per such figure, for `launcher plan` and `launcher train` to say so; () for the built-ins and steady ones.
    noisy: tuple = ()
    # Measured rate tables ({dtype: [[smallest side or sequence length, TFLOP/s], ...]}, from `launcher
    # calibrate`): where present the model interpolates them (log-linear in the size, clamped at the ends)
    # instead of the saturation curve. On CPUs the rate is not a saturation curve at all: it falls again
    # once the operands leave the caches.
    gemm_table: dict = field(default_factory=dict)
    attention_table: dict = field(default_factory=dict)
    attention_head_dim: float = 128.0
    attention_table_by_head_dim: dict = field(default_factory=dict)
    zero3_module_s: float = 0.0
    zero3_param_s: float = 0.0
    zero3_module_step_s: float = 0.0
    zero3_param_step_s: float = 0.0
    zero3_recompute_param_s: float = 0.0
    engine_element_s: dict = field(default_factory=dict)
    engine_tensor_s: dict = field(default_factory=dict)
    engine_element_micro_s: dict = field(default_factory=dict)
    engine_tensor_micro_s: dict = field(default_factory=dict)
    # All-to-all (Ulysses) inside a node where measured apart from the all-reduce (gloo runs them by different
    # algorithms); None: the intra link.
    all_to_all: Optional[Link] = None
    # All-reduce inside a node for groups smaller than the node's ranks ({ranks: Link}), every group at once as TP
    # groups run (calibrate on more than 2 ranks a node); a group size not here takes the intra link. On 4 CPU
    # ranks sharing 2 cores a 4-rank all-reduce waits for all four to be scheduled: 6.1 ms of latency against
    # ~1 ms for two (bench/steptime/profile-4.yaml), and TP2 x PP2's TP groups are two.
    intra_groups: dict = field(default_factory=dict)
    # All-reduce across nodes for groups with several ranks on each node ({ranks a node: Link}), measured by
    # calibrate on two or more nodes (all of each node's ranks together: all_reduce_world_after_compute); one rank a
    # node is `inter`. Empty (the built-ins, one-node profiles): every group that spans nodes gets `inter` (inter_for).
    inter_groups: dict = field(default_factory=dict)
    nccl: Optional[NcclTuning] = None
    straggler: dict = field(default_factory=dict)
    # {group size: [[segment seconds, seconds], ...]}: a synchronisation's cost once its group's last rank arrived,
    # by the compute before it (calibrate's _release); {} where not measured (the built-ins)
    release: dict = field(default_factory=dict)
    # the same two measured with only compute_slots ranks busy (module docstring); {} where not measured
    straggler_unshared: dict = field(default_factory=dict)
    release_unshared: dict = field(default_factory=dict)
    framework_s: dict = field(default_factory=dict)
    host_s: dict = field(default_factory=dict)
    # {arch: {dtype: [forward, backward]}}: what a selectively checkpointed block (model.checkpoint_mode=selective)
    # adds per micro-batch beyond the terms above (module docstring); {} where not measured
    selective_framework_s: dict = field(default_factory=dict)
    selective_host_s: dict = field(default_factory=dict)

    def selective(self, arch: str, dtype: str) -> tuple[Optional[float], Optional[float]]:
        """(framework, host) seconds a selectively checkpointed block adds per micro-batch, forward and backward
        together, looked up as framework() is; None for either where the profile has not measured it."""
        framework, host = (_row(t, arch, dtype) for t in (self.selective_framework_s, self.selective_host_s))
        return (sum(framework) if framework else None), (sum(host) if host else None)

    def framework(self, arch: str, dtype: str) -> tuple[float, float, float]:
        """(block forward, block backward, model) seconds per micro-batch beyond the operator terms for `arch` in
        `dtype` (the llama family shares llama's; fp16 takes bf16's); zeros where the profile has none."""
        return _by_arch(self.framework_s, arch, dtype)

    def host(self, arch: str, dtype: str) -> tuple[float, float, float]:
        """(block forward, block backward, model) seconds the host takes to issue a micro-batch on a GPU, looked
        up as framework() is; zeros where the profile has none."""
        return _by_arch(self.host_s, arch, dtype)

    def intra_for(self, ranks: int) -> Link:
        """The intra-node link of a group of `ranks` ranks: its own measurement where calibrate took one, else intra."""
        return self.intra_groups.get(ranks, self.intra)

    def inter_for(self, per_node: int) -> Link:
        """The inter-node link of a collective group with `per_node` of its ranks on each of its nodes.

        NCCL builds a ring across nodes over the NICs of the ranks it holds on each node (one channel a NIC: "on an
        Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW", NCCL
        maintainers, NVIDIA/nccl#812), so such a group's bus bandwidth can grow with its ranks a node; the published
        runs disagree on whether it did (bench/published/results.md: FSDP on H100 nodes carried more than one NIC a
        GPU, DeepSpeed's 2021 ZeRO-3 about one). So only a measurement decides: where calibrate measured groups with
        several ranks a node (inter_groups), that measurement, linear in the ranks a node between the measured sizes
        (one rank a node: inter), the largest measured size's beyond them, the latency of the size at or below;
        without one (the built-ins, one-node profiles), `inter`, one NIC, for every group."""
        if per_node <= 1 or not self.inter_groups:
            return self.inter
        points = {1: self.inter, **self.inter_groups}
        if per_node in points:
            return points[per_node]
        lo = max(k for k in points if k <= per_node)
        hi = min((k for k in points if k > per_node), default=None)
        if hi is None:
            return points[lo]
        f = (per_node - lo) / (hi - lo)
        return Link(points[lo].latency_s, points[lo].bus_gbps + f * (points[hi].bus_gbps - points[lo].bus_gbps))

    def straggler_fraction(self, ranks: int, segment_s: float, unshared: bool = False) -> float:
        """The expected wait of a group of `ranks` ranks for its slowest one at a synchronisation, as a fraction
        of the `segment_s` seconds of compute before it: the measured group size nearest below (a larger group
        waits at least that long; above the largest measured, an under-charge), interpolated by segment length
        (log-linear, clamped at the ends); 0 for one rank or a profile without the measurement. `unshared`: as
        measured with only the compute slots' ranks busy, where the profile has that table."""
        return _by_group(self.straggler_unshared if unshared and self.straggler_unshared else self.straggler,
                         ranks, segment_s)

    def release_s(self, ranks: int, segment_s: float, unshared: bool = False) -> float:
        """What a synchronisation of `ranks` ranks costs once the last arrived, after `segment_s` seconds of compute
        (profile.release, read as straggler_fraction reads its table); 0 where not measured."""
        return _by_group(self.release_unshared if unshared and self.release_unshared else self.release,
                         ranks, segment_s)

    def gemm_table_for(self, dtype: str) -> Optional[list]:
        return _table(self.gemm_table, dtype)

    def attention_table_for(self, dtype: str, head_dim: Optional[float] = None) -> Optional[list]:
        """The attention rate table in `dtype` at `head_dim` ([(seq, FLOP/s)], or None where the profile has no
        table): the measured table where only one head dimension was measured or none is asked for; else the
        two nearest measured head dimensions (the nearest one outside their span), log-linear in the head
        dimension at every sequence length either table has."""
        tables = {float(self.attention_head_dim): _table(self.attention_table, dtype)}
        tables |= {float(hd): _table(t, dtype) for hd, t in self.attention_table_by_head_dim.items()}
        tables = {hd: t for hd, t in sorted(tables.items()) if t}
        if not tables:
            return None
        if head_dim is None or len(tables) == 1:
            return tables.get(float(self.attention_head_dim)) or next(iter(tables.values()))
        dims = list(tables)
        lo = max([x for x in dims if x <= head_dim] or dims[:1])
        hi = min([x for x in dims if x >= head_dim] or dims[-1:])
        if lo == hi:
            return tables[lo]
        f = (math.log(head_dim) - math.log(lo)) / (math.log(hi) - math.log(lo))
        seqs = sorted({x for x, _ in tables[lo]} | {x for x, _ in tables[hi]})
        return [(x, interpolate(tables[lo], x) + f * (interpolate(tables[hi], x) - interpolate(tables[lo], x)))
                for x in seqs]

    def engine_element(self, dtype: str, zero_stage: int) -> float:
        """Seconds per parameter element and step of DeepSpeed's engine at `zero_stage` in `dtype` (fp16 takes
        bf16's figure: the same 16-bit paths); 0 where the profile has none."""
        return _by_stage(self.engine_element_s, dtype, zero_stage)

    def engine_tensor(self, dtype: str, zero_stage: int) -> float:
        """Seconds per parameter tensor and step of DeepSpeed's engine at `zero_stage` in `dtype` (as
        engine_element); 0 where the profile has none."""
        return _by_stage(self.engine_tensor_s, dtype, zero_stage)

    def engine_split(self, dtype: str) -> bool:
        """Whether the engine's figures in `dtype` come split into a per-micro-batch part (engine_*_micro_s) and a
        per-step rest (fp16 as bf16)."""
        return any(self.engine_element_micro_s.get(d) for d in (dtype, "bf16" if dtype == "fp16" else None) if d)

    def engine_micro(self, dtype: str, zero_stage: int) -> tuple[float, float]:
        """(seconds per parameter element, per parameter tensor) of the engine's work every micro-batch; (0, 0)
        where not measured apart (engine_split)."""
        return (_by_stage(self.engine_element_micro_s, dtype, zero_stage),
                _by_stage(self.engine_tensor_micro_s, dtype, zero_stage))

    def gemm_rate(self, dtype: str) -> tuple[float, float]:
        """(plateau FLOP/s, half-rate dimension) of GEMMs in `dtype`."""
        return (_by_dtype(self.gemm_tflops, dtype, self.name, "gemm_tflops") * 1e12,
                _by_dtype(self.gemm_half_dim, dtype, self.name, "gemm_half_dim"))

    def probe_rates(self, dtype: str, width: float, ranks: int) -> dict:
        """What `launcher calibrate`'s GEMM probe and copy window should read now on each of `ranks` ranks of a node
        probing at once, by this profile (launcher/runtime/calibrate.py rates_now measures them): the GEMM at the
        side nearest `width` among those the profile's table measured (log distance; `width` itself where it has
        no table), in TFLOP/s, and the copy in GB/s. The rates here are one rank's alone (alone_rates), so with
        more ranks than compute slots each reads its slots / ranks share, as steptime stretches compute."""
        import math

        table = self.gemm_table_for(dtype)
        if table:
            side, rate = min(table, key=lambda row: abs(math.log(row[0] / width)))
        else:
            plateau, half = self.gemm_rate(dtype)
            side, rate = width, plateau * width / (width + half)
        share = min(1.0, self.compute_slots / ranks) if self.compute_slots else 1.0
        return {"gemm_side": int(side), "gemm_tflops": rate * share / 1e12, "memory_gbps": self.memory_gbps * share}

    def attention_rate(self, dtype: str) -> tuple[float, float]:
        """(plateau FLOP/s, half-rate sequence length) of causal attention in `dtype`."""
        return (_by_dtype(self.attention_tflops, dtype, self.name, "attention_tflops") * 1e12,
                _by_dtype(self.attention_half_seq, dtype, self.name, "attention_half_seq"))


def _by_dtype(table: dict, dtype: str, name: str, key: str) -> float:
    # fp32 training runs its matmuls in TF32 on Ampere and later (inputs.py _dtype_peak says why); a CPU
    # profile measures fp32 itself. bf16 and fp16 share the tensor-core rate.
    for d in (dtype, "tf32" if dtype == "fp32" else None, "bf16" if dtype == "fp16" else None, "fp16" if dtype == "bf16" else None, "any"):
        if d and d in table:
            return float(table[d])
    raise ConfigError("cluster.profile", name, f"profile {name} has no {key} for dtype {dtype} (it has {sorted(table)})",
                      f"re-run `launcher calibrate precision={dtype}` or pick a precision the profile measured")


def _table(tables: dict, dtype: str) -> Optional[list]:
    for d in (dtype, "tf32" if dtype == "fp32" else None, "bf16" if dtype == "fp16" else None):
        if d and tables.get(d):
            return sorted((float(x), float(r) * 1e12) for x, r in tables[d])
    return None


def _row(table: dict, arch: str, dtype: str) -> Optional[tuple]:
    """The row of an {arch: {dtype: row}} table for `arch` in `dtype`: the llama family shares llama's
    (launcher/config/supported.py LLAMA_FAMILY: the same transformers code path), fp16 takes bf16's; None where absent."""
    by_dtype = table.get(arch) or table.get("llama" if arch in LLAMA_FAMILY else arch) or {}
    for d in (dtype, "bf16" if dtype == "fp16" else None):
        if d and by_dtype.get(d):
            return tuple(float(x) for x in by_dtype[d])
    return None


def _by_arch(table: dict, arch: str, dtype: str) -> tuple[float, float, float]:
    """A [block forward, block backward, model] row (_row), zeros where the table has none."""
    return _row(table, arch, dtype) or (0.0, 0.0, 0.0)


def interpolate(table: list, x: float) -> float:
    """Rate at size x from a sorted [(size, rate)] table: log-linear between points, clamped outside."""
    import math

    if x <= table[0][0]:
        return table[0][1]
    for (x0, r0), (x1, r1) in zip(table, table[1:]):
        if x <= x1:
            f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return r0 + f * (r1 - r0)
    return table[-1][1]


# ---- Built-in profiles: every constant with its source. -------------------------------------------------------
#
# GEMM plateau: cuBLAS on large square bf16 GEMMs. A100: ~250-280 of 312 TFLOP/s (Anthony et al. 2024, "The Case
# for Co-Designing Model Architectures with Hardware", arXiv:2401.14489, fig. 3 and 5: GEMM throughput vs size on
# A100; NVIDIA "Matrix Multiplication Background User's Guide", Deep Learning Performance docs, fig. 2/3, same
# range). H100 SXM: ~ 700-760 of 989 TFLOP/s (Anthony et al. 2024, H100 figures; NVIDIA's cuBLAS 12 release
# blog "New cuBLAS 12.0 Features and Matrix Multiplication Performance on H100" shows ~ 750 at large sizes).
# We take 0.85 x peak on A100 and 0.75 x peak on H100/H200 (same Hopper compute).
# gemm_half_dim = 128: the same figures show a GEMM whose smallest dimension is 128 reaching about half the
# plateau and 1024+ within ~10% of it (tile quantization: a 128 x 256 CTA tile needs that many rows to fill
# the SMs; NVIDIA guide section "Tile quantization"). Read off the figures, not fitted to any training run.
# Attention: FlashAttention-2 (Dao 2023, arXiv:2307.08691), the bars of fig. 4(d) (A100 80GB SXM4) and fig. 7(d)
# (H100 80GB SXM5): forward + backward, causal mask, head dimension 128, TFLOP/s in causal FLOPs (half the
# square; the paper's benchmark counts 4 s^2 d heads / 2 x 3.5), read off the figures as printed above each bar
# (the same PNGs are in the flash-attention repository, assets/flash2_{a100,h100}_fwd_bwd_benchmark.png), by
# sequence length 512 ... 16k. The model interpolates them (log-linear, clamped at the ends: attention_table).
# They replace a saturation curve (plateau 190 / 335, half-rate at seq 256) that ran 28% / 37% above the bars at
# seq 512. A100 40GB uses the A100 80GB bars. Head dimension 64 runs 11-14% below these (fig. 4(c), 7(c)): below.
# tf32 (fp32 training) keeps the plateau / 2 curve below.
_FA2_A100 = [[512, 99], [1024, 133], [2048, 155], [4096, 173], [8192, 182], [16384, 189]]
_FA2_H100 = [[512, 163], [1024, 221], [2048, 265], [4096, 294], [8192, 308], [16384, 328]]
# Head dimension 64, the same benchmark's panel (c) (causal, head dimension 64, the same 2,048 hidden: 32 heads):
# 11% (A100) / 13% (H100) below the 128 bars at seq 2k, 13% / 14% at 16k (panel values read as printed; the
# repository's assets/flash2_{a100,h100}_fwd_bwd_benchmark.png). The plan reads a model's head dimension between
# the two (Profile.attention_table_for); H200 measured 128 only, so its table serves every head dimension.
_FA2_A100_HD64 = [[512, 88], [1024, 119], [2048, 140], [4096, 156], [8192, 165], [16384, 171]]
_FA2_H100_HD64 = [[512, 141], [1024, 192], [2048, 232], [4096, 257], [8192, 273], [16384, 284]]
# Memory bandwidth: datasheets (A100 40GB 1,555 GB/s, 80GB 2,039; H100 SXM 3,350; H200 4,800) x 0.85, the
# fraction BabelStream-style copy kernels reach on HBM (Deakin et al., BabelStream results on A100/H100:
# 85-92%); a stated round number.
# Kernel overhead: ~ 5 us per launch on an idle GPU (the CUDA launch latency NVIDIA quotes for
# cudaLaunchKernel, ~ 3-5 us; training loops without CUDA graphs see this per operator when the GPU runs
# ahead of nothing); used only where kernels are tiny.
# Links (NCCL bus bandwidth, nccl-tests all_reduce_perf at 1 GB): DGX A100 NVLink 3 ~ 230 GB/s of the 300 per
# direction; DGX H100 NVLink 4 ~ 360-480 (we take 360 without NVLS); inter-node HDR 200 Gb/s per GPU ~ 22 GB/s
# (A100), NDR 400 Gb/s ~ 45 GB/s (H100/H200), both ~ 90% of line rate (NVIDIA DGX SuperPOD reference
# architecture, nccl-tests figures). The bus bandwidth across nodes is one GPU's NIC even where a group has
# several GPUs on a node (NCCL's model and nccl-tests aggregate them: 192 GB/s all-reduce busbw on DGX A100,
# NCCL maintainers in NVIDIA/nccl#812; that did not fit the published runs, bench/published/results.md); a
# calibrated profile that measured a group with several GPUs a node across nodes charges that instead
# (Profile.inter_for).
# Latency of TP and data-parallel collectives: NCCL's own model for the group's ranks, nodes and message size
# (NcclTuning), which grows with the ring (8 ranks: 32 us a Simple all-gather; 512 ranks on 64 nodes: 2.4 ms).
# The fixed latencies below (~ 10 us inside a node, ~ 20 us across) are left for point-to-point sends and
# all-to-alls.

_NVLINK_LAT, _IB_LAT = 10e-6, 20e-6


def _gpu(name, peak_bf16, gemm_frac, attn, hbm_gbps, intra_bus, inter_bus, host_gb, note, attn_table,
         attn_table_hd64=None):
    return Profile(
        name=name,
        gemm_tflops={"bf16": peak_bf16 * gemm_frac, "fp16": peak_bf16 * gemm_frac, "tf32": peak_bf16 / 2 * gemm_frac},
        gemm_half_dim={"any": 128.0},
        attention_tflops={"bf16": attn, "fp16": attn, "tf32": attn / 2},
        attention_half_seq={"any": 256.0},
        attention_table={"bf16": attn_table, "fp16": attn_table}, attention_head_dim=128.0,
        attention_table_by_head_dim={64: {"bf16": attn_table_hd64, "fp16": attn_table_hd64}} if attn_table_hd64 else {},
        memory_gbps=hbm_gbps * 0.85,
        kernel_overhead_s=5e-6,
        intra=Link(_NVLINK_LAT, intra_bus),
        inter=Link(_IB_LAT, inter_bus),
        nccl=NcclTuning(),
        host_memory_gb=host_gb,
        source=f"built-in {name} profile (launcher/plan/profile.py): {note}",
    )


# H200: measured, not read off datasheets. `launcher calibrate` (its calls queued as a step queues them) on one
# NVIDIA H200 (141 GB, driver 580.159.04, torch 2.11.0+cu130, DeepSpeed 0.19.8; a Firecracker VM, 16 cores), twice
# on 2026-11-28 in different device sessions: bench/gpu/results/2026-11-28-h200{,-2}/profile-h200.yaml, the mean
# of the two files rounded to 3 digits (they differ by 0-8% a figure, 15% at the smallest GEMM side).
# GEMMs as autograd issues them (X W^T, dY W, dY^T X on 16,384 tokens) by the smallest side; "fp32" ran as TF32
# (calibrate sets allow_tf32, as training does); torch SDPA causal forward + backward by sequence length at 4
# sequences (cuDNN's flash kernel, as `launcher train` gets: bench/gpu checks.json), and past 4,096 at 32,768 tokens
# a call (bench/gpu/long_attention.py, the second session: 491 / 527 / 540 at 8k / 16k / 32k; its 4,096 read 445,
# calibrate's 432); a 256 MiB device copy (4.12 TB/s, 86% of the datasheet's 4.8); the device's gap between
# queued kernels (a CUDA-graph replay of 200 tiny kernels: 1.1 us); DeepSpeed's engine per parameter element and
# tensor by ZeRO stage; the host's issue time of the runtime's own models at near-zero compute, per block and
# per model (host_s: llama bf16 1.41 + 1.78 ms a block, 2.65 a model; the two sessions 1.35-1.47, 1.46-2.09,
# 2.39-2.91); ZeRO-3's hooks per module and per parameter tensor (the two calibrations split a Linear's 1.07-1.16 ms
# 0 / 1,074 and 1,164 / 0 us: the probe cannot tell the two apart on a GPU, where the 1B model's modules and
# tensors are as many; the 2026-11-26 calibration, timed one call per synchronisation, read 224 + 246 us).
# Links are not measured (one GPU): the H100's below. Against the 1B runs on H200s (bench/gpu/results.md, held
# by tests/plan/test_gpu_measured.py).
_H200_GEMM = {"bf16": [[256, 117.0], [512, 458], [1024, 629], [2048, 660], [4096, 656], [8192, 657]],
              "fp32": [[256, 101.0], [512, 202], [1024, 252], [2048, 284], [4096, 286], [8192, 317]]}
_H200_SDPA = {"bf16": [[256, 18.1], [512, 65.2], [1024, 222], [2048, 345], [4096, 432], [8192, 491], [16384, 527],
                       [32768, 540]],
              "fp32": [[256, 11.9], [512, 20.1], [1024, 27.7], [2048, 33.6], [4096, 37.4]]}
_H200_HOST = {"llama": {"bf16": [1.41e-3, 1.78e-3, 2.65e-3], "fp32": [1.39e-3, 1.98e-3, 2.43e-3]},
              "gpt": {"bf16": [0.573e-3, 0.944e-3, 2.08e-3], "fp32": [0.497e-3, 0.967e-3, 2.14e-3]},
              "bloom": {"bf16": [1.15e-3, 1.59e-3, 2.37e-3], "fp32": [0.908e-3, 1.48e-3, 2.21e-3]}}
# What the host does (the CPU's Python: issuing the model's kernels, DeepSpeed's per-tensor engine work, ZeRO-3's
# hooks), apart from what the device does (copy bandwidth, kernel gap, the engine's per-element work), because the
# A100 / H100 built-ins borrow the first half (below).
_H200_HOST_MEASURED = dict(zero3_module_s=582e-6, zero3_param_s=537e-6, host_s=_H200_HOST,
                           engine_tensor_s={"bf16": [231e-6, 392e-6, 303e-6, 0.0],
                                            "fp32": [54.3e-6, 177e-6, 205e-6, 0.0]})
_H200_MEASURED = dict(memory_gbps=4120.0, kernel_overhead_s=1.1e-6,
                      engine_element_s={"bf16": [9.54e-12, 1.06e-11, 3.25e-11, 6.97e-12],
                                        "fp32": [4.73e-12, 1.92e-11, 1.49e-12, 3.83e-11]},
                      **_H200_HOST_MEASURED)


def _measured_h200() -> Profile:
    from dataclasses import replace

    base = _gpu("h200", 989.4, 0.75, 335.0, 4800.0, 360.0, 45.0, 2000.0, "", _FA2_H100)
    return replace(base, gemm_table={**_H200_GEMM, "fp16": _H200_GEMM["bf16"]},
                   attention_table={**_H200_SDPA, "fp16": _H200_SDPA["bf16"]}, **_H200_MEASURED,
                   source="built-in h200 profile (launcher/plan/profile.py): measured by `launcher calibrate` on one "
                          "H200, 2026-11-28 (bench/gpu/results/2026-11-28-h200*); links from H100 benchmarks")


# A100 / H100: the device from datasheets and cited benchmarks, the host from the H200's calibrations. The host's
# terms time the CPU running our runtime's Python (transformers' modules, DeepSpeed's engine and ZeRO-3 hooks), which
# does not depend on the GPU under it; no A100 or H100 host has been calibrated. Held out of sample by the three 1B
# runs on one H100 (2026-11-27, bench/gpu/results/2026-11-27-h100, a different VM; nothing of theirs went into the
# H200 figures): planned / measured 0.88 / 0.73 / 0.49 (base, micro-batch 2, ZeRO-3) without them, 1.06 / 0.87 /
# 1.17 with them (tests/plan/test_gpu_measured.py). Where a node's CPU is slower or faster than that VM's 16 cores,
# `launcher calibrate` on it measures its own.
def _datasheet_gpu(*args) -> Profile:
    from dataclasses import replace

    base = _gpu(*args)
    return replace(base, **_H200_HOST_MEASURED,
                   source=base.source + "; host (Python issue, engine per tensor, ZeRO-3 hooks) measured on an H200 "
                                        "node (bench/gpu/results/2026-11-28-h200*)")


BUILTIN: dict[str, Profile] = {
    "a100-40gb": _datasheet_gpu("a100-40gb", 312.0, 0.85, 190.0, 1555.0, 230.0, 22.0, 1000.0,
                                "A100 SXM4 40GB datasheet + cited benchmarks", _FA2_A100, _FA2_A100_HD64),
    "a100-80gb": _datasheet_gpu("a100-80gb", 312.0, 0.85, 190.0, 2039.0, 230.0, 22.0, 2000.0,
                                "A100 SXM4 80GB datasheet + cited benchmarks", _FA2_A100, _FA2_A100_HD64),
    "h100-80gb": _datasheet_gpu("h100-80gb", 989.4, 0.75, 335.0, 3350.0, 360.0, 45.0, 2000.0,
                                "H100 SXM5 datasheet + cited benchmarks", _FA2_H100, _FA2_H100_HD64),
    "h200": _measured_h200(),
}


def generic_profile(name: str, peak_tflops: float, intra_gbps: float, inter_gbps: float) -> Profile:
    """A GPU outside the catalog, from the user's cluster.* numbers: H100's ratios (GEMM 0.75 x peak, attention
    0.34 x peak, 2.9 bytes of memory bandwidth per 1,000 FLOPs) stand in for what we do not know."""
    return Profile(
        name=name, gemm_tflops={"any": peak_tflops * 0.75}, gemm_half_dim={"any": 128.0},
        attention_tflops={"any": peak_tflops * 335.0 / 989.4}, attention_half_seq={"any": 256.0},
        memory_gbps=peak_tflops * 3350.0 * 0.85 / 989.4, kernel_overhead_s=5e-6,
        intra=Link(_NVLINK_LAT, intra_gbps * 0.8), inter=Link(_IB_LAT, inter_gbps * 0.9), nccl=NcclTuning(),
        source=f"{name}: H100 ratios applied to cluster.peak_tflops / intra_node_gbps / inter_node_gbps "
               "(launcher/plan/profile.py generic_profile); run `launcher calibrate` for measured rates")


def _scaled_tables(tables: dict, f: float) -> dict:
    """{dtype: [[size, rate], ...]} with every rate times f (the measured tables scaled() and alone_rates() move)."""
    return {d: [[x, r * f] for x, r in rows] for d, rows in tables.items()}


def nics_added(p: Profile, gpus_per_node: int) -> Profile:
    """The profile with a group's NICs added up across nodes where it measured nothing there (no inter_groups):
    a group with k ranks on each node gets k x the one-NIC bus bandwidth, up to the node's own link (NCCL's rings
    take one channel a NIC: "on an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s
    AllReduce BusBW", NVIDIA/nccl#812). The other end of what the published runs span (Profile.inter_for says why
    the plan does not assume it); `launcher plan` reports the step time under it beside its own. A profile that
    measured its groups across nodes, or a one-GPU node, is returned as it is."""
    from dataclasses import replace

    if p.inter_groups or gpus_per_node <= 1:
        return p
    bus = min(gpus_per_node * p.inter.bus_gbps, max(p.inter.bus_gbps, p.intra.bus_gbps))
    return replace(p, inter_groups={gpus_per_node: Link(p.inter.latency_s, bus)})


def scaled(p: Profile, compute: float = 1.0, intra_gbps: Optional[float] = None, inter_gbps: Optional[float] = None,
           memory: float = 1.0) -> Profile:
    """The profile with its compute rates (GEMM and attention) times `compute` (cluster.peak_tflops over the catalog
    peak; a run's GEMM rate read now over the profile's, launcher/runtime/metrics.py), its memory bandwidth times
    `memory`, and the links' bandwidth replaced by cluster.intra_node_gbps / inter_node_gbps where the user gives
    them (0.8 / 0.9 of the per-direction figure reach the bus, as for the built-ins)."""
    from dataclasses import replace

    return replace(
        p, memory_gbps=p.memory_gbps * memory, gemm_tflops={k: v * compute for k, v in p.gemm_tflops.items()},
        attention_tflops={k: v * compute for k, v in p.attention_tflops.items()},
        attention_table=_scaled_tables(p.attention_table, compute), gemm_table=_scaled_tables(p.gemm_table, compute),
        attention_table_by_head_dim={hd: _scaled_tables(by, compute) for hd, by in p.attention_table_by_head_dim.items()},
        intra=p.intra if intra_gbps is None else Link(p.intra.latency_s, intra_gbps * 0.8),
        inter=p.inter if inter_gbps is None else Link(p.inter.latency_s, inter_gbps * 0.9),
        inter_groups=p.inter_groups if inter_gbps is None else {})     # the user's figure stands for every group


# ---- YAML files written by `launcher calibrate`. -----------------------------------------------------------------

_REQUIRED = ("name", "gemm_tflops", "gemm_half_dim", "attention_tflops", "attention_half_seq", "memory_gbps",
             "kernel_overhead_s", "intra", "inter")


def _by_stage(table: dict, dtype: str, zero_stage: int) -> float:
    """table[dtype][zero_stage], fp16 taking bf16's row (the same 16-bit paths); 0 without a row."""
    for d in (dtype, "bf16" if dtype == "fp16" else None):
        if d and table.get(d):
            return float(table[d][zero_stage])
    return 0.0


def _by_group(table: dict, ranks: int, segment_s: float) -> float:
    """A {group size: [[segment seconds, value], ...]} table at `ranks` and `segment_s`: the measured group size
    nearest below (the smallest where none is), interpolated by segment length (log-linear, clamped at the ends);
    0 for one rank or an empty table."""
    if ranks <= 1 or not table or segment_s <= 0:
        return 0.0
    sizes = sorted(table)
    g = max([x for x in sizes if x <= ranks] or sizes[:1])
    return interpolate(sorted((float(t), float(v)) for t, v in table[g]), segment_s)


def profile_to_dict(p: Profile, measured: Optional[dict] = None) -> dict:
    """The YAML document of a profile: version first, the fitted rates, then the raw measurements."""
    out = {"version": PROFILE_VERSION, **asdict(p)}
    del out["noisy"]    # read from the measurements' sweep_spread when loaded, not a field of the file
    if measured:
        out["measurements"] = measured
    return out


@functools.lru_cache(maxsize=8)
def _parse_profile(text: str):
    """A profile file's YAML, parsed once per content: one `launcher plan` reads cluster.profile for the hardware and
    again for each host-memory check (~30 ms a parse of a calibrated file). Keyed by the text, not the path, so a
    rewritten file is parsed again; load_profile reads the document without changing it."""
    import yaml

    return yaml.safe_load(text)


# The profile's {arch: {dtype: [seconds, ...]}} tables (framework, host issue, selective checkpointing's) and what
# each row's entries are.
ARCH_TABLES = {"framework_s": ("block forward", "block backward", "model"),
               "host_s": ("block forward", "block backward", "model"),
               "selective_framework_s": ("block forward", "block backward"),
               "selective_host_s": ("block forward", "block backward")}


def _arch_table(table: Optional[dict], divisor: float = 1.0) -> dict:
    """An {arch: {dtype: [seconds, ...]}} table with str keys and float entries, each / `divisor`; {} for None."""
    return {str(a): {str(d): [float(x) / divisor for x in v] for d, v in by_dtype.items()}
            for a, by_dtype in (table or {}).items()}


def _group_links(table: Optional[dict]) -> dict:
    """A profile file's {group size: {latency_s, bus_gbps}} table (intra_groups, inter_groups) as {int: Link}."""
    return {int(g): Link(float(v["latency_s"]), float(v["bus_gbps"])) for g, v in (table or {}).items()}


def load_profile(path: str) -> Profile:
    """Read and validate a profile written by `launcher calibrate`; ConfigError on cluster.profile otherwise."""
    import yaml

    key = "cluster.profile"
    fix = "run `launcher calibrate cluster=... --out PATH` and pass that PATH"
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(key, path, f"no profile file at {p.resolve()}", fix)
    try:
        doc = _parse_profile(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as err:
        raise ConfigError(key, path, f"is not a readable YAML profile ({type(err).__name__}: {str(err)[:200]})", fix)
    if not isinstance(doc, dict):
        raise ConfigError(key, path, "is not a YAML mapping (a profile is one)", fix)
    version = doc.get("version")
    if version != PROFILE_VERSION:
        raise ConfigError(key, path, f"has profile version {version!r}; this launcher reads version {PROFILE_VERSION}",
                          "re-run `launcher calibrate` with this launcher to write a current profile")
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        raise ConfigError(key, path, f"lacks {', '.join(missing)} (a version-{PROFILE_VERSION} profile has {', '.join(_REQUIRED)})", fix)
    try:
        prof = Profile(
            name=str(doc["name"]), gemm_tflops={str(k): float(v) for k, v in doc["gemm_tflops"].items()},
            gemm_half_dim={str(k): float(v) for k, v in doc["gemm_half_dim"].items()},
            attention_tflops={str(k): float(v) for k, v in doc["attention_tflops"].items()},
            attention_half_seq={str(k): float(v) for k, v in doc["attention_half_seq"].items()}, memory_gbps=float(doc["memory_gbps"]),
            kernel_overhead_s=float(doc["kernel_overhead_s"]),
            intra=Link(float(doc["intra"]["latency_s"]), float(doc["intra"]["bus_gbps"])),
            inter=Link(float(doc["inter"]["latency_s"]), float(doc["inter"]["bus_gbps"])),
            host_memory_gb=None if doc.get("host_memory_gb") is None else float(doc["host_memory_gb"]),
            compute_slots=None if doc.get("compute_slots") is None else int(doc["compute_slots"]),
            process_bytes=None if doc.get("process_bytes") is None else float(doc["process_bytes"]),
            gemm_table={str(k): [[float(a), float(b)] for a, b in v] for k, v in (doc.get("gemm_table") or {}).items()},
            attention_table={str(k): [[float(a), float(b)] for a, b in v] for k, v in (doc.get("attention_table") or {}).items()},
            attention_head_dim=float(doc.get("attention_head_dim") or 128.0),
            attention_table_by_head_dim={int(hd): {str(k): [[float(a), float(b)] for a, b in v] for k, v in by.items()}
                                         for hd, by in (doc.get("attention_table_by_head_dim") or {}).items()},
            zero3_module_s=float(doc.get("zero3_module_s") or 0.0),
            zero3_param_s=float(doc.get("zero3_param_s") or 0.0),
            zero3_module_step_s=float(doc.get("zero3_module_step_s") or 0.0),
            zero3_param_step_s=float(doc.get("zero3_param_step_s") or 0.0),
            zero3_recompute_param_s=float(doc.get("zero3_recompute_param_s") or 0.0),
            engine_element_s={str(k): [float(x) for x in v] for k, v in (doc.get("engine_element_s") or {}).items()},
            engine_tensor_s={str(k): [float(x) for x in v] for k, v in (doc.get("engine_tensor_s") or {}).items()},
            engine_element_micro_s={str(k): [float(x) for x in v]
                                    for k, v in (doc.get("engine_element_micro_s") or {}).items()},
            engine_tensor_micro_s={str(k): [float(x) for x in v]
                                   for k, v in (doc.get("engine_tensor_micro_s") or {}).items()},
            all_to_all=(Link(float(doc["all_to_all"]["latency_s"]), float(doc["all_to_all"]["bus_gbps"]))
                        if doc.get("all_to_all") else None),
            intra_groups=_group_links(doc.get("intra_groups")), inter_groups=_group_links(doc.get("inter_groups")),
            nccl=(NcclTuning(**{str(k): float(v) for k, v in doc["nccl"].items()})
                  if doc.get("nccl") is not None else None),
            straggler={int(g): [[float(t), float(f)] for t, f in rows]
                       for g, rows in (doc.get("straggler") or {}).items()},
            release={int(g): [[float(t), float(c)] for t, c in rows] for g, rows in (doc.get("release") or {}).items()},
            straggler_unshared={int(g): [[float(t), float(f)] for t, f in rows]
                                for g, rows in (doc.get("straggler_unshared") or {}).items()},
            release_unshared={int(g): [[float(t), float(c)] for t, c in rows]
                              for g, rows in (doc.get("release_unshared") or {}).items()},
            **{name: _arch_table(doc.get(name)) for name in ARCH_TABLES},
            source=f"{p} ({doc.get('source', 'launcher calibrate')})")
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise ConfigError(key, path, f"has a malformed field ({type(err).__name__}: {err})", fix)
    measured = doc.get("measurements") or {}
    prof = alone_rates(prof, measured.get("local_world", measured.get("world")))
    prof = replace(prof, noisy=tuple(noisy_sweeps(measured.get("sweep_spread") or {})))
    rates = [*prof.gemm_tflops.values(), *prof.attention_tflops.values(), prof.memory_gbps, prof.intra.bus_gbps,
             prof.inter.bus_gbps, *(link.bus_gbps for link in (*prof.intra_groups.values(), *prof.inter_groups.values()))]
    for name, what in (("straggler", "fraction"), ("release", "seconds"), ("straggler_unshared", "fraction"),
                       ("release_unshared", "seconds")):
        if any(g < 2 or not rows or any(t <= 0 or v < 0 for t, v in rows) for g, rows in getattr(prof, name).items()):
            raise ConfigError(key, path, f"has a {name} table that is not [[segment seconds > 0, {what} >= 0], ...] "
                              "per group size >= 2", fix)
    for name, table in (("engine_element_s", prof.engine_element_s), ("engine_tensor_s", prof.engine_tensor_s),
                        ("engine_element_micro_s", prof.engine_element_micro_s),
                        ("engine_tensor_micro_s", prof.engine_tensor_micro_s)):
        if any(len(v) != 4 or any(x < 0 for x in v) for v in table.values()):
            raise ConfigError(key, path, f"has an {name} that is not 4 non-negative seconds (ZeRO stages 0-3) "
                              "per dtype", fix)
    for name, parts in ARCH_TABLES.items():
        if any(len(v) != len(parts) or any(x < 0 for x in v) for by_dtype in getattr(prof, name).values()
               for v in by_dtype.values()):
            raise ConfigError(key, path, f"has a {name} that is not {len(parts)} non-negative seconds "
                              f"({', '.join(parts)}) per architecture and dtype", fix)
    if not prof.gemm_tflops or not prof.attention_tflops or any(not (r > 0) for r in rates) \
            or any(v < 0 for v in (*prof.gemm_half_dim.values(), *prof.attention_half_seq.values())):
        raise ConfigError(key, path, "has a rate that is not positive (every TFLOP/s and GB/s must be > 0)", fix)
    return prof


# Sweeps whose figures differ by more than this (max / min) make calibrate say the machine was busy: the profile takes
# each item's median, which drops one disturbed sweep of three, not a disturbance that lasts through two of them.
# On this 2-core VM, calibrations minutes apart read the 64 MiB copy at 10.6-43 GB/s while recipe=tiny's steps
# moved a few percent (bench/steptime/results.md); a GEMM rate moved 2x when another process landed on a sweep.
NOISY_SWEEPS = 1.5


def noisy_sweeps(spread: dict) -> list[str]:
    """One line per figure whose sweeps differ by more than NOISY_SWEEPS (max / min), naming its values."""
    lines = []
    for name, values in spread.items():
        lo, hi = min(values), max(values)
        if lo > 0 and hi / lo > NOISY_SWEEPS:
            shown = ", ".join(f"{v:.3g}" for v in values)
            lines.append(f"{name} read {shown} in the {len(values)} sweeps ({hi / lo:.1f}x apart; the profile takes "
                         f"the median, {statistics.median(values):.3g})")
    return lines


def alone_rates(prof: Profile, measured_ranks) -> Profile:
    """The profile's compute rates as one rank computing alone on its compute slot.

    `launcher calibrate` times its GEMMs, attention, copies, operator chains, ZeRO-3 hooks and engine costs on every
    local rank at once (launcher/runtime/calibrate.py), so with more ranks than compute slots (4 CPU ranks on 2 cores) each rank
    had a slots/ranks share of a core and measured that share of its alone rate. The step-time model stretches
    compute by ranks / slots itself (steptime._compute_stretch), so the share is taken back out here: rates
    x ranks / slots, per-operation times / (ranks / slots). Without this a 4-rank profile planned a 4-rank layout
    twice too slow (bench/parallel/results.md, the CP4 row). Collectives and the straggler fractions are left as
    measured: their cost under sharing is what a step meets. `measured_ranks`: the ranks a node of the profile's
    measurements (local_world; world for a one-node profile that predates it); None (a profile written by hand or
    a GPU profile): as written."""
    from dataclasses import replace

    slots = prof.compute_slots
    if not slots or not measured_ranks or int(measured_ranks) <= slots:
        return prof
    f = int(measured_ranks) / slots
    table = functools.partial(_scaled_tables, f=f)
    return replace(prof, gemm_tflops={d: r * f for d, r in prof.gemm_tflops.items()},
                   attention_tflops={d: r * f for d, r in prof.attention_tflops.items()},
                   gemm_table=table(prof.gemm_table), attention_table=table(prof.attention_table),
                   attention_table_by_head_dim={hd: table(by) for hd, by in prof.attention_table_by_head_dim.items()},
                   memory_gbps=prof.memory_gbps * f, kernel_overhead_s=prof.kernel_overhead_s / f,
                   zero3_module_s=prof.zero3_module_s / f, zero3_param_s=prof.zero3_param_s / f,
                   zero3_module_step_s=prof.zero3_module_step_s / f, zero3_param_step_s=prof.zero3_param_step_s / f,
                   zero3_recompute_param_s=prof.zero3_recompute_param_s / f,
                   engine_element_s={d: [x / f for x in v] for d, v in prof.engine_element_s.items()},
                   engine_tensor_s={d: [x / f for x in v] for d, v in prof.engine_tensor_s.items()},
                   engine_element_micro_s={d: [x / f for x in v] for d, v in prof.engine_element_micro_s.items()},
                   engine_tensor_micro_s={d: [x / f for x in v] for d, v in prof.engine_tensor_micro_s.items()},
                   framework_s=_arch_table(prof.framework_s, f),
                   selective_framework_s=_arch_table(prof.selective_framework_s, f))
