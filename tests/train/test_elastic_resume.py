"""Resuming on another layout (launcher/runtime/elastic.py): real `launcher train` runs on CPU ranks.

Each resumed run is held to an uninterrupted run on the new layout for the steps after the resume (loss and
gradient norm, 1e-5 relative; the norm is what sees a gradient-scale error, which AdamW and clipping hide from the
losses): DP 4 -> 2 (as the user types it: `--config <run>/config.yaml cluster.gpus_per_node=2 resume=auto`) and
2 -> 4 under ZeRO-1, ZeRO-1 -> ZeRO-2 (ZeRO-3 is refused: not exact in DeepSpeed 0.19.8), the pipeline's own TP 2 -> 1 and 1 -> 2 (the trap:
without our universal_checkpoint_info a TP1 -> TP2 resume loads silently wrong), PP 2 -> 1 and 1 -> 2. What cannot be
converted is refused before any rank starts. 12 launches (~3.5 min on 2 cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from train_helpers import REPO, child_env

pytestmark = pytest.mark.slow
TOL = 1e-5
STEPS = 4
LLAMA = ["recipe=tiny", "model.hidden_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2",
         "model.num_key_value_heads=2", "model.intermediate_size=64", "model.vocab_size=320",
         "model.max_position_embeddings=64", "precision=fp32", "optimizer.lr=0.01", "scheduler.warmup_steps=1",
         "cluster=cpu", "data.seq_length=32", "data.max_bytes=300000", "batch.global_batch_size=8",
         "batch.micro_batch_size=2", "logging.log_every=1", "logging.progress_bar=false", "checkpoint.export_hf=false",
         "checkpoint.save_every=2", f"train.steps={STEPS}", "train.eval_every=0"]
Z1, Z2, Z3 = "parallel.zero_stage=1", "parallel.zero_stage=2", "parallel.zero_stage=3"
DP4, DP2 = "cluster.gpus_per_node=4", "cluster.gpus_per_node=2"
PP2, TP2 = "parallel.pipeline_degree=2", "parallel.tensor_degree=2"


def launch(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "launcher", "train", *args], cwd=REPO, env=child_env(OMP_NUM_THREADS=1),
                          capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def train_records(run_dir: Path) -> list[dict]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "train"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir):
    tmp = tmp_path_factory.mktemp("elastic")
    base = LLAMA + [f"data.cache_dir={cache_dir}", f"runs_dir={tmp}"]
    out: dict[str, Path] = {}

    def run(name: str, *extra: str, resume: str | None = None) -> None:
        launch(base + [f"run_name={name}", *extra] + ([f"resume={tmp / resume / 'checkpoints' / 'step_00000002'}"] if resume else []))
        out[name] = tmp / name

    run("dp4z1", DP4, Z1)
    run("dp2z1", DP2, Z1)
    # The user's form: 4 ranks for 2 steps (the schedule's horizon pinned to the 4 steps the run will have), then
    # the frozen config on 2 ranks, resume=auto, into the same run directory.
    run("user", DP4, Z1, "train.steps=2", "scheduler.decay_steps=4")
    launch(["--config", str(tmp / "user" / "config.yaml"), DP2, "resume=auto", "train.steps=4"])
    run("dp4z1-from-dp2", DP4, Z1, resume="dp2z1")
    run("dp2z2-from-z1", DP2, Z2, resume="dp2z1")
    run("tp2pp2", DP4, Z1, TP2, PP2)
    run("pp2dp2", DP4, Z1, PP2)
    run("pp2dp2-from-tp2", DP4, Z1, PP2, resume="tp2pp2")
    run("tp2pp2-from-tp1", DP4, Z1, TP2, PP2, resume="pp2dp2")
    run("dp4z1-from-pp2", DP4, Z1, resume="pp2dp2")
    run("pp2dp2-from-dp2", DP4, Z1, PP2, resume="dp2z1")
    out["tmp"] = tmp
    return out


def assert_equal_after_resume(resumed: Path, full: Path) -> None:
    got, ref = train_records(resumed), train_records(full)[2:]
    assert [r["step"] for r in got][-2:] == [3, 4] and [r["step"] for r in ref] == [3, 4]
    for g, r in zip(got[-2:], ref):
        for key in ("loss", "grad_norm"):
            assert abs(g[key] - r[key]) <= TOL * abs(r[key]), (resumed.name, g["step"], key, g[key], r[key])


@pytest.mark.parametrize("resumed, full", [
    ("user", "dp2z1"),                # DP 4 -> 2, ZeRO-1, --config ... resume=auto in the same run dir
    ("dp4z1-from-dp2", "dp4z1"),      # DP 2 -> 4, ZeRO-1
    ("dp2z2-from-z1", "dp2z1"),       # ZeRO-1 -> ZeRO-2 on 2 ranks (the uninterrupted ZeRO-1 run: same arithmetic in fp32)
    ("pp2dp2-from-tp2", "pp2dp2"),    # TP 2 -> 1 inside a 2-stage pipeline (Megatron-style TP, parallel/tensor.py)
    ("tp2pp2-from-tp1", "tp2pp2"),    # TP 1 -> 2: the trap, handled by our universal_checkpoint_info
    ("dp4z1-from-pp2", "dp4z1"),      # PP 2 -> 1 (PipelineModule names -> transformers names), DP 2 -> 4
    ("pp2dp2-from-dp2", "pp2dp2"),    # PP 1 -> 2 (transformers names -> PipelineModule names), DP 2 -> 2
])
def test_resumed_run_equals_an_uninterrupted_run_on_the_new_layout(runs, resumed, full):
    assert_equal_after_resume(runs[resumed], runs[full])


def test_conversion_is_kept_in_the_resuming_run_and_marked_done(runs):
    # The checkpoint of another run (resume=PATH) is only read: its directory holds no universal/ folder.
    assert not (runs["dp2z1"] / "universal").exists()
    # (beside it DeepSpeed's load leaves a `latest_universal` file naming it)
    (converted,) = (runs["dp4z1-from-dp2"] / "universal").glob("step_*")
    assert converted.name.startswith("step_00000002-") and (converted / "converted.json").is_file()
    # The user's resume converted inside its own run directory, and then saved on the new layout.
    state = json.loads((runs["user"] / "checkpoints" / "step_00000004" / "launcher_state.json").read_text())
    assert state["layout"]["data_degree"] == 2 and (runs["user"] / "universal").is_dir()
    assert (runs["user"] / "config.prev.yaml").is_file()  # the 4-rank config, kept beside the 2-rank one


def test_row_parallel_weights_are_merged_and_split_on_dim_1(runs):
    """The mechanism behind the TP1 -> TP2 trap: the universal form records o_proj/down_proj as row-parallel
    (cat_dim 1), so the loader cuts their columns, not their rows; the embedding and head are cut over the
    vocabulary (rows, like a column-parallel weight); replicated tensors (norms) carry no cat_dim."""
    import torch

    (converted,) = (runs["tp2pp2-from-tp1"] / "universal").glob("step_*")
    zero = converted / "zero"
    meta = {p.name: torch.load(p / "fp32.pt", weights_only=False).get("cat_dim") for p in zero.iterdir() if p.is_dir()}
    assert meta["1.layer.self_attn.o_proj.weight"] == 1 and meta["2.layer.mlp.down_proj.weight"] == 1
    assert meta["1.layer.self_attn.q_proj.weight"] == 0 and meta["2.layer.mlp.up_proj.weight"] == 0
    assert meta["0.weight"] == 0 and meta["4.weight"] == 0   # the embedding and the head: vocabulary rows
    assert meta["3.norm.weight"] is None and meta["1.layer.input_layernorm.weight"] is None


@pytest.mark.parametrize("extra, key, says", [
    ([DP2, Z3], "parallel.zero_stage", "with ZeRO-3 on either side it is not exact"),
    ([DP2, "parallel.zero_stage=0"], "parallel.zero_stage", "ZeRO stage 0 (now) keeps the optimizer state inside the model file"),
    ([DP2, Z1, "batch.global_batch_size=16"], "batch.global_batch_size", "keep batch.global_batch_size=8"),
    ([DP2, Z1, "model.hidden_size=64"], "resume", "model.hidden_size: 32 -> 64"),
    ([DP4, Z1, TP2], "parallel.tensor_degree", "with tensor parallelism at parallel.pipeline_degree=1 (our TP layers"),
])
def test_what_cannot_be_converted_is_refused_before_any_rank_starts(runs, extra, key, says):
    tmp = runs["tmp"]
    proc = launch(LLAMA + [f"runs_dir={tmp}", "run_name=refused", f"data.cache_dir={tmp / 'unused-cache'}",
                           f"resume={runs['dp4z1'] / 'checkpoints' / 'step_00000002'}", *extra], check=False)
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and f"{key}=" in text and says in text and "Traceback" not in text, proc.stderr[-3000:]
    assert not (tmp / "refused").exists()  # nothing written, no rank started
