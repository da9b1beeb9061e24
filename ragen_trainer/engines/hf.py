"""ragen's own decoding loop over a Hugging Face causal LM: the default engine (``"hf"``), on CPU or GPU.

Multi-turn rollouts ask a model for many replies that share most of their context, and ``model.generate`` encodes
every prompt from scratch. This engine does no work twice:

* **KV cache across turns.** When a reply ends, the episode's keys and values stay *parked* under its request key;
  the episode's next prompt (the same tokens plus the env's delta) encodes only the delta. A prompt that departs
  from what is parked (a reply re-tokenised after cleaning, a rewritten history) reuses the keys up to the first
  token where they differ and encodes the rest (keys depend only on earlier tokens); correctness never depends on a
  hit.
* **Shared group prompts.** Requests admitted together with the same prompt (the N rollouts of a GRPO group start
  from one state) are encoded once; each row gets a copy of the cache and samples its own reply.
* **Stop strings and stop tokens** end a row as soon as they appear (``SamplingParams.stop``, e.g. ``"</answer>"``).
* **Continuous batching.** :meth:`HFEngine.session` keeps up to ``batch_size`` rows decoding one token per
  :meth:`~HFSession.step`; finished rows leave at once and waiting requests take their place, so the batch stays full
  while episodes end at different turns and wait for their envs.

How the batch cache is laid out. Every layer holds one key and one value buffer ``[rows, kv_heads, columns,
head_dim]``. Rows are *left-aligned*: row ``r`` holds its ``n_r`` cached tokens in columns ``[0, n_r)`` and writes its
next token at column ``n_r``. A decode step writes those columns in place (no ``torch.cat`` of the whole cache per
token, which is what ``DynamicCache`` does). Attention reads only the columns rows hold: the rows are cut into
consecutive *segments* (:func:`_row_segments`), each attending over the columns ``[0, longest row of the segment]``
with an additive 4-D mask hiding the columns right of a shorter row, so rows at turn 1 do not read the padding up to
a turn-5 row's length (one segment when the rows' lengths are close: a call costs more than a few padded columns).
Nothing is ever shifted: a joining row starts at column 0, the buffers only grow (by whole chunks, copying the live
columns) when the longest row would not fit, and a finished row's slot is filled by the last row so the live rows
stay ``[0, rows)``. Each row carries its own position ids (its own length), so a
row's attention and rotary positions are those of the sequence alone: batching does not change what a row sees.

How prompts are encoded (*packed prefill*). The prompts admitted in a step run through the model in one forward
pass as a single packed sequence: the uncached tokens of every prompt one after the other, each with its own position
ids, so no token is padding (a padded batch runs its linear layers on rows x longest prompt). Each prompt gets its
row of the batch cache first (its reused keys copied in); every layer writes a prompt's new keys into its row and
attends prompt by prompt over that row (:meth:`_PackedPlan.attend`).

Both kinds of pass replace the model's attention function with ragen's own (:func:`_ragen_attention`, registered in
``transformers``' attention interface and switched on for the pass only, then restored), which reads how to attend
from the pass's *plan* (:class:`_PackedPlan`, :class:`_DecodePlan`). The engine therefore serves models that call
that interface (``_supports_attention_backend``), which is every recent ``transformers`` causal LM; others are
refused by name.

Sampling. Each request has its own ``torch.Generator`` seeded from its ``seed`` (or from torch's global RNG when
``None``): a reply does not depend on which other requests share its batch, so replies are reproducible under
continuous batching. Log-probabilities are ``log_softmax(logits / temperature)`` of the sampled token before top-k /
top-p (the quantity TRL's trainers compute for the old policy; temperature 1 when greedy), as the
``hf-generate`` engine records them.

:meth:`HFEngine.generate` (a list of prompts in, replies out) runs a session to completion; identical prompts in the
list share their encoding. The engine holds the *live* model, so the trainer's updates are used by the next session
(on-policy); :meth:`HFEngine.update_weights` swaps in another object, and every parked cache is dropped whenever the
weights may have changed (a new session starts empty).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragen_envs.core import check_arg
from ragen_trainer.engines.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationRequest,
    GenerationResult,
    GenerationSession,
    ModelEngine,
    SamplingParams,
    reply_text,
)

#: Columns added to the batch cache at a time when it grows (fewer re-layouts, a little unused memory).
_COLUMN_CHUNK = 256

#: What one more attention call of a decode step costs, in (row, column) pairs attended: on CPU an SDPA call costs
#: ~15 us and a row's column ~0.11 us (SmolLM2, 2 cores), so a segment of rows pays for itself once it saves this many
#: padded columns. :func:`_row_segments` splits the rows where that holds.
_SEGMENT_COST = 160


class HFEngine(ModelEngine):
    """Sample replies from a ``transformers`` causal LM with a KV cache kept per episode and continuous batching.

    Args:
        model: a ``transformers`` causal LM (or a ``peft`` model wrapping one); used live, never copied.
        tokenizer: its tokenizer (decode, stop tokens).
        batch_size: rows decoded together (memory vs. speed).
        stop_token_ids: ids that end a reply (kept in it); default: eos plus known end-of-turn tokens.
        compute_logprobs: record the sampled tokens' log-probabilities (turn off to save a little time).
        max_parked_tokens: most tokens of finished replies' caches kept for their episodes' next turns; a reply that
            finishes beyond it is not parked (its episode re-encodes its next prompt in full).
        prefill_tokens: most new prompt tokens encoded together in one packed forward pass (memory vs. speed; a
            longer prompt runs alone).
    """

    supports_token_ids = True
    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 32,
        stop_token_ids: list[int] | None = None,
        compute_logprobs: bool = True,
        max_parked_tokens: int = 65_536,
        prefill_tokens: int = 16_384,
    ) -> None:
        super().__init__(
            model, tokenizer, batch_size=batch_size, stop_token_ids=stop_token_ids, compute_logprobs=compute_logprobs
        )
        _check_supported(model)
        self._cache_keyword = _cache_keyword(model)
        check_arg(
            isinstance(max_parked_tokens, int) and max_parked_tokens >= 0,
            "max_parked_tokens",
            max_parked_tokens,
            "an int >= 0 (0: keep no cache between turns)",
        )
        self.max_parked_tokens = max_parked_tokens
        check_arg(
            isinstance(prefill_tokens, int) and prefill_tokens >= 1, "prefill_tokens", prefill_tokens, "an int >= 1"
        )
        self.prefill_tokens = prefill_tokens
        #: Work done, for benchmarks and tests: tokens run through the model (prefill), tokens reused from a parked
        #: or shared cache, decode steps, rows decoded summed over steps, and the key columns decode attended to
        #: (rows x window of each segment) against those the rows hold (the rest is padding of shorter rows).
        self.stats = {
            "prefill_tokens": 0,
            "reused_tokens": 0,
            "decode_steps": 0,
            "decoded_rows": 0,
            "attended_columns": 0,
            "cached_columns": 0,
        }

    def session(self, params: SamplingParams, *, keep_cache: bool = True) -> HFSession:
        """A continuous-batching session; ``keep_cache=False`` parks nothing between turns (one-shot batches)."""
        return HFSession(self, params, keep_cache=keep_cache)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        check_arg(isinstance(params, SamplingParams), "params", type(params).__name__, "a SamplingParams")
        for i, prompt in enumerate(prompts):
            check_arg(len(prompt) > 0, f"prompts[{i}]", prompt, "a non-empty list of token ids")
        results: list[GenerationResult | None] = [None] * len(prompts)
        with self.session(params, keep_cache=False) as session:
            for row, prompt in enumerate(prompts):
                session.submit(GenerationRequest(key=row, prompt=list(prompt), seed=_row_seed(params.seed, row)))
            while session.busy:
                for key, result in session.step():
                    results[key] = result  # type: ignore[index]
        return [r for r in results if r is not None]


def _row_seed(seed: int | None, row: int) -> int | None:
    """One seed per row of a seeded batch: identical prompts (a group's first turn) must sample different replies."""
    return None if seed is None else int(np.random.SeedSequence([seed, row]).generate_state(1)[0])


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


@dataclass
class _Parked:
    """A finished reply's cache, kept for the next turn of its episode."""

    tokens: list[int]
    layers: list[tuple[Any, Any]]  # per layer: keys, values [1, kv_heads, len(tokens), head_dim]


@dataclass
class _PrefillJob:
    """One prompt to encode and the requests that share it (several only for identical, uncached prompts)."""

    prompt: list[int]
    requests: list[GenerationRequest]
    parked: _Parked | None


def _chunks(jobs: list[_PrefillJob], budget: int) -> list[list[_PrefillJob]]:
    """Consecutive jobs grouped so that each packed forward pass runs at most ``budget`` new tokens (a longer job
    runs alone)."""
    chunks: list[list[_PrefillJob]] = []
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


class HFSession(GenerationSession):
    """A continuous-batching session of :class:`HFEngine` (see the module docstring)."""

    engine: HFEngine

    def __init__(self, engine: HFEngine, params: SamplingParams, *, keep_cache: bool = True) -> None:
        super().__init__(engine, params)
        self.keep_cache = keep_cache and engine.max_parked_tokens > 0
        self._waiting: list[GenerationRequest] = []
        self._rows: list[_Row] = []
        self._parked: dict[Hashable, _Parked] = {}  # insertion order = parking order (oldest first)
        self._cache: _BatchCache | None = None
        self._stops = set(engine.stop_token_ids)
        self._stop_window = max((len(s) for s in params.stop), default=0) + 2  # tokens decoded to find a stop string
        self._was_training = bool(engine.model.training)
        engine.model.eval()  # no dropout while sampling; restored by close()
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
        import torch

        finished: list[tuple[Hashable, GenerationResult]] = []
        with torch.inference_mode():
            if self._waiting and len(self._rows) < self.engine.batch_size:
                finished += self._admit()
            if self._rows:
                finished += self._decode()
        return finished

    def release(self, key: Hashable) -> None:
        self._parked.pop(key, None)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._parked.clear()
            self._rows.clear()
            self._waiting.clear()
            self._cache = None
            if self._was_training:
                self.engine.model.train()

    # ---------------------------------------------------------------- admission: prefill what is not cached
    def _admit(self) -> list[tuple[Hashable, GenerationResult]]:
        free = self.engine.batch_size - len(self._rows)
        admitted, self._waiting = self._waiting[:free], self._waiting[free:]
        # One prefill job per distinct prompt: requests with the same prompt and nothing parked share one encoding
        # (a group's first turn); a request whose prompt starts like its parked cache encodes only the rest.
        jobs: list[_PrefillJob] = []
        shared: dict[tuple[int, ...], _PrefillJob] = {}
        for request in admitted:
            prompt = list(request.prompt or [])
            parked = self._parked.pop(request.key, None)
            common = _common_prefix(prompt, parked.tokens) if parked is not None else 0
            if parked is not None and common > 0:
                # Keys of the first `common` tokens do not depend on what followed them: reuse those, drop the rest
                # (_BatchCache.open_row copies only the first len(tokens) columns of the layers).
                jobs.append(_PrefillJob(prompt, [request], _Parked(parked.tokens[:common], parked.layers)))
            elif tuple(prompt) in shared:
                shared[tuple(prompt)].requests.append(request)
            else:
                shared[tuple(prompt)] = _PrefillJob(prompt, [request], None)
                jobs.append(shared[tuple(prompt)])
        import torch

        base = len(self._rows)
        logits = []
        if self._cache is None:
            self._cache = _BatchCache(self.engine.model, self.engine.batch_size)
        self._cache.reserve(max(len(job.prompt) for job in jobs))  # grown once for the step, not once per row
        for chunk in _chunks(jobs, self.engine.prefill_tokens):
            for job, job_logits in zip(chunk, self._prefill(chunk)):
                logits += [job_logits] * len(job.requests)  # _prefill adds the rows in this order
        return self._sample(self._rows[base:], torch.stack(logits))

    def _prefill(self, jobs: list[_PrefillJob]) -> list[Any]:
        """Encode the uncached part of each job's prompt in one packed forward pass, straight into new rows of the
        batch cache; add one row per request; return each job's last-position logits.

        Layout of the pass (jobs with suffixes of ``s_i`` tokens after ``n_i`` reused ones): a new row is opened per
        job, left-aligned like every row (its ``n_i + s_i`` tokens in columns ``[0, n_i + s_i)``), and its reused
        keys are copied into the first ``n_i`` columns. The suffixes run through the model *packed*, one after another
        in a single sequence of ``sum(s_i)`` tokens with their own position ids, so no token is padding. Each layer
        writes a job's new keys into its row and attends job by job over the row's columns
        (:meth:`_PackedPlan.attend`): the linear layers see every token once and attention sees each job's own
        sequence only. Rows of requests sharing a job are copies of its row.
        """
        import torch

        model = self.engine.model
        device = _device(model)
        cache = self._cache
        assert cache is not None
        plan = _PackedPlan(cache)
        ids: list[int] = []
        positions: list[int] = []
        for job in jobs:
            length = len(job.prompt)
            reused = min(len(job.parked.tokens), length - 1) if job.parked is not None else 0  # run one token at least
            rows = [cache.open_row(length, job.parked.layers if reused else None, reused)]
            rows += [cache.open_row(length) for _ in job.requests[1:]]  # copies of the first, filled after the pass
            plan.add(rows, offset=len(ids), suffix=length - reused, length=length)
            ids += job.prompt[reused:]
            positions += range(reused, length)
            self.engine.stats["prefill_tokens"] += length - reused
            self.engine.stats["reused_tokens"] += reused + (len(job.requests) - 1) * length
            for request in job.requests:
                limit = self.params.max_new_tokens
                if request.max_new_tokens is not None:
                    limit = max(1, min(limit, request.max_new_tokens))
                self._rows.append(_Row(request, job.prompt, _generator(request.seed, device), limit))
        last = torch.tensor([job.offset + job.suffix - 1 for job in plan.jobs], device=device)
        with _attention_plan_on(model, plan):
            out = model(
                input_ids=torch.tensor([ids], device=device), position_ids=torch.tensor([positions], device=device),
                use_cache=True, logits_to_keep=last, **{self.engine._cache_keyword: plan.cache_view()},
            )  # fmt: skip
        for job in plan.jobs:
            for row in job.rows[1:]:
                cache.fill_row(row, job.rows[0])
        return [out.logits[0, i, :] for i in range(len(jobs))]

    # ---------------------------------------------------------------- decoding
    def _decode(self) -> list[tuple[Hashable, GenerationResult]]:
        import torch

        assert self._cache is not None
        rows = self._rows
        device = _device(self.engine.model)
        inputs = torch.tensor([[row.tokens[-1]] for row in rows], dtype=torch.long, device=device)
        plan = _DecodePlan(_row_segments([n + 1 for n in self._cache.lengths]))  # each row's columns, new one included
        positions, mask = self._cache.begin_step()
        with _attention_plan_on(self.engine.model, plan):
            out = self.engine.model(
                input_ids=inputs, position_ids=positions, attention_mask=mask, use_cache=True,
                **{self.engine._cache_keyword: self._cache.view()},
            )  # fmt: skip
        self.engine.stats["decode_steps"] += 1
        self.engine.stats["decoded_rows"] += len(rows)
        self.engine.stats["attended_columns"] += sum((stop - start) * window for start, stop, window in plan.segments)
        self.engine.stats["cached_columns"] += sum(self._cache.lengths) + len(rows)
        self._cache.end_step()
        return self._sample(rows, out.logits[:, -1, :])

    def _sample(self, rows: list[_Row], logits: Any) -> list[tuple[Hashable, GenerationResult]]:
        """Sample one token per row from ``logits`` ``[len(rows), vocab]``; finish and remove the rows that end."""
        import torch

        params = self.params
        logits = logits.float()
        scaled = logits / params.temperature if params.temperature > 0 and params.temperature != 1.0 else logits
        logp = torch.log_softmax(scaled, dim=-1) if self.engine.compute_logprobs else None
        if params.greedy:
            chosen = logits.argmax(dim=-1)
        else:
            unfiltered = params.top_k == 0 and params.top_p >= 1.0
            if logp is not None and unfiltered:
                probs = logp.exp()  # the sampling distribution is the one the log-probs are taken from
            else:
                probs = torch.softmax(_filter(logits / params.temperature, params.top_k, params.top_p), dim=-1)
            chosen = _inverse_cdf_sample(probs, [row.generator for row in rows])
        picked = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).tolist() if logp is not None else None
        finished_rows = []
        for i, (row, token) in enumerate(zip(rows, chosen.tolist())):
            row.tokens.append(int(token))
            if picked is not None:
                row.logprobs.append(float(picked[i]))
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
            self._park(row.request.key, _Parked(tokens, self._cache.take_row(index)))
        last = len(self._rows) - 1
        self._cache.move_row(last, index)
        self._rows[index] = self._rows[last]
        self._rows.pop()
        text = reply_text(self.engine.tokenizer, row.tokens, self.params.stop)
        logprobs = row.logprobs if self.engine.compute_logprobs else None
        return row.request.key, GenerationResult(list(row.tokens), text, logprobs, row.finish or FINISH_STOP)

    def _park(self, key: Hashable, parked: _Parked) -> None:
        """Keep ``parked`` for ``key``'s next turn, unless the budget is spent: requests are admitted first come,
        first served, so the caches parked earliest are the next to be used and are the ones kept."""
        self._parked.pop(key, None)
        if self._parked_tokens() + len(parked.tokens) <= self.engine.max_parked_tokens:
            self._parked[key] = parked

    def _parked_tokens(self) -> int:
        return sum(len(p.tokens) for p in self._parked.values())


class _BatchCache:
    """The batch's keys and values, one row per live request, left-aligned (see the module docstring), as a
    ``transformers`` cache during decode steps (:meth:`view`)."""

    def __init__(self, model: Any, max_rows: int) -> None:
        import torch

        heads, dim, layers = _attention_shape(model)
        parameter = next(model.parameters())
        self.columns = _COLUMN_CHUNK
        shape = (max_rows, heads, self.columns, dim)
        self.keys = [torch.zeros(shape, dtype=parameter.dtype, device=parameter.device) for _ in range(layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.lengths: list[int] = []  # tokens cached per live row, in columns [0, length)
        self._step: tuple[Any, Any, int] | None = None  # during a decode step: row indices, lengths, the window

    def reserve(self, n: int) -> None:
        """Make room for rows of ``n`` tokens and one more column (grows the buffers, copying the live columns)."""
        import torch

        if n + 1 <= self.columns:
            return
        columns = -(-(n + 1) // _COLUMN_CHUNK) * _COLUMN_CHUNK + _COLUMN_CHUNK  # room to grow before the next time
        used, rows = max(self.lengths, default=0), len(self.lengths)
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = torch.zeros(old.shape[0], old.shape[1], columns, old.shape[3], dtype=old.dtype, device=old.device)
                new[:rows, :, :used] = old[:rows, :, :used]
                buffers[i] = new
        self.columns = columns

    def open_row(self, n: int, layers: list[tuple[Any, Any]] | None = None, reused: int = 0) -> int:
        """Add a row for a sequence of ``n`` tokens (room made by :meth:`reserve`) whose first ``reused`` keys and
        values are copied from ``layers`` (``[1, heads, >= reused, dim]`` per layer); the rest is written by the
        prefill pass. Returns the row's index."""
        index = len(self.lengths)
        if layers is not None and reused:
            for keys, values, (k, v) in zip(self.keys, self.values, layers):
                keys[index, :, :reused] = k[0, :, :reused]
                values[index, :, :reused] = v[0, :, :reused]
        self.lengths.append(n)
        return index

    def fill_row(self, target: int, source: int) -> None:
        """Copy row ``source``'s tokens into row ``target`` (a request that shares a prefill job)."""
        n = self.lengths[source]
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[target, :, :n] = buffer[source, :, :n]

    def take_row(self, index: int) -> list[tuple[Any, Any]]:
        """A copy of row ``index``'s cached tokens, per layer ``[1, heads, n, dim]``."""
        n = self.lengths[index]
        return [(k[index : index + 1, :, :n].clone(), v[index : index + 1, :, :n].clone())
                for k, v in zip(self.keys, self.values)]  # fmt: skip

    def move_row(self, source: int, target: int) -> None:
        """Row ``source`` (the last) takes the place of row ``target``, which is dropped."""
        if source != target:
            n = self.lengths[source]
            for buffers in (self.keys, self.values):
                for buffer in buffers:
                    buffer[target, :, :n] = buffer[source, :, :n]
            self.lengths[target] = n
        self.lengths.pop()

    def begin_step(self) -> tuple[Any, Any]:
        """Start a decode step: every row writes its next token at its own column ``length``. Returns the rows'
        positions (their lengths) ``[rows, 1]`` and the additive attention mask ``[rows, 1, 1, window]`` (0 on a
        row's columns, the dtype's minimum on the padding right of shorter rows)."""
        import torch

        self.reserve(max(self.lengths))
        device, dtype = self.keys[0].device, self.keys[0].dtype
        lengths = torch.tensor(self.lengths, dtype=torch.long, device=device)
        window = max(self.lengths) + 1
        padding = torch.arange(window, device=device)[None, :] > lengths[:, None]
        mask = torch.zeros(padding.shape, dtype=dtype, device=device).masked_fill_(padding, torch.finfo(dtype).min)
        self._step = (torch.arange(len(self.lengths), device=device), lengths, window)
        return lengths.unsqueeze(1), mask[:, None, None, :]

    def end_step(self) -> None:
        self.lengths = [n + 1 for n in self.lengths]
        self._step = None

    def view(self) -> Any:
        """A ``transformers`` cache whose layers write this step's column of every row in place."""
        from transformers.cache_utils import Cache

        return Cache(layers=[_ColumnLayer(self, i) for i in range(len(self.keys))])


@dataclass
class _PackedJob:
    """One job of a packed prefill pass: its rows (the first is computed, the others copy it), where its suffix sits
    in the packed sequence, and its length (reused + suffix tokens)."""

    rows: list[int]
    offset: int
    suffix: int
    length: int
    mask: Any  # [suffix, length] additive: query i sees the columns up to its own position; None for a fresh prompt


class _PackedPlan:
    """The jobs of one packed prefill pass (:meth:`HFSession._prefill`), read by :meth:`attend`."""

    def __init__(self, cache: _BatchCache) -> None:
        self.cache = cache
        self.jobs: list[_PackedJob] = []

    def add(self, rows: list[int], *, offset: int, suffix: int, length: int) -> None:
        import torch

        mask = None
        if suffix < length:  # causal, aligned bottom-right: query i is token length - suffix + i of its sequence
            device, dtype = self.cache.keys[0].device, self.cache.keys[0].dtype
            columns = torch.arange(length, device=device)
            future = columns[None, :] > (length - suffix + torch.arange(suffix, device=device))[:, None]
            mask = torch.zeros(future.shape, dtype=dtype, device=device).masked_fill_(future, torch.finfo(dtype).min)
        self.jobs.append(_PackedJob(rows, offset, suffix, length, mask))

    def cache_view(self) -> Any:
        from transformers.cache_utils import Cache

        return Cache(layers=[_PackedLayer(self, i) for i in range(len(self.cache.keys))])

    def attend(self, module: Any, query: Any, key: Any, value: Any, mask: Any, scaling: float | None) -> Any:
        """Attention of the pass, job by job: the queries of a job (its suffix in the packed sequence, ``query``
        ``[1, heads, tokens, dim]``) attend over its row of the batch cache (reused keys, then the suffix's own,
        written by :class:`_PackedLayer`); ``key``, ``value`` and ``mask`` (the packed tokens' own) are not used.
        Returns ``[1, tokens, heads, dim]``."""
        import torch

        keys, values = self.cache.keys[module.layer_idx], self.cache.values[module.layer_idx]
        out = query.new_empty(1, query.shape[2], query.shape[1], query.shape[3])
        grouped = query.shape[1] != keys.shape[1]
        for job in self.jobs:
            row = job.rows[0]
            attended = torch.nn.functional.scaled_dot_product_attention(
                query[:, :, job.offset : job.offset + job.suffix],
                keys[row : row + 1, :, : job.length],
                values[row : row + 1, :, : job.length],
                attn_mask=job.mask, is_causal=job.mask is None, scale=scaling, enable_gqa=grouped,
            )  # fmt: skip
            out[0, job.offset : job.offset + job.suffix] = attended[0].transpose(0, 1)
        return out


class _PackedLayer:
    """One layer of the batch cache during a packed prefill pass: writes each job's new keys and values into its
    row; attention reads them from there (:meth:`_PackedPlan.attend`)."""

    is_sliding = False
    is_compileable = False
    is_initialized = True

    def __init__(self, plan: _PackedPlan, layer: int) -> None:
        self.plan, self.layer = plan, layer

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        keys, values = self.plan.cache.keys[self.layer], self.plan.cache.values[self.layer]
        for job in self.plan.jobs:
            new = slice(job.offset, job.offset + job.suffix)
            keys[job.rows[0], :, job.length - job.suffix : job.length] = key_states[0, :, new]
            values[job.rows[0], :, job.length - job.suffix : job.length] = value_states[0, :, new]
        return key_states, value_states

    def get_seq_length(self) -> int:
        return 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def get_max_length(self) -> int:
        return -1


class _DecodePlan:
    """How a decode step attends: segment by segment of rows (:func:`_row_segments`), each over its own window."""

    def __init__(self, segments: list[tuple[int, int, int]]) -> None:
        self.segments = segments

    def attend(self, module: Any, query: Any, key: Any, value: Any, mask: Any, scaling: float | None) -> Any:
        """``query`` ``[rows, heads, 1, dim]`` over ``key`` / ``value`` ``[rows, kv_heads, window, dim]`` (the batch
        cache's columns, this step's written) with the additive ``mask`` ``[rows, 1, 1, window]``; each segment reads
        only its first ``window`` columns. Returns ``[rows, 1, heads, dim]``."""
        import torch

        rows, heads, _, dim = query.shape
        kv_heads = key.shape[1]
        # The query heads that share a key/value head side by side (repeat_kv's order): [rows, kv_heads, group, dim],
        # so attention reads each key once instead of once per query head.
        grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)
        out = query.new_empty(rows, 1, heads, dim)
        for start, stop, window in self.segments:
            attended = torch.nn.functional.scaled_dot_product_attention(
                grouped[start:stop], key[start:stop, :, :window], value[start:stop, :, :window],
                attn_mask=mask[start:stop, :, :, :window], scale=scaling,
            )  # fmt: skip
            out[start:stop, 0] = attended.reshape(stop - start, heads, dim)
        return out


def _row_segments(columns: list[int], cost: int = _SEGMENT_COST) -> list[tuple[int, int, int]]:
    """Cut rows ``[0, len(columns))`` into consecutive segments ``(start, stop, window)``, ``window`` the most columns
    a row of the segment holds, minimising the (row, column) pairs attended plus ``cost`` per segment.

    Dynamic programming over the cut points (``best[i]``: cheapest cover of rows ``[0, i)``), ``O(rows^2)``; when the
    rows' padding under one window costs less than a second segment, one segment is returned at once.
    """
    rows, widest = len(columns), max(columns)
    if rows * widest - sum(columns) <= cost:
        return [(0, rows, widest)]
    best = [0.0] + [math.inf] * rows
    cut = [0] * (rows + 1)
    for stop in range(1, rows + 1):
        window = 0
        for start in range(stop - 1, -1, -1):
            window = max(window, columns[start])
            total = best[start] + (stop - start) * window + cost
            if total < best[stop]:
                best[stop], cut[stop] = total, start
    segments = []
    stop = rows
    while stop > 0:
        start = cut[stop]
        segments.append((start, stop, max(columns[start:stop])))
        stop = start
    return segments[::-1]


#: The name :func:`_ragen_attention` is registered under in ``transformers``' attention interface.
_RAGEN_ATTENTION = "ragen"
_attention_plan: ContextVar[_PackedPlan | _DecodePlan | None] = ContextVar(_RAGEN_ATTENTION, default=None)


def _ragen_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None,
                     dropout: float = 0.0, **kwargs: Any) -> tuple[Any, None]:  # fmt: skip
    """The attention function of HFEngine's passes, called by ``transformers`` in place of its own with the layer's
    ``query`` / ``key`` / ``value`` ``[batch, heads, tokens, dim]``: the plan of the pass in progress says how to
    attend. Returns ``[batch, tokens, heads, dim]`` as ``transformers``' functions do."""
    plan = _attention_plan.get()
    assert plan is not None, "ragen's attention runs only inside an HFSession pass"
    return plan.attend(module, query, key, value, attention_mask, scaling), None


@contextmanager
def _attention_plan_on(model: Any, plan: _PackedPlan | _DecodePlan) -> Iterator[None]:
    """Run ``model`` with :func:`_ragen_attention` following ``plan``; its attention implementation is restored
    after."""
    from transformers import AttentionInterface

    if _RAGEN_ATTENTION not in AttentionInterface._global_mapping:  # registered once per process
        AttentionInterface.register(_RAGEN_ATTENTION, _ragen_attention)
    config = model.config
    before = config._attn_implementation
    token = _attention_plan.set(plan)
    config._attn_implementation = _RAGEN_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before
        _attention_plan.reset(token)


class _ColumnLayer:
    """One layer of :class:`_BatchCache` as ``transformers`` attention sees it during a decode step."""

    is_sliding = False
    is_compileable = False
    is_initialized = True

    def __init__(self, cache: _BatchCache, layer: int) -> None:
        self.cache, self.layer = cache, layer

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        assert self.cache._step is not None
        index, lengths, window = self.cache._step
        rows = len(lengths)
        keys, values = self.cache.keys[self.layer], self.cache.values[self.layer]
        keys[index, :, lengths] = key_states[:, :, 0]
        values[index, :, lengths] = value_states[:, :, 0]
        return keys[:rows, :, :window], values[:rows, :, :window]

    def get_seq_length(self) -> int:
        return max(self.cache.lengths)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return max(self.cache.lengths) + query_length, 0

    def get_max_length(self) -> int:
        return -1


# ---------------------------------------------------------------- helpers
def _check_supported(model: Any) -> None:
    """Refuse, with the engine that handles them, models this engine would run wrong: the batch cache gives every
    layer the whole sequence (no sliding-window or linear-attention layers), and the packed prefill replaces the
    attention function through ``transformers``' attention interface, which the model must call."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    other = sorted({t for t in (getattr(config, "layer_types", None) or []) if t != "full_attention"})
    if other:
        raise ValueError(
            f"invalid argument model={type(model).__name__}: it has {', '.join(other)} layers; HFEngine supports "
            "models whose layers all use full attention. Use the hf-generate engine (GenerateEngine) or vllm."
        )
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model: the one it wraps
    if not getattr(base, "_supports_attention_backend", False):
        raise ValueError(
            f"invalid argument model={type(base).__name__}: it does not use transformers' attention interface "
            "(_supports_attention_backend is false), which HFEngine needs. Use the hf-generate engine "
            "(GenerateEngine) or vllm."
        )


def _cache_keyword(model: Any) -> str:
    """The keyword ``model``'s forward takes a cache under: ``cache`` in recent ``transformers`` (where
    ``past_key_values``, the older name, warns that it is deprecated), ``past_key_values`` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes it through
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _attention_shape(model: Any) -> tuple[int, int, int]:
    """Key/value heads, head dimension and layer count of ``model``'s attention."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return heads, dim, config.num_hidden_layers


def _common_prefix(prompt: list[int], cached: list[int]) -> int:
    """How many leading tokens ``prompt`` and ``cached`` share."""
    n = min(len(prompt), len(cached))
    if prompt[:n] == cached[:n]:
        return n
    return int(np.argmin(np.asarray(prompt[:n]) == np.asarray(cached[:n])))


def _generator(seed: int | None, device: Any) -> Any:
    import torch

    generator = torch.Generator(device=device)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())  # from the global RNG: torch.manual_seed reproduces it
    generator.manual_seed(int(seed))
    return generator


#: Vocabulary entries per block of :func:`_inverse_cdf_sample`.
_CDF_BLOCK = 256


def _inverse_cdf_sample(probs: Any, generators: list[Any]) -> Any:
    """One token per row of ``probs`` ``[rows, vocab]``, row ``i`` drawing its uniform number from ``generators[i]``.

    Inverse-CDF sampling, batched and exact (in float64): the token is the first whose cumulative probability exceeds
    ``u`` times the total. ``torch.multinomial`` per row costs ~1 ms each on a 49k vocabulary, and a float64 cumsum
    over the whole vocabulary is a long sequential scan; instead the vocabulary is cut into blocks of
    :data:`_CDF_BLOCK`: block sums find the block, and a cumsum inside that block alone finds the token.
    """
    import torch

    rows, vocab = probs.shape
    uniforms = torch.stack([torch.rand((), generator=g, device=probs.device) for g in generators]).double()
    blocks = -(-vocab // _CDF_BLOCK)
    padded = torch.nn.functional.pad(probs, (0, blocks * _CDF_BLOCK - vocab)).view(rows, blocks, _CDF_BLOCK)
    cumulative = padded.sum(-1, dtype=torch.float64).cumsum(-1)  # [rows, blocks]
    targets = (uniforms * cumulative[:, -1]).unsqueeze(-1)
    block = torch.searchsorted(cumulative, targets, right=True).squeeze(-1).clamp_(max=blocks - 1)
    before = cumulative.gather(-1, (block - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1) * (block > 0)
    inside = padded[torch.arange(rows, device=probs.device), block]  # [rows, block size]
    offset = torch.searchsorted(inside.double().cumsum(-1) + before.unsqueeze(-1), targets, right=True).squeeze(-1)
    # Rounding can leave the target past the block's last partial sum: take the block's last token that can be drawn
    # (never a zero-probability one, such as a token top-k / top-p filtered out).
    columns = torch.arange(_CDF_BLOCK, device=probs.device)
    last = torch.where(inside > 0, columns, -1).amax(-1)
    offset = torch.where(offset >= _CDF_BLOCK, last, offset)
    return (block * _CDF_BLOCK + offset).clamp_(max=vocab - 1)


def _filter(logits: Any, top_k: int, top_p: float) -> Any:
    """Top-k then top-p (nucleus) filtering of ``[rows, vocab]`` logits (``-inf`` outside), as ``transformers`` does."""
    import torch

    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - top_p)
        drop_sorted[:, -1] = False  # always keep the most likely token
        logits = logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), float("-inf"))
    return logits


def _device(model: Any) -> Any:
    import torch

    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")
