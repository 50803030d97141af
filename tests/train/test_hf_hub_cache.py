"""Hub names (`owner/name`) for model.init_from, model.hf_config and data.tokenizer_path, read from the local
Hugging Face cache (launcher/config/hubcache.py). There is no network here, so the cache is written by the test in
huggingface_hub's layout (blobs, snapshots/<commit> symlinks, refs/main) and checked with huggingface_hub's own
readers (scan_cache_dir, try_to_load_from_cache) before the launcher is pointed at it."""

import hashlib
import json
import os
import shutil

import pytest
import torch

from test_hf_models import FAMILIES, SHAPE, save_model, save_tokenizer
from train_helpers import base_overrides, launcher

pytestmark = pytest.mark.slow

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(cache, repo_id, src, only=None):
    """`src`'s files as huggingface_hub stores a downloaded model repo under `cache`."""
    from huggingface_hub.file_download import repo_folder_name

    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    snap = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if only is not None and f.name not in only:
            continue
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snap


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A llama3-style model with its tokenizer cached as acme/tiny-llama, and acme/config-only holding config.json
    alone (a partial download), under <root>/home/hub (HF_HOME's default hub cache)."""
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    root = tmp_path_factory.mktemp("hub")
    tok = save_tokenizer(root / "tokenizer")
    arch, extra, overrides = FAMILIES["llama3"]
    save_model(root / "model", arch, extra, tok)
    cache = root / "home" / "hub"
    snap = cache_repo(cache, "acme/tiny-llama", root / "model")
    cache_repo(cache, "acme/config-only", root / "model", only={"config.json"})
    cache_repo(cache, "tiny-llama-ownerless", root / "model")   # a legacy name without an owner, like `gpt2`
    seen = {r.repo_id: {f.file_name for rev in r.revisions for f in rev.files} for r in scan_cache_dir(cache).repos}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= seen["acme/tiny-llama"], seen
    assert try_to_load_from_cache("acme/tiny-llama", "config.json", cache_dir=cache) == str(snap / "config.json")
    model = [f"model.arch={arch}", *(f"model.{k}={v}" for k, v in SHAPE.items()), *overrides]
    return root, cache, snap, model


def test_hub_names_resolve_through_HF_HUB_CACHE_and_HF_HOME(hub, tmp_path):
    root, cache, _, model = hub
    args = ["plan", *[o for o in base_overrides(tmp_path / "cache") if not o.startswith("model.")], *model]
    for env in ({"HF_HUB_CACHE": cache}, {"HF_HOME": root / "home"}):
        for key in ("model.init_from", "model.hf_config"):
            r = launcher([*args, f"{key}=acme/tiny-llama"], HF_HUB_OFFLINE=1, **env)
            assert r.returncode == 0, (env, key, r.stderr[-2000:])
    # Not cached, or cached without the weights init_from reads: refused before start, saying how to download it.
    for name, key, says in [("acme/missing", "model.init_from", "is not in the local Hugging Face cache"),
                            ("acme/config-only", "model.init_from", "has none of model.safetensors"),
                            ("acme/missing", "model.hf_config", "is not in the local Hugging Face cache")]:
        r = launcher([*args, f"{key}={name}"], HF_HUB_CACHE=cache, HF_HUB_OFFLINE=1)
        assert r.returncode == 2, r.stderr[-2000:]
        assert f"{key}='{name}'" in r.stderr and says in r.stderr and f"`hf download {name}`" in r.stderr, r.stderr
    r = launcher([*args, "model.hf_config=acme/config-only"], HF_HUB_CACHE=cache, HF_HUB_OFFLINE=1)
    assert r.returncode == 0, r.stderr[-2000:]   # hf_config needs config.json only
    # An owner-less name is a hub name when the cache holds it (and no such path exists); else it stays a path.
    r = launcher([*args, "model.init_from=tiny-llama-ownerless"], HF_HUB_CACHE=cache, HF_HUB_OFFLINE=1)
    assert r.returncode == 0, r.stderr[-2000:]
    r = launcher([*args, "model.init_from=tiny-llama-uncached"], HF_HUB_CACHE=cache, HF_HUB_OFFLINE=1)
    assert r.returncode == 2 and "model.init_from='tiny-llama-uncached'" in r.stderr and "does not exist" in r.stderr, \
        r.stderr[-2000:]


def test_train_from_hub_names_in_the_cache(hub, tmp_path):
    """`launcher train model.init_from=acme/tiny-llama data.tokenizer_path=acme/tiny-llama` on 2 CPU ranks: the
    cached weights are loaded (the trained ones moved a little from them), the cached tokenizer tokenizes, and the
    export carries the cached config and tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    root, cache, snap, model = hub
    base = [o for o in base_overrides(tmp_path / "cache", steps=3) if not o.startswith("model.")]
    r = launcher(["train", *base, *model, "model.init_from=acme/tiny-llama", "data.tokenizer_path=acme/tiny-llama",
                  "precision=fp32", f"runs_dir={tmp_path / 'runs'}", "run_name=hub", "checkpoint.export_hf=true"],
                 HF_HUB_CACHE=cache, HF_HUB_OFFLINE=1)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = tmp_path / "runs" / "hub"
    tag = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    trained = torch.load(tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    initial = AutoModelForCausalLM.from_pretrained(snap, dtype=torch.float32).state_dict()
    moved = max((trained[k].float() - initial[k]).abs().max().item() for k in initial if k in trained)
    assert 0 < moved < 0.05, moved
    a, b = AutoConfig.from_pretrained(snap).to_dict(), AutoConfig.from_pretrained(run / "hf").to_dict()
    for k in ("dtype", "transformers_version", "_name_or_path"):
        a.pop(k, None), b.pop(k, None)
    assert a == b
    text = "def f(x):\n    return x"
    assert AutoTokenizer.from_pretrained(run / "hf")(text)["input_ids"] == AutoTokenizer.from_pretrained(snap)(text)["input_ids"]
    assert json.loads((run / "data.json").read_text())["tokenizer_path"]
