"""model.chunked_loss: the head's matmul and the cross-entropy computed a chunk of tokens at a time, so that no
(tokens x vocabulary) tensor of the whole micro-batch is ever held.

Why: transformers' causal-LM loss (loss_utils.ForCausalLMLoss) upcasts the whole micro-batch's logits to fp32 and
its log-softmax saves them for backward: 4 V bytes a token kept from the forward's end to the backward's start, and
8 V bytes a token more while the backward turns them into the logits' gradient (plan/activations.py
loss_bytes_per_token, loss_end_transient_bytes; tests/plan/test_loss_end_memory.py). At Llama 3's 128,256-token
vocabulary and 8,192 tokens a micro-batch that is 4.2 GB saved and 8.4 GB on top, whatever the model's width.

What runs instead (the recompute form of a fused linear cross-entropy, as Liger-Kernel's fused_linear_cross_entropy
without its Triton kernels and without computing gradients in the forward, which would hold the head weight's
gradient through the whole backward): the forward computes each chunk's logits, their fp32 log-sum-exp and the
target's logit, and keeps only the log-sum-exp (4 bytes a token) beside the head's input and the targets; the
backward computes each chunk's logits again (one more head GEMM forward, 2 n h V FLOPs), turns them into the fp32
softmax minus the one-hot target in place, and multiplies that by the weight (the input's gradient) and by the input
(the weight's gradient, summed over the chunks in the weight's dtype). The arithmetic is
transformers': logits in the model's dtype, softmax in fp32, the logits' gradient rounded to the model's dtype before
its two GEMMs, the mean over the predicted tokens (tests/train/test_chunked_loss.py compares every parameter's
gradient with transformers' loss).

Chunk: plan/activations.py loss_chunk_rows (one formula, shared with the planner's memory and step time).
Where: the transformers model (DP, ZeRO 0-3, Ulysses, ring-attention CP without TP): launcher/config/layout.py
refuses it with TP or pipeline stages, whose layer list computes its own logits.
"""
from __future__ import annotations

import types

import torch
import torch.nn as nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from launcher.plan.activations import loss_chunk_rows

IGNORE = -100


class _ChunkedHeadLoss(torch.autograd.Function):
    """Sum over `targets` != -100 of -log softmax(hidden @ weight^T)[target], `chunk` rows at a time."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk: int):
        n = hidden.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for i in range(0, n, chunk):
            logits = torch.matmul(hidden[i:i + chunk], weight.t()).float()   # transformers: logits.float()
            t = targets[i:i + chunk]
            valid = t != IGNORE
            picked = logits.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1)
            lse[i:i + chunk] = torch.logsumexp(logits, dim=-1)
            del logits
            total += ((lse[i:i + chunk] - picked) * valid).sum()
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk = chunk
        return total

    @staticmethod
    def backward(ctx, grad_total):
        hidden, weight, targets, lse = ctx.saved_tensors
        chunk = ctx.chunk
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if want_h else None
        # The weight's gradient summed over the chunks in its own dtype, as Liger-Kernel does (addmm into it): one
        # rounding a chunk in bf16 where transformers' single GEMM over all the tokens rounds once. An fp32 sum would
        # hold 4 V h bytes more, and on CPU its mixed-dtype add_ makes a 4 V h temporary as well (measured).
        grad_w = torch.zeros_like(weight) if want_w else None
        for i in range(0, hidden.shape[0], chunk):
            h = hidden[i:i + chunk]
            t = targets[i:i + chunk]
            valid = t != IGNORE
            g = torch.matmul(h, weight.t()).float()
            g.sub_(lse[i:i + chunk].unsqueeze(1)).exp_()                     # the fp32 softmax, in place
            g.scatter_add_(1, t.clamp(min=0).unsqueeze(1), -valid.to(g.dtype).unsqueeze(1))
            g.mul_((valid * grad_total).to(g.dtype).unsqueeze(1))            # ignored rows contribute nothing
            g = g.to(hidden.dtype)                                           # transformers: the cast's backward
            if want_h:
                torch.matmul(g, weight, out=grad_h[i:i + chunk])
            if want_w:
                grad_w.addmm_(g.t(), h)
            del g
        return grad_h, grad_w, None, None


def chunked_token_loss_sum(hidden, weight, targets, vocab_size: int):
    """The summed fp32 next-token losses of `targets` (b, s; already aligned with the positions, -100 ignored) through
    the head `weight` (V, h) from `hidden` (b, s, h), a chunk at a time: what launcher/parallel/pipeline.py
    token_loss_sum computes from whole logits (Ulysses' and ring attention's losses, their rank's tokens)."""
    b, s, h = hidden.shape
    chunk = loss_chunk_rows(b * s, vocab_size, h)
    return _ChunkedHeadLoss.apply(hidden.reshape(b * s, h), weight, targets.reshape(-1), chunk)


def chunked_head_loss(hidden, weight, labels, vocab_size: int):
    """transformers' ForCausalLMLoss of `hidden` (b, s, h) through the head `weight` (V, h) and `labels` (b, s): the
    labels shifted left by one (the last position predicts nothing), the mean over the predicted tokens, the fp32
    softmax; computed a chunk at a time (module docstring)."""
    targets = nn.functional.pad(labels, (0, 1), value=IGNORE)[:, 1:]
    return chunked_token_loss_sum(hidden, weight, targets, vocab_size) / (targets != IGNORE).sum()


class ChunkedLossHead(nn.Module):
    """Takes the place of the causal LM's `lm_head` (the same Parameter, so tying, checkpoints and exports are
    unchanged: state-dict key `lm_head.weight`). Its forward takes the labels and returns the loss, so that ZeRO-3
    gathers the head's weight around it (its module hooks) for the forward and again for the backward."""

    def __init__(self, head: nn.Linear):
        super().__init__()
        if getattr(head, "bias", None) is not None:
            raise ValueError("model.chunked_loss: the head has a bias; the chunked loss computes a bias-free head")
        self.weight = head.weight

    def forward(self, hidden, labels=None, targets=None):
        if targets is not None:
            return chunked_token_loss_sum(hidden, self.weight, targets, self.weight.shape[0])
        return chunked_head_loss(hidden, self.weight, labels, self.weight.shape[0])


def _forward(self, input_ids=None, labels=None, position_ids=None, targets=None, **kwargs):
    """The causal LM's forward with the chunked loss: the base model's last hidden state (after the final norm), then
    the head and the loss together. Returns only the loss: transformers' mean over `labels` shifted (the plain
    engine), or with `targets` (already aligned, as Ulysses' and ring attention's losses hold their rank's tokens'
    targets) their sum."""
    if (labels is None) == (targets is None):
        raise ValueError("model.chunked_loss computes the loss only: call the model with labels or with targets")
    hidden = self.base_model(input_ids=input_ids, position_ids=position_ids, **kwargs).last_hidden_state
    return CausalLMOutputWithPast(loss=self.lm_head(hidden, labels, targets))


def installed(model) -> bool:
    """Whether `model` (or the DeepSpeed engine around it) computes its loss with the chunked head."""
    head = getattr(getattr(model, "module", model), "get_output_embeddings", None)   # our TP layers have none
    return head is not None and isinstance(head(), ChunkedLossHead)


def install(model) -> None:
    """Give the transformers causal LM `model` the chunked loss in place (its lm_head and its forward)."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"model.chunked_loss: the head is a {type(head).__name__}, not a Linear")
    model.lm_head = ChunkedLossHead(head)
    model.forward = types.MethodType(_forward, model)
