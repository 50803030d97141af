"""Resume reads per rank (issue 11, part 2): on 4 CPU ranks as pipeline 2 x tensor parallel 2, a rank restoring a
checkpoint through launcher.runtime.checkpoint.load_checkpoint reads whole only its own files (its stage's layer
files for its TP rank and its own mp_rank_* file), and what the load adds to its peak RSS stays below those bytes.

Before the fix every rank also read the first file of each list whole -- mp_rank_00 (stage 0, TP rank 0's optimizer
state) and layer_*-model_00 -- only for DeepSpeed's mp_world_size check (state_dict_factory.check_ckpt_list), twice
the bytes it needs. Measured on the 0.4B shape (bench/build/results.md, "Resume"): each rank read 1.46 GiB whole,
its own 0.73 GiB after the fix. ZeRO-3 already read only its own zero_pp_rank_* files (the same table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "parallel" / "resume_memory_driver.py"


def _run(phase, out, ckpt, env):
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.run([torchrun, "--nproc_per_node", "4", "--standalone", str(DRIVER), str(out), "pp2-tp2",
                           phase, str(ckpt)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())["ranks"]


@pytest.mark.slow
def test_resume_reads_only_this_ranks_files(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "OMP_NUM_THREADS": "1",
           "MODEL_HIDDEN": "512", "MODEL_LAYERS": "4"}
    saved = _run("save", tmp_path / "save.json", tmp_path / "ckpt", env)
    ranks = _run("resume", tmp_path / "resume.json", tmp_path / "ckpt", env)
    files = sorted(p.name for p in (tmp_path / "ckpt" / "t").glob("*.pt"))
    # Each file read whole by exactly one rank (DP = 1 here: no replica shares a file), every file by some rank.
    readers = {}
    for r in ranks:
        for name, size, mapped in r["files"]:
            if not mapped:
                readers.setdefault(name, set()).add(r["rank"])
    assert sorted(readers) == files
    assert all(len(who) == 1 for who in readers.values()), {k: v for k, v in readers.items() if len(v) > 1}
    total = sum((tmp_path / "ckpt" / "t" / f).stat().st_size for f in files)
    for r, s in zip(ranks, saved):
        own = sum(size for _, size, mapped in r["files"] if not mapped)
        assert own < 0.3 * total, (r["rank"], own, total)   # a quarter of the checkpoint, not the whole
        assert r["hwm_after_load"] - r["hwm_before_load"] <= own, r["rank"]
        assert r["params_held"] == s["params_held"]
        assert r["loss"] == pytest.approx(9.0, abs=1.0)
