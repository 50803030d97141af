"""torchrun worker for test_activations.py's multi-rank cases (not collected: no test_ prefix).

`torchrun --nproc_per_node 2 tests/plan/activation_worker.py OUT_DIR CASES.json`. Each case is
{"name", "mode", "arch", "dtype", "ckpt", "layers"} and optionally "document_mask" (tp only: the batch's
position ids restart after EOS, as launcher.train.micro_loss passes them); every rank builds the modules the runtime builds for that
mode, runs one forward of one micro-batch under the saved-tensor hook (tests/plan/activation_measure.py),
runs backward, and writes {name: bytes} to OUT_DIR/rank<r>.json. Modes:
    pipe    the pipeline's layers as launcher.parallel.pipeline.layer_specs builds them on the pipeline grid's
            TP group (ColumnParallel/RowParallel shards, launcher/parallel/tensor.py), materialised with the
            seeded init, run in order as PipelineModule.forward runs them (one stage holding every layer),
            blocks checkpointed with DeepSpeed's checkpoint (PipelineModule's activation_checkpoint_func)
    tp      TP at pipeline_degree = 1 as launcher/train.py builds it: our TP layers as one model
            (launcher.parallel.tensor_model.build_tensor_parallel_model: the one-stage PipelineModule's layers,
            blocks checkpointed with torch's non-reentrant checkpoint) under deepspeed.initialize's plain engine
    ulysses launcher.parallel.sequence's model and loss with sequence_degree 2
    pipe-sp pipe with Megatron sequence parallelism (parallel.sequence_parallel=true): blocks on s/2 tokens
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.plan.activation_measure import param_storages, saved_bytes

SEQ, MICRO, RANKS = 256, 2, 2
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ARCH_OVERRIDES = {
    "llama": ["model.arch=llama", "model.num_key_value_heads=2", "model.intermediate_size=352"],
    "gpt": ["model.arch=gpt", "model.num_key_value_heads=null", "model.intermediate_size=null"],
    "bloom": ["model.arch=bloom", "model.num_key_value_heads=null", "model.intermediate_size=null"],
}
BASE = ["recipe=tiny", "model.hidden_size=128", "model.num_attention_heads=4", "model.vocab_size=256",
        f"data.seq_length={SEQ}", f"batch.micro_batch_size={MICRO}", "cluster=cpu", "cluster.nodes=1",
        f"cluster.gpus_per_node={RANKS}", "parallel.zero_stage=0"]


def overrides(case) -> list:
    degree = "parallel.sequence_degree" if case["mode"] == "ulysses" else "parallel.tensor_degree"
    return BASE + ARCH_OVERRIDES[case["arch"]] + [
        f"precision={case['dtype']}", f"model.num_hidden_layers={case['layers']}", f"{degree}={RANKS}",
        f"batch.global_batch_size={MICRO}", f"model.activation_checkpointing={str(case['ckpt']).lower()}",
        f"parallel.sequence_parallel={str(case['mode'] == 'pipe-sp').lower()}"] + (
        [f"model.checkpoint_blocks={case['checkpoint_blocks']}"] if case.get("checkpoint_blocks") else [])


def ids_for(cfg):
    return torch.randint(0, cfg.model.vocab_size, (MICRO, SEQ), generator=torch.Generator().manual_seed(0))


def run_pipe(case, cfg, layout, held):
    from deepspeed.runtime.activation_checkpointing import checkpointing

    from launcher.parallel.pipeline import causal_lm_loss, layer_specs
    from launcher.parallel.tensor import TensorParallel, register_sequence_parallel_grad_hooks
    from launcher.runtime.build import SeededInit, init_rules, meta_model
    from launcher.runtime.model import attn_implementation

    tp = TensorParallel(dist.new_group(list(range(RANKS))), dist.get_rank(), RANKS, layout.sequence_parallel)
    full = meta_model(cfg.model, vocab_size=layout.padded_vocab_size)
    specs = layer_specs(full, cfg.model.arch, attn_implementation(cfg.model.arch), False, tp,
                        SeededInit(cfg.train.seed, init_rules(full)))
    layers = torch.nn.ModuleList([spec.build() for spec in specs]).to(DTYPES[case["dtype"]])
    register_sequence_parallel_grad_hooks(layers, tp.group)   # as build_pipeline_module does (0 without SP)
    ids = ids_for(cfg)

    def forward():
        x = ids
        for layer in layers:
            if case["ckpt"] and "DecoderBlockPipe" in type(layer).__name__:
                x = checkpointing.checkpoint(layer, x)
                # DeepSpeed's CheckpointFunction keeps its inputs as a ctx attribute (save_args_for_backward sets
                # ctx.deepspeed_saved_tensors), not through save_for_backward, so the hook cannot see them: read
                # them off the node autograd holds (the ctx is the grad_fn).
                held.update({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                             for t in x.grad_fn.deepspeed_saved_tensors})
            else:
                x = layer(x)
        return causal_lm_loss(x, ids, tp.group)   # the head's logits are split over the vocabulary

    return layers, forward, lambda loss: loss.backward()


def run_tp(case, cfg, layout, held):
    import deepspeed

    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.parallel.tensor_model import build_tensor_parallel_model

    assert layout.pipeline_layers and layout.pipeline_degree == 1   # train.py's build_engine takes this path
    model, mpu = build_tensor_parallel_model(cfg, layout, seed=cfg.train.seed)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=build_deepspeed_config(cfg, layout), mpu=mpu)
    ids = ids_for(cfg)
    if case.get("document_mask"):
        from launcher.runtime.documents import document_position_ids

        ids[0, [30, 100, 101, 200]] = 0  # EOS = 0: documents of 31, 70, 1, 99 and 56 tokens in row 0
        ids[1, [10, 150]] = 0
        position_ids = document_position_ids(ids, 0)
        return engine.module, lambda: engine(input_ids=ids, labels=ids, position_ids=position_ids).loss, engine.backward
    return engine.module, lambda: engine(input_ids=ids, labels=ids).loss, engine.backward


_SP = {}


def run_ulysses(case, cfg, layout, held):
    from launcher.parallel.sequence import build_sequence_parallel_model, sequence_parallel_loss, setup_sequence_parallel
    from launcher.train import maybe_apply_activation_checkpointing

    if not _SP:
        _SP["mpu"] = setup_sequence_parallel(RANKS)
    model = build_sequence_parallel_model(cfg.model, cfg.train.seed, layout.padded_vocab_size).to(DTYPES[case["dtype"]])
    maybe_apply_activation_checkpointing(cfg, model)
    model.train()
    ids = ids_for(cfg)
    return model, lambda: sequence_parallel_loss(model, ids, dist.get_rank(), RANKS), lambda loss: loss.backward()


def measure(case) -> int:
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout

    cfg = compose(overrides(case))
    layout = resolve_layout(cfg)
    held = {}   # storages kept outside autograd's saved tensors, measured where they are kept
    run = {"pipe": run_pipe, "pipe-sp": run_pipe, "tp": run_tp, "ulysses": run_ulysses}[case["mode"]]
    module, forward, backward = run(case, cfg, layout, held)
    module.train()
    if case["ckpt"] and case["mode"] == "ulysses" and case["arch"] == "llama":
        # cos/sin reach checkpointed blocks as keyword arguments, kept by the checkpoint's closure (the hook
        # cannot see them): measured at their source, as in test_activations.py.
        module.model.rotary_emb.register_forward_hook(
            lambda m, a, out: held.update({o.untyped_storage().data_ptr(): o.untyped_storage().nbytes() for o in out}))
    loss, n = saved_bytes(forward, param_storages(module), held)   # held and saved storages, each once
    backward(loss)  # the graph is complete and runs
    return n


def main():
    import deepspeed

    from launcher.runtime.distributed import avoid_shm_comm_build, leave_rank

    out_dir, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    avoid_shm_comm_build("cpu")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    # Ulysses last: its attention registration and groups are process-wide.
    cases.sort(key=lambda c: c["mode"] == "ulysses")
    results = {}
    for c in cases:
        try:
            results[c["name"]] = measure(c)
        except (AssertionError, NotImplementedError) as e:  # a path the runtime refuses: reported, not hidden
            results[c["name"]] = {"error": str(e)}
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.barrier()
    leave_rank()   # results are on disk: exit without the interpreter's teardown (see leave_rank)


if __name__ == "__main__":
    main()
