"""Sokoban level difficulty and fresh-level speed: ragen's reference generator (the default) against the RAGEN reference.

Table 1, difficulty: for the registered settings 6x6 / 1 box (search depth 300, ``ragen/Sokoban-v0``) and 8x8 /
2 boxes (search depth 10, ``ragen/SokobanLarge-v0``) it generates ``--seeds`` levels (1,000) with ragen's reference
generator (:mod:`ragen_envs.sokoban.reference_generator`) and with the exact generator (``generator="exact"``, for
contrast), solves each with ragen's optimal solver and prints the median optimal solution length (moves) and the
share solvable within 10 moves (the reference's episode budget), next to the figures measured on 1,000 levels of
RAGEN's own generator (constants below).

Table 2, speed: fresh levels per second (no pool: one generated level per reset) of ragen's reference generator
(numba and plain-Python backends, and ``SokobanEnv.reset(seed=...)`` end to end) against gym-sokoban 0.0.6's real
``generate_room`` (the code RAGEN's generator is adapted from; only its ``envs/room_utils.py`` file is loaded, see
``benchmarks/bench_sokoban.py``), seeded per level as the reference env does (``random.seed`` + ``np.random.seed``),
at the same settings (dim, num_boxes, ``num_steps = int(1.7 * (rows + cols))``, search depth). gym-sokoban 0.0.6
hard-codes the search (``ttl=300``, pulls *and* plain moves); RAGEN changed it to pulls only with
``ttl=search_depth``, so the baseline row runs gym-sokoban's own functions with those two changes patched in (its
``ACTION_LOOKUP`` cut to the four pulls, its ``reverse_playing`` calling ``depth_first_search`` with
``ttl=search_depth``): it then explores exactly the states RAGEN's search does, at gym-sokoban's cost per state
(RAGEN's copy does slightly more work per state, so the ratio is, if anything, understated). gym-sokoban as shipped
is timed too, for context. Rates are per CPU second of this process (robust on a shared machine) and per wall
second; the ratio uses CPU rates. Target: ragen (numba) >= 100x gym-sokoban.

Install the comparison: ``pip install 'ragen[sokoban-bench]'`` or ``pip install --no-deps gym-sokoban==0.0.6``.

    python benchmarks/bench_sokoban_levels.py              # 1,000 seeds, ~1 minute
    python benchmarks/bench_sokoban_levels.py --quick      # 200 seeds, short timings
    python benchmarks/bench_sokoban_levels.py --seeds 300 --budget 2
    python benchmarks/bench_sokoban_levels.py --speed-only # table 2 only

The ``SokobanEnv.reset(seed)`` row is the env's whole fresh-level reset (seeding, generation, the grid text, the info
dict): gymnasium's ``np_random`` is built lazily, the level seed is computed from the reset seed, and the level is
read straight from the generator's kernel (see ``ragen_envs.core`` and ``ragen_envs.sokoban.env``). Target: resets,
too, >= 100x gym-sokoban's ``generate_room``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sokoban import gym_room_to_level, load_gym_sokoban_room_utils, print_table

from ragen_envs.sokoban.env import SokobanEnv
from ragen_envs.sokoban.generator import GeneratorConfig, Level, SokobanGenerator, numba_available
from ragen_envs.sokoban.reference_generator import ReferenceConfig, ReferenceGenerator
from ragen_envs.sokoban.solver import solve_level

# (label, dim, num_boxes, search_depth): the registered ids' settings (RAGEN config/envs.yaml + SokobanEnvConfig).
CONFIGS = [("6x6/1", (6, 6), 1, 300), ("8x8/2", (8, 8), 2, 10)]

#: Optimal solution length of RAGEN's own generator, measured by the team on 1,000 reference levels per config with
#: an optimal solver: (median moves, share solvable within 10 moves).
REFERENCE_MEASURED = {"6x6/1": (4.0, 0.997), "8x8/2": (6.0, 0.983)}
REFERENCE_LABEL = "reference, measured on 1,000 RAGEN levels"

SPEED_TARGET = 100.0


def progress(items: Iterable[Any], desc: str, total: int) -> Iterable[Any]:
    """A tqdm bar on stderr when tqdm is installed, else the items as they are."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, total=total, leave=False, file=sys.stderr)


# ------------------------------------------------------------------------------------------------ difficulty
def difficulty(make: Callable[[int], Level], seeds: int, desc: str) -> dict[str, Any]:
    moves = []
    unsolved = 0
    for seed in progress(range(seeds), desc, seeds):
        solution = solve_level(make(seed), max_expansions=2_000_000)
        if solution is None:
            unsolved += 1
        else:
            moves.append(solution.moves)
    m = np.array(moves)
    return {
        "n": len(m),
        "median": float(np.median(m)),
        "within10": float((m <= 10).mean()),
        "mean": float(m.mean()),
        "p90": float(np.percentile(m, 90)),
        "max": int(m.max()),
        "unsolved": unsolved,
    }


# ------------------------------------------------------------------------------------------------ speed
def rate(make: Callable[[int], Any], budget_s: float, desc: str, batch: int = 1) -> tuple[float, float, int]:
    """Call ``make(seed)`` for seeds 0, 1, ... until ``budget_s`` CPU seconds have passed (checked every ``batch``
    calls); returns levels per CPU second, per wall second, and the level count (``make`` returns ``None`` for a
    failed room)."""
    done = 0
    seed = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while time.process_time() - cpu0 < budget_s:
        for _ in range(batch):
            if make(seed) is not None:
                done += 1
            seed += 1
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(f"  {desc}: {done / cpu:,.1f} levels/s (CPU) over {done} levels", file=sys.stderr, flush=True)
    return done / max(cpu, 1e-9), done / max(wall, 1e-9), done


def gym_sokoban_make(room_utils: Any, dim: tuple[int, int], nb: int) -> Callable[[int], Level | None]:
    steps = int(1.7 * (dim[0] + dim[1]))

    def make(seed: int) -> Level | None:
        random.seed(seed)  # the reference env's all_seed(seed)
        np.random.seed(seed)
        try:
            structure, state, _ = room_utils.generate_room(dim=dim, num_steps=steps, num_boxes=nb)
        except (RuntimeError, RuntimeWarning):
            return None  # too few floor cells, or no room scored > 0 in 4 tries: the reference env resets again
        return gym_room_to_level(structure, state)

    return make


def patch_to_ragen_search(room_utils: Any, search_depth: int) -> Any:
    """gym-sokoban's module with RAGEN's two search changes: only the four pull actions, ``ttl=search_depth``."""
    m = room_utils
    m.ACTION_LOOKUP = {a: name for a, name in m.ACTION_LOOKUP.items() if a < 4}

    def reverse_playing(room_state: np.ndarray, room_structure: np.ndarray, search_depth: int = search_depth) -> Any:
        # gym-sokoban's reverse_playing, with the ttl it hard-codes (300) replaced by search_depth
        box_mapping = {}
        locations = np.where(room_structure == 2)
        m.num_boxes = len(locations[0])
        for i in range(m.num_boxes):
            box = (locations[0][i], locations[1][i])
            box_mapping[box] = box
        m.explored_states = set()
        m.best_room_score = -1
        m.best_box_mapping = box_mapping
        m.depth_first_search(room_state, room_structure, box_mapping, box_swaps=0, last_pull=(-1, -1), ttl=search_depth)
        return m.best_room, m.best_room_score, m.best_box_mapping

    m.reverse_playing = reverse_playing
    return m


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=None, help="levels per config for difficulty (default 1000)")
    parser.add_argument("--quick", action="store_true", help="200 seeds and short timings")
    parser.add_argument("--budget", type=float, default=None, help="CPU seconds per speed row (default 4, quick 1)")
    parser.add_argument("--no-shipped", action="store_true", help="skip gym-sokoban as shipped (slow at 8x8/2)")
    parser.add_argument("--speed-only", action="store_true", help="skip table 1 (difficulty): only the speed table")
    args = parser.parse_args(argv)
    seeds = args.seeds or (200 if args.quick else 1000)
    if seeds < 1:
        parser.error(f"invalid argument --seeds={seeds}: expected an int >= 1")
    budget = args.budget or (1.0 if args.quick else 4.0)
    gym_budget = budget * (2.5 if not args.quick else 1.5)
    have_numba = numba_available()
    print(
        f"python {sys.version.split()[0]}, numpy {np.__version__}, numba {'yes' if have_numba else 'no'}, "
        f"{os.cpu_count()} CPU(s); {seeds} seeds per config",
        flush=True,
    )

    # ---- table 1: difficulty
    diff_rows: list[list[str]] = []
    diff: dict[tuple[str, str], dict[str, Any]] = {}
    for label, dim, nb, depth in [] if args.speed_only else CONFIGS:
        ref_median, ref_share = REFERENCE_MEASURED[label]
        diff_rows.append([label, REFERENCE_LABEL, "1000", f"{ref_median:g}", f"{ref_share:.1%}", "", "", "", ""])
        ours = ReferenceGenerator(ReferenceConfig(dim, nb, search_depth=depth))
        exact = SokobanGenerator(GeneratorConfig(dim, nb))
        for name, gen in (
            (f"ragen reference (search_depth={depth})", ours),
            ("ragen exact (generator='exact')", exact),
        ):
            d = diff[(label, name.split()[1])] = difficulty(gen.generate, seeds, f"{label} {name.split()[1]}")
            diff_rows.append(
                [
                    label,
                    name,
                    str(d["n"]),
                    f"{d['median']:g}",
                    f"{d['within10']:.1%}",
                    f"{d['mean']:.2f}",
                    f"{d['p90']:g}",
                    str(d["max"]),
                    str(d["unsolved"]),
                ]
            )
    if diff_rows:
        print_table(
            "Optimal solution length (moves, ragen's solver)",
            ["config", "generator", "levels", "median", "<= 10 moves", "mean", "p90", "max", "unsolved"],
            diff_rows,
        )

    # ---- table 2: fresh-level speed
    room_utils_ok = load_gym_sokoban_room_utils() is not None
    if not room_utils_ok:
        print("gym-sokoban is not installed: no comparison (pip install --no-deps gym-sokoban==0.0.6)")
    speed_rows: list[list[str]] = []
    ratios: dict[str, float] = {}
    for label, dim, nb, depth in CONFIGS:
        cpu_rates: dict[str, float] = {}
        rows: list[tuple[str, float, float, int]] = []
        for backend in (["numba"] if have_numba else []) + ["python"]:
            gen = ReferenceGenerator(ReferenceConfig(dim, nb, search_depth=depth), backend=backend)
            gen.generate(10**9)  # compile / warm up outside the timing
            name = f"ragen reference generate(seed) ({backend})"
            r = rate(gen.generate, budget, f"{label} {name}", batch=64)
            rows.append((name, *r))
            cpu_rates[backend] = r[0]
        env = SokobanEnv(dim, nb, search_depth=depth)
        env.reset(seed=0)
        r = rate(lambda s, e=env: e.reset(seed=s), budget, f"{label} env reset", batch=64)
        rows.append((f"SokobanEnv.reset(seed) ({'numba' if have_numba else 'python'})", *r))
        cpu_rates["env"] = r[0]
        base = None
        if room_utils_ok:
            patched = patch_to_ragen_search(load_gym_sokoban_room_utils(), depth)
            r = rate(gym_sokoban_make(patched, dim, nb), gym_budget, f"{label} gym-sokoban (RAGEN search)")
            rows.append((f"gym-sokoban 0.0.6 generate_room, RAGEN's search (pulls, ttl={depth})", *r))
            base = r[0]
            if not args.no_shipped and not args.quick:
                shipped = load_gym_sokoban_room_utils()
                r = rate(gym_sokoban_make(shipped, dim, nb), gym_budget, f"{label} gym-sokoban as shipped")
                rows.append(("gym-sokoban 0.0.6 generate_room as shipped (pulls + moves, ttl=300)", *r))
        for name, cpu, wall, n in rows:
            ratio = f"{cpu / base:,.1f}x" if base else "-"
            speed_rows.append([label, name, fmt_rate(cpu), fmt_rate(wall), str(n), ratio])
        if base:
            for key, value in cpu_rates.items():
                ratios[f"{label} {key}"] = value / base
    print_table(
        "Fresh levels per second (no pool)",
        ["config", "generator", "levels/s (CPU)", "levels/s (wall)", "levels", "vs gym-sokoban (RAGEN search)"],
        speed_rows,
    )

    # ---- summary
    print("\nSummary")
    met = True
    for label, _dim, _nb, _depth in CONFIGS:
        ref_median, ref_share = REFERENCE_MEASURED[label]
        if (label, "reference") in diff:
            ours, exact = diff[(label, "reference")], diff[(label, "exact")]
            print(
                f"  {label}: ragen reference median {ours['median']:g} moves, {ours['within10']:.1%} within 10 "
                f"({REFERENCE_LABEL}: {ref_median:g}, {ref_share:.1%}); exact generator {exact['median']:g}, "
                f"{exact['within10']:.1%}"
            )
        if f"{label} numba" in ratios:
            ok = ratios[f"{label} numba"] >= SPEED_TARGET and ratios[f"{label} env"] >= SPEED_TARGET
            met = met and ok
            print(
                f"  {label}: numba {ratios[f'{label} numba']:,.0f}x, python {ratios[f'{label} python']:,.1f}x, "
                f"env reset {ratios[f'{label} env']:,.0f}x gym-sokoban's generate_room (target numba and env reset "
                f">= {SPEED_TARGET:.0f}x: {'met' if ok else 'MISSED'})"
            )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
