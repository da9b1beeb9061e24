"""Connect Four as a text game: two seats take turns dropping pieces into a 7-column, 6-row grid; four in a line wins.

Seats: seat 0 plays ``X`` and moves first, seat 1 plays ``O`` (PettingZoo agents ``player_0`` and ``player_1``).

Action (one per turn): the number of a column that is not full, ``1``-``7`` from the left; the piece falls to the
lowest empty row of that column. With ``lenient_actions=True`` also ``column 4`` / ``col 4``. A full column, a number
out of range or anything else is an invalid turn.

Observation (seat ``O``; row 1 is the top)::

    You are O. X dropped a piece in column 4.
     1 2 3 4 5 6 7
     . . . . . . .
     . . . . . . .
     . . . . . . .
     . . . . . . .
     . . . . . . .
     . . . X . . .
    Columns with room: 1, 2, 3, 4, 5, 6, 7.

Rewards: at the end of the game, win 1, draw 0.5, loss 0 (also a forfeit); 0 on every other move. Success: a win.

Episode end: four pieces of a seat in a row, a column or a diagonal, or a full grid (a draw). In PettingZoo a
seat's 3rd invalid turn forfeits the game (a loss; the other seat wins). In the single-agent view
(``ragen/ConnectFour-v0``) the protocol allows 24 turns (21 moves + 3); running out of turns truncates the episode,
scored as a loss.

Opponents (single-agent view, ``opponent=``): ``"random"`` (a uniformly random column with room) and ``"rule"`` (win
if it can, else block the agent's immediate win, else avoid columns that hand the agent a win on top, preferring
columns nearer the centre; ties at random).

Arguments (``ragen/ConnectFour-v0``): ``seat`` (``None``: ``seed % 2``; ``0``/``1``), ``opponent`` (default
``"random"``), ``render_mode`` (``None`` or ``"ansi"``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ragen_envs.games.base import Opponent, RandomOpponent, WinDrawLossGame
from ragen_envs.games.view import GameEnv

ROWS, COLUMNS, CONNECT = 6, 7, 4
MARKS = ("X", "O")
_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


def drop_row(board: list[list[int]], column: int) -> int:
    """The row a piece dropped into ``column`` lands on (row 0 is the top), or -1 when the column is full."""
    for row in range(ROWS - 1, -1, -1):
        if board[row][column] < 0:
            return row
    return -1


def connects(board: list[list[int]], row: int, column: int, seat: int) -> bool:
    """Whether a piece of ``seat`` at ``(row, column)`` (placed or imagined) makes four in a line."""
    for dr, dc in _DIRECTIONS:
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < ROWS and 0 <= c < COLUMNS and board[r][c] == seat:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= CONNECT:
            return True
    return False


class ConnectFour(WinDrawLossGame):
    """The rules of Connect Four (7 columns, 6 rows). See the module docstring."""

    name = "connect_four"
    title = "Connect Four"
    seat_labels = MARKS
    move_phrase = "a column with room"
    action_names = tuple(str(c) for c in range(1, COLUMNS + 1))
    action_synonyms: ClassVar[dict[str, str]] = {
        f"{word} {c}": str(c) for c in range(1, COLUMNS + 1) for word in ("column", "col", "c", "drop", "drop in")
    }

    def __init__(self) -> None:
        super().__init__()
        self.board: list[list[int]] = [[-1] * COLUMNS for _ in range(ROWS)]  # last_move: each seat's last column
        self.moves = 0

    # ------------------------------------------------------------------ rules
    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.board = [[-1] * COLUMNS for _ in range(ROWS)]
        self.moves = 0

    def legal_moves(self, seat: int) -> list[str]:
        if self.finished or seat != self.turn:
            return []
        return [str(c + 1) for c in range(COLUMNS) if self.board[0][c] < 0]

    def play(self, seat: int, move: str) -> dict[int, float]:
        column = int(move) - 1
        row = drop_row(self.board, column)
        self.board[row][column] = seat
        self.moves += 1
        self.last_move[seat] = column
        if connects(self.board, row, column, seat):
            return self._finish(seat)
        if self.moves == ROWS * COLUMNS:
            return self._finish(None)
        self.turn = 1 - seat
        return {}

    def max_moves(self, seat: int) -> int:
        return ROWS * COLUMNS // 2

    # ------------------------------------------------------------------ text
    def instructions(self, seat: int) -> str:
        me, other = MARKS[seat], MARKS[1 - seat]
        first = "You move first." if seat == 0 else f"{other} moves first."
        return (
            f"You are playing Connect Four as {me} against {other}. {first}\n"
            f"The grid has {COLUMNS} columns and {ROWS} rows. Players take turns dropping one piece into a column "
            "that is not full; it falls to the lowest empty row. Four of your pieces in a line (across, up and down, "
            "or diagonally) win; a full grid without one is a draw.\n"
            f"The grid is shown with row 1 at the top; '.' is empty. Your answer is a column number from 1 to "
            f"{COLUMNS}, e.g. 4.\n"
            "Reward: 1 for a win, 0.5 for a draw, 0 for a loss."
        )

    def grid_text(self) -> str:
        """The grid with a header of column numbers, top row first."""
        header = " " + " ".join(str(c + 1) for c in range(COLUMNS))
        rows = [" " + " ".join(MARKS[v] if v >= 0 else "." for v in row) for row in self.board]
        return "\n".join([header, *rows])

    def state_text(self, seat: int) -> str:
        lines = [self.state_header(seat), self.grid_text()]
        if self.finished:
            lines.append(self.result_line(seat))
        else:
            room = [str(c + 1) for c in range(COLUMNS) if self.board[0][c] < 0]
            lines.append(f"Columns with room: {', '.join(room)}.")
        return "\n".join(lines)

    def last_move_text(self, index: int) -> str:
        return f"dropped a piece in column {index + 1}"

    def board_view(self) -> list[str]:
        return ["".join(MARKS[v] if v >= 0 else "." for v in row) for row in self.board]

    def spectator_board(self) -> str:
        return self.grid_text()


# ---------------------------------------------------------------------------------------------- opponents
def _board_of(view: dict[str, Any]) -> tuple[list[list[int]], int]:
    board = [[MARKS.index(ch) if ch in MARKS else -1 for ch in row] for row in view["board"]]
    return board, MARKS.index(view["you"])


def winning_columns(board: list[list[int]], seat: int) -> list[int]:
    """Columns (0-based) where a piece of ``seat`` would connect four now."""
    found = []
    for column in range(COLUMNS):
        row = drop_row(board, column)
        if row >= 0 and connects(board, row, column, seat):
            found.append(column)
    return found


class RuleConnectFour(Opponent):
    """Win, else block, else a column that does not hand the other seat a win, nearest the centre first."""

    name = "rule"

    def act(self, view: dict[str, Any], rng: np.random.Generator) -> str:
        board, me = _board_of(view)
        other = 1 - me
        for columns in (winning_columns(board, me), winning_columns(board, other)):
            if columns:
                return str(columns[int(rng.integers(len(columns)))] + 1)
        legal = [c for c in range(COLUMNS) if board[0][c] < 0]
        safe = []
        for column in legal:
            row = drop_row(board, column)
            # Playing here lets the other seat drop on top of this piece: unsafe if that spot connects for it.
            if not (row > 0 and connects(board, row - 1, column, other)):
                safe.append(column)
        candidates = safe or legal
        centre = (COLUMNS - 1) / 2
        nearest = min(abs(c - centre) for c in candidates)
        best = [c for c in candidates if abs(c - centre) == nearest]
        return str(best[int(rng.integers(len(best)))] + 1)


#: The opponents of the single-agent view, by name.
OPPONENTS: dict[str, type[Opponent]] = {"random": RandomOpponent, "rule": RuleConnectFour}


class ConnectFourEnv(GameEnv):
    """``ragen/ConnectFour-v0``: one seat of Connect Four against a fixed opponent. See the module docstring."""

    core_cls = ConnectFour
    opponents = OPPONENTS
