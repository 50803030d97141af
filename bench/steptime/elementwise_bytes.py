"""The step-time model's memory-bound bytes against the bytes the runtime's own model moves outside its GEMMs and
attention: every aten operator of one micro-batch forward + backward (loss included) that is not a matmul, not
SDPA and not a view, counted as the bytes of its tensor inputs plus its outputs (what an eager kernel reads and
writes), on CPU ranks' real tensors at a small shape, with 1 and 2 blocks (the difference is one block).

The plan's side: launcher/plan/steptime.py at that shape with a profile of 1 GB/s and no per-kernel cost, so that its
memory-bound seconds are bytes (x 1e9).

    .venv/bin/python bench/steptime/elementwise_bytes.py [arch ...]      # default: llama gpt bloom, fp32 and bf16,
                                                                         # the whole loss and model.chunked_loss
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from launcher.config.compose import compose  # noqa: E402
from launcher.config.layout import resolve_layout  # noqa: E402
from launcher.plan.profile import BUILTIN, profile_to_dict  # noqa: E402
from launcher.plan.report import plan_summary  # noqa: E402
from launcher.runtime import chunked_loss  # noqa: E402
from launcher.runtime.model import build_model  # noqa: E402

GEMM = {"mm", "addmm", "addmm_", "bmm", "baddbmm", "matmul", "linear"}
SHAPE = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 704,
         "vocab_size": 1024}
BATCH, SEQ = 2, 256


class Bytes(TorchDispatchMode):
    """Sum of input + output tensor bytes of every non-view, non-GEMM, non-attention aten op; by op name too."""

    def __init__(self):
        super().__init__()
        self.total, self.by_op, self.kernels = 0, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        schema = func._schema
        view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        if view or name in GEMM or "scaled_dot_product" in name or name.startswith("empty") or name in (
                "detach", "lift_fresh", "set_", "resize_", "_unsafe_view"):
            return out
        written = sum(t.numel() * t.element_size() for t in _tensors(out))
        if name == "nll_loss_forward":       # reads the target and one log-probability per token, not all of them
            target = args[1]
            nbytes = target.numel() * (target.element_size() + args[0].element_size()) + written
        elif name == "nll_loss_backward":    # writes the dense gradient; reads the target
            nbytes = written + args[2].numel() * args[2].element_size()
        elif name == "logsumexp":            # ATen's composite (ReduceOps.cpp logsumexp_out_impl, CPU and CUDA):
            x = args[0]                      # amax reads x, x - max writes and reads a copy, exp_ in place, sum reads
            nbytes = 6 * x.numel() * x.element_size() + written
        elif name == "gather":               # reads the index and one element a row of it (the chunked loss's target)
            index = args[2]
            nbytes = index.numel() * (index.element_size() + args[0].element_size()) + written
        elif name == "scatter_add_":         # reads the index and source, updates one element a row in place
            index, src = args[2], args[3]
            nbytes = index.numel() * index.element_size() + src.numel() * src.element_size() * 3
        elif name in ("zero_", "fill_", "zeros", "zeros_like", "ones", "ones_like", "full", "new_zeros", "scalar_tensor"):
            nbytes = written                 # written, not read
        else:                                # every distinct tensor read or written, once
            seen, nbytes = set(), 0
            for t in _tensors(args) + _tensors(kwargs) + _tensors(out):
                key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
                if key not in seen:
                    seen.add(key)
                    nbytes += t.numel() * t.element_size()
            if any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns):
                nbytes += written            # in place: the tensor is read and written
        self.total += nbytes
        self.kernels += 1
        self.by_op[name] = self.by_op.get(name, 0) + nbytes
        return out


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    return []


def overrides(arch: str, layers: int, dtype: str, chunked: bool = False) -> list[str]:
    return [f"model.chunked_loss={str(chunked).lower()}", "model=tiny", f"model.arch={arch}", f"model.num_hidden_layers={layers}", f"data.seq_length={SEQ}",
            f"model.max_position_embeddings={SEQ}", f"precision={dtype}", "cluster=h100-80gb", "cluster.nodes=1",
            "cluster.gpus_per_node=1", f"batch.micro_batch_size={BATCH}", f"batch.global_batch_size={BATCH}",
            "parallel.zero_stage=0"] + [f"model.{k}={v}" for k, v in SHAPE.items()
                                        if not (k == "intermediate_size" and arch in ("gpt", "bloom"))] + (
        ["model.intermediate_size=null"] if arch in ("gpt", "bloom") else [])


def counted(arch: str, layers: int, dtype: str, chunked: bool = False) -> tuple[int, int, dict]:
    cfg = compose(overrides(arch, layers, dtype, chunked))
    model = build_model(cfg.model, seed=0, vocab_size=SHAPE["vocab_size"]).to(
        torch.bfloat16 if dtype == "bf16" else torch.float32)
    if chunked:     # as launcher.train.build_engine does (maybe_chunk_the_loss)
        chunked_loss.install(model)
    ids = torch.randint(0, SHAPE["vocab_size"], (BATCH, SEQ))
    model(input_ids=ids, labels=ids).loss.backward()       # warm-up (lazy buffers, caches)
    model.zero_grad(set_to_none=True)
    with Bytes() as m:
        model(input_ids=ids, labels=ids).loss.backward()
    return m.total, m.kernels, m.by_op


def planned(arch: str, layers: int, dtype: str, profile: str, chunked: bool = False) -> float:
    cfg = compose(overrides(arch, layers, dtype, chunked) + [f"cluster.profile={profile}"])
    return plan_summary(cfg, resolve_layout(cfg))["step_time_breakdown_s"]["memory_bound"] * 1e9


def bytes_profile(directory: str) -> str:
    """A profile file under `directory` whose memory-bound seconds are bytes / 1e9: 1 GB/s, no per-kernel cost."""
    prof = Path(directory) / "bytes.yaml"
    prof.write_text(yaml.safe_dump(profile_to_dict(replace(BUILTIN["h100-80gb"], memory_gbps=1.0,
                                                           kernel_overhead_s=0.0))))
    return str(prof)


def compare(arch: str, dtype: str, profile: str, chunked: bool = False) -> dict:
    """One block and the ends (embedding, final norm, head, loss): bytes counted on the runtime's model and planned
    (1 and 2 blocks; the difference is one block), the operators a block, and the 2-block per-operator counts.
    `chunked`: model.chunked_loss (launcher/runtime/chunked_loss.py) in the model and the plan."""
    (c1, k1, by1), (c2, k2, by2) = counted(arch, 1, dtype, chunked), counted(arch, 2, dtype, chunked)
    p1, p2 = planned(arch, 1, dtype, profile, chunked), planned(arch, 2, dtype, profile, chunked)
    return {"block_counted": c2 - c1, "block_planned": p2 - p1, "ends_counted": c1 - (c2 - c1),
            "ends_planned": p1 - (p2 - p1), "kernels": k2 - k1, "by_op": (by1, by2)}


def main(archs: list[str]) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        prof = bytes_profile(tmp)
        print(f"shape {SHAPE}, micro-batch {BATCH} x {SEQ}; MB = 1e6 bytes, forward + backward + loss")
        print("| arch | dtype | loss | per block: counted / planned (MB), planned / counted | ends: counted / planned (MB) | kernels a block |")
        print("|---|---|---|---|---|---|")
        for arch in archs:
            for dtype in ("fp32", "bf16"):
                for chunked in (False, True):
                    r = compare(arch, dtype, prof, chunked)
                    blk_c, blk_p, end_c, end_p = (r["block_counted"], r["block_planned"], r["ends_counted"],
                                                  r["ends_planned"])
                    print(f"| {arch} | {dtype} | {'chunked' if chunked else 'whole'} | {blk_c / 1e6:.1f} / "
                          f"{blk_p / 1e6:.1f}, **{blk_p / blk_c:.2f}** | {end_c / 1e6:.1f} / {end_p / 1e6:.1f}, "
                          f"**{end_p / end_c:.2f}** | {r['kernels']} |")
                if "-v" in sys.argv:
                    by1, by2 = r["by_op"]
                    for op in sorted(by2, key=lambda o: -(by2[o] - by1.get(o, 0))):
                        print(f"    {op}: {(by2[op] - by1.get(op, 0)) / 1e6:.2f} MB a block")


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("-")] or ["llama", "gpt", "bloom"])
