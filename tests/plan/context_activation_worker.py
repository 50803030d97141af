"""torchrun worker for test_context_activations.py (not collected: no test_ prefix).

`torchrun --nproc_per_node CP tests/plan/context_activation_worker.py OUT_DIR`: every rank builds
launcher.parallel.context's ring-attention model with context_degree = the world size, runs one forward of one
micro-batch through context_parallel_loss under the saved-tensor hook (tests/plan/activation_measure.py), then
backward, for llama x {bf16, fp32} x {no checkpointing, checkpointing} at 1 and 3 blocks; and the same model on
one rank (plain SDPA, the whole sequence) for the ratio. Writes {name: bytes} to OUT_DIR/rank<r>.json.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.plan.activation_measure import param_storages, saved_bytes
from tests.plan.activation_worker import ARCH_OVERRIDES, DTYPES, MICRO, SEQ

BASE = ["recipe=tiny", "model.hidden_size=128", "model.num_attention_heads=4", "model.vocab_size=256",
        f"data.seq_length={SEQ}", f"batch.micro_batch_size={MICRO}", "cluster=cpu", "cluster.nodes=1",
        "parallel.zero_stage=0"] + ARCH_OVERRIDES["llama"]


def measure(cp: int, dtype: str, ckpt: bool, layers: int) -> int:
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.parallel.context import build_context_parallel_model, context_parallel_loss
    from launcher.runtime.model import build_model
    from launcher.train import maybe_apply_activation_checkpointing

    cfg = compose(BASE + [f"precision={dtype}", f"model.num_hidden_layers={layers}", f"cluster.gpus_per_node={cp}",
                          f"parallel.context_degree={cp}", f"batch.global_batch_size={MICRO}",
                          f"model.activation_checkpointing={str(ckpt).lower()}"])
    layout = resolve_layout(cfg)
    build = build_context_parallel_model if cp > 1 else build_model
    model = build(cfg.model, cfg.train.seed, vocab_size=layout.padded_vocab_size).to(DTYPES[dtype])
    maybe_apply_activation_checkpointing(cfg, model)
    model.train()
    held = {}
    if ckpt:
        # cos/sin reach checkpointed blocks as keyword arguments, kept by the checkpoint's closure (the hook cannot
        # see them): measured at their source, as in activation_worker.py.
        model.model.rotary_emb.register_forward_hook(
            lambda m, a, out: held.update({o.untyped_storage().data_ptr(): o.untyped_storage().nbytes() for o in out}))
    ids = torch.randint(0, cfg.model.vocab_size, (MICRO, SEQ), generator=torch.Generator().manual_seed(0))
    if cp > 1:
        forward = lambda: context_parallel_loss(model, ids, dist.get_rank(), cp, None)   # noqa: E731
    else:
        forward = lambda: model(input_ids=ids, labels=ids).loss   # noqa: E731
    loss, n = saved_bytes(forward, param_storages(model), held)
    loss.backward()   # the graph is complete and runs (the ring's backward included)
    return n


def main():
    import deepspeed

    from launcher.parallel.context import setup_context_parallel
    from launcher.runtime.distributed import avoid_shm_comm_build, leave_rank

    out_dir = Path(sys.argv[1])
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    cp = dist.get_world_size()
    setup_context_parallel(cp)
    results = {}
    for dtype in ("bf16", "fp32"):
        for ckpt in (False, True):
            for layers in (1, 3):
                name = f"{dtype}-{'ckpt' if ckpt else 'none'}-L{layers}"
                results[f"cp-{name}"] = measure(cp, dtype, ckpt, layers)
                results[f"one-{name}"] = measure(1, dtype, ckpt, layers)
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.barrier()
    leave_rank()   # results are on disk: exit without the interpreter's teardown (see leave_rank)


if __name__ == "__main__":
    main()
