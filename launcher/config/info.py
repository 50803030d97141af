"""`--info` and `--cfg job|hydra|all`: what a Hydra user asks before running (`python app.py --info`, `--cfg job`).

`launcher` composes its configs with Hydra but is not a Hydra app (it has subcommands and its own errors), so
Hydra's flags are re-created on plan, show, train and submit with the same names and meanings:
- `--cfg job` (`-c job`) prints the composed config as YAML and exits: no layout check, nothing started, so it
  also shows a config that `plan` would refuse. `--package/-p KEY` prints only that key (Hydra's `-p`).
- `--cfg hydra` prints the part of Hydra's own config that describes this composition (hydra.overrides,
  hydra.runtime: version, config sources, the chosen option of every group; hydra.searchpath), and `--cfg all`
  the job config with it under `hydra:`, as Hydra does. What configures a Hydra *app* (hydra.run/sweep dirs,
  logging, help, launcher, sweeper) is left out: `launcher` is not one, and printing `hydra.run.dir:
  outputs/...` would name a directory nothing writes (the run directory is runs_dir/run_name).
- `--info` prints the config search path (built-in, then $LAUNCHER_CONF_PATH), the option each group ended
  with after the recipe and the overrides, and every group's options with the directory each comes from.
"""

from __future__ import annotations

from typing import Sequence

from omegaconf import OmegaConf

from launcher.config.compose import CONF_PATH_ENV, compose_choices, conf_dir, user_conf_dirs
from launcher.config.errors import ConfigError


# The keys of Hydra's config (hydra-core 1.3 HydraConf) that say how this config was composed.
HYDRA_KEYS_SHOWN = ("overrides", "runtime", "searchpath")
HYDRA_HEADER = ("# hydra: Hydra's config of this composition. Left out: hydra.run/sweep/launcher/sweeper/"
                "logging/help, which configure a Hydra app; `launcher` is not one (the run directory is "
                "runs_dir/run_name).\n")


def hydra_node(overrides: Sequence[str]):
    """The shown keys of Hydra's own config for `overrides` (the command line's task overrides, the chosen option
    of every group, the config sources), unresolved as Hydra prints it; `runtime.output_dir` (never set: no Hydra
    run) is dropped."""
    from launcher.config.compose import _hydra_compose

    full = _hydra_compose(overrides, "config", return_hydra_config=True)
    node = OmegaConf.to_container(OmegaConf.masked_copy(full.hydra, list(HYDRA_KEYS_SHOWN)), resolve=False)
    node["runtime"].pop("output_dir", None)
    node["runtime"].pop("cwd", None)  # where the command ran, not part of the composition
    return node


def cfg_yaml(which: str, cfg, overrides: Sequence[str], package: str | None = None) -> str:
    """`--cfg job|hydra|all`: the composed config, Hydra's config of the composition, or both in one document."""
    if which == "job":
        return config_yaml(cfg, package)
    hydra = hydra_node(overrides)
    if which == "hydra":
        doc = OmegaConf.create({"hydra": hydra})
    else:  # all: the job config resolved (as --cfg job shows it), Hydra's as Hydra prints it
        doc = OmegaConf.create({**OmegaConf.to_container(cfg, resolve=True), "hydra": hydra})
    text = config_yaml(doc, package, resolve=False)
    return text if package else HYDRA_HEADER + text


def config_yaml(cfg, package: str | None = None, resolve: bool = True) -> str:
    """The composed config (or its `package` key) as YAML, interpolations resolved."""
    if package:
        node = OmegaConf.select(cfg, package, default=None)
        if node is None:
            top = ", ".join(str(k) for k in cfg.keys())
            raise ConfigError("--package", package, "names no key of the composed config", f"use one of: {top} "
                              "(or a dotted key below one, e.g. parallel.zero_stage)")
        if not OmegaConf.is_config(node):
            return f"{node}\n"
        return OmegaConf.to_yaml(node, resolve=resolve)
    return OmegaConf.to_yaml(cfg, resolve=resolve)


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
