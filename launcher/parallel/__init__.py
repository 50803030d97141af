"""Pipeline and tensor parallelism on DeepSpeed: pipeline.py (PipelineModule), tensor.py (Megatron-style TP)."""
