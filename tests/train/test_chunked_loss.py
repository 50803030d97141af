"""model.chunked_loss (launcher/runtime/chunked_loss.py) against transformers' own loss on the same weights and batch:
the loss and every parameter's gradient (a gradient-scale or a missed-chunk error shows in the gradients, whatever an
optimizer would hide), in fp32 to rounding and in bf16 to bf16's precision. Shapes chosen so that the chunks do not
divide the tokens (the last chunk is short) and the vocabulary is not a multiple of the width. The 2-rank ZeRO 1 and
ZeRO 3 runs are in tests/train/test_train_runs.py (equivalence_driver's *_chunked cases)."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from launcher.plan.activations import loss_chunk_rows
from launcher.runtime import chunked_loss

VOCAB, HIDDEN, BATCH, SEQ = 1000, 48, 2, 37


def llama(dtype):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    return LlamaForCausalLM(cfg).to(dtype)


def gpt(dtype):
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=64, use_cache=False,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)        # tied head
    return GPT2LMHeadModel(cfg).to(dtype)


def grads(model, ids, labels):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def both(build, dtype, labels_fn=lambda ids: ids):
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels = labels_fn(ids)
    whole = build(dtype)
    chunked = copy.deepcopy(whole)
    chunked_loss.install(chunked)
    return grads(whole, ids, labels), grads(chunked, ids, labels), chunked


def test_the_chunks_do_not_divide_the_tokens():
    rows = BATCH * SEQ
    chunk = loss_chunk_rows(rows, VOCAB, HIDDEN)
    assert rows % chunk and VOCAB % HIDDEN and rows // chunk >= 3, chunk


@pytest.mark.parametrize("build", [llama, gpt], ids=["llama", "gpt-tied"])
def test_fp32_loss_and_gradients_equal_transformers(build):
    (loss_a, ga), (loss_b, gb), model = both(build, torch.float32)
    assert isinstance(model.lm_head, chunked_loss.ChunkedLossHead)
    assert torch.allclose(loss_a, loss_b, rtol=1e-6, atol=0), (loss_a, loss_b)
    assert ga.keys() == gb.keys()
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=1e-4, atol=1e-7), (name, (ga[name] - gb[name]).abs().max())
    # the head's weight is the same Parameter as before: GPT-2's stays tied to the embedding (one gradient, summed)
    assert (model.lm_head.weight is model.get_input_embeddings().weight) == (build is gpt)


def test_ignored_targets_count_as_in_transformers():
    def some_ignored(ids):
        labels = ids.clone()
        labels[0, 5:20] = -100
        labels[1, -3:] = -100
        return labels
    (loss_a, ga), (loss_b, gb), _ = both(llama, torch.float32, some_ignored)
    assert torch.allclose(loss_a, loss_b, rtol=1e-6, atol=0)
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=1e-4, atol=1e-7), name


def test_bf16_gradients_equal_transformers_to_bf16_precision():
    (loss_a, ga), (loss_b, gb), _ = both(llama, torch.bfloat16)
    assert abs(loss_a.float() - loss_b.float()) < 1e-2 * loss_a.float()
    for name in ga:
        a, b = ga[name].float(), gb[name].float()
        rel = (a - b).norm() / a.norm()
        assert rel < 2e-2, (name, rel)      # measured 0.0054 at most; a factor of 2 would read 0.5 or 1



def test_the_model_saves_no_logits_sized_tensor():
    """What autograd keeps after the forward: nothing with the vocabulary's width but the head's weight (the
    saved-tensor hooks see every tensor the graph holds)."""
    model = llama(torch.float32)
    chunked_loss.install(model)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids).loss.backward()
    wide = [s for s in shapes if VOCAB in s]
    assert wide == [(VOCAB, HIDDEN)], wide
