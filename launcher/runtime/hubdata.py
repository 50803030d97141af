"""The identity of a `data.hf_name` dataset from stat calls only, so its warm start reads no data.

A hub dataset has no files named in the config, but after its first load it is files on this machine:
datasets' Arrow cache (`Dataset.cache_files`, under HF_DATASETS_CACHE, immutable once written: datasets writes a
new directory for a new revision or new data files) and, for a hub name, huggingface_hub's record of which
revision it downloaded (`<HF_HUB_CACHE>/datasets--owner--name/refs/*`, rewritten when a newer revision is fetched);
for a local dataset directory, its own files. The cold start loads the dataset and writes a pointer
`hfname-<hash>.json` into data.cache_dir listing those files with their sizes and mtimes and the dataset's
fingerprint; a warm start stats them and, unchanged, gives the manifest key from the pointer without importing
datasets, probing the hub or opening a data file.

The consequence: a run keeps training on the revision it was prepared from, also when the hub has a newer one
(a resumed run must see the data it started with). A newer revision is used once it is downloaded into the
local cache (its refs change), or with a new data.cache_dir.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from launcher.runtime.durable import write_atomic


def _stat(path: Path) -> Optional[list]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [str(path), st.st_size, st.st_mtime_ns]


def _hub_cache() -> Path:
    """huggingface_hub's cache directory, by its own rules (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def source_identity(name: str) -> list:
    """stat of what says which data `name` is: a local directory's files, or the hub cache's revision refs."""
    local = Path(name).expanduser()
    if local.is_dir():
        files = []
        for dirpath, dirnames, filenames in os.walk(local):
            dirnames[:] = sorted(n for n in dirnames if not n.startswith("."))
            files += [_stat(Path(dirpath) / n) for n in sorted(filenames) if not n.startswith(".")]
        return ["dir", str(local.resolve()), files]
    refs = _hub_cache() / ("datasets--" + name.replace("/", "--")) / "refs"
    return ["hub", name, [_stat(p) for p in sorted(refs.rglob("*")) if p.is_file()] if refs.is_dir() else []]


def _pointer(cache: Path, name: str, source: list) -> Path:
    return cache / f"hfname-{hashlib.sha256(json.dumps([name, source]).encode()).hexdigest()[:16]}.json"


def cached_identity(cache: Path, name: str) -> tuple[list, Optional[list]]:
    """(source identity, dataset identity or None): the latter from the pointer when every file it lists has the
    size and mtime recorded (stat only), else None (cold: the dataset must be loaded)."""
    source = source_identity(name)
    try:
        rec = json.loads(_pointer(cache, name, source).read_text())
    except (OSError, ValueError):
        return source, None
    files = rec.get("cache_files") or []
    if not files or any(_stat(Path(f[0])) != f for f in files):
        return source, None
    return source, [rec["fingerprint"], files]


def record_identity(cache: Path, name: str, source: list, ds) -> Optional[list]:
    """After a load: the dataset identity (fingerprint, Arrow files' stat), written to the pointer; None when the
    dataset is not backed by cache files (held in memory) and so has no identity to stat."""
    files = [_stat(Path(f["filename"])) for f in ds.cache_files]
    if not files or None in files:
        return None
    fingerprint = getattr(ds, "_fingerprint", None)
    cache.mkdir(parents=True, exist_ok=True)
    write_atomic(_pointer(cache, name, source), json.dumps({"hf_name": name, "fingerprint": fingerprint, "source": source,
                                                             "cache_files": files}, indent=2).encode())
    return [fingerprint, files]
