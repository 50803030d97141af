"""Peak RSS of loading a whole model from a transformers directory, one process (issue 11, part 2: ZeRO 0-2, AutoTP, Ulysses).

    .venv/bin/python bench/build/load_whole.py DIR [HIDDEN LAYERS]

Writes DIR (a LLaMA, the launcher's seeded init, saved with save_pretrained in 200 MB shards) once, then in a fresh
process each: `from_pretrained` (what `launcher train` did before: transformers 5.23's own loader) and
`launcher.runtime.model.build_model` with model.init_from=DIR (the model built on meta, materialised, and filled
tensor by tensor from safetensors). Prints JSON lines {how, params, fp32_bytes, baseline_hwm, hwm, rss, wall_s, equal}.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def vm(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024


def cfg(hidden, layers, init_from=None):
    from launcher.config.compose import compose

    return compose(["model=tiny", f"model.hidden_size={hidden}", f"model.num_hidden_layers={layers}",
                    "model.num_attention_heads=16", "model.num_key_value_heads=16",
                    f"model.intermediate_size={hidden * 43 // 16}", "model.vocab_size=8192",
                    "model.tie_word_embeddings=false", "cluster=cpu", "precision=fp32"]
                   + ([f"model.init_from={init_from}"] if init_from else []))


def one(how, path, hidden, layers):
    import torch

    torch.set_num_threads(1)
    from launcher.runtime.model import attn_implementation, build_model

    base = vm("VmHWM")
    t0 = time.perf_counter()
    if how == "from_pretrained":
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn_implementation("llama"))
    else:
        m = build_model(cfg(hidden, layers, path).model, seed=0)
    wall = time.perf_counter() - t0
    hwm_load = vm("VmHWM")
    # Touch every value (a lazily mapped tensor is not in RSS until read), then compare with the saved files.
    from safetensors import safe_open

    equal, n = True, 0
    sd = dict(m.named_parameters())
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(f, "pt") as h:
            for k in h.keys():
                if k in sd:
                    equal &= bool(torch.equal(sd[k].detach().float(), h.get_tensor(k).float()))
                    n += 1
    params = sum(p.numel() for p in m.parameters())
    print(json.dumps({"how": how, "params": params, "dtype": str(next(m.parameters()).dtype), "baseline_hwm": base,
                      "hwm_load": hwm_load, "hwm": vm("VmHWM"), "rss": vm("VmRSS"), "wall_s": round(wall, 2), "equal": equal, "compared": n}))


def main():
    if sys.argv[1] == "--one":
        return one(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    path = Path(sys.argv[1])
    hidden, layers = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (1024, 14)
    if not (path / "config.json").exists():
        from launcher.runtime.model import build_model

        build_model(cfg(hidden, layers).model, seed=5).save_pretrained(path, max_shard_size="200MB")
    for how in ("from_pretrained", "build_model"):
        subprocess.run([sys.executable, __file__, "--one", how, str(path), str(hidden), str(layers)], check=True)


if __name__ == "__main__":
    main()
