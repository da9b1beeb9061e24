"""The generation-engine interface the rollout talks to.

Two kinds of engines exist:

* **token engines** (:class:`~ragen_trainer.engines.hf.HFEngine`, :class:`~ragen_trainer.engines.vllm.VLLMEngine`)
  take token ids in and give sampled token ids (and their log-probabilities) out, so the rollout keeps the model's
  tokens verbatim and can train on them;
* **chat engines** (:class:`~ragen_trainer.engines.openai.OpenAIEngine`) only take chat messages and give text back:
  good for evaluating hosted models, not for training (no token ids, no log-probabilities).

``supports_token_ids`` tells them apart; the rollout calls :meth:`GenerationEngine.generate` on the first kind and
:meth:`GenerationEngine.generate_chat` on the second.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any

from ragen_envs.core import check_arg

#: ``finish_reason`` values: the reply ended with a stop / end-of-turn token, or hit ``max_new_tokens``.
FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one reply.

    ``temperature=0`` means greedy decoding. ``top_k=0`` and ``top_p=1.0`` switch those filters off.
    ``seed`` makes sampling reproducible (same prompts, same seed, same engine and batch size: same replies);
    ``None`` draws from the engine's running random state.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 400
    seed: int | None = None

    def __post_init__(self) -> None:
        check_arg(
            isinstance(self.temperature, (int, float))
            and not isinstance(self.temperature, bool)
            and math.isfinite(self.temperature)
            and self.temperature >= 0,
            "temperature",
            self.temperature,
            "a finite number >= 0 (0 = greedy)",
        )
        check_arg(
            isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool) and 0 < self.top_p <= 1,
            "top_p",
            self.top_p,
            "a number in (0, 1]",
        )
        check_arg(
            isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 0,
            "top_k",
            self.top_k,
            "an int >= 0 (0 = off)",
        )
        check_arg(
            isinstance(self.max_new_tokens, int)
            and not isinstance(self.max_new_tokens, bool)
            and self.max_new_tokens >= 1,
            "max_new_tokens",
            self.max_new_tokens,
            "an int >= 1",
        )
        check_arg(
            self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0),
            "seed",
            self.seed,
            "None or an int >= 0",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def with_seed(self, seed: int | None) -> SamplingParams:
        """A copy with another seed (the rollout derives one seed per turn from the base seed)."""
        return replace(self, seed=seed)


@dataclass
class GenerationResult:
    """One sampled reply."""

    token_ids: list[int]
    """The sampled tokens, verbatim, including the stop / end-of-turn token when the model emitted one.
    Empty for chat engines, which do not report tokens."""
    text: str
    """The reply decoded without special tokens (what the env receives)."""
    logprobs: list[float] | None = None
    """Log-probability of each sampled token under the sampling distribution (logits / temperature, before top-k /
    top-p filtering, as TRL computes them), aligned with ``token_ids``; ``None`` when the engine does not report
    them."""
    finish_reason: str = FINISH_STOP
    """``"stop"`` (stop token or end of turn) or ``"length"`` (``max_new_tokens`` reached)."""


class GenerationEngine(ABC):
    """Generates replies for a batch of prompts. Subclasses implement :meth:`generate` or :meth:`generate_chat`."""

    #: ``True``: :meth:`generate` works on token ids and the replies can be trained on.
    supports_token_ids: bool = True
    #: A short name for logs.
    name: str = "engine"
    #: The engine's tokenizer, when it has one (used by the default :meth:`generate_chat`).
    tokenizer: Any = None

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        """Sample one reply per prompt (each prompt is a list of token ids), in order."""

    def generate_chat(
        self, messages_batch: list[list[dict[str, str]]], params: SamplingParams
    ) -> list[GenerationResult]:
        """Sample one reply per conversation. Token engines render the tokenizer's chat template and call
        :meth:`generate`; chat engines override this."""
        if self.tokenizer is None:
            raise NotImplementedError(f"{type(self).__name__} has no tokenizer to render chat messages with")
        prompts = []
        for messages in messages_batch:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            prompts.append(list(self.tokenizer(text, add_special_tokens=False)["input_ids"]))
        return self.generate(prompts, params)

    def update_weights(self, model: Any) -> None:
        """Make the next generation use ``model``'s current weights (on-policy sampling). Default: nothing to do."""

    def close(self) -> None:
        """Release resources (servers, GPU memory). Default: nothing to release."""

    def __enter__(self) -> GenerationEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
