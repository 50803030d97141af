"""Ring-attention context parallelism (launcher/parallel/context.py) on real CPU ranks against 1 rank: CP2, CP4 and
CP2 x DP2 under ZeRO 0-3, each launch one context degree (DeepSpeed keeps the first `mpu`'s groups per process);
CP2 x TP2 (our TP layers on the plain engine, launcher/parallel/tensor_model.py) under ZeRO 0-2, with Megatron SP,
with grouped-query attention and activation checkpointing, and CP2 x TP2 x DP2 on 8 ranks.

Every case trains 6 steps of the tiny LLaMA of tests/parallel/driver.py at seq 64 (hidden 64, 4 heads, 4 layers,
global batch 8) and is held to the 1-rank plain-torch run step by step on
- the loss (absolute, fp32: 1e-5), and
- the global gradient norm before clipping (relative 1e-5): DeepSpeed's reported norm (ZeRO >= 1), or under ZeRO-0
  the norm of the reduced gradients the step applies (DeepSpeed reports none there).
SGD without clipping: a wrong gradient scale (the 1/sp of ZeRO-3's reduce-scatter, issue 13) moves both. The AdamW +
clip cases are held to driver.py's looser trajectory tolerances (AdamW amplifies reduction-order rounding in
near-zero gradient elements: tests/parallel/test_parallel.py) and to 1e-5 on the first step's norm.
Measured on the 2-core machine: max loss diff <= 4.8e-7, grad-norm diff <= 2.4e-7 (SGD cases; CP x TP the same).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.plan.memory import model_state_bytes

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "parallel" / "context_driver.py"
LOSS_TOL = NORM_TOL = 1e-5
ADAMW_LOSS_TOL, ADAMW_FIRST_NORM_TOL, ADAMW_NORM_TOL = 1e-4, 1e-5, 2e-3   # relative, as tests/parallel/test_parallel.py

CP2, CP4, TP2, PP2 = ("parallel.context_degree=2", "parallel.context_degree=4", "parallel.tensor_degree=2",
                      "parallel.pipeline_degree=2")
Z = {z: f"parallel.zero_stage={z}" for z in range(4)}
SGD = "opt=sgd"
LAUNCHES = {
    "cp2": (2, [f"cp2-z{z}:{CP2},{Z[z]},{SGD}" for z in range(4)] + [
        f"cp2-z1-adamw:{CP2},{Z[1]}",
        f"cp2-z3-adamw:{CP2},{Z[3]}",
        # grouped-query attention (k/v heads repeated inside the ring, their gradients summed back) and activation
        # checkpointing (the ring runs again in the recompute).
        f"cp2-gqa-ac-z2:{CP2},{Z[2]},model.num_key_value_heads=2,model.activation_checkpointing=true,{SGD}",
        # model.chunked_loss: each rank's head and loss over its head-tail tokens a chunk at a time
        f"cp2-z1-chunked:{CP2},{Z[1]},model.chunked_loss=true,{SGD}",
        f"cp2-z3-chunked-adamw:{CP2},{Z[3]},model.chunked_loss=true",
    ]),
    "cp4": (4, [f"cp4-z{z}:{CP4},{Z[z]},{SGD}" for z in range(4)]),
    "cp2-dp2": (4, [f"cp2-dp2-z{z}:{CP2},{Z[z]},{SGD}" for z in range(4)] + [f"cp2-dp2-z3-adamw:{CP2},{Z[3]}"]),
    # The third command's layout: every TP rank rings its own heads over its CP group.
    "cp2-tp2": (4, [f"cp2-tp2-z{z}:{CP2},{TP2},{Z[z]},{SGD}" for z in range(3)] + [
        f"cp2-tp2-z2-adamw:{CP2},{TP2},{Z[2]}",
        # Megatron SP inside each CP rank's s / cp tokens (seq 64: 16 tokens per rank outside the TP regions).
        f"cp2-tp2-sp-z2:{CP2},{TP2},parallel.sequence_parallel=true,{Z[2]},{SGD}",
        # one k/v head per TP rank, repeated inside the ring; the ring recomputed in the checkpointed blocks.
        f"cp2-tp2-gqa-ac-z1:{CP2},{TP2},{Z[1]},model.num_key_value_heads=2,model.activation_checkpointing=true,{SGD}",
    ]),
    "cp2-tp2-dp2": (8, [f"cp2-tp2-dp2-z1:{CP2},{TP2},{Z[1]},{SGD}", f"cp2-tp2-dp2-z2-adamw:{CP2},{TP2},{Z[2]}"]),
    # CP inside a pipeline: DeepSpeed's pipeline engine, its grid's data axis holding the DP x CP ranks
    # (launcher/parallel/pipeline.py context_pipeline_loss); ZeRO 0-1, as every pipeline.
    "cp2-pp2": (4, [f"cp2-pp2-z{z}:{CP2},{PP2},{Z[z]},{SGD}" for z in range(2)] + [
        f"cp2-pp2-z1-adamw:{CP2},{PP2},{Z[1]}",
        f"cp2-pp2-gqa-ac-z1:{CP2},{PP2},{Z[1]},model.num_key_value_heads=2,model.activation_checkpointing=true,{SGD}",
    ]),
    "cp2-tp2-pp2": (8, [f"cp2-tp2-pp2-z1:{CP2},{TP2},{PP2},{Z[1]},{SGD}",
                        f"cp2-tp2-pp2-sp-z1-adamw:{CP2},{TP2},{PP2},parallel.sequence_parallel=true,{Z[1]}"]),
}


CRASH_MARKS = ("Fatal Python error", "terminate called", "what():", "corrupted", "double free", "free():",
               "Check failed", "Enforce")


def crash_lines(stderr: str) -> str:
    """What a rank that died of a signal left on stderr: its C++ abort message and the stacks of every thread
    (faulthandler, PYTHONFAULTHANDLER), which the tail of the launch's stderr loses once the other ranks log after
    it. (CP launches on CPU ranks have died, rarely, of SIGABRT / SIGSEGV inside torch's functional collectives'
    wait_tensor under the ring's exchanges; the last, in a CI run of 2026-12-07, `free(): invalid pointer` there, is
    what this printed: _exchange_synchronously_on_cpu in launcher/parallel/context.py.)"""
    lines = stderr.splitlines()
    marks = [i for i, line in enumerate(lines) if any(m in line for m in CRASH_MARKS)]
    return "\n".join(line for i in marks[:4] for line in lines[max(0, i - 2):i + 30])


def _launch(key: str, tmp_path) -> list[dict]:
    nproc, cases = LAUNCHES[key]
    out = tmp_path / f"{key}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
           "PYTHONFAULTHANDLER": "1"}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.run([torchrun, "--nproc_per_node", str(nproc), "--standalone", str(DRIVER), str(out), *cases],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (crash_lines(proc.stderr) + "\n--- the launch's tails ---\n" + proc.stdout[-3000:]
                                  + proc.stderr[-6000:])
    return json.loads(out.read_text())


@pytest.mark.parametrize("key", list(LAUNCHES))
def test_ring_attention_equals_one_rank(key, tmp_path):
    nproc, cases = LAUNCHES[key]
    got = _launch(key, tmp_path)
    assert [r["name"] for r in got] == [c.split(":")[0] for c in cases]
    for r in got:
        cp, tp, pp = (r["layout"][k] for k in ("context_degree", "tensor_degree", "pipeline_degree"))
        assert cp == (4 if key == "cp4" else 2) and tp == (2 if "tp2" in key else 1) and pp == (2 if "pp2" in key else 1)
        assert r["layout"]["data_degree"] == nproc // (cp * tp * pp)
        if tp > 1 or pp > 1:  # our layers: each rank holds its stage's TP shards, less than the whole model
            assert {i["engine"] for i in r["per_rank"]} == {"PipelineEngine" if pp > 1 else "DeepSpeedEngine"}
            assert max(i["params"] for i in r["per_rank"]) < r["reference_params"], (r["per_rank"], r["reference_params"])
        # Each rank embedded seq / cp tokens (its two head-tail chunks), and ran the ring attention.
        assert all(i["tokens_per_rank"] == [r["layout"]["seq_length"] // cp] for i in r["per_rank"]), r["per_rank"]
        assert {i["attn_implementation"] for i in r["per_rank"]} == {"launcher_ring"}
        assert {i.get("chunked_loss", False) for i in r["per_rank"]} == {"chunked" in r["name"]}
        if r["layout"]["zero_stage"] == 3:
            assert r["reduce_scatter"] is False   # DeepSpeed's 1/sp reduce-scatter path off (deepspeed_config.py)
        pairs = list(zip(r["losses"], r["reference"]))
        norms = list(zip(r["grad_norms"], r["reference_grad_norms"]))
        # DeepSpeed's pipeline engine reports no norm at ZeRO-0 fp32 and applies the update inside train_batch:
        # there the SGD losses alone see a scale error (dropping context_pipeline_loss's factor cp moved them by 2.8).
        assert len(pairs) == len(norms) == 6, r
        assert all(g is not None for g, _ in norms) or (pp > 1 and r["layout"]["zero_stage"] == 0), r
        norms = [(g, w) for g, w in norms if g is not None]
        norm_diff = max((abs(g - w) / w for g, w in norms), default=0.0)
        print(f"{r['name']}: max |loss - 1 rank| {max(abs(a - b) for a, b in pairs):.1e}, max grad-norm rel diff "
              f"{norm_diff:.1e} ({r['optimizer']}, {r['seconds']:.0f} s)")
        if r["optimizer"] == "sgd":
            assert max(abs(a - b) for a, b in pairs) <= LOSS_TOL, (r["name"], pairs)
            assert norm_diff <= NORM_TOL, (r["name"], norms)
        else:
            assert max(abs(a - b) / b for a, b in pairs) <= ADAMW_LOSS_TOL, (r["name"], pairs)
            # ZeRO cuts the optimizer state over the CP x DP ranks (DeepSpeed's sequence-data-parallel group), not
            # over the DP replicas alone: the planner's model_state_bytes at Layout.zero_partition_degree. (ZeRO 1-2:
            # under ZeRO-3 this driver's engine keeps DeepSpeed's own fp32 master copy, which train.py's
            # shared_fp32_master removes and the planner leaves out.)
            d = r["layout"]["zero_partition_degree"]
            assert d == r["layout"]["data_degree"] * cp
            for i in r["per_rank"] if r["layout"]["zero_stage"] in (1, 2) else []:
                want = model_state_bytes(i["params"], d, r["layout"]["zero_stage"], "fp32")["optimizer"]
                got = i["state_bytes"]["optimizer"]
                print(f"  rank optimizer state {got:,} B, planned {want:,.0f} B over {d} ranks")
                assert abs(got - want) / want <= 0.02, (r["name"], got, want)
            assert abs(norms[0][0] - norms[0][1]) / norms[0][1] <= ADAMW_FIRST_NORM_TOL, (r["name"], norms)
            assert max(abs(g - w) / w for g, w in norms) <= ADAMW_NORM_TOL, (r["name"], norms)
