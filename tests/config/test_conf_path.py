"""$LAUNCHER_CONF_PATH: a team's own models, clusters and recipes beside the built-in ones (launcher/conf)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import venv_bin

SITE_MODEL = """# a team's model: 2 more layers than the built-in tiny
defaults:
  - tiny
  - _self_
name: tiny-deep
num_hidden_layers: 6
"""
SITE_CLUSTER = """name: site-a100
gpu: a100-80gb
nodes: 2
gpus_per_node: 4
partition: train
time: "12:00:00"
"""
SITE_RECIPE = """# @package _global_
defaults:
  - override /model: tiny-deep
  - override /cluster: site-a100
recipe_name: site-run
batch:
  micro_batch_size: 2
  global_batch_size: 16
"""


@pytest.fixture
def site(tmp_path):
    for rel, text in (("model/tiny-deep.yaml", SITE_MODEL), ("cluster/site-a100.yaml", SITE_CLUSTER),
                      ("recipe/site-run.yaml", SITE_RECIPE)):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_site_options_extend_the_built_in_ones(site, monkeypatch, resolve):
    monkeypatch.setenv("LAUNCHER_CONF_PATH", str(site))
    cfg, layout = resolve(["recipe=site-run"])
    assert (cfg.model.name, cfg.model.num_hidden_layers, cfg.model.hidden_size) == ("tiny-deep", 6, 128)
    assert (layout.world_size, layout.data_degree, layout.grad_accum_steps, cfg.cluster.partition) == (8, 8, 1, "train")
    cfg, _ = resolve(["recipe=llama-7b"])  # the built-in ones are all still there
    assert cfg.model.name == "llama-7b"


def test_site_options_through_the_cli(site):
    env = {**os.environ, "LAUNCHER_CONF_PATH": str(site)}
    out = subprocess.run([venv_bin("launcher"), "plan", "recipe=site-run", "--json"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    typo = subprocess.run([venv_bin("launcher"), "plan", "model=tiny-dep"], capture_output=True, text=True, env=env, timeout=120)
    assert typo.returncode == 2 and "did you mean tiny-deep" in typo.stderr


@pytest.mark.parametrize("make, says", [
    (lambda d: (d / "model").mkdir() or (d / "model" / "tiny.yaml").write_text("name: mine\n"),
     "has the name of the built-in option model=tiny: the built-in one would be chosen and this file ignored"),
    (lambda d: None, "is not a directory"),
])
def test_bad_conf_path_is_refused(tmp_path, monkeypatch, compose, make, says):
    from launcher.config.errors import ConfigError

    target = tmp_path / "site"
    if says != "is not a directory":
        target.mkdir()
        make(target)
    monkeypatch.setenv("LAUNCHER_CONF_PATH", str(target))
    with pytest.raises(ConfigError, match="LAUNCHER_CONF_PATH") as err:
        compose(["recipe=tiny"])
    assert says in str(err.value) and "fix:" in str(err.value)
