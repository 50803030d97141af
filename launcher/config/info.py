"""`--info` and `--cfg job`: what a Hydra user asks before running (`python app.py --info`, `--cfg job`).

`launcher` composes its configs with Hydra but is not a Hydra app (it has subcommands and its own errors), so
Hydra's flags are re-created on plan, show, train and submit with the same names and meanings:
- `--cfg job` (`-c job`) prints the composed config as YAML and exits: no layout check, nothing started, so it
  also shows a config that `plan` would refuse. `--package/-p KEY` prints only that key (Hydra's `-p`).
- `--info` prints the config search path (built-in, then $LAUNCHER_CONF_PATH), the option each group ended
  with after the recipe and the overrides, and every group's options with the directory each comes from.
"""

from __future__ import annotations

from typing import Sequence

from omegaconf import OmegaConf

from launcher.config.compose import CONF_PATH_ENV, compose_choices, conf_dir, user_conf_dirs
from launcher.config.errors import ConfigError


def config_yaml(cfg, package: str | None = None) -> str:
    """The composed config (or its `package` key) as YAML, interpolations resolved."""
    if package:
        node = OmegaConf.select(cfg, package, default=None)
        if node is None:
            top = ", ".join(str(k) for k in cfg.keys())
            raise ConfigError("--package", package, "names no key of the composed config", f"use one of: {top} "
                              "(or a dotted key below one, e.g. parallel.zero_stage)")
        if not OmegaConf.is_config(node):
            return f"{node}\n"
        return OmegaConf.to_yaml(node, resolve=True)
    return OmegaConf.to_yaml(cfg, resolve=True)


def config_info(overrides: Sequence[str]) -> str:
    """The config search path, the chosen option of each group, and each group's options (Hydra's --info)."""
    builtin = conf_dir()
    users = user_conf_dirs()
    choices = compose_choices(overrides)
    lines = ["Config search path (first match wins; a user directory may add options, not replace built-in ones)"]
    lines.append(f"  launcher            {builtin}")
    for d in users:
        lines.append(f"  {CONF_PATH_ENV:<19} {d}")
    if not users:
        lines.append(f"  ({CONF_PATH_ENV} is not set: add directories laid out like the built-in one, "
                     "os.pathsep-separated)")
    lines += ["", f"Primary config: {builtin / 'config.yaml'}", "",
              "Defaults list (the option each group ended with, after the recipe and the overrides)"]
    # In the primary config's order (Hydra's runtime.choices lists them in reverse).
    primary = [str(next(iter(d))) for d in OmegaConf.load(builtin / "config.yaml").defaults if OmegaConf.is_dict(d)]
    ordered = sorted(choices, key=lambda g: primary.index(g) if g in primary else len(primary))
    width = max(len(g) for g in choices)
    lines += [f"  {group:<{width}}  {'null' if choices[group] is None else choices[group]}" for group in ordered]
    lines += ["", "Config groups (choose with GROUP=OPTION; * = chosen; [dir] = from that $LAUNCHER_CONF_PATH entry)"]
    groups = sorted({p.name for d in [builtin, *users] for p in d.iterdir() if p.is_dir() and any(p.glob("*.yaml"))})
    width = max(len(g) for g in groups)
    for group in groups:
        options = []
        for d in [builtin, *users]:
            for path in sorted((d / group).glob("*.yaml")):
                mark = "*" if choices.get(group) == path.stem else ""
                origin = "" if d == builtin else f" [{d}]"
                options.append(f"{path.stem}{mark}{origin}")
        lines.append(f"  {group:<{width}}  {', '.join(options)}")
    return "\n".join(lines) + "\n"
