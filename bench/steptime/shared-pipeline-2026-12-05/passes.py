"""Diagnostic, not the benchmark: every recorded TP2 x PP2 pass re-planned under the candidate shared-pipeline model
(shared_pipeline.patch, not in the launcher) and the stand-ins README.md describes.

    git worktree add --detach /tmp/wt-shared 83612a8 && git -C /tmp/wt-shared apply \\
        $PWD/bench/steptime/shared-pipeline-2026-12-05/shared_pipeline.patch
    cd /tmp && PYTHONPATH=/tmp/wt-shared /work/main/.venv/bin/python \\
        /tmp/wt-shared/bench/steptime/shared-pipeline-2026-12-05/passes.py

Each pass of every bench/steptime results.json with pass_profiles and both calibrations (2 and 4 ranks) is planned
from its own 4-rank profile six ways; it prints measured / planned for each, then a summary line a variant, then the
by-term split on the committed profiles. Nothing is fitted to the steps.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.plan import profile as P
from launcher.plan import steptime as S
from launcher.runtime.metrics import _plan_inputs

BENCH = Path(__file__).resolve().parents[1]
SKIP = ("cluster.profile=", "runs_dir=", "run_name=")
if not hasattr(S, "_shared_pipeline"):
    sys.exit("run with PYTHONPATH on a tree with shared_pipeline.patch applied (see the docstring)")
ALONE, SHARED = P.alone_rates, S._shared_pipeline


def gemm_as_read(prof, measured_ranks):
    """alone_rates with the GEMM and attention tables left as the 4-rank calibration read them (a stand-in for a
    window-timed probe: those probes' medians already read one rank's speed alone, README.md)."""
    out = ALONE(prof, measured_ranks)
    return dataclasses.replace(out, gemm_table=prof.gemm_table, gemm_tflops=prof.gemm_tflops,
                               attention_table=prof.attention_table, attention_tflops=prof.attention_tflops,
                               attention_table_by_head_dim=prof.attention_table_by_head_dim)


# name: (alone_rates, the shared pipeline on, waits in unshared spans from the pass's 2-rank profile)
VARIANTS = {"committed": (ALONE, False, False), "GEMMs as read": (gemm_as_read, False, False),
            "shared pipeline": (ALONE, True, False), "shared + 2-rank waits": (ALONE, True, True),
            "shared + GEMMs as read": (gemm_as_read, True, False),
            "all three": (gemm_as_read, True, True)}


def plan(overrides: list, four: Path, two: Path, variant: str):
    alone, shared, waits = VARIANTS[variant]
    P.alone_rates = alone
    S._shared_pipeline = SHARED if shared else (lambda *a, **k: None)
    S.UNSHARED = P.load_profile(str(two)) if waits else None
    cfg = compose(overrides + [f"cluster.profile={four}"])
    return S.estimate_step_time(*_plan_inputs(cfg, resolve_layout(cfg)))


def main() -> None:
    ratios = {v: [] for v in VARIANTS}
    print("run, pass, measured ms, then measured / planned:", ", ".join(VARIANTS))
    for results in sorted(BENCH.glob("*/results.json")) + [BENCH / "results.json"]:
        doc = json.loads(results.read_text())
        if "pass_profiles" not in doc:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            for i, profiles in enumerate(doc["pass_profiles"]):
                for ranks, text in profiles.items():
                    (Path(tmp) / f"{i}-{ranks}.yaml").write_text(text)
            for r in doc["results"]:
                if "error" in r or r["layout"] != "TP2 x PP2":
                    continue
                overrides = [o for o in r["command"].split()[2:] if not o.startswith(SKIP)]
                for i, measured in enumerate(r.get("repeats_measured_s") or [r["measured_s"]]):
                    four, two = Path(tmp) / f"{i}-4.yaml", Path(tmp) / f"{i}-2.yaml"
                    if not (four.exists() and two.exists()):
                        continue
                    line = []
                    for v in VARIANTS:
                        ratios[v].append(measured / plan(overrides, four, two, v).step_time_s)
                        line.append(f"{ratios[v][-1]:.2f}")
                    print(results.parent.name, i + 1, round(measured * 1e3), *line)
    for v, xs in ratios.items():
        print(f"{v:24s} {sum(abs(x - 1) <= 0.15 for x in xs)} of {len(xs)} within 15%, {min(xs):.2f}-{max(xs):.2f}, "
              f"mean {sum(xs) / len(xs):.3f}")
    # The by-term split on the committed profiles (breakdown.py's terms, bench/steptime/results.md 2026-12-05)
    overrides = ["recipe=tiny", "cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.pipeline_degree=2",
                 "parallel.zero_stage=1"]
    for v in VARIANTS:
        t = plan(overrides, BENCH / "profile-4.yaml", BENCH / "profile.yaml", v)
        b = t.breakdown()
        compute = sum(b[k] for k in ("gemm", "attention", "memory_bound", "framework", "host_bound", "optimizer",
                                     "engine"))
        colls = b["tp_comm"] + b["sp_comm"] + b["dp_comm_exposed"] + b["straggler"]
        print(f"committed profiles, {v:24s} compute {compute * 1e3:4.0f}  collectives + waits {colls * 1e3:4.0f}  "
              f"pipeline {(b['pp_comm'] + b['bubble']) * 1e3:4.0f}  step {t.step_time_s * 1e3:4.0f} ms")


if __name__ == "__main__":
    main()
