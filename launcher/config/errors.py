"""ConfigError: the one exception a user sees for bad input.

Every error names the config key, the bad value, the rule (with the user's
arithmetic) and a fix, so it can be acted on without reading our code.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run, caught before any process starts."""

    def __init__(self, key: str, value: object, rule: str, fix: str):
        # A message is printed and logged: credential-shaped text and secret environment values never appear in it.
        from launcher.config.secrets import redact

        self.key = key
        self.value = redact(value) if isinstance(value, str) else value
        self.rule = rule
        self.fix = fix
        super().__init__(redact(f"{key}={self.value!r}: {rule}\n  fix: {fix}"))


def nearest_multiples(value: int, step: int) -> tuple[int, ...]:
    """The multiples of `step` just below and above `value` (positive only)."""
    below = (value // step) * step
    above = below + step
    return tuple(v for v in (below, above) if v > 0 and v != value)


def nearest_divisors(n: int, value: int, count: int = 2) -> tuple[int, ...]:
    """The divisors of `n` closest to `value`, nearest first."""
    divisors = [d for d in range(1, n + 1) if n % d == 0 and d != value]
    return tuple(sorted(divisors, key=lambda d: (abs(d - value), d))[:count])


def join_or(values) -> str:
    values = [str(v) for v in values]
    if not values:
        return "(none)"
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " or " + values[-1]


def refuse_parallel_degrees(key: str, value, degrees: dict, rule: str, fix: str, fix_tail: str = "") -> None:
    """ConfigError on `key` for the first of `degrees` ({config key: (degree, why)}) above 1: a setting that runs only
    where those degrees are 1. `rule` says where it runs; `fix` turns the setting off, `fix_tail` follows the degree's fix."""
    for name, (degree, why) in degrees.items():
        if degree > 1:
            raise ConfigError(key, value, f"{rule}, not with {name}={degree}: {why}", f"{fix}, or {name}=1{fix_tail}")
