"""The plan's GPU-style memory held to what DeepSpeed really allocates, on CPU ranks.

bench/steptime/live_at_peak.py runs `launcher train recipe=tiny` on 2 CPU ranks with DeepSpeed's overlap_comm on (as
the launcher runs GPUs) and its default 5e8-element reduce bucket, profiles one step's allocations, and adds up every
tensor live at the step's peak, counting allocations whole as a GPU's max_memory_allocated does. The plan's peak
stage (params, gradients, optimizer state, activations, and DeepSpeed's buffers as the plan charges them on a GPU)
must read within 3% of the largest rank: there the buckets are 98% of the bytes, so a bucket missing from the plan
(one of ZeRO 1's two under overlap_comm, or ZeRO 3's, as before 2026-12-06: about x0.5 and x0.06) or one
counted twice is seen.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_plan_reads_deepspeeds_live_bytes_at_the_peak(tmp_path):
    out = tmp_path / "rows.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "steptime" / "live_at_peak.py"), "--overlap", "--json", str(out),
                    "DP2 ZeRO-1 bf16", "DP2 ZeRO-3 bf16"], cwd=ROOT, check=True, capture_output=True, text=True,
                   timeout=600)
    rows = {r["layout"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"DP2 ZeRO-1 bf16", "DP2 ZeRO-3 bf16"}
    # ZeRO 1 with overlap_comm holds two buckets of 5e8 bf16 elements (1,907 MiB), ZeRO 3 one for the engine's life
    assert rows["DP2 ZeRO-1 bf16"]["measured_bytes"] > 2 * 5e8 * 2
    assert 5e8 * 2 < rows["DP2 ZeRO-3 bf16"]["measured_bytes"] < 2 * 5e8 * 2
    for name, r in rows.items():
        assert 0.97 <= r["planned_over_measured"] <= 1.03, (name, r)


@pytest.mark.slow
def test_plan_reads_the_activations_of_each_parallel_layout(tmp_path):
    """A 200,000-element bucket (reductions inside the backward, as a stage past 5e8 parameters sees them) leaves the
    activations, states and collectives' buffers most of the bytes: Ulysses, Megatron TP + SP and a pipeline stage
    each within the spread bench/steptime/results.md reads over twelve layouts (0.947-1.073)."""
    out = tmp_path / "rows.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "steptime" / "live_at_peak.py"), "--overlap", "--bucket", "200000",
                    "--json", str(out), "SP2 ZeRO-1 bf16", "TP2-SP ZeRO-1 bf16", "PP2 ZeRO-1 bf16"],
                   cwd=ROOT, check=True, capture_output=True, text=True, timeout=900)
    rows = json.loads(out.read_text())
    assert [r["layout"] for r in rows] == ["SP2 ZeRO-1 bf16", "TP2-SP ZeRO-1 bf16", "PP2 ZeRO-1 bf16"]
    for r in rows:
        assert 0.94 <= r["planned_over_measured"] <= 1.08, r


@pytest.mark.slow
@pytest.mark.parametrize("layout,knobs,whole", [
    ("DP2 ZeRO-3 bf16", "persist=1000", 1_327_104),                   # every linear kept: the whole model
    ("DP2 ZeRO-3 bf16", "persist=1000,prefetch=0,reuse=1000000", 507_904),   # the reuse distance alone: head, block 4, a down
    ("DP2 ZeRO-3 bf16", "persist=1000,prefetch=20000,reuse=0", 1_327_104),   # the prefetch walks alone: the whole model
    ("DP2 ZeRO-3 bf16", "persist=1000,prefetch=20000,reuse=0,live=300000", 307_200),   # the walks under a live limit
    # the recomputed forward in the trace: every block, the first two, and selective (whose dispatch modes crashed
    # the run at these knobs before launcher/runtime/recompute.py kept ZeRO 3's fetches out of them)
    ("DP2 ZeRO-3 bf16 recompute", "persist=1000,reuse=200000,prefetch=100000,live=400000", 417_792),
    ("DP2 ZeRO-3 bf16 recompute 2 blocks", "persist=1000,reuse=0,prefetch=0", 262_144),
    ("DP2 ZeRO-3 bf16 selective", "persist=1000,reuse=200000,prefetch=100000,live=400000", 417_792),
])
def test_plan_reads_what_zero3_holds_gathered(tmp_path, layout, knobs, whole):
    """ZeRO 3's whole tensors at the peak and its all-gathers (launcher/plan/memory.py zero3_gathered) with
    DeepSpeed's fetching knobs set so that recipe=tiny's linears are fetched (persistence 1,000: above its norms,
    below its linears) and kept by each rule in turn; the plan is told the same knobs. The cases differ by up to
    1,019,904 bf16 elements (1.9 MiB of a 59-61 MiB rank): a replay without the reuse distance would plan the
    second 2.5% over, one without the walks the third 3.3% under; the plan before 2026-12-06 (two blocks, 401,408
    elements, whatever the knobs) read the first and the third 2.9% under. Every rank's all-gathers in the step,
    forward and backward apart (calls and elements), must be the replay's, which the step time prices; those after
    the optimizer step (the persistent tensors' refresh, in calibrate's ZeRO-3 hook terms) must be one a persistent
    tensor of the model, counted by the bench from its tensors. Under recompute the backward's all-gathers are the
    recompute's and the backward's together. steptime's separate count before (the backward's re-gathers plus a
    third gather of each linear followed in its block by >= the reuse distance) read 44 for the two-block case's
    42: torch's early stop leaves a block's last linear gathered from the recompute to its backward."""
    out = tmp_path / "rows.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "steptime" / "live_at_peak.py"), "--bucket", "200000",
                    "--zero3", knobs, "--json", str(out), layout],
                   cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    (row,) = json.loads(out.read_text())
    assert row["zero3_gathered_elements"] - 1_152 == whole     # 1,152: the norms, whole (persistent)
    # 1.5%: under the 2.5% / 3.3% a replay without the reuse distance / the walks reads, above what the runs vary by:
    # the two-block recompute case plans 1.0098 of its peak here and read 1.0104 in a CI run of 2026-12-07, whose
    # rank held one 32 KiB block less (the same planned bytes at the commit before that day's, 8ccb7ad).
    assert 0.99 <= row["planned_over_measured"] <= 1.015, row
    planned = [list(phase) for phase in row["zero3_gathers_planned"]]
    for rank in row["zero3_gathers_measured"][0]:   # forward, backward, and after the optimizer step
        assert [rank["forward"], rank["backward"], rank["step"]] == planned, (rank, planned)
