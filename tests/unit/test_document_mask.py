"""data.document_mask (launcher/runtime/documents.py): a packed window computes what its documents compute alone.

The reference is each document run through the same model on its own (positions from 0, plain causal
attention): nothing expected here comes from the code under test. The checks that the fixture can see
the two halves of the feature: without the position reset (GPT-2's learned absolute positions) or without the
within-document mask (both archs), the packed logits differ from the reference by far more than the tolerance.
RoPE (llama) depends only on relative positions, so there the mask alone already gives the same logits up to
rounding; GPT-2 is what makes the position reset visible.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from launcher.config.errors import ConfigError  # noqa: E402
from launcher.runtime.documents import document_position_ids  # noqa: E402

EOS = 0
SMALL = ["recipe=tiny", "precision=fp32", "model.hidden_size=64", "model.num_attention_heads=4",
         "model.num_hidden_layers=2", "model.vocab_size=96", "model.max_position_embeddings=64"]
ARCHS = {
    "llama": ["model.arch=llama", "model.num_key_value_heads=2", "model.intermediate_size=128"],
    "qwen2": ["model.arch=qwen2", "model.num_key_value_heads=2", "model.intermediate_size=128"],
    "gpt": ["model.arch=gpt", "model.num_key_value_heads=null", "model.intermediate_size=null"],
}


def packed_window() -> torch.Tensor:
    """Two windows of 24 tokens, EOS = 0. Row 0: the tail of a document (5 tokens + EOS), a whole one
    (6 + EOS), a one-token document (its EOS alone), the head of another (10 tokens, no EOS). Row 1: one
    document, no EOS, then an EOS as the last token."""
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(1, 96, (2, 24), generator=g)
    rows[0, [5, 12, 13]] = EOS
    rows[1, 23] = EOS
    return rows


def test_position_ids_restart_after_each_eos():
    got = document_position_ids(packed_window(), EOS)
    row0 = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 0] + list(range(10))
    assert got.tolist() == [row0, list(range(24))]
    assert got.dtype == torch.int64


def documents(row: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each document of a window: a new one begins after every EOS (written out, not from the code)."""
    bounds, start = [], 0
    for i, t in enumerate(row.tolist()):
        if t == EOS:
            bounds.append((start, i + 1))
            start = i + 1
    if start < len(row):
        bounds.append((start, len(row)))
    return bounds


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_packed_logits_equal_each_document_alone(compose, arch):
    from launcher.config.layout import resolve_layout
    from launcher.runtime.model import build_model

    cfg = compose(SMALL + ARCHS[arch] + ["data.document_mask=true", "data.seq_length=24"])
    model = build_model(cfg.model, seed=0, vocab_size=resolve_layout(cfg).padded_vocab_size).eval()
    ids = packed_window()
    from torch._dynamo.utils import counters

    counters.clear()
    with torch.no_grad():
        # What micro_loss in launcher/train.py passes when data.document_mask is on.
        packed = model(input_ids=ids, position_ids=document_position_ids(ids, EOS)).logits
    assert not counters["frames"], "building the mask went through torch.compile (a CPU run must compile nothing)"
    with torch.no_grad():
        alone = torch.empty_like(packed)
        for b in range(ids.shape[0]):
            for s, e in documents(ids[b]):
                alone[b, s:e] = model(input_ids=ids[b:b + 1, s:e]).logits[0]
        # The two halves of the feature, each removed: it must show.
        s = ids.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool).tril()[None, None].expand(2, 1, s, s)
        same_doc = torch.zeros(2, 1, s, s, dtype=torch.bool)
        for b in range(2):
            for a, e in documents(ids[b]):
                same_doc[b, 0, a:e, a:e] = True
        no_mask = model(input_ids=ids, position_ids=document_position_ids(ids, EOS), attention_mask=causal).logits
        no_reset = model(input_ids=ids, position_ids=torch.arange(s).expand(2, s), attention_mask=causal & same_doc).logits
        neither = model(input_ids=ids).logits
    assert (packed - alone).abs().max().item() < 1e-5
    assert (no_mask - alone).abs().max().item() > 1e-3
    assert (neither - alone).abs().max().item() > 1e-3
    if arch == "gpt":  # learned absolute positions: the reset matters on its own
        assert (no_reset - alone).abs().max().item() > 1e-3
    else:  # RoPE: relative positions only
        assert (no_reset - alone).abs().max().item() < 1e-4


def test_token_file_without_eos_id_is_refused(compose, tmp_path):
    """A flat token file names no EOS: the document mask cannot find boundaries, refused before start."""
    from launcher.config.layout import resolve_layout
    from launcher.runtime.data import prepare_data

    flat = tmp_path / "train.bin"
    np.arange(20000, dtype=np.uint16).__mod__(200).astype(np.uint16).tofile(flat)
    base = ["recipe=tiny", "data=tokens", f"data.tokens_path={flat}", "data.token_dtype=uint16",
            f"data.cache_dir={tmp_path / 'cache'}", "model.vocab_size=256"]
    cfg = compose(base + ["data.document_mask=true"])
    with pytest.raises(ConfigError) as err:
        prepare_data(cfg, resolve_layout(cfg))
    assert err.value.key == "data.document_mask" and "flat token file carries no EOS id" in str(err.value)
    # The same file without the mask opens (the refusal is the mask's, not the file's).
    cfg = compose(base)
    assert prepare_data(cfg, resolve_layout(cfg)).eos_id == -1
