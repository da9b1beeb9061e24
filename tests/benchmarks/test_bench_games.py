"""``benchmarks/bench_games.py`` without TextArena: a few games of each ragen game, in process; the table and the JSON
name every game with positive steps/s, and the scripted players only make legal moves (games end by their rules)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("pettingzoo")

from ragen_envs.games import GAMES

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_games.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_games_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_ragen_part_reports_every_game(bench, tmp_path, capsys):
    out = tmp_path / "games.json"
    assert bench.main(["--games", "3", "--repeat", "2", "--no-textarena", "--no-progress", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["games"] == 3 and results["repeats"] == 2 and results["textarena"]["status"].startswith("skipped")
    assert [r["game"] for r in results["results"]] == list(GAMES)
    for row in results["results"]:
        assert row["game"] in printed and row["textarena_id"] in printed
        assert "error" not in row and row["textarena"] is None and row["ratio"] is None
        for engine in ("ragen_pettingzoo", "ragen_view"):
            m = row[engine]
            assert m["games"] == 3 and m["repeats"] == 2 and m["steps"] >= 3
            assert m["steps_per_s"] > 0 and m["steps_per_wall_s"] > 0
            # a game's steps are bounded by its rules: no reply was invalid, so no game ran into the turn budget
            core = GAMES[row["game"]].core()
            assert m["steps_per_game"] <= core.max_moves(0) + core.max_moves(1)


def test_textarena_unavailable_is_na_not_a_failure(bench, tmp_path):
    """A Python without textarena gives "n/a (why)" in the TextArena column; the ragen figures still come."""
    results = bench.run_benchmark(
        1, only=["tictactoe"], view=False, textarena_python=Path(sys.executable), progress=False
    )
    if results["textarena"]["status"] == "ok":
        pytest.skip("this Python has textarena installed")
    (row,) = results["results"]
    assert row["ragen_pettingzoo"]["steps_per_s"] > 0 and row["textarena"] is None
    assert "textarena does not import" in results["textarena"]["status"] and row["textarena_na"]
    _, rows = bench.table_rows(results)
    assert rows[0][4].startswith("n/a (")
