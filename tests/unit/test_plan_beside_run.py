"""The plan beside every run: Throughput (launcher/runtime/metrics.py) puts the plan's predicted step time and peak
memory next to each measured step, and the end-of-run summary compares the median (after the warm-up steps)."""

from __future__ import annotations

import statistics

import pytest

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.plan.inputs import model_shape, resolve_hardware, strategy
from launcher.plan.steptime import estimate_step_time
from launcher.runtime.metrics import WARMUP_STEPS, Throughput, cpu_snapshot, format_versus_plan, host_cpu_share
from tests.conftest import REPO

PROFILE = REPO / "bench" / "steptime" / "profile.yaml"


def test_records_carry_the_plan_when_a_profile_gives_rates():
    cfg = compose(["recipe=tiny", f"cluster.profile={PROFILE}"])
    layout = resolve_layout(cfg)
    planned = estimate_step_time(model_shape(cfg.model), strategy(cfg, layout),
                                 resolve_hardware(cfg.cluster, layout.dtype)).step_time_s
    th = Throughput(cfg, layout)
    times = [0.9, 0.5, 0.30, 0.32, 0.28, 0.31]
    recs = [th(t) for t in times]
    assert recs[2]["predicted_step_time_s"] == pytest.approx(planned)
    assert recs[2]["step_time_over_predicted"] == pytest.approx(0.30 / planned)
    assert recs[2]["predicted_peak_memory_bytes"] > 0
    s = th.versus_plan([123 << 20])
    assert s["steps_timed"] == len(times) - WARMUP_STEPS
    assert s["step_time_s"] == pytest.approx(statistics.median(times[WARMUP_STEPS:]))
    assert s["step_time_over_predicted"] == pytest.approx(s["step_time_s"] / planned)
    assert s["peak_memory_over_predicted"] == pytest.approx((123 << 20) / s["predicted_peak_memory_bytes"])
    assert "planned" in format_versus_plan(s)
    assert "profile" not in recs[2]     # the per-step records carry numbers; the summary names the rates' source


def test_the_summary_holds_the_largest_rank_to_the_plans_peak_stage():
    # Under a pipeline the plan's peak is its largest stage's, often not rank 0's: recipe=tiny PP2 on 2 CPU ranks
    # peaked at 485 MiB on rank 0 and 561 MiB on rank 1, planned 451 MiB. The summary sets the largest rank beside it.
    cfg = compose(["recipe=tiny", f"cluster.profile={PROFILE}", "parallel.pipeline_degree=2", "parallel.zero_stage=1"])
    th = Throughput(cfg, resolve_layout(cfg))
    for _ in range(WARMUP_STEPS + 1):
        th(th.plan["predicted_step_time_s"])
    s = th.versus_plan([485 << 20, 561 << 20])
    assert s["peak_memory_bytes"] == 561 << 20 and s["peak_memory_rank"] == 1
    assert s["peak_memory_bytes_per_rank"] == [485 << 20, 561 << 20]
    assert s["peak_memory_over_predicted"] == pytest.approx((561 << 20) / s["predicted_peak_memory_bytes"])
    assert "peak memory 561 MiB (rank 1, the largest of 2), planned" in format_versus_plan(s)
    assert "the largest" not in format_versus_plan(th.versus_plan([485 << 20]))     # one rank: nothing to name


@pytest.mark.parametrize("ratio, says", [(1.10, False), (0.90, False), (1.30, True), (0.70, True)])
def test_summary_says_what_to_check_when_the_step_is_off_the_plan(ratio, says):
    # More than 15% from the plan (issue 14 part 4's target): the summary names the profile whose rates the plan read
    # and what to do; within it, nothing more.
    cfg = compose(["recipe=tiny", f"cluster.profile={PROFILE}"])
    th = Throughput(cfg, resolve_layout(cfg))
    planned = th.plan["predicted_step_time_s"]
    for _ in range(WARMUP_STEPS + 3):
        th(planned * ratio)
    s = th.versus_plan([1 << 20])
    assert s["step_time_over_predicted"] == pytest.approx(ratio)
    line = format_versus_plan(s)
    assert ("more than 15% from the plan" in line) == says
    assert (str(PROFILE) in line and "launcher calibrate" in line) == says


def test_cpu_ranks_without_a_profile_record_no_prediction():
    cfg = compose(["recipe=tiny"])
    th = Throughput(cfg, resolve_layout(cfg))
    rec = th(0.25)
    assert "predicted_step_time_s" not in rec
    s = th.versus_plan([1 << 20])
    assert s["predicted_step_time_s"] is None and s["step_time_over_predicted"] is None
    assert "no plan prediction" in format_versus_plan(s)


def test_a_launch_that_timed_no_step_says_so():
    # A resume with no steps left times nothing: the summary has no median to put beside the plan.
    cfg = compose(["recipe=tiny", f"cluster.profile={PROFILE}"])
    s = Throughput(cfg, resolve_layout(cfg)).versus_plan([1 << 20])
    assert s["step_time_s"] is None
    assert "no step timed" in format_versus_plan(s)


@pytest.mark.parametrize("gemm, copy, replanned_over_measured, verdict", [
    (1.19, 1.24, 1.02, "explains"),     # the machine moved, and the plan at the rates read now holds the step
    (1.0, 0.80, 1.30, "moved"),         # it moved, and the plan misses even at the rates read now
    (0.5, 1.0, 0.70, "moved"),
    (1.05, 0.95, 1.30, "holds"),        # the rates are the profile's (within 10%): the miss is the model's
    (0.92, 1.08, 0.75, "holds"),
    (1.05, 1.05, 1.10, "explains")])    # within 10%, yet enough to take the step within 15% of the plan
def test_rates_read_after_a_miss_say_whether_the_machine_moved(gemm, copy, replanned_over_measured, verdict):
    # A run off its plan measures the GEMM and copy rates (metrics.check_rates) and plans the step again at them:
    # that plan within 15% of the step, the machine's move explains the miss (recalibrate); rates more than 10% from
    # the profile's but the plan still off, both; rates within 10%, the miss is the model's.
    cfg = compose(["recipe=tiny", f"cluster.profile={PROFILE}"])
    th = Throughput(cfg, resolve_layout(cfg))
    measured = th.plan["predicted_step_time_s"] * 0.7
    for _ in range(WARMUP_STEPS + 3):
        th(measured)
    s = th.versus_plan([1 << 20]) | {"rates_now": {"gemm_side": 128, "dtype": "fp32", "gemm_over_profile": gemm,
                                                 "memory_over_profile": copy,
                                                 "replanned_step_time_s": measured * replanned_over_measured}}
    line = format_versus_plan(s)
    assert (f"fp32 GEMM (side 128) runs at x{gemm:.2f} of the profile's rate and its copy at x{copy:.2f}; planned "
            f"with those rates the step is {measured * replanned_over_measured * 1e3:,.0f} ms (measured "
            f"x{1 / replanned_over_measured:.2f})") in line
    assert ("that explains the miss: run `launcher calibrate` here" in line) == (verdict == "explains")
    assert ("the plan misses even at the rates read now: run `launcher calibrate` here" in line) == (verdict == "moved")
    assert ("those rates hold, so the miss is in the plan's other terms" in line) == (verdict == "holds")


@pytest.mark.parametrize("steal, others, contended", [(0.12, 0.01, True), (0.02, 0.09, True), (0.03, 0.04, False)])
def test_a_miss_with_rates_that_hold_says_when_the_ranks_did_not_have_the_cores(steal, others, contended):
    # The rates read after the steps hold (the profile's within 10%) and the step still misses: where the hypervisor
    # (steal) and other processes took more than a tenth of the machine through the steps, the ranks did not run as
    # calibrate measured them, and the line says so before blaming the plan's terms.
    cfg = compose(["recipe=tiny", f"cluster.profile={PROFILE}"])
    th = Throughput(cfg, resolve_layout(cfg))
    measured = th.plan["predicted_step_time_s"] * 1.25
    for _ in range(WARMUP_STEPS + 3):
        th(measured)
    share = {"window_s": 1.84, "ranks": 2, "hosts": 1, "host": "here", "steal_fraction": steal,
             "others_fraction": others, "ranks_fraction": 0.80, "idle_fraction": 1 - 0.80 - steal - others}
    s = th.versus_plan([1 << 20]) | {"cpu_share": share, "rates_now": {
        "gemm_side": 128, "dtype": "fp32", "gemm_over_profile": 1.04, "memory_over_profile": 0.97,
        "replanned_step_time_s": measured / 1.25}}
    line = format_versus_plan(s)
    assert (f"over the timed steps (1.8 s) the hypervisor took {steal:.0%} of this machine's CPU time (steal), other "
            f"processes {others:.0%}, the run's 2 rank(s) on it 80%") in line
    assert ("the ranks did not have the cores to themselves through the steps" in line) == contended
    assert ("those rates hold, so the miss is in the plan's other terms" in line) == (not contended)


def test_cpu_share_counts_other_processes_and_the_ranks_own_time():
    # Real counters: this process (a rank) spins for a while, a child process spins alongside it; the window's
    # shares put the child's CPU seconds under other processes and this process's under the ranks. Both are read back
    # independently with getrusage. Lower bounds only for the others: the test's neighbours (xdist workers) add to them.
    import resource
    import subprocess
    import sys
    import time

    start = cpu_snapshot()
    self_before, kids_before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.8: pass"])
    t = time.process_time()
    while time.process_time() - t < 0.4:
        pass
    child.wait()
    end = cpu_snapshot()
    self_after = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    share = host_cpu_share([(start, end)])
    machine = {k: end["machine"][k] - start["machine"][k] for k in end["machine"]}
    total = sum(v for k, v in machine.items() if k not in ("guest", "guest_nice"))
    own = (self_after.ru_utime + self_after.ru_stime) - (self_before.ru_utime + self_before.ru_stime)
    assert share["ranks"] == 1 and share["window_s"] >= 0.8
    assert share["ranks_fraction"] * total == pytest.approx(own, abs=0.05)
    child_s = (kids.ru_utime + kids.ru_stime) - (kids_before.ru_utime + kids_before.ru_stime)
    assert child_s >= 0.8 and share["others_fraction"] * total >= 0.8 * child_s
    assert 0 <= share["steal_fraction"] < 1 and 0 <= share["idle_fraction"] < 1
    assert share["steal_fraction"] + share["others_fraction"] + share["ranks_fraction"] + share["idle_fraction"] \
        == pytest.approx(1)


def test_a_profile_calibrated_on_a_busy_machine_is_named_so_by_plan_and_train(tmp_path):
    # calibrate keeps each figure's three sweeps (measurements.sweep_spread) and takes their median; where they
    # disagree by more than 1.5x it warned that the machine was busy. A profile so measured says so again wherever
    # it is used: `launcher plan` warns, and a run off its plan names it beside the profile.
    import yaml

    from launcher.plan.profile import load_profile, profile_to_dict
    from launcher.plan.report import plan_summary

    doc = yaml.safe_load(PROFILE.read_text())
    doc["measurements"]["sweep_spread"] = {"memory_gbps": [11.9, 6.7, 10.3], "kernel_overhead_s": [5e-6, 5.1e-6, 5e-6]}
    busy = tmp_path / "busy.yaml"
    busy.write_text(yaml.safe_dump(doc, sort_keys=False))
    said = "memory_gbps read 11.9, 6.7, 10.3 in the 3 sweeps (1.8x apart; the profile takes the median, 10.3)"
    assert load_profile(str(busy)).noisy == (said,)
    assert load_profile(str(PROFILE)).noisy == ()           # the committed calibration's sweeps agreed
    assert "noisy" not in profile_to_dict(load_profile(str(busy)))   # derived when read, never written

    cfg = compose(["recipe=tiny", f"cluster.profile={busy}"])
    layout = resolve_layout(cfg)
    s = plan_summary(cfg, layout)
    assert s["profile_noisy"] == [said]
    assert (f"the machine was busy while cluster.profile={busy} was measured: {said}; the step time planned from it "
            "moves with that, so calibrate again when the machine is quiet") in s["warnings"]
    quiet = compose(["recipe=tiny", f"cluster.profile={PROFILE}"])
    assert plan_summary(quiet, resolve_layout(quiet))["profile_noisy"] == []

    th = Throughput(cfg, layout)
    for ratio, missed in ((1.0, False), (1.3, True)):
        th.step_times.clear()
        for _ in range(WARMUP_STEPS + 3):
            th(th.plan["predicted_step_time_s"] * ratio)
        line = format_versus_plan(th.versus_plan([1 << 20]))
        assert (f"whose rates come from cluster.profile={busy}, measured while the machine was busy ({said}): "
                "calibrate again when it is quiet") in line if missed else "busy" not in line


def test_the_plan_at_other_rates_is_the_plan_from_a_profile_with_them(tmp_path):
    # planned_step_s(gemm, memory) scales the loaded profile (profile.scaled); a file with those rates, read by
    # load_profile as `launcher plan` reads it, gives the same step.
    from launcher.runtime.metrics import planned_step_s
    from tests.conftest import rescaled_profile

    g, m = 1.3, 0.7
    other = tmp_path / "other.yaml"
    rescaled_profile(other, g, m)
    for overrides in (["parallel.zero_stage=3"], ["parallel.tensor_degree=2"], ["model.activation_checkpointing=true"]):
        cfg = compose(["recipe=tiny", f"cluster.profile={PROFILE}", *overrides])
        layout = resolve_layout(cfg)
        from_file = compose(["recipe=tiny", f"cluster.profile={other}", *overrides])
        assert planned_step_s(cfg, layout, g, m) == pytest.approx(planned_step_s(from_file, resolve_layout(from_file)))
        assert planned_step_s(cfg, layout, g, m) != pytest.approx(planned_step_s(cfg, layout))


def test_probe_rates_are_what_a_rank_of_the_run_should_read():
    # The GEMM at the profile's measured side nearest the model's (sharded) width, log distance; with more ranks
    # than the profile's compute slots each rank reads its share of the profile's alone rates.
    import yaml

    from launcher.plan.profile import load_profile

    doc = yaml.safe_load(PROFILE.read_text())
    table = dict((int(x), r) for x, r in doc["gemm_table"]["fp32"])
    prof = load_profile(str(PROFILE))
    assert doc["compute_slots"] == 2 and doc["measurements"]["local_world"] == 2
    for width, side in [(32, 32), (44, 32), (46, 64), (256, 256), (300, 256), (4096, 512), (8, 32)]:
        r = prof.probe_rates("fp32", width, 2)
        assert r["gemm_side"] == side and r["gemm_tflops"] == pytest.approx(table[side])
        assert r["memory_gbps"] == pytest.approx(doc["memory_gbps"])
        four = prof.probe_rates("fp32", width, 4)      # 4 ranks on 2 slots: half each
        assert four["gemm_tflops"] == pytest.approx(table[side] / 2)
        assert four["memory_gbps"] == pytest.approx(doc["memory_gbps"] / 2)
