"""Soak with torn writes and a full disk (issue 12): the soak of soak.py, plus damage between the kills.

    .venv/bin/python bench/reliability/faults.py [--steps 2000] [--out bench/reliability/faults.json]

The same tiny config and uninterrupted reference as soak.py. The faulted run goes through five launches:
  seg 0: fresh; SIGKILL of `launcher train` ~25 steps after the checkpoint at 500;
         then torn writes: the last metrics.jsonl line cut to half its bytes (no newline), `latest` emptied
         (0 bytes: what a node crash leaves when the rename reached the disk and the data did not);
  seg 1: resume=auto; SIGKILL of rank 1 ~25 steps after the checkpoint at 1,000;
         then: the last metrics line cut to half, `latest` overwritten with binary garbage;
  seg 2: resume=auto with the run directory on a small tmpfs mounted over it (same path), sized so that the
         resume's own writes and ~100 steps of metrics fit and the next checkpoint (0.65 MiB) does not:
         the disk fills during the save at 1,100; the job must fail (non-zero), not hang;
         then the run dir is copied to the normal disk (cp -a), the tmpfs unmounted, the copy put back;
  seg 3: resume=auto; SIGKILL of the whole process group ~25 steps after the checkpoint at 1,500;
         then: the last metrics line cut to half, `latest` zero-filled at its old length (ext4's shape);
  seg 4: resume=auto to the end.
Measured per fault: the launcher's exit status, what it printed (warnings, launcher: lines, the error),
steps lost (newest step logged before the fault minus the step the next launch resumed at); at the end, the
final weights and every per-step loss against the reference (fp32: bit-identical expected).
Needs root for mount(8) (tmpfs); without it the disk-full segment is skipped and says so.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak  # noqa: E402  (the shared helpers: config, reference run, records, weights)

from bench.bench_common import add_work_dir_args, emit, machine, work_dirs  # noqa: E402
from launcher.runtime.checkpoint import read_latest, tag_for  # noqa: E402

REPO = soak.REPO
PYTHON = soak.PYTHON


def start(args: list[str], log: Path):
    e = soak.env()
    e["COLUMNS"] = "1000"  # rich wraps at 80 columns when not on a terminal; keep each message on one line
    f = open(log, "w")
    return subprocess.Popen([PYTHON, "-m", "launcher", *args], cwd=REPO, env=e, stdout=f, stderr=subprocess.STDOUT,
                            start_new_session=True), f


reached = soak.reached


def said(text: str) -> list[str]:
    """What the launcher printed about faults: warnings, its own lines, errors (not the per-step lines)."""
    keep = re.compile(r"warning: |launcher: |error|Error|No space left|resuming|fresh start|preempted|Traceback")
    noise = re.compile(r"FutureWarning|UserWarning|warnings.warn")
    return [ln.strip()[:400] for ln in text.splitlines() if keep.search(ln) and not noise.search(ln)][:25]


def resumed_at(text: str):
    m = re.search(r"resuming at step (\d+)", text)
    return int(m.group(1)) if m else None


def tear_metrics(run_dir: Path) -> str:
    """Cut the last line of metrics.jsonl to half its bytes, without its newline (a torn append)."""
    path = run_dir / "metrics.jsonl"
    data = path.read_bytes()
    body = data.rstrip(b"\n")
    start_of_last = body.rfind(b"\n") + 1
    last = body[start_of_last:]
    path.write_bytes(body[:start_of_last] + last[: len(last) // 2])
    return f"last metrics line ({len(last)} bytes) cut to {len(last) // 2} bytes, no newline"


def damage_latest(run_dir: Path, how: str) -> str:
    path = run_dir / "checkpoints" / "latest"
    old = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
        return f"latest ({old.decode().strip()}) emptied to 0 bytes"
    if how == "garbage":
        path.write_bytes(b"\x8f\x00\xffgarbage\xfe")
        return f"latest ({old.decode().strip()}) overwritten with 11 bytes of binary garbage"
    path.write_bytes(b"\0" * len(old))
    return f"latest ({old.decode().strip()}) zero-filled ({len(old)} zero bytes)"


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def mount_small_tmpfs(run_dir: Path, headroom: int) -> dict:
    """Put `run_dir` on a tmpfs of (its current size + headroom), at the same path."""
    staging = run_dir.with_name(run_dir.name + ".staging")
    run_dir.rename(staging)
    run_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=755", "tmpfs", str(run_dir)], check=True)
    subprocess.run(["cp", "-a", f"{staging}/.", str(run_dir)], check=True)
    st = os.statvfs(run_dir)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    size_k = -(-(used + headroom) // 4096) * 4  # whole pages, in KiB
    subprocess.run(["mount", "-o", f"remount,size={size_k}k", str(run_dir)], check=True)
    shutil.rmtree(staging)
    st = os.statvfs(run_dir)
    return {"tmpfs_size_kib": size_k, "used_kib_at_mount": used // 1024, "free_kib_at_start": st.f_bavail * st.f_frsize // 1024}


def rescue_to_disk(run_dir: Path) -> None:
    """The operator's fix: copy the full run dir to a normal disk, unmount the tmpfs, put the copy in its place."""
    rescue = run_dir.with_name(run_dir.name + ".rescue")
    subprocess.run(["cp", "-a", str(run_dir), str(rescue)], check=True)
    subprocess.run(["umount", str(run_dir)], check=True)
    run_dir.rmdir()
    rescue.rename(run_dir)


def run_faults(cache: Path, runs: Path, steps: int, save_every: int, disk_full: bool) -> dict:
    run_dir = runs / "faults"
    resume = ["train", "--config", str(run_dir / "config.yaml"), "resume=auto"]
    plan = [("sigkill-launcher", 500, "empty"), ("sigkill-rank-1", 1000, "garbage")]
    plan += [("disk-full", None, None)] if disk_full else []
    plan += [("sigkill-process-group", 1500, "zeros"), (None, None, None)]
    faults = []
    t0 = time.time()
    for seg, (mode, target, latest_how) in enumerate(plan):
        log = runs / f"faults-{seg}.log"
        args = ["train", *soak.overrides(cache, runs, "faults", steps, save_every)] if seg == 0 else resume
        mount = None
        if mode == "disk-full":
            # Room for the resume's own rewrites (metrics.jsonl is rewritten whole: its size again) and ~100
            # steps of metrics, not for a checkpoint (0.65 MiB): the save at resumed + save_every fills it.
            headroom = (run_dir / "metrics.jsonl").stat().st_size + 160 * 1024
            mount = mount_small_tmpfs(run_dir, headroom)
        t_seg = time.monotonic()
        proc, f = start(args, log)
        if mode is None:
            rc = proc.wait()
            f.close()
            text = log.read_text()
            result = {"final_segment_rc": rc, "final_segment_said": said(text), "final_resumed_at": resumed_at(text)}
        elif mode == "disk-full":
            hung = False
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                hung = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            f.close()
            text = log.read_text()
            st = os.statvfs(run_dir)
            entry = {"mode": mode, **mount, "launcher_rc": proc.returncode, "hung": hung,
                     "exit_after_s": round(time.monotonic() - t_seg, 1), "step_reached": reached(run_dir),
                     "free_kib_at_exit": st.f_bavail * st.f_frsize // 1024,
                     "latest_at_exit": read_latest(run_dir / "checkpoints"),
                     "leftovers": sorted(p.name for p in (run_dir / "checkpoints").iterdir()),
                     "no_space_errors": text.count("No space left on device"),
                     "tracebacks": text.count("Traceback (most recent call last)"),
                     "this_launch_resumed_at": resumed_at(text), "said": said(text)}
            rescue_to_disk(run_dir)
            faults.append(entry)
        else:
            entry = soak.kill_after_checkpoint(proc, run_dir, target, mode)
            entry.pop("pids", None)
            f.close()
            text = log.read_text()
            entry["this_launch_resumed_at"] = resumed_at(text)
            entry["torn"] = [tear_metrics(run_dir), damage_latest(run_dir, latest_how)]
            faults.append(entry)
        if seg > 0:  # the previous fault's resume: where this launch started and what it printed about it
            prev = faults[seg - 1]
            prev["next_launch_resumed_at"] = resumed_at(text)
            prev["steps_lost"] = prev["step_reached"] - (resumed_at(text) or 0)
            prev["next_launch_said"] = [s for s in said(text) if "warning" in s or "launcher:" in s][:8]
            prev["next_launch_tracebacks"] = text.count("Traceback (most recent call last)")
    return {"faults": faults, "wall_s": round(time.time() - t0, 1), **result}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--save-every", type=int, default=100)
    add_work_dir_args(ap)
    ap.add_argument("--reference", default=None, help="reuse this finished reference run dir (same config)")
    a = ap.parse_args()
    import torch

    runs, cache = work_dirs(a, "faults-")
    t0 = time.time()
    ref_dir = Path(a.reference) if a.reference else runs / "reference"
    ref_wall = None if a.reference else soak.run_reference(cache, runs, a.steps, a.save_every)["wall_s"]
    disk_full = os.geteuid() == 0
    res = run_faults(cache, runs, a.steps, a.save_every, disk_full)
    tag = tag_for(a.steps)
    w_ref, w_f = soak.final_weights(ref_dir / "checkpoints" / tag), soak.final_weights(runs / "faults" / "checkpoints" / tag)
    l_ref = {r["step"]: r["loss"] for r in soak.records(ref_dir, "train")}
    l_f = {r["step"]: r["loss"] for r in soak.records(runs / "faults", "train")}
    common = set(l_ref) & set(l_f)
    result = {
        "machine": machine(),
        "command": "python bench/reliability/faults.py " + " ".join(sys.argv[1:]),
        "steps": a.steps, "save_every": a.save_every,
        "disk_full": "tmpfs mounted over the run dir (mount -t tmpfs -o size=...)" if disk_full
        else "skipped: not root, mount(8) not permitted",
        "reference_wall_s": None if ref_wall is None else round(ref_wall, 1), "faults_wall_s": res["wall_s"],
        "total_wall_s": round(time.time() - t0, 1),
        "faults": res["faults"],
        "final_segment_rc": res["final_segment_rc"], "final_resumed_at": res["final_resumed_at"],
        "final_weights_max_abs_diff": max(float((w_ref[k].float() - w_f[k].float()).abs().max()) for k in w_ref),
        "final_weights_equal": all(torch.equal(w_ref[k], w_f[k]) for k in w_ref),
        "loss_steps_compared": len(common),
        "loss_bit_identical": all(l_ref[s] == l_f[s] for s in common),
        "loss_max_abs_diff": max(abs(l_ref[s] - l_f[s]) for s in common),
        "faults_steps_logged_once_each": [r["step"] for r in soak.records(runs / "faults", "train")] == list(range(1, a.steps + 1)),
        "runs": str(runs),
    }
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
