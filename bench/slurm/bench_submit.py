"""Time from `launcher submit` to the first training step on the local 2-node SLURM cluster, and the preflight's cost.

    .venv/bin/python bench/slurm/bench_submit.py [--repeats 3] [--out bench/slurm]

Starts its own cluster (slurm/local/start.sh under a temp dir, ports apart from the defaults) and stops it
at the end. Each repeat submits recipe=tiny's small test model on 2 nodes x 1 CPU rank (3 steps), once
with the preflight off and once on, and polls (every 50 ms) for:
  submit_s       `launcher submit` returns (compose, validate, data from the warm cache, job dir, sbatch)
  job_start_s    the batch script's first line appears in the job log (queue + slurmd launch)
  first_step_s   metrics.jsonl holds step 1 (torchrun per node, rendezvous, process group, engine, one step)
all measured from the moment `launcher submit` is started. It also times the preflight alone
(`srun --nodes=2 python -m launcher.runtime.preflight --device cpu`), median of the repeats.
Results: results.json + results.md beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "slurm"))
from slurm_helpers import LAUNCHER, START, STOP, job_fields, job_id_of, two_node_overrides, wait_job  # noqa: E402

PORTS = {"LAUNCHER_SLURM_CTLD_PORT": "16937", "LAUNCHER_SLURM_NODE_PORT": "17201"}


def poll(predicate, timeout_s: float = 300, every_s: float = 0.05) -> float:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if predicate():
            return time.perf_counter()
        time.sleep(every_s)
    raise TimeoutError("timed out")


def one_job(env, cache: Path, runs: Path, name: str, preflight: bool, port: int) -> dict:
    args = [*two_node_overrides(cache, runs, name, steps=3, port=port), f"cluster.preflight={str(preflight).lower()}"]
    t0 = time.perf_counter()
    out = subprocess.run([LAUNCHER, "submit", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    t_submit = time.perf_counter()
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = job_id_of(out.stdout)
    log = runs / name / f"slurm-{job_id}.out"
    metrics = runs / name / "metrics.jsonl"
    t_start = poll(lambda: log.exists() and "launcher: job " in log.read_text())
    t_step = poll(lambda: metrics.exists() and metrics.read_text().strip() != "")
    fields = wait_job(job_id, env, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", (fields, log.read_text()[-2000:])
    text = log.read_text()
    if preflight:
        assert text.count("preflight ok on node") == 2, text[-2000:]
    return {"job_id": job_id, "preflight": preflight, "submit_s": t_submit - t0, "job_start_s": t_start - t0,
            "first_step_s": t_step - t0}


def preflight_alone(env, port: int) -> float:
    env = {**env, "MASTER_ADDR": "n1"}
    t0 = time.perf_counter()
    out = subprocess.run(["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", sys.executable, "-m",
                          "launcher.runtime.preflight", "--device", "cpu", "--gpus-per-node", "1", "--port", str(port)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return time.perf_counter() - t0


def med(rows, key):
    return round(statistics.median(r[key] for r in rows), 2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    state, cache, runs = work / "state", work / "cache", work / "runs"
    env = {**os.environ, **PORTS, "SLURM_CONF": str(state / "slurm.conf")}
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    subprocess.run(["bash", str(START), str(state)], env=env, check=True, capture_output=True, text=True, timeout=600)
    cluster_start_s = time.perf_counter() - t0
    slurm_version = subprocess.run(["sinfo", "--version"], env=env, capture_output=True, text=True).stdout.strip()
    try:
        # Warm the data cache once (as a first submit on a login node would); not part of the timings.
        one_job(env, cache, runs, "warmup", preflight=False, port=29700)
        rows = []
        for i in range(args.repeats):
            for preflight in (False, True):
                rows.append(one_job(env, cache, runs, f"r{i}-{'pf' if preflight else 'nopf'}", preflight, 29710 + 2 * i + preflight))
                print(json.dumps(rows[-1]), flush=True)
        alone = [preflight_alone(env, 29750 + i) for i in range(args.repeats)]
    finally:
        subprocess.run(["bash", str(STOP), str(state), "--purge"], env=env, capture_output=True, text=True, timeout=120)
    off = [r for r in rows if not r["preflight"]]
    on = [r for r in rows if r["preflight"]]
    result = {
        "command": "bench/slurm/bench_submit.py --repeats %d" % args.repeats,
        "machine": {"cpus": os.cpu_count(), "gpu": None, "platform": platform.platform(), "python": platform.python_version(),
                    "slurm": slurm_version,
                    "cluster": "slurm/local/start.sh: 2 slurmd nodes (n1, n2) on 127.0.0.1, CPU ranks, 1 rank per node"},
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # The 2 cores are shared with other work: the 1/5/15-minute load averages before and after the runs.
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "cluster_start_s": round(cluster_start_s, 2),
        "median": {
            "preflight_off": {k: med(off, k) for k in ("submit_s", "job_start_s", "first_step_s")},
            "preflight_on": {k: med(on, k) for k in ("submit_s", "job_start_s", "first_step_s")},
            "preflight_cost_in_job_s": round(med(on, "first_step_s") - med(off, "first_step_s"), 2),
            "preflight_alone_s": round(statistics.median(alone), 2),
        },
        "runs": rows,
        "preflight_alone_runs_s": [round(x, 2) for x in alone],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
