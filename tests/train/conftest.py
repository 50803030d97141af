"""Fixtures of the training tests (helpers live in train_helpers.py)."""

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One tokenizer/token cache for the whole session: the corpus is tokenized once."""
    return tmp_path_factory.mktemp("launcher-cache")
