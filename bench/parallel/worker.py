"""One torchrun launch of a bench/parallel script: time optimizer steps of one layout (bench_parallel.py) and, with
--activations, first measure the bytes one micro-batch's forward leaves saved for backward on every rank
(bench_long_context.py).

    torchrun --nproc_per_node N bench/parallel/worker.py OUT.json [--activations] OVERRIDES...

The engine is the one `launcher train` builds (launcher.train.build_engine: AutoTP for TP without a pipeline, our
Megatron TP layers on the plain engine for parallel.sequence_parallel and for TP x CP, Ulysses / ring-attention
models for sequence_degree / context_degree), and a micro-batch's loss is train.micro_loss's, so the timed step is the
training loop's work without its data loader, logging and checkpoints. BENCH_TIMED_STEPS (default 6) timed steps
after 2 warm-up steps, a barrier before and after each.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

WARMUP = 2
TIMED = int(os.environ.get("BENCH_TIMED_STEPS", "6"))


def saved_activation_bytes(engine, layout, coord, x) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one forward of micro-batch `x` on this rank:
    the saved-tensor method tests/plan/test_activations.py holds the planner to (tests/plan/activation_measure.py).

    No backward follows: the graph is dropped, so no gradient or engine state changes before the timed steps.
    Activation checkpointing must be off (the bench's configs turn it off): checkpoints keep tensors outside
    autograd's saved tensors, which the tests measure where they are kept and this does not.
    """
    from tests.plan.activation_measure import param_storages, saved_bytes

    from launcher.train import micro_loss

    if layout.pipeline_engine:
        # A stage holds part of the model; Megatron SP at one stage runs on the plain engine (parallel/tensor_model.py).
        raise SystemExit("--activations measures the whole model's forward on a plain engine, not a pipeline stage")
    forward = lambda: micro_loss(engine, x, coord.sp, layout.sequence_degree, coord.cp, layout.context_degree)[0]  # noqa: E731
    loss, n = saved_bytes(forward, param_storages(engine.module))
    del loss
    return n


def main() -> None:
    import deepspeed

    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.plan.rankmap import rank_coord
    from launcher.runtime.distributed import avoid_shm_comm_build, leave_rank
    from launcher.train import build_engine, micro_loss

    out_path, args = sys.argv[1], sys.argv[2:]
    measure = "--activations" in args
    overrides = [a for a in args if a != "--activations"]
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    cfg = compose(overrides + [f"cluster.gpus_per_node={dist.get_world_size()}"])
    layout = resolve_layout(cfg)
    coord = rank_coord(layout, dist.get_rank())
    engine = build_engine(cfg, layout, build_deepspeed_config(cfg, layout))
    engine.train()
    g = torch.Generator().manual_seed(coord.dp)
    micro = [torch.randint(0, layout.vocab_size, (layout.micro_batch_size, layout.seq_length), generator=g)
             for _ in range(layout.grad_accum_steps)]
    saved = saved_activation_bytes(engine, layout, coord, micro[0]) if measure else None

    def step() -> None:
        if layout.pipeline_engine:
            engine.train_batch(data_iter=iter([(x, x) for x in micro]))
            return
        for x in micro:
            loss, _ = micro_loss(engine, x, coord.sp, layout.sequence_degree, coord.cp, layout.context_degree)
            engine.backward(loss)
            engine.step()

    times, cpu = [], 0.0
    for i in range(WARMUP + TIMED):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        dist.barrier()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
            cpu += time.process_time() - c0
    per_rank = [None] * dist.get_world_size()
    # ru_maxrss is KiB on Linux: the rank's peak resident memory (weights, states, activations, libraries).
    # CPU seconds per timed step (all of the rank's threads): the work, apart from the time other processes on
    # the shared cores took from it.
    dist.all_gather_object(per_rank, {"saved_bytes": saved, "cpu_s_per_step": cpu / TIMED,
                                      "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    if dist.get_rank() == 0:
        record = {"step_times_s": times, "median_s": statistics.median(times), "world": layout.world_size,
                  "tp": layout.tensor_degree, "pp": layout.pipeline_degree, "sp": layout.sequence_degree,
                  "cp": layout.context_degree, "megatron_sp": layout.sequence_parallel, "dp": layout.data_degree,
                  "accum": layout.grad_accum_steps}
        if measure:
            record["saved_bytes_per_rank"] = [r["saved_bytes"] for r in per_rank]
            record["max_rss_bytes_per_rank"] = [r["max_rss_bytes"] for r in per_rank]
        record["cpu_s_per_step_per_rank"] = [r["cpu_s_per_step"] for r in per_rank]
        Path(out_path).write_text(json.dumps(record))
    dist.barrier()
    leave_rank()   # results are on disk: exit without the interpreter's teardown (see leave_rank)


if __name__ == "__main__":
    main()
