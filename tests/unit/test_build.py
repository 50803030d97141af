"""The launcher's seeded init (launcher/runtime/build.py): every layout's part equals the same cut of the whole model.

One process, no torch.distributed: pipeline stages and TP shards are built with the runtime's own
LayerSpecs (launcher/parallel/pipeline.py layer_specs, materialised when built) and compared with
`torch.equal` against the whole model build_model returns; the distributions are checked against
transformers' _init_weights rules (N(0, 0.02) for linears and embeddings, ones for norms, zero biases).
The multi-rank equivalence tests (tests/train, tests/parallel) hold the trained losses to 1 rank.
"""

from __future__ import annotations

import pytest
import torch

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout

LLAMA = ["model=tiny", "model.hidden_size=64", "model.num_attention_heads=4", "model.num_key_value_heads=2",
         "model.num_hidden_layers=3", "model.intermediate_size=160", "model.vocab_size=600", "cluster=cpu"]
BLOOM = LLAMA + ["model.arch=bloom", "model.num_key_value_heads=null", "model.intermediate_size=null",
                 "model.tie_word_embeddings=true"]


def _whole(overrides, seed=7):
    from launcher.runtime.model import build_model

    cfg = compose(overrides)
    return cfg, build_model(cfg.model, seed, vocab_size=resolve_layout(cfg).padded_vocab_size)


def test_same_seed_same_weights_other_seed_other_weights():
    _, a = _whole(LLAMA)
    _, b = _whole(LLAMA)
    _, c = _whole(LLAMA, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.self_attn.q_proj.weight"], sc["model.layers.0.self_attn.q_proj.weight"])


@pytest.mark.parametrize("overrides", [LLAMA, BLOOM], ids=["llama", "bloom"])
def test_distributions_follow_transformers_init_weights(overrides):
    cfg, m = _whole(overrides)
    for name, p in m.named_parameters():
        if name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        elif "norm" in name or "ln_" in name:
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            # initializer_range 0.02 (transformers' default for both configs); thousands of draws per tensor.
            assert abs(p.std().item() - 0.02) < 0.002 and abs(p.mean().item()) < 0.002, name
    # Tied BLOOM: the head is the embedding tensor itself.
    if cfg.model.tie_word_embeddings:
        assert m.lm_head.weight is m.transformer.word_embeddings.weight
    else:
        assert not torch.equal(m.lm_head.weight, m.model.embed_tokens.weight)


def test_rotary_buffers_are_the_real_ones():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    _, m = _whole(LLAMA)
    assert torch.equal(m.model.rotary_emb.inv_freq, LlamaRotaryEmbedding(m.config).inv_freq)


@pytest.mark.parametrize("rows,cols", [((0, 600), (0, 64)), ((100, 517), (0, 64)), ((0, 600), (7, 50)), ((255, 257), (3, 4))])
def test_any_window_equals_the_same_cut_of_the_whole_tensor(rows, cols):
    from launcher.runtime.build import SeededInit, init_rules

    _, m = _whole(LLAMA)
    init = SeededInit(7, init_rules(m))
    full = m.model.embed_tokens.weight.detach()   # 600 rows: 256-row blocks, the last one short
    out = torch.empty(rows[1] - rows[0], cols[1] - cols[0])
    init.fill_(out, "model.embed_tokens.weight", rows=rows, cols=cols)
    assert torch.equal(out, full[rows[0]:rows[1], cols[0]:cols[1]])


@pytest.mark.parametrize("start,stop", [(0, 9600), (9600, 19200), (16383, 16447), (38390, 38400)])
def test_zero3_flat_partition_equals_the_flat_cut(start, stop):
    from launcher.runtime.build import SeededInit, init_rules

    _, m = _whole(LLAMA)
    init = SeededInit(7, init_rules(m))
    out = torch.empty(stop - start + 5)   # a ZeRO-3 partition is padded: only the first stop - start are written
    init.fill_(out, "model.embed_tokens.weight", flat=(start, stop))
    assert torch.equal(out[:stop - start], m.model.embed_tokens.weight.detach().reshape(-1)[start:stop])


@pytest.mark.parametrize("overrides,tp", [(LLAMA, 1), (LLAMA, 2), (BLOOM, 2), (BLOOM, 4)],
                         ids=["llama-tp1", "llama-tp2", "bloom-tp2", "bloom-tp4"])
def test_pipeline_layers_and_tp_shards_equal_the_whole_model(overrides, tp):
    """Every layer, as the runtime builds it on a stage (meta, then materialised with the seeded init), holds
    exactly its TP rank's rows (column-parallel) or columns (row-parallel) of the whole model's tensor."""
    from launcher.parallel.pipeline import ARCH_MODULES, layer_hf_prefixes, layer_specs
    from launcher.parallel.tensor import TensorParallel
    from launcher.runtime.build import SeededInit, init_rules, meta_model
    from launcher.runtime.model import attn_implementation

    cfg, whole = _whole(overrides)
    whole_sd = dict(whole.named_parameters())
    arch, tie = cfg.model.arch, cfg.model.tie_word_embeddings
    vocab = resolve_layout(cfg).padded_vocab_size
    prefixes = layer_hf_prefixes(arch, cfg.model.num_hidden_layers)
    checked = 0
    for rank in range(tp):
        full = meta_model(cfg.model, vocab)
        init = SeededInit(7, init_rules(full))
        specs = layer_specs(full, arch, attn_implementation(arch), tie, TensorParallel(None, rank, tp) if tp > 1 else None, init)
        for spec, prefix in zip(specs, prefixes):
            module = spec.build()
            for local, p in module.named_parameters():
                assert not p.is_meta
                head, _, rest = local.partition(".")
                base = ARCH_MODULES[arch].embed if (tie and prefix == "lm_head") else prefix
                name = f"{base}.{rest}" if head in ("layer", "norm") else f"{base}.{local}"
                want = whole_sd[name].detach()
                shard = getattr(p, "tp_shard", None)
                if shard is not None:
                    dim, r, size = shard
                    assert (r, size) == (rank, tp)
                    n = want.shape[dim] // size
                    want = want.narrow(dim, r * n, n)
                assert torch.equal(p.detach(), want), name
                checked += 1
    assert checked > 20


@pytest.mark.parametrize("tp", [1, 2])
def test_init_from_reads_only_this_ranks_slices_and_files(tp, tmp_path):
    """model.init_from through the pipeline's specs: every layer's TP shard equals the same cut of the saved model,
    and a stage opens only the shard files that hold its tensors (the index's weight_map)."""
    import json

    from launcher.parallel.pipeline import layer_specs
    from launcher.parallel.tensor import TensorParallel
    from launcher.runtime.build import CheckpointSlices, meta_model
    from launcher.runtime.model import attn_implementation

    cfg, whole = _whole(LLAMA)
    whole.save_pretrained(tmp_path, max_shard_size="100KB")   # several shards + model.safetensors.index.json
    weight_map = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) > 3
    saved = {k: v.detach() for k, v in whole.named_parameters()}
    vocab = resolve_layout(cfg).padded_vocab_size
    for rank in range(tp):
        full = meta_model(cfg.model, vocab)
        source = CheckpointSlices(tmp_path)
        specs = layer_specs(full, "llama", attn_implementation("llama"), False, TensorParallel(None, rank, tp) if tp > 1 else None,
                            source)
        block1 = specs[2].build()   # pipeline layer 2 = model.layers.1: a stage holding only that block
        assert source.opened == {weight_map[k] for k in weight_map if k.startswith("model.layers.1.")}
        assert source.opened < set(weight_map.values())
        for local, p in block1.named_parameters():
            want = saved["model.layers.1." + local.partition(".")[2]]
            if getattr(p, "tp_shard", None):
                dim, r, size = p.tp_shard
                n = want.shape[dim] // size
                want = want.narrow(dim, r * n, n)
            assert torch.equal(p.detach(), want), local


def test_init_from_zero3_flat_partitions(tmp_path):
    """The ZeRO-3 path reads flat ranges (a rank's partition of each tensor) from the checkpoint."""
    from launcher.runtime.build import CheckpointSlices

    _, whole = _whole(LLAMA)
    whole.save_pretrained(tmp_path, max_shard_size="100KB")
    source = CheckpointSlices(tmp_path)
    for name, p in whole.named_parameters():
        flat = p.detach().reshape(-1)
        n = -(-flat.numel() // 4)   # 4 DP ranks, the last partition padded
        for r in range(4):
            start, stop = r * n, min((r + 1) * n, flat.numel())
            out = torch.zeros(n)
            source.fill_(out, name, flat=(start, stop))
            assert torch.equal(out[:stop - start], flat[start:stop]), (name, r)


@pytest.mark.parametrize("overrides", [LLAMA, BLOOM], ids=["llama", "bloom"])
def test_init_from_whole_model_reads_tensor_by_tensor(overrides, tmp_path):
    """The whole-model layouts (ZeRO 0-2 data parallelism, Ulysses, CP without TP): model.init_from fills the model built
    on meta tensor by tensor from the safetensors files (no from_pretrained state dict beside it), equal to the saved
    model; a bf16 checkpoint arrives in the launcher's fp32 build like every other layout's (from_pretrained would
    keep bf16 parameters under precision=fp32)."""
    from launcher.runtime.model import build_model

    cfg, whole = _whole(overrides)
    saved = {k: v.detach().clone() for k, v in whole.named_parameters()}
    whole.save_pretrained(tmp_path / "fp32", max_shard_size="100KB")
    whole.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    vocab = resolve_layout(cfg).padded_vocab_size
    for sub, want in (("fp32", saved), ("bf16", {k: v.to(torch.bfloat16).float() for k, v in saved.items()})):
        loaded = build_model(compose(overrides + [f"model.init_from={tmp_path / sub}"]).model, seed=99, vocab_size=vocab)
        got = dict(loaded.named_parameters())
        assert set(got) == set(want)
        for k, v in want.items():
            assert got[k].dtype == torch.float32 and torch.equal(got[k].detach(), v), (sub, k)
        if cfg.model.tie_word_embeddings:
            assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
