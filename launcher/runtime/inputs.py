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
