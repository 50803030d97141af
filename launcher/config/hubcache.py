"""Hub names (`owner/name`) for model.init_from, model.hf_config and data.tokenizer_path, read from the local
Hugging Face cache only: the ranks (and a cluster's compute nodes) have no network, so a name is usable once it
was downloaded (`hf download owner/name`, into HF_HUB_CACHE, default HF_HOME/hub = ~/.cache/huggingface/hub).

The snapshot is found by huggingface_hub itself (`snapshot_download(local_files_only=True)`: refs/main -> the
snapshots/<commit> directory, honoring HF_HUB_CACHE / HF_HOME), so a name resolves to the directory a
`from_pretrained(name)` would read. A missing name, or a snapshot without the files the key needs (a download of
config.json alone for init_from), is refused before start saying how to download it. A local path is never looked
up: only a value that is not an existing path and has the `owner/name` shape is a hub name. A name without an owner
(the legacy `gpt2`, `bert-base-uncased`) is ambiguous with a relative path, so it is a hub name only when it is not
an existing path and the cache holds that repo (models--gpt2, huggingface_hub's folder for repo id `gpt2`); otherwise
it stays a path and the key's own "does not exist" refusal names it.
"""

from __future__ import annotations

import re
from pathlib import Path

from launcher.config.errors import ConfigError

HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
OWNERLESS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# What each key reads from the directory (one of each tuple must be there).
NEEDS = {
    "model.init_from": (("config.json",), ("model.safetensors", "model.safetensors.index.json")),
    "model.hf_config": (("config.json",),),
    "data.tokenizer_path": (("tokenizer.json", "tokenizer.model", "tokenizer_config.json"),),
}


def is_hub_name(value) -> bool:
    s = str(value)
    if Path(s).expanduser().exists():
        return False
    if HUB_NAME.fullmatch(s):
        return True
    return bool(OWNERLESS_NAME.fullmatch(s)) and _cached_repo(s)


def _cached_repo(name: str) -> bool:
    """Whether the local Hugging Face cache has a folder for model repo `name` (no network, no file read)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return (Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type="model")).is_dir()


def local_path(key: str, value):
    """`value` unchanged when it is not a hub name; else the snapshot directory of the local Hugging Face cache
    holding it, or a ConfigError naming the key, the name, what is missing and the download command."""
    if value is None or not is_hub_name(value):
        return value
    from huggingface_hub import constants, snapshot_download

    name = str(value)
    fix = (f"download it where there is a network: `hf download {name}` (huggingface_hub >= 0.34; "
           f"`huggingface-cli download {name}` before), into this cache or one copied here (HF_HUB_CACHE, or HF_HOME/hub); "
           f"or give a local directory ({key}=/path/to/model)")
    try:
        snap = Path(snapshot_download(name, local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError (not cached), HFValidationError (not a repo id)
        raise ConfigError(key, name, f"is not an existing path, and as a hub name it is not in the local Hugging Face cache "
                          f"{constants.HF_HUB_CACHE} ({type(exc).__name__}); the ranks read local files only", fix) from None
    for group in NEEDS.get(key, ()):
        if not any((snap / f).exists() for f in group):
            raise ConfigError(key, name, f"its cached snapshot {snap} has none of {', '.join(group)} (a partial download)",
                              fix)
    return str(snap)
