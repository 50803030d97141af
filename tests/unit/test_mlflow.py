"""MLflow (issue 15): rank 0's recorder logs into a real MLflow file store, and an MLflow that cannot work is
refused before any rank starts (not installed; a store MLflow 3 will not open). The W&B login check runs under
`launcher submit` too, before sbatch. Real mlflow-skinny (the `test` extra), the real console script."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, venv_bin

MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_RUN_ID",
              "MLFLOW_EXPERIMENT_ID")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in MLFLOW_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    yield
    # mlflow.set_experiment exports MLFLOW_EXPERIMENT_ID into this process's environment, where monkeypatch does not
    # undo it: every later `launcher train` of the session inherited an experiment id that its own store lacks
    # (tests/train/test_metrics.py's MLflow run failed so, after this file, in one pytest process). monkeypatch puts
    # back what was there before, after this.
    for name in MLFLOW_ENV:
        os.environ.pop(name, None)


def test_sink_logs_params_and_metrics_and_a_resume_continues_the_same_run(clean_env, tmp_path, monkeypatch, compose):
    from mlflow.tracking import MlflowClient

    from launcher.runtime.metrics import MLFLOW_RUN_ID_FILE, MetricsSink, refuse_mlflow_unusable

    store = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    cfg = compose(["recipe=tiny", "logging.mlflow.enabled=true", f"logging.mlflow.tracking_uri={store}",
                   "logging.mlflow.experiment=first-hour"])
    refuse_mlflow_unusable(cfg)
    sink = MetricsSink(cfg, run_dir, enabled=True, resumed=False)
    try:
        for step in (1, 2):
            sink.log({"kind": "train", "step": step, "loss": 5.0 - step, "grad_norm": None})
    finally:
        sink.close()
    run_id = (run_dir / MLFLOW_RUN_ID_FILE).read_text().strip()
    sink = MetricsSink(cfg, run_dir, enabled=True, resumed=True)  # a resume: same MLflow run, params not re-logged
    try:
        sink.log({"kind": "train", "step": 3, "loss": 1.5})
        sink.log({"kind": "eval", "step": 3, "val_loss": 1.75})
    finally:
        sink.close()
    client = MlflowClient(store)
    run = client.get_run(run_id)
    assert run.info.run_name == "r1" and client.get_experiment(run.info.experiment_id).name == "first-hour"
    assert run.data.params["model.name"] == "tiny" and run.data.params["optimizer.weight_decay"] == "0.01"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")] == [(1, 4.0), (2, 3.0), (3, 1.5)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/val_loss")] == [(3, 1.75)]
    assert "train/grad_norm" not in run.data.metrics  # None is not a number


def run_cli(*args, env=None, cwd=None, block_mlflow=False):
    """The console script; with block_mlflow, in an interpreter where `import mlflow` fails as when it is not
    installed (sys.modules[name] = None: Python's import system then raises ImportError)."""
    env = {**{k: v for k, v in os.environ.items() if k not in MLFLOW_ENV}, **(env or {})}
    if block_mlflow:
        code = "import sys; sys.modules['mlflow'] = None; from launcher.cli import main; sys.exit(main(sys.argv[1:]))"
        cmd = [sys.executable, "-c", code, *args]
        env["PYTHONPATH"] = str(REPO)
    else:
        cmd = [venv_bin("launcher"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


@pytest.mark.parametrize("command", [["train"], ["submit", "--dry-run"]])
def test_mlflow_not_installed_is_refused_before_start(command, tmp_path):
    out = run_cli(*command, "recipe=tiny", "logging.mlflow.enabled=true", f"runs_dir={tmp_path / 'runs'}",
                  cwd=tmp_path, block_mlflow=True)
    err = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "config error: logging.mlflow.enabled=True: MLflow is not installed" in err
    assert "pip install 'launcher[mlflow]'" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() and "starting" not in out.stdout


def test_stores_mlflow_cannot_open_are_refused_before_start(tmp_path):
    # MLflow 3's default store is sqlite:///mlflow.db: mlflow-skinny has no SQLAlchemy for it.
    out = run_cli("train", "recipe=tiny", "logging.mlflow.enabled=true", f"runs_dir={tmp_path / 'runs'}", cwd=tmp_path)
    err = " ".join(out.stderr.split())
    assert out.returncode == 2 and "logging.mlflow.tracking_uri='sqlite:///" in err and "(from MLflow's default)" in err, err
    assert "needs SQLAlchemy" in err and "Traceback" not in err
    # The file store without MLflow 3's opt-in, named by the environment.
    out = run_cli("submit", "--dry-run", "recipe=tiny", "logging.mlflow.enabled=true", f"runs_dir={tmp_path / 'runs'}",
                  env={"MLFLOW_TRACKING_URI": f"file:{tmp_path / 'mlruns'}"}, cwd=tmp_path)
    err = " ".join(out.stderr.split())
    assert out.returncode == 2 and "(from MLFLOW_TRACKING_URI) is MLflow's file store" in err, err
    assert "MLFLOW_ALLOW_FILE_STORE=true" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlruns").exists() and not (tmp_path / "mlflow.db").exists()
    # With the opt-in the same submission renders its job script.
    out = run_cli("submit", "--dry-run", "recipe=tiny", "logging.mlflow.enabled=true", f"runs_dir={tmp_path / 'runs'}",
                  env={"MLFLOW_TRACKING_URI": f"file:{tmp_path / 'mlruns'}", "MLFLOW_ALLOW_FILE_STORE": "true"}, cwd=tmp_path)
    assert out.returncode == 0 and "#SBATCH" in out.stdout, out.stderr[-2000:]


def test_submit_checks_the_wandb_login_before_sbatch(tmp_path):
    """Online W&B without credentials is refused by `launcher submit` too (the job would wait in the queue, then
    rank 0 would die in wandb.init), before the sbatch check: the user's mistake first."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    env.update(HOME=str(home), PATH="/usr/bin:/bin")  # no sbatch on this PATH
    out = subprocess.run([venv_bin("launcher"), "submit", "recipe=tiny", "logging.wandb.enabled=true",
                          f"runs_dir={tmp_path / 'runs'}"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    err = " ".join(out.stderr.split())
    assert out.returncode == 2 and "config error: logging.wandb.enabled=True: W&B logs online" in err, err
    assert "sbatch" not in err and not (tmp_path / "runs").exists()
