"""Diagnostic, not the benchmark: both views of the table with every compute rate scaled by one factor.

    PYTHONPATH=$PWD .venv/bin/python bench/published/compute_scale.py      # ~2 s

The built-in A100 / H100 GEMM rates come from cuBLAS benchmark figures, bursts (launcher/plan/profile.py); a GPU
held at its power or thermal limit through a training run clocks lower, which would slow GEMMs and attention (the
tensor cores) and not the HBM-bound operators or the links. launcher/plan/profile.py scaled(compute=f) is that
change. This prints compare.py's summary of all expressible runs, the headline (the launcher's kernels) and the
second view (each run's own), at f = 1, 0.95, 0.9, 0.85: whether one derating of the rates, whatever its cause,
would close the table's gap. Nothing is fitted or kept: the factors are a sweep, and bench/gpu/sustained_gemm.py
is what would measure a GPU's.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import compare as C  # noqa: E402

from launcher.plan.profile import scaled  # noqa: E402
from launcher.plan.steptime import estimate_step_time  # noqa: E402

FACTORS = (1.0, 0.95, 0.9, 0.85)


def main() -> None:
    records = yaml.safe_load((C.HERE / "runs.yaml").read_text())
    own = C.own_kernels_model()
    print("compute x | headline: within 10% / 20%, median | own kernels: within 10% / 20%, median")
    for f in FACTORS:
        def derated(hw):
            return replace(hw, profile=scaled(hw.profile, compute=f))

        result = C.compare(records, lambda shape, st, hw: estimate_step_time(shape, st, derated(hw)).tokens_per_s,
                           predict_own=lambda shape, st, hw, r: own(shape, st, derated(hw), r))
        h, o = C.summary(result["rows"]), C.summary(result["rows"], "error_own_kernels")
        print(f"{f:9.2f} | {h['within_10pct']:6.1%} / {h['within_20pct']:6.1%}, {h['median_abs_error']:5.1%} | "
              f"{o['within_10pct']:6.1%} / {o['within_20pct']:6.1%}, {o['median_abs_error']:5.1%}   ({h['runs']} runs)")


if __name__ == "__main__":
    main()
