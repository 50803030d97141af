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


def gemm_over_profile(source: Path = REPO / "bench" / "steptime" / "profile.yaml", side: int = 256) -> float:
    """This machine's GEMM rate over `source`'s at `side`, the lower of fp32's and bf16's, timed here with plain torch
    on one thread (a CPU rank's share of this 2-core machine): how far a test must scale the committed calibration to
    be sure to sit below this machine. CPUs differ most in bf16: the one calibrated ran bf16 GEMMs at 0.42 TFLOP/s
    (side 512, 4.5x its fp32: native bf16, which instructions not recorded), an AVX2-only EPYC (2026-12-02) at ~0.0012,
    ~1/300 of it, while its fp32 was 0.7x. Plain torch, not calibrate's probe: the tests this scales hold that probe."""
    import time

    import torch
    import yaml

    doc = yaml.safe_load(Path(source).read_text())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ratios = []
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            a, b = torch.randn(side, side, dtype=dtype), torch.randn(side, side, dtype=dtype)
            a @ b
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < 0.3:
                a @ b
                n += 1
            rate = 2 * side**3 * n / (time.perf_counter() - t0) / 1e12
            ratios.append(rate / dict(doc["gemm_table"][name])[side])
        return min(ratios)
    finally:
        torch.set_num_threads(threads)


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
