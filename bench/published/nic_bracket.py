"""Diagnostic, not the benchmark: each expressible published run planned at both ends of the network question.

    PYTHONPATH=$PWD .venv/bin/python bench/published/nic_bracket.py

The built-in profiles charge a collective group that spans nodes one NIC a GPU; NCCL can spread its ring over the
NICs of the group's GPUs on each node (launcher/plan/profile.py Profile.inter_for, nics_added). `launcher plan` now
reports the step time under both where they differ (`step_time_nics_added_s`). For every run where they differ by
more than 1%, this prints the error at one NIC (the headline's) and with the NICs added, and counts the runs whose
measurement lies between the two ends, 10% either side; first, the whole set's figures at each end (the
headline's at one NIC). Nothing fitted; compare.py's mapping and device terms.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import compare as C  # noqa: E402

from launcher.plan.profile import nics_added  # noqa: E402
from launcher.plan.steptime import estimate_step_time  # noqa: E402


def with_nics_added(shape, st, hw) -> float:
    """compare.py's predict with the run's groups' NICs added (a one-node run's time does not change)."""
    return estimate_step_time(shape, st, replace(hw, profile=nics_added(hw.profile, st.gpus_per_node))).tokens_per_s


def main() -> None:
    records = yaml.safe_load((C.HERE / "runs.yaml").read_text())
    # compare.py's own mapping, skips and device terms, once per end
    one = C.compare(records, C.default_model)["rows"]
    added = C.compare(records, with_nics_added)["rows"]
    rows = [(a["id"], a["error"], b["error"]) for a, b in zip(one, added)
            if b["predicted_tokens_per_s_per_gpu"] > a["predicted_tokens_per_s_per_gpu"] * 1.01]
    between = [x for x in rows if x[1] <= 0.10 and x[2] >= -0.10]
    # The whole set at each end: what the headline would read if the built-ins added the NICs up.
    for name, end in (("one NIC a GPU (the built-ins, the headline)", one), ("the NICs added", added)):
        errors = [abs(r["error"]) for r in end]
        print(f"{name}: {len(errors)} runs, within 10% {sum(e <= 0.10 for e in errors) / len(errors):.1%}, within 20% "
              f"{sum(e <= 0.20 for e in errors) / len(errors):.1%}, median {statistics.median(errors):.1%}, worst "
              f"{max(errors):.1%}")
    print(f"{len(rows)} runs whose two ends differ; the measurement between them (10% either side) in {len(between)}")
    for run, one, added in rows:
        print(f"  {run:58s} one NIC {one:+7.1%}   NICs added {added:+8.1%}")


if __name__ == "__main__":
    main()
