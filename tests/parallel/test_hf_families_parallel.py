"""The llama family from transformers checkpoints through every layout `launcher train` runs (issue 16, part 1).

A Qwen2 checkpoint (q/k/v biases, randomised so they matter) through our TP x PP, our TP without a pipeline (the
plain engine; DeepSpeed AutoTP until issue 11) and Ulysses SP,
and a Llama-3-style checkpoint (`llama3` rope scaling) through a pipeline: each run starts from the same
`model.init_from` directory, trains 3 SGD-like steps (fp32, lr high enough that a wrong gradient shows) and exports;
the losses of every step and the exported model's logits must equal the 1-rank run's (1e-4 relative / 1e-4 abs).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=320, max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6)
ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}
FAMILIES = {
    "qwen2": ("qwen2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, ["model.rope_theta=1000000.0"]),
    "llama3": ("llama", {"rope_parameters": {"rope_theta": 500000.0, **ROPE}},
               ["model.rope_theta=500000.0", "model.rope_scaling={rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, "
                "high_freq_factor: 4.0, original_max_position_embeddings: 64}"]),
}
LAYOUTS = {
    "qwen2": {"tp2pp2": ["cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.pipeline_degree=2"],
              "tp2": ["cluster.gpus_per_node=2", "parallel.tensor_degree=2"],
              "sp2": ["cluster.gpus_per_node=2", "parallel.sequence_degree=2"]},
    "llama3": {"pp2": ["cluster.gpus_per_node=2", "parallel.pipeline_degree=2"]},
}


def save_model(path: Path, arch: str, extra: dict) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(arch, **SHAPE, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn(p.shape) * 0.1)
    model.save_pretrained(path)


def train(tmp: Path, family: str, name: str, extra: list[str]) -> Path:
    arch, _, overrides = FAMILIES[family]
    args = ["recipe=tiny", "cluster=cpu", f"model.arch={arch}", *(f"model.{k}={v}" for k, v in SHAPE.items()), *overrides,
            f"model.init_from={tmp / family}", "precision=fp32", "parallel.zero_stage=1", "optimizer.lr=0.01",
            "scheduler.warmup_steps=1", "data.seq_length=32", "data.max_bytes=300000", f"data.cache_dir={tmp / 'cache'}",
            "batch.global_batch_size=8", "batch.micro_batch_size=2", "train.steps=3", "train.eval_every=0",
            "logging.progress_bar=false", f"runs_dir={tmp / 'runs'}", f"run_name={family}-{name}",
            "checkpoint.export_hf=true", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "launcher", "train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return tmp / "runs" / f"{family}-{name}"


def losses(run: Path) -> list[float]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    return [r["loss"] for r in recs if r["kind"] == "train"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf-parallel")
    out = {}
    for family, (arch, extra, _) in FAMILIES.items():
        save_model(tmp / family, arch, extra)
        out[family, "one"] = train(tmp, family, "one", ["cluster.gpus_per_node=1"])
        for name, layout in LAYOUTS[family].items():
            out[family, name] = train(tmp, family, name, layout)
    return out


@pytest.mark.parametrize("family,name", [(f, n) for f in LAYOUTS for n in LAYOUTS[f]])
def test_layout_trains_and_exports_the_one_rank_model(runs, family, name):
    from transformers import AutoModelForCausalLM

    one, run = runs[family, "one"], runs[family, name]
    assert losses(run) == pytest.approx(losses(one), rel=1e-4)
    ids = torch.randint(0, 320, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(one / "hf")(input_ids=ids).logits
        b = AutoModelForCausalLM.from_pretrained(run / "hf")(input_ids=ids).logits
    print(f"{family} {name}: losses {losses(run)} vs {losses(one)}; exported logits max |diff| {(a - b).abs().max():.3g}")
    assert (a - b).abs().max() <= 1e-4
    # The training moved the weights (else equal logits would prove nothing about the gradients).
    start = AutoModelForCausalLM.from_pretrained(run.parent.parent / family)
    with torch.no_grad():
        assert (start(input_ids=ids).logits - b).abs().max() > 1e-3
