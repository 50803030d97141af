"""What a forward pass keeps for backward, measured: the reference for launcher/plan/activations.py.

`saved_bytes(fn, exclude)` runs `fn()` under torch.autograd.graph.saved_tensors_hooks and sums the storages of
every tensor autograd saves, each storage once (a view saved twice, or the same input saved by q, k and v
projections, is one storage), leaving out the parameters' storages (`exclude`: weights are model state,
counted by launcher/plan/memory.py's model_state_bytes). What the hook sees is exactly what stays alive
between forward and backward because of autograd, plus the inputs that activation checkpointing keeps:
torch's non-reentrant checkpoint saves its positional tensor inputs through _NoopSaveInputs
(torch/utils/checkpoint.py) and DeepSpeed's (reentrant) CheckpointFunction through ctx.save_for_backward,
both outside their own inner hooks. Not seen: tensors a closure keeps (kwargs of a checkpointed call,
e.g. the model-wide rotary cos/sin) and the transient buffers of backward itself (gradients).
"""

from __future__ import annotations

import torch


def param_storages(*modules) -> set:
    return {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}


def saved_bytes(fn, exclude: set = frozenset()):
    """(fn's result, bytes of the distinct non-parameter storages autograd saved while fn ran)."""
    seen: dict = {}

    def pack(t):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr not in exclude and ptr not in seen:
            seen[ptr] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())
