"""`launcher submit` on a real SLURM cluster (slurm/local/start.sh: nodes n1, n2 on 127.0.0.1), CPU ranks.

A: recipe=tiny across 2 nodes x 1 rank with the preflight on, a hostile job name and a secret in the
   environment: COMPLETED, the loss falls in the log, preflight ok on both nodes, the name reached SLURM
   verbatim and executed nothing, the secret reached the job but no file of the run.
B: a job whose batch shell gets SIGUSR1 passes it to the ranks, which checkpoint; it requeues itself with
   `scontrol requeue`, resumes and ends COMPLETED with steps 1..N exactly once each.
T: the real time limit: --time=1 with --signal=USR1@45 (slurmctld signals the steps), checkpoint, requeue, resume.
C: a sweep (-m) submits one job per point; D: the GPU template is accepted by sbatch (--test-only) on
   nodes advertising 8 GPUs; E: a failing preflight names the node.
"""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_helpers import REPO, job_fields, job_id_of, submit, two_node_overrides, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SECRET = "wandb-secret-5f1c9e0b7a2d4e68"


def train_losses(log: str) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in re.finditer(r"^step +(\d+) +loss ([0-9.]+)", log, re.M)}


def metrics_steps(run_dir: Path) -> list[int]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return [r["step"] for r in recs if r["kind"] == "train"]


@pytest.fixture(scope="module")
def job_a(slurm_env, slurm_cache, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs-a")
    trap = tmp_path_factory.mktemp("injection")
    name = f"x'; touch {trap}/pwned1; $(touch {trap}/pwned2) `touch {trap}/pwned3` \"; touch {trap}/pwned4"
    hydra_name = name.replace("\\", "\\\\").replace("'", "\\'")
    setup = 'echo "launcher-test: the batch shell sees a key of $(printf %s "$WANDB_API_KEY" | wc -c) characters"'
    args = [*two_node_overrides(slurm_cache, runs, "a", steps=40, port=29610), "cluster.preflight=true",
            f"cluster.job_name='{hydra_name}'", f"cluster.setup='{setup}'"]
    env = {**slurm_env, "WANDB_API_KEY": SECRET}
    t0 = time.time()
    out = submit(args, env)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = job_id_of(out.stdout)
    fields = wait_job(job_id, slurm_env, timeout_s=300)
    run_dir = runs / "a"
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    return {"fields": fields, "log": log, "run_dir": run_dir, "name": name, "trap": trap, "stdout": out.stdout, "job_id": job_id,
            "wall_s": time.time() - t0}


def test_two_node_job_trains_and_completes(job_a):
    fields, log = job_a["fields"], job_a["log"]
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, log[-3000:])
    assert fields["NumNodes"] == "2" and fields["NodeList"] == "n[1-2]"
    # the job's port: cluster.master_port + 2 x (job id mod 500), apart from concurrent jobs
    assert "world 2" in log and f"launcher: rendezvous n1:{29610 + 2 * (int(job_a['job_id']) % 500)}" in log
    losses = train_losses(log)
    assert sorted(losses) == list(range(1, 41))
    assert losses[40] < losses[1] - 0.3, losses
    assert metrics_steps(job_a["run_dir"]) == list(range(1, 41))
    assert (job_a["run_dir"] / "checkpoints" / "latest").read_text() == "step_00000040"
    assert f"log {job_a['run_dir']}/slurm-" in job_a["stdout"]


def test_preflight_ran_on_each_node_before_training(job_a):
    log = job_a["log"]
    for node in ("n1", "n2"):
        assert re.search(rf"^preflight ok on node {node}: torch .*, CPU, all-reduce over 2 nodes", log, re.M), log[:3000]
    assert log.index("preflight ok") < log.index("step      1")


def test_hostile_job_name_is_inert(job_a):
    assert job_a["fields"]["JobName"] == job_a["name"]  # reached SLURM verbatim, as one argument
    assert list(job_a["trap"].iterdir()) == [], "a command in the job name was executed"


def test_secret_reaches_the_job_but_no_file(job_a):
    assert f"the batch shell sees a key of {len(SECRET)} characters" in job_a["log"]
    for path in job_a["run_dir"].rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"secret written into {path}"


def test_preempted_job_requeues_and_resumes_without_lost_steps(slurm_env, slurm_cache, tmp_path):
    steps = 60
    args = [*two_node_overrides(slurm_cache, tmp_path, "b", steps=steps, port=29620), "checkpoint.save_every=0"]
    out = submit(args, slurm_env)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = job_id_of(out.stdout)
    metrics = tmp_path / "b" / "metrics.jsonl"
    deadline = time.time() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 4):
        assert time.time() < deadline and job_fields(job_id, slurm_env).get("JobState") in ("PENDING", "RUNNING"), \
            job_fields(job_id, slurm_env)
        time.sleep(0.2)
    # SIGUSR1 to the batch shell only (what `--signal=B:USR1@N` would send): its trap must survive it and pass
    # it on to the training step (srun -> torchrun -> ranks). The signal straight to the steps, as plain
    # --signal=USR1@N sends it, is the time-limit test's path.
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=slurm_env, check=True, timeout=30)
    fields = wait_job(job_id, slurm_env, timeout_s=300,
                      until=lambda f: f.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") and f.get("Restarts") != "0")
    log = (tmp_path / "b" / f"slurm-{job_id}.out").read_text()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", (fields, log[-4000:])
    assert "launcher: batch shell got SIGUSR1, passing it to the training step" in log
    stopped = int(re.search(r"preempted \(SIGUSR1\) at step (\d+): checkpoint saved", log)[1])
    assert 4 <= stopped < steps
    assert f"requeueing job {job_id}" in log and f"launcher: job {job_id} attempt 2 on n[1-2]" in log
    assert f"resuming at step {stopped}" in log
    assert metrics_steps(tmp_path / "b") == list(range(1, steps + 1))  # continuous, each step once
    losses = train_losses(log)
    assert set(losses) == set(range(1, steps + 1)) and losses[steps] < losses[1] - 0.3
    assert (tmp_path / "b" / "checkpoints" / "latest").read_text() == f"step_{steps:08d}"
    assert not (tmp_path / "b" / "preempted").exists()


def test_time_limit_signal_checkpoints_requeues_and_resumes(slurm_env, slurm_cache, tmp_path):
    """The real timer: --time=1 (minute) with --signal=USR1@10, so slurmctld itself sends SIGUSR1 to the steps.

    slurmctld checks limits on a periodic timer and sends the signal early rather than late ("up to 60 seconds
    earlier than specified", sbatch(1) --signal); measured here: 4 to 22 s after the start for @45 on a 1-minute
    limit, so @10 keeps it after the ranks' start-up. The attempt checkpoints and requeues; attempt 2 resumes
    from that step. Attempt 2 would be signalled in turn: once it has resumed, the test ends it (B runs a job
    to its end).
    """
    args = [*two_node_overrides(slurm_cache, tmp_path, "t", steps=100000, port=29650, time_limit="1", grace_s=10),
            "checkpoint.save_every=0"]
    out = submit(args, slurm_env)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = job_id_of(out.stdout)
    assert "#SBATCH --time=1\n" in (tmp_path / "t" / "job.sbatch").read_text()
    log = tmp_path / "t" / f"slurm-{job_id}.out"
    resumed = None
    deadline = time.time() + 240
    while resumed is None:
        text = log.read_text() if log.exists() else ""
        m = re.search(r"resuming at step (\d+)", text)
        resumed = int(m[1]) if m else None
        assert time.time() < deadline, (job_fields(job_id, slurm_env), text[-3000:])
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], env=slurm_env, check=True, timeout=30)
    wait_job(job_id, slurm_env, timeout_s=120)
    text = log.read_text()
    stopped = int(re.search(r"preempted \(SIGUSR1\) at step (\d+): checkpoint saved", text)[1])
    assert stopped == resumed >= 1
    assert f"requeueing job {job_id}" in text and f"launcher: job {job_id} attempt 2 on n[1-2]" in text
    steps = metrics_steps(tmp_path / "t")
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= stopped


def test_sweep_submits_one_job_per_point(slurm_env, slurm_cache, tmp_path):
    base = [a for a in two_node_overrides(slurm_cache, tmp_path, "unused", steps=3, port=29630) if not a.startswith("run_name=")]
    out = submit(["-m", *base, "optimizer.lr=1e-3,3e-3"], slurm_env)
    assert out.returncode == 0, out.stdout + out.stderr
    ids = re.findall(r"^submitted job (\d+):", out.stdout, re.M)
    assert len(ids) == 2 and "sweep point 2/2: " in out.stdout
    # Both run at once on n[1-2] (one CPU each per node): their rendezvous ports must differ.
    for job_id in ids:
        assert wait_job(job_id, slurm_env, timeout_s=300)["JobState"] == "COMPLETED"
    logs = [p.read_text() for p in tmp_path.glob("*/slurm-*.out")]
    ports = {re.search(r"launcher: rendezvous n1:(\d+)", log)[1] for log in logs}
    assert len(logs) == 2 and len(ports) == 2
    lrs = sorted(float(re.search(r"^  lr: (\S+)$", (d / "config.yaml").read_text(), re.M)[1]) for d in tmp_path.iterdir())
    assert lrs == [1e-3, 3e-3]
    assert all(metrics_steps(d) == [1, 2, 3] for d in tmp_path.iterdir())


def test_gpu_template_is_accepted_by_sbatch(slurm_env, tmp_path):
    """The GPU script (--gpus-per-node=8, the preflight on) as rendered, checked by sbatch itself on nodes with 8 GPUs."""
    out = submit(["recipe=llama-7b", "cluster.nodes=2", "cluster.partition=debug",
                  f"runs_dir={tmp_path}", "--dry-run"], slurm_env)
    assert out.returncode == 0, out.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(out.stdout)
    assert "#SBATCH --gpus-per-node=8" in out.stdout and "PREFLIGHT=1" in out.stdout
    test = subprocess.run(["sbatch", "--test-only", str(script)], env=slurm_env, capture_output=True, text=True, timeout=60)
    assert test.returncode == 0 and "to start at" in test.stderr, test.stderr
    too_many = subprocess.run(["sbatch", "--test-only", "--gpus-per-node=9", str(script)], env=slurm_env,
                              capture_output=True, text=True, timeout=60)
    assert too_many.returncode != 0  # the check above is not vacuous: 9 GPUs per node are refused


def test_gpu_calibration_script_is_accepted_by_sbatch(slurm_env, tmp_path):
    """`launcher submit --calibrate` for 2 GPU nodes (as rendered by --dry-run), checked by sbatch itself."""
    out = submit(["--calibrate", "cluster=h100-80gb", "cluster.nodes=2", "cluster.partition=debug", f"runs_dir={tmp_path}",
                  "--out", str(tmp_path / "h100.yaml"), "--dry-run"], slurm_env)
    assert out.returncode == 0, out.stderr
    assert list(tmp_path.iterdir()) == []   # --dry-run writes nothing
    script = tmp_path / "calibrate.sbatch"
    script.write_text(out.stdout)
    assert "#SBATCH --gpus-per-node=8" in out.stdout and '-m launcher.runtime.calibrate "$RAW" cuda 1.0' in out.stdout
    test = subprocess.run(["sbatch", "--test-only", str(script)], env=slurm_env, capture_output=True, text=True, timeout=60)
    assert test.returncode == 0 and "to start at" in test.stderr, test.stderr


def test_failing_preflight_names_the_node(slurm_env):
    """The preflight module under srun, one task per node, on nodes whose torch sees no GPU: fails fast, naming the node."""
    env = {**slurm_env, "MASTER_ADDR": "n1"}
    t0 = time.time()
    out = subprocess.run(["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", sys.executable, "-m",
                          "launcher.runtime.preflight", "--device", "cuda", "--gpus-per-node", "8", "--port", "29641"],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    named = re.findall(r"preflight FAILED on node (n[12]) \(GPU count\): torch sees 0 GPUs, the layout needs "
                       r"cluster.gpus_per_node=8", out.stderr)
    assert named and set(named) <= {"n1", "n2"}, out.stderr
    assert time.time() - t0 < 60
