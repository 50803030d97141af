"""launcher/runtime/preflight.py slow_cpu_bf16_warning, on this machine's real matmuls.

torch's slow bf16 path is the one it takes on CPUs without AVX-512 (the AVX2-only EPYC of 2026-12-02: 1.1 against
52 GFLOP/s fp32). Turning oneDNN off sends bf16 matmuls down that same reference kernel on any x86 CPU, so the
warning's branch is measured here for real, whatever CPU the suite runs on.
"""

import re

import pytest
import torch

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.runtime.preflight import BF16_SLOWER_THAN_FP32, slow_cpu_bf16_warning


def layout_of(*overrides):
    return resolve_layout(compose(["recipe=tiny", *overrides]))


def test_bf16_on_the_reference_kernel_warns_with_both_rates_and_the_fix():
    with torch.backends.mkldnn.flags(enabled=False):
        text = slow_cpu_bf16_warning(layout_of("precision=bf16"))
    assert text is not None, "bf16 matmuls off oneDNN ran at over half of fp32's rate"
    assert text.startswith("precision.dtype=bf16 on CPU ranks") and "precision=fp32" in text
    bf16, fp32 = map(float, re.search(r"ran at ([\d.]+) GFLOP/s in bf16 against ([\d.]+) in fp32", text).groups())
    assert fp32 + 0.05 > BF16_SLOWER_THAN_FP32 * (bf16 - 0.05) and bf16 > 0   # the text rounds each rate to 0.1
    slower = int(re.search(r"bf16 matmuls are (\d+)x slower than fp32", text).group(1))
    assert abs(slower - fp32 / bf16) <= 0.05 * slower + 1  # the ratio of the unrounded rates
    assert "oneDNN's bf16 path is off" in text


@pytest.mark.parametrize("overrides", [["precision=fp32"], ["cluster=a100-80gb", "cluster.gpus_per_node=2", "precision=bf16"]],
                         ids=["cpu-fp32", "gpu-bf16"])
def test_fp32_and_gpu_runs_are_not_measured(overrides):
    with torch.backends.mkldnn.flags(enabled=False):  # bf16 slow here: only the layout can keep the warning away
        assert slow_cpu_bf16_warning(layout_of(*overrides)) is None
