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

The search runs in one kernel (:func:`ragen_envs.sokoban.kernels.generate_kernel`) written in the subset of Python that
numba compiles. With numba installed (the ``fast`` extra) it is compiled once and cached; without it the *same*
function runs as plain Python on lists and makes identical levels, only slower (see :mod:`ragen_envs.sokoban.base`).
All randomness is drawn outside the kernel from ``numpy.random.default_rng(seed)``, so a seed gives the same level on
every machine and backend.

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
from ragen_envs.sokoban.kernels import OK, generate_kernel, generate_uniform_count, room_geometry

#: Bumped whenever the levels a seed makes change; pools are cached under this version.
GENERATOR_VERSION = 1

WALL, FLOOR, TARGET = 0, 1, 2


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

    kernel = staticmethod(generate_kernel)
    config_type = GeneratorConfig
    version = GENERATOR_VERSION
    config: GeneratorConfig

    def _build_arrays(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        cols = self.config.dim_room[1]
        nb, ncells, interior = self.config.num_boxes, self.config.cells, self.config.interior
        # The search never holds more states than box placements x player regions; size the hash table to that.
        bound = comb(interior, nb) * max(1, interior - nb)
        cap = int(min(self.config.max_states, bound))
        self._cap = cap
        self._tsize = table_size(cap)
        self._nu = generate_uniform_count(self.config.walk_steps, nb)
        zrng = np.random.default_rng(0x5EED_50C0)  # fixed: the hash only orders ties, it must not vary by run
        zob = zrng.integers(0, 2**62, size=2 * ncells, dtype=np.int64)
        consts = (room_geometry(cols), zob[:ncells].copy(), zob[ncells:].copy())
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
            if status != OK or int(out[3]) < cfg.min_depth:
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
