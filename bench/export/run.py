"""Export benchmark: peak RSS and wall time of `export_checkpoint` on a ~0.8B-parameter LLaMA checkpoint.

    python bench/export/run.py make DIR            # write DIR/step_00000001: a ZeRO-0 fp32 launcher checkpoint
    /usr/bin/time -v python bench/export/run.py export DIR/step_00000001 OUT [max_shard_gb]

The checkpoint is what DeepSpeed's engine writes under ZeRO-0 (mp_rank_00_model_states.pt holding `module`) with
a launcher_state.json (no manifest: the pre-manifest format, which verify_checkpoint accepts), so the measurement
is the export itself, without a training run: hidden 2048, 16 layers, MLP 5504, vocab 32000 = 0.86B parameters,
3.4 GB in fp32 (issue 11's 0.8B case).
"""

import json
import sys
import time
from pathlib import Path

SHAPE = ["model.hidden_size=2048", "model.num_hidden_layers=16", "model.num_attention_heads=16",
         "model.num_key_value_heads=16", "model.intermediate_size=5504", "model.vocab_size=32000",
         "model.max_position_embeddings=2048", "precision=fp32", "parallel.zero_stage=0", "cluster.gpus_per_node=1"]


def make(root: Path) -> None:
    import torch
    from omegaconf import OmegaConf

    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.runtime.checkpoint import LAYOUT_KEYS
    from launcher.runtime.model import build_model

    cfg = compose(["recipe=tiny", *SHAPE])
    layout = resolve_layout(cfg)
    tag = root / "step_00000001"
    tag.mkdir(parents=True)
    model = build_model(cfg.model, seed=0, vocab_size=layout.padded_vocab_size)
    print("params", sum(p.numel() for p in model.parameters()))
    torch.save({"module": model.state_dict()}, tag / "mp_rank_00_model_states.pt")
    state = {"step": 1, "config": OmegaConf.to_container(cfg, resolve=True),
             "layout": {k: getattr(layout, k) for k in LAYOUT_KEYS}, "data": {"eos_id": 0}}
    (tag / "launcher_state.json").write_text(json.dumps(state))


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def export(tag: Path, out: Path, max_gb: float) -> None:
    """Prints the wall time and the peaks of anonymous RSS (the process's own memory) and file-backed RSS (pages
    of the mmap-loaded checkpoint: page cache, shared and reclaimable), sampled every 20 ms."""
    import threading

    from launcher.export import export_checkpoint

    peaks = {"RssAnon": 0, "RssFile": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            for k in peaks:
                peaks[k] = max(peaks[k], _status_kb(k))
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    try:
        export_checkpoint(tag, out, max_shard_bytes=int(max_gb * 1e9))
    except TypeError:   # the export before streaming (no max_shard_bytes)
        export_checkpoint(tag, out)
    done.set()
    print(f"export_s {time.perf_counter() - t0:.1f}  peak RssAnon {peaks['RssAnon'] / 2**20:.2f} GiB  "
          f"peak RssFile {peaks['RssFile'] / 2**20:.2f} GiB")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
    else:
        export(Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]) if len(sys.argv) > 4 else 5.0)
