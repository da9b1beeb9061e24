"""ReasoningGroundingReward: reward thinking whose claims about the state are true, penalise hallucinated ones."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from ragen_envs.core import BaseTextEnv, check_arg
from ragen_envs.rewards.base import RewardShaping


class ReasoningGroundingReward(RewardShaping):
    """Check what ``<think>`` claims about the state against the env's structured state (the paper's Finding 3).

    Before each turn the wrapper captures ``env.unwrapped.state_view()`` -- the state the model saw when it wrote the
    reply. After the turn it asks ``env.unwrapped.check_reasoning(think, view_before, actions)`` to count the claims it
    can verify (FrozenLake/Sokoban: positions of the player, goal, holes, boxes and what a move leads to; Bandit: which
    arm is the risky one; Countdown: arithmetic such as ``25 - 5 = 20``).

    What it rewards: ``per_supported`` for each distinct supported claim, at most ``max_bonus`` a turn and only when the
    reply was well-formed; it subtracts ``per_contradicted`` for each contradicted (hallucinated) claim, at most
    ``max_penalty`` a turn, whatever the format. Thinking that makes no checkable claim gets 0, so the wrapper never
    pays for length alone; the cap keeps lists of true but useless facts from paying more than ``max_bonus``.

    Args:
        per_supported / max_bonus: credit per supported claim and its cap per turn (>= 0).
        per_contradicted / max_penalty: cost per contradicted claim and its cap per turn (>= 0).
        weight, name: see :class:`~ragen_envs.rewards.base.RewardShaping`.
    """

    default_name = "grounding"

    def __init__(
        self,
        env: gym.Env,
        *,
        per_supported: float = 0.05,
        max_bonus: float = 0.2,
        per_contradicted: float = 0.1,
        max_penalty: float = 0.3,
        weight: float = 1.0,
        name: str | None = None,
    ) -> None:
        super().__init__(env, weight=weight, name=name)
        for arg, value in (
            ("per_supported", per_supported),
            ("max_bonus", max_bonus),
            ("per_contradicted", per_contradicted),
            ("max_penalty", max_penalty),
        ):
            check_arg(
                isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
                arg,
                value,
                "a number >= 0",
            )
        check_arg(isinstance(env.unwrapped, BaseTextEnv), "env", type(env.unwrapped).__name__, "a ragen_envs text env")
        self.per_supported, self.max_bonus = float(per_supported), float(max_bonus)
        self.per_contradicted, self.max_penalty = float(per_contradicted), float(max_penalty)

    def before_step(self, action: str) -> dict[str, Any]:
        return self.env.unwrapped.state_view()  # type: ignore[attr-defined]

    def compute(self, action: str, info: dict[str, Any], context: Any) -> tuple[float, dict[str, Any]]:
        think = str(info.get("think", ""))
        if not think.strip():
            return 0.0, {"supported": 0, "contradicted": 0}
        counts = self.env.unwrapped.check_reasoning(think, context, list(info.get("actions", [])))  # type: ignore[attr-defined]
        supported, contradicted = int(counts.get("supported", 0)), int(counts.get("contradicted", 0))
        credit = min(self.max_bonus, self.per_supported * supported) if info.get("format_ok", False) else 0.0
        cost = min(self.max_penalty, self.per_contradicted * contradicted)
        return credit - cost, {"supported": supported, "contradicted": contradicted}
