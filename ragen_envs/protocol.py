"""The turn protocol: the one wrapper that turns any :class:`~ragen_envs.core.BaseTextEnv` into an LLM-facing env.

One ``step`` is one *turn*: the action is the model's whole reply, for example::

    <think>The box is left of me, the target below it.</think><answer>Left || Down</answer>

The protocol parses the reply (:func:`ragen_envs.parsing.parse_reply`), executes up to ``actions_per_turn`` of its
actions in order on the inner env (stopping at the episode's end or when ``max_actions_per_episode`` is spent), sums
their rewards, and adds ``format_penalty`` when the reply was malformed or named an invalid action, with the reason in
``info["reason"]``. Every setting comes from one :class:`~ragen_envs.settings.ProtocolSettings`.

Messages. ``reset`` returns the first user message and ``info["system_prompt"]``; each ``step`` returns the next user
message. With ``prompt_layout="reference"`` (the default) they are RAGEN's (``ragen/llm_agent/ctx_manager.py``
``get_lm_inputs`` and ``_init_prefix_lookup``)::

    system: "You're a helpful assistant. "
    user:   <env instruction><symbol legend><action list>
            "\\nTurn 1:\\nState:\\n<state>\\nYou have 10 actions left. Always output: <think> [Your thoughts] </think>
            <answer> [your answer] </answer> with no extra text. Strictly follow this format. Max response length:
            100 words (tokens).\\n"
    user:   "Reward:\\n<env reward of the turn>\\n" "\\nTurn 2:\\n" "State:\\n..."

The reward message carries the env's reward only, as in the reference (whose format penalty is kept aside and added
to the episode's score); the ``step`` reward includes the penalty. With ``prompt_layout="ragen"``, the instructions,
the reply format and the action budget are in the system message and a bad reply is explained in the next prompt.

Spaces: ``UnicodeText`` for both; the action is the reply text (any length and any type is accepted; beyond
``max_reply_chars`` it is cut before parsing, and the cut is a format error; a non-``str`` reply is a format error).
Every observation is cut to ``max_observation_chars`` (default :data:`~ragen_envs.spaces.MAX_OBSERVATION_CHARS`),
head and tail kept around ``"\\n[... cut ...]\\n"``, and ``observation_space`` is ``UnicodeText`` of that length, so
observations never leave it; invalid actions are named in ``reason`` by short previews, never echoed whole.

Episode end: ``terminated`` when the inner env terminates (solved, fell in a hole, bought an item, bandit pulled);
``truncated`` after ``max_turns`` turns, once ``max_actions_per_episode`` actions have been executed, or when the inner
env truncates (e.g. Sokoban's ``max_steps``; the turn's remaining actions are then dropped).

Info: the :data:`~ragen_envs.core.INFO_KEYS` contract plus ``reason`` (``None`` or why the penalty applied),
``turn``, ``actions_left``, ``invalid_actions``, ``dropped_actions`` (beyond ``actions_per_turn``), the env's extra
keys from its last executed step and its :meth:`~ragen_envs.core.BaseTextEnv.state_info`, and on ``reset`` the
``system_prompt`` to give the model.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym

from ragen_envs.core import INFO_KEYS, BaseTextEnv, cap_text, check_arg, default_info, preview
from ragen_envs.parsing import ParsedReply, parse_reply
from ragen_envs.settings import ProtocolSettings
from ragen_envs.spaces import UnicodeText

#: Keys of an inner step's info that are not the env's extras.
_NOT_EXTRA = frozenset(INFO_KEYS) | {"reason"}
#: The reference's system message (``ctx_manager.py``), trailing space included.
REFERENCE_SYSTEM_PROMPT = "You're a helpful assistant. "
#: Most invalid actions named in a reason, and the longest preview of each.
_MAX_NAMED_INVALID = 5


class TurnProtocol(gym.Wrapper[str, str, str, str]):
    """Parse replies, run several actions per turn, penalise bad format, and write the next prompt.

    Args:
        env: the unwrapped text env.
        settings: the protocol settings; ``None``: :class:`~ragen_envs.settings.ProtocolSettings` defaults (RAGEN's
            ``base.yaml``). ``gymnasium.make("ragen/<Name>-v0")`` passes the id's reference settings.
        **overrides: individual settings fields applied on top of ``settings`` (e.g. ``actions_per_turn=2``).
    """

    def __init__(self, env: BaseTextEnv, settings: ProtocolSettings | None = None, **overrides: Any) -> None:
        super().__init__(env)
        base = env.unwrapped
        check_arg(isinstance(base, BaseTextEnv), "env", type(base).__name__, "a ragen_envs BaseTextEnv")
        check_arg(
            settings is None or isinstance(settings, ProtocolSettings),
            "settings",
            type(settings).__name__,
            "a ProtocolSettings or None",
        )
        self.settings = (settings or ProtocolSettings()).updated(overrides, where="TurnProtocol arguments")
        # Every observation is cut to max_observation_chars (_cap), so that is the space's bound; it also sizes the
        # shared-memory buffers of an AsyncVectorEnv (ragen_envs.spaces).
        if self.settings.max_observation_chars != env.observation_space.max_length:
            self.observation_space = UnicodeText(self.settings.max_observation_chars)
        self._turn = 0
        self._actions_left = self.settings.max_actions_per_episode
        self._done = False

    # ------------------------------------------------------------------ settings, as attributes agents read
    @property
    def turn_protocol(self) -> TurnProtocol:
        """This wrapper; outer wrappers reach it with ``env.get_wrapper_attr("turn_protocol")``."""
        return self

    @property
    def max_turns(self) -> int:
        return self.settings.max_turns

    @property
    def actions_per_turn(self) -> int:
        return self.settings.actions_per_turn

    @property
    def max_actions_per_episode(self) -> int:
        return self.settings.max_actions_per_episode

    @property
    def action_sep(self) -> str:
        return self.settings.action_sep

    @property
    def enable_think(self) -> bool:
        return self.settings.enable_think

    @property
    def format_penalty(self) -> float:
        return self.settings.format_penalty

    def format_reply(self, actions: list[str], think: str = "") -> str:
        """A well-formed reply carrying ``actions``: ``<think>think</think><answer>a1 || a2</answer>``, without the
        think block when thinking is off (what scripted agents and fixed opponents send)."""
        answer = f" {self.action_sep} ".join(actions)
        if self.enable_think:
            return f"<think>{think}</think><answer>{answer}</answer>"
        return f"<answer>{answer}</answer>"

    # ------------------------------------------------------------------ prompt text
    @property
    def format_prompt(self) -> str:
        """How the reply must look, as the prompt says it."""
        if self.settings.prompt_layout == "reference":
            if self.enable_think:
                return "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
            return "<answer> [your answer] </answer>"
        return "<think>...</think><answer>...</answer>" if self.enable_think else "<answer>...</answer>"

    @property
    def system_prompt(self) -> str:
        """The system message for the model."""
        if self.settings.prompt_layout == "reference":
            return REFERENCE_SYSTEM_PROMPT
        base: BaseTextEnv = self.env.unwrapped  # type: ignore[assignment]
        sep = f' "{self.action_sep}" '
        per_turn = (
            f"You can take up to {self.actions_per_turn} actions per turn, separated by{sep}"
            if self.actions_per_turn > 1
            else "Take exactly one action per turn."
        )
        return (
            REFERENCE_SYSTEM_PROMPT
            + base.instructions.strip()
            + f"\n{per_turn}\nAlways reply in the format {self.format_prompt}."
        )

    def reference_instructions(self) -> str:
        """The env's part of the first user message in the reference layout (``_init_prefix_lookup``): its
        instruction, then the symbol legend and the action list where the reference's env config has them."""
        base: BaseTextEnv = self.env.unwrapped  # type: ignore[assignment]
        text = base.reference_instruction if base.reference_instruction is not None else base.instructions.strip()
        if base.reference_legend:
            text += "\nThe meaning of each symbol in the state is:\n" + ", ".join(
                f"{symbol}: {meaning}" for symbol, meaning in base.reference_legend.items()
            )
        if base.reference_lists_actions:
            text += "\nYour available actions are:\n" + ", ".join(base.action_names)
            text += (
                f"\nYou can make up to {self.max_actions_per_episode} actions, separated by the action separator "
                f'" {self.action_sep} "\n'
            )
        return text

    def _state_text(self) -> str:
        base: BaseTextEnv = self.env.unwrapped  # type: ignore[assignment]
        return base.reference_state_text() if self.settings.prompt_layout == "reference" else base.state_text()

    def _turn_prompt(self, state: str, warning: str = "") -> str:
        """The ``Turn k:`` block: state, actions left, format and length hint."""
        length = f"Max response length: {self.settings.length_hint} words (tokens)."
        if self.settings.prompt_layout == "reference":
            return (
                f"\nTurn {self._turn + 1}:\nState:\n{state}\nYou have {self._actions_left} actions left. "
                f"Always output: {self.format_prompt} with no extra text. Strictly follow this format. {length}\n"
            )
        return (
            f"Turn {self._turn + 1}:\nState:\n{state}\n{warning}"
            f"You have {self._actions_left} actions left. Always output: {self.format_prompt} "
            f"with no extra text. Strictly follow this format. {length}\n"
        )

    def _exact_names(self) -> frozenset[str] | None:
        """The lower-cased action names an answer must match exactly (the reference's ``action_lookup``), or ``None``
        when the env's own parser decides (free-form actions, or ``lenient_actions``)."""
        base: BaseTextEnv = self.env.unwrapped  # type: ignore[assignment]
        if self.settings.lenient_actions or not base.action_names:
            return None
        return frozenset(name.lower() for name in base.action_names)

    def _cap(self, text: str) -> str:
        return cap_text(text, self.settings.max_observation_chars)

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        _, inner_info = self.env.reset(seed=seed, options=options)
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
        if self.settings.prompt_layout == "reference":
            observation = self.reference_instructions() + self._turn_prompt(self._state_text())
        else:
            observation = self._turn_prompt(self._state_text())
        return self._cap(observation), info

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
            return self._cap(self._state_text()), 0.0, False, True, info

        limit = self.settings.max_reply_chars
        too_long = isinstance(action, str) and len(action) > limit
        if too_long:  # cut before parsing so that a runaway reply costs no more than a long one
            action = action[:limit]
        parsed: ParsedReply = parse_reply(
            action, enable_think=self.enable_think, separator=self.action_sep, bare_answers=self.settings.bare_answers
        )
        to_run = parsed.actions[: self.actions_per_turn]
        dropped = parsed.actions[self.actions_per_turn :]

        # The reference sums the executed actions' rewards starting from the int 0 and prints that sum.
        env_reward: float | int = 0
        env_parts: dict[str, float] = {}
        executed: list[str] = []
        invalid: list[str] = []
        effective = False
        terminated = False
        inner_truncated = False  # the inner env's own limit (e.g. Sokoban's max_steps) ends the episode too
        success = base.is_success()
        extra: dict[str, Any] = {}
        inner_step = self.env.step
        exact_names = self._exact_names()
        for raw in to_run:
            if terminated or inner_truncated or self._actions_left <= 0:
                dropped.append(raw)
                continue
            if exact_names is not None and raw.lower() not in exact_names:
                invalid.append(raw)  # not an action name (the reference's lookup); no step is taken
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
            named = [preview(a) for a in invalid[:_MAX_NAMED_INVALID]]
            more = f" and {len(invalid) - _MAX_NAMED_INVALID} more" if len(invalid) > _MAX_NAMED_INVALID else ""
            reason = f"invalid action(s) {named}{more}; valid actions: {base.describe_actions()}"
        if too_long:
            cut = f"the reply was cut to its first {limit} characters"
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
        total = float(env_reward) + penalty
        return self._cap(self._next_observation(env_reward, total, reason)), total, terminated, truncated, info

    def _next_observation(self, env_reward: float | int, total: float, reason: str | None) -> str:
        state = self._state_text()
        if self.settings.prompt_layout == "reference":
            message = f"Reward:\n{env_reward}\n"
            if self._done:  # no model reads this (the reference drops the last state); agents and logs may
                return message + f"\nTurn {self._turn + 1}:\nState:\n{state}\nThe episode has ended.\n"
            return message + self._turn_prompt(state)
        if self._done:
            return f"Reward:\n{total:g}\nThe episode has ended.\nState:\n{state}\n"
        warning = f"Your last reply was not used in full: {reason}.\n" if reason is not None else ""
        return f"Reward:\n{total:g}\n\n" + self._turn_prompt(state, warning)


def find_protocol(env: gym.Env) -> TurnProtocol:
    """The :class:`TurnProtocol` in ``env``'s wrapper chain (``gymnasium.make`` and reward wrappers wrap it).

    ``ValueError`` when ``env`` has none (e.g. an unwrapped :class:`~ragen_envs.core.BaseTextEnv`).
    """
    try:
        protocol = env.get_wrapper_attr("turn_protocol")
    except AttributeError:
        protocol = None
    if not isinstance(protocol, TurnProtocol):
        raise ValueError(f"invalid env {env!r}: expected a ragen LLM-facing env (a TurnProtocol inside)")
    return protocol
