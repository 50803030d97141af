"""Tables for results.md from bench/build/results/*.json: `.venv/bin/python bench/build/summarize.py`."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent / "results"
GIB = 2**30


def rng(values, fmt="{:.2f}"):
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def build_table():
    print("| code | size | layout | params held / rank | build s | HWM built GiB | HWM before step | RSS before step | HWM after step | step s | loss | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    def order(f):   # before/after, then model size (HIDDENxLAYERS), then layout
        _, code, size, mode = f.stem.split("-", 3)
        return code, int(size.split("x")[0]) if "x" in size else 10**9, mode

    def load(f):   # the 1-minute load average at the start and end of the run (run_build.sh), where recorded
        lf = f.with_name(f.name + ".load")
        if not lf.exists():
            return "-"
        d = json.loads(lf.read_text())
        return f"{d['load_start']:.1f} -> {d['load_end']:.1f}"

    for f in sorted(HERE.glob("build-*.json"), key=order):
        _, code, size, mode = f.stem.split("-", 3)
        r = json.loads(f.read_text())["ranks"]
        print(f"| {code} | {size} | {mode} | {rng([x['params_held'] / 1e6 for x in r], '{:.1f}')}M | {rng([x['build_s'] for x in r], '{:.1f}')} "
              f"| {rng([x['hwm_built'] / GIB for x in r])} | {rng([x['hwm_before_step'] / GIB for x in r])} "
              f"| {rng([x.get('rss_before_step', 0) / GIB for x in r])} | {rng([x['hwm_after_step'] / GIB for x in r])} "
              f"| {rng([x['step_s'] for x in r], '{:.1f}')} | {rng([x['loss'] for x in r], '{:.4f}')} | {load(f)} |")


def zero3_traces():
    for f in sorted(HERE.glob("build-*zero3*.json")):
        if f.stem.startswith("build-before"):
            continue
        r = json.loads(f.read_text())["ranks"][0]
        if not r.get("zero3_trace"):
            continue
        print(f"\n{f.stem}, rank 0: RSS at deepspeed.initialize {r['rss_built'] / GIB:.3f} GiB (HWM {r['hwm_built'] / GIB:.3f})\n")
        print("| DeepSpeed step (stage3.py) | RSS before | RSS after | HWM after |")
        print("|---|---|---|---|")
        for t in r["zero3_trace"]:
            print(f"| {t['step']} | {t['rss_before'] / GIB:.3f} | {t['rss_after'] / GIB:.3f} | {t['hwm_after'] / GIB:.3f} |")


def resume_table():
    print("| code | layout | HWM before load | HWM after load | RSS after load | read whole GiB (files) | load s | loss after |")
    print("|---|---|---|---|---|---|---|---|")
    for f in sorted(HERE.glob("resume-*.json")):
        code = f.stem.split("-")[1]
        d = json.loads(f.read_text())
        r = d["ranks"]

        def whole(x):
            files = x["files"]
            if files and len(files[0]) == 3:
                files = [fl for fl in files if not fl[2]]
            return sum(fl[1] for fl in files) / GIB, len(files)

        print(f"| {code} | {d['mode']} | {rng([x['hwm_before_load'] / GIB for x in r])} | {rng([x['hwm_after_load'] / GIB for x in r])} "
              f"| {rng([x['rss_after_load'] / GIB for x in r])} | {rng([whole(x)[0] for x in r])} ({rng([whole(x)[1] for x in r], '{}')}) "
              f"| {rng([x['load_s'] for x in r], '{:.1f}')} | {rng([x['loss'] for x in r], '{:.4f}')} |")


if __name__ == "__main__":
    build_table()
    zero3_traces()
    print()
    resume_table()
