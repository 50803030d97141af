"""Where a CPU-rank training step's time goes (diagnostic for bench/steptime; not a test).

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/breakdown.py "DP2 ZeRO-0" [...]

Runs `launcher train` for each named layout of run.py with bench/steptime/stepprof on PYTHONPATH: every rank
times forward / backward / step over steps 4-7 and profiles step 8 with torch.profiler (CPU ops, self time).
Prints per rank: the step's wall time, the phases and the minor page faults of a step (minflt, steps 4-7's mean),
the sum of aten self times, and the top ops. STEPPROF_SHAPES=1 splits the ops by input shape; STEPPROF_TOP=N
prints N of them (18). STEPPROF_COLL=1 times every collective of steps 4-7 on every rank and splits the time
inside them into the wait for the last rank and the rest (the transfer).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import HERE, LAUNCHER, LAYOUTS, MEASURE, REPO  # noqa: E402


def main() -> None:
    for name in sys.argv[1:]:
        ranks, extra = LAYOUTS[name]
        profile = HERE / ("profile.yaml" if ranks == 2 else f"profile-{ranks}.yaml")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "prof"
            out.mkdir()
            env = {**os.environ, "STEPPROF_OUT": str(out), "PYTHONPATH": f"{HERE / 'stepprof'}:{REPO}"}
            args = [LAUNCHER, "train", "recipe=tiny", f"cluster.gpus_per_node={ranks}", f"cluster.profile={profile.relative_to(REPO)}",
                    f"runs_dir={tmp}", "run_name=prof", "train.steps=10", *MEASURE, *extra]
            proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
            if proc.returncode:
                print(proc.stderr[-3000:])
                continue
            recs = [json.loads(l) for l in (Path(tmp) / "prof" / "metrics.jsonl").read_text().splitlines()] \
                if (Path(tmp) / "prof" / "metrics.jsonl").exists() else []
            summ = next((r for r in recs if r.get("kind") == "summary"), {})
            steps = [round(r["step_time_s"] * 1e3) for r in recs if r.get("kind") == "train"]
            print(f"== {name}  load {os.getloadavg()}  steps(ms) {steps}  predicted {summ.get('predicted_step_time_s', 0)*1e3:.0f} ms")
            walls = []
            for r in range(ranks):
                ph = json.loads((out / f"rank{r}-phases.json").read_text())
                walls.append(ph["wall"])
                st = json.loads(next(out.glob(f"rank{r}-step*.json")).read_text())
                print(f"rank {r}: threads {st['threads']} phases(ms) " + " ".join((f"{k}={v:.0f}" if k == "minflt" else f"{k}={v*1e3:.1f}") for k, v in ph.items())
                      + f" | profiled step {st['wall_s']*1e3:.0f} ms, all-op self sum {sum(o['self_s'] for o in st['ops'])*1e3:.0f}")
                for o in st["ops"][:int(os.environ.get('STEPPROF_TOP', 18))]:
                    print(f"   {o['op'][:110]:110s} n={o['count']:5d} self={o['self_s']*1e3:7.2f} ms")
            if os.environ.get("STEPPROF_COLL"):
                timed = int(os.environ.get("STEPPROF_STEPS", 4))
                kinds = collectives(out, ranks, timed)
                if kinds:
                    by_term(kinds, sum(walls) / ranks, timed,
                            ["recipe=tiny", f"cluster.gpus_per_node={ranks}", f"cluster.profile={profile}", *extra])


def collectives(out: Path, ranks: int, steps: int) -> dict | None:
    """STEPPROF_COLL=1: per collective kind, per step, the time inside it split into waiting for the last rank to
    arrive and what is left once all have (the transfer). Calls are paired by their order on each rank, which
    holds where every rank of the world calls the same collectives in turn (SP2, DP2, TP2); STEPPROF_GROUP=G pairs
    them within each G consecutive ranks instead (G=2 for TP2 x PP2: a stage's TP pair; G=1 for PP2, whose
    two ranks call different ones)."""
    calls = [json.loads((out / f"rank{r}-colls.json").read_text()) for r in range(ranks)]
    size = int(os.environ.get("STEPPROF_GROUP", ranks))
    groups = [calls[k:k + size] for k in range(0, ranks, size)]
    if any(len({len(c) for c in g}) != 1 for g in groups):
        print("   collectives: the ranks of a group made different numbers of calls; not paired")
        return
    kinds: dict = {}
    for per_rank in (c for g in groups for c in zip(*g)):
        name, nbytes = per_rank[0][0], per_rank[0][3]
        last = max(c[1] for c in per_rank)
        k = kinds.setdefault((name, nbytes), {"n": 0, "inside": 0.0, "wait": 0.0, "after": 0.0})
        k["n"] += 1
        k["inside"] += sum(c[2] - c[1] for c in per_rank) / ranks / 1e9
        k["wait"] += sum(last - c[1] for c in per_rank) / ranks / 1e9
        k["after"] += sum(c[2] - last for c in per_rank) / ranks / 1e9
    # per rank, a step: with groups, each group's calls are counted once per group; divided by the groups so
    # that "a step" stays what one rank does
    for k in kinds.values():
        k["n"] /= len(groups)
    for (name, nbytes), k in sorted(kinds.items(), key=lambda kv: -kv[1]["inside"]):
        print(f"   {name} {nbytes} B: {k['n'] / steps:.0f} a step, inside {k['inside'] / steps * 1e3:.1f} ms a step "
              f"(waiting for the last rank {k['wait'] / steps * 1e3:.1f}, after it arrived {k['after'] / steps * 1e3:.1f}; "
              f"{k['after'] / k['n'] * 1e6:.0f} us a call)")
    return kinds


def by_term(kinds: dict, wall_s: float, steps: int, overrides: list) -> None:
    """The step split three ways, measured (a rank's mean over the timed steps) beside the plan's terms on the same
    profile: outside every collective (compute, Python, the engine) against the plan's compute terms; inside
    the collectives but the pipeline's sends and receives (TP, SP, DP, with the waits for the last rank) against
    tp_comm + sp_comm + dp_comm_exposed + straggler; inside the sends and receives (the pipeline's waits for the
    other stage) against pp_comm + bubble. Where the totals agree and the parts do not, the plan lands by
    compensation."""
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.plan.steptime import estimate_step_time
    from launcher.runtime.metrics import _plan_inputs

    p2p = sum(k["inside"] for (name, _), k in kinds.items() if name in ("send", "recv")) / steps
    coll = sum(k["inside"] for (name, _), k in kinds.items() if name not in ("send", "recv")) / steps
    cfg = compose(overrides)
    t = estimate_step_time(*_plan_inputs(cfg, resolve_layout(cfg))).breakdown()
    plan_compute = sum(t[k] for k in ("gemm", "attention", "memory_bound", "framework", "host_bound", "optimizer",
                                      "engine"))
    plan_coll = sum(t[k] for k in ("tp_comm", "sp_comm", "dp_comm_exposed", "straggler"))
    plan_pipe = t["pp_comm"] + t["bubble"]
    print(f"   by term (ms a step, measured / planned): outside the collectives {(wall_s - p2p - coll) * 1e3:.1f} / "
          f"{plan_compute * 1e3:.1f}; collectives and their waits {coll * 1e3:.1f} / {plan_coll * 1e3:.1f} "
          f"(straggler {t['straggler'] * 1e3:.1f} of it); pipeline sends and receives {p2p * 1e3:.1f} / "
          f"{plan_pipe * 1e3:.1f}; the step {wall_s * 1e3:.1f} / {sum(t.values()) * 1e3:.1f}")


if __name__ == "__main__":
    main()
