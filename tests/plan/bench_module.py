"""Load a script under bench/ as a module (bench/ is not a package: its scripts run as files)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load(relpath: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
