"""Diagnostic, not the benchmark: how the records whose micro-batch is unknown move with it.

    PYTHONPATH=$PWD .venv/bin/python bench/published/micro_batch_unknown.py [family ...]

compare.py maps a record that does not state its micro-batch to 1 (and says so in the row's `assumed`). This plans
each such record of the given families (default: mt-nlg) again at micro-batch 1, 2, 4 and 8, through compare.py's
own mapping and model, and prints the error at each, so a reader can see how much of a row's error the unstated
value could hold. Nothing here changes a record: choosing the micro-batch from these errors would fit the rows.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import compare as C  # noqa: E402


def main(families: list[str]) -> None:
    records = [r for r in yaml.safe_load((C.HERE / "runs.yaml").read_text())
               if r["family"] in families and "micro_batch" in r.get("unknown", [])]
    for mb in (1, 2, 4, 8):
        result = C.compare([dict(r, micro_batch=mb) for r in records], C.default_model)
        errors = ", ".join(f"{x['id']} {x['error']:+.1%}" for x in result["rows"])
        skipped = ", ".join(f"{x['id']} ({x['why'][:60]})" for x in result["not_expressible"])
        print(f"micro-batch {mb}: {errors}" + (f"; not expressible: {skipped}" if skipped else ""))


if __name__ == "__main__":
    main(sys.argv[1:] or ["mt-nlg"])
