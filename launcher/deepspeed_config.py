"""The DeepSpeed engine config, from one pure function with an explicit key-by-key mapping.

No reflection over "non-default fields" and no "auto" values: every key we
emit is written below, with why where it is not obvious. Tests pin the output
with golden files and feed every recipe's config through DeepSpeed's own parser.
This module imports neither torch nor deepspeed.
"""

from __future__ import annotations

from launcher.config.layout import Layout, reduce_dtype
from launcher.plan.memory import (BF16_IMMEDIATE_GRAD_UPDATE, REDUCE_BUCKET_ELEMENTS, overlap_comm_on, reduce_bucket_for,
                                  uses_bf16_optimizer)
from launcher.plan.params import param_numels

# We print our own metrics every step; DeepSpeed's own periodic print would only duplicate them.
STEPS_PER_PRINT = 1_000_000_000
# zero_optimization.reduce_bucket_size in elements: the plan's value (its memory counts the bucket); a module global
# here so that tests/parallel/driver.py can shrink it for a run.
REDUCE_BUCKET_SIZE = REDUCE_BUCKET_ELEMENTS


def deepspeed_batch_world(layout: Layout) -> int:
    """The rank count DeepSpeed multiplies into its batch assertion.

    DeepSpeed checks train_batch_size == micro x accum x W when it parses the
    config (deepspeed/runtime/config.py, DeepSpeedConfig.__init__):
    - with our layer list (a pipeline, or any tensor parallelism at pipeline_degree = 1:
      launcher/parallel/tensor_model.py), its grid is the `mpu` and
      W = its data-parallel size, our data_degree; except that with a pipeline and
      context parallelism the grid's data axis holds the CP ranks too (the pipeline
      engine takes no other mpu: launcher/parallel/pipeline.py), so W = data_degree x
      context_degree, and the train_batch_size we emit is the global batch x CP;
    - without one (no TP, no pipeline), W = the whole world / sequence_parallel_size = data_degree.
    (DeepSpeed AutoTP, no longer used, parsed the config before installing its groups and so counted each TP rank
    as a replica: W was data_degree x tensor_degree there.)
    """
    if layout.pipeline_engine:
        return layout.data_degree * layout.context_degree
    return layout.data_degree


def _precision(cfg, layout: Layout) -> dict:
    p = cfg.precision
    out: dict = {
        "bf16": {"enabled": layout.dtype == "bf16"},
        "fp16": {"enabled": layout.dtype == "fp16"},
    }
    if layout.dtype == "fp16":
        # loss_scale 0 = dynamic loss scaling (Micikevicius et al. 2018, "Mixed Precision Training", section 3.2).
        out["fp16"].update({
            "loss_scale": 0,
            "initial_scale_power": p.initial_scale_power,
            "loss_scale_window": p.loss_scale_window,
            "hysteresis": p.hysteresis,
            "min_loss_scale": p.min_loss_scale,
        })
    if p.grad_accum_dtype is not None:
        out["data_types"] = {"grad_accum_dtype": p.grad_accum_dtype}
    if uses_bf16_optimizer(layout.dtype, layout.zero_stage, p.grad_accum_dtype == "fp32", layout.pipeline_degree):
        # BF16_Optimizer adds each bf16 gradient into its accumulation gradient from a hook as autograd produces it
        # and frees it, instead of zeroing and keeping every bf16 gradient until the backward ends and adding them
        # all then: the same adds (bit-identical results, tests/plan/test_bf16_accumulation.py), 8 bytes a
        # parameter less a micro-batch after the first, and no step-long copy of the gradients in the model dtype
        # (2 bytes a parameter; plan/steptime.py bf16_accumulation, plan/memory.py _model_states, which read the
        # same value).
        out["bf16"]["immediate_grad_update"] = BF16_IMMEDIATE_GRAD_UPDATE
    # Both keys, whatever the layout: DeepSpeed reads the second when sequence_parallel_size > 1, the first otherwise
    # (engine.py), and would default the second to fp32 (config.layout.reduce_dtype says why not).
    out["communication_data_type"] = out["seq_parallel_communication_data_type"] = reduce_dtype(cfg)
    return out


def zero3_sequence_parallel_reduction(cfg, layout: Layout) -> dict:
    """The gradient-reduction keys that keep Ulysses SP x ZeRO-3 gradients right: {} outside that layout.

    DeepSpeed 0.19.8 ZeRO-3 reduces each bucket of gradients over the sequence-data-parallel group (dp x sp
    ranks) by one of two paths (runtime/zero/stage3.py, __reduce_and_partition_ipg_grads):
    - __avg_scatter_contiguous_grads divides by |group| / sequence_parallel_size = dp, then all-reduces:
      the SP ranks' gradients are summed (each holds the gradient of its share of the loss) and the
      replicas averaged, which is the gradient of the mean loss;
    - __avg_scatter_grads (reduce_scatter_coalesced, comm/coalesced_collectives.py) divides by |group| =
      dp x sp and never multiplies sequence_parallel_size back: every gradient, and the reported norm,
      comes out 1/sp of the true one (measured at sp=2: grad norm 0.548 vs 1.097 on one rank; with SGD
      the loss leaves the 1-rank trajectory by 2e-3 relative after one step; tests/parallel, case sp2-z3).
    The second path is taken when reduce_scatter is true, and also for any bucket holding more than
    reduce_bucket_size elements, i.e. one parameter larger than the bucket (a 128k-token embedding at
    hidden 4096 is 525M elements). So: reduce_scatter off, and a bucket at least as large as the largest
    parameter. The price is an all-reduce (2 x params per rank on the wire) instead of a reduce-scatter
    (1 x) of the gradients: ZeRO-3's step moves 4 instead of 3 x params (Rajbhandari et al. 2020, section 7).
    """
    if layout.sequence_parallel_size == 1 or layout.zero_stage != 3:  # Ulysses or ring attention (CP) alike
        return {}
    largest = max(param_numels(cfg.model, layout.padded_vocab_size))
    return {"reduce_scatter": False,
            "reduce_bucket_size": reduce_bucket_for(REDUCE_BUCKET_SIZE, largest, 3, layout.sequence_parallel_size)}


def zero_optimization_base(stage: int, device: str) -> dict:
    """The zero_optimization keys every run gets, by stage and device; also what `launcher calibrate` builds its
    engine-cost probe with (launcher/runtime/calibrate.py), so that it measures the engine a run gets."""
    return {
        "stage": stage,
        "contiguous_gradients": True,
        # Overlapping the gradient reduction with the backward pass pays on GPUs; on CPU ranks (gloo)
        # it only adds buffer copies.
        "overlap_comm": overlap_comm_on(device),
        "reduce_scatter": True,
        # ZeRO 1/2: each gradient bucket is all-reduced whole (DeepSpeed's default, spelled out because the
        # planner prices that all-reduce: launcher/plan/steptime.py, DP / ZeRO).
        "use_multi_rank_bucket_allreduce": True,
        "reduce_bucket_size": REDUCE_BUCKET_SIZE,
        "allgather_bucket_size": 500_000_000,
    }


def _zero(cfg, layout: Layout) -> dict:
    par = cfg.parallel
    zero = zero_optimization_base(layout.zero_stage, layout.device)
    zero.update(zero3_sequence_parallel_reduction(cfg, layout))
    if layout.zero_stage == 3:
        # Export needs the full 16-bit weights gathered on save (launcher export reads them).
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        # How many parameters ZeRO 3 holds gathered and when it gathers them (parallel.zero3_*, DeepSpeed's defaults
        # unless set): the plan replays the same values (launcher/plan/memory.py zero3_gathered).
        zero.update({"stage3_param_persistence_threshold": par.zero3_param_persistence_threshold,
                     "stage3_max_reuse_distance": par.zero3_max_reuse_distance,
                     "stage3_prefetch_bucket_size": par.zero3_prefetch_bucket_size,
                     "stage3_max_live_parameters": par.zero3_max_live_parameters})
    if par.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": layout.device == "cuda"}
    if par.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": layout.device == "cuda"}
    return zero


def _optimizer(cfg, layout: Layout) -> dict:
    """AdamW. weight_decay here is the decayed group's; norm weights and biases get 0 through their own parameter
    group (launcher/runtime/optimizer.py), which DeepSpeed keeps over this value."""
    o = cfg.optimizer
    params = {
        "lr": o.lr,
        "betas": [o.beta1, o.beta2],
        "eps": o.eps,
        "weight_decay": o.weight_decay,
        # torch's AdamW instead of FusedAdam / DeepSpeedCPUAdam, which JIT-compile a C++
        # extension on first use (~73 s and ~133 s on a 2-core machine).
        "torch_adam": o.torch_adam,
        "adam_w_mode": True,
    }
    if o.torch_adam and optimizer_fused(cfg, layout):
        # DeepSpeed passes the remaining params to torch.optim.AdamW (runtime/engine.py, _configure_basic_optimizer):
        # fused=True is torch's single-kernel CUDA AdamW; without it torch picks the foreach implementation.
        params["fused"] = True
    return {"type": "AdamW", "params": params}


def optimizer_fused(cfg, layout: Layout) -> bool:
    """optimizer.fused, or by default: on GPU ranks whose optimizer step runs on the GPU (not ZeRO-Offload's CPU step).

    torch's fused (single-kernel) CUDA AdamW over its default foreach one: torchtitan made it its default after
    measuring 1.6-3.6% faster steps on Llama 3 8B across FSDP, TP, CP and PP (pytorch/torchtitan#881). On CPU ranks
    we keep torch's default (foreach), which every CPU test here runs.
    """
    if cfg.optimizer.fused is not None:
        return bool(cfg.optimizer.fused)
    return layout.device == "cuda" and not cfg.parallel.offload_optimizer


def _scheduler(cfg) -> dict:
    s = cfg.scheduler
    lr = cfg.optimizer.lr
    # warmup_steps 0 (no warmup): DeepSpeed 0.19.8's WarmupLR and WarmupCosineLR refuse warmup_num_steps 0 (a
    # ValueError in every rank) and raise 1 to 2, so "no warmup" is a 2-step warmup that starts at the peak
    # (warmup_min_lr = lr, warmup_min_ratio = 1): steps 1 and 2 train at optimizer.lr, the decay follows.
    warmup, start = (1, 1.0) if s.warmup_steps == 0 else (s.warmup_steps, 0.0)
    if s.name == "constant":
        return {"type": "WarmupLR", "params": {
            "warmup_min_lr": lr * start, "warmup_max_lr": lr, "warmup_num_steps": warmup, "warmup_type": "linear"}}
    total = s.decay_steps if s.decay_steps is not None else cfg.train.steps
    # Linear warmup then cosine decay to a floor, as in LLaMA (Touvron et al. 2023, section 2.2: final lr = 10% of peak).
    return {"type": "WarmupCosineLR", "params": {
        "total_num_steps": max(total, warmup + 1),
        "warmup_num_steps": warmup,
        "warmup_min_ratio": start,
        "warmup_type": "linear",
        "cos_min_ratio": s.min_lr / lr if lr > 0 else 0.0,
    }}


def _pipeline(cfg, layout: Layout) -> dict:
    return {
        "stages": layout.pipeline_degree,
        "partition": cfg.parallel.partition_method,
        "seed_layers": False,
        "activation_checkpoint_interval": 1 if cfg.model.activation_checkpointing else 0,
        # Splitting activations sent between stages across the TP ranks only helps when there are TP ranks, and
        # is wrong under sequence parallelism: DeepSpeed sends 1/tp of a tensor it assumes the TP ranks share and
        # all-gathers it on the next stage, while each SP rank's tensor is its own tokens (already 1/tp).
        "pipe_partitioned": layout.tensor_degree > 1 and not layout.sequence_parallel,
        "grad_partitioned": layout.tensor_degree > 1 and not layout.sequence_parallel,
    }


def build_deepspeed_config(cfg, layout: Layout) -> dict:
    """The DeepSpeed JSON for a composed config and its resolved layout."""
    ds: dict = {
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.grad_accum_steps,
        "train_batch_size": layout.micro_batch_size * layout.grad_accum_steps * deepspeed_batch_world(layout),
        # DeepSpeed 0.19.8 defaults gradient_clipping to 1.0 when the key is absent, so always emit it.
        "gradient_clipping": cfg.optimizer.grad_clip,
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
        "zero_optimization": _zero(cfg, layout),
        "optimizer": _optimizer(cfg, layout),
        "scheduler": _scheduler(cfg),
    }
    ds.update(_precision(cfg, layout))
    # No "activation_checkpointing" section: DeepSpeed 0.19.8 reads it only in deepspeed.checkpointing.configure,
    # which its engine never calls (runtime/activation_checkpointing/checkpointing.py), so its keys
    # (partition_activations, cpu_checkpointing) would promise what does not happen. Recompute is switched on where
    # it runs: transformers' gradient checkpointing (train.py) and the pipeline's activation_checkpoint_interval.
    if layout.sequence_parallel_size > 1:
        # Ulysses or CP ranks: DeepSpeed sums their gradients and averages only over data-parallel replicas.
        ds["sequence_parallel_size"] = layout.sequence_parallel_size
    if layout.pipeline_engine:
        ds["pipeline"] = _pipeline(cfg, layout)
    return ds
