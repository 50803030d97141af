"""Data benchmarks of issue 16: pretokenization tokens/s (1 and 2 processes), warm-cache start-up against corpus
size (10 MB and 1 GB), and the per-step data cost of a 3-source blend. Results: bench/data/results.md.

    flock /tmp/heavy.lock .venv/bin/python bench/data/bench_data.py pretok --mb 16
    flock /tmp/heavy.lock .venv/bin/python bench/data/bench_data.py startup --mb 10 1024 --workdir /tmp/data-bench
    .venv/bin/python bench/data/bench_data.py blend

Each measurement runs in a fresh interpreter (what a rank does at start); the corpora are generated under --workdir
and deleted afterwards. The corpus: this interpreter's stdlib .py files, repeated with a per-copy prefix until the
size is reached, as jsonl (data=hf), 64 files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
TOKENIZER_VOCAB = 8192


def write_corpus(root: Path, megabytes: int, files: int = 64) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    texts = []
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("**/*.py")):
        if "site-packages" in f.parts:
            continue
        t = f.read_bytes().decode("utf-8", errors="replace")
        if t.strip():
            texts.append(t)
    target = megabytes * 2**20
    per_file = target // files
    paths, copy, i = [], 0, 0
    for k in range(files):
        p = root / f"part-{k:03d}.jsonl"
        size = 0
        with open(p, "w") as fh:
            while size < per_file:
                line = json.dumps({"text": f"# copy {copy}\n" + texts[i]}) + "\n"
                fh.write(line)
                size += len(line)
                i += 1
                if i == len(texts):
                    i, copy = 0, copy + 1
        paths.append(p)
    return paths


def run(code: str, env: dict | None = None, old: str | None = None) -> dict:
    """One fresh interpreter; `code` prints one JSON line last. `old`: the launcher package root to import instead
    of this checkout (python -S: the editable install's import hook, a site .pth, would win over PYTHONPATH)."""
    env = {**os.environ, **(env or {})}
    argv = [PY, "-c", code]
    if old:
        argv = [PY, "-S", "-c", code]
        env["PYTHONPATH"] = os.pathsep.join([old, sysconfig.get_paths()["purelib"]])
    out = subprocess.run(argv, cwd=old or REPO, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


PREPARE = """
import json, time, sys
t0 = time.perf_counter()
from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.runtime.data import prepare_data
def main():
    cfg = compose({overrides!r})
    layout = resolve_layout(cfg)
    t1 = time.perf_counter()
    p = prepare_data(cfg, layout)
    t2 = time.perf_counter()
    import launcher
    print(json.dumps({{"import_compose_s": t1 - t0, "prepare_s": t2 - t1, "tokens": p.num_tokens + getattr(p, "val_num_tokens", 0),
                      "launcher": launcher.__file__}}))
if __name__ == "__main__":
    main()
"""


def overrides(paths, cache, tokenizer, workers=1):
    return ["recipe=tiny", f"model.vocab_size={TOKENIZER_VOCAB}", "model.max_position_embeddings=2048", "data=hf",
            "data.seq_length=1024", f"data.paths=[{','.join(map(str, paths))}]", f"data.cache_dir={cache}",
            f"data.tokenizer_path={tokenizer}", f"data.num_workers={workers}", "data.max_bytes=null"]


def tokenizer(workdir: Path) -> Path:
    """A byte-level BPE of 8192 tokens trained on 4 MB of the stdlib (BPE training is not what is measured)."""
    path = workdir / "tokenizer-8192.json"
    if not path.exists():
        code = f"""
from launcher.runtime.data import read_documents, train_tokenizer
from launcher.config.compose import compose
cfg = compose(["recipe=tiny", "data.max_bytes=4000000"])
train_tokenizer(read_documents(cfg), {TOKENIZER_VOCAB}).save({str(path)!r})
print("{{}}")
"""
        run(code)
    return path


def bench_pretok(args):
    work = Path(args.workdir)
    tok = tokenizer(work)
    paths = write_corpus(work / f"corpus-{args.mb}mb", args.mb)
    rows = []
    for label, workers, env in [("1 process (tokenizers' own threads)", 1, {}),
                                ("1 process, TOKENIZERS_PARALLELISM=false", 1, {"TOKENIZERS_PARALLELISM": "false"}),
                                ("2 processes", 2, {})]:
        cache = work / f"cache-pretok-{workers}-{len(rows)}"
        shutil.rmtree(cache, ignore_errors=True)
        r = run(PREPARE.format(overrides=overrides(paths, cache, tok, workers)), env)
        r.update(label=label, tokens_per_s=r["tokens"] / r["prepare_s"])
        rows.append(r)
        print(json.dumps(r), flush=True)
        shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(work / f"corpus-{args.mb}mb", ignore_errors=True)


def bench_startup(args):
    work = Path(args.workdir)
    tok = tokenizer(work)
    for mb in args.mb:
        corpus = work / f"corpus-{mb}mb"
        cache = work / f"cache-{mb}mb"
        paths = write_corpus(corpus, mb)
        cold = run(PREPARE.format(overrides=overrides(paths, cache, tok, args.workers)))
        warm = [run(PREPARE.format(overrides=overrides(paths, cache, tok, args.workers))) for _ in range(3)]
        r = {"corpus_mb": mb, "corpus_bytes": sum(p.stat().st_size for p in paths), "tokens": cold["tokens"],
             "cold_prepare_s": cold["prepare_s"], "warm_prepare_s": [w["prepare_s"] for w in warm],
             "warm_import_compose_s": [w["import_compose_s"] for w in warm]}
        if args.old and mb <= 100:  # the old code holds the corpus as Python strings: only the small corpus
            old = run(PREPARE.format(overrides=overrides(paths, work / f"cache-old-{mb}mb", tok, 1)).replace(
                f"data.num_workers=1", "data.val_fraction=0.01"), old=args.old)
            old_warm = run(PREPARE.format(overrides=overrides(paths, work / f"cache-old-{mb}mb", tok, 1)).replace(
                f"data.num_workers=1", "data.val_fraction=0.01"), old=args.old)
            r.update(old_cold_prepare_s=old["prepare_s"], old_warm_prepare_s=old_warm["prepare_s"])
        print(json.dumps(r), flush=True)
        shutil.rmtree(corpus, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(work / f"cache-old-{mb}mb", ignore_errors=True)
        shutil.rmtree(work / "hf-cache", ignore_errors=True)


def bench_blend(args):
    """Per-step data cost of a 3-source blend: sample ids + rows for one global batch, against a step's time."""
    import numpy as np
    from dataclasses import replace

    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.runtime.data import TokenBatches, prepare_data

    work = Path(args.workdir) / "blend"
    work.mkdir(parents=True, exist_ok=True)
    srcs = []
    for i, (w, n) in enumerate([(0.6, 4_000_000), (0.3, 2_000_000), (0.1, 1_000_000)]):
        p = work / f"s{i}.bin"
        np.random.default_rng(i).integers(0, 320, size=n).astype(np.uint16).tofile(p)
        srcs.append(f"{{path: {p}, weight: {w}}}")
    cfg = compose(["recipe=tiny", "data=blend", f"data.sources=[{','.join(srcs)}]", "data.token_dtype=uint16",
                   "model.vocab_size=320", f"data.cache_dir={work / 'cache'}"])
    layout = resolve_layout(cfg)
    prepared = prepare_data(cfg, layout)
    b = TokenBatches(prepared, layout, seed=0, dp_rank=0)
    accum = layout.grad_accum_steps
    for step in range(5):  # warm the page cache and the first block
        list(b.train_batches(step, accum))
    t0 = time.perf_counter()
    steps = 2000
    for step in range(steps):
        list(b.train_batches(step, accum))
    per_step = (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    far = TokenBatches(prepared, layout, seed=0, dp_rank=0)
    list(far.train_batches(10**6, accum))  # a resume at step 1e6 (16e6 slots): the block counts up to it
    resume = time.perf_counter() - t0
    print(json.dumps({"micro": layout.micro_batch_size, "accum": accum, "seq": layout.seq_length,
                      "data_s_per_step": per_step, "resume_at_step_1e6_s": resume}))
    shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["pretok", "startup", "blend"])
    ap.add_argument("--mb", type=int, nargs="+", default=[16])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/data-bench")
    ap.add_argument("--old", help="PYTHONPATH of the code before this change, for a before/after of start-up")
    args = ap.parse_args()
    # datasets' Arrow copy of the jsonl corpus goes under the work dir too, and is deleted with it.
    os.environ["HF_DATASETS_CACHE"] = str(Path(args.workdir) / "hf-cache")
    if args.what == "pretok":
        args.mb = args.mb[0]
        bench_pretok(args)
    elif args.what == "startup":
        bench_startup(args)
    else:
        bench_blend(args)


if __name__ == "__main__":
    main()
