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

import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rank_records import report_ranks, vm  # noqa: E402  (re-exported: resume_memory_driver imports vm from here)

SHAPE = ["model=tiny", "model.hidden_size=2048", "model.num_hidden_layers=16", "model.num_attention_heads=16",
         "model.num_key_value_heads=16", "model.intermediate_size=5504", "model.vocab_size=8192",
         "model.tie_word_embeddings=false"]
MODES = {
    "pp2-tp2": ["parallel.pipeline_degree=2", "parallel.tensor_degree=2", "parallel.zero_stage=0",
                "batch.micro_batch_size=1", "batch.global_batch_size=2"],
    "zero3-dp4": ["parallel.zero_stage=3", "batch.micro_batch_size=1", "batch.global_batch_size=4"],
}


def shape() -> list[str]:
    """SHAPE, or with MODEL_HIDDEN / MODEL_LAYERS set another size of it (intermediate = 43/16 x hidden, as 5504 / 2048):
    bench/build uses hidden 768 x 12 layers (98M params) and 1536 x 12 (367M)."""
    out = list(SHAPE)
    if os.environ.get("MODEL_HIDDEN"):
        h = int(os.environ["MODEL_HIDDEN"])
        out = [o for o in out if not o.startswith(("model.hidden_size", "model.intermediate_size"))]
        out += [f"model.hidden_size={h}", f"model.intermediate_size={h * 43 // 16}"]
    if os.environ.get("MODEL_LAYERS"):
        out = [o for o in out if not o.startswith("model.num_hidden_layers")]
        out += [f"model.num_hidden_layers={os.environ['MODEL_LAYERS']}"]
    return out


SMALL_BUCKETS = {"reduce_bucket_size": 20_000_000, "stage3_prefetch_bucket_size": 20_000_000,
                 "sub_group_size": 10_000_000, "stage3_max_live_parameters": 100_000_000}


# DeepSpeed 0.19.8 steps of deepspeed.initialize under ZeRO-3 (runtime/zero/stage3.py), in call order; with
# ZeRO-3 each is wrapped to record VmRSS before and after and VmHWM after (docs/parallel-notes.md, ZeRO-3 RSS).
ZERO3_STEPS = ("_create_fp16_partitions_with_defragmentation", "_create_fp32_partitions", "initialize_optimizer_states",
               "_setup_for_real_optimizer", "create_reduce_and_remove_grad_hooks")


def probe_zero3(trace: list) -> None:
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    for name in ZERO3_STEPS:
        real = getattr(Stage3, name)

        def wrapped(self, *a, _real=real, _name=name, **k):
            before = vm("VmRSS")
            out = _real(self, *a, **k)
            trace.append({"step": _name, "rss_before": before, "rss_after": vm("VmRSS"), "hwm_after": vm("VmHWM")})
            return out

        setattr(Stage3, name, wrapped)


def main() -> None:
    # `launcher` before `deepspeed`, as a real rank (`python -m launcher train`) imports them: launcher/lean_imports.py
    # then keeps DeepSpeed's autotuner from importing MLflow. In the other order MLflow's 0.11 GiB was counted in
    # every rank's baseline here (0.36 GiB instead of 0.25) though no `launcher train` rank holds it.
    import launcher  # noqa: I001  (the order is the point)
    import deepspeed
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime.distributed import avoid_shm_comm_build, leave_rank
    from launcher.runtime.cpualloc import recycle_step_buffers, zero3_gathered_bytes
    from launcher.train import build_engine

    out_path, mode = sys.argv[1], sys.argv[2]
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = compose(shape() + MODES[mode] + ["data.seq_length=64", "cluster=cpu", f"cluster.gpus_per_node={world}",
                                         "precision=fp32", "model.activation_checkpointing=false"])
    layout = resolve_layout(cfg)
    ds = build_deepspeed_config(cfg, layout)
    ds["optimizer"] = {"type": "SGD", "params": {"lr": 1e-3}}
    ds["zero_allow_untested_optimizer"] = True   # ZeRO with a torch optimizer DeepSpeed has not listed
    ds.pop("scheduler", None)
    if layout.zero_stage == 3:
        ds["zero_optimization"].update(SMALL_BUCKETS)
    trace: list = []
    if layout.zero_stage == 3:
        probe_zero3(trace)
    baseline = vm("VmHWM")
    rss = {}
    # The peak when the model is built, just before deepspeed.initialize adds the engine's own buffers
    # (optimizer partitions, flat gradient buffers): recorded by wrapping initialize, which still runs unchanged.
    at_initialize = {}
    real_initialize = deepspeed.initialize

    def initialize(*args, **kwargs):
        at_initialize["hwm"], rss["built"] = vm("VmHWM"), vm("VmRSS")
        return real_initialize(*args, **kwargs)

    deepspeed.initialize = initialize
    t0 = time.perf_counter()
    engine = build_engine(cfg, layout, ds)
    build_s = time.perf_counter() - t0
    hwm_before_step, rss["before_step"] = vm("VmHWM"), vm("VmRSS")
    rss["file"] = vm("RssFile")   # of that, pages mapped from files (the libraries' code), shared by every rank
    recycle_step_buffers(layout.device, layout.zero_stage,   # as launcher/train.py run() does before its loop
                         zero3_gathered_bytes(engine.module) if layout.zero_stage == 3 else None)
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
           "params_held": held, "zero3_trace": trace, "rss_built": rss["built"], "rss_before_step": rss["before_step"], "rss_file_before_step": rss["file"], "launcher": os.path.dirname(launcher.__file__), "build_s": build_s, "step_s": step_s, "loss": float(loss)}
    report_ranks(rec, out_path, {"mode": mode}, f"[build_memory] {mode} ({rec['launcher']}): ", lambda r: (
        f"r{r['rank']} HWM built/step/after {r['hwm_built'] / 2**30:.2f}/{r['hwm_before_step'] / 2**30:.2f}/"
        f"{r['hwm_after_step'] / 2**30:.2f} GiB build {r['build_s']:.1f}s step {r['step_s']:.1f}s loss {r['loss']:.4f}"))
    leave_rank()   # results are on disk: exit without the interpreter's teardown (see leave_rank)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
