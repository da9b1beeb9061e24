"""The data a multi-turn rollout produces and the trainer consumes.

One :class:`Trajectory` is one episode of one model on one env from one initial state (its ``seed``). ``input_ids``
hold the whole conversation as the model saw it (system prompt, user turns, the model's replies), and ``loss_mask`` is
1 on the trained tokens: exactly the replies' tokens under ``loss_mask="replies"`` (environment text never trained; TRL
calls it ``env_mask``), or every token after the system prompt under ``"after_system"`` (the paper's runs; see
:mod:`ragen_trainer.rollout`). ``turn_spans`` mark the replies in both. Which ids a reply has is the rollout's ``reply_tokens`` (:mod:`ragen_trainer.rollout`): by default
the reference's cleaned reply re-tokenised, generation prefix included; or the sampled ids, verbatim. A :class:`RolloutBatch` holds P initial states x N rollouts each, grouped by ``group_id``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Trajectory:
    """One multi-turn episode, tokenised."""

    group_id: int
    """Index of the initial state within the batch; the N rollouts of one initial state share it."""
    seed: int
    """The env seed that made the initial state."""
    env_id: str
    messages: list[dict[str, str]]
    """The chat: system, user, assistant, user, assistant, ... (the last user message may be the final observation).
    Assistant messages hold the replies as trained (cleaned under ``reply_tokens="cleaned"``; ``replies`` hold what
    the env received)."""
    input_ids: list[int]
    """The conversation's token ids: prompt tokens from the chat template and each reply's trained ids (the cleaned
    reply re-tokenised, or the sampled ids verbatim; see ``reply_tokens`` in :mod:`ragen_trainer.rollout`)."""
    loss_mask: list[int]
    """1 on the trained positions. ``loss_mask="replies"``: each reply's trained ids (the end-of-turn token
    included; the generation prefix too under ``reply_tokens="cleaned"``), 0 on everything else.
    ``"after_system"``: every position after the system turn's first successor (the paper's runs)."""
    turn_spans: list[tuple[int, int]]
    """``[start, end)`` of each assistant reply in ``input_ids`` (under ``loss_mask="replies"`` exactly the positions
    where ``loss_mask`` is 1); turn-level rewards and advantages use each span's last token."""
    turn_rewards: list[float]
    """The env's reward for each turn (format penalties and shaping included)."""
    success: bool
    replies: list[str]
    infos: list[dict[str, Any]]
    """The env's ``info`` after each turn (the info contract of ``ragen_envs``), whole: ``reward_parts`` and the reward
    wrappers' ``reward_details`` included (:attr:`reward_parts`, :attr:`reward_details`)."""
    old_logprobs: list[float] | None = None
    """Per-token log-probabilities under the sampling policy, aligned with ``input_ids`` (0.0 where the mask is 0);
    ``None`` when the engine does not report them or when the trained ids are not the sampled ones
    (``reply_tokens="cleaned"``: re-tokenised text and the generation prefix have no sampling log-probs). The trainer
    does not read them: it scores every kept trajectory with a forward pass for its old log-probs."""
    truncated: bool = False
    """The episode hit the turn/action/context limit rather than ending by itself."""
    finish_reasons: list[str] = field(default_factory=list)
    """Per turn, why the reply ended: ``"stop"`` (end-of-turn token) or ``"length"`` (token limit or context)."""
    eval_only: bool = False
    """``True`` when the replies came from a chat engine (an HTTP API): ``input_ids`` then come from re-tokenising
    the reply text, not from the sampler, so the trajectory is for evaluation, never for training."""
    tags: dict[str, Any] = field(default_factory=dict)
    """What else identifies the episode, for metrics: self-play sets ``seat``, ``opponent`` and ``game``
    (:mod:`ragen_trainer.selfplay`); empty for single-agent rollouts."""

    @property
    def reward(self) -> float:
        """The trajectory return R(tau): the sum of its turn rewards."""
        return float(sum(self.turn_rewards))

    @property
    def reward_parts(self) -> list[dict[str, float]]:
        """Per turn, the env's split of that turn's reward (``info["reward_parts"]``: ``env``, ``format_penalty`` and
        one entry per reward wrapper); each turn's parts sum to its reward. Read from :attr:`infos`, which keep every
        turn's whole ``info``, so nothing is stored twice."""
        return [{str(k): float(v) for k, v in (info.get("reward_parts") or {}).items()} for info in self.infos]

    @property
    def reward_details(self) -> list[dict[str, Any]]:
        """Per turn, what each reward wrapper saw (``info["reward_details"]``, by part name), e.g. the grounding
        wrapper's ``{"supported": 2, "contradicted": 0}``; ``{}`` on turns of an env without wrappers."""
        return [dict(info.get("reward_details") or {}) for info in self.infos]

    @property
    def num_turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def num_model_tokens(self) -> int:
        """Tokens of the model's replies (``turn_spans``), whichever positions ``loss_mask`` trains."""
        return int(sum(end - start for start, end in self.turn_spans))


@dataclass
class RolloutBatch:
    """All trajectories of one training step, with timing and bookkeeping."""

    trajectories: list[Trajectory]
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent, e.g. ``{"generation": ..., "environment": ..., "tokenization": ...}``."""
    metrics: dict[str, float] = field(default_factory=dict)
    """What the collector itself reports beside the trajectories (e.g. the self-play snapshot the games drew)."""

    def groups(self) -> dict[int, list[Trajectory]]:
        """Trajectories by ``group_id`` (initial state), in batch order."""
        out: dict[int, list[Trajectory]] = {}
        for traj in self.trajectories:
            out.setdefault(traj.group_id, []).append(traj)
        return out

    def __len__(self) -> int:
        return len(self.trajectories)
