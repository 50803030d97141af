"""The baseline of bench/train_overhead.py: the smallest DeepSpeed loop we could write by hand.

Same model (build_model), same DeepSpeed JSON (build_deepspeed_config), same packed token file and
batch size as `launcher train`, but no metrics, no progress bar, no sampler: contiguous slices.
    torchrun --standalone --nproc_per_node 2 bench/minimal_ds_loop.py OUT.json override...
"""

import json
import os
import sys
import time

import deepspeed
import numpy as np
import torch

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.deepspeed_config import build_deepspeed_config
from launcher.runtime.data import prepare_data
from launcher.runtime.launch import avoid_shm_comm_build
from launcher.runtime.model import build_model

cfg = compose(sys.argv[2:])
layout = resolve_layout(cfg)
avoid_shm_comm_build(layout.device)
deepspeed.init_distributed(dist_backend="gloo")
rank = torch.distributed.get_rank()
prepared = prepare_data(cfg, layout)
tokens = np.memmap(prepared.bin_path, dtype=prepared.dtype, mode="r")
model = build_model(cfg.model, seed=cfg.train.seed, vocab_size=layout.padded_vocab_size)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=build_deepspeed_config(cfg, layout))
micro, seq = layout.micro_batch_size, layout.seq_length
times, ends = [], []
for step in range(cfg.train.steps):
    t0 = time.perf_counter()
    for m in range(layout.grad_accum_steps):
        start = ((step * layout.grad_accum_steps + m) * layout.data_degree + rank) * micro * seq
        x = torch.from_numpy(tokens[start:start + micro * seq].astype(np.int64).reshape(micro, seq))
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
    loss.item()
    times.append(time.perf_counter() - t0)
    ends.append(time.time())
    if step == 9 and os.environ.get("BENCH_READY_FILE"):
        open(os.environ["BENCH_READY_FILE"], "w").close()  # bench/train_overhead.py starts sampling rank 0 now
if rank == 0:
    json.dump({"step_times": times, "step_ends": ends}, open(sys.argv[1], "w"))
