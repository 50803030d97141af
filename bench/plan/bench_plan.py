"""Planner benchmark: --search wall time, and predicted vs published TFLOP/s per GPU.

    PYTHONPATH=$PWD python bench/plan/bench_plan.py      # writes bench/plan/results.{json,md}

Search time: search_layouts(cfg) on an already composed config, median of 5 (composition is timed
apart: it is the same for `launcher plan` with or without --search).
Published runs (sources in PUBLISHED): Narayanan et al. 2021 Table 1 (all rows: A100, seq 2048, vocab
51,200, full recompute, micro batch 1 assumed: the table does not give it), BLOOM-176B (BigScience 2022,
~150 TFLOP/s per A100 hardware FLOPs, Megatron-DeepSpeed logs), LLaMA-65B (Touvron et al. 2023, 380
tokens/s/GPU; their TP/PP are unpublished, our recipe's layout is used). The 1T row of Table 1 was the
calibration point of the old single compute efficiency; the per-operator model (launcher/plan/steptime.py)
with the built-in, cited profiles fits nothing to it (the `calibration` column is kept for comparison).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from types import SimpleNamespace as NS

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.plan.steptime import estimate_step_time
from launcher.plan.inputs import Hardware, Strategy, model_shape, resolve_hardware, strategy
from launcher.plan.search import search_layouts

OUT = Path(__file__).parent

# Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", Table 1:
# (params B, heads, hidden, layers, TP, PP, GPUs, batch, published TFLOP/s per GPU)
MEGATRON_TABLE_1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]


def time_search(overrides: list[str], repeats: int = 5) -> dict:
    cfg = compose(overrides)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ranked, counts = search_layouts(cfg)
        times.append(time.perf_counter() - t0)
    world = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    return {"overrides": overrides, "world_size": world, "median_s": statistics.median(times), "runs_s": times,
            "counts": counts, "best": ranked[0].strategy.__dict__ if ranked else None}


def megatron_rows() -> list[dict]:
    rows = []
    for p, heads, h, layers, tp, pp, gpus, batch, published in MEGATRON_TABLE_1:
        m = NS(arch="gpt", hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=None,
               intermediate_size=None, vocab_size=51200, max_position_embeddings=2048, tie_word_embeddings=True)
        dp = gpus // (tp * pp)
        st = Strategy(tensor_degree=tp, pipeline_degree=pp, sequence_degree=1, data_degree=dp, zero_stage=1,
                      micro_batch_size=1, grad_accum_steps=batch // dp, global_batch_size=batch, seq_length=2048,
                      padded_vocab_size=51200, gpus_per_node=8, dtype="fp16", grad_accum_fp32=False, recompute="full")
        spec = resolve_hardware(NS(gpu="a100-80gb", peak_tflops=None, memory_gb=None, intra_node_gbps=None,
                                   inter_node_gbps=None), "fp16")
        t = estimate_step_time(model_shape(m), st, spec)
        rows.append({"run": f"Megatron Table 1, {p}B (TP{tp} PP{pp}, {gpus} GPUs)", "metric": "hardware TFLOP/s per GPU",
                     "published": published, "predicted": round(t.hardware_tflops_per_gpu, 1),
                     "calibration": p == 1008.0,
                     "source": "Narayanan et al. 2021, Table 1"})
    return rows


def recipe_row(recipe: str, metric: str, published: float, source: str) -> dict:
    cfg = compose([f"recipe={recipe}"])
    layout = resolve_layout(cfg)
    hw = resolve_hardware(cfg.cluster, layout.dtype)
    t = estimate_step_time(model_shape(cfg.model), strategy(cfg, layout), hw)
    value = {"hardware TFLOP/s per GPU": t.hardware_tflops_per_gpu,
             "tokens/s per GPU": t.tokens_per_s / layout.world_size}[metric]
    return {"run": f"recipe {recipe}", "metric": metric, "published": published, "predicted": round(value, 1),
            "calibration": False, "source": source}


# Llama 3 405B (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3: 126 layers, 16,384 hidden, 128 heads,
# 8 KV heads, FFN 53,248, vocab 128,000; Table 4: 16,384 H100, seq 8,192, 16M tokens per step = 2,048 sequences).
LLAMA3_405B_16K = ["model=llama2-70b", "model.hidden_size=16384", "model.num_hidden_layers=126", "model.num_attention_heads=128",
                   "model.num_key_value_heads=8", "model.intermediate_size=53248", "model.vocab_size=128000",
                   "model.max_position_embeddings=8192", "data.seq_length=8192", "batch.global_batch_size=2048",
                   "cluster=h100-80gb", "cluster.nodes=2048", "precision=bf16"]


def main() -> None:
    searches = [time_search(["recipe=bloom-176b"]), time_search(["recipe=llama-65b"]), time_search(LLAMA3_405B_16K)]
    table = megatron_rows() + [
        recipe_row("bloom-176b", "hardware TFLOP/s per GPU", 150.0,
                   "BigScience 2022 (arXiv:2211.05100) section 3.4 / bigscience tr11 logs: ~150 TFLOP/s per A100"),
        recipe_row("llama-65b", "tokens/s per GPU", 380.0, "Touvron et al. 2023, section 2.4: ~380 tokens/s/GPU on 2,048 A100-80GB"),
    ]
    for r in table:
        r["error"] = round(r["predicted"] / r["published"] - 1, 3)
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "note": "2 shared CPU cores, other jobs running at the same time"}
    (OUT / "results.json").write_text(json.dumps({"machine": machine, "search": searches, "published_vs_predicted": table},
                                                 indent=2, default=str) + "\n")
    lines = ["# Planner benchmark", "", f"Machine: {machine['platform']}, Python {machine['python']}, "
             f"{machine['cpus']} CPUs ({machine['note']}). Command: `PYTHONPATH=$PWD python bench/plan/bench_plan.py`.", "",
             "## --search wall time (median of 5, composition excluded)", "", "| config | GPUs | median | enumerated | fit |",
             "|---|---|---|---|---|"]
    for s in searches:
        name = "Llama 3 405B (overrides in LLAMA3_405B_16K)" if s["overrides"] is LLAMA3_405B_16K else " ".join(s["overrides"])
        lines.append(f"| {name} | {s['world_size']} | {s['median_s']:.3f} s | {s['counts']['enumerated']} | {s['counts']['fit']} |")
    lines += ["", "## Predicted vs published", "",
              "| run | metric | published | predicted | error | note | source |", "|---|---|---|---|---|---|---|"]
    for r in table:
        note = "calibration row" if r["calibration"] else "held out"
        lines.append(f"| {r['run']} | {r['metric']} | {r['published']} | {r['predicted']} | {r['error']:+.1%} | {note} | {r['source']} |")
    lines += ["", READING]
    (OUT / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# Written by hand after the run of 2026-11-25 (re-read it when the table is regenerated).
READING = (
    "Reading (2026-11-25). This table had not been regenerated since before the per-operator step-time model "
    "(launcher/plan/steptime.py, merged in 3190e21); the rows committed before today (e.g. the calibration row at "
    "+0.4%) described a model the planner no longer used. Re-run on the committed planner: the Megatron rows are "
    "within 10% from 7.5B to 310B (TP4-TP8, PP1-PP16) and outside it at both ends: +21.2% and +13.7% at 1.7B and "
    "3.6B (TP1-2), -13.6% and -15.6% at 530B and 1T (PP35, "
    "PP64: the deep-pipeline rows, the calibration row among them, are now predicted slow). BLOOM-176B is -13.5% and "
    "LLaMA-65B -48.3% (tokens/s). The published-run 10% target of issue 14 is therefore not met; the --search times "
    "above include the CP x TP (x PP) candidates added for issue 13 (Llama 3 405B: 1,748 candidates, was 1,004 "
    "without them on the same commit, 3.3 s on a loaded box). "
    "Re-run for issue 11 (TP at pipeline_degree 1 runs our TP layers, not DeepSpeed AutoTP: 2 + 2 all-reduces per "
    "block and a replicated full-vocabulary head on every TP rank instead of AutoTP's vocab-sharded head, whose "
    "logits it all-gathered, and its 5 backward all-reduces per LLaMA block; these GPT rows had 2): only the TP-only "
    "rows move, 3.6B +13.7% -> +11.8%, 7.5B +2.5% -> -0.5%, 18.4B +5.8% -> +1.2% (the full head's GEMMs on every "
    "rank); the rest are unchanged. llama-65b's search fits 756 layouts, was 714: the 42 added are TP at one stage "
    "(19 TP, 23 TP + Megatron SP), whose ranks now build only their shards, so they pass the host-memory check "
    "(AutoTP built the whole fp32 model per rank; the TP + SP ones were refused by the search's host-memory memo, "
    "keyed by the grid, which the whole-model verdict of TP alone had filled). "
    "The search times doubled with the box's load (load average ~6 during the run), not with the candidates.")


if __name__ == "__main__":
    main()
