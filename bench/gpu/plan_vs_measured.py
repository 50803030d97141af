"""The plan held to the GPU pack's training runs: for each train-1b*.json in a results folder, `launcher plan`'s
step time and peak memory for the run's own overrides, with the built-in profile of its GPU and with the profile
`launcher calibrate` wrote on the same machine, beside what the run measured. No GPU needed: it plans only.

    .venv/bin/python bench/gpu/plan_vs_measured.py bench/gpu/results/2026-11-26-h200
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from launcher.config.compose import compose  # noqa: E402
from launcher.config.layout import resolve_layout  # noqa: E402
from launcher.plan.report import plan_summary  # noqa: E402


def plan(overrides: list[str]) -> dict:
    cfg = compose(overrides)
    return plan_summary(cfg, resolve_layout(cfg))


def rows(results: Path) -> list[dict]:
    """One row per measured run: its name, what changed from the base run, measured and planned numbers."""
    profiles = sorted(results.glob("profile-*.yaml"))
    base = json.loads((results / "train-1b-base.json").read_text())["overrides"]
    out = []
    for f in sorted(results.glob("train-1b*.json")):
        run = json.loads(f.read_text())
        if "measured" not in run:
            continue
        over, me = run["overrides"], run["measured"]
        row = {"run": f.stem, "changes": [o for o in over if o not in base], "steps": me["steps"],
               "measured_step_s": me["step_time_s"], "measured_peak_bytes": me["peak_memory_bytes"]}
        for name, extra in [("builtin", [])] + [(p.stem, [f"cluster.profile={p}"]) for p in profiles]:
            p = plan(over + extra)
            row[f"{name}_step_s"] = p["step_time_s"]
            row[f"{name}_peak_bytes"] = p["memory_per_gpu_bytes"]["total"]
        out.append(row)
    return out


def main(results: str) -> int:
    table = rows(Path(results))
    names = [k[:-len("_step_s")] for k in table[0] if k.endswith("_step_s") and not k.startswith("measured")]
    print("| run | changes from the base run | measured step (s) | " + " | ".join(
        f"{n}: planned step (s), planned / measured" for n in names) + " | measured peak (GB) | planned peak (GB), / measured |")
    print("|---" * (4 + len(names) + 2) + "|")
    for r in table:
        plans = " | ".join(f"{r[n + '_step_s']:.3f}, **{r[n + '_step_s'] / r['measured_step_s']:.2f}**" for n in names)
        peak = r["builtin_peak_bytes"]
        print(f"| {r['run']} | {' '.join(r['changes']) or '-'} | {r['measured_step_s']:.3f} | {plans} | "
              f"{r['measured_peak_bytes'] / 1e9:.2f} | {peak / 1e9:.2f}, **{peak / r['measured_peak_bytes']:.3f}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "bench/gpu/results/2026-11-26-h200")))
