"""Loop overhead and data benchmarks of `launcher train` (issue 3). Results: bench/results/train_overhead.json.

    PYTHONPATH=$PWD .venv/bin/python bench/train_overhead.py [--steps 110] [--repeats 6]

1. tokens/s of `launcher train recipe=tiny` against bench/minimal_ds_loop.py and against HF Trainer
   (bench/hf_trainer_loop.py; same model, DeepSpeed JSON, data and batch; 2 CPU ranks), launched
   alternately (A B C, B C A, C A B, ...) so load from other processes hits all alike. Needs
   `pip install -e '.[bench]'`. Throughput per run is measured over a wall-clock window after 10 warm-up
   steps; the headline ratios are medians of the per-repeat paired ratios (with their min and max).
2. where rank 0 of each of the three loops spends its wall time (py-spy): the share
   outside DeepSpeed's forward/backward/step is each loop's own overhead, measured inside one run.
3. data wait as a fraction of step time, from launcher train's own metrics.jsonl.
4. pretokenization: BPE training time and encoding tokens/s on a fresh cache (data.max_bytes of the stdlib).
"""

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARMUP_STEPS = 10  # steps left out of every measurement (allocator and gloo warm-up)
sys.path.insert(0, str(REPO))


def env():
    e = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return e


def run_launcher(overrides, runs_dir, name):
    """`launcher train` (its own torchrun, RankWatch and all); (step times, step end wall times, data wait fraction)."""
    result = subprocess.run([sys.executable, "-m", "launcher", "train", *overrides, f"runs_dir={runs_dir}", f"run_name={name}"],
                            cwd=REPO, env=env(), capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"launcher train failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    recs = [json.loads(x) for x in (Path(runs_dir) / name / "metrics.jsonl").read_text().splitlines() if x]
    recs = [r for r in recs if r["kind"] == "train"][WARMUP_STEPS:]
    wait = sum(r["data_wait_s"] for r in recs) / sum(r["step_time_s"] for r in recs)
    return [r["step_time_s"] for r in recs], [r["time"] for r in recs], wait


def run_baseline(script, overrides, out):
    """bench/minimal_ds_loop.py or bench/hf_trainer_loop.py on 2 CPU ranks; (step times, step end wall times)."""
    for attempt in range(2):
        result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                 str(REPO / "bench" / script), str(out), *overrides],
                                cwd=REPO, env=env(), capture_output=True, text=True)
        if result.returncode == 0:
            break
        # The baselines are not the product: one failed launch is retried, and recorded with its stderr.
        BASELINE_FAILURES.append({"script": script, "exit": result.returncode, "stderr_tail": result.stderr[-1500:]})
        print(f"{script} failed (exit {result.returncode}), attempt {attempt + 1}:\n{result.stderr[-3000:]}", flush=True)
    else:
        raise SystemExit(f"{script} failed twice")
    got = json.loads(Path(out).read_text())
    return got["step_times"][WARMUP_STEPS:], got["step_ends"][WARMUP_STEPS:]


BASELINE_FAILURES: list[dict] = []


def window_tokens_per_s(ends, tokens_per_step):
    """Throughput over the measured window, from wall-clock step ends: everything between steps counts
    (logging, metrics, progress bar), not only what a loop's own step timer covers."""
    return tokens_per_step * (len(ends) - 1) / (ends[-1] - ends[0])


# A rank-0 sample inside one of the DeepSpeed engine calls is training work every loop does; any other sample
# inside the loop is that loop's own overhead. py-spy names frames "Class.method (package/relative/path.py:line)".
ENGINE_FRAMES = tuple(f"{fn} (deepspeed/runtime/{f}:" for fn, f in
                      (("DeepSpeedEngine.forward", "engine.py"), ("DeepSpeedEngine.backward", "engine.py"),
                       ("DeepSpeedEngine.step", "engine.py"), ("PipelineEngine.train_batch", "pipe/engine.py")))
LOOP_FRAMES = {"launcher": "run (launcher/train.py:", "minimal": "<module> (", "hf_trainer": "Trainer._inner_training_loop (transformers/trainer.py:"}
BASELINE_SCRIPTS = {"minimal": "minimal_ds_loop.py", "hf_trainer": "hf_trainer_loop.py"}
PROFILE_STEPS = 300  # outlasts warm-up + the sampling window on this machine (~0.14 s a step)


def pyspy_path():
    import shutil

    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if Path(found).exists() else None


def rank0_pid(torchrun_pid: int, deadline: float) -> int:
    """The worker of a torchrun process tree whose environment says RANK=0."""
    while time.time() < deadline:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) != torchrun_pid:
                    continue
                if b"\0RANK=0\0" in b"\0" + (stat.parent / "environ").read_bytes():
                    return int(stat.parent.name)
            except (OSError, ValueError, IndexError):
                continue
        time.sleep(0.2)
    raise SystemExit("no rank 0 found under torchrun")


def in_loop(loop: str, frame: str) -> bool:
    if loop == "minimal":  # a script's top level: its loop is the module itself
        return frame.startswith(LOOP_FRAMES[loop]) and f"{BASELINE_SCRIPTS[loop]}:" in frame
    return frame.startswith(LOOP_FRAMES[loop])


def profile_rank0(loop: str, overrides, tmp: Path, seconds: int = 15):
    """Where rank 0 of a loop spends its wall time in the steady state, sampled with py-spy.

    `py-spy record --idle --nonblocking` on rank 0 for `seconds` once step 10 is done: every sample is a
    wall-clock moment, waiting in a collective included. Samples inside the loop (LOOP_FRAMES) either sit in a
    DeepSpeed engine call (forward/backward/step, the work every loop does) or elsewhere: for `launcher train`
    its data fetch, loss agreement, metrics and logging; for the Trainer its DataLoader, collator, callbacks,
    bookkeeping. That share is the loop's own overhead, measured inside one run, so it does not depend on the
    machine's speed drifting between runs as the A/B ratios do. None without py-spy (pip install -e '.[bench]').
    """
    pyspy = pyspy_path()
    if pyspy is None:
        return None
    args = [o for o in overrides if not o.startswith("train.steps=")] + [f"train.steps={PROFILE_STEPS}"]
    ready = tmp / f"{loop}.ready"
    if loop == "launcher":
        from launcher.runtime.launch import read_rank_records

        cmd = [sys.executable, "-m", "launcher", "train", *args, f"runs_dir={tmp}", "run_name=profiled"]
        metrics = tmp / "profiled" / "metrics.jsonl"
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(REPO / "bench" / BASELINE_SCRIPTS[loop]), str(tmp / f"{loop}_profiled.json"), *args]
    log = tmp / f"{loop}.profiled.log"
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(env(), BENCH_READY_FILE=str(ready)),
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    deadline = time.time() + 300
    if loop == "launcher":
        while proc.poll() is None and not (metrics.exists() and len(metrics.read_text().splitlines()) > WARMUP_STEPS):
            time.sleep(0.2)
        pid = read_rank_records(tmp / "profiled" / "ranks")[0]["pid"]
    else:
        pid = rank0_pid(proc.pid, deadline)
        while proc.poll() is None and not ready.exists() and time.time() < deadline:
            time.sleep(0.2)
    raw = tmp / f"{loop}.pyspy"
    subprocess.run([pyspy, "record", "--idle", "--nonblocking", "--rate", "250", "--duration", str(seconds),
                    "--format", "raw", "--output", str(raw), "--pid", str(pid)], check=True, capture_output=True)
    if proc.wait() != 0:
        raise RuntimeError(f"profiled {loop} run failed (exit {proc.returncode}): {log.read_text()[-1500:]}")
    engine = other = 0
    by_frame: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not any(in_loop(loop, f) for f in frames):
            continue  # outside the training loop
        if any(f.startswith(ENGINE_FRAMES) for f in frames):
            engine += int(count)
            continue
        other += int(count)
        loop_at = max(i for i, f in enumerate(frames) if in_loop(loop, f))
        where = frames[min(loop_at + 1, len(frames) - 1)]  # what the loop called
        by_frame[where] = by_frame.get(where, 0) + int(count)
    total = engine + other
    return {"samples_in_loop": total, "in_deepspeed_engine_calls": engine / total, "loop_overhead": other / total,
            "overhead_by_call": {k: v / total for k, v in sorted(by_frame.items(), key=lambda kv: -kv[1])[:8]},
            "method": f"py-spy record --idle --nonblocking --rate 250 on rank 0 for {seconds} s after step {WARMUP_STEPS}"}


def profile_all(overrides, tmp: Path) -> dict:
    """profile_rank0 of every loop; a failed baseline launch is retried once and recorded in BASELINE_FAILURES.

    A failed `launcher train` is not retried (as in run_launcher): it is the product, its failure is a finding.
    """
    out = {}
    for loop in LOOP_FRAMES:
        if loop == "launcher":
            out[loop] = profile_rank0(loop, overrides, tmp)
            continue
        for _ in range(2):
            try:
                out[loop] = profile_rank0(loop, overrides, tmp)
                break
            except RuntimeError as exc:
                BASELINE_FAILURES.append({"script": f"profile of {loop}", "error": str(exc)})
                out[loop] = None
    return out


def implied(profile, baseline: str):
    """tokens/s ratio the two loops' overhead shares imply when their DeepSpeed calls take the same time a step."""
    if profile["launcher"] is None or profile[baseline] is None:
        return None
    return (1 - profile["launcher"]["loop_overhead"]) / (1 - profile[baseline]["loop_overhead"])


def pretokenize_bench(max_bytes):
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.runtime import data

    with tempfile.TemporaryDirectory() as cache:
        cfg = compose(["recipe=tiny", f"data.max_bytes={max_bytes}", f"data.cache_dir={cache}"])
        layout = resolve_layout(cfg)
        t0 = time.perf_counter()
        docs = data.read_documents(cfg)
        t_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        prepared = data.prepare_data(cfg, layout)  # trains the BPE and pretokenizes
        t_total = time.perf_counter() - t0
        t0 = time.perf_counter()
        data.train_tokenizer(docs, cfg.model.vocab_size)  # timed alone, to take it out of the pretokenization rate
        t_bpe = time.perf_counter() - t0
    return {"corpus_bytes": sum(len(t.encode()) for _, t in docs), "documents": len(docs), "tokens": prepared.num_tokens,
            "read_s": t_read, "bpe_train_s": t_bpe, "prepare_total_s": t_total,
            "pretokenize_tokens_per_s": prepared.num_tokens / max(1e-9, t_total - t_bpe - t_read)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=110)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--pretok-bytes", type=int, default=8_000_000)
    ap.add_argument("--profile-only", action="store_true", help="only the py-spy profiles of the three loops")
    args = ap.parse_args()
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout

    overrides = ["recipe=tiny", f"train.steps={args.steps}", "train.eval_every=0", "checkpoint.save_every=0",
                 "checkpoint.export_hf=false", "logging.log_every=1", "logging.progress_bar=false"]
    tokens_per_step = resolve_layout(compose(overrides)).tokens_per_step
    if args.profile_only:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps({"profiles": profile_all(overrides, Path(tmp)), "failures": BASELINE_FAILURES}, indent=2))
        return
    pooled = {"launcher": [], "minimal": [], "hf_trainer": []}
    load_before = os.getloadavg()  # the benchmark means something only on an otherwise idle machine
    per_run, wait_fracs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            runs = {
                "launcher": lambda: run_launcher(overrides, tmp, f"bench{i}"),
                **{b: functools.partial(run_baseline, script, overrides, Path(tmp) / f"{b}{i}.json")
                   for b, script in BASELINE_SCRIPTS.items()},
            }
            order = list(runs)[i % 3:] + list(runs)[:i % 3]  # rotate: no loop always runs first or last
            row = {"order": order}
            for name in order:
                got = runs[name]()
                times, ends = got[0], got[1]
                if name == "launcher":
                    wait_fracs.append(got[2])
                pooled[name] += times
                row[name] = {"median_step_s": statistics.median(times), "window_tokens_per_s": window_tokens_per_s(ends, tokens_per_step)}
            row["launcher_vs_minimal"] = row["launcher"]["window_tokens_per_s"] / row["minimal"]["window_tokens_per_s"]
            row["launcher_vs_hf_trainer"] = row["launcher"]["window_tokens_per_s"] / row["hf_trainer"]["window_tokens_per_s"]
            per_run.append(row)
            print(json.dumps(row), flush=True)
        profile = profile_all(overrides, Path(tmp))
    ratios_min = [r["launcher_vs_minimal"] for r in per_run]
    ratios_hf = [r["launcher_vs_hf_trainer"] for r in per_run]
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "note": "2-core VM, no GPU",
                    "loadavg_1_5_15min_before": load_before},
        "config": f"recipe=tiny (LLaMA, ZeRO-2, fp32, 2 CPU ranks gloo, {tokens_per_step} tokens/step)",
        "method": (f"A B C rotated per repeat; per run, tokens/s over the wall-clock window from the end of step {WARMUP_STEPS + 1} "
                   "to the last step (everything between steps counts); headline = median over repeats of the paired "
                   "per-repeat ratios. median_step_s = median of each loop's own step timer, pooled."),
        "steps_per_run": args.steps, "repeats": args.repeats,
        "median_step_s": {k: statistics.median(v) for k, v in pooled.items()},
        "launcher_vs_minimal": {"median": statistics.median(ratios_min), "min": min(ratios_min), "max": max(ratios_min), "target": 0.98},
        "launcher_vs_hf_trainer": {"median": statistics.median(ratios_hf), "min": min(ratios_hf), "max": max(ratios_hf), "target": 1.1},
        "per_run": per_run,
        "baseline_launch_failures": BASELINE_FAILURES,
        "data_wait_fraction": max(wait_fracs),
        "rank0_wall_time_profile": profile,
        # The overhead shares bound the ratios without run-to-run drift: a loop's tokens/s is (its share of time in
        # DeepSpeed's calls) x (their speed), and the calls are the same code on the same model and data.
        "profile_implied_launcher_vs_minimal": implied(profile, "minimal"),
        "profile_implied_launcher_vs_hf_trainer": implied(profile, "hf_trainer"),
        "pretokenization": pretokenize_bench(args.pretok_bytes),
    }
    out = REPO / "bench/results/train_overhead.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
