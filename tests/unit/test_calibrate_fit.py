"""The arithmetic of `launcher calibrate` that runs in the parent process (no ranks): the median-of-sweeps merge and
the fits, against numbers worked out by hand."""

from __future__ import annotations

import pytest

from launcher.runtime.calibrate import (ATTN_CPU_FULL_WIDTH_SEQ, ATTN_WIDTH, SPLIT_MICRO_BATCHES, _attention_heads,
                                        _median_of, _median_time, fit_alpha_beta, fit_saturation,
                                        median_rows, noisy_sweeps, pooled_release, probe_repeats, release_seconds,
                                        zero3_split,
                                        split_by_micro_batches, sweep_spread, wait_fraction)


def _sweep(scale: float, overhead: float, gbps: float) -> dict:
    return {"gemm": {"fp32": [[32, 1.0 * scale], [64, 2.0 * scale]], "bf16": [[32, 3.0 * scale]]},
            "attention": {"fp32": [[64, 5.0 * scale]], "bf16": [[64, 7.0 * scale]]},
            "memory_gbps": gbps, "kernel_overhead_s": overhead}


def test_median_of_sweeps_drops_the_disturbed_sweep():
    # Sweep 2 is slow everywhere (a neighbour ran): each item is the middle of the three, never sweep 2's.
    med = _median_of([_sweep(1.0, 3e-6, 10.0), _sweep(0.5, 9e-6, 11.0), _sweep(0.9, 4e-6, 12.0)])
    assert med["gemm"] == {"fp32": [[32, 0.9], [64, 1.8]], "bf16": [[32, 2.7]]}
    assert med["attention"] == {"fp32": [[64, 4.5]], "bf16": [[64, 6.3]]}
    assert med["memory_gbps"] == 11.0 and med["kernel_overhead_s"] == 4e-6


def test_median_of_is_per_item_not_per_sweep():
    a, b, c = _sweep(1.0, 3e-6, 10.0), _sweep(1.0, 3e-6, 10.0), _sweep(1.0, 3e-6, 10.0)
    a["gemm"]["fp32"][0][1] = 0.25     # sweep a slow at side 32 only
    b["gemm"]["fp32"][1][1] = 0.5      # sweep b slow at side 64 only
    assert _median_of([a, b, c])["gemm"]["fp32"] == [[32, 1.0], [64, 2.0]]


def test_median_of_keeps_the_gpu_host_cost_per_operator():
    sweeps = [{**_sweep(1.0, 1e-6, 10.0), "kernel_host_s": h} for h in (15e-6, 20e-6, 14e-6)]
    assert _median_of(sweeps)["kernel_host_s"] == 15e-6
    assert "kernel_host_s" not in _median_of([_sweep(1.0, 3e-6, 10.0)])    # CPU sweeps have none


def test_sweep_spread_keeps_each_sweep_and_names_what_moved():
    # Three rows at side 64 per sweep, as calibrate times them (forward, input- and weight-gradient GEMMs): the
    # kept figure is their middle one. The copy read 20.0, 10.6, 21.0 GB/s (1.98x apart, over 1.5): named, with
    # its median; the GEMM rates (0.9x) and the overheads (1.25x) are not.
    sweeps = [_sweep(1.0, 4e-6, 20.0), _sweep(0.9, 5e-6, 10.6), _sweep(1.0, 4e-6, 21.0)]
    for x in sweeps:
        x["gemm"]["fp32"] += [[64, x["gemm"]["fp32"][1][1] * 0.5], [64, x["gemm"]["fp32"][1][1] * 3]]
    spread = sweep_spread(sweeps)
    assert spread == {"memory_gbps": [20.0, 10.6, 21.0], "kernel_overhead_s": [4e-6, 5e-6, 4e-6],
                      "gemm_fp32_side_64": [2.0, 1.8, 2.0], "gemm_bf16_side_32": [3.0, 2.7, 3.0]}
    assert noisy_sweeps(spread) == ["memory_gbps read 20, 10.6, 21 in the 3 sweeps (2.0x apart; the profile takes "
                                    "the median, 20)"]
    # 1.45x apart everywhere (copy 20 -> 29 GB/s, GEMMs 1 -> 0.69x, overhead 4 -> 5.8 us): under the line, nothing said.
    assert noisy_sweeps(sweep_spread([_sweep(1.0, 4e-6, 20.0), _sweep(0.69, 5.8e-6, 29.0)])) == []


def test_median_time_queues_calls_between_synchronisations():
    # On a GPU calibrate times `calls` calls queued back to back per synchronisation, as a step queues its kernels:
    # each timed run is `calls` calls and one sync, and the result is per call.
    calls, syncs = [], []
    _median_time(lambda: calls.append(1), lambda: syncs.append(1), repeats=3, budget_s=0.0, calls=4)
    assert len(calls) == 1 + 3 * 4 and len(syncs) == 1 + 3      # one warm-up call, then 3 runs of 4
    # Per call: 4 calls of a 20 ms sleep time as one 20 ms call, not 80 ms.
    import time
    assert 0.015 < _median_time(lambda: time.sleep(0.02), lambda: None, repeats=3, budget_s=0.0, calls=4) < 0.07


def test_median_time_takes_two_runs_of_a_call_longer_than_its_budget_and_three_otherwise():
    # A call that alone outlasts the budget (a CPU rank's attention at 4,096 tokens: 1-2 s) is timed twice after its
    # warm-up, or twice with none where the caller has warmed the kernel; a shorter one three times.
    import time
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.06)
    assert 0.05 < _median_time(slow, lambda: None, repeats=10, budget_s=0.04) < 0.2
    assert len(calls) == 1 + 2
    calls.clear()
    _median_time(slow, lambda: None, repeats=10, budget_s=0.04, warm=False)
    assert len(calls) == 2
    calls.clear()
    _median_time(slow, lambda: None, repeats=10, budget_s=0.1)     # 0.06 s a run: under the budget
    assert len(calls) == 1 + 3


def test_attention_probe_narrows_only_cpu_calls_past_the_full_width_length():
    # Full width (256 / head dimension heads) up to 1,024 tokens; past it the heads that keep a call's work at the
    # full width's at 1,024 (work ~ heads x seq^2), one at least; GPU calls always at the full width.
    assert ATTN_WIDTH["cpu"] == 256 and ATTN_CPU_FULL_WIDTH_SEQ == 1024
    assert [_attention_heads("cpu", 32, s) for s in (64, 1024, 2048, 4096)] == [8, 8, 2, 1]
    assert [_attention_heads("cpu", 64, s) for s in (64, 1024, 2048, 4096)] == [4, 4, 1, 1]
    assert [_attention_heads("cpu", 128, s) for s in (1024, 2048, 4096)] == [2, 1, 1]
    assert [_attention_heads("cuda", 128, s) for s in (1024, 4096, 16384)] == [16, 16, 16]


def test_fit_saturation_recovers_plateau_and_half():
    # rate = P x / (x + h) with P = 100, h = 64, sampled exactly.
    pts = [[x, 100.0 * x / (x + 64.0)] for x in (32, 64, 128, 256, 512)]
    plateau, half = fit_saturation(pts)
    assert plateau == pytest.approx(100.0) and half == pytest.approx(64.0)


def test_fit_alpha_beta_recovers_latency_and_bus_bandwidth():
    # 2 ranks: t = 1 ms + 2 (1/2) B / (2 GB/s) = 1e-3 + B / 2e9.
    pts = [[b, 1e-3 + b / 2e9] for b in (4 << 10, 1 << 20, 16 << 20)]
    lat, bus = fit_alpha_beta(pts, world=2)
    assert lat == pytest.approx(1e-3) and bus == pytest.approx(2.0)


def test_fit_saturation_stays_within_what_one_h200_measured():
    """The H200's raw GEMM and SDPA rates (bench/gpu/results/2026-11-26-h200/profile-h200.yaml, `measurements`):
    bf16 GEMMs dip at side 8192 and attention still climbs steeply at 4096. The old 1/rate fit said "802 TFLOP/s
    from size 0" and "fp32 attention at 1,462 TFLOP/s" (34 measured); each summary must stay near the rates seen."""
    from pathlib import Path

    import yaml

    doc = yaml.safe_load((Path(__file__).parents[2] / "bench/gpu/results/2026-11-26-h200/profile-h200.yaml").read_text())
    for kind in ("gemm", "attention"):
        for dtype, pts in doc["measurements"][kind].items():
            plateau, half = fit_saturation(pts)
            best, largest = max(r for _, r in pts), max(x for x, _ in pts)
            assert 0.9 * best <= plateau <= 1.25 * best, (kind, dtype, plateau, best)
            assert 0 < half <= largest, (kind, dtype, half)


def test_straggler_wait_is_read_from_arrivals_not_durations():
    # Two ranks whose segments take the same 10 ms, but the release lets rank 1 go 1 ms later every time: it arrives
    # 1 ms after rank 0, so the pair waits 1 - 0.5 = 0.5 ms past the mean arrival a segment, 5% of it (the spread
    # of the durations alone, the probe's reading until 2026-11-27, is 0).
    mean, fraction = wait_fraction([[0.010, 0.010], [0.010, 0.010]], [[1.000, 2.000], [1.001, 2.001]], 2)
    assert mean == pytest.approx(0.010) and fraction == pytest.approx(0.05)
    # Four ranks, one repeat, arrivals 0 / 2 / 0 / 4 ms after the first: pairs (0, 2) and (0, 4) wait 1 and 2 ms past
    # their means, 1.5 ms on average; the group of four 4 - 1.5 = 2.5 ms. Mean segment (10 + 30 + 20 + 20) / 4 = 20 ms.
    arrivals = [[5.000], [5.002], [5.000], [5.004]]
    durations = [[0.010], [0.030], [0.020], [0.020]]
    assert wait_fraction(durations, arrivals, 2) == pytest.approx([0.020, 0.0015 / 0.020])
    assert wait_fraction(durations, arrivals, 4) == pytest.approx([0.020, 0.0025 / 0.020])


def test_release_is_the_groups_mean_exit_after_its_last_arrival():
    # Two ranks, [arrival, exit] stamps in seconds, the first repeat a warm-up. Repeat 1: arrivals 5.0 / 5.5, exits
    # 6.5 / 6.6: (6.55 - 5.5) = 1.05; repeat 2: arrivals 10.0 / 10.2, exits 11.0 / 11.1: 0.85; mean 0.95. Segments:
    # each arrival less the same rank's previous exit: 4.0, 3.5, 4.3, 3.6; mean 3.85.
    stamps = [[[0.0, 1.0], [5.0, 6.5], [10.0, 11.0]], [[0.0, 1.2], [5.5, 6.6], [10.2, 11.1]]]
    assert release_seconds(stamps, 2) == pytest.approx([3.85, 0.95])
    # Four ranks in pairs: each pair by its own last arrival (1.0 after 2.0 for the first, 0.5 after 3.0 for the
    # second); one kept repeat each.
    four = [[[0.0, 0.0], [1.0, 3.0]], [[0.0, 0.0], [2.0, 3.0]], [[0.0, 0.0], [3.0, 3.5]], [[0.0, 0.0], [2.0, 3.5]]]
    assert release_seconds(four, 2) == pytest.approx([2.0, (1.0 + 0.5) / 2])


def test_release_rows_are_pooled_by_their_synchronisations():
    # CPU targets 5, 20, 60, 150 ms are timed 100, 25, 8 and 4 times a round (0.5 s each, 4 to 100); rows of 2, 1, 4
    # and 3 ms pool to (100 x 2 + 25 x 1 + 8 x 4 + 4 x 3) / 137 = 269 / 137 ms at every measured segment length.
    rows = [[0.0055, 0.002], [0.0201, 0.001], [0.0598, 0.004], [0.151, 0.003]]
    assert [probe_repeats(t) for t in (0.005, 0.02, 0.06, 0.15)] == [100, 25, 8, 4]
    pooled = pooled_release(rows, "cpu")
    assert [t for t, _ in pooled] == [t for t, _ in rows]
    assert [c for _, c in pooled] == pytest.approx([0.269 / 137] * 4)


def test_probe_rounds_are_combined_row_by_row_by_their_median():
    # Three rounds of the collectives (a list of [bytes, seconds] rows) and of the release ({group size: rows}); the
    # second round's all-to-all was disturbed at 4 KiB (2 ms against 0.3 / 0.4) and the third's release at 5 ms.
    coll = [{"all_to_all_after_compute": [[4096, 3e-4], [65536, 6e-4]], "groups": {"2": [[4096, 1e-4]]}},
            {"all_to_all_after_compute": [[4096, 2e-3], [65536, 5e-4]], "groups": {"2": [[4096, 3e-4]]}},
            {"all_to_all_after_compute": [[4096, 4e-4], [65536, 7e-4]], "groups": {"2": [[4096, 2e-4]]}}]
    assert median_rows(coll) == {"all_to_all_after_compute": [[4096, 4e-4], [65536, 6e-4]],
                                 "groups": {"2": [[4096, 2e-4]]}}
    release = [{"2": [[0.0051, 1.5e-3], [0.151, 1.9e-3]]}, {"2": [[0.0049, 1.7e-3], [0.149, 1.6e-3]]},
               {"2": [[0.0050, 9.0e-3], [0.150, 2.0e-3]]}]
    assert median_rows(release) == {"2": [[0.0050, 1.7e-3], [0.150, 1.9e-3]]}
    assert median_rows([{}, {}, {}]) == {}       # one rank: no release table in any round


def test_split_by_micro_batches_takes_the_added_micro_batches_apart_from_the_step():
    assert SPLIT_MICRO_BATCHES == 3
    # 1.16 ms a step with one micro-batch, 1.38 with three: 0.11 each micro-batch, 1.05 once a step.
    assert split_by_micro_batches(1.16e-3, 1.38e-3) == pytest.approx((0.11e-3, 1.05e-3))
    # Differences of medians can come out below 0: clipped.
    assert split_by_micro_batches(1e-3, 0.9e-3) == (0.0, 1e-3)
    assert split_by_micro_batches(1e-3, 5e-3) == (2e-3, 0.0)


def test_zero3_hooks_are_split_from_the_median_of_their_rounds():
    # Costs per unit (ms) at 1 and 3 micro-batches a step; round 2 was disturbed (4-5x). Medians: linear 1.2 / 1.4,
    # wrapped 1.6 / 2.0. Linear: (1.4 - 1.2) / 2 = 0.1 a micro-batch, 1.2 - 0.1 = 1.1 a step; wrapped 0.2 and 1.4. A
    # module is wrapped - linear (0.1 a micro-batch, 0.3 a step), a parameter linear - module (0 and 0.8).
    rounds = [{"linear/1": 1.2e-3, "linear/3": 1.4e-3, "wrapped/1": 1.6e-3, "wrapped/3": 2.0e-3},
              {"linear/1": 5.0e-3, "linear/3": 6.0e-3, "wrapped/1": 7.0e-3, "wrapped/3": 9.0e-3},
              {"linear/1": 1.0e-3, "linear/3": 1.2e-3, "wrapped/1": 1.4e-3, "wrapped/3": 1.8e-3}]
    assert zero3_split(rounds) == pytest.approx({"zero3_module_s": 0.1e-3, "zero3_param_s": 0.0,
                                                 "zero3_module_step_s": 0.3e-3, "zero3_param_step_s": 0.8e-3,
                                                 "zero3_recompute_param_s": 0.0}, abs=1e-12)


def test_zero3_recompute_figure_is_the_checkpointed_unit_over_the_wrapped_one_round_by_round():
    # The checkpointed Linear (in its wrapper) at 1 micro-batch against the wrapped Linear of the same round; the
    # median of the rounds' differences (0.3, -0.1, 0.9 ms -> 0.3), not the difference of the medians (1.9 - 1.6).
    rounds = [{"linear/1": 1.2e-3, "linear/3": 1.6e-3, "wrapped/1": 1.6e-3, "wrapped/3": 2.2e-3, "recompute/1": 1.9e-3},
              {"linear/1": 1.1e-3, "linear/3": 1.5e-3, "wrapped/1": 1.0e-3, "wrapped/3": 2.1e-3, "recompute/1": 0.9e-3},
              {"linear/1": 1.3e-3, "linear/3": 1.7e-3, "wrapped/1": 1.7e-3, "wrapped/3": 2.3e-3, "recompute/1": 2.6e-3}]
    assert zero3_split(rounds)["zero3_recompute_param_s"] == pytest.approx(0.3e-3)
    # Below the wrapped unit (a median difference under 0): clipped at 0.
    for r in rounds:
        r["recompute/1"] = r["wrapped/1"] - 0.1e-3
    assert zero3_split(rounds)["zero3_recompute_param_s"] == 0.0