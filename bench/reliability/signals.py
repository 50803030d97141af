"""Time from SIGHUP / SIGTERM to a saved checkpoint and to exit (issue 12, part 5).

    .venv/bin/python bench/reliability/signals.py [--repeats 5] [--out bench/reliability/signals.json]

The tiny config of soak.py (2 CPU ranks, ~16 ms/step, a 0.65 MiB checkpoint) with no periodic checkpoint
(checkpoint.save_every=0) and more steps than it will run. Once rank 0 has logged step 30, one signal goes
either to `launcher train` (which forwards it to torchrun, which forwards it to the ranks) or to rank 1 alone
(the ranks all-reduce the stop flag each step, so all stop at the same step boundary). Measured from the
kill(2), polling every 5 ms:
  latest_s:   `checkpoints/latest` names a step at or after the step logged when the signal was sent;
  marker_s:   the `preempted` marker exists (rank 0 writes it after the save, before the closing barrier);
  exit_s:     `launcher train` has exited; and its exit status (0 expected: a preemption is a clean stop),
plus the step the checkpoint holds and the steps run between the signal and the stop.
Every repeat is a fresh run (its own run_name), so no repeat inherits another's state.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import faults  # noqa: E402
import soak  # noqa: E402

from bench.bench_common import add_work_dir_args, emit, machine, work_dirs  # noqa: E402
from launcher.protocol import PREEMPTED_FILE  # noqa: E402


def one(cache: Path, runs: Path, name: str, sig: str, target: str) -> dict:
    run_dir = runs / name
    args = ["train", *soak.overrides(cache, runs, name, 100000, 0)]
    proc, f = faults.start(args, runs / f"{name}.log")
    try:
        while proc.poll() is None and faults.reached(run_dir) < 30:
            time.sleep(0.01)
        if proc.poll() is not None:
            return {"error": f"exited {proc.returncode} before step 30", "log": (runs / f"{name}.log").read_text()[-2000:]}
        pids = soak.rank_pids(run_dir)
        at_signal = faults.reached(run_dir)
        t0 = time.monotonic()
        os.kill(proc.pid if target == "launcher" else pids[1], getattr(signal, sig))
        latest_s = marker_s = None
        while time.monotonic() - t0 < 120:
            now = time.monotonic() - t0
            if latest_s is None and faults.latest_step(run_dir) >= at_signal:
                latest_s = now
            if marker_s is None and (run_dir / PREEMPTED_FILE).exists():
                marker_s = now
            if proc.poll() is not None:
                break
            time.sleep(0.005)
        exit_s = time.monotonic() - t0
        rc = proc.poll()
        if rc is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        gone = [p for p in pids.values() if soak.alive(p)]
        text = (runs / f"{name}.log").read_text()
        marker = run_dir / PREEMPTED_FILE
        saved = faults.latest_step(run_dir)
        return {"signal": sig, "target": target, "launcher_rc": rc, "hung": rc is None,
                "step_at_signal": at_signal, "checkpoint_step": saved, "steps_after_signal": saved - at_signal,
                "latest_s": None if latest_s is None else round(latest_s, 3),
                "marker_s": None if marker_s is None else round(marker_s, 3), "exit_s": round(exit_s, 3),
                "marker": json.loads(marker.read_text()) if marker.exists() else None,
                "ranks_left": gone, "tracebacks": text.count("Traceback (most recent call last)"),
                "said": [s for s in faults.said(text) if "preempted" in s or "launcher:" in s][:4]}
    finally:
        f.close()


def summary(rows: list[dict], key: str) -> dict:
    vals = [r[key] for r in rows if r.get(key) is not None]
    if not vals:
        return {"n": 0}
    return {"n": len(vals), "median": round(statistics.median(vals), 3), "min": min(vals), "max": max(vals)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    add_work_dir_args(ap)
    a = ap.parse_args()
    runs, cache = work_dirs(a, "signals-")
    t0 = time.time()
    cases = {}
    for sig in ("SIGHUP", "SIGTERM"):
        for target in ("launcher", "rank1"):
            rows = [one(cache, runs, f"{sig.lower()}-{target}-{i}", sig, target) for i in range(a.repeats)]
            cases[f"{sig} to {target}"] = {
                "latest_s": summary(rows, "latest_s"), "marker_s": summary(rows, "marker_s"),
                "exit_s": summary(rows, "exit_s"), "steps_after_signal": summary(rows, "steps_after_signal"),
                "launcher_rc": [r.get("launcher_rc") for r in rows],
                "all_checkpointed": all(r.get("marker") and r.get("checkpoint_step", 0) >= r.get("step_at_signal", 1)
                                        for r in rows),
                "ranks_left": sum(len(r.get("ranks_left", [])) for r in rows),
                "tracebacks": sum(r.get("tracebacks", 0) for r in rows),
                "runs": rows}
            print(sig, target, json.dumps({k: v for k, v in cases[f'{sig} to {target}'].items() if k != 'runs'}), flush=True)
    result = {
        "machine": machine(),
        "command": "python bench/reliability/signals.py " + " ".join(sys.argv[1:]),
        "repeats": a.repeats, "total_wall_s": round(time.time() - t0, 1), "cases": cases, "runs": str(runs)}
    emit(result, a.out, echo=False)  # the per-case lines above are the console's
    return 0


if __name__ == "__main__":
    sys.exit(main())
