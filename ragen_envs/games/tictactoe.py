"""Tic-tac-toe as a text game: two seats take turns marking the cells of a 3x3 board; three in a row wins.

Seats: seat 0 plays ``X`` and moves first, seat 1 plays ``O`` (PettingZoo agents ``player_0`` and ``player_1``).

Action (one per turn): the number of an empty cell, ``1``-``9``, numbered left to right, top to bottom. With
``lenient_actions=True`` also ``cell 5``, ``square 5`` and position words (``center``, ``top left``, ``bottom
right``, ...). A taken cell, a number out of range or anything else is an invalid turn.

Observation (seat ``O``, after ``X`` took the centre)::

    You are O. X played cell 5.
     1 | 2 | 3
    ---+---+---
     4 | X | 6
    ---+---+---
     7 | 8 | 9
    Empty cells: 1, 2, 3, 4, 6, 7, 8, 9.

Rewards: at the end of the game, win 1, draw 0.5, loss 0 (also a forfeit); 0 on every other move. Success: a win.

Episode end: three marks in a row (a row, a column or a diagonal) or a full board. In PettingZoo a seat's
3rd invalid turn forfeits the game (a loss; the other seat wins). In the single-agent view (``ragen/TicTacToe-v0``)
the protocol allows 8 turns (5 moves + 3); running out of turns truncates the episode, scored as a loss.

Opponents (single-agent view, ``opponent=``): ``"random"`` (a uniformly random empty cell), ``"rule"`` (win if it
can, else block the agent's win, else the centre, else a corner, else any cell; ties at random) and ``"perfect"``
(memoised minimax: never loses, takes the quickest win and delays a loss; ties at random).

Arguments (``ragen/TicTacToe-v0``): ``seat`` (``None``: ``seed % 2``; ``0``/``1``), ``opponent`` (default
``"random"``), ``render_mode`` (``None`` or ``"ansi"``).
"""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar

import numpy as np

from ragen_envs.games.base import Opponent, RandomOpponent, WinDrawLossGame
from ragen_envs.games.view import GameEnv

#: The 8 lines of three cells (0-based cell indices).
LINES: tuple[tuple[int, int, int], ...] = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)
)  # fmt: skip
MARKS = ("X", "O")
CENTRE, CORNERS = 4, (0, 2, 6, 8)
_POSITIONS = (
    ("top left", "top-left", "upper left"),
    ("top middle", "top center", "top centre", "top-middle", "top-center"),
    ("top right", "top-right", "upper right"),
    ("middle left", "center left", "centre left", "middle-left"),
    ("center", "centre", "middle", "the center", "the centre", "the middle"),
    ("middle right", "center right", "centre right", "middle-right"),
    ("bottom left", "bottom-left", "lower left"),
    ("bottom middle", "bottom center", "bottom centre", "bottom-middle", "bottom-center"),
    ("bottom right", "bottom-right", "lower right"),
)


def winner_of(board: tuple[int, ...] | list[int]) -> int:
    """The seat (0 or 1) with three in a row on ``board`` (cells: -1 empty, 0 X, 1 O), or -1 for none."""
    for a, b, c in LINES:
        mark = board[a]
        if mark >= 0 and mark == board[b] == board[c]:
            return mark
    return -1


class TicTacToe(WinDrawLossGame):
    """The rules of tic-tac-toe. See the module docstring."""

    name = "tictactoe"
    title = "Tic-tac-toe"
    seat_labels = MARKS
    move_phrase = "an empty cell"
    action_names = tuple(str(i) for i in range(1, 10))
    action_synonyms: ClassVar[dict[str, str]] = {
        **{f"{word} {i}": str(i) for i in range(1, 10) for word in ("cell", "square", "position", "box")},
        **{word: str(i + 1) for i, words in enumerate(_POSITIONS) for word in words},
    }

    def __init__(self) -> None:
        super().__init__()
        self.board: list[int] = [-1] * 9  # last_move: the cell index of each seat's last move

    # ------------------------------------------------------------------ rules
    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.board = [-1] * 9

    def legal_moves(self, seat: int) -> list[str]:
        if self.finished or seat != self.turn:
            return []
        return [str(i + 1) for i, mark in enumerate(self.board) if mark < 0]

    def play(self, seat: int, move: str) -> dict[int, float]:
        cell = int(move) - 1
        self.board[cell] = seat
        self.last_move[seat] = cell
        if winner_of(self.board) == seat:
            return self._finish(seat)
        if all(mark >= 0 for mark in self.board):
            return self._finish(None)
        self.turn = 1 - seat
        return {}

    def max_moves(self, seat: int) -> int:
        return 5 if seat == 0 else 4

    # ------------------------------------------------------------------ text
    def instructions(self, seat: int) -> str:
        me, other = MARKS[seat], MARKS[1 - seat]
        first = "You move first." if seat == 0 else f"{other} moves first."
        return (
            f"You are playing tic-tac-toe as {me} against {other}. {first}\n"
            "Players take turns marking one empty cell of the 3x3 board; three of your marks in a row, a column or "
            "a diagonal wins, and a full board without one is a draw.\n"
            "The cells are numbered 1 to 9, left to right and top to bottom; the board shows the numbers of the "
            "empty cells.\n"
            "Your answer is the number of one empty cell, e.g. 5.\n"
            "Reward: 1 for a win, 0.5 for a draw, 0 for a loss."
        )

    def board_text(self, numbers: bool = True) -> str:
        """The board as three rows; empty cells show their numbers (or ``.`` with ``numbers=False``)."""
        cells = [MARKS[m] if m >= 0 else (str(i + 1) if numbers else ".") for i, m in enumerate(self.board)]
        rows = [f" {cells[r * 3]} | {cells[r * 3 + 1]} | {cells[r * 3 + 2]}" for r in range(3)]
        return "\n---+---+---\n".join(rows)

    def state_text(self, seat: int) -> str:
        lines = [self.state_header(seat), self.board_text()]
        if self.finished:
            lines.append(self.result_line(seat))
        else:
            empty = [str(i + 1) for i, m in enumerate(self.board) if m < 0]
            lines.append(f"Empty cells: {', '.join(empty)}.")
        return "\n".join(lines)

    def last_move_text(self, index: int) -> str:
        return f"played cell {index + 1}"

    def board_view(self) -> list[str]:
        return [MARKS[m] if m >= 0 else "" for m in self.board]

    def spectator_board(self) -> str:
        return self.board_text(numbers=False)


# ---------------------------------------------------------------------------------------------- opponents
def _board_of(view: dict[str, Any]) -> tuple[tuple[int, ...], int]:
    """``(board, me)`` from a state view: cells -1 empty, 0 X, 1 O; ``me`` the seat of the view."""
    board = tuple(MARKS.index(c) if c else -1 for c in view["board"])
    return board, MARKS.index(view["you"])


def _winning_cells(board: tuple[int, ...], seat: int) -> list[int]:
    """Empty cells that would complete a line of ``seat``."""
    cells = []
    for line in LINES:
        marks = [board[i] for i in line]
        if marks.count(seat) == 2 and marks.count(-1) == 1:
            cells.append(line[marks.index(-1)])
    return sorted(set(cells))


class RuleTicTacToe(Opponent):
    """Win if it can, else block the other seat's win, else take the centre, else a corner, else any cell."""

    name = "rule"

    def act(self, view: dict[str, Any], rng: np.random.Generator) -> str:
        board, me = _board_of(view)
        for cells in (_winning_cells(board, me), _winning_cells(board, 1 - me)):
            if cells:
                return str(cells[int(rng.integers(len(cells)))] + 1)
        if board[CENTRE] < 0:
            return str(CENTRE + 1)
        for group in (CORNERS, range(9)):
            free = [i for i in group if board[i] < 0]
            if free:
                return str(free[int(rng.integers(len(free)))] + 1)
        raise ValueError("no empty cell: the game is over")


@cache
def solve(board: tuple[int, ...]) -> int:
    """The minimax value of ``board`` for the seat to move: ``> 0`` a win, ``0`` a draw, ``< 0`` a loss.

    Wins count ``1 + empty cells left`` when they happen (quicker wins score higher), losses the negative. Memoised
    on the board (5,478 reachable positions), so a whole game tree is solved once per process.
    """
    empty = [i for i, mark in enumerate(board) if mark < 0]
    last = winner_of(board)
    if last >= 0:  # the previous mover completed a line: the seat to move has lost
        return -(1 + len(empty))
    if not empty:
        return 0
    seat = (9 - len(empty)) % 2
    best = -100
    for cell in empty:
        child = board[:cell] + (seat,) + board[cell + 1 :]
        best = max(best, -solve(child))
    return best


def best_moves(board: tuple[int, ...]) -> list[int]:
    """The cells (0-based) of every optimal move on ``board`` for the seat to move."""
    empty = [i for i, mark in enumerate(board) if mark < 0]
    seat = (9 - len(empty)) % 2
    scores = [-solve(board[:c] + (seat,) + board[c + 1 :]) for c in empty]
    top = max(scores)
    return [c for c, s in zip(empty, scores) if s == top]


class PerfectTicTacToe(Opponent):
    """Minimax over the whole game tree (memoised): never loses; prefers quick wins and slow losses."""

    name = "perfect"

    def act(self, view: dict[str, Any], rng: np.random.Generator) -> str:
        board, _ = _board_of(view)
        cells = best_moves(board)
        return str(cells[int(rng.integers(len(cells)))] + 1)


#: The opponents of the single-agent view, by name.
OPPONENTS: dict[str, type[Opponent]] = {
    "random": RandomOpponent,
    "rule": RuleTicTacToe,
    "perfect": PerfectTicTacToe,
}


class TicTacToeEnv(GameEnv):
    """``ragen/TicTacToe-v0``: one seat of tic-tac-toe against a fixed opponent. See the module docstring."""

    core_cls = TicTacToe
    opponents = OPPONENTS
