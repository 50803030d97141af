"""Diagnostic (bench/steptime/breakdown.py): when STEPPROF_OUT is set, every training rank profiles steps
PROFILE_FROM..PROFILE_FROM+PROFILE_STEPS-1 with torch.profiler and writes its op table and phase timings there.
Put on PYTHONPATH only by breakdown.py; nothing in launcher/ imports it."""
import os

if os.environ.get("STEPPROF_OUT") and os.environ.get("LOCAL_RANK") is not None:
    import json
    import resource
    import time

    import launcher.train as T

    FROM, N = int(os.environ.get("STEPPROF_FROM", 4)), int(os.environ.get("STEPPROF_STEPS", 4))
    calls = {"n": 0}
    phases: dict = {}
    colls: list = []

    def timed(obj, name, record):
        """Wrap obj.name; record(name, entry ns, exit ns, args) for the calls of steps FROM..FROM+N-1."""
        fn = getattr(obj, name)

        def wrapper(*a, **k):
            t0 = time.monotonic_ns()
            try:
                return fn(*a, **k)
            finally:
                if FROM <= calls["n"] < FROM + N:
                    record(name, t0, time.monotonic_ns(), a or tuple(k.values()))
        setattr(obj, name, wrapper)

    def phase(name, t0, t1, args):
        phases[name] = phases.get(name, 0.0) + (t1 - t0) / 1e9

    def wrap(step_fn):
        def prof_step(engine, *a, **k):
            import torch
            if calls["n"] == 0:
                for name in ("forward", "backward", "step", "train_batch"):
                    if hasattr(engine, name):
                        timed(engine, name, phase)
            i = calls["n"]
            if i != FROM + N:   # steps FROM..FROM+N-1: phase timers only; step FROM+N: under the profiler
                t0, f0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                out = step_fn(engine, *a, **k)
                if FROM <= i:
                    phases["wall"] = phases.get("wall", 0.0) + time.perf_counter() - t0
                    # minor page faults: first touches of memory the allocator took fresh from the kernel
                    phases["minflt"] = phases.get("minflt", 0.0) + resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
                calls["n"] += 1
                if i == FROM + N - 1:
                    with open(f"{os.environ['STEPPROF_OUT']}/rank{os.environ['RANK']}-phases.json", "w") as f:
                        json.dump({k: v / N for k, v in phases.items()}, f)
                    if colls:
                        with open(f"{os.environ['STEPPROF_OUT']}/rank{os.environ['RANK']}-colls.json", "w") as f:
                            json.dump(colls, f)
                return out
            t0 = time.perf_counter()
            shapes = bool(os.environ.get("STEPPROF_SHAPES"))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes) as p:
                out = step_fn(engine, *a, **k)
            wall = time.perf_counter() - t0
            calls["n"] += 1
            rank = os.environ["RANK"]
            d = os.environ["STEPPROF_OUT"]
            ka = p.key_averages(group_by_input_shape=shapes)
            rows = sorted(({"op": e.key + (f" {e.input_shapes}" if shapes else ""), "count": e.count, "self_s": e.self_cpu_time_total / 1e6,
                            "total_s": e.cpu_time_total / 1e6} for e in ka), key=lambda r: -r["self_s"])
            with open(f"{d}/rank{rank}-step{i}.json", "w") as f:
                json.dump({"wall_s": wall, "threads": torch.get_num_threads(), "ops": rows}, f)
            return out
        return prof_step

    if os.environ.get("STEPPROF_COLL"):
        # Every collective of steps FROM..FROM+N-1 with its entry and exit on CLOCK_MONOTONIC (one clock for all
        # the ranks of a host): breakdown.py pairs the ranks' calls to split each wait from the transfer.
        import torch.distributed as dist

        def nbytes(x):
            if isinstance(x, (list, tuple)):
                return sum(nbytes(y) for y in x)
            return x.numel() * x.element_size() if hasattr(x, "numel") else 0

        def collective(name, t0, t1, args):
            # the whole tensor each moves: all_gather's output list, reduce_scatter's input list (Megatron SP's
            # list forms, launcher/parallel/tensor.py), the first tensor of the others
            t = args[1] if name == "reduce_scatter" and len(args) > 1 else (args[0] if args else None)
            colls.append([name, t0, t1, nbytes(t)])
        for _name in ("all_to_all_single", "all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor",
                      "all_gather", "reduce_scatter", "broadcast", "send", "recv"):
            if hasattr(dist, _name):
                timed(dist, _name, collective)

    T.train_step = wrap(T.train_step)
    T.train_step_pipeline = wrap(T.train_step_pipeline)
