"""Diagnostics, not the benchmark: bench/published/compare.py as committed, then with the planner's element-wise
operators charged as the fused kernels many published runs used instead of the eager ones the launcher's runtime
(transformers' modules) runs. Each variant is launcher/plan/steptime.py with named lines replaced, loaded as a
separate module; nothing is fitted. The readings in compare.py quote this output.

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
}


# A record's `elementwise_kernels: fused` (runs.yaml) -> the variant that charges its architecture's fused kernels
# (compare.py's second view). BLOOM has none written: its one run is charged as the launcher's runtime either way.
FUSED_BY_ARCH = {"llama": "fused-llama", "gpt": "fused-gelu"}


def variant_module(name: str):
    """steptime.py with the variant's lines replaced, as its own module."""
    src = Path(steptime.__file__).read_text()
    for old, new in VARIANTS[name]:
        assert src.count(old) == 1, f"variant {name}: this line of steptime.py changed, update VARIANTS: {old.strip()}"
        src = src.replace(old, new)
    spec = importlib.util.spec_from_loader(f"steptime_{name.replace('-', '_')}", loader=None)
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
    names = sys.argv[1:] or list(VARIANTS)
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
