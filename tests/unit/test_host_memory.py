"""Host memory per node (launcher/plan/host.py): hand-computed terms, the refusal, and agreement with the
per-rank ledger of `launcher train --dry-run` (which counts the modules the runtime builds, on meta).

LLaMA-7B by hand (h 4096, L 32, heads 32, FFN 11008, V 32000, untied):
    block   = 4 h^2 + 3 h FFN + 2 h = 67,108,864 + 135,266,304 + 8,192 = 202,383,360
    total   = 2 V h + 32 block + h = 262,144,000 + 6,476,267,520 + 4,096 = 6,738,415,616
    TP-replicated per block: its two RMSNorm weights, 2 h = 8,192
    embedding (and the untied head) per TP2 rank: V/2 rows, 16,000 x 4,096 = 65,536,000 (vocab-parallel)
"""

from __future__ import annotations

import dataclasses

import pytest

from launcher.config import hardware
from launcher.config.compose import compose
from launcher.config.errors import ConfigError
from launcher.config.layout import resolve_layout
from launcher.plan.report import check_host_memory, host_summary

H100_NODE = ["recipe=llama-7b", "cluster.gpu=h100-80gb", "cluster.nodes=1", "cluster.gpus_per_node=8",
             "batch.global_batch_size=64", "batch.micro_batch_size=1", "train.tokens=2048000000"]


def _summary(overrides):
    cfg = compose(overrides)
    return cfg, resolve_layout(cfg), host_summary(cfg, resolve_layout(cfg))


def test_catalog_host_memory_is_the_dgx_datasheets():
    assert hardware.CATALOG["a100-40gb"].host_memory_gb == 1000.0    # DGX A100 320GB: 1TB
    assert hardware.CATALOG["a100-80gb"].host_memory_gb == 2000.0    # DGX A100 640GB: 2TB
    assert hardware.CATALOG["h100-80gb"].host_memory_gb == 2000.0    # DGX H100: 2TB
    assert hardware.CATALOG["h200"].host_memory_gb == 2000.0         # DGX H200: 2TB
    assert all("datasheet" in spec.host_source for spec in hardware.CATALOG.values())


def test_pipeline_tp_terms_by_hand():
    """PP 2 x TP 2 x DP 2, ZeRO 1, bf16: 16 blocks per stage, the embedding and head split over the vocabulary
    (V/2 rows a TP rank), the final norm whole."""
    _, _, h = _summary(H100_NODE + ["parallel.tensor_degree=2", "parallel.pipeline_degree=2"])
    block_per_tp_rank = (202_383_360 - 8_192) // 2 + 8_192                     # 101,195,776
    stage0 = 65_536_000 + 16 * block_per_tp_rank                               # embedding/2 + 16 blocks = 1,684,668,416
    stage1 = 16 * block_per_tp_rank + 4_096 + 65_536_000                       # 16 blocks + norm + head/2 = 1,684,672,512
    row_block = 256 * max(4096, 11008 // 2) * 4                                # one seeded 256-row block in fp32
    assert h["build_path"] == "pipeline"
    # ranks 0-3 are stage 0 (TP x DP = 4 per stage), ranks 4-7 stage 1: all on node 0.
    assert h["build_bytes_per_rank"] == [6_744_309_760] * 4 + [6_744_326_144] * 4
    assert stage0 * 4 + row_block == 6_744_309_760 and stage1 * 4 + row_block == 6_744_326_144
    assert h["build_bytes"] == 4 * 6_744_309_760 + 4 * 6_744_326_144
    # checkpoint: ZeRO 1's fp32 master partition = params / DP x 4 B, staged by torch.save
    assert h["checkpoint_bytes"] == 4 * (stage0 // 2 * 4) + 4 * (stage1 // 2 * 4) == 26_954_727_424
    assert h["offload_bytes"] == 0
    # data loader, 8 ranks: one micro-batch 1 x 2048 x 8 B + a blend block 2^18 x 16 B each; no per-sample
    # array (the sample order is a keyed permutation: 2,048,000,000 tokens cost nothing here)
    assert h["data_loader_bytes"] == 8 * (16_384 + 4_194_304)
    assert h["capacity_bytes"] == 2_000_000_000_000 and h["fits"] is True


def test_tp_without_stages_builds_its_shards_by_hand():
    """TP 2 x DP 4 at pipeline_degree 1 runs our TP layers (launcher/parallel/tensor_model.py): each rank builds its
    TP shards of the 32 blocks, V/2 rows of the embedding and of the head (vocab-parallel) and the final norm whole,
    not the whole model (DeepSpeed AutoTP, which this replaced, built 6,738,415,616 x 4 B = 26.95 GB per rank)."""
    _, _, h = _summary(H100_NODE + ["parallel.tensor_degree=2"])
    block_per_tp_rank = (202_383_360 - 8_192) // 2 + 8_192                     # 101,195,776
    own = 65_536_000 + 32 * block_per_tp_rank + 4_096 + 65_536_000              # 3,369,340,928
    row_block = 256 * max(4096, 11008 // 2) * 4                                # one seeded 256-row block in fp32
    assert h["build_path"] == "pipeline"
    assert h["build_bytes_per_rank"] == [own * 4 + row_block] * 8 == [13_482_999_808] * 8


def test_zero3_offload_terms_by_hand_and_refusal():
    """ZeRO-3 x DP 8 with optimizer offload: each rank builds its partition; the optimizer lives in host RAM."""
    over = H100_NODE + ["parallel.zero_stage=3", "parallel.offload_optimizer=true"]
    cfg, layout, h = _summary(over)
    held = 6_738_415_616 // 8                                                   # 842,301,952
    build = held * 2 + 32_000 * 4096 // 8 * 4 + 2 * 11008 * 4                  # bf16 partition + the fp32 rows it is cut from
    assert h["build_path"] == "zero3"
    assert h["build_bytes_per_rank"] == [build] * 8 == [1_750_227_968] * 8
    assert h["checkpoint_bytes"] == 0                                           # states already on the host
    assert h["offload_bytes"] == 8 * held * 16 == 107_814_649_856               # fp32 master + m + v + fp32 grads
    total = 8 * (1_750_227_968 + 13_476_831_232 + 4_194_304 + 16_384)          # 121,850,159,104
    assert h["total_bytes"] == total
    check_host_memory(cfg, layout)                                              # 121.9 GB of 2,000 GB: fits

    cfg = compose(over + ["cluster.host_memory_gb=100"])
    with pytest.raises(ConfigError) as e:
        check_host_memory(cfg, resolve_layout(cfg))
    err = e.value
    assert err.key == "cluster.host_memory_gb" and err.value == 100
    assert "needs 121.9 GB of host memory but has 100.0 GB" in err.rule
    assert "8 ranks x 1.8 GB = 14.0 GB" in err.rule and "CPU offload 107.8 GB" in err.rule
    assert "offload_optimizer=false" in err.fix and "cluster.gpus_per_node" in err.fix


def test_catalog_node_refusal_names_the_gpu_entry():
    """No cluster.host_memory_gb: the catalog's DGX A100 320GB node (1 TB) is what is exceeded, so the key is cluster.gpu.
    llama-65b whole-model build (no TP or PP, ZeRO 1): 8 ranks x the whole fp32 model (~261 GB) > 1,000 GB."""
    cfg = compose(["recipe=llama-65b", "cluster.gpu=a100-40gb", "cluster.nodes=8", "cluster.gpus_per_node=8",
                   "parallel.tensor_degree=1", "parallel.pipeline_degree=1", "parallel.zero_stage=1",
                   "batch.global_batch_size=64", "batch.micro_batch_size=1"])
    layout = resolve_layout(cfg)
    h = host_summary(cfg, layout)
    assert h["build_path"] == "whole" and h["fits"] is False
    with pytest.raises(ConfigError) as e:
        check_host_memory(cfg, layout)
    assert e.value.key == "cluster.gpu" and "1TB system memory" in e.value.rule
    assert "cluster.host_memory_gb" in e.value.fix


def test_cpu_cluster_is_not_checked_unless_given():
    cfg, layout, h = _summary(["recipe=tiny"])
    assert h["capacity_bytes"] is None and h["fits"] is None
    check_host_memory(cfg, layout)
    cfg = compose(["recipe=tiny", "cluster.host_memory_gb=0.001"])      # 1 MB: the tiny model's build alone exceeds it
    with pytest.raises(ConfigError) as e:
        check_host_memory(cfg, resolve_layout(cfg))
    assert e.value.key == "cluster.host_memory_gb"


def test_a_calibrated_profile_gives_the_node_capacity(tmp_path):
    """`launcher calibrate` records the node's RAM (host_memory_gb); with cluster.profile the check uses it, and
    cluster.host_memory_gb still wins over it."""
    import yaml

    from launcher.plan.profile import BUILTIN, profile_to_dict

    path = tmp_path / "box.yaml"
    path.write_text(yaml.safe_dump(profile_to_dict(dataclasses.replace(BUILTIN["h100-80gb"], host_memory_gb=0.001))))
    cfg, layout, h = _summary(["recipe=tiny", f"cluster.profile={path}"])
    assert h["capacity_bytes"] == 1_000_000 and h["capacity_source"].startswith(f"cluster.profile={path}")
    assert h["fits"] is False                      # recipe=tiny's 2 ranks build 2 x 5.3 MB (fp32) alone
    with pytest.raises(ConfigError) as e:
        check_host_memory(cfg, layout)
    assert e.value.key == "cluster.profile" and e.value.value == str(path)
    assert "has 0.0 GB" in e.value.rule and "cluster.host_memory_gb" in e.value.fix
    cfg, layout, h = _summary(["recipe=tiny", f"cluster.profile={path}", "cluster.host_memory_gb=8"])
    assert h["capacity_bytes"] == 8e9 and h["fits"] is True


@pytest.mark.parametrize("overrides", [
    ["recipe=bloom-176b"],
    ["recipe=llama2-70b"],
    H100_NODE + ["parallel.tensor_degree=2", "parallel.pipeline_degree=2"],
    H100_NODE + ["parallel.zero_stage=3"],
    H100_NODE + ["parallel.tensor_degree=2"],
], ids=["bloom-176b", "llama2-70b", "llama-7b-pp2-tp2", "llama-7b-zero3", "llama-7b-tp2"])
def test_build_peak_agrees_with_the_dry_run_ledger(overrides):
    """The plan's build bytes per rank equal the ledger's host bytes at build (counted from the runtime's meta
    modules); ZeRO-3 to the per-tensor rounding of its partitions (< 1 element per tensor)."""
    pytest.importorskip("torch")
    from launcher.runtime.dryrun import rank_ledger

    cfg, layout, h = _summary(overrides)
    ledger = [r["host_bytes_build"] for r in rank_ledger(cfg, layout) if r["node"] == h["node"]]
    assert ledger == pytest.approx(h["build_bytes_per_rank"], rel=1e-6)
    if h["build_path"] != "zero3":
        assert ledger == h["build_bytes_per_rank"]
