"""Which GPU runs which slice of the model: node/GPU -> global rank -> (tp, sp, cp, dp, pp) coordinates.

Order, innermost first: tensor, sequence (Ulysses), context (ring), data, pipeline.

    rank = (((pp * DP + dp) * CP + cp) * SP + sp) * TP + tp          (every index 0-based)
    node = rank // gpus_per_node,   gpu = rank % gpus_per_node

- TP innermost: a tensor-parallel group is TP consecutive ranks, so with
  TP <= gpus_per_node (and gpus_per_node % TP == 0) it lies inside one node and
  its per-layer all-reduces stay on NVLink. This is Megatron-LM's order
  (megatron/core/parallel_state.py, initialize_model_parallel: "tp-cp-ep-dp-pp",
  tensor fastest; Narayanan et al. 2021, section 3.3: "tensor model parallelism
  should generally be used up to degree g when using g-GPU servers").
- then DP, then PP outermost. DeepSpeed's pipeline grid uses the same order:
  `PipeModelDataParallelTopology(num_pp, num_mp, num_dp)` is a row-major
  `ProcessTopology(axes=['pipe', 'data', 'model'], dims=[pp, dp, mp])`
  (deepspeed/runtime/pipe/topology.py), i.e. model fastest, pipe slowest.
  tests/plan/test_rankmap.py checks our formula against its `get_coord`.
- Ulysses sequence parallelism (sp) sits between TP and DP: its all-to-all
  is the next-most bandwidth-hungry collective after TP's all-reduce.
- Megatron sequence parallelism (parallel.sequence_parallel) adds no axis: the
  TP ranks of a group also split each sequence outside the TP regions, TP rank
  tp holding tokens [tp * s/TP, (tp + 1) * s/TP) there (launcher/parallel/tensor.py).
  The map shows that slice per rank (`tokens`).
- Context parallelism (cp, ring attention) likewise, Megatron's "tp-cp-ep-dp-pp": its K/V
  rotations run once per layer. SP and CP are never both > 1 (layout.py), and either way the
  sequence-splitting ranks of a replica are consecutive, which is how DeepSpeed's
  parallel_state_sp builds its groups.

No torch here: `launcher plan --rank-map` must run on a laptop.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.layout import Layout


@dataclass(frozen=True)
class RankCoord:
    """One rank's place on the cluster and in the parallel grid."""

    rank: int
    node: int
    gpu: int
    tp: int
    sp: int
    dp: int
    pp: int
    cp: int = 0


def global_rank(layout: Layout, tp: int, sp: int, dp: int, pp: int, cp: int = 0) -> int:
    """The global rank of grid coordinates (the formula in the module docstring)."""
    return (((pp * layout.data_degree + dp) * layout.context_degree + cp) * layout.sequence_degree + sp) \
        * layout.tensor_degree + tp


def rank_coord(layout: Layout, rank: int) -> RankCoord:
    """Coordinates of `rank`: the inverse of `global_rank` by mixed-radix division, TP digit first."""
    if not 0 <= rank < layout.world_size:
        raise ValueError(f"rank {rank} outside 0..{layout.world_size - 1}")
    rest, tp = divmod(rank, layout.tensor_degree)
    rest, sp = divmod(rest, layout.sequence_degree)
    rest, cp = divmod(rest, layout.context_degree)
    pp, dp = divmod(rest, layout.data_degree)
    node, gpu = divmod(rank, layout.gpus_per_node)
    return RankCoord(rank=rank, node=node, gpu=gpu, tp=tp, sp=sp, dp=dp, pp=pp, cp=cp)


def rank_map(layout: Layout) -> list[RankCoord]:
    """One row per rank, in rank order."""
    return [rank_coord(layout, r) for r in range(layout.world_size)]


def tensor_groups(layout: Layout) -> list[list[int]]:
    """The ranks of each tensor-parallel group (ranks that differ only in tp)."""
    groups: dict[tuple[int, int, int], list[int]] = {}
    for c in rank_map(layout):
        groups.setdefault((c.pp, c.dp, c.sp, c.cp), []).append(c.rank)
    return list(groups.values())


def tensor_groups_crossing_nodes(layout: Layout) -> list[list[int]]:
    """TP groups whose ranks sit on more than one node (empty when TP divides gpus_per_node)."""
    return [g for g in tensor_groups(layout) if len({r // layout.gpus_per_node for r in g}) > 1]


def sequence_slice(layout: Layout, c: RankCoord) -> tuple[int, int]:
    """The tokens [start, end) of each sequence rank `c` holds outside the TP regions under Megatron SP
    (its TP rank's share; launcher/parallel/tensor.py splits dim 1 in TP-rank order)."""
    n = layout.seq_length // layout.tensor_degree
    return c.tp * n, (c.tp + 1) * n


def format_rank_map(layout: Layout) -> str:
    """A plain-text table, one line per rank (384 lines for bloom-176b)."""
    show_sp = layout.sequence_degree > 1
    show_cp = layout.context_degree > 1
    show_tokens = layout.sequence_parallel
    head = ("node  gpu   rank    tp" + ("    sp" if show_sp else "") + ("    cp" if show_cp else "") + "    pp    dp"
            + ("  tokens" if show_tokens else ""))
    if show_cp:
        formula = "rank = ((pp*DP + dp)*CP + cp)*TP + tp (TP innermost, then CP, DP, PP outermost)"
    else:
        formula = "rank = ((pp*DP + dp)*SP + sp)*TP + tp (TP innermost, then SP, DP, PP outermost)"
    megatron_sp = (f" (+ Megatron SP: the TP ranks also split each sequence, {layout.seq_length // layout.tensor_degree} "
                   "tokens each outside attention/MLP)" if show_tokens else "")
    lines = [
        f"# TP {layout.tensor_degree}{megatron_sp} x " + (f"SP {layout.sequence_degree} x " if show_sp else "")
        + (f"CP {layout.context_degree} x " if show_cp else "")
        + f"DP {layout.data_degree} x PP {layout.pipeline_degree} = {layout.world_size} ranks on "
        f"{layout.nodes} nodes x {layout.gpus_per_node} GPUs; " + formula,
        head,
    ]
    for c in rank_map(layout):
        sp = f"{c.sp:>6}" if show_sp else ""
        cp = f"{c.cp:>6}" if show_cp else ""
        tokens = "  {}-{}".format(*sequence_slice(layout, c)) if show_tokens else ""
        lines.append(f"{c.node:>4} {c.gpu:>4} {c.rank:>6} {c.tp:>5}{sp}{cp} {c.pp:>5} {c.dp:>5}{tokens}")
    crossing = tensor_groups_crossing_nodes(layout)
    lines.append(f"# {len(tensor_groups(layout))} tensor-parallel groups, "
                 + ("all inside one node" if not crossing else f"{len(crossing)} crossing nodes, e.g. ranks {crossing[0]}"))
    return "\n".join(lines)


def write_rank_map_png(layout: Layout, path: str) -> str:
    """Draw the map as a nodes x GPUs grid: colour = pipeline stage, label = rank and (tp, dp).

    matplotlib is imported here (Agg, no display) so `launcher plan` stays instant without it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows = rank_map(layout)
    nodes, gpus = layout.nodes, layout.gpus_per_node
    cmap = plt.get_cmap("tab20" if layout.pipeline_degree > 10 else "tab10")
    # Past 64 nodes the labels would be unreadable: draw colours and TP boxes only, rows squeezed.
    labelled = nodes <= 64
    fig, ax = plt.subplots(figsize=(1.0 + 1.1 * gpus, 1.0 + (0.45 if labelled else 0.1) * nodes))
    fontsize = 7 if layout.world_size <= 64 else 5
    for c in rows:
        colour = cmap(c.pp % cmap.N)
        ax.add_patch(Rectangle((c.gpu, c.node), 1, 1, facecolor=colour, edgecolor="white", linewidth=0.8))
        label = (f"r{c.rank}\ntp{c.tp} dp{c.dp}" + (f" sp{c.sp}" if layout.sequence_degree > 1 else "")
                 + (f" cp{c.cp}" if layout.context_degree > 1 else ""))
        if labelled:
            ax.text(c.gpu + 0.5, c.node + 0.5, label, ha="center", va="center", fontsize=fontsize)
    # Outline each TP group so it is visible that it stays inside a node.
    for group in tensor_groups(layout):
        first = rows[group[0]]
        if all(r // gpus == first.node for r in group):
            ax.add_patch(Rectangle((first.gpu, first.node), len(group), 1, fill=False, edgecolor="black", linewidth=1.6))
    ax.set_xlim(0, gpus)
    ax.set_ylim(nodes, 0)
    ax.set_xticks([g + 0.5 for g in range(gpus)], [str(g) for g in range(gpus)])
    step = 1 if labelled else 8
    ax.set_yticks([n + 0.5 for n in range(0, nodes, step)], [str(n) for n in range(0, nodes, step)], fontsize=6 if nodes > 16 else 8)
    ax.set_xlabel("GPU in node")
    ax.set_ylabel("node")
    ax.set_title(f"TP {layout.tensor_degree} x DP {layout.data_degree} x PP {layout.pipeline_degree}"
                 f" = {layout.world_size} ranks; colour = pipeline stage, black box = TP group", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
