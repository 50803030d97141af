"""Activation bytes: what the runtime's modules save for backward, per block and per pipeline stage (no torch).

Every term below is a tensor that autograd saves in the forward pass of the modules `launcher train` builds
(transformers 5.x LlamaDecoderLayer / BloomBlock / GPT2Block, our pipeline wrappers in
launcher/parallel/pipeline.py, our TP shards in launcher/parallel/tensor.py, Ulysses in
launcher/parallel/sequence.py), read off with torch.autograd.graph.saved_tensors_hooks, each storage
counted once, parameters excluded (tests/plan/activation_measure.py). tests/plan/test_activations.py
holds these formulas to that measurement within 2% for every arch x dtype x checkpointing x TP/SP
combination it builds.

Notation, per token (one position of one sequence) of one micro-batch on one rank: h hidden, f ffn width,
a heads, k KV heads, d = h / a head dim, V padded vocabulary, w bytes of the training dtype (bf16/fp16 2,
fp32 4), t tensor degree (our TP layers, launcher/parallel/tensor.py, with or without stages), u Ulysses
degree (a rank holds s / u tokens). A micro-batch has s b / u tokens on a rank.

LLaMA block (modeling_llama.py), bytes per token:
    2 x LlamaRMSNorm     4h (its input upcast to fp32: `hidden_states.to(torch.float32)`; in fp32 the block
                         input itself) + 4 (fp32 rsqrt of the variance) + w h (the normalised input in the
                         dtype, saved by `weight * x`) + w h (its output, saved by the next linears)
    q, k, v after rotary w (h + 2 k d) / t   (SDPA's inputs; the pre-rotary projections are not kept: q * cos
                         saves only cos, which needs no grad)
    SDPA                 w h / t (output, also o_proj's input: the kernel writes (b, s, a, d), so
                         transpose(1, 2).contiguous() is a no-op) + 4 a / t (fp32 logsumexp)
    SwiGLU MLP           4 w f / t: gate output (SiLU's input), SiLU output and up output (the product's
                         inputs), and the product (down_proj's input)
    total                8h + 8 + 4wh + w (2h + 2kd + 4f) / t + 4a / t
    bf16, MHA, t = 1:    8h + 8 + 8h + 4h + 8f + 4a = 20h + 8f + 4a + 8 (f = 8h/3: ~41.3 s b h; Korthikanti: 34)
  plus rotary cos and sin, 2 s d w per micro-batch: once per model in transformers (LlamaModel computes them for
  all layers), once per block in our layer list (DecoderBlockPipe recomputes them from the hidden states: every
  layout with stages or with TP, Layout.pipeline_layers).

BLOOM block (modeling_bloom.py, eager attention with ALiBi), bytes per token:
    2 x LayerNorm        w h (input) + 2 c (mean, rstd) + w h (output); c = 4 on CUDA (layer_norm_kernel.cu keeps
                         the statistics in fp32), the input dtype on CPU (measured: 2 bytes each in bf16)
    attention            3 w h / t (q, k: baddbmm's operands; v: bmm's) + w h / t (dense's input, the merged heads)
    scores               4 a s / t (softmax's fp32 output, `softmax(..., dtype=torch.float32)`) + w a s / t (its cast
                         back to the dtype, bmm's operand; the same storage in fp32, so 0 there)
    MLP                  2 w f / t (BloomGelu's input, dense_4h_to_h's input)
    total                4wh + 4c + (4wh + 2wf) / t + (4 + [w if w != 4]) a s / t

GPT-2 block (modeling_gpt2.py, SDPA, dropout 0), bytes per token:
    2 x LayerNorm        w h + 2 c + w h, as BLOOM
    attention            3 w h / t (c_attn's output: q, k, v are views of one storage) + w h / t + 4 a / t (SDPA)
    MLP                  4 w f / t: gelu_new (NewGELUActivation) is Python arithmetic, 0.5 x (1 + tanh(...)):
                         it keeps x, tanh's output, 0.5 x and 1 + tanh; + w f / t (c_proj's input)
    total                4wh + 4c + (4wh + 5wf + 4a) / t

Outside the blocks (first and last pipeline stage; both on a 1-stage run). Under TP (t > 1) the embedding, the head
and the loss are split over the vocabulary, rank r holding rows [r V/t, (r+1) V/t) of the padded vocabulary, as in
Megatron-LM (Shoeybi et al. 2019, section 3; core/tensor_parallel/layers.py VocabParallelEmbedding,
ColumnParallelLinear(parallel_output=True); core/tensor_parallel/cross_entropy.py vocab_parallel_cross_entropy):
    embedding            8 per token (int64 input ids, F.embedding's indices); GPT-2 also 8 s per micro-batch
                         (its position ids); BLOOM's word_embeddings_layernorm: w h + 2 c.
                         TP: 9 per token: F.embedding's indices are the rank-local ids (int64, ids - r V/t, 0
                         outside the rank's rows: a new storage; the input ids themselves are no longer saved, no
                         op with a gradient reads them) and masked_fill_ keeps the bool out-of-range mask (1)
    final norm + head    LLaMA 4h + 4 + 2wh, GPT-2 / BLOOM 2wh + 2c (the head's input is the norm's output; under
                         TP Megatron's copy-to-TP in front of the head is an identity forward and saves nothing)
    loss                 4V + 8 per predicted token: the fp32 log-softmax output (transformers' ForCausalLMLoss
                         and our causal_lm_loss upcast the logits with .float()) and the int64 targets. Predicted
                         tokens: transformers upcasts all s positions, our layer list's causal_lm_loss s - 1 (with
                         stages, and with TP at pipeline_degree 1).
                         TP: 4V/t + 9 per predicted token: vocab_parallel_cross_entropy saves the fp32 softmax of
                         the rank's V/t columns, each token's target column on this rank (int64, -1 elsewhere or
                         ignored) and the bool valid mask (loss_bytes_per_token)
    loss end's peak      transient, not saved: the highest moment of the head and loss above what they save
                         (loss_end_transient_bytes), read off torch's memory timeline (the profiler's
                         MemoryProfileTimeline, every tensor alive at each allocation) by
                         tests/plan/test_loss_end_memory.py. P predicted tokens, N = s b / u logits rows:
                         t = 1: the start of backward, 8V per predicted token: nll_loss_backward's fp32 gradient
                         of the log-probabilities and log_softmax_backward's fp32 output, alive together beside the
                         saved log-softmax (the 16-bit cast of the gradient comes after the first is freed, 4V + wV).
                         TP: the loss's forward, w N V/t + 8 P V/t: the logits, their fp32 copy (4; none in fp32
                         without the shift, where .float() and the reshape are views), x - max (the softmax to be
                         saved) and exp's temporary (4); the backward writes the gradient over the saved softmax
                         and its cast or slice-backward's zero-padded copy adds w V/t, below the forward's moment.
                         DeepSpeed's PipelineEngine (pipeline_degree > 1) keeps each micro-batch's outputs, the
                         last stage's logits, in pipe_buffers['outputs'], and its last-stage backward returns before
                         clearing them (deepspeed 0.19.8 runtime/pipe/engine.py _exec_backward_pass): our loss_fn
                         releases their storage once the loss is computed (launcher/parallel/pipeline.py
                         ReleasingLoss), so nothing of them outlives the loss's forward.
    chunked loss         model.chunked_loss (the transformers model on the plain engine; launcher/runtime/chunked_loss.py):
                         the head's GEMM and the loss a chunk of c = loss_chunk_rows rows at a time, so the loss saves
                         12 per row (the fp32 log-sum-exp and the int64 target) and its peak above that is one
                         chunk's, c V: the forward's 8 c V (the fp32 logits and logsumexp's x - max; the 16-bit
                         logits are freed by their upcast), or the backward's w N h (the input's gradient, written
                         chunk by chunk) + 4 c V (the fp32 softmax-minus-target) + w c V (its 16-bit cast, outside
                         fp32), whichever is higher. The head weight's gradient is summed into its own (V, h) buffer,
                         as the whole GEMM writes it.
    pipeline buffers     (pipeline_degree > 1, per in-flight micro-batch) DeepSpeed's PipelineEngine keeps each
                         micro-batch's stage output in pipe_buffers['outputs'] until its backward (a residual add:
                         no op saves it), cut over the TP ranks (pipe_partitioned: w x / t; under Megatron SP the
                         tensor holds s / t tokens already and is sent whole), and its stage input
                         in pipe_buffers['inputs'] (the whole tensor, all-gathered under TP) until it has sent the
                         input's gradient back; the input costs nothing more where the stage's first block saves
                         it anyway (a checkpointed block's input; LayerNorm's input; RMSNorm's fp32 input in fp32),
                         w x in 16-bit LLaMA-family blocks without recompute, whose RMSNorm keeps an fp32 copy
                         (pipeline_buffer_bytes; x = h b s tokens of the tensor between stages)
    receive buffer       (pipeline_degree > 1, once per stage, not per micro-batch) the engine receives activations
                         and gradients into buffers it keeps for the whole run: pipe_recv_buf (stages but the first)
                         and grad_layer (stages but the last) are views of one _grad_layer_buf per tensor
                         (_allocate_or_extend_buffers, deepspeed 0.19.8 runtime/pipe/engine.py), so a middle stage
                         holds one tensor, not two: x / t as sent (partitioned, or s / t tokens under SP), plus
                         the partition's int64 shape (72 bytes) (pipeline_receive_bytes)

Activation checkpointing (model.activation_checkpointing with model.checkpoint_mode=full: whole blocks,
transformers' gradient_checkpointing (non-reentrant) or DeepSpeed's reentrant checkpoint in the PipelineModule,
one block per checkpoint):
    kept per block       w h per token: the block's input (torch's _NoopSaveInputs; DeepSpeed's CheckpointFunction
                         keeps it as ctx.deepspeed_saved_tensors). Not divided by t: DeepSpeed partitions checkpointed
                         inputs over TP (partition_activations) only after deepspeed.checkpointing.configure,
                         which its engine never calls and we do not either, so every TP rank keeps the full input
                         (a departure from Megatron's 2sbh/t).
    working set          one block's full set (the formula above) while that block is recomputed in backward.

Selective checkpointing (model.checkpoint_mode=selective, launcher/runtime/recompute.py: torch's selective
checkpoint keeps the outputs of mm / addmm / bmm / baddbmm and the SDPA kernels, everything else is recomputed;
the transformers model only, t = u = 1): a checkpointed block keeps its input (w h, as above) plus, per token,
    LLaMA                w (h + 2 k d) (q, k, v projections, before rotary) + w h + 4 a (SDPA's output and fp32
                         logsumexp) + w h (o_proj's output) + 2 w f (gate, up) + w h (down_proj's output)
                         = w (4h + 2kd) + 2wf + 4a
    GPT-2                3 w h (c_attn) + w h + 4 a (SDPA) + w h (c_proj) + w f (c_fc) + w h (the MLP's c_proj)
                         = 6wh + wf + 4a
    BLOOM                3 w h (query_key_value) + w a s (baddbmm's scores, in the dtype) + w h (the context bmm)
                         + w h (dense) + w f (dense_h_to_4h) + w h (dense_4h_to_h) = 6wh + wf + was
  (bf16 LLaMA, h 128, f 352, 4 heads: 2,960 of the 5,400 bytes a token the block saves without checkpointing).
  Measured: the hooks' bytes plus the storages the policy's cache holds (tests/plan/test_activations.py).
    working set          the recomputed rest of one block (its full set minus the kept outputs) while it is
                         recomputed in backward.

Document mask (data.document_mask, launcher/runtime/documents.py; llama family and gpt on 1 rank / ZeRO DP, llama
family under our TP layers at pipeline_degree 1 too, where the embedding builds the mask and the blocks take
(hidden, position_ids, mask); tests/plan/test_activations_document_mask.py measures both, the TP one once the
runtime takes the position ids there):
positions restart after each EOS and transformers builds a boolean (b, 1, s, s) causal within-document mask
that every block's SDPA receives instead of is_causal. Measured on CPU (torch 2.13's flash-CPU kernel):
    per block            w s per token: the kernel keeps the mask converted to the training dtype (b x s x s x w
                         per block: quadratic in s; one mask for all heads, so not divided by t); llama with
                         grouped-query attention also 2 w (a - k) d / t: transformers repeats k and v to all
                         heads when a mask is given (sdpa_attention_forward passes enable_gqa only without one;
                         a view, no copy, when a rank holds one KV head)
    per micro-batch      llama: rotary cos and sin per sample (positions differ between samples): 2 s d w b instead
                         of 2 s d w; gpt: its position ids per sample, 8 s b instead of 8 s; with checkpointing
                         the boolean mask itself, b s s bytes, held by every checkpointed block's closure
                         (under our TP layers, pipeline_degree 1: the checkpointed blocks' inputs, the mask
                         and the int64 position ids, b s s + 8 b s; the blocks compute cos/sin per sample)
On CUDA SDPA takes the memory-efficient kernel with the same mask (the flash kernel takes no mask); its saved
set is not measured here (no GPU in the test environment), and these CPU figures are what the planner uses.

Parallelism:
    TP                   our TP layers (launcher/parallel/tensor.py), as a pipeline's stages and at
                         pipeline_degree = 1 (launcher/parallel/tensor_model.py on the plain engine): norms,
                         residual stream and the column-parallel inputs stay replicated; everything inside
                         attention and the MLP is divided by t (the formulas carry the split). Measured for
                         llama and bloom, with and without stages (tests/plan/test_activations.py). The ends are
                         vocab-parallel (above): a TP rank keeps the fp32 softmax of its V/t columns (4V/t + 9 per
                         predicted token) and a V/t-wide logits' gradient, and 9 bytes a token at the embedding.
                         GPT-2 has no TP path (no GPT layer list); the plan charges it the same ends.
    Megatron SP (llama)  parallel.sequence_parallel (Korthikanti et al. 2022, section 4.2.2), our pipeline-grid TP
                         only. The norms run on s / t tokens, so each RMSNorm keeps (4h + 4 + w h) / t per token;
                         its output is no longer saved (the sequence all-gather in front of attention / the MLP
                         saves nothing) but the gathered full-length tensor is, by q/k/v (gate/up): w h per
                         token, not divided. Attention and MLP terms are those of TP. So a LLaMA block keeps
                             2 (4h + 4 + w h) / t + 2 w h + (w (2h + 2kd) + 4a + 4 w f) / t
                         (TP alone: 2 (4h + 4 + 2 w h) + the same TP terms). It stops short of 1/t because the
                         gathered column-parallel inputs are full length (h = 128, s = 128, fp32, t = 2: a
                         block keeps 62 % of one rank's bytes under TP, 54 % under TP+SP). The final norm keeps
                         (4h + 4 + w h) / t plus the gathered head input w h; a checkpointed block keeps its
                         s / t-token input, w h / t per token; embedding ids, rotary and logits are those of TP
                         (the embedding's output is reduce-scattered to the sequence: no saved bytes).
    Ulysses (llama)      every per-token term is per local token (s / u of them). Attention after the all-to-all
                         holds the full sequence for a / u heads, the same bytes per local token, plus what the
                         all-to-alls add (see ULYSSES below).
    ring CP (llama)      every term is per local token (s / c of them, c = context_degree), attention included:
                         launcher/parallel/context.py's RingAttention saves q, k, v as given (k, v not repeated
                         for GQA), its output (stored in the layout o_proj reads, so one storage with o_proj's
                         input) and the fp32 logsumexp, which is what one-rank SDPA saves per token. The K/V blocks
                         passing around the ring are transient (freed after each block's kernel), not saved.
                         Measured on 2 and 4 ranks (tests/plan/test_context_activations.py): planned/measured
                         1.0000, a rank saving exactly 1/c of one rank's bytes.
    pipeline (1F1B)      stage i holds min(PP - i, m) micro-batches in flight (Narayanan et al. 2021, section
                         2.2.1); memory.py multiplies.

Where this departs from Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", section 4.1, Table 2: 34 s b h + 5 a s^2 b per GPT block): their count assumes Megatron's fused
kernels: LayerNorm storing only its 16-bit input (2sbh, no fp32 upcast, no separate output copy), GELU
storing its input only (8sbh), dropout masks (sbh each x 3; ours run without dropout), and a fused QKV
whose input is shared; transformers' modules store more (RMSNorm's fp32 upcast, four ffn-wide tensors in
SwiGLU and in gelu_new) and no masks; SDPA (flash / memory-efficient kernels on GPUs, the flash kernel on
CPU) keeps the fp32 logsumexp (4 a bytes per token) instead of the scores; and their full recompute
partitions the checkpoint over TP, which our runtime does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from launcher.config.supported import LLAMA_FAMILY

LN_STATS_BYTES = 4          # LayerNorm mean / rstd per token on CUDA (fp32 accumulation type)
RMS_STATS_BYTES = 4         # RMSNorm's fp32 rsqrt per token
INDEX_BYTES = 8             # int64 token ids / targets
MASK_BYTES = 1              # a bool per token: the vocab-parallel embedding's out-of-range mask, the loss's valid mask
LOGSUMEXP_BYTES = 4         # SDPA's fp32 logsumexp per head per token


def dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


@dataclass(frozen=True)
class ActivationShape:
    """The widths the formulas read (a view of inputs.ModelShape, so the tests can build it without a config)."""

    arch: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int            # padded vocabulary (the head's width)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def block_bytes_per_token(m: ActivationShape, seq_length: int, dtype: str, tp: int = 1, ulysses: int = 1,
                          sp: bool = False, document_mask: bool = False) -> float:
    """Bytes one block saves for backward per local token (no checkpointing), derivation in the module docstring.
    `sp`: Megatron sequence parallelism over the `tp` ranks (per token of the whole sequence, as for TP)."""
    h, f, a, k, d = m.hidden_size, m.intermediate_size, m.num_heads, m.num_kv_heads, m.head_dim
    w, c, t = dtype_bytes(dtype), LN_STATS_BYTES, tp
    if document_mask:  # DOCUMENT MASK: the mask in the dtype; k, v repeated to all heads under GQA
        # repeat_kv's expand + reshape copies unless a rank holds one KV head (then the reshape is a view of k, v).
        repeat = 2 * w * (a - k) * d / t if m.arch in LLAMA_FAMILY and k != a and k // t > 1 else 0.0
        return block_bytes_per_token(m, seq_length, dtype, tp, ulysses, sp) + w * seq_length + repeat
    if m.arch in LLAMA_FAMILY:
        norms = 2 * (4 * h + RMS_STATS_BYTES + 2 * w * h)
        if sp:  # each norm on s/t tokens; the gathered input of the column-parallel linears full length
            norms = 2 * ((4 * h + RMS_STATS_BYTES + w * h) / t + w * h)
        if ulysses > 1:
            attn = ulysses_attention_bytes_per_token(m, dtype)
        else:
            attn = (w * (h + 2 * k * d) + w * h + LOGSUMEXP_BYTES * a) / t
        return norms + attn + 4 * w * f / t
    if m.arch == "bloom":
        scores = (4 + (w if w != 4 else 0)) * a * seq_length / t
        return 4 * w * h + 4 * c + (4 * w * h + 2 * w * f) / t + scores
    if m.arch == "gpt":
        return 4 * w * h + 4 * c + (4 * w * h + 5 * w * f + LOGSUMEXP_BYTES * a) / t
    raise ValueError(f"unknown arch {m.arch!r}")


def ulysses_attention_bytes_per_token(m: ActivationShape, dtype: str) -> float:
    """LLaMA attention under Ulysses (launcher/parallel/sequence.py), per local token: see ULYSSES."""
    h, a, k, d = m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim
    w = dtype_bytes(dtype)
    # ULYSSES: SDPA keeps q, k, v after the first all-to-all (full sequence, a/u heads: per local token the
    # same bytes as a/u heads x u tokens), with k, v repeated to a heads for grouped-query attention (before
    # the exchange or after it, launcher/parallel/sequence.py: SDPA saves the repeated tensors either way; the
    # repeat itself saves nothing), its output and fp32 logsumexp; o_proj's input is the second
    # all-to-all's output, a storage of its own (w h).
    kv = 2 * h if k != a else 2 * k * d
    return w * (h + kv) + w * h + LOGSUMEXP_BYTES * a + w * h


def checkpointed_block_bytes_per_token(m: ActivationShape, dtype: str, sp_tp: int = 1, seq_length: int = 0,
                                       recompute: str = "full") -> float:
    """Bytes a checkpointed block keeps per local token between forward and its recompute: its input
    (1/sp_tp of it under Megatron sequence parallelism over sp_tp TP ranks), and under recompute="selective" the
    outputs the selection policy keeps (selective_kept_bytes_per_token)."""
    inp = dtype_bytes(dtype) * m.hidden_size / sp_tp
    return inp + (selective_kept_bytes_per_token(m, seq_length, dtype) if recompute == "selective" else 0.0)


def selective_kept_bytes_per_token(m: ActivationShape, seq_length: int, dtype: str) -> float:
    """The matmuls' and attention kernels' outputs a selectively checkpointed block keeps per token (SELECTIVE in
    the module docstring; one rank of the transformers model: no TP, Ulysses or CP)."""
    h, f, a, k, d = m.hidden_size, m.intermediate_size, m.num_heads, m.num_kv_heads, m.head_dim
    w = dtype_bytes(dtype)
    if m.arch in LLAMA_FAMILY:
        return w * (4 * h + 2 * k * d) + 2 * w * f + LOGSUMEXP_BYTES * a
    if m.arch == "gpt":
        return 6 * w * h + w * f + LOGSUMEXP_BYTES * a
    if m.arch == "bloom":
        return 6 * w * h + w * f + w * a * seq_length
    raise ValueError(f"unknown arch {m.arch!r}")


def rotary_bytes(m: ActivationShape, seq_length: int, dtype: str, ulysses: int = 1, samples: int = 1) -> float:
    """LLaMA's rotary cos and sin for one micro-batch (shape (samples, s, d) each, in the dtype: one sample's
    unless positions differ between samples, as under the document mask); 0 for other archs."""
    if m.arch not in LLAMA_FAMILY:
        return 0.0
    return 2 * samples * (seq_length // ulysses) * m.head_dim * dtype_bytes(dtype)


def embedding_bytes(m: ActivationShape, seq_length: int, micro_batch: int, dtype: str, ulysses: int = 1,
                    document_mask: bool = False, tp: int = 1) -> float:
    """What the embedding end saves for one micro-batch: the ids (under TP the rank-local ids and the bool
    out-of-range mask of VocabParallelEmbedding), GPT-2's position ids (one row, or one per sample under the
    document mask), BLOOM's embedding LayerNorm."""
    tokens = seq_length * micro_batch // ulysses
    out = (INDEX_BYTES + (MASK_BYTES if tp > 1 else 0)) * tokens
    if m.arch == "gpt":
        out += INDEX_BYTES * seq_length // ulysses * (micro_batch if document_mask else 1)
    if m.arch == "bloom":
        out += tokens * (dtype_bytes(dtype) * m.hidden_size + 2 * LN_STATS_BYTES)
    return out


def loss_bytes_per_token(m: ActivationShape, tp: int = 1, chunked: bool = False) -> float:
    """What the loss saves per predicted token: the fp32 log-softmax (4V) and the int64 target; under TP (t > 1)
    Megatron's vocab_parallel_cross_entropy: the fp32 softmax of the rank's V/t columns, the int64 local target
    column and the bool valid mask, 4V/t + 9. `chunked` (model.chunked_loss, launcher/runtime/chunked_loss.py): the
    fp32 log-sum-exp and the int64 target of each logits row, 12, whatever V."""
    if chunked:
        return 4 + INDEX_BYTES
    if tp > 1:
        return 4 * m.vocab_size / tp + INDEX_BYTES + MASK_BYTES
    return 4 * m.vocab_size + INDEX_BYTES


def head_bytes(m: ActivationShape, seq_length: int, micro_batch: int, dtype: str, ulysses: int = 1,
               pipeline: bool = False, sp_tp: int = 1, tp: int = 1, chunked: bool = False) -> float:
    """What the head end saves for one micro-batch: final norm, head input, the loss's fp32 (log-)softmax and
    targets (loss_bytes_per_token; V/tp columns of it under TP).
    `sp_tp`: the final norm runs on 1/sp_tp of the tokens (Megatron SP), its gathered output is the head's input."""
    w, h = dtype_bytes(dtype), m.hidden_size
    tokens = seq_length * micro_batch // ulysses
    if m.arch in LLAMA_FAMILY:
        norm = 4 * h + RMS_STATS_BYTES + 2 * w * h
        if sp_tp > 1:
            norm = (4 * h + RMS_STATS_BYTES + w * h) / sp_tp + w * h
    else:
        norm = 2 * w * h + 2 * LN_STATS_BYTES
    return tokens * norm + predicted_tokens(seq_length, micro_batch, ulysses, pipeline) * loss_bytes_per_token(m, tp, chunked)


def loss_shifted(pipeline: bool, split: int) -> bool:
    """Whether the loss drops the logits' last position: our layer list's causal_lm_loss does (pipeline), except
    under CP (`split` > 1: context_pipeline_loss on the local tokens, no shift); transformers' loss shifts the labels
    instead."""
    return pipeline and split == 1


def loss_chunk_rows(rows: int, vocab_size: int, hidden_size: int) -> int:
    """model.chunked_loss: the tokens (logits rows) of one chunk, chosen so that a chunk's logits hold about as many
    elements as the head's input: ceil(rows / ceil(V / h)). Liger-Kernel's fused_linear_cross_entropy picks its
    chunk by the same ratio (rounded up to a power of two for its Triton kernel; launcher/runtime/chunked_loss.py
    has no kernel of its own and does not round)."""
    chunks = -(-vocab_size // hidden_size)
    return max(1, -(-rows // chunks))


def predicted_tokens(seq_length: int, micro_batch: int, ulysses: int = 1, shifted: bool = False) -> float:
    """Positions a rank's loss predicts in one micro-batch: our layer list's causal_lm_loss drops the last (`shifted`),
    transformers' loss shifts the labels instead and CP's loss has no shift, so all s b / u count."""
    return (seq_length - 1) * micro_batch if shifted else seq_length * micro_batch / ulysses


def loss_end_transient_bytes(m: ActivationShape, seq_length: int, micro_batch: int, dtype: str, ulysses: int = 1,
                              tp: int = 1, shifted: bool = False, chunked: bool = False) -> float:
    """The loss end's highest moment above what it saves for backward (head_bytes), for one micro-batch on one rank
    (module docstring, "loss end's peak"). `shifted`: the loss drops the last position (our layer list's
    causal_lm_loss; transformers' loss shifts the labels instead, CP's loss has no shift). `chunked`: model.chunked_loss
    (module docstring, "chunked loss")."""
    w = dtype_bytes(dtype)
    rows = seq_length * micro_batch / ulysses                  # logits rows (N)
    if chunked:
        cv = loss_chunk_rows(int(rows), m.vocab_size, m.hidden_size) * m.vocab_size    # one chunk's logits
        return max(8 * cv, w * rows * m.hidden_size + (4 if w == 4 else 4 + w) * cv)
    predicted = predicted_tokens(seq_length, micro_batch, ulysses, shifted)
    v = m.vocab_size / tp
    if tp == 1:
        return 8 * predicted * v
    copy = 0 if (w == 4 and not shifted) else 4
    return w * rows * v + (copy + 4) * predicted * v


def stage_input_saved(m: ActivationShape, dtype: str, checkpointed: bool) -> bool:
    """Whether a stage's first block saves its input tensor itself (module docstring, "pipeline buffers"): a
    checkpointed block keeps it, LayerNorm saves its input, LLaMA's RMSNorm its fp32 upcast (the input itself in
    fp32, a copy in 16-bit)."""
    return checkpointed or m.arch not in LLAMA_FAMILY or dtype_bytes(dtype) == 4


def pipeline_buffer_bytes(m: ActivationShape, seq_length: int, micro_batch: int, dtype: str, tp: int = 1,
                          split: int = 1, sp: bool = False, first: bool = False, last: bool = False,
                          input_saved: bool = True) -> float:
    """What DeepSpeed's PipelineEngine holds for one in-flight micro-batch of a stage beside the saved tensors
    (module docstring, "pipeline buffers"): the stage's output until its backward, cut over TP, and its input where
    the stage's first block does not save it. `split`: ranks sharing a sample's tokens (Ulysses x CP); `sp`: Megatron
    SP (the tensor between stages holds s / t tokens)."""
    x = dtype_bytes(dtype) * m.hidden_size * seq_length * micro_batch / split / (tp if sp else 1)
    cut = tp if not sp else 1     # launcher/deepspeed_config.py: pipe_partitioned under TP without SP
    return (0.0 if last else x / cut) + (0.0 if first or input_saved else x)


def pipeline_receive_bytes(m: ActivationShape, seq_length: int, micro_batch: int, dtype: str, tp: int = 1,
                           split: int = 1, sp: bool = False) -> float:
    """The PipelineEngine's receive buffer, one per stage for the whole run (module docstring, "receive buffer"):
    the tensor between stages as it travels, the same bytes as one micro-batch's held output."""
    return pipeline_buffer_bytes(m, seq_length, micro_batch, dtype, tp, split, sp, first=True, last=False)


def stage_saved_bytes(m: ActivationShape, blocks: int, seq_length: int, micro_batch: int, dtype: str,
                      recompute: str = "none", tp: int = 1, ulysses: int = 1, first: bool = True,
                      last: bool = True, pipeline: bool = False, sp: bool = False, context: int = 1,
                      document_mask: bool = False, checkpointed: Optional[int] = None, chunked: bool = False) -> float:
    """Bytes one micro-batch leaves saved for backward on one rank of a stage holding `blocks` blocks
    (and the embedding if `first`, the head and loss if `last`): what the tests measure. `checkpointed`: how many of
    the blocks are checkpointed under recompute="full" or "selective" (model.checkpoint_blocks; None: all); the others
    keep their whole saved set, as without recompute.
    `sp`: Megatron sequence parallelism over the `tp` ranks (parallel.sequence_parallel). `context`: the
    ring-attention degree (its ranks hold s / context tokens each, the same bytes per token as one rank)."""
    split = ulysses * context   # ranks sharing one sample's tokens (one of the two is 1)
    tokens = seq_length * micro_batch / split
    sp_tp = tp if sp else 1
    ckpt = (blocks if checkpointed is None else min(blocks, checkpointed)) if recompute != "none" else 0
    kept = tokens * checkpointed_block_bytes_per_token(m, dtype, sp_tp, seq_length, recompute)
    whole = tokens * block_bytes_per_token(m, seq_length, dtype, tp, ulysses, sp, document_mask)
    rotary = rotary_bytes(m, seq_length, dtype, split, micro_batch if document_mask else 1)
    held = 0.0
    if document_mask and ckpt:
        # DOCUMENT MASK: the bool mask, held by the checkpoints (one storage for all blocks); in our layer list the
        # checkpointed blocks' inputs are (hidden, position_ids, mask), so the int64 position ids too.
        held = micro_batch * seq_length * seq_length + (INDEX_BYTES * micro_batch * seq_length if pipeline else 0)
    # The pipeline's blocks each compute their own cos/sin (kept unless the block is checkpointed); the
    # transformers model computes them once for all layers.
    if pipeline:
        whole += rotary
        rotary = 0.0
    total = ckpt * kept + (blocks - ckpt) * whole + (rotary + held if blocks else 0.0)
    if first:
        total += embedding_bytes(m, seq_length, micro_batch, dtype, split, document_mask, tp)
    if last:
        total += head_bytes(m, seq_length, micro_batch, dtype, split, loss_shifted(pipeline, split), sp_tp, tp, chunked)
    return total
