"""`launcher plan --search`: every valid layout for the model and cluster, the ones that fit, ranked.

Candidates: tensor_degree (divisors of the heads, within one node), pipeline_degree (what divides the
rest of the world, at most one block per stage), ZeRO stage 0-3, micro batch (divisors of the per-replica
batch), recompute (off / full, the two the launcher can run: model.activation_checkpointing). The global
batch, sequence length, precision, cluster and model stay as configured; Ulysses SP stays as configured.

Validity is decided by the one set of rules, `resolve_layout` (config/layout.py), run on a plain copy of
the config with the candidate's values; memory and time by memory.py and steptime.py (per operator). Ranked by estimated
tokens/s; ties go to the layout with more memory headroom.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from omegaconf import OmegaConf

from launcher.config.errors import ConfigError
from launcher.config.layout import Layout, resolve_layout
from launcher.plan.inputs import Hardware, ModelShape, Strategy, model_shape, resolve_hardware, strategy
from launcher.plan.memory import MemoryEstimate, estimate_memory
from launcher.plan.steptime import StepTime, estimate_step_time


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


def _with(cfg: SimpleNamespace, tp: int, pp: int, zero: int, micro: int, recompute: bool) -> SimpleNamespace:
    parallel = SimpleNamespace(**{**vars(cfg.parallel), "tensor_degree": tp, "pipeline_degree": pp,
                                  "zero_stage": zero, "data_degree": None})
    batch = SimpleNamespace(**{**vars(cfg.batch), "micro_batch_size": micro})
    model = SimpleNamespace(**{**vars(cfg.model), "activation_checkpointing": recompute})
    return SimpleNamespace(**{**vars(cfg), "parallel": parallel, "batch": batch, "model": model})


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def evaluate(cfg, layout: Layout, shape: ModelShape, hw: Hardware) -> Candidate:
    """Memory and time of one resolved layout."""
    st = strategy(cfg, layout)
    tokens = cfg.train.tokens or cfg.train.steps * layout.tokens_per_step
    return Candidate(layout=layout, strategy=st, memory=estimate_memory(shape, st, hw),
                     time=estimate_step_time(shape, st, hw, tokens))


def search_layouts(cfg) -> tuple[list[Candidate], dict]:
    """All valid layouts that fit, best first, and counts of what was dropped and why."""
    plain = plain_config(cfg)
    shape = model_shape(plain.model)
    hw = resolve_hardware(plain.cluster, plain.precision.dtype)
    if hw is None:
        raise ConfigError("cluster.gpu", plain.cluster.gpu, "--search plans GPU clusters; CPU ranks have no peak to plan against",
                          "select a GPU cluster, e.g. cluster=a100-80gb")
    world = plain.cluster.nodes * plain.cluster.gpus_per_node
    sp = plain.parallel.sequence_degree
    gbs = plain.batch.global_batch_size
    counts = {"enumerated": 0, "invalid": 0, "does_not_fit": 0}
    fitting: list[Candidate] = []
    for tp in _divisors(plain.model.num_attention_heads):
        if tp > plain.cluster.gpus_per_node or world % (tp * sp):
            continue
        for pp in _divisors(world // (tp * sp)):
            if pp > plain.model.num_hidden_layers:
                continue
            dp = world // (tp * sp * pp)
            if gbs % dp:
                continue
            for zero in (0, 1, 2, 3):
                for micro in _divisors(gbs // dp):
                    for recompute in (False, True):
                        counts["enumerated"] += 1
                        c = _with(plain, tp, pp, zero, micro, recompute)
                        try:
                            layout = resolve_layout(c)
                        except ConfigError:
                            counts["invalid"] += 1
                            continue
                        cand = evaluate(c, layout, shape, hw)
                        if not cand.memory.fits:
                            counts["does_not_fit"] += 1
                            continue
                        fitting.append(cand)
    fitting.sort(key=lambda k: (-k.time.tokens_per_s, -k.memory.headroom_bytes))
    counts["fit"] = len(fitting)
    return fitting, counts


def _label(c: Candidate) -> str:
    st = c.strategy
    return (f"TP{st.tensor_degree} PP{st.pipeline_degree} DP{st.data_degree} Z{st.zero_stage} "
            f"mb{st.micro_batch_size} {'recompute' if st.recompute == 'full' else 'no-recompute'}")


def explain(c: Candidate, best: Candidate) -> str:
    """Why a layout wins or loses against the best: its biggest costs beyond pure compute."""
    t = c.time
    parts = []
    costs = {"bubble": t.bubble_s, "TP comm": t.tp_comm_s, "PP p2p": t.pp_comm_s, "DP comm": t.dp_comm_exposed_s}
    for name, sec in sorted(costs.items(), key=lambda kv: -kv[1]):
        if sec / t.step_time_s >= 0.01:
            parts.append(f"{name} {sec / t.step_time_s:.0%}")
    if c.strategy.recompute == "full":
        parts.append("recompute +{:.0%} FLOPs".format(t.hardware_flops_per_token / t.flops_per_token - 1))
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
                    "data_degree": st.data_degree, "zero_stage": st.zero_stage,
                    "micro_batch_size": st.micro_batch_size, "recompute": st.recompute,
                    "tokens_per_s": t.tokens_per_s, "step_time_s": t.step_time_s, "mfu": t.mfu,
                    "memory_total_bytes": c.memory.peak.total, "why": explain(c, ranked[0])})
    return out
