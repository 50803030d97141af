"""bench/gpu/sustained_gemm.py, the GPU pack's check of whether a burst GEMM rate holds under sustained load, run
here on CPU at a tiny shape, so that GPU minutes go to measuring: it runs to the end, each window's rate is its GEMM
count x 2 side^3 over its seconds, and the summary is the first window against the median of the last third."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sustained_gemm_bench_runs_on_cpu_and_its_rates_are_its_counts(tmp_path):
    proc = subprocess.run([sys.executable, "bench/gpu/sustained_gemm.py", "--out", str(tmp_path), "--device", "cpu",
                           "--dtype", "fp32", "--side", "64", "--seconds", "1.5", "--window", "0.25"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    doc = json.loads((tmp_path / "sustained-gemm.json").read_text())
    assert (doc["device"], doc["dtype"], doc["side"], doc["flops_per_gemm"]) == ("cpu", "fp32", 64, 2 * 64 ** 3)
    windows = doc["windows"]
    assert len(windows) >= 4
    for w in windows:
        assert w["elapsed_s"] >= 0.25 and w["gemms"] % 4 == 0 and w["gemms"] > 0
        assert w["tflops"] == w["gemms"] * 2 * 64 ** 3 / w["elapsed_s"] / 1e12
        assert w["clocks_sm"] is None and w["power_draw"] is None       # no nvidia-smi query on CPU
    # windows follow each other: the last ends at or after --seconds
    assert [w["t_s"] for w in windows] == sorted(w["t_s"] for w in windows) and windows[-1]["t_s"] >= 1.5
    last = windows[-(len(windows) // 3):]
    s = doc["summary"]
    assert s["burst_tflops"] == windows[0]["tflops"] and s["windows_in_sustained"] == len(last)
    assert s["sustained_tflops"] == statistics.median(w["tflops"] for w in last)
    assert s["sustained_over_burst"] == s["sustained_tflops"] / s["burst_tflops"]
    assert "burst" in proc.stdout and "sustained" in proc.stdout


def test_a_window_reads_nvidia_smis_csv_line_and_what_it_does_not_report_is_none():
    # nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu
    # --format=csv,noheader,nounits prints one line like these (no GPU here: printf stands in for its output).
    sys.path.insert(0, str(REPO / "bench" / "gpu"))
    try:
        import sustained_gemm as bench
    finally:
        sys.path.pop(0)

    def read(line: str) -> dict:
        return bench._smi_read(subprocess.Popen(["printf", line], stdout=subprocess.PIPE, text=True))

    assert read("1755, 1980, 689.43, 700.00, 71\n") == {
        "clocks_sm": 1755.0, "clocks_max_sm": 1980.0, "power_draw": 689.43, "power_limit": 700.0, "temperature_gpu": 71.0}
    assert read("1410, 1410, [N/A], 400.00, 55\n")["power_draw"] is None
    assert set(read("garbled\n").values()) == {None}
    assert bench._smi_read(None)["clocks_sm"] is None
