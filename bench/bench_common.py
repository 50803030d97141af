"""What the benchmark scripts share: the baseline loops' exit (bench/train_overhead.py), and the reliability
scripts' work-dir flags, machine line and result JSON (bench/reliability/*.py)."""

import json
import os
import sys
from pathlib import Path
from typing import Optional


def exit_without_teardown() -> None:
    """End a finished baseline rank the way `launcher train` ends its ranks (launcher/cli.py run_rank).

    The baselines' ranks, too, were seen to abort in C++ static destructors at interpreter exit after their
    results were written (2 of ~40 launches on 2026-11-23, torchrun exit 1), failing a benchmark run.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def add_work_dir_args(ap) -> None:
    """--runs, --cache and --out, as every bench/reliability script takes them."""
    ap.add_argument("--runs", default=None, help="work dir (default: a temp dir)")
    ap.add_argument("--cache", default=None, help="data cache dir (default: <runs>/cache)")
    ap.add_argument("--out", default=None, help="write the result JSON here")


def work_dirs(args, prefix: str) -> tuple[Path, Path]:
    """(the work dir, made; the data cache dir) from --runs / --cache."""
    import tempfile

    runs = Path(args.runs or tempfile.mkdtemp(prefix=prefix))
    runs.mkdir(parents=True, exist_ok=True)
    return runs, Path(args.cache) if args.cache else runs / "cache"


def machine() -> str:
    """The line a result names its machine with: host, cores, accelerator, OS, torch."""
    import platform

    import torch

    gpu = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "no GPU"
    return f"{platform.node()}: {os.cpu_count()} cores, {gpu}, {platform.platform()}, torch {torch.__version__}"


def emit(result: dict, out: Optional[str], echo: bool = True) -> None:
    """The result as indented JSON: on stdout (unless echo=False) and, with --out, into that file."""
    text = json.dumps(result, indent=2)
    if echo:
        print(text)
    if out:
        Path(out).write_text(text + "\n")
