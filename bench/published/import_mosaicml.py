"""Turn MosaicML's published throughput tables into runs.yaml records (run once; output pasted into runs.yaml).

Source: mosaicml/llm-foundry, scripts/train/benchmarking/README.md at commit
495218376830947dce625efabc4d86be7c47cc45 (the last commit that changed the tables). Each table row is one
measured run (Composer + PyTorch FSDP, 12 steps; the README's "Results" section). Model shapes come from
scripts/train/yamls/pretrain/mpt-<size>.yaml in the same repository (d_model, n_layers, n_heads,
expansion_ratio 4, vocab 50368). The FP8 table is skipped (the planner has no fp8).

Attention kernel: the tables were added at b2a43a1 (Oct 2023; the >= 128-GPU table at 5e85bd6, Jan 2024), where
scripts/train/benchmarking/submit_benchmarks.py had `--attn_impl` default 'triton' and sweep.sh does not pass
it: the rows ran MPT's Triton FlashAttention (llmfoundry/models/layers/flash_attn_triton.py), not
FlashAttention-2 (the default became 'flash' later). Each record says so (attention_kernel: triton), except the
>= 128-GPU table's 1b / 3b / 7b / 70b rows, which sweep.py @ 5e85bd6 ran with `--attn_impl flash` (FlashAttention-2).
Element-wise kernels: MPTMLP runs one nn.GELU kernel and MPT its low-precision LayerNorm as one kernel, not the
launcher's eager GPT-2 gelu_new: each record says so (elementwise_kernels: fused).

    python bench/published/import_mosaicml.py README.md >> bench/published/runs.yaml
"""

from __future__ import annotations

import sys

COMMIT = "495218376830947dce625efabc4d86be7c47cc45"
# d_model, n_layers, n_heads (scripts/train/yamls/pretrain/mpt-<size>.yaml); the 760m/1b/3b head counts were
# changed in those yamls to keep d_head = 128 (comments there); heads do not change the FLOPs (H x Q = d_model).
SHAPES = {"125m": (768, 12, 12), "350m": (1024, 24, 16), "760m": (1536, 24, 12), "1b": (2048, 24, 16),
          "3b": (2560, 32, 20), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 48, 56), "70b": (8192, 80, 64)}
GPUS = {"h100_80gb": "h100-80gb", "a100_80gb": "a100-80gb", "a100_40gb": "a100-40gb"}
SHARDING = {"FULL_SHARD": "fsdp_full_shard", "SHARD_GRAD_OP": "fsdp_shard_grad_op"}


def rows(text: str):
    section = None
    header = None
    for line in text.splitlines():
        if line.startswith("## "):
            section, header = line[3:].strip(), None
            continue
        if not line.startswith("|") or "---" in line:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "Model":
            header = cells
            continue
        if header and section and "FP8" not in section:
            yield section, dict(zip(header, cells))


def record(section: str, r: dict) -> str:
    size = r["Model"]
    hidden, layers, heads = SHAPES[size]
    seq, gpus = int(r["SeqLen (T)"]), int(r["# GPUs"])
    rid = f"mosaicml-{r['GPU'].replace('_', '')}-{size}-s{seq}-g{gpus}-mb{r['MicroBatchSize']}-gbs{r['GlobalBatchSize']}"
    prec = r["Precision"]
    return f"""- id: {rid}
  family: mosaicml-llm-foundry
  source: "MosaicML llm-foundry, scripts/train/benchmarking/README.md @ {COMMIT[:12]}, table '{section}', row {size} seq {seq} {gpus} GPUs"
  model: {{name: mpt-{size}, arch: gpt, layers: {layers}, hidden: {hidden}, heads: {heads}, kv_heads: {heads}, ffn: {4 * hidden}, vocab: 50368, seq: {seq}, params_stated: {r['NumParams']}}}
  gpu: {GPUS[r['GPU']]}
  gpus: {gpus}
  gpus_per_node: 8
  tp: 1
  pp: 1
  cp: 1
  dp: {gpus}
  sharding: {SHARDING[r['Sharding Strategy']]}
  micro_batch: {r['MicroBatchSize']}
  grad_accum: {r['GradAccum']}
  global_batch: {r['GlobalBatchSize']}
  recompute: {'full' if r['Activation Checkpointing'] == 'True' else 'none'}
  precision: bf16
  precision_stated: "{prec} / {r['MP Mode']}"
  measured: {{tokens_per_s_per_gpu: {r['Throughput (T/s/GPU)']}, mfu_pct: {r['MFU']}, hfu_pct: {r['HFU']}}}
  derived: {{dp: "= gpus (FSDP, no model parallelism)", ffn: "expansion_ratio 4 x d_model (mpt yaml)"}}
{_attention(section, size)}  elementwise_kernels: fused
  notes: "Composer FSDP, {_attention_note(section, size)}, learned position embeddings (NumParams grows with seq); MFU uses 6N + 12 L d s"
"""


# The >= 128-GPU table was run by scripts/train/benchmarking/sweep.py @ 5e85bd6, which passes `--attn_impl flash`
# (FlashAttention-2, the gpu-flash2 extra) for 1b, 3b, 7b and 70b and `--attn_impl triton` for 13b and 30b; every
# other table by sweep.sh, which passes none, so submit_benchmarks.py's default 'triton' (b2a43a1).
LARGE_SCALE_FLASH = {"1b", "3b", "7b", "70b"}


def _flash(section: str, size: str) -> bool:
    return "Large Scale" in section and size in LARGE_SCALE_FLASH


def _attention(section: str, size: str) -> str:
    return "" if _flash(section, size) else "  attention_kernel: triton\n"


def _attention_note(section: str, size: str) -> str:
    if _flash(section, size):
        return ("attention: FlashAttention-2 (attn_impl: flash, which sweep.py @ 5e85bd6 passes for 1b / 3b / 7b / "
                "70b; the launcher's kernel class)")
    return ("attention: MPT's Triton FlashAttention (attn_impl: triton, the --attn_impl default of "
            "submit_benchmarks.py when the tables were measured, b2a43a1 and 5e85bd6; sweep.sh does not pass it; "
            "sweep.py @ 5e85bd6 passes it for 13b / 30b), not FlashAttention-2")


def main() -> None:
    text = open(sys.argv[1]).read()
    out = [record(section, r) for section, r in rows(text)]
    sys.stdout.write("".join(out))
    print(f"# {len(out)} MosaicML records", file=sys.stderr)


if __name__ == "__main__":
    main()
