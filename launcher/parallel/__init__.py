"""Pipeline and tensor parallelism on DeepSpeed: pipeline.py (PipelineModule), tensor.py (Megatron-style TP)."""

from __future__ import annotations


def skip_cpu_shm_comm_build() -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory all-reduce op on CPU ranks.

    deepspeed.comm's TorchBackend builds `deepspeed_shm_comm` whenever the op probes as
    compatible (deepspeed/comm/torch.py, build_shm_op), which on Linux CPU ranks means a
    ~1 min C++ compile per fresh TORCH_EXTENSIONS_DIR, and gloo works without it. The
    compatibility table is a cached module-level dict (deepspeed/ops/__init__.py keeps one
    dict "so edits to it persist"); call this before deepspeed.init_distributed.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
