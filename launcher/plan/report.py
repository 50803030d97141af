"""`launcher plan`: the resolved layout and what follows from it, as one dict, a table, or JSON.

No torch here: planning must be instant and run on a laptop.
"""

from __future__ import annotations

from typing import Optional

from launcher.config.errors import ConfigError
from launcher.config.layout import Layout
from launcher.plan.host import estimate_host_memory, host_capacity, stages_by_node
from launcher.plan.inputs import model_shape, nics_added_hardware, resolve_hardware, strategy
from launcher.plan.memory import activation_bytes_per_layer, checkpointed_layers, estimate_memory, explain_stage_memory
from launcher.plan.params import count_params, rough_params
from launcher.plan.profile import BUILTIN
from launcher.config.supported import PIPELINE_ARCHS
from launcher.plan.stages import stage_blocks, stage_param_counts
from launcher.plan.steptime import estimate_step_time
from launcher.plan.track_record import describe, no_match, similar


def plan_summary(cfg, layout: Layout) -> dict:
    """Every number `launcher plan` reports, keyed as in `--json`."""
    params = count_params(cfg.model)
    out = {
        "recipe": cfg.recipe_name,
        "model": cfg.model.name,
        "arch": cfg.model.arch,
        "world_size": layout.world_size,
        "nodes": layout.nodes,
        "gpus_per_node": layout.gpus_per_node,
        "gpu": cfg.cluster.gpu,
        "tensor_degree": layout.tensor_degree,
        "pipeline_degree": layout.pipeline_degree,
        "sequence_degree": layout.sequence_degree,
        "sequence_parallel": layout.sequence_parallel,
        "context_degree": layout.context_degree,
        "data_degree": layout.data_degree,
        "zero_stage": layout.zero_stage,
        "precision": layout.dtype,
        "micro_batch_size": layout.micro_batch_size,
        "grad_accum_steps": layout.grad_accum_steps,
        "global_batch_size": layout.global_batch_size,
        "seq_length": layout.seq_length,
        "tokens_per_step": layout.tokens_per_step,
        "pipeline_micro_batches": layout.pipeline_micro_batches,
        "bubble_fraction": layout.bubble_fraction,
        "params_total": params.total,
        "params_non_embedding": params.non_embedding,
        "params_rough_12lh2_vh": rough_params(cfg.model),
        "vocab_size": layout.vocab_size,
        "padded_vocab_size": layout.padded_vocab_size,
        "warnings": list(layout.warnings),
    } | stage_summary(cfg, layout) | performance_summary(cfg, layout) | {"host_memory": host_summary(cfg, layout)}
    out["warnings"] += [noisy_profile_warning(cfg.cluster.profile, line) for line in out["profile_noisy"] or ()]
    return out


def noisy_profile_warning(profile: str, line: str) -> str:
    """The plan's warning for one figure whose calibration sweeps disagreed (profile.noisy_sweeps)."""
    return (f"the machine was busy while cluster.profile={profile} was measured: {line}; the step time planned from "
            "it moves with that, so calibrate again when the machine is quiet")


def host_memory(cfg, layout: Layout):
    """Host RAM of the fullest node (launcher/plan/host.py), against cluster.host_memory_gb, the calibrated profile's
    node or the catalog's node (host_capacity)."""
    tokens = cfg.train.tokens or cfg.train.steps * layout.tokens_per_step
    return estimate_host_memory(model_shape(cfg.model), strategy(cfg, layout), stages_by_node(layout), tokens,
                                host_capacity(cfg.cluster))


def host_summary(cfg, layout: Layout) -> dict:
    """The `host_memory` section of the plan: the fullest node's bytes per term, the capacity and the arithmetic."""
    h = host_memory(cfg, layout)
    return {"node": h.node, "ranks": h.ranks, "build_path": h.build_path,
            "build_bytes_per_rank": [int(b) for b in h.per_rank_build],
            "build_bytes": int(h.build), "checkpoint_bytes": int(h.checkpoint), "offload_bytes": int(h.offload),
            "data_loader_bytes": int(h.data_loader), "total_bytes": int(h.total),
            "capacity_bytes": None if h.capacity_bytes is None else int(h.capacity_bytes),
            "capacity_source": h.capacity_source, "fits": h.fits, "arithmetic": h.arithmetic()}


def check_host_memory(cfg, layout: Layout) -> None:
    """Refuse a layout whose fullest node needs more host RAM than it has (nothing to check when unknown)."""
    h = host_memory(cfg, layout)
    if h.fits is not False:
        return
    key = ("cluster.host_memory_gb" if cfg.cluster.host_memory_gb is not None
           else "cluster.profile" if h.capacity_source.startswith("cluster.profile") else "cluster.gpu")
    value = {"cluster.host_memory_gb": cfg.cluster.host_memory_gb, "cluster.profile": cfg.cluster.profile,
             "cluster.gpu": cfg.cluster.gpu}[key]
    fixes = []
    if cfg.parallel.offload_optimizer or cfg.parallel.offload_param:
        fixes.append("turn CPU offload off (parallel.offload_optimizer=false, parallel.offload_param=false) if the GPUs "
                     "hold the states (`launcher plan` shows GPU memory)")
    fixes.append(f"fewer ranks per node (cluster.gpus_per_node below {layout.gpus_per_node})")
    fixes.append("more nodes or a higher parallel.pipeline_degree (each rank builds and holds a smaller part)")
    if key == "cluster.gpu":
        fixes.append("or, if the nodes have more RAM than the catalog's DGX node, set cluster.host_memory_gb")
    if key == "cluster.profile":
        fixes.append("or, if the training nodes have more RAM than the node calibrated, set cluster.host_memory_gb")
    raise ConfigError(
        key, value,
        f"node {h.node} needs {h.total / 1e9:,.1f} GB of host memory but has {h.capacity_bytes / 1e9:,.1f} GB "
        f"({h.capacity_source}): {h.arithmetic()} (launcher/plan/host.py)",
        "; ".join(fixes))


def stage_summary(cfg, layout: Layout) -> dict:
    """Blocks and exact parameters (before TP sharding) of every pipeline stage, as DeepSpeed will cut them
    (launcher/plan/stages.py); null where the pipeline is not implemented for the architecture."""
    if layout.pipeline_degree > 1 and cfg.model.arch not in PIPELINE_ARCHS:
        return {"stage_blocks": None, "stage_params": None}
    args = (model_shape(cfg.model), layout.padded_vocab_size, layout.pipeline_degree, cfg.parallel.partition_method)
    return {"stage_blocks": list(stage_blocks(*args)), "stage_params": list(stage_param_counts(*args))}


def check_memory(cfg, layout: Layout) -> Optional[str]:
    """Refuse a layout whose model states alone exceed the GPU; a warning (returned) when only the full estimate does.

    The split is deliberate. Parameters, gradients and optimizer states per GPU follow from the layout by
    the ZeRO paper's accounting (Rajbhandari et al. 2020, section 3; our exact ledger matches DeepSpeed to
    the byte on CPU ranks, tests/plan), so when they alone do not fit, no micro-batch or recompute setting
    can help: a ConfigError before any rank starts or any job is submitted (`launcher train`, `launcher
    submit`). Activations and framework overhead are an estimate (kernels, allocator), so a total over
    capacity is a warning there; `launcher plan` reports both as DOES NOT FIT with the shortfall.
    CPU ranks have no capacity to plan against: None. Host RAM per node is checked first (check_host_memory).
    """
    check_host_memory(cfg, layout)
    hw = resolve_hardware(cfg.cluster, layout.dtype)
    if hw is None:
        return None
    mem = estimate_memory(model_shape(cfg.model), strategy(cfg, layout), hw)
    peak = mem.peak
    states = peak.params + peak.grads + peak.optimizer
    gb = 1e9
    if states > mem.capacity_bytes:
        raise ConfigError(
            "parallel.zero_stage" if layout.zero_stage < 3 else "cluster.nodes",
            layout.zero_stage if layout.zero_stage < 3 else cfg.cluster.nodes,
            f"the model states alone need {states / gb:.1f} GB per GPU (parameters {peak.params / gb:.1f} + gradients "
            f"{peak.grads / gb:.1f} + optimizer {peak.optimizer / gb:.1f} GB with ZeRO stage {layout.zero_stage}, "
            f"TP {layout.tensor_degree} x PP {layout.pipeline_degree} x DP {layout.data_degree}) but one "
            f"{cfg.cluster.gpu} GPU holds {mem.capacity_bytes / gb:.1f} GB",
            "shard more: a higher parallel.zero_stage, more tensor/pipeline degree or more nodes "
            "(`launcher plan --search` ranks the layouts that fit)")
    if not mem.fits:
        return (f"the planner estimates {peak.total / gb:.1f} GB per GPU (activations {peak.activations / gb:.1f} GB "
                f"included) for {mem.capacity_bytes / gb:.1f} GB: this may run out of memory; see `launcher plan`")
    return None


def performance_summary(cfg, layout: Layout) -> dict:
    """Memory per GPU, FLOPs, step time, throughput, MFU and days (null for CPU ranks without cluster.profile)."""
    hw = resolve_hardware(cfg.cluster, layout.dtype)
    keys = ("memory_per_gpu_bytes", "memory_how", "memory_capacity_bytes", "memory_headroom_bytes", "fits",
            "memory_peak_stage",
            "recompute", "flops_per_token", "hardware_flops_per_token", "step_time_s", "step_time_breakdown_s",
            "tokens_per_s", "tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "peak_tflops", "profile",
            "train_tokens", "train_days", "step_time_track_record", "step_time_track_record_note",
            "step_time_nics_added_s", "profile_noisy")
    shape = model_shape(cfg.model)
    st = strategy(cfg, layout)
    # Per block and micro-batch on one rank (launcher/plan/activations.py); needs no GPU numbers.
    per_layer = {"activation_bytes_per_layer": int(activation_bytes_per_layer(shape, st)),
                 # model.checkpoint_blocks (null: every block under recompute) and the blocks it checkpoints in all
                 "checkpoint_blocks": st.checkpoint_blocks, "checkpointed_blocks": checkpointed_layers(shape, st),
                 "num_blocks": shape.num_layers}
    if hw is None:
        return {**dict.fromkeys(keys), **per_layer}
    mem = estimate_memory(shape, st, hw)
    tokens = cfg.train.tokens or cfg.train.steps * layout.tokens_per_step
    t = estimate_step_time(shape, st, hw, tokens)
    # Where a group spans nodes with several GPUs on each and the profile measured no such group, the step time
    # with their NICs added up (profile.nics_added): the plan charges one NIC, the published runs went either way.
    # Planned again only where that profile differs and a group can span nodes.
    hw_added = nics_added_hardware(hw, layout.nodes, layout.gpus_per_node)
    added = estimate_step_time(shape, st, hw_added, tokens).step_time_s if hw_added is not None else None
    return {
        "memory_per_gpu_bytes": {k: int(v) for k, v in mem.per_gpu().items()},
        "memory_how": explain_stage_memory(shape, st, hw, mem.peak.stage),
        "memory_capacity_bytes": int(mem.capacity_bytes),
        "memory_headroom_bytes": int(mem.headroom_bytes),
        "fits": mem.fits,
        "memory_peak_stage": mem.peak.stage,
        "recompute": st.recompute,
        "flops_per_token": t.flops_per_token,
        "hardware_flops_per_token": t.hardware_flops_per_token,
        "step_time_s": t.step_time_s,
        "step_time_breakdown_s": t.breakdown(),
        "recompute_s": t.recompute_s,
        "tokens_per_s": t.tokens_per_s,
        "tflops_per_gpu": t.tflops_per_gpu,
        "hardware_tflops_per_gpu": t.hardware_tflops_per_gpu,
        "mfu": t.mfu if hw.device == "cuda" else None,
        "peak_tflops": hw.peak_tflops if hw.device == "cuda" else None,
        "profile": hw.profile.source,
        # calibrate's sweeps disagreed while it measured this profile (profile.noisy_sweeps): the plan says so
        "profile_noisy": list(hw.profile.noisy),
        "train_tokens": int(tokens),
        "train_days": t.train_days,
        **track_record(cfg, layout, hw),
        "step_time_nics_added_s": added if added is not None and added < t.step_time_s * 0.99 else None,
        **per_layer,
    }


def _no_track_record(cfg, hw, dtype: str) -> str:
    """Why the published runs say nothing about this plan's step time ("" where they do): they hold the built-in
    GPU profiles as they stand, in 16-bit precision, on the GPUs and model widths they ran (track_record.no_match)."""
    if hw is None or hw.device != "cuda":
        return "CPU ranks: no published runs; bench/steptime/results.md holds the model to runs on this machine"
    if getattr(cfg.cluster, "profile", None):
        return "a calibrated profile: the published runs hold the built-in profiles only"
    if hw.profile != BUILTIN.get(hw.name):
        return f"cluster.* rates override the built-in {hw.name} profile: the published runs held it as built in"
    if dtype == "fp32":
        return "fp32 (TF32 GEMMs): every published run trained in 16-bit precision"
    return no_match(hw.name, cfg.model.hidden_size)


def track_record(cfg, layout: Layout, hw) -> dict:
    """How the step-time model fared on the published runs most like this layout (launcher/plan/track_record.py),
    where the plan uses a built-in GPU profile as it stands; else why there is no record."""
    why = _no_track_record(cfg, hw, layout.dtype)
    rec = None if why else similar(hw.name, layout.zero_stage, layout.pipeline_degree, layout.tensor_degree,
                                   layout.seq_length, cfg.model.hidden_size)
    return {"step_time_track_record": rec, "step_time_track_record_note": why or describe(rec)}


def search_track_records(cfg, rows: list[dict]) -> str:
    """Each ranked layout's published-run record (`step_time_track_record`, None where there is none), and one line
    for the table: the best layout's record, or why there is none."""
    hw = resolve_hardware(cfg.cluster, cfg.precision.dtype)
    why = _no_track_record(cfg, hw, cfg.precision.dtype)
    for r in rows:
        r["step_time_track_record"] = None if why else similar(
            hw.name, r["zero_stage"], r["pipeline_degree"], r["tensor_degree"], cfg.data.seq_length,
            cfg.model.hidden_size)
    if not rows:
        return ""
    if why:
        return "step time vs published runs: " + why
    return "step time vs published runs, for #1: " + describe(rows[0]["step_time_track_record"])


def _s(x: float) -> str:
    """Seconds, with the precision a CPU-rank step (milliseconds) and a GPU-cluster step (seconds) both need."""
    return f"{x:.3g} s" if x < 1 else f"{x:,.2f} s"


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


def _performance_rows(s: dict) -> list[tuple[str, str, str]]:
    if s["fits"] is None:
        return [("memory / step time", "n/a", "CPU ranks: no rates to plan against (`launcher calibrate` writes a "
                 "profile; cluster.profile=PATH uses it)")]
    m = s["memory_per_gpu_bytes"]
    bd = s["step_time_breakdown_s"]
    step = s["step_time_s"]
    stage = s["memory_peak_stage"]
    return [
        ("memory: params", _gb(m["params"]), f"stage {stage}'s weights on one rank (block matrices / TP; norms whole; "
         f"embedding and head split over the vocabulary): {s['memory_how']['params']}"),
        ("memory: grads", _gb(m["grads"]), s["memory_how"]["grads"]),
        ("memory: optimizer", _gb(m["optimizer"]), s["memory_how"]["optimizer"]),
        ("memory: activations", _gb(m["activations"]),
         f"{s['activation_bytes_per_layer'] / 1e6:,.1f} MB per block per micro-batch ("
         + {"full": "checkpointed: its input", "none": "its saved tensors",
            "selective": "selectively checkpointed: its input and its matmuls' and attention's outputs"}[s["recompute"]]
         + (f"; {s['checkpointed_blocks']} of {s['num_blocks']} blocks checkpointed (model.checkpoint_blocks="
            f"{s['checkpoint_blocks']} a stage), the others keep their saved tensors"
            if s["recompute"] != "none" and s["checkpointed_blocks"] < s["num_blocks"] else "")
         + ", plan/activations.py) x blocks x in-flight micro-batches (1F1B: first stage holds PP)"
         + (" + the pipeline engine's stage input and output per micro-batch in flight and its receive buffer"
            if s["pipeline_degree"] > 1 else "") + " + embedding/head/fp32 loss"
         + (", or one block's recomputed set while recomputed once those are freed, whichever is larger"
            if s["recompute"] != "none" and s["checkpointed_blocks"] == s["num_blocks"] else "")),
        ("memory: overhead", _gb(m["overhead"]), s["memory_how"]["overhead"]),
        ("memory per GPU", f"{_gb(m['total'])} / {_gb(s['memory_capacity_bytes'])}",
         ("fits, " if s["fits"] else "DOES NOT FIT, ") + f"{_gb(abs(s['memory_headroom_bytes']))} "
         + ("free" if s["fits"] else "short") + f" (worst stage: {stage})"),
        ("FLOPs per token", f"{s['flops_per_token'] / 1e9:,.1f} GFLOP",
         f"6N + 12 L H Q T (PaLM app. B); with recompute {s['hardware_flops_per_token'] / 1e9:,.1f} (Narayanan eq. 3)"),
        ("step time", _s(step),
         f"GEMM {_s(bd['gemm'])} + attention {_s(bd['attention'])} + element-wise {_s(bd['memory_bound'])} + "
         + (f"framework {_s(bd['framework'])} + " if bd.get("framework") else "")
         + (f"waiting for the host's Python {_s(bd['host_bound'])} (host-bound: issuing a micro-batch takes longer "
            "than its kernels; a larger batch.micro_batch_size amortises it) + " if bd.get("host_bound") else "") +
         f"optimizer {_s(bd['optimizer'])} + TP {_s(bd['tp_comm'])} + SP {_s(bd['sp_comm'])} + PP {_s(bd['pp_comm'])} + "
         f"bubble {_s(bd['bubble'])} + DP/ZeRO exposed {_s(bd['dp_comm_exposed'])}"
         + (f" + DeepSpeed engine {_s(bd['engine'])}" if bd.get("engine") else "")
         + (f" + waits for the slowest rank {_s(bd['straggler'])}" if bd.get("straggler") else "")
         + (f" (recompute {_s(s['recompute_s'])} inside)" if s["recompute_s"] else "") + f"; rates: {s['profile']}"),
        ("step time vs published", _track_value(s["step_time_track_record"]), s["step_time_track_record_note"]),
        *([("step time, NICs added", _s(s["step_time_nics_added_s"]),
            "a collective group spans nodes with several GPUs on each: the plan charges it one NIC a GPU, this its "
            "GPUs' NICs together (NCCL's rings can; FSDP on H100 nodes measured more than one NIC a GPU, DeepSpeed's "
            "2021 ZeRO-3 about one: bench/published/results.md); `launcher submit --calibrate` on 2+ nodes measures "
            "which, and the plan then charges that (launcher/plan/profile.py nics_added, Profile.inter_for)")]
          if s.get("step_time_nics_added_s") else []),
        ("tokens / s", f"{s['tokens_per_s']:,.0f}", f"tokens per step / step time; {s['tokens_per_s'] / s['world_size']:,.0f} per GPU"),
        ("TFLOP/s per GPU", f"{s['tflops_per_gpu']:.1f} model / {s['hardware_tflops_per_gpu']:.1f} hardware",
         "FLOPs per token x tokens/s / world; hardware counts recompute (Megatron's and BLOOM's convention)"),
        ("MFU", "n/a" if s["mfu"] is None else f"{s['mfu']:.1%}",
         "CPU ranks: no dense peak" if s["mfu"] is None else "model TFLOP/s per GPU / dense peak"),
        ("training time", f"{s['train_days']:,.1f} days", f"train.tokens {s['train_tokens']:,} / tokens per s"),
    ]


def _track_value(rec: Optional[dict]) -> str:
    return "no record" if rec is None else f"{rec['min_error']:+.0%} .. {rec['max_error']:+.0%}"


def _rows(s: dict) -> list[tuple[str, str, str]]:
    """(quantity, value, how it is derived) rows of the plan table."""
    tp, pp, sp, dp = s["tensor_degree"], s["pipeline_degree"], s["sequence_degree"], s["data_degree"]
    cp = s.get("context_degree", 1)
    mp = f"{tp} x {pp}" + (f" x {sp}" if sp > 1 else "") + (f" x {cp}" if cp > 1 else "")
    rows = [
        ("model", f"{s['model']} ({s['arch']})", f"recipe {s['recipe']}" if s["recipe"] else ""),
        ("world size", f"{s['world_size']:,}", f"nodes x gpus_per_node = {s['nodes']} x {s['gpus_per_node']} ({s['gpu']})"),
        ("tensor x pipeline" + (" x sequence" if sp > 1 else "") + (" x context" if cp > 1 else ""), mp,
         "ranks per model replica = " + f"{tp * pp * sp * cp:,}"),
        *([("Megatron SP", f"{s['seq_length'] // tp:,} tokens per TP rank",
            f"seq_length / TP = {s['seq_length']:,} / {tp} (parallel.sequence_parallel)")]
          if s.get("sequence_parallel") else []),
        ("data parallel", f"{dp:,}", f"world / (TP x PP{' x SP' if sp > 1 else ''}{' x CP' if cp > 1 else ''}) = "
         f"{s['world_size']:,} / {tp * pp * sp * cp:,}"),
        ("ZeRO stage / precision", f"{s['zero_stage']} / {s['precision']}", ""),
        ("micro batch", f"{s['micro_batch_size']}", "sequences per rank per forward"),
        ("accumulation steps", f"{s['grad_accum_steps']:,}",
         f"global / (micro x DP) = {s['global_batch_size']:,} / ({s['micro_batch_size']} x {dp:,})"),
        ("global batch", f"{s['global_batch_size']:,}", "sequences per optimizer step"),
        ("tokens per step", f"{s['tokens_per_step']:,}", f"global batch x seq_length = {s['global_batch_size']:,} x {s['seq_length']:,}"),
        ("pipeline bubble", f"{s['bubble_fraction']:.2%}",
         f"(PP - 1) / micro-batches = {pp - 1} / {s['pipeline_micro_batches']:,}" if pp > 1 else "no pipeline"),
        ("parameters", f"{s['params_total']:,}", f"exact; {s['params_non_embedding']:,} outside embeddings/head"),
        ("parameters (rough)", f"{s['params_rough_12lh2_vh']:,}", "12 x L x h^2 + V x h"),
    ]
    if pp > 1 and s.get("stage_blocks"):
        b, n = s["stage_blocks"], s["stage_params"]
        rows.append(("blocks per stage", _runs(b), f"DeepSpeed partition_method cut; stage params {n[0] / 1e9:,.2f}B first, "
                     f"{max(n) / 1e9:,.2f}B largest, {n[-1] / 1e9:,.2f}B last (before TP)"))
    if s["padded_vocab_size"] != s["vocab_size"]:
        rows.append(("vocab (padded)", f"{s['padded_vocab_size']:,}", f"{s['vocab_size']:,} rounded up to a multiple of TP"))
    return rows + _performance_rows(s) + _host_rows(s["host_memory"])


_BUILD_HOW = {"pipeline": "pipeline build: the stage's layers in fp32 + one 256-row block",
              "zero3": "zero.Init: the 1/DP partition in the training dtype + the fp32 rows it is cut from",
              "whole": "whole fp32 model on every rank (no PP, not ZeRO-3 alone)"}


def _host_rows(h: dict) -> list[tuple[str, str, str]]:
    """Host RAM of the fullest node, term by term (launcher/plan/host.py)."""
    b = h["build_bytes_per_rank"]
    per_rank = _gb(max(b)) if _gb(min(b)) == _gb(max(b)) else f"{_gb(min(b))}..{_gb(max(b))}"
    if h["capacity_bytes"] is None:
        verdict = "not checked: " + h["capacity_source"]
    else:
        room = h["capacity_bytes"] - h["total_bytes"]
        verdict = (("fits, " if h["fits"] else "DOES NOT FIT, ") + f"{_gb(abs(room))} " + ("free" if h["fits"] else "short")
                   + f" ({h['capacity_source']})")
    cap = f" / {_gb(h['capacity_bytes'])}" if h["capacity_bytes"] is not None else ""
    return [
        ("host: build", _gb(h["build_bytes"]), f"{h['ranks']} ranks x {per_rank} ({_BUILD_HOW[h['build_path']]})"),
        ("host: checkpoint", _gb(h["checkpoint_bytes"]), "torch.save stages each rank's fp32 master partition on the host"),
        ("host: CPU offload", _gb(h["offload_bytes"]), "ZeRO-Offload: fp32 master + Adam m, v + fp32 grads (16 B/param) / DP; "
                                                      "offload_param: weights / DP"),
        ("host: data loader", _gb(h["data_loader_bytes"]), "one int64 micro-batch + a blend block (4 MiB); no per-sample array"),
        ("host memory per node", f"{_gb(h['total_bytes'])}{cap}", verdict + f" (fullest node: {h['node']})"),
    ]


def _runs(values) -> str:
    """[5, 6, 6, 6, 5] -> '5, 6 x3, 5'."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        out.append(f"{values[i]}" + (f" x{j - i}" if j - i > 1 else ""))
        i = j
    return ", ".join(out)


def render_plan(s: dict, console) -> None:
    """Print the plan as a rich table, warnings underneath."""
    from rich.table import Table

    table = Table(title=f"launcher plan: {s['recipe'] or s['model']}", title_justify="left")
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right")
    table.add_column("how", style="dim", overflow="fold")   # a path or config key folds, never cut to "…"
    for row in _rows(s):
        table.add_row(*row)
    console.print(table)
    from rich.markup import escape

    for w in s["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")


def network_ends_line(ends: dict) -> str:
    """One line on the search's ranking at the network's other end (search.network_ends)."""
    first, fastest, least = ends["first"], ends["fastest_nics_added"], ends["least_worst_loss"]
    line = ("with a group's NICs added across nodes (the table charges one NIC a GPU; launcher/plan/profile.py "
            "nics_added): ")
    if fastest["rank"] == 1:
        return line + f"#1 is the fastest there too ({_s(first['step_time_nics_added_s'])})"
    line += (f"the fastest is #{fastest['rank']} {fastest['layout']} ({_s(fastest['step_time_nics_added_s'])}; "
             f"#1 takes {_s(first['step_time_nics_added_s'])}, "
             f"{first['step_time_nics_added_s'] / fastest['step_time_nics_added_s'] - 1:+.1%}). Least behind the "
             f"fastest at its worse end: #{least['rank']}"
             + (f" {least['layout']}" if least["rank"] not in (1, fastest["rank"]) else "")
             + f", {least['worst_loss']:.1%}. `launcher submit --calibrate` on 2+ nodes measures which end a cluster "
             "is at")
    return line


def render_search(rows: list[dict], counts: dict, console, held: dict | None = None, record: str = "",
                  ends: dict | None = None) -> None:
    """Print the ranked layouts of `launcher plan --search`; `held`: the batch the search kept fixed; `record`: the
    best layout's published-run record (search_track_records); `ends`: the ranking with a group's NICs added
    (search.network_ends), where the plan has that other end."""
    from rich.table import Table

    lines = []
    if held:
        lines.append(f"held as configured: global batch {held['global_batch_size']:,} sequences x seq_length "
                     f"{held['seq_length']:,} = {held['tokens_per_step']:,} tokens per step "
                     "(batch.global_batch_size, data.seq_length)")
    if ends:
        lines.append(network_ends_line(ends))
    if record:
        lines.append(record)
    if held and held.get("note"):
        lines.append(f"warning: {held['note']}")
    caption = "\n".join(lines) or None
    table = Table(title=f"best layouts ({counts['fit']:,} fit of {counts['enumerated']:,} enumerated: "
                        f"{counts['invalid']:,} invalid, {counts['does_not_fit']:,} out of memory)", title_justify="left",
                  caption=caption, caption_justify="left")
    for col, just in (("#", "right"), ("layout", "left"), ("tokens/s", "right"), ("step", "right"), ("MFU", "right"),
                      ("memory", "right"), ("why", "left")):
        table.add_column(col, justify=just, style="dim" if col == "why" else None, overflow="fold")
    for i, r in enumerate(rows, 1):
        table.add_row(str(i), r["layout"], f"{r['tokens_per_s']:,.0f}", f"{r['step_time_s']:.2f} s", f"{r['mfu']:.1%}",
                      _gb(r["memory_total_bytes"]), r["why"])
    console.print(table)
