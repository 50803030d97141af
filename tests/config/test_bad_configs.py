"""The bad-config catalogue (tests/config/bad_configs.yaml), every entry through the CLI entry point.

Each must exit with status 2 before anything starts, print one message naming the key, the rule and a fix,
and show no traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

CATALOGUE = yaml.safe_load((Path(__file__).parent / "bad_configs.yaml").read_text())


def load(group: str | None = None) -> list[dict]:
    return [e for e in CATALOGUE if group is None or e["group"] == group]


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda e: " ".join(e["args"]))
def test_rejected_with_key_rule_and_fix(entry, capsys):
    from launcher.cli import EXIT_CONFIG_ERROR, main

    code = main([entry.get("command", "plan"), *entry["args"]])
    out, err = capsys.readouterr()
    assert code == EXIT_CONFIG_ERROR, out
    message = " ".join(err.split())
    assert f"config error: {entry['key']}=" in message, message
    assert " fix: " in message, message
    assert " ".join(entry["says"].split()) in message, message
    assert "Traceback" not in err and out == ""


def test_catalogue_size_and_spread():
    assert len(CATALOGUE) >= 40
    keys = {e["key"].split(".")[0] for e in CATALOGUE}
    # every config group that has rules appears in the catalogue
    assert {"model", "data", "parallel", "batch", "precision", "cluster", "recipe", "run_name", "optimizer"} <= keys
