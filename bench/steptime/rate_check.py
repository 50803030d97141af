"""Does the step-time model follow the machine's rates? Every layout of run.py against profiles that are wrong by a
known factor, and the plan again at the rates each run read after its steps.

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/rate_check.py            # ~12 min on 2 cores
    flock /tmp/heavy.lock .venv/bin/python bench/steptime/rate_check.py --scale 1.5 --only TP2

For each --scale, bench/steptime/profile.yaml and profile-4.yaml (this machine's committed calibrations) are written
to a temporary directory with their GEMM and attention rates and their copy bandwidth times the scale (the rest of
the profile as measured), and every layout trains against them. A profile 1.5x too fast plans every layout too
fast, so each run lands off its plan and `launcher train` measures the GEMM and copy rates after its steps, then
plans the step again at them (launcher/runtime/metrics.py check_rates, replanned_step_time_s). Where the model's
response to the rates is right, that plan holds the measured step (within 15%) whatever the profile claimed; the
result is each layout's measured / planned from the wrong profile, the ratios read, and measured / planned again.
Writes rate_check.json here and prints a markdown table; the reading goes in results.md by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from run import HERE, LAYOUTS, REPO, train

sys.path.insert(0, str(REPO))
from tests.conftest import rescaled_profile  # noqa: E402  (the tests' own rescaling of the committed profiles)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, nargs="*", default=[1.5, 0.67])
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    rows = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for scale in args.scale:
        with tempfile.TemporaryDirectory() as tmp:
            profiles = {}
            for ranks, name in ((2, "profile.yaml"), (4, "profile-4.yaml")):
                profiles[ranks] = Path(tmp) / name
                rescaled_profile(profiles[ranks], scale, scale, source=HERE / name)
            for layout, (ranks, extra) in LAYOUTS.items():
                if args.only and layout not in args.only:
                    continue
                with tempfile.TemporaryDirectory() as runs:
                    r = train(layout, ranks, extra, profiles[ranks], args.steps, Path(runs))
                r["scale"] = scale
                rows.append(r)
                now = r.get("rates_now") or {}
                print(json.dumps({k: r.get(k) for k in ("layout", "scale", "measured_s", "predicted_s", "ratio")}
                                 | {k: now.get(k) for k in ("gemm_over_profile", "memory_over_profile",
                                                            "replanned_step_time_s")}), flush=True)
    (HERE / "rate_check.json").write_text(json.dumps({"started": started, "steps": args.steps, "results": rows},
                                                     indent=1) + "\n")
    print(table(rows))


def table(rows: list) -> str:
    lines = ["| profile's rates x | layout | measured step (ms) | planned from that profile (ms) | measured / planned | "
             "GEMM / copy read over the profile's | planned at the rates read (ms) | measured / planned again |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['scale']} | {r['layout']} | failed | | | | | |")
            continue
        now = r.get("rates_now")
        if not now:     # on its plan even so: nothing read
            lines.append(f"| {r['scale']} | {r['layout']} | {r['measured_s'] * 1e3:.0f} | {r['predicted_s'] * 1e3:.0f} | "
                         f"{r['ratio']:.2f} | not read (on its plan) | | |")
            continue
        again = now["replanned_step_time_s"]
        lines.append(f"| {r['scale']} | {r['layout']} | {r['measured_s'] * 1e3:.0f} | {r['predicted_s'] * 1e3:.0f} | "
                     f"{r['ratio']:.2f} | {now['gemm_over_profile']:.2f} / {now['memory_over_profile']:.2f} | "
                     f"{again * 1e3:.0f} | {r['measured_s'] / again:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
