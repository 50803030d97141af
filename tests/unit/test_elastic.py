"""launcher/runtime/elastic.py without ranks: the universal_checkpoint_info patterns against the real parameter names
of the models the launcher builds, the PipelineModule <-> transformers renaming, and the refusals.
The resumes themselves (real ranks, equal to uninterrupted runs): tests/train/test_elastic_resume.py."""

from __future__ import annotations

import re

import pytest

from launcher.config.compose import compose
from launcher.config.errors import ConfigError
from launcher.config.layout import resolve_layout
from launcher.runtime import elastic

SMALL = ["model.hidden_size=32", "model.num_hidden_layers=3", "model.num_attention_heads=2", "model.num_key_value_heads=2",
         "model.intermediate_size=64", "model.vocab_size=320", "model.max_position_embeddings=64", "data.seq_length=32"]


def hf_names(overrides) -> tuple[list[str], object]:
    from launcher.runtime.build import meta_model

    cfg = compose(overrides)
    return [n for n, _ in meta_model(cfg.model).named_parameters()], cfg


CASES = [(["recipe=tiny", *SMALL], "llama"), (["recipe=tiny", *SMALL, "model.tie_word_embeddings=true"], "llama"),
         (["recipe=bloom-176b", "cluster=cpu", "model.hidden_size=32", "model.num_hidden_layers=3",
           "model.num_attention_heads=2", "model.vocab_size=320"], "bloom")]


@pytest.mark.parametrize("overrides, arch", CASES)
def test_renaming_round_trips_and_the_patterns_classify_every_parameter_once(overrides, arch):
    names, cfg = hf_names(overrides)
    tie = bool(cfg.model.tie_word_embeddings)
    spec = {"arch": arch, "layers": cfg.model.num_hidden_layers, "tie": tie}
    to_hf = {p: h for p, h in elastic._hf_to_pipeline_candidates(spec, names).items()}
    assert sorted(to_hf.values()) == sorted(names)
    assert elastic.pipeline_to_hf_names(arch, cfg.model.num_hidden_layers, to_hf) == to_hf
    row_words = ("o_proj.weight", "down_proj.weight") if arch == "llama" else ("self_attention.dense.weight", "dense_4h_to_h.weight")
    col_words = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj") if arch == "llama" else ("query_key_value", "dense_h_to_4h")
    for pipeline, named in ((True, list(to_hf)), (False, names)):
        info = elastic.universal_info(arch, pipeline)
        rows, reps = info["parameter_with_row_parallelism_patterns"], info["tp_replicated_parameter_patterns"]
        used = set()
        for name in named:
            hits = [p for p in rows + reps if re.match(p, name)]
            assert len(hits) <= 1, (name, hits)  # DeepSpeed: "Got more than one matching patterns"
            used.update(hits)
            hf = to_hf.get(name, name)
            if hf.endswith(row_words):
                assert hits and hits[0] in rows, name
            elif any(w in hf for w in col_words + ("embed_tokens", "word_embeddings.", "lm_head")) \
                    and not hf.endswith(("dense.bias", "dense_4h_to_h.bias")):
                assert not hits, name  # column-parallel or vocabulary-parallel: the default, cut along dim 0
            else:
                assert hits and hits[0] in reps, name  # norms, row-parallel biases
        assert used == set(rows + reps)  # DeepSpeed (strict): "Unused patterns ... while merging tp slices"


def saved_for(overrides):
    cfg = compose(["recipe=tiny", *SMALL, *overrides])
    layout = resolve_layout(cfg)
    from omegaconf import OmegaConf

    from launcher.runtime.checkpoint import LAYOUT_KEYS

    return {"layout": {k: getattr(layout, k) for k in LAYOUT_KEYS}, "config": OmegaConf.to_container(cfg, resolve=True)}


def test_an_optimizer_without_adam_moments_is_refused():
    saved = saved_for(["cluster.gpus_per_node=4", "batch.micro_batch_size=4"])
    saved["config"]["optimizer"]["name"] = "lion"
    cfg = compose(["recipe=tiny", *SMALL, "cluster.gpus_per_node=2", "batch.micro_batch_size=4"])
    with pytest.raises(ConfigError) as err:
        elastic.refuse_unconvertible(saved, cfg, resolve_layout(cfg), "step_00000002")
    assert err.value.key == "optimizer.name" and "exp_avg" in err.value.rule and err.value.fix


def test_only_a_change_of_the_partitioning_needs_a_conversion():
    saved = saved_for(["cluster.gpus_per_node=2", "batch.micro_batch_size=4"])
    same = compose(["recipe=tiny", *SMALL, "cluster.gpus_per_node=2", "batch.micro_batch_size=2"])  # micro only
    other = compose(["recipe=tiny", *SMALL, "cluster.gpus_per_node=4", "batch.micro_batch_size=4"])
    assert not elastic.needs_conversion(saved, same, resolve_layout(same))
    assert elastic.needs_conversion(saved, other, resolve_layout(other))


def test_a_checkpoint_from_before_the_new_keys_resumes_and_a_cp_change_is_refused():
    from launcher.runtime.checkpoint import resume_changes

    overrides = ["cluster.gpus_per_node=2", "batch.micro_batch_size=4"]
    saved = saved_for(overrides)
    # Written before parallel.sequence_parallel / parallel.context_degree / data.document_mask existed.
    for group, key in (("parallel", "sequence_parallel"), ("parallel", "context_degree"), ("data", "document_mask")):
        del saved["config"][group][key]
    for key in ("sequence_parallel", "context_degree"):
        del saved["layout"][key]
    cfg = compose(["recipe=tiny", *SMALL, *overrides])
    assert resume_changes(saved, cfg, resolve_layout(cfg), "step_00000002") == []
    # Switching the new features on is still a change the resume names.
    on = compose(["recipe=tiny", *SMALL, *overrides, "data.document_mask=true"])
    assert resume_changes(saved, on, resolve_layout(on), "step_00000002") == ["data.document_mask: False -> True"]
    cp = compose(["recipe=tiny", *SMALL, "cluster.gpus_per_node=2", "batch.micro_batch_size=8", "parallel.context_degree=2"])
    with pytest.raises(ConfigError) as err:
        elastic.refuse_unconvertible(saved_for(overrides), cp, resolve_layout(cp), "step_00000002")
    assert err.value.key == "parallel.context_degree"


def test_a_one_stage_pipeline_sp_checkpoint_is_refused_with_the_export_fix(tmp_path):
    # Megatron SP at pipeline_degree=1 once ran on a one-stage pipeline engine, whose checkpoint keeps each layer in
    # its own file (DeepSpeed's PipelineModule.save_state_dict names); the plain engine that runs it now reads
    # mp_rank_<tp> files, so such a tag is refused before start, pointing at the export.
    import torch

    from launcher.runtime.checkpoint import refuse_one_stage_pipeline_files

    sp = resolve_layout(compose(["recipe=tiny", *SMALL, "cluster.gpus_per_node=2", "parallel.tensor_degree=2",
                                 "parallel.sequence_parallel=true"]))
    tag = tmp_path / "global_step3"
    tag.mkdir()
    torch.save({"module": {}}, tag / "mp_rank_00_model_states.pt")
    refuse_one_stage_pipeline_files(sp, tag)   # the plain engine's own files: fine
    torch.save({"weight": torch.zeros(2)}, tag / "layer_00-model_00-model_states.pt")
    with pytest.raises(ConfigError, match=r"(?s)resume=.*per-layer files.*launcher export"):
        refuse_one_stage_pipeline_files(sp, tag)
    pp2 = resolve_layout(compose(["recipe=tiny", *SMALL, "cluster.gpus_per_node=4", "parallel.tensor_degree=2",
                                  "parallel.pipeline_degree=2", "parallel.sequence_parallel=true",
                                  "parallel.zero_stage=1"]))
    refuse_one_stage_pipeline_files(pp2, tag)   # with stages the per-layer files are what the pipeline engine reads


def test_a_tensor_degree_that_pads_the_vocabulary_differently_is_refused():
    """TP pads the vocabulary to a multiple of the tensor degree (launcher/config/layout.py): a PP2 checkpoint of a
    321-token vocabulary holds 321 embedding rows, TP2 would build 322, another tensor shape the conversion does not
    carry. With 320 tokens both layouts hold 320 rows and the same change converts."""
    pp = ["parallel.pipeline_degree=2", "parallel.zero_stage=1"]
    for vocab, refused in ((321, True), (320, False)):
        saved = saved_for(["cluster.gpus_per_node=2", *pp, f"model.vocab_size={vocab}"])
        cfg = compose(["recipe=tiny", *SMALL, "cluster.gpus_per_node=4", *pp, "parallel.tensor_degree=2",
                       f"model.vocab_size={vocab}"])
        layout = resolve_layout(cfg)
        assert elastic.needs_conversion(saved, cfg, layout)
        if not refused:
            elastic.refuse_unconvertible(saved, cfg, layout, "step_00000002")
            continue
        with pytest.raises(ConfigError) as err:
            elastic.refuse_unconvertible(saved, cfg, layout, "step_00000002")
        assert err.value.key == "parallel.tensor_degree" and "321 rows then, 322 now" in err.value.rule
        assert "(321) to 321 rows" in err.value.fix
