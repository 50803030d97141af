"""`launcher plan --search`: every layout `launcher train` would run for the model and cluster, the ones that fit, ranked.

Candidates: sequence_degree (Ulysses SP: divisors of the heads and of the sequence, within one node, llama
only, without TP or PP: what launcher/train.py runs), context_degree (ring-attention CP: divisors of the world
with seq_length % (2 CP) = 0, any span of nodes (its K/V passes are point-to-point sized, not all-to-all), llama
family only, without Ulysses, with or without TP and PP as train runs it: Llama 3's TP x CP x PP), tensor_degree
(divisors of the heads, within one node; our TP layers are the pipeline's layer list, so llama family and bloom only),
pipeline_degree (what divides the rest of the world, at most one block per stage, llama and bloom only),
Megatron sequence parallelism on and off wherever TP > 1 (LLaMA family; our TP layers: ZeRO 0-1 with a
pipeline, 0-2 without),
ZeRO stage 0-3 (0-1 with a pipeline), micro batch (divisors of the per-replica batch), recompute (off, every
block, and where a layout fits with every block checkpointed but not with none, the fewest checkpointed blocks a
stage that fit: model.activation_checkpointing, model.checkpoint_blocks; where none does not fit and the layout is
the transformers model's (no TP, PP, SP, CP), selective checkpointing too, of every block and of the fewest a stage
that fit: model.checkpoint_mode), and the loss: where the transformers model computes it (no TP or PP) and the whole
loss does not fit, the same layout with model.chunked_loss (one more forward of the head's GEMM: slower where both
fit, so not tried there), and the fewest checkpointed blocks with it as well as without (model.chunked_loss=true in
the config keeps it on every such layout instead). Held as configured: the global batch and the
sequence length (so the tokens per step), precision, cluster and model. The configured TP / PP / SP / ZeRO /
micro batch are only a starting point: they need not be a valid layout themselves.

Validity is decided by the rules `launcher train` and `submit` apply before any rank starts
(submit.validate_before_start): `resolve_layout` (config/layout.py), `check_supported` (config/supported.py) and
the host-memory check (plan/report.py), run on a plain copy of the config with the candidate's values; GPU
memory (every term, stricter than train's model-states refusal) by memory.py and time by steptime.py (per operator). The loops
skip the combinations those rules refuse outright (ZeRO 2-3 with a pipeline, TP at pipeline_degree 1 with
ZeRO-3, TP or PP for an architecture without our layer list (gpt), SP with TP or PP) before calling them, and the
pipeline cut each estimate reads per stage is computed once per (model, PP) (plan/stages.py, cached), and a
layout's step time is estimated only once it fits (_if_fits), which keeps a 405B model on 16,384 GPUs well under
2 s (0.35 s, bench/plan); every candidate that is kept still passes through all of them. Ranked by estimated
tokens/s; ties go to the layout with more memory headroom. Where a group can span nodes and the profile measured
nothing there, every kept layout is timed again with its groups' NICs added (network_ends), and the fastest there
and the least behind at its worse end are named beside the ranking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional
from types import SimpleNamespace

from omegaconf import OmegaConf

from launcher.config.errors import ConfigError
from launcher.config.layout import Layout, pipeline_accumulates_in_bf16, resolve_layout
from launcher.config.supported import LLAMA_FAMILY, PIPELINE_ARCHS, check_supported
from launcher.plan.inputs import (Hardware, ModelShape, Strategy, model_shape, nics_added_hardware, resolve_hardware,
                                  strategy)
from launcher.plan.memory import MemoryEstimate, blocks_in_stage, estimate_memory
from launcher.plan.steptime import StepTime, estimate_step_time
from launcher.plan.host import TOKEN_ID_BYTES, estimate_host_memory, host_capacity


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    strategy: Strategy
    memory: MemoryEstimate
    time: StepTime


def _namespace(node):
    """A plain, fast-to-read copy of a config (SimpleNamespace all the way down)."""
    if isinstance(node, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in node.items()})
    return node


def plain_config(cfg) -> SimpleNamespace:
    """The composed config as nested SimpleNamespaces: resolve_layout reads it exactly like the DictConfig."""
    return _namespace(OmegaConf.to_container(cfg, resolve=True))


def _with(cfg: SimpleNamespace, tp: int, pp: int, zero: int, micro: int, recompute: bool, sp: int = 1,
          megatron_sp: bool = False, cp: int = 1, checkpoint_blocks: Optional[int] = None,
          mode: str = "full", chunked: bool = False) -> SimpleNamespace:
    """The plain config with a candidate's values; `chunked`: the chunked loss asked for where the configured loss is
    the whole one (the configured chunked loss is kept wherever it runs)."""
    parallel = SimpleNamespace(**{**vars(cfg.parallel), "tensor_degree": tp, "pipeline_degree": pp, "sequence_degree": sp,
                                  "sequence_parallel": megatron_sp, "context_degree": cp, "zero_stage": zero,
                                  "data_degree": None})
    batch = SimpleNamespace(**{**vars(cfg.batch), "micro_batch_size": micro})
    model = SimpleNamespace(**{**vars(cfg.model), "activation_checkpointing": recompute,
                               "checkpoint_blocks": checkpoint_blocks if recompute else None,
                               "checkpoint_mode": mode if recompute else "full",
                               # model.chunked_loss where the runtime runs it (config/layout.py _check_chunked_loss)
                               "chunked_loss": (chunked or _configured_chunked(cfg)) and _chunkable(tp, pp)})
    return SimpleNamespace(**{**vars(cfg), "parallel": parallel, "batch": batch, "model": model})


def _configured_chunked(cfg: SimpleNamespace) -> bool:
    return bool(getattr(cfg.model, "chunked_loss", False))


def _chunkable(tp: int, pp: int) -> bool:
    """Whether train runs model.chunked_loss on the layout: the transformers model's head, no TP or PP (config/layout.py
    _check_chunked_loss)."""
    return tp == pp == 1


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


class _HostCheck:
    """check_host_memory's verdict (plan/report.py), computed once per grid and ZeRO stage.

    report.check_host_memory places all world_size ranks on their nodes for every call (seconds for
    16,384 GPUs over hundreds of candidates). The verdict only needs each distinct node composition (the
    fullest node decides), which depends on the TP / PP / SP / DP grid alone (so does the build path, host.py
    build_path: our layer list with stages or any TP, Megatron SP or not); and of the per-rank terms (host.py) only the data loader's one micro-batch of int64 ids depends on the micro batch, the same on
    every rank, so it is added exactly: ranks x (micro - micro_0) x seq x 8 B.
    """

    def __init__(self, cluster):
        self.capacity = host_capacity(cluster)
        self.nodes: dict = {}
        self.memo: dict = {}

    def fits(self, cfg, layout: Layout, st: Strategy, shape: ModelShape) -> bool:
        if self.capacity[0] is None:
            return True
        grid = (layout.tensor_degree, layout.pipeline_degree, layout.sequence_degree, layout.context_degree, layout.data_degree)
        if grid not in self.nodes:
            self.nodes[grid] = node_stage_sets(layout)
        key = (*grid, layout.zero_stage)
        if key not in self.memo:
            tokens = cfg.train.tokens or cfg.train.steps * layout.tokens_per_step
            self.memo[key] = (estimate_host_memory(shape, st, self.nodes[grid], tokens, self.capacity), st.micro_batch_size)
        h, micro0 = self.memo[key]
        total = h.total + h.ranks * (st.micro_batch_size - micro0) * st.seq_length * TOKEN_ID_BYTES
        return total <= self.capacity[0]


def node_stage_sets(layout: Layout) -> list[tuple[int, ...]]:
    """The distinct pipeline-stage compositions of the nodes: set(stages_by_node(layout)) without building the
    rank map. rankmap.py orders ranks TP, SP, CP, DP, PP innermost first, so rank r sits in stage r // (TP x SP x CP x DP)."""
    block = layout.tensor_degree * layout.sequence_degree * layout.context_degree * layout.data_degree
    g = layout.gpus_per_node
    found = set()
    for first in range(0, layout.nodes * g, g):
        lo, hi = first // block, (first + g - 1) // block
        # a node inside one stage (most nodes at 16,384 GPUs) needs no per-rank division
        found.add((lo,) * g if lo == hi else tuple(r // block for r in range(first, first + g)))
    return sorted(found)


# A pruning of the search, not a rule of `launcher train` (which runs any CP x TP x PP): CP is combined with TP and
# PP only while every CP rank keeps at least this many tokens. Llama 3 (Dubey et al. 2024, section 3.3.2) used CP 16
# at 131,072 tokens, 8,192 per rank, with TP 8 and PP 16; CP alone is still tried at every degree. Enumerating every
# CP degree with every TP and PP took recipe=llama-65b on 2,048 GPUs (seq 2,048) from 1,752 candidates in 4.1 s to
# 13,336 in 55 s (this 2-core machine, loaded), almost all of them rings of a few hundred tokens per rank.
COMPOSED_CP_MIN_TOKENS = 4096


def _zero_stages(tp: int, pp: int, megatron_sp: bool = False) -> tuple[int, ...]:
    if pp > 1:
        return (0, 1)  # DeepSpeed's pipeline engine: ZeRO 0-1 only (layout.py)
    if tp > 1:
        return (0, 1, 2)  # our TP layers on the plain engine run ZeRO 0-2 (launcher/parallel/tensor_model.py): ZeRO-3 refused
    return (0, 1, 2, 3)


def search_layouts(cfg) -> tuple[list[Candidate], dict]:
    """All layouts train accepts that fit, best first, and counts of what was dropped and why."""
    plain = plain_config(cfg)
    shape = model_shape(plain.model)
    hw = resolve_hardware(plain.cluster, plain.precision.dtype)
    if hw is None:
        raise ConfigError("cluster.gpu", plain.cluster.gpu, "--search plans GPU clusters; CPU ranks have no peak to plan against",
                          "select a GPU cluster, e.g. cluster=a100-80gb")
    gpn = plain.cluster.gpus_per_node
    world = plain.cluster.nodes * gpn
    gbs = plain.batch.global_batch_size
    heads, layers, arch = plain.model.num_attention_heads, plain.model.num_hidden_layers, plain.model.arch
    seq = plain.data.seq_length
    sps = [k for k in _divisors(heads) if k <= gpn and seq % k == 0] if arch in LLAMA_FAMILY else [1]
    cps = [k for k in _divisors(world) if k > 1 and seq % (2 * k) == 0] if arch in LLAMA_FAMILY else []
    # (Ulysses, CP) pairs: one of them 1; TP and PP without Ulysses (what train runs: config/layout.py).
    splits = [(sp, 1) for sp in sps] + [(1, cp) for cp in cps]
    counts = {"enumerated": 0, "invalid": 0, "does_not_fit": 0}
    chunk_twins = not _configured_chunked(plain)   # configured on, the chunked loss is every chunkable layout's
    fitting: list[Candidate] = []
    host = _HostCheck(plain.cluster)
    for sp, cp in splits:
        # CP composed with TP and PP only where the sequence is long enough to want it (COMPOSED_CP_MIN_TOKENS).
        composed = sp == 1 and (cp == 1 or seq // cp >= COMPOSED_CP_MIN_TOKENS)
        # TP runs our layer list at every pipeline degree (Layout.pipeline_layers): none for gpt (PIPELINE_ARCHS).
        for tp in _divisors(heads) if composed and arch in PIPELINE_ARCHS else [1]:
            if tp > gpn or world % (tp * sp * cp):
                continue
            for pp in _divisors(world // (tp * sp * cp)) if composed else [1]:
                if pp > layers or (pp > 1 and arch not in PIPELINE_ARCHS):
                    continue
                dp = world // (tp * sp * cp * pp)
                if gbs % dp:
                    continue
                for msp, zero in [(msp, z) for msp in ((False, True) if tp > 1 and arch in LLAMA_FAMILY else (False,))
                                  for z in _zero_stages(tp, pp, msp)]:
                    for micro in _divisors(gbs // dp):
                        kept_fits = None    # whether the same layout fits without recompute
                        for recompute, mode in ((False, "full"), (True, "full"), (True, "selective")):
                            # Selective checkpointing is faster than full and slower than none: tried only where none
                            # does not fit, and where train runs it (the transformers model: no TP, PP, SP, CP).
                            if mode == "selective" and not (kept_fits is False and tp == pp == sp == cp == 1):
                                continue
                            grid = (tp, pp, zero, micro, sp, msp, cp)
                            cand = _candidate(plain, grid, recompute, mode, False, shape, hw, host, counts)
                            if cand is _INVALID:
                                continue
                            if cand is None and chunk_twins and _chunkable(tp, pp):
                                # The chunked loss only where the whole one does not fit: where it fits, the whole
                                # one is faster (one forward of the head's GEMM fewer: steptime.end_costs).
                                twin = _candidate(plain, grid, recompute, mode, True, shape, hw, host, counts)
                                cand = None if twin is _INVALID else twin
                            if not recompute:
                                kept_fits = cand is not None
                            if cand is None:
                                continue
                            fitting.append(cand)
                            if recompute and kept_fits is False:
                                # Between the two: the fewest checkpointed blocks a stage that fit (Megatron's
                                # --recompute-num-layers), which recompute less than all of them.
                                # With the whole loss, and (where it runs) the chunked one, whose smaller loss end
                                # can leave room for fewer checkpointed blocks: +1 head GEMM against their recompute.
                                losses = {cand.strategy.chunked_loss}
                                if chunk_twins and _chunkable(tp, pp):
                                    losses.add(True)
                                for chunked in sorted(losses):
                                    fewest = _fewest_checkpointed(plain, grid, shape, hw, host, cand.strategy, mode,
                                                                  chunked)
                                    if fewest is not None:
                                        counts["enumerated"] += 1
                                        fitting.append(fewest)
    fitting.sort(key=lambda k: (-k.time.tokens_per_s, -k.memory.headroom_bytes))
    counts["fit"] = len(fitting)
    return fitting, counts


_INVALID = object()   # _candidate's verdict on a config train's rules refuse


def _candidate(plain, grid: tuple, recompute: bool, mode: str, chunked: bool, shape: ModelShape, hw: Hardware, host,
               counts: dict):
    """The candidate of one enumerated config: _INVALID where train's rules refuse it, None where it does not fit;
    counted in `counts`."""
    tp, pp, zero, micro, sp, msp, cp = grid
    counts["enumerated"] += 1
    c = _with(plain, tp, pp, zero, micro, recompute, sp, msp, cp, mode=mode, chunked=chunked)
    try:
        layout = resolve_layout(c)
        check_supported(c, layout)
    except ConfigError:
        counts["invalid"] += 1
        return _INVALID
    cand = _if_fits(c, layout, shape, hw, host)
    if cand is None:
        counts["does_not_fit"] += 1
    return cand


def _fitting(c, layout: Layout, shape: ModelShape, hw: Hardware, host) -> Optional[tuple[Strategy, MemoryEstimate]]:
    """The strategy and memory of a resolved config, or None where it does not fit the GPU or the node's host memory."""
    st = strategy(c, layout)
    memory = estimate_memory(shape, st, hw)
    return (st, memory) if memory.fits and host.fits(c, layout, st, shape) else None


def _timed(c, layout: Layout, shape: ModelShape, hw: Hardware, fit: tuple[Strategy, MemoryEstimate]) -> Candidate:
    st, memory = fit
    tokens = c.train.tokens or c.train.steps * layout.tokens_per_step
    return Candidate(layout=layout, strategy=st, memory=memory, time=estimate_step_time(shape, st, hw, tokens))


def _if_fits(c, layout: Layout, shape: ModelShape, hw: Hardware, host) -> Optional[Candidate]:
    """The candidate of a resolved config, or None where it does not fit. The step time, two thirds of an evaluation's
    cost, is estimated only for a layout that fits: most of a large search's candidates do not (the 405B config on
    16,384 GPUs: 479 of 1,903 fit), and a candidate that does not fit is dropped whatever its time."""
    fit = _fitting(c, layout, shape, hw, host)
    return None if fit is None else _timed(c, layout, shape, hw, fit)


def _fewest_checkpointed(plain, grid: tuple, shape: ModelShape, hw: Hardware, host, full: Strategy,
                         mode: str = "full", chunked: bool = False) -> Optional[Candidate]:
    """The candidate with the fewest model.checkpoint_blocks (1 .. a stage's blocks - 1) that fits, by bisection
    (memory falls as blocks are checkpointed: plan/memory.py checkpointed_in_stage), where the layout fits with every
    block checkpointed in model.checkpoint_mode `mode` (`full`, its strategy) and not with none; None where only all
    of them fit. `chunked`: planned with the chunked loss (model.chunked_loss) where the layout runs it."""
    tp, pp, zero, micro, sp, msp, cp = grid

    def at(n: int):
        c = _with(plain, tp, pp, zero, micro, True, sp, msp, cp, checkpoint_blocks=n, mode=mode, chunked=chunked)
        layout = resolve_layout(c)
        fit = _fitting(c, layout, shape, hw, host)
        return None if fit is None else (c, layout, fit)

    # The bisection asks only whether a count fits; the step time is estimated once, for the count it settles on.
    lo, hi, best = 1, max(blocks_in_stage(shape, full, s) for s in range(pp)) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        found = at(mid)
        if found is not None:
            best, hi = found, mid - 1
        else:
            lo = mid + 1
    if best is None:
        return None
    c, layout, fit = best
    return _timed(c, layout, shape, hw, fit)


def _label(c: Candidate) -> str:
    st = c.strategy
    sp = f" SP{st.sequence_degree}" if st.sequence_degree > 1 else ""
    sp += f" CP{st.context_degree}" if st.context_degree > 1 else ""
    tp = f"TP{st.tensor_degree}+SP" if st.sequence_parallel else f"TP{st.tensor_degree}"   # Megatron SP inside TP
    return (f"{tp} PP{st.pipeline_degree}{sp} DP{st.data_degree} Z{st.zero_stage} "
            f"mb{st.micro_batch_size} {_recompute_label(st)}" + (" chunked-loss" if st.chunked_loss else ""))


def _recompute_label(st: Strategy) -> str:
    if not st.checkpointing:
        return "no-recompute"
    name = "recompute" if st.recompute == "full" else "selective recompute"
    return name if st.checkpoint_blocks is None else f"{name} {st.checkpoint_blocks}/stage"


def explain(c: Candidate, best: Candidate) -> str:
    """Why a layout wins or loses against the best: its biggest costs beyond pure compute."""
    t = c.time
    parts = []
    costs = {"bubble": t.bubble_s, "TP comm": t.tp_comm_s, "PP p2p": t.pp_comm_s, "DP comm": t.dp_comm_exposed_s,
             "SP/CP comm": t.sp_comm_s, "stragglers": t.straggler_s}
    for name, sec in sorted(costs.items(), key=lambda kv: -kv[1]):
        if sec / t.step_time_s >= 0.01:
            parts.append(f"{name} {sec / t.step_time_s:.0%}")
    if c.strategy.recompute == "full":
        parts.append("recompute +{:.0%} FLOPs".format(t.hardware_flops_per_token / t.flops_per_token - 1))
    st = c.strategy
    if pipeline_accumulates_in_bf16(st.pipeline_degree, st.zero_stage, st.dtype, "fp32" if st.grad_accum_fp32 else None):
        parts.append("gradients accumulated in bf16")   # the warning (JSON rows) says how not to; fp32_accumulation the price
    parts.append(f"{c.memory.headroom_bytes / 1e9:.0f} GB free")
    if c is not best:
        parts.insert(0, f"{1 - t.tokens_per_s / best.time.tokens_per_s:.1%} slower")
    return ", ".join(parts)


def search_rows(ranked: list[Candidate], top: int = 10) -> list[dict]:
    """The top layouts as JSON-ready dicts."""
    out = []
    for c in ranked[:top]:
        st, t = c.strategy, c.time
        out.append({"layout": _label(c), "tensor_degree": st.tensor_degree, "pipeline_degree": st.pipeline_degree,
                    "sequence_degree": st.sequence_degree, "sequence_parallel": st.sequence_parallel,
                    "context_degree": st.context_degree, "data_degree": st.data_degree, "zero_stage": st.zero_stage,
                    "micro_batch_size": st.micro_batch_size, "recompute": st.recompute,
                    "checkpoint_blocks": st.checkpoint_blocks, "chunked_loss": st.chunked_loss,
                    "tokens_per_s": t.tokens_per_s, "step_time_s": t.step_time_s, "mfu": t.mfu,
                    "memory_total_bytes": c.memory.peak.total, "why": explain(c, ranked[0]),
                    "warnings": list(c.layout.warnings)})
    return out


def network_ends(cfg, ranked: list[Candidate], rows: list[dict]) -> Optional[dict]:
    """The ranking at the network's other end, where the plan has one; None where it has not (one node, a profile
    that measured its groups across nodes, nothing ranked).

    The table charges a collective group that spans nodes one NIC a GPU (profile.Profile.inter_for says why); with
    several GPUs of the group on each node, NCCL's rings can take all their NICs (profile.nics_added), and the
    published runs sit at either end (bench/published/results.md). A layout ranked first at one end need not be at
    the other (LLaMA-13B on 8 H100 nodes: the first here is 2% behind the fastest there). So beside the ranking this
    gives the fastest layout with the NICs added, and the layout whose larger loss over the two ends (its step time
    over that end's fastest, minus 1) is least: the minimax-regret choice (Savage 1951) while nothing has measured
    which end a cluster is at (`launcher submit --calibrate` on 2+ nodes does; a profile it wrote has no other end).
    Sets `step_time_nics_added_s` on each of `rows` (search_rows: the first len(rows) of `ranked`; None without
    another end)."""
    plain = plain_config(cfg)
    hw_added = nics_added_hardware(resolve_hardware(plain.cluster, plain.precision.dtype), plain.cluster.nodes,
                                   plain.cluster.gpus_per_node)
    if not ranked or hw_added is None:
        for row in rows:
            row["step_time_nics_added_s"] = None
        return None
    shape = model_shape(plain.model)
    there = [estimate_step_time(shape, c.strategy, hw_added).step_time_s for c in ranked]
    here = [c.time.step_time_s for c in ranked]
    for row, t in zip(rows, there):
        row["step_time_nics_added_s"] = t
    fastest = min(range(len(ranked)), key=there.__getitem__)       # min keeps the first of equals: the better ranked
    loss = [max(here[i] / here[0], there[i] / there[fastest]) - 1 for i in range(len(ranked))]
    least = min(range(len(ranked)), key=loss.__getitem__)

    def one(i: int) -> dict:
        return {"rank": i + 1, "layout": _label(ranked[i]), "step_time_s": here[i], "step_time_nics_added_s": there[i],
                "worst_loss": loss[i]}

    return {"fastest_nics_added": one(fastest), "first": one(0), "least_worst_loss": one(least)}


def fp32_accumulation(cfg, ranked: list[Candidate], rows: list[dict]) -> None:
    """What asking for fp32 gradient accumulation would cost each shown layout that sums its micro-batches'
    gradients in bf16 (config.layout.pipeline_accumulates_in_bf16: bf16 ZeRO-1 pipelines without
    precision.grad_accum_dtype=fp32, which the plan warns about): the same layout with that key set, where DeepSpeed
    runs its BF16_Optimizer (plan/memory.py uses_bf16_optimizer: a whole fp32 gradient buffer instead of the bf16
    gradients, its accumulation charged by steptime.bf16_accumulation). Sets `fp32_accumulation` on each of `rows`
    ({step_time_s, slower, memory_total_bytes, fits}; None where the layout does not accumulate in bf16) and adds
    the figure to its "why", so the warning comes with the price of following it. The search itself ranks the
    layouts with the accumulation dtype the config asks for."""
    from dataclasses import replace

    plain = plain_config(cfg)
    shape, hw = model_shape(plain.model), resolve_hardware(plain.cluster, plain.precision.dtype)
    for c, row in zip(ranked, rows):
        st = c.strategy
        if not pipeline_accumulates_in_bf16(st.pipeline_degree, st.zero_stage, st.dtype,
                                            "fp32" if st.grad_accum_fp32 else None):
            row["fp32_accumulation"] = None
            continue
        twin = replace(st, grad_accum_fp32=True)
        memory, t = estimate_memory(shape, twin, hw), estimate_step_time(shape, twin, hw)
        slower = t.step_time_s / c.time.step_time_s - 1
        row["fp32_accumulation"] = {"step_time_s": t.step_time_s, "slower": slower,
                                    "memory_total_bytes": memory.peak.total, "fits": memory.fits}
        row["why"] += (f"; grad_accum_dtype=fp32: {slower:+.1%} time, "
                       + (f"{memory.headroom_bytes / 1e9:.0f} GB free" if memory.fits else "does not fit"))


# The keys the search holds fixed (the tokens per step) and where their value comes from when nothing sets them.
HELD_KEYS = ("batch.global_batch_size", "data.seq_length")


def held_batch(cfg, overrides) -> dict:
    """The batch the search keeps fixed, and a note when it is the defaults' and not the user's.

    conf/config.yaml's batch (32 sequences) and the default data option's seq_length (256) are sized for its default
    model (tiny) on one node. `plan model=llama-65b cluster.nodes=64 --search` without a batch of its own would rank
    layouts for 8,192 tokens a step on 512 GPUs (16 tokens per GPU; bubble-bound, MFU ~3.5%), which reads as a result
    about the model, not about the batch. So when no recipe and no override set a held key and the model is not
    config.yaml's, the note says so and names the model's recipes (whose batches are the published runs')."""
    from launcher.config.compose import compose, default_option, recipes_for_model

    gbs, seq = cfg.batch.global_batch_size, cfg.data.seq_length
    gpus = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    held = {"global_batch_size": gbs, "seq_length": seq, "tokens_per_step": gbs * seq,
            "tokens_per_gpu": gbs * seq / gpus, "defaulted_keys": [], "note": None}
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    if cfg.recipe_name or cfg.model.name == default_option("model"):
        return held
    # A data option chosen on the command line sets its own seq_length: chosen, not defaulted.
    defaulted = [k for k in HELD_KEYS if k not in keys and not (k == "data.seq_length" and "data" in keys)]
    if not defaulted:
        return held
    held["defaulted_keys"] = defaulted
    source = {"batch.global_batch_size": (gbs, "conf/config.yaml"),
              "data.seq_length": (seq, f"conf/data/{default_option('data')}.yaml")}
    said = " and ".join(f"{k}={source[k][0]} ({source[k][1]})" for k in defaulted)
    fix = f"set {'them' if len(defaulted) > 1 else 'it'} on the command line"
    recipes = recipes_for_model(cfg.model.name)
    if recipes:
        r = compose([f"recipe={recipes[0]}"])
        fix += (f", or start from recipe={recipes[0]} ({r.batch.global_batch_size:,} sequences x "
                f"{r.data.seq_length:,} = {r.batch.global_batch_size * r.data.seq_length:,} tokens a step, with "
                f"cluster.* and parallel.* overrides as here)")
    held["note"] = (f"{said} {'are the defaults' if len(defaulted) > 1 else 'is the default'}, sized for the "
                    f"{default_option('model')} model, not chosen for {cfg.model.name}: these layouts are ranked for "
                    f"{gbs * seq:,} tokens a step on {gpus:,} GPUs ({gbs * seq / gpus:,.0f} tokens per GPU). For a "
                    f"ranking at the batch you will train with, {fix}.")
    return held
