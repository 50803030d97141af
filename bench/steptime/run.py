"""Predicted vs measured step time for recipe=tiny on this machine's CPU ranks, after `launcher calibrate`.

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/run.py            # ~10 min on 2 cores
    flock /tmp/heavy.lock .venv/bin/python bench/steptime/run.py --no-calibrate   # reuse bench/steptime/profile.yaml
    .venv/bin/python bench/steptime/run.py --repredict   # the committed planner's prediction beside the recorded runs

1. `launcher calibrate cluster=cpu cluster.gpus_per_node=2 --out bench/steptime/profile.yaml` (and a 4-rank profile,
   profile-4.yaml, for TP2 x PP2, whose 4 ranks share the 2 cores: the collectives are measured at that world size).
2. For each layout, `launcher train recipe=tiny cluster.profile=... <layout> train.steps=STEPS` (no checkpoints,
   no eval, no export), and read the run's end-of-run summary record from metrics.jsonl: the median measured step
   time after 2 warm-up steps beside the plan's prediction (launcher/runtime/metrics.py Throughput.summary).
Writes results.json and the table of results.md here (`--render` redraws it from results.json); the findings
under the table are written by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
LAUNCHER = str(Path(sys.executable).parent / "launcher")

LAYOUTS = {
    "DP2 ZeRO-0": (2, ["parallel.zero_stage=0"]),
    "DP2 ZeRO-1": (2, ["parallel.zero_stage=1"]),
    "DP2 ZeRO-2": (2, ["parallel.zero_stage=2"]),
    "DP2 ZeRO-3": (2, ["parallel.zero_stage=3"]),
    # beyond the list: ZeRO-3 at 4 micro-batches a step, where its per-step and per-micro-batch engine work
    # part (calibrate's probe at 1 and 3 micro-batches a step)
    "DP2 ZeRO-3 mb2": (2, ["parallel.zero_stage=3", "batch.micro_batch_size=2"]),
    "TP2": (2, ["parallel.tensor_degree=2", "parallel.zero_stage=1"]),
    "PP2": (2, ["parallel.pipeline_degree=2", "parallel.zero_stage=1"]),
    "SP2": (2, ["parallel.sequence_degree=2", "parallel.zero_stage=1"]),
    # Megatron sequence parallelism inside TP2 (not in issue 14's list; --search ranks TP + SP layouts)
    "TP2-SP": (2, ["parallel.tensor_degree=2", "parallel.sequence_parallel=true", "parallel.zero_stage=1"]),
    "TP2 x PP2": (4, ["parallel.tensor_degree=2", "parallel.pipeline_degree=2", "parallel.zero_stage=1"]),
    # beyond the list: activation checkpointing, every block and the first 2 of the 4 (model.checkpoint_blocks)
    "DP2 ZeRO-1 ckpt": (2, ["parallel.zero_stage=1", "model.activation_checkpointing=true"]),
    "DP2 ZeRO-1 ckpt first 2": (2, ["parallel.zero_stage=1", "model.activation_checkpointing=true",
                                     "model.checkpoint_blocks=2"]),
    # selective checkpointing (model.checkpoint_mode=selective): the matmuls' outputs kept, element-wise ops recomputed
    "DP2 ZeRO-1 selective": (2, ["parallel.zero_stage=1", "model.activation_checkpointing=true",
                                 "model.checkpoint_mode=selective"]),
}


# What every measured `launcher train` here adds: log each step, no eval, checkpoint or export in the timed loop.
MEASURE = ["scheduler.warmup_steps=2", "logging.log_every=1", "logging.progress_bar=false", "train.eval_every=0",
           "checkpoint.save_every=0", "checkpoint.export_hf=false"]


def on_two_ranks(script: str, extra: list = ()) -> object:
    """Run `script --rank-side OUT [extra]` on 2 local CPU ranks (torchrun, the repository on PYTHONPATH) and return
    the JSON its rank 0 wrote to OUT (layers.py, straggler.py, probe_rounds.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "rank0.json"
        subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2", script,
                        "--rank-side", str(raw), *extra], cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True)
        return json.loads(raw.read_text())


def gather_to_rank0(out: str, record: object) -> None:
    """The rank side's end under on_two_ranks: every rank's `record` gathered, a list in rank order, written as JSON
    to OUT by rank 0 (straggler.py, sync_chain.py)."""
    import torch.distributed as dist

    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, record)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(every))
    dist.barrier()


def replan(doc: dict, edit=lambda profile: profile) -> str:
    """Every run of a results.json document (`doc`) planned again, each pass with its own calibration
    (pass_profiles) passed through `edit` (a profile's YAML dict -> the dict to plan with), in this process (so a
    diagnostic's replacement of a steptime function applies): one line, how many of the runs are within 15% and
    each measured / planned (release_variant.py, operand_bandwidth.py)."""
    import contextlib
    import io

    import yaml

    from launcher.cli import main as cli

    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, profiles in enumerate(doc["pass_profiles"]):
            for ranks, text in profiles.items():
                (Path(tmp) / f"{i}-{ranks}.yaml").write_text(yaml.safe_dump(edit(yaml.safe_load(text))))
            for r in doc["results"]:
                args = [a for a in r["command"].split()[2:] if not a.startswith("cluster.profile=")]
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    cli(["plan", *args, f"cluster.profile={tmp}/{i}-{r['ranks']}.yaml", "--json"])
                ratios.append((r["layout"], r["repeats_measured_s"][i] / json.loads(out.getvalue())["step_time_s"]))
    inside = sum(abs(x - 1) <= 0.15 for _, x in ratios)
    return f"{inside} of {len(ratios)} within 15%; measured / planned " + ", ".join(f"{n} {x:.2f}" for n, x in ratios)


def diagnostic_args() -> argparse.Namespace:
    """The command line of layers.py and straggler.py: --profile, and the hidden --rank-side OUT of on_two_ranks."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="bench/steptime/profile.yaml")
    ap.add_argument("--rank-side", default=None, help=argparse.SUPPRESS)
    return ap.parse_args()


def rounds_args() -> argparse.Namespace:
    """The command line of probe_rounds.py and zero3_rounds.py: --rounds, and the hidden --rank-side OUT of
    on_two_ranks."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rank-side", default=None, help=argparse.SUPPRESS)
    return ap.parse_args()


def probe_rank():
    """On a rank under on_two_ranks, what calibrate's own probes need, set up as _worker sets it up (gloo, glibc's
    step settings): (launcher.runtime.calibrate, torch.distributed, the device, sync, agree)."""
    import torch
    import torch.distributed as dist

    from launcher.runtime import calibrate

    dist.init_process_group("gloo")
    calibrate.recycle_step_buffers("cpu", 0)
    dev = torch.device("cpu")
    return calibrate, dist, dev, calibrate._timer("cpu"), calibrate._agreement(dist, dev)


def calibrate(ranks: int) -> Path:
    out = HERE / ("profile.yaml" if ranks == 2 else f"profile-{ranks}.yaml")
    subprocess.run([LAUNCHER, "calibrate", "cluster=cpu", f"cluster.gpus_per_node={ranks}", "--out", str(out)],
                   cwd=REPO, check=True)
    return out


def train(name: str, ranks: int, extra: list[str], profile: Path, steps: int, runs: Path, env: dict | None = None) -> dict:
    """One layout's `launcher train` (env: the ranks' environment, default this process's) and what its metrics say."""
    args = [LAUNCHER, "train", "recipe=tiny", f"cluster.gpus_per_node={ranks}", f"cluster.profile={profile}",
            f"runs_dir={runs}", f"run_name=bench-{name.replace(' ', '').lower()}", f"train.steps={steps}",
            *MEASURE, *extra]
    started, load_before = time.perf_counter(), os.getloadavg()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"layout": name, "error": proc.stderr[-2000:], "command": " ".join(args[1:])}
    records = [json.loads(l) for l in (runs / f"bench-{name.replace(' ', '').lower()}" / "metrics.jsonl").read_text().splitlines()]
    summary = next(r for r in records if r.get("kind") == "summary")
    trains = [r for r in records if r.get("kind") == "train"]
    steps_s = [r["step_time_s"] for r in trains]
    # peak memory: the largest rank's (CPU: peak RSS) at the last train record, against the plan's peak stage
    peak = max(trains[-1].get("peak_memory_bytes_per_rank") or [trains[-1]["peak_memory_bytes"]])
    return {"layout": name, "ranks": ranks, "command": "launcher " + " ".join(args[1:]).replace(str(runs), "RUNS"),
            "measured_s": summary["step_time_s"], "predicted_s": summary["predicted_step_time_s"],
            "ratio": summary["step_time_over_predicted"], "step_times_s": steps_s, "wall_s": time.perf_counter() - started,
            "peak_memory_bytes": peak, "predicted_peak_memory_bytes": summary["predicted_peak_memory_bytes"],
            "last_step_at": trains[-1]["time"],
            "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
            # off the plan by more than 15%: the GEMM and copy rates the run read after its steps, over the profile's
            "rates_now": summary.get("rates_now"),
            # who used the CPU through the timed steps: the hypervisor (steal), other processes, the run's ranks
            "cpu_share": summary.get("cpu_share")}


def repredict() -> None:
    """Each recorded row's prediction by the planner as committed now (`launcher plan <the row's overrides> --json`,
    same profile), kept as predicted_committed_s beside the prediction the run logged: the measurement is not
    repeated, so a planner fix shows against the same measured steps."""
    doc = json.loads((HERE / "results.json").read_text())
    for r in doc["results"]:
        if "error" in r:
            continue
        overrides = r["command"].split()[2:]   # "launcher train <overrides>"
        out = subprocess.run([LAUNCHER, "plan", *overrides, "--json"], cwd=REPO, capture_output=True, text=True, check=True)
        r["predicted_committed_s"] = json.loads(out.stdout)["step_time_s"]
        print(f"{r['layout']}: logged {r['predicted_s'] * 1e3:.0f} ms, committed planner {r['predicted_committed_s'] * 1e3:.0f} ms")
    doc["repredicted"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    (HERE / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    render()


def render() -> None:
    doc = json.loads((HERE / "results.json").read_text())
    m = doc["machine"]
    lines = ["| layout | ranks | measured median step (ms) | repeats (ms) | load avg (1 min) before-after | "
             "predicted at run time, each repeat (ms) | predicted, committed model (ms) | measured / predicted, each repeat | within 15% | "
             "peak memory (largest rank's peak RSS) / planned, each repeat | "
             "off the plan: GEMM / copy rate read after the steps over the profile's, each repeat | "
             "CPU time through the timed steps, hypervisor (steal) / other processes, each repeat |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        if "error" in r:
            lines.append(f"| {r['layout']} | | failed | | | | | | | | | |")
            continue
        # without --repredict: the last pass's prediction, whose profile is the one committed (the row's own run
        # may be an earlier pass's, predicted from that pass's calibration)
        now = r.get("predicted_committed_s", r.get("repeats_predicted_s", [r["predicted_s"]])[-1])
        if doc.get("calibrate_each_pass"):   # each pass against the profile calibrated just before it
            ratios = [x / p for x, p in zip(r["repeats_measured_s"], r["repeats_predicted_s"])]
        else:
            ratios = [x / now for x in r.get("repeats_measured_s", [r["measured_s"]])]
        reps = ", ".join(f"{x * 1e3:.0f}" for x in r.get("repeats_measured_s", [r["measured_s"]]))
        loads = ", ".join(f"{a:.1f}-{b:.1f}" for a, b in r.get("repeats_load_avg", []))
        at_run = ", ".join(f"{x * 1e3:.0f}" for x in r.get("repeats_predicted_s", [r["predicted_s"]]))
        lines.append(f"| {r['layout']} | {r['ranks']} | {r['measured_s'] * 1e3:.0f} | {reps} | {loads} | {at_run} | "
                     f"{now * 1e3:.0f} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                     f"{', '.join('yes' if abs(x - 1) <= 0.15 else 'no' for x in ratios)} | "
                     f"{', '.join(f'{x:.2f}' for x in r.get('repeats_memory_ratio', [])) or 'not recorded'} | "
                     f"{rates_cell(r)} | {cpu_share_cell(r)} |")
    cmds = "\n".join(f"    {r['command']}" for r in doc["results"] if "command" in r)
    table = "\n".join(lines) + calibration_spread(doc.get("pass_profiles", []))
    held = ("calibrated again before every pass, each repeat held to the prediction from its own pass's profile "
            "(pass_profiles in results.json)" if doc.get("calibrate_each_pass")
            else "each repeat held to the committed model and profile")
    text = (HERE / "results.md").read_text() if (HERE / "results.md").exists() else ""
    head = (f"<!-- table: generated by bench/steptime/run.py --render -->\n"
            f"Machine: {m['cpus']} CPU cores, {m['platform']}, Python {m['python']}, torch {m['torch']}; gloo; "
            f"load average at the end {', '.join(f'{x:.1f}' for x in m['load_avg_at_end'])}. "
            f"{doc['steps']} steps per run, median after 2 warm-up steps; every layout run {doc.get('repeat', 1)} time(s) (all layouts, then again{' in reverse order' if doc.get('reversed_passes') else ''}); "
            f"the measured column is the faster repeat's median (the lower middle), the repeats column all of them"
            f"; {held}"
            f"{'; the committed-model predictions recomputed ' + doc['repredicted'] + ' (--repredict)' if 'repredicted' in doc else ''}.\n\n{table}\n\nCommands (RUNS = a temporary directory):\n\n{cmds}\n"
            f"<!-- end table -->\n")
    if "<!-- end table -->" in text:
        pre, rest = text.split("<!-- table:", 1)
        text = pre + head + rest.split("<!-- end table -->\n", 1)[1]
    else:
        text = "# Predicted vs measured step time, recipe=tiny on CPU ranks\n\n" + head
    (HERE / "results.md").write_text(text)


def rates_cell(row: dict) -> str:
    """Each repeat's rates read after the steps over the profile's (GEMM / copy), '-' where the run was on its plan
    (launcher train measures them only off it); 'not recorded' for rows from before the check existed."""
    if "repeats_rates_now" not in row:
        return "not recorded"
    return ", ".join(f"{x['gemm_over_profile']:.2f} / {x['memory_over_profile']:.2f}" if x else "-"
                     for x in row["repeats_rates_now"])


def cpu_share_cell(row: dict) -> str:
    """Each repeat's share of the machine's CPU time through its timed steps taken by the hypervisor and by other
    processes (launcher train's summary cpu_share); 'not recorded' for rows from before the summary had it."""
    if "repeats_cpu_share" not in row:
        return "not recorded"
    return ", ".join(f"{x['steal_fraction']:.0%} / {x['others_fraction']:.0%}" if x else "-"
                     for x in row["repeats_cpu_share"])


def calibration_spread(pass_profiles: list) -> str:
    """A line under the table: each pass's calibrations, the copy bandwidth of their three sweeps
    (measurements.sweep_spread, kept by calibrate since 2026-11-29) and whether calibrate called the machine busy."""
    import yaml

    parts = []
    for i, profiles in enumerate(pass_profiles):
        for ranks, text in sorted(profiles.items()):
            spread = (yaml.safe_load(text).get("measurements") or {}).get("sweep_spread")
            if spread:
                busy = " (calibrate: busy)" if "The machine was busy" in text else ""
                parts.append(f"pass {i + 1} {ranks} ranks {', '.join(f'{x:.1f}' for x in spread['memory_gbps'])}{busy}")
    return ("\n\nCalibrations' copy bandwidth by sweep (GB/s): " + "; ".join(parts) + ".") if parts else ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-calibrate", action="store_true")
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--repeat", type=int, default=1, help="run every layout this many times (all layouts, then again in reverse order)")
    ap.add_argument("--calibrate-each-pass", action="store_true",
                    help="calibrate again before every pass, so each pass is predicted from rates measured minutes before")
    ap.add_argument("--render", action="store_true", help="only redraw results.md's table from results.json")
    ap.add_argument("--repredict", action="store_true", help="recompute the committed planner's predictions, then render")
    args = ap.parse_args()
    if args.render:
        return render()
    if args.repredict:
        return repredict()
    import torch

    profiles = {2: HERE / "profile.yaml", 4: HERE / "profile-4.yaml"}
    runs: dict = {}
    pass_profiles = []
    for rep in range(args.repeat):
        if not args.no_calibrate and (rep == 0 or args.calibrate_each_pass):
            profiles = {r: calibrate(r) for r in (2, 4)}
        pass_profiles.append({r: p.read_text() for r, p in profiles.items()})
        # Every other pass in reverse order: a machine that slows as a pass goes on then shows as a drift
        # within the pass, not as the last layouts' error.
        for name, (ranks, extra) in (reversed(LAYOUTS.items()) if rep % 2 else LAYOUTS.items()):
            if args.only and name not in args.only:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                r = train(name, ranks, extra, profiles[ranks].relative_to(REPO), args.steps, Path(tmp))
            print(json.dumps({k: v for k, v in r.items() if k != "step_times_s"}), flush=True)
            runs.setdefault(name, []).append(r)
    results = []
    for name, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            results.append(rs[0])
            continue
        # The row: the run whose median step is the median of the repeats (the lower middle one for an even count).
        ok.sort(key=lambda r: r["measured_s"])
        row = dict(ok[(len(ok) - 1) // 2])
        row["repeats_measured_s"] = [r["measured_s"] for r in rs if "error" not in r]
        row["repeats_predicted_s"] = [r["predicted_s"] for r in rs if "error" not in r]
        row["repeats_load_avg"] = [[r["load_avg_before"][0], r["load_avg_after"][0]] for r in rs if "error" not in r]
        row["repeats_memory_ratio"] = [r["peak_memory_bytes"] / r["predicted_peak_memory_bytes"] for r in rs if "error" not in r]
        row["repeats_rates_now"] = [r["rates_now"] for r in rs if "error" not in r]
        row["repeats_cpu_share"] = [r.get("cpu_share") for r in rs if "error" not in r]
        results.append(row)
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               "torch": torch.__version__, "load_avg_at_end": os.getloadavg()}
    old = json.loads((HERE / "results.json").read_text()) if (HERE / "results.json").exists() and args.only else {}
    merged = {r["layout"]: r for r in old.get("results", [])} | {r["layout"]: r for r in results}
    (HERE / "results.json").write_text(json.dumps({"machine": machine, "steps": args.steps, "repeat": args.repeat,
                                                   "calibrate_each_pass": args.calibrate_each_pass, "reversed_passes": True,
                                                   "pass_profiles": pass_profiles,
                                                   "results": list(merged.values())}, indent=1) + "\n")
    render()


if __name__ == "__main__":
    main()
