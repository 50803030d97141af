"""The per-operator step-time model (launcher/plan/steptime.py) against hand-derived cases.

Each expected value is written from the formula's derivation (module docstring) with a profile that makes
every term but the one under test free, not printed by the code under test.
"""

from __future__ import annotations

import dataclasses

import pytest

from launcher.config.compose import compose
from launcher.config.errors import ConfigError
from launcher.config.layout import resolve_layout
from launcher.plan import steptime
from launcher.plan.inputs import Hardware, model_shape, strategy
from launcher.plan.memory import uses_bf16_optimizer
from launcher.plan.params import count_params
from launcher.plan.profile import BUILTIN, PROFILE_VERSION, Link, NcclTuning, Profile, load_profile, profile_to_dict

FREE = Link(0.0, 1e12)     # a link with no latency and 1e21 B/s
P = 1e12                   # 1 TFLOP/s GEMM plateau


def ideal(**kw) -> Profile:
    """Only GEMMs cost (plateau P, no shape penalty); attention, memory, kernels and links are free."""
    base = dict(name="ideal", gemm_tflops={"any": P / 1e12}, gemm_half_dim={"any": 0.0}, attention_tflops={"any": 1e12},
                attention_half_seq={"any": 0.0}, memory_gbps=1e12, kernel_overhead_s=0.0, intra=FREE, inter=FREE)
    return Profile(**{**base, **kw})


def hardware(prof: Profile, device: str = "cuda") -> Hardware:
    return Hardware(name="test", peak_tflops=1.0, memory_bytes=1e12, intra_node_gbps=1.0, inter_node_gbps=1.0,
                    source="test", profile=prof, device=device)


def setup(*overrides):
    cfg = compose(["recipe=tiny", *overrides])
    layout = resolve_layout(cfg)
    return cfg, model_shape(cfg.model), strategy(cfg, layout)


def test_gemm_saturation_and_roofline():
    prof = ideal(gemm_half_dim={"any": 128.0}, memory_gbps=1.0)
    rate = prof.gemm_rate("fp32")
    # smallest side 128 = the half-rate dimension: half the plateau. Bytes (3 x 128^2 x 4) at 1 GB/s take 0.2 ms,
    # the FLOPs (2 x 128^3 at 0.5 TFLOP/s) 8.4 us: memory-bound, so the roofline's max picks the bytes.
    assert steptime.gemm_s(128, 128, 128, 4, prof, rate) == pytest.approx(3 * 128 * 128 * 4 / 1e9)
    fast_mem = dataclasses.replace(prof, memory_gbps=1e9)
    assert steptime.gemm_s(128, 128, 128, 4, fast_mem, rate) == pytest.approx(2 * 128 ** 3 / (P / 2))
    # side 384: 384 / (384 + 128) = 3/4 of the plateau
    assert steptime.gemm_s(4096, 384, 1024, 2, fast_mem, rate) == pytest.approx(2 * 4096 * 384 * 1024 / (0.75 * P))


def test_collectives_latency_plus_ring_bytes():
    link = Link(1e-3, 10.0)  # 1 ms, 10 GB/s
    assert steptime.all_reduce_s(1e9, 2, link) == pytest.approx(1e-3 + 2 * (1 / 2) * 1e9 / 1e10)
    assert steptime.all_reduce_s(1e9, 8, link) == pytest.approx(1e-3 + 2 * (7 / 8) * 0.1)
    assert steptime.gather_s(1e9, 4, link) == pytest.approx(1e-3 + (3 / 4) * 0.1)
    assert steptime.all_reduce_s(1e9, 1, link) == 0.0


def test_attention_causal_flops_and_sequence_curve():
    prof = ideal(attention_tflops={"any": 1.0}, attention_half_seq={"any": 1024.0})
    # b=2, s=1024, 4 heads, d=64: forward 4 b s^2 heads d / 2 FLOPs; fwd + bwd = 3.5 x that; s = s_half: half rate
    fwd_flops = 4 * 2 * 1024 ** 2 * 4 * 64 / 2
    f, b = steptime.attention_s(2, 1024, 4, 64, prof, prof.attention_rate("bf16"))
    assert f + b == pytest.approx(3.5 * fwd_flops / (0.5e12))
    assert b / f == pytest.approx(2.5)


def _block_gemm_flops(h, f, n):
    # LLaMA block with a = kv heads, per micro-batch: q, k, v, o are h x h, gate, up, down are h x f; forward 2 n
    # per weight element, each backward GEMM (input and weight gradient) the same again.
    return 3 * 2 * n * (4 * h * h + 3 * h * f)


def test_one_rank_step_is_its_gemms_when_only_gemms_cost():
    cfg, shape, st = setup("cluster.gpus_per_node=1", "batch.global_batch_size=8")
    n = st.micro_batch_size * st.seq_length
    h, f, v, L = 128, 352, 2048, 4
    head = 3 * 2 * n * h * v
    t = steptime.estimate_step_time(shape, st, hardware(ideal()))
    assert st.grad_accum_steps == 1 and st.data_degree == 1
    assert t.step_time_s == pytest.approx((L * _block_gemm_flops(h, f, n) + head) / P, rel=1e-9)
    assert t.gemm_s == pytest.approx(t.step_time_s)


def test_recompute_full_adds_one_forward_of_every_block():
    _, shape, st = setup("cluster.gpus_per_node=1", "batch.global_batch_size=8", "model.activation_checkpointing=true")
    n = st.micro_batch_size * st.seq_length
    h, f, v, L = 128, 352, 2048, 4
    t = steptime.estimate_step_time(shape, st, hardware(ideal()))
    assert st.recompute == "full"
    fwd = 2 * n * (4 * h * h + 3 * h * f)
    assert t.step_time_s == pytest.approx((L * (_block_gemm_flops(h, f, n) + fwd) + 3 * 2 * n * h * v) / P, rel=1e-9)
    assert t.recompute_s == pytest.approx(L * fwd / P)


def test_1f1b_with_uneven_stages():
    # PP2, blocks cut 2 + 2 (partition by type), 4 micro-batches: stage 0 = 2 blocks, stage 1 = 2 blocks + the head.
    # 1F1B: T0 + T1 + (m - 1) max(T0, T1)  (fill/drain cross each stage once, the slowest paces the rest).
    _, shape, st = setup("cluster.gpus_per_node=2", "parallel.pipeline_degree=2", "parallel.partition_method=type:DecoderBlock",
                         "batch.micro_batch_size=2", "batch.global_batch_size=8", "parallel.zero_stage=0")
    assert st.grad_accum_steps == 4
    n = 2 * st.seq_length
    block = _block_gemm_flops(128, 352, n) / P
    head = 3 * 2 * n * 128 * 2048 / P
    t0, t1 = 2 * block, 2 * block + head
    t = steptime.estimate_step_time(shape, st, hardware(ideal()))
    assert t.step_time_s == pytest.approx(t0 + t1 + 3 * t1, rel=1e-9)
    assert t.bubble_s == pytest.approx(t0, rel=1e-9)   # (sum_s T_s + (m-1) T_max) - m T_max = T0


def test_tensor_parallel_at_one_stage_all_reduces_and_vocab_parallel_ends():
    # TP2 without a pipeline runs our TP layers on the plain engine (launcher/parallel/tensor_model.py), one
    # micro-batch of 4 blocks: per block 2 all-reduces of n h w bytes forward (g after o_proj, down_proj) and 2
    # backward (f before q/k/v and gate/up); the vocab-parallel ends add the embedding's all-reduce (forward), the
    # head's input-gradient all-reduce (backward), both n h w, and the loss's 3 all-reduces of n fp32 values.
    lat, bus = 1e-4, 1.0
    _, shape, st = setup("cluster.gpus_per_node=2", "parallel.tensor_degree=2", "batch.global_batch_size=8",
                         "parallel.zero_stage=0")
    assert st.pipeline_degree == 1 and st.grad_accum_steps == 1
    n, w = 8 * st.seq_length, 4
    ar = lat + 2 * (1 / 2) * n * 128 * w / (bus * 1e9)
    ar_loss = lat + 2 * (1 / 2) * n * 4 / (bus * 1e9)
    t = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, bus))))
    assert t.tp_comm_s == pytest.approx(4 * 4 * ar + 2 * ar + 3 * ar_loss, rel=1e-9)
    # ... and each rank computes its V/2 columns of the head: the blocks' GEMMs and the head's 3 (n x h x V) halved.
    h, f, v = 128, 352, 2048
    assert t.gemm_s == pytest.approx((4 * _block_gemm_flops(h, f, n) / 2 + 3 * 2 * n * h * v / 2) / P, rel=1e-9)


def test_tensor_parallel_all_reduces_pipeline_grid():
    # TP2 x PP2 (launcher/parallel/tensor.py, Megatron's f and g): 2 all-reduces forward + 2 backward per block; the
    # vocab-parallel head adds its input gradient's all-reduce (n h w, backward) and the loss's 3 all-reduces of n
    # fp32 values. One micro-batch, 2 blocks per stage: the slowest (last) stage's 2 blocks and head.
    lat, bus = 1e-4, 1.0
    _, shape, st = setup("cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.pipeline_degree=2",
                         "parallel.partition_method=type:DecoderBlock", "batch.global_batch_size=8", "parallel.zero_stage=0")
    n, w = 8 * st.seq_length, 4
    ar = lat + 2 * (1 / 2) * n * 128 * w / (bus * 1e9)
    t = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, bus))))
    ar_loss = lat + 2 * (1 / 2) * n * 4 / (bus * 1e9)
    assert st.grad_accum_steps == 1
    assert t.tp_comm_s == pytest.approx(2 * 4 * ar + ar + 3 * ar_loss, rel=1e-9)


def test_nccl_cost_model_latency_grows_with_the_ring():
    # NCCL's tuning model (src/graph/tuning.cc), us: ring (base, NVLink step, network step) LL 6.6/0.6/2.7, LL128
    # 14/1.9/4.0, Simple 8.4/3.4/14; a step inside a node at least the 1 us network overhead (x 3 for Simple) once
    # the ring leaves the node. All-gather over r ranks on N nodes: r - 1 steps, N - 1 of them across.
    n = NcclTuning()
    us = 1e-6

    def same(got, want):
        assert len(got) == len(want)
        for (lat, frac), (lat_w, frac_w) in zip(got, want):
            assert lat == pytest.approx(lat_w * us) and frac == pytest.approx(frac_w)

    same(n.options(False, 8, 1), [(6.6 + 7 * 0.6, 1 / 3), (14 + 7 * 1.9, 0.92), (8.4 + 7 * 3.4, 1.0)])
    same(n.options(False, 16, 2), [(6.6 + 14 * 1.0 + 2.7, 1 / 4), (14 + 14 * 1.9 + 4.0, 0.92), (8.4 + 14 * 3.4 + 14, 1.0)])
    same(n.options(False, 512, 64)[2:], [(8.4 + 448 * 3.4 + 63 * 14, 1.0)])
    # all-reduce: 2 (r - 1) ring steps, 2N across nodes; then the tree, base + 2 (ranks a node - 1) NVLink steps
    # + 2 floor(log2 N) network steps, at 0.92 of the bus, moving 2 B (2 (r-1)/r B in the ring formula)
    ar = n.options(True, 512, 64)
    same(ar[2:3], [(8.4 + (1022 - 128) * 3.4 + 128 * 14, 1.0)])
    same(ar[5:], [(2 * (7 * 28 + 6 * 28), 0.92 * 511 / 512)])
    # one rank a node: every ring step crosses (2 (r - 1) of them, not NCCL's 2N)
    same(n.options(True, 4, 4)[2:3], [(8.4 + 6 * 14, 1.0)])


def test_collectives_take_nccls_cheapest_protocol():
    link = steptime.GroupLink(0.0, 100.0, gather_options=tuple(NcclTuning().options(False, 8, 1)),
                              all_reduce_options=tuple(NcclTuning().options(True, 8, 1)))
    us = 1e-6
    # 1 GB: Simple, bandwidth-bound. 1 KB: LL, whose 6.6 + 7 x 0.6 us beat Simple's 32.2 us at a third of the bus.
    assert steptime.gather_s(1e9, 8, link) == pytest.approx((8.4 + 7 * 3.4) * us + 7 / 8 * 1e9 / 100e9)
    assert steptime.gather_s(1e3, 8, link) == pytest.approx((6.6 + 7 * 0.6) * us + 7 / 8 * 1e3 / (100e9 / 3))
    assert steptime.all_reduce_s(1e9, 8, link) == pytest.approx((8.4 + 14 * 3.4) * us + 2 * 7 / 8 * 1e9 / 100e9)


def test_group_links_by_rank_order_and_nodes():
    # TP consecutive, a ZeRO group every TP-th rank (launcher/plan/rankmap.py). 8 GPUs a node.
    intra, inter = Link(10e-6, 300.0), Link(20e-6, 40.0)
    prof = ideal(intra=intra, inter=inter, nccl=NcclTuning())
    n = prof.nccl

    def check(link, ranks, nodes, bus):
        assert link.bus_gbps == bus
        assert link.gather_options == tuple(n.options(False, ranks, nodes))
        assert link.all_reduce_options == tuple(n.options(True, ranks, nodes))

    check(steptime._group_link(prof, 8, 1, 8), 8, 1, 300.0)         # TP8: one node
    check(steptime._group_link(prof, 64, 2, 8), 64, 16, 40.0)       # ZeRO group under TP2: 4 a node, 16 nodes
    check(steptime._group_link(prof, 4, 8, 8), 4, 4, 40.0)          # under TP8: one a node
    check(steptime._group_link(prof, 4, 2, 8), 4, 1, 300.0)         # 4 x 2 ranks: one node
    # a calibrated profile (no nccl) keeps the link, and the latency it measured
    assert steptime._group_link(ideal(intra=intra, inter=inter), 64, 2, 8) == inter


def test_a_group_across_nodes_takes_the_link_measured_for_its_ranks_a_node(tmp_path):
    # calibrate on several nodes measures one rank a node (inter) and every rank of every node together
    # (inter_groups at the node's ranks). A group that spans nodes is charged the measurement for its ranks a node:
    # between the measured sizes the bandwidth linear in the ranks a node, the latency of the size below; above the
    # largest measured, the largest's. Without the measurement every such group gets `inter` (one NIC).
    import yaml

    intra, inter, eight = Link(10e-6, 300.0), Link(20e-6, 40.0), Link(30e-6, 320.0)
    prof = ideal(intra=intra, inter=inter, inter_groups={8: eight})
    assert steptime._group_link(prof, 64, 1, 8) == eight                   # DP64 under TP1: 8 a node, 8 nodes
    assert steptime._group_link(prof, 16, 8, 8) == inter                   # under TP8: one a node
    # under TP2: 4 a node, 40 + (4 - 1) / (8 - 1) x (320 - 40) = 160 GB/s
    assert steptime._group_link(prof, 64, 2, 8) == Link(20e-6, 160.0)
    assert steptime._group_link(prof, 8, 1, 8) == intra                    # one node: the node's link
    assert prof.inter_for(16) == eight                                     # more a node than measured
    # the plan's data-parallel traffic follows: ZeRO-1 DP16 of recipe=tiny on 2 nodes of 8, 8 ranks a node
    cfg, shape, st = setup("cluster.gpus_per_node=8", "cluster.nodes=2", "parallel.zero_stage=1",
                           "batch.micro_batch_size=1", "batch.global_batch_size=16")
    assert (st.data_degree, st.tensor_degree) == (16, 1)
    one_nic = steptime.estimate_step_time(shape, st, hardware(ideal(intra=intra, inter=inter)))
    measured = steptime.estimate_step_time(shape, st, hardware(prof))
    assert measured.dp_comm_exposed_s < one_nic.dp_comm_exposed_s
    # The file round-trips it.
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile_to_dict(prof)))
    assert load_profile(str(path)).inter_groups == {8: eight}


def test_plan_reports_the_step_time_with_a_groups_nics_added_where_nothing_measured_them():
    # The built-in H100 profile charges a group across nodes one NIC a GPU (45 GB/s bus); NCCL can spread the ring
    # over the NICs of the group's GPUs on each node. `launcher plan` reports the step time under that too: 8 GPUs a
    # node, min(8 x 45, the node's 360) = 360 GB/s for a group with all 8 on each node.
    from launcher.plan.inputs import resolve_hardware
    from launcher.plan.profile import nics_added
    from launcher.plan.report import plan_summary

    h100 = BUILTIN["h100-80gb"]
    assert (h100.inter.bus_gbps, h100.intra.bus_gbps, h100.inter_groups) == (45.0, 360.0, {})
    assert nics_added(h100, 8).inter_groups == {8: Link(h100.inter.latency_s, 360.0)}
    assert nics_added(h100, 4).inter_groups == {4: Link(h100.inter.latency_s, 180.0)}
    measured = dataclasses.replace(h100, inter_groups={8: Link(1e-5, 100.0)})
    assert nics_added(measured, 8) is measured                              # a measurement stands

    def summary(*overrides):
        cfg = compose(["model=llama-13b", "cluster=h100-80gb", "batch.micro_batch_size=2", "batch.global_batch_size=128",
                       "data.seq_length=2048", *overrides])
        return cfg, plan_summary(cfg, resolve_layout(cfg))

    cfg, s = summary("cluster.nodes=8", "parallel.zero_stage=3")           # ZeRO-3 over 64 GPUs, 8 a node
    layout = resolve_layout(cfg)
    builtin = resolve_hardware(cfg.cluster, layout.dtype)
    assert builtin.profile.inter_groups == {}
    hw = dataclasses.replace(builtin, profile=dataclasses.replace(h100, inter_groups={8: Link(h100.inter.latency_s, 360.0)}))
    expected = steptime.estimate_step_time(model_shape(cfg.model), strategy(cfg, layout), hw).step_time_s
    assert s["step_time_nics_added_s"] == pytest.approx(expected, rel=1e-12) and expected < s["step_time_s"]
    assert summary("cluster.nodes=1", "parallel.zero_stage=3")[1]["step_time_nics_added_s"] is None   # one node
    # TP8 a node: the data-parallel group has one GPU on each node, already one NIC each
    assert summary("cluster.nodes=8", "parallel.zero_stage=1", "parallel.tensor_degree=8",
                   "batch.micro_batch_size=1", "batch.global_batch_size=16")[1]["step_time_nics_added_s"] is None


def test_pipeline_hop_link_follows_the_rank_order():
    # Rank order tp, sp, dp, pp (launcher/plan/rankmap.py): a stage's next stage is t x sp x dp ranks on. With 8 GPUs
    # a node, PP2 x DP4 keeps both stages in one node; PP2 x DP8 puts stage 1 of rank 0 on rank 8, the next node.
    intra, inter = Link(10e-6, 300.0), Link(20e-6, 40.0)
    prof = ideal(intra=intra, inter=inter)

    def pp_link(dp, tp=1):
        _, _, st = setup("cluster.gpus_per_node=8", f"cluster.nodes={max(1, 2 * dp * tp // 8)}",
                         "parallel.pipeline_degree=2", f"parallel.tensor_degree={tp}", f"parallel.data_degree={dp}",
                         "parallel.zero_stage=0", "batch.micro_batch_size=1", f"batch.global_batch_size={2 * dp}")
        assert st.pipeline_degree == 2 and st.data_degree == dp
        return steptime._links(st, prof)["pp"]

    assert pp_link(4) == intra
    assert pp_link(8) == inter
    assert pp_link(2, tp=2) == intra
    assert pp_link(4, tp=2) == inter     # TP2 x PP2 spans 4 ranks, but the stages are 8 apart


def test_zero0_all_reduce_pays_the_groups_nccl_latency():
    # DP2 ZeRO-0 on one node, one gradient bucket of 4 N bytes: NCCL's cheapest is the Simple ring, 8.4 + 2 x 3.4
    # us, + 2 x 1/2 x 4 N / B.
    bus = 1.0
    _, shape, st = setup("parallel.zero_stage=0")
    N = count_params(compose(["recipe=tiny"]).model).total
    prof = ideal(intra=Link(1.0, bus), nccl=NcclTuning())
    t = steptime.estimate_step_time(shape, st, hardware(prof))
    assert t.dp_comm_exposed_s == pytest.approx((8.4 + 2 * 3.4) * 1e-6 + 4 * N / (bus * 1e9), rel=1e-9)
    assert BUILTIN["h100-80gb"].nccl == NcclTuning() and BUILTIN["a100-80gb"].nccl == NcclTuning()


def test_zero1_on_cpu_ranks_exposes_gradient_allreduce_and_weight_allgather():
    # DP2 ZeRO-1 on CPU ranks (overlap_comm off): DeepSpeed 0.19.8 all-reduces the whole gradient bucket once per
    # step (stage_1_and_2.py average_tensor -> allreduce_and_scatter -> allreduce_bucket, under
    # use_multi_rank_bucket_allreduce), ring bytes 2 x 1/2 x 4 N; then the updated fp32 weights are all-gathered,
    # 1/2 x 4 N: (L + 4 N / B) + (L + 1/2 x 4 N / B), N = every parameter.
    lat, bus = 1e-3, 1.0
    _, shape, st = setup("parallel.zero_stage=1")
    N = count_params(compose(["recipe=tiny"]).model).total
    t = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, bus)), device="cpu"))
    assert st.data_degree == 2
    assert t.dp_comm_exposed_s == pytest.approx(2 * lat + 1.5 * 4 * N / (bus * 1e9), rel=1e-9)


def test_gradients_cross_the_wire_in_the_reduce_dtype_with_or_without_sequence_parallelism():
    # DeepSpeed casts gradients to its communication dtype before reducing them, whatever the accumulation dtype;
    # the launcher sets it to precision.reduce_dtype, the model's unless set, also under Ulysses or CP (where
    # DeepSpeed's own default is fp32). Measured on 2 CPU ranks, recipe=tiny bf16: ZeRO-1 all_reduce 1,328,256 bf16
    # elements with and without grad_accum_dtype=fp32 (2026-12-05); under parallel.sequence_degree=2 with the
    # launcher's config ZeRO-0 and ZeRO-3 in bf16 (float32 before it set seq_parallel_communication_data_type),
    # ZeRO-1 in float32 either way (2026-12-06, bench/steptime/results.md). DP2 ZeRO-1 on CPU ranks (nothing overlapped): the gradient all-reduce
    # (L + 2 x 1/2 x bytes / B) and the bf16 weights' all-gather (L + 1/2 x 2 N / B).
    lat, bus = 1e-3, 1.0
    N = count_params(compose(["recipe=tiny"]).model).total
    hw = hardware(ideal(intra=Link(lat, bus)), device="cpu")
    for accum in ("bf16", "fp32"):
        _, shape, st = setup("parallel.zero_stage=1", "precision=bf16", f"precision.grad_accum_dtype={accum}")
        t = steptime.estimate_step_time(shape, st, hw)
        assert t.dp_comm_exposed_s == pytest.approx(2 * lat + (2 * N + 0.5 * 2 * N) / (bus * 1e9), rel=1e-9)
    # SP2: one replica, its 2 sequence ranks reduce over DeepSpeed's sequence-data-parallel group (r = dp x sp = 2).
    # ZeRO-0 all-reduces its one bucket in the reduce dtype (L + 2 x 1/2 x bytes / B); ZeRO-1 in fp32 whatever it is
    # told (stage_1_and_2.py allreduce_bucket), then all-gathers the bf16 weights.
    for reduce, grad_bytes in (("null", 2), ("fp32", 4)):
        _, shape, st = setup("parallel.sequence_degree=2", "parallel.zero_stage=0", "precision=bf16",
                             f"precision.reduce_dtype={reduce}")
        assert st.data_degree == 1 and st.zero_partition_degree == 2
        t = steptime.estimate_step_time(shape, st, hw)
        assert t.dp_comm_exposed_s == pytest.approx(lat + grad_bytes * N / (bus * 1e9), rel=1e-9)
        _, shape, st = setup("parallel.sequence_degree=2", "parallel.zero_stage=1", "precision=bf16",
                             f"precision.reduce_dtype={reduce}")
        t = steptime.estimate_step_time(shape, st, hw)
        assert t.dp_comm_exposed_s == pytest.approx(2 * lat + (4 * N + 0.5 * 2 * N) / (bus * 1e9), rel=1e-9)
    _, shape, st = setup("parallel.zero_stage=1", "precision=bf16", "precision.reduce_dtype=fp32")
    t = steptime.estimate_step_time(shape, st, hw)
    assert t.dp_comm_exposed_s == pytest.approx(2 * lat + (4 * N + 0.5 * 2 * N) / (bus * 1e9), rel=1e-9)


def test_bf16_optimizer_at_zero0_gathers_the_weights_it_partitions():
    # bf16 + ZeRO-0 under the pipeline engine runs DeepSpeed's BF16_Optimizer, which partitions the fp32 master
    # weights over DP and all-gathers the updated bf16 weights after its step (PP2 x DP2 on 4 CPU ranks: one
    # all_gather_into_tensor of 331,776 bf16 elements a rank, half a stage's weights, 2026-12-05). Per stage with n
    # weights: the gradient all-reduce (L + 2 x 1/2 x 2 n / B) and the all-gather (L + 1/2 x 2 n / B).
    from launcher.plan.memory import params_per_stage

    lat, bus = 1e-3, 1.0
    _, shape, st = setup("cluster.gpus_per_node=4", "parallel.pipeline_degree=2", "parallel.zero_stage=0",
                         "precision=bf16")
    assert st.data_degree == 2
    t = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, bus)), device="cpu"))
    n = max(params_per_stage(shape, st))
    assert t.dp_comm_exposed_s == pytest.approx(2 * lat + (2 * n + 0.5 * 2 * n) / (bus * 1e9), rel=1e-9)
    fp32 = setup("cluster.gpus_per_node=4", "parallel.pipeline_degree=2", "parallel.zero_stage=0")
    t = steptime.estimate_step_time(fp32[1], fp32[2], hardware(ideal(intra=Link(lat, bus)), device="cpu"))
    assert t.dp_comm_exposed_s == pytest.approx(lat + 4 * max(params_per_stage(fp32[1], fp32[2])) / (bus * 1e9),
                                                 rel=1e-9)


def test_zero1_and_2_deepspeed_config_all_reduces_gradient_buckets():
    # The planner prices ZeRO 1/2's gradient reduction as an all-reduce because the engine config asks for it.
    from launcher.deepspeed_config import zero_optimization_base

    for stage in (1, 2):
        assert zero_optimization_base(stage, "cpu")["use_multi_rank_bucket_allreduce"] is True


def test_zero2_on_gpu_hides_gradient_allreduce_behind_backward():
    # overlap_comm (GPU): the per-micro-batch gradient all-reduce hides behind that micro-batch's backward; a fast
    # link leaves only the final all-gather of the fp32 weights: L + 1/2 x 4 N / B.
    lat, bus = 1e-6, 1e6
    _, shape, st = setup("parallel.zero_stage=2")
    N = count_params(compose(["recipe=tiny"]).model).total
    t = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, bus))))
    assert t.dp_comm_exposed_s == pytest.approx(lat + 0.5 * 4 * N / (bus * 1e9), rel=1e-9)


def test_oversubscribed_cpu_node_stretches_compute():
    _, shape, st = setup("cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.zero_stage=1")
    one = steptime.estimate_step_time(shape, st, hardware(ideal(compute_slots=4), "cpu"))
    two = steptime.estimate_step_time(shape, st, hardware(ideal(compute_slots=2), "cpu"))
    assert two.gemm_s == pytest.approx(2 * one.gemm_s)


def test_oversubscribed_pipeline_is_bound_by_the_nodes_work():
    # TP2 x PP2 on 4 ranks and 2 cores, 2 micro-batches, only GEMMs cost. Stage compute alone: C0 = 2 blocks,
    # C1 = 2 blocks + head (TP-sharded blocks, the head's V/2 columns). Critical path at full speed: C0 + C1 + C1.
    # The node's work: 2 ranks per stage x 2 micro-batches x (C0 + C1), over 2 cores: 2 (C0 + C1), the larger.
    _, shape, st = setup("cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.pipeline_degree=2",
                         "parallel.partition_method=type:DecoderBlock", "parallel.zero_stage=0")
    n = 8 * st.seq_length
    c0 = 2 * _block_gemm_flops(128, 352, n) / 2 / P
    c1 = c0 + 3 * 2 * n * 128 * 2048 / 2 / P
    assert st.grad_accum_steps == 2
    t = steptime.estimate_step_time(shape, st, hardware(ideal(compute_slots=2), "cpu"))
    assert t.step_time_s == pytest.approx(2 * (c0 + c1), rel=1e-6)
    alone = steptime.estimate_step_time(shape, st, hardware(ideal(compute_slots=4), "cpu"))
    assert alone.step_time_s == pytest.approx(c0 + 2 * c1, rel=1e-6)


def test_oversubscribed_pipeline_waits_at_the_unshared_fraction_where_a_stage_computes_alone():
    # TP2 x PP2 on 4 ranks and 2 cores, one micro-batch: the stages take turns (F0, F1, B1, B0), each stage's two
    # ranks alone on the two cores, so every wait is at the fraction calibrate measured with only two ranks busy
    # (straggler_unshared), not the one with all four busy. A flat table: the wait is that share of the compute
    # before it, whatever the segment. Only GEMMs cost (C0 = 2 blocks, C1 = 2 blocks + head; TP-sharded).
    _, shape, st = setup("cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.pipeline_degree=2",
                         "parallel.partition_method=type:DecoderBlock", "parallel.zero_stage=0",
                         "batch.global_batch_size=8")
    assert st.grad_accum_steps == 1
    n = 8 * st.seq_length
    c0 = 2 * _block_gemm_flops(128, 352, n) / 2 / P
    c1 = c0 + 3 * 2 * n * 128 * 2048 / 2 / P

    def flat(f):
        return {2: [[1e-4, f], [1.0, f]]}
    split = steptime.estimate_step_time(shape, st, hardware(
        ideal(compute_slots=2, straggler=flat(0.3), straggler_unshared=flat(0.05)), "cpu"))
    assert split.step_time_s == pytest.approx(1.05 * (c0 + c1), rel=1e-6)
    assert split.straggler_s == pytest.approx(0.05 * c1, rel=1e-6)     # the slower stage's
    # Without the unshared table (a profile calibrated before it, or on as many ranks as cores) the one measured
    # with every rank busy stands for both.
    busy = steptime.estimate_step_time(shape, st, hardware(ideal(compute_slots=2, straggler=flat(0.3)), "cpu"))
    assert busy.step_time_s == pytest.approx(1.3 * (c0 + c1), rel=1e-6)


def test_oversubscribed_pipeline_stretches_only_where_the_stages_compute_together():
    # PP2 on 2 ranks and 1 core, two micro-batches, only GEMMs cost: F_s = C_s / 3 and B_s = 2 C_s / 3 (a Linear's
    # backward is two GEMMs of its forward's size; the head's likewise). Played out: stage 0's first forward alone
    # (C0 / 3); its second and stage 1's first together at half speed until the former ends (2 C0 / 3 more), the
    # latter's rest alone; stage 1's first backward alone; then stage 0's first backward and stage 1's second
    # forward together, and so on. The core is never idle (a stage always computes), so the step is
    # all the node's work on its one core, 2 (C0 + C1), against the 1F1B time at full speed, C0 + 2 C1, with
    # nothing shared; the stretch each stage met lies between 1 and 2.
    _, shape, st = setup("cluster.gpus_per_node=2", "parallel.pipeline_degree=2",
                         "parallel.partition_method=type:DecoderBlock", "parallel.zero_stage=0")
    assert st.grad_accum_steps == 2
    n = 8 * st.seq_length
    c0 = 2 * _block_gemm_flops(128, 352, n) / P
    c1 = c0 + 3 * 2 * n * 128 * 2048 / P
    t = steptime.estimate_step_time(shape, st, hardware(ideal(compute_slots=1), "cpu"))
    assert t.step_time_s == pytest.approx(2 * (c0 + c1), rel=1e-6)
    alone = steptime.estimate_step_time(shape, st, hardware(ideal(compute_slots=2), "cpu"))
    assert alone.step_time_s == pytest.approx(c0 + 2 * c1, rel=1e-6)
    assert 2 * c1 < t.gemm_s < 2 * 2 * c1


def test_profile_file_round_trip_and_refusals(tmp_path):
    import yaml

    prof = ideal(host_memory_gb=24.0, compute_slots=2)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile_to_dict(prof)))
    back = load_profile(str(path))
    assert back.gemm_tflops == prof.gemm_tflops and back.intra == prof.intra and back.compute_slots == 2
    assert back.nccl is None
    # The waits calibrate measures with only the cores' ranks busy (4 ranks on 2 cores) come back as written.
    waits = dict(straggler={2: [[0.005, 0.3]]}, straggler_unshared={2: [[0.005, 0.04]]}, release={2: [[0.005, 4e-3]]},
                 release_unshared={2: [[0.005, 1e-3]]})
    path.write_text(yaml.safe_dump(profile_to_dict(dataclasses.replace(prof, **waits))))
    back = load_profile(str(path))
    assert {k: getattr(back, k) for k in waits} == waits
    assert back.straggler_fraction(2, 0.01, unshared=True) == 0.04 and back.straggler_fraction(2, 0.01) == 0.3
    assert back.release_s(2, 0.01, unshared=True) == 1e-3 and prof.straggler_fraction(2, 0.01, unshared=True) == 0.0
    path.write_text(yaml.safe_dump(profile_to_dict(dataclasses.replace(prof, straggler_unshared={2: [[0.005, -0.1]]}))))
    with pytest.raises(ConfigError, match="straggler_unshared table"):
        load_profile(str(path))
    path.write_text(yaml.safe_dump(profile_to_dict(dataclasses.replace(prof, nccl=NcclTuning(net_overhead_s=2e-6)))))
    assert load_profile(str(path)).nccl == NcclTuning(net_overhead_s=2e-6)
    doc = profile_to_dict(prof) | {"version": PROFILE_VERSION + 1}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="cluster.profile.*version"):
        load_profile(str(path))
    doc = profile_to_dict(prof)
    del doc["memory_gbps"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="lacks memory_gbps"):
        load_profile(str(path))
    with pytest.raises(ConfigError, match="no profile file"):
        load_profile(str(tmp_path / "missing.yaml"))


def test_builtin_profiles_drive_the_plan():
    from launcher.plan.report import plan_summary

    cfg = compose(["recipe=llama-7b"])
    s = plan_summary(cfg, resolve_layout(cfg))
    bd = s["step_time_breakdown_s"]
    assert sum(bd.values()) == pytest.approx(s["step_time_s"], rel=1e-9)
    assert "built-in a100-80gb" in s["profile"]
    assert 0.2 < s["mfu"] < 0.75


def test_zero3_gathers_what_deepspeed_fetches_on_cpu_ranks():
    # DP2 ZeRO-3, one micro-batch, no overlap (CPU): reduce-scatter the fp32 gradients (one whole-buffer call) and
    # all-gather what DeepSpeed's parameter coordinator fetches. recipe=tiny's block weights are at most 128 x 352 =
    # 45,056 elements, under the persistence threshold (1e5): whole on every rank, never fetched (their gather after
    # each optimizer step is in calibrate's ZeRO-3 hook terms). The embedding and the head, 2048 x 128 = 262,144
    # each, go in one call: the first module's prefetch walk gathers both, and both are kept for the backward, so
    # nothing is gathered again (DeepSpeed's calls, counted on 2 CPU ranks: bench/steptime/results.md, 2026-12-06).
    lat, bus = 1e-3, 1.0
    _, shape, st = setup("parallel.zero_stage=3")
    N = count_params(compose(["recipe=tiny"]).model).total
    t = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, bus)), device="cpu"))
    reduce = lat + 0.5 * 4 * N / (bus * 1e9)
    fetched = 2 * 2048 * 128
    assert st.grad_accum_steps == 1
    assert t.dp_comm_exposed_s == pytest.approx(reduce + lat + 0.5 * 4 * fetched / (bus * 1e9), rel=1e-9)
    assert t.engine_s == 0.0


def test_zero3_module_hooks_cost_per_module_and_micro_batch():
    # The profile's zero3_module_s per hooked module and micro-batch: LlamaForCausalLM of recipe=tiny has 59
    # modules (4 x 13 in the blocks + 7 outside, counted from transformers' named_modules()); 2 micro-batches here.
    _, shape, st = setup("parallel.zero_stage=3", "batch.global_batch_size=32")
    base = steptime.estimate_step_time(shape, st, hardware(ideal(), device="cpu"))
    hooked = steptime.estimate_step_time(shape, st, hardware(ideal(zero3_module_s=1e-3), device="cpu"))
    assert st.grad_accum_steps == 2
    assert hooked.engine_s == pytest.approx(2 * 59 * 1e-3)
    assert hooked.step_time_s - base.step_time_s == pytest.approx(2 * 59 * 1e-3, rel=1e-9)
    zero1 = setup("parallel.zero_stage=1", "batch.global_batch_size=32")
    assert steptime.estimate_step_time(zero1[1], zero1[2], hardware(ideal(zero3_module_s=1e-3), device="cpu")).engine_s == 0.0


def test_zero3_parameter_hooks_cost_per_parameter_tensor():
    # zero3_param_s per parameter tensor and micro-batch, on top of the modules': recipe=tiny's LlamaForCausalLM has
    # 39 parameter tensors (4 x (7 linears + 2 RMSNorms) + embedding, final norm, untied head), 2 micro-batches.
    _, shape, st = setup("parallel.zero_stage=3", "batch.global_batch_size=32")
    both = steptime.estimate_step_time(shape, st, hardware(ideal(zero3_module_s=1e-3, zero3_param_s=1e-4), device="cpu"))
    assert both.engine_s == pytest.approx(2 * (59 * 1e-3 + 39 * 1e-4))
    _, tied, st = setup("parallel.zero_stage=3", "batch.global_batch_size=32", "model.tie_word_embeddings=true")
    assert steptime.estimate_step_time(tied, st, hardware(ideal(zero3_param_s=1e-4), device="cpu")).engine_s \
        == pytest.approx(2 * 38 * 1e-4)


def test_zero3_step_part_is_paid_once_a_step_whatever_the_micro_batches():
    # zero3_module_step_s / zero3_param_step_s: the part of ZeRO-3's engine work that comes at the step's boundary
    # (calibrate's probe at 1 and 3 micro-batches a step), paid once however many micro-batches the step has, while
    # zero3_module_s / zero3_param_s are paid by every one. recipe=tiny: 59 hooked modules, 39 parameter tensors.
    per_step = ideal(zero3_module_step_s=1e-3, zero3_param_step_s=1e-4)
    every = ideal(zero3_module_s=1e-3, zero3_param_s=1e-4)
    for global_batch, m in ((16, 1), (32, 2), (128, 8)):
        _, shape, st = setup("parallel.zero_stage=3", f"batch.global_batch_size={global_batch}")
        assert st.grad_accum_steps == m
        base = steptime.estimate_step_time(shape, st, hardware(ideal(), device="cpu"))
        once = steptime.estimate_step_time(shape, st, hardware(per_step, device="cpu"))
        assert once.engine_s == pytest.approx(59 * 1e-3 + 39 * 1e-4)
        assert once.step_time_s - base.step_time_s == pytest.approx(59 * 1e-3 + 39 * 1e-4, rel=1e-9)
        assert steptime.estimate_step_time(shape, st, hardware(every, device="cpu")).engine_s \
            == pytest.approx(m * (59 * 1e-3 + 39 * 1e-4))
    zero2 = setup("parallel.zero_stage=2", "batch.global_batch_size=32")
    assert steptime.estimate_step_time(zero2[1], zero2[2], hardware(per_step, device="cpu")).engine_s == 0.0


def test_zero3_recompute_runs_a_checkpointed_blocks_hooks_again():
    # zero3_recompute_param_s: each checkpointed block adds its parameter tensors x the figure a micro-batch (its
    # modules' forward hooks fire again in the recompute). A LLaMA block of recipe=tiny has 9 parameter tensors
    # (7 linears, 2 RMSNorms): 9 x 0.3 ms = 2.7 ms a checkpointed block a micro-batch, over the 59 x 1e-3 + 39 x 1e-4
    # = 62.9 ms of hooks without recompute. 2 micro-batches here.
    prof = ideal(zero3_module_s=1e-3, zero3_param_s=1e-4, zero3_recompute_param_s=3e-4)
    plain = ideal(zero3_module_s=1e-3, zero3_param_s=1e-4)
    for extra, blocks in (((), 0), (("model.activation_checkpointing=true",), 4),
                          (("model.activation_checkpointing=true", "model.checkpoint_blocks=2"), 2),
                          (("model.activation_checkpointing=true", "model.checkpoint_mode=selective"), 4)):
        _, shape, st = setup("parallel.zero_stage=3", "batch.global_batch_size=32", *extra)
        assert st.grad_accum_steps == 2
        t = steptime.estimate_step_time(shape, st, hardware(prof, device="cpu"))
        assert t.engine_s == pytest.approx(2 * (62.9e-3 + blocks * 2.7e-3)), extra
        without = steptime.estimate_step_time(shape, st, hardware(plain, device="cpu"))
        assert t.step_time_s - without.step_time_s == pytest.approx(2 * blocks * 2.7e-3, rel=1e-9, abs=1e-12)
    # BLOOM's block: 4 linears and 2 LayerNorms, each a weight and a bias: 12 tensors, 3.6 ms a checkpointed block.
    _, shape, st = setup("parallel.zero_stage=3", "model.arch=bloom", "model.num_key_value_heads=null",
                         "model.intermediate_size=null", "model.activation_checkpointing=true")
    t = steptime.estimate_step_time(shape, st, hardware(ideal(zero3_recompute_param_s=3e-4), device="cpu"))
    assert t.engine_s == pytest.approx(st.grad_accum_steps * shape.num_layers * 12 * 3e-4)
    # Not ZeRO-3: nothing, checkpointed or not.
    _, shape, st = setup("parallel.zero_stage=1", "model.activation_checkpointing=true")
    assert steptime.estimate_step_time(shape, st, hardware(prof, device="cpu")).engine_s == 0.0


def test_zero3_recompute_figure_in_profile_files(tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile_to_dict(ideal(zero3_recompute_param_s=2.9e-4))))
    assert load_profile(str(path)).zero3_recompute_param_s == 2.9e-4
    # A file from before it was measured: not charged.
    doc = profile_to_dict(ideal())
    del doc["zero3_recompute_param_s"]
    path.write_text(yaml.safe_dump(doc))
    assert load_profile(str(path)).zero3_recompute_param_s == 0.0
    # Measured by 4 ranks on 2 cores: one rank alone pays half, as for the other hook figures (alone_rates).
    path.write_text(yaml.safe_dump(profile_to_dict(ideal(zero3_recompute_param_s=2.9e-4, compute_slots=2),
                                                   measured={"world": 4})))
    assert load_profile(str(path)).zero3_recompute_param_s == pytest.approx(1.45e-4)


def test_zero3_step_part_in_profile_files(tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    prof = ideal(zero3_module_step_s=2e-4, zero3_param_step_s=3e-4, compute_slots=2)
    path.write_text(yaml.safe_dump(profile_to_dict(prof)))
    back = load_profile(str(path))
    assert (back.zero3_module_step_s, back.zero3_param_step_s) == (2e-4, 3e-4)
    # Measured by 4 ranks on 2 cores: one rank alone pays half, as for the per-micro-batch part (alone_rates).
    path.write_text(yaml.safe_dump(profile_to_dict(prof, measured={"world": 4})))
    back = load_profile(str(path))
    assert (back.zero3_module_step_s, back.zero3_param_step_s) == pytest.approx((1e-4, 1.5e-4))
    # A file from before the split has neither: everything stays per micro-batch.
    doc = profile_to_dict(ideal(zero3_param_s=1e-4))
    del doc["zero3_module_step_s"], doc["zero3_param_step_s"]
    path.write_text(yaml.safe_dump(doc))
    assert load_profile(str(path)).zero3_param_step_s == 0.0


def test_mistral_and_qwen2_are_planned_as_the_llama_blocks_they_run():
    # Mistral and Qwen2 run transformers' llama code path (separate q, k, v with rotary, RMSNorm in fp32, SwiGLU with
    # gate and up): every operator term is llama's for the same shape, under a profile where element-wise work and
    # kernels cost, with recompute, with TP. Qwen2 differs only in its q, k, v biases: the same operators, 3 more
    # parameter tensors a block for ZeRO-3's hooks (4 x 12 + 3 = 51 for a 4-block model with an untied head), and
    # their elements in the optimizer, the data-parallel traffic and the gradient accumulation (2 micro-batches a
    # step here: their element-wise work is the biases' add more, one kernel a tensor).
    prof = ideal(gemm_half_dim={"any": 64.0}, memory_gbps=10.0, kernel_overhead_s=5e-6, attention_tflops={"any": 0.05})
    for extra in ([], ["model.activation_checkpointing=true"], ["parallel.tensor_degree=2"],
                  ["parallel.zero_stage=3"], ["precision=bf16", "parallel.pipeline_degree=2", "parallel.zero_stage=1"]):
        by_arch, setups = {}, {}
        for arch in ("llama", "mistral", "qwen2"):
            _, shape, st = setup(f"model.arch={arch}", "model.num_key_value_heads=2", "batch.global_batch_size=32", *extra)
            by_arch[arch] = steptime.estimate_step_time(shape, st, hardware(prof, device="cpu")).breakdown()
            setups[arch] = shape, st
        assert by_arch["mistral"] == by_arch["llama"], extra
        ops = ("gemm", "attention", "framework", "tp_comm", "sp_comm")
        assert {k: by_arch["qwen2"][k] for k in ops} == {k: by_arch["llama"][k] for k in ops}, extra
        shape, st = setups["qwen2"]
        if st.pipeline_degree == 1:
            m = st.grad_accum_steps     # 2, and 4 under TP2 (one data-parallel rank)
            assert m in (2, 4)
            h, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
            biases = shape.num_layers * (h + 2 * kv) / st.tensor_degree
            w = 4 if st.dtype == "fp32" else 2
            # m - 1 adds of the biases' gradients a step, 3 w bytes each at 10 GB/s, and 3 kernels a block
            assert by_arch["qwen2"]["memory_bound"] - by_arch["llama"]["memory_bound"] == pytest.approx(
                (m - 1) * (biases * 3 * w / 10e9 + 3 * shape.num_layers * 5e-6), rel=1e-6), extra
    _, shape, st = setup("model.arch=qwen2", "parallel.zero_stage=3", "batch.global_batch_size=32")
    assert steptime.estimate_step_time(shape, st, hardware(ideal(zero3_param_s=1e-4), device="cpu")).engine_s \
        == pytest.approx(2 * 51 * 1e-4)
    # The count is the model transformers builds (meta device: shapes only).
    from launcher.runtime.model import build_model

    cfg = compose(["recipe=tiny", "model.arch=qwen2"])
    assert len(list(build_model(cfg.model, 0, device="meta").parameters())) == 51


def test_gradient_accumulation_adds_the_gradients_once_per_micro_batch_after_the_first():
    # recipe=tiny (fp32; 39 parameter tensors, the count the ZeRO-3 hook tests above use) at 1 and 4 micro-batches a
    # step: only the element-wise work differs from 4 x one micro-batch's, by 3 adds of every gradient into the held
    # ones (read both, write one: 3 x 4 bytes a parameter at 10 GB/s, one 5 us kernel a tensor). bf16: 2 bytes.
    N = count_params(compose(["recipe=tiny"]).model).total
    prof = ideal(memory_gbps=10.0, kernel_overhead_s=5e-6)
    for dtype, w in (("fp32", 4), ("bf16", 2)):
        one, four = (steptime.estimate_step_time(*setup(f"precision={dtype}", f"batch.global_batch_size={gbs}")[1:],
                                                 hardware(prof, device="cpu")) for gbs in (16, 64))
        assert four.memory_bound_s - 4 * one.memory_bound_s == pytest.approx(3 * (N * 3 * w / 10e9 + 39 * 5e-6),
                                                                             rel=1e-9), dtype
        assert four.gemm_s == pytest.approx(4 * one.gemm_s, rel=1e-9)
        assert sum(four.breakdown().values()) == pytest.approx(four.step_time_s, rel=1e-9)
    # and nothing at one micro-batch: the first backward writes the gradients (its GEMMs), it adds to nothing
    _, shape, st = setup("batch.global_batch_size=16")
    assert st.grad_accum_steps == 1
    assert steptime.grad_accumulation(N, 39, st, prof) == steptime.Cost()


def test_bf16_optimizer_layouts_pay_its_accumulation_instead_of_autograd_s():
    # DeepSpeed's BF16_Optimizer (bf16 ZeRO-0 pipelines; bf16 ZeRO-1 with grad_accum_dtype fp32), with the
    # immediate_grad_update the launcher sets, (cast-)adds each bf16 gradient into its accumulation ones as the
    # backward writes it and zeroes those twice a step: bf16_accumulation's bytes and kernels (held to DeepSpeed's
    # operators in tests/plan/test_bf16_accumulation.py), charged 1/m a micro-batch, at m = 1 too; other layouts pay
    # autograd's (m - 1) x 3 x 2 bytes. 4 micro-batches here.
    prof = ideal(memory_gbps=10.0, kernel_overhead_s=5e-6)
    for overrides, bf16_opt in ((["parallel.pipeline_degree=2", "parallel.zero_stage=0"], True),
                                (["parallel.zero_stage=1", "precision.grad_accum_dtype=fp32"], True),
                                (["parallel.zero_stage=1"], False),
                                (["parallel.pipeline_degree=2", "parallel.zero_stage=0", "batch.global_batch_size=32",
                                  "batch.micro_batch_size=4"], True)):
        _, shape, st = setup("precision=bf16", "cluster.gpus_per_node=4", "batch.global_batch_size=64", *overrides)
        assert uses_bf16_optimizer(st.dtype, st.zero_stage, st.grad_accum_fp32, st.pipeline_degree) is bf16_opt
        m, n = st.grad_accum_steps, 1e6
        nbytes, kernels = steptime.bf16_accumulation(m, st.grad_accum_fp32) if bf16_opt else ((m - 1) * 6, m - 1)
        assert m * steptime.grad_accumulation(n, 10, st, prof).memory == pytest.approx(
            n * nbytes / 10e9 + 10 * kernels * 5e-6, rel=1e-12), overrides
    # fp32 accumulation (ZeRO 1): 18 a micro-batch, 8 a step; bf16 (ZeRO-0 pipelines): 6, 4; DeepSpeed's default
    # (immediate_grad_update false) adds 8 bytes and a kernel a micro-batch after the first (zero and add the held)
    assert steptime.bf16_accumulation(1) == (26, 2) and steptime.bf16_accumulation(4) == (80, 8)
    assert steptime.bf16_accumulation(1, False) == (10, 1) and steptime.bf16_accumulation(4, False) == (28, 4)
    assert steptime.bf16_accumulation(4, True, False) == (104, 11)
    assert steptime.bf16_accumulation(4, False, False) == (52, 7)
    # and the step's optimizer no longer zeroes gradients there: they are the accumulation term's
    _, shape, st = setup("precision=bf16", "cluster.gpus_per_node=4", "parallel.pipeline_degree=2",
                         "parallel.zero_stage=0")
    plain = dataclasses.replace(st, pipeline_degree=1)
    assert steptime._optimizer_s(1e6, plain, prof, 1) - steptime._optimizer_s(1e6, st, prof, 1) == pytest.approx(
        1e6 * 2 / 10e9, rel=1e-12)


def test_engine_per_element_work_per_step_or_per_micro_batch():
    # engine_element_s[dtype][stage] x the rank's parameters (recipe=tiny, no TP or PP: all N of them). ZeRO 0/1
    # reduce once after the last backward: once per step; ZeRO 2/3 in every micro-batch's backward: m times.
    # 2 micro-batches here; recipe=tiny is fp32.
    N = count_params(compose(["recipe=tiny"]).model).total
    per = {"fp32": [1e-9, 2e-9, 3e-9, 4e-9]}
    for stage, times in ((0, 1), (1, 1), (2, 2), (3, 2)):
        _, shape, st = setup(f"parallel.zero_stage={stage}", "batch.global_batch_size=32")
        assert st.grad_accum_steps == 2
        base = steptime.estimate_step_time(shape, st, hardware(ideal(), device="cpu"))
        charged = steptime.estimate_step_time(shape, st, hardware(ideal(engine_element_s=per), device="cpu"))
        assert charged.engine_s == pytest.approx(times * per["fp32"][stage] * N, rel=1e-9)
        assert charged.step_time_s - base.step_time_s == pytest.approx(times * per["fp32"][stage] * N, rel=1e-9)
        assert sum(charged.breakdown().values()) == pytest.approx(charged.step_time_s, rel=1e-9)
    # Another dtype's figure is not used: bf16 runs take the bf16 row, fp16 the bf16 row too, and no row costs 0.
    _, shape, st = setup("parallel.zero_stage=1", "precision=bf16")
    assert steptime.estimate_step_time(shape, st, hardware(ideal(engine_element_s=per), device="cpu")).engine_s == 0.0
    both = ideal(engine_element_s={**per, "bf16": [0.0, 5e-9, 0.0, 0.0]})
    assert steptime.estimate_step_time(shape, st, hardware(both, device="cpu")).engine_s == pytest.approx(5e-9 * N, rel=1e-9)
    assert both.engine_element("fp16", 1) == 5e-9


def test_engine_per_tensor_work_by_the_stage_s_parameter_tensors():
    # engine_tensor_s[dtype][stage] x the stage's parameter tensors, charged like the per-element part: once a step
    # at ZeRO 0/1, every micro-batch at ZeRO 2. recipe=tiny's LlamaForCausalLM has 4 x 9 + 3 = 39 tensors (counted on
    # the model itself below); under PP2 stage 0 holds 2 blocks and the embedding (19), stage 1 2 blocks, the final
    # norm and the head (20), and the step pays the slower stage's.
    from launcher.runtime.model import build_model

    cfg = compose(["recipe=tiny"])
    assert len(list(build_model(cfg.model, 0, device="meta").parameters())) == 39
    per = {"fp32": [1e-4, 2e-4, 3e-4, 0.0]}
    for stage, times in ((0, 1), (1, 1), (2, 2)):
        _, shape, st = setup(f"parallel.zero_stage={stage}", "batch.global_batch_size=32")
        assert st.grad_accum_steps == 2
        charged = steptime.estimate_step_time(shape, st, hardware(ideal(engine_tensor_s=per), device="cpu"))
        assert charged.engine_s == pytest.approx(times * per["fp32"][stage] * 39, rel=1e-9)
        assert sum(charged.breakdown().values()) == pytest.approx(charged.step_time_s, rel=1e-9)
    # Both parts together add up.
    _, shape, st = setup("parallel.zero_stage=1")
    N = count_params(compose(["recipe=tiny"]).model).total
    both = steptime.estimate_step_time(shape, st, hardware(ideal(engine_tensor_s=per, engine_element_s={
        "fp32": [0.0, 1e-9, 0.0, 0.0]}), device="cpu"))
    assert both.engine_s == pytest.approx(2e-4 * 39 + 1e-9 * N, rel=1e-9)
    # bf16 runs take the bf16 row: none here, so nothing is charged.
    _, shape, st = setup("parallel.zero_stage=1", "precision=bf16")
    assert steptime.estimate_step_time(shape, st, hardware(ideal(engine_tensor_s=per), device="cpu")).engine_s == 0.0
    # PP2: each stage's own tensors.
    _, shape, st = setup("parallel.zero_stage=1", "parallel.pipeline_degree=2")
    assert [steptime._parameter_tensors(shape, 2, s, 2) for s in (0, 1)] == [19, 20]


def test_engine_work_split_into_every_micro_batch_and_once_a_step():
    # Where calibrate measured the engine at 1 and 3 micro-batches a step, engine_element_micro_s /
    # engine_tensor_micro_s are paid by every micro-batch and engine_element_s / engine_tensor_s (the rest) once a
    # step, at every ZeRO stage, instead of the stage's all-or-nothing rule. recipe=tiny fp32: N parameters, 39
    # tensors; 1, 2 and 8 micro-batches a step.
    N = count_params(compose(["recipe=tiny"]).model).total
    micro_el, micro_t = [1e-9, 2e-9, 3e-9, 4e-9], [1e-4, 2e-4, 3e-4, 0.0]
    rest_el, rest_t = [5e-9, 6e-9, 7e-9, 8e-9], [5e-4, 6e-4, 7e-4, 0.0]
    prof = ideal(engine_element_s={"fp32": rest_el}, engine_tensor_s={"fp32": rest_t},
                 engine_element_micro_s={"fp32": micro_el}, engine_tensor_micro_s={"fp32": micro_t})
    assert prof.engine_split("fp32") and not prof.engine_split("bf16")
    for stage in range(4):
        for global_batch, m in ((16, 1), (32, 2), (128, 8)):
            _, shape, st = setup(f"parallel.zero_stage={stage}", f"batch.global_batch_size={global_batch}")
            assert st.grad_accum_steps == m
            base = steptime.estimate_step_time(shape, st, hardware(ideal(), device="cpu"))
            charged = steptime.estimate_step_time(shape, st, hardware(prof, device="cpu"))
            want = m * (micro_el[stage] * N + micro_t[stage] * 39) + rest_el[stage] * N + rest_t[stage] * 39
            assert charged.engine_s == pytest.approx(want, rel=1e-9), (stage, m)
            assert charged.step_time_s - base.step_time_s == pytest.approx(want, rel=1e-9), (stage, m)
    # bf16 has no split row: its figures (none here) keep the stage rule.
    _, shape, st = setup("parallel.zero_stage=2", "precision=bf16", "batch.global_batch_size=32")
    bf = ideal(engine_element_s={"bf16": rest_el}, engine_element_micro_s={"fp32": micro_el})
    assert steptime.estimate_step_time(shape, st, hardware(bf, device="cpu")).engine_s \
        == pytest.approx(2 * rest_el[2] * N, rel=1e-9)


def test_engine_split_in_profile_files(tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    prof = ideal(engine_element_micro_s={"fp32": [1e-9, 2e-9, 3e-9, 4e-9]},
                 engine_tensor_micro_s={"fp32": [1e-4, 2e-4, 3e-4, 0.0]}, compute_slots=2)
    path.write_text(yaml.safe_dump(profile_to_dict(prof, measured={"world": 4})))
    back = load_profile(str(path))
    assert back.engine_element_micro_s == {"fp32": [0.5e-9, 1e-9, 1.5e-9, 2e-9]}
    assert back.engine_tensor_micro_s == {"fp32": [0.5e-4, 1e-4, 1.5e-4, 0.0]}
    path.write_text(yaml.safe_dump(profile_to_dict(ideal(engine_tensor_micro_s={"fp32": [1e-4, -1e-4, 0.0, 0.0]}))))
    with pytest.raises(ConfigError, match="engine_tensor_micro_s.*ZeRO stages 0-3"):
        load_profile(str(path))


def test_engine_per_element_in_profile_files(tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    prof = ideal(engine_element_s={"fp32": [1e-9, 2e-9, 3e-9, 4e-9]}, compute_slots=2)
    path.write_text(yaml.safe_dump(profile_to_dict(prof)))
    assert load_profile(str(path)).engine_element_s == prof.engine_element_s
    # Measured by 4 ranks on 2 cores, each rank had half a core: the per-element time of one rank alone is half.
    path.write_text(yaml.safe_dump(profile_to_dict(prof, measured={"world": 4})))
    assert load_profile(str(path)).engine_element_s == {"fp32": [0.5e-9, 1e-9, 1.5e-9, 2e-9]}
    for bad in ([1e-9, 2e-9, 3e-9], [1e-9, -2e-9, 3e-9, 4e-9]):
        path.write_text(yaml.safe_dump(profile_to_dict(ideal(engine_element_s={"fp32": bad}))))
        with pytest.raises(ConfigError, match="engine_element_s.*ZeRO stages 0-3"):
            load_profile(str(path))
    prof = ideal(engine_tensor_s={"fp32": [1e-4, 2e-4, 3e-4, 0.0]}, compute_slots=2)
    path.write_text(yaml.safe_dump(profile_to_dict(prof, measured={"world": 4})))
    assert load_profile(str(path)).engine_tensor_s == {"fp32": [0.5e-4, 1e-4, 1.5e-4, 0.0]}
    path.write_text(yaml.safe_dump(profile_to_dict(ideal(engine_tensor_s={"fp32": [1e-4, -1e-4, 0.0, 0.0]}))))
    with pytest.raises(ConfigError, match="engine_tensor_s.*ZeRO stages 0-3"):
        load_profile(str(path))


def test_framework_cost_per_block_and_model_every_micro_batch():
    # profile.framework_s[arch][dtype] = [block forward, block backward, model]: every micro-batch pays L blocks'
    # forward + backward and the model's share once; full recompute runs each block's forward again. recipe=tiny:
    # 4 llama blocks, fp32, 2 micro-batches at global batch 32 on 2 ranks.
    fb, bb, model = 3e-3, 1e-3, 5e-3
    fw = {"llama": {"fp32": [fb, bb, model]}}
    for recompute, per_block in (("false", fb + bb), ("true", 2 * fb + bb)):
        _, shape, st = setup("batch.global_batch_size=32", f"model.activation_checkpointing={recompute}")
        assert st.grad_accum_steps == 2 and shape.num_layers == 4
        base = steptime.estimate_step_time(shape, st, hardware(ideal(), device="cpu"))
        charged = steptime.estimate_step_time(shape, st, hardware(ideal(framework_s=fw), device="cpu"))
        assert charged.step_time_s - base.step_time_s == pytest.approx(2 * (4 * per_block + model), rel=1e-9)
        assert charged.framework_s == pytest.approx(2 * (4 * per_block + model), rel=1e-9)
        assert sum(charged.breakdown().values()) == pytest.approx(charged.step_time_s, rel=1e-9)
    # Mistral runs llama's code path and takes llama's figure; another dtype's or architecture's row is not used.
    assert ideal(framework_s=fw).framework("mistral", "fp32") == (fb, bb, model)
    assert ideal(framework_s=fw).framework("llama", "bf16") == (0.0, 0.0, 0.0)
    assert ideal(framework_s=fw).framework("gpt", "fp32") == (0.0, 0.0, 0.0)


def test_framework_residual_is_the_probe_beyond_the_charged_terms():
    # A profile where every operator costs something (GEMMs at 0.1 TFLOP/s, 10 GB/s, 5 us a kernel). The probe's
    # "measured" times are what the model charges for its 1- and 3-block models plus a known extra: 2 ms a block
    # forward, 1 ms a block backward, 4 ms a model (split 3 forward + 1 backward). The residual is those extras.
    prof = ideal(gemm_tflops={"any": 0.1}, memory_gbps=10.0, kernel_overhead_s=5e-6, attention_tflops={"any": 0.05})
    P_ = steptime.FRAMEWORK_PROBE
    measured = {}
    for layers in P_["layers"]:
        shape = dataclasses.replace(model_shape(compose(["recipe=tiny"]).model), hidden_size=P_["hidden_size"],
                                    num_layers=layers, num_heads=P_["num_heads"], num_kv_heads=P_["num_heads"],
                                    intermediate_size=P_["intermediate_size"], vocab_size=P_["vocab_size"])
        st = dataclasses.replace(setup("cluster.gpus_per_node=1", "batch.global_batch_size=8")[2], micro_batch_size=1,
                                 global_batch_size=1, seq_length=P_["seq_length"], padded_vocab_size=P_["vocab_size"])
        links = steptime._links(st, prof)
        bf, bb = steptime.block_costs(shape, st, prof, links)
        first, last = steptime.end_costs(shape, st, prof, links)
        measured[layers] = (layers * (bf.compute + 2e-3) + first.compute + 3e-3,
                            layers * (bb.compute + 1e-3) + last.compute + 1e-3)
    assert steptime.framework_residual("llama", "fp32", measured, prof) == pytest.approx([2e-3, 1e-3, 4e-3], rel=1e-6)
    # Where the terms already charge more than the probe took, nothing is added (never a negative cost).
    fast = {k: (f / 10, b / 10) for k, (f, b) in measured.items()}
    assert min(steptime.framework_residual("llama", "fp32", fast, prof)) == 0.0


def test_selective_recompute_charges_element_wise_operators_and_the_dispatch_mode():
    # model.checkpoint_mode=selective on recipe=tiny (4 llama blocks, fp32, 2 micro-batches): the recompute is each
    # block's forward element-wise operators and framework time again, no GEMM or attention; the profile's
    # selective_framework_s (the dispatch mode, forward + backward) comes on top, per block and micro-batch.
    # Element-wise at 10 GB/s and 5 us a kernel, GEMMs at 0.1 TFLOP/s, framework 3 ms + 1 ms a block.
    rates = dict(gemm_tflops={"any": 0.1}, memory_gbps=10.0, kernel_overhead_s=5e-6, attention_tflops={"any": 0.05},
                 framework_s={"llama": {"fp32": [3e-3, 1e-3, 0.0]}})
    sel_f, sel_b = 2e-3, 0.5e-3
    plans = {}
    for mode, extra in (("none", []), ("full", ["model.activation_checkpointing=true"]),
                        ("selective", ["model.activation_checkpointing=true", "model.checkpoint_mode=selective"])):
        _, shape, st = setup("batch.global_batch_size=32", *extra)
        assert st.recompute == mode and st.grad_accum_steps == 2 and shape.num_layers == 4
        plans[mode] = [steptime.estimate_step_time(shape, st, hardware(ideal(**rates, **more), device="cpu"))
                       for more in ({}, {"selective_framework_s": {"llama": {"fp32": [sel_f, sel_b]}}})]
    bf, _ = steptime.block_costs(shape, st, ideal(**rates), steptime._links(st, ideal(**rates)))
    none, full, selective = plans["none"][0], plans["full"][0], plans["selective"][0]
    assert none.step_time_s < selective.step_time_s < full.step_time_s
    assert selective.gemm_s == none.gemm_s and selective.attention_s == none.attention_s
    assert full.gemm_s > none.gemm_s
    assert selective.step_time_s - none.step_time_s == pytest.approx(2 * 4 * (bf.memory + 3e-3), rel=1e-9)
    assert selective.recompute_s == pytest.approx(2 * 4 * (bf.memory + 3e-3), rel=1e-9)
    measured = plans["selective"][1]
    assert measured.step_time_s - selective.step_time_s == pytest.approx(2 * 4 * (sel_f + sel_b), rel=1e-9)
    assert plans["none"][1].step_time_s == none.step_time_s     # only selectively checkpointed blocks pay it
    assert plans["full"][1].step_time_s == full.step_time_s


def test_selective_residual_is_the_probe_beyond_the_charged_recompute():
    # The framework probe with selective checkpointing took 2 ms a block more forward and, backward, the charged
    # recompute (element-wise operators + the forward's framework time) plus 0.5 ms a block: the residual is those.
    prof = ideal(gemm_tflops={"any": 0.1}, memory_gbps=10.0, kernel_overhead_s=5e-6, attention_tflops={"any": 0.05},
                 framework_s={"llama": {"fp32": [3e-3, 1e-3, 0.0]}})
    P_ = steptime.FRAMEWORK_PROBE
    lo, hi = P_["layers"]
    shape = dataclasses.replace(model_shape(compose(["recipe=tiny"]).model), hidden_size=P_["hidden_size"],
                                num_layers=lo, num_heads=P_["num_heads"], num_kv_heads=P_["num_heads"],
                                intermediate_size=P_["intermediate_size"], vocab_size=P_["vocab_size"])
    st = dataclasses.replace(setup("cluster.gpus_per_node=1", "batch.global_batch_size=8")[2], micro_batch_size=1,
                             global_batch_size=1, seq_length=P_["seq_length"], padded_vocab_size=P_["vocab_size"])
    bf, _ = steptime.block_costs(shape, st, prof, steptime._links(st, prof))
    plain = {lo: (0.010, 0.020), hi: (0.016, 0.024)}                       # 3 ms + 2 ms a block
    per_f, per_b = 3e-3 + 2e-3, 2e-3 + bf.memory + bf.framework + 0.5e-3
    selective = {lo: (0.010 + per_f - 3e-3, 0.020 + per_b - 2e-3), hi: (0.016 + 3 * (per_f - 3e-3), 0.024 + 3 * (per_b - 2e-3))}
    assert steptime.selective_residual("llama", "fp32", plain, selective, prof) == pytest.approx([2e-3, 0.5e-3], rel=1e-6)
    assert steptime.selective_residual("llama", "fp32", plain, plain, prof) == [0.0, 0.0]     # never negative


def test_selective_figures_in_profile_files(tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    prof = ideal(selective_framework_s={"llama": {"fp32": [2e-3, 1e-3]}}, selective_host_s={"gpt": {"bf16": [1e-3, 0.0]}})
    path.write_text(yaml.safe_dump(profile_to_dict(prof)))
    back = load_profile(str(path))
    assert back.selective("mistral", "fp32") == (pytest.approx(3e-3), None)    # the llama family reads llama's
    assert back.selective("gpt", "fp16") == (None, pytest.approx(1e-3))        # fp16 takes bf16's
    for bad in ([1e-3], [1e-3, -1e-3]):
        path.write_text(yaml.safe_dump(profile_to_dict(ideal(selective_framework_s={"llama": {"fp32": bad}}))))
        with pytest.raises(ConfigError, match="selective_framework_s.*block forward"):
            load_profile(str(path))


def test_framework_in_profile_files(tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    prof = ideal(framework_s={"llama": {"fp32": [2e-3, 1e-3, 4e-3]}}, compute_slots=2)
    path.write_text(yaml.safe_dump(profile_to_dict(prof)))
    assert load_profile(str(path)).framework_s == prof.framework_s
    # Measured by 4 ranks on 2 cores: one rank alone on its core pays half (alone_rates).
    path.write_text(yaml.safe_dump(profile_to_dict(prof, measured={"world": 4})))
    assert load_profile(str(path)).framework("llama", "fp32") == pytest.approx((1e-3, 0.5e-3, 2e-3))
    for bad in ([1e-3, 1e-3], [1e-3, -1e-3, 1e-3]):
        path.write_text(yaml.safe_dump(profile_to_dict(ideal(framework_s={"llama": {"fp32": bad}}))))
        with pytest.raises(ConfigError, match="framework_s.*block forward"):
            load_profile(str(path))


def test_host_floor_bounds_a_micro_batch_from_below():
    # profile.host_s[arch][dtype] = [block forward, block backward, model]: on a GPU the host issues a micro-batch's
    # kernels ahead of the device, so the step pays max(kernels, host issue) per micro-batch, not their sum.
    # recipe=tiny (4 llama blocks, fp32) on one GPU, 2 micro-batches: only GEMMs cost (ideal), at 1 TFLOP/s.
    _, shape, st = setup("cluster.gpus_per_node=1", "batch.global_batch_size=16")
    assert st.grad_accum_steps == 2 and shape.num_layers == 4 and st.pipeline_degree == 1
    base = steptime.estimate_step_time(shape, st, hardware(ideal()))
    kernels = base.gemm_s / 2                         # one micro-batch's device time
    hf, hb, model = 0.3 * kernels / 4, 0.5 * kernels / 4, 0.6 * kernels   # host 4 (hf + hb) + model = 1.4 x kernels
    slow = steptime.estimate_step_time(shape, st, hardware(ideal(host_s={"llama": {"fp32": [hf, hb, model]}})))
    assert slow.host_bound_s == pytest.approx(2 * (4 * (hf + hb) + model - kernels), rel=1e-9)
    assert slow.step_time_s - base.step_time_s == pytest.approx(2 * 0.4 * kernels, rel=1e-9)
    assert sum(slow.breakdown().values()) == pytest.approx(slow.step_time_s, rel=1e-9)
    # A host faster than the kernels is hidden behind them: nothing is added.
    half = {"llama": {"fp32": [hf / 2, hb / 2, model / 2]}}
    fast = steptime.estimate_step_time(shape, st, hardware(ideal(host_s=half)))
    assert fast.step_time_s == pytest.approx(base.step_time_s, rel=1e-12) and fast.host_bound_s == 0.0
    # Full recompute issues every block's forward again (and runs the blocks' forward GEMMs again).
    _, _, full = setup("cluster.gpus_per_node=1", "batch.global_batch_size=16", "model.activation_checkpointing=true")
    recomputed = steptime.estimate_step_time(shape, full, hardware(ideal())).gemm_s / 2
    assert recomputed > kernels
    rec = steptime.estimate_step_time(shape, full, hardware(ideal(host_s={"llama": {"fp32": [hf, hb, model]}})))
    assert rec.host_bound_s == pytest.approx(2 * (4 * (2 * hf + hb) + model - recomputed), rel=1e-9)
    # PP2, every stage host-bound: each issues its own 2 blocks and half the model, H = 2 (hf + hb) + model / 2, and
    # 1F1B runs p + m - 1 = 3 such slots; doubling the host's figures adds 3 H to the step.
    pp2 = dataclasses.replace(st, pipeline_degree=2)
    slow_host = [20 * hf, 20 * hb, 20 * model]          # far above either stage's kernels
    step = {x: steptime.estimate_step_time(shape, pp2, hardware(ideal(host_s={"llama": {"fp32": [
        x * v for v in slow_host]}}))).step_time_s for x in (1, 2)}
    assert step[2] - step[1] == pytest.approx(3 * (2 * (20 * hf + 20 * hb) + 20 * model / 2), rel=1e-9)


def test_host_in_profile_files(tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    prof = ideal(host_s={"llama": {"bf16": [1e-3, 2e-3, 3e-3]}})
    path.write_text(yaml.safe_dump(profile_to_dict(prof)))
    assert load_profile(str(path)).host("mistral", "fp16") == (1e-3, 2e-3, 3e-3)
    assert load_profile(str(path)).host("gpt", "bf16") == (0.0, 0.0, 0.0)
    path.write_text(yaml.safe_dump(profile_to_dict(ideal(host_s={"llama": {"bf16": [1e-3, -1e-3, 0.0]}}))))
    with pytest.raises(ConfigError, match="host_s.*block forward"):
        load_profile(str(path))


def test_probe_split_blocks_and_model():
    # FRAMEWORK_PROBE runs 1 and 3 blocks: a block is half the difference, the model what is left at one block.
    assert steptime.FRAMEWORK_PROBE["layers"] == (1, 3)
    assert steptime.probe_split({1: (5e-3, 4e-3), 3: (9e-3, 10e-3)}) == pytest.approx([2e-3, 3e-3, 4e-3])


def test_ulysses_four_all_to_alls_each_way():
    # SP2, one micro-batch: per block q, k, v and the output each cross by their own all-to-all forward and again
    # backward (DeepSpeed _SeqAllToAll), each tensor n/sp tokens x a d: 8 all-to-alls of L + 1/2 x bytes / B.
    lat, bus = 1e-4, 1.0
    _, shape, st = setup("cluster.gpus_per_node=2", "parallel.sequence_degree=2", "batch.global_batch_size=8",
                         "parallel.zero_stage=0")
    n = 8 * st.seq_length / 2
    a2a = lat + 0.5 * n * 128 * 4 / (bus * 1e9)
    t = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, bus))))
    assert st.grad_accum_steps == 1
    assert t.sp_comm_s == pytest.approx(4 * 8 * a2a, rel=1e-9)


def test_ulysses_grouped_query_exchange_and_deepspeeds_copies():
    # Against DP2 at micro-batch 4 (the same 4 x 128 = 512 tokens a rank, the same element-wise work outside
    # attention), SP2 adds per block and micro-batch DeepSpeed's 2 copies of each of the 4 exchanged tensors
    # forward and the same backward (read + write, fp32). Under grouped-query attention our Ulysses attention
    # (launcher/parallel/sequence.py) sends k, v with their kv heads when sp divides kv (2 KV heads of 4), else
    # repeats them to all heads first (1 KV head); the repeat (kv heads read, a written) runs forward and back.
    lat, bus, gbps = 1e-4, 1.0, 1.0
    prof = ideal(intra=Link(lat, bus), memory_gbps=gbps)
    common = ("cluster.gpus_per_node=2", "batch.global_batch_size=8", "parallel.zero_stage=0")
    sp2 = (*common, "parallel.sequence_degree=2")
    mha = steptime.estimate_step_time(*setup(*sp2)[1:], hardware(prof))
    gqa = steptime.estimate_step_time(*setup(*sp2, "model.num_key_value_heads=2")[1:], hardware(prof))
    mqa = steptime.estimate_step_time(*setup(*sp2, "model.num_key_value_heads=1")[1:], hardware(prof))
    dp = steptime.estimate_step_time(*setup(*common, "batch.micro_batch_size=4")[1:], hardware(prof))
    n, a, d, layers = 512, 4, 32, 4
    el = n * d * 4                                              # bytes of one head's n tokens, fp32
    a2a = lambda heads: lat + 0.5 * heads * el / (bus * 1e9)    # noqa: E731
    assert mha.sp_comm_s == pytest.approx(layers * 2 * 4 * a2a(a), rel=1e-9)
    assert gqa.sp_comm_s == pytest.approx(layers * 2 * (2 * a2a(a) + 2 * a2a(2)), rel=1e-9)
    assert mqa.sp_comm_s == pytest.approx(mha.sp_comm_s, rel=1e-9)
    gb = gbps * 1e9
    assert mha.memory_bound_s - dp.memory_bound_s == pytest.approx(layers * 2 * 2 * 2 * 4 * a * el / gb, rel=1e-9)
    for got, kv, sent in ((gqa, 2, 2), (mqa, 1, a)):
        copies = 2 * 2 * 2 * (2 * a + 2 * sent) * el / gb
        repeat = 2 * 2 * (kv + a) * el / gb
        rotary = 3 * 9 * (a + kv) * el / gb                     # q and k rotated, forward + twice the bytes back
        mha_rotary = 3 * 9 * 2 * a * el / gb
        assert got.memory_bound_s - dp.memory_bound_s == pytest.approx(
            layers * (copies + repeat + rotary - mha_rotary), rel=1e-9)


def test_context_parallel_ring_passes_and_halved_tokens():
    # CP2 on 2 ranks, one micro-batch of 8 x 128 tokens: each rank holds n = 8 x 128 / 2 tokens (GEMMs at n). With
    # attention free, nothing hides the ring: per block forward one all-gather of both ranks' k, v (repeated to the
    # a = 4 heads, d = 32, fp32: 2 n a d 4 bytes each), backward that again plus cp = 2 rotations of the fp32 dK/dV.
    lat, bus = 1e-4, 1.0
    _, shape, st = setup("cluster.gpus_per_node=2", "parallel.context_degree=2", "batch.global_batch_size=8",
                         "parallel.zero_stage=0")
    assert (st.context_degree, st.data_degree, st.grad_accum_steps) == (2, 1, 1)
    n, a, d = 8 * 128 / 2, 4, 32
    kv = 2 * n * a * d * 4
    ring = lat + (1 / 2) * 2 * kv / (bus * 1e9)
    dkv = 2 * (lat + kv / (bus * 1e9))
    t = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, bus))))
    assert t.sp_comm_s == pytest.approx(4 * (2 * ring + dkv), rel=1e-9)
    assert t.gemm_s == pytest.approx((4 * _block_gemm_flops(128, 352, n) + 3 * 2 * n * 128 * 2048) / P, rel=1e-9)


def test_a_profile_calibrated_on_more_ranks_than_cores_is_not_stretched_twice(tmp_path):
    # One machine, 2 cores, measured by calibrate twice: with 2 ranks each rank had a core (GEMM rate P); with 4
    # ranks each had half a core, so every timed operation ran at half speed (rate P/2, per-operator overhead 2x).
    # Both files describe the same machine, so a 4-rank layout must plan the same step time from either (the model
    # stretches compute by 4 ranks / 2 cores once; bench/parallel's CP4 row was planned 2x slow before).
    import yaml

    _, shape, st = setup("cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.zero_stage=1")
    two = ideal(compute_slots=2, kernel_overhead_s=1e-5, memory_gbps=10.0, gemm_table={"any": [[64.0, P / 1e12]]})
    half = dict(compute_slots=2, kernel_overhead_s=2e-5, memory_gbps=5.0, gemm_tflops={"any": P / 2e12},
                gemm_table={"any": [[64.0, P / 2e12]]}, attention_tflops={"any": 0.5e12})
    four = ideal(**half)
    times = []
    for prof, ranks in ((two, 2), (four, 4)):
        path = tmp_path / f"p{ranks}.yaml"
        path.write_text(yaml.safe_dump(profile_to_dict(prof, measured={"world": ranks})))
        times.append(steptime.estimate_step_time(shape, st, hardware(load_profile(str(path)), "cpu")).step_time_s)
    assert times[1] == pytest.approx(times[0], rel=1e-9)
    # A hand-written profile (no measurements) is taken as written.
    path = tmp_path / "hand.yaml"
    path.write_text(yaml.safe_dump(profile_to_dict(four)))
    assert load_profile(str(path)).gemm_tflops == four.gemm_tflops


def test_builtin_attention_rates_are_flashattention2_figure_bars():
    # FlashAttention-2 (Dao 2023) fig. 4(d) / 7(d), causal, head dim 128, fwd + bwd: A100 155 TFLOP/s at seq 2k,
    # H100 294 at 4k; between bars log-linear in the sequence (3k: halfway in log2 between 2k and 4k on A100).
    import math

    from launcher.plan.profile import BUILTIN, interpolate

    a100, h100 = BUILTIN["a100-80gb"].attention_table_for("bf16"), BUILTIN["h100-80gb"].attention_table_for("bf16")
    assert interpolate(a100, 2048) == pytest.approx(155e12)
    assert interpolate(h100, 4096) == pytest.approx(294e12)
    f = math.log(3072 / 2048) / math.log(2)
    assert interpolate(a100, 3072) == pytest.approx((155 + f * (173 - 155)) * 1e12)
    assert interpolate(a100, 65536) == pytest.approx(189e12)   # clamped at the last bar (16k)


def test_attention_rate_by_head_dimension():
    # FlashAttention-2 fig. 4(c) / 7(c), head dimension 64: A100 140 TFLOP/s at seq 2k (155 at 128), H100 257 at 4k
    # (294). Between the two measured head dimensions log-linear in the head dimension (96: 0.585 of the way from
    # 64 in log2); outside them the nearest (a 32 or a 256 head dimension reads 64's or 128's bars).
    import math

    from launcher.plan.profile import BUILTIN, interpolate

    a100, h100 = BUILTIN["a100-80gb"], BUILTIN["h100-80gb"]
    assert interpolate(a100.attention_table_for("bf16", 64), 2048) == pytest.approx(140e12)
    assert interpolate(h100.attention_table_for("bf16", 64), 4096) == pytest.approx(257e12)
    assert interpolate(a100.attention_table_for("bf16", 128), 2048) == pytest.approx(155e12)
    assert a100.attention_table_for("bf16", 256) == a100.attention_table_for("bf16") \
        == a100.attention_table_for("bf16", 128)
    assert a100.attention_table_for("bf16", 32) == a100.attention_table_for("bf16", 64)
    f = math.log(96 / 64) / math.log(2)
    assert interpolate(a100.attention_table_for("bf16", 96), 2048) == pytest.approx((140 + f * (155 - 140)) * 1e12)
    # fp16 reads bf16's; the H200 measured one head dimension, which then serves all.
    assert a100.attention_table_for("fp16", 64) == a100.attention_table_for("bf16", 64)
    h200 = BUILTIN["h200"]
    assert h200.attention_table_for("bf16", 64) == h200.attention_table_for("bf16", 128)

    # The plan charges it: the same 2,048-wide model at 32 heads of 64 against 16 heads of 128 (same FLOPs), seq 2k
    # on one A100, attention alone slower by the bars' ratio 155 / 140.
    def attention(heads):
        _, shape, st = setup("model.num_hidden_layers=2", "model.hidden_size=2048",
                             "model.intermediate_size=5504", f"model.num_attention_heads={heads}",
                             f"model.num_key_value_heads={heads}", "data.seq_length=2048", "precision=bf16",
                             "cluster=a100-80gb", "cluster.gpus_per_node=1", "batch.micro_batch_size=1",
                             "batch.global_batch_size=1", "parallel.zero_stage=0")
        return steptime.estimate_step_time(shape, st, hardware(a100)).attention_s
    launches = 4 * a100.kernel_overhead_s     # 2 blocks, forward + backward
    assert attention(32) - launches == pytest.approx((attention(16) - launches) * 155 / 140, rel=1e-6)


def _compute(t) -> float:
    return t.gemm_s + t.attention_s + t.memory_bound_s


def test_straggler_wait_on_the_step_compute_at_the_one_gradient_sync():
    # DP2 ZeRO-0 (and 1): no collective inside a micro-batch, so the one synchronisation is the gradient reduce after
    # the last backward; the group waits for its slower rank over the whole step's compute (2 micro-batches here).
    for stage in (0, 1):
        _, shape, st = setup(f"parallel.zero_stage={stage}", "batch.global_batch_size=32")
        assert st.grad_accum_steps == 2 and st.zero_partition_degree == 2
        base = steptime.estimate_step_time(shape, st, hardware(ideal(), device="cpu"))
        flat = {2: [[1e-6, 0.1], [1e3, 0.1]]}
        late = steptime.estimate_step_time(shape, st, hardware(ideal(straggler=flat), device="cpu"))
        assert late.straggler_s == pytest.approx(0.1 * _compute(base), rel=1e-9)
        assert late.step_time_s - base.step_time_s == pytest.approx(0.1 * _compute(base), rel=1e-9)
        assert sum(late.breakdown().values()) == pytest.approx(late.step_time_s, rel=1e-9)
    # One rank waits for nobody.
    _, shape, st = setup("cluster.gpus_per_node=1", "batch.global_batch_size=8")
    assert steptime.estimate_step_time(shape, st, hardware(ideal(straggler=flat), device="cpu")).straggler_s == 0.0


def test_straggler_wait_per_tp_collective_at_its_segment_length():
    # TP2, 2 micro-batches: 4 blocks x 4 all-reduces (2 forward, 2 backward) per micro-batch split its compute into
    # 16 segments; the fraction is read at that segment length, log-linear between the measured points.
    import math

    _, shape, st = setup("parallel.tensor_degree=2", "parallel.zero_stage=1")
    assert st.grad_accum_steps == 2 and shape.num_layers == 4
    base = steptime.estimate_step_time(shape, st, hardware(ideal(), device="cpu"))
    per_mb = _compute(base) / 2
    seg = per_mb / 16
    lo, hi = (seg / 10, 0.2), (seg * 100, 0.05)
    want = 0.2 + (math.log(seg) - math.log(lo[0])) / (math.log(hi[0]) - math.log(lo[0])) * (0.05 - 0.2)
    late = steptime.estimate_step_time(shape, st, hardware(ideal(straggler={2: [list(lo), list(hi)]}), device="cpu"))
    assert late.straggler_s == pytest.approx(2 * want * per_mb, rel=1e-9)
    assert late.step_time_s - base.step_time_s == pytest.approx(2 * want * per_mb, rel=1e-9)
    # Clamped outside the measured lengths.
    short = steptime.estimate_step_time(shape, st, hardware(ideal(straggler={2: [[seg * 10, 0.3], [seg * 20, 0.01]]}),
                                                            device="cpu"))
    assert short.straggler_s == pytest.approx(2 * 0.3 * per_mb, rel=1e-9)


def test_straggler_group_is_the_largest_synchronising_one():
    # 4 ranks: TP2 x DP2 ZeRO-1 synchronises pairs inside a micro-batch (group 2); DP4 ZeRO-3's gathers span 4 ranks;
    # a group larger than any measured takes the largest measured size (8 ranks here: the 4-rank figure).
    table = {2: [[1.0, 0.1]], 4: [[1.0, 0.3]]}
    prof = ideal(straggler=table)
    assert prof.straggler_fraction(2, 0.5) == 0.1 and prof.straggler_fraction(3, 0.5) == 0.1
    assert prof.straggler_fraction(8, 0.5) == 0.3 and prof.straggler_fraction(1, 0.5) == 0.0
    _, shape, st = setup("cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.zero_stage=1")
    assert steptime._syncs_per_micro_batch(shape, st, 0) == (16, 2)
    _, shape, st = setup("cluster.gpus_per_node=4", "parallel.zero_stage=3", "batch.global_batch_size=32")
    # ZeRO-3: per micro-batch its all-gathers and the gradient reduce. recipe=tiny's block matrices stay whole below
    # the persistence threshold, and the first fetch's prefetch walk gathers the embedding and the head in one call;
    # both are kept for the backward (far inside the reuse distance): one all-gather, as DeepSpeed issues
    # (bench/steptime/results.md, 2026-12-06 13:00), and the reduce.
    assert steptime._syncs_per_micro_batch(shape, st, 0) == (2, 4)
    base = steptime.estimate_step_time(shape, st, hardware(ideal(), device="cpu"))
    late = steptime.estimate_step_time(shape, st, hardware(prof, device="cpu"))
    assert late.straggler_s == pytest.approx(0.3 * _compute(base), rel=1e-9)
    # A pipeline stage synchronises with each neighbour twice per micro-batch (activations forward, gradients back).
    _, shape, st = setup("parallel.pipeline_degree=2", "parallel.zero_stage=1")
    assert steptime._syncs_per_micro_batch(shape, st, 0) == (2, 2) == steptime._syncs_per_micro_batch(shape, st, 1)


def test_straggler_table_in_profile_files_and_built_ins(tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    prof = ideal(straggler={2: [[0.005, 0.1], [0.15, 0.05]]})
    path.write_text(yaml.safe_dump(profile_to_dict(prof, measured={"world": 4})))
    assert load_profile(str(path)).straggler == prof.straggler      # a fraction: kept as measured under sharing
    for bad in ({1: [[0.005, 0.1]]}, {2: []}, {2: [[0.0, 0.1]]}, {2: [[0.005, -0.1]]}):
        path.write_text(yaml.safe_dump(profile_to_dict(ideal(straggler=bad))))
        with pytest.raises(ConfigError, match="straggler table"):
            load_profile(str(path))
    # Not measured on the built-in GPUs: no wait charged there, so the published-run comparison is unchanged.
    assert all(not p.straggler for p in BUILTIN.values())


def test_a_group_smaller_than_the_node_takes_its_own_measured_link(tmp_path):
    # TP2 x PP2 on a 4-rank node: the TP groups are 2 ranks. calibrate measures a 2-rank group's all-reduce apart
    # from the node-wide one (intra_groups); the plan charges it, and the node-wide link where no group size matches.
    import yaml

    lat, bus = 1e-4, 1.0
    _, shape, st = setup("cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.pipeline_degree=2",
                         "parallel.partition_method=type:DecoderBlock", "batch.global_batch_size=8", "parallel.zero_stage=0")
    n, w = 8 * st.seq_length, 4
    ar = lat + 2 * (1 / 2) * n * 128 * w / (bus * 1e9)
    ar_loss = lat + 2 * (1 / 2) * n * 4 / (bus * 1e9)     # the vocab-parallel loss's all-reduces, 3 of n fp32 values
    slow = Link(50 * lat, bus / 50)
    prof = ideal(intra=slow, intra_groups={2: Link(lat, bus)})
    # the slowest (last) stage: 2 blocks x 4 all-reduces, the head input's gradient all-reduce and the loss's 3
    assert steptime.estimate_step_time(shape, st, hardware(prof)).tp_comm_s == pytest.approx(
        (2 * 4 + 1) * ar + 3 * ar_loss, rel=1e-9)
    no_pair = steptime.estimate_step_time(shape, st, hardware(ideal(intra=slow, intra_groups={4: Link(lat, bus)})))
    assert no_pair.tp_comm_s == pytest.approx((2 * 4 + 1) * (50 * lat + 50 * (ar - lat))
                                              + 3 * (50 * lat + 50 * (ar_loss - lat)), rel=1e-9)
    # The file round-trips it.
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile_to_dict(prof)))
    assert load_profile(str(path)).intra_groups == {2: Link(lat, bus)}


def test_a_multi_node_profile_takes_its_share_of_a_core_per_node(tmp_path):
    # 2 nodes x 2 ranks on 2 cores each (`launcher submit --calibrate`): world 4, but each rank had a core, so
    # nothing is taken back out (alone_rates reads the ranks a node, local_world, not the world).
    import yaml

    prof = ideal(compute_slots=2, gemm_tflops={"any": 0.5})
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile_to_dict(prof, measured={"world": 4, "local_world": 2, "nodes": 2})))
    assert load_profile(str(path)).gemm_tflops == {"any": 0.5}
    path.write_text(yaml.safe_dump(profile_to_dict(prof, measured={"world": 4})))
    assert load_profile(str(path)).gemm_tflops == {"any": 1.0}


def test_a_synchronisation_costs_its_release_beyond_the_links_latency():
    # TP2, 2 micro-batches of 16 all-reduces each: every synchronisation costs what calibrate measured a tiny
    # all-reduce of the pair to take after that segment of compute (profile.release, read at the segment length
    # like the straggler fraction) beyond the latency the TP link already charges; none where the link's latency is
    # at least that.
    _, shape, st = setup("parallel.tensor_degree=2", "parallel.zero_stage=1")
    lat = 1e-4
    base = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, 1e12)), device="cpu"))
    seg = _compute(base) / 2 / 16
    slow = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, 1e12), release={2: [[seg, 4e-4]]}),
                                                           device="cpu"))
    assert slow.straggler_s == pytest.approx(2 * 16 * (4e-4 - lat), rel=1e-9)
    assert slow.step_time_s - base.step_time_s == pytest.approx(2 * 16 * (4e-4 - lat), rel=1e-9)
    below = ideal(intra=Link(lat, 1e12), release={2: [[seg, 0.5 * lat]]})
    assert steptime.estimate_step_time(shape, st, hardware(below, device="cpu")).straggler_s == 0.0
    # DP2 ZeRO-1 alone: the step's one synchronisation, after the whole step's compute.
    _, shape, st = setup("parallel.zero_stage=1")
    base = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, 1e12)), device="cpu"))
    late = steptime.estimate_step_time(shape, st, hardware(ideal(intra=Link(lat, 1e12), release={2: [[1e-3, 2e-3]]}),
                                                           device="cpu"))
    assert late.straggler_s == pytest.approx(2e-3 - lat, rel=1e-9)


def test_release_table_in_profile_files(tmp_path):
    import yaml

    path = tmp_path / "p.yaml"
    prof = ideal(release={2: [[0.005, 1e-3], [0.15, 2e-3]]})
    path.write_text(yaml.safe_dump(profile_to_dict(prof, measured={"world": 4})))
    assert load_profile(str(path)).release == prof.release
    for bad in ({1: [[0.005, 1e-3]]}, {2: []}, {2: [[0.0, 1e-3]]}, {2: [[0.005, -1e-3]]}):
        path.write_text(yaml.safe_dump(profile_to_dict(ideal(release=bad))))
        with pytest.raises(ConfigError, match="release table"):
            load_profile(str(path))


def test_cpu_ranks_plan_the_calibrated_process_not_the_cuda_allowance(tmp_path):
    """On CPU ranks the plan's memory overhead is the process calibrate measured (profile.process_bytes) and the
    ZeRO-1/2 bucket only as far as the stage's gradients fill it (torch.empty pages are not resident until
    written); a GPU, or a CPU profile from before process_bytes, keeps the 2 GB allowance and the whole bucket (two
    on a GPU, where the launcher turns on overlap_comm and DeepSpeed double-buffers it)."""
    import yaml

    from launcher.plan.memory import estimate_memory, explain_stage_memory

    _, shape, st = setup("parallel.zero_stage=2")           # recipe=tiny: fp32, 2 ranks, ZeRO-2
    n = shape.params.total                                  # no TP or PP: the bucket sees every gradient
    cpu = estimate_memory(shape, st, hardware(ideal(process_bytes=400e6), "cpu")).peak
    assert cpu.overhead == 400e6 + n * 4                    # 5e8 elements would be 2 GB; the model is ~1.3M
    gpu = estimate_memory(shape, st, hardware(ideal(process_bytes=400e6), "cuda")).peak
    assert gpu.overhead == 2e9 + 2 * 500_000_000 * 4            # overlap_comm (GPUs): DeepSpeed's two buckets
    old = estimate_memory(shape, st, hardware(ideal(), "cpu")).peak
    assert old.overhead == 2e9 + 500_000_000 * 4                # CPU ranks run without overlap_comm: one
    # the plan's table says which terms these are, with their arithmetic (recipe=tiny: 1,328,256 parameters)
    assert n == 1_328_256
    explain = {dev: explain_stage_memory(shape, st, hardware(ideal(process_bytes=400e6), dev), 0)["overhead"]
               for dev in ("cpu", "cuda")}
    assert explain["cpu"] == ("0.40 GB measured by launcher calibrate (the profile's process_bytes; glibc's kept "
                              "free blocks not counted) + ZeRO 2's reduce bucket pages its 1,328,256 gradients "
                              "fill x 4 B = 5.3 MB")
    assert explain["cuda"] == ("2.00 GB stated allowance (CUDA context, cuBLAS/NCCL workspaces, allocator "
                               "fragmentation) + ZeRO 2's reduce bucket x 2 (overlap_comm's double buffer) "
                               "500,000,000 elements x 4 B = 4.00 GB")
    # the states and activations are the same on either device
    assert (cpu.params, cpu.grads, cpu.optimizer, cpu.activations) == (gpu.params, gpu.grads, gpu.optimizer, gpu.activations)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile_to_dict(ideal(process_bytes=400e6))))
    assert load_profile(str(path)).process_bytes == 400e6
