"""Selective activation checkpointing (model.checkpoint_mode=selective): keep every matmul's and attention
kernel's output, recompute the element-wise operators between them.

Full checkpointing keeps a block's input and runs its whole forward again in the backward (~1/3 more FLOPs).
Most of a LLaMA block's saved bytes, though, come from cheap element-wise operators: RMSNorm's fp32 upcast, its
normalised copy and output, rotary's q and k, SiLU's output and the SwiGLU product (launcher/plan/activations.py).
Keeping the outputs of the GEMMs and SDPA and recomputing the rest costs no matmul FLOPs a second time and keeps
~60% of the block's bytes (recipe=tiny in fp32 at micro-batch 8: 6.6 of 11.0 MB a block; full checkpointing 0.5).
This is torchtitan's op-level selective checkpointing with every matmul kept (torchtitan also drops every other
matmul's output); it is not Korthikanti et al.'s "selective" (recompute the attention core), which a flash /
memory-efficient SDPA kernel already is.

torch's own mechanism (torch.utils.checkpoint.create_selective_checkpoint_contexts, non-reentrant checkpoint) does
the work: a dispatch mode caches the outputs the policy keeps during the forward and hands them back to the
recompute. It runs on the transformers model (DP / ZeRO 0-3: transformers' gradient_checkpointing with a
context_fn); our layer list (pipeline / TP) runs DeepSpeed's reentrant checkpoint, which has no policy, so
launcher/config/layout.py refuses the mode there, and the planner offers it only where this runs.

Its price beyond the recomputed operators is Python: the dispatch mode visits every operator of a checkpointed
block in the forward and again in the recompute (70 a LLaMA block; on one CPU process it made recipe=tiny's step
as slow as keeping every output, bench/steptime/results.md). `launcher calibrate` measures it per block
(profile.selective_framework_s; selective_host_s on a GPU) and the plan charges it (launcher/plan/steptime.py).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten
# The operators whose outputs are kept: GEMMs (nn.Linear lowers to mm / addmm; GPT-2's Conv1D is addmm) and the
# scaled-dot-product-attention kernels of every backend (the output and its logsumexp).
KEPT_OPS = frozenset(getattr(_aten, name).default for name in (
    "mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention") if hasattr(_aten, name))


def policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    """context_fn for torch.utils.checkpoint.checkpoint (non-reentrant): a fresh cache per checkpointed call."""
    return create_selective_checkpoint_contexts(policy)


def checkpoint_kwargs(mode: str) -> dict:
    """transformers' gradient_checkpointing_kwargs for model.checkpoint_mode (full | selective)."""
    kwargs = {"use_reentrant": False}   # non-reentrant: works with ZeRO-3's parameter hooks, needs no requires_grad
    if mode == "selective":
        kwargs["context_fn"] = selective_context
    return kwargs
