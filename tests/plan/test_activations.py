"""Issue 14, part 1: the planner's activation bytes equal what the runtime's modules save for backward.

The reference is a measurement (tests/plan/activation_measure.py: saved_tensors_hooks over a forward pass,
storages de-duplicated, parameters excluded) of the very model `launcher train` builds
(launcher.runtime.model.build_model, cast to the training dtype as DeepSpeed's bf16/fp16 engines do,
checkpointed as train.maybe_apply_activation_checkpointing does). Nothing expected here comes from the
planner: the planner's formulas (launcher/plan/activations.py) are held to within 2% of the measurement.
Per block = (measured at 3 blocks - measured at 1 block) / 2, so the block formula is held on its own and
not hidden behind the logits.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from launcher.plan import activations as act  # noqa: E402
from tests.plan.activation_measure import SelectiveCacheBytes, param_storages, saved_bytes  # noqa: E402

SEQ, MICRO = 256, 2
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ARCHS = {
    # hidden 128, 4 heads (d = 32); llama with grouped-query attention (2 KV heads) and a SwiGLU width.
    "llama": ["model.arch=llama", "model.num_key_value_heads=2", "model.intermediate_size=352"],
    "gpt": ["model.arch=gpt", "model.num_key_value_heads=null", "model.intermediate_size=null"],
    "bloom": ["model.arch=bloom", "model.num_key_value_heads=null", "model.intermediate_size=null"],
}
BASE = ["recipe=tiny", "model.hidden_size=128", "model.num_attention_heads=4", "model.vocab_size=256",
        f"data.seq_length={SEQ}", f"batch.micro_batch_size={MICRO}", "batch.global_batch_size=4"]


def activation_shape(cfg, layout) -> act.ActivationShape:
    from launcher.plan.inputs import model_shape

    s = model_shape(cfg.model)
    return act.ActivationShape(arch=s.arch, hidden_size=s.hidden_size, num_heads=s.num_heads,
                               num_kv_heads=s.num_kv_heads, intermediate_size=s.intermediate_size,
                               vocab_size=layout.padded_vocab_size)


def measure_model(compose, arch: str, dtype: str, layers: int, checkpointing: bool, checkpoint_blocks=None,
                  mode: str = "full"):
    from launcher.config.layout import resolve_layout
    from launcher.runtime.model import build_model

    cfg = compose(BASE + ARCHS[arch] + [f"precision={dtype}", f"model.num_hidden_layers={layers}",
                                        f"model.activation_checkpointing={str(checkpointing).lower()}"]
                  + ([f"model.checkpoint_blocks={checkpoint_blocks}"] if checkpoint_blocks else [])
                  + ([f"model.checkpoint_mode={mode}"] if checkpointing else []))
    layout = resolve_layout(cfg)
    model = build_model(cfg.model, seed=0, vocab_size=layout.padded_vocab_size).to(DTYPES[dtype])
    if checkpointing:
        from launcher.train import maybe_apply_activation_checkpointing

        maybe_apply_activation_checkpointing(cfg, model)
    model.train()
    held = {}
    if checkpointing and arch == "llama":
        # Under checkpointing the rotary cos/sin reach each block as keyword arguments, which torch's checkpoint
        # keeps in its closure (not through autograd, so the hook misses them): measured at their source.
        model.model.rotary_emb.register_forward_hook(
            lambda mod, args, out: held.update({o.untyped_storage().data_ptr(): o.untyped_storage().nbytes() for o in out}))
    ids = torch.randint(0, cfg.model.vocab_size, (MICRO, SEQ), generator=torch.Generator().manual_seed(0))
    params = param_storages(model)
    with SelectiveCacheBytes() as cache:   # selective: the outputs its policy keeps live in torch's own cache
        loss, measured = saved_bytes(lambda: model(input_ids=ids, labels=ids).loss, params, held)
    measured += cache.add(held, params)
    assert bool(cache.caches) == (checkpointing and mode == "selective")
    loss.backward()  # the graph is complete and runs
    return cfg, layout, measured


@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_saved_bytes_match_planner(compose, arch, dtype, checkpointing):
    cfg, layout, one = measure_model(compose, arch, dtype, 1, checkpointing)
    _, _, three = measure_model(compose, arch, dtype, 3, checkpointing)
    m = activation_shape(cfg, layout)
    recompute = "full" if checkpointing else "none"
    tokens = SEQ * MICRO
    measured_block = (three - one) / 2
    if checkpointing:
        planned_block = tokens * act.checkpointed_block_bytes_per_token(m, dtype)
    else:
        planned_block = tokens * act.block_bytes_per_token(m, SEQ, dtype)
    planned_total = act.stage_saved_bytes(m, 3, SEQ, MICRO, dtype, recompute)
    print(f"{arch} {dtype} {recompute}: block planned/measured {planned_block / measured_block:.4f}, "
          f"model {planned_total / three:.4f}")
    assert planned_block == pytest.approx(measured_block, rel=0.02)
    assert planned_total == pytest.approx(three, rel=0.02)


@pytest.mark.parametrize("checkpoint_blocks", [1, 2])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_first_blocks_checkpointed_match_planner(compose, arch, dtype, checkpoint_blocks):
    """model.checkpoint_blocks: the first N of 3 blocks checkpointed (train.checkpoint_first_blocks), the others
    keeping their whole saved set; held to the planner's stage total within 2%, and strictly between the two ends."""
    cfg, layout, partial = measure_model(compose, arch, dtype, 3, True, checkpoint_blocks)
    _, _, none = measure_model(compose, arch, dtype, 3, False)
    _, _, full = measure_model(compose, arch, dtype, 3, True)
    m = activation_shape(cfg, layout)
    planned = act.stage_saved_bytes(m, 3, SEQ, MICRO, dtype, "full", checkpointed=checkpoint_blocks)
    print(f"{arch} {dtype} first {checkpoint_blocks} of 3 checkpointed: planned/measured {planned / partial:.4f}")
    assert full < partial < none
    assert planned == pytest.approx(partial, rel=0.02)


@pytest.mark.parametrize("checkpoint_blocks", [None, 1])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_selective_checkpointing_matches_planner(compose, arch, dtype, checkpoint_blocks):
    """model.checkpoint_mode=selective (launcher/runtime/recompute.py): a checkpointed block keeps its input and its
    matmuls' and attention's outputs. Per block (3 blocks - 1 block) / 2 and the model's total (every block, or the
    first of 3) within 2% of the planner, and strictly between full checkpointing and none."""
    cfg, layout, three = measure_model(compose, arch, dtype, 3, True, checkpoint_blocks, mode="selective")
    _, _, none = measure_model(compose, arch, dtype, 3, False)
    _, _, full = measure_model(compose, arch, dtype, 3, True, checkpoint_blocks)
    m = activation_shape(cfg, layout)
    planned_total = act.stage_saved_bytes(m, 3, SEQ, MICRO, dtype, "selective", checkpointed=checkpoint_blocks)
    line = f"{arch} {dtype} selective, {checkpoint_blocks or 'every'} block(s): model planned/measured {planned_total / three:.4f}"
    if checkpoint_blocks is None:
        _, _, one = measure_model(compose, arch, dtype, 1, True, mode="selective")
        planned_block = SEQ * MICRO * act.checkpointed_block_bytes_per_token(m, dtype, 1, SEQ, "selective")
        line += f", block {planned_block / ((three - one) / 2):.4f}"
        assert planned_block == pytest.approx((three - one) / 2, rel=0.02)
    print(line)
    assert full < three < none
    assert planned_total == pytest.approx(three, rel=0.02)


# --- 2 CPU ranks: our TP layers as a pipeline's layer list and at pipeline_degree = 1, Ulysses SP -------------------
# (tests/plan/activation_worker.py)
RANK_CASES = [(mode, arch, dtype, ckpt)
              for mode, archs in (("pipe", ("llama", "bloom")), ("pipe-sp", ("llama",)), ("tp", ("llama", "bloom")),
                                  ("ulysses", ("llama",)))
              for arch in archs for dtype in ("bf16", "fp32") for ckpt in (False, True)]


# model.checkpoint_blocks on our TP layer list at one stage (build_tensor_parallel_model: StagePipelineModule clears
# DeepSpeed's per-layer checkpoint flags past the N-th block), 3 blocks.
PARTIAL_RANK_CASES = [("tp", "llama", "bf16", 1), ("tp", "bloom", "fp32", 2)]


def _case_name(mode, arch, dtype, ckpt, layers):
    return f"{mode}-{arch}-{dtype}-{'ckpt' if ckpt else 'none'}-L{layers}"


@pytest.fixture(scope="module")
def rank_measurements(tmp_path_factory):
    """One torchrun launch of 2 ranks measuring every RANK_CASES case at 1 and 3 blocks; {name: [rank0, rank1]}."""
    tmp = tmp_path_factory.mktemp("activations")
    cases = [{"name": _case_name(m, a, d, c, n), "mode": m, "arch": a, "dtype": d, "ckpt": c, "layers": n}
             for (m, a, d, c) in RANK_CASES for n in (1, 3)]
    cases += [{"name": f"{m}-{a}-{d}-first{k}-L3", "mode": m, "arch": a, "dtype": d, "ckpt": True, "layers": 3,
               "checkpoint_blocks": k} for (m, a, d, k) in PARTIAL_RANK_CASES]
    return measure_on_two_ranks(tmp, cases)


@pytest.mark.slow
@pytest.mark.parametrize("mode, arch, dtype, ckpt", RANK_CASES,
                         ids=[_case_name(*c, "")[:-2] for c in RANK_CASES])
def test_parallel_saved_bytes_match_planner(rank_measurements, mode, arch, dtype, ckpt):
    shapes = {"llama": act.ActivationShape("llama", 128, 4, 2, 352, 256),
              "bloom": act.ActivationShape("bloom", 128, 4, 4, 512, 256)}   # the worker's ARCH_OVERRIDES
    m = shapes[arch]
    tp = 2 if mode in ("pipe", "pipe-sp", "tp") else 1
    u = 2 if mode == "ulysses" else 1
    sp = mode == "pipe-sp"
    pipe = mode != "ulysses"   # our layer list (Layout.pipeline_layers): every TP mode, with or without stages
    recompute = "full" if ckpt else "none"
    one = rank_measurements[_case_name(mode, arch, dtype, ckpt, 1)]
    three = rank_measurements[_case_name(mode, arch, dtype, ckpt, 3)]
    assert one[0] == one[1] and three[0] == three[1]   # both TP / SP ranks hold the same
    measured_block = (three[0] - one[0]) / 2
    tokens = SEQ * MICRO / u
    if ckpt:
        planned_block = tokens * act.checkpointed_block_bytes_per_token(m, dtype, tp if sp else 1)
    else:
        planned_block = tokens * act.block_bytes_per_token(m, SEQ, dtype, tp, u, sp)
        if pipe:
            planned_block += act.rotary_bytes(m, SEQ, dtype)   # each pipeline block computes its own cos/sin
    planned_total = act.stage_saved_bytes(m, 3, SEQ, MICRO, dtype, recompute, tp, u, pipeline=pipe, sp=sp)
    print(f"{mode} {arch} {dtype} {recompute}: block planned/measured {planned_block / measured_block:.4f}, "
          f"stage {planned_total / three[0]:.4f}")
    assert planned_block == pytest.approx(measured_block, rel=0.02)
    assert planned_total == pytest.approx(three[0], rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("mode, arch, dtype, blocks", PARTIAL_RANK_CASES,
                         ids=[f"{m}-{a}-{d}-first{k}" for m, a, d, k in PARTIAL_RANK_CASES])
def test_parallel_first_blocks_checkpointed_match_planner(rank_measurements, mode, arch, dtype, blocks):
    shapes = {"llama": act.ActivationShape("llama", 128, 4, 2, 352, 256),
              "bloom": act.ActivationShape("bloom", 128, 4, 4, 512, 256)}   # the worker's ARCH_OVERRIDES
    got = rank_measurements[f"{mode}-{arch}-{dtype}-first{blocks}-L3"]
    none = rank_measurements[_case_name(mode, arch, dtype, False, 3)]
    full = rank_measurements[_case_name(mode, arch, dtype, True, 3)]
    assert got[0] == got[1] and full[0] < got[0] < none[0]
    planned = act.stage_saved_bytes(shapes[arch], 3, SEQ, MICRO, dtype, "full", 2, 1, pipeline=True, checkpointed=blocks)
    print(f"{mode} {arch} {dtype} first {blocks} of 3 checkpointed: planned/measured {planned / got[0]:.4f}")
    assert planned == pytest.approx(got[0], rel=0.02)


def test_plan_json_reports_activation_bytes_per_layer(compose):
    """`launcher plan --json` carries the per-block figure beside the totals: llama2-70b checkpoints every block,
    so a block keeps its bf16 input: s x b x h x 2 bytes (4096 x 1 x 8192 x 2 = 64 MiB)."""
    from launcher.config.layout import resolve_layout
    from launcher.plan.report import plan_summary

    cfg = compose(["recipe=llama2-70b"])
    layout = resolve_layout(cfg)
    s = plan_summary(cfg, layout)
    assert cfg.model.activation_checkpointing and layout.dtype == "bf16"
    assert s["activation_bytes_per_layer"] == layout.seq_length * layout.micro_batch_size * cfg.model.hidden_size * 2
    assert s["memory_per_gpu_bytes"]["activations"] > s["activation_bytes_per_layer"]


def measure_on_two_ranks(tmp, cases: list[dict]) -> dict:
    """Run activation_worker.py's `cases` in one 2-rank torchrun launch; {case name: [rank 0 record, rank 1 record]}."""
    import json
    import os
    import subprocess

    from tests.conftest import REPO, venv_bin

    (tmp / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([venv_bin("torchrun"), "--standalone", "--nproc_per_node", "2",
                           str(REPO / "tests/plan/activation_worker.py"), str(tmp), str(tmp / "cases.json")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]
    return {name: [ranks[0][name], ranks[1][name]] for name in ranks[0]}
