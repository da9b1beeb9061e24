"""HFEngine's key/value storage: the batch cache of the live rows, and the caches parked between an episode's turns.

Layout of the batch cache (:class:`BatchCache`). Every layer holds one key and one value buffer ``[rows, kv_heads,
columns, head_dim]``. Rows are *left-aligned*: row ``r`` holds its ``n_r`` cached tokens in columns ``[0, n_r)`` and
writes its next token at column ``n_r``. A decode step writes those columns in place (no ``torch.cat`` of the whole
cache per token, which is what ``DynamicCache`` does). Nothing is ever shifted: a joining row starts at column 0, the
buffers only grow (by whole chunks, copying the live columns) when the longest row would not fit, and a finished
row's slot is filled by the last row so the live rows stay ``[0, rows)``.

Every row also records its *lineage* (:data:`Lineage`): which prefill pass computed its first columns. Rows of one
prefill job (a group's identical first prompt), rows that reused one encoded shared prefix, and an episode's later
turns (its parked cache) hold bit-identical copies of those columns, so decode attention may read one copy for all of
them (:meth:`BatchCache.shared_groups`).

When a reply ends, its row's keys and values are *parked* (:class:`ParkedCaches`) under its episode's key, so the
episode's next prompt (the same tokens plus the env's delta) encodes only the delta.

How the model reads and writes this storage during a pass is :mod:`ragen_trainer.engines.hf.runner`'s job.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

#: Columns added to the batch cache at a time when it grows (fewer re-layouts, a little unused memory).
COLUMN_CHUNK = 256
#: Fewest shared columns worth reading once for several rows (an extra attention call per layer and a merge).
MIN_SHARED_COLUMNS = 32


#: Where a row's columns were computed: ``((pass, columns), ...)``, columns increasing: its first ``columns`` columns
#: are copies of what prefill pass ``pass`` wrote (a shared prefix, a group's first prompt, ...). Rows whose lineages
#: hold the same pass hold bit-identical keys and values in its columns (copies of one computation), so attention may
#: read one row's copy for all of them (:meth:`BatchCache.shared_groups`).
Lineage = tuple[tuple[int, int], ...]


def cut_lineage(lineage: Lineage, columns: int) -> Lineage:
    """``lineage`` of the first ``columns`` columns only."""
    return tuple((tag, min(n, columns)) for tag, n in lineage if min(n, columns) > 0)


@dataclass
class ParkedCache:
    """A finished reply's cache, kept for the next turn of its episode."""

    tokens: list[int]
    layers: list[tuple[Any, Any]]  # per layer: keys, values [1, kv_heads, len(tokens), head_dim]
    lineage: Lineage = ()  # where its columns were computed (BatchCache.lineage)


@dataclass
class SharedColumns:
    """Rows of the batch cache whose first ``columns`` columns are copies of one computation: attention reads them
    once, from row ``source`` (one of ``rows``)."""

    source: int
    columns: int
    rows: list[int]


class ParkedCaches:
    """The parked caches of a session, at most ``max_tokens`` tokens in all.

    Requests are admitted first come, first served, so the caches parked earliest are the next to be used: when the
    budget is spent, a newly finished reply is not parked (its episode re-encodes its next prompt in full)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._parked: dict[Hashable, ParkedCache] = {}  # insertion order = parking order (oldest first)

    def park(self, key: Hashable, parked: ParkedCache) -> None:
        """Keep ``parked`` for ``key``'s next turn, unless the budget is spent."""
        self._parked.pop(key, None)
        if self.tokens() + len(parked.tokens) <= self.max_tokens:
            self._parked[key] = parked

    def take(self, key: Hashable) -> ParkedCache | None:
        """``key``'s parked cache, removed from the store (``None`` when there is none)."""
        return self._parked.pop(key, None)

    def release(self, key: Hashable) -> None:
        self._parked.pop(key, None)

    def clear(self) -> None:
        self._parked.clear()

    def tokens(self) -> int:
        return sum(len(p.tokens) for p in self._parked.values())


def common_prefix(prompt: list[int], cached: list[int]) -> int:
    """How many leading tokens ``prompt`` and ``cached`` share."""
    n = min(len(prompt), len(cached))
    if prompt[:n] == cached[:n]:
        return n
    return int(np.argmin(np.asarray(prompt[:n]) == np.asarray(cached[:n])))


@dataclass
class DecodeStep:
    """One decode step: every row writes its next token at its own column ``length``."""

    rows: Any  # [rows] row indices
    lengths: Any  # [rows] tokens each row held before the step (the column it writes)
    window: int  # columns attended: the longest row plus the new one
    positions: Any  # [rows, 1] the new tokens' positions (their rows' lengths)
    mask: Any  # [rows, 1, 1, window] additive: 0 on a row's columns, the dtype's minimum on padding right of it; or None


class BatchCache:
    """The batch's keys and values, one row per live request, left-aligned (see the module docstring)."""

    def __init__(self, shape: tuple[int, int, int], max_rows: int, *, dtype: Any, device: Any) -> None:
        """``shape``: key/value heads, head dimension and layer count of the model's attention."""
        heads, dim, layers = shape
        self.columns = COLUMN_CHUNK
        size = (max_rows, heads, self.columns, dim)
        self.keys = [torch.zeros(size, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.lengths: list[int] = []  # tokens cached per live row, in columns [0, length)
        self.lineage: list[Lineage] = []  # per live row: where its columns were computed
        self._passes = itertools.count()
        self._groups: list[SharedColumns] | None = None  # shared_groups() until the rows change

    def reserve(self, n: int) -> None:
        """Make room for rows of ``n`` tokens and one more column (grows the buffers, copying the live columns)."""
        if n + 1 <= self.columns:
            return
        columns = -(-(n + 1) // COLUMN_CHUNK) * COLUMN_CHUNK + COLUMN_CHUNK  # room to grow before the next time
        used, rows = max(self.lengths, default=0), len(self.lengths)
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = torch.zeros(old.shape[0], old.shape[1], columns, old.shape[3], dtype=old.dtype, device=old.device)
                new[:rows, :, :used] = old[:rows, :, :used]
                buffers[i] = new
        self.columns = columns

    def open_row(self, n: int, layers: list[tuple[Any, Any]] | None = None, reused: int = 0,
                 lineage: Lineage = ()) -> int:  # fmt: skip
        """Add a row for a sequence of ``n`` tokens (room made by :meth:`reserve`) whose first ``reused`` keys and
        values are copied from ``layers`` (``[1, heads, >= reused, dim]`` per layer, computed where ``lineage``
        says); the rest is written by the prefill pass, a new pass of the lineage. Returns the row's index."""
        index = len(self.lengths)
        if layers is not None and reused:
            for keys, values, (k, v) in zip(self.keys, self.values, layers):
                keys[index, :, :reused] = k[0, :, :reused]
                values[index, :, :reused] = v[0, :, :reused]
        self.lengths.append(n)
        kept = cut_lineage(lineage, reused) if layers is not None else ()
        self.lineage.append(kept + ((next(self._passes), n),))
        self._groups = None
        return index

    def fill_row(self, target: int, source: int) -> None:
        """Copy row ``source``'s tokens into row ``target`` (a request that shares a prefill job)."""
        n = self.lengths[source]
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[target, :, :n] = buffer[source, :, :n]
        self.lineage[target] = self.lineage[source]
        self._groups = None

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
            self.lineage[target] = self.lineage[source]
        self.lengths.pop()
        self.lineage.pop()
        self._groups = None

    def close_last_row(self) -> None:
        """Drop the last row (a scratch row, such as a shared prefix's once taken)."""
        self.lengths.pop()
        self.lineage.pop()
        self._groups = None

    def shared_groups(self) -> list[SharedColumns]:
        """The rows that hold copies of one computation in their first columns, grouped (at least two rows and
        :data:`MIN_SHARED_COLUMNS` columns a group; a row in one group at most).

        Each row joins the deepest pass of its lineage that another row also holds (the most columns: a GRPO group's
        rows share their whole first prompt, rows of distinct states only the env's common head); a group's shared
        columns are the fewest its rows hold of that pass. Recomputed only when the rows change."""
        if self._groups is None:
            holders = Counter(tag for lineage in self.lineage for tag, _ in lineage)
            members: dict[int, list[int]] = {}
            for row, lineage in enumerate(self.lineage):
                shared = [(n, tag) for tag, n in lineage if holders[tag] > 1]
                if shared:
                    members.setdefault(max(shared)[1], []).append(row)
            self._groups = []
            for tag, rows in members.items():
                columns = min(n for row in rows for t, n in self.lineage[row] if t == tag)
                if len(rows) > 1 and columns >= MIN_SHARED_COLUMNS:
                    self._groups.append(SharedColumns(rows[0], columns, rows))
        return self._groups

    def begin_step(self, *, mask: bool = True) -> DecodeStep:
        """Start a decode step (room is made for every row's next column); ``mask=False`` leaves the step's padding
        mask out (``None``: a pass that attends by its own plan does not read it)."""
        self.reserve(max(self.lengths))
        device, dtype = self.keys[0].device, self.keys[0].dtype
        lengths = torch.tensor(self.lengths, dtype=torch.long, device=device)
        window = max(self.lengths) + 1
        padding_mask = None
        if mask:
            padding = torch.arange(window, device=device)[None, :] > lengths[:, None]
            padding_mask = torch.zeros(padding.shape, dtype=dtype, device=device).masked_fill_(
                padding, torch.finfo(dtype).min
            )[:, None, None, :]
        rows = torch.arange(len(self.lengths), device=device)
        return DecodeStep(rows, lengths, window, lengths.unsqueeze(1), padding_mask)

    def end_step(self) -> None:
        """Every row now holds its new token."""
        self.lengths = [n + 1 for n in self.lengths]
