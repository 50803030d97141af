"""Names shared by the launchers (`launcher train`, the sbatch script) and the loop; no imports, no torch.

The SLURM rendering (launcher/slurm.py) sits before the runtime in the import order, yet its script must
name the same run-dir files and torchrun flags as launcher/runtime/launch.py: both read them from here.
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
