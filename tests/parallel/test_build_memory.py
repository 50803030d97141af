"""Proof on CPU ranks that a rank builds only what it holds (issue 11, part 5).

A 0.8B-parameter LLaMA (hidden 2048, 16 layers, 16 heads, MLP 5504, vocab 8192, untied) is 843,122,688
parameters: 3.37 GB (3.14 GiB) in fp32 (tests/parallel/build_memory_driver.py). On 4 CPU ranks, as pipeline 2 x
tensor parallel 2 and as ZeRO-3 over 4 data-parallel ranks, every rank's peak resident memory (VmHWM) while the
model is built must stay under 0.7 x that whole fp32 model, and one training step must run. Before per-rank
construction every rank built the whole fp32 model first (>= 1.0 x; 4 ranks x 3.4 GB was OOM-killed in a 14 GiB
cgroup). Measured on the 2-core machine (bench/build/results.md, 2026-11-25): ZeRO-3 x DP4 build HWM 1.19-1.22 GiB,
2.11 before the first step, 2.51-2.54 after it; PP2 x TP2 in the same file; both first losses 9.3258 on the same
batch, since both layouts start from the same weights.

ZeRO-3 up to the first step (after deepspeed.initialize): 2.11 GiB per rank = 0.672 x (bench/build/results.md), against
2.89 before launcher/runtime/zero3.py. DeepSpeed 0.19.8 kept a second fp32 copy of every partition as the optimizer's
master weights even in fp32 training (stage3.py 1162-1163 compares a torch.device with the string 'cpu'); the
launcher now has it reuse the partition, as that code means to. What is left, measured per rank (bench/build/
results.md, "ZeRO-3: what deepspeed.initialize allocates"), with P = one rank's fp32 partition = 843.1M / 4 x 4 B
= 0.785 GiB:
    0.253  python + torch + deepspeed + the gloo process group (VmHWM before the build; the driver imports
           `launcher` first, as a rank does, so DeepSpeed's autotuner does not pull in MLflow: 0.36 GiB otherwise)
    0.098  transformers' LLaMA modeling code (its import pulls torch._dynamo, sympy, DTensor)
    0.785  the parameter partition (P)
    0.042  deepspeed.initialize before the ZeRO-3 optimizer's partitions (DeepSpeed's engine; not split further)
    0.785  the flat gradient partition (P, stage3.py 791)
    0.125  transient: each parameter all-gathered once to hook it; the largest, the 8192 x 2048 embedding (64 MiB),
           is held twice (DeepSpeed's flat buffer + gloo's flat output, ProcessGroupGloo allgather)
    -----
    2.088  against 2.11 measured and the 0.7 x limit of 2.199.
No DeepSpeed config knob removes a term, read from stage3.py: sub_group_size, the bucket sizes,
max_live_parameters and prefetch act on the step's buffers, the gradient partition is always allocated whole, and
the hook pass (create_reduce_and_remove_grad_hooks) gathers every parameter whole, one at a time, whatever the
config. So the margin under 0.7 x is 0.09 GiB; this test also holds what deepspeed.initialize may add to what the
arithmetic says: P and the transient, not the 2P it added with the master copy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.runtime.launch import CPU_MALLOC_ENV

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
        # What `launcher train` gives CPU ranks (launcher/runtime/launch.py CPU_MALLOC_ENV): without it the first
        # step was OOM-killed by the 14 GiB cgroup.
        env |= CPU_MALLOC_ENV
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.run([torchrun, "--nproc_per_node", "4", "--standalone", str(DRIVER), str(out), mode],
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
    else:
        partition = WHOLE_FP32_BYTES / 4
        for r in ranks:
            assert r["hwm_before_step"] < 0.7 * WHOLE_FP32_BYTES, (r["rank"], r["hwm_before_step"] / 2**30)
            # The gradient partition and the hook pass's transient (docstring), not a second copy of the weights.
            assert r["hwm_before_step"] - r["hwm_built"] < partition + 0.3 * 2**30, (r["rank"], r["hwm_before_step"] / 2**30)


@pytest.mark.slow
def test_init_from_read_per_rank_equals_the_saved_model(tmp_path):
    """model.init_from through build_engine on 2 ranks, as PP2 and as ZeRO-3: every tensor a rank holds equals the saved one."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "OMP_NUM_THREADS": "1"}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    out = tmp_path / "init_from.json"
    proc = subprocess.run([torchrun, "--nproc_per_node", "2", "--standalone",
                           str(REPO / "tests" / "parallel" / "init_from_driver.py"), str(tmp_path / "ckpt"), str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert len(set((tmp_path / "ckpt").glob("model-*.safetensors"))) > 3   # really sharded
    per_rank = json.loads(out.read_text())
    assert len(per_rank) == 2
    for r in per_rank:
        assert r["pp2"]["equal"] and r["zero3"]["equal"], r
        assert r["pp2"]["checked"] > 5 and r["zero3"]["checked"] == 4 * 9 + 3   # LLaMA: 9 tensors a block + embed, norm, head
