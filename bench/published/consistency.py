"""How well could any deterministic model do on the published set? The spread of the runs themselves.

A step-time model sees a run only through its inputs (model shape, GPU type and count, TP / PP / CP / DP, sharding,
micro and global batch, sequence, recompute, precision, kernels). Where two published runs share every input and
report different throughputs, no model can put both within 10%: the best single prediction for a group is the
one that lands within 10% of the most of its members. This reads bench/published/results.json (the expressible
runs) and runs.yaml (their shapes) and reports that ceiling, for groups of identical inputs and, looser, for groups
that differ only in the data-parallel degree (the GPU count and global batch with it: the per-GPU work is the same,
so measured tokens/s per GPU should be close; the model itself moves those by their DP communication only).

    python3 bench/published/consistency.py
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import yaml

HERE = Path(__file__).parent
SHAPE_KEYS = ("arch", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq")


def key(row: dict, record: dict, per_gpu: bool) -> tuple:
    shape = tuple(record["model"].get(k) for k in SHAPE_KEYS)
    layout = row["layout"].split()
    if per_gpu:     # drop the data-parallel degree and the global batch (they scale together here)
        layout = [t for t in layout if not t.startswith(("DP", "gbs"))]
    return (shape, row["gpu"], None if per_gpu else row["gpus"], " ".join(layout), row.get("attention_kernel"),
            row.get("elementwise_kernels"))


def ceiling(values: list) -> int:
    """The most members one prediction p puts within 10% (|p / m - 1| <= 0.1): the best p lies at an end of some
    member's window [0.9 m, 1.1 m]."""
    return max(sum(1 for m in values if abs(p / m - 1) <= 0.10 + 1e-12) for v in values for p in (0.9 * v, 1.1 * v))


def main() -> None:
    rows = json.loads((HERE / "results.json").read_text())["rows"]
    records = {r["id"]: r for r in yaml.safe_load((HERE / "runs.yaml").read_text())}
    for per_gpu, name in ((False, "identical inputs"), (True, "identical but for the data-parallel degree")):
        groups = collections.defaultdict(list)
        for row in rows:
            groups[key(row, records[row["id"]], per_gpu)].append(row)
        multi = [g for g in groups.values() if len(g) > 1]
        best = sum(ceiling([r["measured_tokens_per_s_per_gpu"] for r in g]) for g in groups.values())
        spread = [max(r["measured_tokens_per_s_per_gpu"] for r in g) / min(r["measured_tokens_per_s_per_gpu"] for r in g)
                  for g in multi]
        print(f"{name}: {len(rows)} runs in {len(groups)} groups, {len(multi)} with more than one run "
              f"({sum(map(len, multi))} runs; largest max/min within a group {max(spread):.3f}); the most any model "
              f"can put within 10%: {best} of {len(rows)} ({best / len(rows):.1%})")


if __name__ == "__main__":
    main()
