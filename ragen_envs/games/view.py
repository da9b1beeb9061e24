"""A seat of a game as a ragen text env: :class:`SeatView` (one seat of a shared game) and :class:`GameEnv` (the
single-agent view: one seat against a fixed opponent).

Both are :class:`~ragen_envs.core.BaseTextEnv` subclasses, so the turn protocol (reply parsing, format penalty,
protocol settings, the ``info`` contract) and the reward wrappers apply to them unchanged. One step is one move of
the seat, written as the game's move text (``"5"``, ``"Cooperate"``, ``"propose books=1 hats=0 balls=2"``).

* :class:`SeatView` plays nothing itself: the PettingZoo environments (:mod:`ragen_envs.games.pettingzoo_env`) give
  each seat one, over the same :class:`~ragen_envs.games.base.GameCore`, and step the seats in turn.
* :class:`GameEnv` owns its game and an opponent: after the agent's move the opponent answers inside the same step,
  so the next observation is the state at the agent's next turn. Each game's file subclasses it
  (``TicTacToeEnv``, ...) and ``ragen/<Game>-v0`` registers that subclass.

Seat (``GameEnv``): ``seat=None`` (default) takes seat ``seed % 2`` on a seeded reset (seat 0 moves first), so a run
of consecutive seeds plays both seats equally often and a seed always gives the same seat; an unseeded reset draws
the seat from the env's generator. ``seat=0``/``"first"`` or ``1``/``"second"`` fixes it.

Invalid turns (single-agent view). A reply that does not parse or names an illegal move is a turn with the
protocol's format penalty and a ``reason``; the game state does not change and the opponent does not move. The
registered ids allow :data:`~ragen_envs.games.base.INVALID_CAP` (3) turns beyond the most moves the seat can need
(``max_turns`` = :attr:`GameEnv.turn_budget`); a seat that runs out of turns before the game ends is truncated,
which scores as a forfeit: no further reward (a loss, 0), ``success`` False.
"""

from __future__ import annotations

from typing import Any, ClassVar, SupportsFloat

import numpy as np

from ragen_envs.core import BaseTextEnv, StepOutcome, check_arg, preview
from ragen_envs.games.base import INVALID_CAP, GameCore, Opponent, make_opponent, parse_seat


class SeatView(BaseTextEnv):
    """One seat's view of a shared :class:`GameCore`, as a text env. See the module docstring.

    ``reset`` does not restart the game (its owner does); ``step`` plays one move of the seat and nothing else.
    Extra ``info`` keys on every turn (:meth:`state_info`): ``seat`` (its label), ``legal_actions`` (its legal moves
    now, empty when it is not its turn), ``outcome`` (``None`` while the game goes on) and ``score``.
    """

    max_action_chars = 1024

    def __init__(self, core: GameCore, seat: int, render_mode: str | None = None) -> None:
        check_arg(isinstance(core, GameCore), "core", type(core).__name__, "a GameCore")
        check_arg(seat in (0, 1) and not isinstance(seat, bool), "seat", seat, "0 or 1")
        self.core = core
        self.seat = seat
        self.last_rewards: dict[int, float] = {}  # every seat's rewards from this seat's last move
        # Instance-level: the protocol matches replies against them exactly (the reference's action lookup).
        self.action_names = core.action_names
        self.action_synonyms = core.action_synonyms
        super().__init__(render_mode=render_mode)

    @property
    def instructions(self) -> str:
        return self.core.instructions(self.seat)

    def _reset_state(self, options: dict[str, Any] | None) -> None:
        return None  # the game is shared: whoever owns it resets it

    def parse_action(self, text: str) -> str | None:
        return self.core.parse_move(self.seat, text)

    def _apply_action(self, action: str) -> StepOutcome:
        rewards = self.core.play(self.seat, action)
        self.last_rewards = dict(rewards)
        reward = float(rewards.get(self.seat, 0.0))
        return StepOutcome(
            reward=reward,
            terminated=self.core.over,
            effective=True,  # a legal move always changes the game
            success=self.core.success(self.seat),
            extra={"move": action},
        )

    def state_text(self) -> str:
        return self.core.state_text(self.seat)

    def state_view(self) -> dict[str, Any]:
        return self.core.state_view(self.seat)

    def is_success(self) -> bool:
        return self.core.success(self.seat)

    def state_info(self) -> dict[str, Any]:
        core, seat = self.core, self.seat
        return {
            "seat": core.label(seat),
            "legal_actions": core.legal_moves(seat) if seat in core.to_move() else [],
            "outcome": core.outcome(seat),
            "score": core.score(seat),
        }

    def describe_actions(self) -> str:
        return self.core.describe_moves(self.seat)

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = super().step(action)
        if not info["action_is_valid"]:  # "illegal now" is more exact than the base env's "unknown action"
            info["reason"] = f"{preview(action)} is not a legal move now; legal moves: {self.describe_actions()}"
        return observation, reward, terminated, truncated, info

    def check_reasoning(self, think: str, view_before: dict[str, Any], actions: list[str]) -> dict[str, int]:
        return self.core.check_reasoning(self.seat, think, view_before, actions)

    def render(self) -> str | np.ndarray | None:
        return self.core.render() if self.render_mode == "ansi" else None


class GameEnv(SeatView):
    """The single-agent view of a game: one seat against a fixed opponent. See the module docstring.

    Subclasses set :attr:`core_cls` and :attr:`opponents` (name -> factory); keyword arguments other than ``seat``,
    ``opponent`` and ``render_mode`` go to the core (the game's own arguments).

    Extra ``info`` keys: those of :class:`SeatView`, ``opponent`` (its name) and, on a step, ``move`` (the agent's
    move) and ``opponent_moves`` (what the opponent played in answer).
    """

    #: The game's rules.
    core_cls: ClassVar[type[GameCore]]
    #: Opponent name -> factory; ``opponent=`` takes one of these names or an :class:`Opponent` instance.
    opponents: ClassVar[dict[str, type[Opponent]]] = {}

    def __init__(
        self,
        *,
        seat: int | str | None = None,
        opponent: str | Opponent = "random",
        render_mode: str | None = None,
        **game_kwargs: Any,
    ) -> None:
        self.seat_choice = parse_seat(seat)
        self.opponent = make_opponent(opponent, self.opponents, self.core_cls.title)
        super().__init__(self.core_cls(**game_kwargs), 0, render_mode=render_mode)
        self._reset_seed: Any = None
        self._opponent_moves: list[str] = []

    @property
    def opponent_seat(self) -> int:
        return 1 - self.seat

    @property
    def turn_budget(self) -> int:
        """Turns the registered id allows: the most moves either seat can need, plus :data:`INVALID_CAP`."""
        return max(self.core.max_moves(0), self.core.max_moves(1)) + INVALID_CAP

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._reset_seed = seed
        observation, info = super().reset(seed=seed, options=options)
        info.update(self.state_info())  # the protocol merges these into its reset info, as on every turn
        return observation, info

    def _reset_state(self, options: dict[str, Any] | None) -> None:
        seed = self._reset_seed
        if self.seat_choice is not None:
            self.seat = self.seat_choice
        elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            self.seat = int(seed) % 2  # consecutive seeds alternate seats; a seed always gives the same one
        else:
            self.seat = int(self.np_random.integers(2))
        self.core.reset(self.np_random)
        self.opponent.reset(self.opponent_seat)
        # An opponent that moves first does so now: its move is part of the initial state of this seed.
        self._opponent_moves = []
        self._let_opponent_move()

    def _let_opponent_move(self) -> float:
        """Let the opponent move until the agent is to move or the game is over; the agent's reward from it."""
        reward = 0.0
        core, seat, other = self.core, self.seat, self.opponent_seat
        while not core.over and seat not in core.to_move() and other in core.to_move():
            text = self.opponent.act(core.state_view(other), self.np_random)
            move = core.parse_move(other, text) if isinstance(text, str) else None
            if move is None:  # a bug of the opponent, not of the agent: say so loudly
                raise RuntimeError(
                    f"opponent {self.opponent!r} played an illegal move {text!r}; legal: {core.describe_moves(other)}"
                )
            self._opponent_moves.append(move)
            reward += float(core.play(other, move).get(seat, 0.0))
        return reward

    def _apply_action(self, action: str) -> StepOutcome:
        self._opponent_moves = []
        rewards = self.core.play(self.seat, action)
        reward = float(rewards.get(self.seat, 0.0)) + self._let_opponent_move()
        return StepOutcome(
            reward=reward,
            terminated=self.core.over,
            effective=True,
            success=self.core.success(self.seat),
            extra={"move": action, "opponent_moves": list(self._opponent_moves)},
        )

    def state_info(self) -> dict[str, Any]:
        info = super().state_info()
        info["opponent"] = self.opponent.name or type(self.opponent).__name__
        return info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        # A step after the game ended (the unwrapped env has no turn limit of its own) changes nothing.
        if self.core.over:
            observation = self._observation(self.state_text())
            info = {
                "success": self.is_success(),
                "format_ok": True,
                "action_is_valid": False,
                "action_is_effective": False,
                "actions": [],
                "think": "",
                "reward_parts": {"env": 0.0},
                "reason": "the game is over; call reset()",
            }
            info.update(self.state_info())
            return observation, 0.0, True, False, info
        return super().step(action)
