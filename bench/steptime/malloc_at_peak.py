"""Where a CPU rank's peak RSS goes beyond the plan: glibc's heap, in use and free, at the moment of the peak.

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/malloc_at_peak.py                # ~3 min on 2 cores
    flock /tmp/heavy.lock .venv/bin/python bench/steptime/malloc_at_peak.py --profiles bench/steptime/xeon-amx-2026-12-04 TP2

The plan's peak for a CPU rank is calibrate's process_bytes (what a rank of a near-zero model holds after its first
steps) plus the live tensors its terms count (launcher/plan/memory.py); recipe=tiny's layouts read 1.11-1.23x that in
peak RSS (bench/steptime/xeon-amx-2026-12-04). This runs each layout of run.py's LAYOUTS (ZeRO-3 left out: its
gather buffers are mapped past glibc's 4 MiB threshold and mallinfo2 counts a mapping whole, touched or not) as
`launcher train` with a `sitecustomize` on PYTHONPATH that samples each rank's RSS (/proc/self/statm) every 2 ms
and, each time it reaches a new high, glibc's mallinfo2 (bytes in use, free in the heaps, mapped). It reports, per
rank, the sample of the highest RSS before the last train record: the heap's bytes in use and free there, and the
rest of the RSS (the touched pages of glibc's mapped chunks, the interpreter's own arenas, code and libraries).
Mapped chunks are counted whole by mallinfo2 (DeepSpeed's ZeRO 1/2 reduce bucket, 5e8 elements of torch.empty, is
~1.9 GB of them, barely touched), so they are shown as mapped and the rest is RSS less the heap.
Diagnostic: nothing in the launcher reads it.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import LAYOUTS, REPO, train  # noqa: E402  (bench/ is not a package)

HOOK = r'''
import ctypes, json, os, threading, time
if os.environ.get("LOCAL_RANK") is not None and os.environ.get("MALLOC_AT_PEAK_OUT"):
    class _MI2(ctypes.Structure):    # struct mallinfo2 (malloc.h, glibc >= 2.33)
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
    _mallinfo2 = ctypes.CDLL(None).mallinfo2
    _mallinfo2.restype = _MI2
    _page = os.sysconf("SC_PAGE_SIZE")
    _highs = []
    _out = os.path.join(os.environ["MALLOC_AT_PEAK_OUT"], "rank%s.json" % os.environ["RANK"])

    def _rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _page

    def _sample():
        # the ranks leave through os._exit (no atexit): the highs are written as they come (at most every 0.25 s,
        # and only when there is a new one), atomically
        last, top, written = 0.0, 0, 0
        while True:
            r = _rss()
            if r > top:
                m = _mallinfo2()
                top = r
                _highs.append({"t": time.time(), "rss": r, "in_use": m.uordblks, "free": m.fordblks,
                               "free_top": m.keepcost, "mapped": m.hblkhd})
            if len(_highs) > written and time.time() - last > 0.25:
                last, written = time.time(), len(_highs)
                with open(_out + ".tmp", "w") as f:
                    json.dump(_highs, f)
                os.replace(_out + ".tmp", _out)
            time.sleep(0.002)
    threading.Thread(target=_sample, daemon=True).start()
'''


def measure(name: str, ranks: int, extra: list[str], profile: Path, work: Path, hook: Path) -> dict:
    """run.py's `launcher train` of one layout with the sampler in its ranks; per rank, the last high before its
    last train record."""
    out = work / name.replace(" ", "_")
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(hook), "MALLOC_AT_PEAK_OUT": str(out)}
    run = train(name, ranks, extra, profile, 14, work / "runs", env)
    if "error" in run:
        raise SystemExit(f"{name}: launcher train failed:\n{run['error']}")
    rows = [[h for h in json.loads(path.read_text()) if h["t"] <= run["last_step_at"]][-1]
            for path in sorted(out.glob("rank*.json"))]
    return {"layout": name, "planned": run["predicted_peak_memory_bytes"], "ranks": rows}


def main() -> None:
    args = sys.argv[1:]
    profiles = REPO / "bench/steptime"      # profile.yaml, profile-4.yaml (run.py's), or --profiles DIR's
    if args[:1] == ["--profiles"]:
        profiles, args = Path(args[1]).resolve(), args[2:]
    names = args or [n for n in LAYOUTS if "ZeRO-3" not in n]
    M = 2 ** 20
    print("MiB at each rank's highest RSS before the last train record: RSS = heap in use + heap free + the rest")
    print(f"profiles: {profiles.relative_to(REPO)}")
    print("| layout | planned | rank | RSS | over plan | heap in use | heap free (at the top) | mapped (virtual) | the rest |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        hook = Path(tmp) / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK)
        for name in names:
            ranks, extra = LAYOUTS[name]
            profile = profiles / ("profile-4.yaml" if ranks == 4 else "profile.yaml")
            r = measure(name, ranks, extra, profile, Path(tmp), hook)
            for i, h in enumerate(r["ranks"]):
                rest = h["rss"] - h["in_use"] - h["free"]
                print(f"| {name} | {r['planned'] / M:.0f} | {i} | {h['rss'] / M:.0f} | {(h['rss'] - r['planned']) / M:+.0f} "
                      f"| {h['in_use'] / M:.0f} | {h['free'] / M:.0f} ({h['free_top'] / M:.0f}) | {h['mapped'] / M:.0f} "
                      f"| {rest / M:.0f} |", flush=True)


if __name__ == "__main__":
    main()
