"""The data and the math of a StarPO update: the kept batch as tensors, its advantages, its PPO mini- and
micro-batches, the policy's per-token log-probs, and the loss of one micro-batch.

Nothing here holds state between steps or knows about processes beyond a ``rank`` / ``world`` pair:
:class:`ragen_trainer.trainer.StarPOTrainer` drives these functions in the order of the paper's algorithm. Every count
(mini-batches, micro-batches, rows) is taken from the batch in hand, so a step that keeps more or fewer trajectories
than the config's nominal ``env_groups x group_size`` (self-play's two seats, uneven groups) is trained whole.

Shapes: a batch of ``B`` trajectories is padded to the longest, ``W = max(len(input_ids)) - 1`` *action positions*
(position ``t`` predicts token ``t + 1``); every per-token tensor is ``[B, W]`` and ``mask`` is 1 on the model's own
tokens.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ragen_trainer.advantages import bilevel_gae_advantages, gae_advantages, grpo_advantages, masked_whiten
from ragen_trainer.critic import PolicyWithCritic
from ragen_trainer.losses import agg_loss, kl_penalty, policy_loss, row_normalizers, value_loss
from ragen_trainer.packing import PackedBatch, pack
from ragen_trainer.rollout import placed_rewards
from ragen_trainer.trajectory import Trajectory


def pad_rows(rows: Sequence[Sequence[float]], width: int, value: float, dtype: torch.dtype) -> torch.Tensor:
    """``rows`` as one ``[len(rows), width]`` tensor, each row cut or padded with ``value`` on the right."""
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            n = min(len(row), width)
            out[i, :n] = torch.tensor(list(row[:n]), dtype=dtype)
    return out


def action_mask(trajs: Sequence[Trajectory], width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """1 on the action positions whose next token the model wrote (``loss_mask`` shifted by one)."""
    return pad_rows([t.loss_mask[1:] for t in trajs], width, 0, dtype)


def reply_mask(trajs: Sequence[Trajectory], width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """1 on the action positions that predict a token of the model's own replies (``turn_spans``), whatever
    ``loss_mask`` trains: under the paper's ``after_system`` mask the trained positions also cover the environment's
    text, whose entropy says nothing about how varied the replies are (the Echo Trap's signal)."""
    out = torch.zeros((len(trajs), width), dtype=dtype)
    for i, traj in enumerate(trajs):
        for start, end in traj.turn_spans:
            lo, hi = max(start - 1, 0), min(end - 1, width)
            if hi > lo:
                out[i, lo:hi] = 1
    return out


def turn_ends(traj: Trajectory) -> list[int]:
    """Action positions (``input_ids`` index - 1) of the last token of each reply."""
    return [end - 2 for start, end in traj.turn_spans if end - start >= 1 and end >= 2]


def _on_mask(mask: torch.Tensor, entries: torch.Tensor) -> torch.Tensor:
    """``entries`` (one per nonzero of ``mask``, in row-major order) laid out as ``mask``'s shape, zero off it."""
    return torch.zeros(mask.shape, dtype=entries.dtype, device=entries.device).masked_scatter(mask, entries)


def token_values(policy: PolicyWithCritic, inputs: PackedBatch, mask: torch.Tensor) -> torch.Tensor:
    """The critic's values at the action positions of ``mask`` (``[B, W]`` float32, zero off it), without the
    policy's LM head (and, for a separate value model, without the policy at all)."""
    values = policy.values(inputs.model_inputs())
    return _on_mask(mask.bool(), values[inputs.select].float()[inputs.gather])


def token_logprobs(
    policy: PolicyWithCritic, inputs: PackedBatch, mask: torch.Tensor, *, temperature: float, entropy: bool,
    values: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Per action position of ``mask`` (``[B, W]``: token ``t + 1`` given tokens ``<= t``, for the trajectories
    ``inputs`` packs): the log-prob at the sampling temperature, the entropy, and the critic's value; each ``[B, W]``
    float32, zero off ``mask``.

    Only the positions the model is trained on go through the LM head and the softmax, each once however many rows
    share it, in chunks whose logits are recomputed in the backward pass
    (:meth:`ragen_trainer.critic.PolicyWithCritic.logprobs`), so no ``[tokens, vocab]`` tensor is ever whole; the row
    has no padding and each group's prefix once (:mod:`ragen_trainer.packing`)."""
    sel = mask.bool()
    if int(sel.sum()) != int(inputs.gather.numel()):
        raise ValueError(f"the packed batch has {int(inputs.gather.numel())} trained entries, the mask {int(sel.sum())}")
    scores = policy.logprobs(inputs.model_inputs(), inputs.select, inputs.targets, temperature=temperature,
                             entropy=entropy, values=values)
    # each packed position once -> each trained entry of the batch (a shared prefix's positions serve several rows)
    logp = _on_mask(sel, scores.logprobs[inputs.gather])
    ent = _on_mask(sel, scores.entropy[inputs.gather]) if scores.entropy is not None else None
    vals = _on_mask(sel, scores.values[inputs.select].float()[inputs.gather]) if scores.values is not None else None
    return logp, ent, vals


# ---------------------------------------------------------------------------------------------------- the batch
@dataclass
class TrainingBatch:
    """The kept trajectories of one step with everything the update reads, as ``[B, W]`` float32 tensors."""

    kept: list[Trajectory]
    mask: torch.Tensor
    replies: torch.Tensor
    """The trained positions that predict the model's own replies (:func:`reply_mask` times ``mask``): the rest of
    ``mask`` is the environment's text and the template, trained under ``loss_mask="after_system"``."""
    advantages: torch.Tensor
    returns: torch.Tensor
    """GAE's value targets (zeros under GRPO)."""
    values: torch.Tensor | None
    """The critic's values at scoring time (the value loss is clipped around them); ``None`` without a critic."""
    old_logprobs: torch.Tensor | None
    """Log-probs of the policy that generated the rollouts (scored before any update of this step); ``None`` when
    the step makes a single update, whose own forward gives them (:func:`ppo_loss`)."""
    ref_logprobs: torch.Tensor | None
    """Log-probs of the frozen reference policy (KL), or ``None``."""

    def __len__(self) -> int:
        return len(self.kept)

    def mini_batches(self, size: int) -> list[list[int]]:
        """The rows in order, split into PPO mini-batches of ``size`` (the last may be smaller): verl's
        ``batch.split(ppo_mini_batch_size)``, no shuffle. Every kept trajectory is in exactly one."""
        return [list(range(start, min(start + size, len(self)))) for start in range(0, len(self), size)]


def update_count(kept: int, mini_batch_size: int, epochs: int) -> int:
    """Optimizer steps of a training step: ``epochs * ceil(kept / mini_batch_size)`` (0 when nothing is kept)."""
    return epochs * math.ceil(kept / mini_batch_size)


def compute_advantages(config: Any, kept: list[Trajectory], scores: dict[str, list[list[float]]]
                       ) -> tuple[TrainingBatch, dict[str, float]]:
    """Advantages and returns of the kept batch (the paper's Sec. 3: GAE with the critic, or GRPO's group-normalised
    return), with the in-reward KL applied first when the config asks for it. Returns the batch and its metrics."""
    cfg = config
    width = max(len(t.input_ids) for t in kept) - 1
    mask = action_mask(kept, width)
    ends = [turn_ends(t) for t in kept]
    # Token rewards on action positions (input position - 1); rollout.placed_rewards puts them on reply tokens.
    rewards = pad_rows([placed_rewards(t, cfg.reward_placement)[1:] for t in kept], width, 0.0, torch.float32)
    old = pad_rows(scores["old_logprobs"], width, 0.0, torch.float32) if scores.get("old_logprobs") else None
    ref = pad_rows(scores["ref_logprobs"], width, 0.0, torch.float32) if scores.get("ref_logprobs") else None
    kl_penalty_tokens = torch.zeros_like(mask)
    if cfg.kl_reward_coef > 0 and ref is not None and old is not None:
        # In-reward KL (RLHF's, the reference's kl_ctrl): r_t <- r_t - beta * (log pi_old(a_t) - log pi_ref(a_t)) on
        # every model token, before the advantage, so the critic and GRPO both see the penalised return.
        kl_penalty_tokens = cfg.kl_reward_coef * (old - ref) * mask
        rewards = rewards - kl_penalty_tokens
    values = None
    if cfg.adv_estimator == "grpo":
        returns_traj = torch.tensor([t.reward for t in kept], dtype=torch.float32) - kl_penalty_tokens.sum(dim=1)
        adv_traj = grpo_advantages(returns_traj, [t.group_id for t in kept], norm_by_std=cfg.grpo_norm_by_std)
        advantages = adv_traj[:, None] * mask
        returns = torch.zeros_like(mask)
    else:
        values = pad_rows(scores["values"], width, 0.0, torch.float32) * mask
        if cfg.adv_estimator == "gae":
            advantages, returns = gae_advantages(rewards, values, mask, gamma=cfg.gamma, lam=cfg.lam)
        else:
            advantages, returns = bilevel_gae_advantages(rewards, values, mask, ends, gamma=cfg.gamma, lam=cfg.lam,
                                                         turn_gamma=cfg.turn_gamma, turn_lam=cfg.turn_lam)
        if cfg.whiten_advantages:
            advantages = masked_whiten(advantages, mask)
    n_tok = float(mask.sum())
    metrics = {
        "adv/mean": float((advantages * mask).sum() / max(n_tok, 1.0)),
        "adv/abs_mean": float((advantages.abs() * mask).sum() / max(n_tok, 1.0)),
        "batch/model_tokens": n_tok,
        "reward/kl_penalty": float(kl_penalty_tokens.sum() / max(len(kept), 1)),
    }
    replies = reply_mask(kept, width) * mask
    metrics.update(context_advantage_metrics(advantages, mask, replies))
    if values is not None:
        metrics["critic/values_mean"] = float((values * mask).sum() / max(n_tok, 1.0))
        metrics["critic/returns_mean"] = float((returns * mask).sum() / max(n_tok, 1.0))
    batch = TrainingBatch(kept=kept, mask=mask, replies=replies, advantages=advantages, returns=returns,
                          values=values, old_logprobs=old, ref_logprobs=ref)
    return batch, metrics


def context_advantage_metrics(advantages: torch.Tensor, mask: torch.Tensor, replies: torch.Tensor) -> dict[str, float]:
    """Where the advantage falls: its mean over the trained positions that predict the model's own replies
    (``adv/reply_mean``) and over those that predict the rest, the environment's text and the template
    (``adv/context_mean``, with their share of the trained tokens, ``batch/context_token_share``; only under a loss
    mask that trains them, the paper's ``after_system``).

    Why it is watched: the policy gradient ``A_t * grad log pi(x_t)`` has zero mean over tokens the policy sampled,
    whatever constant ``A_t`` carries, but not over text it did not write. On the environment's tokens a nonzero
    ``adv/context_mean`` moves their likelihood directly: below zero it pushes the observations' likelihood down. Under
    GRPO's trajectory-level advantage it is below zero whenever failing episodes are the longer ones (more turns, more
    observation tokens), as on FrozenLake: ``docs/learning.md``, "Why vanilla GRPO fell off"."""
    context = mask - replies
    n_reply, n_context, n_tok = float(replies.sum()), float(context.sum()), float(mask.sum())
    out = {"adv/reply_mean": float((advantages * replies).sum() / max(n_reply, 1.0))}
    if n_context > 0:
        out["adv/context_mean"] = float((advantages * context).sum() / n_context)
        out["batch/context_token_share"] = n_context / max(n_tok, 1.0)
    return out


# ------------------------------------------------------------------------------------------------ micro-batches
def micro_batches(batch: TrainingBatch, members: list[int], *, micro_batch_size: int, rank: int, world: int,
                  agg_mode: str, micro_size: int, share_prefixes: bool = True) -> list[dict[str, Any]]:
    """This process's micro-batches of one mini-batch (``members``: row indices of ``batch``).

    The rows are split into ``world`` contiguous shares (so a group's rollouts stay together and share their
    prefix), then each process's share into the same number of micro-batches everywhere
    (``ceil(len(members) / (world * micro_batch_size))``), so DDP's all-reduces meet; a process left without rows for
    a micro-batch gets a zero-weight one. Each micro-batch is packed (:func:`ragen_trainer.packing.pack`) and
    carries the loss ``normalizer``, one per row (:func:`ragen_trainer.losses.row_normalizers` over the whole
    mini-batch, in its order: its token count for ``token-mean``, its sequence count for the ``seq-mean`` modes, the
    token count of the row's loss micro-batch of ``micro_size`` rows times their number for ``micro-token-mean``),
    divided by ``world`` -- each process divides by its share and DDP averages over processes, so the summed gradient
    is exactly that of the mini-batch's loss, whatever ``micro_batch_size`` is."""
    mine = [int(i) for i in np.array_split(np.array(members, dtype=np.int64), world)[rank]]
    norms = row_normalizers(batch.mask[members], agg_mode, world=world, micro_size=micro_size).clamp(min=1e-8)
    norm_of = {member: norms[k] for k, member in enumerate(members)}
    count = max(1, math.ceil(len(members) / (world * micro_batch_size)))
    out = []
    for chunk in (list(c) for c in np.array_split(np.array(mine, dtype=np.int64), count)):
        weight = 1.0
        if not chunk:  # nothing left for this micro-batch: a zero-weight one keeps DDP's collectives in step
            chunk, weight = [mine[0] if mine else members[0]], 0.0
        chunk = [int(i) for i in chunk]
        trajs = [batch.kept[i] for i in chunk]
        width = max(len(t.input_ids) for t in trajs) - 1

        def rows(t: torch.Tensor | None, _chunk: list[int] = chunk, _w: int = width) -> torch.Tensor | None:
            return None if t is None else t[_chunk, :_w].clone()

        mask = rows(batch.mask) * weight
        out.append({
            "rows": chunk,
            "packed": pack(trajs, mask, share_prefixes=share_prefixes),
            "mask": mask,
            "reply_mask": rows(batch.replies) * weight,
            "advantages": rows(batch.advantages),
            "returns": rows(batch.returns),
            "old_values": rows(batch.values),
            "old_logprobs": rows(batch.old_logprobs),
            "ref_logprobs": rows(batch.ref_logprobs),
            "normalizer": torch.stack([norm_of[i] for i in chunk]),
        })
    return out


# ---------------------------------------------------------------------------------------------------- the loss
def ppo_loss(config: Any, policy: PolicyWithCritic, micro: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
    """The StarPO loss of one micro-batch (pre-normalised: the micro-batches of a mini-batch sum to its mean):

        L = L_clip(pi)  -  entropy_coef * H(pi)  [+ kl_coef * KL(pi || pi_ref)]  [+ value_loss_coef * L_V]

    with ``L_clip`` PPO's clipped surrogate with decoupled and dual clipping (:func:`ragen_trainer.losses.
    policy_loss`), ``H`` the token entropy, and ``L_V`` the clipped value loss of the critic. Returns the loss and
    this micro-batch's statistics for :class:`UpdateStats`."""
    cfg = config
    mask, norm = micro["mask"], micro["normalizer"]
    logp, ent, values = token_logprobs(policy, micro["packed"], mask > 0, temperature=cfg.temperature, entropy=True,
                                       values=cfg.use_critic)
    # A step with one update scores nothing beforehand: the policy that made the rollouts is this forward's, so the
    # old log-probs are its own, detached (exactly; TRL's num_iterations=1 shortcut). Otherwise the scoring pass's.
    old = micro["old_logprobs"] if micro["old_logprobs"] is not None else logp.detach()
    losses = cfg.loss_settings()
    pg, pg_stats = policy_loss(logp, old, micro["advantages"], mask, losses, normalizer=norm)
    ent_loss = agg_loss(ent, mask, losses.loss_agg_mode, norm)
    loss = pg - cfg.entropy_coef * ent_loss
    n_tok = float(mask.sum())
    stats = {"sum:loss/policy": float(pg.detach()), "sum:policy/entropy": float(ent_loss.detach()), "tokens": n_tok}
    replies = micro.get("reply_mask")
    if replies is not None and ent is not None:  # the replies' own entropy, what the Echo Trap monitor watches
        stats["reply:policy/reply_entropy"] = float((ent.detach() * replies).sum())
        stats["reply_tokens"] = float(replies.sum())
    if micro.get("ref_logprobs") is not None and cfg.kl_coef > 0:
        kl = agg_loss(kl_penalty(logp, micro["ref_logprobs"], losses.kl_estimator), mask, losses.loss_agg_mode, norm)
        loss = loss + cfg.kl_coef * kl
        stats["sum:policy/kl"] = float(kl.detach())
    if micro.get("ref_logprobs") is not None and replies is not None:
        # log pi - log pi_ref apart for the replies and for the trained text the policy did not write (the env's,
        # under after_system): a policy that unlearns its observations shows it here first (context_advantage_metrics)
        log_ratio = (logp.detach() - micro["ref_logprobs"]) * (mask > 0)
        context = mask - replies
        stats["reply:policy/log_ratio_replies"] = float((log_ratio * replies).sum())
        stats["context:policy/log_ratio_context"] = float((log_ratio * context).sum())
        stats["context_tokens"] = float(context.sum())
    if values is not None:
        vf, vf_stats = value_loss(values, micro["old_values"], micro["returns"], mask, losses, normalizer=norm)
        loss = loss + cfg.value_loss_coef * vf
        stats["sum:loss/value"] = float(vf.detach())
        stats["tok:critic/vf_clipfrac"] = float(vf_stats["vf_clipfrac"]) * n_tok
    for k in ("clipfrac", "clipfrac_high", "clipfrac_low", "clipfrac_dual", "approx_kl", "ratio_mean"):
        stats["tok:policy/" + k] = float(pg_stats[k]) * n_tok
    if n_tok > 0:
        stats["min:policy/ratio_min"] = float(pg_stats["ratio_min"])
        stats["max:policy/ratio_max"] = float(pg_stats["ratio_max"])
    return loss, stats


class UpdateStats:
    """A step's loss statistics, collected per micro-batch and reduced over updates and processes.

    Keys say how a value is reduced: ``sum:`` values are pre-normalised shares of an update's mean (summed over its
    micro-batches and processes, then averaged over the step's updates), ``tok:`` values are token-weighted sums
    (divided by the step's model tokens), ``reply:`` values are sums over reply tokens (divided by the step's reply
    tokens), ``context:`` values sums over the other trained tokens (divided by their count; left out when there are
    none), ``min:`` / ``max:`` are extremes, ``mean:`` values are the same on every
    process (gradient norms after the all-reduce) and averaged over the step's updates."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = defaultdict(list)

    def add(self, stats: dict[str, float]) -> None:
        for key, value in stats.items():
            self._values[key].append(value)

    def reduce(self, accelerator: Any, updates: int) -> dict[str, float]:
        """The step's metrics; a collective: every process must call it (with the same keys)."""
        values = self._values
        keys = sorted(k for k in values if k.split(":", 1)[0] in ("sum", "tok", "reply", "context"))
        world = accelerator.num_processes
        local = torch.tensor([sum(values[k]) for k in keys]
                             + [sum(values["tokens"]), sum(values["reply_tokens"]), sum(values["context_tokens"])],
                             dtype=torch.float64, device=accelerator.device)
        total = accelerator.reduce(local, reduction="sum") if world > 1 else local
        counts = {"tok": float(total[-3]), "reply": float(total[-2]), "context": float(total[-1])}
        out: dict[str, float] = {}
        for i, key in enumerate(keys):
            kind, name = key.split(":", 1)
            if kind == "context" and counts["context"] == 0:
                continue  # no trained text outside the replies (loss_mask="replies"): nothing to average
            # sum: each process holds its share of a global mean (normalised by the global count / world)
            out[name] = (float(total[i]) / world / max(updates, 1) if kind == "sum"
                         else float(total[i]) / max(counts[kind], 1))
        extremes = torch.tensor([min(values["min:policy/ratio_min"], default=math.inf),
                                 max(values["max:policy/ratio_max"], default=-math.inf)], dtype=torch.float64,
                                device=accelerator.device)  # fmt: skip
        if world > 1:
            extremes = accelerator.gather(extremes).view(world, 2)
            extremes = torch.stack([extremes[:, 0].min(), extremes[:, 1].max()])
        if math.isfinite(float(extremes[0])):
            out["policy/ratio_min"] = float(extremes[0])
            out["policy/ratio_max"] = float(extremes[1])
        for key in (k for k in values if k.startswith("mean:")):
            out[key.split(":", 1)[1]] = sum(values[key]) / len(values[key])
        return out


__all__ = [
    "TrainingBatch",
    "UpdateStats",
    "action_mask",
    "compute_advantages",
    "context_advantage_metrics",
    "micro_batches",
    "pad_rows",
    "ppo_loss",
    "reply_mask",
    "token_logprobs",
    "token_values",
    "turn_ends",
    "update_count",
]
