"""Bad input files and credentials, through the CLI entry point: refused before any rank starts, exit 2, one
paragraph naming the key, the value, the rule and a fix, no traceback, no secret echoed.

Every file is written by the test into its own tmp dir (real files, real datasets / tokenizers / numpy reads).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from launcher.cli import EXIT_CONFIG_ERROR, main

TINY = ["recipe=tiny", "model.vocab_size=320", "data.seq_length=32", "batch.global_batch_size=8", "batch.micro_batch_size=4"]


def refused(capsys, argv, key, says, secret=None):
    code = main(argv)
    out, err = capsys.readouterr()
    message = " ".join(err.split())
    assert code == EXIT_CONFIG_ERROR, (out, err)
    assert f"config error: {key}=" in message and " fix: " in message, message
    assert " ".join(says.split()) in message, message
    assert "Traceback" not in err and out == ""
    if secret:
        assert secret not in err
    return message


# ----------------------------------------------------------------------------- --config


@pytest.mark.parametrize("content,says", [
    (None, "does not exist"),
    ("model: [1, 2\n", "is not valid YAML"),
    ("", "is empty"),
    ("# only a comment\n", "is empty"),
    ("- 1\n- 2\n", "holds a list at the top level, not a mapping of config keys"),
    ("just text\n", "holds a str at the top level"),
    (b"model:\n  name: \xff\xfe\n", "is not UTF-8 text"),
])
def test_frozen_config_file_refused(capsys, tmp_path, content, says):
    path = tmp_path / "config.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    refused(capsys, ["train", "--config", str(path)], "--config", says)


def test_frozen_config_directory_names_its_config(capsys, tmp_path):
    (tmp_path / "config.yaml").write_text("run_name: x\n")
    refused(capsys, ["train", "--config", str(tmp_path)], "--config", f"it holds {tmp_path / 'config.yaml'}")


def test_frozen_config_unknown_key_and_bad_interpolation(capsys, tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  hiden_size: 3\n")
    refused(capsys, ["train", "--config", str(path)], "model.hiden_size", "did you mean hidden_size")
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    path.write_text("train:\n  seed: ${oc.env:WANDB_API_KEY}\n")
    refused(capsys, ["train", "--config", str(path)], "train.seed", "${oc.env:WANDB_API_KEY}': resolves to a value of the wrong type",
            secret="0123456789abcdef0123456789abcdef01234567")
    path.write_text("train:\n  seed: ${oc.env:LAUNCHER_TEST_NOT_SET}\n")
    refused(capsys, ["train", "--config", str(path)], "train.seed", "reads the environment variable LAUNCHER_TEST_NOT_SET")


# ----------------------------------------------------------------------------- data=tokens


def write_tokens(tmp_path, ids, dtype="uint16", **index):
    bin_path = tmp_path / "tokens.bin"
    np.asarray(ids, dtype=dtype).tofile(bin_path)
    meta = {"num_tokens": len(ids), "dtype": dtype, "vocab_size": 320, "eos_id": 0, **index}
    (tmp_path / "tokens.idx.json").write_text(json.dumps(meta))
    return bin_path


def tokens_args(tmp_path, bin_path):
    return ["train", *TINY, "data=tokens", f"data.tokens_path={bin_path}", f"data.cache_dir={tmp_path / 'cache'}",
            f"runs_dir={tmp_path / 'runs'}"]


IDS = np.arange(20_000) % 320


def test_tokens_truncated(capsys, tmp_path):
    bin_path = write_tokens(tmp_path, IDS)
    with open(bin_path, "r+b") as f:
        f.truncate(30_000)
    refused(capsys, tokens_args(tmp_path, bin_path), "data.tokens_path",
            "the index says 20,000 tokens of uint16 = 20,000 x 2 = 40,000 bytes, the file has 30,000 bytes "
            "(truncated: it holds 15,000 of the 20,000 tokens)")


def test_tokens_wrong_dtype(capsys, tmp_path):
    bin_path = write_tokens(tmp_path, IDS, dtype="uint16")
    index = json.loads((tmp_path / "tokens.idx.json").read_text())
    (tmp_path / "tokens.idx.json").write_text(json.dumps(dict(index, dtype="uint32")))
    refused(capsys, tokens_args(tmp_path, bin_path), "data.tokens_path",
            "the size fits 20,000 tokens of uint16: the file and its index disagree on the dtype")
    (tmp_path / "tokens.idx.json").write_text(json.dumps(dict(index, dtype="int64")))
    refused(capsys, tokens_args(tmp_path, bin_path), "data.tokens_path", "packed tokens are uint16 or uint32")


def test_tokens_id_beyond_vocab_by_scan_then_cached(capsys, tmp_path):
    ids = IDS.copy()
    ids[12_345] = 400
    bin_path = write_tokens(tmp_path, ids)  # no max_id in the index: the file is read once
    refused(capsys, tokens_args(tmp_path, bin_path), "data.tokens_path", "holds token id 400, but model.vocab_size = 320")
    cached = list((tmp_path / "cache").glob(".maxid-*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["max_id"] == 400
    # The second start reads the cached maximum (the file is not read again: a changed cache value shows it).
    cached[0].write_text(json.dumps({"max_id": 399}))
    refused(capsys, tokens_args(tmp_path, bin_path), "data.tokens_path", "holds token id 399")


def test_tokens_id_beyond_vocab_from_the_index(capsys, tmp_path):
    bin_path = write_tokens(tmp_path, IDS, max_id=1000)  # recorded by the writer: no scan
    refused(capsys, tokens_args(tmp_path, bin_path), "data.tokens_path", "holds token id 1000")
    assert not list((tmp_path / "cache").glob(".maxid-*.json"))


def test_tokens_index_not_json_or_incomplete(capsys, tmp_path):
    bin_path = write_tokens(tmp_path, IDS)
    (tmp_path / "tokens.idx.json").write_text('{"num_tokens": 20000,')
    refused(capsys, tokens_args(tmp_path, bin_path), "data.tokens_path", "its index tokens.idx.json is not valid JSON")
    (tmp_path / "tokens.idx.json").write_text('{"num_tokens": 20000, "vocab_size": 320}')
    refused(capsys, tokens_args(tmp_path, bin_path), "data.tokens_path", "lacks dtype, eos_id")


def test_good_tokens_pass_every_check(tmp_path):
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.runtime.data import prepare_data

    bin_path = write_tokens(tmp_path, IDS, max_id=319)
    cfg = compose([*TINY, "data=tokens", f"data.tokens_path={bin_path}", f"data.cache_dir={tmp_path / 'cache'}"])
    prepared = prepare_data(cfg, resolve_layout(cfg))
    assert prepared.num_tokens == 20_000 and prepared.dtype == "uint16" and prepared.val_samples > 0


def test_pretokenize_records_the_largest_id(tmp_path):
    """What data=tokens trusts instead of reading the file: the writer's max_id equals the file's maximum."""
    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.runtime.data import index_path, prepare_data

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n"}) + "\n"
                                              for i in range(3000)))
    cfg = compose([*TINY, "data=hf", f"data.paths=[{tmp_path / 'a.jsonl'}]", f"data.cache_dir={tmp_path / 'cache'}"])
    prepared = prepare_data(cfg, resolve_layout(cfg))
    index = json.loads(index_path(__import__("pathlib").Path(prepared.bin_path)).read_text())
    tokens = np.fromfile(prepared.bin_path, dtype=prepared.dtype)
    assert index["max_id"] == int(tokens.max()) < 320


# ----------------------------------------------------------------------------- data=hf


def hf_args(tmp_path, *paths):
    return ["train", *TINY, "data=hf", f"data.paths=[{','.join(str(p) for p in paths)}]",
            f"data.cache_dir={tmp_path / 'cache'}", f"runs_dir={tmp_path / 'runs'}"]


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def test_hf_empty_file(capsys, tmp_path):
    good, empty = tmp_path / "good.jsonl", tmp_path / "empty.jsonl"
    good.write_text('{"text": "hello"}\n')
    empty.write_text("")
    refused(capsys, hf_args(tmp_path, good, empty), "data.paths", f"'{empty}': is empty (0 bytes)")


def test_hf_directory_instead_of_files(capsys, tmp_path):
    (tmp_path / "d.jsonl").mkdir()
    refused(capsys, hf_args(tmp_path, tmp_path / "d.jsonl"), "data.paths", "is not a file")


def test_hf_broken_json_line_is_named(capsys, tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c"\n{"text": "d"}\n')
    refused(capsys, hf_args(tmp_path, path), "data.paths", "line 3 is not valid JSON")


@pytest.mark.parametrize("name,data", [
    ("a.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n'),
    ("a.txt", b"first line\nsecond caf\xe9 line\n"),
])
def test_hf_non_utf8_line_is_named(capsys, tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    refused(capsys, hf_args(tmp_path, path), "data.paths", "line 2 is not UTF-8 text (byte 0xe9")


def test_hf_unreachable_hub_refused_at_once(capsys, tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens, refused at once
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    t0 = time.perf_counter()
    refused(capsys, ["train", *TINY, "data=hf", "data.hf_name=someone/corpus", f"data.cache_dir={tmp_path / 'cache'}",
                     f"runs_dir={tmp_path / 'runs'}"], "data.hf_name", "the hub (http://127.0.0.1:9) cannot be reached")
    assert time.perf_counter() - t0 < 10  # datasets alone retried for ~25 s


# ----------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("content,says", [("", "is empty"), ('{"version": "1.0", "model": 3}', "is not a tokenizer file"),
                                          ("not json", "is not a tokenizer file")])
def test_tokenizer_file_refused(capsys, tmp_path, content, says):
    corpus = tmp_path / "a.jsonl"
    corpus.write_text('{"text": "hello world"}\n')
    tok = tmp_path / "tokenizer.json"
    tok.write_text(content)
    refused(capsys, [*hf_args(tmp_path, corpus), f"data.tokenizer_path={tok}"], "data.tokenizer_path", says)


# ----------------------------------------------------------------------------- directories


def test_unwritable_runs_dir(capsys, tmp_path):
    import os

    if os.getuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        refused(capsys, ["train", *TINY, f"runs_dir={locked / 'runs'}"], "runs_dir", "is not writable")
    # /sys is read-only for every user, root included.
    refused(capsys, ["train", *TINY, "runs_dir=/sys/launcher-test-runs"], "runs_dir",
            "is not writable: creating a file in /sys failed")


# ----------------------------------------------------------------------------- credentials by shape


HF = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"


@pytest.mark.parametrize("value,kind", [
    (f"module load cuda\nexport HF_TOKEN={HF}\n", "a Hugging Face token (hf_...) (line 2)"),
    ("module load cuda\nexport WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "a credential assigned to WANDB_API_KEY (line 2)"),
    ("export AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE", "an AWS access key id"),
    ("export OPENAI_API_KEY=sk-proj-AbCdEfGhIjKlMnOpQrStUvWx", "an API secret key"),
    ("mysql --password=hunter2hunter2 -e 'select 1'", "a credential assigned to password"),
    ("git clone https://bob:s3cret@git.example.com/repo", "a password in a URL"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n", "a private key block"),
])
def test_setup_credentials_recognised_by_shape(value, kind, monkeypatch):
    from launcher.config.errors import ConfigError
    from launcher.config.secrets import refuse_secrets_in_config

    for name in ("WANDB_API_KEY", "HF_TOKEN", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as err:
        refuse_secrets_in_config({"cluster": {"setup": value}})
    text = str(err.value)
    assert err.value.key == "cluster.setup" and f"looks like {kind}" in text and "through the environment" in text
    for secret in (HF, "0123456789abcdef0123456789abcdef01234567", "AKIAIOSFODNN7EXAMPLE", "hunter2", "s3cret", "b3BlbnNz"):
        assert secret not in text


@pytest.mark.parametrize("key,value", [
    ("cluster.setup", "export HF_TOKEN=$(cat ~/.hf_token)\nexport WANDB_API_KEY=${WANDB_API_KEY}"),
    ("cluster.setup", "export TOKENIZERS_PARALLELISM=false\nsource ~/.secrets.sh"),
    ("model.init_from", "/hub/models--x/snapshots/0123456789abcdef0123456789abcdef01234567/"),
    ("extras.git_sha", "0123456789abcdef0123456789abcdef01234567"),
    ("extras.note", "hf_cache is where the tokens live"),
])
def test_not_credentials(key, value):
    from launcher.config.secrets import refuse_secrets_in_config

    group, name = key.split(".")
    refuse_secrets_in_config({group: {name: value}})


def test_secret_never_reaches_job_script(capsys, tmp_path):
    """`launcher submit --dry-run` prints the job script; a token in cluster.setup is refused before it is rendered."""
    refused(capsys, ["submit", *TINY, f"runs_dir={tmp_path}", f"cluster.setup='export HF_TOKEN={HF}'", "--dry-run"],
            "cluster.setup", "looks like a Hugging Face token", secret=HF)


@pytest.mark.parametrize("override", ["train.seed=${oc.env:WANDB_API_KEY}", f"train.seed={HF}"])
def test_debug_traceback_never_shows_the_credential(override, monkeypatch):
    """--debug re-raises with the traceback; neither the message nor the chained exceptions hold the value."""
    import traceback

    from launcher.config.errors import ConfigError

    key = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("WANDB_API_KEY", key)
    with pytest.raises(ConfigError) as err:
        main(["--debug", "plan", "recipe=tiny", override])
    text = "".join(traceback.format_exception(err.value))
    assert "train.seed" in text and key not in text and HF not in text


# ----------------------------------------------------------------------------- the LR schedule on resume


def test_cosine_lr_matches_deepspeed():
    """The numbers a schedule-change refusal quotes are DeepSpeed's own (step k = scheduler iteration k-1)."""
    import torch
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    from launcher.runtime.checkpoint import _cosine_lr

    lr, warmup, horizon, min_lr = 2e-3, 20, 200, 2e-4
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = WarmupCosineLR(opt, total_num_steps=horizon, warmup_num_steps=warmup, warmup_min_ratio=0.0,
                           cos_min_ratio=min_lr / lr, warmup_type="linear")
    for step in range(1, 260):
        sched.step()  # the engine steps the scheduler once before step k's update: iteration k-1
        assert sched.get_lr()[0] == pytest.approx(_cosine_lr(step, lr, warmup, horizon, min_lr), rel=1e-12, abs=1e-15), step


@pytest.mark.parametrize("name", ["cosine", "constant"])
def test_no_warmup_builds_deepspeeds_scheduler_at_the_peak(name):
    """scheduler.warmup_steps=0 ("no warmup"): DeepSpeed 0.19.8's schedulers refuse warmup_num_steps 0 (a
    ValueError in every rank, after the ranks started). The launcher's parameters build DeepSpeed's own class, and
    step 1 trains at optimizer.lr, as _cosine_lr (the numbers a resume refusal quotes) says."""
    import torch
    from deepspeed.runtime import lr_schedules

    from launcher.config.compose import compose
    from launcher.config.layout import resolve_layout
    from launcher.deepspeed_config import build_deepspeed_config
    from launcher.runtime.checkpoint import _cosine_lr

    cfg = compose(["recipe=tiny", f"scheduler={name}", "scheduler.warmup_steps=0", "train.steps=50"])
    sched_cfg = build_deepspeed_config(cfg, resolve_layout(cfg))["scheduler"]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optimizer.lr)
    sched = getattr(lr_schedules, sched_cfg["type"])(opt, **sched_cfg["params"])
    lrs = []
    for _ in range(50):
        sched.step()  # iteration k-1 before step k's update (launcher/train.py start_lr_schedule)
        lrs.append(sched.get_lr()[0])
    lr = cfg.optimizer.lr
    assert lrs[0] == lrs[1] == pytest.approx(lr, rel=1e-12)
    if name == "constant":
        assert all(x == pytest.approx(lr, rel=1e-12) for x in lrs)
    else:
        assert lrs[2] < lr and lrs[-1] == pytest.approx(cfg.scheduler.min_lr, rel=1e-9)
        for step, got in enumerate(lrs, start=1):
            assert got == pytest.approx(_cosine_lr(step, lr, 0, 50, cfg.scheduler.min_lr), rel=1e-12), step
