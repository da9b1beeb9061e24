"""The turn protocol: the one wrapper that turns any :class:`~ragen_envs.core.BaseTextEnv` into an LLM-facing env.

One ``step`` is one *turn*: the action is the model's whole reply, for example::

    <think>The box is left of me, the target below it.</think><answer>Left || Down</answer>

The protocol parses the reply (:func:`ragen_envs.parsing.parse_reply`), executes up to ``actions_per_turn`` of its
actions in order on the inner env (stopping at the episode's end or when ``max_actions_per_episode`` is spent), sums
their rewards, and adds ``format_penalty`` when the reply was malformed or named an invalid action, with the reason in
``info["reason"]``. The observation is the next user message, built like the reference code's prompt
(state, actions left, the required format), so a trainer and any agent see the same text.

Spaces: ``UnicodeText`` for both; the action is the reply text (any length is accepted).

Episode end: ``terminated`` when the inner env terminates (solved, fell in a hole, bought an item, bandit pulled);
``truncated`` after ``max_turns`` turns, once ``max_actions_per_episode`` actions have been executed, or when the inner
env truncates (e.g. Sokoban's ``max_steps``; the turn's remaining actions are then dropped).

Info: the :data:`~ragen_envs.core.INFO_KEYS` contract plus ``reason`` (``None`` or why the penalty applied),
``turn``, ``actions_left``, ``invalid_actions``, ``dropped_actions`` (beyond ``actions_per_turn``), the env's extra
keys from its last executed step, and on ``reset`` the ``system_prompt`` to give the model.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, SupportsFloat

import gymnasium as gym

from ragen_envs.core import INFO_KEYS, BaseTextEnv, check_arg, default_info
from ragen_envs.parsing import ParsedReply, parse_reply
from ragen_envs.spaces import MAX_REPLY_CHARS

#: Keys of an inner step's info that are not the env's extras.
_NOT_EXTRA = frozenset(INFO_KEYS) | {"reason"}

#: Keyword arguments of ``gymnasium.make`` that configure the protocol rather than the env itself.
PROTOCOL_KWARGS: tuple[str, ...] = (
    "actions_per_turn",
    "max_actions_per_episode",
    "max_turns",
    "action_sep",
    "enable_think",
    "format_penalty",
    "max_response_tokens",
)


class TurnProtocol(gym.Wrapper[str, str, str, str]):
    """Parse replies, run several actions per turn, penalise bad format, and write the next prompt.

    Args:
        env: the unwrapped text env.
        actions_per_turn: most actions executed per turn (1 to any N); extra ones are dropped. ``None``: env default.
        max_actions_per_episode: total action budget; the episode is truncated when it is spent. ``None``: env default.
        max_turns: turns before truncation. ``None``: env default.
        action_sep: separator between actions inside ``<answer>``.
        enable_think: require ``<think>...</think>`` before the answer; when off, bare actions are accepted too.
        format_penalty: reward added (normally negative) on a turn whose reply is malformed or names an invalid action.
        max_response_tokens: the length hint written into each prompt (the reference's response length).
    """

    def __init__(
        self,
        env: BaseTextEnv,
        *,
        actions_per_turn: int | None = None,
        max_actions_per_episode: int | None = None,
        max_turns: int | None = None,
        action_sep: str = "||",
        enable_think: bool = True,
        format_penalty: float = -0.1,
        max_response_tokens: int = 400,
    ) -> None:
        super().__init__(env)
        base = env.unwrapped
        check_arg(isinstance(base, BaseTextEnv), "env", type(base).__name__, "a ragen_envs BaseTextEnv")
        self.actions_per_turn = _positive_int("actions_per_turn", actions_per_turn, base.default_actions_per_turn)
        self.max_actions_per_episode = _positive_int(
            "max_actions_per_episode", max_actions_per_episode, base.default_max_actions_per_episode
        )
        self.max_turns = _positive_int("max_turns", max_turns, base.default_max_turns)
        check_arg(isinstance(action_sep, str) and action_sep.strip() != "", "action_sep", action_sep, "a non-blank str")
        check_arg(isinstance(enable_think, bool), "enable_think", enable_think, "True or False")
        check_arg(
            isinstance(format_penalty, (int, float))
            and not isinstance(format_penalty, bool)
            and math.isfinite(format_penalty),
            "format_penalty",
            format_penalty,
            "a finite number (the reference uses -0.1)",
        )
        self.max_response_tokens = _positive_int("max_response_tokens", max_response_tokens, 400)
        self.action_sep = action_sep
        self.enable_think = enable_think
        self.format_penalty = float(format_penalty)
        self._turn = 0
        self._actions_left = self.max_actions_per_episode
        self._done = False

    # ------------------------------------------------------------------ prompt text
    @property
    def format_prompt(self) -> str:
        return "<think>...</think><answer>...</answer>" if self.enable_think else "<answer>...</answer>"

    @property
    def system_prompt(self) -> str:
        """The system message for the model: the env's instructions plus the reply format and action budget."""
        base: BaseTextEnv = self.env.unwrapped  # type: ignore[assignment]
        sep = f' "{self.action_sep}" '
        per_turn = (
            f"You can take up to {self.actions_per_turn} actions per turn, separated by{sep}"
            if self.actions_per_turn > 1
            else "Take exactly one action per turn."
        )
        return (
            "You're a helpful assistant. "
            + base.instructions.strip()
            + f"\n{per_turn}\nAlways reply in the format {self.format_prompt}."
        )

    def _turn_prompt(self, state: str, warning: str = "") -> str:
        return (
            f"Turn {self._turn + 1}:\nState:\n{state}\n{warning}"
            f"You have {self._actions_left} actions left. Always output: {self.format_prompt} "
            f"with no extra text. Strictly follow this format. "
            f"Max response length: {self.max_response_tokens} words (tokens).\n"
        )

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        state, inner_info = self.env.reset(seed=seed, options=options)
        self._turn = 0
        self._actions_left = self.max_actions_per_episode
        self._done = False
        info = default_info(success=inner_info.get("success", False))
        info.update({k: v for k, v in inner_info.items() if k not in INFO_KEYS})
        info.update(
            system_prompt=self.system_prompt,
            turn=0,
            actions_left=self._actions_left,
            reason=None,
            invalid_actions=[],
            dropped_actions=[],
        )
        return self._turn_prompt(state), info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        base: BaseTextEnv = self.env.unwrapped  # type: ignore[assignment]
        if self._done:
            info = default_info(
                success=base.is_success(),
                format_ok=False,
                action_is_valid=False,
                reward_parts={"env": 0.0},
            )
            info.update(base.state_info())  # the env's state keys are on every turn's info, this one too
            info.update(
                reason="the episode has ended; call reset()",
                turn=self._turn,
                actions_left=self._actions_left,
                invalid_actions=[],
                dropped_actions=[],
            )
            return base.state_text(), 0.0, False, True, info

        too_long = isinstance(action, str) and len(action) > MAX_REPLY_CHARS
        if too_long:  # cut before parsing so that a runaway reply costs no more than a long one
            action = action[:MAX_REPLY_CHARS]
        parsed: ParsedReply = parse_reply(action, enable_think=self.enable_think, separator=self.action_sep)
        to_run = parsed.actions[: self.actions_per_turn]
        dropped = parsed.actions[self.actions_per_turn :]

        env_reward = 0.0
        env_parts: dict[str, float] = {}
        executed: list[str] = []
        invalid: list[str] = []
        effective = False
        terminated = False
        inner_truncated = False  # the inner env's own limit (e.g. Sokoban's max_steps) ends the episode too
        success = base.is_success()
        extra: dict[str, Any] = {}
        inner_step = self.env.step
        for raw in to_run:
            if terminated or inner_truncated or self._actions_left <= 0:
                dropped.append(raw)
                continue
            _, reward, terminated, inner_truncated, step_info = inner_step(raw)
            if not step_info["action_is_valid"]:
                invalid.append(raw)
                continue
            self._actions_left -= 1
            env_reward += float(reward)
            for key, value in step_info["reward_parts"].items():
                env_parts[key] = env_parts.get(key, 0.0) + float(value)
            executed.extend(step_info["actions"])
            effective = effective or step_info["action_is_effective"]
            success = step_info["success"]
            for key, value in step_info.items():  # the env's extra keys (the last action's values win)
                if key not in _NOT_EXTRA:
                    extra[key] = value

        reason = parsed.reason
        if reason is None and invalid:
            reason = f"invalid action(s) {invalid[:5]}; valid actions: {base.describe_actions()}"
        if too_long:
            cut = f"the reply was cut to its first {MAX_REPLY_CHARS} characters"
            reason = cut if reason is None else f"{cut}; {reason}"
        penalty = self.format_penalty if reason is not None else 0.0

        self._turn += 1
        truncated = not terminated and (inner_truncated or self._turn >= self.max_turns or self._actions_left <= 0)
        self._done = terminated or truncated

        reward_parts = env_parts if env_parts else {"env": 0.0}
        reward_parts["format_penalty"] = penalty
        info: dict[str, Any] = {
            "success": bool(success),
            "format_ok": parsed.format_ok,
            "action_is_valid": parsed.format_ok and not invalid,
            "action_is_effective": effective,
            "actions": executed,
            "think": parsed.think,
            "reward_parts": reward_parts,
        }
        if extra:
            info.update(extra)
        info.update(base.state_info())
        info["reason"] = reason
        info["turn"] = self._turn
        info["actions_left"] = self._actions_left
        info["invalid_actions"] = invalid
        info["dropped_actions"] = dropped
        total = env_reward + penalty
        if self._done:
            observation = f"Reward:\n{total:g}\nThe episode has ended.\nState:\n{base.state_text()}\n"
        else:
            warning = ""
            if reason is not None:
                warning = f"Your last reply was not used in full: {reason}.\n"
            observation = f"Reward:\n{total:g}\n\n" + self._turn_prompt(base.state_text(), warning)
        return observation, total, terminated, truncated, info


def _positive_int(name: str, value: int | None, default: int) -> int:
    if value is None:
        return default
    check_arg(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name, value, "an int >= 1")
    return value


def load_object(path: str) -> Any:
    """Import ``"package.module:Name"`` and return ``Name``."""
    module_name, _, attr = path.partition(":")
    check_arg(bool(module_name and attr), "env_cls", path, "'package.module:ClassName'")
    return getattr(importlib.import_module(module_name), attr)


def make_text_env(
    env_cls: str | type[BaseTextEnv],
    *,
    reward_wrappers: list[str | dict[str, Any]] | tuple[str | dict[str, Any], ...] = (),
    **kwargs: Any,
) -> gym.Env:
    """Build the LLM-facing env: ``env_cls(**env_kwargs)`` inside :class:`TurnProtocol`, then any reward wrappers.

    This is the entry point of every ``ragen/<Name>-v0`` id: ``gymnasium.make`` passes the registered defaults and the
    caller's kwargs here. Protocol kwargs (:data:`PROTOCOL_KWARGS`) go to the protocol, ``reward_wrappers`` names
    wrappers of :mod:`ragen_envs.rewards` (a name, or ``{"name": ..., **kwargs}``), everything else to the env.
    """
    cls = load_object(env_cls) if isinstance(env_cls, str) else env_cls
    protocol_kwargs = {k: kwargs.pop(k) for k in PROTOCOL_KWARGS if k in kwargs}
    env = TurnProtocol(cls(**kwargs), **protocol_kwargs)
    if reward_wrappers:
        from ragen_envs.rewards import wrap_rewards  # only loaded when asked for

        env = wrap_rewards(env, reward_wrappers)
    return env
