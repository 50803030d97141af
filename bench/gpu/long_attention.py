"""Causal SDPA forward + backward at long sequences (4k-32k), as the plan's attention table would need them.

`launcher calibrate` timed SDPA on a GPU only to sequence 4,096 until 2026-11-28 (bf16 now to 16,384:
calibrate.ATTN_SEQS_GPU_LONG), and the plan holds the last rate of its table beyond it (profile.interpolate clamps).
Published long-sequence runs (bench/published: MosaicML's 16k-65k rows) are where the planner misses most, so this
measures what the same kernel call does past that: bf16, head dim 128, 16 heads, the batch that keeps 32,768 tokens
per call, 10 calls queued per synchronisation as calibrate times on a GPU (sync_probe.per_call, median of 5),
counted in causal FLOPs exactly as calibrate counts them (4 s^2 h d / 2 x 3.5 per sequence).
Plain torch: runs on a bare GPU image.

    python3 bench/gpu/long_attention.py --out DIR     # DIR/long-attention.json, rewritten after each length
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sync_probe import per_call  # this folder's: the median of queued calls between two synchronisations

SEQS = (2048, 4096, 8192, 16384, 32768)
TOKENS = 32768
HEADS, HEAD_DIM = 16, 128


def main() -> None:
    import torch
    import torch.nn.functional as F

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "heads": HEADS,
                    "head_dim": HEAD_DIM, "tokens_per_call": TOKENS, "rows": []}
    for s in SEQS:
        b = max(1, TOKENS // s)
        q, k, v = (torch.randn(b, HEADS, s, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        g = torch.randn_like(q)

        def step(q=q, k=k, v=v, g=g):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
        t = per_call(step, 10, repeats=5)
        flops = b * 4.0 * s * s * HEADS * HEAD_DIM / 2 * 3.5
        result["rows"].append({"seq": s, "batch": b, "seconds": t, "tflops": flops / t / 1e12})
        print(result["rows"][-1], flush=True)
        (out / "long-attention.json").write_text(json.dumps(result, indent=1) + "\n")
        del q, k, v, g, step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
