"""Sokoban level generation: ragen's generator against gym-sokoban's, side by side in one run.

For each room configuration (6x6 / 1 box, 8x8 / 2 boxes, 10x10 / 4 boxes) it measures rooms per second of

* ragen's generator with numba (the ``fast`` extra) and with the plain-Python fallback (identical levels), and
* gym-sokoban 0.0.6's real ``generate_room`` (the generator of the RAGEN reference code), run from the installed
  package's ``envs/room_utils.py``; gym-sokoban's package ``__init__`` needs the old ``gym`` and ``pkg_resources``,
  so only that module file is loaded (it needs only numpy),

then solves a sample of the levels of both with ragen's optimal solver and prints the distribution of optimal
solution lengths (moves and pushes), to show the faster levels are no easier. Finally it times a pooled reset.

Install the comparison: ``pip install 'ragen[sokoban-bench]'`` or ``pip install --no-deps gym-sokoban==0.0.6``.

    python benchmarks/bench_sokoban.py               # full run (~6 minutes on 2 cores)
    python benchmarks/bench_sokoban.py --quick       # smaller samples and time caps
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_envs.sokoban.env import SokobanEnv
from ragen_envs.sokoban.generator import GeneratorConfig, Level, SokobanGenerator, numba_available
from ragen_envs.sokoban.solver import solve

CONFIGS = [((6, 6), 1), ((8, 8), 2), ((10, 10), 4)]


def load_gym_sokoban_room_utils() -> Any | None:
    """gym-sokoban's ``room_utils`` module (its real generator code), or ``None`` when it is not installed."""
    try:
        dist = importlib.metadata.distribution("gym-sokoban")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file("gym_sokoban/envs/room_utils.py")))
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("gym_sokoban_room_utils", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gym_room_to_level(room_structure: np.ndarray, room_state: np.ndarray) -> Level:
    """gym-sokoban's codes (structure 0 wall/1 floor/2 target; state 3/4 box, 5 player) as a ragen Level."""
    fixed = room_structure.astype(np.int8)
    boxes = tuple(sorted((int(r), int(c)) for r, c in np.argwhere(np.isin(room_state, (3, 4)))))
    pr, pc = np.argwhere(room_state == 5)[0]
    return Level(fixed=fixed, boxes=boxes, player=(int(pr), int(pc)))


def time_rooms(make: Callable[[int], Level | None], budget_s: float, max_rooms: int) -> tuple[float, list[Level], int]:
    """Call ``make(seed)`` for seeds 0, 1, ... until ``budget_s`` or ``max_rooms``; rooms/s counts only successes."""
    levels: list[Level] = []
    failures = 0
    start = time.perf_counter()
    seed = 0
    while len(levels) < max_rooms and time.perf_counter() - start < budget_s:
        level = make(seed)
        seed += 1
        if level is None:
            failures += 1
        else:
            levels.append(level)
    elapsed = time.perf_counter() - start
    return (len(levels) / elapsed if elapsed > 0 else float("nan")), levels, failures


def difficulty(levels: list[Level], max_expansions: int, budget_s: float) -> dict[str, Any]:
    """Optimal moves / pushes of as many ``levels`` as ``budget_s`` allows."""
    moves: list[int] = []
    pushes: list[int] = []
    unsolved = 0
    start = time.perf_counter()
    for level in levels:
        if time.perf_counter() - start > budget_s:
            break
        solution = solve(level.fixed, level.boxes, level.player, max_expansions=max_expansions)
        if solution is None:
            unsolved += 1
        else:
            moves.append(solution.moves)
            pushes.append(solution.pushes)
    return {"moves": moves, "pushes": pushes, "unsolved": unsolved}


def summary(values: list[int]) -> str:
    if not values:
        return "-"
    q = np.percentile(values, [10, 50, 90])
    return f"{statistics.mean(values):5.1f} ({q[0]:.0f}/{q[1]:.0f}/{q[2]:.0f})"


def histogram(values: list[int], edges: list[int]) -> str:
    if not values:
        return "-"
    counts = np.histogram(values, bins=edges + [10**6])[0]
    share = counts / len(values)
    return " ".join(f"{e}+:{s:4.0%}" for e, s in zip(edges, share))


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for h in header:
            table.add_column(h, justify="right" if h not in ("config", "generator", "env") else "left")
        for row in rows:
            table.add_row(*row)
        Console(width=200).print(table)
    except ImportError:
        print(f"\n{title}")
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
        print("-+-".join("-" * w for w in widths))
        for row in rows:
            print(" | ".join(c.ljust(w) for c, w in zip(row, widths)))


def pooled_reset_us(n_resets: int, pool_size: int) -> list[list[str]]:
    """Mean microseconds of a reset from a pool (unseeded and seeded), unwrapped and through ``gymnasium.make`` (the
    turn protocol: system prompt and first user message), and of a reset that generates its level."""
    import gymnasium

    def mean_us(fn: Callable[[int], Any], n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            fn(i)
        return (time.perf_counter() - start) / n * 1e6

    rows = []
    for name, env in (
        ("SokobanEnv (unwrapped)", SokobanEnv((6, 6), 1, pool_size=pool_size)),
        ("gymnasium.make('ragen/Sokoban-v0')", gymnasium.make("ragen/Sokoban-v0", pool_size=pool_size)),
    ):
        env.reset(seed=0)
        generated = gymnasium.make("ragen/Sokoban-v0") if name.startswith("gym") else SokobanEnv((6, 6), 1)
        generated.reset(seed=0)
        rows.append(
            [
                "6x6/1",
                name,
                f"{mean_us(lambda i, e=env: e.reset(), n_resets):.1f}",
                f"{mean_us(lambda i, e=env: e.reset(seed=i), n_resets):.1f}",
                f"{mean_us(lambda i, e=generated: e.reset(), n_resets // 10):.1f}",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller samples and time caps")
    parser.add_argument(
        "--gym-budget",
        type=float,
        default=None,
        help="seconds per config for gym-sokoban (default 10/30/120 s, quick 5/10/30 s)",
    )
    parser.add_argument("--solve-sample", type=int, default=None, help="levels per generator solved for difficulty")
    args = parser.parse_args(argv)
    quick = args.quick
    default_budgets = (5.0, 10.0, 30.0) if quick else (10.0, 30.0, 120.0)
    ours_budget = 1.5 if quick else 4.0
    solve_sample = args.solve_sample or (40 if quick else 150)

    room_utils = load_gym_sokoban_room_utils()
    if room_utils is None:
        print(
            "gym-sokoban is not installed: only ragen's generator is measured "
            "(pip install --no-deps gym-sokoban==0.0.6 for the comparison)"
        )
    have_numba = numba_available()
    print(
        f"python {sys.version.split()[0]}, numpy {np.__version__}, numba {'yes' if have_numba else 'no'}, "
        f"{os.cpu_count()} CPU(s); gym-sokoban {'0.0.6 (room_utils.generate_room)' if room_utils else 'missing'}"
    )

    speed_rows: list[list[str]] = []
    diff_rows: list[list[str]] = []
    for (dim, nb), default_budget in zip(CONFIGS, default_budgets):
        gym_budget = args.gym_budget or default_budget
        label = f"{dim[0]}x{dim[1]}/{nb}"
        cfg = GeneratorConfig(dim, nb)
        rates: dict[str, float] = {}
        samples: dict[str, list[Level]] = {}
        for backend in (["numba"] if have_numba else []) + ["python"]:
            gen = SokobanGenerator(cfg, backend=backend)
            gen.generate(10**9)  # compile / warm up outside the timing
            budget = ours_budget if backend == "numba" else ours_budget * (3 if nb == 4 else 1)
            rate, levels, _ = time_rooms(gen.generate, budget, 200_000)
            rates[f"ragen ({backend})"] = rate
            samples.setdefault("ragen", levels)
            print(f"  {label} ragen ({backend}): {rate:,.1f} rooms/s over {len(levels)} rooms", flush=True)
        if room_utils is not None:
            steps = int(1.7 * (dim[0] + dim[1]))

            def make_gym(seed: int, dim: tuple[int, int] = dim, nb: int = nb, steps: int = steps) -> Level | None:
                random.seed(seed)
                np.random.seed(seed)
                try:
                    structure, state, _ = room_utils.generate_room(dim=dim, num_steps=steps, num_boxes=nb)
                except (RuntimeError, RuntimeWarning):
                    return None  # gym-sokoban raises when no room scored > 0; its env then resets again
                return gym_room_to_level(structure, state)

            rate, levels, failures = time_rooms(make_gym, gym_budget, 100_000)
            rates["gym-sokoban"] = rate
            samples["gym-sokoban"] = levels
            print(
                f"  {label} gym-sokoban: {rate:,.2f} rooms/s over {len(levels)} rooms ({failures} failed tries)",
                flush=True,
            )
        base = rates.get("gym-sokoban")
        for name, rate in rates.items():
            ratio = f"{rate / base:,.0f}x" if base and name != "gym-sokoban" else ("1x" if base else "-")
            speed_rows.append([label, name, f"{rate:,.2f}", f"{1e3 / rate:,.3f}", ratio])
        for name, levels in samples.items():
            sample = levels[:solve_sample]
            d = difficulty(sample, max_expansions=300_000, budget_s=60.0 if not quick else 20.0)
            diff_rows.append(
                [
                    label,
                    name,
                    str(len(d["moves"])),
                    summary(d["moves"]),
                    summary(d["pushes"]),
                    histogram(d["moves"], [0, 10, 20, 30, 40, 60]),
                    str(d["unsolved"]),
                ]
            )
            print(f"  {label} {name}: solved {len(d['moves'])} levels", flush=True)

    print_table(
        "Generator speed (rooms/s, higher is better)",
        ["config", "generator", "rooms/s", "ms/room", "vs gym-sokoban"],
        speed_rows,
    )
    print_table(
        "Difficulty: optimal solution length, mean (p10/median/p90)",
        ["config", "generator", "levels", "moves", "pushes", "moves histogram", "unsolved"],
        diff_rows,
    )

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RAGEN_CACHE_DIR"] = tmp
        reset_rows = pooled_reset_us(20_000 if not quick else 5_000, 2_000)
    print_table(
        "reset() at 6x6/1 (microseconds, mean)",
        ["config", "env", "pooled reset()", "pooled reset(seed=i)", "generated reset()"],
        reset_rows,
    )


if __name__ == "__main__":
    main()
