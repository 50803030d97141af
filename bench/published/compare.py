"""Predicted vs published throughput for every run in runs.yaml that the planner can express.

    PYTHONPATH=$PWD .venv/bin/python bench/published/compare.py            # writes results.json + results.md here, and launcher/plan/track_record.json
    PYTHONPATH=$PWD .venv/bin/python bench/published/compare.py --model launcher.plan.steptime:estimate_step_time

Each record becomes a launcher config (model shape, cluster.gpu / nodes, TP / PP / ZeRO stage, micro and global
batch, recompute, dtype) and goes through the same `resolve_layout` that `launcher train` runs; a record that
fails it, or that needs what the launcher does not have (fp8, an interleaved pipeline schedule, selective
recompute, hybrid sharding), is listed as not expressible with the reason. The step-time model is reached through
one adapter, `predict` (the `--model module:function` option swaps it: any function taking (ModelShape, Strategy,
Hardware) and returning a float of tokens/s or an object with `.tokens_per_s`).

Measured tokens/s per GPU come from what the source states, in this order: tokens/s per GPU; iteration
time (global batch x seq / iteration time / GPUs); TFLOP/s per GPU turned back into tokens with the
source's own FLOP formula (`tflops_basis`): Narayanan et al. 2021 eq. 3 (96 l h^2 (1 + s/6h + V/16lh) per
token, with recompute) or PaLM's 6N + 12 L H Q T with the source's N. TFLOP/s per GPU in the table are
model FLOPs by the planner's formula (launcher/plan/flops.py) for both columns, so their error equals the
tokens/s error.

Where a record leaves a value unknown, the mapping assumes one and the table says which (micro batch 1;
recompute none; Llama 3's FSDP with a pipeline as ZeRO-1, since DeepSpeed's pipeline engine takes ZeRO 0-1
only). Runs that carry an assumption are counted separately as well as in the totals.

Each row also carries the launcher's memory plan for the same layout (planned_memory_fraction: the planned peak over
the GPU's memory, plan/memory.py estimate_memory, which `launcher train` and `--search` apply; and
planned_memory_fraction_chunked_loss, the same with model.chunked_loss where it runs): over 1, the
launcher's runtime would not run that layout (its saved tensors, fp32 logits and buffers are what it stores, not
what the published framework did), and its predicted time is of a run it would refuse. The tables count those runs
apart as well as in the totals.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import statistics
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import yaml

from launcher.config import hardware
from launcher.config.compose import compose
from launcher.config.errors import ConfigError
from launcher.config.layout import resolve_layout
from launcher.plan.flops import flops_per_token
from launcher.plan.memory import estimate_memory
from launcher.plan import steptime
from launcher.plan.steptime import estimate_step_time
from launcher.plan.track_record import KERNEL_NAMES
from launcher.plan.inputs import model_shape, resolve_hardware, strategy
from launcher.plan.search import plain_config

HERE = Path(__file__).parent
TRACK_PATH = HERE.parent.parent / "launcher" / "plan" / "track_record.json"

# sharding as published -> DeepSpeed ZeRO stage the launcher runs (FSDP FULL_SHARD = ZeRO-3, SHARD_GRAD_OP =
# ZeRO-2: PyTorch FSDP docs; BLOOM's BF16_Optimizer is DeepSpeed's ZeRO-1 equivalent, its slurm file says so).
ZERO_OF = {"none": 0, "zero1": 1, "bf16_optimizer_zero1": 1, "fsdp_shard_grad_op": 2, "fsdp_full_shard": 3, "zero3": 3}


def default_model(shape, st, hw) -> float:
    return estimate_step_time(shape, st, hw).tokens_per_s


def load_model(spec: str | None):
    """The step-time adapter: `module:function` or the planner's steptime.estimate_step_time."""
    if not spec:
        return default_model
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name)

    def predict(shape, st, hw) -> float:
        out = fn(shape, st, hw)
        return float(out if isinstance(out, (int, float)) else out.tokens_per_s)
    return predict


def measured_tokens_per_s_per_gpu(r: dict) -> tuple[float, str]:
    """What the source measured, as tokens/s per GPU, and how it was obtained."""
    m, mod = r["measured"], r["model"]
    if "tokens_per_s_per_gpu" in m:
        return float(m["tokens_per_s_per_gpu"]), "stated tokens/s/GPU"
    if "iteration_s" in m:
        return r["global_batch"] * mod["seq"] / m["iteration_s"] / r["gpus"], "global batch x seq / iteration time / GPUs"
    basis = m.get("tflops_basis")
    l, h, s, v = mod["layers"], mod["hidden"], mod["seq"], mod["vocab"]
    if basis == "narayanan_eq3":
        per_token = 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        return m["tflops_per_gpu"] * 1e12 / per_token, "TFLOP/s / eq. 3 FLOPs per token"
    if basis == "palm_6n_12lhqt":
        per_token = 6 * float(mod["params_stated"]) + 12 * l * h * s
        return m["tflops_per_gpu"] * 1e12 / per_token, "TFLOP/s / (6N + 12LHQT), N as stated"
    raise ValueError(f"{r['id']}: no measurement compare.py can use")


@functools.cache
def base_config(gpu: str):
    # One composed config per GPU type (a Hydra compose takes ~0.6 s); every record replaces the fields it sets
    # in copies (_replace), never in this one (search.py does the same).
    return plain_config(compose([f"cluster={gpu}", "model=llama-7b"]))


def _replace(ns: SimpleNamespace, **kv) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(ns), **kv})


def to_config(r: dict, base) -> tuple[SimpleNamespace, str, list[str]]:
    """The launcher config of a record, its recompute mode and the assumptions made for unknown fields."""
    assumed = list(r.get("assumed", []))   # what the record itself had to assume (runs.yaml says why)
    mod = r["model"]
    if r["pp"] > 1 and r.get("pipeline_schedule") == "interleaved":
        raise ConfigError("parallel.pipeline_degree", r["pp"],
                          "the run used an interleaved pipeline schedule (virtual stages per rank, bubble (p-1)/(v m)); "
                          "DeepSpeed's PipelineEngine runs non-interleaved 1F1B (bubble (p-1)/m)", "")
    micro = r.get("micro_batch")
    if micro is None:
        micro, _ = 1, assumed.append("micro_batch=1")
    recompute = r.get("recompute")
    if recompute is None:
        recompute, _ = "none", assumed.append("recompute=none")
    if recompute not in ("none", "full"):
        raise ConfigError("model.activation_checkpointing", recompute,
                          "the launcher checkpoints every block, or keeps every matmul's and attention's output "
                          "(checkpoint_mode=selective); the run's is another policy (Megatron: the attention core; "
                          "MaxText, torchtitan: operator lists; fms-fsdp: a fraction of the blocks)", "")
    sharding = r["sharding"]
    if sharding == "hsdp":
        raise ConfigError("parallel.zero_stage", sharding,
                          "hybrid sharding (FSDP HYBRID_SHARD: ZeRO-3 inside each node, replicas across nodes); "
                          "DeepSpeed's closest, ZeRO++ hpZ / MiCS, the launcher does not run: its ZeRO stages shard over "
                          "the whole data-parallel group", "")
    if sharding == "fsdp":
        zero = 1 if r["pp"] > 1 else 3
        assumed.append(f"FSDP as ZeRO-{zero}")
    else:
        zero = ZERO_OF[sharding]
        if "sharding" in r.get("unknown", []):
            assumed.append(f"sharding as ZeRO-{zero}")
    dtype = r["precision"]
    if dtype == "mixed16":
        dtype, _ = "bf16", assumed.append("mixed16 as bf16")
    model = _replace(base.model, arch=mod["arch"], hidden_size=mod["hidden"], num_hidden_layers=mod["layers"],
                     num_attention_heads=mod["heads"],
                     num_key_value_heads=mod["kv_heads"] if mod["kv_heads"] != mod["heads"] else None,
                     intermediate_size=mod["ffn"] if mod["arch"] == "llama" else None,
                     vocab_size=mod["vocab"], max_position_embeddings=mod["seq"],
                     tie_word_embeddings=mod["arch"] != "llama", activation_checkpointing=recompute == "full")
    gpn = r["gpus_per_node"]
    cluster = _replace(base.cluster, gpu=r["gpu"], nodes=r["gpus"] // gpn, gpus_per_node=gpn)
    # cp: the launcher's ring attention (parallel.context_degree, launcher/parallel/context.py), the class of
    # Megatron / TransformerEngine's CP and torchtitan's (ring over head-tail chunks).
    # sequence_parallel: Megatron's SP inside TP (parallel.sequence_parallel), where the record states it.
    parallel = _replace(base.parallel, tensor_degree=r["tp"], pipeline_degree=r["pp"], sequence_degree=1,
                        sequence_parallel=bool(r.get("sequence_parallel", False)), context_degree=r.get("cp", 1),
                        data_degree=None, zero_stage=zero, offload_optimizer=False, offload_param=False)
    batch = _replace(base.batch, micro_batch_size=micro, global_batch_size=r["global_batch"])
    data = _replace(base.data, seq_length=mod["seq"])
    # BLOOM's "bf16 implements its own zero stage 1 equivalent" is DeepSpeed's BF16_Optimizer, which the launcher runs
    # for bf16 ZeRO-1 with fp32 gradient accumulation (as recipes/bloom-176b.yaml; memory.uses_bf16_optimizer)
    precision = _replace(base.precision, dtype=dtype, grad_accum_dtype="fp32" if sharding == "bf16_optimizer_zero1"
                         else base.precision.grad_accum_dtype)
    cfg = _replace(base, model=model, cluster=cluster, parallel=parallel, batch=batch, data=data, precision=precision)
    return cfg, recompute, assumed


# The built-in profiles' host terms time our runtime's Python on a GPU node: transformers' modules issuing their
# kernels (host_s), DeepSpeed 0.19's engine per parameter tensor and its ZeRO-3 hooks (profile.py, measured on an
# H200 node and borrowed by the A100 / H100 built-ins). No run here ran that Python (Megatron, DeepSpeed of 2021-22,
# PyTorch FSDP under llm-foundry / Lightning / torchtitan / NeMo), so each is held to the device terms alone; the
# host terms are held where our runtime ran (bench/gpu's runs, tests/plan/test_gpu_measured.py). With them, the
# FSDP rows are charged DeepSpeed's hooks: `--host-terms` (results.md, the reading of 2026-11-28 evening).
RUNTIME_HOST_TERMS = dict(host_s={}, engine_tensor_s={}, zero3_module_s=0.0, zero3_param_s=0.0)


def device_only(hw):
    """The hardware with its profile's runtime host terms removed (RUNTIME_HOST_TERMS)."""
    return replace(hw, profile=replace(hw.profile, **RUNTIME_HOST_TERMS))


def own_kernels_model():
    """The planner with each run's own kernels: where a record says `elementwise_kernels: fused` (TransformerEngine, apex,
    Triton, XLA or Inductor fusion, a fused GELU), its architecture's fused variant of launcher/plan/steptime.py
    (variants.py: one kernel a norm, an activation, a rotary); where its `attention_kernel` has cited rates of its
    own (variants.OWN_ATTENTION: MPT's Triton FlashAttention), those in place of the profile's FlashAttention-2
    tables; where it is Megatron's unfused core attention, the variant that charges its scores in memory
    (variants.ATTENTION_VARIANTS); where its weight-gradient GEMMs accumulated the micro-batches' gradients
    (`grad_accumulation: fused_wgrad`), no add of its own (variants.py fused-grad-accumulation); where it ran
    DeepSpeed's BF16_Optimizer before immediate_grad_update existed (`sharding: bf16_optimizer_zero1`), that
    optimizer's default accumulation (variants.py deepspeed-default-bf16-accumulation). Nothing fitted.
    Every other run as the
    launcher's runtime (None: the headline's prediction stands, not computed again). A diagnostic beside the
    headline, which charges the launcher's own kernels."""
    import sys
    if str(HERE) not in sys.path:     # variants.py sits beside this file (bench/ is not a package)
        sys.path.insert(0, str(HERE))
    import variants
    mods: dict = {(): steptime}

    def predict(shape, st, hw, record) -> Optional[float]:
        names = ((variants.FUSED_BY_ARCH[shape.arch],) if record.get("elementwise_kernels") == "fused"
                 and shape.arch in variants.FUSED_BY_ARCH else ())
        if record.get("attention_kernel") in variants.ATTENTION_VARIANTS:
            names += (variants.ATTENTION_VARIANTS[record["attention_kernel"]],)
        if record.get("grad_accumulation") == "fused_wgrad":
            names += ("fused-grad-accumulation",)
        if record.get("sharding") == "bf16_optimizer_zero1":     # DeepSpeed's BF16_Optimizer of 2022
            names += ("deepspeed-default-bf16-accumulation",)
        if names not in mods:
            mods[names] = variants.variant_module(*names)
        mod = mods[names]
        own_hw = variants.own_attention(hw, record.get("attention_kernel"))
        if mod is steptime and own_hw is hw:
            return None
        return mod.estimate_step_time(shape, st, own_hw).tokens_per_s
    return predict


def compare(records: list[dict], predict, host_terms: bool = False, predict_own=None) -> dict:
    """Every record against `predict`; with `predict_own` (own_kernels_model), each row also carries the error
    under the run's own element-wise kernels (error_own_kernels)."""
    rows, skipped = [], []
    for r in records:
        try:
            if hardware.lookup(r["gpu"]) is None:
                raise ConfigError("cluster.gpu", r["gpu"], "not in the GPU catalog: its peak and bandwidths are not known", "")
            if r["gpus"] % r["gpus_per_node"]:
                raise ConfigError("cluster.nodes", r["gpus"], "GPU count is not whole nodes", "")
            cfg, recompute, assumed = to_config(r, base_config(r["gpu"]))
            layout = resolve_layout(cfg)
        except ConfigError as e:
            skipped.append({"id": r["id"], "family": r["family"], "why": str(e).splitlines()[0][:300]})
            continue
        if layout.data_degree != r["dp"]:
            skipped.append({"id": r["id"], "family": r["family"], "why": f"derived dp {layout.data_degree} != stated {r['dp']}"})
            continue
        shape = model_shape(cfg.model)
        st = strategy(cfg, layout, recompute)
        hw = resolve_hardware(cfg.cluster, cfg.precision.dtype)
        hw = hw if host_terms else device_only(hw)
        measured, how = measured_tokens_per_s_per_gpu(r)
        predicted = predict(shape, st, hw) / layout.world_size
        memory = estimate_memory(shape, st, hw)
        # model.chunked_loss where the runtime runs it (config/layout.py _check_chunked_loss: the transformers model)
        plain = st.tensor_degree == st.pipeline_degree == 1
        chunked = estimate_memory(shape, replace(st, chunked_loss=True), hw) if plain else None
        own_total = predict_own(shape, st, hw, r) if predict_own else None
        own = predicted if own_total is None else own_total / layout.world_size
        f = flops_per_token(shape, layout.seq_length)
        rows.append({
            "id": r["id"], "family": r["family"], "source": r["source"], "gpu": r["gpu"], "gpus": r["gpus"],
            "layout": f"TP{r['tp']} PP{r['pp']} DP{layout.data_degree} Z{st.zero_stage} mb{st.micro_batch_size} "
                      f"gbs{r['global_batch']} s{layout.seq_length} {recompute}",
            "assumed": assumed, "measured_from": how, "attention_kernel": r.get("attention_kernel", "launcher's"),
            "seq": layout.seq_length, "zero": st.zero_stage, "tp": r["tp"], "pp": r["pp"], "hidden": r["model"]["hidden"],
            "micro_batch": st.micro_batch_size, "recompute": recompute,
            "measured_tokens_per_s_per_gpu": measured, "predicted_tokens_per_s_per_gpu": predicted,
            "measured_tflops_per_gpu": measured * f / 1e12, "predicted_tflops_per_gpu": predicted * f / 1e12,
            "error": predicted / measured - 1,
            "elementwise_kernels": r.get("elementwise_kernels", "eager"), "error_own_kernels": own / measured - 1,
            "planned_memory_fraction": memory.peak.total / memory.capacity_bytes,
            "planned_memory_fraction_chunked_loss": (chunked.peak.total / chunked.capacity_bytes
                                                     if chunked is not None else None),
        })
    return {"rows": rows, "not_expressible": skipped}


TRACK_FIELDS = ("id", "gpu", "zero", "tp", "pp", "seq", "hidden", "micro_batch", "recompute", "attention_kernel",
                "elementwise_kernels")


def track_record(rows: list[dict]) -> dict:
    """launcher/plan/track_record.json: the model's error per published run, which `launcher plan` reports for the
    runs most like a layout (launcher/plan/track_record.py), and its error with each run's own kernels (the second
    view, own_kernels_model). Errors rounded to 4 decimals."""
    return {"written_by": "bench/published/compare.py from bench/published/runs.yaml",
            "model": "launcher.plan.steptime:estimate_step_time",
            "runs": [{**{k: r[k] for k in TRACK_FIELDS}, "error": round(r["error"], 4),
                      "error_own_kernels": round(r["error_own_kernels"], 4)} for r in rows]}


def summary(rows: list[dict], key: str = "error") -> dict:
    if not rows:
        return {"runs": 0}
    errs = [abs(x[key]) for x in rows]
    return {"runs": len(rows), "within_10pct": sum(e <= 0.10 for e in errs) / len(errs),
            "within_20pct": sum(e <= 0.20 for e in errs) / len(errs), "median_abs_error": statistics.median(errs),
            "worst_abs_error": max(errs)}


# Written by hand after the runs of 2026-12-07 (the memory split, 07:50 UTC; immediate_grad_update, 07:25 UTC; BF16_Optimizer's accumulation, 03:50 UTC),
# 2026-12-06 (gradient accumulation, 23:55 UTC; ZeRO-3's recompute in the
# coordinator's replay; ZeRO-3's gathers as
# DeepSpeed issues them; one compute derating
# swept; the network's two ends; precision.reduce_dtype under Ulysses / CP),
# 2026-12-05 (ZeRO-1/2's all-reduce, the gradients' wire dtype),
# 2026-12-03 (Megatron's unfused attention; before it the Triton kernel's rates),
# 2026-12-02 (fms-fsdp added),
# 2026-11-29 05:05 UTC, 2026-11-28 10:00 UTC,
# 2026-11-26 21:10 UTC, 2026-11-26 18:00 UTC and 2026-11-25 05:10 UTC (re-read it when the table is regenerated).
READING = """Reading (2026-12-07, 11:30 UTC: model.chunked_loss; nothing in the headline moved). The launcher's runtime
can now compute the head and the loss a chunk of tokens at a time (launcher/runtime/chunked_loss.py; off by
default): no whole micro-batch of fp32 logits is held. Each row now also carries planned_memory_fraction_chunked_loss,
the same plan with it, on the 245 layouts where it runs (no TP or PP). All 135 runs that plan over the GPU's memory
are such layouts, and 39 of them fit with it (35 of MosaicML's, the three DGX Cloud Llama 3.1 8B rows on one node,
TinyLlama's); their planned peak drops by 20% (median over the 135). The step it plans is 1.9% longer (median over
the 245; up to 13.5%, MosaicML's 125M at micro-batch 104, where the head is a large part of the model): one more
forward of the head's GEMM. The headline keeps the whole loss, the runtime's default, so no error moved. What still
keeps the other 96 over the GPU is the blocks' saved tensors: transformers' eager operators at MosaicML's
micro-batches of 8-128 without recompute.

Reading (2026-12-07, 07:50 UTC: which published layouts the launcher's own memory plan would run; nothing
in the model changed). Every row now carries planned_memory_fraction, the launcher's planned peak for that layout
over the GPU's memory (plan/memory.py estimate_memory: the check `launcher train` and `--search` apply, held to the
runtime's saved tensors and buffers by tests/plan). 135 of the 262 expressible runs plan over 1 (median 1.57, up to
1.93): 130 of MosaicML's 209, three DGX Cloud Llama 3.1 8B rows on one node (1.01), torchtitan's 13B and TinyLlama
(1.10). So for half the set the headline predicts the time of a run the launcher would refuse before starting: the
published framework stored less than the launcher's runtime does at that layout. Mostly activations (93% of the
planned peak, median, over those rows; MosaicML runs its micro-batches of 8-128 without recompute): transformers'
eager GELU / LayerNorm / attention saved tensors against MPT's fused ones, and the logits, which transformers
upcasts to fp32 (21% of the planned peak, median; without that term 96 of the 135 would still not fit). Split by it
(the tables above): the runs that fit 39% / 64% within 10% / 20%, median 12.4%; those that do not 49% / 79%,
10.1%; with each run's own kernels 49% / 83% and 70% / 96%. The fitting half is not the better-predicted one, so
restricting the target to it would not meet it either; both halves stay in the headline.

Reading (2026-12-07, 07:25 UTC: the launcher's runtime sets BF16_Optimizer's immediate_grad_update; 7 rows
moved, all faster). deepspeed_config now asks DeepSpeed for `bf16.immediate_grad_update: true` wherever
BF16_Optimizer runs: each bf16 gradient is (cast-)added into the accumulation gradient from a hook as the backward
writes it, and freed. The same adds, in the same order (the weights after two SGD steps are bit-identical,
tests/plan/test_bf16_accumulation.py), without zeroing and re-adding the held bf16 gradients every micro-batch after
the first: m x 18 + 8 bytes a parameter a step in fp32, m x 6 + 4 in bf16 (steptime.bf16_accumulation, counted
operator by operator), (m - 1) x 8 less than DeepSpeed's default; and no step-long bf16 copy of the gradients (2
bytes a parameter less memory, the measured ledger: tests/plan/test_state_bytes.py). The headline predicts the
launcher's runtime, so the rows that map to it move faster: Narayanan's PTD-P rows (bf16 ZeRO-0 pipelines, 96-384
micro-batches a step) +4.6 / +3.9 / +3.0% -> +10.1 / +9.2 / +8.2% (175B) and +1.7 / +1.1 / +0.1% -> +7.5 / +6.8 /
+5.8% (530B), back where they were before the accumulation was charged, since the term is now small there (6
bytes a micro-batch); BLOOM +6.7% -> +9.3%. BLOOM's own view charges the optimizer as BLOOM ran it in 2022, before
immediate_grad_update existed (deepspeedai/DeepSpeed#4975, January 2024): variants.py
deepspeed-default-bf16-accumulation, for records with `sharding: bf16_optimizer_zero1`, so it stays +12.2%. Within
10% 44.7% -> 44.3% (the 175B row at 384 GPUs crosses 10%), within 20% 71.8%, median 11.3%, worst 62.4%; with each
run's own kernels 59.5% / 89.3%, median 8.30% -> 8.33%. The PTD-P rows' own view still charges the launcher's bf16 accumulation (6 bytes a
micro-batch), not Megatron's main_grad add (fp16 or fp32 in 2021's code, by a flag their runs do not state).

Reading (2026-12-07, 03:50 UTC: DeepSpeed's BF16_Optimizer accumulation charged; 7 rows moved, all
slower). Where the launcher's runtime runs DeepSpeed's BF16_Optimizer (bf16 ZeRO-0 under the pipeline engine, which
accumulates in bf16; bf16 ZeRO-1 with fp32 accumulation) its accumulation replaces autograd's add: it zeroes the
bf16 gradients before every backward but the first, adds them into its accumulation gradients after every one (cast
first where those are fp32), and zeroes those twice a step: m x 6 + (m - 1) x 8 + 4 bytes a parameter a step in
bf16, m x 18 + (m - 1) x 8 + 8 in fp32, against autograd's (m - 1) x 6 (steptime.bf16_accumulation, counted
operator by operator on one rank, tests/plan/test_bf16_accumulation.py). And BLOOM's record (`sharding:
bf16_optimizer_zero1`, its "bf16 implements its own zero stage 1 equivalent") is now set up as the launcher runs
that optimizer, precision.grad_accum_dtype=fp32 at ZeRO 1 (recipes/bloom-176b.yaml's setting), which it had not
been. Narayanan's PTD-P rows (ZeRO 0, 96-384 micro-batches of one sequence, 1.8-1.9B parameters a GPU) +10.1 / +9.3
/ +8.3% (175B) and +7.5 / +6.8 / +5.8% (530B) -> +4.6 / +3.9 / +3.0% and +1.7 / +1.1 / +0.1%; BLOOM +13.7% ->
+6.7% (own kernels +20.0% -> +12.2%). The PTD-P rows' own view charges the same accumulation (+3.1 .. -0.2%), not
quite what Megatron ran: its DDP adds each fp16 gradient into an fp32 main_grad in a hook (2 + 4 + 4 = 10 bytes a
micro-batch, against the 14 charged) or, with gradient_accumulation_fusion, inside the GEMM; no variant says so
yet. Within 10% 43.9% -> 44.7%, within 20% 71.8% (unchanged), median 11.3%, worst 62.4%; with each run's own
kernels 59.5% / 88.9% -> 59.5% / 89.3%, median 8.3%. Nothing fitted.

Reading (2026-12-06, 23:55 UTC: gradient accumulation charged; 172 rows moved, all slower). With m > 1
micro-batches a step, every backward after the first adds its weight gradients into the held ones (autograd's
AccumulateGrad, p.grad += g: read both, write one), (m - 1) x 3 w bytes a parameter a step at memory bandwidth
(steptime.grad_accumulation, as element-wise work of the stage's backward). Nothing had charged it: calibrate's
engine probe counts it on its plain side, and the A100 / H100 built-ins have no engine terms. It weighs most where
a GPU holds many parameters against few tokens a micro-batch and runs many micro-batches: Narayanan's PTD-P rows
(1.8-1.9B parameters a GPU, one 2,048-token sequence a micro-batch, 96-384 of them a step) +14.6 / +13.8 / +12.6%
(175B) and +12.4 / +11.6 / +10.5% (530B) -> +10.1 / +9.3 / +8.3% and +7.5 / +6.8 / +5.8%; MT-NLG +37.3 / +38.8
/ +42.8% -> +31.5 / +32.9 / +36.8%; BLOOM +15.9% -> +13.7%; the Megatron README's GPT-3 +19.9% -> +15.2%; Narayanan's TP-only rows 1.7B
+14.6% -> +10.8%, 3.6B +8.2% -> +4.5%, 7.5B -2.5% -> -5.7%, 18.4B +0.6% -> -2.8% (3.2-6.0 points for Megatron's
rows). NVIDIA's NeMo rows (32-64 micro-batches) go 2.4-3.0 points slower in the headline, where the launcher's runtime
pays the add; their own view charges none: NeMo 2's GPTConfig turns on Megatron-Core's gradient_accumulation_fusion,
whose weight-gradient GEMM accumulates into the fp32 main_grad (runs.yaml `grad_accumulation: fused_wgrad` on its 97
NeMo records; variants.py fused-grad-accumulation). MosaicML's rows with m > 1 0.1-4.0 points slower: FSDP adds the
reduce-scattered shard (1/r of the gradients), charged whole here as the launcher's runtime adds them. Within 10%
42.7% -> 43.9%, within 20% 71.4% -> 71.8%, median 11.9% -> 11.3%, worst 62.4%; with each run's own kernels 56.5% ->
59.5%, 87.8% -> 88.9%, 8.7% -> 8.3%. On 2 CPU ranks the term is small (recipe=tiny's 1.3M parameters, the calibrated
copy bandwidth): its TP2, SP2, PP2 and TP2 x PP2 layouts (2 micro-batches) plan 0.5-1 ms slower, ZeRO-3 at
micro-batch 2 (4 micro-batches) 2.5 ms (bench/steptime/results.md's committed-model column, 265 -> 268 ms).

Reading (2026-12-06, 16:40 UTC: ZeRO-3's all-gathers under recompute from the same replay; 10 rows moved,
all faster). Under full recompute the step time had added, beside the replay's backward, a third gather of every
linear followed in its block by >= the reuse distance (steptime's _zero3_regathered_per_block, a second copy of the
coordinator's rule). The replay's trace now holds the recompute as DeepSpeed records it (transformers' non-reentrant
checkpoint re-runs a block's forward after its last linear's backward fetch; torch's early stop leaves that linear
gathered), and the step time charges the replay's calls alone. On 2 CPU ranks the replay gives DeepSpeed's
all-gathers call for call over thirteen recompute settings (full, first two blocks, selective); the old count was
off in eleven of them (58 for 54, 28 for 0, 50 for 24, ...; bench/steptime/results.md). Here, at the default 1e9 reuse
distance, GPT-3-shaped blocks re-gather qkv and dense a third time, not fc as well (proj, fetched before the
recompute, is all that lies between fc's recompute and its backward): Narayanan's three ZeRO-3 175B rows +35.8 /
+7.6 / +2.0% -> +49.3 / +18.3 / +12.3%; the 34B / 70B fms-fsdp rows +4.7 / +1.1% -> +13.4 / +7.8%; MosaicML's 70B
rows -50.7 / -42.6 / +8.8 / -24.4% -> -45.2 / -36.3 / +11.9 / -16.1%; NeMo's 70B CP2 -64.1% -> -62.4%. Within 10%
44.3% -> 42.7%, within 20% 71.0% -> 71.4%, median 11.6% -> 11.9%, worst 64.1% -> 62.4%; with each run's own kernels
58.0% -> 56.5%, 87.4% -> 87.8%, 8.7%, 62.4%. The rows that moved away ran FSDP (or 2021's DeepSpeed). FSDP
with the checkpoint inside its unit, as llm-foundry and fms-fsdp apply it, gathers a unit twice a micro-batch, its
pre-backward unshard serving the recompute (fairscale issue 777's FSDP(checkpoint(module))); with the checkpoint
outside the unit, or under transformers' own checkpointing with FSDP1, three times (pytorch issue 105635 saw two
all-gathers a layer in the backward). Not traced for these runs. If they gathered twice, what they miss is not the
sharding's traffic, and the old over-count had been hiding some other under-charge of large data-parallel runs,
not found yet; if three times, the over-count had stood in for FSDP's own, and the model predicts the launcher's.

Reading (2026-12-06, 13:30 UTC: ZeRO-3's all-gathers counted as DeepSpeed issues them; 18 rows moved,
17 of them faster). The model had charged every ZeRO-3 run one all-gather per fetched module forward and the same again
backward, of the whole model's bytes. launcher/plan/memory.py zero3_gathered now replays DeepSpeed 0.19.8's parameter
coordinator (prefetch walks, reuse distance, live limit), and the step time charges its calls: the backward
re-gathers only what the forward released, at DeepSpeed's defaults all but about 1e9 elements (LLaMA-7B over 8
ranks: 5.71e9 of 6.74e9). On 2 CPU ranks the replay gives DeepSpeed's all-gathers call for call and element for
element, forward and backward, over five knob settings (bench/steptime/results.md). Here: the FSDP-class rows
of 7B-70B move +0.1 .. +4.3 points (torchtitan's 13B +2.6% -> +5.9%, fms-fsdp's four +2.0 / -0.7 / +13.2 / +7.1% ->
+4.7 / +1.1 / +13.6 / +7.9%, MosaicML's H100 7B at 256 / 512 GPUs +10.0 / +1.6% -> +14.0 / +5.9%, its 13B mb2 at
16-64 GPUs -48.4 .. -52.9% -> -47.6 .. -51.7%, NeMo's 70B CP2 -64.5% -> -64.1%), Narayanan's ZeRO-3 rows by 0.2
points at most, one of them (530B on 1,120 GPUs) 0.1 point slower (their 175B / 530B modules are above the
prefetch bucket, each fetched in a call and the next one in a walk's, and 1e9 kept elements are under 1% of those
models). Within 10% 44.7% -> 44.3% (MosaicML's 7B at 256 GPUs leaves), within 20% 71.0%, median 11.5% ->
11.6%, worst 64.5% -> 64.1%; with each run's own kernels 58.4% -> 58.0%, 87.4%, 8.7%. These runs ran FSDP (or
DeepSpeed ZeRO-3 in 2021), which reshards after the forward and gathers the whole model again for the backward:
the headline charges the launcher's runtime, and DeepSpeed 0.19.8 keeps about 1e9 elements where FSDP keeps none,
so rows that were near their measurement because the model charged FSDP's traffic move away from it.

Reading (2026-12-06, 07:00 UTC: one derating of the compute rates swept; nothing here moved). The runs
made mostly of large GEMMs lean fast in both views (Narayanan et al.'s PTD-P rows +10 .. +14% with their own kernels,
BLOOM-176B +23%, the Megatron-LM README's 175B +18%, MosaicML's 30B / 70B on H100s +11 .. +25%), and the built-in
GEMM rates are cuBLAS benchmark bursts; a GPU at its power or thermal limit through a run clocks lower. `PYTHONPATH=$PWD
.venv/bin/python bench/published/compute_scale.py` scales every GEMM and attention rate by one factor
(profile.scaled(compute=f): the tensor cores' work, not HBM's or the links'): within 10% / 20% / median, headline then
own kernels, x 1.00 44.7% / 71.0% / 11.5%, 58.4% / 87.4% / 8.7%; x 0.95 45.0% / 71.8% / 11.5%, 63.4% / 88.9% /
7.2%; x 0.90 39.7% / 71.0% / 12.6%, 63.7% / 88.5% / 6.8%; x 0.85 32.8% / 68.7% / 15.3%, 60.7% / 88.2% / 7.6%. So no
one derating brings the headline nearer the target (its misses are not one rate's: the long-sequence MosaicML rows
sit the other way), and the second view gains 5 points at most. No factor is kept: a sweep read against the same
runs would be a fit. Whether the burst rates hold under sustained load is a GPU measurement, now in the GPU pack
(bench/gpu/sustained_gemm.py, not yet run on a GPU).

Reading (2026-12-06, morning: the network's two ends side by side; nothing here moved). `launcher plan` now
reports beside its step time the step time with a cross-node group's NICs added (`step_time_nics_added_s`;
launcher/plan/profile.py nics_added: a group with k GPUs on each node gets k x the one-NIC bus, up to the node's own
link, NVIDIA/nccl#812), and a profile calibrated on several nodes charges what it measured for the group's ranks a
node (Profile.inter_for, from the all-ranks all-reduce `launcher submit --calibrate` already took and kept unused).
The built-ins keep one NIC, so the tables above did not move. `PYTHONPATH=$PWD .venv/bin/python
bench/published/nic_bracket.py`: 40 of the 262 runs have ends more than 1% apart, and 25 of those 40 lie between
them (10% either side). The rows the one-NIC headline misses most sit at the other end: NeMo AutoModel's 70B CP2
-64.5% at one NIC, +5.2% with the NICs added; MosaicML's H100 13B mb2 at 16-64 GPUs -48.4 .. -52.9% / +28.2 ..
+28.9%; the 70B g32 mb2 rows -50.7% (H100) and -42.6% (A100) / +24.0% and +15.0%. Narayanan's six ZeRO-3 rows go
the other way (-2.7 .. +42.1% at one NIC, +68 .. +426% added), and so do the FSDP rows of fms-fsdp (+2.0 / -0.7%
against +26.6 / +25.2%) and torchtitan's 13B (+2.6 / +15.9%). The twelve DGXC 8B CP2 rows lie outside both ends
(-21.2 .. -26.1% / -13.7 .. -19.3%): DeepSpeed's fp32 ZeRO-1 reduce under CP, the runtime's (the reading below).
So FSDP-class runs sit at either end (their networks are not all stated: fms-fsdp's "800Gbps inter-node", per node
or per GPU not said); no one rule for the built-ins puts both ends' runs within 10%, and on a user's cluster the
measurement decides.

Reading (2026-12-06: the launcher now tells DeepSpeed to reduce gradients in the model's dtype under Ulysses and
CP too; one row moves). New key `precision.reduce_dtype` (null = the model's dtype, as DeepSpeed does without a split
sequence and as Megatron-LM and NeMo do by default; or fp32), written to both `communication_data_type` and
`seq_parallel_communication_data_type` (launcher/config/layout.py reduce_dtype; docs/training.md). Measured on 2
CPU ranks, recipe=tiny bf16, parallel.sequence_degree=2, every large collective's dtype logged by a sitecustomize
wrapper of torch.distributed: ZeRO-0 and ZeRO-3 all-reduce the 1,328,256 gradient elements in bf16 with the new
config (float32 before), ZeRO-1 in float32 either way: DeepSpeed 0.19.8's stage_1_and_2.py allreduce_bucket casts
to fp32 whenever sequence_parallel_size > 1, whatever the config says, so the planner keeps fp32 there
(plan/inputs.py Strategy.wire_dtype) and `launcher plan` warns when precision.reduce_dtype asks otherwise. So the
15 DGXC CP 2 rows (ZeRO-1 as the launcher runs them) do not move; NeMo AutoModel's 70B (ZeRO-3 with CP 2) moves back
-75.8% -> -64.5%, the worst row of both views. All 262: within 10% 44.7%, within 20% 71.0%, median 11.5% unchanged;
worst 75.8% -> 64.5%.

Reading (2026-12-05, evening: data-parallel gradients priced as DeepSpeed moves them; the headline loses
ground, the runtime is now told right). Three fixes, each measured on 2-4 CPU ranks with recipe=tiny (sizes and
dtypes of every collective, bench/steptime/results.md) and read in DeepSpeed 0.19.8's code: (1) ZeRO-1/2 reduce
each gradient bucket with an all-reduce of the whole bucket (stage_1_and_2.py average_tensor under
use_multi_rank_bucket_allreduce, its default), 2 (r-1)/r of the bytes a rank, where the planner charged a
reduce-scatter's (r-1)/r; (2) gradients cross the wire in the model's dtype whatever the accumulation dtype, and in
fp32 whenever sequence_parallel_size > 1 (Ulysses or CP: engine.py seq_parallel_communication_data_type), where the
planner charged fp32 for fp32 accumulation and the model's dtype under CP; (3) bf16 at ZeRO-0 under the pipeline
engine (BF16_Optimizer) partitions its master weights and all-gathers the bf16 weights after each step, which the
planner left out. 26 rows move: the 15 DGXC rows (ZeRO-1, CP 2 on the 8B and the 405B proxies) by -2.1 to -5.5
points (the 8B rows -15.7 .. -21.0% -> -21.2 .. -26.1%), NeMo AutoModel's 70B (ZeRO-3 with CP 2: fp32 all-reduce in
place of a bf16 reduce-scatter, 4x the bytes) -64.5% -> -75.8%, MT-NLG's three and BLOOM 0.5-0.8 points closer,
the six PTD-P table-2 rows 0-0.8 points closer. Within 20% 75.2% -> 71.0%, worst 64.5% -> 75.8%; within 10% and
the median unchanged; the second view 59.9% -> 58.4% within 10%. Those runs reduce as NeMo and Megatron do (a
bf16 reduce-scatter in their distributed optimizers); the headline prices the launcher's runtime on their layouts,
and under CP that runtime moves 2-4x their gradient bytes. That gap is the runtime's, not the model's: a
`launcher plan` of those layouts now shows it. The readings below quote these rows as they stood before.

Reading (2026-12-05, later: one model shape and layout under two frameworks; nothing changed). MT-NLG
(Smith et al. 2022) and Narayanan et al. 2021's table 2 PTD-P 529.6B train the same shape (105 layers, hidden 20480,
128 heads, sequence 2048; vocabularies 50272 / 51200) on A100-80GB nodes at TP 8 x PP 35, both non-interleaved
1F1B. Time per pipeline slot, the iteration time over the m + p - 1 slots of its schedule (m micro-batches a
replica): PTD-P at micro-batch 1, DP 2 / 4 / 8, 178.7 / 177.7 / 176.6 ms (within 1.2%); MT-NLG at the micro-batch 1
the table assumes, DP 8 / 10 / 12 at a fixed global batch of 1920, 219.3 / 222.1 / 228.9 ms, or at micro-batch 2,
the one under which its three runs take equal slots, 390.3 / 386.2 / 389.5 ms (within 1.1%), 195 ms a sequence.
Either way MT-NLG's Megatron-DeepSpeed pipeline (DeepSpeed's PipelineEngine, the launcher's own) spent more per
sequence on the same per-slot work than Megatron-LM: 10% at micro-batch 2, 24-30% at micro-batch 1. The planner,
deterministic in the layout, gives both one slot: 159.4 ms (PTD-P, DP 8) and 159.2 ms (MT-NLG at micro-batch 1;
307.3 ms for 2 sequences at micro-batch 2), so PTD-P +10.8% and MT-NLG +37.8% (+27.0% at micro-batch 2). At
micro-batch 1 the two families' slots are 1.24-1.30 apart, past the 1.1 / 0.9 = 1.22 that two runs can differ by
and both lie within 10% of one prediction: no model of the layout alone puts both within 10%. The runs'
micro-batch stays the assumed 1 (inferring 2 from the runs' own times would be fitting the judged rows); a
multi-GPU measurement of DeepSpeed's PipelineEngine is the lead.

Reading (2026-12-05: the headline charges vocabulary-parallel ends, because the launcher's runtime now runs
them). The launcher's TP splits the embedding, the head and the loss over the vocabulary as Megatron-LM does
(Shoeybi et al. 2019, section 3: VocabParallelEmbedding, a ColumnParallelLinear head with parallel_output=True,
vocab_parallel_cross_entropy; launcher/parallel/tensor.py), so launcher/plan/steptime.py end_costs charges each TP
rank V / t rows, V / t logits, the embedding's and the head's collectives and the loss's three fp32 all-reduces,
and the rank's parameters (hence its optimizer step and data-parallel traffic) count V / t rows of each vocabulary
matrix. variants.py's megatron-vocab-parallel, which charged those ends for the Megatron rows in the second view
only, is gone: it is the headline now. The 17 TP > 1 rows moved, the others did not. All 262: within 10% 46.2% ->
44.7%, within 20% 75.2% -> 75.2%, median 11.2% -> 11.6%, worst 64.5% -> 64.5% (nemo-automodel, TP 1). The
pipelined Megatron runs move past their measurements, as the 2026-12-04 reading found in the second view: MT-NLG
+10.3 / +12.3 / +16.3% -> +37.8 / +39.4 / +43.6%, BLOOM tr11 -15.0% -> +16.4%, the Megatron README 175B -0.4% ->
+19.9%, PTD-P 529.6B -12.3 .. -11.9% -> +10.8 .. +12.4%, PTD-P 174.6B -1.4 .. -1.3% -> +13.4 .. +14.8%; the TP-only
rows come closer: the DGXC 405B proxies (8 layers; 7 layers, 24.09 and 24.12) -40.2 / -30.6 / -29.4% -> -18.0 / -19.6 / -18.2%, Narayanan 18.4B / 7.5B
-4.8 / -6.7% -> +0.6 / -2.5%, 3.6B +5.7% -> +8.2%. The second view's summary did not move (60%, 87%, 8.1%,
64.5%); its rows moved by at most 3.3 points (the proxy8l row -15.6% -> -12.4%): the variant sharded the ends'
kernels but not the parameters, and charged transformers' log-softmax bytes where vocab_parallel_cross_entropy
moves 40 bytes an element.

Reading (2026-12-04: the second view charges Megatron's tensor parallelism at the model's ends as
Megatron runs it; the headline did not move). The launcher's TP replicates the embedding, the head and the loss on
every TP rank (launcher/plan/steptime.py end_costs: the full-vocabulary head GEMMs and fp32 logits on each rank).
Every Megatron-LM, Megatron-DeepSpeed and NeMo run here with TP > 1 (17 rows: Narayanan 2021, MT-NLG, BLOOM tr11,
the Megatron README run, NVIDIA's DGXC 405B proxies) ran Megatron's vocabulary-parallel ends instead:
VocabParallelEmbedding (V / t rows a rank, its output all-reduced, or reduce-scattered under sequence parallelism),
a ColumnParallelLinear head with parallel_output=True (V / t logits a rank; its input's gradient all-reduced, or
all-gathered forward and reduce-scattered backward under sequence parallelism) and vocab_parallel_cross_entropy
(three fp32 all-reduces of one value a token). The second view now charges that for those rows
(`bench/published/variants.py megatron-vocab-parallel`, selected by variants.MEGATRON_TP_FAMILIES and tp > 1;
from the code's definitions, nothing fitted). The TP-only rows and the DGXC proxies move closer: Narayanan 3.6B /
7.5B / 18.4B -4.1 / -9.4 / -6.4% -> -2.1 / -6.0 / -1.7%, the three 405B proxies (7-8 blocks of a 16,384-wide model
beside a 50,257-word head, TP 8) -26.2 / -24.9 / -37.3% -> -14.2 / -12.7 / -15.6%. The pipelined ones move past
the measurement: Narayanan's PTD-P 174.6B -2.6 .. -2.8% -> +11.7 .. +13.1%, 529.6B -12.2 .. -12.6% -> +10.5 ..
+12.1%, the Megatron README 175B -1.7% -> +18.2%, BLOOM tr11 -12.0% -> +22.4%, MT-NLG +9.9 .. +15.9% -> +37.4 ..
+43.1%. There the replicated head sat on the last pipeline stage, the slowest, every micro-batch (PTD-P 174.6B
g384: 10.4 s of a 78.9 s step, the gap between 60.4 and 50.0 s of GEMM), and covered a cost of those runs that the
model does not have: with the head charged as they ran it, pipelined Megatron runs are predicted 10-43% too fast.
What that cost is (the schedule's real bubble, the last stage's loss and tied-embedding work, GEMM rates of 2021's
cuBLAS at the TP 8 shards, DeepSpeed's pipeline engine for MT-NLG and BLOOM) is not known here. All expressible
runs in the second view: within 10% 61.8% -> 59.9%, within 20% 87.8% -> 87.4%, median 7.8% -> 8.1%, worst 64.5%
(the headline, the launcher's runtime: 46.2%, 75.2%, 11.2%, 64.5%, unchanged). Kept, though the view's numbers
fall: it is the diagnostic of what the runs ran, and the replicated head was not what they ran.

Reading (2026-12-03, later: the second view charges Megatron's unfused attention by its bytes; the
headline did not move). The 21 Megatron / Megatron-DeepSpeed rows (Narayanan 2021, MT-NLG, BLOOM tr11, the Megatron
README run) ran Megatron's core attention, which keeps the b x heads x s x s scores in 16-bit memory: QK^T and PV as
batched GEMMs over the whole square (the causal half masked, not skipped), FusedScaleMaskSoftmax (read, write) and
attention dropout at 0.1 (read, write, a 1-byte mask), the default of Megatron-LM's and Megatron-DeepSpeed's
`--attention-dropout`, which BLOOM's tr11-176B-ml.slurm does not override: 9 bytes a score element forward, 11
backward (dropout's and softmax's backward), as `bench/published/variants.py megatron-attention` (the planner's own
eager-attention branch with those bytes; nothing fitted). Until now the second view charged them FlashAttention-2's
rates: the small models of Narayanan's table 1 were +38% (1.7B, h 2304) and +22% (3.6B) too fast, now +0.2% and -4.1%;
the 7.5B and 18.4B rows move from +3.5% / +2.4% to -9.4% / -6.4%; 15 of the 21 rows moved (the 6 ZeRO-3 rows are
communication-bound in the model). The 21 rows in the second view: within 10% 52.4% -> 61.9%, within 20% 81.0% ->
90.5%, median 9.9% -> 7.7%, mean +7.7% -> +2.0%. All expressible runs in the second view: within 10% 61.1% -> 61.8%,
within 20% 87.0% -> 87.8%, median 7.9% -> 7.8%, worst 64.5% (the headline: 46.2%, 75.2%, 11.2%, 64.5%, unchanged).
Still off among them: Narayanan's ZeRO-3 rows at micro-batch 4 (+36% / +42%), MT-NLG (+10 .. +16%), BLOOM tr11 (-12%)
and the 529.6B PTD-P rows (-12%).

Reading (2026-12-03, the second view charges MPT's Triton attention kernel at its own cited rates; the
headline did not move). The long-sequence error of MosaicML's rows is their attention kernel. `attn_impl: triton` runs
llm-foundry's copy of Tri Dao's "*Experimental* implementation of FlashAttention in Triton"
(llmfoundry/models/layers/flash_attn_triton.py: 128 x 128 blocks, num_stages=1, a backward autotuned between
sequence-parallel and not; its header: "Triton backward is generally slower than CUDA backward"). The FlashAttention-2
paper benchmarks that kernel as "FlashAttention Triton": on the A100 (fig. 4(c) / 4(d), causal, forward + backward)
59-80 TFLOP/s at head dimension 64 and 50-80 at 128 from 512 to 16k tokens, 0.42-0.67x the FlashAttention-2 bars the
model charges (88-171 and 99-189). Fig. 7 (H100) has no Triton bars; its FlashAttention-1 bars (104-156 at 64, 98-137
at 128) stand in, an assumption stated in variants.OWN_ATTENTION (on the A100 the Triton bars are 0.82-1.07x
FlashAttention-1's). Read off the figure, nothing fitted. The second view now charges each run's own attention kernel
beside its own element-wise kernels: all expressible runs within 10% 18.3% -> 61.1%, within 20% 45.0% -> 87.0%, median
22.3% -> 7.9%, worst 75.3% -> 64.5% (the headline, the launcher's runtime for every run: 46.2%, 75.2%, 11.2%, 64.5%);
MosaicML's 209 rows 6.2% -> 59.8% within 10%, 34.9% -> 87.6% within 20%, mean +27.7% -> +2.4%. 190 of the 197 Triton
rows moved; the other 7 (13B / 70B FSDP at micro-batch 2-4) are communication-bound in the model, their slower
attention still under the exposed traffic. By sequence length, the Triton rows' mean error in the second view (A100 /
H100), before -> after: 512 +16% / +23% -> +12% / +17%; 2k +17% / +16% -> +6% / +1%; 8k +35% / +47% -> +0% / +4%; 16k
+45% / +56% -> -7% / -9%; 32k +57% / +61% -> -13% / -16%; 64k +65% / +66% -> -17% / -21%. So the growth with the
sequence was the kernel; what is left runs the other way at both ends: +12-17% at 512 tokens (the short sequences'
large micro-batches, 13-128 sequences: a cost the model lacks, not found) and -13 .. -21% past 16k, where the tables
hold their 16k rate (the Triton kernel's rate still rising there would explain it; no cited figure past 16k). With the
cited A100 bars alone (the H100 Triton rows left at FlashAttention-2): 51.5% within 10%, 72.9% within 20%. The rows
still worst in the second view are not attention: the 13B / 70B FSDP rows at micro-batch 2 on 16-64 GPUs (-43 .. -53%,
communication-bound in the model at the built-in one-NIC link: the NIC-aggregation reading below), NeMo's 70B CP2
(-65%), Narayanan's ZeRO-3 rows (+36 / +42%) and the three 405B TP8 proxies (-25 .. -37%). The headline stays the
launcher's runtime (what `launcher plan` predicts); the target (>= 90% within 10%, none worse than 20%) is met by
neither view.

Tried and dropped (2026-12-02): compute slowed by the communication it hides. The model hides data-parallel
and ZeRO transfers behind compute at no cost; arXiv:2507.03114 measured "an average computational slowdown of 18.9%,
with a maximum of 40.0%" while communication overlaps compute (4 A100 / H100 / MI250 / MI210, GPT and LLaMA
models). Charged as 0.189 x the hidden time (`bench/published/variants.py overlap-contention`; cited, not fitted):
all expressible runs within 10% 46.2% -> 41.6%, within 20% 75.2% -> 74.4%, median 11.2% -> 11.9%, worst 64.5% ->
66.6%; MosaicML mean +6.2% -> +3.6%, fms-fsdp +5.4% -> -9.9%, dgxc -18.4% -> -20.9%, Narayanan +3.3% -> -0.4%, the
s >= 16k rows unmoved (+26.5 .. +55.1%). With each run's own element-wise kernels (the second view, that variant's
lines added to fused-llama / fused-gelu in a scratch run, not committed) MosaicML's mean goes only +28% -> +24%:
what MPT's runs spend beyond the model is not contention with hidden traffic. Not adopted; the model's overlap stays
free.

Reading (2026-12-02, IBM fms-fsdp runs added; nothing in the model changed). New data (runs.yaml family
fms-fsdp, each record quoting its source): the throughput table of foundation-model-stack/fms-fsdp's README at
5e522b4c4f8a (no torch.compile; the same numbers as the PyTorch blog "Maximizing training throughput using PyTorch
FSDP", 2024-03-13) on 128 A100 80GB and 96 H100 80GB, and the README's torch.compile table at ed74fd5ddec0 for A100:
12 records, Llama 2 7B / 13B / 70B and fms's own 34B (48 layers, 8192 wide, 8 kv heads, ffn 22016), seq 4096, 2
sequences per GPU with no accumulation, bf16 mixed precision, PyTorch FSDP1 with SDPA FlashAttention-2 and fms's
eager RMSNorm / rotary / SwiGLU: the software class closest to our runtime's. 4 are expressible, the 34B and 70B
rows with full activation checkpointing (FSDP FULL_SHARD as ZeRO-3, TP1 PP1, mb2): A100 34B 700 measured / 792
predicted tokens/s/GPU **+13.2%**, A100 70B 370 / 396 **+7.1%**, H100 34B 1550 / 1581 **+2.0%**, H100 70B 800 / 794
**-0.7%**. 8 are not: the 7B rows (eager and compiled) ran HSDP (FSDP HYBRID_SHARD: ZeRO-3 inside a node, replicas
across nodes), which the launcher does not run (DeepSpeed's class is ZeRO++ hpZ / MiCS; new sharding value `hsdp`);
the 13B rows and every compiled 13B-70B row ran fms-fsdp's selective checkpointing (every n-th block, or a fraction p
of the blocks; n / p not stated), another policy than ours. Left out, with reasons in runs.yaml's header: the compiled
H100 column (its GPU count conflicts with the compile blog's 464 H100s), the README's superseded February tables,
the compile blog's 448-GPU production run. All expressible runs 258 -> 262: within 10% 45.7% -> 46.2%, within 20%
74.8% -> 75.2%, median 11.2% -> 11.2% (11.19 -> 11.17), worst 64.5% -> 64.5%; the launcher's attention class 40 ->
44 runs (within 10% 28% -> 32%), eager element-wise kernels 3 -> 7 (33% -> 57%).

What the model charges (device terms, as compare.py runs it). A100 34B: GEMM 8.42 s, attention 0.69, element-wise
1.16 (the recompute's 2.53 s inside them), optimizer 0.04, ZeRO-3 traffic 0.04 exposed: 10.34 s a step against 11.70
measured; 70B 20.68 s against 22.14. The model is compute-bound there: its gathers and reduce-scatters (~10 / ~21 s
a step at the built-in A100 inter-node 22 GB/s) hide behind compute, and would on the cluster's stated "400Gbps"
too (50 GB/s if that is per node), so the 7-13% is on the compute side or in what FSDP1 and the trainer add beyond
the device terms: not known here. H100: 34B 5.18 s against 5.29, 70B 10.32 against 10.24, of which 1.01 / 2.14 s is
ZeRO-3 traffic exposed at the built-in one-NIC 45 GB/s (20% of the step). The source states "an H100 cluster with 96
GPUs and 800Gbps inter-node interconnect", per node or per GPU not said. Taken as a node's 100 GB/s for a ring (NCCL
spreading a ring over the node's NICs, the NIC-aggregation reading of 2026-11-26) the traffic hides and both H100
rows go to +27% / +25%; taken as per-GPU shares (6.25 / 12.5 GB/s) all four rows go to -67 .. -71%, which the
measurements rule out. The FSDP blog's H100 traces show "a 10% gap due to network" where the model exposes 20%; with
10% of the measured step as network, the rest (4.8 / 9.2 s) is 13-14% above the model's compute (4.17 / 8.18 s), the
A100 rows' shortfall again. So the H100 match is partly two errors cancelling: the model's network too slow for
this cluster, its compute (or FSDP1's overheads) too fast.

Reading (2026-12-02, the data's own spread; nothing in the model changed). Is 90% within 10% out of reach
because the published runs disagree with one another? `python3 bench/published/consistency.py` groups the
expressible runs by every input the model reads: 6 groups of identical inputs hold 17 runs (largest max / min
within a group 1.067), and 25 groups that differ only in the data-parallel degree (same per-GPU work) hold 90
(largest 1.222). In every group one prediction can land within 10% of every member, so a deterministic model
could in principle put all 258 within 10%: the misses below are terms the model lacks or gets wrong, not scatter
in the data. The new selective-recompute mode (model.checkpoint_mode=selective) moved no row: the records'
"selective" is Megatron's (the attention core) or MaxText's and torchtitan's operator lists, another policy than
ours, so those rows stay not expressible (the reason now says so).

Reading (2026-11-29 morning, NVIDIA's DGX Cloud recipes added; the run's own element-wise kernels as a
second view). New data: every dense BF16 pre-training table of NVIDIA/dgxc-benchmarking, in every README version
(v24.11.1 .. v26.06.01): 112 records, all H100 (NeMo 24.09 / 24.12 / 25.02 with Megatron-Core and
TransformerEngine, MaxText and PaxML on JAX), each with the config lines that give its recompute, distributed
optimizer (ZeRO-1) and SP (tests/plan/test_published_runs.py: step time, tokens/s and the READMEs' MFU formula
agree on every row). 23 are expressible (Llama 3.1 8B TP1 CP2 ZeRO-1 at 8-128 GPUs in three NeMo releases, the
405B 7- / 8-layer proxies at TP8 CP2 SP, MaxText's Llama 3 70B FSDP at 128-2,048 GPUs); 89 are not, each by its
first reason (54 interleaved pipelines; 25 Nemotron-4 15B, grouped-query attention in a GELU-class block; 10
selective recompute: MaxText's Llama 2 70B, PaxML's 5B). All expressible runs 235 -> 258: within 10% 49.8% -> 45.7%, within 20% 75.3% -> 74.8%,
median 10.0% -> 11.2%, worst 64.5%. The new rows are all too slow in the model: Llama 3.1 8B -15.4 .. -21.0%, the
MaxText 70B -9.5 .. -12.1%, the 405B proxies -29 .. -40%.

Why: the headline charges the launcher's runtime, transformers' eager RMSNorm (8 kernels in fp32), rotary (10)
and SwiGLU (2), and those runs ran fused kernels (TransformerEngine with bias_activation_fusion, apply_rope_fusion,
persist_layer_norm; XLA fusion). Records now say which element-wise kernels they ran (runs.yaml
`elementwise_kernels`, with each family's source), and the table above adds a second, diagnostic view that
charges each run's own kernels (bench/published/variants.py: one kernel a norm, an activation, a rotary; nothing
fitted). Under it the dgxc rows go to 87% within 10% (median 2.0%: the 8B rows +0.4 .. -7.1%, MaxText -1.7 ..
-6.5%); only the three 405B TP8 proxies stay off (-25 .. -37%: they overlap TP communication with GEMMs,
ub_tp_comm_overlap, which the model charges exposed, as our TP runs it). All runs outside MosaicML: within 10%
26.5% -> 65.3%, median 13.9% -> 4.6%. MosaicML's rows go the other way (50% -> 6% within 10%, mean +28%): the
fused-GELU finding below, now for the whole set. So with each run's own kernels the device terms (GEMM, attention,
memory, collectives) hold the Megatron-Core / TE and XLA runs and do not hold MPT's, where something the model
lacks costs 15-40% of a step. The headline stays the launcher's own runtime, because that is what `launcher
plan` predicts; `launcher plan` now says, beside its track record, how many of the matching runs ran fused
element-wise kernels (launcher/plan/track_record.py), so that a -16% there reads as the runtime's eager operators.

MosaicML, read again (llm-foundry and Composer at the commits the tables name). The >= 128-GPU table was run by
scripts/train/benchmarking/sweep.py @ 5e85bd6, which passes `--attn_impl flash` (FlashAttention-2) for 1b / 3b / 7b
/ 70b and `triton` for 13b / 30b: those 12 rows were labelled Triton and are now the launcher's kernel class
(import_mosaicml.py; labels only, no prediction moved). With their own kernels they are still +2 .. +30% too fast
(1b +18 .. +30%, 3b +11 .. +19%, 70b +19 .. +25%), so MPT's gap is not its attention kernel. What the runs did
beyond the model, from the code: Composer computes two train metrics (LanguageCrossEntropy, LanguagePerplexity),
each an unfused torch cross-entropy on the cached logits, after every micro-batch; the loss itself is
flash-attn's fused cross-entropy. Per logit that is ~34 bytes against the ~36 the model charges for
transformers' fp32 loss, so it does not explain the gap either. submit_benchmarks.py drops its
--fsdp_config_mixed_precision flag (the function default DEFAULT wins; Composer >= 0.16.4 reduces gradients in fp32
under it, twice the bytes the model charges), and the A100 40GB table's rows are older `bf16 | PURE` numbers kept
from before b2a43a1. Not modelled; where the rest of the 15-40% goes is still not known.

Reading (2026-11-29, attention by head dimension). The built-in A100 / H100 attention rates were
FlashAttention-2's head-dimension-128 bars (fig. 4(d) / 7(d)) for every model; the same figures' panel (c), head
dimension 64, runs 11-14% below them (A100 seq 2k 140 against 155 TFLOP/s, H100 4k 257 against 294). The plan now
reads a model's head dimension between the two panels, log-linear (launcher/plan/profile.py
Profile.attention_table_for), and `launcher calibrate` measures the table at more than one head dimension. Cited,
not fitted. 42 rows moved (the 39 MosaicML rows of 125m / 350m, head dimension 64; TinyLlama, 64; Narayanan's
1.7B / 3.6B, 96); within 10% 49.8% -> 49.8% (2 in: the A100-80GB 125m / 350m s8192 rows +13.3 / +11.6% -> +9.9 /
+8.1%; 2 out: two A100 125m s2048 rows -9.0 / -9.4% -> -10.0 / -10.3%), within 20% 75.3% -> 75.3%, median 10.0%,
worst 73.9% -> 64.5% (the MosaicML 350m s65536 row +73.9% -> +60.7%; the worst is now NeMo's 70B CP2 row). The
long-sequence MosaicML rows stay far off (+55% mean at 64k): their Triton kernel, not the head dimension.

Reading (2026-11-28 evening, the host terms held apart). This table did not move. The A100 / H100 built-ins
now carry the H200 node's host terms (our runtime's Python: the model's kernel issue, DeepSpeed's engine per
parameter tensor, ZeRO-3's hooks at 582 us a module and 537 us a parameter tensor; launcher/plan/profile.py), which
took the three 1B runs on one H100 from 0.88 / 0.73 / 0.49 planned / measured to 1.06 / 0.87 / 1.17. No run here ran
that Python, so compare.py holds each to the device terms alone (RUNTIME_HOST_TERMS). Charged anyway (`--host-terms
--out DIR`): within 10% 49.8% -> 28.5%, within 20% 75.3% -> 47.2%, median 10.0% -> 22.1%; MosaicML's FSDP rows move
-18 points on average (the 1B H100 mb18 s1024 row -7.0% -> -49.6%: at ~0.3 s of hooks a micro-batch on ~0.3 s of
kernels, DeepSpeed's ZeRO-3 would take twice MPT's FSDP step), TinyLlama -11.0% -> -34.7%, torchtitan's three
+13.9 / +2.6 / +13.0% -> +8.9 / -9.7 / +7.8% (3 of 3 within 10%), Narayanan's rows by 0-2.5 points (the ZeRO-3
175B g384 +36.0% -> +33.0%: modules of 175B models dwarf their hooks), MT-NLG and BLOOM not at all. Whether
DeepSpeed 0.19's ZeRO-3 really costs that much beside FSDP at these layouts has not been measured here; the hook
figures are held only by the H200 and H100 1B runs.

Reading (2026-11-28, three new runs; attention kernels labelled; CP expressible). Nothing in the model changed.
New records (runs.yaml, sources and quotes in each): the Megatron-LM README's GPT-3 175B on 1,024 A100s (TP8 PP16 DP8,
non-interleaved 1F1B at that commit, 32 s an iteration = 138 TFLOP/s by eq. 3): **-0.4%**; TinyLlama 1.1B (FSDP on 16
A100-40GB, 24k tokens/s/GPU): **-11.0%**, the model charging the launcher's eager RMSNorm / SwiGLU / rotary / loss
(2.3 s of its 6.1 s step) where TinyLlama ran fused kernels; NeMo AutoModel's Llama 3.1 70B on 64 H100s (FSDP2 over
32, CP 2, 8k, full recompute, 18.90 s a step): **-64.5%**. compare.py listed every CP run as "not implemented by the
launcher", which stopped being true when parallel.context_degree (ring attention) landed; CP now maps to it. In the
70B row the model's compute terms add up to 18.0 s (GEMM 12.7, attention 2.6, element-wise 2.6) against the 18.90 s
measured, and ZeRO-3's per-module gathers and reduce-scatters over one 45 GB/s NIC per GPU add 35.3 s exposed: the
same conflict the NIC-aggregation reading below describes (modern FSDP on DGX H100 is not bound by one NIC per GPU;
Narayanan's 2021 DeepSpeed ZeRO-3 rows were). Not included, with reasons in runs.yaml's header: GPT-NeoX-20B (FLOP
basis of its 117 TFLOP/s not stated), OLMo-core, BigScience's chronicles-prequel tables, StarCoder, Falcon, LLaMA-1.
Labels: every Megatron / Megatron-DeepSpeed run here (Narayanan 2021, MT-NLG, BLOOM tr11, the README run) is now
marked `attention_kernel: megatron_unfused` (QK^T and PV as batched GEMMs with the scores in memory, fused softmax:
they predate FlashAttention, or like BLOOM did not use it); they had been counted as the launcher's kernel class.
The launcher's class (torch SDPA / FlashAttention-2) is now 5 runs (torchtitan's 3, TinyLlama, NeMo's 70B). All
expressible runs 232 -> 235: within 10% 50.0% -> 49.8%, within 20% 75.4% -> 75.3%, median 10.0%, worst 73.9% (the
same MosaicML 64k row).

Reading (2026-11-27 evening, BLOOM's element-wise operators counted). One row moved: bloom-176b-tr11
-12.7% -> -15.0% (within 10% 50% -> 50%, within 20% 75% -> 75%, median 10.0%, worst 73.9%; the gpt rows' learned-
position terms and the fp32 loss moved nothing beyond 0.1 point). The model's BLOOM block now charges what the
runtime's transformers BloomAttention / BloomGelu run, counted per operator (bench/steptime/elementwise_bytes.py,
held by tests/plan/test_elementwise_bytes.py): the q, k, v reshape copies and their select_backward sums, the mask
add and fp32 softmax with its casts, bloom_gelu's 9 forward and 18 backward eager kernels (21 + 43 ffn-wide tensors,
not 16 + 32). Planned/counted bytes a block 0.73-0.80 -> 1.00. The tr11 run itself used Megatron-DeepSpeed's fused
scale-mask-softmax and bias-GELU kernels, which our runtime does not have: the row now says what `launcher train`
would do with that layout, further from what Megatron-DeepSpeed did.

Finding (2026-11-26 evening, not a model change): the fit of the gpt-architecture rows leans on a GELU they
did not run. The model charges the launcher's own runtime, whose gpt blocks are HF GPT-2 with `gelu_new`: tanh
GELU in ~8 eager element-wise kernels (launcher/plan/steptime.py block_costs, 8 x 2 n f/t x w bytes forward).
MPT runs one fused `nn.GELU(approximate='none')` (llm-foundry MPTMLP) and Megatron a fused bias-GELU. Charged as
one fused kernel instead (mem(2 n f/t x w, 1); bench/published/variants.py fused-gelu runs both), all 232 runs go
from 50% to 9.5% within 10% (MosaicML 50% -> 5%; the others 48% -> 48%, within 20% 91% -> 83%) and the mean
error by sequence length from -10% / -7% / -3% / +3% / +16% at 512 / 1k / 2k / 4k / 8k to +17% / +17% / +16% /
+25% / +38%. So for those runs something else costs about as much as the eager GELU would (15-40% of a step at
MPT's 768-2,048 widths) and the model does not have it; where it goes (GEMM rates at small widths below the
built-in curve, FSDP's casts and copies, something else) is not known here. The committed model keeps the
eager GELU because the launcher runs it; the note is here so that the short-sequence fit is not read as
evidence for the rest of the model.

Reading (2026-11-26 evening, Table 1's pipeline schedule). Narayanan et al. 2021 section 5.1, which
Table 1 reports, says "In particular, we use the interleaved pipeline schedule with the scatter/gather
optimization enabled" (arXiv:2104.04473v5; runs.yaml quotes it on every Table 1 record). The six Table 1 rows
with a pipeline (PP 2, 4, 8, 16, 35, 64) ran virtual stages, which DeepSpeed's PipelineEngine does not, so like
Llama 3 405B they are now listed as not expressible instead of compared (they were +3.1%, +4.2%, +0.3%, -3.3%,
-14.1%, -15.9%: the PP35 / PP64 misses were the schedule, as the reading below guessed). Nothing in the model
changed. All expressible runs 238 -> 232: within 10% 50.4% -> 50.0%, within 20% 76.1% -> 75.4%, median abs error
9.8% -> 10.0%, worst 73.9%. Runs outside MosaicML 29 -> 23: within 10% 52% -> 48%, within 20% 93% -> 91%.
Narayanan 2021 22 -> 16: within 10% 64% -> 62%. Table 2's PTD-P rows (section 5.2) name no schedule and stay.

Reading (2026-11-26, collectives by NCCL's own cost model). Before -> after: within 10% 48% -> 50%,
within 20% 76% -> 76%, median abs error 10.3% -> 9.8%, worst +73.9% -> +73.9% (the same MosaicML 64k row);
Narayanan 2021 within 10% 55% -> 64%, median 6.2% -> 5.4%; runs outside MosaicML within 10% 45% -> 52%.

What changed. A TP or data-parallel collective cost a fixed latency (10 us inside a node, 20 us across) plus
its bytes at the bus bandwidth, whatever the group's size. It now costs what NCCL's own tuning model says
(src/graph/tuning.cc, ncclTopoTuneModel / ncclTopoGetAlgoTime; launcher/plan/profile.py `NcclTuning`), the
cheapest of ring LL, LL128 and Simple and, for an all-reduce, tree: a Simple ring all-gather over r ranks on N
nodes pays 8.4 us + (r - N) x 3.4 us + (N - 1) x 14 us, LL 6.6 + 0.6 / 2.7 us a step at a quarter of the bus,
LL128 14 + 1.9 / 4.0 us at 0.92 of it. Constants read from NCCL's source, not fitted. ZeRO-3 pays it per module
gather, so its cost grows with the data-parallel group (a Simple gather over 512 ranks on 64 nodes: 2.4 ms; over
1,536 on 192: 7.3 ms). 13 rows moved closer, 7 further (by more than 1 point): Narayanan table 2 ZeRO-3 175B g768
+14.7% -> +7.7%, g1536 +14.7% -> +2.1%, 530B g1120 / g2240 +2.0% / +4.1% -> -1.4% / -2.7%, g384 / g640
+40% / +45% -> +36% / +42%; MosaicML H100 7B g256 / g512 +14.0% / +19.3% -> +10.0% / +1.6%; torchtitan 13B
+7.1% -> +2.6%; the TP8 PTD-P rows move by 1-4 points either way (an 8-rank all-reduce now pays 56 us, not 10);
MosaicML's H100 13B mb2 rows go 1-2.5 points further off (-51%, -53%).

Tried and dropped: the NICs of a node aggregated. NCCL's graph and nccl-tests give a ring across nodes the bus
bandwidth of all the group's NICs on a node (nChannels x per-NIC speed; "on an Nvidia DGX-A100 system we have
8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW", NCCL maintainers, NVIDIA/nccl#812), up to the
NVLink bus, where the built-ins charge one NIC (22 / 45 GB/s). On top of the model above it takes the MosaicML
H100 13B mb2 rows (the same 4,800 tok/s/GPU measured at 8-64 GPUs, which one NIC cannot carry) from -48..-53% to
+28..+29% and the 70B g32 mb2 rows from -43% / -51% to +15% / +24%; but Narayanan's ZeRO-3 rows (DeepSpeed of
2021, whose throughput halves with every doubling of the GPUs, as one NIC per GPU predicts) go to +68..+426%,
MosaicML's 70B A100-40GB g64 -25% -> +50%, torchtitan 13B +3% -> +16%, and within 10% falls 50% -> 47%. Which of
the two a DeepSpeed 0.19 ZeRO-3 run on today's NCCL gets needs a multi-node measurement, not taken here.

Reading (2026-11-25, branch fidelity). Before -> after this branch: all expressible runs 240 -> 238 (the two
Llama 3 rows left, below); within 10% 48% -> 48%, within 20% 75% -> 76%, median abs error 10.8% -> 10.3%, worst
+77.1% -> +73.9%. Runs at seq <= 4,096 (174): within 10% 63% -> 63%, within 20% 90% -> 92%, median 7.7% -> 7.3%,
worst 77.1% -> 50.4%. Runs outside MosaicML (29 after, 31 before): within 20% 74% -> 93%. The target (>= 90% within
10%, none beyond 20%) is not met, and not reachable here with cited constants: see the seq-length rows of the
by-feature table.

What changed. (1) ZeRO-3 under full recompute (launcher/plan/steptime.py `_zero3_regathered_per_block`): the
recomputed forward gathers every block module again, and DeepSpeed gathers once more for the backward the
modules it released in between (those followed in the block by >= stage3_max_reuse_distance = 1e9 parameters,
DeepSpeed's default, which our config keeps; partitioned_param_coordinator.py `__params_to_release`): for
GPT-175B/530B that is 2/3 of every block a third time. Derived from DeepSpeed's rule, not fitted. Narayanan 2021
table 2 ZeRO-3 rows: 175B g768 / g1536 +40% -> +15%, 530B g1120 / g2240 +25% / +27% -> +2% / +4%; the two
micro-batch-4 rows (175B g384 +69% -> +40%, 530B g640 +77% -> +45%) stay off: there compute (~44 s) and traffic
(~59 s) are of the same size and the model hides the smaller behind the larger completely, while the measured
82 s lies between that (59 s) and their sum (103 s). MosaicML's FSDP rows are mapped to ZeRO-3 and get the same
extra gather, which FSDP does not do (it keeps the recompute's gather for the backward): the comm-bound ones
moved (70B g32 mb2 -45% -> -50%, A100 -36% -> -42%; 70B A100-40GB g64 -15% -> -24%). (2) Built-in attention rates
are the FlashAttention-2 paper's fig. 4(d) / 7(d) bars (launcher/plan/profile.py), replacing a curve 28% / 37%
above them at seq 512; the effect here is small (a few short-sequence rows a little slower). (3) Llama 3 405B
(TP8 PP16, s8192) is not expressible: the paper (section 3.3.2, fig. 6) used an interleaved schedule with V stages
per rank, bubble (PP-1)/(V M); DeepSpeed's PipelineEngine runs non-interleaved 1F1B, bubble (PP-1)/M, which at
M = 16-32 and PP 16 is what the model charged (-46% / -55%). Comparing them measured the schedule, not the model.

What remains off. The error grows with the sequence length (mean -10% at 512, -2% at 2k, +16% at 8k, +28% at 16k,
+44% at 32k, +58% at 64k), all MosaicML, on every GPU, model size and micro-batch. Those tables were measured
with MPT's Triton FlashAttention (`attn_impl: triton`, submit_benchmarks.py's default when they were added, b2a43a1
/ 5e85bd6), not FlashAttention-2, so the planner (which models our launcher's torch SDPA) is predicting another
kernel. Taking every other term as modelled, the attention rate these runs imply at s >= 16k is 0.51-0.64 x the
FlashAttention-2 bars (A100 ~105, H100 ~185 TFLOP/s), above the paper's "FlashAttention Triton" bars (A100 50-80)
and its FlashAttention-1 bars (A100 55-83, H100 98-137): no cited kernel rate reproduces them, so none was
substituted (using the FlashAttention-1 bars for MosaicML moves within 20% up but within 10% from 48% to 27%).
At short sequences the MosaicML rows are a little slow in the model (-10% at 512) partly because the model charges
our HF GPT-2 element-wise kernels (eager tanh-GELU, 8 kernels) where MPT runs fused ones. Also off: 13B H100
mb2 without recompute (+26% at 8 GPUs, -48..-50% at 16-64 GPUs, measured the same 4,800 tok/s/GPU at every size:
not bandwidth-bound as the model's 45 GB/s inter-node link makes it); Narayanan's PP35 / PP64 rows -12..-16% (the
table's schedule is not stated; an interleaved one would explain a faster measurement); MT-NLG +11..+17%.
[2026-11-26 evening: Table 1's schedule is stated after all (section 5.1, interleaved), and its PP > 1 rows are
no longer compared: see the newest reading. Table 2's PTD-P PP35 rows (-12%) remain; section 5.2 names no schedule.]"""


def _summary_rows(sets: dict, key: str = "error") -> list[str]:
    out = []
    for name, rs in sets.items():
        s = summary(rs, key)
        if s["runs"]:
            out.append(f"| {name} | {s['runs']} | {s['within_10pct']:.0%} | {s['within_20pct']:.0%} | "
                       f"{s['median_abs_error']:.1%} | {s['worst_abs_error']:.1%} |")
    return out


def render(result: dict, model_name: str) -> str:
    rows = result["rows"]
    out = [f"# Predicted vs published throughput ({model_name})", "",
           "Command: `PYTHONPATH=$PWD .venv/bin/python bench/published/compare.py`. Data: `runs.yaml` (sources per run). "
           "Target (issue 14 part 5): within 10% for >= 90% of expressible runs, none worse than 20%.", "",
           "| set | runs | within 10% | within 20% | median abs error | worst |", "|---|---|---|---|---|---|"]
    sets = {"all": rows, "no assumed fields": [x for x in rows if not x["assumed"]],
            "the launcher's plan fits its runtime in the GPU": [x for x in rows if x["planned_memory_fraction"] <= 1],
            "the launcher's plan does not fit (it would refuse the layout)":
                [x for x in rows if x["planned_memory_fraction"] > 1]}
    for fam in sorted({x["family"] for x in rows}):
        sets[fam] = [x for x in rows if x["family"] == fam]
    for kernel in sorted({x["attention_kernel"] for x in rows}):   # "launcher's" sorts first
        name = "the launcher's (FlashAttention-2 class)" if kernel == "launcher's" else KERNEL_NAMES.get(kernel, kernel)
        sets[f"attention kernel: {name}"] = [x for x in rows if x["attention_kernel"] == kernel]
    for kind in sorted({x["elementwise_kernels"] for x in rows}):
        sets[f"element-wise kernels: {kind}"] = [x for x in rows if x["elementwise_kernels"] == kind]
    out += _summary_rows(sets)
    if any(x["error_own_kernels"] != x["error"] for x in rows):
        out += ["", "### The same runs with each run's own kernels, element-wise and attention "
                "(diagnostic, not the headline)", "",
                "Where a record says `elementwise_kernels: fused`, its norms, activation and rotary are charged as one "
                "kernel each (bench/published/variants.py, by architecture); where it ran MPT's Triton FlashAttention "
                "(`attention_kernel: triton`), its attention is charged at that kernel's cited rates "
                "(variants.OWN_ATTENTION: the FlashAttention-2 paper's \"FlashAttention Triton\" bars on the A100, "
                "its FlashAttention-1 bars standing in on the H100), and where it ran Megatron's core attention "
                "(`attention_kernel: megatron_unfused`), the scores' GEMMs over the whole square and their softmax "
                "and dropout bytes (variants.py megatron-attention), instead of FlashAttention-2's (compare.py "
                "own_kernels_model; nothing fitted). The headline above charges the launcher's runtime "
                "(transformers' eager operators, FlashAttention-2-class SDPA) for every run.", "",
                "| set | runs | within 10% | within 20% | median abs error | worst |", "|---|---|---|---|---|---|"]
        out += _summary_rows(sets, "error_own_kernels")
    out += ["", READING]
    # The same errors by feature: which modelled term a systematic miss points at.
    mean = lambda rs: sum(x["error"] for x in rs) / len(rs)  # noqa: E731 (signed: too fast > 0, too slow < 0)
    out += ["", "## By feature (signed mean error: + predicted too fast)", "",
            "| feature | value | runs | mean error | within 10% | within 20% | median abs error | worst |",
            "|---|---|---|---|---|---|---|---|"]
    features = {"seq length": lambda x: x["seq"], "ZeRO stage": lambda x: x["zero"],
                "micro batch": lambda x: x["micro_batch"] if x["micro_batch"] < 8 else ">= 8",
                "recompute": lambda x: x["recompute"], "GPU": lambda x: x["gpu"],
                "GPUs": lambda x: x["gpus"] if x["gpus"] <= 64 else ("128-512" if x["gpus"] <= 512 else "> 512")}
    for name, key in features.items():
        groups: dict = {}
        for x in rows:
            groups.setdefault(key(x), []).append(x)
        for value in sorted(groups, key=lambda v: (isinstance(v, str), v)):
            rs, s = groups[value], summary(groups[value])
            out.append(f"| {name} | {value} | {s['runs']} | {mean(rs):+.1%} | {s['within_10pct']:.0%} | "
                       f"{s['within_20pct']:.0%} | {s['median_abs_error']:.1%} | {s['worst_abs_error']:.1%} |")
    worst = sorted(rows, key=lambda x: -abs(x["error"]))[:15]
    out += ["", "## Worst 15", "", "| run | layout | measured tok/s/GPU | predicted | error | assumed |", "|---|---|---|---|---|---|"]
    out += [f"| {x['id']} | {x['layout']} | {x['measured_tokens_per_s_per_gpu']:.0f} | {x['predicted_tokens_per_s_per_gpu']:.0f} | "
            f"{x['error']:+.1%} | {', '.join(x['assumed'])} |" for x in worst]
    out += ["", "## Every expressible run", "",
            "| run | GPU x n | layout | measured tok/s/GPU | predicted | measured TFLOP/s | predicted | error | "
            "error, own kernels (element-wise; attention) | planned memory / GPU's | measured from | assumed |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {x['id']} | {x['gpu']} x {x['gpus']} | {x['layout']} | {x['measured_tokens_per_s_per_gpu']:.0f} | "
            f"{x['predicted_tokens_per_s_per_gpu']:.0f} | {x['measured_tflops_per_gpu']:.0f} | {x['predicted_tflops_per_gpu']:.0f} | "
            f"{x['error']:+.1%} | {x['error_own_kernels']:+.1%} ({x['elementwise_kernels']}; {x['attention_kernel']}) | "
            f"{x['planned_memory_fraction']:.2f} | {x['measured_from']} | "
            f"{', '.join(x['assumed'])} |" for x in rows]
    out += ["", "## Not expressible", "", "| run | why |", "|---|---|"]
    out += [f"| {x['id']} | {x['why']} |" for x in result["not_expressible"]]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(HERE / "runs.yaml"))
    ap.add_argument("--model", default=None, help="module:function step-time model (default launcher.plan.steptime:estimate_step_time)")
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--host-terms", action="store_true",
                    help="keep the profiles' runtime host terms (RUNTIME_HOST_TERMS); give --out elsewhere with it")
    args = ap.parse_args()
    records = yaml.safe_load(open(args.runs))
    result = compare(records, load_model(args.model), host_terms=args.host_terms,
                     predict_own=None if args.model else own_kernels_model())
    name = args.model or "launcher.plan.steptime:estimate_step_time"
    result["model"] = name
    result["summary"] = summary(result["rows"])
    result["summary_own_kernels"] = summary(result["rows"], "error_own_kernels")
    out = Path(args.out)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(render(result, name))
    if args.model is None and not args.host_terms:
        rec = track_record(result["rows"])   # one run per line: a model change shows as a readable diff
        runs = ",\n".join(json.dumps(r) for r in rec.pop("runs"))
        TRACK_PATH.write_text(json.dumps(rec)[:-1] + ', "runs": [\n' + runs + "\n]}\n")
    s = result["summary"]
    print(f"{name}: {s['runs']} expressible of {len(records)}; within 10% {s['within_10pct']:.0%}, "
          f"within 20% {s['within_20pct']:.0%}, worst {s['worst_abs_error']:.0%}; not expressible {len(result['not_expressible'])}")
    o = result["summary_own_kernels"]
    print(f"  each run's own kernels (diagnostic): within 10% {o['within_10pct']:.0%}, within 20% "
          f"{o['within_20pct']:.0%}, median {o['median_abs_error']:.1%}, worst {o['worst_abs_error']:.0%}")


if __name__ == "__main__":
    main()
