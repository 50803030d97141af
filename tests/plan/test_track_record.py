"""The plan's step-time track record: launcher/plan/track_record.json is the model's error on every published run
as the model stands now, and `launcher plan` reports the runs most like a layout (launcher/plan/track_record.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.plan import track_record
from launcher.plan.report import plan_summary
from tests.plan import bench_module

ROOT = Path(__file__).resolve().parents[2]


def _compare_module():
    return bench_module.load("bench/published/compare.py", "published_compare")


def test_committed_track_record_is_the_models_error_today():
    # Every planner change that moves a prediction must re-run bench/published/compare.py, which rewrites the file.
    compare = _compare_module()
    records = yaml.safe_load((ROOT / "bench" / "published" / "runs.yaml").read_text())
    rows = compare.compare(records, compare.default_model, predict_own=compare.own_kernels_model())["rows"]
    fresh = compare.track_record(rows)
    committed = json.loads(track_record.PATH.read_text())
    assert committed == fresh, "stale: run `PYTHONPATH=$PWD .venv/bin/python bench/published/compare.py`"
    assert compare.TRACK_PATH == track_record.PATH


def _run(id_, gpu="a100-80gb", zero=0, tp=1, pp=1, seq=2048, error=0.0, kernel="launcher's", hidden=4096,
         elementwise="eager", own=None):
    return {"id": id_, "gpu": gpu, "zero": zero, "tp": tp, "pp": pp, "seq": seq, "hidden": hidden, "micro_batch": 1,
            "recompute": "none", "attention_kernel": kernel, "elementwise_kernels": elementwise, "error": error,
            "error_own_kernels": error if own is None else own}


def test_similar_keeps_the_layout_class_before_the_gpu_and_the_sequence():
    runs = ([_run(f"z3-{i}", zero=3, seq=2048, error=0.01 * (i + 1)) for i in range(5)]              # +1..+5%
            + [_run(f"z3-long-{i}", zero=3, seq=32768, error=0.5, kernel="triton",
                    elementwise="fused" if i < 3 else "eager", own=-0.01 * (i + 1)) for i in range(5)]
            + [_run(f"ptdp-{i}", gpu="a100-40gb", tp=8, pp=4, error=-0.1) for i in range(3)]
            + [_run(f"ptdp-80-{i}", tp=8, pp=4, error=0.2) for i in range(2)]
            + [_run("h100", gpu="h100-80gb", zero=3)])
    # All five criteria hold for five runs.
    rec = track_record.similar("a100-80gb", 3, 1, 1, 4096, 4096, runs)
    assert rec["matched_on"] == ["ZeRO-3", "no pipeline", "no TP", "a100-80gb", "seq 2,048-8,192"]
    assert rec["runs"] == 5 and rec["other_attention_kernel"] == 0
    assert rec["min_error"] == pytest.approx(0.01) and rec["max_error"] == pytest.approx(0.05)
    assert rec["median_abs_error"] == pytest.approx(0.03) and rec["within_10pct"] == 1.0
    # Long sequences: the five Triton runs.
    rec = track_record.similar("a100-80gb", 3, 1, 1, 32768, 4096, runs)
    assert rec["runs"] == 5 and rec["other_attention_kernel"] == 5 and rec["within_20pct"] == 0.0
    assert rec["other_attention_kernels"] == ["triton"]
    assert "5 of them ran another attention kernel (MosaicML's Triton FlashAttention)" in track_record.describe(rec)
    assert rec["fused_elementwise"] == 3 and "; 3 ran fused element-wise kernels" in track_record.describe(rec)
    # The same five charged with their own kernels (-1 .. -5%): said beside the record, only where some ran others.
    assert ("; with each run's own kernels charged (fused element-wise ones; MPT's Triton attention at its rates, "
            "Megatron's unfused attention by its bytes and its vocabulary-parallel TP ends), "
            "-5% to -1%, median |error| 3%, 100% within 10%. All 16 runs: 56% within 10%, 69% within 20% (88% and 100% "
            "with their own kernels)" in track_record.describe(rec))
    # (All 16: within 10% the five +1..+5%, the three -10% and the H100's 0 = 9; within 20% also the two +20% = 11;
    # with their own kernels the five long runs join both: 14 and 16.)
    plain = track_record.similar("a100-80gb", 3, 1, 1, 4096, 4096, runs)     # the five +1..+5% runs, eager, FA2
    assert "each run's own kernels charged" not in track_record.describe(plain)
    # TP x PP on a100-80gb: two runs there, so the GPU and the sequence are dropped, the layout class kept: 5 runs.
    rec = track_record.similar("a100-80gb", 1, 4, 8, 2048, 4096, runs)
    assert rec["matched_on"] == ["ZeRO 0-2", "a pipeline", "TP", "any GPU"]
    assert rec["runs"] == 5 and rec["min_error"] == pytest.approx(-0.1) and rec["max_error"] == pytest.approx(0.2)
    assert rec["within_10pct"] == pytest.approx(3 / 5)
    assert rec["all_runs"]["runs"] == len(runs)
    # A GPU no published run used, or a model more than 2x narrower or wider than every published one: no record.
    assert track_record.similar("h200", 3, 1, 1, 2048, 4096, runs) is None
    assert track_record.no_match("h200", 4096, runs).startswith("no published run on h200")
    assert track_record.similar("a100-80gb", 3, 1, 1, 2048, 2048, runs) is not None       # 4,096 is 2x
    assert track_record.similar("a100-80gb", 3, 1, 1, 2048, 2047, runs) is None
    assert track_record.no_match("a100-80gb", 128, runs) == (
        "no published run of a model this wide: hidden_size 128, the published runs 4,096-4,096 (GEMM sizes and "
        "per-kernel costs change with the width)")


def _summary(*overrides):
    cfg = compose(list(overrides))
    return plan_summary(cfg, resolve_layout(cfg))


def test_plan_reports_the_record_for_built_in_gpu_profiles_only():
    s = _summary("recipe=bloom-176b")
    rec = s["step_time_track_record"]
    assert rec["runs"] >= track_record.MIN_RUNS and rec["matched_on"][:3] == ["ZeRO 0-2", "a pipeline", "TP"]
    assert s["step_time_track_record_note"].startswith(f"{rec['runs']} published runs like this one")
    why = {
        ("recipe=bloom-176b", "cluster.gpu=h200"): "no published run on h200",
        ("recipe=bloom-176b", "cluster.inter_node_gbps=100"): "cluster.* rates override the built-in",
        ("recipe=llama-7b", "precision=fp32"): "fp32",
        ("recipe=tiny", f"cluster.profile={ROOT / 'bench' / 'steptime' / 'profile.yaml'}"): "CPU ranks",
        (): "no published run of a model this wide",   # bare `launcher plan`: the tiny model on 8 A100s
    }
    for overrides, reason in why.items():
        s = _summary(*overrides)
        assert s["step_time_track_record"] is None, overrides
        assert s["step_time_track_record_note"].startswith(reason), (overrides, s["step_time_track_record_note"])


def test_search_gives_every_ranked_layout_its_record():
    from launcher.plan.report import search_track_records
    from launcher.plan.search import search_layouts, search_rows

    cfg = compose(["recipe=bloom-176b"])
    rows = search_rows(search_layouts(cfg)[0], 5)
    line = search_track_records(cfg, rows)
    for r in rows:
        want = track_record.similar("a100-80gb", r["zero_stage"], r["pipeline_degree"], r["tensor_degree"], 2048, 14336)
        assert want is not None and r["step_time_track_record"] == want
    assert line == "step time vs published runs, for #1: " + track_record.describe(rows[0]["step_time_track_record"])

    cfg = compose(["recipe=tiny", f"cluster.profile={ROOT / 'bench' / 'steptime' / 'profile.yaml'}"])
    rows = search_rows(search_layouts(cfg)[0], 3)
    line = search_track_records(cfg, rows)
    assert rows and all(r["step_time_track_record"] is None for r in rows)
    assert line.startswith("step time vs published runs: CPU ranks")
