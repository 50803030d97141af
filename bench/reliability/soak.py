"""Soak: `launcher train` on 2 CPU ranks for 2,000 steps, a checkpoint every 100, a hard kill every 500 (issue 7, part 7).

    .venv/bin/python bench/reliability/soak.py [--steps 2000] [--out bench/reliability/results.json]

Two runs of the same tiny config (the test model of tests/train: a 2-layer LLaMA of width 32, fp32, ZeRO-2):
  reference: uninterrupted;
  soak:      killed three times, each time shortly after the checkpoint at a multiple of 500, and continued
             with `launcher train --config <run>/config.yaml resume=auto`:
               kill 1: SIGKILL `launcher train` itself (torchrun and the ranks must die with it),
               kill 2: SIGKILL rank 1 (the job must exit non-zero and name the rank),
               kill 3: SIGKILL the whole process group at once (a node going away).
Measured: steps lost per kill (the newest step rank 0 logged before the kill minus the step resumed from),
seconds from the kill until no rank of the job is left, losses and final weights against the reference
(fp32: exact expected), resident memory of each rank at every checkpoint (does it grow?), wall times.
tests/train/test_soak.py runs this (marked slow) and asserts on its result.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
PYTHON = sys.executable

from bench.bench_common import add_work_dir_args, emit, machine, work_dirs  # noqa: E402
from launcher.runtime.checkpoint import read_latest  # noqa: E402  (after the path)
from launcher.runtime.launch import proc_state, read_rank_records  # noqa: E402
MODEL = ["model.hidden_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2", "model.num_key_value_heads=2",
         "model.intermediate_size=64", "model.vocab_size=320", "model.max_position_embeddings=64"]


def overrides(cache_dir: Path, runs: Path, name: str, steps: int, save_every: int) -> list[str]:
    return ["recipe=tiny", *MODEL, "data.seq_length=32", "data.max_bytes=300000", f"data.cache_dir={cache_dir}",
            "batch.global_batch_size=8", "batch.micro_batch_size=4", f"train.steps={steps}", "train.eval_every=0",
            "scheduler.warmup_steps=20", "logging.log_every=1", "logging.progress_bar=false", "checkpoint.export_hf=false",
            f"checkpoint.save_every={save_every}", "checkpoint.keep_last=3", f"runs_dir={runs}", f"run_name={name}"]


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def records(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut by the kill
        if r.get("kind") == kind:
            out.append(r)
    return out


def rank_pids(run_dir: Path) -> dict[int, int]:
    return {rank: rec["pid"] for rank, rec in read_rank_records(run_dir / "ranks").items()}


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z")


def start(args: list[str], log: Path):
    f = open(log, "w")
    return subprocess.Popen([PYTHON, "-m", "launcher", *args], cwd=REPO, env=env(), stdout=f, stderr=subprocess.STDOUT,
                            start_new_session=True), f


def latest_step(run_dir: Path) -> int:
    tag = read_latest(run_dir / "checkpoints")  # None while `latest` is missing or damaged (faults.py damages it)
    return int(tag.split("_")[1]) if tag else 0


def reached(run_dir: Path) -> int:
    """The newest step rank 0 logged."""
    return max((r["step"] for r in records(run_dir, "train")), default=0)


def kill_after_checkpoint(proc, run_dir: Path, target: int, mode: str) -> dict:
    """Wait for the checkpoint at `target`, let ~25 more steps run (mid-interval, so work is really lost), then
    kill as `mode`: `sigkill-launcher` (torchrun and the ranks must die with it), `sigkill-rank-1` (the job must
    exit non-zero and name the rank) or `sigkill-process-group` (a node going away). Waits up to 120 s for every
    rank to be gone and kills any orphan. Returns what happened, with "error" if the job ended before the
    checkpoint; "pids" is the rank -> pid map at the kill. Shared by this soak and faults.py."""
    while proc.poll() is None and latest_step(run_dir) < target:
        time.sleep(0.02)
    if proc.poll() is not None:
        return {"mode": mode, "error": f"the job exited ({proc.returncode}) before the checkpoint at {target}"}
    at_ckpt = reached(run_dir)
    while proc.poll() is None and reached(run_dir) < at_ckpt + 25:
        time.sleep(0.01)
    pids = rank_pids(run_dir)
    t_kill = time.monotonic()
    if mode == "sigkill-launcher":
        os.kill(proc.pid, signal.SIGKILL)
    elif mode == "sigkill-rank-1":
        os.kill(pids[1], signal.SIGKILL)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=120)
    launcher_exit_s = time.monotonic() - t_kill
    while any(alive(p) for p in pids.values()) and time.monotonic() - t_kill < 120:
        time.sleep(0.01)
    all_gone_s = time.monotonic() - t_kill
    orphans = [p for p in pids.values() if alive(p)]
    for p in orphans:  # never leave one behind
        os.kill(p, signal.SIGKILL)
    return {"mode": mode, "launcher_rc": proc.returncode, "launcher_exit_s": round(launcher_exit_s, 2),
            "all_ranks_gone_s": round(all_gone_s, 2), "step_reached": reached(run_dir), "orphans_left": orphans,
            "pids": pids}


def run_reference(cache: Path, runs: Path, steps: int, save_every: int) -> dict:
    t0 = time.time()
    proc, f = start(["train", *overrides(cache, runs, "reference", steps, save_every)], runs / "reference.log")
    rc = proc.wait()
    f.close()
    assert rc == 0, (runs / "reference.log").read_text()[-3000:]
    return {"wall_s": time.time() - t0}


def run_soak(cache: Path, runs: Path, steps: int, save_every: int, kill_every: int) -> dict:
    run_dir = runs / "soak"
    kills = []
    how = ["sigkill-launcher", "sigkill-rank-1", "sigkill-process-group"]
    segment = 0
    t_start = time.time()
    args = ["train", *overrides(cache, runs, "soak", steps, save_every)]
    while True:
        log = runs / f"soak-{segment}.log"
        proc, f = start(args, log)
        target = (len(kills) + 1) * kill_every
        mode = how[len(kills)] if target < steps and len(kills) < len(how) else None
        if mode is None:
            rc = proc.wait()
            f.close()
            assert rc == 0, log.read_text()[-3000:]
            break
        kill = kill_after_checkpoint(proc, run_dir, target, mode)
        f.close()
        assert "error" not in kill, kill["error"] + "\n" + log.read_text()[-3000:]
        pids = kill.pop("pids")
        resumed_from = latest_step(run_dir)
        text = log.read_text()
        kills.append({**kill, "resumed_from": resumed_from, "steps_lost": kill["step_reached"] - resumed_from,
                      "named_the_dead_rank": (f"rank 1 (pid {pids[1]}" in text and "died with SIGKILL" in text)
                      if mode == "sigkill-rank-1" else None})
        args = ["train", "--config", str(run_dir / "config.yaml"), "resume=auto"]
        segment += 1
    return {"wall_s": time.time() - t_start, "kills": kills, "segments": segment + 1}


def final_weights(tag_dir: Path) -> dict:
    import torch

    return torch.load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]


def memory_trend(run_dir: Path) -> dict:
    """Resident memory of every rank at each checkpoint, and how much it grew over the second half of them."""
    ck = records(run_dir, "checkpoint")
    per_rank = list(zip(*[r["rss_bytes_per_rank"] for r in ck]))  # rank -> series
    n = len(ck)
    half = n // 2
    mib = lambda b: round(b / 2**20, 1)  # noqa: E731
    return {"checkpoints": n,
            "rss_mib_per_rank": [[mib(x) for x in series] for series in per_rank],
            "growth_mib_first_to_last_per_rank": [mib(series[-1] - series[0]) for series in per_rank],
            "growth_mib_second_half_per_rank": [mib(series[-1] - series[half]) for series in per_rank],
            "save_s_median": round(sorted(r["save_s"] for r in ck)[n // 2], 3),
            "hash_s_median": round(sorted(r["hash_s"] for r in ck)[n // 2], 4),
            "checkpoint_mib": round(ck[-1]["bytes"] / 2**20, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--kill-every", type=int, default=500)
    add_work_dir_args(ap)
    a = ap.parse_args()
    import torch

    runs, cache = work_dirs(a, "soak-")
    t0 = time.time()
    ref = run_reference(cache, runs, a.steps, a.save_every)
    soak = run_soak(cache, runs, a.steps, a.save_every, a.kill_every)
    tag = f"step_{a.steps:08d}"
    w_ref, w_soak = final_weights(runs / "reference" / "checkpoints" / tag), final_weights(runs / "soak" / "checkpoints" / tag)
    max_diff = max(float((w_ref[k].float() - w_soak[k].float()).abs().max()) for k in w_ref)
    l_ref = {r["step"]: r["loss"] for r in records(runs / "reference", "train")}
    l_soak = {r["step"]: r["loss"] for r in records(runs / "soak", "train")}
    result = {
        "machine": machine(),
        "command": "python bench/reliability/soak.py " + " ".join(sys.argv[1:]),
        "steps": a.steps, "save_every": a.save_every, "kill_every": a.kill_every,
        "reference_wall_s": round(ref["wall_s"], 1), "soak_wall_s": round(soak["wall_s"], 1),
        "total_wall_s": round(time.time() - t0, 1),
        "kills": soak["kills"],
        "final_weights_max_abs_diff": max_diff,
        "final_weights_equal": all(torch.equal(w_ref[k], w_soak[k]) for k in w_ref),
        "loss_steps_compared": len(set(l_ref) & set(l_soak)),
        "loss_max_abs_diff": max(abs(l_ref[s] - l_soak[s]) for s in set(l_ref) & set(l_soak)),
        "soak_steps_logged": sorted(l_soak) == list(range(1, a.steps + 1)),
        "memory_reference": memory_trend(runs / "reference"),
        "memory_soak": memory_trend(runs / "soak"),
        "runs": str(runs),
    }
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
