"""bench/published/runs.yaml holds its sources' numbers faithfully: each record's stated figures agree with
each other the way the source defines them (a transcription error shows up as a disagreement), and every
record names its source. The planner is not involved here (bench/published/compare.py holds it to the runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

RUNS = yaml.safe_load((Path(__file__).parents[2] / "bench" / "published" / "runs.yaml").read_text())
PEAK = {"a100-80gb": 312e12, "a100-40gb": 312e12, "h100-80gb": 989.4e12}  # dense bf16 (NVIDIA datasheets)


def test_every_run_names_its_source_and_a_measurement():
    ids = [r["id"] for r in RUNS]
    assert len(ids) == len(set(ids))
    for r in RUNS:
        assert r["source"] and r["measured"], r["id"]
        assert set(r.get("derived", {})).isdisjoint(r.get("unknown", [])), r["id"]


@pytest.mark.parametrize("r", RUNS, ids=lambda r: r["id"])
def test_layout_multiplies_out(r):
    dp = r["dp"]
    assert r["tp"] * r["pp"] * r.get("cp", 1) * dp == r["gpus"]
    if "micro_batch" in r and "grad_accum" in r:
        assert r["micro_batch"] * r["grad_accum"] * dp == r["global_batch"]


def test_mosaicml_mfu_reproduces_from_throughput_and_stated_params():
    # llm-foundry's README: mfu = (6 N + 12 L d s) x tokens/s / (GPUs x peak), N = NumParams (its formula, per GPU here)
    for r in (r for r in RUNS if r["family"] == "mosaicml-llm-foundry"):
        m = r["model"]
        f = 6 * m["params_stated"] + 12 * m["layers"] * m["hidden"] * m["seq"]
        mfu = r["measured"]["tokens_per_s_per_gpu"] * f / PEAK[r["gpu"]] * 100
        assert mfu == pytest.approx(r["measured"]["mfu_pct"], rel=0.01, abs=0.3), r["id"]


def test_narayanan_table_1_aggregate_is_per_gpu_times_gpus():
    for r in (r for r in RUNS if r["id"].startswith("narayanan2021-t1")):
        m = r["measured"]
        assert m["tflops_per_gpu"] * r["gpus"] / 1e3 == pytest.approx(m["aggregate_pflops"], rel=0.01), r["id"]
        assert m["tflops_per_gpu"] / 312 * 100 == pytest.approx(m["pct_of_peak"], abs=0.6), r["id"]


def test_iteration_times_and_tflops_agree_under_eq3():
    # BLOOM (105 s, 149-150 TFLOP/s) and MT-NLG (60.1 / 50.2 / 44.4 s, 126 / 121 / 113): the source's TFLOP/s are
    # eq. 3 FLOPs (Narayanan et al. 2021, with recompute) over the iteration time.
    for r in (r for r in RUNS if "iteration_s" in r["measured"]):
        m, mod = r["measured"], r["model"]
        l, h, s, v = mod["layers"], mod["hidden"], mod["seq"], mod["vocab"]
        flops = 96 * r["global_batch"] * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        assert flops / m["iteration_s"] / r["gpus"] / 1e12 == pytest.approx(m["tflops_per_gpu"], rel=0.02), r["id"]


def test_llama3_tflops_and_mfu_agree():
    for r in (r for r in RUNS if r["family"] == "llama3"):
        assert r["measured"]["tflops_per_gpu"] * 1e12 / PEAK["h100-80gb"] * 100 == pytest.approx(r["measured"]["mfu_pct"], abs=0.6)
        assert r["global_batch"] * r["model"]["seq"] == pytest.approx(16 * 2**20, rel=0.05)  # "16M" tokens per batch
