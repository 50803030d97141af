"""Loop overhead and data benchmarks of `launcher train` (issue 3). Results: bench/results/train_overhead.json.

    PYTHONPATH=$PWD .venv/bin/python bench/train_overhead.py [--steps 60] [--repeats 2]

1. tokens/s of `launcher train recipe=tiny` against bench/minimal_ds_loop.py and against HF Trainer
   (bench/hf_trainer_loop.py; same model, DeepSpeed JSON, data and batch; 2 CPU ranks), launched
   alternately A B C A B C so load from other processes hits all alike. Needs `pip install -e '.[bench]'`.
   Step times are medians over the steps after the first 10 (warm-up).
2. data wait as a fraction of step time, from launcher train's own metrics.jsonl.
3. pretokenization: BPE training time and encoding tokens/s on a fresh cache (data.max_bytes of the stdlib).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def env():
    e = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return e


def run_launcher(overrides, runs_dir, name):
    subprocess.run([sys.executable, "-m", "launcher", "train", *overrides, f"runs_dir={runs_dir}", f"run_name={name}"],
                   cwd=REPO, env=env(), check=True, capture_output=True, text=True)
    recs = [json.loads(x) for x in (Path(runs_dir) / name / "metrics.jsonl").read_text().splitlines() if x]
    return [r for r in recs if r["kind"] == "train"]


def run_baseline(script, overrides, out):
    """bench/minimal_ds_loop.py or bench/hf_trainer_loop.py on 2 CPU ranks; their per-step wall times."""
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    str(REPO / "bench" / script), str(out), *overrides],
                   cwd=REPO, env=env(), check=True, capture_output=True, text=True)
    return json.loads(Path(out).read_text())["step_times"]


def pretokenize_bench(max_bytes):
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.runtime import data

    with tempfile.TemporaryDirectory() as cache:
        cfg = compose(["recipe=tiny", f"data.max_bytes={max_bytes}", f"data.cache_dir={cache}"])
        layout = resolve_layout(cfg)
        t0 = time.perf_counter()
        docs = data.read_documents(cfg)
        t_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        prepared = data.prepare_data(cfg, layout)  # trains the BPE and pretokenizes
        t_total = time.perf_counter() - t0
        t0 = time.perf_counter()
        tok = data.train_tokenizer(docs, cfg.model.vocab_size)
        t_bpe = time.perf_counter() - t0
    return {"corpus_bytes": sum(len(t.encode()) for _, t in docs), "documents": len(docs), "tokens": prepared.num_tokens,
            "read_s": t_read, "bpe_train_s": t_bpe, "prepare_total_s": t_total,
            "pretokenize_tokens_per_s": prepared.num_tokens / max(1e-9, t_total - t_bpe - t_read)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pretok-bytes", type=int, default=8_000_000)
    args = ap.parse_args()
    overrides = ["recipe=tiny", f"train.steps={args.steps}", "train.eval_every=0", "checkpoint.save_every=0",
                 "checkpoint.export_hf=false", "logging.log_every=1", "logging.progress_bar=false"]
    launcher_times, minimal_times, trainer_times, wait_fracs, per_run = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            recs = run_launcher(overrides, tmp, f"bench{i}")[10:]
            launcher_times += [r["step_time_s"] for r in recs]
            wait_fracs.append(sum(r["data_wait_s"] for r in recs) / sum(r["step_time_s"] for r in recs))
            mins = run_baseline("minimal_ds_loop.py", overrides, Path(tmp) / f"minimal{i}.json")[10:]
            minimal_times += mins
            hf = run_baseline("hf_trainer_loop.py", overrides, Path(tmp) / f"hf{i}.json")[10:]
            trainer_times += hf
            per_run.append({"launcher_median_step_s": statistics.median(r["step_time_s"] for r in recs),
                            "minimal_median_step_s": statistics.median(mins),
                            "hf_trainer_median_step_s": statistics.median(hf)})
    tokens_per_step = 16 * 128
    lt, mt, ht = (statistics.median(t) for t in (launcher_times, minimal_times, trainer_times))
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "note": "2-core shared VM, other jobs running; no GPU"},
        "config": "recipe=tiny (1.33M params LLaMA, ZeRO-2, fp32, 2 CPU ranks gloo, 16 x 128 tokens/step)",
        "steps_per_run": args.steps, "runs_each": args.repeats,
        "launcher_train": {"median_step_s": lt, "tokens_per_s": tokens_per_step / lt},
        "minimal_deepspeed_loop": {"median_step_s": mt, "tokens_per_s": tokens_per_step / mt},
        "hf_trainer": {"median_step_s": ht, "tokens_per_s": tokens_per_step / ht},
        "launcher_vs_minimal": mt / lt,
        "launcher_vs_hf_trainer": ht / lt,
        "per_run_medians": per_run,
        "data_wait_fraction": max(wait_fracs),
        "pretokenization": pretokenize_bench(args.pretok_bytes),
    }
    out = REPO / "bench/results/train_overhead.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
