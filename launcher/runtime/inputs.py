"""Every input file and directory checked before any rank starts, each refusal one ConfigError paragraph.

`launcher train` and `launcher submit` call these (through prepare_data and validate_before_start) on the
machine that starts the run, so a bad file fails in seconds instead of as a traceback in every rank.
The checks are cheap: sizes, headers and arithmetic. The two that read a whole file say why where they do.
No torch here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from launcher.config.errors import ConfigError

TOKEN_DTYPES = ("uint16", "uint32")
# Largest-id scans read this many tokens at a time (64 MiB of uint16): bounded memory on any file size.
SCAN_CHUNK_TOKENS = 32 * 2**20
HUB_PROBE_TIMEOUT_S = 5.0


# ----------------------------------------------------------------------------- directories


def check_writable_dir(key: str, value: str) -> None:
    """`value` (created when missing) can hold new files: the nearest existing ancestor is a directory we can write.

    Probed by creating and removing a temporary file there, not by permission bits: those say nothing for root,
    read-only mounts, quotas or ACLs.
    """
    path = Path(value).expanduser()
    probe = path.resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        what = "run directory" if key == "runs_dir" else "directory"
        raise ConfigError(key, value, f"{probe} is a file, so no {what} can be made under it",
                          f"point {key} at a directory (it is created when missing)")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".launcher-write-probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        missing = "" if probe == path.resolve() else f" (it does not exist yet; {probe} is where it would be created)"
        raise ConfigError(key, value, f"is not writable: creating a file in {probe} failed ({exc.strerror}){missing}",
                          f"point {key} at a directory you can write (e.g. on scratch), or fix its permissions") from None


# ----------------------------------------------------------------------------- data=tokens


def read_token_index(bin_path: Path, idx: Path, key: str = "data.tokens_path") -> dict:
    """The *.idx.json of a packed token file, with the fields the loader needs, or a ConfigError."""
    try:
        index = json.loads(idx.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(key, str(bin_path), f"its index {idx.name} is not valid JSON ({exc})",
                          "re-create the token file (a run with data=stdlib/hf writes both), or restore the index") from None
    if not isinstance(index, dict):
        raise ConfigError(key, str(bin_path), f"its index {idx.name} is not a JSON object", "re-create the token file")
    missing = [k for k in ("num_tokens", "dtype", "vocab_size", "eos_id") if k not in index]
    if missing:
        raise ConfigError(key, str(bin_path), f"its index {idx.name} lacks {', '.join(missing)}",
                          "re-create the token file with this launcher (its index records them)")
    return index


def check_token_file(bin_path: Path, index: dict, vocab_size: int, cache_dir: Path, key: str = "data.tokens_path") -> None:
    """The packed file holds what its index says: a known dtype, the byte size num_tokens x itemsize, every id
    (and EOS) below model.vocab_size."""
    dtype, n = index["dtype"], index["num_tokens"]
    if dtype not in TOKEN_DTYPES:
        raise ConfigError(key, str(bin_path), f"its index says dtype {dtype!r}; packed tokens are {' or '.join(TOKEN_DTYPES)}",
                          "re-create the token file with this launcher")
    if not isinstance(n, int) or n < 1:
        raise ConfigError(key, str(bin_path), f"its index says num_tokens={n!r}", "re-create the token file")
    item = np.dtype(dtype).itemsize
    size = bin_path.stat().st_size
    if size != n * item:
        other = "uint32" if dtype == "uint16" else "uint16"
        if size == n * np.dtype(other).itemsize:
            what = f"the size fits {n:,} tokens of {other}: the file and its index disagree on the dtype"
        elif size < n * item:
            what = f"truncated: it holds {size // item:,} of the {n:,} tokens"
        else:
            what = f"{size - n * item:,} bytes longer than its index says"
        raise ConfigError(key, str(bin_path),
                          f"the index says {n:,} tokens of {dtype} = {n:,} x {item} = {n * item:,} bytes, the file has {size:,} "
                          f"bytes ({what})",
                          "re-create the token file (or copy it again completely), with the index written alongside it")
    if not 0 <= index["eos_id"] < vocab_size:
        raise ConfigError(key, str(bin_path), f"its EOS id {index['eos_id']} is not below model.vocab_size = {vocab_size}",
                          "use the tokenizer these tokens were made with and its vocabulary size")
    top = max_token_id(bin_path, index, cache_dir)
    if top >= vocab_size:
        raise ConfigError(key, str(bin_path),
                          f"holds token id {top}, but model.vocab_size = {vocab_size} (ids must be < vocab_size: the embedding "
                          f"has {vocab_size} rows, and a larger id fails inside every rank after the start)",
                          f"set model.vocab_size >= {top + 1} (the tokenizer's size), or use tokens made with a {vocab_size}-token tokenizer")


# Megatron-LM's MMapIndexedDataset index (megatron/core/datasets/indexed_dataset.py, _IndexWriter.write):
#   b"MMIDIDX\x00\x00", <Q version = 1, <B dtype code, <Q sequence count, <Q document count,
#   then int32 sizes[sequence count], int64 byte pointers[sequence count], int64 document_indices[document count].
MEGATRON_HEADER = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
MEGATRON_TOKEN_DTYPES = ("uint8", "int16", "int32", "int64", "uint16")


def read_megatron_index(bin_path: Path, idx: Path, key: str = "data.tokens_path") -> dict:
    """Header and size checks of a Megatron .bin/.idx pair without reading its arrays (only their last entries).

    The tokens are read as one flat stream (sequences are stored back to back; preprocess_data.py's --append-eod
    ends each document with EOD), so the .bin's size gives the token count; the last pointer + size must end
    exactly there, which a truncated or foreign .bin fails.
    """
    import struct

    size = idx.stat().st_size
    with open(idx, "rb") as fh:
        head = fh.read(9 + 8 + 1 + 8 + 8)
    if len(head) < 34 or head[:9] != MEGATRON_HEADER:
        raise ConfigError(key, str(bin_path), f"{idx.name} does not start with Megatron's index header {MEGATRON_HEADER!r}",
                          "give the .idx written with the .bin by Megatron-LM's tools/preprocess_data.py")
    version, = struct.unpack("<Q", head[9:17])
    code = head[17]
    seqs, docs = struct.unpack("<QQ", head[18:34])
    if version != 1:
        raise ConfigError(key, str(bin_path), f"{idx.name} is Megatron index version {version}; version 1 is read",
                          "re-create the index with Megatron-LM's tools/preprocess_data.py")
    dtype = MEGATRON_DTYPES.get(code)
    if dtype not in MEGATRON_TOKEN_DTYPES:
        raise ConfigError(key, str(bin_path), f"{idx.name} says dtype code {code} ({dtype or 'unknown'}); token ids are "
                          f"codes {', '.join(f'{c} ({n})' for c, n in MEGATRON_DTYPES.items() if n in MEGATRON_TOKEN_DTYPES)}",
                          "give a token corpus (preprocess_data.py output), not an index of another kind")
    need = 34 + seqs * 4 + seqs * 8 + docs * 8
    if size < need or seqs < 1:
        raise ConfigError(key, str(bin_path), f"{idx.name} is {size:,} bytes; its header ({seqs:,} sequences, {docs:,} documents) "
                          f"needs 34 + {seqs:,} x 12 + {docs:,} x 8 = {need:,}", "copy the .idx again completely")
    item = np.dtype(dtype).itemsize
    sizes = np.memmap(idx, dtype=np.int32, mode="r", offset=34, shape=(seqs,))
    pointers = np.memmap(idx, dtype=np.int64, mode="r", offset=34 + seqs * 4, shape=(seqs,))
    end = int(pointers[-1]) + int(sizes[-1]) * item
    bin_size = bin_path.stat().st_size
    if end != bin_size or int(pointers[0]) != 0:
        raise ConfigError(key, str(bin_path), f"the index's last sequence ends at byte {int(pointers[-1]):,} + {int(sizes[-1]):,} x {item} "
                          f"= {end:,}, the .bin has {bin_size:,} bytes", "copy the .bin again completely, with the .idx written alongside it")
    return {"format": "megatron", "dtype": dtype, "num_tokens": bin_size // item, "num_docs": max(0, docs - 1)}


def flat_token_index(bin_path: Path, dtype, key: str = "data.tokens_path") -> dict:
    """A header-less array of ids (nanoGPT's data/*/prepare.py writes uint16 train.bin / val.bin)."""
    if dtype is None:
        raise ConfigError(key, str(bin_path), "has no index beside it (neither our .idx.json nor Megatron's .idx), so it is read as "
                          "a flat array of token ids, and their width is unknown",
                          "set data.token_dtype=uint16 (nanoGPT's GPT-2 tokens) or uint32, or give the index file")
    item = np.dtype(dtype).itemsize
    size = bin_path.stat().st_size
    if size == 0 or size % item:
        raise ConfigError(key, str(bin_path), f"is {size:,} bytes, not a whole number of {dtype} ids ({size:,} % {item} = {size % item})",
                          "check data.token_dtype, or copy the file again completely")
    return {"format": "flat", "dtype": dtype, "num_tokens": size // item}


def max_token_id(bin_path: Path, index: dict, cache_dir: Path) -> int:
    """The largest id in the file: from its index when the writer recorded it (this launcher does, since the same
    pass that wrote the tokens saw them), else by reading the whole file once.

    That O(file) read is unavoidable for a file nobody recorded the maximum of -- an id >= vocab_size is otherwise
    only found by the embedding lookup, inside every rank (a device-side assert on GPUs). Its result is cached
    under data.cache_dir keyed by the file's path, size and mtime, so it is paid once per file, not per start.
    """
    if isinstance(index.get("max_id"), int):
        return index["max_id"]
    st = bin_path.stat()
    key = f"{bin_path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    import hashlib

    cache = cache_dir.expanduser() / f".maxid-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if cache.is_file():
        try:
            return int(json.loads(cache.read_text())["max_id"])
        except (ValueError, KeyError, OSError):
            pass
    tokens = np.memmap(bin_path, dtype=np.dtype(index["dtype"]), mode="r", shape=(index["num_tokens"],))
    top = 0
    for start in range(0, len(tokens), SCAN_CHUNK_TOKENS):
        top = max(top, int(tokens[start:start + SCAN_CHUNK_TOKENS].max()))
    del tokens
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"max_id": top, "file": str(bin_path)}))
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only cache only costs the scan again next time
    return top


# ----------------------------------------------------------------------------- data=hf


def check_hf_files(paths: list[str]) -> None:
    """Each local file exists, is a file and is not empty (datasets fails on an empty file with a bare StopIteration)."""
    for p in paths:
        path = Path(p).expanduser()
        if not path.exists():
            raise ConfigError("data.paths", p, "does not exist", "give existing local files")
        if not path.is_file():
            raise ConfigError("data.paths", p, "is not a file (data=hf reads json/jsonl/parquet/txt/csv files)",
                              "list the files themselves, e.g. data.paths='[/data/a.jsonl,/data/b.jsonl]'")
        if path.stat().st_size == 0:
            raise ConfigError("data.paths", p, "is empty (0 bytes)", "remove it from data.paths, or write the corpus into it")


@contextlib.contextmanager
def quiet_datasets():
    """datasets logs its own read errors, with a traceback when logging is configured, before raising; we say it
    once, as a ConfigError. Its progress bar stays (feedback on a large corpus); its logger is restored afterwards."""
    from datasets.utils import logging as ds_logging

    level = ds_logging.get_verbosity()
    ds_logging.set_verbosity(ds_logging.CRITICAL + 10)
    try:
        yield
    finally:
        ds_logging.set_verbosity(level)


def explain_hf_read_error(paths: list[str], builder: str, exc: BaseException) -> ConfigError:
    """After datasets failed to read local files: find the file and line at fault.

    Only on this error path do we read the files ourselves (datasets' own error names neither file nor line).
    """
    root = exc
    while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
        root = root.__cause__ or root.__context__
    detail = f"{type(root).__name__}: {(str(root).splitlines() or [''])[0][:200]}"
    for p in paths:
        path = Path(p).expanduser()
        if builder == "parquet":
            continue
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    return ConfigError("data.paths", p, f"line {lineno} is not UTF-8 text (byte 0x{raw[err.start]:02x} at "
                                       f"column {err.start + 1})",
                                       "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8), or drop that line")
                if builder == "json" and path.suffix.lower() == ".jsonl" and line.strip():
                    try:
                        json.loads(line)
                    except json.JSONDecodeError as err:
                        return ConfigError("data.paths", p, f"line {lineno} is not valid JSON ({err.msg} at column {err.colno})",
                                           "fix or remove that line: a .jsonl file holds one JSON object per line")
    return ConfigError("data.paths", paths[0] if len(paths) == 1 else list(paths),
                       f"could not be read as {builder} by datasets.load_dataset ({detail})",
                       "check the files' format (one kind: json/jsonl, parquet, txt or csv)")


def check_hub_reachable(name: str) -> None:
    """data.hf_name needs the hub: refuse at once when it cannot be reached (datasets would retry for ~25 s and
    then raise), unless the user asked for the offline cache (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "") or os.environ.get("HF_DATASETS_OFFLINE", "0") not in ("0", ""):
        return
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError("data.hf_name", name, f"the hub ({endpoint}) cannot be reached from this machine "
                          f"({exc.strerror or type(exc).__name__})",
                          "download the dataset where there is a network and pass its files as data.paths, or set "
                          "HF_HUB_OFFLINE=1 to read a copy already in the datasets cache") from None


def hub_load_error(name: str, exc: BaseException) -> ConfigError:
    first = (str(exc).splitlines() or [""])[0][:200]
    return ConfigError("data.hf_name", name, f"datasets.load_dataset could not load it ({type(exc).__name__}: {first})",
                       "check the name on huggingface.co (owner/name), your access to it (HF_TOKEN in the environment), "
                       "or pass local files as data.paths")


# ----------------------------------------------------------------------------- tokenizer


def load_tokenizer_file(path: Path, key: str = "data.tokenizer_path"):
    """A tokenizers.Tokenizer from a tokenizer.json, or a ConfigError saying what is wrong with the file."""
    from tokenizers import Tokenizer

    if not path.is_file():
        raise ConfigError(key, str(path), "does not exist" if not path.exists() else "is not a file",
                          "give a tokenizer.json written by HF tokenizers")
    if path.stat().st_size == 0:
        raise ConfigError(key, str(path), "is empty (0 bytes)", "give a tokenizer.json written by HF tokenizers")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a plain Exception with serde's message
        first = (str(exc).splitlines() or [""])[0][:200]
        raise ConfigError(key, str(path), f"is not a tokenizer file HF tokenizers can read ({first})",
                          "give the tokenizer.json of a trained tokenizer (tokenizer.save(path)), not a vocab or config file") from None


def load_tokenizer_dir(path: Path, key: str = "data.tokenizer_path"):
    """A transformers fast tokenizer from a local directory (AutoTokenizer, never the network), or a ConfigError.

    A hub name is accepted once it is a local directory (the ranks read local files only). A slow-only tokenizer
    (sentencepiece without tokenizer.json) is converted by transformers; the run needs the fast backend."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises OSError/ValueError/... with its own message
        first = (str(exc).splitlines() or [""])[0][:200]
        raise ConfigError(key, str(path), f"is a directory transformers' AutoTokenizer cannot load ({type(exc).__name__}: {first})",
                          "give a model directory holding tokenizer.json (or tokenizer.model) and tokenizer_config.json, "
                          "or a tokenizer.json file") from None
    if not getattr(tok, "is_fast", False) or getattr(tok, "backend_tokenizer", None) is None:
        raise ConfigError(key, str(path), "has no fast (HF tokenizers) backend, which the run tokenizes with",
                          "save the tokenizer with a tokenizer.json (AutoTokenizer.from_pretrained(...).save_pretrained(dir))")
    return tok
