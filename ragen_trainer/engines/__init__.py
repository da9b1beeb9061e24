"""Generation engines: ragen's own decoding loop on a Hugging Face model (``HFEngine``, default), plain
``model.generate`` (``GenerateEngine``, the baseline), vLLM (optional extra), OpenAI-compatible HTTP (eval only).

Heavy backends are imported only when their engine is used: ``from ragen_trainer.engines import HFEngine`` does not
import vLLM.
"""

from __future__ import annotations

from typing import Any

from ragen_trainer.engines.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    GenerationSession,
    SamplingParams,
)

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "GenerateEngine",
    "GenerationEngine",
    "GenerationRequest",
    "GenerationResult",
    "GenerationSession",
    "HFEngine",
    "OpenAIEngine",
    "SamplingParams",
    "VLLMEngine",
]


def __getattr__(name: str) -> Any:  # lazy: torch / vllm / http only when asked for
    if name == "HFEngine":
        from ragen_trainer.engines.hf import HFEngine

        return HFEngine
    if name == "GenerateEngine":
        from ragen_trainer.engines.hf_generate import GenerateEngine

        return GenerateEngine
    if name == "VLLMEngine":
        from ragen_trainer.engines.vllm import VLLMEngine

        return VLLMEngine
    if name == "OpenAIEngine":
        from ragen_trainer.engines.openai import OpenAIEngine

        return OpenAIEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
