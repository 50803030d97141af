"""Every recipe composes, resolves, matches its published numbers, and its DeepSpeed config parses in DeepSpeed."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from tests.conftest import RECIPES

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "deepspeed"
REQUIRED_RECIPES = {"tiny", "llama-7b", "llama-13b", "llama-33b", "llama-65b", "llama2-70b", "gpt3-175b", "bloom-176b"}


def test_required_recipes_exist():
    assert REQUIRED_RECIPES <= set(RECIPES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_composes_and_resolves(resolve, recipe):
    cfg, layout = resolve([f"recipe={recipe}"])
    assert cfg.recipe_name == recipe
    assert layout.world_size == layout.model_parallel_size * layout.data_degree


def test_bloom_176b_published_layout(resolve):
    # BigScience tr11-176B-ml: 48 nodes x 8 A100-80GB; TP 4, PP 12, DP 8; micro 2, global 2048; seq 2048; bf16.
    cfg, layout = resolve(["recipe=bloom-176b"])
    assert (cfg.cluster.nodes, cfg.cluster.gpus_per_node, cfg.cluster.gpu) == (48, 8, "a100-80gb")
    assert (layout.tensor_degree, layout.pipeline_degree, layout.data_degree) == (4, 12, 8)
    assert (layout.micro_batch_size, layout.global_batch_size, layout.grad_accum_steps) == (2, 2048, 128)
    assert layout.tokens_per_step == 4_194_304 and layout.dtype == "bf16"
    assert cfg.model.vocab_size == 250_880 and cfg.model.activation_checkpointing


@pytest.fixture(scope="module")
def single_rank_process_group():
    """A real one-rank gloo group, so DeepSpeed's config parser runs its distributed code path."""
    import deepspeed
    import deepspeed.comm as ds_dist

    from launcher.runtime.distributed import avoid_shm_comm_build

    # DeepSpeed would JIT-compile its shared-memory all-reduce op here (~107 s on 2 cores).
    avoid_shm_comm_build("cpu")
    if not ds_dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        deepspeed.init_distributed("gloo", auto_mpi_discovery=False, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    ds_dist.destroy_process_group()


class _DataParallelSize:
    """What DeepSpeedConfig reads from an `mpu`: the rank count of its batch assertion.

    We cannot start 384 ranks here, so this stands in for the world DeepSpeed would see:
    with a pipeline, the topology's data-parallel size; without one, dist world / sequence_parallel_size
    (both rules read from deepspeed/runtime/config.py, DeepSpeedConfig.__init__).
    """

    def __init__(self, size: int):
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


def _deepspeed_world(layout) -> int:
    if layout.pipeline_layers:   # our layer list (a pipeline, or any TP): its grid is the mpu
        return layout.data_degree * (layout.context_degree if layout.pipeline_engine else 1)
    return layout.world_size // layout.sequence_degree


def _parse(ds: dict, layout):
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig(json.loads(json.dumps(ds)), mpu=_DataParallelSize(_deepspeed_world(layout)))


@pytest.mark.parametrize("recipe", RECIPES)
def test_deepspeed_accepts_recipe_config(resolve, single_rank_process_group, recipe):
    from launcher.deepspeed_config import build_deepspeed_config

    cfg, layout = resolve([f"recipe={recipe}"])
    ds = build_deepspeed_config(cfg, layout)
    parsed = _parse(ds, layout)
    assert parsed.train_micro_batch_size_per_gpu == layout.micro_batch_size
    assert parsed.gradient_accumulation_steps == layout.grad_accum_steps
    assert parsed.gradient_clipping == cfg.optimizer.grad_clip
    assert parsed.zero_optimization_stage == layout.zero_stage
    assert parsed.bfloat16_config.enabled == (layout.dtype == "bf16")


LAYOUT_VARIANTS = [
    ["recipe=tiny", "parallel.zero_stage=3"],
    ["recipe=tiny", "parallel.zero_stage=0", "precision=bf16"],
    ["recipe=tiny", "parallel.tensor_degree=2", "parallel.zero_stage=1"],
    ["recipe=tiny", "parallel.pipeline_degree=2", "parallel.zero_stage=1", "batch.micro_batch_size=2"],
    ["recipe=tiny", "parallel.sequence_degree=2"],
    ["recipe=tiny", "parallel.offload_optimizer=true"],
    ["recipe=llama-7b", "precision=fp16"],
    ["recipe=llama-7b", "parallel.zero_stage=3", "parallel.offload_param=true", "parallel.offload_optimizer=true"],
    ["recipe=llama-7b", "scheduler=constant"],
    ["recipe=llama-13b", "parallel.sequence_degree=2", "data.seq_length=2048"],
    ["recipe=llama-13b", "parallel.sequence_degree=2", "data.seq_length=2048", "parallel.zero_stage=3"],
]


@pytest.mark.parametrize("overrides", LAYOUT_VARIANTS, ids=" ".join)
def test_deepspeed_accepts_layout_variants(resolve, single_rank_process_group, overrides):
    from launcher.deepspeed_config import build_deepspeed_config

    cfg, layout = resolve(overrides)
    parsed = _parse(build_deepspeed_config(cfg, layout), layout)
    assert parsed.train_batch_size == layout.micro_batch_size * layout.grad_accum_steps * _deepspeed_world(layout)


@pytest.mark.parametrize("reduce", ["null", "fp32"])
def test_deepspeed_reduces_gradients_in_the_reduce_dtype_under_ulysses_too(resolve, single_rank_process_group, reduce):
    """DeepSpeed reads seq_parallel_communication_data_type when sequence_parallel_size > 1 (fp32 when the key is
    absent) and communication_data_type otherwise: the config the launcher writes gives both precision.reduce_dtype,
    the model's bf16 unless set (config.layout.reduce_dtype)."""
    import torch
    from launcher.deepspeed_config import build_deepspeed_config

    want = torch.float32 if reduce == "fp32" else torch.bfloat16
    for sp in ("parallel.sequence_degree=2", "parallel.sequence_degree=1"):
        cfg, layout = resolve(["recipe=tiny", "precision=bf16", sp, f"precision.reduce_dtype={reduce}"])
        parsed = _parse(build_deepspeed_config(cfg, layout), layout)
        assert parsed.seq_parallel_communication_data_type == want
        assert parsed.communication_data_type == want


def test_tensor_parallel_batch_counts_data_ranks(resolve):
    """TP at pipeline_degree = 1 runs our layers with their grid as the mpu, so DeepSpeed's batch assertion counts
    the data-parallel ranks only (deepspeed_batch_world). AutoTP, which counted every TP rank as a replica (train_batch_size
    tensor_degree times the global batch), is no longer configured."""
    from launcher.deepspeed_config import build_deepspeed_config

    cfg, layout = resolve(["recipe=tiny", "parallel.tensor_degree=2", "parallel.zero_stage=1"])
    ds = build_deepspeed_config(cfg, layout)
    assert layout.data_degree == 1 and layout.global_batch_size == 16
    assert ds["train_batch_size"] == 16  # micro 8 x accum 2 x data_degree 1
    assert "tensor_parallel" not in ds


@pytest.mark.parametrize("overrides,reduce_scatter,bucket", [
    # Ulysses x ZeRO-3: DeepSpeed's reduce-scatter path divides by dp x sp (launcher/deepspeed_config.py,
    # zero3_sequence_parallel_reduction); LLaMA-7B's largest tensor (32,000 x 4,096) fits the default bucket.
    (["parallel.sequence_degree=2", "parallel.zero_stage=3"], False, 500_000_000),
    # A Llama 3 vocabulary: the 128,256 x 4,096 = 525,336,576-element embedding would not fit the default
    # bucket and would be reduced on the reduce-scatter path alone.
    (["parallel.sequence_degree=2", "parallel.zero_stage=3", "model.vocab_size=128256"], False, 525_336_576),
    # ZeRO-1/2 scale by sequence_parallel_size on every path; ZeRO-3 without SP has nothing to correct.
    (["parallel.sequence_degree=2", "parallel.zero_stage=1"], True, 500_000_000),
    (["parallel.sequence_degree=2", "parallel.zero_stage=2"], True, 500_000_000),
    (["parallel.zero_stage=3", "model.vocab_size=128256"], True, 500_000_000),
    # Ring-attention CP goes through the same DeepSpeed sequence-parallel reduction (launcher/parallel/context.py).
    (["parallel.context_degree=2", "parallel.zero_stage=3"], False, 500_000_000),
    (["parallel.context_degree=2", "parallel.zero_stage=1"], True, 500_000_000),
])
def test_ulysses_zero3_reduces_without_reduce_scatter(resolve, overrides, reduce_scatter, bucket):
    from launcher.deepspeed_config import build_deepspeed_config

    cfg, layout = resolve(["recipe=llama-7b", *overrides])
    ds = build_deepspeed_config(cfg, layout)
    zero = ds["zero_optimization"]
    assert (zero["reduce_scatter"], zero["reduce_bucket_size"]) == (reduce_scatter, bucket)
    assert ds.get("sequence_parallel_size", 1) == layout.sequence_degree * layout.context_degree
    assert zero["contiguous_gradients"]  # the all-reduce path is the contiguous-buffer one


def test_fp16_config_uses_dynamic_loss_scaling(resolve):
    from launcher.deepspeed_config import build_deepspeed_config

    cfg, layout = resolve(["recipe=llama-7b", "precision=fp16"])
    fp16 = build_deepspeed_config(cfg, layout)["fp16"]
    assert fp16["enabled"] and fp16["loss_scale"] == 0 and fp16["initial_scale_power"] == 16


def test_the_launcher_sets_immediate_grad_update_where_bf16_optimizer_runs(resolve):
    """deepspeed_config asks for immediate_grad_update exactly where the plan says BF16_Optimizer runs (its bytes
    and equivalence: tests/plan/test_bf16_accumulation.py)."""
    from launcher.deepspeed_config import build_deepspeed_config

    for overrides, runs in ((["recipe=bloom-176b"], True),
                            (["recipe=tiny", "precision=bf16", "parallel.pipeline_degree=2", "parallel.zero_stage=0"],
                             True),
                            (["recipe=tiny", "precision=bf16", "parallel.zero_stage=1"], False),
                            (["recipe=tiny", "precision=bf16", "parallel.pipeline_degree=2", "parallel.zero_stage=1"],
                             False)):
        cfg, layout = resolve(overrides)
        ds = build_deepspeed_config(cfg, layout)
        assert ds["bf16"].get("immediate_grad_update", False) is runs, overrides


@pytest.mark.parametrize("recipe", RECIPES)
def test_golden_deepspeed_json(resolve, recipe):
    """Pinned DeepSpeed JSON per recipe (reviewed by hand). Regenerate with LAUNCHER_UPDATE_GOLDEN=1 after a deliberate change."""
    from launcher.deepspeed_config import build_deepspeed_config

    cfg, layout = resolve([f"recipe={recipe}"])
    got = build_deepspeed_config(cfg, layout)
    path = GOLDEN / f"{recipe}.json"
    if os.environ.get("LAUNCHER_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())
