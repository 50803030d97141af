"""Every recorded pass of a bench results.json planned again from that pass's own profile (diagnostic; not a test).

    PYTHONPATH=<tree> .venv/bin/python bench/steptime/replan_passes.py RESULTS.json [LAYOUT ...]

run.py --repredict plans every row again from the committed profile (the last pass's); a results.json written with
--calibrate-each-pass keeps each pass's profiles (pass_profiles), so a change to the model can be held to every pass
it would have predicted. Run from outside the repository with PYTHONPATH on the tree under test (a worktree with a
candidate change; xeon-amx-2026-12-05c/ compares three that way). Prints one line a row and pass: measured, planned
(ms) and measured / planned.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

SKIP = ("cluster.profile=", "runs_dir=", "run_name=")


def replan(results: Path, only: list) -> list:
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.runtime.metrics import planned_step_s

    doc = json.loads(results.read_text())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, profiles in enumerate(doc["pass_profiles"]):
            for ranks, text in profiles.items():
                (Path(tmp) / f"{i}-{ranks}.yaml").write_text(text)
        for r in doc["results"]:
            if "error" in r or (only and r["layout"] not in only):
                continue
            overrides = [o for o in r["command"].split()[2:] if not o.startswith(SKIP)]   # "launcher train <overrides>"
            for i, measured in enumerate(r.get("repeats_measured_s") or [r["measured_s"]]):
                profile = Path(tmp) / f"{i}-{r['ranks']}.yaml"
                if not profile.exists():
                    continue
                cfg = compose(overrides + [f"cluster.profile={profile}"])
                planned = planned_step_s(cfg, resolve_layout(cfg))
                rows.append((r["layout"], i + 1, measured, planned))
    return rows


def main() -> None:
    for layout, pass_, measured, planned in replan(Path(sys.argv[1]), sys.argv[2:]):
        print(f"{layout:26s} pass {pass_}: measured {measured * 1e3:6.1f} ms, planned {planned * 1e3:6.1f} ms, "
              f"{measured / planned:.3f}")


if __name__ == "__main__":
    main()
