"""Does a CPU rank's SDPA rate depend on how many heads one call holds? (diagnostic for calibrate's attention probe,
launcher/runtime/calibrate.py ATTN_CPU_FULL_WIDTH_SEQ; not a test)

    .venv/bin/torchrun --nproc_per_node 2 bench/steptime/attention_heads.py

Every rank at once, as calibrate times them (_window_s): causal forward + backward at 1,024, 2,048 and 4,096 tokens,
counted in causal FLOPs, with calibrate's full width (256 / head dimension heads) and with one head; the last column is
one head's rate over the full width's. Readings: bench/steptime/epyc-avx2-2026-12-08/README.md and calibrate.py's ATTN_CPU_FULL_WIDTH_SEQ comment.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

import launcher.runtime.calibrate as C

dev = C._start_rank("cpu")
rank = dist.get_rank()
for dtype in (torch.float32, torch.bfloat16):
    for hd in (64, 128, 32):
        for s in (1024, 2048, 4096):
            row = []
            for heads in (C.ATTN_WIDTH["cpu"] // hd, 1):
                q, k, v = (torch.randn(1, heads, s, hd, dtype=dtype, requires_grad=True) for _ in range(3))
                g = torch.randn(1, heads, s, hd, dtype=dtype)

                def step():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
                dist.barrier()
                t = C._window_s(step, dist)
                row.append((heads, 4.0 * s * s * heads * hd / 2 * 3.5 / t / 1e9, t))
            if rank == 0:
                print(f"{str(dtype):15s} hd {hd:3d} s {s:5d}  "
                      + "  ".join(f"{h} heads {r:6.2f} GFLOP/s ({t:.3f} s a call)" for h, r, t in row)
                      + f"  one head / full width {row[1][1] / row[0][1]:.3f}", flush=True)
dist.barrier()
dist.destroy_process_group()
