"""The rank map against two independent references: the Megatron formula written out by hand, and
DeepSpeed's own PipeModelDataParallelTopology (pure Python, no processes)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.plan.rankmap import rank_map, tensor_groups, tensor_groups_crossing_nodes, write_rank_map_png

REPO = Path(__file__).resolve().parents[2]

# recipe -> (nodes, gpus_per_node, tp, pp, dp) from the recipe files' own provenance comments
# (bloom-176b: BigScience tr11 script, 48 nodes x 8, TP 4, PP 12, DP 8; llama-65b: 2048 A100s, TP 8, PP 4 -> DP 64).
RECIPES = {
    "bloom-176b": (48, 8, 4, 12, 8),
    "llama-65b": (256, 8, 8, 4, 64),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_rank_map_matches_megatron_formula_and_deepspeed_topology(recipe):
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    nodes, gpus, tp, pp, dp = RECIPES[recipe]
    layout = resolve_layout(compose([f"recipe={recipe}"]))
    assert (layout.nodes, layout.gpus_per_node, layout.tensor_degree, layout.pipeline_degree, layout.data_degree) == (nodes, gpus, tp, pp, dp)
    rows = rank_map(layout)
    assert len(rows) == nodes * gpus

    # Reference 1: rank = pp*(dp*tp) + dp_idx*tp + tp_idx, enumerated from the coordinates (the other direction).
    expected = {p * (dp * tp) + d * tp + t: (t, p, d) for p, d, t in itertools.product(range(pp), range(dp), range(tp))}
    # Reference 2: DeepSpeed's grid, the one its pipeline engine builds its groups from.
    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    for row in rows:
        assert (row.tp, row.pp, row.dp) == expected[row.rank]
        ds = topo.get_coord(row.rank)
        assert (row.tp, row.pp, row.dp) == (ds.model, ds.pipe, ds.data)
        assert (row.node, row.gpu) == (row.rank // gpus, row.rank % gpus)
        assert row.sp == 0

    groups = tensor_groups(layout)
    assert len(groups) == pp * dp
    assert all(g == list(range(g[0], g[0] + tp)) for g in groups)  # consecutive ranks
    assert tensor_groups_crossing_nodes(layout) == []
    assert sorted(map(sorted, groups)) == sorted(map(sorted, topo.get_axis_comm_lists("model")))


def test_tp_larger_than_a_node_is_reported_crossing():
    layout = resolve_layout(compose(["cluster=cpu", "cluster.nodes=2", "cluster.gpus_per_node=2", "parallel.tensor_degree=4",
                                     "precision=fp32", "batch.global_batch_size=4"]))
    assert tensor_groups_crossing_nodes(layout) == [[0, 1, 2, 3]]


def test_cli_prints_384_rows_and_writes_png(tmp_path):
    png = tmp_path / "map.png"
    out = subprocess.run([sys.executable, "-m", "launcher", "plan", "recipe=bloom-176b", "--rank-map", "--rank-map-png", str(png)],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.splitlines()
    body = [line for line in out if line and not line.startswith("#") and not line.startswith("node")]
    assert len(body) == 384
    assert body[5].split() == ["0", "5", "5", "1", "0", "1"]  # node 0, gpu 5: rank 5 = tp 1 of dp replica 1, stage 0
    assert body[383].split() == ["47", "7", "383", "3", "11", "7"]
    assert "all inside one node" in out[-1]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_directly(tmp_path):
    layout = resolve_layout(compose(["recipe=llama-65b"]))
    path = write_rank_map_png(layout, str(tmp_path / "m.png"))
    assert Path(path).stat().st_size > 10_000


def test_context_parallel_ranks_are_consecutive_as_deepspeed_groups_them():
    """CP 4 x DP 4 on 2 nodes x 8: a replica's CP ranks are consecutive (cp inside dp), which is how DeepSpeed's
    parallel_state_sp builds the groups the ring runs over (ranks i x sp .. (i + 1) x sp - 1, written out here)."""
    layout = resolve_layout(compose(["recipe=llama3.1-8b", "cluster.nodes=2", "parallel.tensor_degree=1",
                                     "parallel.pipeline_degree=1", "parallel.context_degree=4", "data.seq_length=8192",
                                     "batch.global_batch_size=64"]))
    assert (layout.context_degree, layout.data_degree, layout.sequence_parallel_size) == (4, 4, 4)
    rows = rank_map(layout)
    for i in range(4):
        group = list(range(i * 4, (i + 1) * 4))   # parallel_state_sp.initialize_sequence_parallel's i-th group
        assert [rows[r].cp for r in group] == [0, 1, 2, 3] and {rows[r].dp for r in group} == {i}
    from launcher.plan.rankmap import format_rank_map, global_rank

    assert all(global_rank(layout, c.tp, c.sp, c.dp, c.pp, c.cp) == c.rank for c in rows)
    assert "CP 4 x DP 4" in format_rank_map(layout)
