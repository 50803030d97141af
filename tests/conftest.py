"""Shared fixtures: compose configs the way the CLI does."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))


def rescaled_profile(out: Path, compute: float, memory: float, source: Path = REPO / "bench" / "steptime" / "profile.yaml") -> dict:
    """`source` (by default bench/steptime/profile.yaml, this machine type's committed calibration) with its GEMM and
    attention rates times `compute` and its copy bandwidth times `memory`, written to `out`; the document written.
    Also bench/steptime/rate_check.py's."""
    import yaml

    doc = yaml.safe_load(Path(source).read_text())
    for key in ("gemm_tflops", "attention_tflops"):
        doc[key] = {d: v * compute for d, v in doc[key].items()}
    doc["memory_gbps"] *= memory
    for key in ("gemm_table", "attention_table"):
        doc[key] = {d: [[x, r * compute] for x, r in rows] for d, rows in doc[key].items()}
    doc["attention_table_by_head_dim"] = {hd: {d: [[x, r * compute] for x, r in rows] for d, rows in by.items()}
                                          for hd, by in doc["attention_table_by_head_dim"].items()}
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


def venv_bin(name: str) -> str:
    """The console script installed next to the interpreter running the tests."""
    return str(Path(sys.executable).parent / name)


@pytest.fixture
def compose():
    from launcher.config.compose import compose as _compose

    return _compose


@pytest.fixture
def resolve():
    from launcher.config.compose import compose as _compose
    from launcher.config.layout import resolve_layout

    def _resolve(overrides):
        cfg = _compose(overrides)
        return cfg, resolve_layout(cfg)

    return _resolve


@pytest.fixture(autouse=True)
def _no_user_conf_dir(monkeypatch):
    monkeypatch.delenv("LAUNCHER_CONF_PATH", raising=False)
    yield
