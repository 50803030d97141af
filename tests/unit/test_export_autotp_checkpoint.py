"""`launcher export` keeps reading checkpoints written by DeepSpeed AutoTP, how TP without a pipeline ran before
issue 11 (`launcher train` refuses to resume them: launcher/runtime/checkpoint.py refuse_autotp_checkpoint, and
points to the export). Such a checkpoint holds one mp_rank_<tp>_model_states.pt per TP rank whose `module` is the
rank's AutoTP slices under transformers' names: column-parallel linears cut along their rows, row-parallel ones
(o_proj, down_proj) along their columns, the training-mode head along its vocabulary rows (deepspeed 0.19.8
module_inject/auto_tp.py: LinearLayer, LinearAllreduce, a column LinearLayer with gather_output for lm_head),
everything else whole on every rank. Written here from a whole model by that rule, merged back by
launcher/parallel/export.py from the files alone, and compared with torch.equal.
"""

from __future__ import annotations

import re

import pytest
import torch

from launcher.config.compose import compose
from launcher.config.layout import resolve_layout

LLAMA = ["model=tiny", "model.hidden_size=64", "model.num_attention_heads=4", "model.num_key_value_heads=2",
         "model.num_hidden_layers=3", "model.intermediate_size=160", "model.vocab_size=600", "cluster=cpu"]
COLUMN = re.compile(r".*\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$|lm_head\.weight$")
ROW = re.compile(r".*\.(o_proj|down_proj)\.weight$")


@pytest.mark.parametrize("tp", [2, 4])
def test_autotp_checkpoint_exports_to_the_whole_model(tp, tmp_path):
    from launcher.parallel.export import checkpoint_state_dict
    from launcher.runtime.model import build_model

    cfg = compose(LLAMA)
    whole = build_model(cfg.model, 7, vocab_size=resolve_layout(cfg).padded_vocab_size)
    want = {k: v.detach().clone() for k, v in whole.state_dict().items()}
    for rank in range(tp):
        module = {}
        for name, t in want.items():
            dim = 0 if COLUMN.fullmatch(name) else 1 if ROW.fullmatch(name) else None
            module[name] = t.clone() if dim is None else t.chunk(tp, dim=dim)[rank].clone()
        torch.save({"module": module}, tmp_path / f"mp_rank_{rank:02d}_model_states.pt")
    got = checkpoint_state_dict(tmp_path, "llama", cfg.model.num_hidden_layers, False, pipelined=False,
                                full_shapes={k: tuple(v.shape) for k, v in want.items()})
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
