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
        keep_zero3_fetches_out_of_the_cache()
    return kwargs


def keep_zero3_fetches_out_of_the_cache() -> None:
    """Run ZeRO 3's parameter fetch and release hooks outside torch's selective-checkpoint dispatch modes.

    The modes number every operator of a checkpointed block by kind, in the forward and again in the recompute,
    and the recompute takes the n-th kept output of a kind from the forward's cache: the two must issue the same
    operators. ZeRO 3's forward hooks run inside the block and issue operators of their own (the all-gather's
    concatenation, the release's partition copies), and how many depends on what is gathered at that moment:
    where the recompute gathers more inside a block than the forward did (the forward's prefetch walks gathered
    it from the block before), the recompute stops with "aten.cat.default (or aten.slice.Tensor) invocation index
    N encountered during backward but not found in storage". Seen on 2 CPU ranks with lowered fetching knobs
    (recipe=tiny: parallel.zero3_max_reuse_distance=2e5, prefetch 1e5, live 4e5, persistence 1e3;
    tests/train/equivalence_driver.py's zero3_selective_fetching case); not run at the defaults on a model
    whose linears exceed the 1e5 persistence threshold, where the same fetches happen inside the blocks. Those
    hooks move parameters and compute nothing the backward needs, so they run with the modes set aside (torch's
    _disable_current_modes, private: torch 2.13 offers no public way to exempt a region from a dispatch mode; the
    same failure in torch's own FSDP drew a scoped bypass of the selective-checkpoint modes around its all-gather,
    pytorch pull request 196862, which this torch does not have). Idempotent."""
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
    from torch.utils._python_dispatch import _disable_current_modes

    for name in ("pre_sub_module_forward_function", "post_sub_module_forward_function"):
        hook = getattr(DeepSpeedZeRoOffload, name)
        if getattr(hook, "outside_dispatch_modes", False):
            continue

        def outside(self, sub_module, _hook=hook):
            with _disable_current_modes():
                return _hook(self, sub_module)

        outside.outside_dispatch_modes = True
        setattr(DeepSpeedZeRoOffload, name, outside)
