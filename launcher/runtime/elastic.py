"""Resuming a checkpoint on another layout (DP size, TP or PP degree, ZeRO stage 1-3) through DeepSpeed's
universal checkpoint.

A DeepSpeed checkpoint is tied to the layout it was saved on: ZeRO keeps one optimizer shard per DP rank and
pipeline stage, TP keeps one slice per TP rank. A plain `load_checkpoint` on another DP size fails
("The checkpoint being loaded used a DP world size of 4 but the current world size is 2", also with
`zero_optimization.elastic_checkpoint: true`), and across pipeline degrees ("parameter-alignment layout does
not match"), measured on DeepSpeed 0.19.8 on CPU ranks. DeepSpeed's answer is the
universal checkpoint (deepspeed/checkpoint/ds_to_universal.py): every parameter's fp32 value and Adam
moments as whole tensors, one folder per parameter name, which `"checkpoint": {"load_universal": true}`
slices for whatever layout loads it. So a resume on another layout is:

    verify (checkpoint.py) -> refuse what no conversion can carry (refuse_unconvertible, before any rank starts)
    -> rank 0 converts once into <run_dir>/universal/<tag>-<manifest digest>/ (convert_once: a temporary
       folder renamed into place, so a torn conversion is never loaded) while the other ranks wait
    -> every rank loads it with load_universal (train.py).

The converted folder belongs to the run that resumes (a checkpoint of another run given as resume=PATH is
only read). Data order needs nothing: a step reads global sample slots [step x global batch, (step+1) x global
batch) (runtime/data.py TokenBatches.train_sample_ids), whichever ranks read them, so with the global batch
kept the resumed run reads what an uninterrupted run on the new layout reads.

Conversion runs in a child process (`python -m launcher.runtime.elastic <tag dir> <out>`): ds_to_universal
forks its own workers and holds whole tensors, which should not stay in rank 0's memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from launcher.config.errors import ConfigError

UNIVERSAL_DIR = "universal"
DONE_FILE = "converted.json"
# The layout fields a universal checkpoint absorbs; everything else in checkpoint.LAYOUT_KEYS stays refused.
ELASTIC_LAYOUT_KEYS = ("world_size", "data_degree", "tensor_degree", "pipeline_degree", "zero_stage", "micro_batch_size")
# The config keys that express them (the machine, the parallel degrees, the micro batch that the accumulation absorbs).
ELASTIC_CONFIG_KEYS = ("cluster.nodes", "cluster.gpus_per_node", "parallel.tensor_degree", "parallel.pipeline_degree",
                       "parallel.data_degree", "parallel.zero_stage", "parallel.partition_method", "batch.micro_batch_size")
# Fields whose change needs the conversion (a changed micro batch alone loads as it is).
CONVERT_ON = ("data_degree", "tensor_degree", "pipeline_degree", "zero_stage")
# ds_to_universal converts Adam's state (fp32, exp_avg, exp_avg_sq per parameter): Lion fails with
# KeyError 'exp_avg_sq', Adafactor and 8-bit Adam with KeyError 'exp_avg' (measured, notes above).
ADAM_STYLE = ("adamw", "adam", "radam")


def needs_conversion(saved: dict, cfg, layout) -> bool:
    old = saved["layout"]
    part_then = saved.get("config", {}).get("parallel", {}).get("partition_method")
    return (any(old.get(k) != getattr(layout, k) for k in CONVERT_ON)
            or (layout.pipeline_degree > 1 and part_then != cfg.parallel.partition_method))


def _kind(tp: int, pp: int) -> str:
    """Which module the loop builds (train.build_engine): a PipelineModule, our TP layers on the plain engine
    (launcher/parallel/tensor_model.py, parameters `pipe.<layer>.<name>`), or the transformers model."""
    return "pipeline" if pp > 1 else "tensor" if tp > 1 else "transformers"


def refuse_unconvertible(saved: dict, cfg, layout, tag_dir: Path) -> None:
    """Refuse, with the key, both values, the rule and a fix, a layout change no universal checkpoint carries."""
    old = saved["layout"]
    then = saved.get("config", {})
    where = f"the checkpoint {Path(tag_dir).name} was saved with"

    def refuse(key, was, now, rule, fix):
        raise ConfigError(key, now, f"{where} {key}={was}; resuming it on this layout goes through DeepSpeed's universal "
                          f"checkpoint, and {rule}", fix)

    opt = then.get("optimizer", {}).get("name", "adamw")
    if opt not in ADAM_STYLE:
        refuse("optimizer.name", opt, cfg.optimizer.name, f"its conversion reads Adam's moments (exp_avg, exp_avg_sq), "
               f"which {opt} does not keep", "resume on the checkpoint's own layout, or start a new run from its "
               "exported weights (resume=never, model.init_from=<launcher export>)")
    for stage, label in ((old["zero_stage"], "saved"), (layout.zero_stage, "now")):
        if stage == 0:
            refuse("parallel.zero_stage", old["zero_stage"], layout.zero_stage,
                   f"ZeRO stage 0 ({label}) keeps the optimizer state inside the model file, which the conversion does "
                   "not read (it reads ZeRO's optimizer shards)", "use parallel.zero_stage 1, 2 or 3 on both layouts "
                   "(with pipeline_degree > 1: 1), or resume on the checkpoint's own layout")
    if 3 in (old["zero_stage"], layout.zero_stage):
        refuse("parallel.zero_stage", old["zero_stage"], layout.zero_stage,
               "with ZeRO-3 on either side it is not exact in DeepSpeed 0.19.8: ZeRO-1/2 -> ZeRO-3 finds no model file "
               "(ZeRO-3 names them zero_pp_rank_*_mp_rank_*_model_states.pt; it stops in SDLoaderBase.check_ckpt_list), "
               "and ZeRO-3 DP4 -> DP2 and DP2 -> DP4 leave the gradient norm 3.8e-5 (relative) off an uninterrupted run "
               "one step after the resume, even with the per-group weight decay its loader overwrites put back "
               "(checkpoint.load_checkpoint)", f"resume on the checkpoint's own layout (ZeRO-3 on {old['data_degree']} "
               "data-parallel ranks), or move the run to ZeRO-1/2 through its exported weights (resume=never, "
               "model.init_from=<launcher export>)")
    if old["sequence_degree"] != 1 or layout.sequence_degree != 1:
        refuse("parallel.sequence_degree", old["sequence_degree"], layout.sequence_degree,
               "a change of layout with Ulysses sequence parallelism is not verified to load exactly",
               "resume on the checkpoint's own layout")
    if old.get("context_degree", 1) != 1 or layout.context_degree != 1:
        refuse("parallel.context_degree", old.get("context_degree", 1), layout.context_degree,
               "a change of layout with ring-attention context parallelism is not verified to load exactly",
               "resume on the checkpoint's own layout")
    if old.get("sequence_parallel", False) or layout.sequence_parallel:
        refuse("parallel.sequence_parallel", old.get("sequence_parallel", False), layout.sequence_parallel,
               "a change of layout with Megatron sequence parallelism (our TP layers: on the pipeline engine with "
               "stages, on the plain engine without) is not verified to load exactly", "resume on the checkpoint's own layout")
    if old["padded_vocab_size"] != layout.padded_vocab_size:
        refuse("parallel.tensor_degree", old["tensor_degree"], layout.tensor_degree,
               f"the embedding is padded to a multiple of the tensor degree: {old['padded_vocab_size']} rows then, "
               f"{layout.padded_vocab_size} now, another tensor shape", "choose a tensor_degree that pads the "
               f"vocabulary ({then.get('model', {}).get('vocab_size')}) to {old['padded_vocab_size']} rows as well")
    if "tensor" in (_kind(old["tensor_degree"], old["pipeline_degree"]), _kind(layout.tensor_degree, layout.pipeline_degree)):
        # Our TP layers at pipeline_degree = 1 save the PipelineModule's names under tensor_model.PREFIX
        # (pipe.<layer>.<name>); the conversion's patterns (universal_info) and renames (pipeline <-> transformers)
        # know the bare PipelineModule names only, and no run holds such a conversion to an uninterrupted one.
        refuse("parallel.tensor_degree", old["tensor_degree"], layout.tensor_degree,
               "with tensor parallelism at parallel.pipeline_degree=1 (our TP layers on DeepSpeed's plain engine, "
               "parameters named pipe.<layer>.<name>) on either side it is not implemented: the conversion maps "
               "pipeline-stage and transformers names only",
               "resume on the checkpoint's own layout (its tensor, pipeline and data degrees and ZeRO stage), or put "
               "the TP inside a pipeline (parallel.pipeline_degree > 1) on both layouts, or start a new run from its "
               "export (resume=never, model.init_from=<launcher export>)")


def refuse_global_batch_change(saved: dict, cfg, layout, tag_dir: Path) -> None:
    """The global batch is the data position's unit: step s reads sample slots [s x B, (s+1) x B) (runtime/data.py),
    and the learning-rate schedule counts steps of B sequences. Another B would re-read or skip samples and change
    what a step means, so it is refused with the arithmetic a layout change keeps it by."""
    old_b, new_b = saved["layout"]["global_batch_size"], layout.global_batch_size
    if old_b == new_b:
        return
    micro, dp = layout.micro_batch_size, layout.data_degree
    raise ConfigError("batch.global_batch_size", new_b,
                      f"the checkpoint {Path(tag_dir).name} was saved with a global batch of {old_b} sequences, and a resumed "
                      f"step s reads sample slots [s x {old_b}, (s+1) x {old_b}) of the data order and follows a learning-rate "
                      f"schedule counted in steps of {old_b} sequences; a global batch of {new_b} would read other samples "
                      "than the run it continues", f"keep batch.global_batch_size={old_b}: on {dp} data-parallel ranks with "
                      f"micro batch {micro} that is {old_b // max(1, micro * dp)} accumulation steps"
                      + ("" if old_b % (micro * dp) == 0 else f" (choose a micro batch dividing {old_b} / {dp})")
                      + "; or start a new run from its exported weights (resume=never, model.init_from=<launcher export>)")


# ----------------------------------------------------------------------------- the metadata our own modules need


def universal_info(arch: str, pipeline: bool) -> dict:
    """DeepSpeed's `universal_checkpoint_info` for a launcher-built module (a PipelineModule or a transformers model).

    ds_to_universal merges each parameter's TP slices by these patterns: row-parallel weights (o_proj and
    down_proj, Megatron's RowParallelLinear: launcher/parallel/tensor.py) along dim 1, replicated ones (norms,
    row-parallel biases) from one rank, everything else along dim 0 (column-parallel; the embedding and the head
    too, split over the vocabulary). The loader re-splits a whole tensor the same way. Without them a TP1 -> TP2
    resume re-splits o_proj/down_proj on dim 0 and loads silently wrong (loss 5.5717 vs 5.5511), and a replicated
    tensor is concatenated tp times. The patterns go through re.match (anchored at the start), must not overlap and must
    each match some parameter (strict conversion), hence the cases per arch.
    """
    if arch == "bloom":
        row, layer_norms, row_bias = (r"self_attention\.dense", r"mlp\.dense_4h_to_h"), \
            r"(input_layernorm|post_attention_layernorm)\.", r"(self_attention\.dense|mlp\.dense_4h_to_h)\.bias$"
    else:
        row, layer_norms, row_bias = (r"self_attn\.o_proj", r"mlp\.down_proj"), \
            r"(input_layernorm|post_attention_layernorm)\.", None
    rows = "(" + "|".join(row) + r")\.weight$"
    if pipeline:
        # PipelineModule names: <layer index>.<local name> (launcher/parallel/pipeline.py); the embedding and head
        # (`<index>.weight`, or tied_modules.embed) are split over the vocabulary like a column-parallel weight.
        block = r"\d+\.layer\."
        replicated = [r"\d+\.norm\.", block + layer_norms]
    else:
        block = r"(model\.layers|transformer\.h)\.\d+\."
        replicated = [block + layer_norms, r"(model\.norm|transformer\.ln_f)\."]
        if arch == "bloom":
            replicated.append(r"transformer\.word_embeddings_layernorm\.")
    if row_bias:
        replicated.append(block + row_bias)
    return {"universal_checkpoint_version": 0.2, "parameter_with_row_parallelism_patterns": [block + rows],
            "tp_replicated_parameter_patterns": replicated}


def pipeline_to_hf_names(arch: str, num_layers: int, names) -> dict:
    """PipelineModule parameter name -> the transformers model's name (the same tensor), for `names`."""
    from launcher.parallel.pipeline import ARCH_MODULES, layer_hf_prefixes

    prefixes = layer_hf_prefixes(arch, num_layers)
    out = {}
    for name in names:
        head, _, local = name.partition(".")
        if head == "tied_modules":
            out[name] = f"{ARCH_MODULES[arch].embed}.{local.partition('.')[2]}"
            continue
        prefix = prefixes[int(head)]
        sub, _, rest = local.partition(".")
        out[name] = f"{prefix}.{rest}" if sub in ("layer", "norm") and rest else f"{prefix}.{local}"
    return out


# ----------------------------------------------------------------------------- converting, once


def converted_dir(run_dir: Path, tag_dir: Path) -> Path:
    """Where this run keeps the universal form of `tag_dir`: named by the tag and a digest of its manifest
    (the content it was converted from), inside the resuming run's own directory."""
    tag_dir = Path(tag_dir)
    ident = (tag_dir / "manifest.json").read_bytes() if (tag_dir / "manifest.json").is_file() else str(tag_dir.resolve()).encode()
    return Path(run_dir) / UNIVERSAL_DIR / f"{tag_dir.name}-{hashlib.sha256(ident).hexdigest()[:12]}"


def convert_once(tag_dir: Path, run_dir: Path, saved: dict, layout, log=print) -> Path:
    """The universal form of `tag_dir` for `layout`, converting it when this run has not yet (rank 0 only).

    Durable: converted into `.tmp-<name>-<pid>`, marked done, fsynced and renamed; a folder without the mark is
    never returned (a failed ds_to_universal leaves a folder that later fails to load with a bare
    `assert len(self.ckpt_list) > 0`). Older conversions of this run are removed (they served earlier resumes).
    """
    from launcher.runtime.durable import fsync_dir, fsync_file, write_atomic

    final = converted_dir(run_dir, tag_dir)
    old, new = saved["layout"], layout
    target = _kind(new.tensor_degree, new.pipeline_degree)
    if (final / DONE_FILE).is_file() and json.loads((final / DONE_FILE).read_text()).get("names") == _naming(target):
        return final
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.iterdir():
        if stale != final:
            shutil.rmtree(stale, ignore_errors=True)
    if final.exists():
        shutil.rmtree(final)  # not marked done, or converted for the other naming
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    cfg = saved["config"]
    spec = {"source": str(tag_dir), "out": str(tmp), "arch": cfg["model"]["arch"], "layers": cfg["model"]["num_hidden_layers"],
            "tie": bool(cfg["model"].get("tie_word_embeddings")), "source_kind": _kind(old["tensor_degree"], old["pipeline_degree"]),
            "target_kind": target}
    t0 = time.perf_counter()
    log(f"converting {tag_dir} (tp {old['tensor_degree']} pp {old['pipeline_degree']} dp {old['data_degree']} ZeRO "
        f"{old['zero_stage']}) to a universal checkpoint for tp {new.tensor_degree} pp {new.pipeline_degree} dp "
        f"{new.data_degree} ZeRO {new.zero_stage}: {final}")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-m", "launcher.runtime.elastic", json.dumps(spec)], capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"converting {tag_dir} to a universal checkpoint failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    for p in tmp.rglob("*"):
        if p.is_file():
            fsync_file(p)
    for d in {p.parent for p in tmp.rglob("*")} | {tmp}:
        fsync_dir(d)
    write_atomic(tmp / DONE_FILE, json.dumps({"source": str(tag_dir), "names": _naming(target),
                                              "seconds": round(time.perf_counter() - t0, 2)}))
    os.rename(tmp, final)
    fsync_dir(root)
    log(f"converted in {time.perf_counter() - t0:.1f} s")
    return final


def _naming(kind: str) -> str:
    return "pipeline" if kind == "pipeline" else "transformers"


def _convert(spec: dict) -> None:
    """The child process: ds_to_universal with our metadata injected, then the parameter folders renamed to
    the names the resuming module has (PipelineModule <-> transformers)."""
    import argparse

    from deepspeed.checkpoint import ds_to_universal as dsu
    from deepspeed.checkpoint.constants import UNIVERSAL_CHECKPOINT_INFO

    source_kind, target_kind = spec["source_kind"], spec["target_kind"]
    # Ours replaces whatever the files carry (nothing, for a PipelineModule or a plain transformers model; our TP
    # layers at pipeline_degree = 1 are refused by refuse_unconvertible).
    info = universal_info(spec["arch"], source_kind == "pipeline")

    def inject(ds_checkpoint):
        ds_checkpoint.global_state[UNIVERSAL_CHECKPOINT_INFO] = info

    dsu._inject_missing_state = inject
    args = argparse.Namespace(input_folder=spec["source"], output_folder=spec["out"], num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    dsu.main(args)
    if _naming(source_kind) != _naming(target_kind):
        zero = Path(spec["out"]) / "zero"
        names = [p.name for p in zero.iterdir() if p.is_dir()]
        mapping = pipeline_to_hf_names(spec["arch"], spec["layers"], names) if source_kind == "pipeline" else \
            {v: k for k, v in _hf_to_pipeline_candidates(spec, names).items()}
        for a, b in mapping.items():
            os.rename(zero / a, zero / f".renamed-{b}")
        for a, b in mapping.items():
            os.rename(zero / f".renamed-{b}", zero / b)


def _hf_to_pipeline_candidates(spec: dict, hf_names) -> dict:
    """pipeline name -> transformers name for the transformers names present (the inverse of pipeline_to_hf_names)."""
    from launcher.parallel.pipeline import ARCH_MODULES, layer_hf_prefixes

    prefixes = layer_hf_prefixes(spec["arch"], spec["layers"])
    embed = ARCH_MODULES[spec["arch"]].embed
    out = {}
    for hf in hf_names:
        # The longest prefix that names a pipeline layer (model.layers.1 must not take model.layers.10's tensors).
        i, prefix = max(((i, p) for i, p in enumerate(prefixes) if hf.startswith(p + ".")), key=lambda t: len(t[1]))
        rest = hf[len(prefix) + 1:]
        if spec["tie"] and prefix == embed:
            out[f"tied_modules.embed.{rest}"] = hf
        elif rest == "weight" and prefix in (embed, ARCH_MODULES[spec["arch"]].head):
            out[f"{i}.{rest}"] = hf
        elif prefix.startswith(ARCH_MODULES[spec["arch"]].blocks + "."):
            out[f"{i}.layer.{rest}"] = hf
        else:
            out[f"{i}.norm.{rest}"] = hf
    return out


# ----------------------------------------------------------------------------- the ranks


def universal_ds_config(ds_config: dict) -> dict:
    """The engine's DeepSpeed config for a universal load (the run's frozen deepspeed.json stays as generated)."""
    return {**ds_config, "checkpoint": {**ds_config.get("checkpoint", {}), "load_universal": True}}


def prepare_resume(tag_dir: Optional[Path], run_dir: Path, cfg, layout, log=print) -> Optional[Path]:
    """Rank 0, before the process group: the universal folder to load when `tag_dir` was saved on another layout
    (converted now if this run has not yet), else None. Only the checks a conversion needs; the whole resume check
    (checkpoint.check_resume_compatible) runs as before."""
    if tag_dir is None:
        return None
    from launcher.runtime.checkpoint import load_state

    saved = load_state(tag_dir)
    from launcher.runtime.checkpoint import refuse_autotp_checkpoint

    refuse_autotp_checkpoint(saved, tag_dir)  # before any conversion: its names are AutoTP's (checkpoint.py)
    if "layout" not in saved or not needs_conversion(saved, cfg, layout):
        return None
    refuse_unconvertible(saved, cfg, layout, tag_dir)
    return convert_once(tag_dir, run_dir, saved, layout, log=log)


if __name__ == "__main__":
    _convert(json.loads(sys.argv[1]))
