"""Data pipeline: determinism, disjoint DP slices, caching, the other sources, and each bad input (no processes)."""

import json
import re
from dataclasses import replace

import numpy as np
import pytest
from tokenizers import Tokenizer

from launcher.config.compose import compose
from launcher.config.errors import ConfigError
from launcher.config.layout import resolve_layout
from launcher.runtime.data import EOS_TOKEN, TokenBatches, index_path, prepare_data, train_tokenizer

from train_helpers import base_overrides, launcher


def _cfg(cache_dir, *extra):
    cfg = compose(base_overrides(cache_dir) + list(extra))
    return cfg, resolve_layout(cfg)


def test_stdlib_tokens_decode_back_to_the_corpus(cache_dir):
    cfg, layout = _cfg(cache_dir)
    prepared = prepare_data(cfg, layout)
    tok = Tokenizer.from_file(prepared.tokenizer_path)
    assert tok.get_vocab_size() == cfg.model.vocab_size
    tokens = np.memmap(prepared.bin_path, dtype=prepared.dtype, mode="r")
    assert prepared.dtype == "uint16" and len(tokens) == prepared.num_tokens
    assert int(tokens.max()) < cfg.model.vocab_size
    # The first document is the first .py file in path order; byte-level BPE round-trips it exactly.
    first_doc_end = int(np.argmax(tokens == prepared.eos_id))
    import sysconfig
    from pathlib import Path
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    first = sorted((f.relative_to(stdlib).as_posix(), f) for f in stdlib.rglob("*.py")
                   if "site-packages" not in f.relative_to(stdlib).parts and f.read_bytes().strip())[0][1]
    assert tok.decode(tokens[:first_doc_end].tolist()) == first.read_bytes().decode("utf-8", errors="replace")
    # Cached: a second call reuses the same files.
    mtime = index_path(Path(prepared.bin_path)).stat().st_mtime_ns
    assert prepare_data(cfg, layout) == prepared
    assert index_path(Path(prepared.bin_path)).stat().st_mtime_ns == mtime


def test_dp_slices_disjoint_deterministic_and_layout_independent(cache_dir):
    cfg, layout = _cfg(cache_dir)
    prepared = prepare_data(cfg, layout)
    gbs = 8
    two_ranks = replace(layout, data_degree=2, micro_batch_size=2, grad_accum_steps=2, global_batch_size=gbs)
    one_rank = replace(layout, data_degree=1, micro_batch_size=8, grad_accum_steps=1, global_batch_size=gbs)
    ranks = [TokenBatches(prepared, two_ranks, seed=7, dp_rank=r) for r in range(2)]
    single = TokenBatches(prepared, one_rank, seed=7, dp_rank=0)
    steps_per_epoch = prepared.train_samples // gbs
    seen = []
    for step in range(steps_per_epoch):
        per_rank = [sum((b.train_sample_ids(step, m) for m in range(2)), []) for b in ranks]
        assert not set(per_rank[0]) & set(per_rank[1]), f"ranks overlap at step {step}"
        assert set(per_rank[0]) | set(per_rank[1]) == set(single.train_sample_ids(step, 0))
        seen += per_rank[0] + per_rank[1]
    # Within one epoch no sample repeats, all are in the training split.
    assert len(seen) == len(set(seen)) and max(seen) < prepared.train_samples
    # Deterministic: a fresh reader (as after a resume) gives the same ids; another seed does not.
    again = TokenBatches(prepared, two_ranks, seed=7, dp_rank=1)
    assert [again.train_sample_ids(s, 1) for s in (0, 5, 3)] == [ranks[1].train_sample_ids(s, 1) for s in (0, 5, 3)]
    other = TokenBatches(prepared, two_ranks, seed=8, dp_rank=1)
    assert other.train_sample_ids(0, 0) != ranks[1].train_sample_ids(0, 0)
    # Held-out samples are outside the training range and disjoint across ranks.
    val = [set(b.val_sample_ids(0)) for b in ranks]
    assert min(min(v) for v in val) >= prepared.train_samples and not val[0] & val[1]
    x = ranks[0].batch(ranks[0].train_sample_ids(0, 0))
    assert tuple(x.shape) == (2, 32)


def test_hf_jsonl_and_tokens_sources(cache_dir, tmp_path):
    rows = [{"text": f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 20, "id": i} for i in range(300)]
    path = tmp_path / "code.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg, layout = _cfg(cache_dir, "data=hf", f"data.paths=[{path}]", "data.max_bytes=null")
    prepared = prepare_data(cfg, layout)
    assert prepared.source == "hf" and prepared.train_samples >= 8
    cfg2, layout2 = _cfg(cache_dir, "data=tokens", f"data.tokens_path={prepared.bin_path}")
    again = prepare_data(cfg2, layout2)
    assert (again.num_tokens, again.train_samples, again.eos_id) == (prepared.num_tokens, prepared.train_samples, prepared.eos_id)


def _error(cache_dir, *extra) -> ConfigError:
    cfg, layout = _cfg(cache_dir, *extra)
    with pytest.raises(ConfigError) as info:
        prepare_data(cfg, layout)
    return info.value


def test_empty_corpus(cache_dir, tmp_path):
    (tmp_path / "empty.py").write_text("   \n")
    err = _error(cache_dir, f"data.paths=[{tmp_path}]")
    assert err.key == "data.paths" and "empty" in err.rule


def test_fewer_tokens_than_one_global_batch_says_how_many(cache_dir, tmp_path):
    # Varied enough for a 320-token BPE, but far fewer tokens than a 64 x 32 global batch.
    (tmp_path / "small.py").write_text("".join(f"value_{i} = compute({i}, name='item{i}')\n" for i in range(60)))
    err = _error(cache_dir, f"data.paths=[{tmp_path}]", "data.max_bytes=null", "batch.global_batch_size=64", "batch.micro_batch_size=32")
    # 64 sequences of 32 tokens plus the held-out samples: at least 64 x 32 = 2048 tokens.
    needed = int(re.search(r"= ([\d,]+) tokens$", err.rule).group(1).replace(",", ""))
    assert needed >= 64 * 32 and "global batch" in err.rule


def test_missing_text_field_lists_the_columns(cache_dir, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"content": "x" * 100, "meta": i}) + "\n" for i in range(10)))
    err = _error(cache_dir, "data=hf", f"data.paths=[{path}]")
    assert err.key == "data.text_field" and "content" in err.rule and "meta" in err.rule


def test_tokenizer_vocab_mismatch(cache_dir, tmp_path):
    tok = train_tokenizer([("a", "def add(a, b):\n    return a + b\n" * 50)], vocab_size=300)
    path = tmp_path / "tok.json"
    path.write_text(tok.to_str())
    n = tok.get_vocab_size()
    err = _error(cache_dir, f"data.tokenizer_path={path}")
    assert err.key == "data.tokenizer_path" and str(n) in err.rule and "320" in err.rule
    assert tok.token_to_id(EOS_TOKEN) == 0


def test_tokens_vocab_mismatch(cache_dir):
    cfg, layout = _cfg(cache_dir)
    prepared = prepare_data(cfg, layout)
    err = _error(cache_dir, "data=tokens", f"data.tokens_path={prepared.bin_path}", "model.vocab_size=512")
    assert err.key == "data.tokens_path" and "320" in err.rule and "512" in err.rule


def test_cli_refuses_bad_data_before_starting_ranks(cache_dir, tmp_path):
    runs = tmp_path / "runs"
    result = launcher(["train", *base_overrides(cache_dir), f"data.paths=[{tmp_path}]", f"runs_dir={runs}"], timeout=120)
    assert result.returncode == 2, result.stderr
    assert "data.paths" in result.stderr and "empty" in result.stderr
    assert not runs.exists()  # nothing was created, no rank started
