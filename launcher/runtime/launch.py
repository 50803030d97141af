"""Starting and watching the local ranks: torchrun in the foreground, every rank's registration and exit record.

Outside a distributed launch `launcher train` resolves and validates the config,
prepares the data (so bad data fails before any rank starts), creates the run directory
(launcher/runtime/rundir.py) and starts `cluster.gpus_per_node` local ranks with torchrun,
each running `launcher train --config <run_dir>/config.yaml`. Under srun + torchrun
(RANK/WORLD_SIZE set) the ranks run the loop directly. Inside a rank: launcher/runtime/distributed.py
(the process group) and launcher/runtime/preemption.py.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple, Optional

from launcher.runtime.durable import write_atomic
from launcher.runtime.runlock import LOCK_TOKEN_ENV

from launcher.protocol import CPU_MALLOC_ENV, EXIT_NONFINITE, PREEMPTED_FILE, TORCHRUN_SIGNALS, torchrun_grace_flags
# `launcher train` tells its ranks where to register (pid, rank) and record their exit status, so it can name a
# dead rank and kill a stopped one (see RankWatch).
RANKS_DIR_ENV = "LAUNCHER_RANKS_DIR"
RANKS_DIR = "ranks"
STACK_SUFFIX = ".stack"  # <run_dir>/ranks/rank-N.stack: a crashed rank's Python stacks (record_crash_stacks)
# After one rank has failed, the others get this long to exit on their own (their next collective fails at
# once when a peer's sockets closed) before the launcher kills them. torchrun's own stop after a failure
# sends SIGTERM and waits 30 s (LocalElasticAgent._shutdown's default) -- and a stopped process never acts
# on SIGTERM -- so without this the job could outlive a failure by 30 s or forever.
FAILURE_GRACE_S = 10.0
# torchrun exits within a second or two of its last worker (it reaps them, closes its rendezvous, exits); one still
# there this long after every rank has exited is hung, and is killed (issue 12: `launcher train` waited forever).
TORCHRUN_EXIT_GRACE_S = float(os.environ.get("LAUNCHER_TORCHRUN_EXIT_GRACE_S", 30))
# Signals `launcher train` passes on to torchrun (which passes them to the ranks: TORCHRUN_SIGNALS). SIGHUP (the
# terminal or SSH session closed) stops the run like SIGTERM: the ranks checkpoint and exit for a resume.
FORWARDED_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP")
# Below this much free space in the run dir, a rank without an exit record most likely failed to write it.
FULL_DISK_BYTES = 1 << 20


# ----------------------------------------------------------------------------- local ranks


def torchrun_command(config_path: Path, nproc: int, overrides=()) -> list[str]:
    """torchrun, standalone rendezvous (one node), forwarding SIGUSR1 too, one worker per local rank."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            f"--signals-to-handle={TORCHRUN_SIGNALS}", *torchrun_grace_flags(), "-m", "launcher", "train", "--config",
            str(config_path), *overrides]


def rank_env(nproc: int, cpu: bool) -> dict:
    """This process's environment plus what every local rank gets unless the user set it: one BLAS/OpenMP thread
    per CPU core share (torchrun would set 1 and warn) and, on CPU, glibc's malloc settings (CPU_MALLOC_ENV).
    `launcher calibrate` starts its ranks with the same."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    for key, value in (CPU_MALLOC_ENV.items() if cpu else ()):
        env.setdefault(key, value)
    return env


def start_local_ranks(config_path: Path, nproc: int, run_dir: Path, overrides=(), extra_env: Optional[dict] = None,
                      lock_token: Optional[str] = None, cpu: bool = False) -> int:
    """Run torchrun in the foreground, passing our own termination signals on; 0 also when preempted cleanly.

    While it runs, RankWatch follows every rank: a rank that dies (no exit record: a signal, the OOM killer)
    or fails is named on the console ("rank 1 (pid 4242) died with SIGKILL"), and whatever is left of the job
    is killed FAILURE_GRACE_S later at the latest, stopped (SIGSTOP) ranks at once. torchrun runs in its own
    session (so a Ctrl-C reaches it only through us, as a forwarded SIGINT) and dies with us (PR_SET_PDEATHSIG):
    `kill -9` of `launcher train` leaves no orphaned ranks.
    """
    env = rank_env(nproc, cpu)
    ranks_dir = run_dir / RANKS_DIR
    if ranks_dir.exists():
        for old in [*ranks_dir.glob("rank-*.json"), *ranks_dir.glob(f"rank-*{STACK_SUFFIX}")]:
            old.unlink()
    ranks_dir.mkdir(parents=True, exist_ok=True)
    env[RANKS_DIR_ENV] = str(ranks_dir)
    if lock_token:
        env[LOCK_TOKEN_ENV] = lock_token  # the ranks work under our run-dir lock
    env.update(extra_env or {})
    # A marker left by an earlier, preempted attempt must not make this attempt's failure read as a clean stop.
    (run_dir / PREEMPTED_FILE).unlink(missing_ok=True)
    proc = subprocess.Popen(torchrun_command(config_path, nproc, overrides), env=env, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=die_with_parent)
    watch = RankWatch(ranks_dir, nproc)
    relay = threading.Thread(target=watch.relay_stderr, args=(proc.stderr,), daemon=True)
    relay.start()

    def forward(signum, _frame):
        # A stop signal (SIGTERM, SIGUSR1, SIGHUP) goes straight to the ranks once all have registered: they save
        # and exit 0, and torchrun ends as after a normal run. Sent to torchrun, it raises SignalException and
        # prints a traceback under a clean preemption (bench/reliability/results.md). Ctrl-C, and any signal
        # before every rank is known, still go to torchrun, which passes them on.
        pids = [r["pid"] for r in watch.ranks.values()]
        if signum != signal.SIGINT and len(pids) == nproc:
            try:
                for pid in pids:
                    os.kill(pid, signum)
                return
            except ProcessLookupError:
                pass  # a rank is already gone: torchrun handles the rest
        proc.send_signal(signum)

    previous = {s: signal.signal(getattr(signal, s), forward) for s in FORWARDED_SIGNALS}
    torchrun_hung = False
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            watch.check()
            if watch.killed_all_at and time.monotonic() - watch.killed_all_at > 5:
                os.killpg(proc.pid, signal.SIGKILL)  # torchrun itself did not exit after its ranks were gone
            gone_for = watch.all_exited_for()
            if gone_for is not None and gone_for > TORCHRUN_EXIT_GRACE_S and not torchrun_hung:
                torchrun_hung = True
                _say_stderr(f"launcher: torchrun (pid {proc.pid}) did not exit within {TORCHRUN_EXIT_GRACE_S:.0f} s of its "
                            "last rank: killed with SIGKILL")
                os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.returncode
    finally:
        for s, handler in previous.items():
            signal.signal(getattr(signal, s), handler)
    relay.join(timeout=5)
    watch.check()
    for stack in ranks_dir.glob(f"rank-*{STACK_SUFFIX}"):  # keep only the stacks of ranks that crashed
        if stack.stat().st_size == 0:
            stack.unlink()
    if torchrun_hung and watch.ranks and all(r.get("exit_code") == 0 for r in watch.ranks.values()):
        rc = 0  # every rank finished and recorded status 0: the run's result, whatever torchrun was stuck on
    # torchrun reports a forwarded signal as a failure even when every worker saved and exited 0 (the marker
    # is this attempt's: the one an earlier attempt left was removed above).
    if rc != 0 and (run_dir / PREEMPTED_FILE).exists():
        return 0
    if rc != 0 and not watch.deaths and watch.ranks and all(
            r.get("exit_code") == EXIT_NONFINITE for r in watch.ranks.values()):
        _say_stderr(f"launcher: training stopped on a non-finite loss or gradients (exit status {EXIT_NONFINITE}); "
                    "the rank 0 log above says which step and what was saved")
        return EXIT_NONFINITE
    if rc != 0:
        _say_stderr(f"launcher: training failed (torchrun exit status {rc}): {watch.summary()}")
    return rc


def _say_stderr(text: str) -> None:
    sys.stderr.write(text.rstrip() + "\n")
    sys.stderr.flush()


def die_with_parent() -> None:
    """In a child (Popen preexec_fn / a rank at start): get SIGKILL when the parent dies. Linux only; else no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _signal_name(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


def read_rank_records(ranks_dir: Path) -> dict[int, dict]:
    """rank -> its record in <run_dir>/ranks/rank-N.json ({rank, local_rank, pid, host}, then its exit status)."""
    records = {}
    for f in Path(ranks_dir).glob("rank-*.json"):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue  # being written
        records[rec["rank"]] = rec
    return records


def proc_state(pid: int) -> Optional[str]:
    """The one-letter state of a process (R, S, D, T stopped, Z zombie), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    return stat[stat.rindex(")") + 2]


class Death(NamedTuple):
    """A rank that died with no exit record (a signal), as RankWatch names it: "rank R (pid P, host)", and the
    Python stacks faulthandler left in `stack_path` if the signal was a fatal one ("" otherwise)."""

    where: str
    stack_path: Path
    stack: str

    @classmethod
    def of(cls, where: str, stack_path: Path) -> "Death":
        try:
            stack = stack_path.read_text(errors="replace").strip()
        except OSError:
            stack = ""
        return cls(where, stack_path, stack)


class RankWatch:
    """What `launcher train` knows about its ranks: their registrations, exit records and torchrun's failure lines.

    Every rank writes <run_dir>/ranks/rank-N.json ({rank, pid, host}) when it starts and adds its exit status
    when it leaves `launcher train --config` (also on an exception). A rank whose process is gone without
    an exit record was killed by a signal; torchrun, its parent, reaped it and logs the status
    ("failed (exitcode: -9) local_rank: 1 (pid: 4242)"), which relay_stderr picks out of the stream it
    passes through to our stderr.
    """

    # torch/distributed/elastic/multiprocessing/api.py (torch 2.13): logged when torchrun sees a worker fail.
    TORCHRUN_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
    # ... and in its final summary, one block per failed rank: "exitcode  : -9 (pid: 4242)".
    TORCHRUN_SUMMARY = re.compile(r"exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")

    def __init__(self, ranks_dir: Path, nproc: int):
        self.ranks_dir = ranks_dir
        self.nproc = nproc
        self.ranks: dict[int, dict] = {}
        self.exitcodes: dict[int, int] = {}   # pid -> exit code torchrun reported
        self.reported: set[int] = set()
        self.waited: set[int] = set()
        self.deaths: dict[int, Death] = {}    # pid -> the rank that died by a signal, and the stacks it left
        self.failures: list[str] = []
        self.first_failure_at: Optional[float] = None
        self.killed_all_at: Optional[float] = None
        self._all_exited_at: Optional[float] = None

    def relay_stderr(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            try:
                sys.stderr.buffer.write(raw)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            line = raw.decode(errors="replace")
            m = self.TORCHRUN_FAILED.search(line)
            if m:
                self.exitcodes[int(m.group(3))] = int(m.group(1))
            m = self.TORCHRUN_SUMMARY.search(line)
            if m:
                self.exitcodes.setdefault(int(m.group(2)), int(m.group(1)))

    def _load(self) -> None:
        self.ranks.update(read_rank_records(self.ranks_dir))

    def _fail(self, text: str) -> None:
        self.failures.append(text)
        _say_stderr(f"launcher: {text}")
        if self.first_failure_at is None:
            self.first_failure_at = time.monotonic()

    def check(self) -> None:
        """Name ranks that died or failed; kill stopped ranks after a failure, and all of them after the grace."""
        self._load()
        alive, deaths, failures, stacks = [], [], [], []
        for rank, rec in sorted(self.ranks.items()):
            pid = rec["pid"]
            state = proc_state(pid)
            if state is not None and state != "Z":
                alive.append((rank, pid, state))
                continue
            if pid in self.reported:
                continue
            where = f"rank {rank} (pid {pid}, {rec.get('host', '?')})"
            code = rec.get("exit_code")
            if code is None:
                # No exit record: killed by a signal. torchrun (its parent) logs the status right after reaping
                # it; give that line one more poll so the message can name the signal.
                code = self.exitcodes.get(pid)
                if code is None and pid not in self.waited:
                    self.waited.add(pid)
                    return
                # faulthandler wrote the stacks before the rank died: read them once, now
                death = self.deaths[pid] = Death.of(where, self.ranks_dir / f"rank-{rank:05d}{STACK_SUFFIX}")
                deaths.append(self._death(pid))
                if death.stack:
                    stacks.append(f"launcher: rank {rank}'s Python stacks when it died ({death.stack_path}):\n"
                                  f"{death.stack}")
            elif code == EXIT_NONFINITE:
                failures.append(f"{where} stopped on a non-finite loss or gradients (exit status {code}, see train.nan_policy)")
            elif code != 0:
                failures.append(f"{where} failed with exit status {code}" + (f": {_short(rec['error'])}" if rec.get("error") else ""))
            self.reported.add(pid)
        for text in deaths + failures:  # a death is the likelier cause of the other ranks' failures
            self._fail(text)
        for text in stacks:
            _say_stderr(text)
        if self.first_failure_at is None or not alive:
            return
        overdue = time.monotonic() - self.first_failure_at > FAILURE_GRACE_S
        for rank, pid, state in alive:
            if state == "T" or overdue:
                why = ("is stopped (SIGSTOP/SIGTSTP) and cannot act on SIGTERM" if state == "T"
                       else f"did not exit within {FAILURE_GRACE_S:.0f} s of the failure")
                self._fail(f"rank {rank} (pid {pid}) {why}: killed with SIGKILL")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.reported.add(pid)
        if overdue and self.killed_all_at is None:
            self.killed_all_at = time.monotonic()

    def all_exited_for(self) -> Optional[float]:
        """Seconds since every rank (all nproc registered) had exited, or None while one runs (or none registered)."""
        if len(self.ranks) < self.nproc or any(proc_state(r["pid"]) not in (None, "Z") for r in self.ranks.values()):
            self._all_exited_at = None
            return None
        if self._all_exited_at is None:
            self._all_exited_at = time.monotonic()
        return time.monotonic() - self._all_exited_at

    def _death(self, pid: int) -> str:
        code, death = self.exitcodes.get(pid), self.deaths[pid]
        frame = innermost_frame(death.stack)
        where = f" in {frame} (every thread's stack: {death.stack_path})" if frame else ""
        if code is not None and code < 0:
            return f"{death.where} died with {_signal_name(code)}{where}"
        if frame:  # faulthandler wrote its stacks: a fatal signal, whose name torchrun has not logged yet
            return f"{death.where} died (no exit record: killed by a signal){where}"
        free = shutil.disk_usage(self.ranks_dir).free if self.ranks_dir.exists() else None
        if free is not None and free < FULL_DISK_BYTES:
            # A rank whose error could not be written (ENOSPC) looks like a signal's death: say which it likely was.
            return (f"{death.where} died with no exit record, and the run directory's filesystem is full "
                    f"({free:,} bytes free): its error is in its output above")
        return f"{death.where} died (no exit record: killed by a signal)"

    def summary(self) -> str:
        """Every failure in the order seen; deaths re-rendered with the signal torchrun's summary named."""
        if not self.failures:
            late = [f"rank {r['rank']} (pid {r['pid']}) finished (exit record 0) but then died with {_signal_name(self.exitcodes[r['pid']])}"
                    for r in self.ranks.values() if self.exitcodes.get(r["pid"], 0) < 0]
            return "; ".join(late) if late else "no rank reported a failure (see torchrun's summary above)"
        return "; ".join([self._death(pid) for pid in self.deaths] + [f for f in self.failures if " died " not in f])


def innermost_frame(stack: str) -> Optional[str]:
    """The crashing thread's innermost Python frame in a faulthandler dump, as 'path:line in function' with the path
    from its package down ('torch/distributed/...'), or None. The dump (CPython 3.11) lists each thread innermost
    first, the crashing one under "Current thread 0x... (most recent call first):", each frame as
    '  File "PATH", line N in FUNC'."""
    lines = stack.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread ")), None)
    for line in lines[start + 1:] if start is not None else ():
        m = re.match(r'\s+File "(.+)", line (\d+) in (.+)', line)
        if m:
            path, parts = m.group(1), Path(m.group(1)).parts
            if "site-packages/" in path:
                path = path.split("site-packages/")[-1]
            elif re.search(r"/python3\.\d+/", path):  # the standard library
                path = re.split(r"/python3\.\d+/", path)[-1]
            elif "launcher" in parts:  # this package, wherever the checkout is
                path = str(Path(*parts[len(parts) - 1 - parts[::-1].index("launcher"):]))
            return f"{path}:{m.group(2)} in {m.group(3)}"
        if not line.strip():
            break
    return None


def _short(error: str) -> str:
    """A rank's error, without gloo's source path prefix and boilerplate."""
    error = re.sub(r"\[/[^\]]*\] ", "", error)
    return error.split(" This is typically")[0]


def register_rank() -> Optional[Path]:
    """In a rank started by `launcher train`: record (rank, pid, host) for RankWatch. Returns the record's path."""
    ranks_dir = os.environ.get(RANKS_DIR_ENV)
    if not ranks_dir or "RANK" not in os.environ:
        return None
    path = Path(ranks_dir) / f"rank-{int(os.environ['RANK']):05d}.json"
    write_atomic(path, json.dumps({"rank": int(os.environ["RANK"]), "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
                                    "pid": os.getpid(), "host": socket.gethostname()}))
    return path


_STACK_FILE = None  # the open file faulthandler writes into: it must stay open for the life of the process


def record_crash_stacks(record: Optional[Path]) -> None:
    """Have every thread's Python stack written when this rank dies by SIGSEGV, SIGFPE, SIGABRT, SIGBUS or SIGILL
    (faulthandler): a crash inside a C++ library (gloo, NCCL, a kernel) otherwise leaves no trace of where it was.
    Under `launcher train` (`record`: this rank's record) into rank-N.stack beside it, whose innermost frame
    RankWatch names in its failure line and whose whole text it prints; under srun (no record) to stderr, the
    job's log."""
    global _STACK_FILE
    if record is not None:
        try:
            _STACK_FILE = open(record.with_suffix(STACK_SUFFIX), "w")
        except OSError:  # e.g. a full disk: the stacks still reach stderr
            _STACK_FILE = None
    faulthandler.enable(file=_STACK_FILE or sys.stderr, all_threads=True)


def record_rank_exit(path: Optional[Path], exit_code: int, error: Optional[str] = None) -> None:
    """Add the exit status to this rank's record (every exit but a signal's writes one)."""
    if path is None:
        return
    try:
        rec = json.loads(path.read_text())
        rec.update(exit_code=exit_code, error=error)
        write_atomic(path, json.dumps(rec))
    except OSError as exc:  # e.g. a full disk: say so, since RankWatch would otherwise read "killed by a signal"
        _say_stderr(f"launcher: could not record this rank's exit status {exit_code} in {path}: {exc}")
