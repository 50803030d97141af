"""Probes tried and handled, by class (issue 12): the bad-input catalogue by group, and the fault tests by file.

    .venv/bin/python bench/reliability/probes.py [--out bench/reliability/probes.json]
    (run it under `flock /tmp/heavy.lock`: the fault tests start multi-process DeepSpeed runs)

Runs, with pytest and a JUnit XML report each:
  tests/config/test_bad_configs.py: every entry of tests/config/bad_configs.yaml through the CLI entry point
      (exit 2, key/value/rule/fix, no traceback, nothing written); the outcomes are counted by the entry's group
      (pytest runs the parametrized cases in catalogue order, so the n-th case is the n-th entry);
  tests/train/test_rundir.py, test_integrity.py, test_failures.py, tests/unit/test_rundir_files.py: the run-dir,
      integrity, dead/hung-rank and run-dir-file fault tests, counted per file with each test's outcome.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.bench_common import emit  # noqa: E402
FAULT_TESTS = ["tests/train/test_rundir.py", "tests/train/test_integrity.py", "tests/train/test_failures.py",
               "tests/unit/test_rundir_files.py"]


def pytest_run(paths: list[str], xml: Path) -> dict:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *paths],
                          cwd=REPO, capture_output=True, text=True)
    cases = []
    for tc in ET.parse(xml).getroot().iter("testcase"):
        outcome = "passed"
        for child in tc:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
            elif child.tag == "skipped":
                outcome = "skipped"
        cases.append({"file": tc.get("classname", "").replace(".", "/") + ".py", "name": tc.get("name"),
                      "outcome": outcome, "time_s": round(float(tc.get("time", 0)), 2)})
    return {"command": "pytest " + " ".join(paths), "rc": proc.returncode, "wall_s": round(time.time() - t0, 1),
            "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "", "cases": cases}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the result JSON here")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="probes-"))
    catalogue = yaml.safe_load((REPO / "tests/config/bad_configs.yaml").read_text())
    bad = pytest_run(["tests/config/test_bad_configs.py"], tmp / "bad.xml")
    entries = [c for c in bad["cases"] if c["name"].startswith("test_rejected_with_key_rule_and_fix[")]
    assert len(entries) == len(catalogue), (len(entries), len(catalogue))
    by_group = collections.defaultdict(collections.Counter)
    for entry, case in zip(catalogue, entries):
        by_group[entry["group"]][case["outcome"]] += 1
    faults = pytest_run(FAULT_TESTS, tmp / "faults.xml")
    by_file = collections.defaultdict(collections.Counter)
    for case in faults["cases"]:
        by_file[case["file"]][case["outcome"]] += 1
    result = {
        "command": "python bench/reliability/probes.py " + " ".join(sys.argv[1:]),
        "catalogue": {"entries": len(catalogue), "pytest_rc": bad["rc"], "pytest_summary": bad["summary"],
                      "wall_s": bad["wall_s"],
                      "by_group": {g: {"count": sum(c.values()), **c}
                                   for g, c in sorted(by_group.items(), key=lambda kv: -sum(kv[1].values()))},
                      "other_tests": [c for c in bad["cases"] if c not in entries],
                      "not_passed": [{"group": e["group"], "args": e["args"], **c} for e, c in zip(catalogue, entries)
                                     if c["outcome"] != "passed"]},
        "fault_tests": {"pytest_rc": faults["rc"], "pytest_summary": faults["summary"], "wall_s": faults["wall_s"],
                        "by_file": {f: {"count": sum(c.values()), **c} for f, c in by_file.items()},
                        "cases": faults["cases"]},
    }
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
