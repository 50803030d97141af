"""Step time of each 3D layout on CPU ranks relative to one rank: the communication overhead the layouts add.

    PYTHONPATH=$PWD python bench/parallel/bench_parallel.py     # ~4 min on 2 cores; writes results.json / results.md

Every layout trains the same model on the same global batch (8 sequences of 128 tokens, micro-batch 1, fp32,
ZeRO-1 wherever there is DP); one torchrun launch per layout (bench/parallel/worker.py), 2 warm-up steps, then
the median of 6 timed optimizer steps (a barrier before and after each). On CPU ranks the ranks also share
the cores, so this measures overhead under contention, not speed-up: see the machine note in results.md.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
MODEL = ["model=tiny", "model.hidden_size=256", "model.num_attention_heads=8", "model.num_key_value_heads=8",
         "model.num_hidden_layers=4", "model.intermediate_size=688", "model.vocab_size=1024",
         "model.max_position_embeddings=128", "data.seq_length=128", "cluster=cpu", "precision=fp32",
         "batch.micro_batch_size=1", "batch.global_batch_size=8", "parallel.zero_stage=1"]
TP, PP, SP = "parallel.tensor_degree=2", "parallel.pipeline_degree=2", "parallel.sequence_degree=2"
LAYOUTS = {"1 rank": (1, []), "tp2": (2, [TP]), "pp2": (2, [PP]), "sp2": (2, [SP]), "pp2 x dp2": (4, [PP]),
           "tp2 x dp2": (4, [TP]), "tp2 x pp2": (4, [TP, PP]), "tp2 x pp2 x dp2": (8, [TP, PP])}


def run(name: str, nproc: int, args: list[str], tmp: Path) -> dict:
    """One torchrun launch of worker.py with `args` (overrides, and --activations): its result record."""
    out = tmp / f"{''.join(c for c in name if c.isalnum())}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(tmp / "ext")}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.run([torchrun, "--nproc_per_node", str(nproc), "--master_port", "29711",
                           str(REPO / "bench/parallel/worker.py"), str(out), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(out.read_text())


def main() -> None:
    import torch

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (nproc, extra) in LAYOUTS.items():
            results[name] = run(name, nproc, MODEL + extra, Path(tmp))
            print(f"{name:>16}: {results[name]['median_s'] * 1e3:7.0f} ms", flush=True)
    base = results["1 rank"]["median_s"]
    for r in results.values():
        r["relative_to_1_rank"] = r["median_s"] / base
    machine = {"cpu_cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               "torch": torch.__version__, "deepspeed": __import__("deepspeed").__version__,
               "note": "CPU ranks over gloo; all ranks of a layout share these cores (8 ranks on 2 cores are 4x "
                       "oversubscribed), and other processes may have shared the cores during the run"}
    save({"model": MODEL, "machine": machine, "results": results})


def save(part: dict) -> None:
    """Replace this script's keys of results.json (bench_long_context.py keeps its own under "long_context") and
    re-render results.md from the whole file."""
    path = HERE / "results.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.update(part)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    write_markdown(doc)


def write_markdown(doc: dict) -> None:
    machine, results = doc["machine"], doc["results"]
    lines = ["# 3D layouts: step time relative to one rank (CPU ranks, gloo)", "",
             f"Machine: {machine['cpu_cores']} CPU cores, {machine['platform']}, Python {machine['python']}, "
             f"torch {machine['torch']}, DeepSpeed {machine['deepspeed']}. {machine['note']}.", "",
             "Model: LLaMA-style, hidden 256, 8 heads, 4 layers, MLP 688, vocab 1024; 8 sequences x 128 tokens per "
             "step, micro-batch 1, fp32, ZeRO-1 where there is DP. Median of 6 steps after 2 warm-up steps. "
             "Command: `PYTHONPATH=$PWD python bench/parallel/bench_parallel.py`.", "",
             "| layout | ranks | accum (micro-batches) | median step (ms) | x 1 rank |", "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['world']} | {r['accum']} | {r['median_s'] * 1e3:.0f} | {r['relative_to_1_rank']:.2f} |")
    lines += ["", "How to read it: every rank runs one torch thread, so the 1-rank run uses one of the 2 cores while any "
              "2-rank layout uses both; that is why pp2 and pp2 x dp2 come out below 1.0 (two stages / replicas compute "
              "at once). 4 and 8 ranks share the same 2 cores (2x and 4x oversubscribed), so beyond 2 ranks nothing "
              "can get faster here. tp2 and tp2 x dp2 run DeepSpeed AutoTP, "
              "tp2 x pp2 (x dp2) our Megatron layers in the pipeline; both pay two all-reduces per block forward and "
              "two backward over gloo (TP2 costs about 2x one rank); SP2 pays four all-to-alls (q, k, v, output) per "
              "block forward and four backward; the pipeline pays its "
              "bubble (p-1)/m = 1/8 for pp2 with 8 micro-batches, 1/4 with DP2. The ratios are CPU/gloo overhead under "
              "contention, not a prediction of GPU speed-up (`launcher plan` models that)."]
    if "long_context" in doc:
        from bench_long_context import markdown_lines

        lines += [""] + markdown_lines(doc["long_context"])
    (HERE / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown-only"]:  # re-render results.md from the recorded results.json
        write_markdown(json.loads((HERE / "results.json").read_text()))
    else:
        main()
