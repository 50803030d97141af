"""data.document_mask through `launcher train` as a user runs it: 2 CPU ranks (ZeRO-1; TP 2) equal 1 rank.

A corpus of short documents (2-15 words, written here) packed into 32-token windows, so most windows hold
several documents and the mask acts on every step. The 2-rank ZeRO-1 run (micro 4 x dp 2) and the 1-rank run
(micro 8) see the same 8 samples per step; their losses, gradient norms (which show a gradient-scale error that
AdamW would hide from the losses) and held-out losses agree within 1e-5. The same 2-rank run without the mask
trains on the same samples with different numbers: the option reaches the model. TP 2 runs our TP layers
(launcher/parallel/tensor_model.py), which take the position ids and build transformers' mask in their embedding.
"""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.runtime.data import TokenBatches, prepare_data
from train_helpers import base_overrides, launcher

pytestmark = pytest.mark.slow
STEPS = 6
WORDS = ("the a of pack window token mask document model train loss rank step batch data read write "
         "attention position layer norm head cache file shard stage pipe grad sum mean").split()


def records(run_dir: Path, kind: str) -> list[dict]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return [r for r in recs if r["kind"] == kind]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docmask")
    rng = random.Random(0)
    corpus = tmp / "docs.jsonl"
    with corpus.open("w") as fh:
        for _ in range(3000):
            fh.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 15)))}) + "\n")
    common = [*base_overrides(tmp / "cache", STEPS), "data=hf", f"data.paths=[{corpus}]", "data.max_bytes=null",
              "parallel.zero_stage=1", "train.eval_every=3", "train.eval_batches=2", f"runs_dir={tmp / 'runs'}"]
    cases = {"one": ["data.document_mask=true", "cluster.gpus_per_node=1", "batch.micro_batch_size=8"],
             "two": ["data.document_mask=true", "cluster.gpus_per_node=2", "batch.micro_batch_size=4"],
             "two_unmasked": ["cluster.gpus_per_node=2", "batch.micro_batch_size=4"],
             "tp2": ["data.document_mask=true", "cluster.gpus_per_node=2", "parallel.tensor_degree=2",
                     "batch.micro_batch_size=8"],
             # The position ids and the mask pass through torch's checkpoint around every block.
             "tp2ac": ["data.document_mask=true", "cluster.gpus_per_node=2", "parallel.tensor_degree=2",
                       "batch.micro_batch_size=8", "model.activation_checkpointing=true"]}
    out = {}
    ext = tmp / "torch_extensions"
    ext.mkdir()
    for name, extra in cases.items():
        result = launcher(["train", *common, *extra, f"run_name={name}"], OMP_NUM_THREADS=1, TORCH_EXTENSIONS_DIR=ext)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        out[name] = tmp / "runs" / name
    assert list(ext.iterdir()) == [], "a CPU run JIT-compiled a DeepSpeed op"
    cfg = compose(common + cases["one"])
    return out, cfg


def test_windows_hold_several_documents(runs):
    """The fixture exercises the mask: most training windows contain an EOS that is not their last token."""
    _, cfg = runs
    layout = resolve_layout(cfg)
    prepared = prepare_data(cfg, layout)
    batches = TokenBatches(prepared, layout, seed=cfg.train.seed, dp_rank=0)
    rows = batches.batch(sum((batches.train_sample_ids(s, 0) for s in range(STEPS)), [])).numpy()
    inner_eos = (rows[:, :-1] == prepared.eos_id).any(axis=1)
    assert prepared.eos_id >= 0 and inner_eos.mean() > 0.9, inner_eos.mean()


@pytest.mark.parametrize("name", ["tp2", "tp2ac"])
def test_tensor_parallel_equals_one_rank(runs, name):
    """TP 2 without a pipeline (our TP layers on the plain engine, no AutoTP) with the mask: the same losses,
    gradient norms and held-out losses as 1 rank (the unmasked run is > 1e-4 off: test_two_ranks_zero1_equal_one_rank)."""
    dirs, _ = runs
    one, tp = records(dirs["one"], "train"), records(dirs[name], "train")
    assert len(tp) == STEPS
    ds = json.loads((dirs[name] / "deepspeed.json").read_text())
    assert "tensor_parallel" not in ds and ds["train_batch_size"] == 8, ds
    print("TP2: max |loss diff|", max(abs(a["step_loss"] - b["step_loss"]) for a, b in zip(one, tp)),
          "max grad-norm rel diff", max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(one, tp)))
    for a, b in zip(one, tp):
        assert abs(a["step_loss"] - b["step_loss"]) < 1e-5, (a["step_loss"], b["step_loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * b["grad_norm"], (a["grad_norm"], b["grad_norm"])
    val_one, val_tp = (records(dirs[n], "eval") for n in ("one", name))
    assert np.allclose([r["val_loss"] for r in val_one], [r["val_loss"] for r in val_tp], rtol=0, atol=1e-5)


def test_two_ranks_zero1_equal_one_rank(runs):
    dirs, _ = runs
    one, two, unmasked = (records(dirs[n], "train") for n in ("one", "two", "two_unmasked"))
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, STEPS + 1))
    print("max |loss diff|", max(abs(a["step_loss"] - b["step_loss"]) for a, b in zip(one, two)),
          "max grad-norm rel diff", max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(one, two)),
          "first loss masked/unmasked", two[0]["step_loss"], unmasked[0]["step_loss"])
    for a, b in zip(one, two):
        assert abs(a["step_loss"] - b["step_loss"]) < 1e-5, (a["step_loss"], b["step_loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * b["grad_norm"], (a["grad_norm"], b["grad_norm"])
    val_one, val_two = (records(dirs[n], "eval") for n in ("one", "two"))
    assert [r["step"] for r in val_one] == [3, 6]
    assert np.allclose([r["val_loss"] for r in val_one], [r["val_loss"] for r in val_two], rtol=0, atol=1e-5)
    # The mask changes the computation: the unmasked run's very first loss (same weights, same samples) differs.
    assert abs(two[0]["step_loss"] - unmasked[0]["step_loss"]) > 1e-4, (two[0]["step_loss"], unmasked[0]["step_loss"])
    assert one[-1]["step_loss"] < one[0]["step_loss"]  # and it trains
