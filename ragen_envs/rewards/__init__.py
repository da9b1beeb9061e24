"""Reasoning-aware reward wrappers (the paper's Finding 3), pluggable and composable.

Each wrapper adds a per-turn bonus to an LLM-facing env's reward and reports it in ``info["reward_parts"][name]``
(details in ``info["reward_details"][name]``), so training logs show every part:

==================  ========================================================================================
``format``          :class:`FormatReward`: + for a well-formed reply with valid actions (and a non-empty think)
``grounding``       :class:`ReasoningGroundingReward`: + per true claim about the state in ``<think>``, - per false one
``thinking_length`` :class:`ThinkingLengthReward`: + for thinking up to a target length, nothing for padding
==================  ========================================================================================

Use them by name when making an env, or wrap one yourself::

    env = gymnasium.make("ragen/FrozenLake-v0", reward_wrappers=["format", {"name": "grounding", "per_supported": 0.1}])
    env = ReasoningGroundingReward(gymnasium.make("ragen/FrozenLake-v0"))

Add your own by subclassing :class:`RewardShaping` and calling :func:`register_reward`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium as gym

from ragen_envs.rewards.base import RewardShaping, find_protocol
from ragen_envs.rewards.format import FormatReward
from ragen_envs.rewards.grounding import ReasoningGroundingReward
from ragen_envs.rewards.thinking import ThinkingLengthReward, padding_stats

#: Name -> wrapper class; names are what ``reward_wrappers=[...]`` accepts.
REWARD_WRAPPERS: dict[str, type[RewardShaping]] = {
    "format": FormatReward,
    "grounding": ReasoningGroundingReward,
    "reasoning_grounding": ReasoningGroundingReward,
    "thinking_length": ThinkingLengthReward,
    "think_length": ThinkingLengthReward,
}


def register_reward(name: str, cls: type[RewardShaping]) -> None:
    """Make ``cls`` available as ``reward_wrappers=[name]``."""
    if not (isinstance(name, str) and name.strip()):
        raise ValueError(f"invalid argument name={name!r}: expected a non-empty str")
    if not (isinstance(cls, type) and issubclass(cls, RewardShaping)):
        raise ValueError(f"invalid argument cls={cls!r}: expected a subclass of RewardShaping")
    REWARD_WRAPPERS[name] = cls


def _used_names(env: gym.Env) -> set[str]:
    names: set[str] = set()
    current: Any = env
    while current is not None:
        if isinstance(current, RewardShaping):
            names.add(current.name)
        current = getattr(current, "env", None)
    return names


def wrap_rewards(env: gym.Env, specs: Iterable[str | Mapping[str, Any] | type[RewardShaping]] | str) -> gym.Env:
    """Wrap ``env`` in the reward wrappers ``specs``, innermost first.

    A spec is a registered name (``"grounding"``), a dict ``{"name": ..., **kwargs}`` (``"part_name"`` sets the
    ``reward_parts`` key) or a :class:`RewardShaping` subclass. Two wrappers of the same kind get distinct
    ``reward_parts`` keys (``grounding``, ``grounding_2``). Unknown names and bad keyword arguments raise
    ``ValueError`` naming what is accepted.
    """
    if isinstance(specs, (str, Mapping)) or (isinstance(specs, type) and issubclass(specs, RewardShaping)):
        specs = [specs]  # type: ignore[list-item]
    known = ", ".join(sorted(REWARD_WRAPPERS))
    for spec in specs:  # type: ignore[union-attr]
        if isinstance(spec, str):
            name, kwargs = spec, {}
        elif isinstance(spec, Mapping):
            kwargs = dict(spec)
            name = kwargs.pop("name", None)
        elif isinstance(spec, type) and issubclass(spec, RewardShaping):
            name, kwargs = spec, {}
        else:
            raise ValueError(
                f"invalid argument reward_wrappers item {spec!r}: expected a name ({known}), "
                "a dict with a 'name' key, or a RewardShaping subclass"
            )
        if isinstance(name, type):
            cls = name
        elif isinstance(name, str) and name in REWARD_WRAPPERS:
            cls = REWARD_WRAPPERS[name]
        else:
            raise ValueError(f"invalid argument reward_wrappers: unknown reward wrapper {name!r}; known: {known}")
        # The reward_parts key: "part_name" if given, else the class's default; made unique in the chain.
        part = kwargs.pop("part_name", None) or cls.default_name
        used = _used_names(env)
        unique, k = part, 2
        while unique in used:
            unique, k = f"{part}_{k}", k + 1
        kwargs["name"] = unique
        try:
            env = cls(env, **kwargs)
        except TypeError as exc:  # unknown keyword: say which wrapper and what it accepts
            raise ValueError(f"invalid argument reward_wrappers: bad keyword for {cls.__name__}: {exc}") from None
    return env


__all__ = [
    "REWARD_WRAPPERS",
    "FormatReward",
    "ReasoningGroundingReward",
    "RewardShaping",
    "ThinkingLengthReward",
    "find_protocol",
    "padding_stats",
    "register_reward",
    "wrap_rewards",
]
