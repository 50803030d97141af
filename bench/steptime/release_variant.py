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
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = str(Path(sys.executable).parent / "launcher")


def pooled(release: dict) -> dict:
    """Each group's rows as calibrate now writes them (pooled_release), from the rows a profile recorded."""
    from launcher.runtime.calibrate import pooled_release
    return {g: pooled_release(rows, "cpu") for g, rows in release.items()}


def main() -> None:
    for rev in sys.argv[1:]:
        doc = json.loads(Path(rev).read_text() if Path(rev).is_file() else
                         subprocess.run(["git", "show", f"{rev}:bench/steptime/results.json"], cwd=REPO,
                                        capture_output=True, text=True, check=True).stdout)
        with tempfile.TemporaryDirectory() as tmp:
            for i, profiles in enumerate(doc["pass_profiles"]):
                for ranks, text in profiles.items():
                    y = yaml.safe_load(text)
                    raw = {int(g): rows for g, rows in y["measurements"]["release"].items()}   # calibrate's rows
                    (Path(tmp) / f"asis-{i}-{ranks}.yaml").write_text(yaml.safe_dump({**y, "release": raw}))
                    (Path(tmp) / f"pooled-{i}-{ranks}.yaml").write_text(yaml.safe_dump({**y, "release": pooled(raw)}))
            for variant in ("asis", "pooled"):
                ratios = []
                for i in range(len(doc["pass_profiles"])):
                    for r in doc["results"]:
                        args = [a for a in r["command"].split()[2:] if not a.startswith("cluster.profile=")]
                        out = subprocess.run([LAUNCHER, "plan", *args, f"cluster.profile={tmp}/{variant}-{i}-{r['ranks']}.yaml",
                                              "--json"], cwd=REPO, capture_output=True, text=True, check=True)
                        ratios.append((r["layout"], r["repeats_measured_s"][i] / json.loads(out.stdout)["step_time_s"]))
                inside = sum(abs(x - 1) <= 0.15 for _, x in ratios)
                print(f"{rev} {'rows interpolated' if variant == 'asis' else 'pooled release'}: {inside} of {len(ratios)} within 15%; "
                      + ", ".join(f"{n} {x:.2f}" for n, x in ratios))


if __name__ == "__main__":
    main()
