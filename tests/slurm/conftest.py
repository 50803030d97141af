"""The local 2-node SLURM cluster, once per session: started by slurm/local/start.sh, stopped at the end.

Tests that need it take the `slurm_env` fixture. They skip (with the reason) only where slurm is missing
and cannot be installed (start.sh exits 3: no apt-get, or not root); any other failure to start is a failure.
"""

import subprocess

import pytest

from slurm_helpers import CANNOT_INSTALL, START, STOP, TEST_PORTS, cluster_env


@pytest.fixture(scope="session")
def slurm_state(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm")
    env = {**cluster_env(state), **TEST_PORTS}
    started = subprocess.run(["bash", str(START), str(state)], env=env, capture_output=True, text=True, timeout=600)
    if started.returncode == CANNOT_INSTALL:
        pytest.skip(f"no SLURM here and it cannot be installed: {started.stderr.strip()}")
    assert started.returncode == 0, f"slurm/local/start.sh failed:\n{started.stdout}\n{started.stderr}"
    yield state
    subprocess.run(["bash", str(STOP), str(state)], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def slurm_env(slurm_state):
    return cluster_env(slurm_state)


@pytest.fixture(scope="session")
def slurm_cache(tmp_path_factory):
    """One tokenizer/token cache for the SLURM tests (built at submit time on the 'login node')."""
    return tmp_path_factory.mktemp("slurm-cache")
