"""torchrun worker for test_state_bytes.py (not collected by pytest: no test_ prefix).

For each case (a list of compose overrides) this rank builds the model the way `launcher train` does
(launcher.runtime.model.build_model at the layout's padded vocabulary, launcher.deepspeed_config's JSON),
runs two optimizer steps of one micro-batch, and measures its model-state bytes
(launcher.runtime.state_bytes.measure_model_state_bytes) after the second backward, before the second
step: the Adam moments exist (created by the first step) and so do this step's gradients.
As an independent check of the walk it also sums every live tensor storage the garbage collector can
see, so the test can bound what the walk did not classify. Each rank writes <out_dir>/rank<r>.json.
"""

import gc
import json
import sys
from pathlib import Path

import deepspeed
import deepspeed.comm as dist
import torch

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.deepspeed_config import build_deepspeed_config
from launcher.runtime.model import build_model
from launcher.runtime.optimizer import param_groups
from launcher.runtime.state_bytes import measure_model_state_bytes, model_state_tensors
from launcher.runtime.zero3 import shared_fp32_master


def live_storages() -> dict:
    """data_ptr -> nbytes of every storage behind a tensor the garbage collector tracks."""
    out = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and not obj.is_meta:
                s = obj.untyped_storage()
                out[s.data_ptr()] = s.nbytes()
        except Exception:  # some tracked objects refuse isinstance/attribute access
            continue
    return out


def unclassified(engine, before: dict) -> list:
    """Storages (>= 1 KiB) born in this case, alive now, that model_state_tensors does not name."""
    from launcher.runtime.state_bytes import _tensors

    gc.collect()   # unreachable cycles (e.g. from DeepSpeed's setup) are not held state
    named = set(before)
    for tensors in model_state_tensors(engine).values():
        named |= {t.untyped_storage().data_ptr() for t in _tensors(tensors)}
    return sorted(n for ptr, n in live_storages().items() if ptr not in named and n >= 1024)


def run_case(overrides: list) -> dict:
    gc.collect()
    before = live_storages()
    cfg = compose(overrides)
    layout = resolve_layout(cfg)
    model = build_model(cfg.model, seed=cfg.train.seed, vocab_size=layout.padded_vocab_size)
    # The two parameter groups `launcher train` passes, and its ZeRO-3 fp32 master sharing (launcher/train.py build_engine).
    with shared_fp32_master():
        engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model, cfg.optimizer.weight_decay),
                                          config=build_deepspeed_config(cfg, layout))
    gen = torch.Generator().manual_seed(dist.get_rank())
    result = {}
    for step in range(2):
        ids = torch.randint(0, cfg.model.vocab_size, (layout.micro_batch_size, layout.seq_length), generator=gen)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        if step == 1:
            result = measure_model_state_bytes(engine)
            result["unclassified"] = unclassified(engine, before)
            result["optimizer_class"] = type(engine.optimizer).__name__
        engine.step()
    engine.destroy()
    del engine, model
    gc.collect()
    return result


def main():
    out_dir = Path(sys.argv[1])
    cases = json.loads(Path(sys.argv[2]).read_text())
    # Nothing may JIT-compile on CPU ranks (see launcher.runtime.distributed.avoid_shm_comm_build).
    from launcher.runtime.distributed import avoid_shm_comm_build, leave_rank

    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed("gloo", auto_mpi_discovery=False)
    results = {name: run_case(overrides) for name, overrides in cases.items()}
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results, indent=1))
    dist.barrier()
    leave_rank()   # results are on disk: exit without the interpreter's teardown (see leave_rank)


if __name__ == "__main__":
    main()
