"""A dead or hung rank never hangs `launcher train` (issue 7, part 2): real ranks, real signals.

Each case starts `launcher train` as a user does (it starts torchrun), waits until the ranks train, then
  - SIGSEGV to one rank of 2 (a crash in C++), kill -9 to one rank of 4: the job exits non-zero within 60 s and says
    which rank died and with which signal; the crashed rank's Python stack is on stderr;
  - SIGSTOP one rank of 2 (a hung collective): the other rank's collective times out after
    train.dist_timeout_s, the launcher kills the stopped rank, the job exits non-zero within timeout + 60 s;
  - kill -9 `launcher train` itself: no rank survives it (no orphans training on).
The ranks' pids come from their registrations (<run_dir>/ranks/rank-N.json), which the tests also check
against /proc (each pid runs `launcher train --config` of this run).
"""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher.runtime.launch import proc_state, read_rank_records
from train_helpers import PYTHON, REPO, base_overrides, child_env

pytestmark = pytest.mark.slow
DIST_TIMEOUT_S = 10


def start(cache_dir, runs: Path, name: str, nproc: int, *extra):
    micro = 8 // nproc // 2 or 1
    args = ["train", *base_overrides(cache_dir, 100000), f"runs_dir={runs}", f"run_name={name}", "checkpoint.save_every=0",
            f"cluster.gpus_per_node={nproc}", f"batch.micro_batch_size={micro}", f"train.dist_timeout_s={DIST_TIMEOUT_S}",
            "logging.log_every=5", *extra]
    proc = subprocess.Popen([PYTHON, "-m", "launcher", *args], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    run_dir = runs / name
    deadline = time.time() + 300
    pids: dict[int, int] = {}
    while time.time() < deadline and proc.poll() is None:
        pids = {rank: rec["pid"] for rank, rec in read_rank_records(run_dir / "ranks").items()}
        metrics = run_dir / "metrics.jsonl"
        if len(pids) == nproc and metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.1)
    assert proc.poll() is None and len(pids) == nproc, proc.communicate()[1][-3000:] if proc.poll() is not None else pids
    for rank, pid in pids.items():  # the registrations name this run's ranks
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "launcher train --config" in cmdline and name in cmdline, (rank, cmdline)
    return proc, pids


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z")


def finish(proc, pids, limit_s: float):
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=limit_s + 60)
    finally:
        for pid in pids.values():  # never leave a rank behind, even when the assertion below fails
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    return time.monotonic() - t0, out, err


@pytest.mark.parametrize("nproc,victim,sig", [(2, 1, signal.SIGSEGV), (4, 2, signal.SIGKILL)])
def test_killed_rank_fails_the_job_fast_and_is_named(cache_dir, tmp_path, nproc, victim, sig):
    """SIGSEGV stands for a crash inside a C++ library (gloo, a kernel): the rank also leaves every thread's Python
    stack on stderr (faulthandler, launcher/cli.py run_rank), which a SIGKILL cannot."""
    proc, pids = start(cache_dir, tmp_path, f"kill{nproc}", nproc)
    t_kill = time.monotonic()
    os.kill(pids[victim], sig)
    elapsed, out, err = finish(proc, pids, 60)
    elapsed = time.monotonic() - t_kill
    print(f"{nproc} ranks, {sig.name} to rank {victim}: exit {proc.returncode} after {elapsed:.1f} s")
    assert proc.returncode != 0
    assert elapsed < 60, elapsed
    assert f"launcher: rank {victim} (pid {pids[victim]}" in err and f"died with {sig.name}" in err, err[-3000:]
    summary = [line for line in err.splitlines() if line.startswith("launcher: training failed")]
    assert summary and f"rank {victim} (pid {pids[victim]}" in summary[0] and sig.name in summary[0], err[-3000:]
    if sig == signal.SIGSEGV:
        # The rank's stacks are kept beside its record and printed; the crashing (main) thread's reaches down to the
        # loop, and the failure line names its innermost frame (wherever in the step the signal landed).
        stack_file = tmp_path / f"kill{nproc}" / "ranks" / f"rank-{victim:05d}.stack"
        dump = stack_file.read_text()
        assert dump.startswith("Fatal Python error: Segmentation fault") and dump.strip() in err, err[-3000:]
        main_thread = dump[dump.index("Current thread "):]
        assert "launcher/train.py" in main_thread and "in run_rank" in main_thread, dump
        assert re.search(rf"died with SIGSEGV in \S+:\d+ in \S+ \(every thread's stack: {re.escape(str(stack_file))}\)",
                         summary[0]), summary[0]
        # the ranks that did not crash leave no stack file
        assert sorted(p.name for p in stack_file.parent.glob("*.stack")) == [stack_file.name]
    assert not any(alive(p) for p in pids.values())


@pytest.mark.parametrize("nproc,victim", [(2, 1), (4, 2)])
def test_stopped_rank_is_detected_by_the_collective_timeout(cache_dir, tmp_path, nproc, victim):
    proc, pids = start(cache_dir, tmp_path, f"stop{nproc}", nproc)
    t_stop = time.monotonic()
    os.kill(pids[victim], signal.SIGSTOP)
    _, out, err = finish(proc, pids, DIST_TIMEOUT_S + 60)
    elapsed = time.monotonic() - t_stop
    print(f"{nproc} ranks, SIGSTOP rank {victim}: exit {proc.returncode} after {elapsed:.1f} s (dist_timeout_s={DIST_TIMEOUT_S})")
    assert proc.returncode != 0
    # Not before the timeout (nothing else can tell a slow rank from a hung one), and soon after it.
    assert DIST_TIMEOUT_S - 1 < elapsed < DIST_TIMEOUT_S + 60, elapsed
    assert f"Timed out waiting {DIST_TIMEOUT_S * 1000}ms" in err, err[-3000:]
    assert f"rank {victim} (pid {pids[victim]}) is stopped" in err and "killed with SIGKILL" in err, err[-3000:]
    assert not any(alive(p) for p in pids.values())


def test_killing_the_launcher_leaves_no_orphaned_ranks(cache_dir, tmp_path):
    proc, pids = start(cache_dir, tmp_path, "orphans", 2)
    os.kill(proc.pid, signal.SIGKILL)  # the `launcher train` process only, not its process group
    t0 = time.monotonic()
    proc.communicate(timeout=30)
    while time.monotonic() - t0 < 30 and any(alive(p) for p in pids.values()):
        time.sleep(0.1)
    gone_after = time.monotonic() - t0
    for pid in pids.values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    print(f"kill -9 launcher train: its ranks gone after {gone_after:.1f} s")
    assert gone_after < 10, gone_after
