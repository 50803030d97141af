"""PP, PP x DP, TP (our layers on the plain engine, ZeRO 0-2), TP x DP, TP x PP, TP x PP x DP, TP + Megatron SP (x PP, x DP), Ulysses SP x ZeRO 0-3 on real CPU ranks (gloo), each
against the 1-rank fp32 loss and gradient-norm trajectories of the unpipelined, unsharded model trained in plain
torch (tests/parallel/driver.py). Every case can see a gradient-scale error: ZeRO >= 1 and bf16 cases by
DeepSpeed's reported gradient norm, ZeRO-0 fp32 cases (no norm reported) by running SGD without clipping.

Three launches (2, 4, 8 ranks), several layouts each, to pay the start-up once per world size
(measured on the 2-core machine: ~27 s, ~45 s, ~56 s). model.arch=bloom runs TP2 x PP2 and PP2 x DP2 too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "parallel" / "driver.py"

# The driver's model: hidden h=64, 4 layers, MLP I=128, vocab V=256, untied. Parameter counts from the
# LLaMA architecture written out (not from the code under test):
H, L, I, V = 64, 4, 128, 256
BLOCK_LINEAR = 4 * H * H + 3 * H * I          # q, k, v, o + gate, up, down
BLOCK = BLOCK_LINEAR + 2 * H                  # + two RMSNorm weights
FULL = 2 * V * H + L * BLOCK + H              # embedding + head + blocks + final norm = 197,184
TOL = 1e-4                                    # relative, per step (issue 4)
# Gradient norms: the first step (identical weights) differs only by reduction order. Later AdamW steps
# amplify rounding in near-zero gradient elements (the update is ~lr x sign(g) there): up to 4.1e-4 at step 5
# (sp2-dp2-z3). A scale error is far outside either: 1 - 1/sp = 0.5 at sp = 2.
FIRST_NORM_TOL, NORM_TOL = 1e-5, 2e-3
# The same width as BLOOM (model.arch=bloom): fused qkv (3h x h) + dense (h x h) + 4h MLP, every linear with a
# bias, two LayerNorms (weight + bias) per block, the word-embedding LayerNorm and ln_f (BigScience 2022, Table 3;
# transformers modeling_bloom.py).
BLOOM_BLOCK_LINEAR = 12 * H * H + 9 * H
BLOOM_COLUMN_ROW_SHARDED = 12 * H * H + 7 * H  # all but the two row-parallel biases (added once after the sum)
BLOOM_BLOCK = BLOOM_BLOCK_LINEAR + 4 * H
BLOOM_FULL_TIED = V * H + 2 * H + L * BLOOM_BLOCK + 2 * H
BLOOM = "model.arch=bloom,model.num_key_value_heads=null,model.intermediate_size=null"

PP = "parallel.pipeline_degree=2"
TP = "parallel.tensor_degree=2"
SP = "parallel.sequence_degree=2"
Z1, Z2, Z3 = "parallel.zero_stage=1", "parallel.zero_stage=2", "parallel.zero_stage=3"
# Megatron SP inside TP (launcher/parallel/tensor.py): on the pipeline engine with stages, on the plain engine at one
# stage (launcher/parallel/tensor_model.py, the driver's `tpplain` mode), where ZeRO-2 applies.
MSP = "parallel.sequence_parallel=true"
SGD = "opt=sgd"  # ZeRO-0 fp32: DeepSpeed reports no gradient norm, so SGD without clipping exposes the scale
# Ulysses cases come last in a launch (DeepSpeed keeps their SP groups for the rest of the process).
LAUNCHES = {
    2: [
        f"pp2:pipe:{PP},{SGD}",
        f"pp2-z1-tied-type-ac:pipe:{PP},{Z1},model.tie_word_embeddings=true,parallel.partition_method=type:DecoderBlock,"
        "model.activation_checkpointing=true,model.checkpoint_blocks=1",
        # BLOOM's choice, tied embeddings too: the tied weight's gradient is all-reduced from BF16_Optimizer's
        # fp32 copy, which immediate_grad_update fills from a hook (pipe/engine.py _exec_reduce_tied_grads)
        f"pp2-bf16:pipe:{PP},{Z1},precision=bf16,precision.grad_accum_dtype=fp32,model.tie_word_embeddings=true",
        f"tp2:tpplain:{TP},{SGD}",
        f"tp2-z1:tpplain:{TP},{Z1}",
        f"tp2-z2:tpplain:{TP},{Z2}",
        f"tp2-sp:tpplain:{TP},{MSP},{SGD}",
        f"tp2-sp-z1:tpplain:{TP},{MSP},{Z1}",
        f"tp2-sp-z2:tpplain:{TP},{MSP},{Z2}",
        f"tp2-sp-z2-sgd:tpplain:{TP},{MSP},{Z2},{SGD}",
        f"tp2-sp-z2-tied-ac:tpplain:{TP},{MSP},{Z2},model.tie_word_embeddings=true,model.activation_checkpointing=true",
        f"tp2-sp-z2-no-norm-allreduce:tpplain:{TP},{MSP},{Z2},break=norm_grads",
        f"sp2:ulysses:{SP},{SGD}",
        f"sp2-z1:ulysses:{SP},{Z1}",
        f"sp2-z2:ulysses:{SP},{Z2}",
        f"sp2-z3:ulysses:{SP},{Z3}",
        f"sp2-z3-sgd:ulysses:{SP},{Z3},{SGD}",
        # A reduce bucket (4096) smaller than the embedding (V x H = 16,384): the generated config must raise it.
        f"sp2-z3-large-param:ulysses:{SP},{Z3},bucket=4096",
        # Grouped-query attention: 2 KV heads cross the all-to-all as they are (sp divides them), 1 KV head is
        # repeated to all 4 heads first (launcher/parallel/sequence.py).
        f"sp2-gqa:ulysses:{SP},{SGD},model.num_key_value_heads=2",
        f"sp2-mqa-z3:ulysses:{SP},{Z3},model.num_key_value_heads=1",
        # model.chunked_loss: each rank's head and loss over its S/sp tokens a chunk at a time (SGD: a scale error
        # moves the loss; ZeRO-3: the head's weight gathered for the forward and again for the backward)
        f"sp2-chunked:ulysses:{SP},{SGD},model.chunked_loss=true",
        f"sp2-z3-chunked:ulysses:{SP},{Z3},model.chunked_loss=true",
    ],
    4: [
        f"pp2-dp2-tied:pipe:{PP},model.tie_word_embeddings=true,{SGD}",
        f"pp4:pipe:parallel.pipeline_degree=4,{SGD}",
        f"pp2-dp2-z1:pipe:{PP},{Z1}",
        f"tp2-pp2-tied:pipe:{TP},{PP},model.tie_word_embeddings=true,{SGD}",
        f"tp2-pp2-z1-ac:pipe:{TP},{PP},{Z1},model.activation_checkpointing=true",
        f"tp2-dp2-z1:tpplain:{TP},{Z1}",
        f"bloom-tp2-pp2-tied:pipe:{BLOOM},{TP},{PP},model.tie_word_embeddings=true,{SGD}",
        f"bloom-pp2-dp2-z1:pipe:{BLOOM},{PP},{Z1}",
        f"tp2-sp-pp2:pipe:{TP},{PP},{MSP},{SGD}",
        f"tp2-sp-pp2-z1-tied-ac:pipe:{TP},{PP},{MSP},{Z1},model.tie_word_embeddings=true,model.activation_checkpointing=true",
        f"tp2-sp-dp2-z1:tpplain:{TP},{MSP},{Z1}",
        f"tp2-sp-dp2-z2:tpplain:{TP},{MSP},{Z2}",
        f"sp2-dp2-z1:ulysses:{SP},{Z1}",
        f"sp2-dp2-z3:ulysses:{SP},{Z3}",
    ],
    8: [f"tp2-pp2-dp2-z1:pipe:{TP},{PP},{Z1}"],
}


def _launch(nproc: int, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(f"ranks{nproc}") / "results.json"
    ext = tmp_path_factory.mktemp("torch_extensions")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": str(ext), "OMP_NUM_THREADS": "1"}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.run([torchrun, "--nproc_per_node", str(nproc), "--standalone", str(DRIVER), str(out),
                           *LAUNCHES[nproc]], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # Nothing may be JIT-compiled on CPU ranks (the shm comm op is skipped, AdamW is torch's).
    assert list(ext.iterdir()) == []
    return {r["name"]: r for r in json.loads(out.read_text())}


@pytest.fixture(scope="module")
def ranks2(tmp_path_factory):
    return _launch(2, tmp_path_factory)


@pytest.fixture(scope="module")
def ranks4(tmp_path_factory):
    return _launch(4, tmp_path_factory)


@pytest.fixture(scope="module")
def ranks8(tmp_path_factory):
    return _launch(8, tmp_path_factory)


def _assert_matches_one_rank(r, tol=TOL, norm_tol: float | None = NORM_TOL, first_norm_tol=FIRST_NORM_TOL):
    """Loss per step, and the gradient norm per step where DeepSpeed reports one, equal the 1-rank run's.
    A case without a reported norm must be an SGD run without clipping (the loss then sees the scale)."""
    assert len(r["losses"]) >= 5
    assert len(set(round(x, 4) for x in r["reference"])) > 1, "the reference trajectory must move"
    for step, (got, ref) in enumerate(zip(r["losses"], r["reference"])):
        assert abs(got - ref) <= tol * abs(ref), f"{r['name']} step {step}: {got} vs 1-rank {ref}"
    norms = r["grad_norms"]
    if None in norms:
        assert set(norms) == {None} and r["optimizer"] == "sgd", f"{r['name']}: sees no gradient-scale error"
        return
    for step, (got, ref) in enumerate(zip(norms, r["reference_grad_norms"])):
        t = first_norm_tol if step == 0 else norm_tol
        if t is not None:
            assert abs(got - ref) <= t * ref, f"{r['name']} step {step}: grad norm {got} vs 1-rank {ref}"


def _assert_export_reproduces_pipeline(r, tol=1e-5):
    """launcher.parallel.export merged stages (and TP shards) into a transformers state dict that loads
    strictly and gives the pipeline's own loss on a fixed batch (engine.eval_batch after training)."""
    e = r["export"]
    assert e["keys_match"]
    assert abs(e["export_loss"] - e["pipeline_eval_loss"]) <= tol * e["pipeline_eval_loss"]


def _assert_megatron_sharding(r, tp=2):
    """Each rank holds 1/tp of its stage's block linears, all as column/row-parallel layers, and 1/tp of the
    vocabulary rows of the embedding (first stage) and the head (last stage)."""
    stages = 1 + max(info["stage"] for info in r["per_rank"])
    for info in r["per_rank"]:
        blocks = info["blocks"]
        assert blocks >= 1
        assert info["plain_linear_in_blocks"] == 0
        assert info["column_parallel"] == 5 * blocks and info["row_parallel"] == 2 * blocks
        assert info["block_linear_params"] == blocks * BLOCK_LINEAR // tp
        # Marked tensor_model_parallel (counted on every TP rank by the gradient norm): the block shards, and the
        # vocabulary rows of the embedding and of an untied head; a tied embedding's copy on the last stage stays
        # unmarked (DeepSpeed's ds_pipe_replicated: counted once, on the first stage).
        ends = (info["stage"] == 0) + (info["stage"] == stages - 1 and "tied" not in r["name"])
        assert info["sharded_params"] == blocks * BLOCK_LINEAR // tp + ends * V * H // tp
        # TP group = consecutive ranks (launcher/plan/rankmap.py), as DeepSpeed's grid says.
        g = info["slice_group"]
        assert g == list(range(g[0], g[0] + tp)) and g[0] % tp == 0
    stage_ranks = {}
    for info in r["per_rank"]:
        stage_ranks.setdefault((info["stage"], info["dp_rank"]), []).append(info["params"])
    # One replica's ranks together hold the full model once, except that the norms are replicated on each TP rank.
    for dp in {k[1] for k in stage_ranks}:
        replica = sum(sum(v) for (stage, d), v in stage_ranks.items() if d == dp)
        assert replica == FULL + (tp - 1) * (FULL - L * BLOCK_LINEAR - 2 * V * H)


@pytest.mark.slow
def test_pp2_matches_one_rank(ranks2):
    r = ranks2["pp2"]
    _assert_matches_one_rank(r)
    _assert_export_reproduces_pipeline(r)
    params = sorted(i["params"] for i in r["per_rank"])
    assert sum(params) == FULL  # stages hold disjoint slices of one model
    assert {i["blocks"] for i in r["per_rank"]} == {2}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pp2", "pp2-bf16"])
def test_pipeline_engine_keeps_no_logits_past_the_loss(ranks2, name):
    """DeepSpeed's PipelineEngine references the last stage's logits of its last 2 micro-batches after the step
    (pipe_buffers['outputs']; 4 micro-batches here); ReleasingLoss has released their storage, as the planner assumes
    (launcher/plan/activations.py, "loss end's peak"). Unreleased they would be 2 x 2 x 32 x 256 x w bytes."""
    last = max(ranks2[name]["per_rank"], key=lambda i: i["stage"])
    assert last["held_outputs"] == 2
    assert last["held_output_bytes"] == 0


SEQ, MICRO, GLOBAL = 32, 2, 8                 # the driver's BASE


def _planned_buffers(info: dict, stages: int, dp: int, tp: int, dtype: str, sp: bool) -> dict:
    """The planner's pipeline buffers (launcher/plan/activations.py pipeline_buffer_bytes) for a rank: the output and,
    apart, the whole input (which the plan adds only where the stage's first block does not save it), times the
    micro-batches in flight at the stage's first backward under 1F1B, min(PP - stage, m)."""
    from launcher.plan import activations as act

    m = act.ActivationShape(arch="llama", hidden_size=H, num_heads=4, num_kv_heads=4, intermediate_size=I, vocab_size=V)
    stage, last = info["stage"], info["stage"] == stages - 1
    micro_batches = GLOBAL // (MICRO * dp)
    flight = min(stages - stage, micro_batches)
    out = act.pipeline_buffer_bytes(m, SEQ, MICRO, dtype, tp, 1, sp, first=True, last=last)
    inp = act.pipeline_buffer_bytes(m, SEQ, MICRO, dtype, tp, 1, sp, first=False, last=True, input_saved=False)
    return {"outputs": flight * out, "inputs": flight * inp,
            "receive": act.pipeline_receive_bytes(m, SEQ, MICRO, dtype, tp, 1, sp)}


@pytest.mark.slow
@pytest.mark.parametrize("launch,name,tp,dtype,sp", [("ranks2", "pp2", 1, "fp32", False),
                                                     ("ranks2", "pp2-bf16", 1, "bf16", False),
                                                     ("ranks4", "pp4", 1, "fp32", False),
                                                     ("ranks4", "tp2-pp2-tied", 2, "fp32", False),
                                                     ("ranks4", "tp2-sp-pp2", 2, "fp32", True)])
def test_pipeline_buffers_are_what_the_plan_counts(request, launch, name, tp, dtype, sp):
    """What DeepSpeed's PipelineEngine references in pipe_buffers at the start of a backward (the driver's count, each
    storage once) against the planner's figure: every stage but the last holds its output per in-flight micro-batch
    (cut over TP without SP, s / t tokens whole with it), every stage but the first its whole input. And the buffer it
    keeps for the run to receive into (after the steps): one tensor as sent on every stage, the middle stages of pp4
    included, where activations and gradients share it."""
    r = request.getfixturevalue(launch)[name]
    stages = 1 + max(i["stage"] for i in r["per_rank"])
    for info in r["per_rank"]:
        got = info["pipe_buffer_peak_bytes"]
        want = _planned_buffers(info, stages, r["layout"]["data_degree"], tp, dtype, sp)
        # within 2%: under TP the engine also keeps each partitioned output's shape (an int64 meta tensor, 144 bytes)
        assert got["outputs"] == pytest.approx(want["outputs"], rel=0.02), (info["stage"], got, want)
        if info["stage"] > 0:
            assert got["inputs"] == pytest.approx(want["inputs"], rel=0.02), (info["stage"], got, want)
        assert info["receive_buffer_bytes"] == pytest.approx(want["receive"], rel=0.02), (info["stage"], want)


@pytest.mark.slow
def test_pp4_matches_one_rank(ranks4):
    """Four stages of one block each: the two middle stages receive and send both ways."""
    r = ranks4["pp4"]
    _assert_matches_one_rank(r)
    _assert_export_reproduces_pipeline(r)
    assert [i["blocks"] for i in sorted(r["per_rank"], key=lambda i: i["stage"])] == [1, 1, 1, 1]


@pytest.mark.slow
def test_tp2_pipeline_keeps_no_logits_past_the_loss(ranks4):
    """The same under TP (each last-stage rank's V/t columns), on both TP ranks of the last stage."""
    r = ranks4["tp2-pp2-z1-ac"]
    stages = 1 + max(i["stage"] for i in r["per_rank"])
    last = [i for i in r["per_rank"] if i["stage"] == stages - 1]
    assert len(last) == 2 and all(i["held_outputs"] == 2 and i["held_output_bytes"] == 0 for i in last)


@pytest.mark.slow
def test_pp2_tied_type_partition_checkpointing_zero1(ranks2):
    r = ranks2["pp2-z1-tied-type-ac"]
    _assert_matches_one_rank(r)
    _assert_export_reproduces_pipeline(r)
    # Tied: both ends hold the embedding (TiedLayerSpec), no separate head: FULL - V*H + V*H again.
    assert sum(i["params"] for i in r["per_rank"]) == FULL
    assert [i["blocks"] for i in sorted(r["per_rank"], key=lambda i: i["stage"])] == [2, 2]
    # model.checkpoint_blocks=1: the PipelineEngine checkpoints one of each stage's two blocks, not both.
    assert [i["checkpointed"] for i in r["per_rank"]] == [1, 1]


@pytest.mark.slow
def test_pp2_bf16_runs_bf16_optimizer(ranks2):
    """recipes/bloom-176b.yaml's choice (bf16 + ZeRO-1 + fp32 grad accumulation, tied embeddings) on a pipeline:
    DeepSpeed selects its BF16_Optimizer, with the immediate_grad_update the launcher sets, the weights are bf16,
    and the trajectory follows fp32 to bf16 precision (8 mantissa bits: ~4e-3 relative per rounding; measured max
    9.3e-3 over 6 steps untied)."""
    r = ranks2["pp2-bf16"]
    assert {i["optimizer"] for i in r["per_rank"]} == {"BF16_Optimizer"}
    assert {i["immediate_grad_update"] for i in r["per_rank"]} == {True}
    assert {i["param_dtype"] for i in r["per_rank"]} == {"torch.bfloat16"}
    # Gradient norms: the first step's (same weights, bf16-rounded) within 1e-2 (measured 1.9e-3); later ones
    # follow the bf16 trajectory, not the fp32 one (step 4: 1.70 vs 0.99), and are not compared.
    _assert_matches_one_rank(r, tol=3e-2, norm_tol=None, first_norm_tol=1e-2)
    _assert_export_reproduces_pipeline(r, tol=2e-2)  # bf16 weights, fp32 transformers forward


@pytest.mark.slow
@pytest.mark.parametrize("launch,name,stage", [("ranks2", "tp2", 0), ("ranks2", "tp2-z1", 1), ("ranks2", "tp2-z2", 2),
                                               ("ranks4", "tp2-dp2-z1", 1)])
def test_tp2_without_pipeline_matches_one_rank_and_shards(request, launch, name, stage):
    """TP2 at pipeline_degree 1 (what DeepSpeed AutoTP ran until issue 11): our TP layers on the plain engine, ZeRO
    0-2, against the 1-rank trajectory (SGD: the loss sees a gradient-scale error; ZeRO >= 1: the gradient norm),
    Megatron's sharding, and the export merging to the 1-rank model with the run's own held-out loss."""
    r = request.getfixturevalue(launch)[name]
    _assert_matches_one_rank(r, tol=SP_TOL, first_norm_tol=SP_TOL)
    _assert_megatron_sharding(r)
    _assert_export_reproduces_pipeline(r)
    for info in r["per_rank"]:
        assert info["engine"] == "DeepSpeedEngine" and info["zero_stage"] == stage
        assert info["block_tokens"] == [32]  # no SP: every block sees the whole sequence
    assert sorted(i["dp_rank"] for i in r["per_rank"]) == [0] * 2 + [1] * 2 * (launch == "ranks4")


@pytest.mark.slow
@pytest.mark.parametrize("launch,name", [("ranks2", "tp2"), ("ranks4", "tp2-dp2-z1")])
def test_tp2_without_pipeline_never_materialises_a_whole_weight(request, launch, name):
    """Issue 11: every rank gives real storage to its TP slice only. The build materialises exactly the parameters
    the rank holds (half the vocabulary rows of the embedding and the head, half of every block linear, the
    replicated norms), never the whole model, and no tensor larger than V x H / 2."""
    r = request.getfixturevalue(launch)[name]
    held = 2 * V * H // 2 + L * (BLOCK_LINEAR // 2 + 2 * H) + H
    for info in r["per_rank"]:
        assert info["materialised_numel"] == info["params"] == held < FULL
        assert info["materialised_largest"] == V * H // 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pp2-dp2-tied", "pp2-dp2-z1"])
def test_pp2_dp2_matches_one_rank(ranks4, name):
    r = ranks4[name]
    _assert_matches_one_rank(r)
    _assert_export_reproduces_pipeline(r)
    assert sorted(i["dp_rank"] for i in r["per_rank"]) == [0, 0, 1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tp2-pp2-tied", "tp2-pp2-z1-ac"])
def test_tp2_pp2_matches_one_rank_and_shards(ranks4, name):
    r = ranks4[name]
    _assert_matches_one_rank(r)
    _assert_megatron_sharding(r)
    _assert_export_reproduces_pipeline(r)


@pytest.mark.slow
def test_tp2_pp2_dp2_on_8_ranks(ranks8):
    r = ranks8["tp2-pp2-dp2-z1"]
    _assert_matches_one_rank(r)
    _assert_megatron_sharding(r)
    _assert_export_reproduces_pipeline(r)
    assert sorted(i["dp_rank"] for i in r["per_rank"]) == [0] * 4 + [1] * 4


@pytest.mark.slow
def test_bloom_tp2_pp2_matches_one_rank_and_shards(ranks4):
    """Bloom in the pipeline (ALiBi inside the blocks, embedding LayerNorm as its own layer, tied head) with its
    fused query_key_value split per head over 2 TP ranks."""
    r = ranks4["bloom-tp2-pp2-tied"]
    _assert_matches_one_rank(r)
    _assert_export_reproduces_pipeline(r)
    for info in r["per_rank"]:
        blocks = info["blocks"]
        assert blocks == 2 and info["plain_linear_in_blocks"] == 0
        assert info["column_parallel"] == 2 * blocks and info["row_parallel"] == 2 * blocks  # qkv, h->4h | dense, 4h->h
        # + the embedding's vocabulary rows on the first stage (the tied copy on the last is ds_pipe_replicated)
        assert info["sharded_params"] == blocks * BLOOM_COLUMN_ROW_SHARDED // 2 + (info["stage"] == 0) * V * H // 2
        assert info["block_linear_params"] == blocks * (BLOOM_COLUMN_ROW_SHARDED // 2 + 2 * H)
    # Sharded block weights and vocabulary rows once; everything else on both TP ranks; the tied embedding's rows on
    # both stages.
    total = sum(i["params"] for i in r["per_rank"])
    sharded = L * BLOOM_COLUMN_ROW_SHARDED + V * H
    assert total == sharded + 2 * (BLOOM_FULL_TIED - sharded) + V * H


@pytest.mark.slow
def test_bloom_pp2_dp2_matches_one_rank(ranks4):
    r = ranks4["bloom-pp2-dp2-z1"]
    _assert_matches_one_rank(r)
    _assert_export_reproduces_pipeline(r)
    untied_full = BLOOM_FULL_TIED + V * H
    for dp in (0, 1):
        assert sum(i["params"] for i in r["per_rank"] if i["dp_rank"] == dp) == untied_full


# Megatron SP against 1 rank: the fp32 tolerance of the brief (issue 13). Losses and the first step's gradient
# norm are within 1e-5 (measured <= 2.9e-6 and 1.1e-7); later AdamW gradient norms keep NORM_TOL (above).
SP_TOL = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("launch,name", [("ranks2", "tp2-sp"), ("ranks2", "tp2-sp-z1"), ("ranks2", "tp2-sp-z2"),
                                         ("ranks2", "tp2-sp-z2-sgd"), ("ranks4", "tp2-sp-pp2"),
                                         ("ranks4", "tp2-sp-pp2-z1-tied-ac"), ("ranks4", "tp2-sp-dp2-z1"),
                                         ("ranks4", "tp2-sp-dp2-z2")])
def test_megatron_sequence_parallel_matches_one_rank(request, launch, name):
    """TP2 + Megatron SP (Korthikanti et al. 2022, section 4.2.2), without a pipeline (the plain engine, ZeRO 0-2),
    x PP2 (tied embedding, activation checkpointing) and x DP2: every decoder block receives seq/2 = 16 of the 32
    tokens, and the loss and gradient-norm trajectories are the 1-rank ones; the export merges to the 1-rank model."""
    r = request.getfixturevalue(launch)[name]
    _assert_matches_one_rank(r, tol=SP_TOL, first_norm_tol=SP_TOL)
    _assert_megatron_sharding(r)
    _assert_export_reproduces_pipeline(r)
    for info in r["per_rank"]:
        assert info["block_tokens"] == [16]
        # The norms that run on s/tp tokens: two per block, and the final norm on the last stage.
        assert info["sequence_parallel_params"] == info["blocks"] * 2 * H + (H if info["stage"] == r["layout"]["pipeline_degree"] - 1 else 0)


@pytest.mark.slow
def test_megatron_sequence_parallel_test_sees_missing_norm_allreduce(ranks2):
    """The negative control: without the all-reduce of the norm weights' gradients over the TP ranks, each rank
    steps its norms with the gradient of its own 16 tokens. The comparison above must see it, here on the plain
    engine under ZeRO-2 (measured when it ran ZeRO-1 on a one-stage pipeline engine: loss 1.5e-4 off at step 2,
    gradient norm 3.2e-5 off at step 0)."""
    r = ranks2["tp2-sp-z2-no-norm-allreduce"]
    with pytest.raises(AssertionError):
        _assert_matches_one_rank(r, tol=SP_TOL, first_norm_tol=SP_TOL)
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], r["reference"]))
    assert loss_diff > 10 * SP_TOL
    assert abs(r["grad_norms"][0] - r["reference_grad_norms"][0]) > SP_TOL * r["reference_grad_norms"][0]


@pytest.mark.slow
@pytest.mark.parametrize("launch,name,stage", [("ranks2", "tp2-sp-z2", 2), ("ranks2", "tp2-sp-z2-sgd", 2),
                                               ("ranks2", "tp2-sp-z2-tied-ac", 2), ("ranks4", "tp2-sp-dp2-z2", 2),
                                               ("ranks2", "tp2-sp-z1", 1), ("ranks2", "tp2-sp", 0)])
def test_megatron_sequence_parallel_runs_on_the_plain_engine_with_zero(request, launch, name, stage):
    """At pipeline_degree 1 Megatron SP is not a one-stage PipelineEngine (which asserts ZeRO < 2) but DeepSpeed's
    plain engine with the grid as mpu, so ZeRO-2 partitions gradients and optimizer state over DP. The first
    step's gradient norm is the 1-rank one to 1e-5 (a factor 2 on any gradient would be far outside), the SGD
    case's loss trajectory sees the update itself, and the tied + checkpointed case matches too."""
    r = request.getfixturevalue(launch)[name]
    _assert_matches_one_rank(r, tol=SP_TOL, first_norm_tol=SP_TOL)
    _assert_export_reproduces_pipeline(r)
    for info in r["per_rank"]:
        assert info["engine"] == "DeepSpeedEngine" and info["zero_stage"] == stage
        assert info["block_tokens"] == [16]
        assert info["block_linear_params"] == info["blocks"] * BLOCK_LINEAR // 2
    if stage:
        assert r["per_rank"][0]["optimizer"] == "DeepSpeedZeroOptimizer"


@pytest.mark.slow
@pytest.mark.parametrize("launch,name", [("ranks2", "sp2"), ("ranks2", "sp2-z1"), ("ranks2", "sp2-z2"), ("ranks2", "sp2-z3"),
                                         ("ranks2", "sp2-z3-sgd"), ("ranks2", "sp2-z3-large-param"),
                                         ("ranks2", "sp2-chunked"), ("ranks2", "sp2-z3-chunked"),
                                         ("ranks4", "sp2-dp2-z1"), ("ranks4", "sp2-dp2-z3")])
def test_ulysses_sp2_matches_one_rank(request, launch, name):
    """DeepSpeed Ulysses (DistributedAttention all-to-all): each rank embeds, projects and scores only
    seq/2 = 16 of the 32 tokens, yet the loss and gradient-norm trajectories are the 1-rank ones (attention saw
    the whole sequence, and the SP ranks' gradients are summed, not averaged), under ZeRO 0-3.

    ZeRO-3 is the trap: DeepSpeed 0.19.8's reduce-scatter path divides by dp x sp, so with the config's
    old "reduce_scatter": true every gradient was 1/2 (grad norm 0.548 vs 1.097 at step 1; SGD loss 2e-3
    off after one step). launcher/deepspeed_config.py turns it off for SP x ZeRO-3 and sizes the bucket
    so that no parameter takes that path (sp2-z3-large-param: a 4096-element default bucket is raised to
    the 16,384-element embedding)."""
    r = request.getfixturevalue(launch)[name]
    _assert_matches_one_rank(r)
    for info in r["per_rank"]:
        assert info["tokens_per_rank"] == [16]
        assert info["attn_implementation"] == "launcher_ulysses"
        assert info["params"] == FULL  # SP replicates the weights
        assert info["chunked_loss"] == name.endswith("chunked")
    if name == "sp2-z3-large-param":
        assert r["reduce_scatter"] is False and r["reduce_bucket_size"] == V * H


@pytest.mark.slow
@pytest.mark.parametrize("name,kv", [("sp2-gqa", 2), ("sp2-mqa-z3", 1)])
def test_ulysses_grouped_query_attention_matches_one_rank(ranks2, name, kv):
    """Ulysses with fewer KV heads than query heads: the 1-rank trajectory (SGD, so a gradient-scale error
    shows in the loss; ZeRO-3 with its reported norm), whether k and v cross the all-to-all with their own 2
    heads, each rank then repeating its 1 KV head for its 2 query heads, or are repeated to all 4 first."""
    r = ranks2[name]
    _assert_matches_one_rank(r)
    head_dim = H // 4
    for info in r["per_rank"]:
        assert info["tokens_per_rank"] == [16]
        assert info["attn_implementation"] == "launcher_ulysses"
        assert info["params"] == FULL - L * 2 * H * (4 - kv) * head_dim   # k_proj, v_proj: kv heads of 16
