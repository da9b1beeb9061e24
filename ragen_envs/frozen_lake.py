"""FrozenLake as a text env: walk over a slippery frozen lake to the goal without falling into a hole.

The reference code's FrozenLake: a random map per seed (``size`` x ``size``, each tile frozen with probability ``p``,
random start and goal cells, redrawn until the goal is reachable from the start), and a slippery lake on which a move
goes in the intended direction with probability ``success_rate`` and otherwise to one of the two perpendicular
directions (the rest split equally). With ``map_name="4x4"``/``"8x8"`` or ``desc=[...]`` it plays gymnasium's own
fixed maps instead (start ``S`` top-left, goal ``G`` bottom-right), with the same dynamics as gymnasium's
``FrozenLake-v1``.

Action space: ``UnicodeText``; valid actions are ``Left``, ``Down``, ``Right``, ``Up`` (case-insensitive; also
``west``/``south``/``east``/``north``, ``move left``/``go left``, arrows ``←↓→↑``). Moving off the edge keeps the
player in place (an ineffective action).

Observation: the grid, one row per line, one symbol per cell: ``P`` player, ``_`` frozen, ``O`` hole, ``G`` goal,
``X`` player in a hole, ``√`` player on the goal. Positions in prompts and claims are ``(row, col)`` from the top-left.
The reference writes a row's symbols with nothing between them (``P__O``), which a BPE tokenizer merges (``__``), so a
cell's column is not a token position; ``cell_separator=" "`` writes ``P _ _ O`` instead (one token per cell).

Rewards: ``1`` on reaching the goal, else ``0``.

Episode end: terminated on reaching the goal or falling into a hole. Through the protocol (reference defaults): up to
5 actions per turn, 10 actions per episode, 5 turns.

Arguments:
    size: side of the random maps (2..64; reference 4).
    p: probability that a tile of a random map is frozen (0 < p <= 1; reference 0.8).
    is_slippery: whether moves can slip (reference True).
    success_rate: probability of moving in the intended direction on a slippery lake (0..1; reference 1/3).
    cell_separator: text between a row's cells in the observation: ``""`` (the reference's) or ``" "``.
    map_name: ``"4x4"`` or ``"8x8"``: gymnasium's fixed maps; overrides ``size`` and ``p``.
    desc: a fixed map as rows of ``S`` (start), ``F`` (frozen), ``H`` (hole), ``G`` (goal), like gymnasium's ``desc``.
    render_mode: ``None``, ``"ansi"`` (the text grid) or ``"rgb_array"`` (a picture, 32 px per cell).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragen_envs import grounding
from ragen_envs.core import BaseTextEnv, StepOutcome, check_arg
from ragen_envs.rendering import CellStyle, draw_grid

#: gymnasium's fixed maps (``gymnasium.envs.toy_text.frozen_lake.MAPS``), reproduced so that importing this module
#: does not import gymnasium's toy-text package.
MAPS: dict[str, list[str]] = {
    "4x4": ["SFFF", "FHFH", "FFFH", "HFFG"],
    "8x8": [
        "SFFFFFFF",
        "FFFFFFFF",
        "FFFHFFFF",
        "FFFFFHFF",
        "FFFHFFFF",
        "FHHFFFHF",
        "FHFFHFHF",
        "FFFHFFFG",
    ],
}

#: ``cell_separator`` values: the reference's rows (``""``) or one space between cells.
CELL_SEPARATORS: tuple[str, ...] = ("", " ")

LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
ACTIONS: tuple[str, ...] = ("Left", "Down", "Right", "Up")  # gymnasium's action order
_DELTAS: tuple[tuple[int, int], ...] = ((0, -1), (1, 0), (0, 1), (-1, 0))

# Cell codes of the map array; the player is drawn over them.
FROZEN, HOLE, GOAL = 0, 1, 2
_SYMBOLS = {FROZEN: "_", HOLE: "O", GOAL: "G"}
PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "P", "X", "√"

_STYLES = {
    FROZEN: CellStyle((200, 230, 250)),
    HOLE: CellStyle((30, 60, 110)),
    GOAL: CellStyle((200, 230, 250), "square", (60, 170, 60)),
    3: CellStyle((200, 230, 250), "disc", (220, 60, 40)),  # player
    4: CellStyle((30, 60, 110), "cross", (220, 60, 40)),  # player in a hole
    5: CellStyle((60, 170, 60), "disc", (220, 60, 40)),  # player on the goal
}

# Words that name an entity in a claim of the thinking (see ragen_envs.grounding).
_PLAYER_WORDS = (
    *("i am", "i'm", "im at", "i stand", "i'm standing", "player", "my position", "my location"),
    *("me", "agent", "p is", "currently"),
)
_GOAL_WORDS = ("goal", "target", "g is", "gift", "destination")
_HOLE_WORDS = ("hole", "holes", "o is", "o's", "danger", "trap", "traps")
_OUTCOME_WORDS = {
    "hole": ("hole", "holes", "fall", "falls", "falling", "fell"),
    "goal": ("goal", "target", "win", "destination"),
    "edge": ("edge", "wall", "boundary", "border", "out of bounds", "off the grid", "off the map", "stay in place"),
}


def reachable(grid: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> bool:
    """Whether ``goal`` can be reached from ``start`` over non-hole cells with 4-neighbour moves."""
    nrow, ncol = grid.shape
    return _reachable_flat(
        (grid != HOLE).ravel().tolist(), nrow, ncol, start[0] * ncol + start[1], goal[0] * ncol + goal[1]
    )


def _reachable_flat(free: list[bool], nrow: int, ncol: int, first: int, target: int) -> bool:
    # Depth-first search on plain Python lists: a 4x4 map takes a few microseconds.
    seen = [False] * (nrow * ncol)
    seen[first] = True
    stack = [first]
    while stack:
        cell = stack.pop()
        if cell == target:
            return True
        r, c = divmod(cell, ncol)
        for nxt, ok in ((cell - 1, c > 0), (cell + 1, c < ncol - 1), (cell - ncol, r > 0), (cell + ncol, r < nrow - 1)):
            if ok and free[nxt] and not seen[nxt]:
                seen[nxt] = True
                stack.append(nxt)
    return False


def shortest_path(grid: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[str] | None:
    """Action names of a shortest hole-free path from ``start`` to ``goal`` (ignoring slipping), or ``None``."""
    nrow, ncol = grid.shape
    parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        cell = frontier.popleft()
        if cell == goal:
            path: list[str] = []
            while parent[cell] is not None:
                cell, action = parent[cell]  # type: ignore[misc]
                path.append(ACTIONS[action])
            return path[::-1]
        for action, (dr, dc) in enumerate(_DELTAS):
            nr, nc = cell[0] + dr, cell[1] + dc
            if 0 <= nr < nrow and 0 <= nc < ncol and (nr, nc) not in parent and grid[nr, nc] != HOLE:
                parent[(nr, nc)] = (cell, action)
                frontier.append((nr, nc))
    return None


def transition_model(view: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The dynamics of a :meth:`FrozenLakeEnv.state_view`: transition tensor ``P[s, a, s']`` (gymnasium's slip model:
    the intended move with probability ``success_rate``, each perpendicular one with half the rest; a move off the edge
    stays), the goal indicator and the terminal mask (holes and goal absorb)."""
    nrow, ncol = view["size"]
    n = nrow * ncol
    holes = {tuple(h) for h in view["holes"]}
    goal = tuple(view["goal"])
    sr = float(view.get("success_rate", 1.0)) if view.get("slippery", True) else 1.0
    terminal = np.zeros(n, bool)
    is_goal = np.zeros(n)
    P = np.zeros((n, 4, n))
    for r in range(nrow):
        for c in range(ncol):
            s = r * ncol + c
            if (r, c) in holes or (r, c) == goal:
                terminal[s] = True
                is_goal[s] = float((r, c) == goal)
                P[s, :, s] = 1.0
                continue
            for a in range(4):
                for moved, p in ((a, sr), ((a - 1) % 4, (1 - sr) / 2), ((a + 1) % 4, (1 - sr) / 2)):
                    if p <= 0:
                        continue
                    dr, dc = _DELTAS[moved]
                    nr, nc = r + dr, c + dc
                    if not (0 <= nr < nrow and 0 <= nc < ncol):
                        nr, nc = r, c
                    P[s, a, nr * ncol + nc] += p
    return P, is_goal, terminal


def reach_values(
    P: np.ndarray, is_goal: np.ndarray, terminal: np.ndarray, horizon: int, gamma: float = 1.0
) -> list[np.ndarray]:
    """Finite-horizon value iteration: ``V[h][s]``, the highest (``gamma``-discounted) probability of reaching the
    goal from ``s`` within ``h`` more moves, for ``h = 0..horizon``."""
    values = [is_goal.copy()]
    for _ in range(horizon):
        q = P @ values[-1]  # (n, 4)
        values.append(np.where(terminal, is_goal, gamma * q.max(axis=1)))
    return values


def best_action(view: dict[str, Any], steps_left: int) -> tuple[str, float]:
    """The move that maximises the chance of reaching the goal within ``steps_left`` moves, and that chance.

    Finite-horizon dynamic programming (:func:`reach_values`) over the slippery dynamics read from ``view``
    (:func:`transition_model`): an optimal reference agent for the demo, tests and the leaderboard.
    """
    P, is_goal, terminal = transition_model(view)
    s = view["player"][0] * view["size"][1] + view["player"][1]
    horizon = max(1, steps_left)
    # A slight discount breaks ties towards reaching the goal sooner; the chance reported is undiscounted.
    discounted = P[s] @ reach_values(P, is_goal, terminal, horizon - 1, gamma=0.999)[-1]
    a = int(np.argmax(discounted))
    return ACTIONS[a], float(P[s, a] @ reach_values(P, is_goal, terminal, horizon - 1)[-1])


def generate_random_map(
    rng: np.random.Generator, size: int = 4, p: float = 0.8, max_tries: int = 100_000
) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """A random solvable map as the reference draws it: ``(grid, start, goal)``.

    Every tile is frozen with probability ``p`` (else a hole); start and goal are two distinct random cells; the draw
    is repeated until the goal is reachable from the start.
    """
    n = size * size
    for _ in range(max_tries):
        draws = rng.random(n + 2).tolist()  # one call: n tiles, then start and goal
        free = [u < p for u in draws[:n]]
        start_index = min(int(draws[n] * n), n - 1)
        goal_index = min(int(draws[n + 1] * (n - 1)), n - 2)
        goal_index += goal_index >= start_index  # two distinct cells, uniformly
        free[start_index] = free[goal_index] = True
        if _reachable_flat(free, size, size, start_index, goal_index):
            grid = np.array([FROZEN if f else HOLE for f in free], np.int8).reshape(size, size)
            start, goal = divmod(start_index, size), divmod(goal_index, size)
            grid[goal] = GOAL
            return grid, start, goal
    raise RuntimeError(f"no solvable {size}x{size} map with p={p} in {max_tries} draws; raise p")


def parse_desc(desc: Sequence[str]) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """``(grid, start, goal)`` of a gymnasium-style map (rows of ``S``, ``F``, ``H``, ``G``); ``ValueError`` if bad."""
    rows = (
        [row.decode() if isinstance(row, bytes) else row for row in desc]
        if isinstance(desc, Sequence) and not isinstance(desc, (str, bytes))
        else None
    )
    check_arg(
        rows is not None and len(rows) >= 1 and all(isinstance(r, str) for r in rows),
        "desc",
        desc,
        "a list of equal-length strings of S, F, H, G",
    )
    assert rows is not None
    width = len(rows[0])
    check_arg(width >= 1 and all(len(r) == width for r in rows), "desc", desc, "rows of equal, non-zero length")
    text = "".join(rows)
    check_arg(set(text) <= set("SFHG"), "desc", desc, "only the letters S, F, H, G")
    check_arg(text.count("S") == 1 and text.count("G") == 1, "desc", desc, "exactly one S and one G")
    grid = np.array([[HOLE if ch == "H" else GOAL if ch == "G" else FROZEN for ch in r] for r in rows], np.int8)
    start = divmod(text.index("S"), width)
    goal = divmod(text.index("G"), width)
    return grid, (int(start[0]), int(start[1])), (int(goal[0]), int(goal[1]))


class FrozenLakeEnv(BaseTextEnv):
    """Slippery grid walk to a goal past holes. See the module docstring for spaces, rewards and arguments."""

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    action_names = ACTIONS
    # Compass words, "move/go/step <direction>" and arrows, besides the names themselves (any case).
    action_synonyms = {
        **grounding.DIRECTION_WORDS,
        **{
            f"{verb} {word}": name
            for verb in ("move", "go", "step")
            for word, name in grounding.DIRECTION_WORDS.items()
        },
        **{"←": "Left", "↓": "Down", "→": "Right", "↑": "Up"},
    }
    max_action_chars = 1024
    # RAGEN config/envs.yaml FrozenLake env_instruction (verbatim, its spelling included) and FrozenLakeEnvConfig's
    # grid_vocab / action_lookup, which its context manager appends.
    reference_instruction = (
        "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to the unintended "
        "direction due to the slippery ice. Example answer format: <think>To forbid the hole and go to the target, I "
        "should go left then go up.</think><answer>Left || Up</answer>"
    )
    reference_legend = {
        "P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole", "√": "player on goal"
    }  # fmt: skip
    reference_lists_actions = True

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        *,
        is_slippery: bool = True,
        success_rate: float = 1.0 / 3.0,
        cell_separator: str = "",
        map_name: str | None = None,
        desc: Sequence[str] | None = None,
        render_mode: str | None = None,
    ) -> None:
        check_arg(
            isinstance(size, int) and not isinstance(size, bool) and 2 <= size <= 64, "size", size, "an int in 2..64"
        )
        check_arg(
            isinstance(p, (int, float)) and not isinstance(p, bool) and 0.0 < p <= 1.0, "p", p, "a float in (0, 1]"
        )
        check_arg(isinstance(is_slippery, bool), "is_slippery", is_slippery, "True or False")
        check_arg(
            isinstance(success_rate, (int, float))
            and not isinstance(success_rate, bool)
            and 0.0 <= success_rate <= 1.0,
            "success_rate",
            success_rate,
            "a probability in [0, 1]",
        )
        check_arg(cell_separator in CELL_SEPARATORS, "cell_separator", cell_separator, f"one of {CELL_SEPARATORS}")
        check_arg(
            map_name is None or (isinstance(map_name, str) and map_name in MAPS),
            "map_name",
            map_name,
            f"None or one of {sorted(MAPS)}",
        )
        check_arg(desc is None or map_name is None, "desc", desc, "None when map_name is given (use one of the two)")
        super().__init__(render_mode=render_mode)
        self.size = size
        self.p = float(p)
        self.is_slippery = is_slippery
        self.success_rate = float(success_rate) if is_slippery else 1.0
        self.cell_separator = cell_separator
        self.map_name = map_name
        self._fixed = parse_desc(MAPS[map_name] if map_name is not None else desc) if (map_name or desc) else None
        # Slip thresholds on one uniform draw: [0, a) intended, [a, b) the next direction counter-clockwise
        # in gymnasium's order ((a - 1) % 4), [b, 1) the other perpendicular one ((a + 1) % 4).
        self._slip_a = self.success_rate
        self._slip_b = self.success_rate + (1.0 - self.success_rate) / 2.0
        self._grid = np.zeros((1, 1), np.int8)
        self._start = self._goal = self._pos = (0, 0)
        self._status = "playing"  # "playing", "hole", "goal"
        self._texts: dict[tuple[tuple[int, int], str], str] = {}
        self._rows: list[str] = []
        self._holes: list[list[int]] = []

    # ------------------------------------------------------------------ text
    @property
    def instructions(self) -> str:
        slip = (
            f"The ice is slippery: a move goes the way you chose with probability {self.success_rate:.2g}, otherwise "
            "to one of the two perpendicular directions."
            if self.is_slippery and self.success_rate < 1.0
            else "The ice is not slippery: every move goes the way you chose."
        )
        return (
            "You are solving the FrozenLake puzzle: walk from your position to the goal without falling into a hole.\n"
            f"{slip}\n"
            f"Symbols: {PLAYER} you, _ frozen ice, O hole, G goal, {PLAYER_IN_HOLE} you in a hole, "
            f"{PLAYER_ON_GOAL} you on the goal. Positions are (row, col), counted from 0 at the top-left.\n"
            "Actions: Left, Down, Right, Up. Moving off the edge leaves you in place.\n"
            "Reward: 1 for reaching the goal, else 0. Falling into a hole ends the game."
        )

    def _drawn_rows(self) -> list[str]:
        """The map's rows with the player drawn in, one symbol per cell and nothing between them."""
        r, c = self._pos
        symbol = {"playing": PLAYER, "hole": PLAYER_IN_HOLE, "goal": PLAYER_ON_GOAL}[self._status]
        rows = list(self._rows)
        rows[r] = rows[r][:c] + symbol + rows[r][c + 1 :]
        return rows

    def state_text(self) -> str:
        key = (self._pos, self._status)
        text = self._texts.get(key)
        if text is None:  # at most 3 * size * size variants per map: cache them
            text = "\n".join(self.cell_separator.join(row) for row in self._drawn_rows())
            self._texts[key] = text
        return text

    def state_view(self) -> dict[str, Any]:
        return {
            "size": [int(self._grid.shape[0]), int(self._grid.shape[1])],
            "player": [self._pos[0], self._pos[1]],
            "goal": [self._goal[0], self._goal[1]],
            "holes": [list(h) for h in self._holes],
            "grid": self._drawn_rows(),
            "status": self._status,
            "slippery": self.is_slippery,
            "success_rate": self.success_rate,
        }

    # ------------------------------------------------------------------ dynamics
    def _reset_state(self, options: dict[str, Any] | None) -> None:
        if self._fixed is not None:
            grid, start, goal = self._fixed
            grid = grid.copy()
        else:
            grid, start, goal = generate_random_map(self.np_random, self.size, self.p)
        self._grid, self._start, self._goal, self._pos = grid, start, goal, start
        self._status = "playing"
        self._texts = {}
        self._rows = ["".join([_SYMBOLS[v] for v in row]) for row in grid.tolist()]
        ncol = grid.shape[1]
        self._holes = [list(divmod(i, ncol)) for i, v in enumerate(grid.ravel().tolist()) if v == HOLE]

    def _apply_action(self, action: str) -> StepOutcome:
        if self._status != "playing":  # the episode has ended; further moves change nothing
            return StepOutcome(terminated=True, success=self._status == "goal", extra={"slipped": False})
        intended = ACTIONS.index(action)
        moved = intended
        if self.success_rate < 1.0:
            u = self.np_random.random()
            if u >= self._slip_a:
                moved = (intended - 1) % 4 if u < self._slip_b else (intended + 1) % 4
        dr, dc = _DELTAS[moved]
        r, c = self._pos
        nrow, ncol = self._grid.shape
        nr, nc = r + dr, c + dc
        if not (0 <= nr < nrow and 0 <= nc < ncol):
            nr, nc = r, c
        self._pos = (nr, nc)
        cell = self._grid[nr, nc]
        reward = 0.0
        if cell == HOLE:
            self._status = "hole"
        elif cell == GOAL:
            self._status = "goal"
            reward = 1.0
        return StepOutcome(
            reward=reward,
            terminated=self._status != "playing",
            effective=(nr, nc) != (r, c),
            success=self._status == "goal",
            extra={"slipped": moved != intended, "moved": ACTIONS[moved]},
        )

    def is_success(self) -> bool:
        return self._status == "goal"

    # ------------------------------------------------------------------ rendering
    def render_rgb(self) -> np.ndarray:
        codes = self._grid.astype(np.int64).copy()
        codes[self._pos] = {"playing": 3, "hole": 4, "goal": 5}[self._status]
        return draw_grid(codes, _STYLES, tile=32)

    # ------------------------------------------------------------------ reasoning checks
    def outcomes_of(self, direction: str, view: dict[str, Any]) -> set[str]:
        """What the intended (unslipped) move ``direction`` does from the state ``view``: hole, goal or edge."""
        r, c = view["player"]
        dr, dc = _DELTAS[ACTIONS.index(direction)]
        nrow, ncol = view["size"]
        nr, nc = r + dr, c + dc
        if not (0 <= nr < nrow and 0 <= nc < ncol):
            return {"edge"}
        if [nr, nc] == view["goal"]:
            return {"goal"}
        if [nr, nc] in view["holes"]:
            return {"hole"}
        return set()

    def check_reasoning(self, think: str, view_before: dict[str, Any], actions: list[str]) -> dict[str, int]:
        """Verify what the thinking claims about the state it saw.

        Recognised claims (see :mod:`ragen_envs.grounding`): positions of the player, the goal and holes
        (``"I am at (0, 1)"``, ``"holes at (1,1) and (2,3)"``), outcomes of moves (``"moving down leads to a hole"``,
        ``"going right reaches the goal"``, ``"left hits the edge"``; judged on the intended, unslipped move), and
        where the goal lies (``"the goal is below me"``).
        """
        if not think:
            return {"supported": 0, "contradicted": 0}
        player = tuple(view_before["player"])
        goal = tuple(view_before["goal"])
        locations = {"player": {player}, "goal": {goal}, "hole": {tuple(h) for h in view_before["holes"]}}
        keywords = {"player": _PLAYER_WORDS, "goal": _GOAL_WORDS, "hole": _HOLE_WORDS}
        s1, c1 = grounding.check_position_claims(think, locations, keywords)
        s2, c2 = grounding.check_move_claims(think, lambda d: self.outcomes_of(d, view_before), _OUTCOME_WORDS)
        s3, c3 = grounding.check_relative_claims(think, _GOAL_WORDS, player, {goal})  # type: ignore[arg-type]
        return {"supported": s1 + s2 + s3, "contradicted": c1 + c2 + c3}
