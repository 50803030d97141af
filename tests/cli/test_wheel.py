"""A wheel install, outside the checkout: the configs, recipes and sbatch template travel inside the package.

The wheel is built from a copy of the package sources (nothing written into the checkout), installed with
--no-deps into a fresh venv whose dependencies come from the test venv's site-packages (a .pth line: its own
.pth files, among them the editable install of this checkout, are not processed there), and run from a
directory outside the checkout: plan, show, `submit --dry-run`, a $LAUNCHER_CONF_PATH option, and a
2-step train on 2 CPU ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow
SMALL = ["model.hidden_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2", "model.num_key_value_heads=2",
         "model.intermediate_size=64", "model.vocab_size=320", "model.max_position_embeddings=64", "data.seq_length=32",
         "data.max_bytes=300000", "batch.global_batch_size=8", "batch.micro_batch_size=4", "train.steps=2",
         "train.eval_every=0", "scheduler.warmup_steps=1", "logging.progress_bar=false", "checkpoint.export_hf=false"]


def sh(cmd: list[str], cwd: Path, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})
    assert out.returncode == 0, f"{' '.join(map(str, cmd))}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin dir, a working directory outside the checkout)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "launcher", src / "launcher", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"), str(src)], root)
    (wheel,) = (root / "dist").glob("launcher-*.whl")

    venv = root / "venv"
    sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], root)
    py = venv / "bin" / "python"
    site = Path(sh([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).stdout.strip())
    (site / "test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    sh([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)], root)
    where = sh([str(py), "-c", "import launcher; print(launcher.__file__)"], root).stdout.strip()
    assert where.startswith(str(site)), where  # the wheel's copy, not this checkout
    work = root / "work"
    work.mkdir()
    return venv / "bin", work


def test_wheel_carries_the_configs_recipes_and_template(installed):
    bin_dir, work = installed
    launcher = str(bin_dir / "launcher")
    sh([launcher, "plan"], work)
    plan = sh([launcher, "plan", "recipe=bloom-176b", "--json"], work)
    assert '"world_size": 384' in plan.stdout
    assert json.loads(plan.stdout)["step_time_track_record"]["runs"] >= 5   # launcher/plan/track_record.json travels too
    shown = sh([launcher, "show", "recipe=llama-7b"], work)
    assert "DeepSpeed config" in shown.stdout
    script = sh([launcher, "submit", "recipe=llama-65b", "cluster.partition=gpu", "--dry-run"], work).stdout
    assert script.startswith("#!/bin/bash\n") and "--partition=gpu" in script
    assert list(work.iterdir()) == []


def test_wheel_install_takes_site_options_from_the_conf_path(installed, tmp_path):
    bin_dir, work = installed
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tiny-wide.yaml").write_text("defaults:\n  - tiny\n  - _self_\nname: tiny-wide\nhidden_size: 256\n")
    out = sh([str(bin_dir / "launcher"), "plan", "recipe=tiny", "model=tiny-wide", "--json"], work, LAUNCHER_CONF_PATH=str(tmp_path))
    assert '"model": "tiny-wide"' in out.stdout


def test_wheel_install_trains(installed, tmp_path):
    bin_dir, work = installed
    out = sh([str(bin_dir / "launcher"), "train", "recipe=tiny", *SMALL, f"data.cache_dir={tmp_path / 'cache'}",
              f"runs_dir={tmp_path / 'runs'}", "run_name=wheel"], work, timeout=600)
    run = tmp_path / "runs" / "wheel"
    assert (run / "config.yaml").exists() and (run / "checkpoints" / "latest").exists(), out.stdout[-2000:]
    steps = [line for line in (run / "metrics.jsonl").read_text().splitlines() if '"kind": "train"' in line]
    assert len(steps) == 2
