"""Corpus -> tokenizer -> packed token file -> per-rank batches.

    documents (stdlib .py files | datasets rows | nothing for data=tokens)
      -> byte-level BPE of model.vocab_size (HF tokenizers), cached by content hash
      -> one packed token file: documents joined with EOS, uint16/uint32,
         memory-mapped, plus an index (<key>.idx.json), cached by content hash
      -> fixed-length samples of data.seq_length tokens; the last val_fraction
         of them are held out for evaluation
      -> sample ids for (step, micro step, dp rank) from a seeded permutation

Batches are a pure function of (seed, step, micro step, dp rank), so a resumed
run sees exactly the batches an uninterrupted run would, and DP ranks read
disjoint samples: the global sample slot of micro-sample i is

    g = step * global_batch + micro_step * (micro * dp) + dp_rank * micro + i

and slot g maps to sample perm_epoch[g mod S], epoch = g div S (S = train
samples, a fresh seeded permutation per epoch). The same slots are used by
every split of one global batch into micro x accum x dp, which is what makes
1 rank x micro 4 and 2 ranks x micro 2 (or micro 1 x accum 4) see the same data.

`prepare_data` raises ConfigError for bad input before any rank starts.
Several processes may call it at once (all ranks under SLURM): a file lock
per cache key makes the first one build and the others reuse.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import sysconfig
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
FORMAT_VERSION = "launcher-packed-v1"
ENCODE_CHUNK_DOCS = 256
HF_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text", ".csv": "csv"}


@dataclass(frozen=True)
class PreparedData:
    """Where the packed tokens and the tokenizer of a run are, and how they split into samples."""

    bin_path: str
    tokenizer_path: Optional[str]
    dtype: str
    num_tokens: int
    vocab_size: int
    eos_id: int
    seq_length: int
    train_samples: int
    val_samples: int
    source: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------- corpus


def _stdlib_documents(cfg) -> tuple[list[tuple[str, str]], str]:
    """(relative path, text) of every .py file, sorted by path; and the key a ConfigError names."""
    roots = [Path(p).expanduser() for p in cfg.data.paths] or [Path(sysconfig.get_paths()["stdlib"])]
    files: list[tuple[str, Path]] = []
    for root in roots:
        if not root.is_dir():
            raise ConfigError("data.paths", str(root), "is not a directory", "give directories holding .py files, or [] for the stdlib")
        for f in root.rglob("*.py"):
            rel = f.relative_to(root)
            # Installed third-party packages are not the standard library and differ between machines.
            if "site-packages" in rel.parts or "dist-packages" in rel.parts:
                continue
            files.append((f"{root.name}/{rel.as_posix()}", f))
    files.sort(key=lambda item: item[0])
    docs = []
    total = 0
    for name, path in files:
        # A few stdlib test files are deliberately not UTF-8; replacement keeps the corpus identical everywhere.
        text = path.read_bytes().decode("utf-8", errors="replace")
        if not text.strip():
            continue
        docs.append((name, text))
        total += len(text.encode("utf-8"))
        if cfg.data.max_bytes is not None and total >= cfg.data.max_bytes:
            break
    return docs, "data.paths"


def _hf_documents(cfg) -> tuple[list[tuple[str, str]], str]:
    import datasets

    d = cfg.data
    if d.paths:
        exts = {Path(p).suffix.lower() for p in d.paths}
        builders = {HF_BUILDERS.get(e) for e in exts}
        if None in builders or len(builders) != 1:
            raise ConfigError("data.paths", list(d.paths), f"needs files of one kind among {', '.join(sorted(HF_BUILDERS))} (got {', '.join(sorted(exts))})",
                              "convert the files to one format, e.g. jsonl with a text field")
        inputs.check_hf_files(list(d.paths))
        builder = builders.pop()
        try:
            with inputs.quiet_datasets():
                ds = datasets.load_dataset(builder, data_files=[str(Path(p).expanduser()) for p in d.paths], split="train")
        except Exception as exc:  # datasets' errors name neither file nor line: find them
            raise inputs.explain_hf_read_error(list(d.paths), builder, exc) from None
    elif d.hf_name:
        inputs.check_hub_reachable(d.hf_name)
        try:
            with inputs.quiet_datasets():
                ds = datasets.load_dataset(d.hf_name, split="train")
        except Exception as exc:  # not found, gated, offline cache miss, bad config name
            raise inputs.hub_load_error(d.hf_name, exc) from None
    else:
        raise ConfigError("data.paths", [], "data=hf needs local files in data.paths or a hub name in data.hf_name",
                          "set data.paths=[/path/a.jsonl] or data.hf_name=NAME")
    if d.text_field not in ds.column_names:
        raise ConfigError("data.text_field", d.text_field, f"is not a column of the dataset (columns: {', '.join(ds.column_names)})",
                          f"set data.text_field to one of {', '.join(ds.column_names)}")
    docs = []
    total = 0
    try:
        # Arrow decodes the strings row by row as they are read, not at load time: a non-UTF-8 byte inside a JSON
        # string surfaces here.
        for i, text in enumerate(ds[d.text_field]):
            if not isinstance(text, str) or not text.strip():
                continue
            docs.append((str(i), text))
            total += len(text.encode("utf-8"))
            if d.max_bytes is not None and total >= d.max_bytes:
                break
    except Exception as exc:  # noqa: BLE001
        if not d.paths:
            raise inputs.hub_load_error(d.hf_name, exc) from None
        raise inputs.explain_hf_read_error(list(d.paths), builder, exc) from None
    return docs, "data.paths" if d.paths else "data.hf_name"


def read_documents(cfg) -> list[tuple[str, str]]:
    """The corpus of data=stdlib or data=hf, in a deterministic order. ConfigError when it is empty."""
    docs, key = _stdlib_documents(cfg) if cfg.data.source == "stdlib" else _hf_documents(cfg)
    if not docs:
        value = list(cfg.data.paths) or cfg.data.hf_name or sysconfig.get_paths()["stdlib"]
        raise ConfigError(key, value, "the corpus is empty: no non-blank documents were found",
                          "point data.paths at files or directories that hold text (data=stdlib reads *.py files)")
    return docs


def corpus_hash(docs: list[tuple[str, str]]) -> str:
    h = hashlib.sha256(FORMAT_VERSION.encode())
    for name, text in docs:
        h.update(name.encode() + b"\0" + text.encode("utf-8") + b"\0")
    return h.hexdigest()


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


def build_tokenizer(cfg, docs, chash: str, cache: Path, console=None) -> tuple[Path, object]:
    """The tokenizer file for this corpus and vocab size: the user's, or a cached / freshly trained BPE."""
    from tokenizers import Tokenizer
    import tokenizers

    vocab = cfg.model.vocab_size
    if cfg.data.tokenizer_path and Path(cfg.data.tokenizer_path).expanduser().is_dir():
        return _pretrained_tokenizer(cfg, Path(cfg.data.tokenizer_path).expanduser(), cache)
    if cfg.data.tokenizer_path:
        path = Path(cfg.data.tokenizer_path).expanduser()
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


# ----------------------------------------------------------------------------- packed tokens


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


def index_path(bin_path: Path) -> Path:
    return bin_path.with_name(bin_path.name[: -len(".bin")] + ".idx.json") if bin_path.name.endswith(".bin") else bin_path.with_name(bin_path.name + ".idx.json")


def pretokenize(docs, tok, eos_id: int, bin_path: Path, dtype: str, progress: bool, meta: dict) -> dict:
    """Encode every document, append EOS, and write the packed file and its index atomically."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    tmp = bin_path.with_name(bin_path.name + f".tmp{os.getpid()}")
    np_dtype = np.dtype(dtype)
    doc_offsets = [0]
    n = 0
    max_id = eos_id  # recorded in the index: data=tokens checks ids < vocab_size without reading the file again
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets needed: faster where available
    columns = (TextColumn("pretokenizing"), BarColumn(), MofNCompleteColumn(), TextColumn("docs"), TimeRemainingColumn())
    with open(tmp, "wb") as out, Progress(*columns, disable=not progress, transient=True) as bar:
        task = bar.add_task("tokenize", total=len(docs))
        for start in range(0, len(docs), ENCODE_CHUNK_DOCS):
            chunk = docs[start:start + ENCODE_CHUNK_DOCS]
            for enc in encode([text for _, text in chunk]):
                ids = np.asarray(enc.ids + [eos_id], dtype=np_dtype)
                max_id = max(max_id, int(ids.max()))
                out.write(ids.tobytes())
                n += len(ids)
                doc_offsets.append(n)
            bar.advance(task, len(chunk))
        out.flush()
        os.fsync(out.fileno())  # the index (written last, atomically) must never name tokens that are not on disk
    os.replace(tmp, bin_path)
    index = dict(meta, format=FORMAT_VERSION, dtype=dtype, num_tokens=n, num_docs=len(docs), eos_id=eos_id, max_id=max_id)
    buf = io.BytesIO()
    np.save(buf, np.asarray(doc_offsets, dtype=np.int64))
    write_atomic(bin_path.with_name(bin_path.name + ".docs.npy"), buf.getvalue())
    write_atomic(index_path(bin_path), json.dumps(index, indent=2).encode())
    return index


def _split(cfg, layout, num_tokens: int, key: str, value) -> tuple[int, int]:
    """(train samples, val samples), or a ConfigError saying how many tokens one global batch needs."""
    seq = layout.seq_length
    total = num_tokens // seq
    frac = cfg.data.val_fraction
    if not 0.0 <= frac < 1.0:
        raise ConfigError("data.val_fraction", frac, "must be in [0, 1)", "use e.g. data.val_fraction=0.01")
    val = 0 if frac == 0 else max(1, int(round(total * frac)))
    train = total - val
    gbs = layout.global_batch_size
    if train < gbs:
        need = (gbs + val) * seq
        raise ConfigError(key, value,
                          f"has {num_tokens:,} tokens = {total} samples of data.seq_length {seq} ({val} held out for eval), "
                          f"fewer than one global batch of {gbs} samples: need at least (global_batch_size + val samples) x seq_length "
                          f"= ({gbs} + {val}) x {seq} = {need:,} tokens",
                          "use a larger corpus (raise data.max_bytes or add files), or lower batch.global_batch_size / data.seq_length")
    return train, val


def _tokens_source(cfg, layout) -> PreparedData:
    d = cfg.data
    if not d.tokens_path:
        raise ConfigError("data.tokens_path", d.tokens_path, "data=tokens needs the path of a packed *.bin file", "set data.tokens_path=/path/tokens.bin")
    bin_path = Path(d.tokens_path).expanduser()
    idx = index_path(bin_path)
    if not bin_path.is_file() or not idx.is_file():
        raise ConfigError("data.tokens_path", str(bin_path), f"needs both the token file and its index {idx.name}",
                          "point it at a *.bin written by a previous run's pretokenization (see the run's data.json)")
    index = inputs.read_token_index(bin_path, idx)
    if index.get("vocab_size") != cfg.model.vocab_size:
        raise ConfigError("data.tokens_path", str(bin_path),
                          f"the tokens were made with a tokenizer of {index.get('vocab_size')} tokens but model.vocab_size = {cfg.model.vocab_size}",
                          f"set model.vocab_size={index.get('vocab_size')}")
    inputs.check_token_file(bin_path, index, cfg.model.vocab_size, Path(d.cache_dir))
    train, val = _split(cfg, layout, index["num_tokens"], "data.tokens_path", str(bin_path))
    tok = index.get("tokenizer_path")
    return PreparedData(str(bin_path), tok if tok and Path(tok).exists() else None, index["dtype"], index["num_tokens"],
                        index["vocab_size"], index["eos_id"], layout.seq_length, train, val, "tokens")


def prepare_data(cfg, layout, progress: bool = False, console=None) -> PreparedData:
    """Tokenizer and packed tokens for `cfg`, built once and cached under data.cache_dir."""
    if cfg.data.source == "tokens":
        return _tokens_source(cfg, layout)
    if cfg.data.source not in ("stdlib", "hf"):
        raise ConfigError("data.source", cfg.data.source, "must be stdlib, hf or tokens", "select data=stdlib, data=hf or data=tokens")
    cache = Path(cfg.data.cache_dir).expanduser()
    inputs.check_writable_dir("data.cache_dir", cfg.data.cache_dir)
    docs = read_documents(cfg)
    chash = corpus_hash(docs)
    tok_path, tok = build_tokenizer(cfg, docs, chash, cache, console)
    eos_id = _eos_id(tok, str(tok_path))
    dtype = token_dtype(cfg.model.vocab_size)
    tok_hash = hashlib.sha256(Path(tok_path).read_bytes()).hexdigest()
    key = hashlib.sha256(f"{chash}|{tok_hash}|{dtype}|{FORMAT_VERSION}".encode()).hexdigest()[:16]
    bin_path = cache / f"tokens-{key}.bin"
    with _locked(cache, f"tokens-{key}"):
        idx = index_path(bin_path)
        if bin_path.exists() and idx.exists():
            index = json.loads(idx.read_text())
        else:
            meta = {"vocab_size": cfg.model.vocab_size, "tokenizer_path": str(tok_path), "corpus_sha256": chash,
                    "source": cfg.data.source}
            index = pretokenize(docs, tok, eos_id, bin_path, dtype, progress, meta)
    key_name = "data.paths" if cfg.data.paths or cfg.data.source == "stdlib" else "data.hf_name"
    key_value = list(cfg.data.paths) or (cfg.data.hf_name if cfg.data.source == "hf" else "stdlib")
    if cfg.data.max_bytes is not None:
        key_name, key_value = "data.max_bytes", cfg.data.max_bytes
    train, val = _split(cfg, layout, index["num_tokens"], key_name, key_value)
    return PreparedData(str(bin_path), str(tok_path), dtype, index["num_tokens"], cfg.model.vocab_size, eos_id,
                        layout.seq_length, train, val, cfg.data.source)


# ----------------------------------------------------------------------------- batches


class TokenBatches:
    """Deterministic, disjoint per-DP-rank batches over a packed token file (memory-mapped)."""

    def __init__(self, prepared: PreparedData, layout, seed: int, dp_rank: int):
        self.prepared = prepared
        self.tokens = np.memmap(prepared.bin_path, dtype=np.dtype(prepared.dtype), mode="r", shape=(prepared.num_tokens,))
        self.seq = prepared.seq_length
        self.micro = layout.micro_batch_size
        self.dp = layout.data_degree
        self.gbs = layout.global_batch_size
        self.dp_rank = dp_rank
        self.seed = seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.prepared.train_samples)}
        return self._perms[epoch]

    def train_sample_ids(self, step: int, micro_step: int) -> list[int]:
        """Sample ids of this rank's micro-batch `micro_step` of optimizer step `step` (0-based)."""
        first = step * self.gbs + micro_step * self.micro * self.dp + self.dp_rank * self.micro
        s = self.prepared.train_samples
        return [int(self._perm(g // s)[g % s]) for g in range(first, first + self.micro)]

    def val_sample_ids(self, batch: int) -> list[int]:
        """Held-out samples of eval micro-batch `batch`: fixed, disjoint across ranks, wrapping when few."""
        first = (batch * self.dp + self.dp_rank) * self.micro
        v = max(1, self.prepared.val_samples)
        return [self.prepared.train_samples + (g % v) for g in range(first, first + self.micro)]

    def batch(self, sample_ids: list[int]):
        """input_ids (micro, seq) as int64; labels are the same ids (transformers shifts them)."""
        import torch

        rows = np.stack([self.tokens[i * self.seq:(i + 1) * self.seq] for i in sample_ids]).astype(np.int64)
        return torch.from_numpy(rows)

    def train_batches(self, step: int, accum: int) -> Iterator:
        for micro_step in range(accum):
            yield self.batch(self.train_sample_ids(step, micro_step))
