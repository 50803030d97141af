"""Run directories and the launcher's processes under crashes and signals (issue 12), on real 2-rank runs.

  - one owner: a second `launcher train` into a running run dir exits 2 naming the owner (pid, host);
  - SIGHUP (a closed terminal) to `launcher train`: the ranks checkpoint at the next step, exit 0, the lock is released;
  - a `preempted` marker left by that stop cannot turn the next attempt's crash into exit 0;
  - torchrun hanging after its ranks have exited: `launcher train` kills it after the grace and reports the
    ranks' result (here 0), instead of waiting forever;
  - fault injection: a SIGKILL in the middle of a metrics append, between publishing a checkpoint and writing
    `latest`, and in the middle of an export; after each, what is left is consistent and the next command works.
    (The config freeze is cut the same way in tests/unit/test_rundir_files.py; a kill before publishing is
    tests/train/test_train_runs.py's LAUNCHER_CRASH_IN_SAVE case.)
"""

import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from launcher.runtime.launch import proc_state, read_rank_records
from train_helpers import PYTHON, REPO, base_overrides, child_env, launcher

pytestmark = pytest.mark.slow
HANG_TORCHRUN = Path(__file__).parent / "hang_torchrun"


def train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]


def test_owner_sighup_stale_marker_and_hung_torchrun(cache_dir, tmp_path):
    runs = tmp_path / "runs"
    args = ["train", *base_overrides(cache_dir, 100000), f"runs_dir={runs}", "run_name=own", "checkpoint.save_every=0",
            "logging.log_every=1"]
    proc = subprocess.Popen([PYTHON, "-m", "launcher", *args], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    run_dir = runs / "own"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        m = run_dir / "metrics.jsonl"
        if m.exists() and len(m.read_text().splitlines()) >= 3:
            break
        time.sleep(0.1)
    pids = [r["pid"] for r in read_rank_records(run_dir / "ranks").values()]
    try:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        # A second start into the running run dir is refused, naming the owner; nothing of the run is touched.
        config_before = (run_dir / "config.yaml").read_bytes()
        second = launcher(args, timeout=300)
        err = " ".join(second.stderr.split())
        assert second.returncode == 2 and f"is in use by `launcher train` (pid {proc.pid} on host {socket.gethostname()}" in err, err
        assert (run_dir / "config.yaml").read_bytes() == config_before and proc.poll() is None

        t_hup = time.monotonic()
        os.kill(proc.pid, signal.SIGHUP)
        out, err = proc.communicate(timeout=120)
        hup_s = time.monotonic() - t_hup
    finally:
        for pid in pids:
            if proc_state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)
    print(f"SIGHUP -> checkpoint saved and exit after {hup_s:.1f} s")
    assert proc.returncode == 0, err[-3000:]
    # The ranks got the signal straight from us: torchrun ended as after a normal run, with no SignalException traceback.
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    marker = json.loads((run_dir / "preempted").read_text())
    assert marker["signal"] == "SIGHUP" and (run_dir / "checkpoints" / "latest").read_text() == f"step_{marker['step']:08d}"
    assert not (run_dir / "owner.lock").exists()
    stopped = marker["step"]

    # The next attempt crashes in its final save: the marker of the SIGHUP stop must not make that exit 0.
    resume = ["train", "--config", str(run_dir / "config.yaml"), "resume=auto", f"train.steps={stopped + 2}",
              "scheduler.decay_steps=100000"]  # the saved cosine horizon (a resume may not re-stretch it)
    crashed = launcher(resume, timeout=300, LAUNCHER_CRASH_IN_SAVE=f"step_{stopped + 2:08d}")
    assert crashed.returncode != 0 and "launcher: training failed" in crashed.stderr, crashed.stderr[-3000:]
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{stopped:08d}"

    # torchrun that never exits after its ranks did (sitecustomize makes it sleep at exit): killed after the grace.
    t0 = time.monotonic()
    hung = launcher(resume, timeout=300, LAUNCHER_TORCHRUN_EXIT_GRACE_S=3,
                    PYTHONPATH=f"{HANG_TORCHRUN}{os.pathsep}{REPO}")
    took = time.monotonic() - t0
    print(f"hung torchrun: launcher train returned {hung.returncode} after {took:.1f} s")
    assert hung.returncode == 0, hung.stderr[-3000:]
    assert "did not exit within 3 s of its last rank: killed with SIGKILL" in hung.stderr
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{stopped + 2:08d}"
    assert not (run_dir / "owner.lock").exists()


def tree_digest(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def test_kill_during_writes_leaves_a_consistent_run(cache_dir, tmp_path):
    runs = tmp_path / "runs"
    base = [*base_overrides(cache_dir, 6), f"runs_dir={runs}", "checkpoint.save_every=2", "checkpoint.keep_last=5"]

    # 1. Metrics append: rank 0 dies with half of step 3's line written. latest = step 2; the resume drops the torn
    #    line with a warning and every step appears once.
    res = launcher(["train", *base, "run_name=m"], LAUNCHER_FAULT="metrics.half-line")
    run_dir = runs / "m"
    assert res.returncode != 0
    text = (run_dir / "metrics.jsonl").read_text()
    assert not text.endswith("\n") and (run_dir / "checkpoints" / "latest").read_text() == "step_00000002"
    res = launcher(["train", "--config", str(run_dir / "config.yaml"), "resume=auto"])
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, out[-3000:]
    assert "dropped 1 damaged line(s)" in out and "resuming at step 2" in out
    assert train_steps(run_dir) == [1, 2, 3, 4, 5, 6]

    # 2. Checkpoint publish: killed after step_2 was renamed into place, before `latest` was written. The resume
    #    takes step_2 (intact, manifest-verified), saying `latest` was missing.
    res = launcher(["train", *base, "run_name=c"], LAUNCHER_FAULT="checkpoint.renamed")
    run_dir = runs / "c"
    assert res.returncode != 0 and not (run_dir / "checkpoints" / "latest").exists()
    assert (run_dir / "checkpoints" / "step_00000002" / "manifest.json").is_file()
    assert not (run_dir / "owner.lock").exists()  # `launcher train` itself exited normally and released it
    res = launcher(["train", "--config", str(run_dir / "config.yaml"), "resume=auto"])
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, out[-3000:]
    assert "skips damaged checkpoints (latest: missing) and resumes from step_00000002" in out and "resuming at step 2" in out
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_00000006"

    # 3. Export: killed after model.safetensors was written. OUT does not appear (only a .OUT.partial-PID dir); an
    #    earlier export at OUT stays byte for byte; the next export works.
    out_dir = tmp_path / "hf"
    ckpt_dir = run_dir / "checkpoints" / "step_00000004"
    res = launcher(["export", str(ckpt_dir), str(out_dir)], timeout=300, LAUNCHER_FAULT="export.model-written")
    assert res.returncode == -signal.SIGKILL and not out_dir.exists()
    assert [p.name for p in tmp_path.glob(".hf.partial-*")]
    assert launcher(["export", str(ckpt_dir), str(out_dir)], timeout=300).returncode == 0
    first = tree_digest(out_dir)
    assert "model.safetensors" in first and "config.json" in first
    res = launcher(["export", str(run_dir / "checkpoints" / "latest"), str(out_dir)], timeout=300,
                   LAUNCHER_FAULT="export.model-written")
    assert res.returncode == -signal.SIGKILL and tree_digest(out_dir) == first
    assert launcher(["export", str(run_dir / "checkpoints" / "latest"), str(out_dir)], timeout=300).returncode == 0
    assert tree_digest(out_dir)["model.safetensors"] != first["model.safetensors"]  # step 6 replaced step 4
