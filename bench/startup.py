"""Start-up and exit of a short `launcher train` run, with and without the Muon stand-ins that DeepSpeed's ZeRO code
gets (launcher/lean_imports.py). Results: bench/results/startup.json.

    PYTHONPATH=$PWD .venv/bin/python bench/startup.py [--pairs 4] [--ranks 2]

Each pair runs the same 4-step ZeRO-1 run of a 2-layer width-32 LLaMA (fp32, 2 CPU ranks, a checkpoint at steps 2
and 4) twice, in alternating order: as `launcher train` runs it ("stand-ins"), and with the real Muon module
imported first in every rank by a sitecustomize on PYTHONPATH ("deepspeed's import"), which is what every rank did
before: the sitecustomize is not DeepSpeed's code, so it gets the real module, and DeepSpeed then finds it loaded.
Reported per run: the command's wall time (the number to compare: the real import happens before the run's own
clock starts in the second kind, inside it in the first), the run's own wall time from its summary, and the largest
rank's peak resident memory.
The loop itself runs in ~0.3 s; the rest is start-up and exit.
"""

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "startup.json"
RUN = ["recipe=tiny", "model.hidden_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2",
       "model.num_key_value_heads=2", "model.intermediate_size=64", "model.vocab_size=320",
       "model.max_position_embeddings=64", "precision=fp32", "scheduler.warmup_steps=1", "cluster=cpu",
       "data.seq_length=32", "data.max_bytes=300000", "batch.global_batch_size=8", "batch.micro_batch_size=2",
       "logging.log_every=1", "logging.progress_bar=false", "checkpoint.export_hf=false", "checkpoint.save_every=2",
       "train.steps=4", "train.eval_every=0", "parallel.zero_stage=1"]
# `launcher` first, as a rank imports it before DeepSpeed (launcher/lean_imports.py keeps MLflow out then).
REAL_MUON = """import os
if os.environ.get("RANK") is not None:
    import launcher  # noqa: F401
    import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401 -- as every rank imported it before the stand-ins
"""


def one(tmp: Path, name: str, ranks: int, real_muon: Path | None) -> dict:
    env_path = f"{real_muon}:{REPO}" if real_muon else str(REPO)
    cmd = [sys.executable, "-m", "launcher", "train", *RUN, f"cluster.gpus_per_node={ranks}",
           f"data.cache_dir={tmp / 'cache'}", f"runs_dir={tmp}", f"run_name={name}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_path, "HOME": str(tmp)},
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp / name / "summary.json").read_text())
    last = [json.loads(x) for x in (tmp / name / "metrics.jsonl").read_text().splitlines()][-1]
    return {"command_s": round(wall, 2), "run_wall_s": round(summary["wall_time_s"], 2),
            "peak_rss_mib": round(last["peak_memory_bytes"] / 2**20)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    runs: dict = {"stand-ins": [], "deepspeed's import": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "real_muon").mkdir()
        (tmp / "real_muon" / "sitecustomize.py").write_text(REAL_MUON)
        one(tmp, "warm-up", args.ranks, None)   # the tokenizer and token cache, once
        for i in range(args.pairs):
            order = [("stand-ins", None), ("deepspeed's import", tmp / "real_muon")]
            for kind, site in (order if i % 2 == 0 else order[::-1]):
                runs[kind].append(one(tmp, f"{'a' if site is None else 'b'}{i}", args.ranks, site))
    med = {kind: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for kind, rs in runs.items()}
    result = {"machine": f"{platform.machine()}, {platform.platform()}, Python {platform.python_version()}",
              "ranks": args.ranks, "pairs": args.pairs, "runs": runs, "median": med}
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(med, indent=1))


if __name__ == "__main__":
    main()
