"""Shared settings of the training tests: a very small model and corpus so each 2-rank launch takes seconds."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

# A 2-layer LLaMA of width 32 on a 300 kB prefix of the stdlib; fp32; 8 sequences of 32 tokens per step.
MODEL = ["model.hidden_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2", "model.num_key_value_heads=2",
         "model.intermediate_size=64", "model.vocab_size=320", "model.max_position_embeddings=64"]


def base_overrides(cache_dir, steps: int = 6) -> list[str]:
    return ["recipe=tiny", *MODEL, "data.seq_length=32", "data.max_bytes=300000", f"data.cache_dir={cache_dir}",
            "batch.global_batch_size=8", "batch.micro_batch_size=4", f"train.steps={steps}", "train.eval_every=0", "scheduler.warmup_steps=2",
            "logging.log_every=1", "logging.progress_bar=false", "checkpoint.export_hf=false"]


def child_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def launcher(args, timeout=600, **env):
    """`python -m launcher ARGS` as a user runs it (it starts torchrun itself)."""
    return subprocess.run([PYTHON, "-m", "launcher", *args], cwd=REPO, env=child_env(**env), capture_output=True,
                          text=True, timeout=timeout)
