"""Run directories that cannot be corrupted (issue 12, points 1-3), on real files and real processes, no ranks.

  - the run lock: a live owner (another process) is refused with its pid, host and job id; a killed owner, an
    old heartbeat from another host and an earlier attempt of the same SLURM job are taken over; release only
    deletes our own lock; `launcher train` and `launcher submit` into an owned run dir exit 2 before writing anything;
  - unnamed runs never share a directory (exclusive mkdir with -2, -3, ... suffixes, 8 threads at once);
  - config freeze: a full disk (RLIMIT_FSIZE makes the write fail with EFBIG, as ENOSPC would) and a SIGKILL after
    the new file is written both leave the old config.yaml in place;
  - a torn last line of metrics.jsonl is dropped with a warning; an empty `latest` falls back to the newest
    intact checkpoint with the same warning as a damaged checkpoint; resume=never refuses step_* without `latest`;
  - export refuses an output inside a checkpoint, inside a run dir another live process owns, or a non-empty
    directory that is not an earlier export.
"""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.config.errors import ConfigError
from launcher.export import check_export_target
from launcher.runtime import checkpoint as ckpt
from launcher.runtime import runlock
from launcher.runtime.metrics import truncate_metrics

REPO = Path(__file__).resolve().parents[2]


def env(**extra):
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    for k in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", runlock.LOCK_TOKEN_ENV):
        e.pop(k, None)
    e.update(extra)
    return e


def holder(run_dir: Path):
    """Another process that owns run_dir until killed; returns it once the lock exists."""
    code = (f"from launcher.runtime.runlock import acquire; import time, sys; acquire(__import__('pathlib').Path({str(run_dir)!r}), 'train'); "
            "print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env(SLURM_JOB_ID="4242"), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture(autouse=True)
def no_slurm_env(monkeypatch):
    for k in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", runlock.LOCK_TOKEN_ENV):
        monkeypatch.delenv(k, raising=False)


def test_live_owner_is_refused_and_a_killed_one_taken_over(tmp_path, capsys):
    run_dir = tmp_path / "r"
    proc = holder(run_dir)
    try:
        with pytest.raises(ConfigError) as err:
            runlock.acquire(run_dir, "train")
        msg = str(err.value)
        assert f"pid {proc.pid} on host {socket.gethostname()}, SLURM job 4242" in msg and "in use by `launcher train`" in msg
        assert "delete" in msg and str(run_dir / "owner.lock") in msg
    finally:
        proc.kill()
        proc.wait()
    lock = runlock.acquire(run_dir, "train")  # the owner was killed: its lock is stale
    assert f"process {proc.pid} on this host is gone" in capsys.readouterr().out
    rec = runlock.read_lock(run_dir)
    assert rec["pid"] == os.getpid() and rec["token"] == lock.token
    lock.release()
    assert not (run_dir / "owner.lock").exists()


def test_other_host_heartbeat_and_slurm_requeue(tmp_path, monkeypatch):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    lock_path = run_dir / "owner.lock"
    rec = {"pid": 1, "host": "node-elsewhere", "job_id": "77", "attempt": "0", "kind": "train", "token": "x", "started": time.time()}
    lock_path.write_text(json.dumps(rec))
    with pytest.raises(ConfigError, match="SLURM job 77"):
        runlock.acquire(run_dir, "train")  # fresh heartbeat on another host: owned
    old = time.time() - runlock.STALE_AFTER_S - 5
    os.utime(lock_path, (old, old))
    runlock.acquire(run_dir, "train").release()  # heartbeat too old: stale

    lock_path.write_text(json.dumps(rec))  # fresh again, on another host
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    lock = runlock.acquire(run_dir, "train")  # the requeued attempt of the same job takes its own lock over
    assert runlock.read_lock(run_dir)["attempt"] == "1"
    # Release deletes only our own lock: one that somebody else wrote meanwhile stays.
    lock_path.write_text(json.dumps(rec))
    lock.release()
    assert lock_path.exists()


def test_submit_lock_is_taken_over_by_its_job(tmp_path, monkeypatch):
    run_dir = tmp_path / "r"
    sub = runlock.acquire(run_dir, "submit")
    sub.update(job_id="900")
    sub.keep()
    with pytest.raises(ConfigError, match="SLURM job 900"):
        runlock.acquire(run_dir, "train")  # a queued job owns it (no squeue here to say otherwise)
    monkeypatch.setenv("SLURM_JOB_ID", "900")
    runlock.acquire(run_dir, "train").release()  # the job itself starts


def test_unnamed_runs_never_collide(tmp_path):
    base = tmp_path / "runs" / "tiny-20261124-120000"
    got, threads = [], [threading.Thread(target=lambda: got.append(runlock.claim_new_dir(base))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.name for p in got) == sorted([base.name] + [f"{base.name}-{n}" for n in range(2, 9)])


def test_launcher_train_into_an_owned_run_dir_is_refused(tmp_path):
    runs = tmp_path / "runs"
    proc = holder(runs / "busy")
    try:
        results = [subprocess.run([sys.executable, "-m", "launcher", command, "recipe=tiny", f"runs_dir={runs}", "run_name=busy",
                                   f"data.cache_dir={tmp_path / 'cache'}", *flags], cwd=REPO, env=env(), capture_output=True,
                                  text=True, timeout=120)
                   for command, flags in (("train", []), ("submit", ["--dry-run"]))]
    finally:
        proc.kill()
        proc.wait()
    for res in results:
        err = " ".join(res.stderr.split())
        assert res.returncode == 2, res.stdout + res.stderr
        assert "config error: run_name='busy'" in err and f"pid {proc.pid} on host {socket.gethostname()}, SLURM job 4242" in err, err
        assert "Traceback" not in res.stderr
    assert sorted(p.name for p in (runs / "busy").iterdir()) == ["owner.lock"]  # nothing written, not even the cache


FREEZE = """
import json, resource, signal, sys
from pathlib import Path
from omegaconf import OmegaConf
from launcher.runtime.rundir import freeze_config
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as one on a full disk with ENOSPC
if sys.argv[2] != "0":
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
freeze_config(OmegaConf.create({"note": sys.argv[3] * 3000}), Path(sys.argv[1]), {"train_batch_size": 8})
"""


@pytest.mark.parametrize("how", ["full-disk", "killed"])
def test_a_failed_refreeze_leaves_the_old_config(tmp_path, how):
    run_dir = tmp_path / "r"
    first = subprocess.run([sys.executable, "-c", FREEZE, str(run_dir), "0", "a"], env=env(), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    old = (run_dir / "config.yaml").read_bytes()
    limit, extra = ("1000", {}) if how == "full-disk" else ("0", {"LAUNCHER_FAULT": "config.tmp-written"})
    res = subprocess.run([sys.executable, "-c", FREEZE, str(run_dir), limit, "b"], env=env(**extra), capture_output=True, text=True)
    if how == "full-disk":
        assert res.returncode == 1 and "File too large" in res.stderr, res.stderr[-2000:]
    else:
        assert res.returncode == -signal.SIGKILL
    assert (run_dir / "config.yaml").read_bytes() == old  # still the old config: the job's command still starts
    assert not [p.name for p in run_dir.iterdir() if ".tmp" in p.name] or how == "killed"
    # The next freeze goes through and keeps the old one as config.prev.yaml.
    assert subprocess.run([sys.executable, "-c", FREEZE, str(run_dir), "0", "b"], env=env()).returncode == 0
    assert (run_dir / "config.prev.yaml").read_bytes() == old and "bbb" in (run_dir / "config.yaml").read_text()


def test_torn_metrics_line_is_dropped_with_a_warning(tmp_path):
    lines = [json.dumps({"kind": "train", "step": s, "loss": 1.0 / s}) for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + lines[2][:17])
    said = []
    truncate_metrics(tmp_path, after_step=2, warn=said.append)
    assert (tmp_path / "metrics.jsonl").read_text() == lines[0] + "\n" + lines[1] + "\n"
    assert len(said) == 1 and "dropped 1 damaged line(s)" in said[0] and "line 4" in said[0]


def fake_checkpoint(root: Path, step: int) -> Path:
    """A checkpoint directory with a manifest (what verify_checkpoint checks); real files, no model."""
    tag = root / ckpt.tag_for(step)
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(os.urandom(256))
    (tag / ckpt.STATE_FILE).write_text(json.dumps({"step": step, "manifest": ckpt.MANIFEST}))
    files = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in tag.iterdir()}
    (tag / ckpt.MANIFEST).write_text(json.dumps({"algorithm": "sha256", "files": files}))
    return tag


@pytest.mark.parametrize("latest,says", [(b"", "latest: empty"), (b"\0\0\0\0", "latest: empty"),
                                         (b"step_00000009", "step_00000009: the directory is missing"),
                                         (b"\xff\xfe", "latest: not a checkpoint tag"), (None, "latest: missing")])
def test_damaged_latest_falls_back_like_a_damaged_checkpoint(tmp_path, latest, says):
    root = tmp_path / "checkpoints"
    fake_checkpoint(root, 2)
    newest = fake_checkpoint(root, 4)
    if latest is not None:
        (root / "latest").write_bytes(latest)
    said = []
    got = ckpt.checkpoint_to_resume(OmegaConf.create({"resume": "auto"}), tmp_path, warn=said.append)
    assert got == newest
    assert len(said) == 1 and "resume=auto skips damaged checkpoints (" in said[0] and says in said[0], said
    assert "resumes from step_00000004, the newest intact one" in said[0]
    with pytest.raises(ConfigError, match=r"already holds checkpoints \(step_00000004, step_00000002"):
        ckpt.checkpoint_to_resume(OmegaConf.create({"resume": "never"}), tmp_path)
    if latest is not None and not latest.startswith(b"step_"):
        with pytest.raises(ConfigError, match="is damaged"):
            ckpt.resolve_checkpoint(root / "latest")


def test_export_target_is_checked(tmp_path):
    tag = fake_checkpoint(tmp_path / "run" / "checkpoints", 2)
    (tmp_path / "run" / "checkpoints" / "latest").write_text(tag.name)
    for bad in (tag, tag / "hf", tmp_path / "run" / "checkpoints" / "hf"):
        with pytest.raises(ConfigError, match="inside the checkpoint directory"):
            check_export_target(bad, tag)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="non-empty directory"):
        check_export_target(tmp_path / "junk", tag)
    proc = holder(tmp_path / "other")
    try:
        with pytest.raises(ConfigError, match=f"`launcher train` \\(pid {proc.pid}"):
            check_export_target(tmp_path / "other" / "hf", tag)
    finally:
        proc.kill()
        proc.wait()
    check_export_target(tmp_path / "other" / "hf", tag)  # its owner is gone
    check_export_target(tmp_path / "run" / "hf", tag)
