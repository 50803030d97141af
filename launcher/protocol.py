"""Names shared by the launchers (`launcher train`, the sbatch script) and the loop; no imports, no torch.

The SLURM rendering (launcher/slurm.py) sits before the runtime in the import order, yet its script must
name the same run-dir files and torchrun flags as launcher/runtime/launch.py and rundir.py: both read them from here.
"""

CONFIG_FILE = "config.yaml"
DEEPSPEED_FILE = "deepspeed.json"
# Written by rank 0 when the loop stopped on SIGUSR1/SIGTERM after saving; the sbatch script requeues the
# job when it finds it, and clears it when a (requeued) job starts.
PREEMPTED_FILE = "preempted"
# torchrun forwards these to its workers (SIGUSR1 is not in its default list) and waits this long
# for them to save before it kills them.
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
TORCHRUN_SHUTDOWN_TIMEOUT_S = 300


def torchrun_grace_flags() -> list:
    """["--shutdown-timeout=300"] where the installed torchrun takes that flag (the seconds it lets the ranks save
    after passing a signal on, before SIGKILL; its own default is 30), else []: torch 2.11's torchrun refuses it,
    and with it the whole run (seen on the GPU image, bench/gpu/results.md). Read from torch/distributed/run.py's
    text, not by importing torch: `launcher train` and the sbatch script (on its batch node) ask before starting it."""
    from importlib.metadata import PackageNotFoundError, distribution
    from pathlib import Path

    try:
        has = "--shutdown-timeout" in Path(distribution("torch").locate_file("torch/distributed/run.py")).read_text()
    except (PackageNotFoundError, OSError):
        has = True  # not found as a distribution (a source build, say): the flag of the torch we test on
    return [f"--shutdown-timeout={TORCHRUN_SHUTDOWN_TIMEOUT_S}"] if has else []

# Signals that mean "checkpoint now and exit 0": SLURM sends SIGUSR1 before the time limit
# (sbatch --signal) and SIGTERM on scancel / preemption; SIGHUP comes when the terminal or SSH session of a
# local run closes (its default action would kill the run with no final save). torchrun forwards them all.
PREEMPT_SIGNALS = ("SIGUSR1", "SIGTERM", "SIGHUP")
# Preemption signals that arrived before the loop installed its handler (see remember_early_preemption).
EARLY_PREEMPTION: list = []


def remember_early_preemption() -> None:
    """In a rank, from the first line of `python -m launcher`: record SIGUSR1/SIGTERM/SIGHUP instead of dying.

    SLURM may send the --signal "up to 60 seconds earlier than specified" (sbatch(1), --signal), i.e. while a
    rank still imports torch and DeepSpeed (seconds); Python's default for SIGUSR1 is to exit, which loses the
    checkpoint and the requeue. launcher.runtime.preemption.PreemptionFlag takes over the record.
    """
    import signal

    def record(signum, _frame):
        EARLY_PREEMPTION.append(signal.Signals(signum).name)

    for name in PREEMPT_SIGNALS:
        signal.signal(getattr(signal, name), record)


# A rank's exit status after stopping on a non-finite loss (launcher/train.py; launcher/runtime/launch.py reports it).
EXIT_NONFINITE = 3


# glibc malloc for CPU ranks (`launcher train`, `launcher calibrate` and the sbatch script set each unless the user
# already has). ZeRO-3 all-gathers whole parameters and frees them again at every layer; with glibc's defaults (8 x
# cores arenas, a dynamic mmap threshold that climbs to 32 MiB) the freed buffers stay in the ranks' heaps.
# Measured (bench/build/results.md, "glibc"): the 0.8B LLaMA as ZeRO-3 x DP4 on 4 CPU ranks was OOM-killed by a
# 14 GiB cgroup in its first step without these; with them each rank peaked at 2.57-2.64 GiB after that step.
# Buffers above 4 MiB are mapped and unmapped on free; 2 arenas bound the rest. These hold while the engine is
# built; the steps run with larger thresholds (launcher/runtime/cpualloc.py).
CPU_MALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(4 << 20)}
