"""`launcher train` / `launcher export` with pipeline and tensor parallelism, as a user runs them (real torchrun, CPU ranks).

- a 1-rank run is the reference; TP2 x PP2 (4 ranks, Megatron TP inside a PipelineModule, ZeRO-1), TP2 x DP2
  without a pipeline (4 ranks, ZeRO-1, the same TP layers on the plain engine), TP2 + Megatron SP (2 ranks, the recipe's ZeRO-2 on the plain engine) and Ulysses SP2 (2 ranks,
  ZeRO-1) follow its loss and grad-norm trajectory,
  save, resume exactly and export a transformers model that reproduces the training run's own held-out
  loss (i.e. its logits); Ulysses SP2 under ZeRO-3 follows it too (its gradients were 1/2 with DeepSpeed's
  reduce-scatter: launcher/deepspeed_config.py, zero3_sequence_parallel_reduction);
- the scaled-down BLOOM: `recipe=bloom-176b` with a tiny model on 1 node x 8 CPU ranks -> TP 2 x PP 2 x DP 2,
  the recipe's bf16 + ZeRO-1 + fp32 accumulation + activation checkpointing + tied embeddings, with a
  checkpoint and an export.
- the issue-13 commands as typed: TP2 + Megatron SP and ring-attention CP2 x TP2, each under recipe=tiny's ZeRO-2,
  with a resume and an export; and plain TP2 under recipe=tiny's ZeRO-2 (issue 11: what AutoTP ran).
Seventeen launches (~7.5 min on 2 cores); the 1-rank equivalence of each layout in isolation is test_parallel.py's
and test_context_parallel.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.runtime.data import TokenBatches, prepare_data

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS = 4
TOL = 1e-4  # relative, per step (issue 4)

LLAMA = ["recipe=tiny", "model.hidden_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2",
         "model.num_key_value_heads=2", "model.intermediate_size=64", "model.vocab_size=320", "model.max_position_embeddings=64",
         "precision=fp32", "optimizer.lr=0.01", "scheduler.warmup_steps=1"]
# The recipe's own path with only the model shape, the machine and the run length scaled down.
BLOOM = ["recipe=bloom-176b", "cluster=cpu", "cluster.nodes=1", "cluster.gpus_per_node=8", "parallel.tensor_degree=2",
         "parallel.pipeline_degree=2", "model.hidden_size=64", "model.num_hidden_layers=4", "model.num_attention_heads=4",
         "model.vocab_size=320", "model.max_position_embeddings=64", "batch.micro_batch_size=1", "train.steps=3",
         "scheduler.warmup_steps=1",  # the recipe warms up over 89 steps: longer than this run (refused)
         "train.eval_every=3"]


def common(tmp: Path, name: str) -> list[str]:
    return ["data.seq_length=32", "data.max_bytes=300000", f"data.cache_dir={tmp / 'cache'}", "batch.global_batch_size=8",
            "logging.log_every=1", "logging.progress_bar=false", f"runs_dir={tmp / 'runs'}", f"run_name={name}",
            "checkpoint.export_hf=true", "checkpoint.save_every=2"]


def llama(tmp: Path, name: str, *extra: str) -> list[str]:
    return LLAMA + common(tmp, name) + ["cluster=cpu", f"train.steps={STEPS}", f"train.eval_every={STEPS}",
                                       "batch.micro_batch_size=2", *extra]


def train(overrides: list[str], ext: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": str(ext)}
    proc = subprocess.run([sys.executable, "-m", "launcher", "train", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    cfg = compose(overrides)
    run_dir = Path(cfg.runs_dir) / cfg.run_name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"cfg": cfg, "dir": run_dir, "train": [r for r in records if r["kind"] == "train"],
            "eval": [r for r in records if r["kind"] == "eval"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train-parallel")
    ext = tmp / "torch_extensions"
    ext.mkdir()
    z1 = "parallel.zero_stage=1"
    out = {"one": train(llama(tmp, "one", "cluster.gpus_per_node=1"), ext)}
    out["tp2pp2"] = train(llama(tmp, "tp2pp2", "cluster.gpus_per_node=4", "parallel.tensor_degree=2",
                                "parallel.pipeline_degree=2", z1), ext)
    out["tp2pp2-resumed"] = train(llama(tmp, "tp2pp2-resumed", "cluster.gpus_per_node=4", "parallel.tensor_degree=2",
                                        "parallel.pipeline_degree=2", z1,
                                        f"resume={out['tp2pp2']['dir'] / 'checkpoints' / 'step_00000002'}"), ext)
    # TP without a pipeline: our TP layers on the plain engine (launcher/parallel/tensor_model.py; AutoTP until issue 11).
    out["tp2dp2"] = train(llama(tmp, "tp2dp2", "cluster.gpus_per_node=4", "parallel.tensor_degree=2", z1), ext)
    out["tp2dp2-resumed"] = train(llama(tmp, "tp2dp2-resumed", "cluster.gpus_per_node=4", "parallel.tensor_degree=2", z1,
                                        f"resume={out['tp2dp2']['dir'] / 'checkpoints' / 'step_00000002'}"), ext)
    # Megatron SP without a pipeline: our TP layers on DeepSpeed's plain engine (launcher/parallel/tensor_model.py),
    # under recipe=tiny's own ZeRO-2 (the pipeline engine, which ran it before, refuses ZeRO-2).
    tp2sp = ("cluster.gpus_per_node=2", "parallel.tensor_degree=2", "parallel.sequence_parallel=true")
    out["tp2sp"] = train(llama(tmp, "tp2sp", *tp2sp), ext)
    out["tp2sp-resumed"] = train(llama(tmp, "tp2sp-resumed", *tp2sp,
                                       f"resume={out['tp2sp']['dir'] / 'checkpoints' / 'step_00000002'}"), ext)
    sp2 = ("cluster.gpus_per_node=2", "parallel.sequence_degree=2", z1)
    out["sp2"] = train(llama(tmp, "sp2", *sp2), ext)
    out["sp2-resumed"] = train(llama(tmp, "sp2-resumed", *sp2, f"resume={out['sp2']['dir'] / 'checkpoints' / 'step_00000002'}"), ext)
    out["sp2z3"] = train(llama(tmp, "sp2z3", "cluster.gpus_per_node=2", "parallel.sequence_degree=2", "parallel.zero_stage=3"), ext)
    out["bloom"] = train(BLOOM + common(tmp, "bloom"), ext)
    # Nothing may be JIT-compiled on CPU ranks.
    assert list(ext.iterdir()) == []
    return out


def exported_val_loss(run: dict) -> float:
    """The held-out loss of the exported transformers model on the run's own eval batches, averaged as
    launcher.train.evaluate does (mean over eval_batches per DP replica, then over the replicas)."""
    from transformers import AutoModelForCausalLM

    cfg = run["cfg"]
    layout = resolve_layout(cfg)
    model = AutoModelForCausalLM.from_pretrained(run["dir"] / "hf").eval()
    prepared = prepare_data(cfg, layout)
    per_replica = []
    with torch.no_grad():
        for dp in range(layout.data_degree):
            b = TokenBatches(prepared, layout, seed=cfg.train.seed, dp_rank=dp)
            losses = [model(input_ids=x, labels=x).loss.item() for x in (b.batch(b.val_sample_ids(i)) for i in range(cfg.train.eval_batches))]
            per_replica.append(sum(losses) / len(losses))
    return sum(per_replica) / len(per_replica)


def assert_follows(got: list[dict], ref: list[dict], tol: float = TOL) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in ref]
    for g, r in zip(got, ref):
        assert abs(g["loss"] - r["loss"]) <= tol * abs(r["loss"]), (g["step"], g["loss"], r["loss"])
        assert abs(g["grad_norm"] - r["grad_norm"]) <= tol * abs(r["grad_norm"]), (g["step"], g["grad_norm"], r["grad_norm"])


def test_reference_learns(runs):
    losses = [r["loss"] for r in runs["one"]["train"]]
    assert len(losses) == STEPS and losses[-1] < losses[0]


@pytest.mark.parametrize("name", ["tp2pp2", "tp2dp2", "tp2sp", "sp2", "sp2z3"])
def test_parallel_run_follows_one_rank(runs, name):
    assert_follows(runs[name]["train"], runs["one"]["train"])


@pytest.mark.parametrize("name", ["tp2pp2", "tp2sp", "sp2", "sp2z3"])
def test_val_loss_equals_one_rank(runs, name):
    # dp = 1 in these runs and the reference: the same held-out batches (for sp2 each rank evaluates half of every sequence).
    assert abs(runs[name]["eval"][0]["val_loss"] - runs["one"]["eval"][0]["val_loss"]) <= 1e-5 * runs["one"]["eval"][0]["val_loss"]


@pytest.mark.parametrize("name", ["tp2pp2", "tp2dp2", "tp2sp", "sp2"])
def test_resume_continues_exactly(runs, name):
    resumed, full = runs[f"{name}-resumed"]["train"], runs[name]["train"]
    assert [r["step"] for r in resumed] == [3, 4]
    assert_follows(resumed, full[2:], tol=1e-6)


def test_checkpoint_holds_every_layer_and_tp_shard(runs):
    tag = runs["tp2pp2"]["dir"] / "checkpoints" / "step_00000002"
    # PipelineModule.ckpt_layer_path: embedding, 2 blocks, norm, head = 5 layers, each per TP rank.
    assert sorted(p.name for p in tag.glob("layer_*")) == [f"layer_{i:02d}-model_{t:02d}-model_states.pt" for i in range(5) for t in range(2)]
    for name in ("tp2dp2", "tp2sp"):
        tag = runs[name]["dir"] / "checkpoints" / "step_00000002"
        assert sorted(p.name for p in tag.glob("mp_rank_*")) == ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"]
    # Megatron SP at one stage: the plain engine's files, ZeRO-2 optimizer partitions, no pipeline layer files.
    tag = runs["tp2sp"]["dir"] / "checkpoints" / "step_00000002"
    assert not list(tag.glob("layer_*")) and len(list(tag.glob("zero_pp_rank_*_optim_states.pt"))) == 2
    ds = json.loads((runs["tp2sp"]["dir"] / "deepspeed.json").read_text())
    assert ds["zero_optimization"]["stage"] == 2 and "pipeline" not in ds and "tensor_parallel" not in ds
    # Plain TP at one stage: the same module (pipe.<layer>.<name>), no AutoTP section, the batch counted over DP.
    tag = runs["tp2dp2"]["dir"] / "checkpoints" / "step_00000002"
    names = torch.load(tag / "mp_rank_01_model_states.pt", map_location="cpu", weights_only=False)["module"]
    assert names and all(k.startswith("pipe.") for k in names), sorted(names)[:4]
    ds = json.loads((runs["tp2dp2"]["dir"] / "deepspeed.json").read_text())
    assert "tensor_parallel" not in ds and ds["train_batch_size"] == 8


@pytest.mark.parametrize("name", ["tp2pp2", "tp2dp2", "tp2sp", "sp2"])
def test_export_reproduces_training(runs, name):
    """The merged export loads with from_pretrained, gives the run's own logged held-out loss, and equals
    the 1-rank run's export (same training, so the same weights)."""
    from transformers import AutoModelForCausalLM

    run = runs[name]
    logged = run["eval"][0]["val_loss"]
    assert abs(exported_val_loss(run) - logged) <= 1e-5 * logged
    a = AutoModelForCausalLM.from_pretrained(run["dir"] / "hf").state_dict()
    b = AutoModelForCausalLM.from_pretrained(runs["one"]["dir"] / "hf").state_dict()
    assert sorted(a) == sorted(b)
    for k in b:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5), k


def test_bloom_recipe_tp2_pp2_dp2_end_to_end(runs):
    run = runs["bloom"]
    ds = json.loads((run["dir"] / "deepspeed.json").read_text())
    # The recipe's choices survived the scale-down: bf16, ZeRO-1 with fp32 accumulation, 2 stages, checkpointing.
    assert ds["bf16"]["enabled"] and ds["zero_optimization"]["stage"] == 1
    assert ds["data_types"]["grad_accum_dtype"] == "fp32" and ds["pipeline"]["stages"] == 2
    # Checkpointing is the pipeline's per-block recompute (DeepSpeed reads no "activation_checkpointing" section
    # unless deepspeed.checkpointing.configure is called, which it never does: launcher/deepspeed_config.py).
    assert ds["pipeline"]["activation_checkpoint_interval"] == 1 and "activation_checkpointing" not in ds
    assert run["cfg"].recipe_name == "bloom-176b" and run["cfg"].model.arch == "bloom"
    assert [r["step"] for r in run["train"]] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in run["train"])
    ckpts = run["dir"] / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_00000003"
    # Embedding, its LayerNorm, 4 blocks, ln_f saved per TP rank; the tied head is the embedding (not saved twice).
    assert len(list((ckpts / "step_00000002").glob("layer_*-model_states.pt"))) == 7 * 2
    # The export is a BloomForCausalLM that reproduces the run's held-out loss (bf16 training weights in an
    # fp32 forward: to bf16 precision, 8 mantissa bits).
    config = json.loads((run["dir"] / "hf" / "config.json").read_text())
    assert config["model_type"] == "bloom" and config["n_layer"] == 4 and config["tie_word_embeddings"]
    logged = run["eval"][0]["val_loss"]
    assert abs(exported_val_loss(run) - logged) <= 2e-2 * logged


def run_resume_export(tmp_path, user: list[str], steps: int, resume_at: int, *extra: str) -> dict:
    """`launcher train <user's overrides>` with only the run length, checkpoints, logging and where files go added:
    trains `steps` steps, its export gives the run's own held-out loss (1e-5), and a run resumed from step
    `resume_at` follows it exactly (loss and grad norm, 1e-6). Returns the first run."""
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    where = [f"train.steps={steps}", f"checkpoint.save_every={resume_at}", "logging.log_every=1", *extra,
             f"runs_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}", "logging.progress_bar=false"]
    run = train(user + where + ["run_name=issue"], ext)
    assert [r["step"] for r in run["train"]] == list(range(1, steps + 1))
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in run["train"])
    logged = run["eval"][-1]["val_loss"]
    assert abs(exported_val_loss(run) - logged) <= 1e-5 * logged
    resumed = train(user + where + ["run_name=issue-resumed",
                                    f"resume={run['dir'] / 'checkpoints' / f'step_{resume_at:08d}'}"], ext)
    assert [r["step"] for r in resumed["train"]] == list(range(resume_at + 1, steps + 1))
    assert_follows(resumed["train"], run["train"][resume_at:], tol=1e-6)
    run["deepspeed"] = json.loads((run["dir"] / "deepspeed.json").read_text())
    run["layout"] = resolve_layout(run["cfg"])
    return run


def test_issue_command_tp2_sp_zero2(tmp_path):
    """The issue's command as a user types it, `launcher train recipe=tiny cluster.gpus_per_node=4
    parallel.tensor_degree=2 parallel.sequence_parallel=true`: TP2 + Megatron SP x DP2 under the recipe's ZeRO-2 trains
    (22 steps: the recipe warms up over 20), resumes from its step-11 checkpoint exactly (ZeRO-2 partitions over the 2
    replicas), and exports a transformers model that gives the run's own held-out loss (once refused: DeepSpeed's
    pipeline engine, which ran SP, takes ZeRO 0-1 only)."""
    run = run_resume_export(tmp_path, ["recipe=tiny", "cluster.gpus_per_node=4", "parallel.tensor_degree=2",
                                       "parallel.sequence_parallel=true"], 22, 11)
    assert run["deepspeed"]["zero_optimization"]["stage"] == 2 and "pipeline" not in run["deepspeed"]
    layout = run["layout"]
    assert (layout.tensor_degree, layout.data_degree, layout.sequence_parallel) == (2, 2, True)


def test_issue_command_tp2_zero2(tmp_path):
    """Issue 11's plain TP as a user types it, `launcher train recipe=tiny cluster.gpus_per_node=2
    parallel.tensor_degree=2`: our TP layers on the plain engine under the recipe's ZeRO-2 (AutoTP ran it before,
    every rank building the whole model) trains 22 steps, resumes from step 11 exactly and exports a transformers
    model that gives the run's own held-out loss."""
    run = run_resume_export(tmp_path, ["recipe=tiny", "cluster.gpus_per_node=2", "parallel.tensor_degree=2"], 22, 11)
    ds, layout = run["deepspeed"], run["layout"]
    assert ds["zero_optimization"]["stage"] == 2 and "tensor_parallel" not in ds and "pipeline" not in ds
    assert (layout.tensor_degree, layout.data_degree, layout.pipeline_layers) == (2, 1, True)


def test_issue_command_cp2_tp2(tmp_path):
    """The issue's third command as a user types it, `launcher train recipe=tiny cluster.gpus_per_node=4
    parallel.context_degree=2 parallel.tensor_degree=2`: ring-attention CP2 x TP2 (our TP layers on the plain engine,
    every TP rank ringing its own heads) under the recipe's ZeRO-2 trains 22 steps, resumes from step 11 exactly and
    exports (once refused before start: TP without a pipeline was AutoTP only, whose groups and DeepSpeed's
    sequence-parallel groups cannot both be laid out). Its equality to one rank, loss and gradient norm, is
    tests/parallel/test_context_parallel.py's."""
    run = run_resume_export(tmp_path, ["recipe=tiny", "cluster.gpus_per_node=4", "parallel.context_degree=2",
                                       "parallel.tensor_degree=2"], 22, 11)
    ds, layout = run["deepspeed"], run["layout"]
    assert ds["zero_optimization"]["stage"] == 2 and ds["sequence_parallel_size"] == 2 and "tensor_parallel" not in ds
    assert (layout.context_degree, layout.tensor_degree, layout.data_degree, layout.pipeline_layers) == (2, 2, 1, True)


def test_cp2_pp2_trains_resumes_exports(tmp_path):
    """Ring-attention CP inside a pipeline, as a user types it: `launcher train recipe=tiny cluster.gpus_per_node=4
    parallel.context_degree=2 parallel.pipeline_degree=2 parallel.zero_stage=1` (the recipe's ZeRO-2 is refused with
    a pipeline): 8 steps on DeepSpeed's pipeline engine, a resume from step 4 exact, and the export. Its equality to
    one rank is tests/parallel/test_context_parallel.py's."""
    run = run_resume_export(tmp_path, ["recipe=tiny", "cluster.gpus_per_node=4", "parallel.context_degree=2",
                                       "parallel.pipeline_degree=2", "parallel.zero_stage=1"], 8, 4,
                            "scheduler.warmup_steps=2")
    # DeepSpeed's pipeline engine checks the batch against its grid's data axis, the DP x CP ranks.
    ds = run["deepspeed"]
    assert "pipeline" in ds and ds["train_batch_size"] == run["cfg"].batch.global_batch_size * 2
    assert run["train"][-1]["loss"] < run["train"][0]["loss"]
