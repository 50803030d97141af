"""Diagnostic, not the benchmark: bench/published/compare.py as committed, then with every DP/ZeRO transfer exposed
(steptime._overlap_comm forced False), per family and for the Narayanan 2021 rows. No constant is fitted.

    PYTHONPATH=$PWD .venv/bin/python bench/published/overlap_variant.py
"""
import sys, yaml
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import compare as C
from launcher.plan import steptime
recs = yaml.safe_load(open(__import__("pathlib").Path(__file__).parent / "runs.yaml")); recs = recs["runs"] if isinstance(recs, dict) else recs
def summ(tag):
    res = C.compare(recs, C.default_model)["rows"]
    e = [abs(r["error"]) for r in res]
    fam = {}
    for r in res: fam.setdefault(r["family"], []).append(abs(r["error"]))
    print(tag, f"n={len(e)} within10 {sum(x<=.1 for x in e)/len(e):.0%} within20 {sum(x<=.2 for x in e)/len(e):.0%} worst {max(e):.0%}",
          {k: f"{sum(x<=.1 for x in v)}/{len(v)}" for k, v in fam.items()})
    return {r["id"]: r["error"] for r in res}
base = summ("as committed")
# Variant: ZeRO-3 traffic never overlapped (as on CPU ranks)
orig = steptime._overlap_comm
steptime._overlap_comm = lambda hw: False
nov = summ("ZeRO-3/all DP exposed")
steptime._overlap_comm = orig
for k in base:
    if "zero3" in k or "narayanan" in k:
        print(f"  {k[:50]:50s} {base[k]*100:+5.0f}% -> {nov[k]*100:+5.0f}%")
