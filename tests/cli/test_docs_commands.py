"""Every command in README.md and docs/*.md, run exactly as written (a new command there is covered automatically).

Commands are read from the fenced code blocks: every line of a ```bash block, and the `launcher ...` lines of
an untagged block (the others hold file trees). `# ...` lines right under a command are its documented output:
the command must then fail with status 2 and print that text (a trailing `...` marks where the docs cut it).

- `launcher plan` / `show` / `submit --dry-run`: run as written; exit 0 (or the documented failure).
- `launcher submit` without --dry-run: run as written with a PATH that has no sbatch (this suite must not queue
  jobs, and gives the same result with or without SLURM here): every check runs and passes, and the one error
  is the last one, "sbatch is not on PATH". Real submissions: tests/slurm/test_slurm_jobs.py.
- Everything else (training for minutes, placeholders, installing SLURM) is in EXCEPTIONS with the reason and
  the test that covers it; a `launcher train` exception still has its overrides composed and validated here
  by `launcher show` with the same arguments.
A command in neither class fails the test: decide how it is covered.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, venv_bin

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
VENV_BIN = str(Path(sys.executable).parent)

# command as written (without a leading `.venv/bin/`) -> why it is not run here, and what runs it instead.
EXCEPTIONS = {
    "make demo": "trains recipe=tiny for 200 steps (1-3 min): the `launcher train recipe=tiny` line below",
    "make test": "is this test suite",
    "launcher train recipe=tiny": "200 steps of the ~1.3M-param model (1-3 min); `launcher train` on 2 CPU ranks end to end: "
                                  "tests/train/test_train_cli.py (recipe=tiny with the harness's small model and steps)",
    "launcher train recipe=tiny parallel.zero_stage=3 precision=bf16 train.steps=500":
        "500 steps (minutes); ZeRO-3 and bf16 against a single-process reference: tests/train/test_train_runs.py",
    "launcher train recipe=tiny resume=auto": "200 steps when there is no run to resume; preempt + resume=auto step for step: "
                                              "tests/train/test_train_cli.py::test_preempted_run_resumes_exactly",
    "launcher train recipe=tiny run_name=elastic cluster.gpus_per_node=4 batch.micro_batch_size=4":
        "200 steps on 4 CPU ranks (minutes); the same 4 -> 2 resume on the harness's small model, held to an uninterrupted "
        "2-rank run: tests/train/test_elastic_resume.py",
    "launcher train recipe=tiny run_name=elastic cluster.gpus_per_node=2 batch.micro_batch_size=4 resume=auto":
        "continues the run above (minutes); DP 4 -> 2 with --config ... resume=auto: tests/train/test_elastic_resume.py",
    "launcher export runs/<run>/checkpoints/latest out/hf-model": "<run> is a placeholder; export of every ZeRO stage: "
                                                                  "tests/train/test_train_runs.py::test_export_reproduces_training_logits",
    "launcher train recipe=tiny cluster.gpus_per_node=4 parallel.context_degree=2 data.seq_length=1024":
        "200 steps at 1,024 tokens on 4 ranks (minutes); ring-attention CP against 1 rank under ZeRO 0-3: "
        "tests/parallel/test_context_parallel.py",
    "launcher train recipe=tiny cluster.gpus_per_node=4 parallel.tensor_degree=2 parallel.sequence_parallel=true":
        "200 steps on 4 CPU ranks (minutes); the same command with the harness's small model and 22 steps (trains, resumes "
        "exactly, exports): tests/parallel/test_train_parallel.py::test_issue_command_tp2_sp_zero2",
    "launcher train recipe=tiny cluster.gpus_per_node=4 parallel.context_degree=2 parallel.tensor_degree=2":
        "200 steps on 4 CPU ranks (minutes); the same command with 22 steps (trains, resumes exactly, exports): "
        "tests/parallel/test_train_parallel.py::test_issue_command_cp2_tp2; against 1 rank: tests/parallel/test_context_parallel.py",
    "launcher train recipe=tiny cluster.gpus_per_node=4 parallel.context_degree=2 parallel.pipeline_degree=2 parallel.zero_stage=1":
        "200 steps on 4 CPU ranks (minutes); the same command with 8 steps (trains, resumes exactly, exports): "
        "tests/parallel/test_train_parallel.py::test_cp2_pp2_trains_resumes_exports; against 1 rank: "
        "tests/parallel/test_context_parallel.py",
    "launcher train recipe=tiny data=hf data.streaming=true data.paths=[/data/web.jsonl] data.tokenizer_path=/data/tokenizer.json":
        "placeholder paths; a streamed `launcher train` on 2 CPU ranks (3 steps + resume = 6 steps, eval): "
        "tests/train/test_stream.py::test_streamed_two_rank_run_resumes_exactly",
    "launcher submit --calibrate --network-only cluster=cpu cluster.nodes=2 cluster.gpus_per_node=2 "
    "cluster.profile=bench/steptime/profile.yaml --out profiles/two-nodes.yaml":
        "its profile path is relative to the repository root, and this test runs commands in an empty directory; the "
        "same job on the local 2-node SLURM (with the test's runs_dir, time limit and port): "
        "tests/slurm/test_slurm_calibrate.py; its checks, refusals and script: "
        "tests/slurm/test_render.py::test_network_only_calibration_keeps_the_profile_it_names_and_refuses_one_that_does_not_fit",
    "slurm/local/start.sh [STATE_DIR]": "installs and starts SLURM (apt-get, root): the session fixture of tests/slurm/conftest.py",
    "export SLURM_CONF=/tmp/launcher-slurm/slurm.conf": "shell setup for the local cluster: tests/slurm/slurm_helpers.py cluster_env",
    "slurm/local/stop.sh [STATE_DIR] [--purge]": "stops the local SLURM: the session fixture of tests/slurm/conftest.py",
}


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(file:line, command, documented output lines) for every command in the docs' code blocks."""
    found = []
    for doc in DOCS:
        lang = None  # None: outside a block
        last = None
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            fence = re.match(r"^```(\w*)\s*$", line)
            if fence:
                lang, last = (fence[1] if lang is None else None), None
                continue
            if lang is None or not line.strip():
                last = None
                continue
            if line.lstrip().startswith("#"):
                if last is not None:  # output shown under the command
                    last[2].append(line.lstrip()[1:].strip())
                continue
            command = re.sub(r"^\.venv/bin/", "", line.split("  #")[0].strip())
            if lang == "" and command.split()[0] != "launcher":
                last = None
                continue
            if lang not in ("", "bash", "sh"):
                continue
            last = (f"{doc.relative_to(REPO)}:{n}", command, [])
            found.append(last)
    return found


COMMANDS = documented_commands()


def run(argv: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([venv_bin("launcher"), *argv], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_the_docs_have_commands_and_every_exception_is_still_documented():
    written = {c for _, c, _ in COMMANDS}
    assert len(COMMANDS) >= 15 and any(c.startswith("launcher plan") for c in written)
    assert set(EXCEPTIONS) <= written, f"stale EXCEPTIONS: {set(EXCEPTIONS) - written}"


@pytest.mark.parametrize("where, command, output", COMMANDS, ids=[f"{w} {c}" for w, c, _ in COMMANDS])
def test_documented_command_runs_as_written(where, command, output, tmp_path):
    argv = shlex.split(command)
    if command in EXCEPTIONS:
        if argv[:2] == ["launcher", "train"]:
            shown = run(["show", *argv[2:]], tmp_path)
            assert shown.returncode == 0, f"{where}: the overrides of `{command}` do not validate:\n{shown.stderr}"
        return
    assert argv[0] == "launcher", f"{where}: `{command}` is neither run here nor in EXCEPTIONS (with its reason)"
    queues = argv[1] == "submit" and "--dry-run" not in argv
    # cwd: an empty directory, so a command that writes (runs/, a job dir) would show it.
    out = run(argv[1:], tmp_path, **({"PATH": VENV_BIN} if queues else {}))
    text = " ".join((out.stdout + out.stderr).split())
    if output:
        assert out.returncode == 2, f"{where}: `{command}` is documented to fail:\n{out.stdout[-2000:]}{out.stderr}"
        for shown in output:
            for fragment in filter(None, (f.strip(" ,") for f in shown.split("..."))):
                assert " ".join(fragment.split()) in text, f"{where}: documented output {fragment!r} not in:\n{out.stderr}"
    elif queues:
        assert out.returncode == 2 and "sbatch is not on PATH" in out.stderr, f"{where}: {out.stderr}"
        assert "Traceback" not in out.stderr and out.stderr.count("config error") == 1
    else:
        assert out.returncode == 0, f"{where}: `{command}` exited {out.returncode}:\n{out.stderr}"
    assert list(tmp_path.iterdir()) == [], f"{where}: `{command}` wrote {list(tmp_path.iterdir())}"
