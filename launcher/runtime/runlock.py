"""One owner per run directory: `<run_dir>/owner.lock` (no torch).

Who owns a run dir:
  - `launcher train` (the parent of the local ranks) from before it writes anything there until torchrun has
    exited; its ranks are covered by it (they get its token in LAUNCHER_RUN_LOCK);
  - `launcher submit` from before it freezes the config; after sbatch the lock names the job id, and the job's
    rank 0 takes it over when the job starts (same SLURM_JOB_ID), every requeued attempt again;
  - rank 0 under srun + torchrun (a job, or a hand-made launch), until it exits.

The lock is created with link(2) of a fully written temporary file: atomic, and it fails with EEXIST when
the lock exists, on local filesystems and on NFS (v3 and v4: link is the classic NFS-safe lock primitive,
open(O_EXCL) is only atomic on NFSv3+ with Linux >= 2.6.5), Lustre, GPFS and BeeGFS, which all implement link
atomically; no fcntl/flock, which NFS only honours through lockd and Lustre only with `-o flock`. A reader
never sees a half-written lock.

It holds {pid, host, job_id, attempt, kind, token, started}. It is released (deleted, when it is still ours)
on every exit that runs Python code: a return, an exception, SIGTERM/SIGINT/SIGHUP (which the launcher turns
into a normal exit). After a crash (SIGKILL, OOM kill, a dead node) it is left behind and is *stale* when:
  - its job is ours: the same SLURM_JOB_ID and the lock was written by `launcher submit` or by an earlier
    attempt (SLURM_RESTART_COUNT differs): a requeued job never waits for itself;
  - the same host: the pid is gone, or now belongs to another process (its start time differs);
  - a queued job (`launcher submit` lock): `squeue` no longer lists the job (where squeue is on PATH;
    elsewhere it stays owned until the lock is removed by hand, which the refusal says);
  - another host: its heartbeat is old. The owner touches the lock (mtime) every HEARTBEAT_S; a lock not
    touched for STALE_AFTER_S is stale. That needs clocks within minutes of each other (NTP) and a filesystem
    that keeps mtimes from os.utime (all of the above do).
A stale lock is replaced under `owner.lock.takeover` (created exclusively, so two starters cannot both take
it over); a takeover file older than STALE_AFTER_S is itself stale (its process died in those milliseconds).
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Optional

from launcher.config.errors import ConfigError
from launcher.runtime.durable import fsync_dir, write_atomic

LOCK_FILE = "owner.lock"
# Ranks started by `launcher train` run under its lock: they find its token here.
LOCK_TOKEN_ENV = "LAUNCHER_RUN_LOCK"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0


def _proc_start(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _job_queued(job_id: str) -> Optional[bool]:
    """Whether SLURM still lists the job (pending, running, requeued); None when squeue cannot tell."""
    if not shutil.which("squeue"):
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%i"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        # "Invalid job id specified": the job has left the controller's memory.
        return False if "Invalid job id" in out.stderr else None
    return bool(out.stdout.strip())


def describe(rec: dict) -> str:
    who = f"pid {rec.get('pid')} on host {rec.get('host')}"
    if rec.get("job_id"):
        who += f", SLURM job {rec['job_id']}"
    started = rec.get("started")
    if started:
        who += f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}"
    return f"`launcher {rec.get('kind', '?')}` ({who})"


def _here() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "pid_start": _proc_start(os.getpid()),
            "job_id": os.environ.get("SLURM_JOB_ID"), "attempt": os.environ.get("SLURM_RESTART_COUNT", "0")}


def stale_reason(rec: dict, lock_path: Path) -> Optional[str]:
    """Why the lock `rec` no longer has a live owner (see the module docstring), or None while it has one."""
    me = _here()
    if rec.get("job_id") and rec["job_id"] == me["job_id"] and (rec.get("kind") == "submit" or rec.get("attempt") != me["attempt"]):
        return f"it is this job's own lock (SLURM job {rec['job_id']}, an earlier attempt or its submission)"
    if rec.get("kind") == "submit" and rec.get("job_id"):
        queued = _job_queued(rec["job_id"])
        return f"SLURM job {rec['job_id']} is no longer queued or running" if queued is False else None
    if rec.get("host") == me["host"]:
        pid = rec.get("pid")
        if not isinstance(pid, int) or not _pid_alive(pid):
            return f"process {pid} on this host is gone"
        if rec.get("pid_start") and _proc_start(pid) not in (None, rec["pid_start"]):
            return f"pid {pid} now belongs to another process"
        return None
    try:
        age = time.time() - lock_path.stat().st_mtime
    except FileNotFoundError:
        return "it was just released"
    return f"its heartbeat is {age:.0f} s old (> {STALE_AFTER_S:.0f} s)" if age > STALE_AFTER_S else None


class RunLock:
    """An acquired `owner.lock`; `release()` deletes it when it is still ours. See the module docstring."""

    def __init__(self, run_dir: Path, rec: dict):
        self.run_dir, self.rec, self.path = run_dir, rec, run_dir / LOCK_FILE
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        atexit.register(self.release)

    @property
    def token(self) -> str:
        return self.rec["token"]

    def update(self, **fields) -> None:
        """Rewrite the lock with more fields (the job id after sbatch)."""
        self.rec.update(fields)
        write_atomic(self.path, json.dumps(self.rec))

    def start_heartbeat(self) -> "RunLock":
        """Touch the lock every HEARTBEAT_S in a daemon thread, so another host can tell it is alive."""
        def beat():
            while not self._stop.wait(HEARTBEAT_S):
                try:
                    os.utime(self.path)
                except OSError:
                    pass

        self._thread = threading.Thread(target=beat, name="run-lock-heartbeat", daemon=True)
        self._thread.start()
        return self

    def keep(self) -> None:
        """Leave the lock in place when this process exits (a submitted job's: its rank 0 takes it over)."""
        self._stop.set()
        atexit.unregister(self.release)

    def release(self) -> None:
        self._stop.set()
        atexit.unregister(self.release)
        if read_lock(self.run_dir).get("token") == self.token:
            self.path.unlink(missing_ok=True)
            fsync_dir(self.run_dir)


def read_lock(run_dir: Path) -> dict:
    """The lock's record; {} when there is none. An unreadable lock reads as {"damaged": ...}."""
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        return {"damaged": str(exc)}
    try:
        rec = json.loads(text)
        return rec if isinstance(rec, dict) else {"damaged": "not a JSON object"}
    except ValueError:
        return {"damaged": "not JSON"}


def owned_by_us(run_dir: Path) -> bool:
    """This process holds the run dir's lock, or runs under the `launcher train` that holds it."""
    rec = read_lock(run_dir)
    token = os.environ.get(LOCK_TOKEN_ENV)
    return bool(rec) and (rec.get("token") == token and token is not None
                          or (rec.get("pid") == os.getpid() and rec.get("host") == socket.gethostname()))


def _refusal(run_dir: Path, old: dict, key: str) -> ConfigError:
    lock_path = run_dir / LOCK_FILE
    return ConfigError(key, run_dir.name, f"the run directory {run_dir} is in use by {describe(old)} "
                       f"(lock {lock_path}); two runs in one directory would delete each other's "
                       "checkpoints and interleave their metrics",
                       "wait for it to finish, stop it, or choose another run_name; if that owner is "
                       f"really gone (a crashed node), delete {lock_path}")


def refuse_if_owned(run_dir: Path, key: str = "run_name") -> None:
    """Read-only: refuse now (before queueing anything) when a live owner holds `run_dir`; acquire() decides for real."""
    old = read_lock(run_dir)
    if old and "damaged" not in old and stale_reason(old, Path(run_dir) / LOCK_FILE) is None:
        raise _refusal(Path(run_dir), old, key)


def acquire(run_dir: Path, kind: str, key: str = "run_name") -> RunLock:
    """Own `run_dir` (created when missing) or refuse with exit 2 naming the live owner."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_path = run_dir / LOCK_FILE
    rec = {**_here(), "kind": kind, "token": uuid.uuid4().hex, "started": time.time()}
    tmp = run_dir / f"{LOCK_FILE}.new-{rec['token']}"
    write_atomic(tmp, json.dumps(rec))
    try:
        for _ in range(3):
            try:
                os.link(tmp, lock_path)
                fsync_dir(run_dir)
                return RunLock(run_dir, rec)
            except FileExistsError:
                pass
            old = read_lock(run_dir)
            if not old:
                continue  # released between our link and our read: try again
            if os.environ.get(LOCK_TOKEN_ENV) and old.get("token") == os.environ[LOCK_TOKEN_ENV]:
                raise RuntimeError("a rank of `launcher train` tried to take its parent's run lock")  # a bug, not bad input
            why = "the lock is damaged (" + old["damaged"] + ")" if "damaged" in old else stale_reason(old, lock_path)
            if why is None:
                raise _refusal(run_dir, old, key)
            if _take_over(run_dir, old, tmp, why):
                return RunLock(run_dir, rec)
        raise ConfigError(key, run_dir.name, f"another process is starting in {run_dir} at the same moment ({describe(read_lock(run_dir))})",
                          "start one run per run directory")
    finally:
        tmp.unlink(missing_ok=True)


def _take_over(run_dir: Path, old: dict, tmp: Path, why: str) -> bool:
    guard = run_dir / f"{LOCK_FILE}.takeover"
    try:
        fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
    except FileExistsError:
        try:
            if time.time() - guard.stat().st_mtime > STALE_AFTER_S:
                guard.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        time.sleep(0.2)
        return False
    try:
        if read_lock(run_dir) != old:
            return False  # somebody else took it over (or released it) meanwhile: look again
        os.replace(tmp, run_dir / LOCK_FILE)
        fsync_dir(run_dir)
        print(f"launcher: took over the run directory {run_dir} from {describe(old)}: {why}", flush=True)
        return True
    finally:
        guard.unlink(missing_ok=True)


def claim_new_dir(base: Path) -> Path:
    """Create a new run directory `base`, or base-2, base-3, ... when another start made it first (mkdir is exclusive)."""
    base.parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            candidate.mkdir()
            fsync_dir(base.parent)
            return candidate
        except FileExistsError:
            n += 1
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
            n += 1
