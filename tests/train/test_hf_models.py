"""Continued pretraining of transformers checkpoints (issue 16, parts 1, 2 and 4), as a user runs it on 2 CPU ranks.

For a Llama-3-style model (GQA, `llama3` rope scaling, rope_theta 500,000, eps 1e-5), a Mistral and a Qwen2 (q/k/v
biases), each saved locally in bf16 with its own tokenizer directory: `launcher train model.init_from=DIR
data.tokenizer_path=DIR precision=fp32` for 3 steps with the export at the end, then
- the exported model (from_pretrained) gives the logits of the trained weights under the *input* config (so a
  dropped rope scaling, theta or eps would show), to 1e-5;
- its config equals the input's but for the weights' dtype (fp32: precision=fp32 trains and exports in fp32),
  generation_config and tokenizer are the input's, files are 0644;
- the trained weights are the checkpoint's moved by 3 small steps (init_from loaded, not a random init).
"""

import json
import stat

import pytest
import torch

from train_helpers import base_overrides, launcher

pytestmark = pytest.mark.slow

VOCAB, TOKENS = 320, 300   # the embedding is larger than the tokenizer (as Qwen2.5's 152,064 rows vs 151,665)
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=VOCAB, max_position_embeddings=256, tie_word_embeddings=False)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
FAMILIES = {
    "llama3": ("llama", dict(rms_norm_eps=1e-5, rope_parameters={"rope_theta": 500000.0, **LLAMA3_ROPE}),
               ["model.rms_norm_eps=1e-5", "model.rope_theta=500000.0",
                "model.rope_scaling={rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
                "original_max_position_embeddings: 64}"]),
    "mistral": ("mistral", dict(rms_norm_eps=1e-5, sliding_window=64, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                ["model.rms_norm_eps=1e-5", "model.rope_theta=1000000.0"]),
    "qwen2": ("qwen2", dict(rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
              ["model.rms_norm_eps=1e-6", "model.rope_theta=1000000.0"]),
}


def save_tokenizer(path):
    """A byte-level BPE of 300 tokens with EOS/BOS, saved as transformers saves a model's tokenizer."""
    import sysconfig
    from pathlib import Path

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = [p.read_text() for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("[a-c]*.py"))[:20]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=TOKENS, special_tokens=["</s>", "<s>"], show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", bos_token="<s>")
    fast.save_pretrained(path)
    return fast


def save_model(path, arch: str, extra: dict, tok):
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.for_model(arch, **SHAPE, **extra, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():   # transformers' init zeroes biases and sets norms to 1: make both matter to the logits
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn(p.shape) * 0.1)
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, do_sample=True,
                                               temperature=0.6, top_p=0.9)
    model.save_pretrained(path)
    tok.save_pretrained(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir):
    out = {}
    root = tmp_path_factory.mktemp("hf")
    tok = save_tokenizer(root / "tokenizer")
    for family, (arch, extra, overrides) in FAMILIES.items():
        src = root / family
        save_model(src, arch, extra, tok)
        base = [o for o in base_overrides(cache_dir, steps=3) if not o.startswith("model.")]
        args = ["train", *base, f"model.arch={arch}", *(f"model.{k}={v}" for k, v in SHAPE.items()), *overrides,
                f"model.init_from={src}", f"data.tokenizer_path={src}", "precision=fp32", f"runs_dir={root / 'runs'}",
                f"run_name={family}", "checkpoint.export_hf=true"]
        result = launcher(args)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        out[family] = (src, root / "runs" / family)
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_is_the_trained_model_under_the_input_config(runs, family):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src, run_dir = runs[family]
    hf = run_dir / "hf"
    exported = AutoModelForCausalLM.from_pretrained(hf).eval()
    # The trained weights: the engine's module in the last checkpoint (fp32, ZeRO-2), loaded into the input config.
    tag = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    trained_sd = torch.load(tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    trained = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32)
    trained.load_state_dict(trained_sd)
    trained.eval()
    ids = torch.randint(0, TOKENS, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (exported(input_ids=ids).logits - trained(input_ids=ids).logits).abs().max().item()
    print(f"{family}: exported vs trained logits max |diff| = {diff:.3g}")
    assert diff <= 1e-5

    # init_from loaded: the trained weights are the checkpoint's, moved by 3 small steps.
    initial = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).state_dict()
    moved = max((trained_sd[k].float() - initial[k]).abs().max().item() for k in initial if k in trained_sd)
    assert 0 < moved < 0.05, moved

    a, b = AutoConfig.from_pretrained(src).to_dict(), AutoConfig.from_pretrained(hf).to_dict()
    assert b.pop("dtype") == "float32" and a.pop("dtype") == "bfloat16"  # trained and exported in fp32 (precision=fp32)
    for k in ("transformers_version", "_name_or_path"):   # written by the library / set by the loader, not the model
        a.pop(k, None), b.pop(k, None)
    assert a == b
    raw = json.loads((hf / "config.json").read_text())
    assert raw["architectures"] == json.loads((src / "config.json").read_text())["architectures"]
    assert raw["use_cache"] is True
    assert GenerationConfig.from_pretrained(hf).to_dict() == GenerationConfig.from_pretrained(src).to_dict()
    tok_in, tok_out = AutoTokenizer.from_pretrained(src), AutoTokenizer.from_pretrained(hf)
    text = "def f(x):\n    return x  # done"
    assert tok_out(text)["input_ids"] == tok_in(text)["input_ids"] and tok_out.eos_token == tok_in.eos_token == "</s>"
    for f in hf.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


def test_export_shards_stream_in_the_training_dtype(runs, tmp_path):
    """`launcher export --max-shard-size 40KB`: transformers' index format, every shard's tensors within 40,000 bytes
    (as transformers counts: tensor bytes, a larger tensor alone), from_pretrained loads it with the same logits."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    _, run_dir = runs["qwen2"]
    out = tmp_path / "sharded"
    result = launcher(["export", str(run_dir / "checkpoints" / "latest"), str(out), "--max-shard-size", "40KB"])
    assert result.returncode == 0, result.stderr[-3000:]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    for name in files:
        with safe_open(out / name, "pt") as f:
            sizes = [f.get_slice(k).get_shape() for k in f.keys()]
        nbytes = sum(4 * torch.Size(s).numel() for s in sizes)   # fp32 (precision=fp32)
        assert nbytes <= 40_000 or len(sizes) == 1, (name, nbytes)
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in
                                                  AutoModelForCausalLM.from_pretrained(out).parameters())
    a = AutoModelForCausalLM.from_pretrained(out).eval()
    b = AutoModelForCausalLM.from_pretrained(run_dir / "hf").eval()
    ids = torch.arange(40).view(1, 40)
    with torch.no_grad():
        assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)


@pytest.mark.parametrize("size", ["5XB", "1.5GB", "0MB", "-5GB"])
def test_export_refuses_a_bad_shard_size_before_reading(tmp_path, size):
    """A bad --max-shard-size is refused (exit 2, the flag, the value and the units named) before the checkpoint is
    read: the checkpoint path here does not exist, and that is not what the error is about."""
    result = launcher(["export", str(tmp_path / "no-such-ckpt"), str(tmp_path / "out"), f"--max-shard-size={size}"])
    assert result.returncode == 2, result.stderr
    assert f"--max-shard-size='{size}'" in result.stderr and "KiB, MiB, GiB" in result.stderr, result.stderr
    assert "no-such-ckpt" not in result.stderr and not (tmp_path / "out").exists()


def test_tokenizer_directory_larger_than_the_embedding_is_refused(tmp_path):
    """A tokenizer directory loads through AutoTokenizer; more tokens than model.vocab_size is refused before start."""
    from launcher.config.compose import compose
    from launcher.config.errors import ConfigError
    from launcher.runtime.data import build_tokenizer

    save_tokenizer(tmp_path / "tok")
    cfg = compose(["recipe=tiny", f"data.tokenizer_path={tmp_path / 'tok'}", f"model.vocab_size={TOKENS}"])
    path, tok = build_tokenizer(cfg, [], "unused", tmp_path / "cache")
    assert tok.get_vocab_size() == TOKENS and tok.token_to_id("</s>") == 0 and path.is_file()
    cfg = compose(["recipe=tiny", f"data.tokenizer_path={tmp_path / 'tok'}", f"model.vocab_size={TOKENS - 1}"])
    with pytest.raises(ConfigError) as err:
        build_tokenizer(cfg, [], "unused", tmp_path / "cache")
    assert err.value.key == "data.tokenizer_path" and f"has {TOKENS} tokens" in str(err.value)


@pytest.mark.parametrize("size", ["5GB", "500MB", "40KB", "2GiB", "10MiB", "3KiB", "5Gb", "8kb"])
def test_shard_size_units_are_transformers(size):
    """--max-shard-size reads a size as transformers' save_pretrained(max_shard_size=...) does."""
    from transformers.utils.hub import convert_file_size_to_int

    from launcher.export import parse_shard_size

    assert parse_shard_size(size) == convert_file_size_to_int(size)
