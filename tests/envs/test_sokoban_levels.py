"""Sokoban levels: generator (solvable, deterministic, same on both backends), solver, pools, Boxoban loader."""

from __future__ import annotations

import numpy as np
import pytest

from ragen_envs.sokoban.boxoban import BoxobanFormatError, load_boxoban, parse_boxoban
from ragen_envs.sokoban.generator import (
    GenerationError,
    GeneratorConfig,
    Level,
    SokobanGenerator,
    generate_level,
    numba_available,
)
from ragen_envs.sokoban.pool import LevelPool, level_seed
from ragen_envs.sokoban.solver import SokobanBoard, replay, solve_level

BACKENDS = ["python"] + (["numba"] if numba_available() else [])


def _check_level_shape(level: Level, dim: tuple[int, int], nb: int) -> None:
    assert level.fixed.shape == dim
    fixed = level.fixed
    # border is wall, boxes and player on distinct floor cells, as many targets as boxes, every box off target
    assert not fixed[0].any() and not fixed[-1].any() and not fixed[:, 0].any() and not fixed[:, -1].any()
    assert len(level.boxes) == nb == int((fixed == 2).sum())
    assert len(set(level.boxes)) == nb
    assert all(fixed[b] == 1 for b in level.boxes), "generated levels start with every box off target"
    assert fixed[level.player] != 0 and level.player not in level.boxes
    assert level.pushes is not None and level.pushes >= 1


# ------------------------------------------------------------------------------------------------ generator
@pytest.mark.parametrize("dim, nb, n", [((6, 6), 1, 300), ((8, 8), 2, 300), ((7, 9), 3, 40)])
def test_every_generated_level_is_solved_optimally(dim, nb, n):
    gen = SokobanGenerator(GeneratorConfig(dim, nb))
    for seed in range(n):
        level = gen.generate(seed)
        _check_level_shape(level, dim, nb)
        solution = solve_level(level)
        assert solution is not None, f"seed {seed} unsolved:\n{level.to_text()}"
        # the plan is checked by an independent replay of the rules, not by the search that made it
        assert replay(level.fixed, level.boxes, level.player, solution.actions), level.to_text()
        assert solution.moves == len(solution.actions) >= solution.pushes >= level.pushes
        if seed < 60:
            # the reverse-play BFS depth is the exact fewest pushes: the solver's push-optimal plan agrees
            assert solve_level(level, objective="pushes").pushes == level.pushes


def test_generator_is_deterministic_per_seed():
    cfg = GeneratorConfig((8, 8), 2)
    a = [SokobanGenerator(cfg).generate(s) for s in range(30)]
    b = [SokobanGenerator(cfg).generate(s) for s in range(30)]
    assert a == b
    assert [x.pushes for x in a] == [x.pushes for x in b]
    assert len({x.to_text() for x in a}) > 25  # different seeds, different levels
    assert generate_level(7, cfg) == a[7]


@pytest.mark.parametrize("dim, nb, n", [((6, 6), 1, 40), ((8, 8), 2, 25), ((10, 10), 4, 2)])
def test_backends_make_identical_levels(dim, nb, n):
    if not numba_available():
        pytest.skip("numba is not installed")
    cfg = GeneratorConfig(dim, nb, max_states=3000)
    fast = SokobanGenerator(cfg, backend="numba")
    slow = SokobanGenerator(cfg, backend="python")
    for seed in range(n):
        a, b = fast.generate(seed), slow.generate(seed)
        assert a == b and a.pushes == b.pushes and a.meta == b.meta, seed


def test_depth_range_is_a_curriculum():
    easy = SokobanGenerator(GeneratorConfig((8, 8), 2, max_depth=3))
    hard = SokobanGenerator(GeneratorConfig((8, 8), 2, min_depth=8))
    for seed in range(40):
        assert 1 <= easy.generate(seed).pushes <= 3
        level = hard.generate(seed)
        assert level.pushes >= 8
        assert solve_level(level, objective="pushes").pushes == level.pushes


def test_generator_rejects_bad_arguments():
    for kwargs, name in [
        ({"dim_room": (3, 6)}, "dim_room"),
        ({"dim_room": "6x6"}, "dim_room"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"num_boxes": 20}, "num_boxes"),
        ({"p_change_directions": 1.5}, "p_change_directions"),
        ({"max_states": 0}, "max_states"),
        ({"max_depth": 0}, "max_depth"),
        ({"min_depth": 5, "max_depth": 2}, "min_depth"),
    ]:
        with pytest.raises(ValueError, match=name):
            GeneratorConfig(**kwargs)
    with pytest.raises(ValueError, match="seed"):
        SokobanGenerator().generate(-1)
    with pytest.raises(ValueError, match="backend"):
        SokobanGenerator(backend="cuda")
    # a depth no 5x5 room can reach: a clear error, not a hang
    with pytest.raises(GenerationError, match="pushes"):
        SokobanGenerator(GeneratorConfig((5, 5), 1, min_depth=40, tries=5)).generate(0)


# ------------------------------------------------------------------------------------------------ solver
def _level(text: str) -> Level:
    return parse_boxoban(text)[0]


def test_solver_finds_the_fewest_moves_and_pushes():
    level = _level("#######\n#@ $ .#\n#######")
    sol = solve_level(level)
    assert sol.actions == ["Right", "Right", "Right"] and sol.pushes == 2
    # walking around the box: the player must go below it to push it up
    level = _level("#####\n#.  #\n#   #\n# $ #\n#  @#\n#####")
    sol = solve_level(level)
    assert replay(level.fixed, level.boxes, level.player, sol.actions)
    assert sol.pushes == 3 and sol.moves == _bfs_moves(level)


def _bfs_moves(level: Level) -> int:
    """Plain breadth-first search over (player, boxes): the reference's way, slow but obviously right."""
    from collections import deque

    fixed = level.fixed
    start = (level.player, frozenset(level.boxes))
    seen = {start}
    queue = deque([(start, 0)])
    targets = frozenset(zip(*(a.tolist() for a in np.nonzero(fixed == 2))))
    while queue:
        (player, boxes), d = queue.popleft()
        if boxes == targets:
            return d
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            p = (player[0] + dr, player[1] + dc)
            if fixed[p] == 0:
                continue
            nb = boxes
            if p in boxes:
                q = (p[0] + dr, p[1] + dc)
                if fixed[q] == 0 or q in boxes:
                    continue
                nb = boxes - {p} | {q}
            state = (p, nb)
            if state not in seen:
                seen.add(state)
                queue.append((state, d + 1))
    return -1


def test_solver_is_move_optimal_against_brute_force():
    gen = SokobanGenerator(GeneratorConfig((7, 7), 2))
    for seed in range(25):
        level = gen.generate(seed)
        assert solve_level(level).moves == _bfs_moves(level), level.to_text()


def test_solver_reports_unsolvable_and_deadlocks():
    corner = _level("#####\n#$  #\n#  .#\n#@  #\n#####")
    assert solve_level(corner) is None
    board = SokobanBoard(corner.fixed)
    assert board.deadlocked([board.cell((1, 1))])
    assert not board.deadlocked([board.cell((2, 2))])
    # two boxes side by side against a wall: frozen
    frozen = _level("######\n#$$  #\n#  ..#\n#@   #\n######")
    assert solve_level(frozen) is None
    assert solve_level(_level("######\n#@$ .#\n#  * #\n######")).moves == 2
    assert solve_level(_level("####\n#@*#\n####")).moves == 0
    with pytest.raises(ValueError, match="objective"):
        solve_level(corner, objective="time")


# ------------------------------------------------------------------------------------------------ pools
def test_pool_is_built_in_parallel_cached_and_filterable(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path))
    cfg = GeneratorConfig((6, 6), 1)
    pool = LevelPool.load_or_build(cfg, 64, seed=3, workers=2)
    assert len(pool) == 64
    path = LevelPool.cache_path(cfg, 64, 3)
    assert path.exists() and path.is_relative_to(tmp_path)
    assert "built 64 levels" in capsys.readouterr().err
    gen = SokobanGenerator(cfg)
    for i in (0, 17, 63):  # level i is the generator's level of seed level_seed(3, i), whatever the workers
        assert pool.level(i) == gen.generate(level_seed(3, i))
    assert (pool.moves >= pool.pushes).all() and (pool.pushes >= 1).all()
    again = LevelPool.load_or_build(cfg, 64, seed=3)
    assert np.array_equal(again.fixed, pool.fixed) and np.array_equal(again.moves, pool.moves)
    serial = LevelPool.build(cfg, 64, seed=3, workers=1, progress=False)
    assert np.array_equal(serial.boxes, pool.boxes)
    easy = pool.indices(max_pushes=1)
    assert len(easy) and (pool.pushes[easy] == 1).all()
    short = pool.indices(min_moves=5, max_moves=8)
    assert ((pool.moves[short] >= 5) & (pool.moves[short] <= 8)).all()
    with pytest.raises(ValueError, match="configuration"):
        LevelPool.load(path, GeneratorConfig((6, 6), 1, max_states=10))


# ------------------------------------------------------------------------------------------------ Boxoban
BOXOBAN_FIXTURE = """; 0
##########
##########
#### #####
#  $ #####
# #.   ###
#  .$ $ .#
####@  .##
######$###
######  ##
##########

; 1
#######
#+ $  #
#  *  #
#     #
#######
"""


def test_boxoban_loader_reads_levels(tmp_path):
    path = tmp_path / "000.txt"
    path.write_text(BOXOBAN_FIXTURE)
    levels = load_boxoban(path)
    assert len(levels) == 2
    first = levels[0]
    assert first.shape == (10, 10) and first.player == (6, 4)
    assert first.boxes == ((3, 3), (5, 4), (5, 6), (7, 6))
    assert set(first.targets) == {(4, 3), (5, 3), (5, 8), (6, 7)}
    assert first.meta["name"] == "0" and first.meta["line"] == 2
    second = levels[1]
    assert second.player == (1, 1) and second.fixed[1, 1] == 2 and second.fixed[2, 3] == 2
    assert second.to_text() == "#######\n#+ $  #\n#  *  #\n#     #\n#######"
    # the folder form reads every .txt file in name order
    (tmp_path / "001.txt").write_text("; 7\n#####\n#@$.#\n#####\n")
    assert len(load_boxoban(tmp_path)) == 3
    assert solve_level(second).moves > 0


def test_boxoban_loader_explains_bad_input(tmp_path):
    for text, message in [
        ("; 0\n#####\n#@$x#\n#####\n", "unknown symbol 'x'"),
        ("; 0\n#####\n#@$.@#\n#####\n", "exactly one player"),
        ("; 0\n#####\n#@$$.#\n#####\n", "2 boxes but 1 goals"),
        ("; 0\n#####\n#@ .#\n#####\n", "no box"),
        ("", "no level"),
    ]:
        with pytest.raises(BoxobanFormatError, match=message):
            parse_boxoban(text)
    with pytest.raises(FileNotFoundError):
        load_boxoban(tmp_path / "missing.txt")
    with pytest.raises(BoxobanFormatError, match="no .txt"):
        load_boxoban(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("dim, nb, n", [((6, 6), 1, 5000), ((8, 8), 2, 3000), ((10, 10), 4, 200), ((9, 12), 3, 300)])
def test_large_seeded_sample_is_solvable(dim, nb, n):
    gen = SokobanGenerator(GeneratorConfig(dim, nb))
    for seed in range(100_000, 100_000 + n):
        level = gen.generate(seed)
        _check_level_shape(level, dim, nb)
        solution = solve_level(level, objective="pushes")
        assert solution is not None and solution.pushes == level.pushes, f"seed {seed}:\n{level.to_text()}"
        assert replay(level.fixed, level.boxes, level.player, solution.actions)
