"""The base class of every ragen environment and the ``info`` contract.

A :class:`BaseTextEnv` is the *unwrapped* environment: one step takes **one** action written as text (``"Up"``,
``"arm 1"``, ``"search[red shoes]"``) and returns the next state as text. The LLM-facing env that
``gymnasium.make("ragen/<Name>-v0")`` returns is this env inside :class:`ragen_envs.protocol.TurnProtocol`, which
parses a model's whole reply (``<think>...</think><answer>a1 || a2</answer>``) into such actions.

Subclasses implement four small hooks (see :class:`BaseTextEnv`), keep their state in plain numpy, and never raise on
an action string: an unknown action is a no-op step with ``info["action_is_valid"] = False``.

The ``info`` contract
---------------------
Every ``reset`` and ``step`` returns an ``info`` dict holding at least :data:`INFO_KEYS`:

=====================  =========================================================================================
``success``            the episode's task is solved (Sokoban solved, goal reached, right arm, reward 1 on WebShop)
``format_ok``          the reply had the required format (always ``True`` on the unwrapped env)
``action_is_valid``    every action of the step/turn was a legal action name of this env
``action_is_effective`` at least one action changed the state
``actions``            the parsed actions of the step/turn, canonical names
``think``              the ``<think>`` text of the turn (``""`` on the unwrapped env)
``reward_parts``       the reward split by source (``{"env": ..., "format_penalty": ..., ...}``); sums to the reward
=====================  =========================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.utils.seeding import np_random

from ragen_envs.spaces import MAX_OBSERVATION_CHARS, UnicodeText

#: Keys every ``info`` dict of every ragen env carries.
INFO_KEYS: tuple[str, ...] = (
    "success",
    "format_ok",
    "action_is_valid",
    "action_is_effective",
    "actions",
    "think",
    "reward_parts",
)


def default_info(**overrides: Any) -> dict[str, Any]:
    """A fresh ``info`` dict with every contract key at its neutral value, then ``overrides`` applied."""
    info: dict[str, Any] = {
        "success": False,
        "format_ok": True,
        "action_is_valid": True,
        "action_is_effective": False,
        "actions": [],
        "think": "",
        "reward_parts": {},
    }
    info.update(overrides)
    return info


@dataclass
class StepOutcome:
    """What one action did, as a subclass's :meth:`BaseTextEnv._apply_action` reports it.

    ``reward`` is the env's own reward for the action; ``reward_parts`` may split it further (they must sum to it, or
    be empty, in which case the whole reward is reported as ``{"env": reward}``).
    """

    reward: float = 0.0
    terminated: bool = False
    effective: bool = False
    success: bool = False
    reward_parts: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def check_arg(condition: bool, name: str, value: Any, allowed: str) -> None:
    """Raise a ``ValueError`` naming the argument, its bad value and what is accepted, unless ``condition``."""
    if not condition:
        raise ValueError(f"invalid argument {name}={value!r}: expected {allowed}")


class BaseTextEnv(gym.Env[str, str]):
    """Base of every ragen env: one text action per step, a text state per observation.

    Subclasses set the class attributes below and implement:

    * :meth:`_reset_state` -- draw the initial state from ``self.np_random`` (seeded by ``reset(seed=...)``);
    * :meth:`_apply_action` -- apply one canonical action, return a :class:`StepOutcome`;
    * :meth:`state_text` -- the state as the model sees it;
    * :meth:`state_view` -- the state as a structured, JSON-serialisable dict (reasoning-grounding rewards use it).

    and may override :meth:`parse_action` (free-form actions, e.g. Countdown's expression), :meth:`render_rgb`
    (grid envs) and :meth:`check_reasoning` (claims a ``<think>`` text may make about the state).

    Spaces: ``observation_space`` and ``action_space`` are :class:`~ragen_envs.spaces.UnicodeText`.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    #: Canonical action names, in the order they are listed to the model. Empty for free-form actions.
    action_names: ClassVar[tuple[str, ...]] = ()
    #: Extra spellings (lower-case) mapped to canonical names, e.g. ``{"north": "Up"}``.
    action_synonyms: ClassVar[dict[str, str]] = {}
    #: The reference's prompt text for this env (RAGEN ``config/envs.yaml`` ``env_instruction``), opening the first
    #: user message under the reference prompt layout. ``None`` (an env the reference lacks): :attr:`instructions`.
    reference_instruction: ClassVar[str | None] = None
    #: The symbol legend the reference appends to the instruction (its env config's ``grid_vocab``); empty: none.
    reference_legend: ClassVar[dict[str, str]] = {}
    #: Whether the reference appends the action list (its env config has an ``action_lookup``).
    reference_lists_actions: ClassVar[bool] = False
    #: Longest reply (in chars) the action space samples; replies of any length are still handled.
    max_action_chars: ClassVar[int] = 4096

    def __init__(self, render_mode: str | None = None) -> None:
        check_arg(
            render_mode is None or render_mode in self.metadata["render_modes"],
            "render_mode",
            render_mode,
            f"None or one of {self.metadata['render_modes']}",
        )
        self.render_mode = render_mode
        self.observation_space = UnicodeText(MAX_OBSERVATION_CHARS)
        self.action_space = UnicodeText(self.max_action_chars)
        self._lookup = {name.lower(): name for name in self.action_names}
        self._lookup.update({k.lower(): v for k, v in self.action_synonyms.items()})
        self.num_env_steps = 0

    # ------------------------------------------------------------------ hooks for subclasses
    @property
    def instructions(self) -> str:
        """The env's part of the system prompt: the task, the symbols, the actions (no reply-format text)."""
        raise NotImplementedError

    def _reset_state(self, options: dict[str, Any] | None) -> None:
        raise NotImplementedError

    def _apply_action(self, action: str) -> StepOutcome:
        raise NotImplementedError

    def state_text(self) -> str:
        raise NotImplementedError

    def state_view(self) -> dict[str, Any]:
        raise NotImplementedError

    def reference_state_text(self) -> str:
        """The state as the reference env renders it (its ``render()``), shown under the reference prompt layout.
        Default: :meth:`state_text`, for envs whose text is the reference's."""
        return self.state_text()

    def is_success(self) -> bool:
        """Whether the current state counts as solved; used for the ``success`` key."""
        return False

    def state_info(self) -> dict[str, Any]:
        """Extra ``info`` keys that describe the current state (e.g. WebShop's ``available_actions``).

        The turn protocol merges them into every turn's ``info``, whatever the reply was, so an agent always has them.
        """
        return {}

    def parse_action(self, text: str) -> str | None:
        """Map one action as the model wrote it to a canonical action, or ``None`` when it is not one.

        Default: case-insensitive match of a name or synonym, ignoring surrounding whitespace, quotes and brackets.
        """
        found = self._lookup.get(text.lower())  # fast path: the name as written, any case
        if found is not None:
            return found
        key = text.strip().strip("\"'`.[](){}*").strip().lower()
        return self._lookup.get(key)

    def check_reasoning(self, think: str, view_before: dict[str, Any], actions: list[str]) -> dict[str, int]:
        """Check the claims a ``<think>`` text makes about the state it was written in.

        Returns counts ``{"supported": n, "contradicted": m}`` of factual claims that the env could verify.
        The default recognises none; envs override it (see :mod:`ragen_envs.grounding`).
        """
        return {"supported": 0, "contradicted": 0}

    def render_rgb(self) -> np.ndarray:
        """An RGB picture of the state (grid envs override this)."""
        raise NotImplementedError(f"{type(self).__name__} has no rgb_array rendering")

    # ------------------------------------------------------------------ seeding (lazy np_random)
    # gymnasium's ``Env.reset(seed=s)`` builds ``np_random`` at once (``seeding.np_random(s)``: a SeedSequence and a
    # PCG64, ~6.5 us), which is most of a fresh-level Sokoban reset although that level is a pure function of ``s``.
    # So ``reset(seed=s)`` only records ``s`` and the Generator is built on first use, as the very same Generator
    # gymnasium would have built: ``seeding.np_random(s)``, then advanced past the 64-bit draws a fast path already
    # took from it (:meth:`_take_first_draw`). ``_np_random`` is a property because gymnasium's ``np_random`` and its
    # ``check_env`` read that attribute directly; ``np_random_seed`` is set at reset, as gymnasium sets it.
    _np_random_now: np.random.Generator | None = None  # the Generator, once built (or set)
    _np_random_pending: int | None = None  # the seed of a Generator not built yet
    _np_random_skip: int = 0  # 64-bit draws already taken from the pending Generator

    @property  # type: ignore[override]
    def _np_random(self) -> np.random.Generator | None:
        if self._np_random_pending is not None:
            rng, _ = np_random(self._np_random_pending)
            if self._np_random_skip:
                # PCG64.advance(n) is exactly n next_uint64 calls; a fresh PCG64 buffers no 32-bit half
                rng.bit_generator.advance(self._np_random_skip)
            self._np_random_now, self._np_random_pending, self._np_random_skip = rng, None, 0
        return self._np_random_now

    @_np_random.setter
    def _np_random(self, value: np.random.Generator | None) -> None:
        self._np_random_now, self._np_random_pending, self._np_random_skip = value, None, 0

    def _seed_lazily(self, seed: Any) -> None:
        """What ``gymnasium.Env.reset(seed=seed)`` does, with the Generator built on first use."""
        if type(seed) is int and seed >= 0:
            self._np_random_now, self._np_random_pending, self._np_random_skip = None, seed, 0
            self._np_random_seed = seed  # = SeedSequence(seed).entropy, what gymnasium stores
        else:
            super().reset(seed=seed)  # None: keep the Generator; anything else: gymnasium's checks and errors

    def _take_first_draw(self) -> int | None:
        """The seed of ``np_random`` when it is pending and nothing was drawn from it yet, else ``None``.

        A caller that gets a seed ``s`` must compute the Generator's first 64-bit output itself (``PCG64(s)``'s first
        ``random_raw()``, see :func:`ragen_envs.sokoban.base.first_uint64`): the draw is recorded as taken, so a later
        ``np_random`` continues after it, exactly as if ``np_random.integers(2**62)`` (one 64-bit draw) had run.
        """
        seed = self._np_random_pending
        if seed is None or self._np_random_skip:
            return None
        self._np_random_skip = 1
        return seed

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Draw the initial state from ``seed``.

        ``options={"dynamics_seed": d}`` then re-seeds what happens *after* the reset (Bandit payouts, FrozenLake
        slips) from ``d``: the N rollouts of one initial state share ``seed`` but need independent outcomes, or every
        rollout of a group would see the same payout and the group's reward spread would measure nothing.
        """
        self._seed_lazily(seed)
        self.num_env_steps = 0
        self._reset_state(options)
        if options:
            dynamics_seed = options.get("dynamics_seed")
            if dynamics_seed is not None:
                check_arg(
                    isinstance(dynamics_seed, (int, np.integer))
                    and not isinstance(dynamics_seed, bool)
                    and dynamics_seed >= 0,
                    "options['dynamics_seed']",
                    dynamics_seed,
                    "an int >= 0",
                )
                self._np_random, self._np_random_seed = np_random(int(dynamics_seed))
        return self._observation(self.state_text()), default_info(success=self.is_success())

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        canonical = self.parse_action(action) if isinstance(action, str) else None
        if canonical is None:
            info = default_info(
                action_is_valid=False,
                success=self.is_success(),
                reward_parts={"env": 0.0},
                reason=f"unknown action {preview(action)}; valid actions: {self.describe_actions()}",
            )
            return self._observation(self.state_text()), 0.0, False, False, info
        self.num_env_steps += 1
        outcome = self._apply_action(canonical)
        reward = float(outcome.reward)
        # A dict literal rather than default_info(**...): this is the hot path of every env (same keys, same values).
        info: dict[str, Any] = {
            "success": outcome.success,
            "format_ok": True,
            "action_is_valid": True,
            "action_is_effective": outcome.effective,
            "actions": [canonical],
            "think": "",
            "reward_parts": dict(outcome.reward_parts) if outcome.reward_parts else {"env": reward},
        }
        if outcome.extra:
            info.update(outcome.extra)
        return self._observation(self.state_text()), reward, outcome.terminated, False, info

    def render(self) -> str | np.ndarray | None:
        if self.render_mode == "ansi":
            return self.state_text()
        if self.render_mode == "rgb_array":
            return self.render_rgb()
        return None

    # ------------------------------------------------------------------ helpers
    def _observation(self, text: str) -> str:
        """``text`` as an observation: cut to :data:`~ragen_envs.spaces.MAX_OBSERVATION_CHARS` (the bound of
        ``observation_space``), so that no state, however it grew, leaves the space."""
        return text if len(text) <= MAX_OBSERVATION_CHARS else cap_text(text, MAX_OBSERVATION_CHARS)

    def describe_actions(self) -> str:
        """The valid actions as one line for prompts and error reasons."""
        return ", ".join(self.action_names) if self.action_names else "see the instructions"


#: What replaces the middle of a text cut by :func:`cap_text`.
CUT_MARKER = "\n[... cut ...]\n"


def cap_text(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail around :data:`CUT_MARKER`, ``limit``
    characters in all (``limit`` >= 64; the end of a state, e.g. its available actions, is kept)."""
    if len(text) <= limit:
        return text
    keep = limit - len(CUT_MARKER)
    return text[: keep // 2] + CUT_MARKER + text[len(text) - (keep - keep // 2) :]


def preview(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters (for error reasons that must stay short)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
