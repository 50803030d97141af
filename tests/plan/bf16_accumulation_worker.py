"""Worker for test_bf16_accumulation.py (not collected by pytest: no test_ prefix): the bytes DeepSpeed's
BF16_Optimizer and a plain torch loop move accumulating gradients, counted operator by operator.

One process, one rank (gloo). A model of LAYERS bias-free Linear(D, D) in bf16 trains steps of m micro-batches
(m = 1 and 4) two ways:
- plain: loss.backward() per micro-batch, zero_grad(set_to_none=True) after the step (what the ZeRO-1 optimizer's
  gradients see: autograd's AccumulateGrad);
- bf16_optimizer: a DeepSpeed engine with bf16, ZeRO 1 and data_types.grad_accum_dtype fp32, which DeepSpeed 0.19.8
  wraps in BF16_Optimizer (the optimizer of bf16 ZeRO-0 pipelines too), engine.backward / engine.step.
Under a TorchDispatchMode it counts, for the second step (the first leaves the steady state: gradients None after
its zero_grad), every aten operator of the backward calls except GEMMs, views and c10d collectives, as bytes read
plus bytes written (an in-place operator reads and writes its self; zero_/fill_ only write), and, inside step(),
the zeroing operators. Each BF16_Optimizer runs twice, with immediate_grad_update false (DeepSpeed's default)
and true (the launcher's), and its weights after the two steps are digested to the bit. The engine's
data-parallel gradient all-reduce at the step's last backward (allreduce_gradients: the fp32 gradients cast to the
communication dtype, reduced and copied back, ~20 bytes a parameter at one rank too) is counted apart, as
"reduce": it is the engine's data-parallel work, not accumulation. Writes {"plain": {m: ...},
"bf16_optimizer[_pipeline][_immediate]": {m: ...}, "params": N} to argv[1].
"""

import hashlib
import json
import os
import sys

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

D, LAYERS, BATCH = 256, 4, 2
GEMM = {"mm", "addmm", "bmm", "matmul", "linear"}
WRITE_ONLY = {"zero_", "fill_", "_foreach_zero_"}


def _tensors(x) -> list:
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


class Bytes(TorchDispatchMode):
    """Bytes read + written and kernels of every non-GEMM, non-view, non-collective aten op, by op name."""

    def __init__(self, only=None):
        super().__init__()
        self.only, self.total, self.kernels, self.by_op, self.aside = only, 0, 0, {}, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        schema = func._schema
        view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        if (view or name in GEMM or func.namespace != "aten" or name.startswith("empty")
                or name in ("detach", "t", "lift_fresh", "set_", "_unsafe_view")
                or (self.only is not None and name not in self.only)):
            return out
        if name in WRITE_ONLY:
            nbytes = _nbytes(_tensors(args))
        elif name == "copy_":                       # writes self, reads src
            nbytes = _nbytes(_tensors(args))
        else:                                       # reads every input, writes every output (self of an in-place op too)
            nbytes = _nbytes(_tensors(args) + _tensors(kwargs)) + _nbytes(_tensors(out))
        if self.aside is not None:
            self.aside += nbytes
            return out
        self.total += nbytes
        self.kernels += name not in WRITE_ONLY     # foreach / flat zeroing: kernels not per tensor
        self.by_op[name] = self.by_op.get(name, 0) + nbytes
        return out


def _digest(engine) -> str:
    """The engine's weights after its steps, bf16 and fp32 master, to the bit: with SGD any change in the
    gradients the optimizer stepped on (a missed micro-batch, a factor) changes it."""
    h = hashlib.sha256()
    for t in [*engine.module.parameters(), *engine.optimizer.fp32_groups_flat_partition]:
        h.update(t.detach().float().numpy().tobytes())
    return h.hexdigest()


def _step(model_or_engine, x, m: int, engine: bool) -> dict:
    backward, zeroing = Bytes(), Bytes(only=WRITE_ONLY)
    reduce = [0]
    if engine:
        allreduce = type(model_or_engine).allreduce_gradients

        def set_aside(*args, **kwargs):
            backward.aside = 0
            try:
                return allreduce(model_or_engine, *args, **kwargs)
            finally:
                reduce[0] += backward.aside
                backward.aside = None
        model_or_engine.allreduce_gradients = set_aside
    for _ in range(m):
        loss = model_or_engine(x).float().sum()
        with backward:
            model_or_engine.backward(loss) if engine else loss.backward()
        if engine:
            with zeroing:
                model_or_engine.step()      # the optimizer runs at the m-th only
    if not engine:
        model_or_engine.zero_grad(set_to_none=True)
    return {"backward": backward.total, "backward_kernels": backward.kernels, "by_op": backward.by_op,
            "step_zeroing": zeroing.total, "reduce": reduce[0]}


def _pipeline_step(deepspeed, x, m: int, immediate: bool) -> dict:
    """The same model as a one-stage PipelineModule at ZeRO 0 with bf16 accumulation: the pipeline engine's
    BF16_Optimizer, whose "fp32" gradients are then bf16. Counted: its backward instructions, and the zeroing in its
    optimizer-step instruction, of the second train_batch."""
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.pipe.engine import PipelineEngine

    torch.manual_seed(0)
    module = PipelineModule(layers=[nn.Linear(D, D, bias=False) for _ in range(LAYERS)], num_stages=1,
                            loss_fn=lambda out, y: out.float().sum())
    cfg = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": m,
           "bf16": {"enabled": True, "immediate_grad_update": immediate},
           "zero_optimization": {"stage": 0}, "zero_allow_untested_optimizer": True}
    e, *_ = deepspeed.initialize(model=module, optimizer=torch.optim.SGD(module.parameters(), lr=1e-3), config=cfg)
    assert type(e.optimizer).__name__ == "BF16_Optimizer" and isinstance(e, PipelineEngine), type(e.optimizer)
    table = PipelineEngine._INSTRUCTION_MAP
    backward_fn, step_fn = table[schedule.BackwardPass], table[schedule.OptimizerStep]
    result = {}
    try:
        for _ in range(2):
            backward, zeroing = Bytes(), Bytes(only=WRITE_ONLY)

            def counted_backward(self, *args, **kwargs):
                with backward:
                    return backward_fn(self, *args, **kwargs)

            def counted_step(self, *args, **kwargs):
                with zeroing:
                    return step_fn(self, *args, **kwargs)
            table[schedule.BackwardPass], table[schedule.OptimizerStep] = counted_backward, counted_step
            e.train_batch(iter([(x, x)] * m))
            result = {"backward": backward.total, "backward_kernels": backward.kernels, "by_op": backward.by_op,
                      "step_zeroing": zeroing.total, "reduce": 0, "weights": _digest(e)}
    finally:
        table[schedule.BackwardPass], table[schedule.OptimizerStep] = backward_fn, step_fn
    return result


def main() -> None:
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    import deepspeed

    from launcher.runtime.distributed import avoid_shm_comm_build

    avoid_shm_comm_build("cpu")   # no JIT build of DeepSpeed's shared-memory comm op

    torch.set_num_threads(1)
    x = torch.randn(BATCH, D, dtype=torch.bfloat16)
    kinds = [f"bf16_optimizer{p}{i}" for p in ("", "_pipeline") for i in ("", "_immediate")]
    out: dict = {"plain": {}, **{k: {} for k in kinds}, "params": D * D * LAYERS}
    for m in (1, 4):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(D, D, bias=False) for _ in range(LAYERS)]).to(torch.bfloat16)
        runs = [_step(model, x, m, engine=False) for _ in range(2)]
        out["plain"][m] = runs[1]
        for immediate in (False, True):
            suffix = "_immediate" if immediate else ""
            torch.manual_seed(0)
            model = nn.Sequential(*[nn.Linear(D, D, bias=False) for _ in range(LAYERS)])
            cfg = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": m,
                   "bf16": {"enabled": True, "immediate_grad_update": immediate},
                   "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"},
                   "zero_allow_untested_optimizer": True}
            e, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3),
                                         config=cfg)
            assert type(e.optimizer).__name__ == "BF16_Optimizer", type(e.optimizer)
            runs = [_step(e, x, m, engine=True) for _ in range(2)]
            out["bf16_optimizer" + suffix][m] = {**runs[1], "weights": _digest(e)}
            out["bf16_optimizer_pipeline" + suffix][m] = _pipeline_step(deepspeed, x, m, immediate)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
