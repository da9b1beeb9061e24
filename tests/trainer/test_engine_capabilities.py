"""Engines say what they can, and the trainer asks them (not their names): how the policy's weights reach an engine
(``weights_by_reference``) and whether one engine serves every process (``shared_across_processes``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.engines.base import GenerationEngine, ModelEngine  # noqa: E402
from ragen_trainer.engines.hf import HFEngine  # noqa: E402
from ragen_trainer.engines.hf_generate import GenerateEngine  # noqa: E402
from ragen_trainer.engines.openai import OpenAIEngine  # noqa: E402
from ragen_trainer.engines.vllm import VLLMEngine  # noqa: E402
from ragen_trainer.trainer import PolicyView, StarPOTrainer  # noqa: E402
from tests.trainer.conftest import ScriptedEngine, build_tiny_model  # noqa: E402
from tests.trainer.test_trainer import small_config  # noqa: E402


def test_the_engines_declare_how_weights_reach_them():
    assert GenerationEngine.weights_by_reference is False and GenerationEngine.shared_across_processes is False
    for engine in (ModelEngine, HFEngine, GenerateEngine):  # generate with the training module itself
        assert engine.weights_by_reference is True and engine.shared_across_processes is False
    assert OpenAIEngine.weights_by_reference is False and VLLMEngine.weights_by_reference is False


class RecordingEngine(ScriptedEngine):
    def __init__(self, tokenizer, *, by_reference: bool | None) -> None:
        super().__init__(tokenizer, ["<answer>Left</answer>"])
        if by_reference is not None:
            self.weights_by_reference = by_reference
        self.received = []

    def update_weights(self, model):
        self.received.append(model)


@pytest.mark.parametrize("by_reference", [True, False, None])
def test_the_trainer_hands_weights_as_the_engine_asks(tmp_path, tiny_tokenizer, by_reference):
    """``True``: the live module; ``False``, or an engine of the user's own without the attribute: a view of the
    policy without its critic, to copy."""
    model = build_tiny_model(tiny_tokenizer)
    engine = RecordingEngine(tiny_tokenizer, by_reference=by_reference)
    trainer = StarPOTrainer(small_config(tmp_path, total_steps=1), model, tiny_tokenizer, engine=engine)
    trainer._sync_engine(trainer.policy)
    (received,) = engine.received
    if by_reference:
        assert received is trainer.policy
    else:
        assert isinstance(received, PolicyView)
