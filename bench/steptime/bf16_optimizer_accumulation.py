"""What DeepSpeed's BF16_Optimizer adds to each micro-batch beyond the ZeRO-1 optimizer, measured on one CPU rank
(diagnostic for a term the plan does not charge yet, not a test).

    .venv/bin/python bench/steptime/bf16_optimizer_accumulation.py            # 24 x Linear(1024), 25.2M elements
    .venv/bin/python bench/steptime/bf16_optimizer_accumulation.py 2048       # the layers' side

DeepSpeed 0.19.8 wraps the optimizer in BF16_Optimizer for bf16 with grad_accum_dtype fp32 at ZeRO 1, and for bf16
at ZeRO 0 under the pipeline engine (launcher/plan/memory.py uses_bf16_optimizer). With its default
immediate_grad_update false, every micro-batch zeroes the bf16 gradients (clear_lp_grads: the next backward adds
into them instead of writing them), and after the backward adds each one, cast to fp32, into the fp32 gradient
(update_hp_grads: `hp_grad.add_(lp.grad.to(fp32))`; pipe/engine.py calls both around each backward). Beyond the
ZeRO-1 optimizer's autograd add that is about w + (w + 16) = 20 bytes an element a micro-batch in bf16. Four
engines (each optimizer at 1 and 4 micro-batches a step, gradient_accumulation_steps = m) run full steps in
alternating order; each one's slope over the micro-batches is (step at 4 - step at 1) / 3.
Readings: bench/steptime/results.md.
"""
from __future__ import annotations

import logging
import os
import statistics
import sys
import time

import torch
from torch import nn


def main() -> None:
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                 ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    import deepspeed

    from launcher.runtime.distributed import avoid_shm_comm_build

    avoid_shm_comm_build("cpu")   # no JIT build of DeepSpeed's shared-memory comm op

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    d, layers = (int(sys.argv[1]) if len(sys.argv) > 1 else 1024), 24

    def engine(fp32_accumulation: bool, m: int):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(layers)])
        cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": m, "gradient_clipping": 1.0,
               "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}
        if fp32_accumulation:
            cfg["data_types"] = {"grad_accum_dtype": "fp32"}
        e, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3), config=cfg)
        return e

    x = torch.randn(4, d, dtype=torch.bfloat16)
    engines = {(a, m): engine(a, m) for a in (True, False) for m in (1, 4)}
    times: dict = {key: [] for key in engines}
    for r in range(12):
        for (a, m), e in (engines.items() if r % 2 else reversed(engines.items())):
            t = time.perf_counter()
            for _ in range(m):
                e.backward(e(x).float().sum())
                e.step()        # applies the optimizer at the m-th only
            times[a, m].append(time.perf_counter() - t)
    med = {key: statistics.median(v[2:]) for key, v in times.items()}    # the first two rounds warm up
    n = d * d * layers
    for a in (True, False):
        slope = (med[a, 4] - med[a, 1]) / 3
        print(f"{type(engines[a, 1].optimizer).__name__}: {med[a, 1] * 1e3:.1f} / {med[a, 4] * 1e3:.1f} ms a step at "
              f"1 / 4 micro-batches; {slope * 1e3:.1f} ms an extra micro-batch, {slope / n * 1e9:.3f} ns an element")
    extra = ((med[True, 4] - med[True, 1]) - (med[False, 4] - med[False, 1])) / 3 / n
    print(f"BF16_Optimizer beyond ZeRO-1, a micro-batch: {extra * 1e9:.3f} ns an element ({n / 1e6:.1f}M elements)")


if __name__ == "__main__":
    main()
