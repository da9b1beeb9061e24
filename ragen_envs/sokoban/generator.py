"""Always-solvable Sokoban levels, fast: random-walk rooms, boxes placed by reverse play from the targets.

The levels are of gym-sokoban's family (the generator the RAGEN reference code uses), made differently:

1. **Room topology**: a random walk of ``num_steps`` steps (default ``int(1.7 * (rows + cols))``) that changes
   direction with probability ``p_change_directions`` and carves one of five 3x3 floor masks at each step; the border
   is wall. Then ``num_boxes`` targets are put on distinct random floor cells.
2. **Reverse play**: starting from every box on its target, the player *pulls* boxes. gym-sokoban explores pulls and
   walks with a depth-first search over full room states (up to 300 000 of them, ~10 s a room at 10x10 with 4 boxes).
   Here the search is a breadth-first search over *push-equivalent* states: a state is the set of box cells plus the
   region the player can walk in (named by its smallest cell), so walking costs nothing. The search starts from the
   solved position with the player in each region of the floor (every way a solution can end), so BFS layer ``k``
   holds exactly the states whose optimal solution needs ``k`` pushes. Every state reached is solvable by
   construction: pushes undo the pulls in reverse order.
3. **Scoring**: among the states reached, the level is the one with every box off its target and, first, the most
   pushes needed (the BFS depth), then the largest box-to-target distance, ties broken by a seeded hash. The player
   is put on a random cell of the level's walkable region (gym-sokoban leaves it next to the last pulled box, and the
   RAGEN reference then walks it up to 3 random steps). ``max_depth`` / ``min_depth`` bound the pushes (a
   curriculum), ``max_states`` bounds the search (and so how hard the hardest level of a large room can be).

The search runs in one flat kernel written in the subset of Python that numba compiles. With numba installed (the
``fast`` extra) it is compiled once and cached; without it the *same* function runs as plain Python on lists and
makes identical levels, only slower (see :mod:`ragen_envs.sokoban.base`). All randomness is drawn outside the kernel from ``numpy.random.default_rng(seed)``,
so a seed gives the same level on every machine and backend.

Cell codes of ``Level.fixed``: 0 wall, 1 floor, 2 target. Cells are ``(row, col)``, row 0 at the top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import comb
from typing import Any

import numpy as np

from ragen_envs.core import check_arg
from ragen_envs.sokoban.base import (
    KernelGenerator,
    RoomConfig,
    numba_available,  # noqa: F401 -- re-exported: tests and benchmarks import it from here
    resolve_backend,  # noqa: F401 -- re-exported, as before the base module
    table_size,
)

#: Bumped whenever the levels a seed makes change; pools are cached under this version.
GENERATOR_VERSION = 1

WALL, FLOOR, TARGET = 0, 1, 2

# The five 3x3 floor masks of gym-sokoban's random walk, as (row offset, col offset) lists around the walk position.
_MASKS = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
# Flattened for the kernel: offsets (dr, dc) per mask, padded to 4 entries, and the count of each.
_MASK_DR = np.array([[dr for dr, _ in m] + [0] * (4 - len(m)) for m in _MASKS], dtype=np.int64).ravel()
_MASK_DC = np.array([[dc for _, dc in m] + [0] * (4 - len(m)) for m in _MASKS], dtype=np.int64).ravel()
_MASK_N = np.array([len(m) for m in _MASKS], dtype=np.int64)
_DIR_DR = np.array([1, 0, -1, 0], dtype=np.int64)
_DIR_DC = np.array([0, 1, 0, -1], dtype=np.int64)

# Status codes of the kernel.
_OK, _TOO_FEW_FLOORS, _NO_LEVEL = 0, 1, 2


@dataclass
class Level:
    """One Sokoban level.

    Attributes:
        fixed: ``(rows, cols)`` int8 array, 0 wall, 1 floor, 2 target.
        boxes: box cells ``(row, col)``, sorted.
        player: the player's cell.
        pushes: the fewest pushes that solve the level (known for generated levels), else ``None``.
        moves: the fewest moves (steps) that solve it, when a solver has computed it, else ``None``.
        seed: the generator seed that made it (``None`` for loaded levels).
    """

    fixed: np.ndarray
    boxes: tuple[tuple[int, int], ...]
    player: tuple[int, int]
    pushes: int | None = None
    moves: int | None = None
    seed: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.fixed.shape[0]), int(self.fixed.shape[1])

    @property
    def targets(self) -> tuple[tuple[int, int], ...]:
        return tuple((int(r), int(c)) for r, c in zip(*np.nonzero(self.fixed == TARGET)))

    def to_text(self) -> str:
        """The level in the Boxoban / XSB notation (``#`` wall, ``@`` player, ``$`` box, ``.`` goal, ``*``, ``+``)."""
        boxes = set(self.boxes)
        rows = []
        for r in range(self.fixed.shape[0]):
            line = []
            for c in range(self.fixed.shape[1]):
                code = int(self.fixed[r, c])
                if code == WALL:
                    line.append("#")
                elif (r, c) in boxes:
                    line.append("*" if code == TARGET else "$")
                elif (r, c) == self.player:
                    line.append("+" if code == TARGET else "@")
                else:
                    line.append("." if code == TARGET else " ")
            rows.append("".join(line))
        return "\n".join(rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Level):
            return NotImplemented
        return (
            np.array_equal(self.fixed, other.fixed)
            and tuple(sorted(self.boxes)) == tuple(sorted(other.boxes))
            and self.player == other.player
        )


# --------------------------------------------------------------------------------------------- the kernel
def _generate_kernel(
    rows,
    cols,
    num_boxes,
    num_steps,
    p_change,
    u,
    max_states,
    max_depth,
    tsize,
    mask_dr,
    mask_dc,
    mask_n,
    dir_dr,
    dir_dc,
    zob_box,
    zob_player,
    fixed,
    st_boxes,
    st_player,
    st_depth,
    st_parent,
    table,
    vis,
    vis2,
    occ,
    stack,
    out,
):
    """One attempt: carve a room, place player and targets, search reverse play, pick the level.

    ``u`` holds the attempt's uniform random numbers (see :func:`_uniform_count`). Writes the room into ``fixed``
    (flat, ``rows * cols``) and ``out = [n_states, best_state, player_cell, depth]``; returns a status code.
    Runs unchanged as plain Python on lists or compiled by numba on int64 arrays.
    """
    ncells = rows * cols
    for i in range(ncells):
        fixed[i] = 0
    # ---- 1. random-walk topology (gym-sokoban's process) -------------------------------------------------------
    k = 0
    r = 1 + int(u[k] * (rows - 1))
    k += 1
    c = 1 + int(u[k] * (cols - 1))
    k += 1
    d = int(u[k] * 4)
    k += 1
    for _ in range(num_steps):
        if u[k] < p_change:
            d = int(u[k + 1] * 4)
        m = int(u[k + 2] * 5)
        k += 3
        r = max(min(r + dir_dr[d], rows - 2), 1)
        c = max(min(c + dir_dc[d], cols - 2), 1)
        for j in range(mask_n[m]):
            fixed[(r + mask_dr[m * 4 + j]) * cols + c + mask_dc[m * 4 + j]] = 1
    nfloor = 0
    for rr in range(rows):
        for cc in range(cols):
            i = rr * cols + cc
            if rr == 0 or cc == 0 or rr == rows - 1 or cc == cols - 1:
                fixed[i] = 0
            elif fixed[i] == 1:
                stack[nfloor] = i
                nfloor += 1
    if nfloor <= num_boxes + 1:
        return 1  # _TOO_FEW_FLOORS
    # ---- 2. player and targets on distinct floor cells (partial Fisher-Yates over the floor list) --------------
    for j in range(num_boxes):
        pick = j + int(u[k] * (nfloor - j))
        k += 1
        tmp = stack[j]
        stack[j] = stack[pick]
        stack[pick] = tmp
    for j in range(num_boxes):
        fixed[stack[j]] = 2
        st_boxes[j] = stack[j]
    # boxes sorted ascending: every state keeps its box list sorted so that equal states compare equal
    for a in range(1, num_boxes):
        x = st_boxes[a]
        b = a - 1
        while b >= 0 and st_boxes[b] > x:
            st_boxes[b + 1] = st_boxes[b]
            b -= 1
        st_boxes[b + 1] = x
    salt = int(u[k] * 1073741824.0)
    k += 1
    u_player = u[k]
    # ---- 3. breadth-first reverse play over (boxes, player region) ---------------------------------------------
    for i in range(tsize):
        table[i] = 0
    for i in range(ncells):
        vis[i] = 0
        vis2[i] = 0
        occ[i] = 0
    stamp2 = 0
    stamp = 0  # vis[i] == stamp marks cells of the region being filled
    ostamp = 0  # occ[i] == ostamp marks the box cells of the state being expanded
    tmask = tsize - 1
    # depth 0: the solved position with the player in each region of the free floor (every way a solution ends)
    ostamp += 1
    for j in range(num_boxes):
        occ[st_boxes[j]] = ostamp
    n = 0
    for start in range(ncells):
        if fixed[start] == 0 or occ[start] == ostamp or vis2[start] != 0:
            continue
        stamp2 += 1
        top = 0
        stack[top] = start
        top += 1
        vis2[start] = stamp2
        while top > 0:
            top -= 1
            x = stack[top]
            for dd in range(4):
                y = x + dir_dr[dd] * cols + dir_dc[dd]
                if fixed[y] != 0 and occ[y] != ostamp and vis2[y] == 0:
                    vis2[y] = stamp2
                    stack[top] = y
                    top += 1
        if n > 0:
            for j in range(num_boxes):
                st_boxes[n * num_boxes + j] = st_boxes[j]
        st_player[n] = start  # scanning in cell order, the first cell met is the region's smallest
        st_depth[n] = 0
        st_parent[n] = -1
        h = zob_player[start]
        for j in range(num_boxes):
            h ^= zob_box[st_boxes[j]]
        slot = h & tmask
        while table[slot] != 0:
            slot = (slot + 1) & tmask
        table[slot] = n + 1
        n += 1
        if n >= max_states:
            break
    best = -1
    best_depth = -1
    best_dist = -1
    best_tie = -1
    head = 0
    while head < n:
        cur = head
        head += 1
        base = cur * num_boxes
        # score the state: every box off target, then depth, then distance to the nearest targets, then a hash
        off = 0
        dist = 0
        for j in range(num_boxes):
            b = st_boxes[base + j]
            if fixed[b] != 2:
                off += 1
            br = b // cols
            bc = b - br * cols
            nearest = rows + cols
            for t in range(num_boxes):
                tc = st_boxes[t]  # state 0 holds the targets
                tr = tc // cols
                tcc = tc - tr * cols
                dm = abs(br - tr) + abs(bc - tcc)
                nearest = min(nearest, dm)
            dist += nearest
        if off == num_boxes:
            hh = zob_player[st_player[cur]]
            for j in range(num_boxes):
                hh ^= zob_box[st_boxes[base + j]]
            tie = (hh ^ salt) & 1073741823
            dep = st_depth[cur]
            if (
                (dep > best_depth)
                or (dep == best_depth and dist > best_dist)
                or (dep == best_depth and dist == best_dist and tie > best_tie)
            ):
                best = cur
                best_depth = dep
                best_dist = dist
                best_tie = tie
        if max_depth > 0 and st_depth[cur] >= max_depth:
            continue
        if n >= max_states:
            continue  # keep scoring the states already found, add no more
        # region of the player in this state
        ostamp += 1
        for j in range(num_boxes):
            occ[st_boxes[base + j]] = ostamp
        stamp += 1
        top = 0
        p0 = st_player[cur]
        stack[top] = p0
        top += 1
        vis[p0] = stamp
        while top > 0:
            top -= 1
            x = stack[top]
            for dd in range(4):
                y = x + dir_dr[dd] * cols + dir_dc[dd]
                if fixed[y] != 0 and occ[y] != ostamp and vis[y] != stamp:
                    vis[y] = stamp
                    stack[top] = y
                    top += 1
        region = stamp
        # every pull: player on p next to box b (p = b + step), steps on to q = p + step, the box follows to p
        for j in range(num_boxes):
            b = st_boxes[base + j]
            for dd in range(4):
                step = dir_dr[dd] * cols + dir_dc[dd]
                p = b + step
                q = p + step
                if vis[p] != region or fixed[q] == 0 or occ[q] == ostamp:
                    continue
                if n >= max_states:
                    break
                # child boxes: b replaced by p, kept sorted (written in place at slot n)
                nb = n * num_boxes
                w = 0
                for t in range(num_boxes):
                    x = st_boxes[base + t]
                    if t != j:
                        st_boxes[nb + w] = x
                        w += 1
                # insert p
                a = num_boxes - 1
                while a > 0 and st_boxes[nb + a - 1] > p:
                    st_boxes[nb + a] = st_boxes[nb + a - 1]
                    a -= 1
                st_boxes[nb + a] = p
                # child region: fill from q with the child's boxes (own stamp array); name it by its smallest cell
                occ[b] = 0
                occ[p] = ostamp
                stamp2 += 1
                top = 0
                stack[top] = q
                top += 1
                vis2[q] = stamp2
                low = q
                while top > 0:
                    top -= 1
                    x = stack[top]
                    low = min(low, x)
                    for dd2 in range(4):
                        y = x + dir_dr[dd2] * cols + dir_dc[dd2]
                        if fixed[y] != 0 and occ[y] != ostamp and vis2[y] != stamp2:
                            vis2[y] = stamp2
                            stack[top] = y
                            top += 1
                occ[p] = 0
                occ[b] = ostamp
                h = zob_player[low]
                for t in range(num_boxes):
                    h ^= zob_box[st_boxes[nb + t]]
                slot = h & tmask
                found = False
                while table[slot] != 0:
                    other = table[slot] - 1
                    if st_player[other] == low:
                        same = True
                        ob = other * num_boxes
                        for t in range(num_boxes):
                            if st_boxes[ob + t] != st_boxes[nb + t]:
                                same = False
                                break
                        if same:
                            found = True
                            break
                    slot = (slot + 1) & tmask
                if not found:
                    table[slot] = n + 1
                    st_player[n] = low
                    st_depth[n] = st_depth[cur] + 1
                    st_parent[n] = cur * 4 * num_boxes + j * 4 + dd  # parent, pulled box index, direction
                    n += 1
    if best < 0:
        return 2  # _NO_LEVEL
    # ---- 4. the player goes on a random cell of the chosen state's region --------------------------------------
    base = best * num_boxes
    ostamp += 1
    for j in range(num_boxes):
        occ[st_boxes[base + j]] = ostamp
    stamp += 1
    top = 0
    cnt = 0
    stack[top] = st_player[best]
    top += 1
    vis[st_player[best]] = stamp
    # collect the region in row-major order for a machine-independent pick
    while top > 0:
        top -= 1
        x = stack[top]
        for dd in range(4):
            y = x + dir_dr[dd] * cols + dir_dc[dd]
            if fixed[y] != 0 and occ[y] != ostamp and vis[y] != stamp:
                vis[y] = stamp
                stack[top] = y
                top += 1
    for i in range(ncells):
        if vis[i] == stamp:
            cnt += 1
    pick = int(u_player * cnt)
    player = -1
    for i in range(ncells):
        if vis[i] == stamp:
            if pick == 0:
                player = i
                break
            pick -= 1
    out[0] = n
    out[1] = best
    out[2] = player
    out[3] = best_depth
    return 0


def _uniform_count(num_steps: int, num_boxes: int) -> int:
    """How many uniforms one kernel attempt reads (start cell and direction, 3 per walk step, targets, salt,
    player)."""
    return 3 + 3 * num_steps + num_boxes + 2


# --------------------------------------------------------------------------------------------- public API
@dataclass(frozen=True)
class GeneratorConfig(RoomConfig):
    """What kind of levels to make.

    Args:
        dim_room: ``(rows, cols)`` of the room, border walls included (4..64 each; the walk carves the inner
            ``rows - 2`` x ``cols - 2`` cells).
        num_boxes: boxes (and targets) per level, at least 1.
        p_change_directions: probability that the random walk turns at each step (gym-sokoban: 0.35).
        num_steps: random-walk steps; ``None`` uses gym-sokoban's ``int(1.7 * (rows + cols))``.
        max_states: most reverse-play states searched per attempt; the search is breadth-first, so this bounds
            how deep (how many pushes) the hardest level found can be. Small rooms exhaust their states first.
        max_depth: most pushes a level may need (``None``: as many as the search finds); a cheap curriculum knob.
        min_depth: fewest pushes a level must need; rooms that cannot reach it are redrawn.
        tries: rooms drawn per level before giving up (a room can be too small or allow no level).
    """

    dim_room: tuple[int, int] = (6, 6)
    num_boxes: int = 1
    p_change_directions: float = 0.35
    num_steps: int | None = None
    max_states: int = 20_000
    max_depth: int | None = None
    min_depth: int = 1
    tries: int = 100

    def __post_init__(self) -> None:
        self._check_room()
        check_arg(
            isinstance(self.max_states, int) and 1 <= self.max_states <= 50_000_000,
            "max_states",
            self.max_states,
            "an int in 1..50000000",
        )
        check_arg(
            self.max_depth is None or (isinstance(self.max_depth, int) and self.max_depth >= 1),
            "max_depth",
            self.max_depth,
            "None or an int >= 1",
        )
        check_arg(
            isinstance(self.min_depth, int) and 1 <= self.min_depth <= (self.max_depth or self.min_depth),
            "min_depth",
            self.min_depth,
            "an int >= 1 and <= max_depth",
        )
        check_arg(isinstance(self.tries, int) and self.tries >= 1, "tries", self.tries, "an int >= 1")

    def key(self) -> str:
        """A file-name-safe key of every field that changes the levels (with the generator version)."""
        return f"v{GENERATOR_VERSION}_{self._room_key()}_s{self.max_states}_d{self.min_depth}-{self.max_depth or 0}"


class GenerationError(RuntimeError):
    """No level could be made within ``tries`` rooms (the room is too small for the boxes, or the depth range is
    unreachable)."""


class SokobanGenerator(KernelGenerator):
    """Make levels for one :class:`GeneratorConfig`; ``generate(seed)`` is deterministic (any int >= 0; the same
    seed gives the same level on every machine and backend).

    >>> gen = SokobanGenerator(GeneratorConfig((8, 8), 2))
    >>> level = gen.generate(0)   # doctest: +SKIP
    >>> print(level.to_text())    # doctest: +SKIP

    Args:
        config: the level family (default 6x6, one box).
        backend: ``"auto"`` (numba when installed), ``"numba"`` or ``"python"``; both make identical levels.
    """

    kernel = staticmethod(_generate_kernel)
    config_type = GeneratorConfig
    version = GENERATOR_VERSION
    config: GeneratorConfig

    def _build_arrays(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        rows, cols = self.config.dim_room
        nb = self.config.num_boxes
        ncells = rows * cols
        interior = (rows - 2) * (cols - 2)
        # The search never holds more states than box placements x player regions; size the hash table to that.
        bound = comb(interior, nb) * max(1, interior - nb)
        cap = int(min(self.config.max_states, bound))
        self._cap = cap
        self._tsize = table_size(cap)
        self._nu = _uniform_count(self.config.walk_steps, nb)
        zrng = np.random.default_rng(0x5EED_50C0)  # fixed: the hash only orders ties, it must not vary by run
        zob = zrng.integers(0, 2**62, size=2 * ncells, dtype=np.int64)
        consts = (_MASK_DR, _MASK_DC, _MASK_N, _DIR_DR, _DIR_DC, zob[:ncells].copy(), zob[ncells:].copy())
        # int32 state arrays: a 20 000-state search at 10x10 with 4 boxes needs well under 1 MB.
        bufs = (
            np.zeros(ncells, dtype=np.int64),  # fixed
            np.zeros(cap * nb, dtype=np.int32),  # st_boxes
            np.zeros(cap, dtype=np.int32),  # st_player
            np.zeros(cap, dtype=np.int32),  # st_depth
            np.zeros(cap, dtype=np.int64),  # st_parent (parent * 4 * num_boxes + pull)
            np.zeros(self._tsize, dtype=np.int32),  # table
            np.zeros(ncells, dtype=np.int64),  # vis
            np.zeros(ncells, dtype=np.int64),  # vis2
            np.zeros(ncells, dtype=np.int64),  # occ
            np.zeros(ncells + 4, dtype=np.int64),  # stack
            np.zeros(4, dtype=np.int64),  # out
        )
        return consts, bufs

    def _generate_locked(self, seed: int) -> Level:
        cfg = self.config
        rows, cols = cfg.dim_room
        nb = cfg.num_boxes
        st_boxes, out = self._bufs[1], self._bufs[-1]
        rng = np.random.default_rng(seed)
        for _ in range(cfg.tries):
            u = rng.random(self._nu)
            if self.backend == "python":
                u = u.tolist()
            status = self._run(
                rows, cols, nb, cfg.walk_steps, float(cfg.p_change_directions), u, self._cap, cfg.max_depth or 0,
                self._tsize,
            )  # fmt: skip
            if status != _OK or int(out[3]) < cfg.min_depth:
                continue
            best = int(out[1])
            boxes = tuple(sorted(divmod(int(b), cols) for b in st_boxes[best * nb : best * nb + nb]))
            player = divmod(int(out[2]), cols)
            return Level(
                fixed=self._room(),
                boxes=boxes,
                player=(int(player[0]), int(player[1])),
                pushes=int(out[3]),
                seed=seed,
                meta={"states": int(out[0])},
            )
        raise GenerationError(
            f"no level with {nb} box(es) and {cfg.min_depth}..{cfg.max_depth or 'any'} pushes in {cfg.tries} rooms "
            f"of {rows}x{cols} for seed {seed}; use a larger dim_room, fewer boxes or a wider depth range"
        )


def shared_generator(config: GeneratorConfig | None = None, *, backend: str = "auto") -> SokobanGenerator:
    """One :class:`SokobanGenerator` per configuration and backend in this process, so that many envs share one set
    of search buffers (about 1 MB at 10x10 with 4 boxes) instead of holding one each."""
    return SokobanGenerator.shared(config, backend=backend)


def generate_level(seed: int, config: GeneratorConfig | None = None, *, backend: str = "auto") -> Level:
    """The level of ``seed`` for ``config`` (default 6x6, one box), from the :func:`shared_generator`."""
    return shared_generator(config, backend=backend).generate(seed)
