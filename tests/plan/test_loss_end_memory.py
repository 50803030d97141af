"""Issue 14, part 1: the planner's loss end (what the head and loss save, and their transient peak) equals what
torch's memory timeline reads while the runtime's own loss functions run (tests/plan/loss_end_worker.py: 2 gloo
ranks, every path the runtime computes its loss by, fp32 and bf16, the logits dropped after the loss or held as
DeepSpeed's PipelineEngine holds them; model.chunked_loss's head and loss together). Nothing expected here comes
from the planner: its formulas (launcher/plan/activations.py loss_bytes_per_token, loss_end_transient_bytes) are
held to within 2%.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.plan import activations as act

REPO = Path(__file__).resolve().parents[2]
SHIFTED = {"transformers": False, "layers": True, "layers-vocab-parallel": True, "context": False,
           "context-vocab-parallel": False, "plain-vocab-parallel": True, "layers-unreleased": True,
           "layers-vocab-parallel-unreleased": True}
DTYPE_BYTES = {"fp32": 4, "bf16": 2}


@pytest.fixture(scope="module")
def readings(tmp_path_factory):
    out = tmp_path_factory.mktemp("loss_end") / "loss_end.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                           str(REPO / "tests" / "plan" / "loss_end_worker.py"), str(out)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


def planned(d: dict, c: dict) -> float:
    m = act.ActivationShape(arch="llama", hidden_size=d["hidden"], num_heads=1, num_kv_heads=1, intermediate_size=1,
                            vocab_size=d["vocab"])
    shifted = SHIFTED[c["path"]]
    predicted = (d["seq"] - 1) * d["batch"] if shifted else d["seq"] * d["batch"]
    return (predicted * act.loss_bytes_per_token(m, c["tp"])
            + act.loss_end_transient_bytes(m, d["seq"], d["batch"], c["dtype"], 1, c["tp"], shifted))


def logits_bytes(d: dict, c: dict) -> float:
    return d["batch"] * d["seq"] * d["vocab"] / c["tp"] * DTYPE_BYTES[c["dtype"]]


def test_loss_end_peak_matches_the_memory_timeline(readings):
    """Every runtime path at the planner's figure, DeepSpeed's reference to the logits included (ReleasingLoss)."""
    assert len(readings["cases"]) == 2 * len(SHIFTED) * len(DTYPE_BYTES)     # 2 ranks x paths x dtypes
    off = []
    for c in readings["cases"]:
        if c["path"].endswith("unreleased"):
            continue
        ratio = planned(readings, c) / c["peak_bytes"]
        if not 0.98 <= ratio <= 1.02:
            off.append((c["path"], c["dtype"], c["rank"], round(ratio, 4)))
    assert not off, off


def test_the_pipeline_engines_reference_costs_the_logits_without_the_release(readings):
    """Without ReleasingLoss the engine's reference keeps the logits alive: without TP through the backward's peak
    (w V a token more), under TP not (its peak is the loss's forward, where the logits are alive anyway). So the
    measurement sees a held tensor, and the release is what keeps the planner's figure."""
    d = readings
    for c in d["cases"]:
        if not c["path"].endswith("unreleased"):
            continue
        extra = logits_bytes(d, c) if c["tp"] == 1 else 0.0
        ratio = (planned(d, c) + extra) / c["peak_bytes"]
        assert 0.98 <= ratio <= 1.02, (c, ratio)


def test_the_peak_moves_with_what_the_formula_says(readings):
    """The readings themselves, in units of V/t bytes a token, so a planner that matched by accident would not: without
    TP the backward's two fp32 gradients (8) beside the saved log-softmax (4); under TP the loss's forward (logits w,
    their fp32 copy 4, x - max 4, exp's temporary 4)."""
    d = readings
    got = {(c["path"], c["dtype"]): round(c["peak_bytes"] / (logits_bytes(d, c) / DTYPE_BYTES[c["dtype"]]))
           for c in d["cases"] if c["rank"] == 0}
    assert got[("transformers", "bf16")] == got[("layers", "bf16")] == got[("layers", "fp32")] == 12
    assert got[("layers-unreleased", "bf16")] == 14 and got[("layers-unreleased", "fp32")] == 16
    assert got[("layers-vocab-parallel", "bf16")] == got[("plain-vocab-parallel", "bf16")] == 14
    assert got[("layers-vocab-parallel", "fp32")] == 16
    assert got[("context-vocab-parallel", "fp32")] == 12      # no shift in fp32: the logits are the loss's input


def test_the_chunked_loss_end_matches_the_memory_timeline(readings):
    """model.chunked_loss: what it saves (12 bytes a row) and its peak above that (one chunk's), at a shape where the
    forward's chunk is the peak and one where the backward's input gradient is, in fp32 and bf16."""
    d = readings
    assert len(d["chunked"]) == 4
    regimes = set()
    for c in d["chunked"]:
        b, s, h, v, w = c["batch"], c["seq"], c["hidden"], d["vocab"], DTYPE_BYTES[c["dtype"]]
        m = act.ActivationShape(arch="llama", hidden_size=h, num_heads=1, num_kv_heads=1, intermediate_size=1,
                                vocab_size=v)
        planned = (b * s * act.loss_bytes_per_token(m, 1, chunked=True)
                   + act.loss_end_transient_bytes(m, s, b, c["dtype"], chunked=True))
        assert 0.98 <= planned / c["peak_bytes"] <= 1.02, (c, planned)
        # which moment is the peak, by the arithmetic of the chunk (not the planner's): ceil(V / h) chunks
        chunk_v = -(-b * s // -(-v // h)) * v
        regimes.add(8 * chunk_v > w * b * s * h + (4 if w == 4 else 6) * chunk_v)
        # against what the whole loss would hold at the same shape: 4V + 8 saved a token, 8V more at its peak
        assert c["peak_bytes"] < 0.2 * b * s * (12 * v + 8), c
    assert regimes == {True, False}
