"""What adding a backward's weight gradients into the held ones costs, measured in the runtime's own model against
the plan's charge (launcher/plan/steptime.py grad_accumulation). Diagnostic, not a test.

    .venv/bin/python bench/steptime/grad_accumulation.py                       # defaults below, one process
    .venv/bin/python bench/steptime/grad_accumulation.py --layers 8 --hidden 1024 --rounds 12

The runtime's LLaMA (launcher/runtime/model.py build_model, transformers' modules) at a shape whose parameters
outweigh its activations (few tokens, wide layers: the regime of a pipeline stage at micro-batch 1), one process
on one core. Each round runs one forward + backward with every .grad set to None first (autograd writes each
weight gradient) and one with the gradients of the round before still held (autograd's AccumulateGrad adds the
new ones into them), in alternating order; the difference of the two medians is what accumulation costs a
micro-batch. The plan charges memory_s(parameters x 3 x dtype bytes, parameter tensors, profile) with the memory
bandwidth and per-kernel cost of the profile given (default bench/steptime/profile.yaml, this machine's
calibration), the same call steptime.grad_accumulation makes per micro-batch after the first.
The process runs under glibc's settings of a CPU rank's steps (it starts itself again under
launcher/protocol.py CPU_MALLOC_ENV, then launcher/runtime/cpualloc.py recycle_step_buffers switches them as a
ZeRO-1 rank does); `--build-malloc` keeps the build's (a fresh mapping, zero-filled, for every freed gradient of
4 MiB or more).
Readings: bench/steptime/results.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from launcher.config.compose import compose
from launcher.plan.profile import load_profile
from launcher.plan.steptime import memory_s
from launcher.protocol import CPU_MALLOC_ENV
from launcher.runtime.cpualloc import recycle_step_buffers
from launcher.runtime.model import build_model

HERE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=32, help="sequence length of the one sequence a micro-batch")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--profile", default=str(HERE / "profile.yaml"))
    ap.add_argument("--build-malloc", action="store_true", help="keep glibc's build settings (no switch)")
    args = ap.parse_args()
    if any(os.environ.get(k) != v for k, v in CPU_MALLOC_ENV.items()):     # start again as a CPU rank starts
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **CPU_MALLOC_ENV})
    switched = False if args.build_malloc else recycle_step_buffers("cpu", 1)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = compose(["recipe=tiny", f"model.num_hidden_layers={args.layers}", f"model.hidden_size={args.hidden}",
                   f"model.intermediate_size={args.hidden * 8 // 3 // 64 * 64}", "model.num_attention_heads=8",
                   "model.num_key_value_heads=8"]).model
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = build_model(cfg, 0).to(dtype).train()
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    x = torch.randint(0, cfg.vocab_size, (1, args.tokens))

    def step(keep: bool) -> float:
        if not keep:
            for p in params:
                p.grad = None
        t0 = time.perf_counter()
        model(input_ids=x, labels=x).loss.backward()
        return time.perf_counter() - t0

    step(False), step(True)     # warm-up: both paths once
    fresh, held = [], []
    for r in range(args.rounds):
        for keep in ((False, True) if r % 2 else (True, False)):
            (held if keep else fresh).append(step(keep))
    measured = statistics.median(held) - statistics.median(fresh)
    prof = load_profile(args.profile)
    w = 4 if args.dtype == "fp32" else 2
    planned = memory_s(n * 3 * w, len(params), prof)
    print(f"{args.layers} layers, hidden {args.hidden}, {args.tokens} tokens, {args.dtype}: {n / 1e6:.1f}M parameters "
          f"in {len(params)} tensors; forward + backward {statistics.median(fresh) * 1e3:.1f} ms with the gradients "
          f"written, {statistics.median(held) * 1e3:.1f} ms added into held ones (medians of {args.rounds}); "
          f"malloc: {'step' if switched else 'build'} settings")
    print(f"accumulation: measured {measured * 1e3:.1f} ms, planned {planned * 1e3:.1f} ms "
          f"({n * 3 * w / 1e9:.2f} GB at {prof.memory_gbps:.1f} GB/s + {len(params)} kernels), "
          f"measured / planned {measured / planned:.2f}")


if __name__ == "__main__":
    main()
