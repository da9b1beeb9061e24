"""Shared pytest fixtures."""

from __future__ import annotations

import os
import signal

import pytest

# Keep thread pools small: CI has 2 cores and several test modules start servers and models.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# A shell starts background jobs (`cmd &`, `nohup`) with SIGINT ignored, and Python then never raises
# KeyboardInterrupt: the Ctrl-C tests (which send SIGINT to a training run) would see nothing. Restore Python's own
# handler; their subprocesses then start with the default disposition too.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Point ragen's cache folder at a temp dir so tests never read or write the user's cache."""
    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ragen-cache"))
