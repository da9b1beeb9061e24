"""Fixtures of the benchmark tests."""

from __future__ import annotations

import pytest

from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny model and tokenizer (a folder a benchmark's worker loads like a real model's)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_layers=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
