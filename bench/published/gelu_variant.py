"""Diagnostic, not the benchmark: bench/published/compare.py as committed, then with the gpt blocks' GELU charged as
one fused kernel (what MPT's nn.GELU and Megatron's fused bias-GELU run) instead of the ~8 eager kernels of the
launcher's HF GPT-2 `gelu_new`. The variant is launcher/plan/steptime.py with that one line replaced, loaded as a
separate module; nothing is fitted. bench/published/results.md's "Finding" paragraph quotes its output.

    PYTHONPATH=$PWD .venv/bin/python bench/published/gelu_variant.py
"""
import importlib.util
import statistics
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import compare as C  # noqa: E402
from launcher.plan import steptime  # noqa: E402

EAGER = "        mem(8 * 2 * n * f / t * w, 8)             # tanh-GELU in eager ops (GPT2 gelu_new, bloom_gelu): ~8 kernels\n"
FUSED = ("        mem(2 * n * f / t * w, 1) if shape.arch == 'gpt' else mem(8 * 2 * n * f / t * w, 8)  # variant: fused "
         "GELU for gpt\n")


def variant_module():
    src = Path(steptime.__file__).read_text()
    assert src.count(EAGER) == 1, "the GELU line of block_costs changed: update EAGER"
    spec = importlib.util.spec_from_loader("steptime_fused_gelu", loader=None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up there
    exec(compile(src.replace(EAGER, FUSED), "steptime_fused_gelu", "exec"), mod.__dict__)
    return mod


def report(tag, rows):
    def line(name, sel):
        e = [r["error"] for r in rows if sel(r)]
        a = [abs(x) for x in e]
        return (f"  {name:10s} n={len(e):3d} within 10% {sum(x <= .1 for x in a) / len(a):5.1%} within 20% "
                f"{sum(x <= .2 for x in a) / len(a):5.1%} median |err| {statistics.median(a):5.1%}")
    print(tag)
    print(line("all", lambda r: True))
    print(line("MosaicML", lambda r: r["family"].startswith("mosaicml")))
    print(line("others", lambda r: not r["family"].startswith("mosaicml")))
    for s in sorted({r["seq"] for r in rows}):
        e = [r["error"] for r in rows if r["seq"] == s]
        print(f"  seq {s:6d}: mean error {statistics.mean(e):+6.1%} over {len(e)} runs")


records = yaml.safe_load((HERE / "runs.yaml").read_text())
report("as committed (eager gelu_new, the launcher's runtime)", C.compare(records, C.default_model)["rows"])
fused = variant_module()
report("variant: gpt GELU as one fused kernel", C.compare(records, lambda sh, st, hw: fused.estimate_step_time(sh, st, hw).tokens_per_s)["rows"])
