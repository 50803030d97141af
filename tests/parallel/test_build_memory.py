"""Proof on CPU ranks that a rank builds only what it holds (issue 11, part 5).

A 0.8B-parameter LLaMA (hidden 2048, 16 layers, 16 heads, MLP 5504, vocab 8192, untied) is 843,122,688
parameters: 3.37 GB (3.14 GiB) in fp32 (tests/parallel/build_memory_driver.py). On 4 CPU ranks, as pipeline 2 x
tensor parallel 2 and as ZeRO-3 over 4 data-parallel ranks, every rank's peak resident memory (VmHWM) while the
model is built must stay under 0.7 x that whole fp32 model, and one training step must run. Before per-rank
construction every rank built the whole fp32 model first (>= 1.0 x; 4 ranks x 3.4 GB was OOM-killed in a 14 GiB
cgroup). Measured on the 2-core machine: PP2 x TP2 48 s (build HWM 1.23-1.33 GiB, 3.14-3.31 GiB after the step),
ZeRO-3 x DP4 118 s (build HWM 1.19-1.22 GiB; 2.89 GiB after deepspeed.initialize, 3.32 GiB after the step);
both first losses 9.3258 on the same batch, since both layouts start from the same weights.

ZeRO-3 up to the first step is not held to 0.7x: deepspeed.initialize itself adds about 1.7 GiB per rank here, all
of it DeepSpeed 0.19.8's (measured step by step: bench/build/results.md, "ZeRO-3: what deepspeed.initialize
allocates"). With P = one rank's fp32 partition (843.1M / 4 = 210.8M elements = 0.785 GiB): a second fp32 copy of
it as the optimizer's master weights (P), the flat gradient partition (P, stage3.py 791), and each parameter
all-gathered once to hook it (one whole tensor at a time, the 64 MiB embedding at most). The master copy is
redundant in fp32 -- stage3.py 1162-1163 means to reuse the partition when its dtype and device already match,
but compares `tensor.device == self.device` with self.device the string 'cpu' ('cuda:0' on GPUs), which torch
2.13 evaluates False -- so baseline 0.36 + P (built) + P + P = 2.71 GiB plus transients, 2.89 measured, against
the 0.7x limit of 2.20. Without that copy it would be 1.93 + transients. Nothing the launcher builds is in that
figure; the bf16 runs the recipes use need the master copy anyway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "parallel" / "build_memory_driver.py"
# 16 blocks x (4 x 2048^2 + 3 x 2048 x 5504 + 2 x 2048) + 2 x 8192 x 2048 + 2048: written out from the LLaMA
# architecture, not taken from the code under test.
WHOLE_PARAMS = 16 * (4 * 2048 * 2048 + 3 * 2048 * 5504 + 2 * 2048) + 2 * 8192 * 2048 + 2048
WHOLE_FP32_BYTES = 4 * WHOLE_PARAMS


def _launch(mode: str, tmp_path) -> dict:
    out = tmp_path / f"{mode}.json"
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": str(ext), "OMP_NUM_THREADS": "1"}
    if mode.startswith("zero3"):
        # After the build, DeepSpeed's Stage3ZeroOptimizer all-gathers every parameter once to hook it
        # (stage3.py create_reduce_and_remove_grad_hooks) and adds fp32 master + gradient partitions; the gathered
        # tensors are freed but glibc keeps them in per-thread arenas. Measured in a 14 GiB cgroup on 4 ranks: a
        # rank was OOM-killed there without these two settings, and with them every rank peaked at 3.32 GiB.
        env |= {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(4 << 20)}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.run([torchrun, "--nproc_per_node", "4", "--master_port", "29731", str(DRIVER), str(out), mode],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pp2-tp2", "zero3-dp4"])
def test_each_rank_builds_only_its_part_and_trains(mode, tmp_path):
    assert WHOLE_PARAMS == 843_122_688
    result = _launch(mode, tmp_path)
    ranks = result["ranks"]
    assert len(ranks) == 4
    for r in ranks:
        assert r["hwm_built"] < 0.7 * WHOLE_FP32_BYTES, (r["rank"], r["hwm_built"] / 2**30)
        assert r["params_held"] < 0.4 * WHOLE_PARAMS
        assert r["loss"] == pytest.approx(9.0, abs=1.0)   # ~ln(8192) = 9.01 at init: the step ran on real weights
    if mode == "pp2-tp2":
        # Up to the first step the engine adds no optimizer state here (SGD, ZeRO 0): the whole run stays under it too.
        assert all(r["hwm_before_step"] < 0.7 * WHOLE_FP32_BYTES for r in ranks)


@pytest.mark.slow
def test_init_from_read_per_rank_equals_the_saved_model(tmp_path):
    """model.init_from through build_engine on 2 ranks, as PP2 and as ZeRO-3: every tensor a rank holds equals the saved one."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "OMP_NUM_THREADS": "1"}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    out = tmp_path / "init_from.json"
    proc = subprocess.run([torchrun, "--nproc_per_node", "2", "--master_port", "29733",
                           str(REPO / "tests" / "parallel" / "init_from_driver.py"), str(tmp_path / "ckpt"), str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert len(set((tmp_path / "ckpt").glob("model-*.safetensors"))) > 3   # really sharded
    per_rank = json.loads(out.read_text())
    assert len(per_rank) == 2
    for r in per_rank:
        assert r["pp2"]["equal"] and r["zero3"]["equal"], r
        assert r["pp2"]["checked"] > 5 and r["zero3"]["checked"] == 4 * 9 + 3   # LLaMA: 9 tensors a block + embed, norm, head
