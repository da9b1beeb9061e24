"""FormatReward: a bonus for a well-formed turn (the paper's format reward)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from ragen_envs.core import check_arg
from ragen_envs.rewards.base import RewardShaping, find_protocol


class FormatReward(RewardShaping):
    """Reward replies in the required format.

    What it rewards: ``reward`` (default +0.1) on a turn whose reply parsed (``info["format_ok"]``), named only valid
    actions (``info["action_is_valid"]``) and, when thinking is required, has a non-empty ``<think>`` block. Any other
    turn gets ``-penalty`` (default 0, because the protocol already applies its -0.1 format penalty; set it to make
    format errors cost more).

    Args:
        reward: bonus of a well-formed turn (>= 0).
        penalty: cost of a malformed turn (>= 0), on top of the protocol's format penalty.
        require_think: demand a non-empty ``<think>``; ``None`` follows the protocol's ``enable_think``.
        weight, name: see :class:`~ragen_envs.rewards.base.RewardShaping`.
    """

    default_name = "format"

    def __init__(
        self,
        env: gym.Env,
        *,
        reward: float = 0.1,
        penalty: float = 0.0,
        require_think: bool | None = None,
        weight: float = 1.0,
        name: str | None = None,
    ) -> None:
        super().__init__(env, weight=weight, name=name)
        for arg, value in (("reward", reward), ("penalty", penalty)):
            check_arg(
                isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
                arg,
                value,
                "a number >= 0",
            )
        check_arg(
            require_think is None or isinstance(require_think, bool),
            "require_think",
            require_think,
            "None, True or False",
        )
        if require_think is None:
            try:
                require_think = find_protocol(env).enable_think
            except ValueError:  # a bare env without the protocol: thinking is expected, as the protocol's default
                require_think = True
        self.reward = float(reward)
        self.penalty = float(penalty)
        self.require_think = require_think

    def compute(self, action: str, info: dict[str, Any], context: Any) -> tuple[float, dict[str, Any]]:
        problems = []
        if not info.get("format_ok", False):
            problems.append("malformed reply")
        elif not info.get("action_is_valid", False):
            problems.append("invalid action")
        if self.require_think and not str(info.get("think", "")).strip():
            problems.append("empty <think>")
        if problems:
            return -self.penalty, {"ok": False, "problems": problems}
        return self.reward, {"ok": True, "problems": []}
