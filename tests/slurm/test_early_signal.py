"""A rank that gets SIGUSR1 while it is still importing (SLURM may signal early) checkpoints instead of dying.

One rank (RANK=0, WORLD_SIZE=1) of `python -m launcher train --config`, signalled 0.2 s after it starts,
long before torch is imported: without launcher/__main__.py's early handler Python's default action ends it.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from slurm_helpers import MODEL, REPO

pytestmark = pytest.mark.slow


def test_signal_during_imports_stops_after_one_step_with_a_checkpoint(tmp_path, slurm_cache):
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime.rundir import freeze_config

    cfg = compose(["recipe=tiny", *MODEL, "data.seq_length=32", "data.max_bytes=300000", f"data.cache_dir={slurm_cache}",
                   "batch.global_batch_size=4", "batch.micro_batch_size=4", "train.steps=50", "train.eval_every=0",
                   "logging.progress_bar=false", "checkpoint.export_hf=false", "cluster.gpus_per_node=1",
                   f"runs_dir={tmp_path}", "run_name=early"])
    config = freeze_config(cfg, tmp_path / "early", build_deepspeed_config(cfg, resolve_layout(cfg)))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29660", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "train", "--config", str(config), "resume=auto"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "preempted (SIGUSR1) at step 1: checkpoint saved" in out
    assert json.loads((tmp_path / "early" / "preempted").read_text())["step"] == 1
    assert (tmp_path / "early" / "checkpoints" / "latest").read_text() == "step_00000001"
