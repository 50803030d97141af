"""Non-finite loss / gradients (issue 7, part 5) in real 2-rank `launcher train` runs.

A real NaN: the test hook LAUNCHER_NAN_AT_STEP multiplies one rank's loss of step 4 by NaN before
backward, so NaN gradients go through backward, DeepSpeed's all-reduce and the optimizer step.
  - nan_policy=skip, ZeRO-0 fp32 (torch's AdamW straight under the engine) and ZeRO-2 bf16 (DeepSpeed
    does not skip by itself in either): the weights and optimizer state after step 4 equal those after
    step 3 bit for bit, the LR schedule holds, steps 5-6 train on, the skip is counted and logged.
  - nan_policy=stop: exit status 3 with a clear line; latest = step_4 holding step 3's weights.
"""

import json

import pytest
import torch

from train_helpers import base_overrides, launcher

pytestmark = pytest.mark.slow


def tensors(obj, prefix=""):
    """Every tensor inside a (nested) checkpoint object, by path."""
    if torch.is_tensor(obj):
        return {prefix: obj}
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(tensors(v, f"{prefix}/{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(tensors(v, f"{prefix}/{i}"))
    return out


def state_of(tag_dir):
    """Module weights + optimizer state (all ranks' files) of a checkpoint, and its LR scheduler state."""
    out, sched = {}, None
    for f in sorted(tag_dir.glob("*.pt")):
        sd = torch.load(f, map_location="cpu", weights_only=False)
        if "module" in sd:
            out.update(tensors(sd["module"], f"{f.name}/module"))
            sched = sd["lr_scheduler"]
        if "optimizer" in sd and sd["optimizer"] is not None:
            out.update(tensors(sd["optimizer"], f"{f.name}/optimizer"))
        if "optimizer_state_dict" in sd:
            out.update(tensors(sd["optimizer_state_dict"], f"{f.name}/optimizer"))
    return out, sched


def records(run_dir):
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("layout", [["parallel.zero_stage=0"], ["parallel.zero_stage=2", "precision=bf16"]], ids=["zero0-fp32", "zero2-bf16"])
def test_skip_drops_the_update_and_trains_on(cache_dir, tmp_path, layout):
    result = launcher(["train", *base_overrides(cache_dir, 6), f"runs_dir={tmp_path}", "run_name=skip", *layout,
                       "checkpoint.save_every=1", "checkpoint.keep_last=10", "train.nan_policy=skip"],
                      LAUNCHER_NAN_AT_STEP="4:1")
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert "non-finite loss at step 4: update skipped (train.nan_policy=skip)" in log, log[-3000:]
    run = tmp_path / "skip"
    recs = records(run)
    assert recs[4]["skipped"] is True and recs[4]["loss"] != recs[4]["loss"]  # NaN
    assert all(recs[s]["skipped"] is False and recs[s]["loss"] < 100 for s in (1, 2, 3, 5, 6))
    assert recs[6]["skipped_steps"] == 1
    assert recs[5]["lr"] == recs[4]["lr"] != recs[3]["lr"]  # the schedule held over the skipped step
    ckpts = run / "checkpoints"
    s3, sched3 = state_of(ckpts / "step_00000003")
    s4, sched4 = state_of(ckpts / "step_00000004")
    s5, _ = state_of(ckpts / "step_00000005")
    assert len(s3) > 10 and same(s3, s4), "weights or optimizer state changed over a skipped step"
    assert sched3 == sched4
    assert not same(s4, s5) and all(torch.isfinite(v).all() for v in s5.values() if v.is_floating_point())
    assert json.loads((ckpts / "step_00000006" / "launcher_state.json").read_text())["skipped_steps"] == [4]


def test_stop_saves_the_last_good_weights_and_exits_3(cache_dir, tmp_path):
    result = launcher(["train", *base_overrides(cache_dir, 6), f"runs_dir={tmp_path}", "run_name=stop",
                       "checkpoint.save_every=1", "checkpoint.keep_last=10", "train.nan_policy=stop"],
                      LAUNCHER_NAN_AT_STEP="4")
    assert result.returncode == 3, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert ("non-finite loss at step 4 (train.nan_policy=stop): the update was not applied; saved step_00000004 "
            "with the weights of step 3 as latest; exiting with status 3") in log, log[-3000:]
    assert "launcher: training stopped on a non-finite loss" in result.stderr
    ckpts = tmp_path / "stop" / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_00000004" and not (ckpts / "step_00000005").exists()
    assert same(state_of(ckpts / "step_00000003")[0], state_of(ckpts / "step_00000004")[0])
