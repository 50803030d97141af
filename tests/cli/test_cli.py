"""The CLI through the real console script: what a user types and sees."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import venv_bin

PLAN_KEYS = {"world_size", "nodes", "gpus_per_node", "tensor_degree", "pipeline_degree", "data_degree", "micro_batch_size",
             "grad_accum_steps", "global_batch_size", "tokens_per_step", "params_total", "bubble_fraction"}


def run(*args: str, module: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "launcher", *args] if module else [venv_bin("launcher"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_plan_json_bloom():
    out = run("plan", "recipe=bloom-176b", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert PLAN_KEYS <= plan.keys()
    assert (plan["world_size"], plan["tensor_degree"], plan["pipeline_degree"], plan["data_degree"]) == (384, 4, 12, 8)
    assert plan["grad_accum_steps"] == 128 and plan["tokens_per_step"] == 4_194_304
    assert plan["params_total"] == 176_247_271_424
    assert plan["bubble_fraction"] == pytest.approx(11 / 128)


def test_plan_table_shows_arithmetic():
    out = run("plan", "recipe=bloom-176b")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for fragment in ("384", "4 x 12", "176,247,271,424", "4,194,304", "8.59%"):
        assert fragment in text, fragment


def test_plan_table_in_a_pipe_cuts_no_cited_path():
    """Piped (no terminal: rich renders 80 columns), a long path in the "how" column folds onto the next line
    instead of ending in "…": every source the plan cites can still be read off the table, and names a real file."""
    import glob
    import re
    from pathlib import Path

    out = run("plan", "recipe=bloom-176b")
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout
    how = "".join(line.split("│")[3].strip() for line in out.stdout.splitlines() if line.count("│") == 4)
    cited = re.findall(r"\(((?:launcher|bench)/[^ )]+)", how)
    assert len(cited) >= 3, how
    root = Path(__file__).resolve().parents[2]
    for path in cited:
        assert glob.glob(str(root / path.rstrip(",;:"))), path


def test_plan_without_recipe_from_overrides():
    out = run("plan", "model=llama-65b", "cluster.nodes=256", "parallel.tensor_degree=8", "batch.global_batch_size=2048", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert (plan["world_size"], plan["data_degree"], plan["params_total"]) == (2048, 256, 65_285_660_672)


def test_bad_batch_is_a_clear_error_without_traceback():
    out = run("plan", "recipe=llama-7b", "batch.global_batch_size=1000")
    assert out.returncode == 2
    assert "batch.global_batch_size=1000" in out.stderr
    assert "4 x 64 = 256" in out.stderr and "768 or 1024" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_debug_flag_shows_traceback():
    out = run("--debug", "plan", "recipe=llama-7b", "batch.global_batch_size=1000")
    assert out.returncode != 0 and "Traceback" in out.stderr and "ConfigError" in out.stderr


@pytest.mark.parametrize("args,fragments", [
    (["model.hiden_size=3"], ["model.hiden_size", "did you mean hidden_size"]),
    (["recipe=llama7b"], ["recipes/llama7b.yaml", "llama-7b"]),
    (["model=llama-7"], ["conf/model/llama-7.yaml", "llama-7b"]),
    (["batch.micro_batch_size=two"], ["batch.micro_batch_size", "wrong type"]),
    (["parallel.tensr_degree=2"], ["parallel.tensr_degree", "tensor_degree"]),
    (["clustr.nodes=2"], ["clustr", "cluster"]),
])
def test_compose_errors_name_the_key_and_suggest(args, fragments):
    out = run("plan", *args)
    assert out.returncode == 2, out.stdout
    for fragment in fragments:
        assert fragment in out.stderr, (fragment, out.stderr)
    assert "Traceback" not in out.stderr


def test_show_prints_config_layout_and_deepspeed_json():
    out = run("show", "recipe=bloom-176b", module=True)
    assert out.returncode == 0, out.stderr
    assert "recipe_name: bloom-176b" in out.stdout
    ds = json.loads(out.stdout[out.stdout.index("{", out.stdout.index("DeepSpeed config")):])
    assert ds["train_micro_batch_size_per_gpu"] == 2 and ds["gradient_accumulation_steps"] == 128
    assert ds["pipeline"]["stages"] == 12


def test_bare_plan_and_show_use_a_valid_default_layout():
    """conf/config.yaml alone (tiny on one a100-80gb node) is a layout: 4 x 8 ranks x 1 step = 32."""
    out = run("plan", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert (plan["world_size"], plan["micro_batch_size"], plan["grad_accum_steps"], plan["global_batch_size"]) == (8, 4, 1, 32)
    assert run("show").returncode == 0


def test_search_starts_from_an_invalid_layout_and_keeps_the_global_batch():
    # 32 sequences on 512 GPUs: not a layout as configured (DP 512); the search finds those with DP | 32.
    out = run("plan", "model=llama-65b", "cluster.gpu=h100-80gb", "cluster.nodes=64", "--search", "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    held = found["held"]
    assert (held["global_batch_size"], held["seq_length"], held["tokens_per_step"], held["tokens_per_gpu"]) == (32, 256, 8192, 16)
    assert found["layouts"] and found["counts"]["fit"] > 0
    for row in found["layouts"]:
        assert row["tensor_degree"] * row["pipeline_degree"] * row["sequence_degree"] * row["data_degree"] == 512
        assert 32 % (row["micro_batch_size"] * row["data_degree"]) == 0
    # That batch is conf/config.yaml's (the tiny model's), not one anyone chose for a 65B model on 512 GPUs: the
    # search says so and names the recipe whose batch is LLaMA-65B's (2,048 x 2,048 tokens, Touvron et al. 2023).
    assert held["defaulted_keys"] == ["batch.global_batch_size", "data.seq_length"]
    assert "16 tokens per GPU" in held["note"] and "recipe=llama-65b (2,048 sequences x 2,048" in held["note"]


def test_search_warns_only_about_a_batch_nobody_chose():
    table = run("plan", "model=llama-65b", "cluster.gpu=h100-80gb", "cluster.nodes=64", "--search")
    assert table.returncode == 0, table.stderr
    text = " ".join(table.stdout.split())
    assert "warning: batch.global_batch_size=32 (conf/config.yaml) and data.seq_length=256 (conf/data/stdlib.yaml) are the defaults" in text
    # One key set on the command line: only the other is named.
    one = json.loads(run("plan", "model=llama-65b", "cluster.gpu=h100-80gb", "cluster.nodes=64", "batch.global_batch_size=1024",
                         "--search", "--json").stdout)["held"]
    assert one["defaulted_keys"] == ["data.seq_length"] and one["tokens_per_gpu"] == 512
    # The recipe's batch, the tiny model's own defaults, or both keys given: no note.
    for args in (["recipe=llama-65b", "cluster.gpu=h100-80gb", "cluster.nodes=64"], [],
                 ["model=llama-65b", "cluster.gpu=h100-80gb", "cluster.nodes=64", "batch.global_batch_size=1024",
                  "data.seq_length=2048"]):
        out = run("plan", *args, "--search", "--json")
        assert out.returncode == 0, out.stderr
        held = json.loads(out.stdout)["held"]
        assert held["note"] is None and held["defaulted_keys"] == [], args


def test_plan_sweep_prints_one_plan_per_point_and_names_the_invalid_ones():
    out = run("plan", "-m", "recipe=llama-7b", "parallel.tensor_degree=1,2,3", "--json")
    assert out.returncode == 2  # point 3 is not a layout; the other two are still planned
    points = json.loads(out.stdout)
    assert [p["overrides"][1] for p in points] == [f"parallel.tensor_degree={k}" for k in (1, 2, 3)]
    assert [p["plan"]["data_degree"] for p in points[:2]] == [64, 32]
    assert "32 % 3 = 2" in points[2]["error"] and "config error: parallel.tensor_degree=3" in out.stderr
    table = run("plan", "-m", "recipe=llama-7b", "parallel.tensor_degree=1,2")
    assert table.returncode == 0 and "sweep point 2/2: recipe=llama-7b parallel.tensor_degree=2" in table.stdout


def test_plus_adds_keys_only_to_extras():
    """Hydra's `+key=value` is how a free-form dict gets a new entry; elsewhere it is refused (tests/config/bad_configs.yaml)."""
    out = run("show", "recipe=tiny", "+extras.tag=ablation-3")
    assert out.returncode == 0, out.stderr
    assert "tag: ablation-3" in out.stdout


def test_gpu_cluster_without_gpus_is_refused_before_any_rank_starts(tmp_path):
    """Bare `launcher train` (cluster=a100-80gb) where torch sees no GPU: exit 2 naming cluster.gpu and cluster=cpu,
    nothing written. CUDA_VISIBLE_DEVICES='' hides any GPU, so this holds on a GPU machine too."""
    import os
    import time

    t0 = time.time()
    out = subprocess.run([venv_bin("launcher"), "train", f"runs_dir={tmp_path / 'runs'}"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    message = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stderr
    assert "config error: cluster.gpu='a100-80gb': cluster=a100-80gb starts cluster.gpus_per_node=8 GPU ranks" in message
    assert "torch sees 0 GPUs here" in message and "fix: train on CPU ranks here with cluster=cpu" in message
    assert "Traceback" not in out.stderr and list(tmp_path.iterdir()) == []
    assert time.time() - t0 < 60  # the ranks used to die ~95 s in
