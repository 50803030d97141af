"""Diagnostic (not a test): the dtype and size of every large collective a training rank calls.

    mkdir -p /tmp/cd && COLLDTYPE_OUT=/tmp/cd PYTHONPATH=bench/steptime/colldtype:$PWD .venv/bin/launcher train \
        recipe=tiny precision=bf16 cluster.gpus_per_node=2 parallel.sequence_degree=2 parallel.zero_stage=3 \
        train.steps=2 scheduler.warmup_steps=0 runs_dir=/tmp/cd-runs train.eval_every=0 checkpoint.save_every=0 \
        checkpoint.export_hf=false logging.progress_bar=false && cat /tmp/cd/rank0.json

Wraps torch.distributed's all_reduce, reduce_scatter(_tensor) and all_gather_into_tensor on every torchrun rank
and keeps {"<collective> <dtype> <elements>": calls} for tensors of more than 10,000 elements in
$COLLDTYPE_OUT/rank<R>.json, rewritten at each counted call (a rank leaves by os._exit, past atexit). 2026-12-06 (bench/steptime/results.md): under SP2 bf16 with the launcher's config
ZeRO-0 and ZeRO-3 all-reduce the 1,328,256 gradient elements in bf16, ZeRO-1 in float32.
"""
import os
if os.environ.get("COLLDTYPE_OUT") and os.environ.get("LOCAL_RANK") is not None:
    import json
    import torch.distributed as dist
    seen = {}
    for name in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "reduce_scatter"):
        fn = getattr(dist, name)
        def wrap(*a, _fn=fn, _name=name, **k):
            t = a[0] if a else next(iter(k.values()))
            if hasattr(t, "dtype") and t.numel() > 10000:
                key = f"{_name} {t.dtype} {t.numel()}"
                seen[key] = seen.get(key, 0) + 1
                open(f"{os.environ['COLLDTYPE_OUT']}/rank{os.environ['RANK']}.json", "w").write(json.dumps(seen))
            return _fn(*a, **k)
        setattr(dist, name, wrap)
