"""pyproject.toml's floors hold for what the tests run on: each is satisfied by the installed (tested) version."""

from __future__ import annotations

import hashlib
import re
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

PROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
TESTED = [Requirement(r) for r in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["test"]]


@pytest.mark.parametrize("req", TESTED, ids=str)
def test_installed_version_meets_the_floor(req):
    installed = version(req.name)
    assert req.specifier.contains(installed, prereleases=True), f"{req}: installed {installed}"


def test_python_floor_is_what_the_code_needs():
    assert SpecifierSet(PROJECT["requires-python"]).contains(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert not SpecifierSet(PROJECT["requires-python"]).contains("3.10")  # hashlib.file_digest is 3.11+
    assert hasattr(hashlib, "file_digest")


def test_the_code_cites_only_files_that_ship_with_the_repo():
    """Measured facts the code relies on live in docs/ (e.g. docs/parallel-notes.md), not in notes outside the repo."""
    repo = Path(__file__).resolve().parents[2]
    sources = [*repo.joinpath("launcher").rglob("*.py"), *repo.joinpath("tests").rglob("*.py"), *repo.joinpath("docs").glob("*.md")]
    for src in sources:
        text = src.read_text()
        if src == Path(__file__).resolve():
            continue
        assert "shared/notes" not in text and "findings.md" not in text, f"{src} cites a notes file outside the repo"
        for cited in re.findall(r"docs/[\w.-]+\.md", text):
            assert (repo / cited).is_file(), f"{src} cites {cited}, which does not exist"
