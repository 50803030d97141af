"""Diagnostics, not the benchmark: bench/published/compare.py as committed, then with the planner's element-wise
operators charged as the fused kernels many published runs used instead of the eager ones the launcher's runtime
(transformers' modules) runs; OWN_ATTENTION, the cited rates of attention kernels other than the launcher's, which
compare.py's second view charges the runs that used them. Each variant is launcher/plan/steptime.py with named
lines replaced, loaded as a separate module; nothing is fitted. The readings in compare.py quote this output.

    PYTHONPATH=$PWD .venv/bin/python bench/published/variants.py                # every variant
    PYTHONPATH=$PWD .venv/bin/python bench/published/variants.py fused-gelu     # one

Variants (bytes per kernel by the kernel's definition: each input read once, each output written once):
  fused-gelu             the gpt blocks' GELU as one kernel (MPT's nn.GELU, Megatron's fused bias-GELU), not
                         GPT-2 `gelu_new`'s ~8 eager kernels
  fused-llama            LLaMA's RMSNorm as one kernel reading x and writing y (TransformerEngine / apex /
                         Triton RMSNorm, as LayerNorm is already charged), rotary as one kernel per q and k
                         (read, write), SwiGLU as one kernel (read gate and up, write the product); backward twice
                         the forward, as the planner charges every fused kernel
  overlap-contention     every data-parallel / ZeRO transfer the model hides behind compute slows that compute by
                         18.9% of the hidden time: the mean computational slowdown under overlapped communication
                         measured on 4 A100 / H100 / MI250 / MI210 with GPT and LLaMA models (arXiv:2507.03114,
                         abstract: "an average computational slowdown of 18.9%, with a maximum of 40.0%")
  deepspeed-default-bf16-accumulation  DeepSpeed's BF16_Optimizer as it ran before immediate_grad_update existed
                         (deepspeedai/DeepSpeed#4975, January 2024; the launcher sets it): every backward but the
                         first zeroes the held bf16 gradients and adds into them, and the optimizer adds them all
                         after it, (m - 1) x 8 bytes a parameter a step more (steptime.bf16_accumulation, counted
                         both ways in tests/plan/test_bf16_accumulation.py); runs.yaml `sharding:
                         bf16_optimizer_zero1` (BLOOM, 2022)
  fused-grad-accumulation  no add of each micro-batch's weight gradients into the held ones: the weight-gradient
                         GEMM accumulates into fp32 main_grad (Megatron-Core's gradient_accumulation_fusion, on in
                         NeMo 2; runs.yaml `grad_accumulation: fused_wgrad`)
  megatron-attention     Megatron's core attention (Megatron-LM / Megatron-DeepSpeed before FlashAttention): QK^T
                         and PV as batched GEMMs over the whole s x s square (the causal half is masked, not
                         skipped), the scores in memory in the model's 16-bit dtype, FusedScaleMaskSoftmax (one
                         kernel: read the scores, write the probabilities; its backward reads the output and the
                         gradient, writes one) and attention dropout (torch's fused dropout: read, write, and a
                         1-byte mask; backward reads the gradient and the mask, writes one). Dropout at 0.1, the
                         default of both repositories' arguments.py (`--attention-dropout`, default=0.1), which no
                         run here overrides where its script is published (BLOOM's tr11-176B-ml.slurm sets none)
Megatron's TP at the model's ends (VocabParallelEmbedding, the ColumnParallelLinear head, vocab_parallel_cross_entropy)
is no variant since 2026-12-05: the launcher's runtime runs the same vocabulary-parallel ends, so the headline
(steptime.py end_costs) charges them for every TP > 1 run.
tests/plan/test_published_runs.py holds that every anchor line below is still in steptime.py, so a variant cannot
silently stop applying.
"""
from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

import yaml

from launcher.plan import steptime

HERE = Path(__file__).parent

# variant -> [(a line of steptime.py as committed, what replaces it)]
VARIANTS = {
    "fused-gelu": [
        ("        mem(8 * 2 * n * f / t * w, 8)             # tanh-GELU in eager ops (GPT2 gelu_new): ~8 kernels\n",
         "        mem(2 * n * f / t * w, 1)                 # variant: one fused GELU kernel\n"),
    ],
    "fused-llama": [
        ("        return x * (F32 * 8 + w * (2 + 2 * casts)), 6 + casts\n",
         "        return 2 * x * w, 1   # variant: one fused RMSNorm kernel\n"),
        ("        mem(9 * (q_el + kv_el) * w, 10)          # rotary: q cos + rotate_half(q) sin, same for k "
         "(5 kernels each)\n",
         "        mem(2 * (q_el + kv_el) * w, 2)           # variant: fused rotary, one kernel per tensor\n"),
        ("        mem(5 * n * f / t * w, 2)                 # silu(gate) * up\n",
         "        mem(3 * n * f / t * w, 1)                 # variant: fused SwiGLU\n"),
    ],
    "overlap-contention": [
        ("            exposed = max(0.0, comm - hide) + gather_s(par_b, r, link)\n",
         "            exposed = max(0.0, comm - hide) + 0.189 * min(comm, hide) + gather_s(par_b, r, link)\n"),
        ("            exposed = m * max(0.0, per_mb - hide) + gather_s(par_b, r, link)\n",
         "            exposed = m * max(0.0, per_mb - hide) + m * 0.189 * min(per_mb, hide) + gather_s(par_b, r, link)\n"),
        ("            exposed = m * max(0.0, per_mb - hide)\n",
         "            exposed = m * max(0.0, per_mb - hide) + m * 0.189 * min(per_mb, hide)\n"),
    ],
    "fused-grad-accumulation": [
        ("    m = st.grad_accum_steps\n    if uses_bf16_optimizer(",
         "    return Cost()   # variant: the weight-gradient GEMM accumulates into main_grad, no add of its own\n"
         "    m = st.grad_accum_steps\n    if uses_bf16_optimizer("),
    ],
    "deepspeed-default-bf16-accumulation": [
        ("        nbytes, kernels = bf16_accumulation(m, st.grad_accum_fp32)\n",
         "        nbytes, kernels = bf16_accumulation(m, st.grad_accum_fp32, immediate=False)   # variant: default\n"),
    ],
    "megatron-attention": [
        ("    if shape.flash_attention:\n",
         "    if False:   # variant: Megatron's unfused core attention, the eager branch below\n"),
        ("        mem_counted(scores * 2 * w + b * s * s * w + scores * 2 * F32 + casts, 2 + ck, scores * 3 * F32 + casts, "
         "1 + ck)\n",
         "        mem_counted(scores * (4 * w + 1), 2, scores * (5 * w + 1), 2)   # variant: fused softmax + dropout\n"),
    ],
}


# A record's `elementwise_kernels: fused` (runs.yaml) -> the variant that charges its architecture's fused kernels
# (compare.py's second view). BLOOM has none written: its one run is charged as the launcher's runtime either way.
FUSED_BY_ARCH = {"llama": "fused-llama", "gpt": "fused-gelu"}


# A record's `attention_kernel` -> its kernel's causal forward + backward rate (TFLOP/s by sequence length, as the
# built-in profiles' FlashAttention-2 tables: launcher/plan/profile.py), head dimension 128 and 64, by GPU, for the
# kernels that are not the launcher's class (compare.py's second view; the headline charges FlashAttention-2's).
# "triton": MPT's `attn_impl: triton`, llm-foundry's llmfoundry/models/layers/flash_attn_triton.py, whose header
# says it is Tri Dao's "*Experimental* implementation of FlashAttention in Triton" (backward autotuned between two
# 128 x 128 configs, num_stages=1; "Triton backward is generally slower than CUDA backward"). A100: that kernel's
# bars in the FlashAttention-2 paper (Dao 2023, arXiv:2307.08691), fig. 4(d) (head dimension 128) and 4(c) (64),
# "FlashAttention Triton", causal, forward + backward, read as printed above each bar (the flash-attention
# repository's assets/flash2_a100_fwd_bwd_benchmark.png). H100: fig. 7 has no Triton bars; its "FlashAttention"
# (FlashAttention-1, also not Hopper-tuned) bars stand in, an assumption: on the A100 the Triton bars are 0.82-1.07x
# FlashAttention-1's at head dimension 64 and 0.91-0.99x at 128. Past 16k the tables hold their 16k rate (as
# the profiles' do). Nothing here is fitted to the runs.
OWN_ATTENTION = {
    "triton": {
        "a100": {128: [[512, 50], [1024, 61], [2048, 68], [4096, 74], [8192, 78], [16384, 80]],
                 64: [[512, 59], [1024, 75], [2048, 79], [4096, 76], [8192, 79], [16384, 80]]},
        "h100": {128: [[512, 98], [1024, 109], [2048, 108], [4096, 126], [8192, 135], [16384, 137]],
                 64: [[512, 104], [1024, 123], [2048, 136], [4096, 138], [8192, 149], [16384, 156]]},
    },
}


def own_attention(hw, kernel: str | None):
    """`hw` with its profile's attention tables replaced by `kernel`'s (OWN_ATTENTION) for its GPU; `hw` itself
    where the kernel is the launcher's class or its rates on that GPU are not written."""
    from dataclasses import replace

    tables = OWN_ATTENTION.get(kernel or "", {}).get(hw.profile.name.split("-")[0])
    if not tables:
        return hw
    by_dtype = {hd: {"bf16": t, "fp16": t} for hd, t in tables.items()}
    return replace(hw, profile=replace(hw.profile, attention_table=by_dtype[128], attention_head_dim=128.0,
                                       attention_table_by_head_dim={64: by_dtype[64]}))


# A record's `attention_kernel` -> the variant that charges it where no rate table stands for it (OWN_ATTENTION).
ATTENTION_VARIANTS = {"megatron_unfused": "megatron-attention"}


def variant_module(*names: str):
    """steptime.py with each named variant's lines replaced (in order), as its own module."""
    src = Path(steptime.__file__).read_text()
    for name in names:
        for old, new in VARIANTS[name]:
            assert src.count(old) == 1, f"variant {name}: this line of steptime.py changed, update VARIANTS: {old.strip()}"
            src = src.replace(old, new)
    spec = importlib.util.spec_from_loader("steptime_" + "_".join(n.replace("-", "_") for n in names), loader=None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up there
    exec(compile(src, spec.name, "exec"), mod.__dict__)
    return mod


def summary_lines(rows: list[dict]) -> list[str]:
    from compare import summary   # the table's own figures (main put compare's folder on the path)

    def line(name, sel):
        picked = [r for r in rows if sel(r)]
        if not picked:
            return None
        s = summary(picked)
        return (f"  {name:34s} n={s['runs']:3d} within 10% {s['within_10pct']:5.1%} within 20% "
                f"{s['within_20pct']:5.1%} median |err| {s['median_abs_error']:5.1%} "
                f"mean {statistics.mean(r['error'] for r in picked):+6.1%}")
    out = [line("all", lambda r: True)]
    out += [line(f, lambda r, f=f: r["family"] == f) for f in sorted({r["family"] for r in rows})]
    out += [f"  seq {s:6d}: mean error {statistics.mean(r['error'] for r in rows if r['seq'] == s):+6.1%} over "
            f"{sum(r['seq'] == s for r in rows)} runs" for s in sorted({r["seq"] for r in rows})]
    return [x for x in out if x]


def main() -> None:
    sys.path.insert(0, str(HERE))
    import compare as C
    # an attention variant describes the runs that ran that kernel (compare.py's second view), not every run
    names = sys.argv[1:] or [n for n in VARIANTS if n not in ATTENTION_VARIANTS.values()]
    records = yaml.safe_load((HERE / "runs.yaml").read_text())
    print("as committed (the launcher's runtime: eager element-wise operators)")
    print("\n".join(summary_lines(C.compare(records, C.default_model)["rows"])))
    for name in names:
        mod = variant_module(name)
        rows = C.compare(records, lambda sh, st, hw: mod.estimate_step_time(sh, st, hw).tokens_per_s)["rows"]
        print(f"variant {name}")
        print("\n".join(summary_lines(rows)))


if __name__ == "__main__":
    main()
