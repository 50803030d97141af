"""`launcher submit --calibrate` on the local 2-node SLURM cluster (slurm/local/start.sh), CPU ranks.

One job: 2 nodes x 2 ranks, --network-only on a committed one-node profile (bench/steptime/profile.yaml, 2 CPU
ranks): the compute, engine and framework probes are that profile's (tests/train/test_calibrate.py runs the whole
measurement on 2 local ranks), and the job measures what two nodes change. It must end COMPLETED having written the
profile where --out said, with the inter-node link fitted from a group that spans the nodes (one rank a node), the
link of a group with both ranks of each node from all four, and the intra-node one from each node's ranks, the raw measurements of every group kept, every other field the base
profile's, the job's own files in a new calibrate-* directory under runs_dir (no run's directory touched), and
`launcher plan` taking the profile.
"""

import json
import subprocess
import sys

import pytest
import yaml

from slurm_helpers import LAUNCHER, REPO, cpu_models, job_id_of, profile_naming, submit, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
BASE = REPO / "bench" / "steptime" / "profile.yaml"


def test_calibration_job_measures_both_links_and_writes_the_profile(slurm_env, tmp_path):
    # The committed base was calibrated on the Xeon sessions get; on the other machine class (an AVX2 EPYC) the job
    # would refuse it (the next test), so the base names this host's CPU: this test is about what the job measures
    # and keeps, not about whose compute figures those are.
    base_file = profile_naming(BASE, tmp_path / "this-cpu.yaml", "cpu_model", cpu_models()[0])
    runs, out = tmp_path / "runs", tmp_path / "profiles" / "local.yaml"
    args = ["--calibrate", "--network-only", "cluster=cpu", "cluster.nodes=2", "cluster.gpus_per_node=2", "cluster.time=20",
            "cluster.master_port=29660", f"cluster.profile={base_file}", f"runs_dir={runs}", "--out", str(out)]
    submitted = submit(args, slurm_env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = job_id_of(submitted.stdout)
    # 20 minutes: the whole measurement (before --network-only) took 218 s in one CI run and 412 s in the next, on an
    # AVX2-only EPYC (2026-12-02, 4 ranks on 2 cores)
    fields = wait_job(job_id, slurm_env, timeout_s=1200)
    (job_dir,) = runs.iterdir()
    log = (job_dir / f"slurm-{job_id}.out").read_text()
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, log[-3000:])
    assert job_dir.name.startswith("calibrate-") and fields["NumNodes"] == "2" and fields["TimeLimit"] == "00:20:00"
    assert sorted(p.name for p in job_dir.iterdir()) == ["job.sbatch", "raw.json", f"slurm-{job_id}.out"]
    assert f"wrote {out}" in log

    doc = yaml.safe_load(out.read_text())
    m = doc["measurements"]
    assert (m["world"], m["nodes"], m["local_world"]) == (4, 2, 2)
    assert "--network-only" in doc["source"] and "2 nodes x 2 cpu ranks" in doc["source"] and "2 nodes measured" in m["note"]
    # Only the network was measured: the compute sweeps, the engine and framework probes did not run, and every
    # field but the network's is the base profile's, as it was written.
    from launcher.runtime.calibrate import NETWORK_FIELDS, NETWORK_MEASUREMENTS

    base = yaml.safe_load(base_file.read_text())
    assert m["scope"] == "network" and m["compute_from"] == str(base_file)
    assert set(m["phase_seconds"]) == {"collectives", "stragglers and release", "ZeRO-3 hooks", "host memory"}
    assert {k: v for k, v in doc.items() if k not in (*NETWORK_FIELDS, "source", "measurements")} == \
        {k: v for k, v in base.items() if k not in (*NETWORK_FIELDS, "source", "measurements")}
    kept = set(base["measurements"]) - set(NETWORK_MEASUREMENTS) - {"note"}
    assert kept >= {"gemm", "attention", "engine", "framework"} and all(m[k] == base["measurements"][k] for k in kept)
    assert m["all_reduce_after_compute"] != base["measurements"]["all_reduce_after_compute"]
    sizes = [b for b, _ in m["all_reduce_after_compute"]]
    for key in ("all_reduce_after_compute", "all_to_all_after_compute", "all_reduce_rail_after_compute",
                "all_reduce_world_after_compute"):
        assert [b for b, _ in m[key]] == sizes and all(t >= 0 for _, t in m[key]), key
    # The links are fitted from their own groups: intra from each node's 2 ranks, inter from one rank a node, and
    # inter_groups (a group with 2 ranks on each node) from all 4 ranks together.
    from launcher.runtime.calibrate import fit_alpha_beta

    assert [doc["intra"]["latency_s"], doc["intra"]["bus_gbps"]] == list(fit_alpha_beta(m["all_reduce_after_compute"], 2))
    assert [doc["inter"]["latency_s"], doc["inter"]["bus_gbps"]] == list(fit_alpha_beta(m["all_reduce_rail_after_compute"], 2))
    assert list(doc["inter_groups"]) == [2]
    assert [doc["inter_groups"][2]["latency_s"], doc["inter_groups"][2]["bus_gbps"]] == \
        list(fit_alpha_beta(m["all_reduce_world_after_compute"], 4))
    assert doc["inter"] != doc["intra"]

    # `launcher plan` takes it, and a data-parallel all-reduce over the 2 nodes is charged on the link measured for
    # its ranks a node: DP4 (2 a node) on inter_groups' 2, DP2 under TP2 (one a node) on inter. The same profile with
    # that link 10x faster plans less exposed DP traffic; with the other link 10x faster, the same.
    def plan_dp_comm(profile, *overrides):
        plan = subprocess.run([LAUNCHER, "plan", "recipe=tiny", "cluster=cpu", "cluster.nodes=2", "cluster.gpus_per_node=2",
                               "batch.micro_batch_size=4", f"cluster.profile={profile}", "--json", *overrides],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert plan.returncode == 0, plan.stderr
        return json.loads(plan.stdout)["step_time_breakdown_s"]["dp_comm_exposed"]

    def tenfold(link: dict) -> dict:
        return {"latency_s": link["latency_s"] / 10, "bus_gbps": link["bus_gbps"] * 10}

    faster_rail, faster_world = tmp_path / "faster-rail.yaml", tmp_path / "faster-world.yaml"
    faster_rail.write_text(yaml.safe_dump({**doc, "inter": tenfold(doc["inter"])}))
    faster_world.write_text(yaml.safe_dump({**doc, "inter_groups": {2: tenfold(doc["inter_groups"][2])}}))
    dp4 = [plan_dp_comm(p) for p in (out, faster_world, faster_rail)]
    assert dp4[0] > dp4[1] > 0 and dp4[2] == dp4[0], dp4
    tp2 = [plan_dp_comm(p, "parallel.tensor_degree=2") for p in (out, faster_rail, faster_world)]
    assert tp2[0] > tp2[1] > 0 and tp2[2] == tp2[0], tp2

    # The nodes' CPU is recorded (read here from /proc/cpuinfo, not by the launcher's code), and the fit refuses a
    # base profile from another node type, before it writes anything: another CPU model, or another accelerator.
    host_cpu, other_cpu = cpu_models()
    assert m["cpu_model"] == host_cpu
    for key, theirs in (("cpu_model", other_cpu), ("device_name", "NVIDIA H100 80GB HBM3")):
        base_path = profile_naming(BASE, tmp_path / f"other-{key}.yaml", key, theirs)
        refit = tmp_path / f"refit-{key}.yaml"
        fit = subprocess.run([sys.executable, "-m", "launcher.runtime.calibrate", "--fit", str(job_dir / "raw.json"),
                              str(refit), str(base_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert fit.returncode == 2, fit.stdout + fit.stderr
        assert f"cluster.profile='{base_path}'" in fit.stderr and f"measured on {theirs!r}" in fit.stderr, fit.stderr
        assert f"measurements.{key}" in fit.stderr and "fix: calibrate one node of this type whole" in fit.stderr
        assert "Traceback" not in fit.stderr and not refit.exists()


def test_network_only_job_with_a_base_from_another_cpu_ends_before_measuring(slurm_env, tmp_path):
    """The same job with a base profile that names another CPU model: its first step, on each node, refuses before
    any rank starts. The job fails with exit 2, its log holds the paragraph (the key, both models, the node, the fix),
    no raw measurements and no profile are written."""
    host_cpu, other_cpu = cpu_models()
    base = profile_naming(BASE, tmp_path / "other-cpu.yaml", "cpu_model", other_cpu)
    runs, out = tmp_path / "runs", tmp_path / "profiles" / "net.yaml"
    submitted = submit(["--calibrate", "--network-only", "cluster=cpu", "cluster.nodes=2", "cluster.gpus_per_node=2",
                        "cluster.time=20", "cluster.master_port=29660", f"cluster.profile={base}", f"runs_dir={runs}",
                        "--out", str(out)], slurm_env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = job_id_of(submitted.stdout)
    fields = wait_job(job_id, slurm_env, timeout_s=300)
    (job_dir,) = runs.iterdir()
    log = (job_dir / f"slurm-{job_id}.out").read_text()
    said = " ".join(log.split())
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "2:0", (fields, log[-3000:])
    assert f"cluster.profile='{base}'" in said and f"measured on {other_cpu!r}" in said and repr(host_cpu) in said
    assert "nothing was measured or written" in said and "fix: calibrate one node of this type whole" in said
    assert "Traceback" not in log and "calibrate: collectives" not in log
    assert sorted(p.name for p in job_dir.iterdir()) == ["job.sbatch", f"slurm-{job_id}.out"] and not out.parent.exists()
