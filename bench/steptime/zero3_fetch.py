"""What ZeRO-3 costs per Linear layer once its weight is above DeepSpeed's persistence threshold (1e5 elements) and
so is gathered and released around every use, against the hooks alone (below it), on one rank: a ZeRO-3 engine
over K bias-free Linear(d, d) layers less the same layers plain, forward + backward + step, at K = 8 and 40, the
difference of the differences over 32 (as `launcher calibrate` measures the hooks, launcher/runtime/calibrate.py).

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node=1 bench/steptime/zero3_fetch.py

Why: on one H200 the 1B LLaMA's ZeRO-3 step was 0.33 s over ZeRO-1's where the plan, with calibrate's hook costs
(measured below the threshold), charged 0.19 s (bench/gpu/results.md). The plan charges a gather only as link
traffic, and nothing at one rank.
"""

import logging
import os
import statistics
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from launcher.runtime.distributed import avoid_shm_comm_build  # noqa: E402


def median_s(fn, n: int = 20) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def per_layer_ms(d: int) -> float:
    extra = {}
    for k in (8, 40):
        torch.manual_seed(0)
        plain = nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(k)])
        x = torch.randn(4, d)
        t_plain = median_s(lambda: plain(x).sum().backward())
        model = nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(k)])
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3), config={
            "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True})

        def z3():
            engine.backward(engine(x).sum())
            engine.step()
        extra[k] = median_s(z3) - t_plain
        engine.destroy()
    return (extra[40] - extra[8]) / 32 * 1e3


def main() -> None:
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    for d in (32, 256, 320, 400, 640):
        print(f"d={d} ({d * d:,} elements, {'gathered' if d * d > 100_000 else 'persistent'}): "
              f"{per_layer_ms(d):.3f} ms per layer over plain", flush=True)


if __name__ == "__main__":
    main()
