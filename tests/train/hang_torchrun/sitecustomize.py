"""Test hook (tests/train/test_rundir.py): on this PYTHONPATH, torchrun (`python -m torch.distributed.run`) never
exits after its workers did -- it sleeps at interpreter exit, as a torchrun stuck in its rendezvous shutdown would.
Every other process (the launcher, the ranks) is untouched."""

import atexit
import os
import sys
import time


def _hang():
    if sys.argv and sys.argv[0].endswith(os.path.join("torch", "distributed", "run.py")):
        time.sleep(3600)


atexit.register(_hang)
