"""data=hf with data.streaming=true: documents -> tokens -> windows as training consumes them, no packed cache.

For a corpus larger than the disk cache (or than one would pretokenize before a first step). The dataset is
opened with datasets' streaming mode (`load_dataset(..., streaming=True)`: local json/jsonl/parquet/txt/csv files
or a dataset directory are read lazily, record batch by record batch), so start-up reads one row (to check
data.text_field) and memory is independent of the corpus size.

The window stream, a pure function of (corpus, tokenizer, train.seed, data.seq_length, data.shuffle_buffer,
data.val_fraction, data.split_seed):

    documents in corpus order, numbered i = 0, 1, ... (non-empty texts, as the pretokenized path numbers them)
      -> document i is held out when held_out_rule's keyed hash of (data.split_seed, i) < data.val_fraction
         (the pretokenized path's rule, launcher/runtime/data.py; it cannot force one held-out document in a
         corpus without any, which needs the document count)
      -> pass e over the training documents: a shuffle buffer of data.shuffle_buffer documents seeded by
         (train.seed, e) (the algorithm of datasets' IterableDataset.shuffle: fill the buffer, then each new
         document replaces a uniformly drawn one, which is emitted)
      -> each document's ids + EOS, concatenated, cut into data.seq_length windows; a pass's last partial
         window is dropped, then pass e + 1 starts (as the pretokenized path drops a file's tail)
      -> window g of that endless stream fills global sample slot g.

Slot g belongs to the DP rank the batch path gives it (TokenBatches.train_sample_ids):
g = step * global_batch + micro_step * (micro * dp) + dp_rank * micro + i, so a global batch is split exactly as
with a packed file. Every rank reads and tokenizes the whole stream and keeps its slots (the windows cross
document boundaries, so no rank can know where its windows start without the tokens before them): tokenizing
costs dp times what one reader would pay, in each rank's own process. Fine while a tokenizer outruns a rank's
consumption (measured: 0.59M tokens/s through this path, docs/data.md); at large DP, pretokenize (data.streaming=false).

Resume: the step gives the position (step * global_batch windows consumed, also written to the checkpoint as
data_position.samples_consumed); the resumed rank re-reads and re-tokenizes the stream up to it. That costs a
pass over everything trained so far; it is exact, which datasets' IterableDataset.state_dict is not with a
shuffle buffer (its docs: the buffer's content is lost on resume).

Held-out windows: the held-out documents in corpus order (never shuffled), packed the same way; eval batch b of
DP rank r takes windows (b * dp + r) * micro + i, wrapping when there are fewer. Training never reads a
held-out document, so no eval window shares a document with a training window.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from launcher.config.errors import ConfigError
from launcher.runtime import inputs
from launcher.runtime.data import (ENCODE_CHUNK_DOCS, Documents, PreparedData, _encode_chunk, _eos_id, _key,
                                   _stat_identity, build_tokenizer, held_out_rule, slot_dp_rank, token_dtype,
                                   tokenizer_location, train_slots, val_slots)

STREAM_FORMAT = "launcher-stream-v1"


class StreamDocuments(Documents):
    """Documents of data=hf read with datasets' streaming mode: no Arrow cache is written, nothing is read ahead."""

    def _dataset(self):
        import datasets

        d = self.cfg.data
        if self._ds is not None:
            return self._ds
        files = self.files()  # checks the files' kinds and that they exist and are not empty
        try:
            with inputs.quiet_datasets():
                if files:
                    ds = datasets.load_dataset(self._builder, data_files=[str(p) for _, p in files], split="train", streaming=True)
                elif d.hf_name:
                    if not Path(d.hf_name).expanduser().is_dir():  # a local dataset directory needs no hub
                        inputs.check_hub_reachable(d.hf_name)
                    ds = datasets.load_dataset(d.hf_name, split="train", streaming=True)
                else:
                    raise ConfigError("data.paths", [], "data=hf needs local files in data.paths or a hub name in data.hf_name",
                                      "set data.paths=[/path/a.jsonl] or data.hf_name=NAME")
                # The columns from the first row: a streamed json dataset knows no features before it is read.
                first = next(iter(ds), None)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - datasets' errors name neither file nor line: find them
            if files:
                raise inputs.explain_hf_read_error(list(d.paths), self._builder, exc) from None
            raise inputs.hub_load_error(d.hf_name, exc) from None
        if first is None:
            raise ConfigError(self.key, list(d.paths) or d.hf_name, "holds no rows", "give a corpus with documents in it")
        if d.text_field not in first:
            cols = list(first)
            raise ConfigError("data.text_field", d.text_field, f"is not a column of the dataset (columns: {', '.join(cols)})",
                              f"set data.text_field to one of {', '.join(cols)}")
        self._ds = ds
        return ds


def _identity(cfg) -> str:
    """What decides the window stream, from stat calls and settings only: a resume refuses a change of it
    (checkpoint.resume_changes compares PreparedData.bin_path's name)."""
    d = cfg.data
    if d.paths:
        files = [_stat_identity(Path(p)) for p in d.paths]
    else:
        from launcher.runtime.hubdata import source_identity

        files = source_identity(d.hf_name)
    tok = _stat_identity(tokenizer_location(cfg))
    settings = {"format": STREAM_FORMAT, "files": files, "hf_name": d.hf_name, "text_field": d.text_field, "tokenizer": tok,
                "max_bytes": d.max_bytes, "val_fraction": d.val_fraction, "split_seed": d.split_seed,
                "shuffle_buffer": d.shuffle_buffer, "seq_length": d.seq_length, "seed": cfg.train.seed}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def prepare_stream(cfg, layout) -> PreparedData:
    """Check the streamed corpus and load the tokenizer; reads the first row only (no pass over the corpus)."""
    cache = Path(cfg.data.cache_dir).expanduser()
    inputs.check_writable_dir("data.cache_dir", cfg.data.cache_dir)  # the tokenizer of a model directory is copied there
    StreamDocuments(cfg)._dataset()
    tok_path, tok = build_tokenizer(cfg, None, "", cache)
    return PreparedData(f"stream-{_identity(cfg)}", str(tok_path), token_dtype(cfg.model.vocab_size), 0, cfg.model.vocab_size,
                        _eos_id(tok, str(tok_path)), layout.seq_length, 0, 0, "hf", format="stream")


def _doc_chunks(cfg, held_out_wanted: bool) -> Iterator[list[str]]:
    """Texts of the training (or held-out) documents in corpus order, in chunks for encode_batch."""
    d = cfg.data
    mask = held_out_rule(0, d.val_fraction, d.split_seed)  # 0 documents known: the pure per-document rule
    block: list[str] = []
    i = 0

    def flush():
        held = mask(np.arange(i - len(block), i)) if d.val_fraction > 0 else np.zeros(len(block), dtype=bool)
        return [t for t, h in zip(block, held) if bool(h) == held_out_wanted]

    for _, text in StreamDocuments(cfg):
        block.append(text)
        i += 1
        if len(block) >= ENCODE_CHUNK_DOCS:
            yield flush()
            block = []
    if block:
        yield flush()


def _shuffled(chunks: Iterator[list[str]], buffer_size: int, seed: int, epoch: int) -> Iterator[list[str]]:
    """A bounded shuffle of the documents (datasets' BufferShuffledExamplesIterable's algorithm), rechunked."""
    if buffer_size <= 0:
        yield from chunks
        return
    rng = np.random.default_rng(int(_key(seed, 0x5A0FF1E, epoch)))
    buf: list[str] = []
    out: list[str] = []
    for chunk in chunks:
        for text in chunk:
            if len(buf) < buffer_size:
                buf.append(text)
                continue
            j = int(rng.integers(buffer_size))
            out.append(buf[j])
            buf[j] = text
            if len(out) >= ENCODE_CHUNK_DOCS:
                yield out
                out = []
    rng.shuffle(buf)
    out += buf
    for s in range(0, len(out), ENCODE_CHUNK_DOCS):
        yield out[s:s + ENCODE_CHUNK_DOCS]


def _windows(chunks: Iterator[list[str]], tok, eos_id: int, seq: int) -> Iterator[np.ndarray]:
    """Each text's ids + EOS, concatenated, cut into seq-token windows (the pretokenized file's rows); tail dropped."""
    carry = np.zeros(0, dtype=np.uint32)
    for texts in chunks:
        if not texts:
            continue
        ids, _ = _encode_chunk(texts, eos_id, tok)
        carry = np.concatenate([carry, ids])
        n = len(carry) // seq
        for k in range(n):
            yield carry[k * seq:(k + 1) * seq]
        carry = carry[n * seq:].copy()


def train_windows(cfg, tok, eos_id: int, seq: int, seed: int) -> Iterator[np.ndarray]:
    """The endless training window stream: pass 0, pass 1, ... over the training documents."""
    epoch = 0
    while True:
        got = 0
        for w in _windows(_shuffled(_doc_chunks(cfg, False), cfg.data.shuffle_buffer, seed, epoch), tok, eos_id, seq):
            got += 1
            yield w
        if got == 0:
            raise ConfigError("data.paths" if cfg.data.paths else "data.hf_name", list(cfg.data.paths) or cfg.data.hf_name,
                              f"its training documents hold fewer tokens than one window of data.seq_length {seq}",
                              "use a larger corpus (or raise data.max_bytes), or lower data.seq_length")
        epoch += 1


def val_windows(cfg, tok, eos_id: int, seq: int) -> Iterator[np.ndarray]:
    """The held-out windows, one pass, in corpus order."""
    return _windows(_doc_chunks(cfg, True), tok, eos_id, seq)


class StreamBatches:
    """TokenBatches' interface over the window stream: train ids are global slots g >= 0, held-out window k is -1 - k.

    This rank keeps only its own windows of the current global batch (global_batch / dp of them) and of the eval
    batches asked for so far.
    """

    def __init__(self, cfg, prepared: PreparedData, layout, dp_rank: int):
        from tokenizers import Tokenizer

        self.cfg = cfg
        self.seq = prepared.seq_length
        self.micro, self.dp, self.gbs = layout.micro_batch_size, layout.data_degree, layout.global_batch_size
        self.dp_rank = dp_rank
        self.seed = cfg.train.seed
        self.tok = Tokenizer.from_file(prepared.tokenizer_path)
        self.eos_id = prepared.eos_id
        self._train: Optional[Iterator[np.ndarray]] = None
        self._pos = 0  # index of the next window self._train yields
        self._batch_start = -1  # first slot of the global batch held in self._mine
        self._mine: dict[int, np.ndarray] = {}
        self._val: Optional[Iterator[np.ndarray]] = None
        self._val_pos = 0
        self._val_mine: dict[int, np.ndarray] = {}
        self._val_all: Optional[list[np.ndarray]] = None  # every held-out window, once a pass showed there are few

    def train_sample_ids(self, step: int, micro_step: int) -> list[int]:
        """Slots of this rank's micro-batch `micro_step` of optimizer step `step` (data.train_slots, as TokenBatches)."""
        return list(train_slots(step, micro_step, self.gbs, self.micro, self.dp, self.dp_rank))

    def val_sample_ids(self, batch: int) -> list[int]:
        return [-1 - k for k in val_slots(batch, self.micro, self.dp, self.dp_rank)]

    def _load_global_batch(self, start: int) -> None:
        """Read the stream up to slot `start` (a resume re-tokenizes what it skips), then keep this rank's windows
        of the global batch [start, start + global_batch)."""
        if self._train is None or self._pos > start:
            self._train, self._pos = train_windows(self.cfg, self.tok, self.eos_id, self.seq, self.seed), 0
        while self._pos < start:
            next(self._train)
            self._pos += 1
        self._mine = {}
        for g in range(start, start + self.gbs):
            w = next(self._train)
            self._pos += 1
            if slot_dp_rank(g, self.gbs, self.micro, self.dp) == self.dp_rank:
                self._mine[g] = w
        self._batch_start = start

    def _train_window(self, g: int) -> np.ndarray:
        start = g - g % self.gbs
        if start != self._batch_start:
            self._load_global_batch(start)
        return self._mine[g]

    def _val_window(self, k: int) -> np.ndarray:
        if self._val_all is not None:
            return self._val_all[k % len(self._val_all)]
        if k in self._val_mine:
            return self._val_mine[k]
        if self._val is None:
            self._val = val_windows(self.cfg, self.tok, self.eos_id, self.seq)
        for w in self._val:
            j, self._val_pos = self._val_pos, self._val_pos + 1
            if slot_dp_rank(j, self.micro * self.dp, self.micro, self.dp) == self.dp_rank:
                self._val_mine[j] = w
            if j == k:
                return w
        # The held-out stream ended before window k: there are only self._val_pos of them, few enough to hold.
        self._val_all = list(val_windows(self.cfg, self.tok, self.eos_id, self.seq))
        if not self._val_all:
            raise ConfigError("data.val_fraction", self.cfg.data.val_fraction,
                              f"the held-out documents (each document with probability {self.cfg.data.val_fraction}, seeded by "
                              f"data.split_seed) hold fewer tokens than one window of data.seq_length {self.seq}",
                              "raise data.val_fraction or use a larger corpus, or set train.eval_every=0")
        self._val_mine.clear()
        return self._val_all[k % len(self._val_all)]

    def batch(self, sample_ids: list[int]):
        """input_ids (micro, seq) as int64, as TokenBatches.batch."""
        import torch

        rows = [self._train_window(i) if i >= 0 else self._val_window(-1 - i) for i in sample_ids]
        return torch.from_numpy(np.stack(rows).astype(np.int64))

    def train_batches(self, step: int, accum: int) -> Iterator:
        for micro_step in range(accum):
            yield self.batch(self.train_sample_ids(step, micro_step))
