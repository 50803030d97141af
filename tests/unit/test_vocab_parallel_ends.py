"""The planner's vocabulary-parallel ends (Shoeybi et al. 2019, section 3; Megatron-LM's VocabParallelEmbedding,
ColumnParallelLinear(parallel_output=True), vocab_parallel_cross_entropy), by hand arithmetic on recipe=tiny's LLaMA
at TP 2 x PP 2 (2 blocks a stage), fp32, micro-batch 8 x 128 tokens.

    h 128, f 352, heads = KV heads = 4, V 2,048 (a multiple of 2: no padding), untied head
    block        4 h^2 + 3 h f + 2 h = 65,536 + 135,168 + 256 = 200,960; its two RMSNorm weights (256) whole on
                 each TP rank, the rest halved: 100,352 + 256 = 100,608 a TP rank
    embedding    V h / 2 = 131,072 a TP rank (rows [r V/2, (r+1) V/2)), the head the same
"""

from __future__ import annotations

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout
from launcher.plan import activations as act
from launcher.plan.inputs import Hardware, model_shape, strategy
from launcher.plan.memory import activation_shape, estimate_memory, stage_params

TP2_PP2 = ["recipe=tiny", "cluster.gpus_per_node=4", "parallel.tensor_degree=2", "parallel.pipeline_degree=2",
           "parallel.partition_method=type:DecoderBlock", "parallel.zero_stage=0", "batch.global_batch_size=16"]


def _setup():
    cfg = compose(TP2_PP2)
    layout = resolve_layout(cfg)
    shape, st = model_shape(cfg.model), strategy(cfg, layout)
    assert (st.tensor_degree, st.pipeline_degree, st.padded_vocab_size, st.seq_length, st.micro_batch_size) == \
        (2, 2, 2048, 128, 8)
    return shape, st


def test_tp2_end_stages_hold_half_the_vocabulary_rows():
    shape, st = _setup()
    block = 100_608
    # last stage: its 2 blocks / 2 (norms whole) + the final norm (128, whole) + V h / 2 of the head
    assert stage_params(shape, st, 1) == 2 * block + 128 + 2048 * 128 // 2 == 332_416
    # first stage: V h / 2 of the embedding + its 2 blocks
    assert stage_params(shape, st, 0) == 2048 * 128 // 2 + 2 * block == 332_288


def test_tp2_loss_saves_its_vocabulary_columns():
    shape, st = _setup()
    m = activation_shape(shape, st)
    predicted = (128 - 1) * 8                    # causal_lm_loss's shift: s - 1 positions a sample
    loss = predicted * (4 * 2048 // 2 + 9)       # fp32 softmax of V/2 columns + int64 local target + bool valid
    assert loss == 1016 * 4105 == 4_170_680
    # the head end: the final RMSNorm (fp32 input 4h, rsqrt 4, normalised input and output 2 x 4h) on 1,024 tokens
    norm = 1024 * (4 * 128 + 4 + 2 * 4 * 128)
    assert act.head_bytes(m, 128, 8, "fp32", 1, pipeline=True, sp_tp=1, tp=2) == norm + loss == 5_747_640
    # the embedding end: the rank-local int64 ids and the bool out-of-range mask, 9 bytes a token
    assert act.embedding_bytes(m, 128, 8, "fp32", tp=2) == 1024 * 9
    # the last stage's loss end at its peak, the loss's forward (tests/plan/test_loss_end_memory.py measures it): the
    # saved loss, and beside it the logits (4 B x 1,024 rows x 1,024 columns), their fp32 copy (the reshape of the
    # shifted slice) and exp's temporary (4 B each x 1,016 x 1,024); the backward, which writes the logits' gradient
    # over the saved softmax, stays below it
    hw = Hardware(name="test", peak_tflops=1.0, memory_bytes=1e12, intra_node_gbps=1.0, inter_node_gbps=1.0,
                  source="test", profile=None, device="cuda")
    last = estimate_memory(shape, st, hw).stages[-1]
    transient = 4 * 1024 * 1024 + 8 * 1016 * 1024
    assert transient == 12_517_376
    assert last.stage == 1 and last.logits == loss + transient == 16_688_056


def test_bloom_176b_end_stages_hold_the_published_share():
    """BLOOM-176B, TP 4 x PP 12 (BigScience 2022, section 3.4.2: 3.98B per TP4 rank of an end stage). By hand, h 14,336,
    padded V 250,880, a block 12 h^2 + 13 h = 2,466,437,120 of which 6 h (two LayerNorms, two row-parallel biases)
    stay whole: the first stage's rank holds V h / 4 + 2 h (the embedding LayerNorm) + 5 ((block - 6 h) / 4 + 6 h),
    the last stage's 5 blocks the same + 2 h (ln_f) + V h / 4 (its copy of the tied embedding)."""
    cfg = compose(["recipe=bloom-176b"])
    layout = resolve_layout(cfg)
    shape, st = model_shape(cfg.model), strategy(cfg, layout)
    h, v, block = 14_336, 250_880, 2_466_437_120
    assert (st.tensor_degree, st.pipeline_degree, st.padded_vocab_size) == (4, 12, v)
    ends = v * h // 4 + 2 * h + 5 * ((block - 6 * h) // 4 + 6 * h)
    assert ends == 3_982_551_552
    assert stage_params(shape, st, 0) == stage_params(shape, st, 11) == ends
