"""`launcher train` as a user runs it (it starts torchrun itself), on 2 CPU ranks.

A: an uninterrupted run; its artifacts; nothing JIT-compiled (empty TORCH_EXTENSIONS_DIR stays empty).
B: the same run preempted by SIGUSR1 partway, then `resume=auto`: losses equal A's step for step (1e-6).
C: a save killed after writing but before publishing leaves the previous checkpoint as `latest`.
D: a W&B key in the environment of run A appears nowhere in its run dir (config, metrics, checkpoints,
   TensorBoard and offline W&B files) nor in its console output.
"""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from train_helpers import PYTHON, REPO, base_overrides, child_env, launcher

pytestmark = pytest.mark.slow
STEPS = 30
SECRET = "sk-launcher-test-6f1c2d9e8b7a4c3d"  # a made-up W&B key; offline mode never sends it


def losses(run_dir: Path) -> dict[int, float]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return {r["step"]: r["loss"] for r in recs if r["kind"] == "train"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def run_a(cache_dir, runs, tmp_path_factory):
    ext = tmp_path_factory.mktemp("torch_extensions")
    args = ["train", *base_overrides(cache_dir, STEPS), f"runs_dir={runs}", "run_name=a", "checkpoint.save_every=10",
            "checkpoint.keep_last=2", "checkpoint.export_hf=true", "train.eval_every=10",
            "logging.tensorboard=true", "logging.wandb.enabled=true", "logging.wandb.mode=offline"]
    t0 = time.time()
    result = launcher(args, TORCH_EXTENSIONS_DIR=ext, WANDB_SILENT="true", WANDB_API_KEY=SECRET)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return runs / "a", ext, time.time() - t0, result.stdout + result.stderr


def test_run_writes_its_artifacts_and_compiles_nothing(run_a):
    run_dir, ext, _, _ = run_a
    assert list(ext.iterdir()) == [], "a CPU run JIT-compiled a DeepSpeed op"
    for name in ("config.yaml", "deepspeed.json", "data.json", "metrics.jsonl", "loss.png", "model_state_bytes.json"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_00000030"
    # keep_last=2 of the saves at 10, 20, 30
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_00000020", "step_00000030"]
    state = json.loads((run_dir / "checkpoints" / "step_00000030" / "launcher_state.json").read_text())
    assert state["step"] == 30 and state["tokens_seen"] == 30 * 8 * 32 and state["versions"]["deepspeed"]
    assert state["deepspeed_config"] == json.loads((run_dir / "deepspeed.json").read_text())
    # Plan beside the run (planner issue, part 6): each rank's measured model-state bytes equal the prediction.
    state_bytes = json.loads((run_dir / "model_state_bytes.json").read_text())
    assert state_bytes["prediction_matches"] is True, state_bytes
    assert state_bytes["per_rank"][0]["params"] == state_bytes["predicted_per_rank"][0]["params"] > 0
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert all(r["mfu"] is None and r["tokens_per_s"] > 0 and r["grad_norm"] is not None for r in train)
    assert [r["step"] for r in recs if r["kind"] == "eval"] == [10, 20, 30]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5
    # The schedule each step used (launcher.train.start_lr_schedule): lr 0 at step 1 only, half the peak after
    # one of scheduler.warmup_steps=2, the floor at the last step; wall times of the records only increase.
    frozen = OmegaConf.load(run_dir / "config.yaml")
    lrs = [r["lr"] for r in train]
    assert lrs[0] == 0 and lrs[1] == pytest.approx(frozen.optimizer.lr / 2) and lrs[-1] == pytest.approx(frozen.scheduler.min_lr)
    assert all(a["time"] < b["time"] for a, b in zip(train, train[1:]))
    assert (run_dir / "hf" / "model.safetensors").is_file() and (run_dir / "hf" / "tokenizer.json").is_file()
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert list((run_dir / "wandb").glob("offline-run-*"))
    assert not list(run_dir.rglob("*netrc*"))  # no W&B credentials written
    # The frozen config names its run, so `launcher train --config` (a SLURM requeue) finds this directory.
    assert "run_name: a" in (run_dir / "config.yaml").read_text()


def test_preempted_run_resumes_exactly(run_a, cache_dir, runs):
    ref = losses(run_a[0])
    args = ["train", *base_overrides(cache_dir, STEPS), f"runs_dir={runs}", "run_name=b", "checkpoint.save_every=0",
            "train.eval_every=10"]
    proc = subprocess.Popen([PYTHON, "-m", "launcher", *args], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics = runs / "b" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            proc.send_signal(signal.SIGUSR1)  # as SLURM's --signal does before the time limit
            break
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-5000:]
    preempted = json.loads((runs / "b" / "preempted").read_text())
    stop = preempted["step"]
    assert 3 <= stop < STEPS, out[-3000:]
    assert (runs / "b" / "checkpoints" / "latest").read_text() == f"step_{stop:08d}"

    result = launcher(["train", "--config", str(runs / "b" / "config.yaml"), "resume=auto"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert not (runs / "b" / "preempted").exists()
    got = losses(runs / "b")
    assert sorted(got) == list(range(1, STEPS + 1))
    assert max(abs(got[s] - ref[s]) for s in got) < 1e-6, {s: (got[s], ref[s]) for s in got}


def test_resume_on_a_layout_no_conversion_carries_is_refused(run_a):
    # ZeRO-2 -> ZeRO-1 is converted (tests/train/test_elastic_resume.py); to ZeRO-3 it is refused (not exact).
    run_dir = run_a[0]
    result = launcher(["train", "--config", str(run_dir / "config.yaml"), "resume=auto", "parallel.zero_stage=3"], timeout=120)
    assert result.returncode == 2
    assert "parallel.zero_stage=3" in result.stderr and "with ZeRO-3 on either side it is not exact" in result.stderr


def test_save_killed_midway_keeps_previous_latest(cache_dir, runs):
    args = ["train", *base_overrides(cache_dir, 4), f"runs_dir={runs}", "run_name=c", "checkpoint.save_every=2"]
    result = launcher(args, LAUNCHER_CRASH_IN_SAVE="step_00000004")
    assert result.returncode != 0
    ckpts = runs / "c" / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_00000002"
    assert (ckpts / ".tmp-step_00000004").is_dir() and not (ckpts / "step_00000004").exists()
    # The partial save is not picked up: resuming continues from step 2 and finishes. This time the ranks are
    # started the way the SLURM job does it: torchrun running `launcher train --config <frozen> resume=auto`.
    result = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "launcher",
                             "train", "--config", str(runs / "c" / "config.yaml"), "resume=auto"],
                            cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming at step 2" in result.stdout + result.stderr
    assert (ckpts / "latest").read_text() == "step_00000004" and not (ckpts / ".tmp-step_00000004").exists()


def test_secret_from_the_environment_is_written_nowhere(run_a):
    run_dir, _, _, console = run_a
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) > 20 and any("wandb" in p.parts for p in files) and any("tensorboard" in p.parts for p in files)
    leaked = [str(p) for p in files if SECRET.encode() in p.read_bytes()]
    assert leaked == []
    assert SECRET not in console
