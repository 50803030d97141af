"""Per-rank build memory on 4 CPU ranks: `torchrun --nproc_per_node 4 tests/parallel/build_memory_driver.py OUT.json MODE`.

MODE `pp2-tp2` (pipeline 2 x Megatron TP 2) or `zero3-dp4` (ZeRO-3 over 4 DP ranks). The model is a
0.8B-parameter LLaMA (hidden 2048, 16 layers, 16 heads, MLP 5504, vocab 8192, untied: 843,122,688 params,
3.37 GB fp32). Each rank builds it through launcher.train.build_engine -- the loop's own path, so the same
file runs against older code to show what it used to cost -- records its peak RSS (VmHWM) before the first
step, trains one step, and rank 0 writes every rank's numbers to OUT.json.

The optimizer is torch SGD (DeepSpeed builds any torch.optim class named in its config): AdamW's two
states would add 8 bytes per parameter to the *training* memory of every layout and push 4 ranks past the
machine (docs/parallel-notes.md, section 5: 0.8B AdamW does not fit 12 GiB with any rank count); the build,
which is what this measures, is the same. ZeRO-3 gets small buckets (the same section: the default 5e8-element
reduce bucket was OOM-killed at 12 GiB in step 1 even at 0.2B).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

SHAPE = ["model=tiny", "model.hidden_size=2048", "model.num_hidden_layers=16", "model.num_attention_heads=16",
         "model.num_key_value_heads=16", "model.intermediate_size=5504", "model.vocab_size=8192",
         "model.tie_word_embeddings=false"]
MODES = {
    "pp2-tp2": ["parallel.pipeline_degree=2", "parallel.tensor_degree=2", "parallel.zero_stage=0",
                "batch.micro_batch_size=1", "batch.global_batch_size=2"],
    "zero3-dp4": ["parallel.zero_stage=3", "batch.micro_batch_size=1", "batch.global_batch_size=4"],
}
SMALL_BUCKETS = {"reduce_bucket_size": 20_000_000, "stage3_prefetch_bucket_size": 20_000_000,
                 "sub_group_size": 10_000_000, "stage3_max_live_parameters": 100_000_000}


def vm(key: str) -> int:
    """VmHWM / VmRSS of this process in bytes (/proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def main() -> None:
    import deepspeed

    import launcher
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime.distributed import avoid_shm_comm_build
    from launcher.train import build_engine

    out_path, mode = sys.argv[1], sys.argv[2]
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = compose(SHAPE + MODES[mode] + ["data.seq_length=64", "cluster=cpu", f"cluster.gpus_per_node={world}",
                                         "precision=fp32", "model.activation_checkpointing=false"])
    layout = resolve_layout(cfg)
    ds = build_deepspeed_config(cfg, layout)
    ds["optimizer"] = {"type": "SGD", "params": {"lr": 1e-3}}
    ds["zero_allow_untested_optimizer"] = True   # ZeRO with a torch optimizer DeepSpeed has not listed
    ds.pop("scheduler", None)
    if layout.zero_stage == 3:
        ds["zero_optimization"].update(SMALL_BUCKETS)
    baseline = vm("VmHWM")
    # The peak when the model is built, just before deepspeed.initialize adds the engine's own buffers
    # (optimizer partitions, flat gradient buffers): recorded by wrapping initialize, which still runs unchanged.
    at_initialize = {}
    real_initialize = deepspeed.initialize

    def initialize(*args, **kwargs):
        at_initialize["hwm"] = vm("VmHWM")
        return real_initialize(*args, **kwargs)

    deepspeed.initialize = initialize
    t0 = time.perf_counter()
    engine = build_engine(cfg, layout, ds)
    build_s = time.perf_counter() - t0
    hwm_before_step = vm("VmHWM")
    held = sum((p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()) for p in engine.module.parameters())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, layout.vocab_size, (layout.micro_batch_size, layout.seq_length), generator=g)
    t1 = time.perf_counter()
    if layout.pipeline_degree > 1:
        loss = engine.train_batch(data_iter=iter([(ids, ids)] * layout.grad_accum_steps))
    else:
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    step_s = time.perf_counter() - t1
    rec = {"rank": rank, "baseline_hwm": baseline, "hwm_built": at_initialize["hwm"], "hwm_before_step": hwm_before_step, "hwm_after_step": vm("VmHWM"),
           "params_held": held, "launcher": os.path.dirname(launcher.__file__), "build_s": build_s, "step_s": step_s, "loss": float(loss)}
    recs = [None] * world
    dist.all_gather_object(recs, rec)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"mode": mode, "ranks": recs}, f, indent=1)
        print(f"[build_memory] {mode} ({rec['launcher']}): " + ", ".join(
            f"r{r['rank']} HWM built/step/after {r['hwm_built'] / 2**30:.2f}/{r['hwm_before_step'] / 2**30:.2f}/"
            f"{r['hwm_after_step'] / 2**30:.2f} GiB "
            f"build {r['build_s']:.1f}s step {r['step_s']:.1f}s loss {r['loss']:.4f}" for r in recs), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
