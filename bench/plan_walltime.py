"""Benchmark: wall time of `launcher plan recipe=bloom-176b` through the console script (median of 5).

Run: .venv/bin/python bench/plan_walltime.py   -> writes bench/results/plan_walltime.json
Target (foundation issue): < 1.5 s on the 2-core dev machine.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RUNS = 5
COMMAND = ["plan", "recipe=bloom-176b"]


def main() -> None:
    launcher = str(Path(sys.executable).parent / "launcher")
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run([launcher, *COMMAND], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    result = {
        "command": "launcher " + " ".join(COMMAND),
        "runs_s": [round(t, 3) for t in times],
        "median_s": round(statistics.median(times), 3),
        "target_s": 1.5,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
    }
    out = Path(__file__).parent / "results" / "plan_walltime.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
