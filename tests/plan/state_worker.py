"""Worker for test_model_state_bytes.py: build the tiny model under DeepSpeed on this rank for each
(precision, ZeRO stage) case, run two micro-batch steps, and record the bytes of the parameter,
gradient and optimizer-state tensors this rank holds (distinct storages), as defined in
launcher/plan/state.py. Run with torchrun; rank 0 writes the JSON file named in argv[1].
"""

import json
import sys

import deepspeed
import torch
import torch.distributed as dist

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.deepspeed_config import build_deepspeed_config
from launcher.runtime.model import build_model


def storages(tensors, seen):
    total = 0
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        s = t.untyped_storage()
        if s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        total += s.nbytes()
    return total


def measure(engine):
    seen = set()
    module_params = list(engine.module.parameters())
    params = storages([getattr(p, "ds_tensor", p.data) for p in module_params], seen)
    opt = engine.optimizer
    basic = getattr(opt, "optimizer", opt)
    opt_params = [p for g in basic.param_groups for p in g["params"]]
    states = [v for st in basic.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
    optimizer = storages(opt_params + states, seen)
    grads = [p.grad for p in module_params] + [p.grad for p in opt_params]
    for name in ("fp32_groups_gradients_flat", "averaged_gradients", "ipg_buffer", "grads_in_partition",
                 "__ipg_bucket_flat_buffer", "fp32_partitioned_groups_flat"):
        v = getattr(opt, name, None)
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, (list, tuple)):
            flat = []
            for x in v:
                flat.extend(x if isinstance(x, (list, tuple)) else [x])
            grads += [x for x in flat if torch.is_tensor(x)]
    return {"params": params, "grads": storages(grads, seen), "optimizer": optimizer, "optimizer_class": type(opt).__name__}


def main():
    out_path = sys.argv[1]
    cases = [c.split(":") for c in sys.argv[2:]]
    deepspeed.init_distributed(dist_backend="gloo")
    results = []
    for dtype, stage in cases:
        cfg = compose(["recipe=tiny", f"precision={dtype}", f"parallel.zero_stage={stage}",
                       "batch.micro_batch_size=2", "batch.global_batch_size=4", "data.seq_length=16"])
        layout = resolve_layout(cfg)
        model = build_model(cfg.model, seed=1)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=build_deepspeed_config(cfg, layout))
        torch.manual_seed(0)
        for _ in range(2):
            ids = torch.randint(0, cfg.model.vocab_size, (2, 16))
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            m = measure(engine)   # after backward, before the step (the second time: Adam states exist)
            engine.step()
        results.append({"dtype": dtype, "zero_stage": int(stage), **m})
        engine.destroy() if hasattr(engine, "destroy") else None
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
