"""The baseline of bench/train_overhead.py: the smallest DeepSpeed loop we could write by hand.

Same model (build_model), same DeepSpeed JSON (build_deepspeed_config), same batches (TokenBatches) as
`launcher train`, but no metrics, no logging, no loss agreement, no checkpoints.
    torchrun --standalone --nproc_per_node 2 bench/minimal_ds_loop.py OUT.json override...
"""

import json
import os
import sys
import time

import deepspeed
import torch

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.deepspeed_config import build_deepspeed_config
from launcher.runtime.data import TokenBatches, prepare_data
from launcher.runtime.distributed import avoid_shm_comm_build
from launcher.runtime.model import build_model

from bench_common import exit_without_teardown

cfg = compose(sys.argv[2:])
layout = resolve_layout(cfg)
avoid_shm_comm_build(layout.device)
deepspeed.init_distributed(dist_backend="gloo")
rank = torch.distributed.get_rank()
prepared = prepare_data(cfg, layout)
model = build_model(cfg.model, seed=cfg.train.seed, vocab_size=layout.padded_vocab_size)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=build_deepspeed_config(cfg, layout))
# The very batches `launcher train` reads (contiguous slices measured the same here: 0.131-0.142 s a step either way).
batches = TokenBatches(prepared, layout, seed=cfg.train.seed, dp_rank=rank)
times, ends = [], []
for step in range(cfg.train.steps):
    t0 = time.perf_counter()
    for m in range(layout.grad_accum_steps):
        x = batches.batch(batches.train_sample_ids(step, m))
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
    loss.item()
    times.append(time.perf_counter() - t0)
    ends.append(time.time())
    if step == 9 and os.environ.get("BENCH_READY_FILE"):
        open(os.environ["BENCH_READY_FILE"], "w").close()  # bench/train_overhead.py starts sampling rank 0 now
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"step_times": times, "step_ends": ends}, f)
exit_without_teardown()
