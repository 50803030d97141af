"""Per-rank resume memory on 4 CPU ranks: `torchrun --nproc_per_node 4 tests/parallel/resume_memory_driver.py OUT.json MODE PHASE DIR`.

MODE as in build_memory_driver.py (`pp2-tp2`, `zero3-dp4`); the model is its LLaMA, by default the 0.8B shape
(MODEL_HIDDEN / MODEL_LAYERS set another size: build_memory_driver.shape). PHASE `save`: build through
launcher.train.build_engine, train one step, save a DeepSpeed checkpoint into DIR (tag `t`). PHASE `resume`: build
the same way, then restore that checkpoint through launcher.runtime.checkpoint.load_checkpoint -- the loop's own
resume path -- recording every rank's peak RSS (VmHWM) and resident RSS before and after, and every file the
checkpoint engine read (path, bytes), then train one more step. Rank 0 writes every rank's numbers to OUT.json.

The optimizer is torch SGD with momentum (one fp32 state per parameter, so the optimizer's part of the
checkpoint is real) for the reasons build_memory_driver.py gives for not using AdamW.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_memory_driver import MODES, SMALL_BUCKETS, shape  # noqa: E402
from rank_records import report_ranks, vm  # noqa: E402


def main() -> None:
    import launcher  # noqa: F401,I001  before deepspeed, as a real rank: see build_memory_driver.main
    import deepspeed

    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime import checkpoint as ckpt
    from launcher.runtime.distributed import avoid_shm_comm_build, leave_rank
    from launcher.train import build_engine

    out_path, mode, phase, ckpt_dir = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = compose(shape() + MODES[mode] + ["data.seq_length=64", "cluster=cpu", f"cluster.gpus_per_node={world}",
                                           "precision=fp32", "model.activation_checkpointing=false"])
    layout = resolve_layout(cfg)
    ds = build_deepspeed_config(cfg, layout)
    ds["optimizer"] = {"type": "SGD", "params": {"lr": 1e-3, "momentum": 0.9}}
    ds["zero_allow_untested_optimizer"] = True
    ds.pop("scheduler", None)
    if layout.zero_stage == 3:
        ds["zero_optimization"].update(SMALL_BUCKETS)
    engine = build_engine(cfg, layout, ds)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, layout.vocab_size, (layout.micro_batch_size, layout.seq_length), generator=g)

    def step() -> float:
        if layout.pipeline_degree > 1:
            return float(engine.train_batch(data_iter=iter([(ids, ids)] * layout.grad_accum_steps)))
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        return float(loss)

    held = sum((p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()) for p in engine.module.parameters())
    rec = {"rank": rank, "params_held": held}
    if phase == "save":
        rec["loss"] = step()
        engine.save_checkpoint(str(ckpt_dir), tag="t", save_latest=False)
    else:
        # Every file torch.load reads during the resume, its size, and whether it was mapped (mmap=True: only
        # the pages later copied are read) or read whole into memory.
        read = []
        real_load = torch.load

        def load(path, *args, **kwargs):
            read.append((os.path.basename(str(path)), os.path.getsize(path), bool(kwargs.get("mmap"))))
            return real_load(path, *args, **kwargs)

        torch.load = load
        rec["hwm_before_load"], rec["rss_before_load"] = vm("VmHWM"), vm("VmRSS")
        t0 = time.perf_counter()
        ckpt.load_checkpoint(engine, ckpt_dir / "t")
        rec["load_s"] = time.perf_counter() - t0
        torch.load = real_load
        rec["hwm_after_load"], rec["rss_after_load"] = vm("VmHWM"), vm("VmRSS")
        rec["rss_anon_after_load"], rec["rss_file_after_load"] = vm("RssAnon"), vm("RssFile")
        rec["files"] = read
        # Bytes read whole into memory: files torch.load read without mmap.
        rec["bytes_read"] = sum(b for _, b, m in read if not m)
        rec["loss"] = step()
    report_ranks(rec, out_path, {"mode": mode, "phase": phase}, f"[resume_memory] {mode}: ", None if phase == "save" else lambda r: (
        f"r{r['rank']} HWM before/after load {r['hwm_before_load'] / 2**30:.2f}/{r['hwm_after_load'] / 2**30:.2f} GiB "
        f"RSS {r['rss_before_load'] / 2**30:.2f}/{r['rss_after_load'] / 2**30:.2f} read {r['bytes_read'] / 2**30:.2f} GiB "
        f"in {len(r['files'])} files, load {r['load_s']:.1f}s loss {r['loss']:.4f}"))
    leave_rank()   # results are on disk: exit without the interpreter's teardown (see leave_rank)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
