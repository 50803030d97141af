"""One 2-rank launch that trains several layouts in turn with the loop's own pieces and records what they did.

Run by tests/train/test_train_runs.py as
    torchrun --standalone --nproc_per_node 2 tests/train/equivalence_driver.py OUT_DIR override...
Each case builds a fresh engine with launcher.train.build_engine and steps it with launcher.train.train_step,
exactly as `launcher train` does; rank 0 writes OUT_DIR/results.json. Cases that the export test needs
also save a checkpoint (launcher.runtime.checkpoint.save_checkpoint) and the logits of a fixed batch.

Each step's global gradient norm is recorded too, because the losses alone cannot show a gradient-scale
error (AdamW's update m / sqrt(v) cancels a constant factor; clipping hides it when both norms exceed the
clip): ZeRO >= 1 and bf16 report it (engine.get_global_grad_norm(), before clipping). ZeRO-0 fp32 reports
none, so the zero0 case reads the gradients the torch optimizer is about to apply (a step pre-hook: after
the boundary's backward they are the replicas' all-reduced mean on every rank), which are the raw
gradients while their norm is below the clip (the test checks that it is).
"""

import gc
import json
import sys
from pathlib import Path

import torch

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.deepspeed_config import build_deepspeed_config
from launcher.runtime.checkpoint import build_state, save_checkpoint
from launcher.runtime.data import TokenBatches, prepare_data
from launcher.runtime.distributed import StepAgreement, init_distributed, leave_rank
from launcher.runtime.nonfinite import UpdateVeto
from launcher.train import build_engine, train_step

CASES = {
    "zero0": ["parallel.zero_stage=0", "batch.micro_batch_size=4"],
    "zero1": ["parallel.zero_stage=1", "batch.micro_batch_size=4"],
    "zero2": ["parallel.zero_stage=2", "batch.micro_batch_size=4"],
    "zero3": ["parallel.zero_stage=3", "batch.micro_batch_size=4"],
    "zero2_micro1_accum4": ["parallel.zero_stage=2", "batch.micro_batch_size=1"],
    "zero2_bf16": ["parallel.zero_stage=2", "batch.micro_batch_size=4", "precision=bf16"],
    # Selective checkpointing (launcher/runtime/recompute.py): the element-wise operators recomputed, the matmuls'
    # outputs from torch's cache; on the plain model (ZeRO-1, the first 2 blocks) and under ZeRO-3's hooks.
    "zero1_selective_first2": ["parallel.zero_stage=1", "batch.micro_batch_size=4", "model.activation_checkpointing=true",
                               "model.checkpoint_mode=selective", "model.checkpoint_blocks=2"],
    "zero3_selective": ["parallel.zero_stage=3", "batch.micro_batch_size=4", "model.activation_checkpointing=true",
                        "model.checkpoint_mode=selective"],
    # ... and with ZeRO 3 fetching the linears inside the blocks, keeping some of them gathered from the forward to
    # the recompute: the forward and the recompute then gather different modules, which torch's selective
    # dispatch modes must not see (launcher/runtime/recompute.py keep_zero3_fetches_out_of_the_cache)
    "zero3_selective_fetching": ["parallel.zero_stage=3", "batch.micro_batch_size=4",
                                 "model.activation_checkpointing=true", "model.checkpoint_mode=selective",
                                 "parallel.zero3_param_persistence_threshold=1000",
                                 "parallel.zero3_max_reuse_distance=4000", "parallel.zero3_prefetch_bucket_size=2000",
                                 "parallel.zero3_max_live_parameters=8000"],
    # model.chunked_loss (launcher/runtime/chunked_loss.py): the head and loss a chunk at a time, on the plain engine
    # and under ZeRO-3's gathering of the head's weight for the forward and again for the backward
    "zero1_chunked": ["parallel.zero_stage=1", "batch.micro_batch_size=4", "model.chunked_loss=true"],
    "zero3_chunked": ["parallel.zero_stage=3", "batch.micro_batch_size=4", "model.chunked_loss=true"],
    "zero2_chunked_ckpt": ["parallel.zero_stage=2", "batch.micro_batch_size=4", "model.chunked_loss=true",
                           "model.activation_checkpointing=true"],
}
SAVE_CASES = ("zero0", "zero3")


def applied_gradient_norms(engine) -> list[float]:
    """Global norm of the gradients at each torch optimizer step (ZeRO-0: the optimizer steps the parameters)."""
    norms: list[float] = []

    def hook(opt, args, kwargs):
        grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
        norms.append(torch.nn.utils.get_total_norm(grads).item())

    engine.optimizer.register_step_pre_hook(hook)
    return norms


def main() -> None:
    out_dir = Path(sys.argv[1])
    base = sys.argv[2:]
    first = compose(base + CASES["zero0"])
    rank, world, _ = init_distributed(resolve_layout(first), 120)
    results = {}
    for name, overrides in CASES.items():
        cfg = compose(base + overrides)
        layout = resolve_layout(cfg)
        ds_config = build_deepspeed_config(cfg, layout)
        prepared = prepare_data(cfg, layout)
        batches = TokenBatches(prepared, layout, seed=cfg.train.seed, dp_rank=rank)
        engine = build_engine(cfg, layout, ds_config)
        losses, sample_ids, state_bytes, norms = [], [], None, []
        probed = applied_gradient_norms(engine) if layout.zero_stage == 0 and layout.dtype == "fp32" else None
        veto = UpdateVeto(engine)
        agree = StepAgreement(world, stop_requested=lambda: False)  # the loop's all-reduce before the update
        for step in range(cfg.train.steps):
            sample_ids.append([batches.train_sample_ids(step, m) for m in range(layout.grad_accum_steps)])
            loss, _, _, measured = train_step(engine, batches, step, layout.grad_accum_steps, agree, veto,
                                              measure_state=step == 1)
            losses.append(loss)
            norms.append(engine.get_global_grad_norm())
            state_bytes = measured or state_bytes
        if probed is not None:
            assert norms == [None] * len(norms) and len(probed) == len(norms), (norms, probed)
            norms = probed
        gathered_ids = [None] * world
        torch.distributed.all_gather_object(gathered_ids, sample_ids)
        gathered_bytes = [None] * world
        torch.distributed.all_gather_object(gathered_bytes, state_bytes)
        results[name] = {"losses": losses, "grad_norms": [None if n is None else float(n) for n in norms],
                         "grad_clip": cfg.optimizer.grad_clip, "sample_ids": gathered_ids, "state_bytes": gathered_bytes,
                         "accum": layout.grad_accum_steps, "micro": layout.micro_batch_size,
                         "head": type(engine.module.get_output_embeddings()).__name__}
        if name in SAVE_CASES:
            ckpt_root = out_dir / name / "checkpoints"
            state = build_state(cfg, layout, ds_config, cfg.train.steps, 0, prepared)
            save_checkpoint(engine, ckpt_root, cfg.train.steps, state, keep_last=1, rank=rank, tokenizer_path=prepared.tokenizer_path)
            engine.eval()
            x = batches.batch(batches.val_sample_ids(0))
            with torch.no_grad():
                logits = engine(input_ids=x).logits
            if rank == 0:
                torch.save({"input_ids": x, "logits": logits}, out_dir / name / "logits.pt")
        del engine
        gc.collect()
    if rank == 0:
        (out_dir / "results.json").write_text(json.dumps(results))
    torch.distributed.barrier()
    leave_rank()   # results are on disk: exit without the interpreter's teardown (see leave_rank)


if __name__ == "__main__":
    main()
