"""Packed micro-batches for the update and the scoring pass: no padding, and each group's shared prefix run once.

The N rollouts of a group start from the same initial state, so their token sequences share a prefix: the whole
prompt on a one-turn env (Bandit: ~234 of ~245 tokens), the first turn's prompt on a multi-turn env. A padded batch
computes that prefix N times, forward and backward, for the policy and the critic alike. A :class:`PackedBatch` lays a
micro-batch out as **one row**: each group's shared prefix once, then every trajectory's own tokens, with position ids
that continue the prefix's. One attention function (registered with ``transformers`` as :data:`ATTENTION_NAME`) runs
attention block by block: a prefix attends causally to itself; a trajectory's own tokens attend to its group's prefix
and causally to themselves. Every other layer (embeddings, MLPs, norms, the LM head on the model's own tokens) works on
the row's tokens as they are, so nothing is padded, and the gradient reaches each prefix token once, through the sum of
its continuations' attention -- exactly the gradient of the unshared batch, computed once (tested against the padded
forward to float tolerance).

Where sharing stops: the shared part of a group is its longest common prefix but its last token, so every shared
position predicts the same token in all the group's rows; the first differing token is predicted from each row's own
copy of the last common one. Trained positions inside the shared prefix (under ``loss_mask="after_system"`` the
first user turn is trained) are computed once and read by every row that trains them: each row's loss gets its own
term, and their gradients add up in the shared computation, as they would over separate copies. A trajectory alone
in its micro-batch, or ``share_prefixes=False``, is packed whole (no padding still).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ragen_trainer.engines.hf import transformers_api
from ragen_trainer.trajectory import Trajectory

#: The name the packed attention is registered under (``model.set_attn_implementation(ATTENTION_NAME)``).
ATTENTION_NAME = "ragen_packed"
#: The keyword a :class:`PackedBatch` reaches the attention function under (transformers passes a model's extra
#: keyword arguments down to its attention functions, also through activation checkpointing's recomputation).
LAYOUT_KWARG = "ragen_layout"


@dataclass(frozen=True)
class Block:
    """Row positions ``[start, end)`` that attend to ``[prefix_start, prefix_end)`` and causally to themselves."""

    start: int
    end: int
    prefix_start: int = 0
    prefix_end: int = 0


@dataclass(frozen=True)
class PackedBatch:
    """A micro-batch as one row (see the module docstring)."""

    input_ids: torch.Tensor
    """``[1, L]`` token ids."""
    position_ids: torch.Tensor
    """``[1, L]``: each token's position in its own trajectory."""
    blocks: tuple[Block, ...]
    """The attention blocks, in row order, covering ``[0, L)``."""
    select: torch.Tensor
    """``[1, L]`` bool: the row positions whose next-token prediction is trained (each computed once: a position of
    a shared prefix serves every trajectory of the group that trains it)."""
    targets: torch.Tensor
    """``[n]``: the tokens the selected positions predict, in row order."""
    gather: torch.Tensor
    """``[entries]``: for each trained entry of the batch's mask, in its row-major order, the index of its position
    among the selected ones (the same index for the rows that share a prefix position)."""
    padded_tokens: int
    """Tokens a padded batch of the same trajectories would have computed (``B x longest``)."""

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device | str) -> PackedBatch:
        return PackedBatch(self.input_ids.to(device), self.position_ids.to(device), self.blocks,
                           self.select.to(device), self.targets.to(device), self.gather.to(device),
                           self.padded_tokens)

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments for the policy's (or critic's) forward."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, LAYOUT_KWARG: self}


def shared_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens ``rows`` can share: their longest common prefix but its last token, so every shared
    position predicts a token that is the same in all rows (the first differing token is predicted from each row's
    own copy of the last common one)."""
    if len(rows) < 2:
        return 0
    limit = min(len(r) for r in rows)
    n = 0
    first = rows[0]
    while n < limit and all(r[n] == first[n] for r in rows[1:]):
        n += 1
    return max(n - 1, 0)


def pack(trajs: Sequence[Trajectory], mask: torch.Tensor, *, share_prefixes: bool = True) -> PackedBatch:
    """Pack ``trajs`` (one micro-batch; ``mask``: their ``[B, W]`` action mask, 1 where the next token is trained)
    into one row, each run of consecutive trajectories of one group sharing its prefix."""
    ids: list[int] = []
    positions: list[int] = []
    blocks: list[Block] = []
    wanted: dict[int, int] = {}  # trained packed position -> the token it predicts
    entries: list[int] = []  # the packed position of each mask entry, row-major
    runs: list[list[int]] = []
    for i, traj in enumerate(trajs):  # consecutive rows of one group form a run
        if runs and trajs[runs[-1][-1]].group_id == traj.group_id:
            runs[-1].append(i)
        else:
            runs.append([i])
    for run in runs:
        rows = [list(trajs[i].input_ids) for i in run]
        shared = shared_prefix_length(rows) if share_prefixes else 0
        prefix = (len(ids), len(ids) + shared)
        if shared:
            ids += rows[0][:shared]
            positions += list(range(shared))
            blocks.append(Block(*prefix))
        for i, row in zip(run, rows):
            start = len(ids)
            ids += row[shared:]
            positions += list(range(shared, len(row)))
            trained = mask[i].bool().tolist()
            for j in range(min(len(trained), len(row) - 1)):  # action position j predicts token j + 1
                if trained[j]:
                    at = prefix[0] + j if j < shared else start + j - shared
                    wanted[at] = row[j + 1]
                    entries.append(at)
            blocks.append(Block(start, len(ids), *prefix) if shared else Block(start, len(ids)))
    order = sorted(wanted)  # the LM head reads the selected positions in row order
    index = {at: k for k, at in enumerate(order)}
    select = torch.zeros(1, len(ids), dtype=torch.bool)
    select[0, order] = True
    padded = len(trajs) * max(len(t.input_ids) for t in trajs)
    return PackedBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([positions], dtype=torch.long),
        blocks=tuple(blocks),
        select=select,
        targets=torch.tensor([wanted[at] for at in order], dtype=torch.long),
        gather=torch.tensor([index[at] for at in entries], dtype=torch.long),
        padded_tokens=padded,
    )


# ------------------------------------------------------------------------------------------------ the attention
def packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (``query`` ``[1, heads, L, dim]``, ``key`` / ``value``
    ``[1, kv_heads, L, dim]``): block by block over a :class:`PackedBatch` row; without one, plain SDPA."""
    layout = kwargs.pop(LAYOUT_KWARG, None)
    if layout is None:
        return transformers_api.sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                                       scaling=scaling, **kwargs)
    gqa = query.shape[1] != key.shape[1]
    outputs = []
    for block in layout.blocks:
        q = query[:, :, block.start:block.end]
        k, v = key[:, :, block.start:block.end], value[:, :, block.start:block.end]
        n, p = block.end - block.start, block.prefix_end - block.prefix_start
        if p:
            k = torch.cat([key[:, :, block.prefix_start:block.prefix_end], k], dim=2)
            v = torch.cat([value[:, :, block.prefix_start:block.prefix_end], v], dim=2)
            # attend to the whole prefix, then causally to the block's own tokens
            allowed = torch.ones(n, p + n, dtype=torch.bool, device=q.device).tril_(diagonal=p)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scaling, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa)
        outputs.append(out)
    attn = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
    return attn.transpose(1, 2).contiguous(), None


#: True while a forward on a packed row runs (:func:`packed_forward`).
_PACKED_FORWARD: ContextVar[bool] = ContextVar("ragen_packed_forward", default=False)


@contextmanager
def packed_forward() -> Iterator[None]:
    """Run a model's forward on a :class:`PackedBatch` (its :meth:`~PackedBatch.model_inputs`) inside this, and the
    model builds no attention mask for it. Without it, ``transformers`` reads the row's restarting position ids as
    packed sequences and builds a boolean ``[L, L]`` mask before the layers run, which :func:`packed_attention` never
    reads (it masks block by block): memory quadratic in the row's length, and a quarter of a scoring pass's time on
    the hot-path benchmark (``benchmarks/test_hot_paths.py``, group ``scoring``)."""
    token = _PACKED_FORWARD.set(True)
    try:
        yield
    finally:
        _PACKED_FORWARD.reset(token)


# unpacked calls get SDPA's masks (packed_attention hands them to SDPA); packed forwards, none
transformers_api.register_attention(packed_attention, ATTENTION_NAME, sdpa_masks=True, skip_masks=_PACKED_FORWARD.get)


def use_packed_attention(model: torch.nn.Module) -> None:
    """Make ``model`` (and every transformers model inside it, e.g. a critic's backbone) run :func:`packed_attention`:
    packed rows when a :class:`PackedBatch` is passed, plain SDPA otherwise. Set for the whole run, so activation
    checkpointing's recomputation in the backward pass runs the same attention as the forward did."""
    for sub in model.modules():
        if hasattr(sub, "set_attn_implementation") and hasattr(sub, "config"):
            sub.set_attn_implementation(ATTENTION_NAME)


__all__ = ["ATTENTION_NAME", "Block", "PackedBatch", "pack", "packed_attention", "packed_forward",
           "shared_prefix_length", "use_packed_attention"]
