"""What LLaMA's element-wise operators cost as the launcher's runtime runs them (transformers' eager modules) against
one kernel each, forward + backward, at the 1B and 8B shapes: the lever issue 14's published runs point at.

bench/published (variants.py, fused-llama) says runs that used fused RMSNorm / rotary / SwiGLU kernels are 10-21%
faster than the plan of our eager runtime on the same layout, and that the same kernels would make our llama3.1-8b
recipe +17.5% and llama-65b +25% tokens/s in the plan. Nothing is built on that, because whether a replacement
really is one kernel, and what it saves, needs a GPU. This times, per operator:

  rmsnorm   transformers' LlamaRMSNorm (fp32 upcast, x^2, mean, rsqrt, multiply, cast, weight: ~8 kernels), against
            `weight * F.rms_norm(x.float(), eps).to(dtype)` (the same arithmetic; torch's aten::_fused_rms_norm on
            CUDA) and against the eager module under torch.compile (Inductor; GPU only)
  swiglu    silu(gate) * up, eager and compiled
  rotary    transformers' apply_rotary_pos_emb on q and k, eager and compiled
  copy      a clone of the hidden state: the bandwidth the plan charges element-wise bytes at

each its median of queued calls (sync_probe.per_call), with its device kernel count (torch.profiler), the largest
difference of its output and input gradient from the eager one, and the bytes by the plan's count (the kernel's
definition: each input read once, each output written once; launcher/plan/steptime.py and variants.py) over the time.
Plain torch + transformers: runs on a bare GPU image, nothing to install.

    python3 bench/gpu/fused_elementwise.py --out DIR            # DIR/fused-elementwise.json, rewritten per shape
    python3 bench/gpu/fused_elementwise.py --out DIR --device cpu --shapes tiny     # the check tests/ run on CPU

On CPU nothing is compiled (CPU runs JIT-compile nothing) and the times are not the point: the test holds that the
replacements compute what the eager modules do.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sync_probe import per_call  # this folder's: the median of queued calls between two synchronisations

# (micro-batch, sequence, hidden, ffn, heads, kv heads): bench/gpu/train_1b.py's 1B, and Llama 3.1 8B at its
# recipe's micro-batch (recipes/llama3.1-8b.yaml); tiny for the CPU check.
SHAPES = {"tiny": (2, 64, 128, 352, 4, 4), "1b": (4, 2048, 2048, 5632, 16, 16), "8b": (1, 8192, 4096, 14336, 32, 8)}


def _time(fn, device: str) -> float:
    """Median seconds per call of 10 back-to-back calls between two synchronisations (sync_probe.per_call)."""
    import torch

    return per_call(fn, 10, sync=torch.cuda.synchronize if device == "cuda" else (lambda: None))


def _kernels(fn, device: str) -> int | None:
    """Device kernels one call launches (forward + backward); None on CPU, where there are none to count."""
    if device != "cuda":
        return None
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def _fwd_bwd(f, inputs: list, grad):
    """A callable running f(*inputs) and its backward with `grad`; inputs' gradients are dropped each call."""
    import torch

    grads = grad if isinstance(grad, tuple) else (grad,)

    def run():
        for x in inputs:
            x.grad = None
        out = f(*inputs)
        out = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(out, grads)
        return out
    return run


def _outputs_and_grads(f, inputs: list, grad) -> list:
    run = _fwd_bwd(f, inputs, grad)
    outs = [o.detach().float() for o in run()]
    return outs + [x.grad.detach().float() for x in inputs]


def measure(shape: str, device: str, dtype_name: str = "bf16") -> dict:
    import torch
    import torch.nn.functional as F
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    b, s, h, f, heads, kv = SHAPES[shape]
    hd = h // heads
    el = torch.finfo(dtype).bits // 8
    dev = torch.device(device)
    compile_ok = device == "cuda"   # CPU runs JIT-compile nothing

    def leaf(*size):
        return torch.randn(*size, device=dev, dtype=dtype, requires_grad=True)

    norm = LlamaRMSNorm(h).to(dev)
    norm.weight.data = torch.rand(h, device=dev, dtype=dtype) + 0.5   # in the model's dtype, as the runtime casts it
    eps = norm.variance_epsilon

    def rms_native(x):
        return norm.weight * F.rms_norm(x.float(), (h,), eps=eps).to(x.dtype)

    def swiglu(g, u):
        return F.silu(g) * u

    pos = torch.arange(s, device=dev)
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=dev).float() / hd))
    ang = torch.outer(pos.float(), inv)
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos().to(dtype)[None], emb.sin().to(dtype)[None]

    def rotary(q, k):
        return apply_rotary_pos_emb(q, k, cos, sin)

    x, gate, up = leaf(b, s, h), leaf(b, s, f), leaf(b, s, f)
    q, k = leaf(b, heads, s, hd), leaf(b, kv, s, hd)
    n, nf, nq, nk = b * s * h, b * s * f, b * heads * s * hd, b * kv * s * hd
    # Bytes one fused kernel moves, forward + backward, by the plan's count (variants.py fused-llama; backward twice
    # the forward): RMSNorm reads x, writes y; SwiGLU reads gate and up, writes the product; rotary reads and
    # writes q and k. The copy reads and writes x.
    ops = {
        "rmsnorm": ([x], torch.randn(b, s, h, device=dev, dtype=dtype), 3 * 2 * n * el,
                    {"eager": norm, "native_rms_norm": rms_native}),
        "swiglu": ([gate, up], torch.randn(b, s, f, device=dev, dtype=dtype), 3 * 3 * nf * el, {"eager": swiglu}),
        "rotary": ([q, k], (torch.randn(b, heads, s, hd, device=dev, dtype=dtype),
                            torch.randn(b, kv, s, hd, device=dev, dtype=dtype)), 3 * 2 * (nq + nk) * el,
                   {"eager": rotary}),
    }
    result: dict = {"shape": shape, "dims": dict(zip(("micro_batch", "seq", "hidden", "ffn", "heads", "kv_heads"),
                                                    SHAPES[shape])), "dtype": dtype_name, "ops": {}}
    copy_s = _time(lambda: x.detach().clone(), device)
    result["copy"] = {"seconds": copy_s, "gbps": 2 * n * el / copy_s / 1e9}
    for name, (inputs, grad, fused_bytes, impls) in ops.items():
        if compile_ok:
            impls = {**impls, "compiled": torch.compile(impls["eager"])}
        ref = _outputs_and_grads(impls["eager"], inputs, grad)
        rows = {}
        for impl, fn in impls.items():
            got = _outputs_and_grads(fn, inputs, grad)
            run = _fwd_bwd(fn, inputs, grad)
            t = _time(run, device)
            rows[impl] = {"seconds": t, "kernels": _kernels(run, device),
                          "max_abs_diff_vs_eager": max(float((a - r).abs().max()) for a, r in zip(got, ref)),
                          "max_abs_eager": max(float(r.abs().max()) for r in ref),
                          "fused_bytes_gbps": fused_bytes / t / 1e9}
        result["ops"][name] = {"fused_bytes": fused_bytes, "impls": rows}
    return result


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--shapes", default="1b,8b", help="comma-separated, of " + ", ".join(SHAPES))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
           "results": []}
    for shape in args.shapes.split(","):
        doc["results"].append(measure(shape, args.device, args.dtype))
        (out / "fused-elementwise.json").write_text(json.dumps(doc, indent=1))
        r = doc["results"][-1]
        print(f"{shape}: copy {r['copy']['gbps']:.0f} GB/s; " + "; ".join(
            f"{op} " + ", ".join(f"{impl} {v['seconds'] * 1e3:.3f} ms" + (f" ({v['kernels']} kernels)" if v["kernels"]
                                                                           else "")
                                 for impl, v in o["impls"].items())
            for op, o in r["ops"].items()), flush=True)


if __name__ == "__main__":
    main()
