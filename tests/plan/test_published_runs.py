"""bench/published/runs.yaml holds its sources' numbers faithfully: each record's stated figures agree with
each other the way the source defines them (a transcription error shows up as a disagreement), and every
record names its source. The planner is not involved here (bench/published/compare.py holds it to the runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

RUNS = yaml.safe_load((Path(__file__).parents[2] / "bench" / "published" / "runs.yaml").read_text())
PEAK = {"a100-80gb": 312e12, "a100-40gb": 312e12, "h100-80gb": 989.4e12}  # dense bf16 (NVIDIA datasheets)


def test_every_run_names_its_source_and_a_measurement():
    ids = [r["id"] for r in RUNS]
    assert len(ids) == len(set(ids))
    for r in RUNS:
        assert r["source"] and r["measured"], r["id"]
        assert set(r.get("derived", {})).isdisjoint(r.get("unknown", [])), r["id"]


@pytest.mark.parametrize("r", RUNS, ids=lambda r: r["id"])
def test_layout_multiplies_out(r):
    dp = r["dp"]
    assert r["tp"] * r["pp"] * r.get("cp", 1) * dp == r["gpus"]
    if "micro_batch" in r and "grad_accum" in r:
        assert r["micro_batch"] * r["grad_accum"] * dp == r["global_batch"]


def test_mosaicml_mfu_reproduces_from_throughput_and_stated_params():
    # llm-foundry's README: mfu = (6 N + 12 L d s) x tokens/s / (GPUs x peak), N = NumParams (its formula, per GPU here)
    for r in (r for r in RUNS if r["family"] == "mosaicml-llm-foundry"):
        m = r["model"]
        f = 6 * m["params_stated"] + 12 * m["layers"] * m["hidden"] * m["seq"]
        mfu = r["measured"]["tokens_per_s_per_gpu"] * f / PEAK[r["gpu"]] * 100
        assert mfu == pytest.approx(r["measured"]["mfu_pct"], rel=0.01, abs=0.3), r["id"]


def test_narayanan_table_1_aggregate_is_per_gpu_times_gpus():
    for r in (r for r in RUNS if r["id"].startswith("narayanan2021-t1")):
        m = r["measured"]
        assert m["tflops_per_gpu"] * r["gpus"] / 1e3 == pytest.approx(m["aggregate_pflops"], rel=0.01), r["id"]
        assert m["tflops_per_gpu"] / 312 * 100 == pytest.approx(m["pct_of_peak"], abs=0.6), r["id"]


def test_iteration_times_and_tflops_agree_under_eq3():
    # BLOOM (105 s, 149-150 TFLOP/s), MT-NLG (60.1 / 50.2 / 44.4 s, 126 / 121 / 113) and the Megatron-LM README's
    # GPT-3 175B (32 s, 138): the source's TFLOP/s are eq. 3 FLOPs (Narayanan et al. 2021, with recompute) over the
    # iteration time.
    eq3 = ("narayanan_eq3", "megatron_deepspeed_log_with_recompute")
    timed = [r for r in RUNS if "iteration_s" in r["measured"] and r["measured"].get("tflops_basis") in eq3]
    assert len(timed) >= 5
    for r in timed:
        m, mod = r["measured"], r["model"]
        l, h, s, v = mod["layers"], mod["hidden"], mod["seq"], mod["vocab"]
        flops = 96 * r["global_batch"] * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        assert flops / m["iteration_s"] / r["gpus"] / 1e12 == pytest.approx(m["tflops_per_gpu"], rel=0.02), r["id"]


def test_llama3_tflops_and_mfu_agree():
    for r in (r for r in RUNS if r["family"] == "llama3"):
        assert r["measured"]["tflops_per_gpu"] * 1e12 / PEAK["h100-80gb"] * 100 == pytest.approx(r["measured"]["mfu_pct"], abs=0.6)
        assert r["global_batch"] * r["model"]["seq"] == pytest.approx(16 * 2**20, rel=0.05)  # "16M" tokens per batch


def test_nemo_automodel_step_time_tokens_and_tflops_agree():
    # Its page gives step time, tokens/s/GPU and model TFLOP/s/GPU; the last by nemo_automodel's llama3_flops
    # (GBS s L h^2 (12 + 12 kv/H + 18 ffn/h + 6 s/h + 6 V/(L h)) per step, no recompute term).
    for r in (r for r in RUNS if r["family"] == "nemo-automodel"):
        m, mod = r["measured"], r["model"]
        L, h, s, v = mod["layers"], mod["hidden"], mod["seq"], mod["vocab"]
        tokens_per_s_per_gpu = r["global_batch"] * s / m["iteration_s"] / r["gpus"]
        assert tokens_per_s_per_gpu == pytest.approx(m["tokens_per_s_per_gpu"], rel=0.002)
        per_step = r["global_batch"] * s * L * h * h * (12 + 12 * mod["kv_heads"] / mod["heads"] + 18 * mod["ffn"] / h
                                                       + 6 * s / h + 6 * v / (L * h))
        assert per_step / m["iteration_s"] / r["gpus"] / 1e12 == pytest.approx(m["tflops_per_gpu"], rel=0.002)


def test_every_diagnostic_variant_still_applies_to_the_planner():
    # bench/published/variants.py rewrites named lines of launcher/plan/steptime.py (fused GELU, fused RMSNorm /
    # rotary / SwiGLU); a line edited since would leave a variant silently charging the committed model. Each
    # variant must load and move a prediction of its architecture the way its kernels do: fewer bytes, faster.
    import sys
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench" / "published"))
    import compare
    import variants
    for name, run in (("fused-gelu", "narayanan2021-t1-1.7b"), ("fused-llama", "tinyllama-1.1b-g16")):
        mod = variants.variant_module(name)
        r = next(r for r in RUNS if r["id"] == run)
        rows = [compare.compare([r], predict)["rows"][0]["predicted_tokens_per_s_per_gpu"] for predict in
                (compare.default_model, lambda sh, st, hw: mod.estimate_step_time(sh, st, hw).tokens_per_s)]
        assert rows[1] > rows[0] * 1.005, (name, r["id"], rows)


def test_own_kernels_view_charges_mpts_triton_attention_at_its_cited_rates():
    # MosaicML's `attention_kernel: triton` rows ran llm-foundry's Triton FlashAttention, which the FlashAttention-2
    # paper's fig. 4 benchmarks at 42-67% of FlashAttention-2's rate on the A100 (bench/published/variants.py
    # OWN_ATTENTION). compare.py's second view must charge it: at 16k tokens, where attention is most of a 125M
    # model's step, a Triton row's prediction there is well below the same fused-GELU planner at the profile's
    # FlashAttention-2 rates (by ~(1 - 0.47) of the attention's share), while a row that ran FlashAttention-2 (the
    # launcher's class) is charged the fused-GELU planner alone.
    import sys
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench" / "published"))
    import compare
    import variants
    own, mod = compare.own_kernels_model(), variants.variant_module("fused-gelu")

    def fa2(sh, st, hw):
        return mod.estimate_step_time(sh, st, hw).tokens_per_s
    for run, kernel in (("mosaicml-a10080gb-125m-s16384-g8-mb4-gbs64", "triton"),
                        ("mosaicml-h10080gb-7b-s2048-g512-mb6-gbs3072", "launcher's")):
        r = next(r for r in RUNS if r["id"] == run)
        assert r.get("attention_kernel", "launcher's") == kernel and r["elementwise_kernels"] == "fused"
        row = compare.compare([r], compare.default_model, predict_own=own)["rows"][0]
        at_own = row["measured_tokens_per_s_per_gpu"] * (1 + row["error_own_kernels"])
        at_fa2 = compare.compare([r], fa2)["rows"][0]["predicted_tokens_per_s_per_gpu"]
        if kernel == "triton":
            assert at_own < 0.75 * at_fa2, (run, at_own, at_fa2)
        else:
            assert at_own == pytest.approx(at_fa2, rel=1e-9), (run, at_own, at_fa2)


def test_own_kernels_view_charges_megatrons_unfused_attention_by_its_bytes():
    # Megatron's core attention (every Megatron / Megatron-DeepSpeed row: attention_kernel megatron_unfused) keeps
    # the b x heads x s x s scores in 16-bit memory: QK^T and PV as batched GEMMs over the whole square, the fused
    # scale-mask-softmax (read 2 B, write 2 B an element) and dropout (read 2, write 2, a 1-byte mask): 9 bytes an
    # element forward; backward dropout's (read 2 + 1, write 2) and softmax's (read 2 + 2, write 2): 11. The
    # variant must charge exactly that, and no FlashAttention time.
    import sys
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench" / "published"))
    import compare
    import variants
    from launcher.config.layout import resolve_layout
    from launcher.plan import steptime
    from launcher.plan.inputs import model_shape, resolve_hardware, strategy

    r = next(r for r in RUNS if r["id"] == "narayanan2021-t1-1.7b")
    assert r["attention_kernel"] == "megatron_unfused" and r["elementwise_kernels"] == "fused"
    cfg, recompute, _ = compare.to_config(r, compare.base_config(r["gpu"]))
    layout = resolve_layout(cfg)
    shape, st = model_shape(cfg.model), strategy(cfg, layout, recompute)
    prof = compare.device_only(resolve_hardware(cfg.cluster, cfg.precision.dtype)).profile
    links = steptime._links(st, prof)
    fused = variants.variant_module("fused-gelu").block_costs(shape, st, prof, links)
    unfused = variants.variant_module("fused-gelu", "megatron-attention").block_costs(shape, st, prof, links)
    b, s, d = st.micro_batch_size, st.seq_length, shape.head_dim
    heads = shape.num_heads / st.tensor_degree
    scores = b * heads * s * s
    bw, overhead = prof.memory_gbps * 1e9, prof.kernel_overhead_s
    for cost_fused, cost_unfused, per_element in ((fused[0], unfused[0], 9), (fused[1], unfused[1], 11)):
        assert cost_fused.attention > 0 and cost_unfused.attention == 0
        assert cost_unfused.memory - cost_fused.memory == pytest.approx(scores * per_element / bw + 2 * overhead, rel=1e-9)
    # the GEMMs gain QK^T ([s, d] x [d, s]) and PV ([s, s] x [s, d]) over the whole square, b x heads of each:
    # 2 x 2 b heads s^2 d FLOPs forward; backward each GEMM's two input gradients, twice that
    rate = steptime.gemm_rate(prof, st.dtype)

    def gemm(m, n, k):
        return steptime.gemm_s(m, n, k, 2, prof, rate, b * heads)
    assert unfused[0].gemm - fused[0].gemm == pytest.approx(gemm(s, s, d) + gemm(s, d, s), rel=1e-9)
    backward = gemm(s, d, s) + gemm(d, s, s) + gemm(s, s, d) + gemm(s, d, s)
    assert unfused[1].gemm - fused[1].gemm == pytest.approx(backward, rel=1e-9)
    # Against the run's measured throughput (Narayanan et al. 2021 table 1): +38% off with FlashAttention-2's
    # rates charged, within 10% with Megatron's own attention.
    row = compare.compare([r], compare.default_model, predict_own=compare.own_kernels_model())["rows"][0]
    assert abs(row["error_own_kernels"]) < 0.10, row


@pytest.mark.parametrize("run", ["narayanan2021-t1-18.4b", "dgxc-h100-llama31-405b-proxy7l-g32-bf16-2409"])
def test_headline_charges_vocab_parallel_ends(run):
    # The launcher's TP splits the vocabulary as Megatron's does (every Megatron-LM / Megatron-DeepSpeed / NeMo row
    # with tp > 1 ran the same ends, so no variant charges them apart since 2026-12-05): each rank holds V / t
    # embedding rows and computes V / t logits (ColumnParallelLinear, parallel_output=True), and
    # vocab_parallel_cross_entropy reads them. Collectives: the embedding's output all-reduced forward and the head
    # input's gradient all-reduced backward (n x h x 2 bytes each), or, under sequence parallelism, a reduce-scatter
    # and an all-gather of the same bytes at each end (and the final norm's weight gradient all-reduced); and the
    # loss's three fp32 all-reduces of one value a token (max, target logit, sum of exponentials).
    import sys
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench" / "published"))
    import compare
    from launcher.config.layout import resolve_layout
    from launcher.plan import steptime
    from launcher.plan.inputs import model_shape, resolve_hardware, strategy

    r = next(r for r in RUNS if r["id"] == run)
    assert r["tp"] == 8
    cfg, recompute, _ = compare.to_config(r, compare.base_config(r["gpu"]))
    layout = resolve_layout(cfg)
    shape, st = model_shape(cfg.model), strategy(cfg, layout, recompute)
    assert st.sequence_parallel == bool(r.get("sequence_parallel"))
    prof = compare.device_only(resolve_hardware(cfg.cluster, cfg.precision.dtype)).profile
    links = steptime._links(st, prof)
    first, last = steptime.end_costs(shape, st, prof, links)
    t, h, w = 8, shape.hidden_size, 2
    n = st.micro_batch_size * st.seq_length / r.get("cp", 1)      # this rank's tokens (CP splits the sequence)
    v = st.padded_vocab_size
    assert v % t == 0
    link = links["tp"]
    loss = 3 * steptime.all_reduce_s(n * 4, t, link)
    if st.sequence_parallel:
        ends = 2 * steptime.gather_s(n * h * w, t, link)
        assert first.tp == pytest.approx(ends, rel=1e-9)
        assert last.tp == pytest.approx(ends + steptime.all_reduce_s(h * w, t, link) + loss, rel=1e-9)   # RMSNorm weight
    else:
        one = steptime.all_reduce_s(n * h * w, t, link)
        assert first.tp == pytest.approx(one, rel=1e-9)
        assert last.tp == pytest.approx(one + loss, rel=1e-9)
    rate = steptime.gemm_rate(prof, st.dtype)
    head = (steptime.gemm_s(n, v / t, h, w, prof, rate) + steptime.gemm_s(n, h, v / t, w, prof, rate)
            + steptime.gemm_s(h, v / t, n, w, prof, rate))
    assert last.gemm == pytest.approx(head, rel=1e-9)


def test_dgxc_step_times_tokens_and_mfu_agree():
    # NVIDIA/dgxc-benchmarking prints step time and MFU per table cell; tokens/s/GPU = seq x GBS / step / GPUs, and
    # for the Llama 3.1 8B / 70B tables MFU = GBS x s (12 L h^2 (1 + G/H + s/h) + 18 L F h + 6 V h) / step / GPUs /
    # 989 TFLOP/s (the READMEs' "Notes" formula: non-causal attention, no recompute term).
    rows = [r for r in RUNS if r["family"] == "nvidia-dgxc-benchmarking"]
    assert len(rows) >= 100
    for r in rows:
        m, mod = r["measured"], r["model"]
        s = mod["seq"]
        tokens = r["global_batch"] * s / m["iteration_s"] / r["gpus"]
        assert tokens == pytest.approx(m["tokens_per_s_per_gpu"], rel=2e-3), r["id"]
        if mod["name"] in ("llama3.1-8b", "llama3.1-70b"):
            L, h, v, f = mod["layers"], mod["hidden"], mod["vocab"], mod["ffn"]
            attn = 12 * L * h * h * (1 + mod["kv_heads"] / mod["heads"] + s / h)
            per_sample = s * (attn + 18 * L * f * h + 6 * v * h)
            mfu = r["global_batch"] * per_sample / m["iteration_s"] / r["gpus"] / 989e12 * 100
            assert mfu == pytest.approx(m["mfu_pct"], abs=0.3), r["id"]


def test_fms_fsdp_batches_throughput_and_utilisation_agree():
    # fms-fsdp's README / the PyTorch FSDP blog: 2 sequences of 4096 per GPU, no accumulation ("1 million tokens per
    # batch for 128 GPUs"); the 7B A100 run "trained to 2.2T tokens ... on 128 A100 GPUs for a total of 162k GPU
    # hours, achieving an efficiency of 3700 tokens/sec/GPU"; HFU equals MFU without activation checkpointing and
    # exceeds it with recompute.
    rows = [r for r in RUNS if r["family"] == "fms-fsdp"]
    assert len(rows) == 12
    for r in rows:
        m = r["measured"]
        assert r["global_batch"] == 2 * r["gpus"] and r["model"]["seq"] == 4096, r["id"]
        if r["gpus"] == 128:
            assert r["global_batch"] * r["model"]["seq"] == 2**20, r["id"]
        assert (m["hfu_pct"] == m["mfu_pct"]) == (r["recompute"] == "none"), r["id"]
        assert m["hfu_pct"] >= m["mfu_pct"], r["id"]
    seven = next(r for r in rows if r["id"] == "fms-fsdp-a100-7b-g128-hsdp-noac")
    assert 2.2e12 / (162e3 * 3600) == pytest.approx(seven["measured"]["tokens_per_s_per_gpu"], rel=0.02)
