"""launcher/plan/activations.py's ring-attention CP figures against the saved-tensor measurement on CP2 and CP4
CPU ranks (tests/plan/context_activation_worker.py), within 2% per block and per stage, as test_activations.py
holds the other layouts; and the measured bytes per rank beside one rank's (printed: the ratio the docs quote).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from launcher.plan import activations as act
from tests.plan.activation_worker import MICRO, SEQ

pytestmark = pytest.mark.slow
LLAMA = act.ActivationShape("llama", 128, 4, 2, 352, 256)   # the worker's ARCH_OVERRIDES["llama"]
CASES = [(dtype, ckpt) for dtype in ("bf16", "fp32") for ckpt in (False, True)]


@pytest.fixture(scope="module", params=[2, 4], ids=["cp2", "cp4"])
def measured(request, tmp_path_factory):
    from tests.conftest import REPO, venv_bin

    cp = request.param
    tmp = tmp_path_factory.mktemp(f"cp{cp}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([venv_bin("torchrun"), "--standalone", "--nproc_per_node", str(cp),
                           str(REPO / "tests/plan/context_activation_worker.py"), str(tmp)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return cp, [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(cp)]


@pytest.mark.parametrize("dtype, ckpt", CASES, ids=[f"{d}-{'ckpt' if c else 'none'}" for d, c in CASES])
def test_ring_saved_bytes_match_planner(measured, dtype, ckpt):
    cp, ranks = measured
    name = f"{dtype}-{'ckpt' if ckpt else 'none'}"
    one, three = (ranks[0][f"cp-{name}-L{n}"] for n in (1, 3))
    # Head-tail chunks: every rank holds the same token count, so the same bytes.
    assert all(r[f"cp-{name}-L1"] == one and r[f"cp-{name}-L3"] == three for r in ranks)
    recompute = "full" if ckpt else "none"
    tokens = SEQ * MICRO / cp
    if ckpt:
        planned_block = tokens * act.checkpointed_block_bytes_per_token(LLAMA, dtype)
    else:
        planned_block = tokens * act.block_bytes_per_token(LLAMA, SEQ, dtype)
    planned_total = act.stage_saved_bytes(LLAMA, 3, SEQ, MICRO, dtype, recompute, context=cp)
    measured_block = (three - one) / 2
    single = ranks[0][f"one-{name}-L3"]
    print(f"CP{cp} {dtype} {recompute}: block planned/measured {planned_block / measured_block:.4f}, stage "
          f"{planned_total / three:.4f}; per rank {three:,} B = {three / single:.1%} of one rank ({single:,} B)")
    assert planned_block == pytest.approx(measured_block, rel=0.02)
    assert planned_total == pytest.approx(three, rel=0.02)
    # The one-rank figure is the planner's too (test_activations.py holds it; here at the worker's shape).
    assert act.stage_saved_bytes(LLAMA, 3, SEQ, MICRO, dtype, recompute) == pytest.approx(single, rel=0.02)
