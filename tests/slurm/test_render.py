"""The sbatch script without SLURM: validation tables, quoting executed by bash, numbers from the layout,
golden scripts for bloom-176b and llama-65b, and `launcher submit --dry-run` through the console script.

Regenerate the golden scripts with LAUNCHER_UPDATE_GOLDEN=1 after a deliberate change; review the diff.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.errors import ConfigError
from launcher.slurm import JobPaths, check_cluster, job_values, render_script, time_limit_seconds

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "slurm"
LAUNCHER = str(Path(sys.executable).parent / "launcher")
PATHS = JobPaths(run_dir=Path("/scratch/runs/demo"), workdir=Path("/scratch/launcher"), python="/scratch/venv/bin/python")
# A PATH without sbatch, so a test of what comes before the queue means the same with or without SLURM
# installed on this machine (tests/slurm's fixture installs it mid-session).
NO_SBATCH = str(Path(sys.executable).parent)


def render(resolve, overrides, paths=PATHS) -> str:
    cfg, layout = resolve(overrides)
    check_cluster(cfg, layout)
    return render_script(job_values(cfg, layout, paths))


def sbatch_options(script: str) -> dict[str, str]:
    """`#SBATCH --key=value` lines, split the way sbatch's parser groups quotes (like POSIX shell words)."""
    opts = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            (word,) = shlex.split(line[len("#SBATCH "):])
            key, _, value = word.partition("=")
            opts[key] = value
    return opts


# ----------------------------------------------------------------------------- time limits (sbatch(1) --time)

@pytest.mark.parametrize("text, seconds", [
    ("30", 30 * 60),                      # minutes
    ("1:30", 90),                         # minutes:seconds
    ("24:00:00", 24 * 3600),              # hours:minutes:seconds
    ("2-0", 2 * 86400),                   # days-hours
    ("1-02:03", 86400 + 2 * 3600 + 3 * 60),
    ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),
])
def test_time_limit_forms(text, seconds):
    assert time_limit_seconds(text) == seconds


# ----------------------------------------------------------------------------- every bad SLURM setting, named

BAD = [
    # (overrides, key, words of the rule)
    (["cluster.time=1h"], "cluster.time", "is not a SLURM time limit"),
    (["cluster.time=UNLIMITED"], "cluster.time", "is not a SLURM time limit"),
    (["cluster.time=0:30"], "cluster.time", "under one minute"),
    (["cluster.time=5", "cluster.signal_grace_s=300"], "cluster.signal_grace_s", "grace 300 s >= time limit 5 = 300 s"),
    (["cluster.signal_grace_s=0"], "cluster.signal_grace_s", "in 1..65535"),
    (["cluster.signal_grace_s=70000", "cluster.time=3-0"], "cluster.signal_grace_s", "in 1..65535"),
    (["cluster.partition='gpu;rm -rf x'"], "cluster.partition", "comma-separated names"),
    (["cluster.partition='gpu,,cpu'"], "cluster.partition", "comma-separated names"),
    (["cluster.account='proj $(id)'"], "cluster.account", "must be a name"),
    (["cluster.job_name='a\nb'"], "cluster.job_name", "control character"),
    (["cluster.master_port=80"], "cluster.master_port", "1024..64535"),
    (["cluster.master_port=65000"], "cluster.master_port", "1024..64535"),
    (["cluster.cpus_per_task=0"], "cluster.cpus_per_task", ">= 1"),
    (["cluster.extra_sbatch=[exclusive]"], "cluster.extra_sbatch[0]", "starting with '--'"),
]


@pytest.mark.parametrize("overrides, key, rule", BAD, ids=[b[1] + ":" + " ".join(b[0]) for b in BAD])
def test_bad_cluster_settings_are_refused(resolve, overrides, key, rule):
    with pytest.raises(ConfigError) as err:  # numeric ranges by resolve_layout (ranges.py), the rest by check_cluster
        cfg, layout = resolve(["recipe=llama-7b", *overrides])
        check_cluster(cfg, layout)
    assert err.value.key == key and rule in err.value.rule, str(err.value)
    assert err.value.fix


@pytest.mark.parametrize("overrides", [["cluster.partition='gpu,gpu-long'"], ["cluster.account=proj_1.a"],
                                       ["cluster.time=1-00:00:00", "cluster.signal_grace_s=600"], ["cluster.time=2", "cluster.signal_grace_s=60"]])
def test_good_cluster_settings_pass(resolve, overrides):
    cfg, layout = resolve(["recipe=llama-7b", *overrides])
    check_cluster(cfg, layout)


# ----------------------------------------------------------------------------- numbers from the layout

@pytest.mark.parametrize("overrides, nodes, per_node, gpu_line, preflight", [
    (["recipe=bloom-176b"], 48, 8, True, True),
    (["recipe=llama-7b", "cluster.nodes=2", "cluster.gpus_per_node=4"], 2, 4, True, True),
    (["recipe=llama-7b", "cluster.preflight=false"], 8, 8, True, False),
    (["recipe=tiny"], 1, 2, False, False),
    (["recipe=tiny", "cluster.nodes=2", "cluster.gpus_per_node=1", "cluster.preflight=true"], 2, 1, False, True),
])
def test_nodes_gpus_and_preflight_follow_the_layout(resolve, overrides, nodes, per_node, gpu_line, preflight):
    script = render(resolve, overrides)
    opts = sbatch_options(script)
    assert opts["--nodes"] == str(nodes) and opts["--ntasks-per-node"] == "1"
    assert opts.get("--gpus-per-node") == (str(per_node) if gpu_line else None)
    assert f"--nproc_per_node={per_node} " in script
    assert f"PREFLIGHT={1 if preflight else 0}\n" in script


def test_optional_lines_appear_only_when_set(resolve):
    bare = sbatch_options(render(resolve, ["recipe=llama-7b"]))
    assert not {"--partition", "--account", "--cpus-per-task", "--exclusive"} & set(bare)
    full = sbatch_options(render(resolve, ["recipe=llama-7b", "cluster.partition=gpu", "cluster.account=proj",
                                           "cluster.cpus_per_task=96", "cluster.extra_sbatch=[--exclusive,'--constraint=a100&ib']",
                                           "cluster.time=2-00:00:00", "cluster.signal_grace_s=600"]))
    assert full["--partition"] == "gpu" and full["--account"] == "proj" and full["--cpus-per-task"] == "96"
    assert full["--exclusive"] == "" and full["--constraint"] == "a100&ib"
    assert full["--time"] == "2-00:00:00" and full["--signal"] == "USR1@600" and "--requeue" in full
    assert full["--output"] == "/scratch/runs/demo/slurm-%j.out" and full["--open-mode"] == "append"


def test_cpu_ranks_get_the_malloc_settings_of_a_local_run_and_the_site_hook_wins(resolve):
    """A CPU job's script exports launcher/protocol.py CPU_MALLOC_ENV as `launcher train` gives its local ranks; a
    value cluster.setup exported first stays; a GPU job's script sets none. Read back from bash running the lines."""
    from launcher.protocol import CPU_MALLOC_ENV

    def exported(script: str) -> dict:
        lines = "\n".join(x for x in script.splitlines() if x.startswith("export MALLOC_"))
        keys = " ".join(f'{k}="${k}"' for k in CPU_MALLOC_ENV)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        out = subprocess.run(["bash", "-c", f"{lines}\nprintf '%s\\n' {keys}"], capture_output=True,
                             text=True, env=env)
        assert out.returncode == 0, out.stderr
        return dict(x.split("=", 1) for x in out.stdout.split())

    cpu = render(resolve, ["recipe=tiny"])
    assert exported(cpu) == CPU_MALLOC_ENV
    # the site hook's line comes first in the script, as bash runs them
    site = render(resolve, ["recipe=tiny", "cluster.setup='export MALLOC_ARENA_MAX=1'"])
    assert exported(site) == {**CPU_MALLOC_ENV, "MALLOC_ARENA_MAX": "1"}
    assert exported(render(resolve, ["recipe=llama-7b"])) == {k: "" for k in CPU_MALLOC_ENV}


# ----------------------------------------------------------------------------- quoting, checked by the parsers that read it

HOSTILE = ["x; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "it's \"quoted\" $HOME", "a&&b || c > d < e | f", "#not a comment"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_job_name_is_one_sbatch_argument(resolve, name):
    hydra = name.replace("\\", "\\\\").replace("'", "\\'")
    script = render(resolve, ["recipe=tiny", f"cluster.job_name='{hydra}'"])
    assert sbatch_options(script)["--job-name"] == name
    assert len([x for x in script.splitlines() if "PWNED" in x]) <= 1  # only on its #SBATCH line


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_paths_stay_data_when_bash_runs_the_script_lines(tmp_path, name):
    """Run dir, config path and python, as bash reads them from the rendered script: the values come back intact."""
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout

    trap = tmp_path / "trap"
    trap.mkdir()
    evil = str(tmp_path / name.replace("PWNED", str(trap / "pwned")).replace("/", "_"))
    paths = JobPaths(run_dir=Path(evil), workdir=Path(evil), python=evil + "/python")
    cfg = compose(["recipe=tiny"])
    script = render_script(job_values(cfg, resolve_layout(cfg), paths))
    assigns = "\n".join(x for x in script.splitlines() if re.match(r"(RUN_DIR|CONFIG|PYTHON|PREEMPTED)=", x))
    out = subprocess.run(["bash", "-c", assigns + '\nprintf "%s\\n" "$RUN_DIR" "$CONFIG" "$PYTHON" "$PREEMPTED"'],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [evil, evil + "/config.yaml", evil + "/python", evil + "/preempted"]
    # `touch` of the hostile names would create a file in the cwd (tmp_path) or in trap/
    assert list(tmp_path.iterdir()) == [trap] and list(trap.iterdir()) == []


@pytest.mark.parametrize("recipe", ["tiny", "llama-7b", "bloom-176b", "llama-65b"])
def test_rendered_scripts_are_valid_bash(resolve, recipe, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(render(resolve, [f"recipe={recipe}", "cluster.setup='module load cuda/12.4\nexport X=1'"]))
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_template_and_values_must_agree(tmp_path, resolve):
    cfg, layout = resolve(["recipe=tiny"])
    values = job_values(cfg, layout, PATHS)
    bad = tmp_path / "t.tmpl"
    bad.write_text("#!/bin/bash\n#SBATCH --nodes={{nodes}}\n{{no_such_value}}\n")
    with pytest.raises(RuntimeError, match=r"unfilled \['no_such_value'\]"):
        render_script(values, bad)


# ----------------------------------------------------------------------------- golden scripts

@pytest.mark.parametrize("recipe", ["bloom-176b", "llama-65b"])
def test_golden_sbatch_script(resolve, recipe):
    """Pinned rendered scripts (reviewed by hand). Regenerate with LAUNCHER_UPDATE_GOLDEN=1 after a deliberate change."""
    paths = JobPaths(run_dir=Path(f"/scratch/runs/{recipe}"), workdir=Path("/scratch/launcher"), python="/scratch/venv/bin/python")
    got = render(resolve, [f"recipe={recipe}", "cluster.partition=gpu", "cluster.account=proj"], paths)
    path = GOLDEN / f"{recipe}.sbatch"
    if os.environ.get("LAUNCHER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert got == path.read_text()


# ----------------------------------------------------------------------------- the console script

def launcher(*args, cwd=REPO, **env):
    return subprocess.run([LAUNCHER, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_dry_run_prints_the_script_and_writes_nothing(tmp_path):
    out = launcher("submit", "recipe=llama-65b", "cluster.partition=gpu", "cluster.account=proj", f"runs_dir={tmp_path}",
                   "--dry-run", WANDB_API_KEY="never-in-a-script-1234")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("#!/bin/bash\n") and out.stdout.rstrip().endswith('exit "$rc"')
    opts = sbatch_options(out.stdout)
    assert opts["--nodes"] == "256" and opts["--gpus-per-node"] == "8" and opts["--partition"] == "gpu"
    assert opts["--job-name"].startswith("llama-65b-")
    assert "never-in-a-script-1234" not in out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_layout_never_reaches_the_queue(tmp_path):
    """No --dry-run: the layout error comes first (exit 2, key/rule/fix), before "sbatch is not on PATH"."""
    out = launcher("submit", "recipe=llama-7b", "batch.global_batch_size=1000", f"runs_dir={tmp_path}", PATH=NO_SBATCH)
    assert out.returncode == 2
    assert "batch.global_batch_size=1000" in out.stderr and "fix: nearest valid global_batch_size: 768 or 1024" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_slurm_setting_exits_2(tmp_path):
    out = launcher("submit", "recipe=llama-7b", "cluster.time=5", f"runs_dir={tmp_path}", "--dry-run")
    assert out.returncode == 2 and out.stdout == ""
    assert "cluster.signal_grace_s=300" in out.stderr and "fix: raise cluster.time" in out.stderr


def test_sweep_dry_run_prints_one_script_per_point(tmp_path):
    out = launcher("submit", "-m", "recipe=tiny", "optimizer.lr=1e-3,3e-3", "cluster.nodes=1", f"runs_dir={tmp_path}", "--dry-run")
    assert out.returncode == 0, out.stderr
    run_dirs = re.findall(r"^RUN_DIR=(\S+)$", out.stdout, re.M)
    assert len(run_dirs) == 2 and len(set(run_dirs)) == 2
    assert "sweep point 1/2: recipe=tiny optimizer.lr=0.001" in out.stderr and "optimizer.lr=0.003" in out.stderr


def test_sweep_with_one_bad_point_submits_nothing(tmp_path):
    out = launcher("submit", "-m", "recipe=tiny", "batch.global_batch_size=16,1000", f"runs_dir={tmp_path}", PATH=NO_SBATCH)
    assert out.returncode == 2 and "batch.global_batch_size=1000" in out.stderr and "sbatch" not in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_hostile_run_name_is_refused(tmp_path):
    out = launcher("submit", "recipe=tiny", "run_name='x;touch y'", f"runs_dir={tmp_path}", "--dry-run")
    assert out.returncode == 2 and "run_name=" in out.stderr and "fix:" in out.stderr


def test_submit_without_sbatch_says_so_and_writes_nothing(tmp_path):
    out = launcher("submit", "recipe=tiny", f"runs_dir={tmp_path}", PATH=NO_SBATCH)
    assert out.returncode == 2 and "sbatch is not on PATH" in out.stderr and "--dry-run" in out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overrides, points", [
    (["recipe=tiny", "optimizer.lr=0.001,0.003"], [["recipe=tiny", "optimizer.lr=0.001"], ["recipe=tiny", "optimizer.lr=0.003"]]),
    # Hydra's BasicSweeper: the cartesian product, the last key varying fastest
    (["a=1,2", "b=x,y"], [["a=1", "b=x"], ["a=1", "b=y"], ["a=2", "b=x"], ["a=2", "b=y"]]),
    (["seed=range(1,4)"], [["seed=1"], ["seed=2"], ["seed=3"]]),
    (["recipe=tiny"], [["recipe=tiny"]]),
])
def test_sweep_points_follow_hydra_multirun(overrides, points):
    from launcher.submit import sweep_points

    assert sweep_points(overrides) == points


def test_sweep_with_a_fixed_run_name_is_refused(tmp_path):
    out = launcher("submit", "-m", "recipe=tiny", "optimizer.lr=0.001,0.003", "run_name=same", f"runs_dir={tmp_path}", "--dry-run")
    assert out.returncode == 2 and "run_name='same'" in out.stderr and "two jobs of this submission" in out.stderr


def test_calibration_script_asks_for_whole_nodes_briefly_and_quotes_what_it_writes(tmp_path):
    """`launcher submit --calibrate --dry-run`: the nodes and ranks of cluster.*, --exclusive, a 30-minute limit
    (or cluster.time where shorter), the profile path and job dir shell-quoted, nothing written, no SLURM needed."""
    runs = tmp_path / "runs with space"
    args = [LAUNCHER, "submit", "--calibrate", "cluster=h100-80gb", "cluster.nodes=4", "cluster.account=proj",
            f"runs_dir={runs}", "--out", "profiles/it's.yaml", "--dry-run"]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PATH": NO_SBATCH})
    assert out.returncode == 0, out.stderr
    opts = sbatch_options(out.stdout)
    assert (opts["--nodes"], opts["--gpus-per-node"], opts["--time"], opts["--account"]) == ("4", "8", "00:30:00", "proj")
    assert "--exclusive" in opts and "--nproc_per_node=8" in out.stdout
    assert "OUT=" + shlex.quote(str(tmp_path / "profiles" / "it's.yaml")) in out.stdout
    assert re.search(r"^JOB_DIR='" + re.escape(str(runs)) + r"/calibrate-\d{8}-\d{6}'$", out.stdout, re.M)
    assert not runs.exists() and not (tmp_path / "profiles").exists()
    short = subprocess.run([*args[:-1], "cluster.time=7", "--dry-run"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PATH": NO_SBATCH})
    assert sbatch_options(short.stdout)["--time"] == "00:07:00"
    # Without sbatch on PATH a real submission stops before any file is written.
    real = subprocess.run(args[:-1], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": NO_SBATCH})
    assert real.returncode == 2 and "sbatch is not on PATH" in real.stderr and not runs.exists()


def test_network_only_calibration_keeps_the_profile_it_names_and_refuses_one_that_does_not_fit(tmp_path):
    """`launcher submit --calibrate --network-only`: the ranks measure only the network ("network") and the job's fit
    keeps cluster.profile's other fields (its absolute path on the --fit line); a profile of another device kind or
    another ranks a node, or none, is refused before anything is written (exit 2, the key named)."""
    import yaml

    doc = yaml.safe_load((REPO / "bench/gpu/results/2026-11-28-h200/profile-h200.yaml").read_text())
    doc["measurements"]["local_world"] = 8          # as if calibrated on one 8-GPU node
    node = tmp_path / "node 8.yaml"
    node.write_text(yaml.safe_dump(doc))
    runs = tmp_path / "runs"

    def run(*extra):
        return subprocess.run([LAUNCHER, "submit", "--calibrate", "cluster=h100-80gb", "cluster.nodes=16",
                               f"runs_dir={runs}", "--out", "profiles/16.yaml", *extra], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": NO_SBATCH})

    out = run("--network-only", f"cluster.profile={node}", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert re.search(r'-m launcher\.runtime\.calibrate "\$RAW" cuda \S+ network$', out.stdout, re.M)
    assert f'--fit "$RAW" "$OUT" {shlex.quote(str(node))}\n' in out.stdout
    # Each node checks it is the base's node type before any rank measures: a step before the ranks' srun.
    check = f'"$PYTHON" -m launcher.runtime.calibrate --node-type {shlex.quote(str(node))} cuda\n'
    assert check in out.stdout and out.stdout.index(check) < out.stdout.index("-m torch.distributed.run")
    whole = run(f"cluster.profile={node}", "--dry-run")
    assert re.search(r'calibrate "\$RAW" cuda \S+ all$', whole.stdout, re.M) and '--fit "$RAW" "$OUT"\n' in whole.stdout
    assert "--node-type" not in whole.stdout

    for extra, key, said in (
            (("--network-only",), "cluster.profile", "no profile is given"),
            (("--network-only", f"cluster.profile={REPO / 'bench/steptime/profile.yaml'}"), "cluster.profile",
             "measured on cpu ranks and this calibration runs cuda ranks"),
            (("--network-only", f"cluster.profile={node}", "cluster.gpus_per_node=4"), "cluster.gpus_per_node",
             "measured with 8 ranks a node")):
        bad = run(*extra)
        assert bad.returncode == 2 and key in bad.stderr and said in " ".join(bad.stderr.split()), bad.stderr
    assert not runs.exists() and not (tmp_path / "profiles").exists()
    train = subprocess.run([LAUNCHER, "submit", "--network-only", "recipe=tiny", f"runs_dir={runs}", "--dry-run"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": NO_SBATCH})
    assert train.returncode == 2 and "--network-only" in train.stderr and "calibration job" in train.stderr


def test_local_network_only_calibration_refuses_a_base_from_another_cpu_before_any_rank_starts(tmp_path):
    """`launcher calibrate --network-only` on this node, with a base profile that names another CPU model: exit 2 with
    the paragraph (the key, both models, the fix) at once, no rank started, no profile written. The CPU model is
    read by the test from /proc/cpuinfo, not by the launcher's code (slurm_helpers.cpu_models)."""
    from slurm_helpers import cpu_models, profile_naming

    host_cpu, other_cpu = cpu_models()
    base = profile_naming(REPO / "bench/steptime/profile.yaml", tmp_path / "other-cpu.yaml", "cpu_model", other_cpu)
    out = tmp_path / "profiles" / "net.yaml"
    bad = subprocess.run([LAUNCHER, "calibrate", "--network-only", "cluster=cpu", "cluster.gpus_per_node=2",
                          f"cluster.profile={base}", "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    said = " ".join(bad.stderr.split())
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert f"cluster.profile='{base}'" in said and f"measured on {other_cpu!r}" in said and repr(host_cpu) in said
    assert "nothing was measured or written" in said and "fix: calibrate one node of this type whole" in said
    # No rank started: a network-only rank prints a line as each probe ends, the collectives first.
    assert "Traceback" not in bad.stderr and "calibrate: collectives" not in bad.stderr
    assert not out.parent.exists()
