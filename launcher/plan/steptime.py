"""Per-operator step time: every operator of one micro-batch on one rank of each pipeline stage (no torch).

The one step-time formula of the planner (`launcher plan`, `--search`, and the prediction `launcher train`
records beside its measured step). Rates come from a hardware profile (launcher/plan/profile.py: the
built-in, cited A100/H100/H200 ones, or a file `launcher calibrate` measured).

One micro-batch on one rank (n = b s / sp tokens outside attention; t = TP, sp = Ulysses degree):

    GEMM (M, N, K)          time = max(2MNK / (plateau x d / (d + d_half)), (MK + KN + MN) w / BW) + overhead
                            d = min(M, N, K): a skinny GEMM (few tokens, a thin TP shard) fills fewer tiles
                            (NVIDIA "Matrix Multiplication Background", tile and wave quantization); the max()
                            is the roofline (Williams et al. 2009) in the GEMM's arithmetic intensity.
                            Each forward GEMM X[M,K] W[K,N] has two backward GEMMs of the same FLOPs: the
                            input gradient dY[M,N] W^T (M, K, N) and the weight gradient X^T dY (K, N, M),
                            contracting over the tokens.
    attention (fused)       causal FLOPs: forward 4 b s^2 (a / (t sp)) d / 2 (QK^T and PV, half the square),
                            backward 2.5 x forward (FlashAttention-2, Dao 2023, section 3.1: five matmuls
                            against two); rate by sequence length from the profile's attention table (built-in
                            GPUs: the FA2 paper's fig. 4(d)/7(d) bars; short sequences leave the tiles idle), or
                            plateau x s / (s + s_half) without one. BLOOM's eager ALiBi attention is two batched GEMMs and an
                            fp32 softmax over the b a s^2 scores instead.
    element-wise operators  norms, activations, residual adds, rotary, softmax, loss, embedding lookup and
                            its gradient: bytes read + written / memory bandwidth + one overhead per kernel;
                            backward moves twice the forward bytes (reads the saved input and the incoming
                            gradient, writes the outgoing one), except where the runtime's own operators were
                            counted per pass (BLOOM's q/k/v copies, masked fp32 softmax and custom-backward GELU;
                            the loss): bench/steptime/elementwise_bytes.py holds every block and end to them.
    TP (Megatron)           our TP layers (launcher/parallel/tensor.py; with a pipeline and at pipeline_degree
                            = 1 alike, launcher/parallel/tensor_model.py): per block 2 all-reduces of n h w
                            forward (g after each row-parallel linear) and 2 backward (f before each
                            column-parallel group) (Shoeybi et al. 2019, fig. 3), + 2 with full recompute. The
                            ends are vocab-parallel (Shoeybi et al. 2019, section 3; Megatron-LM's
                            VocabParallelEmbedding, ColumnParallelLinear(parallel_output=True) head and
                            vocab_parallel_cross_entropy): a rank looks up its V/t rows and all-reduces the
                            embedding (n h w forward), runs the head GEMMs on V/t columns with Megatron's f in
                            front (all-reduce of its input gradient, n h w, backward), and the loss on its fp32
                            (n, V/t) logits with three all-reduces of one fp32 value a token forward.
                            all-reduce of B bytes over r ranks: latency + 2 (r - 1)/r B / bus bandwidth (ring;
                            NCCL-tests' busbw). A TP or data-parallel collective costs what NCCL's own model
                            says for the group's ranks, nodes and message (profile.NcclTuning, the built-in
                            GPUs: latency grows with the ring, 32 us for an 8-rank Simple all-gather, 2.4 ms
                            for 512 ranks on 64 nodes; the cheapest of ring LL / LL128 / Simple and, for an
                            all-reduce, tree), else the link's measured latency (a calibrated profile, at its
                            own world size).
    TP + Megatron SP        (parallel.sequence_parallel; Korthikanti et al. 2022, section 4.2.2; our TP layers,
                            with or without a pipeline) each all-reduce becomes an all-gather
                            and a reduce-scatter of the same tensor: the same ring bytes at twice the
                            latency; the norms and residual adds run on n / t tokens, and each norm
                            parameter's gradient is all-reduced over the TP group every micro-batch (one call
                            a parameter, as launcher/parallel/tensor.py's hooks issue them); at the ends the
                            embedding's output is reduce-scattered to the sequence (its gradient all-gathered)
                            and the head's input all-gathered (its gradient reduce-scattered). On 2 CPU ranks
                            (gloo, ~0.7 ms a call) those extra calls are a third of a recipe=tiny TP2 step.
    Ulysses SP              4 all-to-alls (q, k, v, output) forward and 4 backward per block, (sp-1)/sp of
                            each tensor crosses the link (Jacobs et al. 2023, section 3.1); under grouped-query
                            attention k and v cross with their kv heads when sp divides kv, else repeated to all
                            a heads first (launcher/parallel/sequence.py). DeepSpeed copies each exchanged
                            tensor twice (permute + contiguous, before and after): 16 copies a block, plus the
                            k, v repeat under GQA.
    ring CP (c ranks)       a rank holds n = b s / c tokens; its causal attention is 1/c of the sequence's
                            (head-tail chunks balance it), charged at the whole sequence's rate. K/V go round the
                            ring as torch's kernel moves them (launcher/parallel/context.py): forward one
                            all-gather of every rank's K/V (k, v repeated to a heads, n a d w each: (c-1) x 2 n a d
                            w bytes in), backward that all-gather again plus c rotations of the fp32 dK/dV
                            accumulators (2 n a d x 4 bytes each, latency each). Both overlap the ring's block
                            kernels (the exchange is issued before the block that does not need it): only the
                            excess over the attention time of the same pass is charged, as sp_comm.
    recompute (full)        the forward of every checkpointed block again before its backward (all of them, or the
                            first model.checkpoint_blocks of each stage: memory.checkpointed_in_stage).
    recompute (selective)   the same blocks' element-wise operators again (the forward's memory-bound term), with
                            the forward's Python and kernel issue (framework, host): the module code runs whole
                            again, its GEMMs and attention answered from the cache (launcher/runtime/recompute.py).
                            No GEMM or attention time, no TP / SP collectives (it runs without them); ZeRO-3's
                            re-gathers as under full recompute (the modules' hooks fire again). Plus what torch's
                            dispatch mode costs, in the forward over every operator of the block and again in the
                            recompute (profile.selective_framework_s, CPU ranks; selective_host_s as issue time on
                            a GPU, in place of the forward's): measured by `launcher calibrate`'s framework probe
                            with selective checkpointing on (selective_residual); recipe=tiny on one CPU process
                            2026-12-02: the mode took the forward from 38.8 to 43.3 ms for 4 blocks and the step
                            from 115 to 134 ms, full recompute's 140 (bench/steptime/selective_overhead.py).
    PP 1F1B                 stage s takes T_s per micro-batch (its blocks, plus the embedding on the first
                            stage and the final norm, head and loss on the last, plus its point-to-point
                            sends/receives, over the inter-node link unless the whole pipeline group fits in a
                            node: stages are t x sp x dp ranks apart); a step is  sum_s T_s + (m - 1) max_s T_s :
                            fill and drain cross every stage once, the steady state goes at the slowest stage
                            (Narayanan et al. 2021, section 2.2; with equal stages this is (m + p - 1) T, bubble
                            (p-1)/m).
    DP / ZeRO (r = dp x sp) ZeRO 0/1: gradients all-reduced once per step after the last backward; ZeRO 2:
                            all-reduced in every micro-batch's backward. ZeRO 1/2 partition the optimizer
                            state, yet DeepSpeed 0.19.8 reduces each gradient bucket with an all-reduce of the
                            whole bucket and keeps its own partition's slice (stage_1_and_2.py average_tensor:
                            with zero_optimization.use_multi_rank_bucket_allreduce, true by default and in
                            deepspeed_config.py, every slice goes to allreduce_and_scatter -> allreduce_bucket),
                            2 (r-1)/r x bytes a rank on the ring, not a reduce-scatter's (r-1)/r (DP2 ZeRO-1
                            and ZeRO-2, recipe=tiny, 2 CPU ranks: one 5,313,024-byte all_reduce a step,
                            bench/steptime/breakdown.py STEPPROF_COLL). ZeRO 1/2 then all-gather the updated
                            weights; ZeRO 3: per micro-batch all-gather forward,
                            all-gather backward and reduce-scatter (all-reduce under SP, deepspeed_config.py
                            says why) (Rajbhandari et al. 2020, section 7), the gathers as DeepSpeed's
                            parameter coordinator issues them (a fetch or a prefetch walk one call, each
                            paying the link latency; the backward re-gathers only what the forward released:
                            memory.zero3_gathered replays it, held call for call to DeepSpeed on CPU ranks).
                            Under recompute the replay's trace has each checkpointed block's forward again
                            before its backward, so the backward gathers what the forward released for the
                            recompute, and once more for its own backward what DeepSpeed released in between
                            (the modules followed in the block by >= parallel.zero3_max_reuse_distance
                            parameters). With overlap_comm (on for GPUs in
                            our DeepSpeed config) the traffic of a micro-batch hides behind its backward (ZeRO
                            3: its forward + backward, prefetched) and only the excess is exposed; the pipeline
                            engine and ZeRO 0 reduce after the flush, exposed; on CPU ranks (overlap_comm off)
                            everything is exposed. ZeRO-3 also runs Python hooks on every module, forward and
                            backward: modules x the profile's measured zero3_module_s + parameter tensors x
                            its zero3_param_s per micro-batch, and the part that comes once a step (the
                            boundary's partitioned optimizer step: zero3_module_step_s, zero3_param_step_s) once;
                            a checkpointed block's recompute runs its modules' forward hooks again: its parameter
                            tensors x the profile's measured zero3_recompute_param_s (0 in the built-ins).
                            On 2 CPU ranks most of it is the step's: calibrate's probe paid ~1.05 ms a parameter
                            tensor a step and ~0.11 a micro-batch (bench/steptime/results.md).
    DeepSpeed's engine      its own work per parameter element beyond a plain forward + backward + optimizer
                            step (gradients flattened into buckets and copied, fp32 partitions, the clipping
                            norm, ZeRO-3's flat gather buffers): the rank's parameters (TP-sharded, before ZeRO)
                            x the profile's engine_element_s for the run's dtype and ZeRO stage, which `launcher
                            calibrate` measures per step with no collective in it (the traffic is the DP / ZeRO
                            term above), at 1 and 3 micro-batches a step: the part every micro-batch pays
                            (engine_element_micro_s) is charged every micro-batch, the rest once a step. A profile
                            without the split charges ZeRO 2 and 3 all of it every micro-batch (they reduce in
                            every backward; an over-charge of the step's part when m > 1) and ZeRO 0 and 1 once a
                            step (they reduce after the last backward; an under-charge of what each backward pays). The
                            part over the 1/r partition is charged over the whole rank's parameters (the probe
                            runs at r = 1), an over-charge at r > 1. On a 2-core CPU box: 0.6-2 (ZeRO-0), 10-15
                            (ZeRO-1, 2), 4-12 (ZeRO-3) ns per fp32 element, 7-17 ms a step for recipe=tiny at
                            ZeRO 1-3 (bench/steptime/results.md); 0 in the built-in A100 / H100 profiles (device
                            work, not measured there; the H200's is). Plus its work per parameter tensor, whatever
                            the size (per-tensor gradient hooks and bucket bookkeeping): the stage's parameter
                            tensors x engine_tensor_s, charged as the per-element part (ZeRO-3's is
                            zero3_param_s); host work, so the A100 / H100 built-ins take the H200 node's. On
                            the 2-core box, fp32, 0.09 (ZeRO-0), 0.26 (ZeRO-1) and 0.19 (ZeRO-2) ms a tensor;
                            the ZeRO-2 figure is what recipe=tiny's near-zero-width model paid per extra
                            micro-batch over ZeRO-0 (39 tensors, +5.9 ms: 0.15 ms a tensor,
                            bench/steptime/results.md).
    framework               what a micro-batch pays beyond its operators' arithmetic and the per-kernel cost the
                            terms above count: PyTorch dispatch and autograd for every view, reshape, cast and
                            small op, and the transformers modules' Python (recipe=tiny's 4 blocks run ~2,400
                            operators a micro-batch; the terms count ~250 kernels). Measured by `launcher
                            calibrate` per architecture and dtype on the runtime's own model classes at near-zero
                            compute (FRAMEWORK_PROBE), less what these terms charge for that model
                            (framework_residual): per block forward and backward, and per model, charged every
                            micro-batch (the block forward again under full recompute). On a 2-core CPU box 2.7-3.1
                            ms a llama block and 2.5-3.2 ms a model, forward + backward (bench/steptime/results.md); 0
                            on a GPU, where the Python runs ahead of the kernels (the host floor instead).
    host floor (GPU)        the host issues a micro-batch's kernels ahead of the device, so its Python costs
                            nothing until it takes longer than those kernels; then the device waits for it. A
                            stage's micro-batch takes max(its compute, the host's issue time), the latter the same
                            probe's times kept whole (profile.host_s: per block forward and backward, the forward
                            again under full recompute, and per model, half on each end stage: Cost.host). On
                            one H200 2.9-3.4 ms a llama block and 2.4-2.9 ms a model: the ~1B LLaMA at micro-batch
                            1 is host-bound (bench/gpu/results.md). It does not count what DeepSpeed's engine and
                            the training loop issue per micro-batch. The A100 / H100 built-ins take the H200
                            node's host_s (the CPU's speed, not the GPU's).
    stragglers              every rank computes the same segment between two synchronisations of its group, yet
                            not in the same time (other processes, the shared memory bus, a rank's own jitter):
                            the group waits for its slowest rank. Per micro-batch a stage meets its TP
                            collectives (4 a block, 6 with full recompute), Ulysses all-to-alls (8 a block, 12),
                            ring CP exchanges (2 + c a block, 3 + c), ZeRO-3 gathers (the replay's calls, plus
                            the re-gathers under recompute, plus the gradient reduce), ZeRO-2's gradient reduce
                            and its pipeline sends (2 a neighbour); the wait is the profile's measured straggler
                            fraction at the mean segment (the stage's compute over those synchronisations) times
                            the stage's compute, for the largest group among them. With none inside a micro-batch
                            (ZeRO 0/1 without TP, SP or a pipeline) the step's one synchronisation, the gradient
                            reduce over the ZeRO group, waits on the whole step's compute. The fraction is what
                            `launcher calibrate` measures on this machine at its world size (expected slowest
                            minus mean, Hoefler et al., SC 2010, on noise amplified at synchronisations); 0 in the
                            built-in GPU profiles (not measured there). On this 2-core box calibrate measured 3-11% of
                            a 7-157 ms segment for 2 ranks (two calibrations 8 minutes apart, 2026-11-27), DP2
                            ZeRO-0's own loop waited 5-6% of its compute for the slower rank, and SP2's ranks
                            ~10% of the ~5 ms between two all-to-alls (bench/steptime/results.md, straggler.py,
                            sync_chain.py). Once the last rank arrived, each of those synchronisations also costs
                            what calibrate measured a tiny all-reduce of that group to take after that much
                            compute (profile.release) beyond the latency its link charges: the link's latency is
                            fitted after ~1 ms of GEMMs, and on 2 CPU ranks here the same 4 KiB all-reduce took a
                            mean 1.1-1.7 ms after 0.75 ms of compute and 1.5-2.3 ms after 22 (stalls of a scheduler
                            quantum; calibrate pools its segment lengths into one figure a group, since one
                            calibration's rows differ by chance as much as by length; 0 where not measured, the
                            built-ins).
    optimizer               AdamW over this rank's shard at memory bandwidth: fp32 master, m, v read and
                            written, the gradient read (and the norm's extra read), the low-precision weights
                            written: (4 + 4 + 4) x 2 + 4 + 4 (+ 2 for a 16-bit copy) bytes per parameter.
    gradient accumulation   with m > 1 micro-batches a step, every backward after the first adds its weight
                            gradients into the ones held (autograd's AccumulateGrad: p.grad += g, one kernel a
                            parameter tensor reading both and writing the sum): (m - 1) x 3 w bytes a stage
                            parameter at memory bandwidth a step, charged as element-wise work of the stage's
                            backward, (m - 1) / m of it each micro-batch (grad_accumulation). That is what a plain
                            loop pays, and what calibrate's engine probe counts in its plain side; DeepSpeed's own
                            accumulation beyond it (ZeRO 2/3 reduce each micro-batch's gradients into their
                            partition) is the engine's per-micro-batch term. Where DeepSpeed's BF16_Optimizer
                            runs (bf16 ZeRO-0 pipelines, bf16 ZeRO-1 with fp32 accumulation) its own accumulation
                            replaces autograd's: with immediate_grad_update (the launcher's setting) it
                            (cast-)adds each bf16 gradient into its fp32 (ZeRO 1) or bf16 (ZeRO 0) gradients
                            as the backward writes it, and zeroes those twice a step: m x 18 + 8 bytes a
                            parameter in fp32, m x 6 + 4 in bf16 (bf16_accumulation, counted on one rank),
                            charged 1 / m of it each micro-batch, at m = 1 too. calibrate's engine probe never
                            runs that optimizer, so nothing else counts it.
    CPU ranks               when a node runs more ranks than the profile's compute_slots (cores), compute
                            stretches by ranks / slots while every rank computes (_compute_stretch); a
                            pipeline's ranks idle in fill and drain, so its 1F1B schedule is played out with
                            the cores shared, each stage's compute stretched by what it met and its waits at the
                            straggler and release measured that way (_shared_pipeline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from launcher.config.supported import LLAMA_FAMILY
from launcher.plan.activations import loss_chunk_rows
from launcher.plan.flops import flops_per_token, recompute_flops_per_token
from launcher.plan.inputs import Hardware, ModelShape, Strategy
from launcher.plan.memory import (BF16_IMMEDIATE_GRAD_UPDATE, REDUCE_BUCKET_ELEMENTS, blocks_in_stage, overlap_comm, zero3_gathered,
                                  blocks_per_stage, checkpointed_in_stage, checkpointed_layers, checkpointed_of,
                                  params_per_stage, uses_bf16_optimizer, weight_bytes)
from launcher.plan.profile import Link, Profile, interpolate

F32 = 4
ATTN_BWD_OVER_FWD = 2.5  # FlashAttention-2 section 3.1: backward does 5 matmuls, forward 2


# ---- primitives ---------------------------------------------------------------------------------------------------

def gemm_s(m: float, n: float, k: float, w: int, prof: Profile, rate: tuple, batch: float = 1.0) -> float:
    """One (batched) GEMM [m, k] x [k, n]: the roofline of its FLOPs at the shape's rate and its bytes.
    `rate`: (plateau FLOP/s, half-rate dimension) from Profile.gemm_rate, or a measured table (calibrate)."""
    d = min(m, n, k)
    flops = 2.0 * m * n * k * batch
    compute = flops / (interpolate(rate, d) if isinstance(rate, list) else rate[0] * d / (d + rate[1]))
    memory = (m * k + k * n + m * n) * w * batch / (prof.memory_gbps * 1e9)
    return max(compute, memory) + prof.kernel_overhead_s


def attention_fwd_flops(b: float, s: float, heads: float, d: float) -> float:
    """Causal attention forward FLOPs: QK^T and PV, 2 x 2 b s^2 heads d, half of the square computed."""
    return 4.0 * b * s * s * heads * d / 2


def attention_s(b: float, s: float, heads: float, d: float, prof: Profile, rate: tuple) -> tuple[float, float]:
    """(forward, backward) seconds of fused causal attention; the profile's rate (plateau, half-rate sequence)
    counts forward + backward."""
    fwd = attention_fwd_flops(b, s, heads, d)
    r = interpolate(rate, s) if isinstance(rate, list) else rate[0] * s / (s + rate[1])
    total = fwd * (1 + ATTN_BWD_OVER_FWD) / r
    return total / (1 + ATTN_BWD_OVER_FWD) + prof.kernel_overhead_s, total * ATTN_BWD_OVER_FWD / (1 + ATTN_BWD_OVER_FWD) + prof.kernel_overhead_s


def memory_s(nbytes: float, kernels: int, prof: Profile) -> float:
    """Element-wise operators: bytes at memory bandwidth + a fixed cost per kernel."""
    return nbytes / (prof.memory_gbps * 1e9) + kernels * prof.kernel_overhead_s


@dataclass(frozen=True)
class GroupLink(Link):
    """The link as one TP or data-parallel group meets it (_group_link): NCCL's (latency, bandwidth fraction)
    options for its all-gathers / reduce-scatters and for its all-reduces, the cheapest taken per message."""

    gather_options: tuple = ()
    all_reduce_options: tuple = ()


def _cheapest(wire_bytes: float, link: Link, all_reduce: bool) -> float:
    """latency + wire bytes / bus bandwidth: a plain link's one latency, a GroupLink's cheapest NCCL option."""
    options = ((link.all_reduce_options if all_reduce else link.gather_options) if isinstance(link, GroupLink)
               else ((link.latency_s, 1.0),))
    return min(lat + wire_bytes / (link.bus_gbps * frac * 1e9) for lat, frac in options)


def all_reduce_s(nbytes: float, ranks: int, link: Link) -> float:
    """Ring all-reduce: latency + 2 (r-1)/r x bytes / bus bandwidth (Patarasuk & Yuan 2009; NCCL-tests busbw);
    on a GroupLink the cheapest of NCCL's algorithms and protocols (profile.NcclTuning)."""
    if ranks <= 1:
        return 0.0
    return _cheapest(2 * (ranks - 1) / ranks * nbytes, link, all_reduce=True)


def gather_s(nbytes: float, ranks: int, link: Link) -> float:
    """All-gather, reduce-scatter or all-to-all of a `nbytes` buffer: latency + (r-1)/r x bytes / bus bandwidth;
    on a GroupLink the cheapest of NCCL's protocols."""
    if ranks <= 1:
        return 0.0
    return _cheapest((ranks - 1) / ranks * nbytes, link, all_reduce=False)


def p2p_s(nbytes: float, link: Link) -> float:
    return link.latency_s + nbytes / (link.bus_gbps * 1e9)


def gemm_rate(prof: Profile, dtype: str):
    """The measured table when the profile has one, else (plateau, half-rate dimension)."""
    return prof.gemm_table_for(dtype) or prof.gemm_rate(dtype)


# ---- one block ----------------------------------------------------------------------------------------------------

@dataclass
class Cost:
    """Seconds by kind, for one pass of something (a block's forward, a stage's micro-batch, ...)."""
    gemm: float = 0.0
    attention: float = 0.0
    memory: float = 0.0
    tp: float = 0.0
    sp: float = 0.0
    framework: float = 0.0          # dispatch, autograd and module Python beyond the operator terms (profile.framework)
    host: float = 0.0               # the host's issue time on a GPU (profile.host): not device time, so in neither
                                    # compute nor total; it bounds a micro-batch from below (the host floor)

    @property
    def compute(self) -> float:
        return self.gemm + self.attention + self.memory + self.framework

    @property
    def total(self) -> float:
        return self.compute + self.tp + self.sp

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(self.gemm + o.gemm, self.attention + o.attention, self.memory + o.memory, self.tp + o.tp, self.sp + o.sp,
                    self.framework + o.framework, self.host + o.host)

    def __mul__(self, k: float) -> "Cost":
        return Cost(self.gemm * k, self.attention * k, self.memory * k, self.tp * k, self.sp * k, self.framework * k,
                    self.host * k)


def _norm_bytes(x: float, arch: str, w: int) -> tuple[float, int]:
    """(bytes, kernels) of one forward norm over x elements.

    LLaMA's RMSNorm runs in fp32 in eager ops (transformers LlamaRMSNorm: to(fp32), pow, mean, + eps, rsqrt, mul,
    to(dtype), mul weight: each kernel reads and writes its tensor); LayerNorm (GPT, BLOOM) is one fused kernel
    reading and writing x."""
    if arch in LLAMA_FAMILY:
        casts = 0 if w == F32 else 2
        return x * (F32 * 8 + w * (2 + 2 * casts)), 6 + casts
    return 2 * x * w, 1


def _fp32_casts(elements: float, w: int, casts: int) -> tuple[float, int]:
    """(bytes, kernels) of `casts` casts of `elements` between the model's dtype (w bytes) and fp32 in one pass: each
    reads one side and writes the other; none when the model already runs in fp32."""
    return (0.0, 0) if w == F32 else (casts * elements * (w + F32), casts)


def _sp_norm_params(shape: ModelShape) -> int:
    """Parameters of one block's two norms, which Megatron SP marks (launcher/parallel/tensor.py
    mark_sequence_parallel): RMSNorm's weight (LLaMA), LayerNorm's weight and bias (GPT)."""
    return 2 if shape.arch in LLAMA_FAMILY else 4


def block_costs(shape: ModelShape, st: Strategy, prof: Profile, links: dict) -> tuple[Cost, Cost]:
    """(forward, backward) cost of one transformer block for one micro-batch on one rank."""
    t, sp, b, s = st.tensor_degree, st.sequence_degree, st.micro_batch_size, st.seq_length
    cp = st.context_degree
    h, a, kv, d, f = shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.intermediate_size
    w = weight_bytes(st.dtype)
    rate = gemm_rate(prof, st.dtype)
    n = b * s / (sp * cp)            # tokens this rank holds outside attention
    x = n * h                        # elements of one hidden-state tensor
    fwd, bwd = Cost(), Cost()

    def gemm(m_, n_, k_, batch=1.0):
        fwd.gemm += gemm_s(m_, n_, k_, w, prof, rate, batch)
        bwd.gemm += gemm_s(m_, k_, n_, w, prof, rate, batch) + gemm_s(k_, n_, m_, w, prof, rate, batch)

    def mem_counted(fwd_bytes, fwd_kernels, bwd_bytes, bwd_kernels):
        # where the backward is not twice the forward: each pass's kernels counted off the runtime's own operators
        fwd.memory += memory_s(fwd_bytes, fwd_kernels, prof)
        bwd.memory += memory_s(bwd_bytes, bwd_kernels, prof)

    def mem(nbytes, kernels):
        mem_counted(nbytes, kernels, 2 * nbytes, 2 * kernels)

    # Megatron SP: the norms and residual adds outside the TP regions see this rank's n / t tokens only.
    x_out = x / t if st.sequence_parallel else x
    norm_b, norm_k = _norm_bytes(x_out, shape.arch, w)
    q_el, kv_el = n * a * d / t, n * kv * d / t
    # attention block
    mem(norm_b, norm_k)
    if shape.arch in LLAMA_FAMILY:
        gemm(n, a * d / t, h)                    # q_proj
        gemm(n, kv * d / t, h)                   # k_proj
        gemm(n, kv * d / t, h)                   # v_proj
        mem(9 * (q_el + kv_el) * w, 10)          # rotary: q cos + rotate_half(q) sin, same for k (5 kernels each)
    else:
        gemm(n, (a + 2 * kv) * d / t, h)         # fused qkv (GPT c_attn, BLOOM query_key_value)
    if shape.arch == "bloom":
        # BloomAttention._reshape takes q, k, v as strided views of the fused output and reshapes them to (b a, s, d):
        # a copy each. Backward: select_backward writes each one's gradient into a zeroed fused-shape tensor (reads
        # its piece, writes all of it), two adds sum the three, and baddbmm's alpha scales the q and k gradients.
        qkv_el = q_el + 2 * kv_el
        mem_counted(2 * qkv_el * w, 3, (4 * qkv_el + 2 * 3 * qkv_el + 2 * (q_el + kv_el)) * w, 7)
    if sp > 1:
        # Ulysses: q, k, v scattered by heads / gathered by sequence before attention, the output back after
        # one all-to-all per tensor (DeepSpeed _SeqAllToAll: q, k, v, then the output), each paying the latency.
        # Under grouped-query attention launcher/parallel/sequence.py sends k and v with their kv heads when sp
        # divides kv, else repeats them to all a heads first (ulysses_attention).
        kv_sent = kv_el if kv % sp == 0 else q_el
        a2a = 2 * gather_s(q_el * w, sp, links["sp"]) + 2 * gather_s(kv_sent * w, sp, links["sp"])
        fwd.sp += a2a
        bwd.sp += a2a
        # DeepSpeed's single_all_to_all copies every tensor twice, a permute().contiguous() before the exchange
        # and another after (forward; the backward's all-to-alls copy the gradients alike): 16 copies a block per
        # micro-batch, 8 forward + 8 backward (a profiled SP2 step of recipe=tiny runs 128 in its 8 block passes).
        copies = memory_s(2 * 2 * (2 * q_el + 2 * kv_sent) * w, 8, prof)
        fwd.memory += copies
        bwd.memory += copies
        if kv != a:   # repeat_interleave of k and v (read kv, write a heads); backward sums the repeats back
            rep = memory_s(2 * (kv_el + q_el) * w, 2, prof)
            fwd.memory += rep
            bwd.memory += rep
    heads = a / (t * sp * cp)        # CP: 1/cp of the causal work, expressed as a share of the heads
    if shape.flash_attention:
        attn_rate = prof.attention_table_for(st.dtype, d) or prof.attention_rate(st.dtype)   # at this head dim
        af, ab = attention_s(b, s, heads, d, prof, attn_rate)
        fwd.attention += af
        bwd.attention += ab
        if cp > 1:
            kv_block = 2 * n * a * d / t * w   # this rank's k and v, repeated to a heads before the ring
            ring = gather_s(cp * kv_block, cp, links["sp"])
            dkv = cp * p2p_s(2 * n * a * d / t * F32, links["sp"])
            fwd.sp += max(0.0, ring - af)
            bwd.sp += max(0.0, ring + dkv - ab)
    else:
        # eager (BLOOM, ALiBi): scores = baddbmm(alibi, q, k^T), fp32 softmax, probs @ v; the scores are b heads s^2
        scores = b * heads * s * s
        gemm(s, s, d, batch=b * heads)
        gemm(s, d, s, batch=b * heads)
        # the causal mask (b, 1, s, s, the model's dtype) added to the scores (baddbmm adds the ALiBi bias itself);
        # softmax in fp32 (read, write), its backward reads the output and the gradient, writes one; outside fp32
        # the scores are cast up before the softmax and down after it, and the backward casts the gradients alike
        casts, ck = _fp32_casts(scores, w, 2)
        mem_counted(scores * 2 * w + b * s * s * w + scores * 2 * F32 + casts, 2 + ck, scores * 3 * F32 + casts, 1 + ck)
    mem(2 * q_el * w, 1)                          # attention output (b, a, s, d) -> (b, s, a d) contiguous copy
    gemm(n, h, a * d / t)                         # o_proj / dense
    mem(3 * x_out * w, 1)                         # residual add
    # MLP
    mem(norm_b, norm_k)
    if shape.arch in LLAMA_FAMILY:
        gemm(n, f / t, h)                         # gate_proj
        gemm(n, f / t, h)                         # up_proj
        mem(5 * n * f / t * w, 2)                 # silu(gate) * up
    elif shape.arch == "bloom":
        gemm(n, f / t, h)                         # dense_h_to_4h
        # bloom_gelu_forward: 9 eager tanh-GELU ops (3 scalar muls, 3 tensor muls, 2 scalar adds, tanh) moving 21
        # ffn-wide tensors; GeLUFunction's backward (bloom_gelu_back) recomputes the tanh and takes 18 ops, 43 tensors
        ffn = n * f / t * w
        mem_counted(21 * ffn, 9, 43 * ffn, 18)
    else:
        gemm(n, f / t, h)                         # fc (GPT-2 c_fc)
        mem(8 * 2 * n * f / t * w, 8)             # tanh-GELU in eager ops (GPT2 gelu_new): ~8 kernels
    gemm(n, h, f / t)                             # down_proj / c_proj / dense_4h_to_h
    mem(3 * x_out * w, 1)                         # residual add
    if t > 1:
        # launcher/parallel/tensor.py (Megatron's f and g, Shoeybi et al. 2019, fig. 3): forward, g all-reduces the
        # row-parallel outputs of o_proj and down_proj; backward, f all-reduces the input gradient of each
        # sub-layer's column-parallel group (q, k, v; gate, up) once.
        if st.sequence_parallel:
            # Under Megatron SP each all-reduce is two collectives: _GatherFromSequence before the column-parallel
            # group and _ReduceScatterToSequence after the row-parallel output (forward; the backward mirrors
            # them), (t-1)/t of x each: the ring bytes of the all-reduce and twice its latency.
            ag_rs = 2 * gather_s(x * w, t, links["tp"])
            fwd.tp += 2 * ag_rs
            bwd.tp += 2 * ag_rs
            # The norms run on n / t tokens, so their weight (and bias) gradients are partial sums over the TP
            # ranks: one all-reduce a parameter as its gradient is produced, every micro-batch
            # (register_sequence_parallel_grad_hooks).
            bwd.tp += _sp_norm_params(shape) * all_reduce_s(h * w, t, links["tp"])
        else:
            ar = all_reduce_s(x * w, t, links["tp"])
            fwd.tp += 2 * ar
            bwd.tp += 2 * ar
    fb, bb, _ = prof.framework(shape.arch, st.dtype)
    fwd.framework += fb
    bwd.framework += bb
    hf, hb, _ = prof.host(shape.arch, st.dtype)
    fwd.host += hf
    bwd.host += hb
    return fwd, bwd


def end_costs(shape: ModelShape, st: Strategy, prof: Profile, links: dict) -> tuple[Cost, Cost]:
    """(first stage, last stage) extra cost per micro-batch: embedding; final norm, head and loss."""
    sp, b, s = st.sequence_split, st.micro_batch_size, st.seq_length
    h, w = shape.hidden_size, weight_bytes(st.dtype)
    n = b * s / sp
    # Our TP (launcher/parallel/tensor.py, at every pipeline_degree) splits the embedding, head and loss over the
    # vocabulary (Shoeybi et al. 2019, section 3; Megatron-LM's VocabParallelEmbedding, ColumnParallelLinear with
    # parallel_output=True and vocab_parallel_cross_entropy): each TP rank holds v = V/t rows of the padded
    # vocabulary (layout.py pads V to a multiple of t), the final norm is whole.
    t = st.tensor_degree
    v = st.padded_vocab_size / t
    x = n * h * w                                # bytes of one hidden-state tensor of this rank's tokens
    rate = gemm_rate(prof, st.dtype)
    nb, nk = _norm_bytes(n * h, shape.arch, w)   # one norm over this rank's tokens (BLOOM's embedding LayerNorm, ln_f)
    first = Cost()
    # lookup: read the rows, write the hidden states; backward: zero the dense (V/t, h) gradient, index_add n rows
    first.memory += memory_s(2 * x, 1, prof) + memory_s(v * h * w + 3 * x, 2, prof)
    if t > 1:
        # VocabParallelEmbedding's index arithmetic on the int64 ids, 5 kernels: ids < start (read 8, write 1),
        # ids >= end (9), their | (3), ids - start (16), masked_fill_ of the out-of-range ids to 0 (17) = 54 bytes a
        # token; then masked_fill_ zeroes the looked-up rows of ids on other ranks (read and write x), and its
        # backward zeroes their gradient alike.
        first.memory += memory_s(54 * n + 2 * x, 6, prof) + memory_s(2 * x, 1, prof)
    if shape.arch == "gpt":
        # learned positions (GPT-2 wpe): this rank's s / sp position rows looked up and added to every sample's
        # token embeddings; backward sums the gradient over the batch and scatters it into the zeroed wpe gradient
        rows, table = s / sp * h, shape.params.embedding - shape.vocab_size * h
        first.memory += memory_s(2 * rows * w + (2 * n * h + rows) * w, 2, prof) \
            + memory_s((n * h + rows) * w + (table + rows) * w, 2, prof)
    elif shape.arch == "bloom":
        # word_embeddings_layernorm (forward + backward, as the final norm below) and the (b, 1, s, s) causal mask
        # the model builds once a micro-batch (torch.where over a bool tensor, written in the model's dtype)
        first.memory += memory_s(3 * nb, 3 * nk, prof) + memory_s(b * s * s * (w + 1), 1, prof)
    last = Cost()
    last.memory += memory_s(3 * nb, 3 * nk, prof)              # final norm, forward + backward
    if t > 1:
        if st.sequence_parallel:
            # Megatron SP at the ends (launcher/parallel/pipeline.py): the partial embeddings are reduce-scattered to
            # the ranks' s/t tokens (forward; the backward all-gathers the gradient), and the final norm's output is
            # all-gathered for the head (forward; the backward reduce-scatters the ranks' partial input gradients);
            # the final norm's gradient is all-reduced like the blocks'.
            ag = gather_s(x, t, links["tp"])
            first.tp += 2 * ag
            last.tp += 2 * ag + _sp_norm_params(shape) // 2 * all_reduce_s(h * w, t, links["tp"])
        else:
            # the partial embeddings summed over TP (Megatron's g, forward) and the head's input gradient summed
            # (Megatron's f in front of the column-parallel head, backward)
            ar = all_reduce_s(x, t, links["tp"])
            first.tp += ar
            last.tp += ar
    logits = n * v
    cast, ck = _fp32_casts(logits, w, 1)
    if st.chunked_loss:
        # model.chunked_loss (launcher/runtime/chunked_loss.py; t = 1): k chunks of c rows (activations.
        # loss_chunk_rows). Forward, each chunk's logits GEMM, their fp32 cast, logsumexp (amax reads 4, x - max reads 4
        # and writes 4, exp reads and writes 4, the sum reads 4: 4 kernels, 24 bytes an element), the target's gather
        # negligible. Backward, the logits GEMM again, the cast, the softmax in place (sub_ and exp_, 16 bytes), the
        # target's scatter negligible, the scale (mul_, 8), the cast down, then the input's gradient (c, h, V) and the
        # weight's, added into it (V, h, c): 4 GEMMs a chunk where the whole loss runs 3 over all the rows. The
        # weight's gradient buffer is zeroed first (V h w written), where the whole loss's GEMM writes it.
        c = loss_chunk_rows(int(n), int(v), h)
        k = -(-int(n) // c)
        last.gemm += k * (2 * gemm_s(c, v, h, w, prof, rate) + gemm_s(c, h, v, w, prof, rate)
                          + gemm_s(h, v, c, w, prof, rate))
        last.memory += memory_s(logits * 24 + cast, k * (4 + ck), prof) \
            + memory_s(logits * 24 + 2 * cast + v * h * w, k * (3 + 2 * ck) + 1, prof)
    else:
        last.gemm += gemm_s(n, v, h, w, prof, rate) + gemm_s(n, h, v, w, prof, rate) + gemm_s(h, v, n, w, prof, rate)
        if t > 1:
            # vocab_parallel_cross_entropy on the fp32 (n, V/t) logits (Megatron-LM core/tensor_parallel/cross_entropy.py;
            # launcher/parallel/tensor.py): forward the row max (read 4), x - max (read 4, write 4), exp (4, 4) and its
            # row sum (4), then the softmax as exp(x - max - log sum) in place: sub_ (4, 4), exp_ (4, 4): 6 kernels, 40
            # bytes an element, the target's gather negligible; three all-reduces of one fp32 value a token (the max,
            # the target's logit, the sum). Backward: the softmax times the scaled upstream gradient in place (read 4,
            # write 4; 2 kernels with the scale), the target columns' subtraction negligible. The casts to fp32 and
            # back as without TP.
            last.memory += memory_s(logits * 10 * F32 + cast, 6 + ck, prof) + memory_s(logits * 2 * F32 + cast, 2 + ck, prof)
            last.tp += 3 * all_reduce_s(n * F32, t, links["tp"])
        else:
            # cross-entropy on fp32 logits: log_softmax reads them and writes the log-probabilities, nll_loss gathers
            # one a token; backward, nll_loss_backward writes the dense fp32 gradient, log_softmax's backward reads it
            # and the log-probabilities and writes the logits' gradient. Outside fp32 transformers casts the logits up
            # first and the backward casts their gradient down (counted off the runtime's operators,
            # bench/steptime/elementwise_bytes.py)
            last.memory += memory_s(logits * 2 * F32 + cast, 2 + ck, prof) + memory_s(logits * 4 * F32 + cast, 3 + ck, prof)
    # The model's own per-micro-batch Python beyond its blocks (embedding, masks and rotary tables, final norm, head,
    # loss; profile.framework), measured whole: half to each end stage (one stage without a pipeline).
    model = prof.framework(shape.arch, st.dtype)[2]
    first.framework += model / 2
    last.framework += model / 2
    host = prof.host(shape.arch, st.dtype)[2]     # the same part of the host's issue time (GPU), split alike
    first.host += host / 2
    last.host += host / 2
    return first, last


# The near-zero-compute model `launcher calibrate` runs to measure profile.framework_s (launcher/runtime/calibrate.py
# builds it with the runtime's own model classes; framework_residual charges it with this module's terms): a micro-
# batch of one 8-token sample through `layers` blocks of width 32, 2 heads, MLP 64, vocabulary 64. Its operators
# cost microseconds of arithmetic, so its time is what every micro-batch pays whatever its size.
FRAMEWORK_PROBE = {"hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "vocab_size": 64, "seq_length": 8,
                   "layers": (1, 3)}


def _probe_model(arch: str, dtype: str) -> tuple[ModelShape, Strategy]:
    """The framework probe's model (FRAMEWORK_PROBE at its smaller block count) on one rank, one micro-batch of one
    sequence: what calibrate times, as the plan sees it."""
    from launcher.plan.params import ParamCount

    h, a, f, v, s = (FRAMEWORK_PROBE[k] for k in ("hidden_size", "num_heads", "intermediate_size", "vocab_size",
                                                   "seq_length"))
    shape = ModelShape(arch=arch, hidden_size=h, num_layers=FRAMEWORK_PROBE["layers"][0], num_heads=a, num_kv_heads=a,
                       intermediate_size=f, vocab_size=v, tied_embeddings=False, params=ParamCount(0, 0, 0, 0, 0))
    st = Strategy(tensor_degree=1, pipeline_degree=1, sequence_degree=1, data_degree=1, zero_stage=0,
                  micro_batch_size=1, grad_accum_steps=1, global_batch_size=1, seq_length=s, padded_vocab_size=v,
                  gpus_per_node=1, dtype=dtype, grad_accum_fp32=False, recompute="none")
    return shape, st


def framework_residual(arch: str, dtype: str, measured: dict, prof: Profile) -> list:
    """[block forward, block backward, model] seconds per micro-batch (profile.framework_s): the probe model's
    measured forward and backward seconds at FRAMEWORK_PROBE's two block counts, {layers: (fwd, bwd)}, split into a
    per-block and a whole-model part (the difference over the blocks added, and what is left at one block), less
    what block_costs and end_costs charge for the same model on `prof` without this term. Clipped at 0: where the
    terms already charge more than the probe took, nothing is added."""
    from dataclasses import replace

    shape, st = _probe_model(arch, dtype)
    bare = replace(prof, framework_s={})
    links = _links(st, bare)
    bf, bb = block_costs(shape, st, bare, links)
    first, last = end_costs(shape, st, bare, links)
    block_f, block_b, model = probe_split(measured)
    return [max(0.0, block_f - bf.compute), max(0.0, block_b - bb.compute),
            max(0.0, model - first.compute - last.compute)]


def selective_residual(arch: str, dtype: str, plain: dict, selective: dict, prof: Profile) -> list:
    """[block forward, block backward] seconds per micro-batch (profile.selective_framework_s): what the framework
    probe's blocks took more with selective checkpointing on ({layers: (fwd, bwd)} each, probe_split's per-block
    parts), less what the plan charges a selectively checkpointed block's recompute on `prof` (its element-wise
    operators and the forward's framework time, estimate_step_time). Clipped at 0."""
    shape, st = _probe_model(arch, dtype)
    bf, _ = block_costs(shape, st, prof, _links(st, prof))
    (pf, pb, _), (sf, sb, _) = probe_split(plain), probe_split(selective)
    return [max(0.0, sf - pf), max(0.0, sb - pb - bf.memory - bf.framework)]


def probe_split(measured: dict) -> list:
    """[block forward, block backward, model] seconds from the framework probe's {layers: (forward s, backward s)}
    at FRAMEWORK_PROBE's two block counts: the difference over the blocks added is a block's, what is left at one
    block the model's (clipped at 0). On a GPU these are the host's issue time as measured (profile.host_s)."""
    lo, hi = FRAMEWORK_PROBE["layers"]
    (f_lo, b_lo), (f_hi, b_hi) = measured[lo], measured[hi]
    block_f, block_b = (f_hi - f_lo) / (hi - lo), (b_hi - b_lo) / (hi - lo)
    return [max(0.0, block_f), max(0.0, block_b), max(0.0, (f_lo - lo * block_f) + (b_lo - lo * block_b))]


# ---- the step -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepTime:
    step_time_s: float
    compute_s: float        # GEMMs + attention + element-wise + framework + optimizer of the slowest stage, m micro-batches
    bubble_s: float         # pipeline fill and drain: the step's pipeline time minus m x the slowest stage
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
    gemm_s: float = 0.0
    attention_s: float = 0.0
    memory_bound_s: float = 0.0
    sp_comm_s: float = 0.0
    recompute_s: float = 0.0
    optimizer_s: float = 0.0
    framework_s: float = 0.0         # dispatch, autograd and module Python per micro-batch (profile.framework_s)
    host_bound_s: float = 0.0        # the device waiting for the host's issue of its kernels (GPU; profile.host_s)
    engine_s: float = 0.0            # DeepSpeed's ZeRO-3 hooks (profile.zero3_module_s, zero3_param_s) and its
                                     # per-element work (profile.engine_element_s)
    straggler_s: float = 0.0         # the waits for the slowest rank at synchronisations (profile.straggler)
    profile: str = ""

    def breakdown(self) -> dict:
        """Seconds per step by term; they add up to step_time_s (recompute is inside gemm/attention/memory_bound)."""
        return {"gemm": self.gemm_s, "attention": self.attention_s, "memory_bound": self.memory_bound_s,
                "optimizer": self.optimizer_s, "tp_comm": self.tp_comm_s,
                "framework": self.framework_s, "host_bound": self.host_bound_s,
                "sp_comm": self.sp_comm_s, "pp_comm": self.pp_comm_s, "bubble": self.bubble_s, "engine": self.engine_s,
                "dp_comm_exposed": self.dp_comm_exposed_s, "straggler": self.straggler_s}


def _links(st: Strategy, prof: Profile) -> dict:
    """The link of each group, from its place in the rank order (launcher/plan/rankmap.py, innermost first: tensor,
    sequence / context, data, pipeline): TP is t consecutive ranks; SP / CP sp ranks t apart; a ZeRO group every
    TP-th rank; a pipeline's stages t x sp x dp apart, so its hops cross nodes unless the whole pipeline group
    fits in one (with TP1 PP2 DP64 on 8-GPU nodes, stage 1 of rank 0 is rank 64, another node)."""
    g = st.gpus_per_node
    t, sp, p = st.tensor_degree, st.sequence_split, st.pipeline_degree
    sp_link = prof.all_to_all if prof.all_to_all is not None and t * sp <= g else _span(prof, sp, t, g)[0]
    return {"tp": _group_link(prof, t, 1, g), "sp": sp_link, "pp": _span(prof, p, t * sp * st.data_degree, g)[0],
            "dp": _group_link(prof, st.zero_partition_degree, t, g)}


def _span(prof: Profile, ranks: int, stride: int, gpus_per_node: int) -> tuple[Link, int]:
    """The link and the node count of a group of `ranks` ranks, `stride` apart in the rank order: the intra-node
    link where the group fits in a node (that group size's own where calibrate measured it: Profile.intra_for),
    else the inter-node one, on ceil(ranks / (gpus_per_node / stride)) nodes."""
    if ranks * stride <= gpus_per_node:
        return prof.intra_for(ranks), 1
    return prof.inter, math.ceil(ranks / max(1, gpus_per_node // stride))


def _group_link(prof: Profile, ranks: int, stride: int, gpus_per_node: int) -> Link:
    """A collective group's link (_span; across nodes the one for its ranks a node, Profile.inter_for), with NCCL's
    cost model for its ranks and nodes where the profile has it (profile.NcclTuning), else the link's fixed
    latency."""
    link, nodes = _span(prof, ranks, stride, gpus_per_node)
    if nodes > 1:
        link = prof.inter_for(min(ranks, max(1, gpus_per_node // stride)))
    if prof.nccl is None or ranks <= 1:
        return link
    return GroupLink(link.latency_s, link.bus_gbps, gather_options=prof.nccl.options(False, ranks, nodes),
                     all_reduce_options=prof.nccl.options(True, ranks, nodes))


def _optimizer_s(params: float, st: Strategy, prof: Profile, tensors: int) -> float:
    """AdamW over `params` at memory bandwidth (module docstring), plus zeroing the gradients."""
    w = weight_bytes(st.dtype)
    # the gradients zeroed: BF16_Optimizer's (fp32 or bf16) are the accumulation term's (bf16_accumulation)
    zeroed = 0 if uses_bf16_optimizer(st.dtype, st.zero_stage, st.grad_accum_fp32, st.pipeline_degree) else (
        F32 if st.grad_accum_fp32 else w)
    per_param = 2 * 3 * F32 + 2 * F32 + (w if w != F32 else 0) + zeroed
    return memory_s(params * per_param, 15 * tensors, prof)


def grad_accumulation(params: float, tensors: int, st: Strategy, prof: Profile) -> Cost:
    """What accumulating each backward's weight gradients costs a stage, per micro-batch averaged over the step
    (module docstring, gradient accumulation). Autograd's add: (m - 1) / m of one add over its `params` in the
    model's dtype (read both, write one: 3 w bytes each), one kernel per parameter tensor; nothing at m = 1.
    Under DeepSpeed's BF16_Optimizer (memory.uses_bf16_optimizer) what that optimizer does instead: bf16_accumulation."""
    m = st.grad_accum_steps
    if uses_bf16_optimizer(st.dtype, st.zero_stage, st.grad_accum_fp32, st.pipeline_degree):
        nbytes, kernels = bf16_accumulation(m, st.grad_accum_fp32)
        return Cost(memory=memory_s(params * nbytes, tensors * kernels, prof) / m)
    if m <= 1:
        return Cost()
    return Cost(memory=(m - 1) / m * memory_s(params * 3 * weight_bytes(st.dtype), tensors, prof))


def bf16_accumulation(m: int, fp32: bool = True, immediate: bool = BF16_IMMEDIATE_GRAD_UPDATE) -> tuple:
    """(bytes a parameter, kernels a parameter tensor) a step of m micro-batches costs DeepSpeed 0.19.8's
    BF16_Optimizer accumulating gradients; read in runtime/bf16_optimizer.py, engine.py and pipe/engine.py, and
    counted operator by operator on one rank (tests/plan/test_bf16_accumulation.py). Its "fp32" gradients are in the
    accumulation dtype, a bytes: fp32 with precision.grad_accum_dtype=fp32 (ZeRO 1), bf16 otherwise (ZeRO-0
    pipelines; `fp32` False).
    With immediate_grad_update true, the launcher's setting (memory.BF16_IMMEDIATE_GRAD_UPDATE):
    - every backward adds each bf16 gradient into the accumulation gradient from a hook as autograd writes it, cast
      first where a = 4 (reads 2, writes 4), and frees it: the add reads 2 a and writes a (fp32: 18 bytes, two
      kernels; bf16: 6 bytes, one); so autograd never finds a gradient held and never adds into one;
    - the step zeroes the stage's whole accumulation gradient twice (clear_hp_grads at the end of
      BF16_Optimizer.step and again in the engine's zero_grad: 2 a bytes, flat, kernels not counted).
    fp32: m x 18 + 8 bytes; bf16: m x 6 + 4.
    With DeepSpeed's default, immediate_grad_update false (`immediate` False), every backward but the step's first
    finds the bf16 gradients held: clear_lp_grads zeroes them (2 bytes; torch._foreach_zero_, its kernels not
    counted) and autograd adds the new ones into them (3 x 2 bytes, a kernel); update_hp_grads then adds them all
    after the backward: (m - 1) x 8 bytes and m - 1 kernels more (timed on one CPU rank, fp32, before the count:
    bench/steptime/bf16_optimizer_accumulation.py)."""
    a = 4 if fp32 else 2
    cast = (2 + a, 1) if fp32 else (0, 0)
    held = 0 if immediate else m - 1
    return m * (cast[0] + 3 * a) + held * 8 + 2 * a, m * (1 + cast[1]) + held


def estimate_step_time(shape: ModelShape, st: Strategy, hw: Hardware, train_tokens: Optional[float] = None) -> StepTime:
    """Step time, its breakdown, throughput, TFLOP/s per GPU, MFU and training days for one layout."""
    prof = hw.profile
    t, p, sp = st.tensor_degree, st.pipeline_degree, st.sequence_split   # sp: Ulysses x CP
    m, s = st.grad_accum_steps, st.seq_length
    w = weight_bytes(st.dtype)
    world = st.world_size
    links = _links(st, prof)
    ranks_here = min(world, st.gpus_per_node)
    stretch = max(1.0, ranks_here / prof.compute_slots) if prof.compute_slots else 1.0

    bf, bb = block_costs(shape, st, prof, links)
    first, last = end_costs(shape, st, prof, links)
    per_block = bf + bb     # and the forward again for each checkpointed block (checkpointed_in_stage)
    recomputed = bf if st.recompute != "selective" else _selective_recompute(shape, st, prof, bf)
    act_bytes = st.micro_batch_size * s / sp * shape.hidden_size * w / t  # pipe_partitioned: scattered over TP
    p2p = p2p_s(act_bytes, links["pp"]) if p > 1 else 0.0

    # each stage's blocks, checkpointed blocks and parameters, cut once (a pipeline's stages are read 3-4 times each)
    blocks = blocks_per_stage(shape, st)
    ckpts = [checkpointed_of(st, b) for b in blocks]
    stage_n = params_per_stage(shape, st)
    accumulate = [grad_accumulation(stage_n[stage], _parameter_tensors(shape, blocks[stage], stage, p), st, prof)
                  for stage in range(p)]
    costs = []
    for stage in range(p):
        c = per_block * blocks[stage] + recomputed * ckpts[stage] + accumulate[stage]
        if stage == 0:
            c = c + first
        if stage == p - 1:
            c = c + last
        costs.append(c)
    hooks, hooks_step = _zero3_hooks_s(shape, st, prof, costs, ckpts)
    # DeepSpeed's per-element and per-tensor work (module docstring): where calibrate measured it apart, the part
    # every micro-batch pays and the step's rest; otherwise all of it per micro-batch under ZeRO 2/3 (they reduce in
    # every backward) and per step under ZeRO 0/1.
    def engine_work(per_element: float, per_tensor: float) -> list:
        if not (per_element or per_tensor):     # the built-ins under ZeRO 0-2: --search's hot path
            return [0.0] * p
        return [stage_n[stage] * per_element + _parameter_tensors(shape, blocks[stage], stage, p) * per_tensor
                for stage in range(p)]
    rest = engine_work(prof.engine_element(st.dtype, st.zero_stage), prof.engine_tensor(st.dtype, st.zero_stage))
    if prof.engine_split(st.dtype):
        every = engine_work(*prof.engine_micro(st.dtype, st.zero_stage))
    else:
        every, rest = (rest, [0.0] * p) if st.zero_stage >= 2 else ([0.0] * p, rest)
    hooks = [hk + e for hk, e in zip(hooks, every)]
    engine_step = [r + once for r, once in zip(rest, hooks_step)]
    # A pipeline whose node runs more ranks than compute slots: its 1F1B schedule played out with the cores shared
    # (_shared_pipeline), each stage's compute stretched by what it met; otherwise one stretch for every stage.
    shared = (_shared_pipeline(shape, st, prof, bf, bb, recomputed, first, last, hooks, p2p, ranks_here, blocks, ckpts,
                               accumulate)
              if stretch > 1.0 and p > 1 else None)
    k = _compute_stretch(costs, hooks, m, p, ranks_here, prof, stretch, p2p) if shared is None else None

    stages = []
    for stage, c in enumerate(costs):
        neighbours = (stage > 0) + (stage < p - 1)
        k_stage = k if shared is None else shared["stretch"][stage]
        compute = c.compute * k_stage
        # The host floor (GPU): the host issues a micro-batch's kernels ahead of the device, so its Python is hidden
        # until it takes longer than the kernels; then the device waits for it (bench/gpu/results.md: the ~1B LLaMA
        # on one H200 at micro-batch 1 took 0.61 s a step where its kernels need 0.33).
        # The issue time is the stage's Cost.host (its blocks' forward and backward, the forward again under full
        # recompute, half the model's own on each end stage; 0 without profile.host_s), not stretched (k: CPU ranks).
        host_wait = max(0.0, c.host - compute)
        busy = compute + host_wait + hooks[stage]     # what a rank of the stage computes between its synchronisations
        # counted only where there is a fraction to charge (the built-ins have none: --search's hot path)
        syncs, group = _syncs_per_micro_batch(shape, st, stage) if prof.straggler or prof.release else (0, 1)
        if shared is not None:
            wait = shared["wait"][stage] / m
        else:
            wait = (prof.straggler_fraction(group, busy / syncs) * busy
                    + syncs * _release_beyond_latency(prof, group, busy / syncs, st)) if syncs else 0.0
        stages.append({"cost": c, "compute": compute, "host_wait": host_wait, "pp": 2 * neighbours * p2p, "wait": wait,
                       "syncs": syncs, "k": k_stage,
                       "busy": busy, "time": busy + c.tp + c.sp + 2 * neighbours * p2p + wait,
                       "recompute": recomputed.compute * ckpts[stage] * k_stage})
    slow = max(stages, key=lambda x: x["time"])
    pipeline_s = sum(x["time"] for x in stages) + (m - 1) * slow["time"] if shared is None else shared["step"]

    # Data parallel traffic and the optimizer, per stage; the step waits for the slowest stage.
    r = st.zero_partition_degree    # DeepSpeed's data-parallel group under Ulysses (CP) is dp x sp (dp x cp)
    overlap = overlap_comm(hw)
    dp_exposed, opt = [], []
    # Gradients cross the wire in DeepSpeed's communication dtype, whatever the accumulation dtype (engine.py
    # communication_data_type; its and stage_1_and_2.py's allreduce_bucket cast to it), which the launcher sets to
    # precision.reduce_dtype (config.layout.reduce_dtype: the model's unless set), Ulysses / CP or not, except where
    # ZeRO-1/2 cast to fp32 under Ulysses / CP (Strategy.wire_dtype). recipe=tiny bf16 on 2 CPU ranks: ZeRO-1/2
    # all_reduce and ZeRO-3 reduce_scatter_tensor in bf16 with or without precision.grad_accum_dtype=fp32 (PP2 x DP2
    # under the BF16_Optimizer too) (2026-12-05); under SP2 ZeRO-0 and ZeRO-3 all_reduce in bf16 with the launcher's
    # config (fp32 before it set seq_parallel_communication_data_type), ZeRO-1 in fp32 either way (2026-12-06).
    wire = weight_bytes(st.wire_dtype)
    # DeepSpeed's BF16_Optimizer (memory.uses_bf16_optimizer) partitions the fp32 master weights and Adam over DP
    # at ZeRO-0 too, and all-gathers the updated bf16 weights after its step (PP2 x DP2 bf16 ZeRO-0: one
    # all_gather_into_tensor of the stage's bf16 weights a step).
    bf16_opt = uses_bf16_optimizer(st.dtype, st.zero_stage, st.grad_accum_fp32, p)
    for stage, x in enumerate(stages):
        params = stage_n[stage]
        grad_b = params * wire
        par_b = params * w
        buckets = max(1, math.ceil(params / REDUCE_BUCKET_ELEMENTS))
        bwd_window = (bb.total * blocks[stage]) * x["k"]
        link = links["dp"]
        if r <= 1:
            exposed = 0.0
        elif st.zero_stage == 0:
            exposed = buckets * all_reduce_s(grad_b / buckets, r, link) + (gather_s(par_b, r, link) if bf16_opt else 0.0)
        elif st.zero_stage == 1:
            # ZeRO 1/2 reduce each gradient bucket with an all-reduce, not a reduce-scatter (module docstring)
            comm = buckets * all_reduce_s(grad_b / buckets, r, link)
            hide = bwd_window if overlap and p == 1 else 0.0
            exposed = max(0.0, comm - hide) + gather_s(par_b, r, link)
        elif st.zero_stage == 2:
            per_mb = buckets * all_reduce_s(grad_b / buckets, r, link)
            hide = bwd_window if overlap else 0.0
            exposed = m * max(0.0, per_mb - hide) + gather_s(par_b, r, link)
        else:
            reduce = all_reduce_s(grad_b, r, link) if sp > 1 else gather_s(grad_b, r, link)
            # DeepSpeed ZeRO-3 fetches parameters module by module (stage3 parameter coordinator), a module's fetch
            # and each prefetch walk one all-gather, and re-gathers for the backward only what it released after
            # the forward: the calls and elements of memory.zero3_gathered's replay of that coordinator (held call
            # for call to DeepSpeed's on CPU ranks, bench/steptime/results.md), each call paying the link latency
            # (a phase's calls taken as equal in size, which matters only where NCCL's protocol choice depends on
            # it). ZeRO 3 runs without a pipeline, so the stage is the whole model.
            fetches = zero3_gathered(shape, st)     # the recompute's gathers included
            per_mb = reduce + sum(calls * gather_s(elements * w / calls, r, link)
                                  for calls, elements in (fetches.forward_gathers, fetches.backward_gathers) if calls)
            hide = x["compute"] if overlap else 0.0
            exposed = m * max(0.0, per_mb - hide)
        dp_exposed.append(exposed)
        shard = params / (r if st.zero_stage >= 1 or bf16_opt else 1)
        tensors = 1 if st.zero_stage in (1, 2) or bf16_opt else 9 * max(1, blocks[stage]) + 3
        opt.append(_optimizer_s(shard, st, prof, tensors) * stretch)
    # The step's one synchronisation where no micro-batch has one (ZeRO 0/1 data parallelism alone): the gradient
    # reduce waits for the ZeRO group's slowest rank over the whole step's compute.
    end_wait = [0.0 if x["syncs"] else prof.straggler_fraction(r, m * x["busy"]) * m * x["busy"]
                + _release_beyond_latency(prof, r, m * x["busy"], st) for x in stages]
    tail = max(e + o + g + w_ for e, o, g, w_ in zip(dp_exposed, opt, engine_step, end_wait))
    i_tail = max(range(p), key=lambda i: dp_exposed[i] + opt[i] + engine_step[i] + end_wait[i])
    step = pipeline_s + tail

    c = slow["cost"]
    f_model = flops_per_token(shape, s)
    f_hw = f_model + recompute_flops_per_token(shape, s, st.recompute, checkpointed_layers(shape, st))
    tokens_per_s = st.tokens_per_step / step
    tflops = f_model * tokens_per_s / world / 1e12
    hw_tflops = f_hw * tokens_per_s / world / 1e12
    tokens = float(train_tokens) if train_tokens else 0.0
    compute_s = m * slow["compute"] + opt[i_tail]
    return StepTime(
        step_time_s=step, compute_s=compute_s, bubble_s=pipeline_s - m * slow["time"],
        tp_comm_s=m * c.tp, pp_comm_s=m * slow["pp"], dp_comm_exposed_s=dp_exposed[i_tail],
        tokens_per_s=tokens_per_s, flops_per_token=f_model, hardware_flops_per_token=f_hw,
        tflops_per_gpu=tflops, hardware_tflops_per_gpu=hw_tflops, mfu=tflops / hw.peak_tflops if hw.peak_tflops else 0.0,
        train_tokens=tokens, train_days=tokens / tokens_per_s / 86400 if tokens else 0.0,
        gemm_s=m * c.gemm * slow["k"], attention_s=m * c.attention * slow["k"], memory_bound_s=m * c.memory * slow["k"],
        framework_s=m * c.framework * slow["k"],
        host_bound_s=m * slow["host_wait"],
        engine_s=m * hooks[stages.index(slow)] + engine_step[i_tail],
        straggler_s=m * slow["wait"] + end_wait[i_tail],
        sp_comm_s=m * c.sp, recompute_s=m * slow["recompute"], optimizer_s=opt[i_tail], profile=prof.name)


def _selective_recompute(shape: ModelShape, st: Strategy, prof: Profile, bf: Cost) -> Cost:
    """What one selectively checkpointed block adds per micro-batch (module docstring, recompute (selective)): its
    forward's element-wise operators and framework time again, and the dispatch mode's cost where the profile
    measured it; the host's issue time on a GPU, measured whole, else taken as the forward's."""
    framework, host = prof.selective(shape.arch, st.dtype)
    return Cost(memory=bf.memory, framework=bf.framework + (framework or 0.0),
                host=host if host is not None else bf.host)


def _release_beyond_latency(prof: Profile, ranks: int, segment_s: float, st: Strategy, unshared: bool = False) -> float:
    """What one synchronisation of `ranks` consecutive ranks costs after `segment_s` of compute (profile.release)
    beyond the latency its link already charges (fitted from collectives after ~1 ms of GEMMs): 0 without the
    measurement. `unshared`: the release calibrate measured with only the compute slots' ranks busy
    (profile.release_unshared), beyond the same link's latency (measured with every rank busy, so an under-charge
    where the pair's own latency is lower unshared)."""
    if ranks <= 1 or not prof.release:
        return 0.0
    link = _span(prof, ranks, 1, st.gpus_per_node)[0]
    return max(0.0, prof.release_s(ranks, segment_s, unshared) - link.latency_s)


def _syncs_per_micro_batch(shape: ModelShape, st: Strategy, stage: int) -> tuple[int, int]:
    """(synchronisations, the largest group among them) that one micro-batch meets on a pipeline stage: the
    collectives and sends the module docstring's terms charge, counted the same way (stragglers)."""
    blocks = blocks_in_stage(shape, st, stage)
    ckpt = checkpointed_in_stage(shape, st, stage)     # their forward's collectives run again
    t, usp, cp, p, r = st.tensor_degree, st.sequence_degree, st.context_degree, st.pipeline_degree, st.zero_partition_degree
    syncs, group = 0, 1
    if t > 1 and st.sequence_parallel:   # an all-gather and a reduce-scatter for each all-reduce; the norms' grads
        syncs, group = syncs + 8 * blocks + 4 * ckpt + _sp_norm_params(shape) * blocks, max(group, t)
    elif t > 1:
        syncs, group = syncs + 4 * blocks + 2 * ckpt, max(group, t)
    if usp > 1:
        syncs, group = syncs + 8 * blocks + 4 * ckpt, max(group, usp)
    if cp > 1:
        syncs, group = syncs + 2 * blocks + ckpt + cp * blocks, max(group, cp)
    if r > 1 and st.zero_stage == 3:
        fetches = zero3_gathered(shape, st)
        syncs, group = syncs + fetches.forward_gathers[0] + fetches.backward_gathers[0] + 1, max(group, r)
    elif r > 1 and st.zero_stage == 2:
        syncs, group = syncs + 1, max(group, r)
    if p > 1:
        syncs, group = syncs + 2 * ((stage > 0) + (stage < p - 1)), max(group, 2)
    return syncs, group


def _hooked_modules(shape: ModelShape, blocks: int, stage: int, p: int) -> int:
    """nn.Modules of the transformers model on a stage, every one of which DeepSpeed ZeRO-3 hooks (stage3
    _register_hooks_recursively: pre/post forward and backward on each submodule). Per block, LLaMA: the layer,
    self_attn, q, k, v, o, mlp, gate, up, down, act_fn, 2 RMSNorms (13); BLOOM: the block, 2 LayerNorms,
    self_attention, query_key_value, dense, attention_dropout, mlp, dense_h_to_4h, gelu_impl, dense_4h_to_h (11);
    GPT-2: the block, ln_1, attn, c_attn, c_proj, 2 dropouts, ln_2, mlp, c_fc, c_proj, act, dropout (13). Outside
    the blocks (LLaMA, BLOOM 7; GPT-2 8): the CausalLM wrapper, the base model, the layers' ModuleList, the
    embedding(s), final norm, rotary / embedding LayerNorm / dropout, the head. Counted from the modules
    transformers builds: LlamaForCausalLM of recipe=tiny has 59 = 4 x 13 + 7, BloomForCausalLM with 4 layers 51.
    ZeRO-3 does not compose with the pipeline engine; a stage there counts its blocks and 3 per end."""
    per_block = 11 if shape.arch == "bloom" else 13
    outside = 8 if shape.arch == "gpt" else 7
    return blocks * per_block + (outside if p == 1 else 3 * ((stage == 0) + (stage == p - 1)))


def _zero3_hooks_s(shape: ModelShape, st: Strategy, prof: Profile, costs: list, ckpts: list) -> tuple[list, list]:
    """(per micro-batch, per step) by stage: ZeRO-3's engine work beyond a plain model (forward and backward hooks:
    fetch / release / partition decisions in Python; the boundary's partitioned step), the profile's measured
    seconds per hooked module and per parameter tensor, every micro-batch (zero3_module_s, zero3_param_s) and once
    a step (zero3_module_step_s, zero3_param_step_s; `launcher calibrate`: a ZeRO-3 engine against a plain model at
    1 and 3 micro-batches a step); 0 without ZeRO-3. Each checkpointed block (`ckpts`, full or selective: the
    block's modules run again either way) adds its parameter tensors x the profile's zero3_recompute_param_s a
    micro-batch (the forward hooks firing again in the recompute; calibrate's checkpointed Linear). recipe=tiny on
    2 CPU ranks, 2026-12-06: checkpointing every block added 35-37 ms a step under ZeRO-3 and 24-27 under ZeRO-1,
    where the plan had added 30.7 to both (bench/steptime/results.md)."""
    zero = [0.0] * len(costs)
    if st.zero_stage != 3:
        return zero, zero
    p = st.pipeline_degree
    blocks = blocks_per_stage(shape, st)
    modules = [_hooked_modules(shape, blocks[s], s, p) for s in range(p)]
    params = [_parameter_tensors(shape, blocks[s], s, p) for s in range(p)]
    per_block = _parameter_tensors(shape, 1, 0, 1) - _parameter_tensors(shape, 0, 0, 1)   # one block's tensors
    return ([mo * prof.zero3_module_s + pa * prof.zero3_param_s + c * per_block * prof.zero3_recompute_param_s
             for mo, pa, c in zip(modules, params, ckpts)],
            [mo * prof.zero3_module_step_s + pa * prof.zero3_param_step_s for mo, pa in zip(modules, params)])


def _parameter_tensors(shape: ModelShape, blocks: int, stage: int, p: int) -> int:
    """Parameter tensors on a stage, each of which ZeRO-3 tracks with its own hooks (profile.zero3_param_s).
    Per block, LLaMA and Mistral: 7 linear weights + 2 RMSNorm weights (9); Qwen2: the same + q, k, v biases (12);
    BLOOM and GPT-2: 4 linears and 2 LayerNorms, each
    a weight and a bias (12). Outside the blocks, LLaMA: embedding, final norm (+ the head unless tied); BLOOM: the
    embedding, its LayerNorm's 2, ln_f's 2 (+ head); GPT-2: wte, wpe, ln_f's 2 (+ head). recipe=tiny's
    LlamaForCausalLM: 4 x 9 + 3 = 39 (transformers' named_parameters()). A pipeline stage counts its blocks and
    the embedding (first) or final norm and head (last)."""
    per_block = (12 if shape.arch == "qwen2" else 9) if shape.arch in LLAMA_FAMILY else 12
    embed = {"bloom": 3, "gpt": 2}.get(shape.arch, 1)
    final_norm = 1 if shape.arch in LLAMA_FAMILY else 2
    head = 0 if shape.tied_embeddings and p == 1 else 1
    if p == 1:
        return blocks * per_block + embed + final_norm + head
    return blocks * per_block + embed * (stage == 0) + (final_norm + head) * (stage == p - 1)


def _compute_stretch(costs: list, hooks: list, m: int, p: int, ranks: int, prof: Profile, stretch: float, p2p: float) -> float:
    """How much slower than alone each rank computes when a node runs more ranks than it has compute slots.

    The cores are shared, work-conservingly: a step takes at least its critical path at full speed (1F1B below,
    compute unstretched) and at least all the node's compute divided by its slots (the ranks' work: each of the
    ranks / p ranks of a stage computes m micro-batches of that stage, Graham 1969's bound for any schedule).
    A pipeline rank idle in fill and drain leaves its core to the others, so the stretch of a pipeline falls
    below ranks / slots; without a pipeline every rank computes at once and the stretch is ranks / slots.
    Returns k, with the 1F1B time of stages computing at k x their speed alone equal to the larger bound."""
    if stretch <= 1.0:
        return 1.0
    comm = [c.tp + c.sp + hk + 2 * ((s > 0) + (s < p - 1)) * p2p for s, (c, hk) in enumerate(zip(costs, hooks))]
    comp = [c.compute for c in costs]
    slow = max(range(p), key=lambda s: comp[s] + comm[s])
    critical = sum(comp) + sum(comm) + (m - 1) * (comp[slow] + comm[slow])
    work = (ranks / p) * m * sum(comp) / prof.compute_slots + m * comm[slow]
    if work <= critical:
        return 1.0
    return min(stretch, (work - sum(comm) - (m - 1) * comm[slow]) / (sum(comp) + (m - 1) * comp[slow]))


def _shared_pipeline(shape: ModelShape, st: Strategy, prof: Profile, bf: Cost, bb: Cost, recomputed: Cost,
                     first: Cost, last: Cost, hooks: list, p2p: float, ranks: int, blocks: list, ckpts: list,
                     accumulate: list) -> dict:
    """A pipeline's step on a node with more ranks than compute slots: its 1F1B schedule played out with the cores
    shared (processor sharing: while n ranks compute on c slots, each computes at min(1, c / n) of its speed alone).

    In fill and drain one stage's ranks wait for their neighbour and leave it the cores; in the steady state every
    stage computes and each rank gets its share. One stretch for the whole step (_compute_stretch, Graham's bound)
    cannot hold both: recipe=tiny TP2 x PP2 on 4 ranks and 2 cores, 2 micro-batches, spent ~104 ms a micro-batch in
    the steady slots and about half that in fill and drain, where the rank's pipeline sends and receives (its
    waits) came to 53 ms a step against the 90 ms one stretch charged (bench/steptime/results.md, 2026-12-05 by-term
    finding). Each stage's forward and backward of a micro-batch is its compute (stretched while it computes, as
    the schedule finds the cores), then what does not take a core: its TP / SP collectives, ZeRO's per-micro-batch
    hooks and engine work, the sends and receives to its neighbours (the plan's p2p), and its waits at those
    synchronisations on the compute it met, half the micro-batch's synchronisations in each pass (TP's and
    Ulysses' collectives are as many forward as backward): the profile's straggler fraction and release for the
    part computed with the cores shared (calibrate measures them with every rank busy), and those measured with
    only the slots' ranks busy (profile.straggler_unshared, release_unshared) for the part computed unshared. A
    4-rank calibration read a TP pair's wait at 0.31 of a 5 ms segment with every rank busy and 0.04 with two
    (bench/steptime/profile-4.yaml, profile.yaml); charged at every synchronisation it came to 64 ms of TP2 x PP2's
    plan against ~25 ms of waits measured. The end stages' embedding and head, and ZeRO's hooks, split between
    the passes as a block's compute does. In a step a block's compute and its collectives alternate; here each
    pass computes first and then synchronises (bench/steptime/shared-pipeline-2026-12-05/README.md: the pipeline's
    sends, receives and bubble plan 79 ms against 53 measured).

    Returns {"step": seconds of the pipeline for m micro-batches, "stretch": [per stage: the compute's time over
    its time alone], "wait": [per stage: its waits over the m micro-batches]}."""
    p, m = st.pipeline_degree, st.grad_accum_steps
    per_stage = ranks / p
    slots = prof.compute_slots
    fwd = bf.compute / (bf.compute + bb.compute) if bf.compute + bb.compute > 0 else 1 / 3
    passes = []         # passes[stage] = {"F": (compute alone, fixed, syncs, group), "B": ...}
    for stage in range(p):
        end = (first if stage == 0 else Cost()) + (last if stage == p - 1 else Cost())
        neighbours = (stage > 0) + (stage < p - 1)
        f = bf * blocks[stage] + end * fwd
        b = bb * blocks[stage] + recomputed * ckpts[stage] + end * (1 - fwd) + accumulate[stage]
        syncs, group = _syncs_per_micro_batch(shape, st, stage) if prof.straggler or prof.release else (0, 1)
        passes.append({"F": (f.compute, f.tp + f.sp + hooks[stage] * fwd + neighbours * p2p, syncs / 2, group),
                       "B": (b.compute, b.tp + b.sp + hooks[stage] * (1 - fwd) + neighbours * p2p, syncs / 2, group)})

    def wait(elapsed: float, shared_s: float, syncs: float, group: int) -> float:
        """The waits after `elapsed` seconds of compute, `shared_s` of them with the cores shared: each part at
        the fraction and release measured that way (the unshared tables where the profile has them)."""
        if not syncs or elapsed <= 0:
            return 0.0
        segment = elapsed / syncs
        share = min(1.0, shared_s / elapsed)
        return sum(part * (prof.straggler_fraction(group, segment, unshared) * elapsed
                           + syncs * _release_beyond_latency(prof, group, segment, st, unshared))
                   for part, unshared in ((share, False), (1.0 - share, True)) if part > 0)

    def order(stage: int) -> list:     # 1F1B: warm-up forwards, one forward one backward, cool-down backwards
        warm = min(p - stage - 1, m)
        seq = [("F", j) for j in range(warm)]
        for i in range(m - warm):
            seq += [("F", warm + i), ("B", i)]
        return seq + [("B", j) for j in range(m - warm, m)]

    seqs = [order(stage) for stage in range(p)]
    nxt, done = [0] * p, set()
    shared_spent = [0.0] * p
    running = [None] * p    # [phase "c" (compute: alone seconds left) or "x" (the rest: seconds left), left, op, elapsed]
    alone, elapsed, waits = [0.0] * p, [0.0] * p, [0.0] * p
    now = 0.0
    while True:
        for stage in range(p):
            if running[stage] is None and nxt[stage] < len(seqs[stage]):
                kind, j = seqs[stage][nxt[stage]]
                ready = (stage == 0 or ("F", stage - 1, j) in done) if kind == "F" else \
                        (stage == p - 1 or ("B", stage + 1, j) in done)
                if ready:
                    running[stage] = ["c", passes[stage][kind][0], (kind, j), 0.0]
                    alone[stage] += passes[stage][kind][0]
        live = [stage for stage in range(p) if running[stage] is not None]
        if not live:
            break
        computing = sum(running[stage][0] == "c" for stage in live)
        speed = min(1.0, slots / (computing * per_stage)) if computing else 1.0
        dt = min(running[stage][1] / (speed if running[stage][0] == "c" else 1.0) for stage in live)
        now += dt
        for stage in live:
            phase, left, (kind, j), spent = running[stage]
            if phase == "c":
                running[stage][1], running[stage][3] = left - dt * speed, spent + dt
                shared_spent[stage] += dt if speed < 1.0 else 0.0
            else:
                running[stage][1] = left - dt
            if running[stage][1] > 1e-15:
                continue
            if phase == "c":
                _, fixed, syncs, group = passes[stage][kind]
                w = wait(spent + dt, shared_spent[stage], syncs, group)
                shared_spent[stage] = 0.0
                elapsed[stage] += spent + dt
                waits[stage] += w
                running[stage] = ["x", fixed + w, (kind, j), 0.0]
            else:
                done.add((kind, stage, j))
                running[stage] = None
                nxt[stage] += 1
    return {"step": now, "stretch": [e / a if a > 0 else 1.0 for e, a in zip(elapsed, alone)], "wait": waits}


