"""Writes that survive a crash: every file the launcher writes goes through here (no torch).

`write_atomic(path, data)`: write `<name>.tmp<pid>` in the same directory, fsync it, rename it over `path`,
fsync the directory. A reader (or a resume after a kill or a node crash) sees the old file or the new one,
never a mix and never an empty file. rename(2) alone is not enough after a node crash: ext4 and XFS may
persist the rename before the data (an empty or zero-filled `latest` is what a crash left in issue 12),
hence the fsync of the file first, and of the directory so the rename itself is on disk
(fsync(2): "Calling fsync() does not necessarily ensure that the entry in the directory containing the
file has also reached disk. For that an explicit fsync() on a file descriptor for the directory is also
needed."). On a write error (a full disk) the temporary file is removed and `path` is left as it was.

Appends (metrics.jsonl) cannot be atomic; their readers tolerate a torn last line instead
(launcher/runtime/metrics.py).

Fault injection: `fault_point(name)` kills this process with SIGKILL when LAUNCHER_FAULT=name, so tests can
cut a write where a real crash would (tests/train/test_rundir.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Union

FAULT_ENV = "LAUNCHER_FAULT"


def fault_point(name: str) -> None:
    """Die here, as a SIGKILL or a node crash would, when the test hook LAUNCHER_FAULT names this point."""
    if os.environ.get(FAULT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def fsync_dir(path: Path) -> None:
    """Persist a directory's entries (a rename or create in it). Some filesystems refuse: then nothing more can be done."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Persist a file somebody else wrote (torch.save does not fsync). A read-only descriptor is enough on Linux."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Union[str, Path], data: Union[str, bytes], fault: str = "") -> None:
    """Replace `path` with `data` atomically and durably (see the module docstring)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    raw = data.encode() if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        if fault:
            fault_point(fault)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
