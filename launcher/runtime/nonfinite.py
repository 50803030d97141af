"""Non-finite losses and gradients: veto the optimizer update, count what was skipped (train.nan_policy).

The loop learns the step's global loss (one all-reduce, launcher/train.py StepAgreement) after the last
backward and *before* DeepSpeed's optimizer step; NaN and inf survive the sum, so a non-finite loss on any
rank makes the global mean non-finite and every rank decides alike. When it is non-finite the loop arms
`UpdateVeto`, and the innermost torch optimizer's step() returns without touching the weights or its state
(Adam's moments and step count stay as they were).

Why veto inside DeepSpeed's step instead of not calling engine.step(): the engine counts micro-batches in
engine.step() to find accumulation boundaries; skipping the call would shift every later boundary.
DeepSpeed skips updates itself in some configurations (fp16 loss-scale overflow; ZeRO 1/2 in fp32 on an
invalid gradient norm, runtime/zero/stage_1_and_2.py step) and then never calls the inner step; in the
others (ZeRO-0 with torch's optimizer, bf16 without check_grad_overflow) it would apply NaN. Either way the
skip is reported the same way: the veto sets the wrapper's `overflow` flag, which DeepSpeed's
_take_model_step reads after the step to count `engine.skipped_steps` and to hold the LR schedule, exactly
as it does for its own overflow skips. The loop compares that counter before and after each step.

Test hook (the LAUNCHER_CRASH_IN_SAVE precedent): LAUNCHER_NAN_AT_STEP="K" or "K:R" multiplies rank R's
(default: every rank's) first micro-batch loss of step K (1-based, as in metrics.jsonl) by NaN before
backward, so real NaN gradients flow through backward, the all-reduce and the optimizer.
"""

from __future__ import annotations

import os
from typing import Optional

NAN_HOOK_ENV = "LAUNCHER_NAN_AT_STEP"


def _innermost_optimizer(optimizer):
    """DeepSpeed wraps the torch optimizer (ZeRO, BF16_Optimizer, fp16): follow `.optimizer` down to it."""
    seen = set()
    while hasattr(optimizer, "optimizer") and id(optimizer) not in seen:
        seen.add(id(optimizer))
        optimizer = optimizer.optimizer
    return optimizer


class UpdateVeto:
    """Arm it before engine.step() at an accumulation boundary to make that optimizer update a no-op."""

    def __init__(self, engine):
        self.engine = engine
        self.armed = False
        self.vetoed = 0
        self.base = _innermost_optimizer(engine.optimizer)
        original = self.base.step

        def step(*args, **kwargs):
            if self.armed:
                self.vetoed += 1
                # DeepSpeed's wrapper (or the torch optimizer itself under ZeRO-0) is what the engine asks
                # `overflow` after the step: counted as skipped, no scheduler step.
                engine.optimizer.overflow = True
                return None
            if engine.optimizer is self.base:
                self.base.overflow = False  # our attribute on a bare torch optimizer: reset on real updates
            return original(*args, **kwargs)

        self.base.step = step


def poisoned_step() -> Optional[tuple[int, Optional[int]]]:
    """(step, rank or None) from LAUNCHER_NAN_AT_STEP, or None."""
    value = os.environ.get(NAN_HOOK_ENV)
    if not value:
        return None
    step, _, rank = value.partition(":")
    return int(step), (int(rank) if rank else None)


def maybe_poison(loss, step: int, micro_step: int, rank: int):
    """The test hook above: `loss` times NaN at the chosen step/rank/first micro-batch, else `loss`."""
    target = poisoned_step()
    if target is None or micro_step != 0 or step != target[0] or target[1] not in (None, rank):
        return loss
    return loss * float("nan")
