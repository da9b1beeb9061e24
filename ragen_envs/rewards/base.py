"""The base of every reward wrapper: compute a bonus per turn, add it to the reward and to ``info["reward_parts"]``."""

from __future__ import annotations

import math
from typing import Any, ClassVar, SupportsFloat

import gymnasium as gym

from ragen_envs.core import check_arg
from ragen_envs.protocol import find_protocol  # noqa: F401  (re-exported by ragen_envs.rewards)


class RewardShaping(gym.Wrapper[str, str, str, str]):
    """Add a per-turn bonus to the reward of an LLM-facing env (a :class:`TurnProtocol`, possibly wrapped again).

    Subclasses implement :meth:`compute` (and may override :meth:`before_step` to capture what the inner step will
    change, such as the state the reasoning was written in). Each turn the wrapper

    * adds ``weight * bonus`` to the reward,
    * writes it to ``info["reward_parts"][name]`` (so the parts still sum to the reward),
    * writes what it saw to ``info["reward_details"][name]`` (claim counts, word counts, why no credit was given),

    and gives nothing on a step after the episode ended. Wrappers compose: each adds its own part. The observation
    text (``"Reward: ..."``) is the protocol's and shows the env reward without the bonuses.

    Args:
        env: the LLM-facing env.
        weight: multiplies the bonus (``0`` turns the wrapper into a logger of its details).
        name: the key in ``reward_parts`` (default: the class's :attr:`default_name`).
    """

    default_name: ClassVar[str] = "shaping"

    def __init__(self, env: gym.Env, *, weight: float = 1.0, name: str | None = None) -> None:
        super().__init__(env)
        check_arg(
            isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight),
            "weight",
            weight,
            "a finite number",
        )
        check_arg(
            name is None or (isinstance(name, str) and name.strip() != ""), "name", name, "None or a non-empty str"
        )
        self.weight = float(weight)
        self.name = name or self.default_name
        if self.name in ("env", "format_penalty"):
            raise ValueError(
                f"invalid argument name={self.name!r}: expected a name other than 'env' and 'format_penalty'"
            )
        self._ended = False

    # ------------------------------------------------------------------ hooks
    def before_step(self, action: str) -> Any:
        """Called before the inner step; its return value is passed to :meth:`compute` as ``context``."""
        return None

    def compute(self, action: str, info: dict[str, Any], context: Any) -> tuple[float, dict[str, Any]]:
        """The bonus of this turn (before ``weight``) and details for ``info["reward_details"]``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self._ended = False
        info["reward_parts"] = {**info.get("reward_parts", {}), self.name: 0.0}
        return observation, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._ended:
            observation, reward, terminated, truncated, info = self.env.step(action)
            bonus, details = 0.0, {"skipped": "the episode has ended"}
        else:
            context = self.before_step(action)
            observation, reward, terminated, truncated, info = self.env.step(action)
            raw, details = self.compute(action, info, context)
            bonus = self.weight * float(raw)
            self._ended = bool(terminated or truncated)
        info["reward_parts"] = {**info.get("reward_parts", {}), self.name: bonus}
        info["reward_details"] = {**info.get("reward_details", {}), self.name: details}
        return observation, float(reward) + bonus, terminated, truncated, info
