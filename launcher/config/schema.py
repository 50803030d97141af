"""The typed schema of every config group, registered in Hydra's ConfigStore.

One dataclass per group; a docstring under every field. The schema stays
mutable so Hydra can compose and override it; what comes out of composition is
turned into a read-only config and a frozen `Layout` (see layout.py), and
derived numbers are never written back here.

Field names that map 1:1 to transformers or DeepSpeed keep that library's name.
Every int/float field's docstring ends with its range (`Range: ...`), which launcher/config/ranges.py checks
before anything starts. This module imports neither torch nor deepspeed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class ModelConfig:
    arch: str = "llama"
    """Architecture family: `llama` (LlamaForCausalLM; Llama 1/2/3.x), `mistral` (MistralForCausalLM), `qwen2`
    (Qwen2ForCausalLM: q/k/v biases), `bloom` (BloomForCausalLM) or `gpt` (GPT2LMHeadModel)."""
    hidden_size: int = MISSING
    """Width of the residual stream (transformers: hidden_size; GPT-2 calls it n_embd). Range: >= 1."""
    num_hidden_layers: int = MISSING
    """Number of transformer blocks. Range: >= 1."""
    num_attention_heads: int = MISSING
    """Query heads per block. Range: >= 1."""
    num_key_value_heads: Optional[int] = None
    """Key/value heads (grouped-query attention); null means equal to num_attention_heads. Range: >= 1, or null."""
    intermediate_size: Optional[int] = None
    """MLP inner width; null means 4 x hidden_size (bloom and gpt always use 4 x hidden_size). Range: >= 1, or null."""
    vocab_size: int = MISSING
    """Embedding rows. For data=stdlib it is also the size of the BPE tokenizer trained on the corpus. Range: >= 1."""
    max_position_embeddings: int = 2048
    """Longest sequence the positional scheme supports; must be >= data.seq_length. Range: >= 1."""
    tie_word_embeddings: bool = False
    """Share the input embedding with the output head (bloom and gpt always tie)."""
    rms_norm_eps: float = 1e-6
    """Epsilon of the RMSNorm (llama) or LayerNorm (bloom, gpt). Range: > 0, finite."""
    rope_theta: float = 10000.0
    """Base of the rotary embedding (llama, mistral, qwen2). Range: > 0, finite."""
    rope_scaling: Any = None
    """transformers' rope scaling of the llama family, e.g. {rope_type: llama3, factor: 8.0, low_freq_factor: 1.0,
    high_freq_factor: 4.0, original_max_position_embeddings: 8192} (Llama 3.1); null = plain RoPE. (Typed Any: OmegaConf
    2.3 can neither merge a command-line dict into a null Dict node nor add keys to an empty one under Hydra's struct mode.)"""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass (saves memory, costs ~33% more compute)."""
    checkpoint_blocks: Optional[int] = None
    """With activation_checkpointing: how many decoder blocks of each pipeline stage (of the model, without a
    pipeline) are checkpointed, counted from the stage's first; the others keep their activations. null = every block.
    Fewer recompute less and hold more memory (Megatron's --recompute-method block --recompute-num-layers); a stage
    with fewer blocks checkpoints all of them. Range: >= 1, or null."""
    checkpoint_mode: str = "full"
    """With activation_checkpointing: what a checkpointed block keeps. full = its input only, the whole forward runs
    again in the backward (~33% more compute); selective = also every matmul's and attention kernel's output, only
    the element-wise operators (norms, rotary, activation, residual adds) run again: no GEMM recomputed, about 60% of
    the block's activation bytes kept (launcher/runtime/recompute.py). selective runs on the transformers model
    (DP / ZeRO 0-3), not with TP, pipeline stages, Ulysses or CP."""
    chunked_loss: bool = False
    """Compute the head's matmul and the cross-entropy a chunk of tokens at a time (launcher/runtime/chunked_loss.py),
    never holding the whole micro-batch's logits: the loss keeps 12 bytes a token instead of 4 x vocab_size (the fp32
    log-softmax) and its peak is one chunk's, for one more forward of the head's GEMM. The same gradients as
    transformers' loss (the head weight's summed over the chunks in its dtype). Runs on the transformers model (DP /
    ZeRO 0-3, Ulysses, CP), not with TP (whose loss is already split over the vocabulary) or pipeline stages."""
    init_from: Optional[str] = None
    """Path of a transformers checkpoint directory (or an `owner/name` in the local HF cache) to start from instead of random init. Its config.json is then the
    model (trained and exported unchanged); every model.* value must equal it (launcher/config/hfmodel.py)."""
    hf_config: Optional[str] = None
    """A transformers config.json (or its directory) without weights: the model to build with the launcher's init,
    exported with that config. model.* must equal it, as for init_from."""
    name: str = "custom"
    """Human-readable name of this shape (set by the conf/model files)."""


@dataclass
class DataConfig:
    source: str = "stdlib"
    """Where text comes from: `stdlib` (this interpreter's standard library sources), `hf` (datasets.load_dataset), `tokens` (a pretokenized file) or `blend` (weighted token files in `sources`)."""
    seq_length: int = 256
    """Tokens per training sample. Range: >= 1."""
    paths: list[str] = field(default_factory=list)
    """data=hf: local json/jsonl/parquet/txt files; data=stdlib: extra directories to read (empty = the stdlib)."""
    hf_name: Optional[str] = None
    """data=hf: a dataset name on the hub (needs a network), used when `paths` is empty."""
    text_field: str = "text"
    """data=hf: the column holding the text."""
    tokens_path: Optional[str] = None
    """data=tokens: a packed token file written by a previous run (`*.bin` with its `*.idx.json`)."""
    tokenizer_path: Optional[str] = None
    """A trained tokenizer.json, or a transformers model/tokenizer directory or `owner/name` in the local HF cache (AutoTokenizer, local files only; e.g. the
    model.init_from directory), to use instead of training a byte-level BPE on the corpus."""
    val_fraction: float = 0.01
    """Fraction held out for evaluation: a seeded random set of documents (data=stdlib/hf), the last samples of a token file (data=tokens/blend). Range: [0, 0.5); > 0 when train.eval_every > 0."""
    cache_dir: str = "~/.cache/launcher"
    """Where tokenizers and packed token files are cached, keyed by a content hash."""
    max_bytes: Optional[int] = None
    """data=stdlib/hf: stop reading documents once this many bytes are read (a deterministic prefix); null = all. Range: >= 1, or null."""
    sources: list[Any] = field(default_factory=list)
    """data=blend: `[{path: ..., weight: ...}, ...]`, a token file (see data.tokens_path) or a raw corpus (pretokenized first) and its positive weight; each sample comes from source i with probability weight_i / sum(weights) (checked in layout.py)."""
    token_dtype: Optional[str] = None
    """data=tokens/blend: `uint16` or `uint32` for flat token files without an index (nanoGPT's `train.bin` is uint16)."""
    num_workers: int = 1
    """Processes that pretokenize data=stdlib/hf (1 = in this process). Range: >= 1."""
    split_seed: int = 0
    """Seed of the held-out document set (data=stdlib/hf); independent of train.seed so val losses stay comparable. Range: >= 0."""
    document_mask: bool = False
    """Attend only within each document of a packed sample: positions restart at 0 after every EOS and a token sees
    only the earlier tokens of its own document, as Llama 3 trains (Dubey et al. 2024, "The Llama 3 Herd of Models",
    section 3.2: "an attention mask that prevents self-attention between different documents within the same
    sequence") and Megatron-LM's --reset-position-ids --reset-attention-mask. Off: a window attends across document
    boundaries (GPT-2/3, nanoGPT). The loss is unchanged: an EOS still predicts the next document's first token.
    Needs token files that name their EOS (data=stdlib/hf, our data=tokens files) and model.arch llama, mistral,
    qwen2 or gpt on 1 rank or ZeRO data parallelism, llama, mistral or qwen2 with tensor_degree > 1 without a
    pipeline; refused before start with a pipeline, Megatron SP, Ulysses or CP (launcher/config/supported.py,
    launcher/runtime/documents.py)."""
    streaming: bool = False
    """data=hf: read the dataset with datasets' streaming mode and tokenize it inside every rank as training consumes
    it, instead of pretokenizing all of it into data.cache_dir first: for corpora larger than the disk cache.
    Needs data.tokenizer_path; a resume re-reads the stream up to its position (docs/data.md, launcher/runtime/stream.py)."""
    shuffle_buffer: int = 10000
    """data.streaming: documents pass through a shuffle buffer of this many (seeded by train.seed and the pass over
    the corpus); 0 = in corpus order. Range: >= 0."""


# DeepSpeed 0.19.8's ZeRO-3 fetching defaults (deepspeed/runtime/zero/config.py; tests/plan/test_zero3_gathered.py
# holds these to it): the parallel.zero3_* keys below default to them, and the plan replays what they keep gathered.
ZERO3_PARAM_PERSISTENCE_THRESHOLD = 100_000
ZERO3_MAX_REUSE_DISTANCE = 1_000_000_000
ZERO3_PREFETCH_BUCKET_SIZE = 50_000_000
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000


@dataclass
class ParallelConfig:
    tensor_degree: int = 1
    """Tensor-parallel ranks per model replica (TP); keep it within one node. Range: >= 1."""
    pipeline_degree: int = 1
    """Pipeline stages per model replica (PP). Range: >= 1."""
    sequence_degree: int = 1
    """Ulysses sequence-parallel ranks (SP); they take ranks like TP does. Range: >= 1."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism inside TP (Megatron-LM's --sequence-parallel; Korthikanti et al. 2022, section
    4.2.2): the TP ranks also split the sequence outside the TP regions (norms, residuals), so those activations
    are 1/tensor_degree per rank; all-gather + reduce-scatter replace each all-reduce (same bytes). Takes no
    extra ranks. Needs tensor_degree > 1; runs our TP layers (on the pipeline engine with stages, on the plain
    engine with ZeRO 0-2 when pipeline_degree = 1: launcher/parallel/tensor_model.py)."""
    context_degree: int = 1
    """Context-parallel ranks (CP, ring attention, head-tail chunks): each holds 2 chunks of seq_length / (2 CP) tokens
    of every sample of its replica; they take ranks like TP does (launcher/parallel/context.py). Range: >= 1."""
    data_degree: Optional[int] = None
    """Data-parallel replicas (DP). null: derived as world / (TP x PP x SP x CP); an explicit value is checked against that. Range: >= 1, or null."""
    zero_stage: int = 1
    """DeepSpeed ZeRO stage 0-3 (only 0 and 1 compose with pipeline_degree > 1). Range: 0..3."""
    offload_optimizer: bool = False
    """ZeRO-Offload: keep optimizer states (and the step) on the CPU; needs zero_stage >= 1."""
    offload_param: bool = False
    """ZeRO-Infinity parameter offload to CPU; needs zero_stage = 3."""
    partition_method: str = "parameters"
    """How pipeline stages split the layers: `uniform`, `parameters` or `type:<regex>` (DeepSpeed PipelineModule)."""
    zero3_max_live_parameters: int = ZERO3_MAX_LIVE_PARAMETERS
    """ZeRO 3 (DeepSpeed stage3_max_live_parameters): its prefetch stops while this many parameter elements are
    gathered whole; at the default the gathered set of any model past ~1B parameters grows to about this (2 GB a
    rank in bf16; `launcher plan` shows it). Lower it to save memory, at more all-gathers; the reuse distance still
    keeps the last modules, up to about zero3_max_reuse_distance / 2 elements, for their backward: lower both to go
    under that. Range: >= 0."""
    zero3_max_reuse_distance: int = ZERO3_MAX_REUSE_DISTANCE
    """ZeRO 3 (stage3_max_reuse_distance): a module's gathered weights are kept after it runs if it runs again within
    this many parameter elements of the module trace (the last blocks, for their backward). Range: >= 0."""
    zero3_prefetch_bucket_size: int = ZERO3_PREFETCH_BUCKET_SIZE
    """ZeRO 3 (stage3_prefetch_bucket_size): parameter elements each fetch gathers ahead of the module it runs.
    Range: >= 0."""
    zero3_param_persistence_threshold: int = ZERO3_PARAM_PERSISTENCE_THRESHOLD
    """ZeRO 3 (stage3_param_persistence_threshold): tensors of at most this many elements stay whole on every rank
    (norms, biases, small linears), never fetched. Range: >= 0."""


@dataclass
class BatchConfig:
    micro_batch_size: int = 4
    """Sequences per rank per forward pass (DeepSpeed: train_micro_batch_size_per_gpu). Range: >= 1."""
    global_batch_size: int = 8
    """Sequences per optimizer step over all data-parallel replicas; accumulation steps are derived. Range: >= 1."""


@dataclass
class PrecisionConfig:
    dtype: str = "bf16"
    """Training dtype: `fp32`, `bf16` or `fp16` (fp16 needs GPUs and uses dynamic loss scaling)."""
    initial_scale_power: int = 16
    """fp16: the dynamic loss scale starts at 2**initial_scale_power. Range: 0..127."""
    loss_scale_window: int = 1000
    """fp16: overflow-free steps before the loss scale is raised. Range: >= 1."""
    hysteresis: int = 2
    """fp16: overflows tolerated before the loss scale is lowered. Range: >= 1."""
    min_loss_scale: float = 1.0
    """fp16: the loss scale never drops below this. Range: > 0, finite; <= 2**initial_scale_power."""
    grad_accum_dtype: Optional[str] = None
    """Dtype of gradient accumulation buffers (DeepSpeed data_types.grad_accum_dtype); null = DeepSpeed's default."""
    reduce_dtype: Optional[str] = None
    """Dtype gradients cross the wire in when data-parallel, Ulysses or CP ranks reduce them (DeepSpeed's
    communication_data_type and seq_parallel_communication_data_type): `fp32` or the model's dtype; null = the
    model's, with or without Ulysses / CP (docs/training.md). fp32 moves twice a bf16 reduction's bytes."""


@dataclass
class OptimizerConfig:
    name: str = "adamw"
    """Only `adamw` for now (decoupled weight decay, Loshchilov & Hutter 2019)."""
    lr: float = 3e-4
    """Peak learning rate, reached after the warmup. Range: > 0, finite."""
    weight_decay: float = 0.1
    """Decoupled weight decay. Range: >= 0, finite; optimizer.lr x weight_decay < 1."""
    beta1: float = 0.9
    """Adam beta1. Range: [0, 1)."""
    beta2: float = 0.95
    """Adam beta2 (0.95 as in LLaMA and GPT-3). Range: [0, 1)."""
    eps: float = 1e-8
    """Adam epsilon. Range: > 0, finite."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; always emitted because DeepSpeed defaults it to 1.0. Range: >= 0, finite (0 = no clipping)."""
    torch_adam: bool = True
    """Use torch's AdamW instead of DeepSpeed's fused/CPU Adam, which JIT-compile C++ ops (1-2 min each) on first use."""
    fused: Optional[bool] = None
    """With torch_adam: torch's fused (single-kernel) AdamW; null = fused on GPU ranks without offload_optimizer,
    torch's default (foreach) elsewhere. Norm weights and biases never get weight decay (docs/optimizer.md)."""


@dataclass
class SchedulerConfig:
    name: str = "cosine"
    """`cosine` (linear warmup, cosine decay to min_lr) or `constant` (warmup then flat)."""
    warmup_steps: int = 100
    """Optimizer steps of linear warmup from 0 to optimizer.lr: step k (1-based) uses optimizer.lr * (k-1)/warmup_steps
    (DeepSpeed's WarmupCosineLR/WarmupLR at iteration k-1; DeepSpeed raises values below 2 to 2). With 0, steps 1 and 2 run at optimizer.lr and the decay follows (DeepSpeed's warmup is 2 steps at least, here held at the peak). Range: >= 0 (0 = no warmup); below the decay horizon (cosine) or <= train.steps (constant)."""
    min_lr: float = 3e-5
    """The floor the cosine decays to. Range: >= 0, finite; <= optimizer.lr."""
    decay_steps: Optional[int] = None
    """Steps over which to decay; null = train.steps. Range: >= 1, or null."""


@dataclass
class ClusterConfig:
    name: str = "custom"
    """Name of the cluster preset."""
    gpu: str = "a100-80gb"
    """Accelerator type, a key of the catalog in launcher/config/hardware.py, or `cpu` for CPU ranks."""
    nodes: int = 1
    """Nodes in the job. Range: >= 1."""
    gpus_per_node: int = 8
    """GPUs per node (for gpu=cpu: CPU ranks per node). Range: >= 1."""
    cpus_per_task: Optional[int] = None
    """CPU cores per SLURM task (one task per node); null = leave it to the site. Range: >= 1, or null."""
    peak_tflops: Optional[float] = None
    """Dense peak TFLOP/s per GPU in the training dtype; null = from the catalog (required for an unknown gpu). Range: > 0, finite, or null."""
    memory_gb: Optional[float] = None
    """GPU memory in GB; null = from the catalog. Range: > 0, finite, or null."""
    host_memory_gb: Optional[float] = None
    """Host (CPU) RAM per node in GB, what the planner checks the ranks' build, checkpoint staging, CPU offload and data buffers against; null = the catalog GPU's DGX node (2 TB for H100/H200/A100 80GB, 1 TB for A100 40GB), not checked for gpu=cpu or a GPU outside the catalog. Range: > 0, finite, or null."""
    intra_node_gbps: Optional[float] = None
    """Per-GPU intra-node bandwidth in GB/s (NVLink); null = from the catalog. Range: > 0, finite, or null."""
    inter_node_gbps: Optional[float] = None
    """Per-GPU inter-node bandwidth in GB/s (InfiniBand/RoCE); null = from the catalog. Range: > 0, finite, or null."""
    profile: Optional[str] = None
    """A hardware profile written by `launcher calibrate --out PATH` (YAML, versioned): the measured GEMM, attention, memory and link rates that `launcher plan`, `--search`, `train` and `submit` predict step time from; null = the built-in profile of cluster.gpu (launcher/plan/profile.py), none for gpu=cpu. A relative path is read from the current directory."""
    partition: Optional[str] = None
    """SLURM partition (sbatch --partition)."""
    account: Optional[str] = None
    """SLURM account (sbatch --account)."""
    time: str = "24:00:00"
    """SLURM time limit (sbatch --time)."""
    signal_grace_s: int = 300
    """Seconds before the time limit that SLURM sends SIGUSR1 so the run can checkpoint and requeue. Range: 1..65535."""
    setup: Optional[str] = None
    """Site hook: shell lines run in the job before training (module loads, exports)."""
    master_port: int = 29500
    """Base rendezvous port on the first node: a SLURM job uses master_port + 2 x (job id mod 500), the preflight the next one. Range: 1024..64535."""
    preflight: Optional[bool] = None
    """Run a per-node check (torch import, GPU count, all-reduce) before training; null = on for GPU clusters."""
    extra_sbatch: list[str] = field(default_factory=list)
    """Additional `#SBATCH` options, e.g. ['--exclusive']."""
    job_name: Optional[str] = None
    """SLURM job name (sbatch --job-name); null = the run directory's name. Any text without control characters."""


@dataclass
class WandbConfig:
    enabled: bool = False
    """Log to Weights & Biases. The API key comes from WANDB_API_KEY and is never written to disk."""
    project: Optional[str] = None
    """W&B project; null = $WANDB_PROJECT, else wandb's own default. A value here beats the environment."""
    entity: Optional[str] = None
    """W&B entity (team); null = $WANDB_ENTITY, else the key's default."""
    mode: Optional[str] = None
    """`online`, `offline` or `disabled`; null = $WANDB_MODE, else online (which needs `wandb login` or
    WANDB_API_KEY: checked before any rank starts). Files go to $WANDB_DIR when set, else into the run dir."""


@dataclass
class MlflowConfig:
    enabled: bool = False
    """Log to MLflow (the optional extra: pip install 'launcher[mlflow]'; refused before start when not installed)."""
    tracking_uri: Optional[str] = None
    """null = $MLFLOW_TRACKING_URI, else MLflow's default (sqlite:///mlflow.db in the working directory, which needs
    the full `mlflow` package). A file store (file:/path) needs MLFLOW_ALLOW_FILE_STORE=true (MLflow 3). Credentials
    come from MLFLOW_TRACKING_TOKEN / _USERNAME / _PASSWORD in the environment, never from the config."""
    experiment: Optional[str] = None
    """MLflow experiment; null = $MLFLOW_EXPERIMENT_NAME, else MLflow's "Default"."""


@dataclass
class LoggingConfig:
    log_every: int = 1
    """Print and record metrics every N optimizer steps. Range: >= 1."""
    progress_bar: bool = True
    """Rank 0 shows a rich progress bar with ETA."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run directory."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases settings."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    """MLflow settings."""


@dataclass
class CheckpointConfig:
    save_every: int = 100
    """Save a checkpoint every N optimizer steps (and always at the end). Range: >= 0 (0 = only at the end)."""
    keep_last: int = 3
    """Keep the newest K checkpoints, delete older ones. Range: >= 0 (0 = keep every checkpoint)."""
    export_hf: bool = False
    """At the end of training also export a transformers directory to <run_dir>/hf."""


@dataclass
class TrainConfig:
    steps: int = 200
    """Optimizer steps to run. Range: >= 1."""
    tokens: Optional[int] = None
    """Total training tokens for planning (`launcher plan` reports days); null = steps x tokens per step. Range: >= 1, or null."""
    seed: int = 1234
    """Seed for weights, data order and dropout. Range: 0..2**63-1."""
    eval_every: int = 50
    """Evaluate on the held-out split every N steps. Range: >= 0 (0 = never); when > 0, data.val_fraction must be > 0."""
    eval_batches: int = 4
    """Micro-batches per rank per evaluation. Range: >= 1."""
    nan_policy: str = "stop"
    """On a non-finite loss or grad norm: `stop` (checkpoint and exit non-zero) or `skip` (drop the step)."""
    dist_timeout_s: int = 60
    """Collective timeout: a dead or hung rank fails the job after this many seconds. Range: >= 1."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The network's shape."""
    data: DataConfig = field(default_factory=DataConfig)
    """Corpus, tokenizer and sequence length."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Tensor / pipeline / sequence / data degrees and ZeRO."""
    batch: BatchConfig = field(default_factory=BatchConfig)
    """Micro and global batch sizes."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Mixed precision."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer and gradient clipping."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Learning-rate schedule."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Nodes, GPUs and SLURM settings."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Metrics, progress, TensorBoard, W&B."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """When and how many checkpoints."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Steps, seed, evaluation."""
    run_name: Optional[str] = None
    """Name of the run directory under runs_dir; null = <recipe or model>-<timestamp>. Letters, digits, '.', '_', '-' only."""
    runs_dir: str = "runs"
    """Parent directory of run directories."""
    resume: str = "never"
    """`never`, `auto` (continue the newest run of this name from its latest checkpoint) or a checkpoint path."""
    recipe_name: Optional[str] = None
    """Set by the recipe file itself; the published run this config reproduces."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Free-form notes carried into the run directory (provenance, tags); never read by the launcher."""


def register_configs() -> None:
    """Register the root schema so conf/config.yaml can name it in its defaults list."""
    ConfigStore.instance().store(name="config_schema", node=Config)
