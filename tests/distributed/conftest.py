"""Fixtures the distributed tests share with the trainer's tests."""

from tests.trainer.conftest import tiny_model_dir, tiny_tokenizer  # noqa: F401  (fixtures)
