"""bench/gpu/fused_elementwise.py, the GPU pack's measurement of the fused element-wise lever, run here on CPU at a
tiny shape, so that GPU minutes go to measuring: it runs to the end, the native RMSNorm replacement computes what
transformers' eager module does (output and input gradient), and the bytes it reports are the plan's count for that
shape, worked out below by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_fused_elementwise_bench_runs_on_cpu_and_the_replacement_matches(tmp_path):
    proc = subprocess.run([sys.executable, "bench/gpu/fused_elementwise.py", "--out", str(tmp_path), "--device", "cpu",
                           "--shapes", "tiny"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    doc = json.loads((tmp_path / "fused-elementwise.json").read_text())
    [r] = doc["results"]
    assert r["dims"] == {"micro_batch": 2, "seq": 64, "hidden": 128, "ffn": 352, "heads": 4, "kv_heads": 4}
    # Nothing compiled on CPU: eager everywhere, and the native RMSNorm beside it.
    assert {op: sorted(o["impls"]) for op, o in r["ops"].items()} == {
        "rmsnorm": ["eager", "native_rms_norm"], "swiglu": ["eager"], "rotary": ["eager"]}
    native = r["ops"]["rmsnorm"]["impls"]["native_rms_norm"]
    assert native["max_abs_eager"] > 1.0 and native["max_abs_diff_vs_eager"] <= 0.01 * native["max_abs_eager"]
    # bf16 (2 bytes), forward + backward = 3 x the forward's bytes. RMSNorm: x read, y written, 2 x 64 x 128 each.
    # SwiGLU: gate and up read, the product written, 2 x 64 x 352 each. Rotary: q and k (4 heads x 32 each, 4 KV
    # heads) read and written.
    assert r["ops"]["rmsnorm"]["fused_bytes"] == 3 * 2 * (2 * 64 * 128) * 2 == 196_608
    assert r["ops"]["swiglu"]["fused_bytes"] == 3 * 3 * (2 * 64 * 352) * 2 == 811_008
    assert r["ops"]["rotary"]["fused_bytes"] == 3 * 2 * (2 * 4 * 64 * 32 + 2 * 4 * 64 * 32) * 2 == 393_216
    assert all(v["seconds"] > 0 for o in r["ops"].values() for v in o["impls"].values()) and r["copy"]["gbps"] > 0
