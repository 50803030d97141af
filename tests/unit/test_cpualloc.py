"""launcher/runtime/cpualloc.py in a fresh process under the ranks' malloc settings: an 8 MiB buffer allocated,
filled and freed again and again faults its pages in every time under the build settings, and no longer once the
step settings are on; a user's own settings, GPU ranks and a ZeRO-3 run that gathers a buffer the build's threshold
would map keep the build settings."""

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
switched = recycle_step_buffers(sys.argv[1], int(sys.argv[2]), None if sys.argv[3] == "-" else int(sys.argv[3]))
faults()   # the first round after the switch maps the heap once
print(json.dumps({"before": before, "switched": switched, "after": faults()}))
"""


def _run(env_extra: dict, device="cpu", zero_stage=1, gathered=None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env_extra | {"PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", CHILD, device, str(zero_stage), "-" if gathered is None else str(gathered)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_step_settings_stop_the_page_faults_of_a_reused_large_buffer():
    r = _run(CPU_MALLOC_ENV)
    assert r["switched"]
    assert r["before"] >= 20 * 2048 * 0.9        # mapped afresh every round: each of its 2,048 pages faults again
    assert r["after"] < 2048                     # reused from the heap


@pytest.mark.parametrize("env_extra, device, zero_stage, gathered", [
    ({**CPU_MALLOC_ENV, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}, "cpu", 1, None),   # the user's own threshold
    (CPU_MALLOC_ENV, "cpu", 3, None),                      # ZeRO-3, what it gathers not known
    (CPU_MALLOC_ENV, "cpu", 3, 4 << 20),                   # ZeRO-3 gathering a 4 MiB buffer the build would map
    (CPU_MALLOC_ENV, "cuda", 1, None),                     # GPU ranks: glibc's defaults
])
def test_user_settings_zero3_and_gpu_ranks_keep_the_build_settings(env_extra, device, zero_stage, gathered):
    r = _run(env_extra, device, zero_stage, gathered)
    assert not r["switched"]
    assert r["after"] >= 20 * 2048 * 0.9       # still mapped afresh every round


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_zero3_that_gathers_less_than_the_build_threshold_recycles_too():
    # Everything ZeRO-3 gathers stays under the build's 4 MiB mmap threshold (recipe=tiny's embedding and head: 2 MiB
    # in fp32): its gathers come from the heap under either setting, so the step settings go on.
    r = _run(CPU_MALLOC_ENV, "cpu", 3, (4 << 20) - 1)
    assert r["switched"]
    assert r["after"] < 2048


GATHERED_CHILD = """
import sys, os
import torch
import launcher  # noqa: F401
from launcher.runtime.distributed import avoid_shm_comm_build, leave_rank
avoid_shm_comm_build("cpu")
import deepspeed
from launcher.runtime.cpualloc import zero3_gathered_bytes
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
deepspeed.init_distributed(dist_backend="gloo")
# 512 x 512 = 262,144 elements: over the 1e5 persistence threshold, gathered; 64 x 64 = 4,096 and the bias: kept whole
model = torch.nn.Sequential(torch.nn.Linear(512, 512, bias=False), torch.nn.Linear(512, 64), torch.nn.Linear(64, 64))
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
    "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_allow_untested_optimizer": True, "bf16": {"enabled": sys.argv[2] == "bf16"},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100000}})
print("gathered:", zero3_gathered_bytes(engine.module))
leave_rank(0)
"""


@pytest.mark.parametrize("dtype, width", [("fp32", 4), ("bf16", 2)])
def test_zero3_gathered_bytes_counts_what_deepspeed_does_not_keep_whole(tmp_path, dtype, width):
    # A real ZeRO-3 engine: the 512 x 512 weight (262,144) and the 512 x 64 one (32,768, under the threshold, kept
    # whole) -> only the first is gathered, in the engine's dtype.
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    proc = subprocess.run([sys.executable, "-c", GATHERED_CHILD, port, dtype], cwd=REPO, capture_output=True,
                          text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                               "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"gathered: {262_144 * width}" in proc.stdout, proc.stdout[-2000:]
