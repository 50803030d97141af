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


class SelectiveCacheBytes:
    """What selective checkpointing (launcher/runtime/recompute.py) keeps outside autograd's saved tensors: torch's
    caching dispatch mode stores the outputs its policy keeps in a dict of its own, which saved_tensors_hooks never
    sees. Used as a context manager around the forward, it wraps the runtime's create_selective_checkpoint_contexts
    (the same contexts are returned, so nothing the run does changes) to hold on to each cache; `add(seen, exclude)`
    then counts every cached storage not already in `seen` (data_ptr -> bytes) or `exclude` into `seen`."""

    def __enter__(self):
        from launcher.runtime import recompute

        self._module, self._original, self.caches = recompute, recompute.create_selective_checkpoint_contexts, []

        def observed(policy_fn, *args, **kwargs):
            forward, recompute_ctx = self._original(policy_fn, *args, **kwargs)
            self.caches.append(forward.storage)
            return forward, recompute_ctx

        recompute.create_selective_checkpoint_contexts = observed
        return self

    def __exit__(self, *exc):
        self._module.create_selective_checkpoint_contexts = self._original

    def add(self, seen: dict, exclude: set = frozenset()) -> int:
        from torch.utils._pytree import tree_leaves

        before = sum(seen.values())
        for cache in self.caches:
            for outputs in cache.values():          # {op key: {call index: outputs}}
                for out in outputs.values():
                    for t in tree_leaves(out):
                        t = getattr(t, "val", t)     # torch keeps each output in a _VersionWrapper
                        if isinstance(t, torch.Tensor):
                            s = t.untyped_storage()
                            if s.data_ptr() not in exclude and s.data_ptr() not in seen:
                                seen[s.data_ptr()] = s.nbytes()
        return sum(seen.values()) - before
