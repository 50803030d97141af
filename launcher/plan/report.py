"""`launcher plan`: the resolved layout and what follows from it, as one dict, a table, or JSON.

No torch here: planning must be instant and run on a laptop.
"""

from __future__ import annotations

from launcher.config.layout import Layout
from launcher.plan.params import count_params, rough_params


def plan_summary(cfg, layout: Layout) -> dict:
    """Every number `launcher plan` reports, keyed as in `--json`."""
    params = count_params(cfg.model)
    return {
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
    }


def _rows(s: dict) -> list[tuple[str, str, str]]:
    """(quantity, value, how it is derived) rows of the plan table."""
    tp, pp, sp, dp = s["tensor_degree"], s["pipeline_degree"], s["sequence_degree"], s["data_degree"]
    mp = f"{tp} x {pp}" + (f" x {sp}" if sp > 1 else "")
    rows = [
        ("model", f"{s['model']} ({s['arch']})", f"recipe {s['recipe']}" if s["recipe"] else ""),
        ("world size", f"{s['world_size']:,}", f"nodes x gpus_per_node = {s['nodes']} x {s['gpus_per_node']} ({s['gpu']})"),
        ("tensor x pipeline" + (" x sequence" if sp > 1 else ""), mp, "ranks per model replica = " + f"{tp * pp * sp:,}"),
        ("data parallel", f"{dp:,}", f"world / (TP x PP{' x SP' if sp > 1 else ''}) = {s['world_size']:,} / {tp * pp * sp:,}"),
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
    if s["padded_vocab_size"] != s["vocab_size"]:
        rows.append(("vocab (padded)", f"{s['padded_vocab_size']:,}", f"{s['vocab_size']:,} rounded up to a multiple of TP"))
    return rows


def render_plan(s: dict, console) -> None:
    """Print the plan as a rich table, warnings underneath."""
    from rich.table import Table

    table = Table(title=f"launcher plan: {s['recipe'] or s['model']}", title_justify="left")
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right")
    table.add_column("how", style="dim")
    for row in _rows(s):
        table.add_row(*row)
    console.print(table)
    from rich.markup import escape

    for w in s["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
