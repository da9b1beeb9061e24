"""What every text game shares: the rules interface (:class:`GameCore`), fixed opponents (:class:`Opponent`), and the
outcome values (kept and scored for the board games by :class:`WinDrawLossGame`).

A game's rules live in one :class:`GameCore` subclass per game (one game per file), in plain Python and numpy: two
seats (``0`` moves first), moves written as text, and per seat a text view of the state, a structured view and the
instructions. Nothing in a core knows about reply formats, penalties or opponents; those are layered on top:

* :class:`ragen_envs.games.view.GameEnv` -- the single-agent gymnasium view (one seat against a fixed opponent,
  inside the turn protocol, registered as ``ragen/<Game>-v0``);
* :mod:`ragen_envs.games.pettingzoo_env` -- the PettingZoo environments (every seat an LLM, each through its own
  turn protocol).

Rewards. Every game pays each seat a reward that sums to its *score* in ``[0, 1]`` over a game: win :data:`WIN`
(1), draw :data:`DRAW` (0.5), loss :data:`LOSS` (0) for the board games, the payoff as a share of its maximum for
the Prisoner's Dilemma and the negotiation (whose ``no_deal_reward`` may be set below 0). The format penalty of bad
replies comes on top (from the protocol).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from ragen_envs.core import check_arg

#: The PettingZoo agents of the two seats, seat 0 first.
AGENTS: tuple[str, str] = ("player_0", "player_1")

#: Reward of a won, drawn and lost board game (the single-agent view and the PettingZoo seats use the same values).
WIN, DRAW, LOSS = 1.0, 0.5, 0.0
#: The two seats; seat 0 moves first in turn-based games.
SEATS: tuple[int, int] = (0, 1)
#: Invalid turns a seat may take in a PettingZoo game; its ``INVALID_CAP``-th invalid turn forfeits the game. The
#: single-agent views allow the same number of turns beyond the most moves a seat can need (see ``GameEnv``).
INVALID_CAP = 3

# Characters stripped around a move as written ("'5'", "[5]", "5.").
_STRIP = "\"'`.,;:!?[](){}*<> \t\n"


#: The protocol fields that bound a seat's turns; in a two-seat game its own turn budget bounds them instead.
TURN_BUDGET_FIELDS: tuple[str, ...] = ("max_turns", "max_actions_per_episode")


def turn_budget_changes(settings: Any, registered: Any) -> dict[str, tuple[int, int]]:
    """The turn-budget fields (:data:`TURN_BUDGET_FIELDS`) in which ``settings`` differs from the game id's
    ``registered`` settings: ``{name: (given, registered)}``."""
    return {name: (getattr(settings, name), getattr(registered, name)) for name in TURN_BUDGET_FIELDS
            if getattr(settings, name) != getattr(registered, name)}  # fmt: skip


def check_turn_budget_unchanged(settings: Any, registered: Any) -> None:
    """Raise a ``ValueError`` when ``settings`` (a ``ProtocolSettings``) changes a turn-budget field from the game id's
    ``registered`` settings. A game played by both seats (PettingZoo, self-play) ends by its rules: a seat's budget
    is the game's own setting (``max_moves + 2 * invalid_cap``, the ``turn_budget`` of the PettingZoo env), so a
    changed ``max_turns`` would be replaced; where the change was asked for by name (a config field), it is refused
    here instead."""
    for name, (mine, theirs) in turn_budget_changes(settings, registered).items():
        check_arg(False, name, mine, f"the game's registered {theirs}: when both seats play (PettingZoo, self-play) "
                  "the game's own turn budget (max_moves + 2 * invalid_cap, set with invalid_cap) bounds a seat's "
                  "turns, not the protocol")  # fmt: skip


def normalize_move_text(text: str) -> str:
    """``text`` lower-cased, its whitespace collapsed and quotes, brackets and trailing punctuation stripped."""
    return re.sub(r"\s+", " ", text.strip(_STRIP).lower()).strip(_STRIP)


class GameCore(ABC):
    """The rules of a two-seat text game. See the module docstring.

    Subclasses set :attr:`name`, :attr:`title`, :attr:`seat_labels`, :attr:`action_names` (the canonical move names
    a reply must use under the reference protocol's exact matching; empty for free-form moves) and implement the
    abstract methods. State is kept in plain attributes; :meth:`reset` draws everything random from the generator it
    is given, so the same generator state gives the same game.

    Turn order: :meth:`to_move` is the seats expected to move now (one seat in turn-based games, every seat that has
    not committed its move in simultaneous ones, none once :attr:`over`). :meth:`play` applies a *legal* move (one
    that :meth:`parse_move` returned) and returns the reward it produced for each seat.
    """

    #: Short id of the game (``"tictactoe"``), used in PettingZoo names.
    name: ClassVar[str] = ""
    #: The game's name in prompts.
    title: ClassVar[str] = ""
    #: How each seat is called in texts (``("X", "O")``).
    seat_labels: ClassVar[tuple[str, str]] = ("Player 1", "Player 2")
    #: Whether both seats move at once (the Parallel API) or in turns (the AEC API).
    simultaneous: ClassVar[bool] = False
    #: The words :meth:`outcome` returns at the end of a game (per-seat metrics report the rate of each).
    outcomes: ClassVar[tuple[str, ...]] = ("win", "draw", "loss")
    #: Canonical move names (exact matching under the reference protocol); empty: free-form moves.
    action_names: ClassVar[tuple[str, ...]] = ()
    #: Extra spellings (lower-case) mapped to canonical names, accepted with ``lenient_actions=True``.
    action_synonyms: ClassVar[dict[str, str]] = {}

    def __init__(self) -> None:
        self.forfeited: int | None = None  # the seat that forfeited, if one did (-1: both, in simultaneous games)
        # Lower-cased move names and synonyms -> canonical names, for parse_move.
        self._lookup = {name.lower(): name for name in self.action_names}
        self._lookup.update({k.lower(): v for k, v in self.action_synonyms.items()})

    # ------------------------------------------------------------------ rules (subclasses)
    @abstractmethod
    def reset(self, rng: np.random.Generator) -> None:
        """Start a new game; everything random is drawn from ``rng``."""

    @abstractmethod
    def to_move(self) -> tuple[int, ...]:
        """The seats expected to move now; ``()`` once the game is over."""

    @abstractmethod
    def legal_moves(self, seat: int) -> list[str]:
        """The legal moves of ``seat`` now, canonical text (free-form games: the kinds of move, as examples)."""

    @abstractmethod
    def play(self, seat: int, move: str) -> dict[int, float]:
        """Apply the legal ``move`` of ``seat``; return the reward it produced for each seat (missing seats: 0)."""

    @abstractmethod
    def forfeit(self, seat: int) -> dict[int, float]:
        """End the game because ``seat`` forfeits (too many invalid turns); return the rewards it produced."""

    @property
    @abstractmethod
    def over(self) -> bool:
        """Whether the game has ended."""

    @abstractmethod
    def score(self, seat: int) -> float:
        """The seat's score so far in ``[0, 1]`` (the sum of its rewards from :meth:`play` and :meth:`forfeit`)."""

    @abstractmethod
    def success(self, seat: int) -> bool:
        """Whether the seat has succeeded (won; see each game's docstring)."""

    @abstractmethod
    def outcome(self, seat: int) -> str | None:
        """A word for the seat's result (``"win"``, ``"draw"``, ``"loss"``, ``"deal"``, ``"no deal"``), or ``None``
        while the game goes on."""

    @abstractmethod
    def instructions(self, seat: int) -> str:
        """The rules as the seat's prompt states them: its role, the moves, how to write one, the rewards."""

    @abstractmethod
    def state_text(self, seat: int) -> str:
        """The state as ``seat`` sees it (private information of the other seat left out)."""

    @abstractmethod
    def state_view(self, seat: int) -> dict[str, Any]:
        """The state as ``seat`` may know it, JSON-serialisable: what opponents and reward wrappers read."""

    @abstractmethod
    def max_moves(self, seat: int) -> int:
        """The most moves ``seat`` can make in one game (its turn budget, before invalid turns)."""

    @abstractmethod
    def render(self) -> str:
        """The whole public state as text (for ``render_mode="ansi"`` and logs)."""

    # ------------------------------------------------------------------ defaults
    def parse_move(self, seat: int, text: str) -> str | None:
        """The canonical legal move ``text`` names for ``seat``, or ``None`` (unknown, illegal now, not its turn).

        Default: the move names and synonyms, any case, quotes and brackets ignored.
        """
        if seat not in self.to_move() or not isinstance(text, str):
            return None
        name = self._lookup.get(normalize_move_text(text))
        return name if name is not None and name in self.legal_moves(seat) else None

    def describe_moves(self, seat: int) -> str:
        """The legal moves now as one line, for prompts and error reasons."""
        moves = self.legal_moves(seat) if seat in self.to_move() else []
        return ", ".join(moves) if moves else "none (it is not your turn)"

    def forfeit_all(self) -> dict[int, float]:
        """End a simultaneous game in which every seat reached the invalid-turn cap at once; the rewards."""
        raise NotImplementedError(f"{type(self).__name__} is turn-based: only one seat can forfeit at a time")

    def withdraw(self, seat: int, note: str = "") -> None:
        """Take back a committed move of a simultaneous game (its round is replayed); ``note`` tells the seat why."""
        raise NotImplementedError(f"{type(self).__name__} is turn-based: moves cannot be withdrawn")

    def check_reasoning(self, seat: int, think: str, view_before: dict[str, Any], actions: list[str]) -> dict[str, int]:
        """Claims of a ``<think>`` text the game can verify (see ``BaseTextEnv.check_reasoning``); none by default."""
        return {"supported": 0, "contradicted": 0}

    def label(self, seat: int) -> str:
        return self.seat_labels[seat]


class WinDrawLossGame(GameCore):
    """A board game of alternating moves that ends in a win for one seat or a draw: it scores :data:`WIN`,
    :data:`DRAW` and :data:`LOSS` at the end and 0 before (tic-tac-toe, Connect Four).

    It keeps whose turn it is (:attr:`turn`, seat 0 first), each seat's :attr:`last_move` (an index, or ``None``) and
    the result: :attr:`finished`, :attr:`winner` (the winning seat; ``None`` for a draw and while the game goes on) and
    :attr:`forfeited`. Subclasses end a game with :meth:`_finish`, extend :meth:`reset` (calling it first) to set up
    their board, and write the board-specific text through four small hooks: :meth:`board_view`,
    :meth:`spectator_board`, :meth:`last_move_text` and :attr:`move_phrase`. A forfeit is a loss for the forfeiting
    seat and a win for the other.
    """

    #: How :meth:`describe_moves` names a legal move (``"an empty cell"``).
    move_phrase: ClassVar[str] = "a legal move"

    def __init__(self) -> None:
        super().__init__()
        self.winner: int | None = None
        self.finished = False
        self.turn = 0
        self.last_move: list[int | None] = [None, None]

    def reset(self, rng: np.random.Generator) -> None:
        """Clear the result and the moves of the last game."""
        self.winner = None
        self.finished = False
        self.forfeited = None
        self.turn = 0
        self.last_move = [None, None]

    def to_move(self) -> tuple[int, ...]:
        return () if self.finished else (self.turn,)

    # ------------------------------------------------------------------ text (hooks for the subclasses)
    def board_view(self) -> Any:
        """The board as :meth:`state_view` gives it to opponents."""
        raise NotImplementedError

    def spectator_board(self) -> str:
        """The board as :meth:`render` shows it."""
        raise NotImplementedError

    def last_move_text(self, index: int) -> str:
        """How the other seat's last move at ``index`` reads after its label (``"played cell 5"``)."""
        raise NotImplementedError

    def state_header(self, seat: int) -> str:
        """The first line of the seat's state: who it is, then a forfeit, the other seat's last move, or that it
        moves first."""
        other = self.seat_labels[1 - seat]
        header = f"You are {self.seat_labels[seat]}."
        their = self.last_move[1 - seat]
        if self.forfeited is not None:
            who = "You" if self.forfeited == seat else other
            header += f" {who} forfeited the game (too many invalid turns)."
        elif their is not None:
            header += f" {other} {self.last_move_text(their)}."
        elif seat == 0 and self.last_move[0] is None:
            header += " You move first."
        return header

    def result_line(self, seat: int) -> str:
        """The line that ends the state text of a finished game."""
        result = {"win": "You won.", "loss": "You lost.", "draw": "The game is a draw."}[self.outcome(seat) or ""]
        return f"The game is over. {result}"

    def state_view(self, seat: int) -> dict[str, Any]:
        labels = self.seat_labels
        return {
            "game": self.name,
            "you": labels[seat],
            "board": self.board_view(),
            "to_move": labels[self.turn] if not self.finished else None,
            "legal": self.legal_moves(seat),
            "last_moves": {labels[s]: (m + 1 if m is not None else None) for s, m in enumerate(self.last_move)},
            "winner": labels[self.winner] if self.winner is not None else None,
            "over": self.finished,
        }

    def describe_moves(self, seat: int) -> str:
        if self.finished or seat != self.turn:
            return "none (it is not your turn)"
        return f"the number of {self.move_phrase}: " + ", ".join(self.legal_moves(seat))

    def render(self) -> str:
        labels = self.seat_labels
        status = "" if not self.finished else ("\ndraw" if self.winner is None else f"\n{labels[self.winner]} wins")
        return self.spectator_board() + status

    def _finish(self, winner: int | None) -> dict[int, float]:
        """End the game, won by ``winner`` (``None``: a draw); every seat's reward, its final score."""
        self.finished, self.winner = True, winner
        return {s: self.score(s) for s in SEATS}

    def forfeit(self, seat: int) -> dict[int, float]:
        self.forfeited = seat
        return self._finish(1 - seat)

    @property
    def over(self) -> bool:
        return self.finished

    def score(self, seat: int) -> float:
        if not self.finished:
            return 0.0
        return DRAW if self.winner is None else WIN if self.winner == seat else LOSS

    def success(self, seat: int) -> bool:
        return self.finished and self.winner == seat

    def outcome(self, seat: int) -> str | None:
        if not self.finished:
            return None
        return "draw" if self.winner is None else "win" if self.winner == seat else "loss"


class Opponent(ABC):
    """A fixed policy for one seat, used by the single-agent views.

    An opponent sees only what its seat may know: :meth:`act` gets ``core.state_view(seat)`` (never the other seat's
    private values or its committed, unrevealed move) and returns one legal move as text, written as a model would
    write it inside ``<answer>``. Randomness comes from the ``rng`` passed in (the env's generator), so seeded games
    are reproducible.
    """

    #: The name it is registered under (``"random"``, ``"rule"``, ...).
    name: ClassVar[str] = ""

    def reset(self, seat: int) -> None:
        """Called at the start of each game with the seat it plays (stateful opponents clear their memory)."""

    @abstractmethod
    def act(self, view: dict[str, Any], rng: np.random.Generator) -> str:
        """One legal move for the state ``view`` of its seat."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomOpponent(Opponent):
    """Picks uniformly among the legal moves (``view["legal"]``)."""

    name = "random"

    def act(self, view: dict[str, Any], rng: np.random.Generator) -> str:
        legal = view["legal"]
        return legal[int(rng.integers(len(legal)))]


def make_opponent(spec: str | Opponent, table: Mapping[str, Callable[[], Opponent]], game: str) -> Opponent:
    """An opponent from a name of ``table`` or an :class:`Opponent` instance; ``ValueError`` naming the choices."""
    if isinstance(spec, Opponent):
        return spec
    check_arg(
        isinstance(spec, str) and spec in table,
        "opponent",
        spec,
        f"one of {sorted(table)} for {game}, or an Opponent instance",
    )
    return table[spec]()


def parse_seat(seat: Any) -> int | None:
    """``seat`` as 0, 1 or ``None`` (drawn per game); ``ValueError`` naming the accepted spellings."""
    spellings: dict[Any, int | None] = {None: None, "alternate": None, 0: 0, 1: 1, "first": 0, "second": 1}
    ok = not isinstance(seat, bool) and isinstance(seat, (int, str, type(None))) and seat in spellings
    check_arg(ok, "seat", seat, "None or 'alternate' (seat from the seed), 0 or 'first', 1 or 'second'")
    return spellings[seat]


def best_of(scores: list[float], rng: np.random.Generator | None) -> int:
    """Index of the highest score, ties broken by ``rng`` (first one without it)."""
    top = max(scores)
    best = [i for i, s in enumerate(scores) if s == top]
    return best[int(rng.integers(len(best)))] if rng is not None and len(best) > 1 else best[0]
