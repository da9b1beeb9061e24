"""HFEngine's model runner: the model's forward passes over the batch cache, and how they attend.

Prefill (*packed*). The prompts admitted together run through the model in one forward pass as a single packed
sequence: the uncached tokens of every prompt one after the other, each with its own position ids, so no token is
padding (a padded batch runs its linear layers on rows x longest prompt). Each prompt gets its row of the batch cache
first (its reused keys copied in); every layer writes a prompt's new keys into its row (:class:`PackedLayer`) and
attends prompt by prompt over that row (:meth:`PackedPlan.attend`).

Decode. One token per live row, each row at its own position (its own length), so a row's attention and rotary
positions are those of its sequence alone: batching does not change what a row sees. Every layer writes the rows'
new keys at their own columns in place (:class:`ColumnLayer`). Attention reads only the columns rows hold: the rows
are cut into consecutive *segments* (:func:`row_segments`), each attending over the columns ``[0, longest row of the
segment]`` with an additive mask hiding the columns right of a shorter row, so rows at turn 1 do not read the padding
up to a turn-5 row's length (one segment when the rows' lengths are close: a call costs more than a few padded
columns). Columns that several rows hold as copies of one computation (a group's first prompt, the env's common
head: :meth:`~ragen_trainer.engines.hf.cache.BatchCache.shared_groups`) are read once per group of rows, and each
row reads only its own columns after them; the two parts merge by log-sum-exp (:class:`DecodePlan`).

Attention. While a session is open its model runs ragen's attention function (:func:`ragen_attention`, registered
with ``transformers``' attention interface and switched on for the session by :class:`ModelLease`, then switched
back), which reads how to attend from the *plan* of the pass in progress (:class:`PackedPlan`, :class:`DecodePlan`).
Everything this module asks of ``transformers`` goes through :mod:`~ragen_trainer.engines.hf.transformers_api`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import torch

from ragen_trainer.engines.hf import transformers_api
from ragen_trainer.engines.hf.cache import BatchCache, DecodeStep, ParkedCache, SharedColumns
from ragen_trainer.engines.hf.direct_decode import DirectDecoder, bypassed_hooks
from ragen_trainer.engines.hf.packed_weights import PackedWeights
from ragen_trainer.engines.hf.transformers_api import CacheLayer

#: What one more attention call of a decode step costs, in (row, column) pairs attended: on CPU an SDPA call costs
#: ~15 us and a row's column ~0.11 us (SmolLM2, 2 cores), so a segment of rows pays for itself once it saves this many
#: padded columns. :func:`row_segments` splits the rows where that holds.
SEGMENT_COST = 160
#: What reading a group's shared columns once costs beyond its rows' own reads, in the same (row, column) pairs: the
#: group's stacked queries against its source row (~70 us a layer for 8 rows x 240 columns on this CPU, one thread)
#: and, once per step, the merge of the two parts (~150 us). A group is read apart only when it saves more than
#: :data:`GROUP_COST` pairs (``(rows - 1) x shared columns``), and the groups of a step only when together they save
#: more than :data:`SHARED_COST`: two rows sharing 240 columns save less than they cost.
GROUP_COST = 640
SHARED_COST = 1600


@dataclass
class PrefillJob:
    """One prompt to encode and the requests that share it (several only for identical, uncached prompts)."""

    prompt: list[int]
    requests: list[Any]  # GenerationRequest
    parked: ParkedCache | None


class ModelRunner:
    """Runs ``model``'s passes over a :class:`~ragen_trainer.engines.hf.cache.BatchCache` and counts the work in
    ``stats`` (the engine's counters). ``direct_decode``: decode steps run the model's modules directly
    (:class:`~ragen_trainer.engines.hf.direct_decode.DirectDecoder`; the model must be one it supports) instead of
    ``transformers``' forward, unless a module it would bypass has a forward hook (then the hook runs: the
    ``transformers`` forward is used)."""

    def __init__(self, model: Any, stats: dict[str, int], *, share_attention: bool = True,
                 direct_decode: bool = False) -> None:  # fmt: skip
        self.model = model
        self.stats = stats
        self.share_attention = share_attention
        self.direct = DirectDecoder(model) if direct_decode and not bypassed_hooks(model) else None
        self.cache_keyword = transformers_api.cache_keyword(model)
        try:
            self.device = next(model.parameters()).device
        except StopIteration:
            self.device = torch.device("cpu")

    def new_cache(self, max_rows: int) -> BatchCache:
        """An empty batch cache of ``max_rows`` rows, in the model's dtype and on its device."""
        parameter = next(self.model.parameters())
        shape = transformers_api.attention_shape(self.model)
        return BatchCache(shape, max_rows, dtype=parameter.dtype, device=parameter.device)

    def prefill(self, cache: BatchCache, jobs: list[PrefillJob]) -> list[Any]:
        """Encode the uncached part of each job's prompt in one packed forward pass, straight into new rows of
        ``cache`` (one per request, in job order; room made by ``cache.reserve``); return each job's last-position
        logits.

        Layout of the pass (jobs with suffixes of ``s_i`` tokens after ``n_i`` reused ones): a new row is opened per
        job, left-aligned like every row (its ``n_i + s_i`` tokens in columns ``[0, n_i + s_i)``), and its reused
        keys are copied into the first ``n_i`` columns. The suffixes run through the model *packed*, one after another
        in a single sequence of ``sum(s_i)`` tokens with their own position ids, so no token is padding. Each layer
        writes a job's new keys into its row and attends job by job over the row's columns
        (:meth:`PackedPlan.attend`): the linear layers see every token once and attention sees each job's own
        sequence only. Rows of requests sharing a job are copies of its row.
        """
        plan = PackedPlan(cache)
        ids: list[int] = []
        positions: list[int] = []
        for job in jobs:
            length = len(job.prompt)
            reused = min(len(job.parked.tokens), length - 1) if job.parked is not None else 0  # run one token at least
            parked = job.parked if reused else None
            rows = [cache.open_row(length, parked.layers if parked else None, reused, parked.lineage if parked else ())]
            rows += [cache.open_row(length) for _ in job.requests[1:]]  # copies of the first, filled after the pass
            plan.add(rows, offset=len(ids), suffix=length - reused, length=length)
            ids += job.prompt[reused:]
            positions += range(reused, length)
            self.stats["prefill_tokens"] += length - reused
            self.stats["reused_tokens"] += reused + (len(job.requests) - 1) * length
        last = torch.tensor([job.offset + job.suffix - 1 for job in plan.jobs], device=self.device)
        with _attending(plan):
            out = self.model(
                input_ids=torch.tensor([ids], device=self.device),
                position_ids=torch.tensor([positions], device=self.device),
                use_cache=True, logits_to_keep=last, **{self.cache_keyword: plan.cache_view()},
            )  # fmt: skip
        for job in plan.jobs:
            for row in job.rows[1:]:
                cache.fill_row(row, job.rows[0])
        return [out.logits[0, i, :] for i in range(len(jobs))]

    def encode_prefix(self, cache: BatchCache, tokens: list[int]) -> ParkedCache:
        """Encode ``tokens`` in a row of ``cache`` after the live ones (one must be free) and return their keys and
        values as a cache any prompt starting with them can reuse; the row is closed again."""
        self.prefill(cache, [PrefillJob(list(tokens), [None], None)])
        row = len(cache.lengths) - 1
        parked = ParkedCache(list(tokens), cache.take_row(row), cache.lineage[row])
        cache.close_last_row()
        return parked

    def decode(self, cache: BatchCache, last_tokens: list[int]) -> Any:
        """Run one token per row of ``cache`` (``last_tokens[r]`` for row ``r``), writing their keys and values at
        each row's next column; returns the logits ``[rows, vocab]``."""
        inputs = torch.tensor([[token] for token in last_tokens], dtype=torch.long, device=self.device)
        groups = worth_sharing(cache.shared_groups()) if self.share_attention else []
        starts = [0] * len(cache.lengths)  # the first column each row attends to on its own
        for group in groups:
            for row in group.rows:
                starts[row] = group.columns
        held = [n + 1 for n in cache.lengths]  # each row's columns, the new one included
        segments = row_segments(held, starts=starts)
        if groups:
            groups = _drop_unread_sharing(segments, starts, groups)
        plan = DecodePlan(segments, held, starts, groups, cache.keys[0])
        step = cache.begin_step(mask=self.direct is None)  # the direct step attends by the plan alone
        if self.direct is not None:
            logits = self.direct.step(cache, inputs[:, 0], step, plan)
        else:
            with _attending(plan):
                out = self.model(
                    input_ids=inputs, position_ids=step.positions, attention_mask=step.mask, use_cache=True,
                    **{self.cache_keyword: transformers_api.cache_of([ColumnLayer(cache, i, step)
                                                                      for i in range(len(cache.keys))])},
                )  # fmt: skip
            logits = out.logits[:, -1, :]
        self.stats["decode_steps"] += 1
        self.stats["decoded_rows"] += len(last_tokens)
        self.stats["attended_columns"] += plan.columns_read()
        self.stats["cached_columns"] += sum(cache.lengths) + len(last_tokens)
        cache.end_step()
        return logits


# ---------------------------------------------------------------------------------------------------- the model lease
@dataclass
class _Lease:
    sessions: int
    was_training: bool
    attention: str | None
    packed: PackedWeights | None


_leases: WeakKeyDictionary[Any, _Lease] = WeakKeyDictionary()


class ModelLease:
    """Holds ``model`` in sampling mode while a session uses it: eval mode (no dropout), ragen's attention and, with
    ``pack_weights``, its linear layers' weights packed (:mod:`~ragen_trainer.engines.hf.packed_weights`); the last
    session to let go restores its train / eval mode, attention implementation and layers. Sessions of several engines
    may share one model (two seats of a self-play game); the first one's ``pack_weights`` and ``float32_packs`` hold
    for all."""

    def __init__(self, model: Any, *, pack_weights: bool = False, float32_packs: str = "mkl") -> None:
        self.model = model
        lease = _leases.get(model)
        if lease is None:
            transformers_api.register_attention(ragen_attention)
            lease = _Lease(0, bool(model.training), transformers_api.attention_implementation(model), None)
            model.eval()
            try:
                transformers_api.set_attention_implementation(model, transformers_api.ATTENTION_NAME)
                # A model in eval mode (evaluation, benchmarks) keeps its packs between sessions; the trainer's
                # policy, in training mode, changes its weights every step and keeps none.
                lease.packed = (PackedWeights(model, keep=not lease.was_training, float32_packs=float32_packs)
                                if pack_weights else None)  # fmt: skip
            except Exception:
                transformers_api.set_attention_implementation(model, lease.attention)
                model.train(lease.was_training)
                raise
            _leases[model] = lease
        lease.sessions += 1
        self._held = True

    def release(self) -> None:
        """Let go of the model (once; later calls do nothing)."""
        if not self._held:
            return
        self._held = False
        lease = _leases[self.model]
        lease.sessions -= 1
        if lease.sessions == 0:
            del _leases[self.model]
            if lease.packed is not None:
                lease.packed.restore()
            transformers_api.set_attention_implementation(self.model, lease.attention)
            if lease.was_training:
                self.model.train()


# ---------------------------------------------------------------------------------------------------- attention plans
_attention_plan: ContextVar[PackedPlan | DecodePlan | None] = ContextVar("ragen_attention_plan", default=None)


def ragen_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None,
                    dropout: float = 0.0, **kwargs: Any) -> tuple[Any, None]:  # fmt: skip
    """The attention function of HFEngine's passes, called by ``transformers`` in place of its own with the layer's
    ``query`` / ``key`` / ``value`` ``[batch, heads, tokens, dim]``: the plan of the pass in progress says how to
    attend. Returns ``[batch, tokens, heads, dim]`` as ``transformers``' functions do."""
    plan = _attention_plan.get()
    if plan is None:
        raise RuntimeError(
            "the model runs ragen's attention outside an HFEngine pass: an HFEngine session on it is still open "
            "(close it, e.g. `with engine.session(params) as session: ...`, before running the model yourself)"
        )
    return plan.attend(module, query, key, value, attention_mask, scaling), None


@contextmanager
def _attending(plan: PackedPlan | DecodePlan) -> Iterator[None]:
    """Make ``plan`` the plan :func:`ragen_attention` follows for the pass run inside."""
    token = _attention_plan.set(plan)
    try:
        yield
    finally:
        _attention_plan.reset(token)


@dataclass
class PackedJob:
    """One job of a packed prefill pass: its rows (the first is computed, the others copy it), where its suffix sits
    in the packed sequence, and its length (reused + suffix tokens)."""

    rows: list[int]
    offset: int
    suffix: int
    length: int
    mask: Any  # [suffix, length] additive: query i sees the columns up to its own position; None for a fresh prompt


class PackedPlan:
    """The jobs of one packed prefill pass (:meth:`ModelRunner.prefill`), read by :meth:`attend`."""

    def __init__(self, cache: BatchCache) -> None:
        self.cache = cache
        self.jobs: list[PackedJob] = []

    def add(self, rows: list[int], *, offset: int, suffix: int, length: int) -> None:
        mask = None
        if suffix < length:  # causal, aligned bottom-right: query i is token length - suffix + i of its sequence
            device, dtype = self.cache.keys[0].device, self.cache.keys[0].dtype
            columns = torch.arange(length, device=device)
            future = columns[None, :] > (length - suffix + torch.arange(suffix, device=device))[:, None]
            mask = torch.zeros(future.shape, dtype=dtype, device=device).masked_fill_(future, torch.finfo(dtype).min)
        self.jobs.append(PackedJob(rows, offset, suffix, length, mask))

    def cache_view(self) -> Any:
        return transformers_api.cache_of([PackedLayer(self, i) for i in range(len(self.cache.keys))])

    def attend(self, module: Any, query: Any, key: Any, value: Any, mask: Any, scaling: float | None) -> Any:
        """Attention of the pass, job by job: the queries of a job (its suffix in the packed sequence, ``query``
        ``[1, heads, tokens, dim]``) attend over its row of the batch cache (reused keys, then the suffix's own,
        written by :class:`PackedLayer`); ``key``, ``value`` and ``mask`` (the packed tokens' own) are not used.
        Returns ``[1, tokens, heads, dim]``."""
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


class PackedLayer(CacheLayer):
    """One layer of the batch cache during a packed prefill pass: writes each job's new keys and values into its
    row; attention reads them from there (:meth:`PackedPlan.attend`)."""

    def __init__(self, plan: PackedPlan, layer: int) -> None:
        super().__init__()
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


class ColumnLayer(CacheLayer):
    """One layer of the batch cache during a decode step: writes each row's new key and value at the row's own
    column and gives attention the columns ``[0, window)`` of every row."""

    def __init__(self, cache: BatchCache, layer: int, step: DecodeStep) -> None:
        super().__init__()
        self.cache, self.layer, self.step = cache, layer, step

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        step = self.step
        rows = len(step.lengths)
        keys, values = self.cache.keys[self.layer], self.cache.values[self.layer]
        keys[step.rows, :, step.lengths] = key_states[:, :, 0]
        values[step.rows, :, step.lengths] = value_states[:, :, 0]
        return keys[:rows, :, : step.window], values[:rows, :, : step.window]

    def get_seq_length(self) -> int:
        return max(self.cache.lengths)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return max(self.cache.lengths) + query_length, 0


class DecodePlan:
    """How a decode step attends: segment by segment of rows (:func:`row_segments`), each over its own columns, and
    the columns rows share (:meth:`BatchCache.shared_groups`) read once per group of rows.

    Shared columns ("cascade" attention). Rows whose first columns are copies of one computation (a GRPO group's
    first prompt, the env's common head) read those columns once for the whole group: the group's queries, stacked,
    attend over one row's copy, each row attends over its own columns after them, and the two parts are merged by
    their log-sum-exp (``softmax`` over ``[a; b]`` = ``(e^{lse_a} o_a + e^{lse_b} o_b) / (e^{lse_a} + e^{lse_b})``).
    The keys read per layer drop from ``sum_r n_r`` columns to ``shared + sum_r (n_r - shared)``; the result equals
    one softmax over all of a row's columns up to float rounding (about 1e-7)."""

    def __init__(self, segments: list[tuple[int, int, int, int]], held: list[int], starts: list[int],
                 groups: list[SharedColumns], like: Any) -> None:  # fmt: skip
        """``segments``: ``(start, stop, first, window)`` rows and columns read (:func:`row_segments`); ``held`` /
        ``starts``: each row's columns and the first it reads on its own; ``like``: a tensor of the cache's dtype
        and device."""
        self.segments, self.groups = segments, groups
        lowest = torch.finfo(like.dtype).min
        if groups:
            # All groups' shared parts in one attention call: group g's members (padded to the largest group with
            # repeats of its first, whose results are dropped) over its source row's first columns (padded to the
            # most columns, the rest masked).
            most = max(len(g.rows) for g in groups)
            self.members = torch.tensor([g.rows + g.rows[:1] * (most - len(g.rows)) for g in groups], device=like.device)
            self.kept = torch.tensor([[i < len(g.rows) for i in range(most)] for g in groups],
                                     device=like.device).flatten()  # fmt: skip
            self.member_rows = self.members.flatten()[self.kept]
            self.sources = torch.tensor([g.source for g in groups], device=like.device)
            self.shared_columns = max(g.columns for g in groups)
            self.shared_mask = None
            if any(g.columns != self.shared_columns for g in groups):
                hidden = torch.arange(self.shared_columns, device=like.device)[None, :] >= torch.tensor(
                    [g.columns for g in groups], device=like.device)[:, None]
                self.shared_mask = torch.zeros(hidden.shape, dtype=like.dtype, device=like.device).masked_fill_(
                    hidden, lowest)[:, None, None, :]
        self.masks = []  # per segment [rows, 1, 1, window - first] additive, None where every column is the rows'
        for start, stop, first, window in segments:
            if all(starts[r] == first and held[r] == window for r in range(start, stop)):
                self.masks.append(None)
                continue
            columns = torch.arange(first, window, device=like.device)[None, :]
            lo = torch.tensor(starts[start:stop], device=like.device)[:, None]
            hi = torch.tensor(held[start:stop], device=like.device)[:, None]
            hidden = (columns < lo) | (columns >= hi)
            mask = torch.zeros(hidden.shape, dtype=like.dtype, device=like.device).masked_fill_(hidden, lowest)
            self.masks.append(mask[:, None, None, :])

    def columns_read(self) -> int:
        """(row, column) pairs of keys a layer reads in this step."""
        own = sum((stop - start) * (window - first) for start, stop, first, window in self.segments)
        return own + sum(group.columns for group in self.groups)

    def attend(self, module: Any, query: Any, key: Any, value: Any, mask: Any, scaling: float | None) -> Any:
        """``query`` ``[rows, heads, 1, dim]`` over ``key`` / ``value`` ``[rows, kv_heads, window, dim]`` (the batch
        cache's columns, this step's written); ``mask`` (the model's) is not used: each segment's own is. Returns
        ``[rows, 1, heads, dim]``."""
        rows, heads, _, dim = query.shape
        kv_heads = key.shape[1]
        group = heads // kv_heads
        # The query heads that share a key/value head side by side (repeat_kv's order): [rows, kv_heads, group, dim],
        # so attention reads each key once instead of once per query head.
        grouped = query.reshape(rows, kv_heads, group, dim)
        out = query.new_empty(rows, kv_heads, group, dim)
        if not self.groups:
            for (start, stop, first, window), own_mask in zip(self.segments, self.masks):
                out[start:stop] = attention_with_lse(
                    grouped[start:stop], key[start:stop, :, first:window], value[start:stop, :, first:window],
                    own_mask, scaling,
                )[0]  # fmt: skip
            return out.reshape(rows, 1, heads, dim)
        lse = torch.empty(rows, kv_heads, group, dtype=torch.float32, device=query.device)
        for (start, stop, first, window), own_mask in zip(self.segments, self.masks):
            out[start:stop], lse[start:stop] = attention_with_lse(
                grouped[start:stop], key[start:stop, :, first:window], value[start:stop, :, first:window],
                own_mask, scaling,
            )  # fmt: skip
        # Each group's queries as one sequence of members x group queries per key/value head: one pass over its
        # source row's shared columns serves them all.
        groups, most = self.members.shape
        stacked = grouped[self.members].transpose(1, 2).reshape(groups, kv_heads, most * group, dim)
        columns = slice(0, self.shared_columns)
        if groups == 1:  # a view of the source row, no copy
            source = slice(self.groups[0].source, self.groups[0].source + 1)
            shared_keys, shared_values = key[source, :, columns], value[source, :, columns]
        else:  # index_select of the sliced view copies only the shared columns of the source rows
            shared_keys = key[:, :, columns].index_select(0, self.sources)
            shared_values = value[:, :, columns].index_select(0, self.sources)
        o_shared, lse_shared = attention_with_lse(stacked, shared_keys, shared_values, self.shared_mask, scaling)
        o_shared = o_shared.reshape(groups, kv_heads, most, group, dim).transpose(1, 2).reshape(-1, kv_heads, group, dim)
        lse_shared = lse_shared.reshape(groups, kv_heads, most, group).transpose(1, 2).reshape(-1, kv_heads, group)
        o_shared, lse_shared, index = o_shared[self.kept], lse_shared[self.kept], self.member_rows
        lse_own = lse[index]
        total = torch.logaddexp(lse_own, lse_shared)  # merged in float32, rounded once to the cache's dtype
        out[index] = (out[index].float() * torch.exp(lse_own - total)[..., None]
                      + o_shared.float() * torch.exp(lse_shared - total)[..., None]).to(out.dtype)  # fmt: skip
        return out.reshape(rows, 1, heads, dim)


def worth_sharing(groups: list[SharedColumns]) -> list[SharedColumns]:
    """The groups whose shared columns are worth reading apart (:data:`GROUP_COST`, :data:`SHARED_COST`)."""
    kept = [g for g in groups if (len(g.rows) - 1) * g.columns > GROUP_COST]
    return kept if sum((len(g.rows) - 1) * g.columns for g in kept) > SHARED_COST else []


def _drop_unread_sharing(segments: list[tuple[int, int, int, int]], starts: list[int],
                         groups: list[SharedColumns]) -> list[SharedColumns]:
    """A grouped row cut into a segment that reads from column 0 (beside rows that share nothing) reads its shared
    columns there anyway: it leaves its group and reads its own copy (``starts`` updated in place). The rest stay,
    the source row too where it left (it still holds the columns); a grouped row in a segment that starts later than
    column 0 but before its own first column stays too, the columns between masked."""
    first = {row: seg_first for start, stop, seg_first, _ in segments for row in range(start, stop)}
    kept = []
    for group in groups:
        rows = [row for row in group.rows if first[row] > 0]
        for row in set(group.rows) - set(rows):
            starts[row] = 0
        if rows:
            kept.append(SharedColumns(group.source, group.columns, rows))
    return kept


def attention_with_lse(query: Any, key: Any, value: Any, mask: Any, scaling: float | None) -> tuple[Any, Any]:
    """Scaled dot-product attention ``[batch, heads, queries, dim]`` and each query's log-sum-exp of its scores
    ``[batch, heads, queries]`` (float32), what merging two parts of one softmax needs. On a CPU torch's flash
    kernel returns both (and with an additive mask over a decode step's few queries it is faster than
    ``scaled_dot_product_attention``, which then takes its unfused path: 2.2 against 2.7 ms for 32 rows x 660
    columns, SmolLM2's heads, one thread); elsewhere it is computed in float32."""
    if query.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=mask, scale=scaling
        )
        return out, lse.float()
    return attention_with_lse_math(query, key, value, mask, scaling)


def attention_with_lse_math(query: Any, key: Any, value: Any, mask: Any, scaling: float | None) -> tuple[Any, Any]:
    """:func:`attention_with_lse` written out in float32 (any device): ``softmax(q k^T * scale + mask) v`` and the
    log-sum-exp of the scores."""
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse[..., None]), value.float())
    return out.to(query.dtype), lse


def row_segments(columns: list[int], cost: int = SEGMENT_COST, *,
                 starts: list[int] | None = None) -> list[tuple[int, int, int, int]]:  # fmt: skip
    """Cut rows ``[0, len(columns))`` into consecutive segments ``(start, stop, first, window)``: the rows of the
    segment read the columns ``[first, window)``, ``first`` the lowest of their ``starts`` (the first column each
    row reads; 0 by default) and ``window`` the most columns a row holds, minimising the (row, column) pairs read plus
    ``cost`` per segment.

    Dynamic programming over the cut points (``best[i]``: cheapest cover of rows ``[0, i)``), ``O(rows^2)``; when the
    rows' padding under one window costs less than a second segment, one segment is returned at once.
    """
    rows = len(columns)
    starts = starts if starts is not None else [0] * rows
    first, widest = min(starts), max(columns)
    if rows * (widest - first) - sum(c - s for c, s in zip(columns, starts)) <= cost:
        return [(0, rows, first, widest)]
    best = [0.0] + [math.inf] * rows
    cut = [0] * (rows + 1)
    for stop in range(1, rows + 1):
        window, lowest = 0, math.inf
        for start in range(stop - 1, -1, -1):
            window, lowest = max(window, columns[start]), min(lowest, starts[start])
            total = best[start] + (stop - start) * (window - lowest) + cost
            if total < best[stop]:
                best[stop], cut[stop] = total, start
    segments = []
    stop = rows
    while stop > 0:
        start = cut[stop]
        segments.append((start, stop, min(starts[start:stop]), max(columns[start:stop])))
        stop = start
    return segments[::-1]
