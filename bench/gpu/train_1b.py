"""A ~1B LLaMA, bf16, seq 2048, ZeRO-1 on every local GPU with `launcher train`, held against `launcher plan`.

    python bench/gpu/train_1b.py --out DIR [--steps 40] [--tag NAME KEY=VALUE ...]   # a variant: the overrides
                                                                                   # replace the base ones

Model: hidden 2048, 16 layers, 16 heads, FFN 5632, vocab 32000 = 953,223,168 parameters (`launcher plan`).
Data: data=stdlib (the Python standard library's source, on every machine with Python: no download), 20 MB.
Batch: micro 4 x 2 accumulation steps per GPU. Writes train-1b.json: the plan's step time, tokens/s, MFU and
peak memory per GPU beside the measured ones (median over the logged steps after the first 10, which carry
the warm-up: allocator growth, cuDNN/cuBLAS heuristics), and the run's last log lines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WARMUP_STEPS = 10


def overrides(gpu: str, n_gpus: int, steps: int, runs_dir: str) -> list[str]:
    return ["model=tiny", "model.hidden_size=2048", "model.num_hidden_layers=16", "model.num_attention_heads=16",
            "model.num_key_value_heads=16", "model.intermediate_size=5632", "model.vocab_size=32000",
            "model.max_position_embeddings=2048", "data=stdlib", "data.seq_length=2048", "data.max_bytes=20000000",
            "precision=bf16", f"cluster={gpu}", "cluster.nodes=1", f"cluster.gpus_per_node={n_gpus}",
            "parallel.zero_stage=1", "batch.micro_batch_size=4", f"batch.global_batch_size={8 * n_gpus}",
            f"train.steps={steps}", "train.eval_every=0", "scheduler.warmup_steps=4", "logging.log_every=1",
            "logging.progress_bar=false", "checkpoint.save_every=0", "checkpoint.keep_last=1", "checkpoint.export_hf=false",
            "run_name=gpu-pack-1b", f"runs_dir={runs_dir}"]


def launcher(*args: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--tag", default="", help="a variant's name: train-1b-NAME.json, train-1b-NAME-metrics.jsonl")
    ap.add_argument("changes", nargs="*", help="overrides replacing (or adding to) the base run's")
    ap.add_argument("--timeout", type=int, default=540, help="seconds for `launcher train` (a device call runs 600 s "
                    "at most); the steps logged before a timeout are still read")
    args = ap.parse_args()
    out = Path(args.out)
    env = json.loads((out / "env.json").read_text())
    gpu, n = env["launcher_gpu"], env["gpus"]
    runs_dir = "/tmp/gpu-pack-runs"  # the end-of-run checkpoint (~15 GB) stays off $OUT
    shutil.rmtree(runs_dir, ignore_errors=True)
    changed = {c.split("=", 1)[0] for c in args.changes}
    over = [o for o in overrides(gpu, n, args.steps, runs_dir) if o.split("=", 1)[0] not in changed] + args.changes
    suffix = f"-{args.tag}" if args.tag else ""
    result: dict = {"overrides": over}

    plan = launcher("plan", *over, "--json", timeout=300)
    if plan.returncode:
        result["plan_error"] = plan.stderr[-3000:]
    else:
        p = json.loads(plan.stdout)
        result["plan"] = {k: p[k] for k in ("params_total", "world_size", "step_time_s", "tokens_per_s", "mfu",
                                            "tflops_per_gpu", "memory_per_gpu_bytes", "profile", "peak_tflops")}

    try:
        train = launcher("train", *over, timeout=args.timeout)
        result["train_returncode"], log = train.returncode, train.stdout + train.stderr
    except subprocess.TimeoutExpired as exc:  # e.g. in the end-of-run checkpoint (~15 GB): the step records are written
        result["train_returncode"] = f"killed after {args.timeout} s"
        log = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (exc.stdout, exc.stderr))
    result["train_log_tail"] = log[-6000:]
    metrics = Path(runs_dir) / "gpu-pack-1b" / "metrics.jsonl"
    if metrics.exists():
        recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        shutil.copy(metrics, out / f"train-1b{suffix}-metrics.jsonl")
        steady = [r for r in recs if r.get("kind") == "train" and r.get("step", 0) > WARMUP_STEPS]
        if steady:
            med = lambda key: statistics.median(r[key] for r in steady if r.get(key) is not None)  # noqa: E731
            result["measured"] = {"steps": len(steady), "step_time_s": med("step_time_s"), "tokens_per_s": med("tokens_per_s"),
                                  "mfu": med("mfu"), "peak_memory_bytes": max(r["peak_memory_bytes"] for r in steady)}
    if "plan" in result and "measured" in result:
        pl, me = result["plan"], result["measured"]
        result["predicted_over_measured"] = {
            "step_time": pl["step_time_s"] / me["step_time_s"], "tokens_per_s": pl["tokens_per_s"] / me["tokens_per_s"],
            "peak_memory": pl["memory_per_gpu_bytes"]["total"] / me["peak_memory_bytes"]}
    (out / f"train-1b{suffix}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("train_log_tail", "overrides")}, indent=1))
    if result["train_returncode"] != 0:
        print(result["train_log_tail"][-3000:])
    return 0 if result["train_returncode"] == 0 and "measured" in result else 1


if __name__ == "__main__":
    sys.exit(main())
