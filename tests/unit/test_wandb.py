"""W&B follows its own environment conventions, and an online run without credentials is refused before any rank starts.

Real wandb (offline mode writes a real run directory), real netrc files, the real console script; HOME points at a
temporary directory so no real ~/.netrc or wandb settings are read.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import venv_bin

WANDB_ENV = ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE",
             "WANDB_BASE_URL", "NETRC")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in WANDB_ENV:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_environment_wins_over_config_defaults_and_offline_run_is_written(clean_env, tmp_path, monkeypatch, compose):
    """Rank 0's recorder with WANDB_MODE=offline, WANDB_DIR and WANDB_PROJECT set and no credentials anywhere: the
    run is written offline under WANDB_DIR (not the run dir), in WANDB_PROJECT. Used to be: mode online and project
    "launcher" from our defaults, and rank 0 died "No API key"."""
    from launcher.runtime.metrics import MetricsSink, refuse_wandb_without_login

    wandb_dir, run_dir = tmp_path / "wandb-files", tmp_path / "runs" / "r1"
    wandb_dir.mkdir()
    run_dir.mkdir(parents=True)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_PROJECT", "team-proj")
    cfg = compose(["recipe=tiny", "logging.wandb.enabled=true"])
    assert cfg.logging.wandb.mode is None and cfg.logging.wandb.project is None
    refuse_wandb_without_login(cfg)  # offline needs no credentials
    sink = MetricsSink(cfg, run_dir, enabled=True, resumed=False)
    try:
        assert sink.wandb_run.project == "team-proj"
        assert sink.wandb_run.settings.mode == "offline"
        for step in (1, 2, 3):
            sink.log({"kind": "train", "step": step, "loss": 5.0 - step})
    finally:
        sink.close()
    runs = list((wandb_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb")), list(wandb_dir.rglob("*"))
    assert not (run_dir / "wandb").exists()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3


def _cfg(compose, *extra):
    return compose(["recipe=tiny", "logging.wandb.enabled=true", *extra])


def test_online_needs_a_key_or_a_netrc_entry(clean_env, monkeypatch, compose):
    from launcher.config.errors import ConfigError
    from launcher.runtime.metrics import refuse_wandb_without_login

    cfg = _cfg(compose)
    with pytest.raises(ConfigError) as err:
        refuse_wandb_without_login(cfg)
    assert err.value.key == "logging.wandb.enabled"
    assert "api.wandb.ai" in str(err.value) and "WANDB_MODE=offline" in str(err.value)

    netrc = clean_env / ".netrc"
    netrc.write_text("machine example.org login user password x\n")
    netrc.chmod(0o600)
    with pytest.raises(ConfigError):  # an entry for another host is not a W&B login
        refuse_wandb_without_login(cfg)
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "0" * 40 + "\n")  # what `wandb login` writes
    refuse_wandb_without_login(cfg)

    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    with pytest.raises(ConfigError) as err:  # a self-hosted server needs its own entry
        refuse_wandb_without_login(cfg)
    assert "wandb.example.org" in str(err.value)
    monkeypatch.setenv("WANDB_API_KEY", "local-" + "1" * 40)
    refuse_wandb_without_login(cfg)


def test_config_mode_beats_the_environment_and_bad_modes_are_refused(clean_env, monkeypatch, compose):
    from launcher.config.errors import ConfigError
    from launcher.runtime.metrics import refuse_wandb_without_login, wandb_mode

    monkeypatch.setenv("WANDB_MODE", "online")
    cfg = _cfg(compose, "logging.wandb.mode=offline")
    assert wandb_mode(cfg) == "offline"
    refuse_wandb_without_login(cfg)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    refuse_wandb_without_login(_cfg(compose))
    refuse_wandb_without_login(compose(["recipe=tiny"]))  # W&B off: nothing to check
    monkeypatch.setenv("WANDB_MODE", "offlne")
    with pytest.raises(ConfigError) as err:
        refuse_wandb_without_login(_cfg(compose))
    assert err.value.key == "logging.wandb.mode" and "from WANDB_MODE" in str(err.value)


def test_train_refuses_online_wandb_without_credentials_before_ranks_start(clean_env, tmp_path):
    env = {**os.environ, "HOME": str(clean_env)}
    out = subprocess.run([venv_bin("launcher"), "train", "recipe=tiny", "logging.wandb.enabled=true",
                          f"runs_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    message = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stdout + out.stderr
    assert "config error: logging.wandb.enabled=True: W&B logs online (mode 'online' from the default)" in message
    assert f"{clean_env / '.netrc'} has no entry for api.wandb.ai" in message
    assert "fix: log offline with WANDB_MODE=offline" in message and "`wandb login`" in message
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()  # before the run dir and the data
