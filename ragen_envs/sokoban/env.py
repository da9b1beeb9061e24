"""Sokoban (the paper's main multi-turn testbed): push every box onto a target.

The player walks on a grid; moving into a box pushes it one cell if the cell behind it is free. Boxes cannot be
pulled, so a careless push can make the level unsolvable (a *deadlock*). Every generated level is solvable.

Levels: by default each reset generates a level the way the RAGEN reference code does (``generator="reference"``:
gym-sokoban's random-walk rooms and depth-first reverse play as RAGEN modified them, see
:mod:`ragen_envs.sokoban.reference_generator`); at its settings most levels need only a few moves (6x6 with one box:
median 4 moves). ``generator="exact"`` is ragen's own generator (:mod:`ragen_envs.sokoban.generator`): a
breadth-first reverse play that picks the level needing the most pushes, with an exact push count and a curriculum
(``min_pushes`` / ``max_pushes``); its levels are much harder. Levels can also come from a Boxoban file or a list.

Action space: ``UnicodeText``; valid actions are ``Up``, ``Down``, ``Left``, ``Right`` (case-insensitive; also
``1``-``4`` as the reference code numbers them, and ``north``/``south``/``west``/``east``).

Observation: the room as text, one row per line (``observation_format="grid"``); ``"coord"`` lists the coordinates
of walls, targets, boxes and the player instead, ``"grid_coord"`` gives both. Symbols (``vocab="default"``):
``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``√`` box on target, ``P`` player, ``S`` player on target;
``vocab="new"`` (SokobanNewVocab) uses ``W . G B C A @``.

Rewards (gym-sokoban's, as the reference code): -0.1 per step, +1 when a box is pushed onto a target, -1 when a box
is pushed off one, +10 when every box is on a target. ``info["reward_parts"]`` splits them into ``step``, ``box_on``,
``box_off`` and ``solved``.

Episode end: terminated when every box is on a target; truncated after ``max_steps`` steps (100). Under the turn
protocol the reference's budget applies first: 5 actions per turn, 10 per episode, 5 turns.

Info (besides the contract keys): ``boxes_on_target``, ``deadlock`` (a box off target is stuck: on a dead square or
frozen in a 2x2 block, so the level can no longer be solved), ``optimal_pushes`` / ``optimal_moves`` of the level
when known, else ``None`` (on reset): the exact generator knows the fewest pushes, a pool built with the solver knows
the fewest moves; reference levels and loaded levels know neither.

Arguments (the defaults are the reference's SimpleSokoban: 6x6, one box, search depth 300, 100 steps):
    dim_room: ``(rows, cols)`` of generated rooms, border walls included (4..64 each). Default ``(6, 6)``.
    num_boxes: boxes per generated level. Default 1.
    max_steps: steps before truncation. Default 100.
    vocab: ``"default"``, ``"new"`` or a dict naming a symbol for each of ``wall, empty, target, box_on_target, box,
        player, player_on_target``.
    observation_format: ``"grid"``, ``"coord"`` or ``"grid_coord"``.
    levels: where levels come from: ``None`` (generate one per reset; the default), a path of a Boxoban/XSB file or
        folder, or a list of :class:`~ragen_envs.sokoban.generator.Level`. With levels, the generator arguments below
        are ignored.
    generator: ``"reference"`` (the default: the RAGEN reference's levels) or ``"exact"`` (ragen's exact-push-depth
        generator).
    search_depth: reference generator only: the depth budget (``ttl``) of its reverse-play search, as the reference's
        ``search_depth``, at least ``num_boxes + 2``. Default 300 (SokobanEnvConfig's); the registered ids set 300
        (Sokoban), 10 (SokobanLarge, the reference's LargerSokoban) and 30 (SokobanNewVocab). The exact generator
        ignores it (so ``gymnasium.make(id, generator="exact")`` works with the ids' setting).
    pool_size: pre-generate this many levels once (cached on disk, keyed by the generator and its settings, see
        :mod:`ragen_envs.sokoban.pool`) and draw resets from them: a reset is then a lookup. Pools are solved once,
        so their levels know their fewest moves. 0 (the default): generate a level per reset.
    pool_seed: seed of the pool.
    min_pushes, max_pushes: exact generator only: a curriculum, only levels needing this many pushes (generated or
        pooled levels). ``None``: 1 and no maximum.
    max_states: exact generator only: its reverse-play search budget (bounds the hardest level). ``None``: 20000.
    p_change_directions, num_steps: the random walk of either generator (gym-sokoban's 0.35 and
        ``int(1.7 * (rows + cols))``).
    backend: the generator's ``"auto"`` / ``"numba"`` / ``"python"`` (identical levels; numba is the ``fast`` extra).
    render_mode: ``None``, ``"ansi"`` or ``"rgb_array"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, SupportsFloat

import numpy as np

from ragen_envs import grounding
from ragen_envs.core import BaseTextEnv, StepOutcome, check_arg
from ragen_envs.rendering import CellStyle, draw_grid
from ragen_envs.sokoban.base import first_uint64
from ragen_envs.sokoban.boxoban import load_boxoban
from ragen_envs.sokoban.generator import TARGET, WALL, GeneratorConfig, Level, SokobanGenerator, shared_generator
from ragen_envs.sokoban.pool import LevelPool
from ragen_envs.sokoban.reference_generator import ReferenceConfig, ReferenceGenerator, shared_reference_generator
from ragen_envs.sokoban.solver import SokobanBoard

GENERATORS = ("reference", "exact")


def _is_count(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# Arguments that only the exact generator reads (None: not given).
_EXACT_ONLY = ("min_pushes", "max_pushes", "max_states")

# Cell codes of the rendered room (the reference's room_state codes, 6 = player on target).
_WALL, _EMPTY, _TARGET, _BOX_ON_TARGET, _BOX, _PLAYER, _PLAYER_ON_TARGET = range(7)
_VOCAB_KEYS = ("wall", "empty", "target", "box_on_target", "box", "player", "player_on_target")
VOCABS: dict[str, dict[str, str]] = {
    "default": dict(zip(_VOCAB_KEYS, ("#", "_", "O", "√", "X", "P", "S"))),
    # SokobanNewVocab of the reference code (SokobanDifferentGridVocab).
    "new": dict(zip(_VOCAB_KEYS, ("W", ".", "G", "C", "B", "A", "@"))),
}
_VOCAB_WORDS = ("wall", "empty", "target", "box on target", "box", "player", "player on target")

ACTIONS: tuple[str, ...] = ("Up", "Down", "Left", "Right")
_DELTAS: dict[str, tuple[int, int]] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}

# Rewards of gym-sokoban (used by the reference code).
STEP_PENALTY = -0.1
BOX_ON_REWARD = 1.0
BOX_OFF_PENALTY = -1.0
SOLVED_REWARD = 10.0

_STYLES = {
    _WALL: CellStyle((70, 70, 80)),
    _EMPTY: CellStyle((225, 215, 190)),
    _TARGET: CellStyle((225, 215, 190), "ring", (210, 40, 40)),
    _BOX_ON_TARGET: CellStyle((225, 215, 190), "square", (60, 170, 70)),
    _BOX: CellStyle((225, 215, 190), "square", (165, 110, 45)),
    _PLAYER: CellStyle((225, 215, 190), "disc", (40, 90, 220)),
    _PLAYER_ON_TARGET: CellStyle((240, 190, 190), "disc", (40, 90, 220)),
}

# Words of the thinking that name each thing (see ragen_envs.grounding).
_PLAYER_WORDS = ("i am", "i'm", "im at", "i stand", "player", "my position", "my location", "me", "agent", "currently")
_BOX_WORDS = ("box", "boxes", "crate", "crates")
_TARGET_WORDS = ("target", "targets", "goal", "goals", "storage")
_OUTCOME_WORDS = {
    "push": ("push", "pushes", "pushing", "pushed", "shove", "shoves", "moves the box", "move the box"),
    "target": ("onto the target", "on the target", "onto a target", "on a target", "on target", "onto target",
               "onto the goal", "on the goal", "on goal"),
    "blocked": ("wall", "a wall", "blocked", "blocks", "stay in place", "stays in place", "nothing happens",
                "no effect", "bump", "bumps", "can't move", "cannot move", "stuck"),
}  # fmt: skip


class SokobanEnv(BaseTextEnv):
    """Sokoban with generated, pooled or Boxoban levels. See the module docstring."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    action_names = ACTIONS
    action_synonyms: ClassVar[dict[str, str]] = {
        "1": "Up", "2": "Down", "3": "Left", "4": "Right",
        "north": "Up", "south": "Down", "west": "Left", "east": "Right",
        "u": "Up", "d": "Down", "l": "Left", "r": "Right",
    }  # fmt: skip
    # RAGEN config/envs.yaml Sokoban env_instruction (verbatim) and SokobanEnvConfig's grid_vocab / action_lookup,
    # which its context manager appends. The reference appends the *default* legend for every Sokoban variant, the
    # new-vocabulary one included (its env-specific grid_vocab never reaches the prompt); the reference layout does
    # the same, the ragen layout names the symbols the grid really uses.
    reference_instruction = (
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. When you "
        "are right next to a box, you can push it by moving in the same direction. You cannot push a box through a "
        "wall, and you cannot pull a box. The answer should be a sequence of actions, like <answer>Right || Right || "
        "Up</answer>"
    )
    reference_legend = {
        "#": "wall", "_": "empty", "O": "target", "√": "box on target", "X": "box", "P": "player",
        "S": "player on target",
    }  # fmt: skip
    reference_lists_actions = True
    max_action_chars = 2048

    def __init__(
        self,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        *,
        max_steps: int = 100,
        vocab: str | dict[str, str] = "default",
        observation_format: str = "grid",
        levels: str | Path | list[Level] | None = None,
        generator: str = "reference",
        search_depth: int = 300,
        pool_size: int = 0,
        pool_seed: int = 0,
        min_pushes: int | None = None,
        max_pushes: int | None = None,
        max_states: int | None = None,
        p_change_directions: float = 0.35,
        num_steps: int | None = None,
        backend: str = "auto",
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        check_arg(
            isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps >= 1,
            "max_steps",
            max_steps,
            "an int >= 1",
        )
        check_arg(
            observation_format in ("grid", "coord", "grid_coord"),
            "observation_format",
            observation_format,
            "'grid', 'coord' or 'grid_coord'",
        )
        check_arg(
            isinstance(pool_size, int) and not isinstance(pool_size, bool) and pool_size >= 0,
            "pool_size",
            pool_size,
            "an int >= 0 (0: generate a level per reset)",
        )
        check_arg(isinstance(pool_seed, int) and 0 <= pool_seed < 2**31, "pool_seed", pool_seed, "an int in 0..2**31-1")
        self.max_steps = max_steps
        self.observation_format = observation_format
        self.vocab = _resolve_vocab(vocab)
        self._symbols = [self.vocab[k] for k in _VOCAB_KEYS]
        self._instructions = self._make_instructions()
        self._levels: list[Level] | None = None
        self._pool = None
        self._pool_args: tuple[Any, ...] | None = None
        self._pool_index: np.ndarray | None = None
        self._generator: SokobanGenerator | ReferenceGenerator | None = None
        check_arg(
            generator in GENERATORS, "generator", generator, "'reference' (the RAGEN reference's levels) or 'exact'"
        )
        self.generator = generator
        self.config: GeneratorConfig | ReferenceConfig | None = None
        if levels is not None:
            check_arg(pool_size == 0, "pool_size", pool_size, "0 when levels are given")
            self._levels = _resolve_levels(levels)
            self.dim_room = self._levels[0].shape
            self.num_boxes = len(self._levels[0].boxes)
            self.search_depth = None
        else:
            # The configurations validate the room arguments, shared by both generators, with clear messages.
            room: dict[str, Any] = {
                "dim_room": tuple(dim_room) if isinstance(dim_room, (list, tuple)) else dim_room,
                "num_boxes": num_boxes,
                "p_change_directions": p_change_directions,
                "num_steps": num_steps,
            }
            if generator == "reference":
                given = {"min_pushes": min_pushes, "max_pushes": max_pushes, "max_states": max_states}
                for name in _EXACT_ONLY:
                    check_arg(
                        given[name] is None,
                        name,
                        given[name],
                        "None with generator='reference' (it applies to generator='exact' only; the reference "
                        "generator's one search knob is search_depth)",
                    )
                self.config = ReferenceConfig(**room, search_depth=search_depth)
                self.search_depth = self.config.search_depth
            else:
                # search_depth is the reference generator's; the exact one ignores it (the registered ids set it,
                # and gymnasium.make(id, generator="exact") must work), but a value of the wrong kind is still an error
                check_arg(
                    _is_count(search_depth) and search_depth >= 1,
                    "search_depth",
                    search_depth,
                    "an int >= 1 (generator='exact' ignores it: its search knobs are max_states, min_pushes and "
                    "max_pushes)",
                )
                self.config = GeneratorConfig(
                    **room,
                    max_states=20_000 if max_states is None else max_states,
                    max_depth=max_pushes,
                    min_depth=1 if min_pushes is None else min_pushes,
                )
                self.search_depth = None
            self.dim_room = self.config.dim_room
            self.num_boxes = self.config.num_boxes
            if pool_size > 0:
                self._pool_args = (self.config, pool_size, pool_seed, backend)  # to find the pool again (pickling)
                self._pool = _shared_pool(self.config, pool_size, pool_seed, backend)
                self._pool_index = self._pool.indices(min_pushes=min_pushes, max_pushes=max_pushes)
            elif isinstance(self.config, ReferenceConfig):
                self._generator = shared_reference_generator(self.config, backend=backend)
            else:
                self._generator = shared_generator(self.config, backend=backend)
        # Fresh reference levels (the default) are played from plain cells, without a Level (see _set_generated).
        self._fast_reference = isinstance(self._generator, ReferenceGenerator)
        if self._fast_reference:
            rows, cols = self.config.dim_room
            # The room as _grid_text's bytes: one code per byte, a b"\n" column after each row (the last one cut off).
            self._room_frame = np.full((rows, cols + 1), ord("\n"), dtype=np.uint8)
            self._room_cells = self._room_frame[:, :-1]  # the frame's cells, a view generate_cells writes into
        self._level: Level | None = None
        self._level_seed: int | None = None  # generator seed of the level being played, while _level is not built
        self._fixed: list[list[int]] = []
        self._boxes: set[tuple[int, int]] = set()
        self._player = (0, 0)
        self._on_target = 0
        self._deadlock = False
        self._board = None  # SokobanBoard of the level, built on the first push (dead squares)
        self._pushes: int | None = None
        self._moves: int | None = None
        self._pool_current: int | None = None  # index of the pooled level being played
        self._static_valid = False  # _static_bytes matches the current level
        self._static_bytes = b""
        self._grid_table, self._grid_replace = _grid_tables(self._symbols)

    # ------------------------------------------------------------------ pickling (and deepcopy)
    def __getstate__(self) -> dict[str, Any]:
        # The generator pickles as its configuration (see KernelGenerator.__reduce__); the views of its buffers and
        # the process-wide pool are not the env's own state: they are found again in the unpickling process.
        state = self.__dict__.copy()
        state.pop("_room_cells", None)  # a view of _room_frame: made again from the unpickled frame
        if state.get("_pool") is not None:
            state["_pool"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._pool_args is not None:
            self._pool = _shared_pool(*self._pool_args)
        if self._fast_reference:
            self._room_cells = self._room_frame[:, :-1]

    # ------------------------------------------------------------------ text the model sees
    @property
    def instructions(self) -> str:
        return self._instructions

    def _make_instructions(self) -> str:
        # The reference's env_instruction, then its symbol legend and action list (built once: resets reuse it).
        legend = ", ".join(f"{sym}: {word}" for sym, word in zip(self._symbols, _VOCAB_WORDS))
        return (
            "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
            "When you are right next to a box, you can push it by moving in the same direction. "
            "You cannot push a box through a wall, and you cannot pull a box. "
            "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
            f"The meaning of each symbol in the state is:\n{legend}\n"
            "Positions are (row, column), counted from 0 at the top-left corner.\n"
            f"Your available actions are:\n{', '.join(ACTIONS)}"
        )

    def _codes(self) -> list[list[int]]:
        codes = [row[:] for row in self._fixed]  # 0 wall, 1 floor, 2 target: the first three codes already
        for r, c in self._boxes:
            codes[r][c] = _BOX_ON_TARGET if self._fixed[r][c] == TARGET else _BOX
        r, c = self._player
        codes[r][c] = _PLAYER_ON_TARGET if self._fixed[r][c] == TARGET else _PLAYER
        return codes

    def state_text(self) -> str:
        if not self._fixed:
            return "(no level yet: call reset())"
        if self.observation_format == "grid":
            return self._grid_text()
        if self.observation_format == "coord":
            return self._coord_text()
        return "Coordinates:\n" + self._coord_text() + "\nGrid Map:\n" + self._grid_text()

    def _grid_text(self) -> str:
        # The room as bytes, one cell code per byte and b"\n" between rows (built once per level), the boxes and the
        # player written in, then bytes.translate to the symbols: ~1 us for a 6x6 room, a few times less than joining
        # per-cell symbol strings. Symbols that are not one ASCII character go through a placeholder byte.
        if not self._static_valid:
            self._static_bytes = b"\n".join(map(bytes, self._fixed))
            self._static_valid = True
        room = bytearray(self._static_bytes)  # a copy to write into
        width = len(self._fixed[0]) + 1
        for r, c in self._boxes:
            i = r * width + c
            room[i] = _BOX_ON_TARGET if room[i] == TARGET else _BOX
        r, c = self._player
        i = r * width + c
        room[i] = _PLAYER_ON_TARGET if room[i] == TARGET else _PLAYER
        text = room.translate(self._grid_table).decode("ascii")
        for placeholder, symbol in self._grid_replace:
            if placeholder in text:
                text = text.replace(placeholder, symbol)
        return text

    def _coord_text(self) -> str:
        rows, cols = len(self._fixed), len(self._fixed[0])
        view = self.state_view()
        lines = [f"Board size: {rows} rows x {cols} cols (zero-indexed)."]
        on_target = [b for b in view["boxes"] if self._fixed[b[0]][b[1]] == TARGET]
        off_target = [b for b in view["boxes"] if self._fixed[b[0]][b[1]] != TARGET]
        for label, cells in (
            ("Walls", view["walls"]),
            ("Targets", view["targets"]),
            ("Boxes", off_target),
            ("Boxes on target", on_target),
            ("Player", [view["player"]]),
        ):
            if cells:
                lines.append(f"{label}: " + ", ".join(f"({r}, {c})" for r, c in cells))
        return "\n".join(lines)

    def state_view(self) -> dict[str, Any]:
        fixed = self._fixed
        return {
            "size": [len(fixed), len(fixed[0]) if fixed else 0],
            "player": list(self._player),
            "boxes": sorted([r, c] for r, c in self._boxes),
            "targets": [[r, c] for r, row in enumerate(fixed) for c, v in enumerate(row) if v == TARGET],
            "walls": [[r, c] for r, row in enumerate(fixed) for c, v in enumerate(row) if v == WALL],
            "grid": self._grid_text().split("\n"),
            "boxes_on_target": self._on_target,
            "num_boxes": len(self._boxes),
        }

    def render_rgb(self) -> np.ndarray:
        if not self._fixed:
            raise RuntimeError("SokobanEnv.render() before reset(): there is no level to draw yet")
        return draw_grid(np.array(self._codes(), dtype=np.int64), _STYLES, tile=32)

    # ------------------------------------------------------------------ dynamics
    def _reset_state(self, options: dict[str, Any] | None) -> None:
        if options is None and self._fast_reference:  # the default: a fresh reference level (the hot path)
            x = self._first_draw()
            self._set_generated(x >> 2 if x is not None else int(self.np_random.integers(2**62)))
            return
        options = options or {}
        level = options.get("level")
        if level is not None:
            check_arg(isinstance(level, Level), "options['level']", type(level).__name__, "a sokoban Level")
            self._set_level(level)
            return
        index = options.get("level_index")
        if self._levels is not None:
            n = len(self._levels)
            i = self._pick(index, n)
            self._set_level(self._levels[i])
        elif self._pool is not None:
            idx = self._pool_index
            check_arg(len(idx) > 0, "min_pushes/max_pushes", "range", "a range that some pooled level falls in")
            i = int(idx[self._pick(index, len(idx))])
            pool = self._pool
            self._level, self._level_seed = None, None
            # a few tiny tolist() calls: cheaper than a Level, and the pool stays one compact array per process
            self._fixed = pool.fixed[i].tolist()
            self._boxes = {(r, c) for r, c in pool.boxes[i].tolist()}
            self._player = tuple(pool.player[i].tolist())  # type: ignore[assignment]
            pushes = int(pool.pushes[i])
            self._pushes = pushes if pushes >= 0 else None  # reference pools: unknown
            moves = int(pool.moves[i])
            self._moves = moves if moves >= 0 else None
            self._pool_current = i
            self._after_set()
        else:
            check_arg(index is None, "options['level_index']", index, "None for generated levels (use seed)")
            assert self._generator is not None
            # = int(self.np_random.integers(2**62)): one 64-bit draw x, returned as x >> 2 (see _first_draw)
            seed = self._first_draw()
            level_seed = seed >> 2 if seed is not None else int(self.np_random.integers(2**62))
            if self._fast_reference:
                self._set_generated(level_seed)
            else:
                self._set_level(self._generator.generate(level_seed))

    def _first_draw(self) -> int | None:
        """The first 64-bit output of ``np_random`` when it was just seeded by ``reset(seed=...)`` and not built yet
        (computed from the seed, see :meth:`BaseTextEnv._take_first_draw`), else ``None``: then draw from
        ``np_random`` itself."""
        seed = self._take_first_draw()
        return None if seed is None else first_uint64(seed)

    def _pick(self, index: Any, n: int) -> int:
        if index is None:
            # = self.np_random.random(): numpy's next_double is (x >> 11) * 2**-53 for one 64-bit draw x.
            # (random() is also several times cheaper than integers(), which sets numpy's error state on each call.)
            x = self._first_draw()
            u = (x >> 11) * 2.0**-53 if x is not None else self.np_random.random()
            return min(int(u * n), n - 1)
        check_arg(
            isinstance(index, (int, np.integer)) and not isinstance(index, bool) and 0 <= index < n,
            "options['level_index']",
            index,
            f"an int in 0..{n - 1}",
        )
        return int(index)

    def _set_generated(self, level_seed: int) -> None:
        """Play the reference level of ``level_seed`` from its plain cells (:meth:`ReferenceGenerator.generate_cells`);
        the :class:`Level` is built only if asked for (see :attr:`level`)."""
        fixed, boxes, player = self._generator.generate_cells(level_seed, room_out=self._room_cells)
        cols = self.dim_room[1]
        self._level, self._level_seed = None, level_seed
        self._pool_current = None
        self._fixed = fixed
        self._boxes = {divmod(b, cols) for b in boxes}
        self._player = divmod(player, cols)
        self._pushes = self._moves = None  # the reference generator knows neither
        self._after_set()
        self._static_bytes, self._static_valid = self._room_frame.tobytes()[:-1], True

    def _set_level(self, level: Level) -> None:
        self._level, self._level_seed = level, None
        self._pool_current = None
        self._fixed = level.fixed.tolist()
        self._boxes = set(level.boxes)
        self._player = tuple(level.player)  # type: ignore[assignment]
        self._pushes = level.pushes
        self._moves = level.moves
        self._after_set()

    def _after_set(self) -> None:
        fixed = self._fixed
        self._on_target = sum(1 for r, c in self._boxes if fixed[r][c] == TARGET)
        self._deadlock = False
        self._board = None
        self._static_valid = False

    @property
    def level(self) -> Level | None:
        """The level being played, as it was at reset (``None`` before the first reset). A generated or pooled level
        is built when first asked for (resets do not need one): regenerated from its seed, or read from the pool."""
        if self._level is None:
            if self._level_seed is not None and self._generator is not None:
                self._level = self._generator.generate(self._level_seed)
            elif self._pool_current is not None and self._pool is not None:
                self._level = self._pool.level(self._pool_current)
        return self._level

    def current_level(self) -> Level:
        """The level being played, as it was at reset (for the solver / oracle agent: use :meth:`snapshot`)."""
        level = self.level
        if level is None:
            raise RuntimeError("SokobanEnv.current_level() before reset(): there is no level yet")
        return level

    def snapshot(self) -> Level:
        """The current position as a :class:`Level` (e.g. to solve from here)."""
        return Level(
            fixed=np.array(self._fixed, dtype=np.int8),
            boxes=tuple(sorted(self._boxes)),
            player=self._player,
        )

    def state_info(self) -> dict[str, Any]:
        """Merged into every turn's info by the protocol (even a turn whose reply ran no action)."""
        return {"boxes_on_target": self._on_target, "deadlock": self._deadlock}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        observation, info = super().reset(seed=seed, options=options)
        info["boxes_on_target"] = self._on_target  # state_info()
        info["deadlock"] = self._deadlock
        info["optimal_pushes"] = self._pushes
        info["optimal_moves"] = self._moves
        return observation, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = super().step(action)
        if not terminated and self.num_env_steps >= self.max_steps:
            truncated = True
        info.update(self.state_info())  # also on an invalid action, which never reaches _apply_action
        return observation, reward, terminated, truncated, info

    def _apply_action(self, action: str) -> StepOutcome:
        dr, dc = _DELTAS[action]
        r, c = self._player
        fixed = self._fixed
        rows, cols = len(fixed), len(fixed[0])
        nr, nc = r + dr, c + dc
        parts = {"step": STEP_PENALTY}
        effective = False
        if 0 <= nr < rows and 0 <= nc < cols and fixed[nr][nc] != WALL:
            if (nr, nc) in self._boxes:
                br, bc = nr + dr, nc + dc
                if 0 <= br < rows and 0 <= bc < cols and fixed[br][bc] != WALL and (br, bc) not in self._boxes:
                    self._boxes.discard((nr, nc))
                    self._boxes.add((br, bc))
                    self._player = (nr, nc)
                    effective = True
                    was_on, now_on = fixed[nr][nc] == TARGET, fixed[br][bc] == TARGET
                    if now_on and not was_on:
                        self._on_target += 1
                        parts["box_on"] = BOX_ON_REWARD
                    elif was_on and not now_on:
                        self._on_target -= 1
                        parts["box_off"] = BOX_OFF_PENALTY
                    if not now_on and not self._deadlock:
                        self._deadlock = self._box_stuck((br, bc))
            else:
                self._player = (nr, nc)
                effective = True
        solved = self._on_target == len(self._boxes)
        if solved:
            parts["solved"] = SOLVED_REWARD
        return StepOutcome(
            reward=sum(parts.values()),
            terminated=solved,
            effective=effective,
            success=solved,
            reward_parts=parts,
            extra={"boxes_on_target": self._on_target, "deadlock": self._deadlock},
        )

    def _box_stuck(self, box: tuple[int, int]) -> bool:
        """Whether the box just pushed to ``box`` (off target) can never reach a target: dead square or freeze."""
        if self._board is None:
            self._board = SokobanBoard(np.array(self._fixed, dtype=np.int8))
        board = self._board
        cell = board.cell(box)
        return board.dead[cell] or board.frozen({board.cell(b) for b in self._boxes}, cell)

    def is_success(self) -> bool:
        return bool(self._boxes) and self._on_target == len(self._boxes)

    # ------------------------------------------------------------------ reasoning checks
    def outcomes_of(self, direction: str, view: dict[str, Any]) -> set[str]:
        """What moving ``direction`` does from the state ``view``: ``push`` (a box moves), ``target`` (it lands on a
        target) or ``blocked`` (nothing moves)."""
        dr, dc = _DELTAS[direction]
        rows, cols = view["size"]
        walls = {tuple(w) for w in view["walls"]}
        boxes = {tuple(b) for b in view["boxes"]}
        r, c = view["player"]
        nr, nc = r + dr, c + dc

        def free(cell: tuple[int, int]) -> bool:
            return 0 <= cell[0] < rows and 0 <= cell[1] < cols and cell not in walls

        if not free((nr, nc)):
            return {"blocked"}
        if (nr, nc) in boxes:
            beyond = (nr + dr, nc + dc)
            if not free(beyond) or beyond in boxes:
                return {"blocked"}
            return {"push", "target"} if beyond in {tuple(t) for t in view["targets"]} else {"push"}
        return set()

    def check_reasoning(self, think: str, view_before: dict[str, Any], actions: list[str]) -> dict[str, int]:
        """Verify what the thinking claims about the state it saw.

        Recognised claims (see :mod:`ragen_envs.grounding`): positions (``"I am at (2, 3)"``, ``"the box is at
        (3, 3)"``, ``"targets at (1, 1) and (4, 2)"``), what a move does (``"moving Left pushes the box onto the
        target"``, ``"going up hits a wall"``, ``"moving right does not push the box"``), and where boxes and targets
        lie (``"the box is below me"``, ``"the target is to the left"``).
        """
        if not think:
            return {"supported": 0, "contradicted": 0}
        player = tuple(view_before["player"])
        boxes = {tuple(b) for b in view_before["boxes"]}
        targets = {tuple(t) for t in view_before["targets"]}
        locations = {"player": {player}, "box": boxes, "target": targets}
        sym = dict(zip(_VOCAB_KEYS, self._symbols))
        keywords = {
            "player": _PLAYER_WORDS + (f"{sym['player'].lower()} is",),
            "box": _BOX_WORDS + (f"{sym['box'].lower()} is",),
            "target": _TARGET_WORDS + (f"{sym['target'].lower()} is",),
        }
        s1, c1 = grounding.check_position_claims(think, locations, keywords)
        s2, c2 = grounding.check_move_claims(think, lambda d: self.outcomes_of(d, view_before), _OUTCOME_WORDS)
        s3, c3 = grounding.check_relative_claims(think, _BOX_WORDS, player, boxes)  # type: ignore[arg-type]
        s4, c4 = grounding.check_relative_claims(think, _TARGET_WORDS, player, targets)  # type: ignore[arg-type]
        return {"supported": s1 + s2 + s3 + s4, "contradicted": c1 + c2 + c3 + c4}


_SHARED_POOLS: dict[tuple[GeneratorConfig | ReferenceConfig, int, int], Any] = {}


def _shared_pool(config: GeneratorConfig | ReferenceConfig, size: int, seed: int, backend: str) -> Any:
    """The pool of these arguments, loaded (or built) once per process and shared by every env that uses it (the
    configuration, and so the disk cache key, names the generator and its settings)."""
    key = (config, size, seed)
    pool = _SHARED_POOLS.get(key)
    if pool is None:
        pool = _SHARED_POOLS[key] = LevelPool.load_or_build(config, size, seed, backend=backend)
    return pool


def _resolve_vocab(vocab: str | dict[str, str]) -> dict[str, str]:
    if isinstance(vocab, str):
        check_arg(vocab in VOCABS, "vocab", vocab, f"one of {sorted(VOCABS)} or a dict with keys {list(_VOCAB_KEYS)}")
        return dict(VOCABS[vocab])
    check_arg(
        isinstance(vocab, dict) and set(vocab) == set(_VOCAB_KEYS),
        "vocab",
        vocab,
        f"one of {sorted(VOCABS)} or a dict with exactly the keys {list(_VOCAB_KEYS)}",
    )
    values = list(vocab.values())
    check_arg(
        all(isinstance(v, str) and v and "\n" not in v for v in values) and len(set(values)) == len(values),
        "vocab",
        vocab,
        "distinct, non-empty, single-line symbols",
    )
    return dict(vocab)


def _resolve_levels(levels: str | Path | list[Level]) -> list[Level]:
    if isinstance(levels, (str, Path)):
        loaded = load_boxoban(levels)
    else:
        check_arg(
            isinstance(levels, (list, tuple)) and len(levels) > 0 and all(isinstance(x, Level) for x in levels),
            "levels",
            type(levels).__name__,
            "None, a Boxoban file/folder path, or a non-empty list of Level",
        )
        loaded = list(levels)
    return loaded


def _grid_tables(symbols: list[str]) -> tuple[bytes, list[tuple[str, str]]]:
    """For :meth:`SokobanEnv._grid_text`: a ``bytes.translate`` table from the cell codes (0-6) to the symbols, and
    the (placeholder, symbol) pairs to replace afterwards for symbols that are not one printable ASCII character
    (the default vocabulary's ``√``, multi-character symbols). Placeholders are control characters that occur in no
    symbol, so one replacement never creates another placeholder."""
    table = bytearray(range(256))
    replace = []
    used = set("".join(symbols))
    free = [chr(b) for b in range(1, 32) if b != 10 and chr(b) not in used]  # 10 is the "\n" between rows
    for code, symbol in enumerate(symbols):
        if len(symbol) == 1 and 32 <= ord(symbol) < 127:
            table[code] = ord(symbol)
        else:
            check_arg(bool(free), "vocab", symbols, "symbols that leave some control character unused")
            placeholder = free.pop(0)
            table[code] = ord(placeholder)
            replace.append((placeholder, symbol))
    return bytes(table), replace
