"""Compose launcher/conf (+ $LAUNCHER_CONF_PATH) + command-line overrides into one read-only config.

Hydra does the composition (config groups, `recipe=NAME`, `key=value`
overrides); this module turns Hydra's and OmegaConf's exceptions into a
`ConfigError` that names the full key and suggests the closest valid key or
option, and checks that nothing required was left unset.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from launcher.config.errors import ConfigError, join_or
from launcher.config.schema import Config, register_configs
from launcher.config.secrets import redact

# The built-in configs ship inside the package (package data), so a wheel install finds them; conf/ and
# recipes/ at the top of the checkout are links to launcher/conf and launcher/conf/recipe.
BUILTIN_CONF = Path(__file__).resolve().parents[1] / "conf"
# Teams add their own options (model/, cluster/, recipe/, ... laid out like launcher/conf) from their own
# directories: os.pathsep-separated, searched after the built-in ones (Hydra's hydra.searchpath).
CONF_PATH_ENV = "LAUNCHER_CONF_PATH"
HYDRA_VERSION_BASE = "1.3"


def conf_dir() -> Path:
    """The built-in Hydra config directory (the primary config.yaml and the shipped options)."""
    return BUILTIN_CONF


def user_conf_dirs() -> list[Path]:
    """The directories of $LAUNCHER_CONF_PATH, each checked: it exists, and names no built-in option."""
    dirs = [Path(d).expanduser().resolve() for d in os.environ.get(CONF_PATH_ENV, "").split(os.pathsep) if d]
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(CONF_PATH_ENV, str(d), "is not a directory",
                              f"point {CONF_PATH_ENV} at directories laid out like launcher/conf (model/, cluster/, recipe/, ...)")
        for path in sorted(d.glob("*/*.yaml")):
            builtin = BUILTIN_CONF / path.parent.name / path.name
            if builtin.exists():
                # Hydra's search path takes the first match, the built-in one: the user's file would be ignored.
                raise ConfigError(CONF_PATH_ENV, str(path), f"has the name of the built-in option "
                                  f"{path.parent.name}={path.stem}: the built-in one would be chosen and this file ignored",
                                  f"give it a name of its own (e.g. {path.stem}-site.yaml, selected with "
                                  f"{path.parent.name}={path.stem}-site); to change a few keys of the built-in one, "
                                  f"start the file with `defaults: [{path.stem}, _self_]`")
    return dirs


def conf_dirs() -> list[Path]:
    """Where options are found, in Hydra's order: the built-in directory, then $LAUNCHER_CONF_PATH."""
    return [BUILTIN_CONF, *user_conf_dirs()]


def schema_keys(path: str) -> list[str]:
    """Field names of the schema node at dotted `path` ('' = root)."""
    node = Config
    for part in filter(None, path.split(".")):
        match = [f for f in fields(node) if f.name == part]
        if not match:
            return []
        node = match[0].default_factory() if match[0].default_factory is not None else None  # type: ignore[misc]
        if not is_dataclass(node):
            return []
        node = type(node)
    return [f.name for f in fields(node)]


def schema_paths(node=Config, prefix: str = "") -> list[str]:
    """Every dotted key of the schema ('train.steps', 'cluster.gpu', ...), nested sections included."""
    out = []
    for f in fields(node):
        path = f"{prefix}{f.name}"
        out.append(path)
        default = f.default_factory() if f.default_factory is not MISSING else None  # type: ignore[misc]
        if is_dataclass(default):
            out.extend(schema_paths(type(default), f"{path}."))
    return out


# The free-form section: the one place `+key=value` adds a key (Hydra's syntax for a new dict entry).
OPEN_SECTION = "extras"


def check_override_syntax(overrides: Sequence[str]) -> None:
    """Refuse the Hydra override forms that mean nothing on the launcher's closed schema, before composing.

    Hydra accepts `+key=value` on a structured config by opening it, so a typo'd `+train.stepz=5` would be
    composed, frozen into the run and never read; `~key` (delete) and `hydra.*` / `hydra/...` (Hydra's own
    app settings; this is not a Hydra app) end in internal errors or are silently ignored.
    """
    for override in overrides:
        key, _, value = override.partition("=")
        bare = key.lstrip("+~")
        if bare == "hydra" or bare.startswith(("hydra.", "hydra/")):
            raise ConfigError(bare, value, "Hydra's own settings (hydra.run.dir, hydra/launcher, hydra.verbose, ...) do not apply: "
                              "`launcher` composes its configs with Hydra but is not a Hydra app",
                              "drop it; the run directory is runs_dir/run_name (e.g. runs_dir=/scratch/runs run_name=exp1), "
                              "sweeps are `launcher plan -m` / `launcher submit -m`, tracebacks come with --debug, "
                              "the composed config with --cfg job and the search path with --info")
        if key.startswith("~"):
            raise ConfigError(bare, override, "`~key` deletes a key, and every key of the typed schema must exist "
                              "(launcher/config/schema.py)", f"set a value instead ({bare}=null where the field is optional), "
                              "or leave the key out to keep its default")
        if key.startswith("+") and not bare.startswith(f"{OPEN_SECTION}."):
            known = schema_paths()
            groups = sorted({p.name for d in conf_dirs() for p in d.iterdir() if p.is_dir()})
            if bare in known or bare in groups:
                fix = f"drop the '+': {bare}={value} (`+` adds a new key; this one exists)"
            else:
                close = difflib.get_close_matches(bare, known + groups, n=2, cutoff=0.6)
                fix = (f"did you mean {join_or(f'{c}={value}' for c in close)}?" if close else
                       "use a key of launcher/config/schema.py") + f" (free-form notes go under +{OPEN_SECTION}.<name>=...)"
            raise ConfigError(bare, value, f"`{key[:len(key) - len(bare)]}key=value` adds a key, and the schema is closed: "
                              "a key no code reads would be frozen into the run and ignored", fix)


def group_options(group: str) -> list[str]:
    return sorted({p.stem for d in conf_dirs() for p in (d / group).glob("*.yaml")})


def default_option(group: str) -> Optional[str]:
    """The option conf/config.yaml's defaults list picks for `group` (before any recipe or override)."""
    import yaml

    for entry in yaml.safe_load((conf_dir() / "config.yaml").read_text())["defaults"]:
        if isinstance(entry, dict) and group in entry:
            return entry[group]
    return None


def recipes_for_model(model: str) -> list[str]:
    """The recipes (built-in and $LAUNCHER_CONF_PATH) whose defaults list selects `model` (`override /model: NAME`)."""
    import yaml

    found = set()
    for d in conf_dirs():
        for path in (d / "recipe").glob("*.yaml"):
            doc = yaml.safe_load(path.read_text()) or {}
            if any(isinstance(e, dict) and e.get("override /model") == model for e in doc.get("defaults", [])):
                found.add(path.stem)
    return sorted(found)


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=2, cutoff=0.5)
    return f"did you mean {join_or(close)}?" if close else f"valid: {', '.join(choices)}"


def _translate(exc: BaseException) -> ConfigError:
    """Turn a Hydra/OmegaConf composition error into a ConfigError (key, value, rule, fix)."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = exc
    while cause.__cause__ is not None and not isinstance(cause, (ConfigKeyError, ConfigAttributeError, ValidationError)):
        cause = cause.__cause__
    text = str(cause)

    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        full_key = getattr(cause, "full_key", None) or ""
        if not full_key:
            m = re.search(r"full_key: (\S+)", text) or re.search(r"Key '([^']+)'", text)
            full_key = m.group(1) if m else "?"
        parent, _, leaf = full_key.rpartition(".")
        keys = schema_keys(parent)
        where = f"'{parent}'" if parent else "the top level"
        if parent == OPEN_SECTION:  # a new entry of the free-form dict needs Hydra's '+'
            return ConfigError(full_key, leaf, f"is not a key of '{OPEN_SECTION}' yet", f"add it with +{full_key}=<value>")
        return ConfigError(full_key, leaf, f"is not a config key of {where}", _suggest(leaf, keys) if keys else "remove it")
    if isinstance(cause, ValidationError):
        full_key = getattr(cause, "full_key", None) or "?"
        value = getattr(cause, "value", None)
        first = text.splitlines()[0]
        return ConfigError(full_key, value, f"has the wrong type ({first})",
                           f"give {full_key} a value of the type its schema field declares (see launcher/config/schema.py)")
    if isinstance(exc, MissingConfigException):
        group, _, name = (getattr(exc, "missing_cfg_file", None) or "?/?").rpartition("/")
        options = list(getattr(exc, "options", None) or group_options(group))
        where = "recipes/" if group == "recipe" else f"conf/{group}/"
        also = f" (nor {group}/{name}.yaml in ${CONF_PATH_ENV})" if os.environ.get(CONF_PATH_ENV) else ""
        return ConfigError(group, name, f"there is no {where}{name}.yaml{also}", _suggest(name, options) if options else "check the name")
    if isinstance(exc, OverrideParseException):
        return ConfigError("(command line)", text.splitlines()[0], "is not a valid override", "write overrides as key=value, e.g. batch.micro_batch_size=2")
    return ConfigError("(config)", type(exc).__name__, text.splitlines()[0] if text else "composition failed", "check the overrides and the YAML files named above")


def _check_required(cfg: DictConfig) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(missing[0], "???", f"is required and has no value (also unset: {', '.join(missing[1:]) or 'nothing else'})",
                          "select a model/recipe that sets it (e.g. model=llama-7b or recipe=tiny) or pass it on the command line")


def _interpolation_error(key: str, raw, exc: BaseException) -> ConfigError:
    """One paragraph for an interpolation that cannot be resolved. The value shown is the interpolation as written
    (`${oc.env:NAME}`), never what it resolved to: that may be a credential read from the environment."""
    from omegaconf.errors import GrammarParseError, InterpolationKeyError, UnsupportedInterpolationType, ValidationError

    text = (str(exc).splitlines() or [""])[0]
    shown = raw if isinstance(raw, str) else "(interpolation)"
    if isinstance(exc, GrammarParseError):
        return ConfigError(key, shown, "is not a valid interpolation (OmegaConf could not parse it)",
                           "write ${other.key} or ${oc.env:NAME}, or quote the value if it is meant literally")
    if isinstance(exc, InterpolationKeyError):
        return ConfigError(key, shown, f"interpolates a key that does not exist ({text})",
                           "point it at an existing key (full dotted path, e.g. ${model.hidden_size}), or give a plain value")
    if isinstance(exc, UnsupportedInterpolationType):
        return ConfigError(key, shown, f"uses a resolver that does not exist ({text})",
                           "use one of OmegaConf's resolvers (oc.env, oc.select, oc.decode, ...) or a plain value")
    if "Recursive interpolation" in text or isinstance(exc, RecursionError):
        return ConfigError(key, shown, "its interpolation refers back to itself (a loop of ${...} references)",
                           "break the loop: give one of the keys in it a plain value")
    m = re.search(r"Environment variable '([^']+)' not found", str(exc))
    if m:
        return ConfigError(key, shown, f"reads the environment variable {m.group(1)}, which is not set",
                           f"export {m.group(1)} before running, or give a default: ${{oc.env:{m.group(1)},<default>}}")
    if isinstance(exc, ValidationError):
        # OmegaConf's own message holds the resolved value: not repeated here.
        return ConfigError(key, shown, "resolves to a value of the wrong type for this key",
                           f"make {shown} resolve to a value of the type launcher/config/schema.py declares for {key}")
    return ConfigError(key, shown, f"cannot be resolved ({type(exc).__name__})", "give a plain value or a valid ${...} interpolation")


def resolve_interpolations(cfg) -> None:
    """Resolve every ${...} now, in place, so a bad one is refused naming its key before anything starts
    (OmegaConf resolves lazily: otherwise the first access deep inside a rank raises a traceback)."""
    from omegaconf import ListConfig

    def visit(node, prefix: str) -> None:
        keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
        for k in keys:
            key = f"{prefix}[{k}]" if isinstance(node, ListConfig) else f"{prefix}{'.' if prefix else ''}{k}"
            child = node._get_node(k)
            if OmegaConf.is_missing(node, k) and not OmegaConf.is_interpolation(node, k):
                continue  # `???`: _check_required names it
            if OmegaConf.is_interpolation(node, k) or not isinstance(child, (DictConfig, ListConfig)):
                try:
                    node[k]
                except Exception as exc:  # noqa: BLE001 -- every OmegaConf resolution error becomes one paragraph
                    raw = child._value() if child is not None else None
                    raise _interpolation_error(key, raw, exc) from None  # no chained message: it may hold a secret
            else:
                visit(child, key)

    visit(cfg, "")
    OmegaConf.resolve(cfg)


def compose(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose the config for `overrides` (Hydra syntax). Raises ConfigError on any bad input."""
    cfg = _hydra_compose(overrides, config_name)
    resolve_interpolations(cfg)
    _check_required(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def compose_choices(overrides: Sequence[str] = (), config_name: str = "config") -> dict:
    """The option each config group ended with (after the recipe's and the command line's overrides):
    Hydra's hydra.runtime.choices, for `--info`."""
    cfg = _hydra_compose(overrides, config_name, return_hydra_config=True)
    return {group: choice for group, choice in cfg.hydra.runtime.choices.items() if not group.startswith("hydra/")}


def _hydra_compose(overrides: Sequence[str], config_name: str, return_hydra_config: bool = False) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    check_override_syntax(overrides)
    user_dirs = user_conf_dirs()
    # hydra.searchpath is refused from the command line (check_override_syntax); $LAUNCHER_CONF_PATH sets it.
    entries = ",".join(f"'file://{d}'" for d in user_dirs)  # quoted: a path may hold spaces or commas
    search = [f"hydra.searchpath=[{entries}]"] if user_dirs else []
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=HYDRA_VERSION_BASE):
            return hydra_compose(config_name=config_name, overrides=[*search, *overrides],
                                 return_hydra_config=return_hydra_config)
    except ConfigError:
        raise
    except Exception as exc:  # Hydra wraps everything in its own exception types
        err = _translate(exc)
        # --debug shows the chained exception: not when its message holds a credential-shaped value.
        raise err from (exc if redact(str(exc)) == str(exc) else None)


FROZEN_FIX = ("give the config.yaml that `launcher train` or `launcher submit` wrote into the run directory "
              "(a checkpoint's launcher_state.json holds a copy under \"config\")")


def _read_frozen(path: str | Path):
    """The YAML mapping of a frozen config file, or a ConfigError saying what is wrong with the file."""
    import yaml

    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError("--config", str(path), "does not exist", FROZEN_FIX)
    if p.is_dir():
        hint = f"; it holds {p / 'config.yaml'}" if (p / "config.yaml").is_file() else ""
        raise ConfigError("--config", str(path), f"is a directory, not a config file{hint}", f"pass --config {p / 'config.yaml'}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("--config", str(path), f"is not UTF-8 text (byte {exc.start})", FROZEN_FIX) from None
    except OSError as exc:
        raise ConfigError("--config", str(path), f"cannot be read ({exc.strerror})", "check the file's permissions") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError("--config", str(path), f"is not valid YAML: {problem}{where}", FROZEN_FIX) from None
    if data is None:
        raise ConfigError("--config", str(path), "is empty (a frozen config holds the whole composed config)", FROZEN_FIX)
    if not isinstance(data, dict):
        raise ConfigError("--config", str(path), f"holds a {type(data).__name__} at the top level, not a mapping of config keys",
                          FROZEN_FIX)
    return data


def load_frozen(path: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """Read a config frozen into a run or job directory, typed against the schema again, plus key=value
    overrides (e.g. resume=auto). Every problem with the file or an override is a ConfigError."""
    register_configs()
    data = _read_frozen(path)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(data))
    except Exception as exc:  # unknown keys and wrong types name their key
        err = _translate(exc)
        raise ConfigError(err.key, err.value, f"{err.rule} (in --config {path})", err.fix) from None
    if overrides:
        bad = [o for o in overrides if "=" not in o or o.startswith(("+", "~")) or "/" in o.split("=", 1)[0]]
        if bad:
            raise ConfigError("(command line)", bad[0], "with --config only key=value overrides apply (no groups, no recipes)",
                              "e.g. launcher train --config run/config.yaml resume=auto")
        try:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        except Exception as exc:  # noqa: BLE001 -- unknown keys and wrong types name their key
            raise _translate(exc) from None
    resolve_interpolations(merged)
    _check_required(merged)
    OmegaConf.set_readonly(merged, True)
    return merged  # type: ignore[return-value]


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def selected_name(cfg: DictConfig) -> Optional[str]:
    """The recipe's name, else the model's: used for run and job names."""
    return cfg.recipe_name or cfg.model.name
