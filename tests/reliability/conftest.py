"""Fixtures the reliability tests share with the trainer's tests (the tiny model saved in a folder)."""

from tests.trainer.conftest import tiny_model_dir, tiny_tokenizer  # noqa: F401  (fixtures)
