"""The generation-engine interface the rollout talks to.

Two kinds of engines exist:

* **token engines** (:class:`~ragen_trainer.engines.hf.HFEngine`, :class:`~ragen_trainer.engines.vllm.VLLMEngine`)
  take token ids in and give sampled token ids (and their log-probabilities) out, so the rollout keeps the model's
  tokens verbatim and can train on them;
* **chat engines** (:class:`~ragen_trainer.engines.openai.OpenAIEngine`) only take chat messages and give text back:
  good for evaluating hosted models, not for training (no token ids, no log-probabilities).

``supports_token_ids`` tells them apart; the rollout calls :meth:`GenerationEngine.generate` on the first kind and
:meth:`GenerationEngine.generate_chat` on the second.

Continuous batching. :meth:`GenerationEngine.session` opens a :class:`GenerationSession`: requests are submitted at any
time (an episode's next turn as soon as its env has answered), :meth:`GenerationSession.step` advances generation and
returns the replies that finished, and a request's ``key`` (its episode) lets an engine keep state between the turns of
one episode (:class:`~ragen_trainer.engines.hf.HFEngine` keeps its KV cache). The default session
(:class:`BatchSession`) generates everything queued in one :meth:`~GenerationEngine.generate` call per step, which is
what engines with their own scheduler (vLLM) want.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any

from ragen_envs.core import check_arg
from ragen_trainer.models import stop_token_ids as default_stops

#: ``finish_reason`` values: the reply ended with a stop / end-of-turn token, or hit ``max_new_tokens``.
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
#: How an episode whose reply the engine could not produce ends (``AgentReply.stop`` starts with it, then ``": "``
#: and the engine's reason): a chat endpoint that failed the request after its retries, or answered something that
#: is not a completion. The evaluation records such an episode as failed by the engine, not by the model.
ENGINE_FAILURE = "engine failure"


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one reply.

    ``temperature=0`` means greedy decoding. ``top_k=0`` and ``top_p=1.0`` switch those filters off.
    ``seed`` makes sampling reproducible (same prompts, same seed, same engine and batch size: same replies);
    ``None`` draws from the engine's running random state.
    ``stop`` lists stop strings: a reply ends right after the first occurrence of any of them, which stays in its text
    (vLLM's ``include_stop_str_in_output``); the token that completed it is the reply's last token.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 400
    seed: int | None = None
    stop: tuple[str, ...] = ()

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
        check_arg(
            isinstance(self.stop, tuple) and all(isinstance(x, str) and x for x in self.stop),
            "stop",
            self.stop,
            "a tuple of non-empty strings (stop strings)",
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
    error: str | None = None
    """Why there is no reply (``text`` is then empty): set only by chat engines' sessions, for one request that the
    endpoint failed or answered with something that is not a completion (token engines raise instead)."""


class GenerationEngine(ABC):
    """Generates replies for a batch of prompts. Subclasses implement :meth:`generate` or :meth:`generate_chat`."""

    #: ``True``: :meth:`generate` works on token ids and the replies can be trained on.
    supports_token_ids: bool = True
    #: A short name for logs.
    name: str = "engine"
    #: What the trainer hands :meth:`update_weights`: ``True``, the live policy module itself (the engine reads its
    #: weights in place, critic head and all, nothing copied); ``False``, a view of the policy's own weights without
    #: the critic, which the engine copies.
    weights_by_reference: bool = False
    #: ``True``: one engine serves every training process (a server), so one process pushes the weights and the others
    #: wait for the push; ``False``: each process has its own engine and updates it.
    shared_across_processes: bool = False
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

    def session(self, params: SamplingParams) -> GenerationSession:
        """A continuous-batching session sampling with ``params`` (each request brings its own seed)."""
        return BatchSession(self, params)

    def update_weights(self, model: Any) -> None:
        """Make the next generation use ``model``'s current weights (on-policy sampling). Default: nothing to do."""

    def close(self) -> None:
        """Release resources (servers, GPU memory). Default: nothing to release."""

    def __enter__(self) -> GenerationEngine:  # noqa: PYI034 (Python 3.10 has no typing.Self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ModelEngine(GenerationEngine):
    """The set-up shared by the engines that sample from an in-process ``transformers`` model (``hf``,
    ``hf-generate``): the live model, its tokenizer, the batch size, the stop tokens and the log-prob switch."""

    weights_by_reference = True  # generates with the training module itself

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int,
        stop_token_ids: list[int] | None,
        compute_logprobs: bool,
    ) -> None:
        check_arg(
            isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size >= 1,
            "batch_size",
            batch_size,
            "an int >= 1",
        )
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.stop_token_ids = list(stop_token_ids) if stop_token_ids is not None else default_stops(tokenizer)
        check_arg(len(self.stop_token_ids) > 0, "stop_token_ids", stop_token_ids, "at least one token id (eos)")
        self.compute_logprobs = compute_logprobs

    def update_weights(self, model: Any) -> None:
        """Generate with ``model`` from now on (the engine otherwise keeps using the object it was given)."""
        self.model = model


@dataclass(frozen=True)
class GenerationRequest:
    """One reply to generate in a :class:`GenerationSession`."""

    key: Hashable
    """Who asks (an episode): replies come back under it, and an engine may keep state under it between turns."""
    prompt: list[int] | None = None
    """The whole conversation so far as token ids, ending where the reply starts (token engines)."""
    messages: list[dict[str, str]] | None = None
    """The conversation as chat messages (chat engines)."""
    seed: int | None = None
    """Sampling seed of this reply (``None``: the engine's running random state)."""
    max_new_tokens: int | None = None
    """A tighter token limit for this reply (e.g. the room left in its context); ``None``: the session's."""


class GenerationSession:
    """Submit requests at any time; :meth:`step` advances generation and returns the finished replies.

    ``release(key)`` says that ``key``'s episode is over (an engine drops what it kept for it). A session is used by
    one thread.
    """

    def __init__(self, engine: GenerationEngine, params: SamplingParams) -> None:
        check_arg(isinstance(params, SamplingParams), "params", type(params).__name__, "a SamplingParams")
        self.engine = engine
        self.params = params

    def submit(self, request: GenerationRequest) -> None:
        raise NotImplementedError

    def step(self) -> list[tuple[Hashable, GenerationResult]]:
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        """Requests are queued or being generated."""
        raise NotImplementedError

    def release(self, key: Hashable) -> None:
        """``key``'s episode is over. Default: nothing kept, nothing to drop."""

    def close(self) -> None:
        """End the session (drop every kept state)."""

    def __enter__(self) -> GenerationSession:  # noqa: PYI034 (Python 3.10 has no typing.Self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BatchSession(GenerationSession):
    """The default session: each :meth:`step` generates every queued request in one engine call (prompts with
    :meth:`GenerationEngine.generate`, messages with :meth:`GenerationEngine.generate_chat`), seeded with the first
    request's seed (engines derive one seed per row from it)."""

    def __init__(self, engine: GenerationEngine, params: SamplingParams) -> None:
        super().__init__(engine, params)
        self._queue: list[GenerationRequest] = []

    def submit(self, request: GenerationRequest) -> None:
        check_arg(
            (request.prompt is not None) != (request.messages is not None),
            "request",
            request,
            "a GenerationRequest with either prompt (token ids) or messages",
        )
        self._queue.append(request)

    @property
    def busy(self) -> bool:
        return bool(self._queue)

    def step(self) -> list[tuple[Hashable, GenerationResult]]:
        batch, self._queue = self._queue, []
        if not batch:
            return []
        params = self.params.with_seed(batch[0].seed)
        limits = [r.max_new_tokens for r in batch if r.max_new_tokens is not None]
        if len(limits) == len(batch):  # the roomiest request's limit (a caller cuts longer replies of the others)
            params = replace(params, max_new_tokens=min(params.max_new_tokens, max(limits)))
        if batch[0].prompt is not None:
            results = self.engine.generate([r.prompt or [] for r in batch], params)
        else:
            results = self.engine.generate_chat([r.messages or [] for r in batch], params)
        if len(results) != len(batch):
            raise RuntimeError(f"{type(self.engine).__name__} returned {len(results)} replies for {len(batch)} prompts")
        return [(r.key, res) for r, res in zip(batch, results)]


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to and including the earliest stop string, and whether one was found."""
    ends = [text.find(s) + len(s) for s in stop if s in text]
    return (text[: min(ends)], True) if ends else (text, False)


def reply_text(tokenizer: Any, token_ids: list[int], stop: tuple[str, ...] = ()) -> str:
    """A reply's text as the env receives it: decoded without special tokens, cut right after its first stop string
    (the token that completed the string may carry more characters, e.g. ``">\n"``; they are not part of the reply)."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    return cut_at_stop(text, stop)[0] if stop else text


def stop_string_end(tokenizer: Any, token_ids: list[int], stop: tuple[str, ...]) -> int | None:
    """How many of ``token_ids`` a reply keeps when it ends at its first stop string: up to and including the token
    that completes it; ``None`` when the decoded text holds none. (Decoded prefixes only grow, so a binary search
    over them finds that token with a few decodes.)"""
    if not stop or not token_ids:
        return None

    def has_stop(n: int) -> bool:
        text = tokenizer.decode(token_ids[:n], skip_special_tokens=True)
        return any(s in text for s in stop)

    if not has_stop(len(token_ids)):
        return None
    low, high = 1, len(token_ids)  # invariant: has_stop(high)
    while low < high:
        mid = (low + high) // 2
        if has_stop(mid):
            high = mid
        else:
            low = mid + 1
    return high
