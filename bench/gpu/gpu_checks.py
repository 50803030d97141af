"""GPU pack checks (bench/gpu/run.sh calls these; each writes JSON under --out and prints one line per result).

    python bench/gpu/gpu_checks.py env --out DIR      # env.json: GPU, driver, CUDA, torch, NCCL, deepspeed versions
    python bench/gpu/gpu_checks.py checks --out DIR   # checks.json:
        nccl_preflight   the launcher's own per-node preflight (launcher/runtime/preflight.py, as sbatch runs it)
        nccl_allreduce   every local GPU in one NCCL group: a 256 MiB bf16 all-reduce, checked and timed
                         (bus bandwidth 2(n-1)/n x bytes / time, NCCL's definition; skipped with 1 GPU)
        fused_adam       DeepSpeed's FusedAdam (JIT-built here: needs nvcc + ninja) against torch.optim.AdamW
                         after 3 steps on the same parameters and gradients
        sdpa_flash       bf16 causal SDPA forced to the flash backend runs; the kernels the default call
                         launches (torch.profiler) say which backend `launcher train` gets; TFLOP/s of both
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def launcher_gpu(name: str, memory_gib: float) -> str:
    """The launcher catalog name of a torch device name (launcher/config/hardware.py)."""
    n = name.upper()
    if "H200" in n:
        return "h200"
    if "H100" in n:
        return "h100-80gb"
    if "A100" in n:
        return "a100-80gb" if memory_gib > 60 else "a100-40gb"
    return "unknown"


def cmd_env(out: Path) -> int:
    import torch

    info = {"host": socket.gethostname(), "python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpus": torch.cuda.device_count()}
    try:
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:
        info["nccl"] = f"unavailable: {exc}"
    if info["gpus"]:
        p = torch.cuda.get_device_properties(0)
        info.update(gpu_name=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), sm_count=p.multi_processor_count,
                    compute_capability=f"{p.major}.{p.minor}", launcher_gpu=launcher_gpu(p.name, p.total_memory / 2**30))
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except Exception as exc:
        info["nvidia_smi"] = f"unavailable: {exc}"
    for mod in ("deepspeed", "transformers", "hydra", "omegaconf", "pydantic"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as exc:
            info[mod] = f"not importable: {type(exc).__name__}: {exc}"
    (out / "env.json").write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info, indent=1))
    return 0 if info["gpus"] else 1


def nccl_preflight(n_gpus: int) -> dict:
    env = {**os.environ, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_ADDR": "127.0.0.1",
           "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "launcher.runtime.preflight", "--device", "cuda", "--gpus-per-node",
                        str(n_gpus), "--port", "29531", "--timeout-s", "120"], env=env, capture_output=True, text=True, timeout=300)
    return {"ok": r.returncode == 0, "output": (r.stdout + r.stderr).strip()[-2000:]}


def _allreduce_worker(rank: int, world: int, port: int, q) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    n = 128 * 2**20  # 128 Mi elements of bf16 = 256 MiB
    x = torch.full((n,), float(rank + 1), dtype=torch.bfloat16, device="cuda")
    dist.all_reduce(x)
    ok = float(x[0]) == world * (world + 1) / 2 and float(x[-1]) == world * (world + 1) / 2
    times = []
    for _ in range(10):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        t = sorted(times)[len(times) // 2]
        q.put({"ok": ok, "ranks": world, "bytes": n * 2, "median_s": t, "bus_gbps": 2 * (world - 1) / world * n * 2 / t / 1e9})
    dist.destroy_process_group()


def nccl_allreduce(n_gpus: int) -> dict:
    if n_gpus < 2:
        return {"skipped": "one GPU: no peer to all-reduce with (the preflight above still initialises NCCL)"}
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.spawn(_allreduce_worker, args=(n_gpus, 29532, q), nprocs=n_gpus, join=True)
    return q.get()


def fused_adam() -> dict:
    import torch

    torch.manual_seed(0)
    params = [torch.randn(4096, 1024, device="cuda"), torch.randn(1024, device="cuda")]
    grads = [[torch.randn_like(p) for p in params] for _ in range(3)]
    from launcher.runtime.distributed import readable_arch_list_for_deepspeed

    readable_arch_list_for_deepspeed()  # as `launcher train` does: DeepSpeed cannot read the image's "9.0a"
    t0 = time.perf_counter()
    from deepspeed.ops.adam import FusedAdam

    a = [p.clone().requires_grad_() for p in params]
    b = [p.clone().requires_grad_() for p in params]
    opt_a = FusedAdam(a, lr=1e-3, weight_decay=0.1, adam_w_mode=True)
    build_s = time.perf_counter() - t0
    opt_b = torch.optim.AdamW(b, lr=1e-3, weight_decay=0.1, foreach=False)
    for g in grads:
        for p, gg in zip(a, g):
            p.grad = gg.clone()
        for p, gg in zip(b, g):
            p.grad = gg.clone()
        opt_a.step()
        opt_b.step()
    diff = max(float((x - y).abs().max()) for x, y in zip(a, b))
    moved = max(float((x - p).abs().max()) for x, p in zip(a, params))
    return {"ok": diff < 1e-5 and moved > 1e-4, "max_abs_diff_vs_torch_adamw": diff, "max_update": moved,
            "build_and_load_s": round(build_s, 1)}


def sdpa_flash() -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d = 4, 16, 2048, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * b * h * s * s * d / 2  # QK^T and AV, causal half (forward only)

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / 20

    res = {}
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            res["flash_forced_tflops"] = flops / timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)) / 1e12
        res["flash_available"] = True
    except Exception as exc:
        res["flash_available"] = False
        res["flash_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    res["default_tflops"] = flops / timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)) / 1e12
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    res["default_kernels"] = kernels[:12]
    res["default_uses_flash"] = any("flash" in k.lower() for k in kernels)
    res["ok"] = res["flash_available"] and res["default_uses_flash"]
    return res


def cmd_checks(out: Path) -> int:
    import torch

    n = torch.cuda.device_count()
    results = {}
    for name, fn in (("nccl_preflight", lambda: nccl_preflight(n)), ("nccl_allreduce", lambda: nccl_allreduce(n)),
                     ("fused_adam", fused_adam), ("sdpa_flash", sdpa_flash)):
        t0 = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as exc:
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        results[name]["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'traceback'})}", flush=True)
    (out / "checks.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r.get("ok", True) for r in results.values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("env", "checks"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return cmd_env(out) if args.what == "env" else cmd_checks(out)


if __name__ == "__main__":
    sys.exit(main())
