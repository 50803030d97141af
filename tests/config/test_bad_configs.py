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


@pytest.fixture(scope="module")
def fake_checkpoint(tmp_path_factory):
    """A recipe=tiny (ZeRO 2, 2 CPU ranks) checkpoint as a resume sees it: launcher_state.json + manifest.json.

    Written with the functions a real save uses (build_state, the manifest entries), without weights: every
    `resume` entry must be refused before anything would load them.
    """
    import json

    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime import checkpoint as ckpt
    from launcher.runtime.data import PreparedData

    cfg = compose(["recipe=tiny"])
    layout = resolve_layout(cfg)
    prepared = PreparedData(bin_path="/nonexistent/tokens.bin", tokenizer_path=None, dtype="uint16", num_tokens=10**6,
                            vocab_size=layout.vocab_size, eos_id=0, seq_length=layout.seq_length, train_samples=1000,
                            val_samples=10, source="stdlib")
    tag_dir = tmp_path_factory.mktemp("ckpt") / "checkpoints" / ckpt.tag_for(10)
    tag_dir.mkdir(parents=True)
    state = ckpt.build_state(cfg, layout, build_deepspeed_config(cfg, layout), 10, 10 * layout.tokens_per_step, prepared)
    (tag_dir / ckpt.STATE_FILE).write_text(json.dumps(state))
    entries = {ckpt.STATE_FILE: ckpt._file_entry(tag_dir / ckpt.STATE_FILE)}
    (tag_dir / ckpt.MANIFEST).write_text(json.dumps({"algorithm": ckpt.HASH, "files": entries}))
    return tag_dir


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda e: " ".join(e["args"]))
def test_rejected_with_key_rule_and_fix(entry, capsys, tmp_path, monkeypatch, fake_checkpoint):
    from launcher.cli import EXIT_CONFIG_ERROR, main

    (tmp_path / "afile").write_text("not a directory")
    for name, value in entry.get("env", {}).items():
        monkeypatch.setenv(name, value)
    args = [a.replace("{tmp}", str(tmp_path)).replace("{ckpt}", str(fake_checkpoint)) for a in entry["args"]]
    code = main([entry.get("command", "plan"), *args])
    out, err = capsys.readouterr()
    assert code == EXIT_CONFIG_ERROR, out
    message = " ".join(err.split())
    assert f"config error: {entry['key']}=" in message, message
    assert " fix: " in message, message
    assert " ".join(entry["says"].split()) in message, message
    assert "Traceback" not in err and out == ""
    # Refused before anything started: no run directory was made, and a secret is never echoed.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    for value in entry.get("env", {}).values():
        assert value not in err


def test_catalogue_size_and_spread():
    assert len(CATALOGUE) >= 140
    keys = {e["key"].split(".")[0] for e in CATALOGUE}
    # every config group that has rules appears in the catalogue
    assert {"model", "data", "parallel", "batch", "precision", "cluster", "recipe", "run_name", "optimizer", "train",
            "checkpoint", "logging", "resume", "runs_dir", "extras", "scheduler"} <= keys
    groups = {e["group"] for e in CATALOGUE}
    assert {"layout", "compose", "names", "train", "memory", "data", "resume", "secrets", "ranges", "interpolation"} <= groups
