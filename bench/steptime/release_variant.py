"""Diagnostic, not the benchmark: the recorded bench/steptime runs re-planned with each group's release table pooled.

    .venv/bin/python bench/steptime/release_variant.py 867e36a 8d79deb 724257b [bench/steptime/results.json ...]

For each named commit, its results.json (git show; or a results.json file named by its path) is re-planned pass by
pass with that pass's own calibration (pass_profiles), from the rows calibrate measured (the profile's measurements): interpolated by segment length, as
calibrate wrote them until 2026-11-28, and with every group's rows replaced by one figure at all segment lengths,
the mean over all its synchronisations (each row weighted by the repeats calibrate ran at that segment length,
launcher/runtime/calibrate.py _release: total cost over total synchronisations). The rows' means come from 10-100
repeats of a heavy-tailed time (stalls of a scheduler quantum), so their differences are mostly noise; the pooled
figure is the lower-variance reading of the same measurement, which calibrate now writes (pooled_release). Nothing
is fitted; results.md quotes the output.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import REPO, replan  # noqa: E402


def release_rows(profile: dict, pooled: bool) -> dict:
    """The profile with its release table rebuilt from the rows calibrate measured (its measurements): as they are
    (interpolated by segment length when planned) or pooled as calibrate now writes them (pooled_release)."""
    from launcher.runtime.calibrate import pooled_release
    raw = {int(g): rows for g, rows in profile["measurements"]["release"].items()}
    return {**profile, "release": {g: pooled_release(rows, "cpu") for g, rows in raw.items()} if pooled else raw}


def main() -> None:
    for rev in sys.argv[1:]:
        doc = json.loads(Path(rev).read_text() if Path(rev).is_file() else
                         subprocess.run(["git", "show", f"{rev}:bench/steptime/results.json"], cwd=REPO,
                                        capture_output=True, text=True, check=True).stdout)
        print(f"{rev} rows interpolated: {replan(doc, lambda p: release_rows(p, False))}")
        print(f"{rev} pooled release: {replan(doc, lambda p: release_rows(p, True))}")


if __name__ == "__main__":
    main()
