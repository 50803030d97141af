"""The range of every numeric setting, checked in one place before anything starts.

`RANGES` maps each int/float field of the schema (dotted key) to its allowed range, the reason for it and an
example fix; `check_ranges(cfg)` refuses the first value outside its range with a ConfigError, then checks the
few rules that tie two settings together (warmup vs the run, the cosine floor vs the peak, lr x weight decay,
eval without a held-out split). resolve_layout calls it first, so `launcher plan`, `show`, `train`, `submit`
and every rank refuse the same values. Each field's docstring in schema.py states the same range
(`Range: ...`, rendered by `Range.describe`); tests/unit/test_ranges.py holds the two to each other.

OmegaConf types the values (an int field refuses 1.5), but accepts nan, inf and any sign; those are caught here.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Optional

from omegaconf import OmegaConf

from launcher.config.errors import ConfigError

# sbatch --signal=<sig>@<time>: SLURM takes 0..65535 seconds (sbatch(1), --signal).
MAX_SIGNAL_TIME_S = 65535
# A SLURM job's MASTER_PORT = cluster.master_port + 2 x (job id mod PORT_SLOTS), plus the next port for the preflight.
PORT_SLOTS = 500


@dataclass(frozen=True)
class Range:
    """low <= value <= high (open ends where `*_open`), whole or real, optionally null."""

    low: Optional[float] = None
    high: Optional[float] = None
    whole: bool = True
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False
    why: str = ""
    example: str = ""  # the fix: a valid value, in a sentence
    off: Optional[str] = None  # what the value 0 means, when 0 is allowed and special

    def describe(self) -> str:
        """The range as written in the schema docstrings, e.g. '>= 1', '> 0, finite', '[0, 1)', '0..3'."""
        if self.low is not None and self.high is not None:
            if self.whole:
                text = f"{_num(self.low)}..{_num(self.high)}"
            else:
                text = f"{'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {_num(self.low)}"
        else:
            text = "any"
        if not self.whole and (self.low is None or self.high is None):
            text += ", finite"
        if self.off:
            text += f" (0 = {self.off})"
        return text + (", or null" if self.nullable else "")

    def allows(self, value) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.whole and not isinstance(value, int):
            return False
        if not self.whole and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return False
        return True

    def rule(self) -> str:
        kind = "a whole number" if self.whole else "a number" if self.high is not None else "a finite number"
        return f"must be {kind} {_phrase(self)}" + (f" ({self.why})" if self.why else "")


def _num(x) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        x = int(x)
    if isinstance(x, int) and x > 10**6 and ((x & (x - 1)) == 0 or (x & (x + 1)) == 0):
        power = (x & (x - 1)) == 0
        return f"2**{x.bit_length() - 1}" if power else f"2**{x.bit_length()}-1"
    return str(x)


def _phrase(r: Range) -> str:
    """'>= 1', 'in 0..3', 'in [0, 1)', '> 0', with ', or null' where null is allowed (finiteness and the '0 =' note
    are said by the rule's noun and the docstring)."""
    text = r.describe()
    text = text.replace(", finite", "")
    if r.off:
        text = text.replace(f" (0 = {r.off})", "")
    return ("in " + text) if r.low is not None and r.high is not None else text


def W(low: int, high: Optional[int] = None, **kw) -> Range:
    return Range(low=low, high=high, whole=True, **kw)


def R(low: Optional[float], high: Optional[float] = None, **kw) -> Range:
    return Range(low=low, high=high, whole=False, **kw)


_ADAM = "torch.optim.AdamW refuses betas outside [0, 1); at 1 the moving average never moves"
RANGES: dict[str, Range] = {
    "model.hidden_size": W(1, example="e.g. model.hidden_size=4096"),
    "model.num_hidden_layers": W(1, example="e.g. model.num_hidden_layers=32"),
    "model.num_attention_heads": W(1, example="e.g. model.num_attention_heads=32"),
    "model.num_key_value_heads": W(1, nullable=True, example="use a divisor of num_attention_heads, or null for multi-head attention"),
    "model.intermediate_size": W(1, nullable=True, example="e.g. model.intermediate_size=11008, or null (4 x hidden_size)"),
    "model.vocab_size": W(1, example="e.g. model.vocab_size=32000"),
    "model.max_position_embeddings": W(1, example="e.g. model.max_position_embeddings=2048"),
    "model.checkpoint_blocks": W(1, nullable=True, why="checkpointed blocks a stage; no checkpointing is model.activation_checkpointing=false",
                                 example="e.g. model.checkpoint_blocks=8, or null (every block)"),
    "model.rms_norm_eps": R(0, low_open=True, why="added to the variance under the norm's square root; 0 divides by zero on a constant row",
                            example="e.g. model.rms_norm_eps=1e-6 (llama) or 1e-5 (bloom, gpt)"),
    "model.rope_theta": R(0, low_open=True, why="the rotary base: frequencies are theta^(-2i/d)", example="e.g. model.rope_theta=10000"),
    "data.seq_length": W(1, example="e.g. data.seq_length=2048"),
    "data.val_fraction": R(0, 0.5, high_open=True, why="the held-out share of the documents (or of a token file's samples)",
                           example="use e.g. data.val_fraction=0.01"),
    "data.max_bytes": W(1, nullable=True, example="e.g. data.max_bytes=10000000, or null (read everything)"),
    "data.num_workers": W(1, example="e.g. data.num_workers=8 (one per core)"),
    "data.split_seed": W(0, example="e.g. data.split_seed=0"),
    "data.shuffle_buffer": W(0, example="e.g. data.shuffle_buffer=10000 (documents), or 0 (corpus order)"),
    "parallel.tensor_degree": W(1, example="e.g. parallel.tensor_degree=1"),
    "parallel.pipeline_degree": W(1, example="e.g. parallel.pipeline_degree=1"),
    "parallel.zero3_max_live_parameters": W(0, example="e.g. parallel.zero3_max_live_parameters=1000000000 (DeepSpeed's default)"),
    "parallel.zero3_max_reuse_distance": W(0, example="e.g. parallel.zero3_max_reuse_distance=1000000000 (DeepSpeed's default)"),
    "parallel.zero3_prefetch_bucket_size": W(0, example="e.g. parallel.zero3_prefetch_bucket_size=50000000 (DeepSpeed's default)"),
    "parallel.zero3_param_persistence_threshold": W(0, example="e.g. parallel.zero3_param_persistence_threshold=100000 (DeepSpeed's default)"),
    "parallel.sequence_degree": W(1, example="e.g. parallel.sequence_degree=1"),
    "parallel.context_degree": W(1, example="e.g. parallel.context_degree=1"),
    "parallel.data_degree": W(1, nullable=True, example="set parallel.data_degree=null (derived)"),
    "parallel.zero_stage": W(0, 3, why="DeepSpeed ZeRO has stages 0, 1, 2 and 3", example="set parallel.zero_stage to 0, 1, 2 or 3"),
    "batch.micro_batch_size": W(1, example="e.g. batch.micro_batch_size=4"),
    "batch.global_batch_size": W(1, example="e.g. batch.global_batch_size=256"),
    # fp16 loss scale 2**p must itself be a finite fp32 number (fp32's largest power of two is 2**127).
    "precision.initial_scale_power": W(0, 127, why="the loss scale 2**p must be a finite fp32 number",
                                       example="e.g. precision.initial_scale_power=16 (DeepSpeed's default)"),
    "precision.loss_scale_window": W(1, why="overflow-free steps before DeepSpeed raises the scale", example="e.g. precision.loss_scale_window=1000"),
    "precision.hysteresis": W(1, why="overflows DeepSpeed tolerates before lowering the scale", example="e.g. precision.hysteresis=2"),
    "precision.min_loss_scale": R(0, low_open=True, example="e.g. precision.min_loss_scale=1"),
    "optimizer.lr": R(0, low_open=True, why="the peak learning rate", example="e.g. optimizer.lr=3e-4"),
    "optimizer.weight_decay": R(0, why="a negative decay grows the weights", example="e.g. optimizer.weight_decay=0.1"),
    "optimizer.beta1": R(0, 1, high_open=True, why=_ADAM, example="e.g. optimizer.beta1=0.9"),
    "optimizer.beta2": R(0, 1, high_open=True, why=_ADAM, example="e.g. optimizer.beta2=0.95"),
    # torch accepts eps=0, but then a parameter whose gradient was always 0 (the embedding row of a token the
    # data never held) gets 0 / (sqrt(0) + 0) = nan on its first step (torch.optim.AdamW's update m / (sqrt(v) + eps)).
    "optimizer.eps": R(0, low_open=True, why="Adam divides by sqrt(v) + eps; with eps=0 a never-used embedding row becomes 0/0 = nan",
                       example="e.g. optimizer.eps=1e-8"),
    "optimizer.grad_clip": R(0, why="the gradient-norm clip", off="no clipping", example="e.g. optimizer.grad_clip=1.0"),
    "scheduler.warmup_steps": W(0, off="no warmup", example="e.g. scheduler.warmup_steps=100"),
    "scheduler.min_lr": R(0, why="the floor the cosine decays to", example="e.g. scheduler.min_lr=3e-5 (10% of the peak, as LLaMA)"),
    "scheduler.decay_steps": W(1, nullable=True, example="set scheduler.decay_steps=null (= train.steps)"),
    "cluster.nodes": W(1, example="e.g. cluster.nodes=1"),
    "cluster.gpus_per_node": W(1, example="e.g. cluster.gpus_per_node=8"),
    "cluster.cpus_per_task": W(1, nullable=True, example="e.g. cluster.cpus_per_task=64"),
    "cluster.peak_tflops": R(0, low_open=True, nullable=True, example="e.g. cluster.peak_tflops=312 (A100 bf16 dense)"),
    "cluster.memory_gb": R(0, low_open=True, nullable=True, example="e.g. cluster.memory_gb=80"),
    "cluster.host_memory_gb": R(0, low_open=True, nullable=True, example="e.g. cluster.host_memory_gb=2000 (a DGX H100 node)"),
    "cluster.intra_node_gbps": R(0, low_open=True, nullable=True, example="e.g. cluster.intra_node_gbps=300"),
    "cluster.inter_node_gbps": R(0, low_open=True, nullable=True, example="e.g. cluster.inter_node_gbps=25"),
    "cluster.signal_grace_s": W(1, MAX_SIGNAL_TIME_S, why="sbatch --signal=USR1@<seconds>", example="e.g. cluster.signal_grace_s=300: enough to save a checkpoint"),
    "cluster.master_port": W(1024, 65535 - 2 * PORT_SLOTS,
                             why=f"a TCP port above the privileged ones; jobs use master_port + 2 x (job id mod {PORT_SLOTS}) and the next port",
                             example="e.g. cluster.master_port=29500"),
    "logging.log_every": W(1, example="log every N >= 1 steps, e.g. logging.log_every=10"),
    "checkpoint.save_every": W(0, off="only at the end", example="e.g. checkpoint.save_every=100"),
    "checkpoint.keep_last": W(0, off="keep every checkpoint", example="e.g. checkpoint.keep_last=3"),
    "train.steps": W(1, example="train for at least one step, e.g. train.steps=1000"),
    "train.tokens": W(1, nullable=True, example="e.g. train.tokens=300000000000, or null"),
    # torch.manual_seed takes 0..2**64-1 and numpy's SeedSequence refuses negatives; 2**63-1 keeps it an int64.
    "train.seed": W(0, 2**63 - 1, why="torch.manual_seed and numpy's SeedSequence need a non-negative 64-bit integer",
                    example="e.g. train.seed=1234"),
    "train.eval_every": W(0, off="never", example="e.g. train.eval_every=50"),
    "train.eval_batches": W(1, example="evaluate on at least one batch, e.g. train.eval_batches=4"),
    "train.dist_timeout_s": W(1, example="use seconds >= 1 (60 on CPU ranks; a few minutes on large GPU jobs, where a slow step must not trip it)"),
}


# `launcher plan --search` checks a plain copy (SimpleNamespace all the way down, search.plain_config) per candidate,
# thousands of times: a dotted attrgetter reads a key in one C call (splitting each key per call was a tenth of the
# 405B search).
_GETTERS = {key: operator.attrgetter(key) for key in RANGES}


def check_ranges(cfg) -> None:
    """Refuse the first numeric setting outside its range, then the cross-setting rules below."""
    plain = not OmegaConf.is_config(cfg)   # asked once, not per key
    for key, rng in RANGES.items():
        value = _GETTERS[key](cfg) if plain else OmegaConf.select(cfg, key)
        if not rng.allows(value):
            raise ConfigError(key, value, rng.rule(), rng.example)
    _check_schedule(cfg)
    _check_optimizer(cfg)
    _check_eval_split(cfg)
    _check_loss_scale(cfg)


def decay_horizon(cfg) -> int:
    """Optimizer steps of the cosine decay: scheduler.decay_steps, or train.steps when null."""
    s = cfg.scheduler
    return s.decay_steps if s.decay_steps is not None else cfg.train.steps


def _check_schedule(cfg) -> None:
    s, o, steps = cfg.scheduler, cfg.optimizer, cfg.train.steps
    if s.name == "cosine":
        horizon = decay_horizon(cfg)
        source = "scheduler.decay_steps" if s.decay_steps is not None else "train.steps"
        if s.warmup_steps >= horizon:
            raise ConfigError("scheduler.warmup_steps", s.warmup_steps,
                              f"the warmup must end before the cosine decay does: warmup_steps >= {source} "
                              f"({s.warmup_steps} >= {horizon}), so the decay would never run (DeepSpeed would stretch "
                              f"its horizon to warmup_steps + 1 without a word)",
                              f"set scheduler.warmup_steps below {horizon} (e.g. {max(0, horizon // 20)}, 5% of it), "
                              f"or raise {source}")
    elif s.warmup_steps > steps:
        raise ConfigError("scheduler.warmup_steps", s.warmup_steps,
                          f"the warmup is longer than the run: warmup_steps > train.steps ({s.warmup_steps} > {steps}), "
                          f"so the run ends at lr = optimizer.lr x {steps - 1}/{s.warmup_steps} = "
                          f"{o.lr * (steps - 1) / s.warmup_steps:.3g} and never reaches the peak {o.lr:g}",
                          f"set scheduler.warmup_steps <= {steps}, or raise train.steps")
    if s.name == "cosine" and s.min_lr > o.lr:
        raise ConfigError("scheduler.min_lr", s.min_lr,
                          f"the cosine floor is above the peak: min_lr > optimizer.lr ({s.min_lr:g} > {o.lr:g}), so the "
                          f"'decay' would raise the learning rate",
                          f"set scheduler.min_lr <= {o.lr:g} (e.g. {o.lr / 10:g}, 10% of the peak)")


def _check_optimizer(cfg) -> None:
    o = cfg.optimizer
    # Decoupled weight decay multiplies every weight by (1 - lr x weight_decay) each step (Loshchilov & Hutter 2019,
    # Algorithm 2, line 12; torch.optim.AdamW): at >= 1 the weights are zeroed or change sign every step.
    if o.lr * o.weight_decay >= 1:
        raise ConfigError("optimizer.weight_decay", o.weight_decay,
                          f"AdamW multiplies each weight by 1 - lr x weight_decay per step: 1 - {o.lr:g} x {o.weight_decay:g} "
                          f"= {1 - o.lr * o.weight_decay:.3g} <= 0 zeroes or flips every weight",
                          "keep lr x weight_decay well below 1, e.g. optimizer.weight_decay=0.1")


def _check_eval_split(cfg) -> None:
    t, d = cfg.train, cfg.data
    if t.eval_every and d.val_fraction == 0:
        raise ConfigError("data.val_fraction", d.val_fraction,
                          f"train.eval_every={t.eval_every} evaluates on the held-out split, and val_fraction=0 holds "
                          "nothing out: the 'val loss' would be computed on leftover or training tokens",
                          "hold some tokens out (e.g. data.val_fraction=0.01), or turn evaluation off (train.eval_every=0)")


def _check_loss_scale(cfg) -> None:
    p = cfg.precision
    if p.dtype == "fp16" and p.min_loss_scale > 2.0 ** p.initial_scale_power:
        raise ConfigError("precision.min_loss_scale", p.min_loss_scale,
                          f"the floor is above the starting loss scale: min_loss_scale > 2**initial_scale_power "
                          f"({p.min_loss_scale:g} > 2**{p.initial_scale_power} = {2.0 ** p.initial_scale_power:g})",
                          f"set precision.min_loss_scale <= {2.0 ** p.initial_scale_power:g} (e.g. 1)")
