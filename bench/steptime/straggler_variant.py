"""Diagnostic, not the benchmark: the recorded bench/steptime runs re-planned with each group's straggler table
read as one curve instead of row by row.

    .venv/bin/python bench/steptime/straggler_variant.py 4366d78 310ee52 ... [bench/steptime/results.json ...]

calibrate's straggler probe (launcher/runtime/calibrate.py _straggler) times 100, 75, 25 and 10 segments of 5, 20,
60 and 150 ms and writes, per group size and segment length, the mean wait for the slowest rank as a fraction of
the segment. The wait is heavy-tailed (2 CPU ranks here, 3,000 segments of 5 ms: median 0.03 ms, p99 1.7 ms; 0.4%
of them over 2 ms carry 10% of the total), so a row's mean over 100 draws moves by chance: 30 back-to-back blocks
of 100 read 0.8-5.4% (2026-11-29). For each named commit, its results.json (git show; or a file named by its path)
is re-planned pass by pass with that pass's own calibration (pass_profiles), its straggler table rebuilt from the
rows calibrate measured (the profile's measurements) three ways:
  rows     as measured (interpolated by segment length when planned);
  line     the wait in seconds fitted to a + b T over the rows (least squares, each row weighted by its repeats,
           a and b held >= 0), written back as fractions (a + b T) / T at the measured lengths;
  pooled   one fraction at every length: the total wait over the total segment time.
Nothing is fitted to the steps; results.md quotes the output.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import REPO, replan  # noqa: E402

from launcher.runtime.calibrate import STRAGGLER_SEGMENTS_S, probe_repeats  # noqa: E402

# What calibrate ran at each CPU target length (5, 20, 60, 150 ms: 100, 75, 25 and 10 segments).
REPEATS = tuple(probe_repeats(t) for t in STRAGGLER_SEGMENTS_S["cpu"])


def line(rows: list) -> list:
    ws = REPEATS[:len(rows)]
    ts = [t for t, _ in rows]
    waits = [t * f for t, f in rows]
    sw = sum(ws)
    mt = sum(w * t for w, t in zip(ws, ts)) / sw
    mw = sum(w * x for w, x in zip(ws, waits)) / sw
    var = sum(w * (t - mt) ** 2 for w, t in zip(ws, ts))
    b = max(0.0, sum(w * (t - mt) * (x - mw) for w, t, x in zip(ws, ts, waits)) / var) if var else 0.0
    a = mw - b * mt
    if a < 0:
        a, b = 0.0, sum(w * t * x for w, t, x in zip(ws, ts, waits)) / sum(w * t * t for w, t in zip(ws, ts))
    return [[t, (a + b * t) / t] for t in ts]


def pooled(rows: list) -> list:
    ws = REPEATS[:len(rows)]
    frac = sum(w * t * f for w, (t, f) in zip(ws, rows)) / sum(w * t for w, (t, _) in zip(ws, rows))
    return [[t, frac] for t, _ in rows]


def straggler_rows(profile: dict, how) -> dict:
    raw = {int(g): rows for g, rows in profile["measurements"]["straggler"].items()}
    return {**profile, "straggler": {g: how(rows) for g, rows in raw.items()}}


def main() -> None:
    for rev in sys.argv[1:]:
        doc = json.loads(Path(rev).read_text() if Path(rev).is_file() else
                         subprocess.run(["git", "show", f"{rev}:bench/steptime/results.json"], cwd=REPO,
                                        capture_output=True, text=True, check=True).stdout)
        for name, how in (("rows", lambda r: r), ("line", line), ("pooled", pooled)):
            print(f"{rev} {name}: {replan(doc, lambda p: straggler_rows(p, how))}", flush=True)


if __name__ == "__main__":
    main()
