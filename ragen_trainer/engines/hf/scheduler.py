"""HFEngine's scheduler: the continuous-batching session (:class:`HFSession`).

It decides what runs when: waiting requests are admitted into free rows (up to the engine's ``batch_size``), their
prompts encoded in packed passes of at most ``prefill_tokens`` new tokens, reusing what is cached (an episode's parked
cache up to the first token where the prompt departs from it; one encoding for the requests of a step that share a
prompt, a GRPO group's first turn; one encoding of the common head of distinct prompts, the system prompt and the
rules); then every row decodes one token per :meth:`HFSession.step`. A row ends on a stop
token, a stop string or its token limit; it leaves at once (its cache parked for its episode's next turn) and a
waiting request takes its place, so the batch stays full while episodes end at different turns and wait for their
envs. The model passes are :class:`~ragen_trainer.engines.hf.runner.ModelRunner`'s, the storage
:mod:`~ragen_trainer.engines.hf.cache`'s and the sampling :class:`~ragen_trainer.engines.hf.sampler.Sampler`'s.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ragen_envs.core import check_arg
from ragen_trainer.engines.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationRequest,
    GenerationResult,
    GenerationSession,
    SamplingParams,
    reply_text,
)
from ragen_trainer.engines.hf.cache import BatchCache, ParkedCache, ParkedCaches, common_prefix
from ragen_trainer.engines.hf.runner import ModelLease, ModelRunner, PrefillJob
from ragen_trainer.engines.hf.sampler import Sampler, row_generator

if TYPE_CHECKING:
    from ragen_trainer.engines.hf.engine import HFEngine

#: Fewest leading tokens fresh prompts must share for their common prefix to be encoded once for all of them (below
#: it, an extra pass and the copies cost about what they save).
MIN_SHARED_PREFIX = 16
#: Shared prefixes kept per session (an env's prompts share one; a mixed batch of envs, a few).
MAX_SHARED_PREFIXES = 8


@dataclass(eq=False)
class _Row:
    """A request being decoded."""

    request: GenerationRequest
    prompt: list[int]
    generator: Any
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None


class HFSession(GenerationSession):
    """A continuous-batching session of :class:`~ragen_trainer.engines.hf.HFEngine` (see the module docstring).

    The session holds the engine's model for its whole life (eval mode, ragen's attention); :meth:`close` gives it
    back as it was."""

    engine: HFEngine

    def __init__(self, engine: HFEngine, params: SamplingParams, *, keep_cache: bool = True) -> None:
        super().__init__(engine, params)
        self.keep_cache = keep_cache and engine.max_parked_tokens > 0
        self._waiting: list[GenerationRequest] = []
        self._rows: list[_Row] = []
        self._parked = ParkedCaches(engine.max_parked_tokens)
        self._prefixes: list[ParkedCache] = []  # shared prefixes of fresh prompts, newest first
        self._cache: BatchCache | None = None
        self._stops = set(engine.stop_token_ids)
        self._stop_window = max((len(s) for s in params.stop), default=0) + 2  # tokens decoded to find a stop string
        self._sampler = Sampler(params, compute_logprobs=engine.compute_logprobs)
        self._runner = ModelRunner(
            engine.model, engine.stats, share_attention=engine.share_attention, direct_decode=engine.direct_decode
        )
        self._lease = ModelLease(
            engine.model, pack_weights=engine.pack_weights, float32_packs=engine.float32_packs
        )
        self._closed = False

    # ---------------------------------------------------------------- the session interface
    def submit(self, request: GenerationRequest) -> None:
        check_arg(not self._closed, "session", "closed", "an open session")
        check_arg(
            request.prompt is not None and len(request.prompt) > 0,
            "request.prompt",
            request.prompt,
            "a non-empty list of token ids (HFEngine takes token ids, not messages)",
        )
        self._waiting.append(request)

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._rows)

    def step(self) -> list[tuple[Hashable, GenerationResult]]:
        """Admit waiting requests into free rows (encoding what is not cached), then decode one token for every row;
        returns the replies that finished."""
        finished: list[tuple[Hashable, GenerationResult]] = []
        with torch.inference_mode():
            if self._waiting and len(self._rows) < self.engine.batch_size:
                finished += self._admit()
            if self._rows:
                assert self._cache is not None
                logits = self._runner.decode(self._cache, [row.tokens[-1] for row in self._rows])
                finished += self._advance(self._rows, logits)
        return finished

    def release(self, key: Hashable) -> None:
        self._parked.release(key)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._parked.clear()
            self._prefixes.clear()
            self._rows.clear()
            self._waiting.clear()
            self._cache = None
            self._lease.release()

    # ---------------------------------------------------------------- admission: prefill what is not cached
    def _admit(self) -> list[tuple[Hashable, GenerationResult]]:
        free = self.engine.batch_size - len(self._rows)
        admitted, self._waiting = self._waiting[:free], self._waiting[free:]
        jobs, fresh = self._prefill_jobs(admitted)
        base = len(self._rows)
        logits = []
        if self._cache is None:
            self._cache = self._runner.new_cache(self.engine.batch_size)
        self._cache.reserve(max(len(job.prompt) for job in jobs))  # grown once for the step, not once per row
        if self.engine.share_prefixes and fresh:
            self._attach_shared_prefixes(fresh)
        for chunk in _chunks(jobs, self.engine.prefill_tokens):
            for job in chunk:  # the rows in the order the runner opens their cache rows
                for request in job.requests:
                    self._rows.append(self._new_row(request, job.prompt))
            for job, job_logits in zip(chunk, self._runner.prefill(self._cache, chunk)):
                logits += [job_logits] * len(job.requests)
        return self._advance(self._rows[base:], torch.stack(logits))

    def _prefill_jobs(self, admitted: list[GenerationRequest]) -> tuple[list[PrefillJob], list[PrefillJob]]:
        """One prefill job per distinct prompt: requests with the same prompt and nothing parked share one encoding
        (a group's first turn); a request whose prompt starts like its parked cache encodes only the rest. Returns
        the jobs and, among them, the *fresh* ones (nothing parked: candidates for a shared prefix)."""
        jobs: list[PrefillJob] = []
        shared: dict[tuple[int, ...], PrefillJob] = {}
        for request in admitted:
            prompt = list(request.prompt or [])
            parked = self._parked.take(request.key)
            common = common_prefix(prompt, parked.tokens) if parked is not None else 0
            if parked is not None and common > 0:
                # Keys of the first `common` tokens do not depend on what followed them: reuse those, drop the rest
                # (BatchCache.open_row copies only the first len(tokens) columns of the layers).
                jobs.append(PrefillJob(prompt, [request], ParkedCache(parked.tokens[:common], parked.layers,
                                                                  parked.lineage)))
            elif tuple(prompt) in shared:
                shared[tuple(prompt)].requests.append(request)
            else:
                shared[tuple(prompt)] = PrefillJob(prompt, [request], None)
                jobs.append(shared[tuple(prompt)])
        return jobs, list(shared.values())

    def _attach_shared_prefixes(self, fresh: list[PrefillJob]) -> None:
        """Give each fresh job the longest shared prefix it starts with, encoding new prefixes first.

        Distinct prompts of one env mostly differ only after a long common head (the system prompt and the rules:
        165 of FrozenLake's ~240 first-turn tokens, 186 of Sokoban's ~270): fresh prompts admitted together that
        share at least :data:`MIN_SHARED_PREFIX` leading tokens get their longest common prefix encoded once, kept
        for the session (:data:`MAX_SHARED_PREFIXES` of them, newest first), and every prompt that starts with a kept
        prefix reuses its keys as it would a parked cache (keys depend only on earlier tokens)."""
        assert self._cache is not None
        uncovered: dict[tuple[int, ...], list[PrefillJob]] = {}
        for job in fresh:
            if len(job.prompt) > MIN_SHARED_PREFIX and self._shared_prefix(job.prompt)[1] < MIN_SHARED_PREFIX:
                uncovered.setdefault(tuple(job.prompt[:MIN_SHARED_PREFIX]), []).append(job)
        for group in uncovered.values():
            if len(group) < 2:
                continue
            first = group[0].prompt
            # Every job keeps one token of its own to run (its logits come from the pass).
            length = min(min(common_prefix(first, job.prompt) for job in group[1:]),
                         min(len(job.prompt) for job in group) - 1)  # fmt: skip
            if length >= MIN_SHARED_PREFIX:
                self._prefixes.insert(0, self._runner.encode_prefix(self._cache, first[:length]))
                del self._prefixes[MAX_SHARED_PREFIXES:]
        for job in fresh:
            prefix, length = self._shared_prefix(job.prompt)
            if prefix is not None and length >= MIN_SHARED_PREFIX:
                job.parked = ParkedCache(prefix.tokens[:length], prefix.layers, prefix.lineage)

    def _shared_prefix(self, prompt: list[int]) -> tuple[ParkedCache | None, int]:
        """The kept shared prefix ``prompt`` starts with the most of, and how many tokens of it."""
        best: tuple[ParkedCache | None, int] = (None, 0)
        for prefix in self._prefixes:
            length = common_prefix(prompt, prefix.tokens)
            if length > best[1]:
                best = (prefix, length)
        return best

    def _new_row(self, request: GenerationRequest, prompt: list[int]) -> _Row:
        limit = self.params.max_new_tokens
        if request.max_new_tokens is not None:
            limit = max(1, min(limit, request.max_new_tokens))
        return _Row(request, prompt, row_generator(request.seed, self._runner.device), limit)

    # ---------------------------------------------------------------- one token per row
    def _advance(self, rows: list[_Row], logits: Any) -> list[tuple[Hashable, GenerationResult]]:
        """Sample one token per row from ``logits`` ``[len(rows), vocab]``; finish and remove the rows that end."""
        tokens, logprobs = self._sampler.sample(logits, [row.generator for row in rows])
        finished_rows = []
        for i, (row, token) in enumerate(zip(rows, tokens)):
            row.tokens.append(token)
            if logprobs is not None:
                row.logprobs.append(float(logprobs[i]))
            if token in self._stops or self._ends_with_stop_string(row):
                row.finish = FINISH_STOP
            elif len(row.tokens) >= row.max_new_tokens:
                row.finish = FINISH_LENGTH
            if row.finish is not None:
                finished_rows.append(row)
        # From the highest row down: a finished row is replaced by the last live one, so rows that finish together
        # at the end of the batch leave without being moved.
        position = {id(row): i for i, row in enumerate(self._rows)}
        finished_rows.sort(key=lambda row: position[id(row)], reverse=True)
        return [self._finish(row) for row in finished_rows][::-1]

    def _ends_with_stop_string(self, row: _Row) -> bool:
        if not self.params.stop:
            return False
        tail = self.engine.tokenizer.decode(row.tokens[-self._stop_window :], skip_special_tokens=True)
        return any(s in tail for s in self.params.stop)

    def _finish(self, row: _Row) -> tuple[Hashable, GenerationResult]:
        assert self._cache is not None
        index = self._rows.index(row)
        if self.keep_cache:
            # The cache holds the prompt and every reply token but the last (sampled, never fed back).
            tokens = row.prompt + row.tokens[:-1]
            self._parked.park(row.request.key, ParkedCache(tokens, self._cache.take_row(index),
                                                                     self._cache.lineage[index]))
        last = len(self._rows) - 1
        self._cache.move_row(last, index)
        self._rows[index] = self._rows[last]
        self._rows.pop()
        text = reply_text(self.engine.tokenizer, row.tokens, self.params.stop)
        logprobs = row.logprobs if self.engine.compute_logprobs else None
        return row.request.key, GenerationResult(list(row.tokens), text, logprobs, row.finish or FINISH_STOP)


def _chunks(jobs: list[PrefillJob], budget: int) -> list[list[PrefillJob]]:
    """Consecutive jobs grouped so that each packed forward pass runs at most ``budget`` new tokens (a longer job
    runs alone)."""
    chunks: list[list[PrefillJob]] = []
    tokens = 0
    for job in jobs:
        new = len(job.prompt) - (len(job.parked.tokens) if job.parked is not None else 0)
        if chunks and tokens + new <= budget:
            chunks[-1].append(job)
            tokens += new
        else:
            chunks.append([job])
            tokens = new
    return chunks
