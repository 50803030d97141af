"""Diagnostic, not the benchmark: each expressible published run planned at both ends of the network question.

    PYTHONPATH=$PWD .venv/bin/python bench/published/nic_bracket.py

The built-in profiles charge a collective group that spans nodes one NIC a GPU; NCCL can spread its ring over the
NICs of the group's GPUs on each node (launcher/plan/profile.py Profile.inter_for, nics_added). `launcher plan` now
reports the step time under both where they differ (`step_time_nics_added_s`). For every run where they differ by
more than 1%, this prints the error at one NIC (the headline's) and with the NICs added, and counts the runs whose
measurement lies between the two ends, 10% either side. Nothing fitted; compare.py's mapping and device terms.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import compare as C  # noqa: E402

from launcher.config.errors import ConfigError  # noqa: E402
from launcher.config.layout import resolve_layout  # noqa: E402
from launcher.plan.inputs import model_shape, resolve_hardware, strategy  # noqa: E402
from launcher.plan.profile import nics_added  # noqa: E402
from launcher.plan.steptime import estimate_step_time  # noqa: E402


def main() -> None:
    rows = []
    for r in yaml.safe_load((C.HERE / "runs.yaml").read_text()):
        if C.hardware.lookup(r["gpu"]) is None or r["gpus"] % r["gpus_per_node"]:     # as compare.py skips them
            continue
        try:
            cfg, recompute, _ = C.to_config(r, C.base_config(r["gpu"]))
            layout = resolve_layout(cfg)
        except ConfigError:
            continue
        if layout.data_degree != r["dp"]:
            continue
        shape, st = model_shape(cfg.model), strategy(cfg, layout, recompute)
        hw = C.device_only(resolve_hardware(cfg.cluster, cfg.precision.dtype))
        one = estimate_step_time(shape, st, hw).tokens_per_s / layout.world_size
        added = estimate_step_time(shape, st, replace(hw, profile=nics_added(hw.profile, layout.gpus_per_node)))
        added = added.tokens_per_s / layout.world_size
        measured, _ = C.measured_tokens_per_s_per_gpu(r)
        if added > one * 1.01:
            rows.append((r["id"], one / measured - 1, added / measured - 1))
    between = [x for x in rows if x[1] <= 0.10 and x[2] >= -0.10]
    print(f"{len(rows)} runs whose two ends differ; the measurement between them (10% either side) in {len(between)}")
    for run, one, added in rows:
        print(f"  {run:58s} one NIC {one:+7.1%}   NICs added {added:+8.1%}")


if __name__ == "__main__":
    main()
