"""launcher/runtime/cpualloc.py in a fresh process under the ranks' malloc settings: an 8 MiB buffer allocated,
filled and freed again and again faults its pages in every time under the build settings, and no longer once the
step settings are on; a user's own settings and ZeRO-3 keep the build settings."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.protocol import CPU_MALLOC_ENV

REPO = Path(__file__).resolve().parents[2]

# libc's malloc / memset / free straight from ctypes (no torch): the minor page faults of 20 rounds of an 8 MiB
# buffer (2,048 pages), before and after recycle_step_buffers.
CHILD = r"""
import ctypes, json, resource, sys
from launcher.runtime.cpualloc import recycle_step_buffers
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

def faults(rounds=20, size=8 << 20):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        p = libc.malloc(size)
        libc.memset(p, 1, size)
        libc.free(p)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0

before = faults()
switched = recycle_step_buffers(sys.argv[1], int(sys.argv[2]))
faults()   # the first round after the switch maps the heap once
print(json.dumps({"before": before, "switched": switched, "after": faults()}))
"""


def _run(env_extra: dict, device="cpu", zero_stage=1) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env_extra | {"PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", CHILD, device, str(zero_stage)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_step_settings_stop_the_page_faults_of_a_reused_large_buffer():
    r = _run(CPU_MALLOC_ENV)
    assert r["switched"]
    assert r["before"] >= 20 * 2048 * 0.9        # mapped afresh every round: each of its 2,048 pages faults again
    assert r["after"] < 2048                     # reused from the heap


@pytest.mark.parametrize("env_extra, device, zero_stage", [
    ({**CPU_MALLOC_ENV, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}, "cpu", 1),   # the user's own threshold
    (CPU_MALLOC_ENV, "cpu", 3),                                              # ZeRO-3 gathers parameters every step
    (CPU_MALLOC_ENV, "cuda", 1),                                             # GPU ranks: glibc's defaults
])
def test_user_settings_zero3_and_gpu_ranks_keep_the_build_settings(env_extra, device, zero_stage):
    r = _run(env_extra, device, zero_stage)
    assert not r["switched"]
    assert r["after"] >= 20 * 2048 * 0.9       # still mapped afresh every round
