"""What a forward pass keeps for backward, measured: the reference for launcher/plan/activations.py.

`saved_bytes(fn, exclude)` runs `fn()` under torch.autograd.graph.saved_tensors_hooks and sums the storages of
every tensor autograd saves, each storage once (a view saved twice, or the same input saved by q, k and v
projections, is one storage), leaving out the parameters' storages (`exclude`: weights are model state,
counted by launcher/plan/memory.py's model_state_bytes). What the hook sees is exactly what stays alive
between forward and backward because of autograd, plus the positional inputs torch's non-reentrant checkpoint keeps (it saves them through _NoopSaveInputs,
torch/utils/checkpoint.py, outside its own inner hooks). Not seen, so the callers measure them where they are
kept: tensors a closure keeps (kwargs of a checkpointed call, e.g. the model-wide rotary cos/sin), the inputs
DeepSpeed's CheckpointFunction keeps as a ctx attribute (ctx.deepspeed_saved_tensors), and the transient
buffers of backward itself (gradients).
"""

from __future__ import annotations

import torch


def param_storages(*modules) -> set:
    return {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}


def saved_bytes(fn, exclude: set = frozenset(), seen: dict | None = None):
    """(fn's result, bytes of the distinct non-parameter storages autograd saved while fn ran); `seen`
    (data_ptr -> bytes) may carry storages measured elsewhere, counted once with the saved ones."""
    seen = {} if seen is None else seen

    def pack(t):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr not in exclude and ptr not in seen:
            seen[ptr] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())
