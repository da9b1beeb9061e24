"""The rollout engine a training config asks for (``engine``: ``hf``, ``hf-generate`` or ``vllm``)."""

from __future__ import annotations

from typing import Any

from ragen_trainer.engines.base import GenerationEngine


def make_training_engine(config: Any, model: Any, tokenizer: Any) -> GenerationEngine:
    """The engine that generates a run's rollouts with ``model`` (the live policy, unwrapped):

    * ``hf`` -- ragen's decoding loop on the policy itself (:class:`~ragen_trainer.engines.hf.HFEngine`);
    * ``hf-generate`` -- ``model.generate`` from scratch every turn (the plain baseline);
    * ``vllm`` -- a vLLM server at ``engine_url`` that receives the policy's weights before every rollout.
    """
    if config.engine == "hf-generate":
        from ragen_trainer.engines.hf_generate import GenerateEngine

        return GenerateEngine(model, tokenizer, batch_size=config.generation_batch_size)
    if config.engine == "vllm":
        from ragen_trainer.engines.vllm import VLLMEngine

        return VLLMEngine(config.model, tokenizer, mode="server", base_url=config.engine_url)
    from ragen_trainer.engines.hf import HFEngine

    return HFEngine(model, tokenizer, batch_size=config.generation_batch_size)


__all__ = ["make_training_engine"]
