"""The reduce bucket the plan charges is the one the DeepSpeed config asks for (launcher/plan/memory.py
reduce_bucket_for, which both call): 5e8 elements, raised under ZeRO 3 with the sequence split to the largest
parameter (launcher/deepspeed_config.py zero3_sequence_parallel_reduction). The largest parameter the plan reads
from the model's shape equals the real transformers model's largest tensor."""
from __future__ import annotations

import pytest

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.deepspeed_config import build_deepspeed_config
from launcher.plan import memory
from launcher.plan.inputs import model_shape, resolve_hardware, strategy

MODELS = ["tiny", "llama3.1-8b", "llama3.1-405b", "gpt3-175b", "bloom-176b", "qwen2.5-7b", "mistral-7b"]
VARIANTS = [["model=tiny", "model.tie_word_embeddings=true"],
            ["model=tiny", "model.arch=gpt", "model.intermediate_size=null"],
            ["model=tiny", "model.vocab_size=8"]]          # a vocabulary tensor smaller than an MLP's


@pytest.mark.parametrize("overrides", [[f"model={m}"] for m in MODELS] + VARIANTS, ids=lambda o: " ".join(o))
def test_largest_param_is_the_models_largest_tensor(overrides):
    from launcher.runtime.model import build_model

    shape = model_shape(compose(overrides).model)
    for extra in (0, 128):                           # the config's vocabulary, and one padded further (TP)
        vocab = shape.vocab_size + extra
        model = build_model(compose([*overrides, f"model.vocab_size={vocab}"]).model, seed=0, device="meta")
        assert max(shape.largest_param_but_vocab, vocab * shape.hidden_size) == max(p.numel() for p in model.parameters())


# llama3.1-8b's embedding and head are 128,256 x 4,096 = 525,336,576 elements, above the 5e8 bucket.
LAYOUTS = {
    "ZeRO 3, Ulysses 2: raised": (["parallel.zero_stage=3", "parallel.sequence_degree=2"], 128_256 * 4_096),
    "ZeRO 3, CP 2: raised": (["parallel.zero_stage=3", "parallel.context_degree=2"], 128_256 * 4_096),
    "ZeRO 3 alone: not": (["parallel.zero_stage=3"], 500_000_000),
    "ZeRO 1, Ulysses 2: not": (["parallel.zero_stage=1", "parallel.sequence_degree=2"], 500_000_000),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_plan_charges_the_bucket_deepspeed_is_given(name):
    overrides, elements = LAYOUTS[name]
    cfg = compose(["model=llama3.1-8b", "cluster=h100-80gb", "cluster.nodes=1", "precision=bf16",
                   "batch.micro_batch_size=1", "batch.global_batch_size=64", "data.seq_length=4096", *overrides])
    layout = resolve_layout(cfg)
    assert build_deepspeed_config(cfg, layout)["zero_optimization"]["reduce_bucket_size"] == elements
    shape, st = model_shape(cfg.model), strategy(cfg, layout)
    hw = resolve_hardware(cfg.cluster, cfg.precision.dtype)
    how = memory.explain_stage_memory(shape, st, hw, 0)["overhead"]
    copies = 1 if st.zero_stage == 3 else 2          # ZeRO 1/2 double-buffer under overlap_comm (GPUs)
    assert f"reduce bucket{' x 2' if copies == 2 else ''}" in how and f"{elements:,} elements x 2 B" in how, how
    # ZeRO 3's whole tensors at the peak: their own rule, held by tests/plan/test_zero3_gathered.py
    gathered = memory.zero3_gathered(shape, st).total * 2 if st.zero_stage == 3 else 0
    assert memory.estimate_memory(shape, st, hw).peak.overhead == pytest.approx(
        memory.FRAMEWORK_OVERHEAD_BYTES + copies * elements * 2 + gathered, rel=1e-12)
