"""The range table (launcher/config/ranges.py) against the schema: every numeric field has a range, its docstring
states the same range, and the boundary values are accepted or refused as the docstring says."""

from __future__ import annotations

import ast
import math
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import get_type_hints

import pytest

from launcher.config import schema
from launcher.config.errors import ConfigError
from launcher.config.ranges import RANGES, check_ranges

SCHEMA_SOURCE = Path(schema.__file__).read_text()


def numeric_fields(node=schema.Config, prefix=""):
    hints = get_type_hints(node)
    for f in fields(node):
        t = hints[f.name]
        inner = [a for a in getattr(t, "__args__", ()) if a is not type(None)]
        base = inner[0] if inner and getattr(t, "__origin__", None) is not None and len(inner) == 1 else t
        if is_dataclass(base):
            yield from numeric_fields(base, f"{prefix}{f.name}.")
        elif base in (int, float):
            yield f"{prefix}{f.name}", base


def docstrings() -> dict[tuple[str, str], str]:
    """(class name, field) -> the docstring under the field in schema.py."""
    out = {}
    for cls in ast.parse(SCHEMA_SOURCE).body:
        if isinstance(cls, ast.ClassDef):
            for st, nxt in zip(cls.body, cls.body[1:]):
                if isinstance(st, ast.AnnAssign) and isinstance(nxt, ast.Expr):
                    out[(cls.name, st.target.id)] = nxt.value.value
    return out


def test_every_numeric_field_has_a_range_and_documents_it():
    found = dict(numeric_fields())
    assert set(found) == set(RANGES), set(found) ^ set(RANGES)
    docs = docstrings()
    owner = {f"{f.name}": type(f.default_factory()).__name__ for f in fields(schema.Config) if f.default_factory is not MISSING}
    for key, kind in found.items():
        group, name = key.split(".")
        doc = " ".join(docs[(owner[group], name)].split())
        assert f"Range: {RANGES[key].describe()}" in doc, (key, doc)
        assert RANGES[key].whole == (kind is int), key


@pytest.mark.parametrize("key", sorted(RANGES))
def test_bounds_are_the_documented_ones(key):
    """Each end of each range: the value on it is accepted (closed end) or refused (open end); one step outside
    is refused; nan and inf are refused for real numbers."""
    r = RANGES[key]
    eps = 1 if r.whole else 1e-9
    if r.low is not None:
        assert r.allows(r.low) != r.low_open, key
        assert not r.allows(r.low - eps), key
    if r.high is not None:
        assert r.allows(r.high) != r.high_open, key
        assert not r.allows(r.high + eps), key
    assert r.allows(None) == r.nullable
    assert not r.allows(True) and not r.allows("1")
    if not r.whole:
        assert not r.allows(math.nan) and not r.allows(math.inf)
    else:
        assert not r.allows(1.5)


def test_every_recipe_default_is_in_range():
    from launcher.config.compose import compose, group_options

    for recipe in group_options("recipe"):
        check_ranges(compose([f"recipe={recipe}"]))


def test_message_has_key_value_rule_and_fix():
    from launcher.config.compose import compose

    with pytest.raises(ConfigError) as err:
        check_ranges(compose(["recipe=tiny", "optimizer.beta2=1.5"]))
    assert str(err.value) == ("optimizer.beta2=1.5: must be a number in [0, 1) (torch.optim.AdamW refuses betas outside "
                              "[0, 1); at 1 the moving average never moves)\n  fix: e.g. optimizer.beta2=0.95")
