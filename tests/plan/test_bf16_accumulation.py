"""The step time's gradient accumulation term held to the bytes DeepSpeed 0.19.8 and a plain loop move, counted
operator by operator (issue 14 part 2: memory-bound operators at memory bandwidth).

tests/plan/bf16_accumulation_worker.py trains 4 bias-free Linear(256) layers in bf16 (N = 262,144 parameters in
T = 4 tensors) at 1 and 4 micro-batches a step, plainly and under DeepSpeed's BF16_Optimizer twice: ZeRO 1 with
grad_accum_dtype fp32 on the plain engine, and a one-stage PipelineModule at ZeRO 0 (bf16 accumulation, the
optimizer of bf16 ZeRO-0 pipelines). It counts the bytes every backward's non-GEMM operators read and write, and
the step's zeroing. The planner's side is launcher.plan.steptime:
- plain: autograd adds every backward's gradients but the first into the held ones, (m - 1) x 3 x 2 bytes a
  parameter a step (grad_accumulation);
- BF16_Optimizer: bf16_accumulation's m x 18 + 8 bytes (fp32 accumulation) or m x 6 + 4 (bf16) with
  immediate_grad_update, the launcher's setting; m x 18 + (m - 1) x 8 + 8 or m x 6 + (m - 1) x 8 + 4 with
  DeepSpeed's default, replacing that. The two settings leave the same weights, to the bit.
The engine's data-parallel all-reduce at the step's last backward is counted apart (the worker's "reduce") and
checked to be the per-step ~20 bytes a parameter the docstring of bf16_accumulation leaves to the engine term.
Measured: plain 18.0 bytes a parameter at m = 4 beyond 4 x m = 1; BF16_Optimizer beyond plain, DeepSpeed's default
26.0 (m = 1) and 86.0 (m = 4) with fp32 accumulation, 10.0 and 34.0 in the pipeline with bf16; with
immediate_grad_update 26.0 and 62.0, 10.0 and 10.0; each exactly the planned figure (scalar operators on the loss
add < 0.05 bytes a parameter).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.plan import steptime

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16acc") / "counted.json"
    ext = out.parent / "ext"
    ext.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MASTER_PORT": str(_free_port()),
           "TORCH_EXTENSIONS_DIR": str(ext)}
    proc = subprocess.run([sys.executable, str(REPO / "tests/plan/bf16_accumulation_worker.py"), str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(ext.iterdir()) == [], "CPU runs must JIT-compile nothing"
    d = json.loads(out.read_text())
    return d["params"], {kind: {int(m): r for m, r in runs.items()} for kind, runs in d.items() if kind != "params"}


def test_plain_accumulation_adds_every_gradient_after_the_first(counted):
    n, runs = counted
    plain = runs["plain"]
    # what 4 micro-batches move beyond 4 x one: the 3 adds (the loss's scalar operators cancel)
    assert (plain[4]["backward"] - 4 * plain[1]["backward"]) / n == pytest.approx(3 * 3 * 2, abs=0.01)
    assert plain[4]["backward_kernels"] - 4 * plain[1]["backward_kernels"] == 3 * 4       # one add a tensor
    assert plain[4]["by_op"]["add_"] == 3 * 3 * 2 * n


@pytest.mark.parametrize("immediate", [True, False], ids=["immediate_grad_update", "deepspeed_default"])
@pytest.mark.parametrize("kind,fp32", [("bf16_optimizer", True), ("bf16_optimizer_pipeline", False)])
def test_bf16_optimizer_accumulation_is_what_the_plan_charges(counted, kind, fp32, immediate):
    n, runs = counted
    plain, bf16 = runs["plain"], runs[kind + ("_immediate" if immediate else "")]
    for m in (1, 4):
        planned, kernels = steptime.bf16_accumulation(m, fp32, immediate)
        got = (bf16[m]["backward"] + bf16[m]["step_zeroing"] - plain[m]["backward"]) / n
        # BF16_Optimizer's work beyond the plain loop's, against the plan's beyond autograd's (m - 1) x 6
        assert got == pytest.approx(planned - (m - 1) * 6, abs=0.05), (m, bf16[m]["by_op"], plain[m]["by_op"])
        # the per-tensor kernels: the cast and the add every micro-batch, autograd's add after the first
        # (the engine adds at most 3 scalar operators a micro-batch on the loss)
        extra = bf16[m]["backward_kernels"] - plain[m]["backward_kernels"]
        assert 4 * (kernels - (m - 1)) <= extra <= 4 * (kernels - (m - 1)) + 3 * m, (m, extra)
        # the all-reduce the plain engine runs at the last backward of a step, left to the engine term: once a
        # step (the pipeline engine reduces in an instruction of its own, not counted)
        assert bf16[m]["reduce"] / n == pytest.approx(20 if fp32 else 0, abs=0.05)
    a = 4 if fp32 else 2
    assert bf16[4]["step_zeroing"] == bf16[1]["step_zeroing"] == 2 * a * n    # the accumulation gradients, twice



@pytest.mark.parametrize("kind", ["bf16_optimizer", "bf16_optimizer_pipeline"])
def test_immediate_grad_update_steps_on_the_same_gradients(counted, kind):
    """The launcher's immediate_grad_update changes when each bf16 gradient is added, not what is added: after two
    SGD steps of 1 and of 4 micro-batches the weights (bf16 and fp32 master) are the same to the bit as under
    DeepSpeed's default (a micro-batch's gradient missed or added twice would move the fp32 master weights)."""
    _, runs = counted
    for m in (1, 4):
        assert runs[kind + "_immediate"][m]["weights"] == runs[kind][m]["weights"], m

