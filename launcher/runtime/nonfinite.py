"""Non-finite losses and gradients: veto the optimizer update, count what was skipped (train.nan_policy).

The loop learns the step's global loss (one all-reduce, launcher/runtime/distributed.py StepAgreement) after the last
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

import math
import os
from pathlib import Path
from typing import Optional

from launcher.protocol import EXIT_NONFINITE

NAN_HOOK_ENV = "LAUNCHER_NAN_AT_STEP"

# train.nan_policy=skip drops single bad batches; this many skipped steps in a row means divergence: stop.
MAX_CONSECUTIVE_SKIPS = 5


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


def nonfinite_action(cfg, step: int, loss_finite: bool, grad_norm, skipped: bool, overflow: bool,
                     skipped_steps: list[int], ckpt_root: Path) -> tuple[str | None, str]:
    """What a step with a non-finite loss or gradient norm means (launcher/runtime/nonfinite.py), and its log line.

    `applied`: the engine applied the update before the loss was known (pipeline): the weights may hold NaN,
    nothing is saved, the run exits. `stop`: the update was vetoed and train.nan_policy=stop (or too many
    steps in a row were skipped): save the untouched weights, exit. `skip`: vetoed, go on. None: a finite step
    (an fp16 overflow skip is the loss scaler's ordinary business, counted apart).
    """
    from launcher.runtime.checkpoint import read_latest, tag_for

    bad = not loss_finite or (grad_norm is not None and not math.isfinite(grad_norm) and not overflow)
    if bad and not skipped:
        return "applied", (f"non-finite {'loss' if not loss_finite else 'gradient norm'} at step {step}, and the update was "
                           f"applied (it happens inside the engine's step here): the weights may be poisoned, nothing is saved; "
                           f"exiting with status {EXIT_NONFINITE}. The last checkpoint is {read_latest(ckpt_root)}")
    if not skipped or overflow:
        return None, ""
    what = "loss" if not loss_finite else "gradients"
    consecutive = _trailing_run(skipped_steps)
    if cfg.train.nan_policy == "stop" or consecutive >= MAX_CONSECUTIVE_SKIPS:
        why = ("train.nan_policy=stop" if cfg.train.nan_policy == "stop"
               else f"{consecutive} consecutive steps skipped: the model diverged, not one bad batch")
        return "stop", (f"non-finite {what} at step {step} ({why}): the update was not applied; saved {tag_for(step)} "
                        f"with the weights of step {step - 1} as latest; exiting with status {EXIT_NONFINITE}. resume=auto "
                        f"continues after this batch; resume=<run_dir>/checkpoints/step_N from an earlier one")
    return "skip", (f"non-finite {what} at step {step}: update skipped (train.nan_policy=skip); "
                    f"{len(skipped_steps)} step(s) skipped in this run (across resumes): {skipped_steps[-10:]}")


def _trailing_run(steps: list[int]) -> int:
    """How many of the last entries of a sorted step list are consecutive (5, 7, 8, 9 -> 3)."""
    n = 0
    while n < len(steps) and steps[-1 - n] == steps[-1] - n:
        n += 1
    return n
