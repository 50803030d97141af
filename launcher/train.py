"""The training loop, top to bottom. Runs inside every rank (torchrun, or srun + torchrun).

    resolve the frozen config -> join the process group -> open the packed data
    -> build_engine (model, DeepSpeed engine with our generated config)
    -> maybe resume -> for each step: train_step, metrics, maybe eval, maybe save,
       stop on preemption -> final save, loss plot, optional HF export

Every rank reads the same frozen `<run_dir>/config.yaml` (launcher/runtime/launch.py
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

from launcher.config.errors import ConfigError
from launcher.config.layout import resolve_layout
from launcher.deepspeed_config import build_deepspeed_config
from launcher.plan.rankmap import rank_coord
from launcher.runtime import checkpoint as ckpt
from launcher.runtime.data import TokenBatches, prepare_data
from launcher.runtime.durable import write_atomic
from launcher.runtime.launch import EXIT_NONFINITE, PREEMPTED_FILE, PreemptionFlag, init_distributed, run_dir_of
from launcher.runtime.state_bytes import measure_model_state_bytes
from launcher.runtime.metrics import (STATE_BYTES_FILE, MetricsSink, Throughput, current_rss_bytes,
                                      peak_memory_bytes, plot_loss, truncate_metrics)
from launcher.runtime.model import build_model
from launcher.runtime.nonfinite import UpdateVeto

# train.nan_policy=skip drops single bad batches; this many skipped steps in a row means divergence: stop.
MAX_CONSECUTIVE_SKIPS = 5

# The step whose model-state bytes we record: by then the optimizer has allocated its state (at step 0)
# and the gradients of this step exist (measured between backward and the optimizer step).
MEASURE_STATE_AT_STEP = 1


def check_supported(cfg, layout) -> None:
    """What this loop does not run yet, refused before any process starts."""
    if layout.sequence_degree > 1 and layout.tensor_degree > 1:
        raise ConfigError("parallel.sequence_degree", layout.sequence_degree,
                          f"Ulysses sequence parallelism runs without tensor parallelism in `launcher train` "
                          f"(tensor_degree={layout.tensor_degree}: AutoTP and the Ulysses all-to-all are not composed yet)",
                          "set parallel.tensor_degree=1, or parallel.sequence_degree=1")
    if layout.tensor_degree > 1 and layout.pipeline_degree == 1 and layout.zero_stage == 3:
        # deepspeed.initialize checks the batch against world / sp ranks; ZeRO-3 then re-reads the config with
        # AutoTP's groups as mpu (runtime/zero/partition_parameters.py, Init -> DeepSpeedConfig(config, mpu))
        # and checks it against data_degree. Measured on 2 CPU ranks (TP 2): "8 != 2 * 4 * 2", "16 != 2 * 4 * 1".
        mb, acc, dp, tp = layout.micro_batch_size, layout.grad_accum_steps, layout.data_degree, layout.tensor_degree
        raise ConfigError("parallel.zero_stage", 3,
                          f"DeepSpeed AutoTP (tensor_degree={tp} without a pipeline) stops at start under ZeRO-3: DeepSpeed "
                          f"0.19.8 checks train_batch_size twice, against micro x accum x (data x tensor degree) = "
                          f"{mb} x {acc} x {dp * tp} = {mb * acc * dp * tp} and against micro x accum x data_degree = "
                          f"{mb} x {acc} x {dp} = {mb * acc * dp}, and no value passes both",
                          "set parallel.zero_stage=2 (or 1, 0), or parallel.tensor_degree=1")
    if layout.sequence_degree > 1 and cfg.model.arch not in ("llama", "mistral", "qwen2"):
        raise ConfigError("parallel.sequence_degree", layout.sequence_degree,
                          f"Ulysses sequence parallelism is implemented for model.arch=llama, mistral, qwen2, not {cfg.model.arch}",
                          "set parallel.sequence_degree=1, or model.arch=llama")


def build_engine(cfg, layout, ds_config: dict):
    """The model (fixed-seed init, identical on every rank) wrapped by deepspeed.initialize.

    Which model, by layout (the rest of the loop only sees the engine):
    - pipeline_degree > 1: a PipelineModule, each rank building only its stage (launcher/parallel/pipeline.py),
      tensor-parallel inside the stages on the pipeline grid when tensor_degree > 1 (launcher/parallel/tensor.py);
      deepspeed.initialize then returns a PipelineEngine, driven by train_step_pipeline;
    - sequence_degree > 1: the transformers model with Ulysses attention (launcher/parallel/sequence.py); the SP
      groups go to deepspeed.initialize as its `mpu`, so ZeRO and the gradient reduction see them;
    - ZeRO-3 (no TP or SP): built directly as this rank's partitions (deepspeed.zero.Init), never whole;
    - otherwise the transformers model; with tensor_degree > 1 DeepSpeed AutoTP shards it
      (the generated config's tensor_parallel.autotp_size).
    Every path starts from the same weights: the launcher's seeded init (launcher/runtime/build.py).
    """
    import deepspeed

    mpu = None
    if layout.pipeline_degree > 1:
        from launcher.parallel.pipeline import build_pipeline_module

        model = build_pipeline_module(cfg, layout, seed=cfg.train.seed)  # activation checkpointing per block inside
    elif layout.sequence_degree > 1:
        from launcher.parallel.sequence import build_sequence_parallel_model, setup_sequence_parallel

        mpu = setup_sequence_parallel(layout.sequence_degree)
        model = build_sequence_parallel_model(cfg.model, seed=cfg.train.seed, vocab_size=layout.padded_vocab_size)
        maybe_apply_activation_checkpointing(cfg, model)
    elif layout.zero_stage == 3 and layout.tensor_degree == 1:
        from launcher.runtime.build import build_zero3_model

        model = build_zero3_model(cfg.model, cfg.train.seed, ds_config, vocab_size=layout.padded_vocab_size)
        maybe_apply_activation_checkpointing(cfg, model)
    else:
        model = build_model(cfg.model, seed=cfg.train.seed, vocab_size=layout.padded_vocab_size)
        maybe_apply_activation_checkpointing(cfg, model)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config, mpu=mpu)
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
        # Non-reentrant checkpointing works with ZeRO-3's parameter hooks and needs no requires_grad inputs.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def micro_loss(engine, input_ids, sp_rank: int, sp: int):
    """(the loss to backpropagate, the factor that makes it this rank's term of the logged loss) for one micro-batch.

    Without sequence parallelism the loss is the model's mean next-token loss (factor 1). With Ulysses
    (sp > 1) this rank holds S/sp tokens and backpropagates its share of the replica's loss
    (launcher/parallel/sequence.py: the sp shares sum to it); logging share x sp makes the mean over all
    ranks (train: the step's agreed loss, eval: the all-reduce) the mean replica loss again.
    """
    if sp == 1:
        return engine(input_ids=input_ids, labels=input_ids).loss, 1
    from launcher.parallel.sequence import sequence_parallel_loss

    return sequence_parallel_loss(engine, input_ids, sp_rank, sp), sp


def train_step(engine, batches: TokenBatches, step: int, accum: int, agree: "StepAgreement", veto, measure_state: bool = False,
               sp_rank: int = 0, sp: int = 1):
    """One optimizer step of a plain (AutoTP, Ulysses) engine: `accum` micro-batches forward + backward, then DeepSpeed's step.

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
        loss, scale = micro_loss(engine, input_ids, sp_rank, sp)
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


def train_step_pipeline(engine, batches: TokenBatches, step: int, accum: int, agree, veto, measure_state: bool = False):
    """One optimizer step of a PipelineEngine: DeepSpeed's 1F1B schedule over `accum` micro-batches.

    engine.train_batch runs forward, backward and the optimizer step itself, pulling (inputs, labels)
    pairs from the iterator on the first and last stage, and returns the mean loss over the micro-batches
    and the DP replicas on every rank. Model-state bytes are not measured here (the gradients are gone
    when train_batch returns). Same return shape as train_step; no veto (the update happens inside train_batch).
    """
    t0 = time.perf_counter()
    micro = [batches.batch(batches.train_sample_ids(step, j)) for j in range(accum)]
    data_wait = time.perf_counter() - t0
    loss = engine.train_batch(data_iter=iter([(x, x) for x in micro]))
    # The loss is known only after the update: a non-finite one is caught afterwards (run: "applied").
    global_loss, stop = agree.start(loss).wait()
    return global_loss, stop, data_wait, None


def evaluate(engine, batches: TokenBatches, num_batches: int, world: int, sp_rank: int = 0, sp: int = 1) -> float:
    """Mean loss over `num_batches` held-out micro-batches per DP replica, averaged over all ranks."""
    import deepspeed.comm as dist
    import torch
    from deepspeed.runtime.pipe.engine import PipelineEngine

    engine.eval()
    with torch.no_grad():
        inputs = [batches.batch(batches.val_sample_ids(b)).to(engine.device) for b in range(num_batches)]
        if isinstance(engine, PipelineEngine):
            # Averaged over the micro-batches and DP replicas and broadcast to every stage by DeepSpeed.
            local = engine.eval_batch(iter([(x, x) for x in inputs]), num_micro_batches=num_batches).item()
        else:
            local = sum(loss.item() * scale for loss, scale in (micro_loss(engine, x, sp_rank, sp) for x in inputs)) / num_batches
    engine.train()
    t = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / world


class StepAgreement:
    """The loop's one collective per step: the mean loss over all ranks, and whether any rank was asked to stop.

    `start(local mean loss)` begins an asynchronous all-reduce of (loss, preemption flag); `.wait()` on its
    result gives (global mean loss, stop). train_step starts it right after the last forward and waits just
    before the optimizer step, so the all-reduce runs during the backward instead of after it: blocking on
    it there took ~1% of rank 0's wall time on 2 CPU ranks, mostly waiting for the other rank to finish its
    backward (bench/train_overhead.py, rank-0 profile). Every rank reads the same sum, so all decide alike
    (veto the update, stop for preemption). NaN and inf survive the sum.
    """

    def __init__(self, world: int, stop_requested):
        self.world = world
        self.stop_requested = stop_requested  # () -> bool: this rank got SIGUSR1/SIGTERM

    def start(self, local_loss) -> "StepAgreement.Pending":
        import torch
        import torch.distributed as dist

        local_loss = local_loss.detach().to(torch.float64).reshape(1)
        flag = torch.ones_like(local_loss) if self.stop_requested() else torch.zeros_like(local_loss)
        values = torch.cat([local_loss, flag])
        return self.Pending(dist.all_reduce(values, async_op=True), values, self.world)

    class Pending:
        def __init__(self, work, values, world: int):
            self.work, self.values, self.world = work, values, world

        def wait(self) -> tuple[float, bool]:
            self.work.wait()
            loss_sum, stops = self.values.tolist()
            return loss_sum / self.world, stops > 0


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
    return (f"step {rec['step']:>6}  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  gnorm {gn}  "
            f"{rec['tokens_per_s']:,.0f} tok/s ({rec['tokens_per_s_per_rank']:,.0f}/rank)  "
            f"{rec['tflops_per_rank'] * 1e3:.2f} GFLOP/s/rank  {mfu}  step {rec['step_time_s'] * 1e3:.0f} ms  "
            f"data {rec['data_wait_s'] * 1e3:.1f} ms  mem {rec['peak_memory_bytes'] / 2**20:,.0f} MiB{skipped}")


def run(cfg) -> int:
    """Train according to the frozen config `cfg` in this rank; returns the process exit status."""
    import torch

    # 0. The preemption handlers first: under SLURM, SIGUSR1/SIGTERM may come while the ranks are still starting
    #    (data, process group, engine); Python's default for SIGUSR1 is to die, losing the requeue.
    preempt = PreemptionFlag()

    # 1. Every derived number, and the DeepSpeed JSON from its one generator.
    layout = resolve_layout(cfg)
    check_supported(cfg, layout)
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
    resume_from = ckpt.agree_before_group(cfg, run_dir, int(os.environ["RANK"]), warn=lambda m: print(m, flush=True))

    # 3. Process group (gloo / nccl); the run dir exists from here on
    #    (under SLURM no `launcher train` parent made it, so rank 0 freezes the config there itself).
    rank, world, _ = init_distributed(layout, cfg.train.dist_timeout_s)
    is_main = rank == 0
    if is_main:
        maybe_freeze_into_run_dir(cfg, run_dir, ds_config, prepared)
    torch.distributed.barrier()
    if is_main:
        ckpt.clear_resume_handoff(run_dir)  # every rank read it before joining the group
    # The ranks of one tensor-parallel group (and of one pipeline) read the same samples: index by DP rank.
    # Ulysses ranks of one replica also read the same samples, each keeping its S/sp tokens.
    coord = rank_coord(layout, rank)
    batches = TokenBatches(prepared, layout, seed=cfg.train.seed, dp_rank=coord.dp)
    sp_args = {"sp_rank": coord.sp, "sp": layout.sequence_degree}

    # 4. Model + engine; a pipelined engine runs whole optimizer steps itself.
    engine = build_engine(cfg, layout, ds_config)
    step_fn = train_step_pipeline if layout.pipeline_degree > 1 else functools.partial(train_step, **sp_args)

    # 5. Resume: refuse a changed layout, then restore DeepSpeed's state; the step is our data position.
    start_step, tokens_seen = 0, 0
    if resume_from is not None:
        saved = ckpt.load_state(resume_from)
        ckpt.check_resume_compatible(saved, cfg, layout, resume_from, prepared)
        ckpt.load_checkpoint(engine, resume_from)
        start_step, tokens_seen = saved["step"], saved["tokens_seen"]
        if is_main:
            truncate_metrics(run_dir, start_step)

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
        sink.log({"kind": "checkpoint", "step": step, "bytes": info["bytes"], "save_s": info["save_s"],
                  "hash_s": info["hash_s"], "rss_bytes_per_rank": rss})

    # 7. The loop.
    step = start_step
    stopped_by = None
    # Steps whose update was not applied (non-finite loss or gradients, fp16 overflow), across resumes.
    skipped_steps = list(saved.get("skipped_steps", [])) if resume_from is not None else []
    overflow_steps = 0
    veto = UpdateVeto(engine)
    agree = StepAgreement(world, stop_requested=lambda: preempt.raised)
    with progress:
        while step < steps:
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
                _record_state_bytes(cfg, layout, run_dir, rank, state_bytes)
            grad_norm = engine.get_global_grad_norm()
            grad_norm = float(grad_norm) if grad_norm is not None else None
            loss_finite = math.isfinite(loss)
            overflow = skipped and loss_finite and layout.dtype == "fp16"  # the loss scaler's ordinary business
            if skipped and not overflow:
                skipped_steps.append(step)
            overflow_steps += overflow
            rec = {"kind": "train", "step": step, "time": time.time(), "loss": loss, "lr": lr, "grad_norm": grad_norm,
                   "tokens_seen": tokens_seen, "step_time_s": step_time, "data_wait_s": data_wait,
                   "peak_memory_bytes": peak_memory_bytes(layout.device), "skipped": skipped,
                   "skipped_steps": len(skipped_steps), "overflow_steps": overflow_steps, **throughput(step_time)}
            if step % cfg.logging.log_every == 0 or step == steps or step == start_step + 1 or skipped or not loss_finite:
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
                val_loss = evaluate(engine, batches, cfg.train.eval_batches, world, **sp_args)
                sink.log({"kind": "eval", "step": step, "val_loss": val_loss, "val_perplexity": math.exp(min(val_loss, 50))})
                say(f"eval  step {step:>6}  val loss {val_loss:.4f}  perplexity {math.exp(min(val_loss, 50)):.2f}")
            if stop:
                stopped_by = preempt.signal_name or "a signal on another rank"
                break
            if cfg.checkpoint.save_every and step % cfg.checkpoint.save_every == 0 and step < steps:
                save(step)

    if skipped_steps or overflow_steps:
        say(f"skipped updates: {len(skipped_steps)} non-finite step(s) in this run {skipped_steps[-10:]}, "
            f"{overflow_steps} fp16 overflow step(s) since this process started", markup=False)

    # 8. Final checkpoint (also on preemption; not again when a resumed run had nothing left to do), then the artifacts.
    if step > start_step or resume_from is None:
        save(step)
    if stopped_by is not None:
        if is_main:
            write_atomic(run_dir / PREEMPTED_FILE, f'{{"step": {step}, "signal": "{stopped_by}"}}\n')
        # No rank leaves before the marker exists: under `srun --kill-on-bad-exit` the first torchrun to exit
        # (non-zero after a forwarded signal) ends the step on every node, rank 0's included.
        torch.distributed.barrier()
        say(f"preempted ({stopped_by}) at step {step}: checkpoint saved, exiting for requeue")
        sink.close()
        return 0
    # The artifacts need no other rank: they exit now instead of idling in a collective with a timeout.
    if is_main:
        (run_dir / PREEMPTED_FILE).unlink(missing_ok=True)
        plot = plot_loss(run_dir)
        say(f"loss curve {plot}")
        if cfg.checkpoint.export_hf:
            from launcher.export import export_checkpoint

            out = export_checkpoint(ckpt_root / ckpt.tag_for(step), run_dir / "hf")
            say(f"transformers export {out}")
    sink.close()
    return 0


def nonfinite_action(cfg, step: int, loss_finite: bool, grad_norm, skipped: bool, overflow: bool,
                     skipped_steps: list[int], ckpt_root: Path) -> tuple[str | None, str]:
    """What a step with a non-finite loss or gradient norm means (launcher/runtime/nonfinite.py), and its log line.

    `applied`: the engine applied the update before the loss was known (pipeline): the weights may hold NaN,
    nothing is saved, the run exits. `stop`: the update was vetoed and train.nan_policy=stop (or too many
    steps in a row were skipped): save the untouched weights, exit. `skip`: vetoed, go on. None: a finite step
    (an fp16 overflow skip is the loss scaler's ordinary business, counted apart).
    """
    bad = not loss_finite or (grad_norm is not None and not math.isfinite(grad_norm) and not overflow)
    if bad and not skipped:
        return "applied", (f"non-finite {'loss' if not loss_finite else 'gradient norm'} at step {step}, and the update was "
                           f"applied (it happens inside the engine's step here): the weights may be poisoned, nothing is saved; "
                           f"exiting with status {EXIT_NONFINITE}. The last checkpoint is {ckpt.read_latest(ckpt_root)}")
    if not skipped or overflow:
        return None, ""
    what = "loss" if not loss_finite else "gradients"
    consecutive = _trailing_run(skipped_steps)
    if cfg.train.nan_policy == "stop" or consecutive >= MAX_CONSECUTIVE_SKIPS:
        why = ("train.nan_policy=stop" if cfg.train.nan_policy == "stop"
               else f"{consecutive} consecutive steps skipped: the model diverged, not one bad batch")
        return "stop", (f"non-finite {what} at step {step} ({why}): the update was not applied; saved {ckpt.tag_for(step)} "
                        f"with the weights of step {step - 1} as latest; exiting with status {EXIT_NONFINITE}. resume=auto "
                        f"continues after this batch; resume=<run_dir>/checkpoints/step_N from an earlier one")
    return "skip", (f"non-finite {what} at step {step}: update skipped (train.nan_policy=skip); "
                    f"{len(skipped_steps)} step(s) skipped in this run (across resumes): {skipped_steps[-10:]}")


def _trailing_run(steps: list[int]) -> int:
    """How many of the last entries of a sorted step list are consecutive (5, 7, 8, 9 -> 3)."""
    n = 0
    while n < len(steps) and steps[-1 - n] == steps[-1] - n:
        n += 1
    return n


def maybe_freeze_into_run_dir(cfg, run_dir: Path, ds_config: dict, prepared) -> None:
    """Create the run dir and its frozen files when no `launcher train` parent did (srun + torchrun)."""
    import json

    from launcher.runtime.launch import CONFIG_FILE, freeze_config

    if not (run_dir / CONFIG_FILE).exists():
        freeze_config(cfg, run_dir, ds_config)
    if not (run_dir / "data.json").exists():
        write_atomic(run_dir / "data.json", json.dumps(prepared.as_dict(), indent=2))


def _record_state_bytes(cfg, layout, run_dir: Path, rank: int, state_bytes: dict) -> None:
    """Gather every rank's measured model-state bytes; rank 0 writes them beside the planner's prediction.

    The prediction (launcher.plan.memory.predict_model_state_bytes) is exact for data-parallel layouts
    without offload; for others it says why it is not given. Every run so checks the memory model.
    """
    import json

    import deepspeed.comm as dist

    from launcher.plan.memory import predict_model_state_bytes

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state_bytes)
    if rank != 0:
        return
    try:
        predicted = [predict_model_state_bytes(cfg, layout, dp_rank=r) for r in range(len(gathered))]
        note = None
    except ValueError as exc:
        predicted, note = None, f"no exact prediction for this layout: {exc}"
    keys = ("params", "grads", "optimizer")
    matches = None if predicted is None else all(
        all(m[k] == p[k] for k in keys) for m, p in zip(gathered, predicted))
    write_atomic(run_dir / STATE_BYTES_FILE, json.dumps({
        "per_rank": gathered,
        "predicted_per_rank": predicted,
        "prediction_matches": matches,
        "prediction_note": note,
        "note": "bytes of parameters, gradients and optimizer state held by each rank, measured between backward "
                "and the optimizer step (launcher.runtime.state_bytes.measure_model_state_bytes); the prediction is "
                "launcher.plan.memory.predict_model_state_bytes"}, indent=2))
