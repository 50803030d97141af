"""`launcher calibrate` on 2 real CPU ranks (torchrun, gloo) writes a profile that `launcher plan` then uses."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
import yaml

from launcher.runtime.calibrate import COMPUTE_ROUNDS, pooled_release, zero3_split

pytestmark = pytest.mark.slow


def test_calibrate_two_cpu_ranks_then_plan(tmp_path, capsys, monkeypatch):
    from launcher.cli import main
    from launcher.plan.profile import PROFILE_VERSION, load_profile

    out = tmp_path / "profiles" / "box.yaml"
    # Nothing is JIT-compiled: the engine probes' deepspeed.initialize would build DeepSpeed's shm comm op here.
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    assert main(["calibrate", "cluster=cpu", "cluster.gpus_per_node=2", "--out", str(out)]) == 0
    assert list(ext.iterdir()) == []
    doc = yaml.safe_load(out.read_text())
    assert doc["version"] == PROFILE_VERSION
    raw = doc["measurements"]
    assert raw["world"] == 2 and raw["backend"] == "gloo"
    # The host's CPU model, for a later --network-only calibration to check its nodes against (/proc/cpuinfo, read here).
    assert raw["cpu_model"] == next(x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name"))
    # Every measured rate is a real, positive number; all-reduce time grows with the bytes (16 MiB vs 4 KiB).
    for dtype in ("fp32", "bf16"):
        assert all(r > 0 for _, r in raw["gemm"][dtype]) and all(r > 0 for _, r in raw["attention"][dtype])
    # Attention at the profile's head dimension (64 on CPU ranks) and at 32 and 128 beside it, both dtypes, every
    # sequence length; the plan reads a model's head dimension from them (recipe=tiny's is 32: its own table).
    assert raw["attention_head_dim"] == 64 and set(raw["attention_hd"]) == {"32", "128"}
    for by in raw["attention_hd"].values():
        assert set(by) == {"fp32", "bf16"}
        assert all([s for s, _ in by[d]] == [s for s, _ in raw["attention"][d]] and all(r > 0 for _, r in by[d])
                   for d in by)
    # Each compute sweep's headline figures are kept, and the profile's copy bandwidth is their median.
    spread = raw["sweep_spread"]
    assert set(spread) == {"memory_gbps", "kernel_overhead_s", "gemm_fp32_side_512", "gemm_bf16_side_512"}
    assert all(len(v) == COMPUTE_ROUNDS and min(v) > 0 for v in spread.values())
    assert sorted(spread["memory_gbps"])[1] == doc["memory_gbps"]
    # The collectives after compute, the stragglers, the release and ZeRO-3's hooks were timed once a round; each
    # figure is the median of its rounds' (each round's tables kept; ZeRO-3's below).
    rounds = raw["probe_rounds"]
    assert [len(rounds[k]) for k in ("collectives", "straggler", "release", "zero3")] == [COMPUTE_ROUNDS] * 4
    for name in ("all_reduce_after_compute", "all_to_all_after_compute"):
        assert raw[name] == [[b, statistics.median(r[name][i][1] for r in rounds["collectives"])]
                             for i, (b, _) in enumerate(raw[name])]
    assert [c for _, c in raw["release"]["2"]] == [statistics.median(r["2"][i][1] for r in rounds["release"])
                                                   for i in range(len(raw["release"]["2"]))]
    times = dict((b, t) for b, t in raw["all_reduce"])
    assert times[16 << 20] > times[4 << 10] > 0
    prof = load_profile(str(out))
    assert prof.compute_slots >= 1 and prof.memory_gbps > 0 and prof.intra.bus_gbps > 0
    assert prof.attention_head_dim == 64 and set(prof.attention_table_by_head_dim) == {32, 128}
    assert prof.attention_table_for("fp32", 32) == prof.attention_table_for("fp32", 16) \
        != prof.attention_table_for("fp32")
    assert [x for x, _ in prof.attention_table_for("fp32", 32)] == [s for s, _ in raw["attention_hd"]["32"]["fp32"]]
    # DeepSpeed's per-element work: every dtype x ZeRO stage x unit side x layer count was timed, engine and plain.
    # ZeRO-1 in fp32 (flattened gradients, an fp32 partition, copies back) costs an engine step over 40
    # Linear(384, 384) well beyond the plain one (~80 against ~20 ms here), so its per-element figure is positive.
    rows = raw["engine"]
    assert sorted({(r[0], r[1], r[2], r[3], r[4]) for r in rows}) == sorted(
        (dt, z, d, mb, k)
        for dt in ("fp32", "bf16") for z in range(4) for d in (32, 384) for mb in (1, 3) for k in (8, 40))
    assert all(r[5] > 0 and r[6] > 0 for r in rows)
    big = next(r for r in rows if r[:5] == ["fp32", 1, 384, 1, 40])
    assert big[5] > big[6]
    for table in (prof.engine_element_s, prof.engine_tensor_s, prof.engine_element_micro_s, prof.engine_tensor_micro_s):
        assert set(table) == {"fp32", "bf16"} and all(len(v) == 4 and min(v) >= 0 for v in table.values())
    # ZeRO-1's per-element work (its fp32 partition and the copies back) is the step's: the rest, not the
    # per-micro-batch part, carries it.
    assert prof.engine_element("fp32", 1) > 0
    # Per parameter tensor: the d = 32 layer's cost less its 1,024 elements at the per-element figure, for every dtype
    # and stage; ZeRO-3's is 0 (zero3_param_s charges it). ZeRO-1's engine does per-tensor work at d = 32 (~0.26 ms a
    # tensor here).
    assert set(prof.engine_tensor_s) == {"fp32", "bf16"} and all(len(v) == 4 and v[3] == 0.0 for v in prof.engine_tensor_s.values())
    assert all(x >= 0 for v in prof.engine_tensor_s.values() for x in v)
    # Each figure is a difference of two differences of medians, some tens of microseconds a tensor against steps of
    # milliseconds: one dtype's step part came out 0 in a run here (2026-11-28, fp32), both dtypes' in CI's
    # (2026-12-02), the work having gone to the per-micro-batch part. So the probe is held to seeing ZeRO-1/2's
    # per-tensor work in at least one of its eight figures (2 dtypes x 2 stages x per step / per micro-batch).
    assert max(table[dt][stage] for table in (prof.engine_tensor_s, prof.engine_tensor_micro_s)
               for dt in ("fp32", "bf16") for stage in (1, 2)) > 0
    # ZeRO-3's probe: both units (bare and wrapped Linear) at 1 and 3 micro-batches a step, and the wrapped Linear
    # under a checkpoint at 1, K = 8 and 40, engine and plain timed; the profile carries a per-micro-batch and a
    # per-step part and the recompute's figure, none negative. On these 2 ranks most of it is the step's (~1 ms a
    # parameter tensor against ~0.1-0.35 a micro-batch), so the step part shows.
    assert sorted({(r[0], r[1], r[2]) for r in raw["zero3"]}) == sorted(
        [(u, m, k) for u in ("linear", "wrapped") for m in (1, 3) for k in (8, 40)]
        + [("recompute", 1, k) for k in (8, 40)])
    assert all(r[3] > 0 and r[4] > 0 for r in raw["zero3"])
    names = ("zero3_module_s", "zero3_param_s", "zero3_module_step_s", "zero3_param_step_s", "zero3_recompute_param_s")
    parts = tuple(getattr(prof, n) for n in names)
    assert dict(zip(names, parts)) == zero3_split(rounds["zero3"])      # from each round's costs per unit
    assert min(parts) >= 0 and prof.zero3_module_step_s + prof.zero3_param_step_s > 0
    # The framework probe: every architecture and dtype timed at both block counts, forward and backward; three
    # blocks take longer than one (each block is ~100 more operators forward); the residual is what the profile
    # carries, and for llama's many small operators it is positive (~1-2 ms a block on this box).
    fw = raw["framework"]
    assert set(fw) == {"llama", "gpt", "bloom"} and all(set(by) == {"fp32", "bf16"} for by in fw.values())
    for by in fw.values():
        for t in by.values():
            assert set(t) == {"1", "3"} and all(x > 0 for x in t["1"] + t["3"]) and t["3"][0] > t["1"][0]
    assert set(prof.framework_s) == {"llama", "gpt", "bloom"}
    assert all(len(v) == 3 and min(v) >= 0 for by in prof.framework_s.values() for v in by.values())
    assert prof.framework("llama", "fp32")[0] > 0
    # The same probe with selective checkpointing (model.checkpoint_mode=selective): torch's dispatch mode over every
    # operator makes its forward slower than the plain probe's; the profile carries what it adds per block.
    sel = raw["framework_selective"]
    assert set(sel) == set(fw) and all(set(by) == {"fp32", "bf16"} for by in sel.values())
    assert all(sel[a][d]["3"][0] > fw[a][d]["3"][0] for a in sel for d in sel[a])
    assert set(prof.selective_framework_s) == {"llama", "gpt", "bloom"}
    assert all(len(v) == 2 and min(v) >= 0 for by in prof.selective_framework_s.values() for v in by.values())
    assert prof.selective("llama", "fp32")[0] > 0 and prof.selective("llama", "fp32")[1] is None
    # Stragglers: 2 ranks, one group size, every target segment length timed, longer segments longer, fractions >= 0
    # (a slowest-minus-mean wait); the profile carries the table the plan reads.
    assert set(raw["straggler"]) == {"2"} and prof.straggler == {2: raw["straggler"]["2"]}
    rows = raw["straggler"]["2"]
    assert len(rows) == 4 and [r[0] for r in rows] == sorted(r[0] for r in rows) and rows[0][0] > 0
    assert all(f >= 0 for _, f in rows)
    # Release: the pair's tiny all-reduce after each of those segment lengths, timed from its last arrival; a
    # positive time at a measured segment near each target (one node of 2 ranks: no smaller group, no intra_groups).
    # The plan reads the rows pooled into one figure (pooled_release); the rows stay in the measurements.
    assert set(raw["release"]) == {"2"} and prof.intra_groups == {}
    assert prof.release == {2: pooled_release(raw["release"]["2"], "cpu")}
    assert len({c for _, c in prof.release[2]}) == 1
    rel = raw["release"]["2"]
    assert len(rel) == 4 and all(c > 0 for _, c in rel) and [r[0] for r in rel] == sorted(r[0] for r in rel)
    # Where the time went: every probe's seconds, in the order run, in the measurements and the file's header, and a
    # line on stderr as each ended (the ranks' own stderr, passed on while they ran); together no more than the run.
    phases = raw["phase_seconds"]
    assert list(phases) == ["compute rates (GEMM, attention, memory, kernel overhead)", "collectives",
                            "stragglers and release", "ZeRO-3 hooks", "DeepSpeed engine per element and tensor",
                            "framework / host issue time"]
    assert all(t > 0 for t in phases.values()) and sum(phases.values()) <= raw["seconds"]
    header = [line for line in out.read_text().splitlines() if line.startswith("#")]
    # After the phases, where a figure's sweeps moved more than 1.5x (a busy machine: it happens here), the
    # header names each such figure, as stderr's warnings do; on a quiet machine neither says anything.
    busy = [i for i, line in enumerate(header) if line.startswith("# The machine was busy")]
    phase_lines, busy_lines = (header[1:busy[0]], header[busy[0] + 1:]) if busy else (header[1:], [])
    assert [line.split(":")[0].strip("# ") for line in phase_lines] == list(phases)
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("calibrate: warning: ")]
    said = [re.fullmatch(r"calibrate: (.+?)(?:, round (\d) of \d)? \d+ s \(\d+ s so far\)", line)
            for line in err.splitlines() if line.startswith("calibrate: ") and line not in warned]
    assert all(said)
    # The first four probes run once a round, interleaved (compute, collectives, stragglers and release, ZeRO-3's
    # hooks; again; again), their seconds added up under one name; the others once.
    rounds = [(m.group(1), m.group(2)) for m in said]
    assert rounds == [(name, str(k)) for k in range(1, COMPUTE_ROUNDS + 1) for name in list(phases)[:4]] + \
        [(name, None) for name in list(phases)[4:]]
    assert [line.strip("# ") for line in busy_lines] == [
        re.search(r"measured: (.+)\. Predictions", line).group(1) for line in warned]
    moved = {name for name, v in spread.items() if max(v) / min(v) > 1.5}
    assert {line.strip("# ").split(" ")[0] for line in busy_lines} == moved

    assert main(["plan", "recipe=tiny", f"cluster.profile={out}", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["step_time_s"] > 0 and str(out) in plan["profile"]
    assert sum(plan["step_time_breakdown_s"].values()) == pytest.approx(plan["step_time_s"], rel=1e-9)
    # The profile's own numbers reach the plan: the exposed ZeRO-2 traffic on 2 CPU ranks (no overlap) is
    # at least one all-gather of the fp32 weights at the measured link.
    n = plan["params_total"]
    assert plan["step_time_breakdown_s"]["dp_comm_exposed"] >= prof.intra.latency_s + 0.5 * 4 * n / (prof.intra.bus_gbps * 1e9)
    # The node's RAM as calibrate read it is the host-memory check's capacity (launcher/plan/host.py host_capacity).
    mem_total = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal:"))
    assert plan["host_memory"]["capacity_bytes"] == pytest.approx(mem_total, rel=1e-6)
    assert plan["host_memory"]["capacity_source"].startswith(f"cluster.profile={out}")
    # A rank's resident bytes besides its model: once the runtime's modules are imported, torch, DeepSpeed and
    # transformers' modeling code alone are over 200 MB resident; the profile's figure is taken after a near-zero
    # model's ZeRO-2 engine has been built and stepped, which adds DeepSpeed's bookkeeping and the code pages the
    # steps touch (+30.5 MiB on the dev VM, 2026-12-03; file-backed pages alone +20), the figure before it kept in
    # the measurements. The plan's CPU overhead is that plus the ZeRO-2 bucket's pages the gradients fill
    # (recipe=tiny: every fp32 gradient).
    before = doc["measurements"]["process_bytes_before_model"]
    assert 200e6 < before and before + 5e6 < prof.process_bytes < mem_total
    assert plan["memory_per_gpu_bytes"]["overhead"] == pytest.approx(prof.process_bytes + 4 * n)


def test_calibrate_more_ranks_than_cores_measures_the_waits_unshared_too(tmp_path, capsys, monkeypatch):
    # 4 CPU ranks: on a node with fewer cores (CI's and this machine's 2), calibrate times the straggler and release
    # probes a second time with only the cores' ranks busy (a pipeline's fill and drain leave one stage computing),
    # and the plan of TP2 x PP2 reads them where a stage computes alone (steptime._shared_pipeline).
    import os

    from launcher.cli import main
    from launcher.plan.profile import load_profile
    from launcher.runtime.calibrate import STRAGGLER_SEGMENTS_S, median_rows

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    out = tmp_path / "four.yaml"
    assert main(["calibrate", "cluster=cpu", "cluster.gpus_per_node=4", "--out", str(out)]) == 0
    raw = yaml.safe_load(out.read_text())["measurements"]
    assert raw["local_world"] == 4 and raw["cores"] == len(os.sched_getaffinity(0))
    prof = load_profile(str(out))
    slots = prof.compute_slots          # cores / torch threads a rank
    if not 2 <= slots < 4:
        assert "straggler_unshared" not in raw and not prof.straggler_unshared     # every rank has its own core
        return
    rounds = raw["probe_rounds"]
    assert len(rounds["straggler_unshared"]) == len(rounds["release_unshared"]) == COMPUTE_ROUNDS
    # Groups of consecutive ranks among the busy ones only: a pair (TP2 x PP2's TP groups), one row per segment
    # length, each the median of its rounds'.
    assert set(raw["straggler_unshared"]) == set(raw["release_unshared"]) == {"2"}
    assert raw["straggler_unshared"] == median_rows(rounds["straggler_unshared"])
    rows = raw["straggler_unshared"]["2"]
    assert len(rows) == len(STRAGGLER_SEGMENTS_S["cpu"]) and all(t > 0 and f >= 0 for t, f in rows)
    assert prof.straggler_unshared == {2: rows}
    assert prof.release_unshared == {2: pooled_release(raw["release_unshared"]["2"], "cpu")}
    # The plan reads the unshared table where asked: at one of its segment lengths, that row.
    t, f = sorted(rows)[1]
    assert prof.straggler_fraction(2, t, unshared=True) == pytest.approx(f, rel=1e-12)
    assert set(prof.straggler) == {2, 4}      # the tables with every rank busy stay beside them
    capsys.readouterr()
    assert main(["plan", "recipe=tiny", "cluster.gpus_per_node=4", f"cluster.profile={out}", "parallel.tensor_degree=2",
                 "parallel.pipeline_degree=2", "parallel.zero_stage=1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["step_time_s"] == pytest.approx(sum(plan["step_time_breakdown_s"].values()), rel=1e-9)


def test_check_measures_this_machine_against_a_profile(tmp_path, capsys):
    # `launcher calibrate --check`: calibrate's GEMM probe at every side the profile's table measured (both dtypes)
    # and its copy window, beside the profile's rates for a rank of this many. Against a profile with a twentieth of
    # this machine's rates every rate reads far above it: exit 1, calibrate again. The committed calibration
    # (bench/steptime/profile.yaml) scaled below this machine by what plain torch reads here (gemm_over_profile): CI's
    # machines differ, and an AVX2-only one ran bf16 GEMMs at 1/280 of that profile's.
    from launcher.cli import main
    from tests.conftest import gemm_over_profile, rescaled_profile

    slow = tmp_path / "slow.yaml"
    compute = min(1.0, gemm_over_profile()) / 20
    doc = rescaled_profile(slow, compute, 1 / 20)
    assert doc["compute_slots"] == 2    # 2 ranks on 2 slots: the profile's rates are each rank's
    assert main(["calibrate", "--check", "cluster=cpu", "cluster.gpus_per_node=2", f"cluster.profile={slow}"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    rows = re.findall(r"GEMM (fp32|bf16) side (\d+) now ([\d.e+-]+) TFLOP/s, profile ([\d.e+-]+) x([\d.]+)", out)
    assert [(d, int(x)) for d, x, *_ in rows] == [(d, int(x)) for d in ("fp32", "bf16") for x, _ in doc["gemm_table"][d]]
    for d, x, now, profile, ratio in rows:
        assert float(profile) == pytest.approx(dict(doc["gemm_table"][d])[int(x)], rel=1e-3)
        assert float(ratio) == pytest.approx(float(now) / float(profile), rel=0.02) and float(ratio) > 2
    copy = re.search(r"copy 64 MiB now ([\d.]+) GB/s, profile ([\d.]+) x([\d.]+)", out)
    assert float(copy.group(2)) == pytest.approx(doc["memory_gbps"], rel=1e-2) and float(copy.group(3)) > 2
    # The config's plan (the default one: recipe tiny's model, bf16) from the profile and again at the rates read:
    # each is what `launcher plan` gives from a profile file with those rates, and the verdict is the plan's move.
    plan = re.search(r"This config's plan \(bf16: its GEMMs x([\d.]+), the median of its dtype's shapes; copy x([\d.]+)\) "
                     r"is ([\d,.]+) ms a step from the profile and ([\d,.]+) ms at the rates read now \(x([\d.]+)\): "
                     r"more than 10% apart, so the machine is not what that profile measured", out)
    assert plan, out
    gemm, copy_x, from_profile, at_now, shift = (float(x.replace(",", "")) for x in plan.groups())
    assert gemm == pytest.approx(statistics.median(float(r[4]) for r in rows if r[0] == "bf16"), abs=0.011)
    capsys.readouterr()

    def planned_ms(profile) -> float:
        assert main(["plan", "cluster=cpu", "cluster.gpus_per_node=2", f"cluster.profile={profile}", "--json"]) == 0
        return json.loads(capsys.readouterr().out)["step_time_s"] * 1e3

    assert from_profile == pytest.approx(planned_ms(slow), abs=0.051)
    rescaled_profile(tmp_path / "now.yaml", gemm * compute, copy_x / 20)
    assert at_now == pytest.approx(planned_ms(tmp_path / "now.yaml"), rel=0.01)
    assert shift == pytest.approx(at_now / from_profile, abs=0.006) and shift < 0.5
    # What it refuses, before any rank starts: no profile to check, --out beside --check, calibrate without --out.
    for argv, key in ((["calibrate", "--check", "cluster=cpu"], "cluster.profile=None"),
                      (["calibrate", "--check", f"cluster.profile={slow}", "--out", str(tmp_path / "x.yaml")], "--out"),
                      (["calibrate", "cluster=cpu"], "needs --out PATH")):
        assert main(argv) == 2
        assert key in capsys.readouterr().err


def test_interrupted_calibrate_leaves_no_rank_running(tmp_path):
    # calibrate reads its ranks' stderr itself (the phase lines), so an interrupt lands in its loop, not in
    # subprocess.run's: it terminates torchrun, and torchrun its ranks. The parent alone gets SIGINT once the first
    # probe has ended (the ranks are computing then); afterwards no process carrying this test's mark is left. (Without
    # the terminate the ranks still went, ~2 s later here, at their next write to the closed stderr pipe: this holds
    # the outcome, not which of the two brought it.)
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid

    mark = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "calibrate", "cluster=cpu", "cluster.gpus_per_node=2",
                             "--out", str(tmp_path / "p.yaml")], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LAUNCHER_TEST_MARK": mark},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def marked() -> list:
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if f"LAUNCHER_TEST_MARK={mark}".encode() in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                    pids.append(int(pid))
            except OSError:
                pass
        return pids
    try:
        line = proc.stderr.readline()
        while line and not line.startswith("calibrate: "):
            line = proc.stderr.readline()
        assert line.startswith("calibrate: "), "calibrate ended before its first probe did"
        assert len(marked()) >= 4          # the parent, torchrun and the two ranks
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) != 0
        deadline = time.monotonic() + 30
        while marked() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert marked() == []
        assert not (tmp_path / "p.yaml").exists()
    finally:
        for pid in marked():
            os.kill(pid, signal.SIGKILL)
