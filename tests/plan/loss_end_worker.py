"""Peak live bytes of the loss end, as each runtime path computes it, on torch's memory timeline (a worker of
tests/plan/test_loss_end_memory.py; `torchrun --nproc_per_node 2 tests/plan/loss_end_worker.py OUT.json`).

Each case starts from the head's input (b, s, h, requiring grad) and its weight (this rank's V/t rows), then runs
what the runtime runs: the head's matmul, the loss, and the backward through them. torch.profiler records every
allocation and free (profile_memory=True); torch's MemoryProfileTimeline turns them into the bytes alive at each
moment. The case's reading is the highest of those above the first: what the head and loss add at their peak.
`held`: the logits stay referenced through the backward, as DeepSpeed's PipelineEngine keeps the last stage's
outputs in pipe_buffers (launcher/parallel/pipeline.py ReleasingLoss). The two ranks are one TP group for the
vocabulary-parallel cases; each reads its own.
"""
from __future__ import annotations

import json
import sys
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import MemoryProfileTimeline
from transformers.loss.loss_utils import ForCausalLMLoss

from launcher.parallel.pipeline import ReleasingLoss, causal_lm_loss, context_pipeline_loss

BATCH, SEQ, HIDDEN, VOCAB = 2, 128, 4, 4096
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def paths(group):
    """name -> (tensor degree, loss(logits, labels), engine holds the logits) for every way the runtime computes its
    loss, plus one without ReleasingLoss (what DeepSpeed's PipelineEngine would keep without it)."""
    layers, layers_tp = partial(causal_lm_loss, tp_group=None), partial(causal_lm_loss, tp_group=group)
    return {
        # the plain engine: transformers' model computes its own loss (labels shifted, logits whole)
        "transformers": (1, lambda lg, lb: ForCausalLMLoss(lg, lb, vocab_size=VOCAB), False),
        # the pipeline engine (our layer list): the logits' last position dropped, the engine keeping the logits
        "layers": (1, ReleasingLoss(layers), True),
        "layers-vocab-parallel": (2, ReleasingLoss(layers_tp), True),
        # the pipeline engine under ring-attention CP: targets shifted over the whole sequence, the logits whole
        "context": (1, ReleasingLoss(partial(context_pipeline_loss, cp=1)), True),
        "context-vocab-parallel": (2, ReleasingLoss(partial(context_pipeline_loss, cp=1, tp_group=group)), True),
        # TP at pipeline_degree 1 (launcher/parallel/tensor_model.py): the loss inside the plain engine's forward
        "plain-vocab-parallel": (2, layers_tp, False),
        # without ReleasingLoss: the engine's reference keeps the logits through the backward
        "layers-unreleased": (1, layers, True),
        "layers-vocab-parallel-unreleased": (2, layers_tp, True),
    }


def peak_above_start(fn) -> float:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    live = [sum(row) for row in sizes]
    return float(max(live) - live[0])


def case(loss_fn, tp: int, dtype, held: bool) -> float:
    torch.manual_seed(0)
    hidden = torch.randn(BATCH, SEQ, HIDDEN, dtype=dtype, requires_grad=True)
    weight = torch.randn(VOCAB // tp, HIDDEN, dtype=dtype)     # this rank's rows of the (vocab-parallel) head
    labels = torch.randint(0, VOCAB, (BATCH, SEQ))

    def run():
        logits = F.linear(hidden, weight)
        loss = loss_fn(logits, labels)
        keep = logits if held else None
        del logits
        loss.backward()
        del keep
    return peak_above_start(run)


# model.chunked_loss (launcher/runtime/chunked_loss.py): (batch, seq, hidden) where its peak is the forward's chunk
# (the vocabulary many times the width) and where it is the backward's input gradient (the width near the vocabulary).
CHUNKED_SHAPES = ((2, 100, 48), (2, 64, 1000))


def chunked_case(batch: int, seq: int, hidden: int, dtype) -> float:
    """The head and loss of model.chunked_loss from the head's input, as case() does for the whole loss. oneDNN is off:
    its bf16 GEMM on CPU takes a scratch buffer per call (measured up to 272 KB at these shapes, on top of the
    tensors), which CUDA's cuBLAS, with its workspace allocated once, does not."""
    from launcher.runtime.chunked_loss import chunked_head_loss

    torch.manual_seed(0)
    hidden_states = torch.randn(batch, seq, hidden, dtype=dtype, requires_grad=True)
    weight = torch.randn(VOCAB, hidden, dtype=dtype)
    labels = torch.randint(0, VOCAB, (batch, seq))

    def run():
        chunked_head_loss(hidden_states, weight, labels, VOCAB).backward()
    with torch.backends.mkldnn.flags(enabled=False):
        return peak_above_start(run)


def main() -> None:
    dist.init_process_group("gloo")
    group = dist.new_group([0, 1])
    out = []
    for name, (tp, loss_fn, held) in paths(group).items():
        for dtype in DTYPES:
            out.append({"path": name, "tp": tp, "dtype": dtype, "held": held, "rank": dist.get_rank(),
                        "peak_bytes": case(loss_fn, tp, DTYPES[dtype], held)})
    chunked = [{"batch": b, "seq": s, "hidden": h, "dtype": dtype, "peak_bytes": chunked_case(b, s, h, DTYPES[dtype])}
               for b, s, h in CHUNKED_SHAPES for dtype in DTYPES] if dist.get_rank() == 0 else []
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, out)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"batch": BATCH, "seq": SEQ, "hidden": HIDDEN, "vocab": VOCAB,
                       "cases": [c for rank in every for c in rank], "chunked": chunked}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
