"""`model.init_from` read per rank, on 2 real ranks: `torchrun --nproc_per_node 2 tests/parallel/init_from_driver.py DIR OUT.json`.

Rank 0 saves a small LLaMA (the launcher's seeded init, seed 5) as sharded safetensors with an index into DIR; then
every rank builds it through launcher.train.build_engine with model.init_from=DIR as a pipeline of 2 stages and
as ZeRO-3 over 2 ranks, and compares what it holds with the saved tensors (`torch.equal`: its stage's layers, or
its gathered ZeRO-3 parameters). Rank 0 writes the per-rank results to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

BASE = ["model=tiny", "model.hidden_size=64", "model.num_attention_heads=4", "model.num_key_value_heads=4",
        "model.num_hidden_layers=4", "model.intermediate_size=128", "model.vocab_size=256", "data.seq_length=32",
        "cluster=cpu", "cluster.gpus_per_node=2", "precision=fp32", "batch.micro_batch_size=2", "batch.global_batch_size=4"]
# ZeRO-3 first: a pipeline engine leaves its grid in DeepSpeed's global groups, and a later engine without an mpu
# then asks that (gone) mpu for its model-parallel rank (engine._configure_distributed_model).
LAYOUTS = {"zero3": ["parallel.zero_stage=3"], "pp2": ["parallel.pipeline_degree=2", "parallel.zero_stage=0"]}


def main() -> None:
    import deepspeed

    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.parallel.pipeline import layer_hf_prefixes
    from launcher.runtime.distributed import avoid_shm_comm_build, leave_rank
    from launcher.runtime.model import build_model
    from launcher.train import build_engine

    ckpt, out = sys.argv[1], sys.argv[2]
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    cfg0 = compose(BASE + LAYOUTS["zero3"])
    saved_model = build_model(cfg0.model, 5, vocab_size=resolve_layout(cfg0).padded_vocab_size)
    if rank == 0:
        saved_model.save_pretrained(ckpt, max_shard_size="60KB")
    dist.barrier()
    saved = {k: v.detach() for k, v in saved_model.named_parameters()}
    results = {}
    for name, overrides in LAYOUTS.items():
        cfg = compose(BASE + overrides + [f"model.init_from={ckpt}"])
        layout = resolve_layout(cfg)
        engine = build_engine(cfg, layout, build_deepspeed_config(cfg, layout))
        checked, equal = 0, True
        if name == "pp2":
            prefixes = layer_hf_prefixes("llama", cfg.model.num_hidden_layers)
            for local, p in engine.module.named_parameters():
                idx, _, rest = local.partition(".")
                head, _, tail = rest.partition(".")
                key = f"{prefixes[int(idx)]}.{tail if head in ('layer', 'norm') else rest}"
                equal &= torch.equal(p.detach(), saved[key])
                checked += 1
        else:
            for key, p in engine.module.named_parameters():
                with deepspeed.zero.GatheredParameters([p]):
                    equal &= torch.equal(p.detach(), saved[key])
                checked += 1
        results[name] = {"rank": rank, "checked": checked, "equal": bool(equal)}
        del engine
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    leave_rank()   # results are on disk: exit without the interpreter's teardown (see leave_rank)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
