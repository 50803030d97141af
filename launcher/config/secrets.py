"""Credentials never go into a config value: config.yaml, job.sbatch, checkpoints and logs all carry them in clear.

We refuse (rather than redact) a config that holds one, and the fix says to pass it through the environment:
a redacted config.yaml would no longer reproduce the run, and a job script with a placeholder would fail on
the nodes. The environment reaches the ranks without being written anywhere: sbatch exports the submitting
shell's environment (--export=ALL, sbatch(1)), and W&B and the hub read WANDB_API_KEY / HF_TOKEN themselves.

A value is a credential when
  - it holds the value of an environment variable named like one (WANDB_API_KEY, HF_TOKEN, *_SECRET, ...);
  - it has the shape of a known kind of key (`SHAPES`), wherever it is (cluster.setup, extras, paths, names);
  - it assigns one in shell/INI syntax (`export HF_TOKEN=...`, `password=...`, a URL `user:pass@host`), unless
    the assigned value only refers to the environment or a file (`$HF_TOKEN`, `$(cat ~/.token)`);
  - it sits under an extras key named like one (extras.hf_token), where free-form notes live.
The value is never echoed: the message names the key and the kind of credential only.
"""

from __future__ import annotations

import os
import re

from omegaconf import OmegaConf

from launcher.config.errors import ConfigError

# Environment variables that hold credentials: their values must never reach config.yaml, checkpoints or logs.
SECRET_ENV = re.compile(r"(^|_)(API_KEY|ACCESS_KEY|SECRET_KEY|PRIVATE_KEY|TOKEN|SECRET|PASSWORD|PASSWD)$")
# Names of free-form keys (extras.*) that would hold a credential; schema keys are known not to.
SECRET_KEY = re.compile(r"(^|[_.-])(api_?key|token|secret|password|passwd|credentials?)($|[_.-])", re.IGNORECASE)

# The published shapes of the credentials an LLM training job meets. (?<![\w/]) keeps them from matching inside
# a longer word or a path component (a hub cache snapshot directory is a 40-hex commit id).
SHAPES: tuple[tuple[str, re.Pattern], ...] = (
    # huggingface.co/docs/hub/security-tokens: "hf_" + 34 letters/digits.
    ("a Hugging Face token (hf_...)", re.compile(r"(?<![\w/])hf_[A-Za-z0-9]{30,}(?![\w/])")),
    # docs.aws.amazon.com IAM identifiers: access key ids start with AKIA (long-term) or ASIA (temporary), 20 chars.
    ("an AWS access key id (AKIA...)", re.compile(r"(?<![A-Z0-9])(AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")),
    # OpenAI / Anthropic style API keys: "sk-" (sk-proj-, sk-ant-, ...) + a long random tail.
    ("an API secret key (sk-...)", re.compile(r"(?<![\w/-])sk-[A-Za-z0-9_-]{20,}")),
    # GitHub: ghp_/gho_/ghu_/ghs_/ghr_ + 36, and fine-grained github_pat_...
    ("a GitHub token", re.compile(r"(?<![\w/])(gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})")),
    ("a Slack token (xox...)", re.compile(r"(?<![\w/])xox[abprs]-[A-Za-z0-9-]{10,}")),
    ("a private key block", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
)
# A W&B API key is 40 hex digits (wandb login), the same shape as a git commit id: recognised as the whole value
# (git ids are allowed under keys that say so) or when assigned to a key named like a credential (below).
HEX40 = re.compile(r"[0-9a-f]{40}")
COMMIT_KEY = re.compile(r"(sha|commit|revision|hash)", re.IGNORECASE)
# NAME=value / NAME: value / --name value where NAME says credential; `password=` in any case.
ASSIGNMENT = re.compile(r"(?i)\b([A-Z0-9_]*(?:API_?KEY|ACCESS_?KEY|SECRET(?:_?KEY)?|PRIVATE_?KEY|TOKEN|PASSWORD|PASSWD|PWD))"
                        r"\s*[=:]\s*(\"[^\"]*\"|'[^']*'|[^\s;&|]+)")
URL_PASSWORD = re.compile(r"://[^/\s:@]+:([^/\s@]+)@")


def _refers_elsewhere(value: str) -> bool:
    """`$NAME`, `${NAME}`, `$(cat file)`, a path or empty: the assignment does not hold the credential itself."""
    v = value.strip("\"'")
    return v == "" or v.startswith(("$", "`", "/", "~", "<")) or v.lower() in ("none", "null", "true", "false")


def credential_kind(text: str, key: str = "") -> str | None:
    """What kind of credential `text` holds in clear, or None."""
    for kind, pattern in SHAPES:
        if pattern.search(text):
            return kind
    if HEX40.fullmatch(text.strip()) and not COMMIT_KEY.search(key.rsplit(".", 1)[-1]):
        return "a W&B API key (40 hex digits)"
    for m in ASSIGNMENT.finditer(text):
        if not _refers_elsewhere(m.group(2)):
            return f"a credential assigned to {m.group(1)}"
    m = URL_PASSWORD.search(text)
    if m and not _refers_elsewhere(m.group(1)):
        return "a password in a URL (user:password@host)"
    return None


def secret_env_values() -> dict[str, str]:
    # A path (HF_TOKEN_PATH-like variables hold one) is no credential and could be a prefix of a config path.
    return {name: value for name, value in os.environ.items()
            if SECRET_ENV.search(name) and len(value) >= 8 and not value.startswith(("/", "~", "."))}


def redact(text: str) -> str:
    """`text` with every credential-shaped part and every secret environment value replaced (for messages)."""
    for name, value in secret_env_values().items():
        text = text.replace(value, f"<${name}>")
    for _, pattern in SHAPES:
        text = pattern.sub("<redacted>", text)
    return ASSIGNMENT.sub(lambda m: m.group(0) if _refers_elsewhere(m.group(2)) else f"{m.group(1)}=<redacted>", text)


FIX = ("pass credentials through the environment, never as config values: export them in the shell you run "
       "launcher from, or in a file the job sources (cluster.setup='source ~/.secrets.sh' with mode 600); "
       "sbatch hands the submitting environment to the job, and W&B and the hub read WANDB_API_KEY and HF_TOKEN themselves")


def refuse_secrets_in_config(cfg) -> None:
    """Refuse a config whose values hold a credential (see the module docstring). The value is never echoed."""
    secrets = secret_env_values()

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                key = f"{prefix}{k}"
                if key.startswith("extras.") and SECRET_KEY.search(str(k)) and v not in (None, "", {}, []):
                    raise ConfigError(key, "<redacted>", "looks like a credential, and config values are written to "
                                      "config.yaml, checkpoints and logs", FIX)
                walk(v, key + ".")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{prefix[:-1]}[{i}].")
        elif isinstance(node, str):
            key = prefix[:-1]
            for name, value in secrets.items():
                if value in node:
                    raise ConfigError(key, "<redacted>", f"holds the value of the environment variable {name}, "
                                      "and config values are written to config.yaml, checkpoints and logs",
                                      f"remove it from the config; the launcher and W&B read {name} from the environment")
            kind = credential_kind(node, key)
            if kind:
                where = ""
                if "\n" in node.strip():
                    line = next(i for i, text in enumerate(node.splitlines(), 1) if credential_kind(text, key))
                    where = f" (line {line})"
                raise ConfigError(key, "<redacted>", f"holds what looks like {kind}{where}, and config values are written "
                                  "in clear to config.yaml, job.sbatch, checkpoints and logs", FIX)

    walk(OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg, "")
