"""What the baseline loops of bench/train_overhead.py share."""

import os
import sys


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
