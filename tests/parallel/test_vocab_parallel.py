"""The vocabulary-parallel ends (launcher/parallel/tensor.py) on 2 gloo ranks against the whole-vocabulary
computation on one: the embedding's output and weight gradient, and the cross entropy's per-token losses and
logits gradient, with ignored targets and targets on both ranks. Gradients are compared directly, so a factor of 2
(a sum where a mean belongs, a missing or doubled all-reduce) fails."""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

V, H, B, S = 10, 6, 2, 5


def _data():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B * S, V, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (B * S,), generator=g)
    targets[[1, 7]] = -100
    ids = torch.randint(0, V, (B, S), generator=g)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)
    upstream = torch.randn(B, S, H, generator=g, dtype=torch.float64)
    return logits, targets, ids, weight, upstream


def _rank(rank: int, port: int, out) -> None:
    from launcher.parallel.tensor import TensorParallel, vocab_parallel_cross_entropy, vocab_parallel_embedding

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    tp = TensorParallel(dist.group.WORLD, rank, 2)
    logits, targets, ids, weight, upstream = _data()
    rows = slice(rank * V // 2, (rank + 1) * V // 2)

    mine = logits[:, rows].clone().requires_grad_()
    losses = vocab_parallel_cross_entropy(mine, targets, tp.group)
    (losses.sum() / (targets != -100).sum()).backward()

    w = weight[rows].clone().requires_grad_()
    hidden = vocab_parallel_embedding(ids, w, tp)
    (hidden * upstream).sum().backward()
    out.put((rank, losses.detach(), mine.grad, hidden.detach(), w.grad))
    dist.destroy_process_group()


def test_vocab_parallel_embedding_and_cross_entropy_match_the_whole_vocabulary():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, rest) for r, *rest in (out.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0

    logits, targets, ids, weight, upstream = _data()
    whole = logits.clone().requires_grad_()
    ref = F.cross_entropy(whole, targets, ignore_index=-100, reduction="none")
    F.cross_entropy(whole, targets, ignore_index=-100).backward()
    w = weight.clone().requires_grad_()
    ref_hidden = F.embedding(ids, w)
    (ref_hidden * upstream).sum().backward()

    for r in range(2):
        losses, grad, hidden, w_grad = got[r]
        torch.testing.assert_close(losses, ref.float(), rtol=1e-6, atol=1e-6)   # fp32, as transformers' loss
        rows = slice(r * V // 2, (r + 1) * V // 2)
        torch.testing.assert_close(grad, whole.grad[:, rows].float().double(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(hidden, ref_hidden.detach())
        torch.testing.assert_close(w_grad, w.grad[rows])
    assert (ref[[1, 7]] == 0).all() and got[0][1][[1, 7]].abs().sum() == 0   # ignored tokens: no loss, no gradient
