"""What data.streaming=true cannot be combined with, as pure rules on the config (no I/O, no torch).

A streamed corpus is read front to back as training consumes it (launcher/runtime/stream.py), so anything that
needs the whole corpus before the first step is refused here, before any process starts: training a BPE on it
(it needs a pass over every document first), a blend (its sources are token files, indexed by sample), and
processes that pretokenize (nothing is pretokenized). check_supported calls this, so `launcher plan`, `submit`
and `train` refuse the same configs.
"""

from __future__ import annotations

from launcher.config.errors import ConfigError


def check_streaming(cfg) -> None:
    d = cfg.data
    if not getattr(d, "streaming", False):
        return
    if d.source != "hf":
        raise ConfigError("data.streaming", True,
                          f"streams a data=hf dataset (local json/jsonl/parquet/txt/csv files or a dataset directory); "
                          f"data.source is {d.source}, whose "
                          + ("token files are already memory-mapped, never copied whole" if d.source in ("tokens", "blend")
                             else "files are pretokenized into data.cache_dir"),
                          "set data=hf data.paths=[...] to stream files, or data.streaming=false")
    if not d.tokenizer_path:
        raise ConfigError("data.tokenizer_path", None,
                          "data.streaming=true tokenizes documents as training reads them, so the tokenizer must exist "
                          "before the first step; training a BPE on the corpus (what data.tokenizer_path=null does) "
                          "needs a full pass over it first",
                          "set data.tokenizer_path to a tokenizer.json or a model/tokenizer directory (e.g. the "
                          "model.init_from directory), or data.streaming=false")
    if d.num_workers != 1:
        raise ConfigError("data.num_workers", d.num_workers,
                          "data.num_workers processes pretokenize a corpus before training; with data.streaming=true "
                          "nothing is pretokenized (every rank tokenizes its stream in its own process), so the value "
                          "would have no effect",
                          "set data.num_workers=1, or data.streaming=false to pretokenize in parallel")
