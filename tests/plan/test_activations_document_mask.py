"""data.document_mask in the planner's activation bytes (launcher/plan/activations.py, DOCUMENT MASK) held to a
measurement of the model `launcher train` builds, run as its loop runs it with the mask on (position ids from
launcher.runtime.documents, transformers building the mask). Same method as tests/plan/test_activations.py:
saved_tensors_hooks over one forward, storages counted once, parameters excluded; per block = (3 blocks - 1 block)
/ 2. Under checkpointing the mask and the rotary cos/sin reach the blocks as keyword arguments that torch's
checkpoint keeps in its closure (the hook misses them): measured where they enter the first block.
Tensor parallelism (tensor_degree 2 at pipeline_degree 1: our TP layers, launcher/parallel/tensor_model.py) would be
measured on 2 CPU ranks by tests/plan/activation_worker.py; skipped where those layers do not take the position ids.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from launcher.plan import activations as act  # noqa: E402
from launcher.runtime.documents import document_position_ids  # noqa: E402
from tests.plan.activation_measure import param_storages, saved_bytes  # noqa: E402
from tests.plan.test_activations import (ARCHS, BASE, DTYPES, MICRO, SEQ, activation_shape,  # noqa: E402
                                         measure_on_two_ranks)

EOS = 0


def measure(compose, arch: str, dtype: str, layers: int, checkpointing: bool, document_mask: bool):
    from launcher.config.layout import resolve_layout
    from launcher.runtime.model import build_model

    cfg = compose(BASE + ARCHS[arch] + [f"precision={dtype}", f"model.num_hidden_layers={layers}",
                                        f"model.activation_checkpointing={str(checkpointing).lower()}",
                                        f"data.document_mask={str(document_mask).lower()}"])
    layout = resolve_layout(cfg)
    model = build_model(cfg.model, seed=0, vocab_size=layout.padded_vocab_size).to(DTYPES[dtype])
    if checkpointing:
        from launcher.train import maybe_apply_activation_checkpointing

        maybe_apply_activation_checkpointing(cfg, model)
    model.train()
    held = {}

    def keep(mod, args, kwargs):
        for name in ("attention_mask", "position_embeddings"):
            value = kwargs.get(name)
            for t in value if isinstance(value, tuple) else (value,):
                if isinstance(t, torch.Tensor):
                    held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

    if checkpointing:
        blocks = model.model.layers if arch == "llama" else model.transformer.h
        blocks[0].register_forward_pre_hook(keep, with_kwargs=True)
    ids = torch.randint(1, cfg.model.vocab_size, (MICRO, SEQ), generator=torch.Generator().manual_seed(0))
    ids[0, [30, 100, 101, 200]] = EOS  # documents of 31, 70, 1, 99 and 56 tokens; row 1 splits elsewhere
    ids[1, [10, 150]] = EOS
    kwargs = {"position_ids": document_position_ids(ids, EOS)} if document_mask else {}
    loss, measured = saved_bytes(lambda: model(input_ids=ids, labels=ids, **kwargs).loss, param_storages(model), held)
    loss.backward()
    return cfg, layout, measured


@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_document_mask_saved_bytes_match_planner(compose, arch, dtype, checkpointing):
    cfg, layout, one = measure(compose, arch, dtype, 1, checkpointing, True)
    _, _, three = measure(compose, arch, dtype, 3, checkpointing, True)
    m = activation_shape(cfg, layout)
    recompute = "full" if checkpointing else "none"
    measured_block = (three - one) / 2
    if checkpointing:
        planned_block = SEQ * MICRO * act.checkpointed_block_bytes_per_token(m, dtype)
    else:
        planned_block = SEQ * MICRO * act.block_bytes_per_token(m, SEQ, dtype, document_mask=True)
    planned = act.stage_saved_bytes(m, 3, SEQ, MICRO, dtype, recompute, document_mask=True)
    print(f"{arch} {dtype} {recompute}: block planned/measured {planned_block / measured_block:.4f}, "
          f"model {planned / three:.4f}")
    assert planned_block == pytest.approx(measured_block, rel=0.02)
    assert planned == pytest.approx(three, rel=0.02)
    # What the mask adds is counted exactly, not hidden in the 2%: the same model without the mask, both ways.
    _, _, plain = measure(compose, arch, dtype, 3, checkpointing, False)
    added = planned - act.stage_saved_bytes(m, 3, SEQ, MICRO, dtype, recompute)
    assert added == three - plain, (added, three - plain)
    assert added > 0


def test_plan_reports_the_mask(compose):
    """`launcher plan`'s activation figure grows by the mask's terms when data.document_mask is on."""
    from launcher.config.layout import resolve_layout
    from launcher.plan.report import plan_summary

    def per_layer(extra):
        cfg = compose(["recipe=tiny", *extra])
        return plan_summary(cfg, resolve_layout(cfg))["activation_bytes_per_layer"]

    cfg = compose(["recipe=tiny"])
    s, b, w = cfg.data.seq_length, cfg.batch.micro_batch_size, 4  # tiny: fp32, MHA (no k/v repeat)
    assert per_layer(["data.document_mask=true"]) - per_layer([]) == b * s * s * w


@pytest.fixture(scope="module")
def tp_measurements(tmp_path_factory):
    """One torchrun launch of 2 ranks: our TP llama at pipeline_degree 1 with the document mask, {name: [rank0, rank1]}."""
    tmp = tmp_path_factory.mktemp("activations-docmask")
    cases = [{"name": f"{dtype}-{ckpt}-L{n}-{mask}", "mode": "tp", "arch": "llama", "dtype": dtype, "ckpt": ckpt,
              "layers": n, "document_mask": mask}
             for dtype in ("bf16", "fp32") for ckpt in (False, True) for n in (1, 3) for mask in (True, False) if n == 3 or mask]
    return measure_on_two_ranks(tmp, cases)


# Until issue 11, TP at pipeline_degree 1 was DeepSpeed AutoTP on the transformers model, which this measured. Our TP
# layers run it now; where they do not take position ids yet (TensorParallelCausalLM raises NotImplementedError, the
# worker reports it) the case is skipped, not planned against. Checked against the runtime side of issue 11 (branch
# tpall, which adds them) in a trial merge: all four cases planned/measured 1.0000, the checkpointed mask term exact.
@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_tp_document_mask_saved_bytes_match_planner(tp_measurements, dtype, checkpointing):
    m = act.ActivationShape("llama", 128, 4, 2, 352, 256)  # the worker's llama overrides
    one = tp_measurements[f"{dtype}-{checkpointing}-L1-True"]
    three = tp_measurements[f"{dtype}-{checkpointing}-L3-True"]
    plain = tp_measurements[f"{dtype}-{checkpointing}-L3-False"]
    if isinstance(one[0], dict):
        pytest.skip(f"our TP layers refuse position ids at this commit (data.document_mask x TP): {one[0]['error']}")
    assert one[0] == one[1] and three[0] == three[1]
    recompute = "full" if checkpointing else "none"
    measured_block = (three[0] - one[0]) / 2
    if checkpointing:
        planned_block = SEQ * MICRO * act.checkpointed_block_bytes_per_token(m, dtype)
    else:
        planned_block = SEQ * MICRO * act.block_bytes_per_token(m, SEQ, dtype, 2, document_mask=True)
        planned_block += act.rotary_bytes(m, SEQ, dtype, samples=MICRO)   # each of our blocks computes its cos/sin
    planned = act.stage_saved_bytes(m, 3, SEQ, MICRO, dtype, recompute, 2, pipeline=True, document_mask=True)
    added = planned - act.stage_saved_bytes(m, 3, SEQ, MICRO, dtype, recompute, 2, pipeline=True)
    print(f"tp {dtype} {recompute}: block planned/measured {planned_block / measured_block:.4f}, "
          f"model {planned / three[0]:.4f}, added planned {added} measured {three[0] - plain[0]}")
    assert added == three[0] - plain[0]
    assert planned_block == pytest.approx(measured_block, rel=0.02)
    assert planned == pytest.approx(three[0], rel=0.02)
