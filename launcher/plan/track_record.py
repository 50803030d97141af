"""How far the step-time model has been from published measurements, for the runs most like a plan's layout.

`launcher plan` predicts a step time from the built-in GPU profiles; before anyone sizes a cluster on it, they
should see how that prediction has fared. bench/published/compare.py holds the model to every published run it
can express (bench/published/runs.yaml, with sources) and writes one line per run to track_record.json beside
this file: the run's GPU, ZeRO stage, TP, PP, sequence length and attention kernel, and the model's error
(predicted / measured tokens per second - 1; + means the model was too fast), charging the launcher's runtime (with TP, its
vocabulary-parallel embedding, head and loss, as Megatron's) and, beside it, charging the run's own element-wise
and attention kernels (compare.py's second view). tests/plan/test_track_record.py
regenerates it and fails when it is stale, so the record always describes the model as it is.

`similar` picks the published runs most like a layout (of a model within 2x of a published run's width), by what shapes the model's error most: the same ZeRO
class (3 or not: ZeRO-3's per-module gathers), the same pipeline use, the same tensor-parallel use, then the
same GPU and a sequence length within a factor of 2. Where fewer than MIN_RUNS match, the last criterion is
dropped, then the one before (a TP x PP layout on H100 is compared with the TP x PP runs on A100, and says
"any GPU"). A profile that is not a built-in (a calibrated file, cluster.* rate overrides), fp32, a GPU
with no published run at all (h200's profile is measured, not the datasheet one the runs hold) or a model far
narrower or wider than any published one (recipe=tiny's 128) has no record: that is said, not guessed.

No torch here (`launcher plan` runs on a laptop).
"""

from __future__ import annotations

import json
import statistics
from functools import lru_cache
from pathlib import Path
from typing import Optional

PATH = Path(__file__).with_name("track_record.json")
MIN_RUNS = 5
# runs.yaml's attention_kernel, where a run's was not the launcher's (torch SDPA: FlashAttention-2 on A100/H100).
KERNEL_NAMES = {"triton": "MosaicML's Triton FlashAttention",
                "megatron_unfused": "Megatron's unfused attention, scores in memory"}


@lru_cache(maxsize=1)
def load() -> dict:
    return json.loads(PATH.read_text())


def _summary(errors: list[float]) -> dict:
    a = [abs(e) for e in errors]
    return {"runs": len(errors), "median_abs_error": statistics.median(a), "min_error": min(errors),
            "max_error": max(errors), "within_10pct": sum(x <= 0.10 for x in a) / len(a),
            "within_20pct": sum(x <= 0.20 for x in a) / len(a)}


def no_match(gpu: str, hidden_size: int, runs: Optional[list] = None) -> str:
    """Why no published run speaks for this plan ("" where some do): none used its GPU, or none trained a model
    within 2x of its width (GEMM sizes and the share of per-kernel costs change with the width)."""
    runs = load()["runs"] if runs is None else runs
    if not any(r["gpu"] == gpu for r in runs):
        return f"no published run on {gpu} (bench/published/runs.yaml)"
    widths = [r["hidden"] for r in runs]
    if not any(hidden_size / 2 <= w <= hidden_size * 2 for w in widths):
        return (f"no published run of a model this wide: hidden_size {hidden_size:,}, the published runs "
                f"{min(widths):,}-{max(widths):,} (GEMM sizes and per-kernel costs change with the width)")
    return ""


def similar(gpu: str, zero_stage: int, pipeline_degree: int, tensor_degree: int, seq_length: int, hidden_size: int,
            runs: Optional[list] = None) -> Optional[dict]:
    """The model's error on the published runs most like this layout (module docstring), or None where no_match
    says none speaks for it."""
    runs = load()["runs"] if runs is None else runs
    if no_match(gpu, hidden_size, runs):
        return None
    zero3 = zero_stage == 3
    criteria = [
        ("ZeRO-3" if zero3 else "ZeRO 0-2", lambda r: (r["zero"] == 3) == zero3),
        ("a pipeline" if pipeline_degree > 1 else "no pipeline", lambda r: (r["pp"] > 1) == (pipeline_degree > 1)),
        ("TP" if tensor_degree > 1 else "no TP", lambda r: (r["tp"] > 1) == (tensor_degree > 1)),
        (gpu, lambda r: r["gpu"] == gpu),
        (f"seq {seq_length // 2:,}-{seq_length * 2:,}", lambda r: seq_length / 2 <= r["seq"] <= seq_length * 2),
    ]
    for keep in range(len(criteria), -1, -1):
        used = criteria[:keep]
        match = [r for r in runs if all(ok(r) for _, ok in used)]
        if len(match) >= MIN_RUNS:
            break
    labels = [label for label, _ in used] + ([] if len(used) > 3 else ["any GPU"])
    return {**_summary([r["error"] for r in match]), "gpu": gpu, "matched_on": labels,
            "own_kernels": _summary([r.get("error_own_kernels", r["error"]) for r in match]),
            "other_attention_kernel": sum(r["attention_kernel"] != "launcher's" for r in match),
            "other_attention_kernels": sorted({r["attention_kernel"] for r in match} - {"launcher's"}),
            "fused_elementwise": sum(r.get("elementwise_kernels") == "fused" for r in match),
            "all_runs": _summary([r["error"] for r in runs]),
            "all_runs_own_kernels": _summary([r.get("error_own_kernels", r["error"]) for r in runs])}


def describe(rec: dict) -> str:
    """One sentence for the plan's table."""
    names = ", ".join(KERNEL_NAMES.get(k, k) for k in rec["other_attention_kernels"])
    kernel = (f"; {rec['other_attention_kernel']} of them ran another attention kernel ({names})"
              if rec["other_attention_kernel"] else "")
    # the model charges the launcher's eager norms / activations / rotary; runs with fused ones were faster by that
    fused = (f"; {rec['fused_elementwise']} ran fused element-wise kernels (the launcher runs transformers' eager "
             f"ones, and the model charges those)" if rec.get("fused_elementwise") else "")
    # the same runs charged with their own kernels (bench/published/compare.py's second view): what is left is the
    # model's terms, not the software the runs differed in
    o = rec.get("own_kernels")
    own = (f"; with each run's own kernels charged (fused element-wise ones; MPT's Triton attention at its rates, "
           f"Megatron's unfused attention by its bytes and its vocabulary-parallel TP ends), "
           f"{o['min_error']:+.0%} to {o['max_error']:+.0%}, median |error| {o['median_abs_error']:.0%}, "
           f"{o['within_10pct']:.0%} within 10%"
           if o and (rec["other_attention_kernel"] or rec.get("fused_elementwise")) else "")
    a, ao = rec["all_runs"], rec.get("all_runs_own_kernels")
    all_own = f" ({ao['within_10pct']:.0%} and {ao['within_20pct']:.0%} with their own kernels)" if ao else ""
    return (f"{rec['runs']} published runs like this one ({', '.join(rec['matched_on'])}): the model was "
            f"{rec['min_error']:+.0%} to {rec['max_error']:+.0%} off (+: too fast), median |error| "
            f"{rec['median_abs_error']:.0%}, {rec['within_10pct']:.0%} within 10%{kernel}{fused}{own}. "
            f"All {a['runs']} runs: "
            f"{a['within_10pct']:.0%} within 10%, {a['within_20pct']:.0%} within 20%{all_own} "
            f"(bench/published/results.md)")
