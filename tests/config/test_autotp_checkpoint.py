"""A checkpoint written when TP without a pipeline ran on DeepSpeed AutoTP (before issue 11) is refused on resume,
before any rank starts, with one paragraph: its mp_rank files hold transformers names, our TP layers load
pipe.<layer>.<name> (launcher/runtime/checkpoint.py refuse_autotp_checkpoint). `launcher export` still reads it.

The checkpoint is written as that launcher wrote it, with the functions a real save uses (build_state, the manifest
entries) and the DeepSpeed config of that time (tensor_parallel.autotp_size, train_batch_size counting the TP
ranks), without weights: the refusal must come before anything would load them.
"""

import json

import pytest


@pytest.fixture
def autotp_checkpoint(tmp_path):
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime import checkpoint as ckpt
    from launcher.runtime.data import PreparedData

    cfg = compose(["recipe=tiny", "cluster.gpus_per_node=2", "parallel.tensor_degree=2"])
    layout = resolve_layout(cfg)
    prepared = PreparedData(bin_path="/nonexistent/tokens.bin", tokenizer_path=None, dtype="uint16", num_tokens=10**6,
                            vocab_size=layout.vocab_size, eos_id=0, seq_length=layout.seq_length, train_samples=1000,
                            val_samples=10, source="stdlib")
    ds = build_deepspeed_config(cfg, layout)
    # What deepspeed_config.py emitted for this layout before issue 11.
    ds["tensor_parallel"] = {"autotp_size": 2}
    ds["train_batch_size"] = layout.global_batch_size * layout.tensor_degree
    tag_dir = tmp_path / "old" / "checkpoints" / ckpt.tag_for(10)
    tag_dir.mkdir(parents=True)
    state = ckpt.build_state(cfg, layout, ds, 10, 10 * layout.tokens_per_step, prepared)
    (tag_dir / ckpt.STATE_FILE).write_text(json.dumps(state))
    entries = {ckpt.STATE_FILE: ckpt._file_entry(tag_dir / ckpt.STATE_FILE)}
    (tag_dir / ckpt.MANIFEST).write_text(json.dumps({"algorithm": ckpt.HASH, "files": entries}))
    return tag_dir


@pytest.mark.parametrize("layout", [["cluster.gpus_per_node=2", "parallel.tensor_degree=2"],   # its own layout
                                    ["cluster.gpus_per_node=2", "parallel.zero_stage=1"]])     # DP2: a conversion
def test_autotp_checkpoint_is_refused_before_start(autotp_checkpoint, tmp_path, capsys, layout):
    from launcher.cli import EXIT_CONFIG_ERROR, main

    runs = tmp_path / "runs"
    code = main(["train", "recipe=tiny", *layout, f"runs_dir={runs}", f"resume={autotp_checkpoint}"])
    out, err = capsys.readouterr()
    message = " ".join(err.split())
    assert code == EXIT_CONFIG_ERROR, out + err
    assert f"config error: resume='{autotp_checkpoint}'" in message or f"config error: resume={autotp_checkpoint}" in message, message
    assert "written by DeepSpeed AutoTP (tensor_parallel.autotp_size=2" in message, message
    assert f"fix: export it (`launcher export {autotp_checkpoint} <out>`)" in message, message
    assert "Traceback" not in err and not runs.exists()
