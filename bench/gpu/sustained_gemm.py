"""One GEMM back to back for a minute: does the rate of a short burst hold under sustained load?

`launcher calibrate` times each GEMM shape for about a second, and the built-in A100 / H100 profiles take their
rates from cuBLAS benchmark figures (launcher/plan/profile.py), bursts both. A training run keeps the tensor cores
busy for hours, and a GPU at its power or thermal limit lowers its SM clock. The published runs whose time is mostly
large GEMMs are the ones the plan predicts too fast (bench/published/results.md: Narayanan et al.'s PTD-P rows
+10 .. +14%, BLOOM-176B +16%, MosaicML's 30B / 70B on H100s +11 .. +25% with their own kernels), and a uniform
derating of the compute rates would move the table's second view from 58% to 63% within 10% at x 0.95 (and the
headline not at all): a guess until the sustained rate is measured. This measures it: one square GEMM of `--side`
in `--dtype`, queued back to back, its rate in windows of `--window` seconds for `--seconds`, with the SM clock,
power draw and temperature nvidia-smi reads in each window (queried while the GEMMs run, so the GPU never idles
for it). Summary: the first window's rate (the burst), the median of the last third (sustained), their ratio.

    python3 bench/gpu/sustained_gemm.py --out DIR              # ~65 s on a GPU: DIR/sustained-gemm.json
    python3 bench/gpu/sustained_gemm.py --out DIR --device cpu --dtype fp32 --side 64 --seconds 1.5 --window 0.5

Plain torch: runs on a bare GPU image. The JSON is rewritten after every window, so a call cut short keeps what ran.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import time
from pathlib import Path

QUERY = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"
QUEUED = 4        # GEMMs issued between two looks at the clock (each synchronises): a window ends within 4 GEMMs


def _smi_start(device_index: int):
    """An nvidia-smi query started now (None without nvidia-smi); _smi_read collects it."""
    if shutil.which("nvidia-smi") is None:
        return None
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                             "-i", str(device_index)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _smi_read(proc) -> dict:
    names = QUERY.replace(".", "_").split(",")
    if proc is None:
        return dict.fromkeys(names)
    out, _ = proc.communicate(timeout=30)
    values = [v.strip() for v in out.strip().split(",")]
    if proc.returncode != 0 or len(values) != len(names):
        return dict.fromkeys(names)

    def number(v: str):
        try:
            return float(v)
        except ValueError:     # "[N/A]" on a GPU or driver that does not report it
            return None
    return dict(zip(names, map(number, values)))


def summarise(windows: list[dict]) -> dict:
    """The first window's rate, the median of the last third of the windows, and their ratio."""
    last = windows[-max(1, len(windows) // 3):]
    burst, sustained = windows[0]["tflops"], statistics.median(w["tflops"] for w in last)
    clocks = [w["clocks_sm"] for w in last if w["clocks_sm"] is not None]
    return {"burst_tflops": burst, "sustained_tflops": sustained, "sustained_over_burst": sustained / burst,
            "windows_in_sustained": len(last), "first_clocks_sm": windows[0]["clocks_sm"],
            "sustained_clocks_sm": statistics.median(clocks) if clocks else None}


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--side", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=1.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True     # as calibrate and training set it
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    a = torch.randn(args.side, args.side, device=dev, dtype=dtype)
    b = torch.randn(args.side, args.side, device=dev, dtype=dtype)
    c = torch.empty(args.side, args.side, device=dev, dtype=dtype)
    flops = 2 * args.side ** 3
    for _ in range(3):                                   # cuBLAS picks its kernel; the clocks leave idle
        torch.matmul(a, b, out=c)
    sync()
    result = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "dtype": args.dtype, "side": args.side, "flops_per_gemm": flops, "window_s": args.window,
              "seconds": args.seconds, "windows": []}
    index = dev.index if dev.index is not None else (torch.cuda.current_device() if dev.type == "cuda" else 0)
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        smi = _smi_start(index) if dev.type == "cuda" else None
        calls, t0 = 0, time.perf_counter()
        while True:
            for _ in range(QUEUED):
                torch.matmul(a, b, out=c)
            calls += QUEUED
            sync()
            elapsed = time.perf_counter() - t0
            if elapsed >= args.window:
                break
        window = {"t_s": round(t0 + elapsed - start, 3), "gemms": calls, "elapsed_s": elapsed,
                  "tflops": calls * flops / elapsed / 1e12, **_smi_read(smi)}
        result["windows"].append(window)
        result["summary"] = summarise(result["windows"])
        (out / "sustained-gemm.json").write_text(json.dumps(result, indent=1) + "\n")
    s = result["summary"]
    print(f"{result['device']} {args.dtype} GEMM {args.side}^3: burst {s['burst_tflops']:.1f} TFLOP/s, sustained "
          f"{s['sustained_tflops']:.1f} (x{s['sustained_over_burst']:.3f}) over {len(result['windows'])} windows; SM "
          f"clock {s['first_clocks_sm']} -> {s['sustained_clocks_sm']} MHz")


if __name__ == "__main__":
    main()
