"""How `launcher calibrate`'s GPU microbenchmarks should be timed: one call between two synchronisations (what
calibrate did until 2026-11-27) against many calls queued back to back (what a training step does: the host
enqueues kernels ahead of the GPU), plus where the ~1B LLaMA's micro-batch spends its time (GPU busy vs wall,
kernel count), from torch.profiler. Plain torch + transformers: runs on a bare GPU image, nothing to install.

    python3 bench/gpu/sync_probe.py --out DIR        # writes DIR/sync-probe.json (rewritten after each part)
    python3 bench/gpu/sync_probe.py --project DIR    # no GPU: DIR/profile-X.yaml with the probe's queued rates in
                                                     # place of calibrate's -> DIR/profile-X-queued-projection.yaml

The projection is what calibrate's profile would plan had it timed as a step runs (the 2026-11-27 H100 session:
bench/gpu/results.md): the bf16 GEMM table at the probe's sides, the bf16 SDPA table at its sequence lengths (batch
4), the copy bandwidth (1 GiB, queued) and the per-kernel overhead (CUDA-graph replay) replaced.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path



def project(results: Path) -> Path:
    import yaml

    probe = json.loads((results / "sync-probe.json").read_text())
    [src] = [p for p in results.glob("profile-*.yaml") if "projection" not in p.name]
    prof = yaml.safe_load(src.read_text())
    prof["memory_gbps"] = probe["copy_1024MiB_calls20_GBps"]
    prof["kernel_overhead_s"] = probe["graph_per_kernel_us"] * 1e-6
    for table, key, fmt in (("gemm_table", "gemm", "gemm_bf16_d{}_calls20_TFLOPs"),
                            ("attention_table", "attention", "sdpa_b4_s{}_calls10_TFLOPs")):
        rows = dict(prof[table]["bf16"])
        for size in rows:
            if fmt.format(size) in probe:
                rows[size] = probe[fmt.format(size)]
        prof[table]["bf16"] = [[k, v] for k, v in sorted(rows.items())]
    prof["source"] = f"{src.name} with bench/gpu/sync_probe.py's queued rates (a projection, not a calibrate run)"
    prof.pop("measurements", None)
    out = results / f"{src.stem}-queued-projection.yaml"
    out.write_text(yaml.safe_dump(prof, sort_keys=False))
    return out


def per_call(fn, calls: int, repeats: int = 7, sync=None) -> float:
    """Median seconds per call of `calls` back-to-back calls between two synchronisations (`sync`, by default
    torch.cuda.synchronize; fused_elementwise.py passes a no-op for its CPU check)."""
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    fn()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        ts.append((time.perf_counter() - t0) / calls)
    return sorted(ts)[len(ts) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--project")
    args = ap.parse_args()
    if args.project:
        print(project(Path(args.project)))
        return
    import torch
    import torch.nn.functional as F

    out = Path(args.out)
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    def save():
        (out / "sync-probe.json").write_text(json.dumps(res, indent=1))

    dev = "cuda"
    # Copy bandwidth (read + write), by size and by calls per synchronisation.
    for mib in (64, 256, 1024):
        n = (mib << 20) // 4
        src = torch.ones(n, device=dev)
        dst = torch.empty_like(src)
        for k in (1, 20):
            res[f"copy_{mib}MiB_calls{k}_GBps"] = 2 * n * 4 / per_call(lambda: dst.copy_(src), k) / 1e9
    # The 1B run's element-wise shapes (bf16): silu(a) * b on [4, 2048, 5632] = 5 passes; a + b on [4, 2048, 2048]
    # = 3 passes.
    a = torch.randn(4, 2048, 5632, device=dev, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for k in (1, 20):
        res[f"silu_mul_calls{k}_GBps"] = 5 * a.numel() * 2 / per_call(lambda: F.silu(a) * b, k) / 1e9
    x = torch.randn(4, 2048, 2048, device=dev, dtype=torch.bfloat16)
    y = torch.randn_like(x)
    for k in (1, 20):
        res[f"add_calls{k}_GBps"] = 3 * x.numel() * 2 / per_call(lambda: x + y, k) / 1e9
    save()

    # GEMMs as calibrate runs them (16,384 tokens), by side.
    for d in (256, 1024, 2048):
        xx = torch.randn(16384, d, device=dev, dtype=torch.bfloat16)
        w = torch.randn(d, d, device=dev, dtype=torch.bfloat16)
        for k in (1, 20):
            res[f"gemm_bf16_d{d}_calls{k}_TFLOPs"] = 2 * 16384 * d * d / per_call(lambda: F.linear(xx, w), k) / 1e12
    save()

    # Causal SDPA forward + backward (causal FLOPs, as calibrate counts them): calibrate's batch 1 and the 1B run's 4.
    for batch in (1, 4):
        for s in (1024, 2048):
            q, kk, v = (torch.randn(batch, 16, s, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            g = torch.randn(batch, 16, s, 128, device=dev, dtype=torch.bfloat16)
            flops = 4.0 * s * s * 16 * 128 / 2 * 3.5 * batch
            for k in (1, 10):
                res[f"sdpa_b{batch}_s{s}_calls{k}_TFLOPs"] = flops / per_call(
                    lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=True).backward(g), k) / 1e12
    save()

    # Per-operator cost: calibrate's chain (100 tiny ops and their backward, synchronised once) against the same
    # 200 tiny kernels replayed from a CUDA graph (the GPU's own gap between kernels, no host work).
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from launcher.runtime.calibrate import tiny_kernel_graph, tiny_op_chain   # standard library only at import

    chain = tiny_op_chain(dev, 100)
    res["chain_per_op_us"] = per_call(chain, 1, 11) / 200 * 1e6
    res["chain_per_op_calls10_us"] = per_call(chain, 10, 5) / 200 * 1e6
    res["graph_per_kernel_us"] = per_call(tiny_kernel_graph(dev, 200).replay, 10) / 200 * 1e6
    save()

    # The ~1B LLaMA of bench/gpu/train_1b.py: one micro-batch (4 x 2048) forward + backward, wall against GPU busy.
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                          intermediate_size=5632, vocab_size=32000, max_position_embeddings=2048,
                          attn_implementation="sdpa")
        with torch.device(dev):
            model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        ids = torch.randint(0, 32000, (4, 2048), device=dev)

        def mb():
            model(input_ids=ids, labels=ids).loss.backward()
        res["llama1b_microbatch_wall_s"] = per_call(mb, 1, 5)
        res["llama1b_microbatch_calls4_s"] = per_call(mb, 4, 3)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            mb()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        res["llama1b_kernels"] = len(kernels)
        res["llama1b_gpu_busy_s"] = sum(e.device_time for e in kernels) / 1e6
        by: dict = {}
        for e in kernels:
            key = ("gemm" if any(t in e.name.lower() for t in ("gemm", "sm90_xmma", "cutlass", "nvjet")) else
                   "attention" if any(t in e.name.lower() for t in ("flash", "sdpa", "fmha", "attention")) else "other")
            by[key] = by.get(key, 0.0) + e.device_time / 1e6
        res["llama1b_gpu_busy_by_kind_s"] = by
    except Exception as exc:  # noqa: BLE001 - a probe: keep what was measured
        res["llama1b_error"] = repr(exc)
    save()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
