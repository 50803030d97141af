"""The optimizer's parameter groups: weight decay on the matrices, none on norm weights and biases.

Decoupled weight decay (Loshchilov & Hutter 2019) pulls every decayed tensor towards 0. For a norm's gain
that means towards a layer that outputs nothing, and for a bias towards 0 for no regularising gain; the
codebases our users come from exclude both:
- Megatron-LM (megatron/core/optimizer/__init__.py, _get_param_groups): no weight decay when
  `name.endswith(".bias") or len(param.shape) == 1`;
- the HF Trainer (trainer.py, get_decay_parameter_names): every parameter but those of ALL_LAYERNORM_LAYERS
  modules and those named "bias";
- nanoGPT (model.py, configure_optimizers): "all weight tensors in matmuls + embeddings decay, all biases
  and layernorms don't" (by `p.dim() >= 2`).
We take Megatron's rule (it covers RMSNorm, which HF's list of LayerNorm classes misses for custom models,
and every layout: it needs no module types, so it works on PipelineModule stages too). Embeddings keep their
decay, as in all three.

With ZeRO-3 the parameters are already partitioned when the groups are made (deepspeed.zero.Init): their
`.shape` is the flat local slice, their full shape is `ds_shape`.
"""

from __future__ import annotations


def decays(name: str, param) -> bool:
    """Whether `param` (named `name`) gets weight decay: not a bias, and at least 2-D (Megatron's rule)."""
    shape = getattr(param, "ds_shape", None) or param.shape
    return not name.endswith(".bias") and len(shape) > 1


def no_decay_names(model) -> list[str]:
    """The names of the trainable parameters that get no weight decay."""
    return [n for n, p in model.named_parameters() if p.requires_grad and not decays(n, p)]


def param_groups(model, weight_decay: float) -> list[dict]:
    """Two groups for the optimizer: the decayed tensors at `weight_decay` and the rest at 0 (an empty group is left out).

    DeepSpeed keeps each group's own `weight_decay` over the config's value (torch.optim's per-group
    defaults), through ZeRO 1-3 and the pipeline engine alike.
    """
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if decays(name, p) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]
