"""Shared fixtures: compose configs the way the CLI does."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))


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
