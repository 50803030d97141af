"""Hydra's `--cfg job` and `--info` on plan/show/train/submit, through the real console script."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tests.conftest import venv_bin


def run(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([venv_bin("launcher"), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=cwd)


@pytest.mark.parametrize("command", ["plan", "show", "train", "submit"])
def test_cfg_job_prints_only_the_composed_yaml(command, tmp_path):
    """The whole stdout is one YAML document (pipeable), with the overrides applied; nothing is written or started."""
    out = run(command, "recipe=tiny", "train.steps=7", f"runs_dir={tmp_path / 'runs'}", "--cfg", "job", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert cfg["train"]["steps"] == 7 and cfg["model"]["name"] == "tiny" and cfg["recipe_name"] == "tiny"
    assert cfg["parallel"]["zero_stage"] == 2  # the recipe's value, over the default's
    assert list(tmp_path.iterdir()) == []


def test_cfg_job_shows_a_config_that_plan_refuses():
    """Like Hydra's --cfg job it does not run the app: the layout is not checked, so a bad layout can be inspected."""
    bad = ("recipe=tiny", "batch.global_batch_size=15")
    assert run("plan", *bad).returncode == 2
    out = run("plan", *bad, "-c", "job", "-p", "batch")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout) == {"micro_batch_size": 8, "global_batch_size": 15}


def test_cfg_job_package_and_sweep():
    out = run("submit", "-m", "recipe=tiny", "train.steps=1,2", "--cfg", "job", "--package", "train.steps")
    assert out.returncode == 0, out.stderr
    assert [d for d in yaml.safe_load_all(out.stdout)] == [1, 2]
    assert "# sweep point: recipe=tiny train.steps=2" in out.stdout
    out = run("show", "--cfg", "job", "-p", "trian")
    assert out.returncode == 2 and "--package='trian': names no key of the composed config" in out.stderr
    assert "Traceback" not in out.stderr
    out = run("plan", "-p", "train")
    assert out.returncode == 2 and "--package/-p goes with --cfg job" in out.stderr


def test_cfg_job_still_refuses_bad_overrides():
    out = run("show", "--cfg", "job", "train.stepz=5")
    assert out.returncode == 2 and "train.stepz" in out.stderr and "Traceback" not in out.stderr


def test_info_lists_search_path_choices_and_groups_with_user_dirs(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tiny-site.yaml").write_text("defaults:\n  - tiny\n  - _self_\nname: tiny-site\n")
    out = run("plan", "recipe=tiny", "model=tiny-site", "--info", env={"LAUNCHER_CONF_PATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    search = lines[lines.index(next(l for l in lines if l.startswith("Config search path"))) + 1:][:2]
    assert search[0].split()[0] == "launcher" and search[0].endswith(os.path.join("launcher", "conf"))
    assert search[1].split() == ["LAUNCHER_CONF_PATH", str(tmp_path.resolve())]
    start = lines.index(next(l for l in lines if l.startswith("Defaults list"))) + 1
    choices = dict(l.split() for l in lines[start:lines.index("", start)])
    assert choices["model"] == "tiny-site" and choices["cluster"] == "cpu" and choices["recipe"] == "tiny"
    model_line = next(l for l in lines if l.strip().startswith("model ") and "llama-7b" in l)
    assert f"tiny-site* [{tmp_path.resolve()}]" in model_line and "tiny," in model_line
    cluster_options = next(l for l in lines if l.strip().startswith("cluster ") and "a100" in l).split()[1:]
    assert "a100-80gb," in cluster_options and "cpu*," in cluster_options  # every option; * marks the chosen one


@pytest.mark.parametrize("command", ["show", "train", "submit"])
def test_info_on_every_composing_command(command):
    out = run(command, "--info")
    assert out.returncode == 0, out.stderr
    assert "LAUNCHER_CONF_PATH is not set" in out.stdout and "recipe      null" in out.stdout


def test_cfg_hydra_and_all_show_how_the_config_was_composed(tmp_path):
    """Hydra's `--cfg hydra` / `--cfg all`: the command line's overrides and the option each group ended with
    (what the recipe chose), under `hydra:`; `all` puts the job config beside it in one YAML document."""
    out = run("plan", "recipe=tiny", "train.steps=3", "--cfg", "hydra", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    assert list(doc) == ["hydra"] and doc["hydra"]["overrides"]["task"] == ["recipe=tiny", "train.steps=3"]
    assert doc["hydra"]["runtime"]["choices"]["model"] == "tiny" and doc["hydra"]["runtime"]["choices"]["cluster"] == "cpu"
    assert "run" not in doc["hydra"] and "launcher is not one" not in out.stdout and "`launcher` is not one" in out.stdout
    both = yaml.safe_load(run("show", "recipe=tiny", "train.steps=3", "--cfg", "all").stdout)
    assert both["train"]["steps"] == 3 and both["hydra"] == doc["hydra"]
    out = run("plan", "recipe=tiny", "-c", "all", "-p", "hydra.runtime.choices.precision")
    assert out.returncode == 0 and out.stdout == "fp32\n", out.stderr
    assert list(tmp_path.iterdir()) == []


def test_cfg_hydra_of_a_frozen_config_is_refused(tmp_path):
    frozen = tmp_path / "config.yaml"
    frozen.write_text(run("show", "recipe=tiny", "--cfg", "job").stdout)
    out = run("train", "--config", str(frozen), "--cfg", "hydra")
    assert out.returncode == 2 and "--cfg='hydra'" in out.stderr and "use --cfg job" in out.stderr, out.stderr
