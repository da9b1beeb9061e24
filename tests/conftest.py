"""Shared pytest fixtures."""

from __future__ import annotations

import os

import pytest

# Keep thread pools small: CI has 2 cores and several test modules start servers and models.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Point ragen's cache folder at a temp dir so tests never read or write the user's cache."""
    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ragen-cache"))
