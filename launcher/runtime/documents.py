"""data.document_mask: no attention across document boundaries inside a packed sample.

A packed sample is a window of data.seq_length tokens cut from documents joined by EOS (launcher/runtime/data.py:
every document is followed by its EOS), so it usually holds the tail of one document, whole documents and the
head of another. With the mask on, as Llama 3 trains (Dubey et al. 2024, section 3.2) and as Megatron-LM's
--reset-position-ids --reset-attention-mask do (megatron/core/datasets/gpt_dataset.py,
_get_ltor_masks_and_position_ids), each token

    - has a position counted from its document's first token (0 at the window's start and after every EOS), and
    - attends to the earlier tokens of its own document only (causal AND same document).

How it reaches the attention: we pass the restarting position ids alone, and transformers (5.x,
masking_utils.create_causal_mask -> find_packed_sequence_indices) reads a packed batch off them (a position that
does not follow its predecessor by 1 starts a new sequence: exact here, since every document starts at 0) and
builds the causal within-document mask itself, for every attention implementation of the model:
    - sdpa (what launcher/runtime/model.py selects, CPU and GPU): a boolean (micro, 1, seq, seq) mask built once
      per forward. With a mask SDPA cannot take its flash kernel (that one knows only is_causal): on CUDA it runs
      the memory-efficient kernel, on CPU the flash-CPU kernel with the mask. What that adds to the activations
      (a copy of the mask in the training dtype per layer, k and v repeated to all heads under GQA: transformers
      passes enable_gqa only without a mask) is measured and planned in launcher/plan/activations.py.
    - eager: the same mask, additive.
    - flash_attention_2 would take the position ids as varlen sequences (no mask at all, the fastest GPU path),
      and flex_attention a BlockMask; neither is selected: flash-attn is not a dependency, and transformers
      torch.compile's flex attention, while a CPU run must JIT-compile nothing.
tests/unit/test_document_mask.py holds the masked model's logits on a packed window to each document run alone,
so a transformers release that stopped building the mask from position ids fails there.

The loss is unchanged: the label of an EOS is the next document's first token, predicted from the EOS alone
(Megatron's default: its --eod-mask-loss is a separate option), and each document's first token is a target.
"""

from __future__ import annotations


def document_position_ids(input_ids, eos_id: int):
    """(micro, seq) int64 positions within each document: 0 at the window's start and right after every EOS."""
    import torch

    b, s = input_ids.shape
    idx = torch.arange(s, device=input_ids.device).expand(b, s)
    starts = torch.zeros((b, s), dtype=torch.bool, device=input_ids.device)
    starts[:, 1:] = input_ids[:, :-1] == eos_id
    # The index of the latest document start at or before each token (0 when none): a running maximum.
    first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - first
