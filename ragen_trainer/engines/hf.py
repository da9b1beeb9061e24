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
head_dim]``. Rows are *right-aligned*: all rows write their next token at the same column ``end``, row ``r`` holds its
``n_r`` cached tokens in columns ``[end - n_r, end)``, and a 4-D boolean mask hides the columns to their left. A
decode step writes one column in place (no ``torch.cat`` of the whole cache per token, which is what
``DynamicCache`` does) and attends over the columns from the leftmost live row on. A joining row is copied in under
the same alignment; the buffer is re-laid (shifted or grown) only when a row does not fit, and a finished row's slot
is filled by the last row so the live rows stay ``[0, rows)``. Each row carries its own position ids (its own length),
so a row's attention and rotary positions are those of the sequence alone: batching does not change what a row sees.

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

from collections.abc import Hashable
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
        prefill_tokens: prompts encoded together in one forward pass, as rows x longest prompt (memory vs. speed).
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
        _check_full_attention(model)
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
        #: (rows x window) against those the rows hold (the rest is padding of shorter rows).
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
    cached: int
    """Tokens of this row in the batch cache (its prompt, then its replies' tokens but the last sampled one)."""
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
    """Consecutive jobs grouped so that each forward pass holds about ``budget`` key columns x rows."""
    chunks: list[list[_PrefillJob]] = []
    for job in jobs:
        if chunks:
            width = max(len(job.prompt), *(len(j.prompt) for j in chunks[-1]))
            if width * (len(chunks[-1]) + 1) <= budget:
                chunks[-1].append(job)
                continue
        chunks.append([job])
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
        self._reserved = 0  # the longest prompt admitted this step

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
                # (_PrefillBlock.place copies only the first len(tokens) columns of the layers).
                jobs.append(_PrefillJob(prompt, [request], _Parked(parked.tokens[:common], parked.layers)))
            elif tuple(prompt) in shared:
                shared[tuple(prompt)].requests.append(request)
            else:
                shared[tuple(prompt)] = _PrefillJob(prompt, [request], None)
                jobs.append(shared[tuple(prompt)])
        import torch

        base = len(self._rows)
        logits = []
        self._reserved = max(len(job.prompt) for job in jobs)  # one re-layout for the step, not one per longer row
        for chunk in _chunks(jobs, self.engine.prefill_tokens):
            for job, job_logits in zip(chunk, self._prefill(chunk)):
                logits += [job_logits] * len(job.requests)  # _prefill adds the rows in this order
        return self._sample(self._rows[base:], torch.stack(logits))

    def _prefill(self, jobs: list[_PrefillJob]) -> list[Any]:
        """Encode the uncached part of each job's prompt in one forward pass; add one row per request; return each
        job's last-position logits.

        Layout of the pass (``a`` jobs, suffixes of ``s_i`` tokens after ``n_i`` cached ones, ``S = max s_i``,
        ``W = max(n_i + s_i)``): job ``i``'s cached keys sit in columns ``[W - n_i - s_i, W - s_i)`` and its suffix
        in the last ``s_i`` of the ``S`` query positions (``[W - s_i, W)``), right-aligned like the batch cache. The
        ``S - s_i`` query positions before a shorter suffix are padding: their keys are not written (the columns
        hold cached keys) and no real query attends to them.
        """
        import torch

        device = _device(self.engine.model)
        reused = [len(job.parked.tokens) if job.parked is not None else 0 for job in jobs]
        reused = [min(n, len(job.prompt) - 1) for n, job in zip(reused, jobs)]  # at least one token to run
        lengths = [len(job.prompt) for job in jobs]
        suffixes = [total - n for total, n in zip(lengths, reused)]
        width, queries = max(lengths), max(suffixes)
        pad = [queries - s for s in suffixes]
        ids = torch.zeros(len(jobs), queries, dtype=torch.long)
        positions = torch.zeros(len(jobs), queries, dtype=torch.long)
        real = torch.zeros(len(jobs), queries, dtype=torch.bool)
        for i, job in enumerate(jobs):
            ids[i, pad[i] :] = torch.tensor(job.prompt[reused[i] :])
            positions[i, pad[i] :] = torch.arange(reused[i], lengths[i])
            real[i, pad[i] :] = True
        # Query q of job i sits at column W - S + q; it sees its sequence's columns from W - len_i up to its own.
        columns = torch.arange(width)
        first = torch.tensor([width - total for total in lengths])
        own = width - queries + torch.arange(queries)
        mask = (columns[None, None, :] >= first[:, None, None]) & (columns[None, None, :] <= own[None, :, None])
        mask |= ~real[:, :, None] & (columns[None, None, :] == first[:, None, None])  # padding: one column, no NaN
        block = _PrefillBlock(self.engine.model, len(jobs), width, queries, real.to(device))
        for i, job in enumerate(jobs):
            if job.parked is not None and reused[i] > 0:
                block.place(i, job.parked.layers, width - lengths[i], reused[i])
        out = self.engine.model(
            input_ids=ids.to(device), position_ids=positions.to(device), attention_mask=mask[:, None].to(device),
            past_key_values=block.cache(), use_cache=True, logits_to_keep=1,
        )  # fmt: skip
        self.engine.stats["prefill_tokens"] += sum(suffixes)
        self.engine.stats["reused_tokens"] += sum(reused) + sum((len(j.requests) - 1) * len(j.prompt) for j in jobs)
        for i, job in enumerate(jobs):
            layers = block.sequence(i, lengths[i])
            if self._cache is None:
                self._cache = _BatchCache(self.engine.batch_size, layers)
            self._cache.reserve(self._reserved)
            for request in job.requests:
                limit = self.params.max_new_tokens
                if request.max_new_tokens is not None:
                    limit = max(1, min(limit, request.max_new_tokens))
                self._cache.add_row(len(self._rows), layers)
                self._rows.append(_Row(request, job.prompt, _generator(request.seed, device), limit, lengths[i]))
        return [out.logits[i, -1, :] for i in range(len(jobs))]

    # ---------------------------------------------------------------- decoding
    def _decode(self) -> list[tuple[Hashable, GenerationResult]]:
        import torch

        assert self._cache is not None
        rows = self._rows
        device = _device(self.engine.model)
        inputs = torch.tensor([[row.tokens[-1]] for row in rows], dtype=torch.long, device=device)
        lengths = torch.tensor([row.cached for row in rows], dtype=torch.long, device=device)
        mask = self._cache.begin_step(lengths)
        out = self.engine.model(
            input_ids=inputs, position_ids=lengths.unsqueeze(1), attention_mask=mask,
            past_key_values=self._cache.view(len(rows)), use_cache=True,
        )  # fmt: skip
        self._cache.end_step()
        for row in rows:
            row.cached += 1
        self.engine.stats["decode_steps"] += 1
        self.engine.stats["decoded_rows"] += len(rows)
        self.engine.stats["attended_columns"] += len(rows) * int(mask.shape[-1])
        self.engine.stats["cached_columns"] += int(lengths.sum()) + len(rows)
        return self._sample(rows, out.logits[:, -1, :])

    def _sample(self, rows: list[_Row], logits: Any) -> list[tuple[Hashable, GenerationResult]]:
        """Sample one token per row from ``logits`` ``[len(rows), vocab]``; finish and remove the rows that end."""
        import torch

        params = self.params
        logits = logits.float()
        temperature = params.temperature if params.temperature > 0 else 1.0
        logp = torch.log_softmax(logits / temperature, dim=-1) if self.engine.compute_logprobs else None
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
            self._park(row.request.key, _Parked(tokens, self._cache.take_row(index, row.cached)))
        last = len(self._rows) - 1
        self._cache.move_row(last, index)
        self._rows[index] = self._rows[last]
        self._rows.pop()
        if not self._rows:
            self._cache.reset()
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
    """The batch's keys and values, right-aligned per row (see the module docstring), as a ``transformers`` cache."""

    def __init__(self, max_rows: int, like: list[tuple[Any, Any]]) -> None:
        import torch

        self.max_rows = max_rows
        self.shapes = [(k.shape[1], k.shape[3], k.dtype, k.device) for k, _ in like]
        self.columns = _COLUMN_CHUNK
        self.keys = [torch.zeros(max_rows, h, self.columns, d, dtype=t, device=dev) for h, d, t, dev in self.shapes]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.end = 0  # the column every row writes its next token to
        self.starts: list[int] = []  # first column of each live row
        self._step_start = 0

    def reset(self) -> None:
        self.end = 0
        self.starts = []

    def _relayout(self, need_left: int, need_right: int) -> None:
        """Shift the live columns so ``need_left`` fit left of ``end`` and ``need_right`` right of it, growing if
        needed (one copy of the live part)."""
        import torch

        first = min(self.starts) if self.starts else self.end
        used = self.end - first
        new_end = max(used, need_left)
        columns = max(self.columns, -(-(new_end + need_right + _COLUMN_CHUNK) // _COLUMN_CHUNK) * _COLUMN_CHUNK)
        rows = len(self.starts)
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = old if columns == self.columns else torch.zeros(
                    old.shape[0], old.shape[1], columns, old.shape[3], dtype=old.dtype, device=old.device
                )  # fmt: skip
                if rows and used:
                    live = old[:rows, :, first : self.end].clone()
                    new[:rows, :, new_end - used : new_end] = live
                buffers[i] = new
        shift = new_end - self.end
        self.starts = [s + shift for s in self.starts]
        self.end, self.columns = new_end, columns

    def reserve(self, n: int) -> None:
        """Make room for a row of ``n`` tokens (and the next decode column) with at most one re-layout."""
        if n > self.end or self.end + 1 > self.columns:
            self._relayout(n, 1)

    def add_row(self, index: int, layers: list[tuple[Any, Any]]) -> None:
        """Copy one sequence's cache (``[1, heads, n, dim]`` per layer) into row ``index`` (= the number of rows)."""
        n = layers[0][0].shape[2]
        self.reserve(n)
        for buffer, (k, _) in zip(self.keys, layers):
            buffer[index, :, self.end - n : self.end] = k[0, :, -n:]
        for buffer, (_, v) in zip(self.values, layers):
            buffer[index, :, self.end - n : self.end] = v[0, :, -n:]
        self.starts.append(self.end - n)

    def take_row(self, index: int, n: int) -> list[tuple[Any, Any]]:
        """A copy of row ``index``'s ``n`` cached tokens, per layer ``[1, heads, n, dim]``."""
        return [
            (k[index : index + 1, :, self.end - n : self.end].clone(), v[index : index + 1, :, self.end - n : self.end].clone())
            for k, v in zip(self.keys, self.values)
        ]  # fmt: skip

    def move_row(self, source: int, target: int) -> None:
        """Row ``source`` (the last) takes the place of row ``target``, which is dropped."""
        if source != target:
            start = self.starts[source]
            for buffers in (self.keys, self.values):
                for buffer in buffers:
                    buffer[target, :, start : self.end] = buffer[source, :, start : self.end]
            self.starts[target] = start
        self.starts.pop()

    def begin_step(self, lengths: Any) -> Any:
        """Make room for one column and return the step's 4-D attention mask ``[rows, 1, 1, columns]``."""
        import torch

        if self.end + 1 > self.columns:
            self._relayout(0, 1)
        self._step_start = min(self.starts)
        columns = torch.arange(self._step_start, self.end + 1, device=lengths.device)
        return (columns.unsqueeze(0) >= (self.end - lengths).unsqueeze(1))[:, None, None, :]

    def end_step(self) -> None:
        self.end += 1

    def view(self, rows: int) -> Any:
        """A ``transformers`` cache whose layers write this step's column of the first ``rows`` rows in place."""
        from transformers.cache_utils import Cache

        layers = [_ColumnLayer(self, i, rows) for i in range(len(self.keys))]
        return Cache(layers=layers)


class _PrefillBlock:
    """Keys and values of one batched prefill pass (see :meth:`HFSession._prefill`), as a ``transformers`` cache."""

    def __init__(self, model: Any, rows: int, width: int, queries: int, real: Any) -> None:
        import torch

        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        parameter = next(model.parameters())
        self.layers_count = config.num_hidden_layers
        shape = (rows, heads, width, dim)
        self.keys = [
            torch.zeros(shape, dtype=parameter.dtype, device=parameter.device) for _ in range(self.layers_count)
        ]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.width, self.queries = width, queries
        self.real = real[:, None, :, None]  # [rows, 1, queries, 1]: which query positions write their keys

    def place(self, row: int, layers: list[tuple[Any, Any]], start: int, n: int) -> None:
        for (k, v), keys, values in zip(layers, self.keys, self.values):
            keys[row, :, start : start + n] = k[0, :, :n]
            values[row, :, start : start + n] = v[0, :, :n]

    def sequence(self, row: int, n: int) -> list[tuple[Any, Any]]:
        """Row ``row``'s ``n`` tokens, per layer ``[1, heads, n, dim]`` (views)."""
        return [(k[row : row + 1, :, self.width - n :], v[row : row + 1, :, self.width - n :])
                for k, v in zip(self.keys, self.values)]  # fmt: skip

    def cache(self) -> Any:
        from transformers.cache_utils import Cache

        return Cache(layers=[_BlockLayer(self, i) for i in range(self.layers_count)])


class _BlockLayer:
    """One layer of a :class:`_PrefillBlock`: writes the real query positions' keys, returns the whole block."""

    is_sliding = False
    is_compileable = False
    is_initialized = True

    def __init__(self, block: _PrefillBlock, layer: int) -> None:
        self.block, self.layer = block, layer

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        import torch

        b = self.block
        keys, values = b.keys[self.layer], b.values[self.layer]
        window = slice(b.width - b.queries, b.width)
        keys[:, :, window] = torch.where(b.real, key_states, keys[:, :, window])
        values[:, :, window] = torch.where(b.real, value_states, values[:, :, window])
        return keys, values

    def get_seq_length(self) -> int:
        return self.block.width - self.block.queries

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.block.width, 0

    def get_max_length(self) -> int:
        return -1


class _ColumnLayer:
    """One layer of :class:`_BatchCache` as ``transformers`` attention sees it during a decode step."""

    is_sliding = False
    is_compileable = False
    is_initialized = True

    def __init__(self, cache: _BatchCache, layer: int, rows: int) -> None:
        self.cache, self.layer, self.rows = cache, layer, rows

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        c = self.cache
        keys, values = c.keys[self.layer], c.values[self.layer]
        keys[: self.rows, :, c.end : c.end + 1] = key_states
        values[: self.rows, :, c.end : c.end + 1] = value_states
        window = slice(c._step_start, c.end + 1)
        return keys[: self.rows, :, window], values[: self.rows, :, window]

    def get_seq_length(self) -> int:
        return self.cache.end

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.end - self.cache._step_start + query_length, 0

    def get_max_length(self) -> int:
        return -1


# ---------------------------------------------------------------- helpers
def _check_full_attention(model: Any) -> None:
    """The batch cache gives every layer the whole sequence: models with sliding-window or linear-attention layers
    would see more than they should, so they are refused with the engine that handles them."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    other = sorted({t for t in (getattr(config, "layer_types", None) or []) if t != "full_attention"})
    if other:
        raise ValueError(
            f"invalid argument model={type(model).__name__}: it has {', '.join(other)} layers; HFEngine supports "
            "models whose layers all use full attention. Use the hf-generate engine (GenerateEngine) or vllm."
        )


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


def _inverse_cdf_sample(probs: Any, generators: list[Any]) -> Any:
    """One token per row of ``probs`` ``[rows, vocab]``, row ``i`` drawing its uniform number from ``generators[i]``
    (inverse-CDF sampling: batched, and exact; ``torch.multinomial`` per row costs ~1 ms each on a 49k vocabulary)."""
    import torch

    uniforms = torch.stack([torch.rand((), generator=g, device=probs.device) for g in generators])
    cdf = probs.double().cumsum(dim=-1)
    targets = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)
    chosen = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    return chosen.clamp_(max=probs.shape[-1] - 1)


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
