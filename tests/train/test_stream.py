"""data.streaming=true (launcher/runtime/stream.py): the window stream against the pretokenized files, the DP split
of every global batch, the held-out split, the seeded shuffle, and a 2-rank DeepSpeed run that resumes exactly.

The corpus is a jsonl file written here; its tokenizer is the BPE the pretokenized path trains on it (an input to
the streamed path, which needs a tokenizer before its first step).
"""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.runtime import stream
from launcher.runtime.data import prepare_data

from train_helpers import base_overrides, launcher

SEQ = 32
MARK = re.compile(r"doc-(\d+)-end")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(jsonl path, cache dir, tokenizer.json, the pretokenized PreparedData) of 600 documents of varied length;
    each starts with `doc-<i>-end`, so a decoded window says which documents it holds."""
    root = tmp_path_factory.mktemp("stream")
    path = root / "corpus.jsonl"
    rng = np.random.default_rng(7)
    rows = []
    for i in range(600):
        words = " ".join(f"w{int(x)}" for x in rng.integers(0, 60, size=int(rng.integers(5, 90))))
        rows.append({"id": i, "text": f"doc-{i}-end {words}\n"})
    rows.insert(17, {"id": -1, "text": "   "})  # blank rows are skipped by both paths, and not numbered
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = root / "cache"
    cfg = compose(_overrides(cache, path))
    packed = prepare_data(cfg, resolve_layout(cfg))
    tok = root / "tokenizer.json"
    shutil.copy(packed.tokenizer_path, tok)
    return path, cache, tok, packed


def _overrides(cache, path, *extra):
    return base_overrides(cache) + ["data=hf", f"data.paths=[{path}]", "data.max_bytes=null", "data.val_fraction=0.05",
                                    f"data.seq_length={SEQ}", *extra]


def _streamed(corpus, *extra):
    path, cache, tok, _ = corpus
    cfg = compose(_overrides(cache, path, "data.streaming=true", f"data.tokenizer_path={tok}", *extra))
    layout = resolve_layout(cfg)
    return cfg, layout, prepare_data(cfg, layout)


def _take(it, n):
    return [next(it) for _ in range(n)]


def test_in_order_stream_equals_the_pretokenized_files(corpus):
    """shuffle_buffer=0: train window k is row k of the packed train file, held-out window k row k of the val file,
    and pass 2 starts again at row 0 (the tail after the last whole window is dropped, as the file's is)."""
    _, _, _, packed = corpus
    cfg, _, prepared = _streamed(corpus, "data.shuffle_buffer=0")
    assert prepared.format == "stream" and prepared.num_tokens == 0 and prepared.eos_id == packed.eos_id
    tok = Tokenizer.from_file(prepared.tokenizer_path)
    train = np.memmap(packed.bin_path, dtype=packed.dtype, mode="r")
    rows = train[: packed.train_samples * SEQ].reshape(-1, SEQ)
    got = np.stack(_take(stream.train_windows(cfg, tok, prepared.eos_id, SEQ, seed=0), packed.train_samples + 3))
    assert packed.train_samples > 500 and (got[: packed.train_samples] == rows).all()
    assert (got[packed.train_samples:] == rows[:3]).all()
    val = np.memmap(packed.val_bin_path, dtype=packed.dtype, mode="r")[: packed.val_samples * SEQ].reshape(-1, SEQ)
    held = np.stack(list(stream.val_windows(cfg, tok, prepared.eos_id, SEQ)))
    assert packed.val_samples > 10 and held.shape == val.shape and (held == val).all()


def _docs(tok, windows) -> set[int]:
    """The documents whose marker is in the windows, decoded as one text (consecutive windows are one token stream,
    so a marker cut by a window edge is still found)."""
    return {int(m) for m in MARK.findall(tok.decode([int(t) for w in windows for t in w]))}


def test_shuffle_is_seeded_bounded_and_keeps_the_held_out_documents_out(corpus):
    cfg, _, prepared = _streamed(corpus, "data.shuffle_buffer=64")
    tok = Tokenizer.from_file(prepared.tokenizer_path)
    eos = prepared.eos_id
    a = _take(stream.train_windows(cfg, tok, eos, SEQ, seed=0), 400)
    again = _take(stream.train_windows(cfg, tok, eos, SEQ, seed=0), 400)
    other = _take(stream.train_windows(cfg, tok, eos, SEQ, seed=1), 400)
    assert all((x == y).all() for x, y in zip(a, again))
    assert sum((x != y).any() for x, y in zip(a, other)) > 300
    # Bounded: the first window holds documents from the first buffer's worth only (64 + its chunk of 64).
    first = _docs(tok, a[:1])
    assert first and max(first) < 128 + 10, first
    # (d) One full pass, then the start of the next: no held-out document appears in a training window.
    n_pass = sum(1 for _ in stream._windows(stream._shuffled(stream._doc_chunks(cfg, False), 64, 0, 0), tok, eos, SEQ))
    train_docs = _docs(tok, _take(stream.train_windows(cfg, tok, eos, SEQ, seed=0), n_pass + 50))
    val_docs = _docs(tok, stream.val_windows(cfg, tok, eos, SEQ))
    assert len(val_docs) > 15 and len(train_docs) > 500 and not (train_docs & val_docs)
    assert len(train_docs | val_docs) == 600  # every document is read (the dropped tail is in the next pass's 50)


def test_two_dp_ranks_split_each_global_batch_as_the_batch_path(corpus):
    """(b) the StreamBatches the two ranks build: disjoint, covering every global batch, each slot its stream
    window, at the batch path's slot (step * gbs + micro_step * micro * dp + dp_rank * micro + i, launcher/runtime/
    data.py); a rank built at step 5 (a resume) reads what the uninterrupted one does."""
    cfg, layout, prepared = _streamed(corpus, "cluster.gpus_per_node=2", "batch.global_batch_size=8", "batch.micro_batch_size=2")
    assert (layout.data_degree, layout.grad_accum_steps) == (2, 2)
    tok = Tokenizer.from_file(prepared.tokenizer_path)
    windows = _take(stream.train_windows(cfg, tok, prepared.eos_id, SEQ, cfg.train.seed), 8 * 7)
    ranks = [stream.StreamBatches(cfg, prepared, layout, dp_rank=r) for r in range(2)]
    for step in range(7):
        slots = []
        for r, b in enumerate(ranks):
            for j in range(layout.grad_accum_steps):
                ids = b.train_sample_ids(step, j)
                got = b.batch(ids).numpy()
                assert all((got[i] == windows[g]).all() for i, g in enumerate(ids))
                assert ids == [step * 8 + j * 2 * 2 + r * 2 + i for i in range(2)]
                slots += ids
        assert sorted(slots) == list(range(step * 8, step * 8 + 8))
    late = stream.StreamBatches(cfg, prepared, layout, dp_rank=1)
    assert (late.batch(late.train_sample_ids(5, 1)).numpy() == ranks[1].batch(ranks[1].train_sample_ids(5, 1)).numpy()).all()
    # Eval: rank r's batch b is held-out windows (b * dp + r) * micro + i, disjoint across ranks, wrapping when few.
    held = list(stream.val_windows(cfg, tok, prepared.eos_id, SEQ))
    for b in (0, 1, 10):
        for r, sb in enumerate(ranks):
            ks = [((b * 2 + r) * 2 + i) % len(held) for i in range(2)]
            assert (sb.batch(sb.val_sample_ids(b)).numpy() == np.stack([held[k] for k in ks])).all()


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]


def _losses(run_dir: Path) -> tuple[dict, dict]:
    recs = _records(run_dir)
    return ({r["step"]: r["loss"] for r in recs if r["kind"] == "train"},
            {r["step"]: r["val_loss"] for r in recs if r["kind"] == "eval"})


@pytest.mark.slow
def test_streamed_two_rank_run_resumes_exactly(corpus, tmp_path):
    """(c) 2 ranks (DP 2, ZeRO-2, AdamW): 6 steps straight == 3 steps + resume to 6, losses and val
    losses to 1e-6; the checkpoint records the stream position (3 x 8 windows). (b) in real ranks: 1 rank reading
    the same global batches (micro 4 x accum 2) has the 2-rank run's losses and gradient norms (a rank reading a
    wrong share, or a share twice, changes both; a gradient-scale error changes the norm)."""
    path, cache, tok, _ = corpus
    common = _overrides(cache, path, "data.streaming=true", f"data.tokenizer_path={tok}", "data.shuffle_buffer=32",
                        "train.eval_every=3", "train.eval_batches=2", "scheduler.decay_steps=6", f"runs_dir={tmp_path}")
    straight = launcher(["train", *common, "train.steps=6", "run_name=straight"], timeout=300)
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]
    assert "data: streamed (hf)" in straight.stdout
    half = launcher(["train", *common, "train.steps=3", "run_name=resumed"], timeout=300)
    assert half.returncode == 0, half.stdout[-3000:] + half.stderr[-3000:]
    state = json.loads((tmp_path / "resumed" / "checkpoints" / "step_00000003" / "launcher_state.json").read_text())
    assert state["data_position"]["samples_consumed"] == 24
    rest = launcher(["train", "--config", str(tmp_path / "resumed" / "config.yaml"), "resume=auto", "train.steps=6"], timeout=300)
    assert rest.returncode == 0, rest.stdout[-3000:] + rest.stderr[-3000:]
    assert "resuming at step 3" in rest.stdout + rest.stderr
    ref, ref_val = _losses(tmp_path / "straight")
    got, got_val = _losses(tmp_path / "resumed")
    assert sorted(ref) == sorted(got) == list(range(1, 7)) and sorted(ref_val) == sorted(got_val) == [3, 6]
    assert max(abs(got[s] - ref[s]) for s in ref) < 1e-6, (ref, got)
    assert max(abs(got_val[s] - ref_val[s]) for s in ref_val) < 1e-6, (ref_val, got_val)
    assert len({round(v, 6) for v in ref.values()}) == 6  # the steps read different windows
    one = launcher(["train", *common, "train.steps=3", "run_name=one", "cluster.gpus_per_node=1"], timeout=300)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    two = {r["step"]: r for r in _records(tmp_path / "straight") if r["kind"] == "train"}
    for r in (r for r in _records(tmp_path / "one") if r["kind"] == "train"):
        assert abs(r["loss"] - two[r["step"]]["loss"]) < 1e-5, (r, two[r["step"]])
        assert abs(r["grad_norm"] - two[r["step"]]["grad_norm"]) < 1e-4 * two[r["step"]]["grad_norm"], (r, two[r["step"]])


def test_a_resume_refuses_a_changed_streamed_corpus(corpus, tmp_path):
    """The stream has no packed file to compare: its identity (files' sizes and mtimes, tokenizer, settings) stands
    in for one, and resume_changes names a rewritten corpus file."""
    import os

    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime import checkpoint as ckpt

    path = tmp_path / "copy.jsonl"
    shutil.copy(corpus[0], path)
    cfg, layout, prepared = _streamed((path, *corpus[1:]))
    state = ckpt.build_state(cfg, layout, build_deepspeed_config(cfg, layout), 3, 0, prepared)
    assert state["data_position"]["samples_consumed"] == 3 * layout.global_batch_size
    assert ckpt.resume_changes(state, cfg, layout, tmp_path, prepared) == []
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _, _, again = _streamed((path, *corpus[1:]))
    changes = ckpt.resume_changes(state, cfg, layout, tmp_path, again)
    assert len(changes) == 1 and changes[0].startswith("packed tokens: stream-"), changes
