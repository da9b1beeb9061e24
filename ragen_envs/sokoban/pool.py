"""Pre-generated level pools: a reset becomes an array lookup.

A :class:`LevelPool` holds ``size`` levels of one configuration as numpy arrays: a
:class:`~ragen_envs.sokoban.generator.GeneratorConfig` (the exact generator) or a
:class:`~ragen_envs.sokoban.reference_generator.ReferenceConfig` (the reference generator), with each level's fewest
pushes (when the generator knows it: the exact one does, the reference one does not) and, when built with
``solve=True``, its fewest moves (from the solver). :meth:`LevelPool.load_or_build` keeps pools in the user cache
folder (``ragen_envs.cache.cache_dir("sokoban", "pools")``), keyed by the configuration (whose key names the generator,
its version and its search settings), the size and the seed, and builds a missing pool in parallel worker processes
with a progress bar.

Level ``i`` of a pool with seed ``s`` is ``generate(s * 2**32 + i)``, so a pool is the same whatever the number of
workers, and any level can be regenerated on its own.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragen_envs.cache import cache_dir
from ragen_envs.core import check_arg
from ragen_envs.sokoban.base import is_int
from ragen_envs.sokoban.generator import GeneratorConfig, Level, SokobanGenerator
from ragen_envs.sokoban.reference_generator import ReferenceConfig, ReferenceGenerator
from ragen_envs.sokoban.solver import solve_level

#: Pool files are written in this layout; bump when it changes.
POOL_FORMAT = 1


#: A configuration of either generator.
PoolConfig = GeneratorConfig | ReferenceConfig


def level_seed(pool_seed: int, index: int) -> int:
    """The generator seed of level ``index`` of the pool with seed ``pool_seed``."""
    return pool_seed * 2**32 + index


def generator_type(config: PoolConfig) -> type[SokobanGenerator | ReferenceGenerator]:
    """The generator class that makes the levels of ``config``."""
    return ReferenceGenerator if isinstance(config, ReferenceConfig) else SokobanGenerator


@dataclass
class LevelPool:
    """``size`` levels of one configuration as arrays (see the module docstring).

    Attributes:
        config: the generator configuration (exact or reference).
        seed: the pool seed.
        fixed: ``(size, rows, cols)`` int8 cell codes (0 wall, 1 floor, 2 target).
        boxes: ``(size, num_boxes, 2)`` int16 box cells.
        player: ``(size, 2)`` int16 player cells.
        pushes: ``(size,)`` fewest pushes of each level, ``-1`` where unknown (reference levels).
        moves: ``(size,)`` fewest moves, ``-1`` where unknown (not solved, or over the solver budget).
    """

    config: PoolConfig
    seed: int
    fixed: np.ndarray
    boxes: np.ndarray
    player: np.ndarray
    pushes: np.ndarray
    moves: np.ndarray

    def __len__(self) -> int:
        return int(self.fixed.shape[0])

    def level(self, index: int) -> Level:
        """Level ``index`` as a :class:`Level`."""
        i = int(index)
        return Level(
            fixed=self.fixed[i].copy(),
            boxes=tuple((int(r), int(c)) for r, c in self.boxes[i]),
            player=(int(self.player[i, 0]), int(self.player[i, 1])),
            pushes=int(self.pushes[i]) if self.pushes[i] >= 0 else None,
            moves=int(self.moves[i]) if self.moves[i] >= 0 else None,
            seed=level_seed(self.seed, i),
        )

    def __iter__(self) -> Iterator[Level]:
        return (self.level(i) for i in range(len(self)))

    def indices(
        self,
        *,
        min_pushes: int | None = None,
        max_pushes: int | None = None,
        min_moves: int | None = None,
        max_moves: int | None = None,
    ) -> np.ndarray:
        """Indices of the levels whose difficulty is in the given ranges (a curriculum stage).

        Move bounds need a pool built with ``solve=True``; levels with unknown moves are left out by them.
        """
        keep = np.ones(len(self), dtype=bool)
        if min_pushes is not None:
            keep &= self.pushes >= min_pushes
        if max_pushes is not None:
            keep &= self.pushes <= max_pushes
        if min_moves is not None or max_moves is not None:
            keep &= self.moves >= 0
        if min_moves is not None:
            keep &= self.moves >= min_moves
        if max_moves is not None:
            keep &= self.moves <= max_moves
        return np.nonzero(keep)[0]

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the pool to ``path`` (an ``.npz`` file), atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        cfg = self.config
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
        np.savez_compressed(
            tmp,
            format=np.int64(POOL_FORMAT),
            generator_version=np.int64(generator_type(cfg).version),
            config_key=np.array(cfg.key()),
            dim_room=np.array(cfg.dim_room, dtype=np.int64),
            num_boxes=np.int64(cfg.num_boxes),
            seed=np.int64(self.seed),
            fixed=self.fixed,
            boxes=self.boxes,
            player=self.player,
            pushes=self.pushes,
            moves=self.moves,
        )
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path, config: PoolConfig) -> LevelPool:
        """Read a pool written by :meth:`save`; raises ``ValueError`` when it was made for another configuration
        or generator version."""
        with np.load(Path(path), allow_pickle=False) as data:
            version = generator_type(config).version
            if int(data["format"]) != POOL_FORMAT or int(data["generator_version"]) != version:
                raise ValueError(f"{path}: pool made by another generator version or file format; rebuild it")
            if str(data["config_key"]) != config.key():
                raise ValueError(f"{path}: pool of configuration {str(data['config_key'])!r}, not {config.key()!r}")
            return cls(
                config=config,
                seed=int(data["seed"]),
                fixed=data["fixed"],
                boxes=data["boxes"],
                player=data["player"],
                pushes=data["pushes"],
                moves=data["moves"],
            )

    @staticmethod
    def cache_path(config: PoolConfig, size: int, seed: int = 0, *, solve: bool = True) -> Path:
        """Where :meth:`load_or_build` keeps this pool."""
        name = f"{config.key()}_n{size}_seed{seed}{'_solved' if solve else ''}.npz"
        return cache_dir("sokoban", "pools") / name

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        config: PoolConfig,
        size: int,
        seed: int = 0,
        *,
        workers: int | None = None,
        solve: bool = True,
        max_expansions: int = 200_000,
        progress: bool = True,
        backend: str = "auto",
    ) -> LevelPool:
        """Generate ``size`` levels (and solve them when ``solve``) in ``workers`` processes (default: CPU count).

        ``max_expansions`` caps the solver per level; a level over budget keeps ``moves = -1``.
        """
        check_arg(is_int(size) and size >= 1, "size", size, "an int >= 1")
        check_arg(is_int(seed) and 0 <= seed < 2**31, "seed", seed, "an int in 0..2**31-1")
        check_arg(workers is None or (is_int(workers) and workers >= 1), "workers", workers, "None or an int >= 1")
        workers = workers or os.cpu_count() or 1
        # Chunks small enough for a smooth progress bar, large enough to amortise the inter-process traffic.
        chunk = max(1, min(2000, size // (workers * 16) or 1))
        tasks = [
            (config, backend, seed, start, min(size, start + chunk), solve, max_expansions)
            for start in range(0, size, chunk)
        ]
        rows, cols = config.dim_room
        nb = config.num_boxes
        fixed = np.zeros((size, rows, cols), dtype=np.int8)
        boxes = np.zeros((size, nb, 2), dtype=np.int16)
        player = np.zeros((size, 2), dtype=np.int16)
        pushes = np.full(size, -1, dtype=np.int32)
        moves = np.full(size, -1, dtype=np.int32)
        bar = _Progress(size, f"sokoban pool {config.key()} x{size}", enabled=progress)
        started = time.perf_counter()
        if workers == 1 or len(tasks) == 1:
            results = map(_build_chunk, tasks)
            pool = None
        else:
            pool = multiprocessing.get_context().Pool(min(workers, len(tasks)))
            results = pool.imap_unordered(_build_chunk, tasks)
        try:
            for start, f, b, p, pu, mo in results:
                end = start + len(f)
                fixed[start:end], boxes[start:end], player[start:end] = f, b, p
                pushes[start:end], moves[start:end] = pu, mo
                bar.update(len(f))
        finally:
            if pool is not None:
                pool.close()
                pool.join()
        bar.close()
        if progress:
            known = pushes[pushes >= 0]
            solved = moves[moves >= 0]
            print(
                f"built {size} levels in {time.perf_counter() - started:.1f}s with {workers} worker(s)"
                + (f"; pushes {known.min()}..{known.max()} (mean {known.mean():.1f})" if len(known) else "")
                + (f"; solved {len(solved)}/{size}, moves mean {solved.mean():.1f}" if solve and len(solved) else ""),
                file=sys.stderr,
            )
        return cls(config=config, seed=seed, fixed=fixed, boxes=boxes, player=player, pushes=pushes, moves=moves)

    @classmethod
    def load_or_build(
        cls,
        config: PoolConfig,
        size: int,
        seed: int = 0,
        *,
        solve: bool = True,
        workers: int | None = None,
        progress: bool = True,
        backend: str = "auto",
    ) -> LevelPool:
        """The cached pool for these arguments, built and saved first when missing (or stale)."""
        path = cls.cache_path(config, size, seed, solve=solve)
        if path.exists():
            try:
                return cls.load(path, config)
            except (ValueError, OSError, KeyError) as err:  # stale or damaged cache: rebuild it
                print(f"rebuilding sokoban pool {path.name}: {err}", file=sys.stderr)
        pool = cls.build(config, size, seed, workers=workers, solve=solve, progress=progress, backend=backend)
        pool.save(path)
        return pool


def _build_chunk(task: tuple[Any, ...]) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    config, backend, seed, start, end, solve, max_expansions = task
    gen = generator_type(config)(config, backend=backend)
    n = end - start
    rows, cols = config.dim_room
    fixed = np.zeros((n, rows, cols), dtype=np.int8)
    boxes = np.zeros((n, config.num_boxes, 2), dtype=np.int16)
    player = np.zeros((n, 2), dtype=np.int16)
    pushes = np.full(n, -1, dtype=np.int32)
    moves = np.full(n, -1, dtype=np.int32)
    for k in range(n):
        level = gen.generate(level_seed(seed, start + k))
        fixed[k] = level.fixed
        boxes[k] = level.boxes
        player[k] = level.player
        if level.pushes is not None:
            pushes[k] = level.pushes
        if solve:
            solution = solve_level(level, max_expansions=max_expansions)
            if solution is not None:
                moves[k] = solution.moves
    return start, fixed, boxes, player, pushes, moves


class _Progress:
    """tqdm when installed (ragen_envs does not depend on it), else a line every 10 %."""

    def __init__(self, total: int, desc: str, *, enabled: bool = True) -> None:
        self.total, self.desc, self.enabled = total, desc, enabled
        self.done = 0
        self._next = 0.1
        self._bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, desc=desc, unit="level")
            except ImportError:
                print(f"{desc}: 0/{total}", file=sys.stderr)

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
        elif self.done / self.total >= self._next or self.done == self.total:
            print(f"{self.desc}: {self.done}/{self.total}", file=sys.stderr)
            while self._next <= self.done / self.total:
                self._next += 0.1

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m ragen_envs.sokoban.pool --dim 8 8 --boxes 2 --size 20000``: build (or find) a cached pool."""
    import argparse

    parser = argparse.ArgumentParser(description="Build a cached pool of Sokoban levels (a reset becomes a lookup).")
    parser.add_argument("--dim", type=int, nargs=2, default=(6, 6), metavar=("ROWS", "COLS"))
    parser.add_argument("--boxes", type=int, default=1)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all CPUs)")
    parser.add_argument("--max-states", type=int, default=20_000)
    parser.add_argument("--no-solve", action="store_true", help="skip the solver (no optimal move counts)")
    args = parser.parse_args(argv)
    try:
        config = GeneratorConfig(tuple(args.dim), args.boxes, max_states=args.max_states)  # type: ignore[arg-type]
        pool = LevelPool.load_or_build(config, args.size, args.seed, solve=not args.no_solve, workers=args.workers)
    except ValueError as err:
        parser.error(str(err))
    path = LevelPool.cache_path(config, args.size, args.seed, solve=not args.no_solve)
    counts = np.bincount(pool.pushes)
    print(f"{len(pool)} levels in {path}")
    print("pushes: " + ", ".join(f"{k}: {n}" for k, n in enumerate(counts) if n))


if __name__ == "__main__":
    main()
