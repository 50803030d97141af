"""The training loop, top to bottom. Runs inside every rank (torchrun, or srun + torchrun).

    resolve the frozen config -> join the process group -> open the packed data
    -> build_engine (model, DeepSpeed engine with our generated config)
    -> maybe resume -> for each step: train_step, metrics, maybe eval, maybe save,
       stop on preemption -> final save, loss plot, optional HF export

Every rank reads the same frozen `<run_dir>/config.yaml` (launcher/runtime/rundir.py
writes it once). Batches are a pure function of (seed, step, micro step, dp rank)
(launcher/runtime/data.py), so the step number is the whole data position.
"""

from __future__ import annotations

import functools
import math
import os
import time
import warnings
from pathlib import Path

from launcher.config.layout import resolve_layout
from launcher.config.supported import check_supported  # pure rules: plan --search applies the same ones
from launcher.deepspeed_config import build_deepspeed_config
from launcher.plan.rankmap import rank_coord
from launcher.runtime import checkpoint as ckpt
from launcher.runtime.cpualloc import recycle_step_buffers, zero3_gathered_bytes
from launcher.runtime.data import TokenBatches, prepare_data
from launcher.runtime.durable import write_atomic
from launcher.protocol import EXIT_NONFINITE, PREEMPTED_FILE
from launcher.runtime.distributed import StepAgreement, init_distributed, readable_arch_list_for_deepspeed
from launcher.runtime.elastic import universal_ds_config
from launcher.runtime.preemption import PreemptionFlag
from launcher.runtime.preflight import slow_cpu_bf16_warning
from launcher.runtime.rundir import run_dir_of
from launcher.runtime.state_bytes import MEASURE_STATE_AT_STEP, measure_model_state_bytes, record_state_bytes
from launcher.runtime.metrics import (METRICS_FILE, SUMMARY_FILE, WARMUP_STEPS, IntervalLoss, MetricsSink, Throughput,
                                      check_rates, cpu_snapshot, current_rss_bytes, divert_library_logs, format_summary,
                                      format_versus_plan, gather_cpu_share,
                                      gather_peak_memory, peak_memory_bytes, plot_loss, truncate_metrics, write_summary)
from launcher.runtime.model import build_model
from launcher.runtime.nonfinite import UpdateVeto, nonfinite_action
from launcher.runtime.optimizer import param_groups
from launcher.runtime.zero3 import shared_fp32_master

def build_engine(cfg, layout, ds_config: dict):
    """The model (fixed-seed init, identical on every rank) wrapped by deepspeed.initialize.

    Which model, by layout (the rest of the loop only sees the engine):
    - pipeline_degree > 1: a PipelineModule, each rank building only its stage (launcher/parallel/pipeline.py),
      tensor-parallel inside the stages on the pipeline grid when tensor_degree > 1 (launcher/parallel/tensor.py),
      ring attention in its blocks when context_degree > 1; deepspeed.initialize then returns a PipelineEngine,
      driven by train_step_pipeline;
    - tensor_degree > 1 at pipeline_degree = 1 (with or without Megatron SP or CP): the same per-rank TP layers on
      the plain engine, each rank building only its TP slice, with their grid as the `mpu`
      (launcher/parallel/tensor_model.py), so ZeRO-2 applies; driven by train_step like every plain engine;
    - sequence_degree > 1: the transformers model with Ulysses attention (launcher/parallel/sequence.py); the SP
      groups go to deepspeed.initialize as its `mpu`, so ZeRO and the gradient reduction see them;
    - context_degree > 1: the same with ring attention (launcher/parallel/context.py), its CP groups as the `mpu`;
    - ZeRO-3 without TP or PP (Ulysses and CP included): built directly as this rank's partitions
      (deepspeed.zero.Init), never whole;
    - otherwise (1 rank, or ZeRO-0/1/2 data parallelism) the transformers model.
    Every path starts from the same weights: the launcher's seeded init (launcher/runtime/build.py).
    """
    import deepspeed

    mpu = None
    if layout.pipeline_engine:
        from launcher.parallel.pipeline import build_pipeline_module

        model = build_pipeline_module(cfg, layout, seed=cfg.train.seed)  # activation checkpointing per block inside
    elif layout.pipeline_layers:
        from launcher.parallel.tensor_model import build_tensor_parallel_model

        model, mpu = build_tensor_parallel_model(cfg, layout, seed=cfg.train.seed)  # checkpointing per block inside
    elif layout.sequence_degree > 1:
        from launcher.parallel.sequence import build_sequence_parallel_model, setup_sequence_parallel

        mpu = setup_sequence_parallel(layout.sequence_degree)
        model = build_sequence_parallel_model(cfg.model, seed=cfg.train.seed, vocab_size=layout.padded_vocab_size,
                                              zero3_config=ds_config if layout.zero_stage == 3 else None)
        maybe_apply_activation_checkpointing(cfg, model)
        maybe_chunk_the_loss(cfg, model)
    elif layout.context_degree > 1:
        from launcher.parallel.context import build_context_parallel_model, setup_context_parallel

        mpu = setup_context_parallel(layout.context_degree)
        model = build_context_parallel_model(cfg.model, seed=cfg.train.seed, vocab_size=layout.padded_vocab_size,
                                             zero3_config=ds_config if layout.zero_stage == 3 else None)
        maybe_apply_activation_checkpointing(cfg, model)
        maybe_chunk_the_loss(cfg, model)
    elif layout.zero_stage == 3 and layout.tensor_degree == 1:
        from launcher.runtime.build import build_zero3_model

        model = build_zero3_model(cfg.model, cfg.train.seed, ds_config, vocab_size=layout.padded_vocab_size)
        maybe_apply_activation_checkpointing(cfg, model)
        maybe_chunk_the_loss(cfg, model)
    else:
        model = build_model(cfg.model, seed=cfg.train.seed, vocab_size=layout.padded_vocab_size)
        maybe_apply_activation_checkpointing(cfg, model)
        maybe_chunk_the_loss(cfg, model)
    # No weight decay on norm weights and biases (launcher/runtime/optimizer.py: Megatron's rule).
    groups = param_groups(model, cfg.optimizer.weight_decay)
    # ZeRO-3 in fp32 keeps no second copy of the weights as master weights (launcher/runtime/zero3.py).
    with shared_fp32_master():
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config, mpu=mpu)
    start_lr_schedule(engine)
    return engine


def start_lr_schedule(engine) -> None:
    """Put DeepSpeed's scheduler at iteration 0, so that optimizer step k (1-based) uses the schedule's iteration k-1.

    DeepSpeed builds its config schedulers at iteration -1, where they set lr 0 ("Attempting to get learning
    rate from scheduler before it has started"), and steps them to iteration 0 (warmup ratio 0, lr 0 again)
    only after the first update: steps 1 and 2 would both train at lr 0 and the warmup would peak one step
    late. From iteration 0, step 1 alone has lr 0 (as in HF's and Megatron's linear warmup), step
    warmup_steps + 1 is at the peak, and the last step is at the floor. A resumed run then loads the saved
    iteration over this one (ckpt.load_checkpoint).
    """
    sched = engine.lr_scheduler
    if sched is not None and getattr(sched, "last_batch_iteration", None) == -1:
        sched.step(0)


def maybe_apply_activation_checkpointing(cfg, model) -> None:
    if cfg.model.activation_checkpointing:
        from launcher.runtime.recompute import checkpoint_kwargs

        # Non-reentrant, with torch's selection policy under model.checkpoint_mode=selective.
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=checkpoint_kwargs(getattr(cfg.model, "checkpoint_mode", "full")))
        checkpoint_first_blocks(model, getattr(cfg.model, "checkpoint_blocks", None))


def maybe_chunk_the_loss(cfg, model) -> None:
    """model.chunked_loss: the head and the loss a chunk of tokens at a time (launcher/runtime/chunked_loss.py)."""
    if getattr(cfg.model, "chunked_loss", False):
        from launcher.runtime import chunked_loss

        chunked_loss.install(model)


def checkpoint_first_blocks(model, count) -> None:
    """model.checkpoint_blocks: keep checkpointing on the model's first `count` decoder blocks only (transformers
    checks each block's own flag; the pipeline's layer list does the same in StagePipelineModule). None: all."""
    if count is None:
        return
    from transformers.modeling_layers import GradientCheckpointingLayer

    blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for i, block in enumerate(blocks):
        block.gradient_checkpointing = i < count


def micro_loss(engine, input_ids, sp_rank: int, sp: int, cp_rank: int = 0, cp: int = 1, document_eos=None):
    """(the loss to backpropagate, the factor that makes it this rank's term of the logged loss) for one micro-batch.

    Without sequence parallelism the loss is the model's mean next-token loss (factor 1). With Ulysses
    (sp > 1) this rank holds S/sp tokens and backpropagates its share of the replica's loss
    (launcher/parallel/sequence.py: the sp shares sum to it); logging share x sp makes the mean over all
    ranks (train: the step's agreed loss, eval: the all-reduce) the mean replica loss again. Ring attention
    (cp > 1, launcher/parallel/context.py) the same with its S/cp head-tail tokens.
    `document_eos` (data.document_mask): positions restart after that id, and transformers masks attention
    across documents from them (launcher/runtime/documents.py).
    """
    if cp > 1:
        from launcher.parallel.context import context_parallel_loss
        from launcher.parallel.tensor_model import logits_vocab_group

        return context_parallel_loss(engine, input_ids, cp_rank, cp, logits_vocab_group(engine.module)), cp
    if sp == 1:
        if document_eos is not None:
            from launcher.runtime.documents import document_position_ids

            position_ids = document_position_ids(input_ids, document_eos)
            return engine(input_ids=input_ids, labels=input_ids, position_ids=position_ids).loss, 1
        return engine(input_ids=input_ids, labels=input_ids).loss, 1
    from launcher.parallel.sequence import sequence_parallel_loss

    return sequence_parallel_loss(engine, input_ids, sp_rank, sp), sp


def train_step(engine, batches: TokenBatches, step: int, accum: int, agree: "StepAgreement", veto, measure_state: bool = False,
               sp_rank: int = 0, sp: int = 1, cp_rank: int = 0, cp: int = 1, document_eos=None):
    """One optimizer step of a plain (TP, Megatron SP, Ulysses, CP) engine: `accum` micro-batches forward + backward, then DeepSpeed's step.

    engine.step() is called after every micro-batch; DeepSpeed applies the optimizer (with clipping and
    the LR schedule) only at the accumulation boundary, and scales each micro loss by 1/accum itself.
    The step's global loss (and the preemption flag) is all-reduced by `agree`, started after the last
    forward so it runs during the last backward, and waited for before the boundary step: when the global
    loss is not finite the update is vetoed (launcher/runtime/nonfinite.py).
    Returns (global mean loss, stop requested, seconds spent waiting for data, model-state bytes or None).
    """
    import torch

    from launcher.runtime.nonfinite import maybe_poison

    device = engine.device
    loss_sum = 0.0  # becomes a float64 tensor on the device: no host sync per micro-batch
    data_wait = 0.0
    state_bytes = None
    for micro_step in range(accum):
        last = micro_step == accum - 1
        t0 = time.perf_counter()
        input_ids = batches.batch(batches.train_sample_ids(step, micro_step)).to(device, non_blocking=True)
        data_wait += time.perf_counter() - t0
        loss, scale = micro_loss(engine, input_ids, sp_rank, sp, cp_rank, cp, document_eos)
        loss = maybe_poison(loss, step + 1, micro_step, engine.global_rank)
        loss_sum = loss_sum + loss.detach().to(torch.float64) * scale
        if last:
            pending = agree.start(loss_sum / accum)
        engine.backward(loss)
        if last:
            if measure_state:
                state_bytes = measure_model_state_bytes(engine)
            global_loss, stop = pending.wait()
            veto.armed = not math.isfinite(global_loss)
        engine.step()
    veto.armed = False
    return global_loss, stop, data_wait, state_bytes


def pipeline_pairs(micro, cp_rank: int = 0, cp: int = 1) -> list:
    """The (inputs, labels) pairs a PipelineEngine pulls: (ids, ids) for causal_lm_loss's shift, or under context
    parallelism this rank's head-tail chunk of the ids and of the targets shifted over the whole sequence
    (launcher/parallel/context.py local_chunk; the blocks know their chunks' positions, and
    pipeline.context_pipeline_loss takes the targets)."""
    if cp == 1:
        return [(x, x) for x in micro]
    from launcher.parallel.context import local_chunk

    return [(ids, targets) for ids, _, targets in (local_chunk(x, cp_rank, cp) for x in micro)]


def train_step_pipeline(engine, batches: TokenBatches, step: int, accum: int, agree, veto, measure_state: bool = False,
                        cp_rank: int = 0, cp: int = 1, **_not_in_pipelines):
    """One optimizer step of a PipelineEngine: DeepSpeed's 1F1B schedule over `accum` micro-batches.

    engine.train_batch runs forward, backward and the optimizer step itself, pulling (inputs, labels)
    pairs from the iterator on the first and last stage, and returns the mean loss over the micro-batches
    and the DP replicas on every rank. Model-state bytes are not measured here (the gradients are gone
    when train_batch returns). Same return shape as train_step; no veto (the update happens inside train_batch).
    """
    t0 = time.perf_counter()
    micro = [batches.batch(batches.train_sample_ids(step, j)) for j in range(accum)]
    data_wait = time.perf_counter() - t0
    loss = engine.train_batch(data_iter=iter(pipeline_pairs(micro, cp_rank, cp)))
    # The loss is known only after the update: a non-finite one is caught afterwards (run: "applied").
    global_loss, stop = agree.start(loss).wait()
    return global_loss, stop, data_wait, None


def evaluate(engine, batches: TokenBatches, num_batches: int, world: int, sp_rank: int = 0, sp: int = 1,
             cp_rank: int = 0, cp: int = 1, document_eos=None) -> float:
    """Mean loss over `num_batches` held-out micro-batches per DP replica, averaged over all ranks."""
    import deepspeed.comm as dist
    import torch
    from deepspeed.runtime.pipe.engine import PipelineEngine

    engine.eval()
    with torch.no_grad():
        inputs = [batches.batch(batches.val_sample_ids(b)).to(engine.device) for b in range(num_batches)]
        if isinstance(engine, PipelineEngine):
            # Averaged over the micro-batches and DP replicas and broadcast to every stage by DeepSpeed.
            local = engine.eval_batch(iter(pipeline_pairs(inputs, cp_rank, cp)), num_micro_batches=num_batches).item()
        else:
            local = sum(loss.item() * scale for loss, scale in (micro_loss(engine, x, sp_rank, sp, cp_rank, cp, document_eos)
                                                                for x in inputs)) / num_batches
    engine.train()
    t = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / world


def build_progress(enabled: bool, total: int, start: int):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    # soft_wrap: log lines stay whole in files and SLURM logs (a hard wrap at 80 columns splits them for grep).
    # highlight=False: no colouring regexes over every log line (0.34 -> 0.07 ms a line here).
    progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), disable=not enabled,
                        console=Console(soft_wrap=True, highlight=False))
    task = progress.add_task("train", total=total, completed=start, info="")
    return progress, task


def format_line(rec: dict) -> str:
    mfu = "MFU n/a" if rec["mfu"] is None else f"MFU {rec['mfu']:.1%}"
    gn = "n/a" if rec["grad_norm"] is None else f"{rec['grad_norm']:.3f}"
    skipped = "  SKIPPED (no update)" if rec.get("skipped") else ""
    n = rec["loss_interval_steps"]
    mean_of = f" (mean of {n} steps)" if n > 1 else ""
    plan = f" (plan {rec['predicted_step_time_s'] * 1e3:.0f})" if rec.get("predicted_step_time_s") else ""
    return (f"step {rec['step']:>6}  loss {rec['loss']:.4f}{mean_of}  lr {rec['lr']:.2e}  gnorm {gn}  "
            f"{rec['tokens_per_s']:,.0f} tok/s ({rec['tokens_per_s_per_rank']:,.0f}/rank)  "
            f"{rec['tflops_per_rank'] * 1e3:.2f} GFLOP/s/rank  {mfu}  step {rec['step_time_s'] * 1e3:.0f} ms{plan}  "
            f"data {rec['data_wait_s'] * 1e3:.1f} ms  peak mem {max(rec['peak_memory_bytes_per_rank']) / 2**20:,.0f} MiB "
            f"(largest rank){skipped}")


def run(cfg) -> int:
    """Train according to the frozen config `cfg` in this rank; returns the process exit status."""
    import torch

    # 0. The preemption handlers first: under SLURM, SIGUSR1/SIGTERM may come while the ranks are still starting
    #    (data, process group, engine); Python's default for SIGUSR1 is to die, losing the requeue.
    preempt = PreemptionFlag()
    started = time.perf_counter()  # the summary's wall time: start-up (data, engine, resume) included

    # 1. Every derived number, and the DeepSpeed JSON from its one generator.
    layout = resolve_layout(cfg)
    check_supported(cfg, layout)
    if layout.device == "cpu":
        # Named, DeepSpeed picks its CPU accelerator without the warning its auto-detection prints on every rank
        # (deepspeed/accelerator/real_accelerator.py; it reads this before `import deepspeed` below finishes).
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    else:
        readable_arch_list_for_deepspeed()  # before the engine JIT-builds FusedAdam
    ds_config = build_deepspeed_config(cfg, layout)
    run_dir = run_dir_of(cfg)
    ckpt_root = run_dir / "checkpoints"

    # DeepSpeed's ZeRO calls torch's deprecated all_gather_into_tensor every step; the warning is not ours to fix.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*is deprecated", category=FutureWarning)
    # DeepSpeed's pipeline with TP (partitioned activations / checkpointing) broadcasts inside autograd; torch warns
    # once per rank and step. The gradients are right: TP x PP with checkpointing matches one rank (tests/parallel).
    warnings.filterwarnings("ignore", message="c10d::broadcast_: an autograd kernel was not registered", category=UserWarning)

    # 2. Data before the process group: `launcher train` cached it before starting the ranks, so this only
    #    opens the files; under SLURM the first rank to get the cache lock builds it while the others wait
    #    on the lock rather than inside a collective with a timeout.
    prepared = prepare_data(cfg, layout)

    #    The checkpoint to resume from is chosen before the process group too: rank 0 verifies it (minutes at
    #    175B) while the others wait on its answer with a bound of their own, not in a collective bounded by
    #    train.dist_timeout_s (runtime/checkpoint.py agree_before_group).
    #    Saved on another layout, rank 0 converts it to DeepSpeed's universal form first (runtime/elastic.py).
    resume_from, universal = ckpt.agree_before_group(cfg, run_dir, int(os.environ["RANK"]), layout,
                                                     warn=lambda m: print(m, flush=True))

    # 3. Process group (gloo / nccl); the run dir exists from here on
    #    (under SLURM no `launcher train` parent made it, so rank 0 freezes the config there itself).
    rank, world, _ = init_distributed(layout, cfg.train.dist_timeout_s)
    is_main = rank == 0
    if is_main:
        maybe_freeze_into_run_dir(cfg, run_dir, ds_config, prepared)
    torch.distributed.barrier()
    library_log = divert_library_logs(run_dir, rank)  # DeepSpeed's INFO lines to the run dir, not the console
    if is_main:
        ckpt.clear_resume_handoff(run_dir)  # every rank read it before joining the group
    # The ranks of one tensor-parallel group (and of one pipeline) read the same samples: index by DP rank.
    # Ulysses (CP) ranks of one replica also read the same samples, each keeping its S/sp (S/cp) tokens.
    coord = rank_coord(layout, rank)
    if prepared.format == "stream":  # data.streaming: tokenized here as the loop reads it (runtime/stream.py)
        from launcher.runtime.stream import StreamBatches

        batches = StreamBatches(cfg, prepared, layout, dp_rank=coord.dp)
    else:
        batches = TokenBatches(prepared, layout, seed=cfg.train.seed, dp_rank=coord.dp)
    # data.document_mask: the EOS id each micro-batch's positions restart after (check_supported allowed the layout).
    sp_args = {"sp_rank": coord.sp, "sp": layout.sequence_degree, "cp_rank": coord.cp, "cp": layout.context_degree,
               "document_eos": prepared.eos_id if getattr(cfg.data, "document_mask", False) else None}

    # 4. Model + engine; a pipelined engine runs whole optimizer steps itself.
    engine = build_engine(cfg, layout, universal_ds_config(ds_config) if universal else ds_config)
    step_fn = functools.partial(train_step_pipeline if layout.pipeline_engine else train_step, **sp_args)

    # 5. Resume: refuse what cannot continue, then restore DeepSpeed's state; the step is our data position.
    start_step, tokens_seen = 0, 0
    if resume_from is not None:
        saved = ckpt.load_state(resume_from)
        ckpt.check_resume_compatible(saved, cfg, layout, resume_from, prepared)
        ckpt.load_checkpoint(engine, universal or resume_from)
        start_step, tokens_seen = saved["step"], saved["tokens_seen"]
        if is_main:
            truncate_metrics(run_dir, start_step)

    #    CPU ranks: the build's transients are gone; from here a step's buffers are reused, not mapped afresh.
    recycle_step_buffers(layout.device, layout.zero_stage,
                         zero3_gathered_bytes(engine.module) if layout.zero_stage == 3 else None)

    # 6. Recorders (rank 0 only writes).
    sink = MetricsSink(cfg, run_dir, enabled=is_main, resumed=resume_from is not None)
    throughput = Throughput(cfg, layout)
    steps, accum = cfg.train.steps, layout.grad_accum_steps
    show_progress = is_main and cfg.logging.progress_bar
    progress, task = build_progress(show_progress, steps, start_step)
    say = progress.console.print if is_main else (lambda *a, **k: None)
    say(f"run dir {run_dir}  world {world}  tp {layout.tensor_degree}  pp {layout.pipeline_degree}  "
        f"dp {layout.data_degree}  ZeRO {layout.zero_stage}  {layout.dtype}  "
        f"micro {layout.micro_batch_size} x accum {accum} x dp {layout.data_degree} = {layout.global_batch_size} seqs "
        f"x {layout.seq_length} = {layout.tokens_per_step:,} tokens/step  "
        f"{'resuming at step ' + str(start_step) if resume_from else 'fresh start'}", markup=False)
    if is_main:
        slow_bf16 = slow_cpu_bf16_warning(layout)
        if slow_bf16:
            say(f"warning: {slow_bf16}", markup=False)

    from launcher.runtime.model import hf_meta

    hf_files = hf_meta(cfg)  # read once: the source directory may change or vanish during the run

    def save(step: int) -> None:
        import deepspeed.comm as dist

        state = ckpt.build_state(cfg, layout, ds_config, step, tokens_seen, prepared)
        state["skipped_steps"] = list(skipped_steps)
        state["hf"] = hf_files  # what the export writes beside the weights (launcher/export.py)
        info = ckpt.save_checkpoint(engine, ckpt_root, step, state, cfg.checkpoint.keep_last, rank, prepared.tokenizer_path)
        # Each rank's resident memory at every checkpoint: a leak across saves shows as a rising series.
        rss = [None] * world
        dist.all_gather_object(rss, current_rss_bytes())
        sink.log({"kind": "checkpoint", "step": step, "tokens_seen": tokens_seen, "bytes": info["bytes"], "save_s": info["save_s"],
                  "hash_s": info["hash_s"], "rss_bytes_per_rank": rss})

    def run_eval(step: int) -> tuple[int, float]:
        val_loss = evaluate(engine, batches, cfg.train.eval_batches, world, **sp_args)
        sink.log({"kind": "eval", "step": step, "tokens_seen": tokens_seen, "val_loss": val_loss,
                  "val_perplexity": math.exp(min(val_loss, 50))})
        say(f"eval  step {step:>6}  val loss {val_loss:.4f}  perplexity {math.exp(min(val_loss, 50)):.2f}")
        return step, val_loss

    # 7. The loop.
    step = start_step
    stopped_by = None
    # Steps whose update was not applied (non-finite loss or gradients, fp16 overflow), across resumes.
    skipped_steps = list(saved.get("skipped_steps", [])) if resume_from is not None else []
    overflow_steps = 0
    veto = UpdateVeto(engine)
    agree = StepAgreement(world, stop_requested=lambda: preempt.raised)
    interval = IntervalLoss()
    logged_loss, last_eval = (None, 0), None  # (interval mean, its steps) of the last record; (step, val loss)
    loop_started, tokens_at_start = time.perf_counter(), tokens_seen
    # Who used the CPU over the timed steps (those the summary's median is over: after WARMUP_STEPS, or all of a
    # shorter launch), for the summary beside the plan (metrics.gather_cpu_share; CPU ranks).
    cpu_start = cpu_snapshot() if layout.device == "cpu" else None
    with progress:
        while step < steps:
            if step - start_step == WARMUP_STEPS and layout.device == "cpu":
                cpu_start = cpu_snapshot()
            lr = engine.get_lr()[0]  # the rate this step's optimizer update uses
            t0 = time.perf_counter()
            measure = step == max(start_step, MEASURE_STATE_AT_STEP)
            skipped_before = engine.skipped_steps
            loss, stop, data_wait, state_bytes = step_fn(engine, batches, step, accum, agree, veto, measure_state=measure)
            skipped = engine.skipped_steps > skipped_before
            step_time = time.perf_counter() - t0
            step += 1
            tokens_seen += layout.tokens_per_step

            if state_bytes is not None:
                record_state_bytes(cfg, layout, run_dir, rank, state_bytes)
            grad_norm = engine.get_global_grad_norm()
            grad_norm = float(grad_norm) if grad_norm is not None else None
            loss_finite = math.isfinite(loss)
            overflow = skipped and loss_finite and layout.dtype == "fp16"  # the loss scaler's ordinary business
            if skipped and not overflow:
                skipped_steps.append(step)
            overflow_steps += overflow
            interval.add(loss)
            # Every rank takes the same branch (the loss and the skip are agreed): the memory gather is a collective.
            if step % cfg.logging.log_every == 0 or step == steps or step == start_step + 1 or skipped or not loss_finite:
                logged_loss = interval.take()
                rec = {"kind": "train", "step": step, "time": time.time(), "loss": logged_loss[0],
                       "loss_interval_steps": logged_loss[1], "step_loss": loss, "lr": lr, "grad_norm": grad_norm,
                       "tokens_seen": tokens_seen, "step_time_s": step_time, "data_wait_s": data_wait,
                       "peak_memory_bytes": peak_memory_bytes(layout.device),
                       "peak_memory_bytes_per_rank": gather_peak_memory(layout.device, engine.device),
                       "skipped": skipped, "skipped_steps": len(skipped_steps), "overflow_steps": overflow_steps,
                       **throughput(step_time)}
                sink.log(rec)
                say(format_line(rec), markup=False)
            if show_progress:
                progress.update(task, completed=step, info=f"loss {loss:.3f}")

            action, message = nonfinite_action(cfg, step, loss_finite, grad_norm, skipped, overflow, skipped_steps, ckpt_root)
            if action == "stop":
                save(step)  # the vetoed update left the weights of step - 1: those become latest
            if action in ("stop", "applied"):
                say(message, markup=False)
                sink.close()
                return EXIT_NONFINITE
            if action == "skip":
                say(message, markup=False)
            if cfg.train.eval_every and step % cfg.train.eval_every == 0:
                last_eval = run_eval(step)
            if stop:
                stopped_by = preempt.signal_name or "a signal on another rank"
                break
            if cfg.checkpoint.save_every and step % cfg.checkpoint.save_every == 0 and step < steps:
                save(step)

    train_time = time.perf_counter() - loop_started
    cpu_end = cpu_snapshot() if layout.device == "cpu" else None
    # A last evaluation at the end of training when the last step was not one (as Megatron's pretrain does,
    # "the end of training for val data"): the summary's val loss is the final model's.
    if stopped_by is None and cfg.train.eval_every and step > start_step and (last_eval is None or last_eval[0] != step):
        last_eval = run_eval(step)

    rates_now = cpu_share = None    # set below: the rates where the steps missed the plan; the CPU's users

    def report_summary(status: str, export) -> None:
        """The end-of-run record (metrics.jsonl, summary.json) and its lines on the console; rank 0."""
        tokens_run = tokens_seen - tokens_at_start
        summary = {"kind": "summary", "status": status, "step": step, "tokens_seen": tokens_seen,
                   "final_train_loss": logged_loss[0], "final_train_loss_steps": logged_loss[1],
                   "final_val_loss": last_eval[1] if last_eval else None, "final_val_step": last_eval[0] if last_eval else None,
                   "wall_time_s": time.perf_counter() - started, "train_time_s": train_time, "tokens_this_run": tokens_run,
                   "tokens_per_s": tokens_run / train_time if tokens_run and train_time > 0 else None,
                   "run_dir": str(run_dir), "checkpoint": str(ckpt_root / ckpt.tag_for(step)), "export": export,
                   "metrics": str(run_dir / METRICS_FILE), "summary": str(run_dir / SUMMARY_FILE),
                   "library_log": str(library_log)}
        summary |= throughput.versus_plan(peaks_before_probe)  # beside the plan
        summary["rates_now"] = rates_now
        summary["cpu_share"] = cpu_share
        sink.log(summary)
        write_summary(run_dir, summary)
        say(format_summary(summary), markup=False)
        say(format_versus_plan(summary), markup=False)

    if skipped_steps or overflow_steps:
        say(f"skipped updates: {len(skipped_steps)} non-finite step(s) in this run {skipped_steps[-10:]}, "
            f"{overflow_steps} fp16 overflow step(s) since this process started", markup=False)

    # 8. Final checkpoint (also on preemption; not again when a resumed run had nothing left to do), then the artifacts.
    if step > start_step or resume_from is None:
        save(step)
    # Every rank's peak for the summary (a collective: every rank is here), read before the rate probe below, whose
    # operands (~200 MiB on CPU ranks) would raise a CPU rank's peak RSS.
    peaks_before_probe = gather_peak_memory(layout.device, engine.device)
    if stopped_by is not None:
        if is_main:
            write_atomic(run_dir / PREEMPTED_FILE, f'{{"step": {step}, "signal": "{stopped_by}"}}\n')
        # No rank leaves before the marker exists: under `srun --kill-on-bad-exit` the first torchrun to exit
        # (non-zero after a forwarded signal) ends the step on every node, rank 0's included.
        torch.distributed.barrier()
        say(f"preempted ({stopped_by}) at step {step}: checkpoint saved, exiting for requeue")
        if is_main:
            report_summary("preempted", None)
        sink.close()
        return 0
    # Off the plan by more than 15%? Every rank measures this machine's GEMM and copy rates now, to set beside the
    # profile's: the summary then says whether the machine moved or the model missed (metrics.check_rates).
    rates_now = check_rates(throughput, layout.device, layout.dtype, engine.device)
    cpu_share = gather_cpu_share(cpu_start, cpu_end, layout.device)
    # The artifacts need no other rank: they exit now instead of idling in a collective with a timeout.
    if is_main:
        (run_dir / PREEMPTED_FILE).unlink(missing_ok=True)
        plot = plot_loss(run_dir)
        say(f"loss curve {plot}")
        out = None
        if cfg.checkpoint.export_hf:
            import contextlib

            from launcher.export import export_checkpoint

            # zero_to_fp32 print()s its progress ("Processing zero checkpoint ...") and transformers shows a progress
            # bar loading the export back: into DeepSpeed's log file.
            with open(library_log, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                out = str(export_checkpoint(ckpt_root / ckpt.tag_for(step), run_dir / "hf"))
        report_summary("completed", out)
    sink.close()
    return 0


def maybe_freeze_into_run_dir(cfg, run_dir: Path, ds_config: dict, prepared) -> None:
    """Create the run dir and its frozen files when no `launcher train` parent did (srun + torchrun)."""
    import json

    from launcher.protocol import CONFIG_FILE
    from launcher.runtime.rundir import freeze_config

    if not (run_dir / CONFIG_FILE).exists():
        freeze_config(cfg, run_dir, ds_config)
    if not (run_dir / "data.json").exists():
        write_atomic(run_dir / "data.json", json.dumps(prepared.as_dict(), indent=2))
