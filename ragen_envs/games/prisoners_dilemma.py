"""The iterated Prisoner's Dilemma as a text game: both seats choose at once, for a fixed number of rounds.

Seats: ``player_0`` and ``player_1`` (PettingZoo's Parallel API); they are symmetric and move simultaneously: neither
sees the other's choice for a round before making its own.

Rounds: ``rounds`` (default **10**), announced in the instructions and the state.

Action (one per round): ``Cooperate`` or ``Defect`` (any case; with ``lenient_actions=True`` also ``C``/``D``,
``cooperation``, ``defection``, ``betray``). Anything else is an invalid turn.

Payoffs per round (``payoffs=(T, R, P, S)``, default ``(5, 3, 1, 0)``, requiring ``T > R > P > S`` and
``2R > T + S``): both cooperate -> R each (3); both defect -> P each (1); one defects -> the defector T (5), the
cooperator S (0).

Observation (after round 2)::

    Iterated Prisoner's Dilemma, round 3 of 10.
    Round 2: you chose Cooperate and the other player chose Defect: you got 0, they got 5.
    History (you / other): Cooperate/Cooperate, Cooperate/Defect.
    Totals: you 3, the other player 8.

Rewards: each round pays each seat its payoff divided by ``T * rounds`` (so a game's rewards sum to at most 1: the
seat's total payoff as a share of the most it could get). Success: a total payoff of at least ``R * rounds`` (what two
players who always cooperate get; not reachable against ``always_defect``, against which the best is ``P * rounds``).
The info's ``outcome`` compares the totals (``"win"``, ``"draw"``, ``"loss"``).

Episode end: after ``rounds`` rounds. Invalid turns (PettingZoo): a round in which either seat's reply is invalid is
void and replayed (the valid seat's choice is discarded, unseen); a seat's 3rd invalid turn forfeits the game: every
round not yet played then scores as if the forfeiting seat cooperated and the other defected (S for it, T for the
other); if both seats reach the cap in the same round, every round left scores as mutual defection (P each). In the
single-agent view (``ragen/PrisonersDilemma-v0``) the protocol allows ``rounds + 3`` turns (13);
running out of turns truncates the episode (the rounds not played pay nothing).

Opponents (single-agent view, ``opponent=``): ``"random"`` (Cooperate or Defect with equal chance),
``"tit_for_tat"`` (alias ``"rule"``: cooperates first, then repeats the agent's previous choice), ``"always_defect"``
and ``"always_cooperate"``.

Arguments (``ragen/PrisonersDilemma-v0``): ``rounds`` (>= 1; change ``max_turns`` to ``rounds + 3`` with it),
``payoffs``, ``seat`` (``None``: ``seed % 2``; ``0``/``1``: only the name differs, the game is symmetric),
``opponent`` (default ``"tit_for_tat"``), ``render_mode`` (``None`` or ``"ansi"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ragen_envs.core import check_arg
from ragen_envs.games.base import GameCore, Opponent, RandomOpponent
from ragen_envs.games.view import GameEnv

COOPERATE, DEFECT = "Cooperate", "Defect"
MOVES = (COOPERATE, DEFECT)


class PrisonersDilemma(GameCore):
    """The rules of the iterated Prisoner's Dilemma. See the module docstring."""

    name = "prisoners_dilemma"
    title = "Iterated Prisoner's Dilemma"
    seat_labels = ("Player 1", "Player 2")
    simultaneous = True
    action_names = MOVES
    action_synonyms: ClassVar[dict[str, str]] = {
        "c": COOPERATE, "cooperation": COOPERATE, "co-operate": COOPERATE, "i cooperate": COOPERATE,
        "d": DEFECT, "defection": DEFECT, "betray": DEFECT, "i defect": DEFECT,
    }  # fmt: skip

    def __init__(self, rounds: int = 10, payoffs: Sequence[float] = (5, 3, 1, 0)) -> None:
        super().__init__()
        check_arg(
            isinstance(rounds, int) and not isinstance(rounds, bool) and 1 <= rounds <= 1000,
            "rounds",
            rounds,
            "an int in 1..1000",
        )
        values = tuple(payoffs) if isinstance(payoffs, Sequence) and not isinstance(payoffs, str) else ()
        check_arg(
            len(values) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in values),
            "payoffs",
            payoffs,
            "four finite numbers (T, R, P, S): temptation, reward, punishment, sucker",
        )
        t, r, p, s = (float(v) for v in values)
        check_arg(
            t > r > p > s and 2 * r > t + s,
            "payoffs",
            payoffs,
            "(T, R, P, S) with T > R > P > S and 2R > T + S (a Prisoner's Dilemma), e.g. (5, 3, 1, 0)",
        )
        self.rounds = rounds
        self.payoffs = (t, r, p, s)
        self.history: list[tuple[str, str]] = []
        self.pending: list[str | None] = [None, None]
        self.totals = [0.0, 0.0]
        self.notes = ["", ""]

    @property
    def _scale(self) -> float:
        return self.payoffs[0] * self.rounds

    def payoff(self, mine: str, theirs: str) -> float:
        """The payoff of choosing ``mine`` against ``theirs``."""
        t, r, p, s = self.payoffs
        if mine == COOPERATE:
            return r if theirs == COOPERATE else s
        return t if theirs == COOPERATE else p

    # ------------------------------------------------------------------ rules
    def reset(self, rng: np.random.Generator) -> None:
        self.history = []
        self.pending = [None, None]
        self.totals = [0.0, 0.0]
        self.notes = ["", ""]
        self.forfeited = None

    def to_move(self) -> tuple[int, ...]:
        if self.over:
            return ()
        return tuple(s for s in (0, 1) if self.pending[s] is None)

    def legal_moves(self, seat: int) -> list[str]:
        return list(MOVES) if seat in self.to_move() else []

    def play(self, seat: int, move: str) -> dict[int, float]:
        self.pending[seat] = move
        self.notes[seat] = ""
        if self.pending[0] is None or self.pending[1] is None:
            return {}
        a, b = self.pending[0], self.pending[1]
        self.pending = [None, None]
        self.history.append((a, b))
        gains = (self.payoff(a, b), self.payoff(b, a))
        self.totals = [self.totals[0] + gains[0], self.totals[1] + gains[1]]
        return {0: gains[0] / self._scale, 1: gains[1] / self._scale}

    def withdraw(self, seat: int, note: str = "") -> None:
        self.pending[seat] = None
        self.notes[seat] = note

    def forfeit(self, seat: int) -> dict[int, float]:
        t, _, _, s = self.payoffs
        left = self.rounds - len(self.history)
        self.forfeited = seat
        self.pending = [None, None]
        gains = {seat: s * left, 1 - seat: t * left}
        for k, gain in gains.items():
            self.totals[k] += gain
        return {k: gain / self._scale for k, gain in gains.items()}

    def forfeit_all(self) -> dict[int, float]:
        """Both seats reached the invalid-turn cap in the same round: every round left scores as mutual defection."""
        p = self.payoffs[2]
        left = self.rounds - len(self.history)
        self.forfeited = -1  # both
        self.pending = [None, None]
        for k in (0, 1):
            self.totals[k] += p * left
        return {k: p * left / self._scale for k in (0, 1)}

    @property
    def over(self) -> bool:
        return self.forfeited is not None or len(self.history) >= self.rounds

    def score(self, seat: int) -> float:
        return self.totals[seat] / self._scale

    def success(self, seat: int) -> bool:
        return self.over and self.totals[seat] >= self.payoffs[1] * self.rounds

    def outcome(self, seat: int) -> str | None:
        if not self.over:
            return None
        mine, theirs = self.totals[seat], self.totals[1 - seat]
        return "win" if mine > theirs else "draw" if mine == theirs else "loss"

    def max_moves(self, seat: int) -> int:
        return self.rounds

    # ------------------------------------------------------------------ text
    def instructions(self, seat: int) -> str:
        t, r, p, s = (f"{v:g}" for v in self.payoffs)
        return (
            f"You are playing the iterated Prisoner's Dilemma against another player for {self.rounds} rounds.\n"
            "Each round both players choose at the same time, without seeing the other's choice: Cooperate or "
            "Defect.\n"
            f"Payoffs per round: both cooperate: {r} points each; both defect: {p} point(s) each; one defects: the "
            f"defector gets {t} and the cooperator {s}.\n"
            "Your goal is to score as many points as you can over all rounds. Your answer is Cooperate or Defect.\n"
            f"Reward: your points divided by {t} x {self.rounds} (the most you could score)."
        )

    def state_text(self, seat: int) -> str:
        other = 1 - seat
        played = len(self.history)
        lines = []
        if self.over:
            lines.append(f"Iterated Prisoner's Dilemma: the game is over after {played} of {self.rounds} rounds.")
        else:
            lines.append(f"Iterated Prisoner's Dilemma, round {played + 1} of {self.rounds}.")
        if self.notes[seat]:
            lines.append(self.notes[seat])
        if self.history:
            last = self.history[-1]
            mine, theirs = last[seat], last[other]
            lines.append(
                f"Round {played}: you chose {mine} and the other player chose {theirs}: you got "
                f"{self.payoff(mine, theirs):g}, they got {self.payoff(theirs, mine):g}."
            )
            pairs = ", ".join(f"{h[seat]}/{h[other]}" for h in self.history)
            lines.append(f"History (you / other): {pairs}.")
        if self.forfeited == -1:
            lines.append(
                "Both players forfeited (too many invalid turns): the rounds left were scored as if both defected."
            )
        elif self.forfeited is not None:
            who = "You" if self.forfeited == seat else "The other player"
            lines.append(
                f"{who} forfeited (too many invalid turns): the rounds left were scored as if the forfeiting player "
                "cooperated and the other defected."
            )
        lines.append(f"Totals: you {self.totals[seat]:g}, the other player {self.totals[other]:g}.")
        return "\n".join(lines)

    def state_view(self, seat: int) -> dict[str, Any]:
        other = 1 - seat
        return {
            "game": self.name,
            "round": len(self.history) + (0 if self.over else 1),
            "rounds": self.rounds,
            "payoffs": list(self.payoffs),
            "legal": self.legal_moves(seat),
            # Only rounds played: the other seat's committed choice of the current round stays hidden.
            "history": [{"you": h[seat], "other": h[other]} for h in self.history],
            "totals": {"you": self.totals[seat], "other": self.totals[other]},
            "over": self.over,
        }

    def describe_moves(self, seat: int) -> str:
        return "Cooperate or Defect" if seat in self.to_move() else "none (it is not your turn)"

    def render(self) -> str:
        rows = [f"round {i + 1}: {a} / {b}" for i, (a, b) in enumerate(self.history)]
        rows.append(f"totals: {self.totals[0]:g} / {self.totals[1]:g}")
        return "\n".join(rows)


# ---------------------------------------------------------------------------------------------- opponents
class TitForTat(Opponent):
    """Cooperate first, then repeat the other player's previous choice."""

    name = "tit_for_tat"

    def act(self, view: dict[str, Any], rng: np.random.Generator) -> str:
        history = view["history"]
        return history[-1]["other"] if history else COOPERATE


class AlwaysDefect(Opponent):
    """Defect every round."""

    name = "always_defect"

    def act(self, view: dict[str, Any], rng: np.random.Generator) -> str:
        return DEFECT


class AlwaysCooperate(Opponent):
    """Cooperate every round."""

    name = "always_cooperate"

    def act(self, view: dict[str, Any], rng: np.random.Generator) -> str:
        return COOPERATE


#: The opponents of the single-agent view, by name (``"rule"`` is tit-for-tat).
OPPONENTS: dict[str, type[Opponent]] = {
    "random": RandomOpponent,
    "tit_for_tat": TitForTat,
    "rule": TitForTat,
    "always_defect": AlwaysDefect,
    "always_cooperate": AlwaysCooperate,
}


class PrisonersDilemmaEnv(GameEnv):
    """``ragen/PrisonersDilemma-v0``: the iterated Prisoner's Dilemma against a fixed opponent (module docstring)."""

    core_cls = PrisonersDilemma
    opponents = OPPONENTS

    def __init__(self, *, opponent: str | Opponent = "tit_for_tat", **kwargs: Any) -> None:
        """As :class:`GameEnv`, whose other arguments ``kwargs`` go to; only the default opponent differs."""
        super().__init__(opponent=opponent, **kwargs)
