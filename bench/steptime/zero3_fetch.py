"""What ZeRO-3 costs per Linear layer once its weight is above DeepSpeed's persistence threshold (1e5 elements) and
so is gathered and released around every use, against the hooks alone (below it), on one rank: a ZeRO-3 engine
over K bias-free Linear(d, d) layers less the same layers plain, forward + backward + step, at K = 8 and 40, the
difference of the differences over 32 (launcher/runtime/calibrate.py engine_cost_per_unit, which calibrate runs on
32-wide units for the hooks).

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node=1 bench/steptime/zero3_fetch.py

Why: on one H200 the 1B LLaMA's ZeRO-3 step was 0.33 s over ZeRO-1's where the plan, with calibrate's hook costs
(measured below the threshold), charged 0.19 s (bench/gpu/results.md). The plan charges a gather only as link
traffic, and nothing at one rank.
"""

import logging
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
from torch import nn  # noqa: E402

from launcher.runtime.calibrate import engine_cost_per_unit  # noqa: E402
from launcher.config.compose import compose  # noqa: E402
from launcher.runtime.distributed import avoid_shm_comm_build  # noqa: E402

# The clipping a default run has (optimizer.grad_clip), as calibrate passes it.
GRAD_CLIP = float(compose([]).optimizer.grad_clip)


def per_layer_ms(d: int) -> float:
    """calibrate's measurement (a median of 20 runs each, no time budget) on Linear(d, d) units."""
    _, per_unit_s = engine_cost_per_unit(lambda: nn.Linear(d, d, bias=False), d, "cpu", sync=lambda: None,
                                         budget_s=float("inf"), grad_clip=GRAD_CLIP)
    return per_unit_s * 1e3


def main() -> None:
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    for d in (32, 256, 320, 400, 640):
        print(f"d={d} ({d * d:,} elements, {'gathered' if d * d > 100_000 else 'persistent'}): "
              f"{per_layer_ms(d):.3f} ms per layer over plain", flush=True)


if __name__ == "__main__":
    main()
