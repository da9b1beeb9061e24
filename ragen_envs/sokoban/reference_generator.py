"""The RAGEN reference's Sokoban levels: gym-sokoban's ``generate_room`` as RAGEN modified it, reproduced fast.

What it reproduces: ``generate_room`` of RAGEN's ``ragen/env/sokoban/utils.py`` (RAGEN-AI/RAGEN, "adapted from the
gym_sokoban repo"), as its ``SokobanEnv.reset`` calls it (``ragen/env/sokoban/env.py``: ``dim``, ``num_steps`` =
gym-sokoban's ``num_gen_steps = int(1.7 * (rows + cols))``, ``num_boxes``, ``search_depth`` from
``SokobanEnvConfig``), step by step:

1. **Room topology** (``room_topology_generation``): a random walk of ``num_steps`` steps from a random cell (rows and
   columns ``1..dim-1``), turning to a random direction with probability ``p_change_directions`` (0.35), moving one
   cell (clamped to the interior) and carving one of five 3x3 floor masks at each step; the border becomes wall.
2. **Player and targets** (``place_boxes_and_player``): the player on a random floor cell, then each box target on a
   random remaining floor cell; a room with ``<= num_boxes + 1`` floor cells is rejected (the reference raises
   ``RuntimeError`` and its env resets with another seed).
3. **Reverse play** (``reverse_playing`` / ``depth_first_search`` / ``reverse_move``): every box starts on its target;
   a recursive depth-first search with one explored-state set tries the four *pull* actions in the order up, down,
   left, right (actions 0-3: the player steps if the cell is free, and a box right behind it follows). ``ttl`` starts
   at ``search_depth`` and is decremented on entry; a call returns when ``ttl <= 0`` or 300 000 states are explored;
   a state already explored (first visit wins, whatever path reached it) is not searched again. A state is the room
   array: the player cell, the box cells and, per box, whether it has ever been pulled (the reference writes a pulled
   box as code 3 and an unpulled one as 4, so these differ). Each new state scores ``box_swaps * displacement``
   (``box_swaps``: how many times the pulled box changed along the path, ``displacement``: total Manhattan distance of
   the boxes from their own targets), or 0 unless every target is uncovered (no box and no player on one). The first
   state with the highest score is kept (``score > best``).
4. **Tries** (``generate_room``): a room whose best score is 0 is redrawn (the reference tries 4 rooms, then raises
   ``RuntimeWarning`` and its env resets with another seed: the same as drawing rooms until one scores > 0).
5. **Player walk** (``add_random_player_movement``): with probability 0.8 when the kept state's displacement is 1,
   else 0.5, the player walks 1-3 steps, each to a random free neighbour (floor or target, no box) it has not stood on,
   continuing with probability 0.5 after each step.

The search above is reproduced exactly (visit order, explored set, ttl rule, state cap, scoring, tie rule; checked
room by room against the reference's own code and, in the tests, against a recursive oracle) by an iterative
depth-first search with an explicit stack, in one kernel (:func:`ragen_envs.sokoban.kernels.reference_kernel`)
written in the subset of Python that numba compiles: with numba installed (the ``fast`` extra) it is compiled once
and cached; without it the same function runs as plain Python on lists and makes identical levels (see
:mod:`ragen_envs.sokoban.base`). The explored-state set is an open-addressing hash table.

What differs from the reference:

* **Random numbers**: all randomness comes from one xoshiro128** stream per level, seeded by hashing the seed and run
  inside the kernel (no per-level ``numpy.random.default_rng``, which alone costs more than the whole search), not
  from Python's ``random`` / ``numpy.random`` global state as in the reference. So a seed gives a different level than
  in the reference, but the same level on every machine and backend, and the *distribution* is the reference's. Each
  random choice draws one uniform (the walk draws a turn direction even when it does not turn).
* **Failures**: rooms are redrawn from the same seed's stream (up to ``tries``, then :class:`GenerationError`) instead
  of recursing into ``reset`` with ``hash(str(seed))``.
* **Unknown optimum**: like the reference, the generator does not know the fewest pushes or moves of a level
  (``Level.pushes`` is ``None``); :mod:`ragen_envs.sokoban.solver` computes them.
* **search_depth below num_boxes + 2** is rejected: no box set can then be pulled off every target (the reference
  crashes at 1, with ``best_room`` still ``None``, and resets forever at 2).

Quirks of the reference, kept as they are because the levels depend on them:

* only pulls are searched (RAGEN skips gym-sokoban's plain moves, actions 4-7): the player cannot step away from a
  box right behind it without pulling it, so few states are reachable (about 50-150 in a 6x6 room) and the levels are
  short (6x6 / 1 box: median 4 moves);
* the explored set is global while ``ttl`` is per path: a state first reached late on a long path is never searched
  again from a shorter one, so ``search_depth`` cuts off more than its depth suggests;
* a box's ever-pulled flag is part of a state (codes 3 / 4), so the same cells count as two states;
* gym-sokoban 0.0.6 passes the caller's ``last_pull`` down the recursion (so ``box_swaps`` counts every pull); RAGEN
  passes the new one (``box_swaps`` counts changes of the pulled box): RAGEN's version is the one reproduced.

Cell codes of ``Level.fixed``: 0 wall, 1 floor, 2 target. Cells are ``(row, col)``, row 0 at the top.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

import numpy as np

from ragen_envs.core import check_arg
from ragen_envs.sokoban.base import KernelGenerator, RoomConfig, is_int, numba_available, table_size
from ragen_envs.sokoban.generator import GenerationError, Level
from ragen_envs.sokoban.kernels import (
    OK,
    OUT_DISP,
    OUT_PLAYER,
    OUT_ROOMS,
    OUT_SCORE,
    OUT_STATES,
    OUT_SWAPS,
    OUT_WALK,
    reference_kernel,
    reference_uniform_count,
    room_geometry,
)

#: Bumped whenever the levels a seed makes change; pools are cached under this version.
REFERENCE_GENERATOR_VERSION = 1

#: The reference's cap on explored reverse-play states per room (``len(explored_states) >= 300000``).
REFERENCE_MAX_EXPLORED = 300_000

#: Index of the kept box cells (``best_loc``) among the search buffers (:meth:`ReferenceGenerator._build_arrays`).
_BEST_LOC = 15


# --------------------------------------------------------------------------------------------- public API
@dataclass(frozen=True)
class ReferenceConfig(RoomConfig):
    """What kind of levels to make, with the reference's defaults (RAGEN ``SokobanEnvConfig``: 6x6, search depth 300;
    one box as its ``config/envs.yaml`` SimpleSokoban).

    Args:
        dim_room: ``(rows, cols)`` of the room, border walls included (4..64 each).
        num_boxes: boxes (and targets) per level, at least 1.
        search_depth: the reverse-play DFS ``ttl`` (the reference's ``search_depth``: 300 by default, 10 for
            LargerSokoban, 30 for SokobanDifferentGridVocab). The search reaches states up to ``search_depth - 2``
            moves from the solved position, so at least ``num_boxes + 2`` is needed for every box to be pulled.
        p_change_directions: probability that the random walk turns at each step (0.35).
        num_steps: random-walk steps; ``None`` uses gym-sokoban's ``int(1.7 * (rows + cols))``.
        max_explored: the cap on explored states per room (the reference's 300 000).
        tries: rooms drawn per level before :class:`GenerationError` (the reference retries without end).
    """

    dim_room: tuple[int, int] = (6, 6)
    num_boxes: int = 1
    search_depth: int = 300
    p_change_directions: float = 0.35
    num_steps: int | None = None
    max_explored: int = REFERENCE_MAX_EXPLORED
    tries: int = 1000

    def __post_init__(self) -> None:
        self._check_room()
        check_arg(
            is_int(self.search_depth) and self.num_boxes + 2 <= self.search_depth <= 100_000,
            "search_depth",
            self.search_depth,
            f"an int in {self.num_boxes + 2}..100000 for num_boxes={self.num_boxes} (the search reaches "
            "search_depth - 2 moves, and every box must be pulled at least once)",
        )
        object.__setattr__(self, "search_depth", int(self.search_depth))
        check_arg(
            is_int(self.max_explored) and 1 <= self.max_explored <= 50_000_000,
            "max_explored",
            self.max_explored,
            "an int in 1..50000000",
        )
        check_arg(is_int(self.tries) and self.tries >= 1, "tries", self.tries, "an int >= 1")

    def key(self) -> str:
        """A file-name-safe key of every field that changes the levels (with the generator version)."""
        return f"ref{REFERENCE_GENERATOR_VERSION}_{self._room_key()}_sd{self.search_depth}_x{self.max_explored}"


class ReferenceGenerator(KernelGenerator):
    """Make reference levels for one :class:`ReferenceConfig`; ``generate(seed)`` is deterministic (any int in
    ``0..2**64-1``; the same seed gives the same level on every machine and backend).

    ``Level.pushes`` / ``Level.moves`` are ``None`` (the reference's search does not know the optimum); ``Level.meta``
    holds the search's ``states`` (explored), ``score``, ``displacement``, ``box_swaps``, ``walk`` (player steps after
    reverse play) and ``rooms`` (rooms drawn).

    >>> gen = ReferenceGenerator(ReferenceConfig((8, 8), 2, search_depth=10))
    >>> print(gen.generate(0).to_text())    # doctest: +SKIP

    Args:
        config: the level family (default 6x6, one box, search depth 300).
        backend: ``"auto"`` (numba when installed), ``"numba"`` or ``"python"``; both make identical levels.
    """

    kernel = staticmethod(reference_kernel)
    config_type = ReferenceConfig
    version = REFERENCE_GENERATOR_VERSION
    seed_bits = 64  # the kernel seeds its stream from the seed's two 32-bit halves
    config: ReferenceConfig

    def _build_arrays(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        cols = self.config.dim_room[1]
        nb, ncells, interior = self.config.num_boxes, self.config.cells, self.config.interior
        # States: player cell x box cells x (ever pulled) per box; the search never holds more than that.
        bound = interior * comb(interior - 1, nb) * 2**nb
        cap = int(min(self.config.max_explored, bound))
        frames = int(min(self.config.search_depth, cap + 1)) + 1
        zrng = np.random.default_rng(0x5EED_2E7)  # fixed: the hash only places states in the table
        zob = zrng.integers(0, 2**62, size=3 * ncells, dtype=np.int64)
        consts = (room_geometry(cols), zob)
        bufs = (
            np.zeros(ncells, dtype=np.int64),  # fixed
            np.zeros(ncells, dtype=np.int64),  # cells
            np.zeros(nb, dtype=np.int64),  # targets
            np.zeros(frames, dtype=np.int64),  # fr_player
            np.zeros(frames * nb, dtype=np.int64),  # fr_loc
            np.zeros(frames * nb, dtype=np.int64),  # fr_flag
            np.zeros(frames, dtype=np.int64),  # fr_swaps
            np.zeros(frames, dtype=np.int64),  # fr_last
            np.zeros(frames, dtype=np.int64),  # fr_ttl
            np.zeros(frames, dtype=np.int64),  # fr_act
            np.zeros(cap, dtype=np.int32),  # ex_player
            np.zeros(cap * nb, dtype=np.int32),  # ex_key
            np.zeros(cap, dtype=np.int32),  # ex_slot
            np.zeros(table_size(cap), dtype=np.int32),  # table
            np.zeros(nb, dtype=np.int64),  # key_buf
            np.zeros(nb, dtype=np.int64),  # best_loc
            np.zeros(8, dtype=np.int64),  # small
            np.zeros(reference_uniform_count(self.config.walk_steps, nb), dtype=np.float64),  # u
            np.zeros(16, dtype=np.int64),  # out
        )
        return consts, bufs

    def _search(self, seed: int) -> None:
        """Run the kernel for ``seed`` (the caller holds the lock): the level is then in the search buffers."""
        settings = self.__dict__.get("_settings")
        if settings is None:  # the kernel's leading arguments, fixed by the configuration: built once
            cfg = self.config
            settings = self.__dict__["_settings"] = (
                *cfg.dim_room, cfg.num_boxes, cfg.walk_steps, float(cfg.p_change_directions), cfg.search_depth,
                cfg.max_explored, cfg.tries,
            )  # fmt: skip
        status = self._kernel(*settings, seed & 0xFFFFFFFF, seed >> 32, *self._tail)
        if status != OK:
            cfg = self.config
            rows, cols = cfg.dim_room
            raise GenerationError(
                f"no level with {cfg.num_boxes} box(es) in {cfg.tries} rooms of {rows}x{cols} with "
                f"search_depth={cfg.search_depth} for seed {seed}; use a larger dim_room, fewer boxes or a larger "
                "search_depth"
            )

    def _generate_locked(self, seed: int) -> Level:
        self._search(seed)
        cols = self.config.dim_room[1]
        out = [int(x) for x in self._bufs[-1]]
        return Level(
            fixed=self._room(),
            boxes=tuple(sorted(divmod(int(b), cols) for b in self._bufs[_BEST_LOC])),
            player=divmod(out[OUT_PLAYER], cols),
            pushes=None,
            seed=seed,
            meta={
                "states": out[OUT_STATES],
                "score": out[OUT_SCORE],
                "displacement": out[OUT_DISP],
                "box_swaps": out[OUT_SWAPS],
                "walk": out[OUT_WALK],
                "rooms": out[OUT_ROOMS],
            },
        )

    def generate_cells(self, seed: int, room_out: np.ndarray | None = None) -> tuple[list[list[int]], list[int], int]:
        """The level of ``seed`` as plain cells, without building a :class:`Level`: the room's rows (0 wall, 1 floor,
        2 target), the flat box cells (``row * cols + col``) and the flat player cell. With ``room_out`` (an array of
        the room's shape) the room codes are also copied there.

        This is a fresh-level reset's path: a ``Level``'s arrays and meta dict cost as much as the search of a 6x6
        room. The same seed gives the same level as :meth:`generate` (tested)."""
        if type(seed) is not int or not 0 <= seed < 2**64:  # plain ints, the reset path's, skip the full check
            self._check_seed(seed)
        best, out = self._bufs[_BEST_LOC], self._bufs[-1]
        with self._lock:
            self._search(seed)
            if self.backend == "numba":
                grid = self._grid_view
                fixed, boxes = grid.tolist(), best.tolist()
                if room_out is not None:
                    room_out[...] = grid
            else:  # the Python backend's lists
                rows, cols = self.config.dim_room
                room = self._bufs[0]
                fixed, boxes = [room[r * cols : (r + 1) * cols] for r in range(rows)], list(best)
                if room_out is not None:
                    room_out[...] = fixed
            return fixed, boxes, int(out[OUT_PLAYER])

    @property
    def _grid_view(self) -> np.ndarray:
        """The room the kernel writes into its first buffer, as a ``(rows, cols)`` view (numba backend)."""
        view = self.__dict__.get("_grid")
        if view is None:
            rows, cols = self.config.dim_room
            view = self.__dict__["_grid"] = self._bufs[0][: rows * cols].reshape(rows, cols)
        return view


def shared_reference_generator(config: ReferenceConfig | None = None, *, backend: str = "auto") -> ReferenceGenerator:
    """One :class:`ReferenceGenerator` per configuration and backend in this process, so that many envs share one set
    of search buffers."""
    return ReferenceGenerator.shared(config, backend=backend)


def generate_reference_level(seed: int, config: ReferenceConfig | None = None, *, backend: str = "auto") -> Level:
    """The reference level of ``seed`` for ``config`` (default 6x6, one box, search depth 300)."""
    return shared_reference_generator(config, backend=backend).generate(seed)


__all__ = [
    "REFERENCE_GENERATOR_VERSION",
    "REFERENCE_MAX_EXPLORED",
    "ReferenceConfig",
    "ReferenceGenerator",
    "generate_reference_level",
    "numba_available",
    "shared_reference_generator",
]
