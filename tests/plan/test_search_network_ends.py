"""`launcher plan --search` at the network's other end: the built-in profiles charge a group that spans nodes one NIC
a GPU; with several of its GPUs on each node NCCL can take their NICs together (launcher/plan/profile.py
nics_added). The search names the fastest layout there and the layout least behind the fastest at its worse end,
so a user sees whether the ranking's #1 depends on which end their cluster is at."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
import yaml

from launcher.config.compose import compose
from launcher.plan.inputs import model_shape, resolve_hardware
from launcher.plan.profile import Link
from launcher.plan.search import network_ends, search_layouts, search_rows
from launcher.plan.steptime import estimate_step_time
from tests.conftest import REPO, venv_bin

# LLaMA-13B on 8 nodes of 8 H100s, the recipe's 4M-token batch: the ranking's #1 (TP2 + SP, DP32) is not the fastest
# with the NICs added, where a pipeline of 2 with DP32 is.
THIRTEEN_B = ["recipe=llama-13b", "cluster.gpu=h100-80gb", "cluster.nodes=8"]


def test_search_names_the_fastest_layout_with_the_nics_added_and_the_least_worst_loss():
    cfg = compose(THIRTEEN_B)
    ranked, _ = search_layouts(cfg)
    rows = search_rows(ranked, 10)
    ends = network_ends(cfg, ranked, rows)
    # The other end by hand: the built-in H100 profile's 45 GB/s NIC a GPU, 8 GPUs a node: 8 x 45 = 360 GB/s (the
    # node's NVLink bus, 360, caps it) for a group with all 8 of a node's GPUs; fewer a node, in proportion.
    hw = resolve_hardware(cfg.cluster, cfg.precision.dtype)
    one = hw.profile
    assert (one.inter.bus_gbps, one.intra.bus_gbps, one.inter_groups) == (45.0, 360.0, {})
    there_hw = dataclasses.replace(hw, profile=dataclasses.replace(one, inter_groups={8: Link(one.inter.latency_s, 360.0)}))
    shape = model_shape(cfg.model)
    here = [c.time.step_time_s for c in ranked]
    there = [estimate_step_time(shape, c.strategy, there_hw).step_time_s for c in ranked]
    fastest = min(range(len(ranked)), key=lambda i: there[i])
    worst = [max(here[i] / min(here), there[i] / min(there)) - 1 for i in range(len(ranked))]
    least = min(range(len(ranked)), key=lambda i: worst[i])

    assert ends["fastest_nics_added"]["rank"] == fastest + 1 != 1          # the ranking's #1 is not the fastest there
    assert ends["fastest_nics_added"]["step_time_nics_added_s"] == pytest.approx(min(there), rel=1e-12)
    assert ends["first"]["step_time_nics_added_s"] == pytest.approx(there[0], rel=1e-12) and there[0] > min(there)
    assert ends["least_worst_loss"]["rank"] == least + 1
    assert ends["least_worst_loss"]["worst_loss"] == pytest.approx(worst[least], rel=1e-9)
    # least behind at its worse end: no more than either end's own #1 at its worse end
    assert worst[least] <= min(worst[0], worst[fastest]) and worst[0] > 0
    assert [r["step_time_nics_added_s"] for r in rows] == pytest.approx(there[:len(rows)], rel=1e-12)
    assert fastest < len(rows) and ends["fastest_nics_added"]["layout"] == rows[fastest]["layout"]


def test_search_has_no_other_end_on_one_node_or_where_a_profile_measured_the_groups(tmp_path):
    cfg = compose(["recipe=llama-13b", "cluster.gpu=h100-80gb", "cluster.nodes=1"])
    ranked, _ = search_layouts(cfg)
    assert ranked and network_ends(cfg, ranked, search_rows(ranked)) is None
    # A profile calibrated across nodes (inter_groups: 8 ranks a node measured together) has no other end: the
    # measurement decides. The committed H100 profile with such a measurement added.
    doc = yaml.safe_load((REPO / "bench/gpu/results/2026-11-27-h100/profile-h100-80gb.yaml").read_text())
    doc["inter_groups"] = {8: {"latency_s": 2e-5, "bus_gbps": 200.0}}
    path = tmp_path / "measured.yaml"
    path.write_text(yaml.safe_dump(doc))
    cfg = compose([*THIRTEEN_B, f"cluster.profile={path}"])
    ranked, _ = search_layouts(cfg)
    assert ranked and network_ends(cfg, ranked, search_rows(ranked)) is None
    # the same profile without it measured nothing across nodes: the other end is planned
    del doc["inter_groups"]
    path.write_text(yaml.safe_dump(doc))
    assert network_ends(cfg, ranked, search_rows(ranked)) is not None


def test_plan_search_prints_and_writes_the_other_end():
    def plan(*args):
        out = subprocess.run([venv_bin("launcher"), "plan", *args, "--search"], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    data = json.loads(plan(*THIRTEEN_B, "--json"))
    ends = data["network_ends"]
    fastest, least = ends["fastest_nics_added"], ends["least_worst_loss"]
    assert all(r["step_time_nics_added_s"] > 0 for r in data["layouts"])
    text = " ".join(plan(*THIRTEEN_B).split())
    assert (f"the fastest is #{fastest['rank']} {fastest['layout']} ({fastest['step_time_nics_added_s']:,.2f} s; #1 "
            f"takes {ends['first']['step_time_nics_added_s']:,.2f} s") in text
    assert f"Least behind the fastest at its worse end: #{least['rank']}" in text
    one_node = json.loads(plan("recipe=llama-13b", "cluster.gpu=h100-80gb", "cluster.nodes=1", "--json"))
    assert one_node["network_ends"] is None and all(r["step_time_nics_added_s"] is None for r in one_node["layouts"])


def test_the_line_says_when_the_first_is_the_fastest_at_both_ends():
    from launcher.plan.report import network_ends_line

    def one(rank, here, there, loss):
        return {"rank": rank, "layout": f"L{rank}", "step_time_s": here, "step_time_nics_added_s": there,
                "worst_loss": loss}

    first = one(1, 10.0, 9.0, 0.0)
    line = network_ends_line({"first": first, "fastest_nics_added": first, "least_worst_loss": first})
    assert line.endswith("#1 is the fastest there too (9.00 s)") and "Least behind" not in line
    # #3 fastest there (8 s, #1 takes 9: +12.5%); #2 least behind at its worse end, named by its layout
    line = network_ends_line({"first": one(1, 10.0, 9.0, 0.125), "fastest_nics_added": one(3, 11.0, 8.0, 0.1),
                              "least_worst_loss": one(2, 10.5, 8.2, 0.05)})
    assert "the fastest is #3 L3 (8.00 s; #1 takes 9.00 s, +12.5%)" in line
    assert "Least behind the fastest at its worse end: #2 L2, 5.0%." in line
