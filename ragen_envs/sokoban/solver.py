"""An optimal Sokoban solver: A* over pushes, move-optimal, with dead-square and freeze-deadlock pruning.

A search node is the state right after a push (box cells and the exact player cell); an edge is one push, and its
cost is the player's shortest walk to the pushing cell plus the push itself. Every move sequence is a walk-push-walk
sequence, so the cheapest node path is a solution with the fewest *moves* (``objective="moves"``, the default); with
``objective="pushes"`` each push costs 1 and the plan has the fewest pushes.

Pruning never removes a solvable state:

* **dead squares**: floor cells from which a box can reach no target, even alone in the room (found by pulling a box
  from every target); a box pushed onto one makes the level unsolvable;
* **freeze deadlocks**: a box pushed into a 2x2 block of walls and boxes that holds a box off target: none of those
  boxes can ever move again.

The heuristic (sum over boxes of the pushes to the nearest target, ignoring other boxes) never overestimates and
changes by at most 1 per push, so A* returns an optimal plan. Used to verify generated levels, report their difficulty
and act as the oracle agent.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ragen_envs.core import check_arg

ACTIONS: tuple[str, ...] = ("Up", "Down", "Left", "Right")
_DELTAS = ((-1, 0), (1, 0), (0, -1), (0, 1))
_INF = 1 << 30


@dataclass
class Solution:
    """A plan that solves a level: ``actions`` (Up/Down/Left/Right), its move and push counts, search effort."""

    actions: list[str]
    moves: int
    pushes: int
    expanded: int
    optimal: bool = True


class SokobanBoard:
    """The static part of a level, precomputed for search and deadlock checks.

    Args:
        fixed: ``(rows, cols)`` array, 0 wall, 1 floor, 2 target (as :class:`~ragen_envs.sokoban.generator.Level`).
    """

    def __init__(self, fixed: np.ndarray) -> None:
        fixed = np.asarray(fixed)
        check_arg(fixed.ndim == 2, "fixed", fixed.shape, "a 2-D array of cell codes")
        self.rows, self.cols = int(fixed.shape[0]), int(fixed.shape[1])
        # Pad with a wall border so that neighbours of any cell exist and are walls outside the room.
        rows, cols = self.rows + 2, self.cols + 2
        self.prow, self.pcol = rows, cols
        grid = np.zeros((rows, cols), dtype=np.int8)
        grid[1:-1, 1:-1] = fixed
        flat = grid.ravel().tolist()
        self.floor = [v != 0 for v in flat]
        self.target = [v == 2 for v in flat]
        self.targets = [i for i, v in enumerate(flat) if v == 2]
        self.steps = (-cols, cols, -1, 1)
        self.ncells = rows * cols
        self._live_dist = self._pull_distances()
        self.dead = [self.floor[i] and self._live_dist[i] >= _INF for i in range(self.ncells)]

    # ---- coordinates
    def cell(self, rc: tuple[int, int]) -> int:
        return (rc[0] + 1) * self.pcol + rc[1] + 1

    def rc(self, cell: int) -> tuple[int, int]:
        r, c = divmod(cell, self.pcol)
        return r - 1, c - 1

    # ---- static analysis
    def _pull_distances(self) -> list[int]:
        """Pushes a lone box needs from each cell to its nearest target (``_INF``: never), by pulling from targets."""
        dist = [_INF] * self.ncells
        queue: deque[int] = deque()
        for t in self.targets:
            dist[t] = 0
            queue.append(t)
        floor = self.floor
        while queue:
            x = queue.popleft()
            for s in self.steps:
                y, z = x + s, x + 2 * s  # the box moves to y, the pulling player stands on z
                if floor[y] and floor[z] and dist[y] == _INF:
                    dist[y] = dist[x] + 1
                    queue.append(y)
        return dist

    def heuristic(self, boxes: Iterable[int]) -> int:
        return sum(self._live_dist[b] for b in boxes)

    def frozen(self, boxes: set[int] | frozenset[int], cell: int) -> bool:
        """Whether a box on ``cell`` sits in a 2x2 block of walls/boxes holding a box off target (a freeze)."""
        floor, target, cols = self.floor, self.target, self.pcol
        for corner in (cell, cell - 1, cell - cols, cell - cols - 1):
            block = (corner, corner + 1, corner + cols, corner + cols + 1)
            if all((not floor[x]) or x in boxes for x in block) and any(x in boxes and not target[x] for x in block):
                return True
        return False

    def deadlocked(self, boxes: Iterable[int]) -> bool:
        """Cheap unsolvability test of a whole state: a box off target on a dead square or in a frozen block."""
        box_set = set(boxes)
        return any(not self.target[b] and (self.dead[b] or self.frozen(box_set, b)) for b in box_set)

    def reach(self, player: int, boxes: set[int] | frozenset[int]) -> tuple[dict[int, int], dict[int, int]]:
        """Walking distances from ``player`` to every reachable cell, and each cell's predecessor."""
        dist = {player: 0}
        prev: dict[int, int] = {}
        queue = deque([player])
        floor = self.floor
        while queue:
            x = queue.popleft()
            d = dist[x] + 1
            for s in self.steps:
                y = x + s
                if floor[y] and y not in boxes and y not in dist:
                    dist[y] = d
                    prev[y] = x
                    queue.append(y)
        return dist, prev

    def walk(self, player: int, goal: int, boxes: set[int] | frozenset[int]) -> list[str]:
        """Actions of a shortest walk from ``player`` to ``goal`` around ``boxes``."""
        _, prev = self.reach(player, boxes)
        path: list[str] = []
        x = goal
        while x != player:
            p = prev[x]
            path.append(ACTIONS[self.steps.index(x - p)])
            x = p
        path.reverse()
        return path


def solve(
    fixed: np.ndarray,
    boxes: Iterable[tuple[int, int]],
    player: tuple[int, int],
    *,
    objective: str = "moves",
    max_expansions: int = 2_000_000,
) -> Solution | None:
    """Solve a level optimally; ``None`` when it is unsolvable or ``max_expansions`` nodes did not suffice.

    Args:
        fixed: ``(rows, cols)`` cell codes, 0 wall, 1 floor, 2 target.
        boxes: box cells ``(row, col)``; as many as targets.
        player: the player's cell.
        objective: ``"moves"`` (fewest steps) or ``"pushes"`` (fewest pushes).
        max_expansions: search budget in expanded nodes.
    """
    check_arg(objective in ("moves", "pushes"), "objective", objective, "'moves' or 'pushes'")
    check_arg(isinstance(max_expansions, int) and max_expansions >= 1, "max_expansions", max_expansions, "an int >= 1")
    board = SokobanBoard(fixed)
    start_boxes = frozenset(board.cell(b) for b in boxes)
    start_player = board.cell(player)
    check_arg(len(start_boxes) == len(board.targets), "boxes", sorted(boxes), f"{len(board.targets)} distinct cells")
    check_arg(board.floor[start_player] and start_player not in start_boxes, "player", player, "a free floor cell")
    for b in start_boxes:
        check_arg(board.floor[b], "boxes", sorted(boxes), "cells on the floor")
    targets = frozenset(board.targets)
    if start_boxes == targets:
        return Solution(actions=[], moves=0, pushes=0, expanded=0)
    if board.deadlocked(start_boxes):
        return None

    by_moves = objective == "moves"
    start = (start_boxes, start_player)
    best_g = {start: 0}
    parent: dict[tuple[frozenset[int], int], tuple[tuple[frozenset[int], int], int, int]] = {}
    counter = 0
    heap = [(board.heuristic(start_boxes), 0, counter, start)]
    expanded = 0
    steps = board.steps
    floor = board.floor
    while heap:
        _f, neg_g, _, node = heapq.heappop(heap)
        g = -neg_g
        if best_g.get(node, _INF) < g:
            continue
        node_boxes, node_player = node
        if node_boxes == targets:
            return _plan(board, start, node, parent, expanded)
        expanded += 1
        if expanded > max_expansions:
            return None
        dist, _ = board.reach(node_player, node_boxes)
        for b in node_boxes:
            for k, s in enumerate(steps):
                stand = b - s
                walk = dist.get(stand)
                if walk is None:
                    continue
                dest = b + s
                if not floor[dest] or dest in node_boxes or (board.dead[dest] and not board.target[dest]):
                    continue
                child_boxes = node_boxes - {b} | {dest}
                if not board.target[dest] and board.frozen(child_boxes, dest):
                    continue
                child = (child_boxes, b)
                cost = g + (walk + 1 if by_moves else 1)
                if cost < best_g.get(child, _INF):
                    best_g[child] = cost
                    parent[child] = (node, b, k)
                    counter += 1
                    heapq.heappush(heap, (cost + board.heuristic(child_boxes), -cost, counter, child))
    return None


def _plan(
    board: SokobanBoard,
    start: tuple[frozenset[int], int],
    goal: tuple[frozenset[int], int],
    parent: dict,
    expanded: int,
) -> Solution:
    pushes: list[tuple[int, int]] = []
    node = goal
    while node != start:
        node, box, k = parent[node]
        pushes.append((box, k))
    pushes.reverse()
    boxes = set(start[0])
    player = start[1]
    actions: list[str] = []
    for box, k in pushes:
        actions.extend(board.walk(player, box - board.steps[k], boxes))
        actions.append(ACTIONS[k])
        boxes.discard(box)
        boxes.add(box + board.steps[k])
        player = box
    return Solution(actions=actions, moves=len(actions), pushes=len(pushes), expanded=expanded)


def solve_level(level, **kwargs) -> Solution | None:
    """:func:`solve` on a :class:`~ragen_envs.sokoban.generator.Level`."""
    return solve(level.fixed, level.boxes, level.player, **kwargs)


def move(
    fixed: np.ndarray, boxes: Iterable[tuple[int, int]], player: tuple[int, int], action: str
) -> tuple[tuple[tuple[int, int], ...], tuple[int, int]]:
    """One move by the rules (``fixed``: 0 wall, 2 target, else floor): ``(boxes, player)`` after it, the boxes
    sorted. A move into a wall, off the grid, or pushing a box into a wall or another box changes nothing."""
    grid = np.asarray(fixed)
    rows, cols = grid.shape
    box_set = set(map(tuple, boxes))
    r, c = player
    dr, dc = _DELTAS[ACTIONS.index(action)]
    nr, nc = r + dr, c + dc
    if not (0 <= nr < rows and 0 <= nc < cols) or grid[nr, nc] == 0:
        return tuple(sorted(box_set)), (r, c)
    if (nr, nc) in box_set:
        br, bc = nr + dr, nc + dc
        if not (0 <= br < rows and 0 <= bc < cols) or grid[br, bc] == 0 or (br, bc) in box_set:
            return tuple(sorted(box_set)), (r, c)
        box_set.discard((nr, nc))
        box_set.add((br, bc))
    return tuple(sorted(box_set)), (nr, nc)


def solved(fixed: np.ndarray, boxes: Iterable[tuple[int, int]]) -> bool:
    """Whether every box is on a target."""
    grid = np.asarray(fixed)
    return all(grid[tuple(b)] == 2 for b in boxes)


def replay(
    fixed: np.ndarray, boxes: Iterable[tuple[int, int]], player: tuple[int, int], actions: Iterable[str]
) -> bool:
    """Play ``actions`` by the rules (:func:`move`, independently of the search) and say whether every box ends on a
    target."""
    position = (tuple(map(tuple, boxes)), tuple(player))
    for a in actions:
        position = move(fixed, *position, a)
    return solved(fixed, position[0])


def solve_env(env, **kwargs) -> Solution | None:
    """Solve from the *current* position of a Sokoban env (the oracle agent's plan); kwargs as :func:`solve`."""
    return solve_level(env.unwrapped.snapshot(), **kwargs)
