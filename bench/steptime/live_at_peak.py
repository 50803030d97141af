"""What a DeepSpeed rank holds at its step's peak, tensor by tensor, inside `launcher train` (diagnostic for the plan's
GPU-style memory terms, measured on CPU ranks; not a test).

    flock /tmp/heavy.lock .venv/bin/python bench/steptime/live_at_peak.py                      # every layout below
    flock /tmp/heavy.lock .venv/bin/python bench/steptime/live_at_peak.py "SP2 ZeRO-1 bf16"    # one
    flock /tmp/heavy.lock .venv/bin/python bench/steptime/live_at_peak.py --bucket 200000       # reduce_bucket_size
    flock /tmp/heavy.lock .venv/bin/python bench/steptime/live_at_peak.py --overlap --bucket 200000   # as on a GPU
    flock /tmp/heavy.lock .venv/bin/python bench/steptime/live_at_peak.py --zero3 persist=0,reuse=1e6 "DP2 ZeRO-3 bf16"

Each layout runs as `launcher train recipe=tiny` on 2 CPU ranks with a `sitecustomize` on PYTHONPATH that wraps
DeepSpeedEngine.forward and .step: as the first forward of step STEP begins, every rank adds up the storages of
the tensors the interpreter holds (parameters, DeepSpeed's flat groups and fp32 partitions, Adam's state; each
storage once), then runs under torch.profiler with profile_memory=True to the end of that step's optimizer step,
and walks the profiler's allocation events in time order (torch's own MemoryProfileTimeline asserts on the Ulysses
all-to-all's autograd graph): the peak of the bytes the step allocated (less what it freed of the tensors held
before), and every tensor live there with the op and Python frames that allocated it. Unlike a CPU rank's RSS this
counts an allocation whole whether or not its pages were touched, and none of glibc's free blocks: what a GPU's
caching allocator reports as max_memory_allocated. So it holds the plan's GPU-style terms (params, gradients,
optimizer state, activations, the ZeRO 1/2 reduce bucket of reduce_bucket_size elements whole) to DeepSpeed's real
allocations, without a GPU. --bucket N runs DeepSpeed and the plan with a reduce_bucket_size of N elements: below
the model's size, the reductions fire inside the backward as they do for a stage past 5e8 parameters.
LIVE_AT_PEAK_SIZES=1 prints each group's tensor sizes; LIVE_AT_PEAK_DUMP=DIR keeps each rank's record.
--overlap turns on DeepSpeed's overlap_comm on these CPU ranks, as the launcher does on GPUs (its second reduce
buffer, stage_1_and_2.py setup_buckets); --zero3 persist=N,reuse=N,prefetch=N,live=N passes ZeRO 3's
fetching keys (parallel.zero3_param_persistence_threshold, _max_reuse_distance, _prefetch_bucket_size,
_max_live_parameters; any of them) to the run and the plan alike (launcher/plan/memory.py zero3_gathered).
LIVE_AT_PEAK_TRACE=1 with LIVE_AT_PEAK_DUMP keeps ZeRO 3's recorded module trace in each rank's record (module
name, its own parameter elements): the order zero3_gathered replays. The ZeRO-3 layouts with "recompute" and
"selective" in their names run activation checkpointing (all blocks, the first two, selective).
Readings: bench/steptime/results.md.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import HERE, train  # noqa: E402  (bench/ is not a package)

STEP = 6
GROUPS = 14
LAYOUTS = {
    "DP2 ZeRO-1 bf16": ["parallel.zero_stage=1", "precision=bf16"],
    "DP2 ZeRO-2 bf16": ["parallel.zero_stage=2", "precision=bf16"],
    "SP2 ZeRO-1 bf16": ["parallel.sequence_degree=2", "parallel.zero_stage=1", "precision=bf16"],
    "SP2 ZeRO-2 bf16": ["parallel.sequence_degree=2", "parallel.zero_stage=2", "precision=bf16"],
    "SP2 ZeRO-0 bf16": ["parallel.sequence_degree=2", "parallel.zero_stage=0", "precision=bf16"],
    "DP2 ZeRO-1 fp32": ["parallel.zero_stage=1"],
    "SP2 ZeRO-1 fp32": ["parallel.sequence_degree=2", "parallel.zero_stage=1"],
    "DP2 ZeRO-3 bf16": ["parallel.zero_stage=3", "precision=bf16"],
    "DP2 ZeRO-3 bf16 recompute": ["parallel.zero_stage=3", "precision=bf16", "model.activation_checkpointing=true"],
    "DP2 ZeRO-3 bf16 recompute 2 blocks": ["parallel.zero_stage=3", "precision=bf16",
                                           "model.activation_checkpointing=true", "model.checkpoint_blocks=2"],
    "DP2 ZeRO-3 bf16 selective": ["parallel.zero_stage=3", "precision=bf16", "model.activation_checkpointing=true",
                                  "model.checkpoint_mode=selective"],
    "TP2 ZeRO-1 bf16": ["parallel.tensor_degree=2", "parallel.zero_stage=1", "precision=bf16"],
    "TP2-SP ZeRO-1 bf16": ["parallel.tensor_degree=2", "parallel.sequence_parallel=true", "parallel.zero_stage=1",
                           "precision=bf16"],
    "PP2 ZeRO-1 bf16": ["parallel.pipeline_degree=2", "parallel.zero_stage=1", "precision=bf16"],
    "CP2 ZeRO-1 bf16": ["parallel.context_degree=2", "parallel.zero_stage=1", "precision=bf16"],
    # activations well above the logits: 16 blocks at 4x the sequence, so a reduction inside the backward meets
    # most of them still live
    "DP2 ZeRO-1 bf16 deep": ["parallel.zero_stage=1", "precision=bf16", "model.num_hidden_layers=16",
                             "data.seq_length=512", "batch.micro_batch_size=2", "batch.global_batch_size=4"],
    "SP2 ZeRO-1 bf16 deep": ["parallel.sequence_degree=2", "parallel.zero_stage=1", "precision=bf16",
                             "model.num_hidden_layers=16", "data.seq_length=512", "batch.micro_batch_size=2",
                             "batch.global_batch_size=2"],
}

# --zero3's short names for ZeRO 3's fetching keys, passed to `launcher train` and the plan as overrides
ZERO3_KNOBS = {"persist": "parallel.zero3_param_persistence_threshold", "reuse": "parallel.zero3_max_reuse_distance",
               "prefetch": "parallel.zero3_prefetch_bucket_size", "live": "parallel.zero3_max_live_parameters"}
HOOK = r'''
import json, os
if os.environ.get("LIVE_AT_PEAK_BUCKET"):
    # a bucket smaller than the model: reductions fire inside the backward, as a model larger than 5e8 parameters
    # a stage sees at the launcher's reduce_bucket_size (the plan is run with the same size: planned() below)
    import launcher.deepspeed_config as _dc
    import launcher.plan.memory as _mem
    _dc.REDUCE_BUCKET_SIZE = _mem.REDUCE_BUCKET_ELEMENTS = int(os.environ["LIVE_AT_PEAK_BUCKET"])
if os.environ.get("LIVE_AT_PEAK_OVERLAP"):
    # DeepSpeed's overlap_comm, which the launcher turns on for CUDA only, on these CPU ranks too; and the plan told
    # the same (launcher/plan/memory.py overlap_comm)
    import launcher.deepspeed_config as _dc
    import launcher.plan.memory as _mem
    _base = _dc.zero_optimization_base

    def _with_overlap(stage, device):
        return {**_base(stage, device), "overlap_comm": True}
    _dc.zero_optimization_base = _with_overlap
    _mem.overlap_comm = lambda hw: True
if os.environ.get("LOCAL_RANK") is not None and os.environ.get("LIVE_AT_PEAK_OUT"):
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine
    from torch.profiler import ProfilerActivity, profile

    _step_at = int(os.environ["LIVE_AT_PEAK_STEP"])
    MARK = "live_at_peak_backward_done"

    def live_at_peak_backward_done():
        # a marker: its allocation, under this function's frame, says where the backward ended
        torch.empty(1)
    _state = {"prof": None, "done": False}
    _forward, _step = DeepSpeedEngine.forward, DeepSpeedEngine.step

    def _write(prof):
        # The allocations the profiler saw (torch's event tree; torch's own MemoryProfileTimeline asserts on the
        # Ulysses all-to-all's autograd graph), in time order: live bytes allocated inside the window, their peak,
        # and what is live there, each with the op and Python frames that allocated it.
        def walk(events):
            for e in events:
                yield e
                yield from walk(e.children)

        def where(e):
            names, p = [], e.parent
            while p is not None and len(names) < 40:
                names.append(p.name)
                p = p.parent
            ops = [n for n in names if n.startswith("aten::")][:1]
            py = [n for n in names if ".py(" in n and "torch/" not in n and "/nn/modules/" not in n][:3]
            return " < ".join(ops + py)

        allocs = sorted((e.start_time_ns, e.extra_fields.alloc_size, e.extra_fields.ptr, e)
                        for e in walk(prof.profiler.kineto_results.experimental_event_tree())
                        if str(e.typed[0]).endswith("Allocation"))
        live, total, best, snap, zero, at_mark = {}, 0, -1, {}, [], None
        for i, (t, size, ptr, e) in enumerate(allocs):
            chain, p = [], e.parent
            while p is not None and len(chain) < 4:
                chain.append(p.name)
                p = p.parent
            if any(MARK in n for n in chain):
                if size > 0:        # the last backward has ended (step() below): what is live then
                    at_mark = (total, dict(live))
                continue
            if size > 0:
                total += size - live.get(ptr, (0,))[0]     # an address allocated again: its free went unseen
                live[ptr] = (size, e)
                if size >= 2 ** 16 and "deepspeed/runtime/zero" in where(e):
                    zero.append((size, where(e), total))
            elif ptr in live:
                total -= live.pop(ptr)[0]
            else:
                total += size       # a tensor held before the window, freed inside it
            if total > best:
                best, snap = total, dict(live)
        def grouped(snapshot):
            out = {}
            for s, e in snapshot.values():
                n, b = out.get(where(e), (0, 0))
                out[where(e)] = (n + 1, b + s)
            return sorted(((b, n, at) for at, (n, b) in out.items()), reverse=True)
        largest = sorted(((s, where(e)) for s, e in snap.values()), key=lambda x: -x[0])
        out = os.path.join(os.environ["LIVE_AT_PEAK_OUT"], "rank%s.json" % os.environ["RANK"])
        with open(out + ".tmp", "w") as f:
            json.dump({"held": _state["held"], "peak": best, "count": len(snap), "largest": largest, "zero": zero,
                       "gathers": _state.get("gathers"), "trace": _state.get("trace"),
                       "groups": grouped(snap), "end_of_backward": at_mark[0] if at_mark else None,
                       "end_of_backward_groups": grouped(at_mark[1]) if at_mark else []}, f)
        os.replace(out + ".tmp", out)

    def _held():
        # every tensor the interpreter holds as the window opens (parameters, DeepSpeed's flat groups, fp32
        # partitions, optimizer state, data), each storage once
        import gc
        seen = {}
        for o in gc.get_objects():
            try:
                if torch.is_tensor(o) and o.device.type == "cpu":
                    st = o.untyped_storage()
                    seen[st.data_ptr()] = st.nbytes()
            except Exception:
                pass
        return sum(seen.values())

    def forward(self, *a, **k):
        if _state["prof"] is None and not _state["done"] and self.global_steps == _step_at:
            _state["held"] = _held()
            _state["prof"] = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                                     with_stack=True)
            _state["prof"].__enter__()
        return _forward(self, *a, **k)

    def step(self, *a, **k):
        if _state["prof"] is not None:
            live_at_peak_backward_done()
        _state["phase"] = "step"
        try:
            out = _step(self, *a, **k)
        finally:
            _state["phase"] = "forward"
        if _state["prof"] is not None and self.global_steps > _step_at:
            if os.environ.get("LIVE_AT_PEAK_TRACE") and hasattr(self.optimizer, "parameter_offload"):
                # ZeRO 3's recorded module trace, by name and own parameter elements (the replay's trace)
                names = {id(m): n for n, m in self.module.named_modules()}
                order = self.optimizer.parameter_offload.get_param_coordinator()._PartitionedParameterCoordinator__submodule_order
                _state["trace"] = [(names.get(id(m), "?"), sum(p.ds_numel for p in m.parameters(recurse=False)))
                                   for m in order]
            prof, _state["prof"], _state["done"] = _state["prof"], None, True
            prof.__exit__(None, None, None)
            _write(prof)
        return out

    DeepSpeedEngine.forward, DeepSpeedEngine.step = forward, step

    # ZeRO 3's all-gathers in the window, forward and backward apart: each call into torch.distributed from
    # DeepSpeed's partition_parameters.py, with its output's elements
    import sys as _sys
    import torch.distributed as _dist
    _state["gathers"] = {"forward": [0, 0], "backward": [0, 0], "step": [0, 0]}
    _state["phase"] = "forward"

    def _counted(fn):
        def wrapper(*a, **k):
            if _state["prof"] is not None:
                f, hit = _sys._getframe(1), False
                for _ in range(12):
                    if f is None:
                        break
                    if f.f_code.co_filename.endswith("zero/partition_parameters.py"):
                        hit = True
                        break
                    f = f.f_back
                if hit:
                    out = a[0] if a else k.get("output_tensor", k.get("tensor_list"))
                    n = sum(t.numel() for t in out) if isinstance(out, (list, tuple)) else out.numel()
                    g = _state["gathers"][_state["phase"]]
                    g[0], g[1] = g[0] + 1, g[1] + n
            return fn(*a, **k)
        return wrapper

    for _name in ("all_gather_into_tensor", "all_gather", "_all_gather_base"):
        if hasattr(_dist, _name):
            setattr(_dist, _name, _counted(getattr(_dist, _name)))
    _backward = DeepSpeedEngine.backward

    def backward(self, *a, **k):
        _state["phase"] = "backward"
        try:
            return _backward(self, *a, **k)
        finally:
            _state["phase"] = "forward"

    DeepSpeedEngine.backward = backward

    from deepspeed.runtime.pipe.engine import PipelineEngine
    _train_batch = PipelineEngine.train_batch

    def train_batch(self, *a, **k):
        # the pipeline engine runs forward, backward and step inside one call
        if _state["done"] or self.global_steps != _step_at:
            return _train_batch(self, *a, **k)
        _state["held"] = _held()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            out = _train_batch(self, *a, **k)
        _state["done"] = True
        _write(prof)
        return out

    PipelineEngine.train_batch = train_batch
'''


def planned(extra: list[str], bucket_env: dict) -> tuple:
    """(the plan's peak stage, DeepSpeed's buffers as the plan charges them on a GPU: whole buckets, ZeRO-3's
    whole tensors), with the bucket size, overlap_comm and ZeRO 3's fetching knobs the ranks ran; and for ZeRO 3
    (the plan's gathered elements and all-gathers, memory.zero3_gathered; the persistent tensors' refresh after the
    step: calls, elements), else None."""
    import launcher.plan.memory as mem
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.plan.inputs import model_shape, resolve_hardware, strategy
    from launcher.plan.params import param_numels

    mem.REDUCE_BUCKET_ELEMENTS = int(bucket_env.get("LIVE_AT_PEAK_BUCKET", 500_000_000))
    overlap = "LIVE_AT_PEAK_OVERLAP" in bucket_env
    mem.overlap_comm = lambda hw: overlap
    cfg = compose(["recipe=tiny", "cluster.gpus_per_node=2", f"cluster.profile={HERE / 'profile.yaml'}", *extra])
    layout = resolve_layout(cfg)
    shape, st = model_shape(cfg.model), strategy(cfg, layout)
    peak = mem.estimate_memory(shape, st, resolve_hardware(cfg.cluster, cfg.precision.dtype)).peak
    buffers = mem._overhead(shape, st, mem.stage_params(shape, st, peak.stage), None, overlap)[0]
    gathered = mem.zero3_gathered(shape, st) if st.zero_stage == 3 else None
    if gathered is not None:
        # After each optimizer step DeepSpeed gathers every persistent tensor again, one all-gather each (stage3.py);
        # the plan does not price these apart (calibrate's ZeRO-3 hook terms carry them), so they are counted here,
        # from the model's own tensors
        small = [x for x in param_numels(cfg.model, st.padded_vocab_size) if x <= st.zero3_param_persistence_threshold]
        gathered = (gathered, (len(small), sum(small)))
    return peak, buffers - mem.FRAMEWORK_OVERHEAD_BYTES, gathered


def main() -> None:
    args = sys.argv[1:]
    bucket_env = {}
    json_out = None
    zero3 = []
    while args[:1] in (["--bucket"], ["--overlap"], ["--json"], ["--zero3"]):
        if args[0] == "--bucket":
            bucket_env["LIVE_AT_PEAK_BUCKET"], args = args[1], args[2:]
        elif args[0] == "--zero3":
            zero3 = [f"{ZERO3_KNOBS[k]}={int(float(v))}" for k, v in (kv.split("=") for kv in args[1].split(","))]
            args = args[2:]
        elif args[0] == "--json":
            json_out, args = Path(args[1]), args[2:]
        else:
            bucket_env["LIVE_AT_PEAK_OVERLAP"], args = "1", args[1:]
    rows = []
    names = args or list(LAYOUTS)
    M = 2 ** 20
    with tempfile.TemporaryDirectory() as tmp:
        hook = Path(tmp) / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK)
        for name in names:
            extra = LAYOUTS[name] + zero3
            out = Path(tmp) / name.replace(" ", "_")
            out.mkdir()
            env = {**os.environ, "PYTHONPATH": str(hook), "LIVE_AT_PEAK_OUT": str(out), "LIVE_AT_PEAK_STEP": str(STEP),
                   **bucket_env}
            run = train(name, 2, extra, HERE / "profile.yaml", STEP + 2, Path(tmp) / "runs", env)
            if "error" in run:
                raise SystemExit(f"{name}: launcher train failed:\n{run['error']}")
            peak, buffers, planned_zero3 = planned(extra, bucket_env)
            gathered, refresh = planned_zero3 if planned_zero3 is not None else (None, None)
            terms = peak.params + peak.grads + peak.optimizer + peak.activations
            print(f"## {name}: planned params {peak.params / M:.2f}, grads {peak.grads / M:.2f}, optimizer "
                  f"{peak.optimizer / M:.2f}, activations {peak.activations / M:.2f} MiB, DeepSpeed's buffers "
                  f"{buffers / M:.2f} MiB (the peak stage's, {peak.stage})")
            if gathered is not None:
                print(f"  ZeRO 3 whole tensors planned: {gathered.persistent:,.0f} persistent + {gathered.kept:,.0f} "
                      f"kept from the forward + {gathered.prefetched:,.0f} prefetched elements; all-gathers planned: "
                      f"forward {gathered.forward_gathers[0]} ({gathered.forward_gathers[1]:,.0f} elements), backward "
                      f"{gathered.backward_gathers[0]} ({gathered.backward_gathers[1]:,.0f}), optimizer step "
                      f"{refresh[0]} ({refresh[1]:,.0f})")
            ranks = {path: json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))}
            largest = max(r["held"] + r["peak"] for r in ranks.values())
            print(f"  the largest rank {largest / M:.2f} MiB; planned {(terms + buffers) / M:.2f} "
                  f"(x{(terms + buffers) / largest:.3f})")
            rows.append({"layout": name, "measured_bytes": largest, "planned_bytes": terms + buffers,
                         "planned_over_measured": (terms + buffers) / largest,
                         "zero3_gathered_elements": gathered.total if gathered is not None else None,
                         "zero3_gathers_planned": [gathered.forward_gathers, gathered.backward_gathers,
                                                   refresh]
                         if gathered is not None else None,
                         "zero3_gathers_measured": [[r.get("gathers") for r in ranks.values()]]})
            for path, r in ranks.items():
                if gathered is not None and r.get("gathers"):
                    f, b, o = r["gathers"]["forward"], r["gathers"]["backward"], r["gathers"]["step"]
                    print(f"  {path.stem}: ZeRO 3's all-gathers in the step: forward {f[0]} ({f[1]:,} elements), "
                          f"backward {b[0]} ({b[1]:,}), optimizer step {o[0]} ({o[1]:,})")
                measured = r["held"] + r["peak"]
                print(f"  {path.stem}: held as the step began {r['held'] / M:.2f} MiB + peak of the step's own "
                      f"{r['peak'] / M:.2f} = {measured / M:.2f} MiB; planned {(terms + buffers) / M:.2f} "
                      f"(x{(terms + buffers) / measured:.3f})")
                if os.environ.get("LIVE_AT_PEAK_DUMP"):
                    Path(os.environ["LIVE_AT_PEAK_DUMP"]).mkdir(exist_ok=True)
                    (Path(os.environ["LIVE_AT_PEAK_DUMP"]) / f"{name.replace(' ', '_')}-{path.name}").write_text(json.dumps(r))
                print(f"  {path.stem}: {r['peak'] / M:.2f} MiB allocated in the step and live at its peak "
                      f"({r['count']} tensors), by where they were allocated:", flush=True)
                for size, n, at in r["groups"][:GROUPS]:
                    print(f"    {size / M:8.2f} MiB {n:3d}x  {at}")
                    if os.environ.get("LIVE_AT_PEAK_SIZES"):
                        print("      sizes (B):", sorted(s for s, a in r["largest"] if a == at))
                if r["end_of_backward"] is not None:
                    print(f"  {path.stem}: at the end of the step's last backward: held + {r['end_of_backward'] / M:.2f} "
                          "MiB, the largest groups:")
                    for size, n, at in r["end_of_backward_groups"][:6]:
                        print(f"    {size / M:8.2f} MiB {n:3d}x  {at}")
                print("  every allocation of 64 KiB or more under deepspeed/runtime/zero, with the live total after it:")
                for size, at, total in r["zero"]:
                    print(f"    {size / M:9.2f} MiB (live {total / M:.1f})  {at}")

    if json_out is not None:     # the largest rank of each layout, for tests/plan/test_live_at_peak.py
        json_out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
