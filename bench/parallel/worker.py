"""One torchrun launch of bench_parallel.py: time optimizer steps of one layout (see bench_parallel.py)."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

WARMUP, TIMED = 2, 6


def main() -> None:
    import deepspeed

    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime.distributed import avoid_shm_comm_build
    from launcher.plan.rankmap import rank_coord
    from launcher.runtime.model import build_model

    out_path, overrides = sys.argv[1], sys.argv[2:]
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    cfg = compose(overrides + [f"cluster.gpus_per_node={dist.get_world_size()}"])
    layout = resolve_layout(cfg)
    ds = build_deepspeed_config(cfg, layout)
    coord = rank_coord(layout, dist.get_rank())
    mpu = None
    if layout.pipeline_degree > 1:
        from launcher.parallel.pipeline import build_pipeline_module

        model = build_pipeline_module(cfg, layout, seed=1)
    elif layout.sequence_degree > 1:
        from launcher.parallel.sequence import build_sequence_parallel_model, sequence_parallel_loss, setup_sequence_parallel

        mpu = setup_sequence_parallel(layout.sequence_degree)
        model = build_sequence_parallel_model(cfg.model, 1, layout.padded_vocab_size)
    else:
        model = build_model(cfg.model, 1, vocab_size=layout.padded_vocab_size)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds, mpu=mpu)
    g = torch.Generator().manual_seed(coord.dp)
    micro = [torch.randint(0, layout.vocab_size, (layout.micro_batch_size, layout.seq_length), generator=g)
             for _ in range(layout.grad_accum_steps)]

    def step() -> None:
        if layout.pipeline_degree > 1:
            engine.train_batch(data_iter=iter([(x, x) for x in micro]))
            return
        for x in micro:
            if layout.sequence_degree > 1:
                loss = sequence_parallel_loss(engine, x, coord.sp, layout.sequence_degree)
            else:
                loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()

    times = []
    for i in range(WARMUP + TIMED):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        dist.barrier()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump({"step_times_s": times, "median_s": statistics.median(times), "world": layout.world_size,
                       "tp": layout.tensor_degree, "pp": layout.pipeline_degree, "sp": layout.sequence_degree,
                       "dp": layout.data_degree, "accum": layout.grad_accum_steps}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
