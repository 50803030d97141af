"""Checkpoint integrity and resume compatibility (issue 7, parts 3 and 4), on a real 2-rank run.

One run saves steps 2, 4, 6 with a manifest each; copies of it are then damaged on purpose:
  - every manifest lists every file with its size and a sha256 that `sha256sum` agrees with;
  - a truncated file in `latest`: resume=auto warns, naming the file, and resumes from step 4 (the newest
    intact one), training on to the end; the SLURM path (torchrun -> `launcher train --config`) does the same;
  - flipped bytes (same size) and a deleted file: `launcher export` and an explicit resume=PATH refuse with
    the file and what differs, exit 2, no traceback, before any rank starts; all checkpoints damaged: refused;
  - a changed model shape / batch / learning rate on resume: refused with `key: saved -> now`, before any rank
    starts; a changed train.steps / logging / checkpoint interval is allowed (the truncation case above).
"""

import json
import shutil
import subprocess

import pytest

from train_helpers import PYTHON, REPO, base_overrides, child_env, launcher

pytestmark = pytest.mark.slow
STATES = "mp_rank_00_model_states.pt"


@pytest.fixture(scope="module")
def run(cache_dir, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    result = launcher(["train", *base_overrides(cache_dir, 6), f"runs_dir={runs}", "run_name=r", "checkpoint.save_every=2",
                       "checkpoint.keep_last=5"])
    assert result.returncode == 0, result.stderr[-3000:]
    return runs / "r"


def copy_run(run, tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(run, dst)
    # The frozen config names its run dir: point the copy at itself.
    cfg = (dst / "config.yaml").read_text().replace(f"run_name: {run.name}", f"run_name: {name}")
    (dst / "config.yaml").write_text(cfg.replace(f"runs_dir: {run.parent}", f"runs_dir: {tmp_path}"))
    return dst


def test_manifest_lists_every_file_with_size_and_sha256(run):
    for tag in ("step_00000002", "step_00000004", "step_00000006"):
        tag_dir = run / "checkpoints" / tag
        manifest = json.loads((tag_dir / "manifest.json").read_text())
        files = sorted(p.relative_to(tag_dir).as_posix() for p in tag_dir.rglob("*") if p.is_file() and p.name != "manifest.json")
        assert sorted(manifest["files"]) == files and STATES in files and "launcher_state.json" in files
        sums = subprocess.run(["sha256sum", *files], cwd=tag_dir, capture_output=True, text=True, check=True).stdout
        for line in sums.splitlines():
            digest, name = line.split(maxsplit=1)
            assert manifest["files"][name]["sha256"] == digest
            assert manifest["files"][name]["bytes"] == (tag_dir / name).stat().st_size
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    saves = [r for r in recs if r["kind"] == "checkpoint"]
    assert [r["step"] for r in saves] == [2, 4, 6] and all(len(r["rss_bytes_per_rank"]) == 2 for r in saves)


def test_truncated_latest_falls_back_to_the_newest_intact(run, tmp_path):
    r = copy_run(run, tmp_path, "trunc")
    victim = r / "checkpoints" / "step_00000006" / STATES
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size // 2)
    result = launcher(["train", "--config", str(r / "config.yaml"), "resume=auto", "train.steps=8", "scheduler.decay_steps=6",
                       "logging.log_every=2"])  # decay_steps: the saved schedule (a new horizon is refused)
    assert result.returncode == 0, result.stderr[-3000:]
    out = " ".join((result.stdout + result.stderr).split())
    assert (f"resume=auto skips damaged checkpoints (step_00000006: {STATES}: {size // 2:,} bytes, the manifest says "
            f"{size:,} (truncated)) and resumes from step_00000004, the newest intact one") in out, out[-3000:]
    assert "resuming at step 4" in out
    assert (r / "checkpoints" / "latest").read_text() == "step_00000008"

    # The SLURM path: no `launcher train` parent; rank 0 verifies and every rank follows its choice.
    r2 = copy_run(run, tmp_path, "trunc2")
    with open(r2 / "checkpoints" / "step_00000006" / STATES, "r+b") as f:
        f.truncate(100)
    res = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "launcher", "train",
                          "--config", str(r2 / "config.yaml"), "resume=auto"], cwd=REPO, env=child_env(), capture_output=True,
                         text=True, timeout=600)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert "resumes from step_00000004" in log and "resuming at step 4" in log


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_damaged_checkpoint_is_refused_by_export_and_explicit_resume(run, tmp_path, damage):
    r = copy_run(run, tmp_path, damage)
    tag = r / "checkpoints" / "step_00000006"
    optim = sorted(tag.glob("*optim_states.pt"))[0]
    if damage == "flip":
        data = bytearray(optim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        optim.write_bytes(bytes(data))
        says = f"{optim.name}: sha256"
        how = "(same size, changed content)"
    else:
        optim.unlink()
        says, how = f"{optim.name}: missing", ""
    res = launcher(["export", str(r / "checkpoints" / "latest"), str(tmp_path / "hf")], timeout=300)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2 and "config error: checkpoint=" in err and "is damaged" in err and says in err and how in err, err
    assert "Traceback" not in res.stderr and not (tmp_path / "hf" / "model.safetensors").exists()

    res = launcher(["train", "--config", str(r / "config.yaml"), f"resume={tag}"], timeout=300)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2 and f"config error: resume='{tag}'" in err and says in err, err
    assert "older ones here: step_00000004, step_00000002" in err
    assert "Traceback" not in res.stderr and "starting 2 local ranks" not in res.stdout


def test_no_intact_checkpoint_is_refused(run, tmp_path):
    r = copy_run(run, tmp_path, "allbad")
    for tag in (r / "checkpoints").glob("step_*"):
        (tag / "launcher_state.json").write_text((tag / "launcher_state.json").read_text().replace('"step"', '"step" ', 1))
    size = (r / "checkpoints" / "step_00000006" / "launcher_state.json").stat().st_size  # it holds the config: no fixed size
    res = launcher(["train", "--config", str(r / "config.yaml"), "resume=auto"], timeout=300)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2 and "no intact checkpoint in" in err, err
    assert f"step_00000006: launcher_state.json: {size:,} bytes, the manifest says {size - 1:,} (longer than written)" in err, err
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("override,diff", [
    ("model.hidden_size=64", "model.hidden_size: 32 -> 64"),
    ("model.num_hidden_layers=3", "model.num_hidden_layers: 2 -> 3"),
    ("data.max_bytes=200000", "data.max_bytes: 300000 -> 200000"),
    # The global batch has its own refusal (runtime/elastic.py), naming the accumulation that keeps it.
    ("batch.global_batch_size=16", "saved with a global batch of 8 sequences"),
    ("optimizer.lr=0.01", "optimizer.lr: 0.002 -> 0.01"),
])
def test_incompatible_resume_is_refused_with_a_diff(run, override, diff):
    res = launcher(["train", "--config", str(run / "config.yaml"), "resume=auto", override], timeout=300)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    key = override.split("=")[0] if override.startswith("batch.global_batch_size") else "resume"
    assert f"config error: {key}=" in err and diff in err and " fix: " in err, err
    assert "Traceback" not in res.stderr and "starting 2 local ranks" not in res.stdout


def test_empty_latest_and_torn_metrics_resume_from_the_newest_intact(run, tmp_path):
    """What a node crash leaves (issue 12): an empty `latest` and a half-written last metrics line. resume=auto
    takes step_6 (the newest intact) with the damaged-checkpoint warning, drops the torn line with a warning,
    and never starts fresh; resume=never refuses the run dir even without `latest`."""
    r = copy_run(run, tmp_path, "crashed")
    (r / "checkpoints" / "latest").write_bytes(b"")
    lines = (r / "metrics.jsonl").read_text().splitlines()
    (r / "metrics.jsonl").write_text("\n".join(lines) + "\n" + lines[-1][: len(lines[-1]) // 2])
    result = launcher(["train", "--config", str(r / "config.yaml"), "resume=auto", "train.steps=8", "scheduler.decay_steps=6",
                       "logging.log_every=2"])
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, out[-3000:]
    assert "resume=auto skips damaged checkpoints (latest: empty) and resumes from step_00000006" in out, out[-3000:]
    assert "resuming at step 6" in out and "fresh start" not in out and "Traceback" not in out
    assert "metrics.jsonl: dropped 1 damaged line(s)" in out and f"line {len(lines) + 1}" in out
    recs = [json.loads(x) for x in (r / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in recs if x["kind"] == "train"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert (r / "checkpoints" / "latest").read_text() == "step_00000008"

    r2 = copy_run(run, tmp_path, "nolatest")
    (r2 / "checkpoints" / "latest").unlink()
    res = launcher(["train", "--config", str(r2 / "config.yaml"), "resume=never"], timeout=300)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2 and "config error: resume='never'" in err and "already holds checkpoints (step_00000006" in err, err
    assert "Traceback" not in res.stderr and "starting 2 local ranks" not in res.stdout


def test_slow_verification_does_not_race_the_collective_timeout(run, tmp_path):
    """Under srun + torchrun rank 0 verifies the checkpoint before the process group exists; the other rank waits
    with its own bound. A verification 15 s slower than usual with train.dist_timeout_s=5 resumes fine."""
    r = copy_run(run, tmp_path, "slowverify")
    res = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "launcher", "train",
                          "--config", str(r / "config.yaml"), "resume=auto", "train.steps=7", "train.dist_timeout_s=5"],
                         cwd=REPO, env=child_env(LAUNCHER_SLOW_VERIFY_S=15), capture_output=True, text=True, timeout=600)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert "resuming at step 6" in log and (r / "checkpoints" / "latest").read_text() == "step_00000007"
    assert not list(r.glob(".resume-*.json")) and not (r / "owner.lock").exists()


def test_export_refuses_an_output_inside_a_checkpoint(run, tmp_path):
    tag = run / "checkpoints" / "step_00000004"
    before = sorted(p.name for p in tag.iterdir())
    for out in (tag, tag / "hf", run / "checkpoints"):
        res = launcher(["export", str(tag), str(out)], timeout=300)
        err = " ".join(res.stderr.split())
        assert res.returncode == 2 and "config error: out=" in err and "inside the checkpoint directory" in err, err
        assert "Traceback" not in res.stderr
    assert sorted(p.name for p in tag.iterdir()) == before
