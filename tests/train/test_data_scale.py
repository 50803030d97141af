"""Data at scale (no training processes): warm starts that read no raw data, O(1)-memory sample order, Megatron and
flat token files read token for token, weighted blends, held-out documents, parallel pretokenization."""

import json
import os
import struct
import sys
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from launcher.config.compose import compose
from launcher.config.errors import ConfigError
from launcher.config.layout import resolve_layout
from launcher.runtime.data import TokenBatches, _permute, _key, prepare_data, read_documents

from train_helpers import base_overrides


def _cfg(cache_dir, *extra):
    cfg = compose(base_overrides(cache_dir) + list(extra))
    return cfg, resolve_layout(cfg)


def _corpus(root: Path, n: int = 120) -> Path:
    """n small, varied .py files (a data=stdlib corpus of our own)."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        body = "".join(f"def f_{i}_{j}(x, y={j}):\n    return x * {i} + y - {j * j}  # item {i}.{j}\n" for j in range(5 + i % 17))
        (root / f"mod_{i:03d}.py").write_text(body)
    return root


# ----------------------------------------------------------------------------- warm starts


def test_warm_start_opens_no_corpus_file(tmp_path):
    """A second start with a valid cache opens none of the raw files (Python's audit hook sees every open())."""
    corpus = _corpus(tmp_path / "corpus")
    cfg, layout = _cfg(tmp_path / "cache", f"data.paths=[{corpus}]", "data.max_bytes=null", "data.val_fraction=0.05")
    first = prepare_data(cfg, layout)
    opened: list[str] = []

    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(hook)  # cannot be removed; for the rest of the session it only appends paths to `opened`
    again = prepare_data(cfg, layout)
    raw = [p for p in list(opened) if str(corpus) in p]
    assert again == first
    assert raw == [], raw
    # Touching a file (new mtime) invalidates the manifest: the corpus is read again, and, its content unchanged,
    # the same content-keyed token file is reused.
    os.utime(corpus / "mod_000.py")
    opened.clear()
    third = prepare_data(cfg, layout)
    assert any(str(corpus) in p for p in opened) and third == first


def test_warm_start_trusts_size_and_mtime_not_content(tmp_path):
    """data=hf jsonl (read by Arrow, invisible to the audit hook): after the build, the file's bytes are replaced by
    others of the same size and its mtime restored. The warm start returns the old tokens: it did not read the file.
    (The same limit as make/rsync: a rewrite that keeps size and mtime is not seen.)"""
    path = tmp_path / "code.jsonl"
    rows = [{"text": f"def g{i}(a):\n    return a ** {i % 7} + {i}\n" * 12} for i in range(400)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg, layout = _cfg(tmp_path / "cache", "data=hf", f"data.paths=[{path}]", "data.max_bytes=null")
    first = prepare_data(cfg, layout)
    st = path.stat()
    path.write_bytes(b"\xff" * st.st_size)  # not even UTF-8: a read would fail
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert prepare_data(cfg, layout) == first
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(ConfigError) as info:
        prepare_data(cfg, layout)
    assert info.value.key == "data.paths" and "UTF-8" in info.value.rule


HF_NAME_PROBE = r"""
import json, os, sys
from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.runtime.data import prepare_data
cfg = compose(json.loads(sys.argv[1]))
layout = resolve_layout(cfg)
opened = []
sys.addaudithook(lambda event, args: opened.append(os.fsdecode(args[0])) if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) else None)
prepared = prepare_data(cfg, layout)
print(json.dumps({"prepared": prepared.as_dict(), "opened": opened, "datasets_imported": "datasets" in sys.modules}))
"""


def _hf_name_start(tmp_path, overrides):
    """prepare_data in a fresh process (as a rank starts), with its own datasets cache and no hub."""
    import subprocess

    from train_helpers import PYTHON, REPO, child_env

    env = child_env(HF_DATASETS_CACHE=tmp_path / "hf-datasets", HF_HOME=tmp_path / "hf-home", HF_HUB_OFFLINE=1,
                    HF_DATASETS_OFFLINE=1)
    out = subprocess.run([PYTHON, "-c", HF_NAME_PROBE, json.dumps(overrides)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_hf_name_warm_start_reads_no_data(tmp_path):
    """data.hf_name (a dataset directory, loaded by datasets.load_dataset as a hub dataset is, into its Arrow cache):
    the cold start loads it and records its cache files; a warm start in a fresh process imports no datasets,
    opens nothing under the dataset or its cache, and does not read the Arrow files (overwritten with garbage of
    the same size and mtime, it still returns the same tokens). New rows in the dataset are a new dataset."""
    ds_dir = tmp_path / "my-dataset"
    (ds_dir / "data").mkdir(parents=True)
    rows = [{"text": f"def h{i}(b):\n    return b * {i % 11} - {i}\n" * 10} for i in range(500)]
    (ds_dir / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [*base_overrides(tmp_path / "cache"), "data=hf", f"data.hf_name={ds_dir}", "data.max_bytes=null",
                 "data.seq_length=32"]
    cold = _hf_name_start(tmp_path, overrides)
    assert cold["datasets_imported"]
    arrow = sorted((tmp_path / "hf-datasets").rglob("*.arrow"))
    assert arrow
    warm = _hf_name_start(tmp_path, overrides)
    assert warm["prepared"] == cold["prepared"]
    assert not warm["datasets_imported"]
    touched = [p for p in warm["opened"] if str(ds_dir) in p or str(tmp_path / "hf-datasets") in p]
    assert touched == [], touched
    for f in arrow:   # a read by Arrow (C++, unseen by the audit hook) would now fail
        st = f.stat()
        f.write_bytes(b"\xff" * st.st_size)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _hf_name_start(tmp_path, overrides)["prepared"] == cold["prepared"]
    # More rows: the directory's stat changes, the dataset is loaded anew (a new Arrow cache) and re-tokenized.
    with open(ds_dir / "data" / "train.jsonl", "a") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows[:200]))
    grown = _hf_name_start(tmp_path, overrides)
    assert grown["datasets_imported"]
    assert grown["prepared"]["num_tokens"] + grown["prepared"]["val_num_tokens"] > \
        cold["prepared"]["num_tokens"] + cold["prepared"]["val_num_tokens"]


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("n", [1, 2, 3, 17, 256, 1000, 65537])
def test_permutation_is_a_bijection(n):
    ids = np.arange(n)
    p = _permute(ids, n, _key(7, 0))
    assert sorted(p.tolist()) == list(range(n))
    if n > 16:
        assert not np.array_equal(p, ids) and not np.array_equal(p, _permute(ids, n, _key(7, 1)))


def test_sample_order_memory_does_not_grow_with_the_corpus(tmp_path):
    """A 2.2e11-token (sparse, 440 GB apparent) token file: the old int64 permutation would be 8 B x 1.7e9 samples
    = 13.7 GB per rank; the reader allocates under 1 MB to start and to find a step far into the run."""
    bin_path = tmp_path / "huge.bin"
    with open(bin_path, "wb") as fh:
        fh.truncate(2 * 220 * 10**9)
    cfg, layout = _cfg(tmp_path / "cache", "data=tokens", f"data.tokens_path={bin_path}", "data.token_dtype=uint16")
    from launcher.runtime.data import PreparedData

    n = 220 * 10**9
    prepared = PreparedData(str(bin_path), None, "uint16", n, 320, -1, 128, n // 128 - 100, 100, "tokens", format="flat")
    import torch  # noqa: F401  (imported before measuring: batch() returns a tensor)

    tracemalloc.start()
    b = TokenBatches(prepared, replace(layout, seq_length=128), seed=1, dp_rank=0)
    ids = [b.train_sample_ids(step, 0) for step in (0, 10**6, 2 * 10**8)]
    x = b.batch(ids[-1])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20, peak
    assert all(0 <= i < prepared.train_samples for row in ids for i in row) and tuple(x.shape) == (4, 128)


# ----------------------------------------------------------------------------- Megatron and flat token files


def write_megatron(prefix: Path, docs: list[np.ndarray], code: int, dtype) -> None:
    """An MMapIndexedDataset pair written from the format description (megatron/core/datasets/indexed_dataset.py,
    _IndexWriter.write), not through our reader: one sequence per document."""
    with open(f"{prefix}.bin", "wb") as fh:
        for d in docs:
            fh.write(np.asarray(d, dtype=dtype).tobytes())
    sizes = [len(d) for d in docs]
    pointers, pos = [], 0
    for s in sizes:
        pointers.append(pos)
        pos += s * np.dtype(dtype).itemsize
    with open(f"{prefix}.idx", "wb") as fh:
        fh.write(b"MMIDIDX\x00\x00")
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", code))
        fh.write(struct.pack("<Q", len(sizes)))
        fh.write(struct.pack("<Q", len(docs) + 1))
        fh.write(np.asarray(sizes, dtype=np.int32).tobytes())
        fh.write(np.asarray(pointers, dtype=np.int64).tobytes())
        fh.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def _all_rows(prepared, layout):
    b = TokenBatches(prepared, layout, seed=0, dp_rank=0)
    return np.concatenate([b._row(i) for i in range(prepared.train_samples + prepared.val_samples)])


@pytest.mark.parametrize("code,dtype", [(4, np.int32), (8, np.uint16)])
def test_megatron_bin_idx_read_token_for_token(tmp_path, code, dtype):
    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(1, 320, size=rng.integers(5, 400)), 0) for _ in range(300)]
    prefix = tmp_path / "corpus_text_document"
    write_megatron(prefix, docs, code, dtype)
    stream = np.concatenate(docs)
    for given in (prefix, Path(f"{prefix}.bin")):
        cfg, layout = _cfg(tmp_path / "cache", "data=tokens", f"data.tokens_path={given}")
        prepared = prepare_data(cfg, layout)
        assert prepared.format == "megatron" and prepared.num_tokens == len(stream)
        rows = _all_rows(prepared, layout)
        used = (len(stream) // 32) * 32
        assert np.array_equal(rows, stream[:used])


def test_flat_uint16_bin_like_nanogpt(tmp_path):
    ids = np.random.default_rng(1).integers(0, 320, size=20_000).astype(np.uint16)
    path = tmp_path / "train.bin"
    ids.tofile(path)  # nanoGPT's data/openwebtext/prepare.py writes np.memmap(uint16) the same way
    cfg, layout = _cfg(tmp_path / "cache", "data=tokens", f"data.tokens_path={path}", "data.token_dtype=uint16")
    prepared = prepare_data(cfg, layout)
    assert prepared.format == "flat" and np.array_equal(_all_rows(prepared, layout), ids[: (len(ids) // 32) * 32])
    cfg, layout = _cfg(tmp_path / "cache", "data=tokens", f"data.tokens_path={path}")
    with pytest.raises(ConfigError) as info:
        prepare_data(cfg, layout)
    assert info.value.key == "data.tokens_path" and "data.token_dtype" in info.value.fix


def test_bad_megatron_files_are_refused(tmp_path):
    docs = [np.arange(1, 300, dtype=np.int32)] * 4
    prefix = tmp_path / "c"
    write_megatron(prefix, docs, 6, np.float64)  # float64: not a token dtype
    cfg, layout = _cfg(tmp_path / "cache", "data=tokens", f"data.tokens_path={prefix}")
    with pytest.raises(ConfigError) as info:
        prepare_data(cfg, layout)
    assert "dtype code 6 (float64)" in info.value.rule
    write_megatron(prefix, docs, 4, np.int32)
    with open(f"{prefix}.bin", "r+b") as fh:
        fh.truncate(1000)
    with pytest.raises(ConfigError) as info:
        prepare_data(cfg, layout)
    assert "the .bin has 1,000 bytes" in info.value.rule
    write_megatron(prefix, [np.full(300, 500, dtype=np.int32)] * 4, 4, np.int32)
    with pytest.raises(ConfigError) as info:
        prepare_data(cfg, layout)
    assert "holds token id 500" in info.value.rule


# ----------------------------------------------------------------------------- blends


def _blend(tmp_path, weights, n_tokens=(40_000, 30_000, 20_000)):
    """Flat token files whose ids tell their source: source i holds ids in [100 i, 100 i + 100)."""
    rng = np.random.default_rng(3)
    srcs = []
    for i, (w, n) in enumerate(zip(weights, n_tokens)):
        p = tmp_path / f"src{i}.bin"
        (100 * i + rng.integers(0, 100, size=n)).astype(np.uint16).tofile(p)
        srcs.append(f"{{path: {p}, weight: {w}}}")
    return _cfg(tmp_path / "cache", "data=blend", f"data.sources=[{','.join(srcs)}]", "data.token_dtype=uint16")


def test_blend_proportions_and_exact_resume(tmp_path):
    weights = (0.5, 0.3, 0.2)
    cfg, layout = _blend(tmp_path, weights)
    prepared = prepare_data(cfg, layout)
    assert prepared.source == "blend" and len(prepared.blend) == 3
    layout = replace(layout, data_degree=1, micro_batch_size=4, grad_accum_steps=2, global_batch_size=8)
    b = TokenBatches(prepared, layout, seed=11, dp_rank=0)
    steps = 1000  # 8,000 samples
    ids = [i for s in range(steps) for m in range(2) for i in b.train_sample_ids(s, m)]
    src = np.searchsorted(b.train_offsets, ids, side="right") - 1
    n = len(ids)
    # Each slot is an independent draw: count_i ~ Binomial(n, w_i). Bound: 4.5 standard deviations
    # (two-sided tail 6.8e-6 per source); the draws are deterministic, so the test cannot flake.
    for i, w in enumerate(weights):
        count = int((src == i).sum())
        sd = (n * w * (1 - w)) ** 0.5
        assert abs(count - n * w) <= 4.5 * sd, (i, count, n * w, sd)
    # The rows come from the source the id names.
    for j in (0, 17, 4000):
        assert int(b.batch([ids[j]])[0].max()) // 100 == src[j]
    # Within a source, no sample repeats before all of its train samples were drawn once (an epoch each).
    for i in range(3):
        mine = [x for x, s in zip(ids, src) if s == i][: prepared.blend[i]["train_samples"]]
        assert len(mine) == len(set(mine))
    # Resume: a fresh reader (as after a restart) started at step 600 gives the uninterrupted run's ids.
    again = TokenBatches(prepared, layout, seed=11, dp_rank=0)
    assert [again.train_sample_ids(s, m) for s in range(600, 620) for m in range(2)] == \
        [ids[(s * 2 + m) * 4:(s * 2 + m + 1) * 4] for s in range(600, 620) for m in range(2)]
    # Layout independence: 2 DP ranks x micro 2 x accum 2 read the same global batches, disjointly.
    two = replace(layout, data_degree=2, micro_batch_size=2, grad_accum_steps=2)
    ranks = [TokenBatches(prepared, two, seed=11, dp_rank=r) for r in range(2)]
    for s in (0, 333, 999):
        got = sorted(i for r in ranks for m in range(2) for i in r.train_sample_ids(s, m))
        assert got == sorted(ids[s * 8:(s + 1) * 8])


def test_blend_raw_sources_are_pretokenized_with_the_runs_tokenizer(tmp_path):
    """Blend sources that are raw corpora (a jsonl file, a directory of .py files) beside one of our token files:
    each is pretokenized with the token file's tokenizer into the cache, then blended as token files are.
    Proportions within 4.5 sigma of Binomial(n, w); each row decodes to its own source's text; a fresh reader
    resumes exactly; a warm start reads neither raw corpus (overwritten with garbage of the same size and mtime,
    the blend is unchanged). Without a tokenizer of the run, a raw source is refused."""
    from tokenizers import Tokenizer

    corpus = _corpus(tmp_path / "corpus")
    ours = prepare_data(*_cfg(tmp_path / "cache", f"data.paths=[{corpus}]", "data.max_bytes=null"))
    jsonl = tmp_path / "animals.jsonl"
    jsonl.write_text("".join(json.dumps({"text": f"zebra quokka {i} " * 30}) + "\n" for i in range(300)))
    pydir = tmp_path / "walrus"
    pydir.mkdir()
    for i in range(40):
        (pydir / f"w{i}.py").write_text(f"class Walrus{i}:\n    tusk = {i}\n" * 20)
    weights = (0.5, 0.3, 0.2)
    paths = (ours.bin_path, jsonl, pydir)
    sources = ",".join(f"{{path: {p}, weight: {w}}}" for p, w in zip(paths, weights))
    cfg, layout = _cfg(tmp_path / "cache", "data=blend", f"data.sources=[{sources}]", "data.max_bytes=null")
    prepared = prepare_data(cfg, layout)
    assert [s["format"] for s in prepared.blend] == ["launcher"] * 3
    assert all(s["path"].startswith(str(tmp_path / "cache")) and s["val_path"] for s in prepared.blend[1:])
    layout = replace(layout, data_degree=1, micro_batch_size=4, grad_accum_steps=2, global_batch_size=8)
    b = TokenBatches(prepared, layout, seed=5, dp_rank=0)
    ids = [i for s in range(1000) for m in range(2) for i in b.train_sample_ids(s, m)]
    src = np.searchsorted(b.train_offsets, ids, side="right") - 1
    n = len(ids)
    for i, w in enumerate(weights):
        count = int((src == i).sum())
        assert abs(count - n * w) <= 4.5 * (n * w * (1 - w)) ** 0.5, (i, count, n * w)
    tok = Tokenizer.from_file(ours.tokenizer_path)
    for j in range(0, 8000, 97):
        text = tok.decode(b.batch([ids[j]])[0].tolist())
        seen = ("zebra" in text or "quokka" in text, "Walrus" in text or "tusk" in text)
        assert seen == (src[j] == 1, src[j] == 2), (src[j], text)
    again = TokenBatches(prepared, layout, seed=5, dp_rank=0)
    assert [again.train_sample_ids(s, m) for s in range(600, 620) for m in range(2)] == \
        [ids[(s * 2 + m) * 4:(s * 2 + m + 1) * 4] for s in range(600, 620) for m in range(2)]
    for f in [jsonl, *pydir.iterdir()]:
        st = f.stat()
        f.write_bytes(b"\xff" * st.st_size)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert prepare_data(cfg, layout) == prepared
    flat = tmp_path / "flat.bin"
    np.zeros(10_000, dtype=np.uint16).tofile(flat)
    cfg, layout = _cfg(tmp_path / "cache", "data=blend", f"data.sources=[{{path: {flat}, weight: 1}}, {{path: {corpus}, weight: 1}}]",
                       "data.token_dtype=uint16")
    with pytest.raises(ConfigError) as info:
        prepare_data(cfg, layout)
    assert info.value.key == "data.tokenizer_path" and "data.sources[1].path" in info.value.rule, info.value


def test_blend_bad_inputs(tmp_path):
    p = tmp_path / "a.bin"
    np.zeros(10_000, dtype=np.uint16).tofile(p)
    for sources, key, says in [
        (f"[{{path: {p}, weight: 0}}]", "data.sources[0].weight", "positive"),
        (f"[{{path: {p}, weight: 1}}, {{path: {p}, weight: -2}}]", "data.sources[1].weight", "positive"),
        (f"[{{path: {p}, wieght: 1}}]", "data.sources[0]", "unknown: wieght"),
    ]:
        with pytest.raises(ConfigError) as info:
            _cfg(tmp_path / "cache", "data=blend", f"data.sources={sources}", "data.token_dtype=uint16")
        assert info.value.key == key and says in info.value.rule, info.value
    cfg, layout = _cfg(tmp_path / "cache", "data=blend", f"data.sources=[{{path: {tmp_path / 'nope.bin'}, weight: 1}}]")
    with pytest.raises(ConfigError) as info:
        prepare_data(cfg, layout)
    assert info.value.key == "data.sources[0].path" and "does not exist" in info.value.rule


# ----------------------------------------------------------------------------- held-out documents, parallel pretokenization


def _docs_of(path: str, dtype: str, eos: int) -> list[tuple]:
    t = np.fromfile(path, dtype=dtype)
    cuts = np.flatnonzero(t == eos)
    return [tuple(x) for x in np.split(t, cuts + 1) if len(x)]


def test_held_out_documents_are_a_seeded_random_set(tmp_path):
    corpus = _corpus(tmp_path / "corpus", n=200)
    args = [f"data.paths=[{corpus}]", "data.max_bytes=null", "data.val_fraction=0.1"]
    cfg, layout = _cfg(tmp_path / "cache", *args)
    p = prepare_data(cfg, layout)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(p.tokenizer_path)
    texts = [t for _, t in read_documents(cfg)]
    val_docs = [tok.decode(list(d[:-1])) for d in _docs_of(p.val_bin_path, p.dtype, p.eos_id)]
    train_docs = [tok.decode(list(d[:-1])) for d in _docs_of(p.bin_path, p.dtype, p.eos_id)]
    # Every document is in exactly one split, whole.
    assert sorted(val_docs + train_docs) == sorted(texts) and not set(val_docs) & set(train_docs)
    positions = sorted(texts.index(v) for v in val_docs)
    assert 5 <= len(positions) <= 40  # ~Binomial(200, 0.1): mean 20
    assert positions[0] < 100 and positions[-1] >= 100  # from the whole corpus, not its end
    # Seeded: the same seed gives the same set, another seed another set.
    again = prepare_data(*_cfg(tmp_path / "cache2", *args))
    assert np.array_equal(np.fromfile(again.val_bin_path, dtype=p.dtype), np.fromfile(p.val_bin_path, dtype=p.dtype))
    other = prepare_data(*_cfg(tmp_path / "cache", *args, "data.split_seed=1"))
    assert not np.array_equal(np.fromfile(other.val_bin_path, dtype=p.dtype), np.fromfile(p.val_bin_path, dtype=p.dtype))
    # Val sample ids name the held-out file's rows.
    b = TokenBatches(p, layout, seed=0, dp_rank=0)
    vid = b.val_sample_ids(0)[0]
    assert np.array_equal(b.batch([vid])[0].numpy(), np.fromfile(p.val_bin_path, dtype=p.dtype)[(vid - p.train_samples) * 32:][:32])


def test_two_processes_write_the_same_files_as_one(tmp_path):
    corpus = _corpus(tmp_path / "corpus", n=300)
    args = [f"data.paths=[{corpus}]", "data.max_bytes=null"]
    one = prepare_data(*_cfg(tmp_path / "c1", *args, "data.num_workers=1"))
    two = prepare_data(*_cfg(tmp_path / "c2", *args, "data.num_workers=2"))
    for a, b in ((one.bin_path, two.bin_path), (one.val_bin_path, two.val_bin_path)):
        assert Path(a).name == Path(b).name and Path(a).read_bytes() == Path(b).read_bytes()
    assert Path(one.bin_path + ".docs.npy").read_bytes() == Path(two.bin_path + ".docs.npy").read_bytes()
    offsets = np.load(one.bin_path + ".docs.npy")
    t = np.fromfile(one.bin_path, dtype=one.dtype)
    assert offsets[-1] == len(t) and all(t[o - 1] == one.eos_id for o in offsets[1:])


# ----------------------------------------------------------------------------- a blend through `launcher train`


def _losses(run_dir: Path) -> dict[int, float]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return {r["step"]: r["loss"] for r in recs if r["kind"] == "train"}


def test_blend_trains_and_resumes_exactly(cache_dir, tmp_path):
    """2 CPU ranks on a 4-source blend (one of our token files, a Megatron pair, a flat file, a raw jsonl corpus
    pretokenized with the token file's tokenizer): 6 steps straight, and 3 steps + a resume to 6, give the same
    losses (the data position is the step, through the blend)."""
    from train_helpers import launcher

    stdlib = prepare_data(*_cfg(cache_dir))
    ids = np.fromfile(stdlib.bin_path, dtype=stdlib.dtype)
    third = len(ids) // 3
    write_megatron(tmp_path / "mega", [ids[third:2 * third]], 8, np.uint16)
    ids[2 * third:].tofile(tmp_path / "flat.bin")
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps({"text": f"def r{i}(q):\n    return q + {i}\n" * 8}) + "\n" for i in range(200)))
    sources = (f"[{{path: {stdlib.bin_path}, weight: 5}}, {{path: {tmp_path / 'mega'}, weight: 3}}, {{path: {tmp_path / 'flat.bin'}, weight: 2}}, "
               f"{{path: {raw}, weight: 2}}]")
    common = [*base_overrides(cache_dir, 6), "data=blend", "data.seq_length=32", f"data.sources={sources}", "data.token_dtype=uint16",
              "scheduler.decay_steps=6", f"runs_dir={tmp_path / 'runs'}"]
    a = launcher(["train", *common, "run_name=a", "checkpoint.save_every=0"])
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-3000:]
    b = launcher(["train", *common, "run_name=b", "train.steps=3", "checkpoint.save_every=3"])
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    b2 = launcher(["train", "--config", str(tmp_path / "runs" / "b" / "config.yaml"), "resume=auto", "train.steps=6"])
    assert b2.returncode == 0, b2.stdout[-3000:] + b2.stderr[-3000:]
    ref, got = _losses(tmp_path / "runs" / "a"), _losses(tmp_path / "runs" / "b")
    assert sorted(ref) == sorted(got) == list(range(1, 7))
    assert max(abs(got[s] - ref[s]) for s in ref) < 1e-6, (ref, got)
    saved = json.loads((tmp_path / "runs" / "a" / "data.json").read_text())
    assert saved["source"] == "blend" and [s["format"] for s in saved["blend"]] == ["launcher", "megatron", "flat", "launcher"]
