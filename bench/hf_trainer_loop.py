"""The second baseline of bench/train_overhead.py: HF `Trainer` driving the same DeepSpeed config.

Same model (build_model), same DeepSpeed JSON (build_deepspeed_config, passed to TrainingArguments
as a dict), same packed token file and batch arithmetic as `launcher train`. The Trainer builds its
own DataLoader, DistributedSampler and optimizer/scheduler from the DeepSpeed JSON (through
accelerate); a callback records the wall time of every optimizer step.
    torchrun --standalone --nproc_per_node 2 bench/hf_trainer_loop.py OUT.json override...
Needs `accelerate` (pip install -e '.[bench]').
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.deepspeed_config import build_deepspeed_config
from launcher.runtime.data import prepare_data
from launcher.runtime.distributed import avoid_shm_comm_build
from launcher.runtime.model import build_model

from bench_common import exit_without_teardown


class PackedSamples(torch.utils.data.Dataset):
    """The train samples of the packed token file, one (seq,) row each."""

    def __init__(self, prepared):
        self.tokens = np.memmap(prepared.bin_path, dtype=np.dtype(prepared.dtype), mode="r", shape=(prepared.num_tokens,))
        self.seq, self.n = prepared.seq_length, prepared.train_samples

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        row = torch.from_numpy(self.tokens[i * self.seq:(i + 1) * self.seq].astype(np.int64))
        return {"input_ids": row, "labels": row}


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times, self.ends, self._t0 = [], [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._t0)
        self.ends.append(time.time())
        if len(self.times) == 10 and os.environ.get("BENCH_READY_FILE"):
            Path(os.environ["BENCH_READY_FILE"]).touch()  # bench/train_overhead.py starts sampling rank 0 now


def main():
    cfg = compose(sys.argv[2:])
    layout = resolve_layout(cfg)
    avoid_shm_comm_build(layout.device)
    prepared = prepare_data(cfg, layout)
    ds_config = build_deepspeed_config(cfg, layout)
    model = build_model(cfg.model, seed=cfg.train.seed, vocab_size=layout.padded_vocab_size)
    args = TrainingArguments(
        output_dir=sys.argv[1] + ".trainer", deepspeed=ds_config, use_cpu=layout.device == "cpu",
        per_device_train_batch_size=layout.micro_batch_size, gradient_accumulation_steps=layout.grad_accum_steps,
        max_steps=cfg.train.steps, learning_rate=cfg.optimizer.lr, warmup_steps=cfg.scheduler.warmup_steps,
        weight_decay=cfg.optimizer.weight_decay, adam_beta1=cfg.optimizer.beta1, adam_beta2=cfg.optimizer.beta2,
        adam_epsilon=cfg.optimizer.eps, max_grad_norm=cfg.optimizer.grad_clip,
        save_strategy="no", eval_strategy="no", logging_steps=10**9, report_to=[], disable_tqdm=True,
        dataloader_num_workers=0, seed=cfg.train.seed)
    timer = StepTimer()
    trainer = Trainer(model=model, args=args, train_dataset=PackedSamples(prepared), callbacks=[timer])
    trainer.train()
    if torch.distributed.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"step_times": timer.times, "step_ends": timer.ends}, f)
    exit_without_teardown()


if __name__ == "__main__":
    main()
