"""TORCH_CUDA_ARCH_LIST as DeepSpeed's JIT builder can read it (launcher/runtime/distributed.py).

The GPU image sets "9.0a"; DeepSpeed 0.19.8 failed FusedAdam's build on it with "invalid literal for int() with
base 10: '0a'" (bench/gpu/results.md). The rewritten lists below are run through DeepSpeed's own parsing code.
"""

import os

import pytest

from launcher.runtime.distributed import deepspeed_arch_list, readable_arch_list_for_deepspeed


@pytest.mark.parametrize("value, expected", [
    ("9.0a", "9.0"),
    ("8.0;9.0a", "8.0;9.0"),
    ("9.0a+PTX", "9.0+PTX"),
    ("9.0 9.0a 10.0a", "9.0;10.0"),   # spaces are separators too; the duplicate 9.0 goes
])
def test_arch_specific_entries_lose_their_suffix(value, expected):
    assert deepspeed_arch_list(value) == expected


@pytest.mark.parametrize("value", ["", "9.0", "8.0;8.6;9.0+PTX", "7.5 8.0"])
def test_lists_deepspeed_reads_are_left_alone(value):
    assert deepspeed_arch_list(value) is None


def test_deepspeed_parses_the_rewritten_list(monkeypatch):
    """DeepSpeed's compute_capability_args on the image's value fails, and on ours gives sm_90 code (CPU: the
    builder's parsing needs no GPU when TORCH_CUDA_ARCH_LIST names the archs)."""
    from deepspeed.ops.op_builder.builder import CUDAOpBuilder

    class Probe(CUDAOpBuilder):
        NAME = "probe"

        def __init__(self):
            super().__init__(name=self.NAME)

        def absolute_name(self):
            return "probe"

        def sources(self):
            return []

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    with pytest.raises(ValueError, match="0a"):
        Probe().compute_capability_args()
    readable_arch_list_for_deepspeed()  # what a GPU rank of `launcher train` runs before the engine
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0"
    args = Probe().compute_capability_args()
    assert any("sm_90" in a for a in args), args
