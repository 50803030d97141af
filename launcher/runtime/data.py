"""Corpus -> tokenizer -> packed token files -> per-rank batches.

    documents (stdlib .py files | datasets rows), streamed: the corpus is never held in memory
      -> byte-level BPE of model.vocab_size (HF tokenizers), cached by content hash
      -> pretokenized in data.num_workers processes into packed files (documents joined with EOS,
         uint16/uint32, memory-mapped, index <key>.idx.json); a seeded random set of whole documents
         (data.val_fraction of them, data.split_seed) goes to <key>.val.bin instead: the held-out split
      -> fixed-length samples of data.seq_length tokens
      -> sample ids for (step, micro step, dp rank) from a seeded permutation
    or token files made elsewhere (data=tokens: ours, Megatron .bin/.idx, flat nanoGPT .bin), or a weighted
    blend of them (data=blend; a raw corpus among its sources is pretokenized first, with the run's tokenizer);
    for token files made elsewhere the held-out samples are the last val_fraction of each file.

A warm start reads no raw data: a manifest keyed by the corpus files' paths, sizes and mtimes (for data.hf_name,
the dataset's cache files: launcher/runtime/hubdata.py), the tokenizer's identity and the settings (_manifest_key)
names the packed files, so start-up costs a stat per corpus file and
two small JSON reads, whatever the corpus size. Only a cold start reads the corpus (a hashing pass, the BPE
training pass when no tokenizer is given, the tokenizing pass); a file lock per manifest makes the first process
build and the others wait and reuse (every rank under SLURM calls this).

Batches are a pure function of (seed, step, micro step, dp rank), so a resumed run sees exactly the batches an
uninterrupted run would, and DP ranks read disjoint samples: the global sample slot of micro-sample i is

    g = step * global_batch + micro_step * (micro * dp) + dp_rank * micro + i

and slot g maps to sample P_e(g mod S), e = g div S (S = train samples), where P_e is a keyed pseudo-random
permutation of [0, S) evaluated per slot (a Feistel network, _permute): O(1) memory, not an S-element int64
array per rank (8 bytes per sample: ~3.9 GB at 2T tokens of 4096). The same slots are used by every split of
one global batch into micro x accum x dp, which is what makes 1 rank x micro 4 and 2 ranks x micro 2 (or micro 1
x accum 4) see the same data. In a blend, slot g first picks source i with probability w_i (a hash of (seed, g)),
and takes that source's c-th sample, c = how many earlier slots picked i (BlendedDataset in Megatron-LM:
megatron/core/datasets/blended_dataset.py, whose dataset_index / dataset_sample_index these are).

`prepare_data` raises ConfigError for bad input before any rank starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sysconfig
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from launcher.config.errors import ConfigError
from launcher.runtime import inputs
from launcher.runtime.durable import write_atomic  # fsync'd: a node crash leaves the old file or the new one

EOS_TOKEN = "<|endoftext|>"
# Other names a user-supplied tokenizer may give its end-of-document token.
EOS_CANDIDATES = (EOS_TOKEN, "</s>", "<eos>", "<|end_of_text|>")
# v2: held-out documents live in <key>.val.bin (v1 files, the held-out split at their end, are still read by data=tokens).
FORMAT_VERSION = "launcher-packed-v2"
ENCODE_CHUNK_DOCS = 64
ENCODE_CHUNK_BYTES = 2**20  # a chunk handed to a worker: small enough to balance the workers, bounded memory in flight
HF_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text", ".csv": "csv"}
FEISTEL_ROUNDS = 6  # >= 4 rounds of a pseudo-random round function give a pseudo-random permutation (Luby & Rackoff 1988)
BLEND_BLOCK = 1 << 18  # blend slots whose source choices are evaluated at once (one block cached per reader)


@dataclass(frozen=True)
class PreparedData:
    """Where the packed tokens and the tokenizer of a run are, and how they split into samples."""

    bin_path: str
    tokenizer_path: Optional[str]
    dtype: str
    num_tokens: int
    vocab_size: int
    eos_id: int  # -1: the token file does not say (Megatron / flat files)
    seq_length: int
    train_samples: int
    val_samples: int
    source: str
    val_bin_path: Optional[str] = None  # held-out documents; None: val samples are the last val_samples of bin_path
    val_num_tokens: int = 0
    format: str = "launcher"  # launcher | megatron | flat
    blend: tuple = ()  # data=blend: per source {path, format, dtype, num_tokens, weight, train_samples, val_samples, ...}

    def as_dict(self) -> dict:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------- corpus


class Documents:
    """The (name, text) documents of data=stdlib or data=hf in a deterministic order, read anew on every pass.

    Streaming keeps memory independent of corpus size: prepare_data makes up to three passes (hash, BPE
    training, tokenizing) instead of holding the corpus as Python strings. len() is set by the hashing pass.
    """

    def __init__(self, cfg):
        self.cfg = cfg
        self.count: Optional[int] = None
        self._files: Optional[list[tuple[str, Path]]] = None
        self._ds = None
        self._builder = None

    @property
    def key(self) -> str:
        d = self.cfg.data
        return "data.hf_name" if d.source == "hf" and not d.paths else "data.paths"

    def files(self) -> list[tuple[str, Path]]:
        """(name, path) of every file the corpus is read from, sorted: stat'ed, never read, to fingerprint it."""
        if self._files is not None:
            return self._files
        d = self.cfg.data
        files: list[tuple[str, Path]] = []
        if d.source == "stdlib":
            roots = [Path(p).expanduser() for p in d.paths] or [Path(sysconfig.get_paths()["stdlib"])]
            for root in roots:
                if not root.is_dir():
                    raise ConfigError("data.paths", str(root), "is not a directory", "give directories holding .py files, or [] for the stdlib")
                # os.walk, pruned: installed third-party packages are not the standard library and differ between
                # machines, and walking into them (torch, ...) was most of a warm start's time.
                for dirpath, dirnames, filenames in os.walk(root):
                    dirnames[:] = [n for n in dirnames if n not in ("site-packages", "dist-packages")]
                    rel_dir = os.path.relpath(dirpath, root)
                    for n in filenames:
                        if n.endswith(".py"):
                            rel = n if rel_dir == "." else f"{rel_dir}/{n}".replace(os.sep, "/")
                            files.append((f"{root.name}/{rel}", Path(dirpath) / n))
            files.sort(key=lambda item: item[0])
        elif d.paths:
            exts = {Path(p).suffix.lower() for p in d.paths}
            builders = {HF_BUILDERS.get(e) for e in exts}
            if None in builders or len(builders) != 1:
                raise ConfigError("data.paths", list(d.paths), f"needs files of one kind among {', '.join(sorted(HF_BUILDERS))} (got {', '.join(sorted(exts))})",
                                  "convert the files to one format, e.g. jsonl with a text field")
            inputs.check_hf_files(list(d.paths))
            self._builder = builders.pop()
            files = [(str(p), Path(p).expanduser()) for p in d.paths]
        self._files = files
        return files

    def __len__(self) -> int:
        if self.count is None:
            raise TypeError("the number of documents is known after the first pass")
        return self.count

    def __iter__(self) -> Iterator[tuple[str, str]]:
        max_bytes = self.cfg.data.max_bytes
        total = 0
        for name, text in (self._stdlib() if self.cfg.data.source == "stdlib" else self._hf()):
            yield name, text
            total += len(text.encode("utf-8"))
            if max_bytes is not None and total >= max_bytes:
                return

    def _stdlib(self):
        for name, path in self.files():
            # A few stdlib test files are deliberately not UTF-8; replacement keeps the corpus identical everywhere.
            text = path.read_bytes().decode("utf-8", errors="replace")
            if text.strip():
                yield name, text

    def _dataset(self):
        import datasets

        d = self.cfg.data
        if self._ds is not None:
            return self._ds
        files = self.files()
        if files:
            try:
                with inputs.quiet_datasets():
                    self._ds = datasets.load_dataset(self._builder, data_files=[str(p) for _, p in files], split="train")
            except Exception as exc:  # datasets' errors name neither file nor line: find them
                raise inputs.explain_hf_read_error(list(d.paths), self._builder, exc) from None
        elif d.hf_name:
            if not Path(d.hf_name).expanduser().is_dir():   # a local dataset directory needs no hub
                inputs.check_hub_reachable(d.hf_name)
            try:
                with inputs.quiet_datasets():
                    self._ds = datasets.load_dataset(d.hf_name, split="train")
            except Exception as exc:  # not found, gated, offline cache miss, bad config name
                raise inputs.hub_load_error(d.hf_name, exc) from None
        else:
            raise ConfigError("data.paths", [], "data=hf needs local files in data.paths or a hub name in data.hf_name",
                              "set data.paths=[/path/a.jsonl] or data.hf_name=NAME")
        if d.text_field not in self._ds.column_names:
            cols = self._ds.column_names
            raise ConfigError("data.text_field", d.text_field, f"is not a column of the dataset (columns: {', '.join(cols)})",
                              f"set data.text_field to one of {', '.join(cols)}")
        return self._ds

    def _hf(self):
        d = self.cfg.data
        ds = self._dataset()
        i = 0
        try:
            # Arrow decodes the strings batch by batch as they are read (a memory-mapped table, not a Python list);
            # a non-UTF-8 byte inside a JSON string surfaces here.
            for batch in ds.select_columns([d.text_field]).iter(batch_size=1024):
                for text in batch[d.text_field]:
                    if isinstance(text, str) and text.strip():
                        yield str(i), text
                    i += 1
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001
            if not d.paths:
                raise inputs.hub_load_error(d.hf_name, exc) from None
            raise inputs.explain_hf_read_error(list(d.paths), self._builder, exc) from None


def _empty_corpus(cfg, key: str) -> ConfigError:
    value = list(cfg.data.paths) or cfg.data.hf_name or sysconfig.get_paths()["stdlib"]
    return ConfigError(key, value, "the corpus is empty: no non-blank documents were found",
                       "point data.paths at files or directories that hold text (data=stdlib reads *.py files)")


def read_documents(cfg) -> list[tuple[str, str]]:
    """The corpus of data=stdlib or data=hf as a list (small corpora, benchmarks); prepare_data streams it instead."""
    docs = Documents(cfg)
    out = list(docs)
    if not out:
        raise _empty_corpus(cfg, docs.key)
    return out


def _hash_and_count(docs) -> tuple[str, int]:
    h = hashlib.sha256(FORMAT_VERSION.encode())
    n = 0
    for name, text in docs:
        h.update(name.encode() + b"\0" + text.encode("utf-8") + b"\0")
        n += 1
    return h.hexdigest(), n


def corpus_hash(docs) -> str:
    return _hash_and_count(docs)[0]


# ----------------------------------------------------------------------------- tokenizer


@contextlib.contextmanager
def _locked(cache: Path, key: str):
    """An exclusive lock per cache key: concurrent ranks build once, the others wait and reuse."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{key}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def train_tokenizer(docs: list[tuple[str, str]], vocab_size: int):
    """A byte-level BPE (GPT-2 style: Radford et al. 2019, section 2.2) with EOS as token 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((text for _, text in docs), trainer=trainer)
    return tok


def _eos_id(tok, path: str) -> int:
    for name in EOS_CANDIDATES:
        idx = tok.token_to_id(name)
        if idx is not None:
            return idx
    raise ConfigError("data.tokenizer_path", path, f"the tokenizer has no end-of-document token ({', '.join(EOS_CANDIDATES)})",
                      "add one of them as a special token, or leave data.tokenizer_path=null to train one")


def tokenizer_location(cfg) -> Optional[Path]:
    """data.tokenizer_path as a local path (a hub name: its snapshot in the local HF cache), or None."""
    from launcher.config.hubcache import local_path

    value = cfg.data.tokenizer_path
    return Path(str(local_path("data.tokenizer_path", value))).expanduser() if value else None


def build_tokenizer(cfg, docs, chash: str, cache: Path, console=None) -> tuple[Path, object]:
    """The tokenizer file for this corpus and vocab size: the user's, or a cached / freshly trained BPE."""
    from tokenizers import Tokenizer
    import tokenizers

    vocab = cfg.model.vocab_size
    where = tokenizer_location(cfg)
    if where is not None and where.is_dir():
        return _pretrained_tokenizer(cfg, where, cache)
    if where is not None:
        path = where
        tok = inputs.load_tokenizer_file(path)
        if tok.get_vocab_size() != vocab:
            raise ConfigError("data.tokenizer_path", str(path),
                              f"the tokenizer has {tok.get_vocab_size()} tokens but model.vocab_size = {vocab}",
                              f"set model.vocab_size={tok.get_vocab_size()}, or use a tokenizer of {vocab} tokens")
        return path, tok
    key = hashlib.sha256(f"{chash}|bpe|{vocab}|{tokenizers.__version__}".encode()).hexdigest()[:16]
    path = cache / f"tokenizer-{key}.json"
    with _locked(cache, f"tokenizer-{key}"):
        if not path.exists():
            if console is not None:
                console.print(f"training a byte-level BPE of {vocab} tokens on {len(docs)} documents -> {path}")
            tok = train_tokenizer(docs, vocab)
            if tok.get_vocab_size() != vocab:
                raise ConfigError("model.vocab_size", vocab,
                                  f"the corpus only supports a BPE of {tok.get_vocab_size()} tokens (too little text for {vocab} merges)",
                                  f"set model.vocab_size={tok.get_vocab_size()} or use a larger corpus (data.max_bytes=null)")
            write_atomic(path, tok.to_str().encode())
    return path, Tokenizer.from_file(str(path))


def _pretrained_tokenizer(cfg, path: Path, cache: Path) -> tuple[Path, object]:
    """A transformers tokenizer directory (a model's own: Llama 3's tiktoken-based BPE, Mistral's sentencepiece,
    Qwen2's BPE) through AutoTokenizer, read locally only. Its fast backend (tokenizers.Tokenizer, the one
    tokenizer.json that encodes exactly as the model's tokenizer, BOS post-processor included) is what the run
    tokenizes with and what the checkpoints carry; the directory's tokenizer_config.json goes into the export
    (launcher/runtime/model.py, hf_meta). A tokenizer larger than the embedding is refused (ids >= vocab_size
    fail inside every rank); a smaller one is normal (Qwen2.5: 151,665 tokens, 152,064 rows, padded for speed)."""
    from tokenizers import Tokenizer

    tok = inputs.load_tokenizer_dir(path)
    n, vocab = len(tok), cfg.model.vocab_size
    if n > vocab:
        raise ConfigError("data.tokenizer_path", str(path),
                          f"the tokenizer has {n} tokens (with its added tokens) but model.vocab_size = {vocab}: ids "
                          f"{vocab}..{n - 1} would index past the embedding",
                          f"set model.vocab_size >= {n} (the model's own config.json value), or use this model's tokenizer")
    text = tok.backend_tokenizer.to_str()
    out = cache / f"tokenizer-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        write_atomic(out, text.encode())
    return out, Tokenizer.from_str(text)

# ----------------------------------------------------------------------------- manifest (warm starts read no raw data)


def _stat_identity(path: Path) -> list:
    """Path, size and mtime of a file, or of each file directly in a directory (a tokenizer directory)."""
    path = path.expanduser()
    if path.is_dir():
        return [_stat_identity(p) for p in sorted(path.iterdir()) if p.is_file()]
    if not path.exists():
        return [str(path), None]
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def _file_stat(name: str, path: Path) -> list:
    st = os.stat(path)
    return [name, str(path), st.st_size, st.st_mtime_ns]


def _manifest_key(cfg, docs: Documents) -> Optional[str]:
    """What decides the packed files without reading them: the corpus files' identities (stat), the tokenizer's,
    and every setting the packing depends on. A data.hf_name dataset is known by its cache files (_hub_identity);
    None when it has none (an in-memory dataset: hashed at each start).

    Size + mtime_ns is the check make, rsync and ccache (its "direct mode" also hashes) use; a file rewritten
    with the same size within the filesystem's timestamp granularity would be missed, as it is by them.
    """
    d = cfg.data
    if d.source == "hf" and not d.paths:
        files = _hub_identity(cfg, docs) if d.hf_name else None
        if files is None:
            return None
    else:
        files = [_file_stat(name, path) for name, path in docs.files()]
    if d.tokenizer_path:
        tok = ["file", _stat_identity(tokenizer_location(cfg))]
    else:
        import tokenizers

        tok = ["bpe", cfg.model.vocab_size, tokenizers.__version__]
    settings = {"format": FORMAT_VERSION, "source": d.source, "max_bytes": d.max_bytes, "text_field": d.text_field if d.source == "hf" else None,
                "vocab_size": cfg.model.vocab_size, "tokenizer": tok, "val_fraction": d.val_fraction, "split_seed": d.split_seed,
                "files": files}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _hub_identity(cfg, docs: Documents) -> Optional[list]:
    """A data.hf_name dataset's identity by stat (launcher/runtime/hubdata.py): from the pointer a cold start
    wrote, else by loading the dataset (the cold start, which reads it anyway) and writing that pointer."""
    from launcher.runtime import hubdata

    cache = Path(cfg.data.cache_dir).expanduser()
    source, ident = hubdata.cached_identity(cache, cfg.data.hf_name)
    if ident is None:
        ident = hubdata.record_identity(cache, cfg.data.hf_name, source, docs._dataset())
    return None if ident is None else ["hf_name", source, ident]


def _read_manifest(path: Path) -> Optional[tuple[Path, dict]]:
    """(packed file, its index) when the manifest and every file it names are intact, else None (rebuild)."""
    try:
        m = json.loads(path.read_text())
        bin_path = Path(m["bin_path"])
        index = json.loads(index_path(bin_path).read_text())
        if bin_path.stat().st_size != index["num_tokens"] * np.dtype(index["dtype"]).itemsize:
            return None
        if index.get("val_bin") and not bin_path.with_name(index["val_bin"]).is_file():
            return None
        if m.get("tokenizer_path") and not Path(m["tokenizer_path"]).exists():
            return None
        return bin_path, dict(index, tokenizer_path=m.get("tokenizer_path"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _content_hash(path: Path) -> str:
    path = Path(path)
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(path.iterdir()):
            if p.is_file():
                h.update(p.name.encode() + b"\0" + p.read_bytes())
        return h.hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- packed tokens


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


def index_path(bin_path: Path) -> Path:
    return bin_path.with_name(bin_path.name[: -len(".bin")] + ".idx.json") if bin_path.name.endswith(".bin") else bin_path.with_name(bin_path.name + ".idx.json")


M64 = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (Steele, Lea & Flood 2014): a bijective, well-avalanched hash."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _key(*parts: int) -> np.uint64:
    h = np.zeros(1, dtype=np.uint64)
    for p in parts:
        h = _mix(h ^ np.uint64(int(p) & M64))
    return h[0]


def _unit(key: np.uint64, idx: np.ndarray) -> np.ndarray:
    """A uniform [0, 1) per index, a pure function of (key, index): 53 bits of a keyed hash."""
    return (_mix(np.asarray(idx, dtype=np.uint64) ^ key) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _permute(idx, n: int, key: np.uint64) -> np.ndarray:
    """P(idx) for a keyed pseudo-random permutation P of [0, n), without materialising it.

    A balanced Feistel network on the smallest even number of bits 2h with 2^2h >= n, cycle-walked back into
    [0, n) (Black & Rogaway 2002, "Ciphers with Arbitrary Finite Domains", section 3): re-applying a bijection of
    [0, 2^2h) until the value lands below n is a bijection of [0, n); 2^2h < 4n, so < 4 walks are expected.
    """
    idx = np.asarray(idx, dtype=np.uint64)
    if n <= 1:
        return np.zeros(idx.shape, dtype=np.int64)
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)
    round_keys = [_key(int(key), r) for r in range(FEISTEL_ROUNDS)]
    out = idx.copy()
    todo = np.ones(out.shape, dtype=bool)
    while todo.any():
        left, right = out[todo] >> shift, out[todo] & mask
        for rk in round_keys:
            left, right = right, left ^ (_mix(right ^ rk) & mask)
        out[todo] = (left << shift) | right
        todo = out >= np.uint64(n)
    return out.astype(np.int64)


def held_out_rule(num_docs: int, fraction: float, seed: int):
    """mask(doc indices) -> which documents are held out: each with probability `fraction`, keyed by (seed, index).

    At least one when fraction > 0 (the one with the smallest draw), so a small corpus still has a val set.
    """
    key = _key(0x5EED, seed)
    forced = -1
    if fraction > 0:
        lowest, arg = 2.0, -1
        for start in range(0, num_docs, 1 << 20):  # blocks: bounded memory at any number of documents
            u = _unit(key, np.arange(start, min(num_docs, start + (1 << 20))))
            if (u < fraction).any():
                arg = -1
                break
            j = int(u.argmin())
            if u[j] < lowest:
                lowest, arg = float(u[j]), start + j
        forced = arg

    def mask(idx: np.ndarray) -> np.ndarray:
        m = _unit(key, idx) < fraction
        if forced >= 0:
            m |= idx == forced
        return m

    return mask


_WORKER_TOK = None


def _worker_init(tok) -> None:
    global _WORKER_TOK
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker process: the processes are the parallelism
    _WORKER_TOK = tok


def _encode_chunk(texts: list[str], eos_id: int, tok=None) -> tuple[np.ndarray, np.ndarray]:
    """Ids of each text followed by EOS, concatenated (uint32), and the per-document lengths."""
    tok = tok or _WORKER_TOK
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets needed: faster where available
    ids, lengths = [], []
    for enc in encode(texts):
        ids.extend(enc.ids)
        ids.append(eos_id)
        lengths.append(len(enc.ids) + 1)
    return np.asarray(ids, dtype=np.uint32), np.asarray(lengths, dtype=np.int64)


def _chunks(docs) -> Iterator[list[str]]:
    chunk, size = [], 0
    for _, text in docs:
        chunk.append(text)
        size += len(text)
        if len(chunk) >= ENCODE_CHUNK_DOCS or size >= ENCODE_CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _encoded(docs, tok, eos_id: int, workers: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(documents in chunk, ids, lengths) per chunk, in corpus order; with workers > 1, in that many processes.

    At most 2 x workers chunks are in flight (Pool.imap would read the whole corpus ahead into its queue).
    Processes are spawned, not forked: a fork after the tokenizer's Rust thread pool has run can deadlock
    (tokenizers disables its parallelism in forked children and warns for that reason).
    """
    if workers <= 1:
        for texts in _chunks(docs):
            yield (len(texts), *_encode_chunk(texts, eos_id, tok))
        return
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers, initializer=_worker_init, initargs=(tok,)) as pool:
        pending: deque = deque()
        for texts in _chunks(docs):
            pending.append((len(texts), pool.apply_async(_encode_chunk, (texts, eos_id))))
            if len(pending) >= 2 * workers:
                n, res = pending.popleft()
                yield (n, *res.get())
        while pending:
            n, res = pending.popleft()
            yield (n, *res.get())


class _PackedWriter:
    """One packed token file being written: a temporary name until done, then renamed; doc offsets streamed too."""

    def __init__(self, path: Path, dtype: str):
        self.path, self.dtype = path, np.dtype(dtype)
        self.tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        self.offsets_tmp = path.with_name(path.name + f".docs.tmp{os.getpid()}")
        self.out, self.offsets = open(self.tmp, "wb"), open(self.offsets_tmp, "wb")
        self.n = 0
        self.docs = 0
        self.offsets.write(np.zeros(1, dtype=np.int64).tobytes())

    def write(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        self.out.write(ids.astype(self.dtype, copy=False).tobytes())
        self.offsets.write((self.n + np.cumsum(lengths)).astype(np.int64).tobytes())
        self.n += int(lengths.sum())
        self.docs += len(lengths)

    def finish(self) -> None:
        for fh in (self.out, self.offsets):
            fh.flush()
            os.fsync(fh.fileno())  # the index (written last, atomically) must never name tokens that are not on disk
            fh.close()
        os.replace(self.tmp, self.path)
        # Document boundaries as .npy, copied in blocks from the raw stream (never one array of every offset).
        raw = np.memmap(self.offsets_tmp, dtype=np.int64, mode="r")
        out_path = self.path.with_name(self.path.name + ".docs.npy")
        tmp = out_path.with_name(out_path.name + f".tmp{os.getpid()}.npy")
        npy = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=raw.shape)
        for s in range(0, len(raw), 1 << 22):
            npy[s:s + (1 << 22)] = raw[s:s + (1 << 22)]
        npy.flush()
        del npy, raw
        os.replace(tmp, out_path)
        os.unlink(self.offsets_tmp)

    def abort(self) -> None:
        for fh, p in ((self.out, self.tmp), (self.offsets, self.offsets_tmp)):
            fh.close()
            with contextlib.suppress(OSError):
                os.unlink(p)


def pretokenize(docs, tok, eos_id: int, bin_path: Path, dtype: str, progress: bool, meta: dict, workers: int = 1,
                val_fraction: float = 0.0, split_seed: int = 0) -> dict:
    """Encode every document (in `workers` processes), append EOS, route it to the train file or, when it is one
    of the held-out documents, to the val file, and write both and the index atomically."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    total_docs = len(docs)
    held_out = held_out_rule(total_docs, val_fraction, split_seed)
    val_path = bin_path.with_name(bin_path.name[: -len(".bin")] + ".val.bin")
    train, val = _PackedWriter(bin_path, dtype), (_PackedWriter(val_path, dtype) if val_fraction > 0 else None)
    max_id = eos_id  # recorded in the index: data=tokens checks ids < vocab_size without reading the file again
    columns = (TextColumn(f"pretokenizing ({workers} process{'es' if workers > 1 else ''})"), BarColumn(), MofNCompleteColumn(),
               TextColumn("docs"), TimeElapsedColumn(), TimeRemainingColumn())
    done = 0
    try:
        with Progress(*columns, disable=not progress, transient=True) as bar:
            task = bar.add_task("tokenize", total=total_docs)
            for n, ids, lengths in _encoded(docs, tok, eos_id, workers):
                if len(ids):
                    max_id = max(max_id, int(ids.max()))
                to_val = held_out(np.arange(done, done + n)) if val is not None else np.zeros(n, dtype=bool)
                if not to_val.any():
                    train.write(ids, lengths)
                else:
                    ends = np.cumsum(lengths)
                    starts = ends - lengths
                    for is_val, a, b, k in zip(to_val, starts, ends, range(n)):
                        (val if is_val else train).write(ids[a:b], lengths[k:k + 1])
                done += n
                bar.advance(task, n)
        train.finish()
        if val is not None:
            val.finish()
    except BaseException:
        train.abort()
        if val is not None:
            val.abort()
        raise
    index = dict(meta, format=FORMAT_VERSION, dtype=dtype, num_tokens=train.n, num_docs=train.docs, eos_id=eos_id, max_id=max_id,
                 val_bin=val_path.name if val is not None else None, val_num_tokens=val.n if val is not None else 0,
                 val_num_docs=val.docs if val is not None else 0, val_fraction=val_fraction, split_seed=split_seed)
    write_atomic(index_path(bin_path), json.dumps(index, indent=2).encode())
    return index


# ----------------------------------------------------------------------------- samples and splits


def _not_enough(key, value, num_tokens: int, seq: int, train: int, val: int, gbs: int) -> ConfigError:
    need = (gbs + val) * seq
    return ConfigError(key, value,
                       f"has {num_tokens:,} tokens = {train + val} samples of data.seq_length {seq} ({val} held out for eval), "
                       f"fewer than one global batch of {gbs} samples: need at least (global_batch_size + val samples) x seq_length "
                       f"= ({gbs} + {val}) x {seq} = {need:,} tokens",
                       "use a larger corpus (raise data.max_bytes or add files), or lower batch.global_batch_size / data.seq_length")


def _tail_split(cfg, num_tokens: int, seq: int) -> tuple[int, int]:
    """(train, val) samples of a token file without held-out documents: the last val_fraction of its samples."""
    frac = cfg.data.val_fraction
    if not 0.0 <= frac < 1.0:
        raise ConfigError("data.val_fraction", frac, "must be in [0, 1)", "use e.g. data.val_fraction=0.01")
    total = num_tokens // seq
    val = 0 if frac == 0 else max(1, int(round(total * frac)))
    return total - val, val


def _split(cfg, layout, f: dict, key: str, value) -> tuple[int, int]:
    """(train samples, val samples) of one token file, or a ConfigError saying how many tokens one global batch needs."""
    seq = layout.seq_length
    if f.get("val_path"):
        train, val = f["num_tokens"] // seq, f["val_num_tokens"] // seq
        if cfg.data.val_fraction > 0 and val == 0:
            raise ConfigError("data.val_fraction", cfg.data.val_fraction,
                              f"the held-out documents hold {f['val_num_tokens']:,} tokens, fewer than one sample of "
                              f"data.seq_length {seq}", "raise data.val_fraction, or use a larger corpus (data.max_bytes)")
        total_tokens = f["num_tokens"] + f["val_num_tokens"]
    else:
        train, val = _tail_split(cfg, f["num_tokens"], seq)
        total_tokens = f["num_tokens"]
    if train < layout.global_batch_size:
        raise _not_enough(key, value, total_tokens, seq, train, val, layout.global_batch_size)
    return train, val


# ----------------------------------------------------------------------------- token files (data=tokens, data=blend)


def open_token_file(cfg, path: str, key: str) -> dict:
    """Which format a token file is, checked (sizes, header, largest id < vocab_size) without reading it whole:
    ours (x.bin + x.idx.json), Megatron's (prefix.bin + prefix.idx, given as either), or a flat array of ids."""
    p = Path(path).expanduser()
    vocab = cfg.model.vocab_size
    cache = Path(cfg.data.cache_dir)
    if p.name.endswith(".bin") and p.is_file() and index_path(p).is_file():
        index = inputs.read_token_index(p, index_path(p), key)
        if index.get("vocab_size") != vocab:
            raise ConfigError(key, str(p), f"the tokens were made with a tokenizer of {index.get('vocab_size')} tokens but "
                              f"model.vocab_size = {vocab}", f"set model.vocab_size={index.get('vocab_size')}")
        inputs.check_token_file(p, index, vocab, cache, key)
        val_path = p.with_name(index["val_bin"]) if index.get("val_bin") else None
        want = index.get("val_num_tokens", 0) * np.dtype(index["dtype"]).itemsize
        if val_path is not None and (not val_path.is_file() or val_path.stat().st_size != want):
            raise ConfigError(key, str(p), f"its held-out documents {val_path.name} are missing or not the size the index says",
                              "copy the token file together with its .val.bin and .idx.json")
        tok = index.get("tokenizer_path")
        return {"path": str(p), "format": "launcher", "dtype": index["dtype"], "num_tokens": index["num_tokens"],
                "eos_id": index["eos_id"], "vocab_size": index["vocab_size"], "tokenizer_path": tok if tok and Path(tok).exists() else None,
                "val_path": str(val_path) if val_path else None, "val_num_tokens": index.get("val_num_tokens", 0)}
    prefix = p.with_name(p.name[: -len(".bin")]) if p.name.endswith(".bin") else p
    mbin, midx = prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx")
    if mbin.is_file() and midx.is_file():
        p, index = mbin, inputs.read_megatron_index(mbin, midx, key)
    elif p.is_file():
        index = inputs.flat_token_index(p, cfg.data.token_dtype, key)
    else:
        raise ConfigError(key, path, f"does not exist; a token file is read with its index, so it needs both the token file and its "
                          f"index ({index_path(mbin).name} beside ours, {midx.name} beside Megatron's; a flat .bin needs none)",
                          "give a token file: ours (x.bin + x.idx.json, written by a run's pretokenization), Megatron's "
                          "(prefix.bin + prefix.idx) or a flat .bin with data.token_dtype")
    top = inputs.max_token_id(p, index, cache)  # one scan per file, cached by path, size and mtime
    if top >= vocab:
        raise ConfigError(key, str(p), f"holds token id {top}, but model.vocab_size = {vocab} (ids must be < vocab_size: the "
                          f"embedding has {vocab} rows)", f"set model.vocab_size >= {top + 1} (the tokenizer's size)")
    return {"path": str(p), "format": index["format"], "dtype": index["dtype"], "num_tokens": index["num_tokens"], "eos_id": -1,
            "vocab_size": vocab, "tokenizer_path": None, "val_path": None, "val_num_tokens": 0}


def _tokens_source(cfg, layout) -> PreparedData:
    d = cfg.data
    if not d.tokens_path:
        raise ConfigError("data.tokens_path", d.tokens_path, "data=tokens needs the path of a packed *.bin file", "set data.tokens_path=/path/tokens.bin")
    f = open_token_file(cfg, d.tokens_path, "data.tokens_path")
    train, val = _split(cfg, layout, f, "data.tokens_path", f["path"])
    return PreparedData(f["path"], f["tokenizer_path"], f["dtype"], f["num_tokens"], f["vocab_size"], f["eos_id"], layout.seq_length,
                        train, val, "tokens", f["val_path"], f["val_num_tokens"], f["format"])


def raw_corpus(path: str) -> Optional[dict]:
    """The data.* settings that read a blend source as a raw corpus, or None for a token file: a .json/.jsonl/
    .parquet/.txt/.csv file (as data=hf data.paths reads it), a directory holding such files (as data.hf_name
    reads a local dataset directory), or a directory of .py files (as data=stdlib data.paths reads it)."""
    p = Path(path).expanduser()
    if p.is_dir():
        if any(f.suffix.lower() in HF_BUILDERS for f in p.rglob("*") if f.is_file()):
            return {"source": "hf", "paths": [], "hf_name": str(p)}
        return {"source": "stdlib", "paths": [str(p)], "hf_name": None}
    if p.suffix.lower() in HF_BUILDERS:
        return {"source": "hf", "paths": [str(p)], "hf_name": None}
    return None


def _raw_source(cfg, i: int, raw: dict, tokenizer: str, progress: bool, console) -> str:
    """Pretokenize blend source i (a raw corpus) with the run's tokenizer into the cache, as a data=stdlib/hf run
    would (manifest included: a warm start stats it only), and return its token file (ours, with held-out documents)."""
    from omegaconf import OmegaConf

    sub = OmegaConf.to_container(cfg, resolve=True)
    sub["data"].update(raw, tokenizer_path=tokenizer, sources=[], tokens_path=None)
    path = str(cfg.data.sources[i]["path"])
    try:
        bin_path, _, _ = _packed(OmegaConf.create(sub), progress, console)
    except ConfigError as err:   # the corpus's own keys name this source here
        if err.key in ("data.paths", "data.hf_name", "data.text_field"):
            raise ConfigError(f"data.sources[{i}].path", path, err.rule, err.fix) from None
        raise
    return str(bin_path)


def _blend_tokenizer(cfg, opened: dict, raw: dict) -> str:
    """The tokenizer raw blend sources are tokenized with: data.tokenizer_path, else the one our token-file sources
    were made with (their index names it). Several different ones, or none, is refused."""
    if cfg.data.tokenizer_path:
        return str(cfg.data.tokenizer_path)
    ours = sorted({f["tokenizer_path"] for f in opened.values() if f.get("tokenizer_path")})
    if len(ours) == 1:
        return ours[0]
    i = min(raw)
    raise ConfigError("data.tokenizer_path", cfg.data.tokenizer_path,
                      f"data.sources[{i}].path = {cfg.data.sources[i]['path']} is a raw corpus, tokenized with the run's tokenizer "
                      f"before it is blended, and there is " + ("none: no token file among the sources names one" if not ours else
                                                              f"no single one: the token files were made with {', '.join(ours)}"),
                      "set data.tokenizer_path to the tokenizer the token-file sources were made with (a tokenizer.json or a "
                      "model directory)")


def _blend_source(cfg, layout, progress: bool = False, console=None) -> PreparedData:
    seq = layout.seq_length
    raw = {i: r for i, src in enumerate(cfg.data.sources) if (r := raw_corpus(str(src["path"]))) is not None}
    opened = {i: open_token_file(cfg, str(src["path"]), f"data.sources[{i}].path")
              for i, src in enumerate(cfg.data.sources) if i not in raw}
    if raw:
        tokenizer = _blend_tokenizer(cfg, opened, raw)
        for i, r in sorted(raw.items()):
            opened[i] = open_token_file(cfg, _raw_source(cfg, i, r, tokenizer, progress, console), f"data.sources[{i}].path")
    parts = []
    for i, src in enumerate(cfg.data.sources):
        key = f"data.sources[{i}].path"
        f = opened[i]
        if f["val_path"]:
            train, val = f["num_tokens"] // seq, f["val_num_tokens"] // seq
        else:
            train, val = _tail_split(cfg, f["num_tokens"], seq)
        if train < 1 or (cfg.data.val_fraction > 0 and val < 1):
            raise ConfigError(key, str(src["path"]), f"has {f['num_tokens']:,} tokens = {f['num_tokens'] // seq} samples of data.seq_length "
                              f"{seq}; a blend source needs >= 1 train sample{' and >= 1 held-out sample' if cfg.data.val_fraction > 0 else ''}",
                              "use a larger file, or lower data.seq_length")
        parts.append(dict(f, weight=float(src["weight"]), train_samples=train, val_samples=val,
                          **({"corpus": str(src["path"])} if i in raw else {})))
    first = parts[0]
    eos = {p["eos_id"] for p in parts}
    return PreparedData(first["path"], next((p["tokenizer_path"] for p in parts if p["tokenizer_path"]), None), first["dtype"],
                        sum(p["num_tokens"] for p in parts), cfg.model.vocab_size, eos.pop() if len(eos) == 1 else -1, seq,
                        sum(p["train_samples"] for p in parts), sum(p["val_samples"] for p in parts), "blend",
                        format="blend", blend=tuple(parts))


def prepare_data(cfg, layout, progress: bool = False, console=None) -> PreparedData:
    """Tokenizer and packed tokens for `cfg`, built once and cached under data.cache_dir."""
    if cfg.data.source == "tokens":
        return _eos_known(cfg, _tokens_source(cfg, layout))
    if cfg.data.source == "blend":
        return _eos_known(cfg, _blend_source(cfg, layout, progress, console))
    if cfg.data.source not in ("stdlib", "hf"):
        raise ConfigError("data.source", cfg.data.source, "must be stdlib, hf, tokens or blend", "select data=stdlib, data=hf, data=tokens or data=blend")
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise ConfigError("data.val_fraction", cfg.data.val_fraction, "must be in [0, 1)", "use e.g. data.val_fraction=0.01")
    if cfg.data.source == "hf" and getattr(cfg.data, "streaming", False):
        from launcher.runtime.stream import prepare_stream  # no packed files: tokenized in the ranks (stream.py)

        return prepare_stream(cfg, layout)
    bin_path, index, docs = _packed(cfg, progress, console)
    val_bin = bin_path.with_name(index["val_bin"]) if index.get("val_bin") else None
    f = {"num_tokens": index["num_tokens"], "val_path": str(val_bin) if val_bin else None, "val_num_tokens": index.get("val_num_tokens", 0)}
    key_name, key_value = docs.key, list(cfg.data.paths) or (cfg.data.hf_name if cfg.data.source == "hf" else "stdlib")
    if cfg.data.max_bytes is not None:
        key_name, key_value = "data.max_bytes", cfg.data.max_bytes
    train, val = _split(cfg, layout, f, key_name, key_value)
    return PreparedData(str(bin_path), index["tokenizer_path"], index["dtype"], index["num_tokens"], cfg.model.vocab_size, index["eos_id"],
                        layout.seq_length, train, val, cfg.data.source, f["val_path"], f["val_num_tokens"], "launcher")


def _packed(cfg, progress: bool, console) -> tuple[Path, dict, Documents]:
    """The packed files of a data=stdlib/hf corpus: found through the manifest (a warm start: stat only), else built."""
    cache = Path(cfg.data.cache_dir).expanduser()
    inputs.check_writable_dir("data.cache_dir", cfg.data.cache_dir)
    docs = Documents(cfg)
    mkey = _manifest_key(cfg, docs)
    manifest = cache / f"manifest-{mkey}.json" if mkey else None
    found = _read_manifest(manifest) if manifest else None
    if found is None:
        lock = _locked(cache, f"manifest-{mkey}") if mkey else contextlib.nullcontext()
        with lock:  # the first process builds; the others wait here and then find the manifest
            found = _read_manifest(manifest) if manifest else None
            if found is None:
                found = _build_packed(cfg, docs, cache, progress, console)
                if manifest is not None:
                    write_atomic(manifest, json.dumps({"bin_path": str(found[0]), "tokenizer_path": found[1]["tokenizer_path"]}, indent=2).encode())
    return found[0], found[1], docs


def _eos_known(cfg, prepared: PreparedData) -> PreparedData:
    """data.document_mask cuts samples at the EOS id: refuse token files that do not say which id it is."""
    if getattr(cfg.data, "document_mask", False) and prepared.eos_id < 0:
        files = [p["path"] for p in prepared.blend] if prepared.blend else [prepared.bin_path]
        why = ("the blend's sources name different EOS ids or none" if prepared.blend
               else f"a {prepared.format} token file carries no EOS id (only our .idx.json records it)")
        raise ConfigError("data.document_mask", True,
                          f"needs the id of the end-of-document token to find document boundaries, and {why} "
                          f"({', '.join(files)})",
                          "set data.document_mask=false, or pretokenize the corpus with data=stdlib/hf (our token files "
                          "record their EOS id) and read those files")
    return prepared


def _build_packed(cfg, docs: Documents, cache: Path, progress: bool, console) -> tuple[Path, dict]:
    """The cold path: hash the corpus (one streaming pass), get the tokenizer, pretokenize (cached by content)."""
    chash, count = _hash_and_count(docs)
    if count == 0:
        raise _empty_corpus(cfg, docs.key)
    docs.count = count
    tok_path, tok = build_tokenizer(cfg, docs, chash, cache, console)
    eos_id = _eos_id(tok, str(tok_path))
    dtype = token_dtype(cfg.model.vocab_size)
    d = cfg.data
    key = hashlib.sha256(f"{chash}|{_content_hash(Path(tok_path))}|{dtype}|{FORMAT_VERSION}|{d.val_fraction}|{d.split_seed}".encode()).hexdigest()[:16]
    bin_path = cache / f"tokens-{key}.bin"
    with _locked(cache, f"tokens-{key}"):
        found = _packed_files(bin_path)
        if found is None:
            if console is not None and progress:
                console.print(f"pretokenizing {count:,} documents in {d.num_workers} process(es) -> {bin_path}")
            meta = {"vocab_size": cfg.model.vocab_size, "tokenizer_path": str(tok_path), "corpus_sha256": chash, "source": d.source}
            index = pretokenize(docs, tok, eos_id, bin_path, dtype, progress, meta, d.num_workers, d.val_fraction, d.split_seed)
            found = bin_path, index
    return found[0], dict(found[1], tokenizer_path=str(tok_path))


def _packed_files(bin_path: Path) -> Optional[tuple[Path, dict]]:
    idx = index_path(bin_path)
    if not (bin_path.exists() and idx.exists()):
        return None
    index = json.loads(idx.read_text())
    if index.get("val_bin") and not bin_path.with_name(index["val_bin"]).exists():
        return None
    return bin_path, index


# ----------------------------------------------------------------------------- batches


class _Stream:
    """One memory-mapped token file cut into samples: rows [0, train) train, then the held-out rows."""

    def __init__(self, path: str, dtype: str, num_tokens: int, train: int, val: int, seq: int, val_path: Optional[str], val_tokens: int):
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r", shape=(num_tokens,))
        self.val_tokens = np.memmap(val_path, dtype=np.dtype(dtype), mode="r", shape=(val_tokens,)) if val_path and val_tokens else None
        self.train, self.val, self.seq = train, val, seq

    def train_row(self, j: int) -> np.ndarray:
        return self.tokens[j * self.seq:(j + 1) * self.seq]

    def val_row(self, k: int) -> np.ndarray:
        if self.val_tokens is not None:
            return self.val_tokens[k * self.seq:(k + 1) * self.seq]
        return self.train_row(self.train + k)  # a token file's held-out samples are its last ones


def train_slots(step: int, micro_step: int, gbs: int, micro: int, dp: int, dp_rank: int) -> range:
    """Global sample slots of DP rank `dp_rank`'s micro-batch `micro_step` of optimizer step `step` (0-based): a
    global batch of `gbs` slots is ordered micro-step, then DP rank, then sample. The one rule every data path
    splits a global batch by (TokenBatches, runtime/stream.py's StreamBatches)."""
    first = step * gbs + micro_step * micro * dp + dp_rank * micro
    return range(first, first + micro)


def val_slots(batch: int, micro: int, dp: int, dp_rank: int) -> range:
    """Held-out slots of eval micro-batch `batch` of DP rank `dp_rank`: eval batch b is slots [b dp micro, (b+1) dp micro)."""
    first = (batch * dp + dp_rank) * micro
    return range(first, first + micro)


def slot_dp_rank(g: int, gbs: int, micro: int, dp: int) -> int:
    """The DP rank train_slots gives slot g (val_slots' owner too, with gbs = micro x dp)."""
    return ((g % gbs) // micro) % dp


class TokenBatches:
    """Deterministic, disjoint per-DP-rank batches over memory-mapped token files.

    Sample ids: [0, train_samples) are training samples (a blend numbers its sources' one after another),
    [train_samples, train_samples + val_samples) held-out ones.
    """

    def __init__(self, prepared: PreparedData, layout, seed: int, dp_rank: int):
        self.prepared = prepared
        self.seq = prepared.seq_length
        self.micro = layout.micro_batch_size
        self.dp = layout.data_degree
        self.gbs = layout.global_batch_size
        self.dp_rank = dp_rank
        self.seed = seed
        parts = prepared.blend or ({"path": prepared.bin_path, "dtype": prepared.dtype, "num_tokens": prepared.num_tokens,
                                    "train_samples": prepared.train_samples, "val_samples": prepared.val_samples,
                                    "val_path": prepared.val_bin_path, "val_num_tokens": prepared.val_num_tokens, "weight": 1.0},)
        self.streams = [_Stream(p["path"], p["dtype"], p["num_tokens"], p["train_samples"], p["val_samples"], self.seq,
                                p.get("val_path"), p.get("val_num_tokens", 0)) for p in parts]
        self.train_offsets = np.cumsum([0] + [s.train for s in self.streams])
        self.val_offsets = np.cumsum([0] + [s.val for s in self.streams])
        w = np.asarray([p["weight"] for p in parts], dtype=np.float64)
        self.cum_weights = np.cumsum(w / w.sum())
        self.cum_weights[-1] = 1.0
        self.blend_key = _key(seed, 0xB1E4D)
        self._block_counts = [np.zeros(len(self.streams), dtype=np.int64)]  # per source, slots before block b chose it
        self._block: Optional[tuple[int, np.ndarray, np.ndarray]] = None

    # -- blend: which source slot g draws from, and that source's how-many-th draw it is

    def _choices(self, b: int) -> np.ndarray:
        g = np.arange(b * BLEND_BLOCK, (b + 1) * BLEND_BLOCK, dtype=np.uint64)
        return np.searchsorted(self.cum_weights, _unit(self.blend_key, g), side="right")

    def _draw(self, g: int) -> tuple[int, int]:
        """(source, c): slot g draws source i with probability w_i; c = earlier slots that drew i.

        Counts at block starts are accumulated once up to the block asked for (a resume at slot g evaluates
        g hashes once, ~50 M/s) and kept (n_sources int64 per 2^18 slots); the current block is cached.
        """
        b, p = divmod(g, BLEND_BLOCK)
        while len(self._block_counts) <= b:
            last = len(self._block_counts) - 1
            self._block_counts.append(self._block_counts[last] + np.bincount(self._choices(last), minlength=len(self.streams)))
        if self._block is None or self._block[0] != b:
            ch = self._choices(b)
            rank = np.empty(BLEND_BLOCK, dtype=np.int64)
            for i in range(len(self.streams)):
                m = ch == i
                rank[m] = np.arange(int(m.sum()))
            self._block = (b, ch, rank)
        _, ch, rank = self._block
        i = int(ch[p])
        return i, int(self._block_counts[b][i] + rank[p])

    def _samples(self, slots: np.ndarray) -> np.ndarray:
        """Sample ids of global slots, one permutation evaluation per (source, epoch) present (usually one)."""
        if len(self.streams) == 1:
            src, count = np.zeros(len(slots), dtype=np.int64), slots
        else:
            draws = [self._draw(int(g)) for g in slots]
            src = np.asarray([d[0] for d in draws], dtype=np.int64)
            count = np.asarray([d[1] for d in draws], dtype=np.int64)
        out = np.empty(len(slots), dtype=np.int64)
        for i in np.unique(src):
            s = self.streams[i].train
            sel = src == i
            epochs = count[sel] // s
            ids = np.empty(int(sel.sum()), dtype=np.int64)
            for e in np.unique(epochs):
                m = epochs == e
                # single stream: keyed by (seed, epoch), as the tests of one file pin; blend: by (seed, source, epoch)
                key = _key(self.seed, int(e)) if len(self.streams) == 1 else _key(self.seed, int(i), int(e))
                ids[m] = _permute(count[sel][m] % s, s, key)
            out[sel] = ids + int(self.train_offsets[i])
        return out

    def train_sample_ids(self, step: int, micro_step: int) -> list[int]:
        """Sample ids of this rank's micro-batch `micro_step` of optimizer step `step` (0-based)."""
        slots = train_slots(step, micro_step, self.gbs, self.micro, self.dp, self.dp_rank)
        return self._samples(np.arange(slots.start, slots.stop, dtype=np.int64)).tolist()

    def val_sample_ids(self, batch: int) -> list[int]:
        """Held-out samples of eval micro-batch `batch`: fixed, disjoint across ranks, wrapping when few."""
        v = max(1, self.prepared.val_samples)
        return [self.prepared.train_samples + (g % v) for g in val_slots(batch, self.micro, self.dp, self.dp_rank)]

    def _row(self, sample: int) -> np.ndarray:
        t = self.prepared.train_samples
        if sample < t:
            i = int(np.searchsorted(self.train_offsets, sample, side="right") - 1)
            return self.streams[i].train_row(sample - int(self.train_offsets[i]))
        k = sample - t
        i = int(np.searchsorted(self.val_offsets, k, side="right") - 1)
        return self.streams[i].val_row(k - int(self.val_offsets[i]))

    def batch(self, sample_ids: list[int]):
        """input_ids (micro, seq) as int64; labels are the same ids (transformers shifts them)."""
        import torch

        rows = np.stack([self._row(i) for i in sample_ids]).astype(np.int64)
        return torch.from_numpy(rows)

    def train_batches(self, step: int, accum: int) -> Iterator:
        for micro_step in range(accum):
            yield self.batch(self.train_sample_ids(step, micro_step))
