"""benchmarks/headroom.py: its exact probabilities agree with the env played, its search is exhaustive, its
oracles are ordered as they must be, and its command line refuses bad input."""

from __future__ import annotations

import itertools
import math

import gymnasium as gym
import numpy as np
import pytest

from benchmarks import headroom
from ragen_envs.frozen_lake import ACTIONS
from ragen_envs.sokoban.solver import ACTIONS as SOKOBAN_ACTIONS
from ragen_envs.sokoban.solver import solve_level
from ragen_trainer.trainer import VAL_SEED_BASE

ENV = "ragen/FrozenLake-v0"


@pytest.fixture(scope="module")
def states():
    return headroom.frozen_lake_states(ENV, 6, {})


def played(env_id: str, index: int, moves: list[int], names: tuple[str, ...], slip_seed: list[int] | None = None
           ) -> bool:
    """Whether ``moves`` solve validation state ``index`` played through the env's text protocol, as a model's replies
    are (five moves a turn); ``slip_seed`` reseeds the env's generator after the reset (the map comes from the reset
    seed, FrozenLake's slips from that generator)."""
    env = gym.make(env_id)
    env.reset(seed=VAL_SEED_BASE + index)
    if slip_seed is not None:
        env.unwrapped.np_random = np.random.default_rng(slip_seed)
    info: dict = {}
    for start in range(0, len(moves), 5):
        answer = " || ".join(names[a] for a in moves[start:start + 5])
        _obs, _reward, terminated, truncated, info = env.step(f"<think>x</think><answer>{answer}</answer>")
        if terminated or truncated:
            break
    env.close()
    return bool(info.get("success"))


def test_exact_success_matches_the_env_played(states):
    P, goal, _terminal, start = states
    moves = [1, 1, 2, 2, 1, 0, 2, 3, 1, 2]  # Down Down Right Right Down Left Right Up Down Right
    exact = headroom.sequence_success(P, goal, start, moves)
    episodes = 1500
    for index in range(len(exact)):
        measured = np.mean([played(ENV, index, moves, ACTIONS, [index, e]) for e in range(episodes)])
        sigma = math.sqrt(max(exact[index] * (1 - exact[index]), 1e-4) / episodes)
        assert abs(measured - exact[index]) < 4.5 * sigma + 1e-9, (index, measured, exact[index])
    # Random moves: the average over all sequences of their exact success.
    few = 3
    every = np.mean([headroom.sequence_success(P, goal, start, list(q)) for q in itertools.product(range(4), repeat=few)],
                    axis=0)
    np.testing.assert_allclose(headroom.random_success(P, goal, start, few), every, atol=1e-12)


@pytest.mark.parametrize("moves, block_depth", [(4, 7), (6, 2)])
def test_best_open_loop_is_the_best_of_every_sequence(states, monkeypatch, moves, block_depth):
    monkeypatch.setattr(headroom, "BLOCK_DEPTH", block_depth)  # 6 moves, blocks of 2: three prefix moves enumerated
    P, goal, _terminal, start = states
    brute = max(float(headroom.sequence_success(P, goal, start, list(q)).mean())
                for q in itertools.product(range(4), repeat=moves))
    seq, score = headroom.best_open_loop(P, goal, start, moves)
    assert len(seq) == moves
    assert score == pytest.approx(brute, abs=1e-12)
    assert float(headroom.sequence_success(P, goal, start, seq).mean()) == pytest.approx(brute, abs=1e-12)


def test_oracles_are_ordered(states):
    P, goal, terminal, start = states
    moves = 6
    blind = np.max([headroom.sequence_success(P, goal, start, list(q)) for q in itertools.product(range(4), repeat=moves)],
                   axis=0)  # per state: the best blind sequence for that state alone
    protocol = headroom.protocol_oracle(P, goal, start, turns=3, per_turn=2, moves=moves)
    closed = headroom.closed_loop_oracle(P, goal, terminal, start, moves)
    assert np.all(protocol >= blind - 1e-12)  # reading the board at each turn cannot hurt
    assert np.all(closed >= protocol - 1e-12)  # seeing it after every move cannot either
    assert np.any(protocol > blind + 1e-6)  # and on a slippery lake it helps somewhere
    # One move a turn, a turn per move: the protocol's oracle is the closed-loop one.
    np.testing.assert_allclose(headroom.protocol_oracle(P, goal, start, turns=moves, per_turn=1, moves=moves), closed,
                               atol=1e-12)
    # One turn: the best sequence of each state.
    np.testing.assert_allclose(headroom.protocol_oracle(P, goal, start, turns=1, per_turn=moves, moves=moves), blind,
                               atol=1e-12)


def test_command_line_writes_the_table_and_refuses_bad_input(tmp_path, capsys):
    md, js = tmp_path / "h.md", tmp_path / "h.json"
    assert headroom.main(["--states", "4", "--moves", "4", "--no-progress", "--md", str(md), "--json", str(js)]) == 0
    text = md.read_text(encoding="utf-8")
    assert "| best open-loop sequence (" in text and "| protocol's oracle | at each of 5 turns |" in text
    assert "done in" in capsys.readouterr().out
    for argv, message in ((["--env-kwargs", "[1, 2]"], "expected a mapping"),
                          (["--moves", "13"], "--moves <= 12"),
                          (["--env", "ragen/NoSuchEnv-v0"], "FrozenLake and Sokoban env ids"),
                          (["--env-kwargs", "{size: 1}"], "FrozenLake and Sokoban env ids")):
        with pytest.raises(SystemExit) as exit_info:
            headroom.main(["--states", "2", "--moves", "2", "--no-progress", *argv])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


SOKOBAN = "ragen/Sokoban-v0"


@pytest.fixture(scope="module")
def levels():
    return headroom.sokoban_tables(SOKOBAN, 8, {}, moves=6)


def test_sokoban_tables_match_the_env_played(levels):
    T, win = levels
    rng = np.random.default_rng(0)
    sequences = [list(rng.integers(4, size=6)) for _ in range(40)]
    # and each level's own optimal plan, so that solved levels are checked too
    for index in range(T.shape[0]):
        env = gym.make(SOKOBAN)
        env.reset(seed=VAL_SEED_BASE + index)
        plan = solve_level(env.unwrapped.snapshot())
        env.close()
        if plan is not None and plan.moves <= 6:
            sequences.append([SOKOBAN_ACTIONS.index(a) for a in plan.actions] + [0] * (6 - plan.moves))
    solved_somewhere = 0
    for moves in sequences:
        exact = headroom.sokoban_sequence_success(T, win, moves)
        outcomes = [played(SOKOBAN, index, moves, SOKOBAN_ACTIONS) for index in range(T.shape[0])]
        np.testing.assert_array_equal(exact, np.array(outcomes, dtype=float), err_msg=str(moves))
        solved_somewhere += int(exact.sum())
    assert solved_somewhere > 0
    every = np.mean([headroom.sokoban_sequence_success(T, win, list(q)) for q in itertools.product(range(4), repeat=3)],
                    axis=0)
    np.testing.assert_allclose(headroom.sokoban_random_success(T, win, 3), every, atol=1e-12)


@pytest.mark.parametrize("moves, block_depth", [(4, 7), (6, 2)])
def test_sokoban_best_open_loop_is_the_best_of_every_sequence(levels, monkeypatch, moves, block_depth):
    monkeypatch.setattr(headroom, "BLOCK_DEPTH", block_depth)
    T, win = levels
    brute = max(float(headroom.sokoban_sequence_success(T, win, list(q)).mean())
                for q in itertools.product(range(4), repeat=moves))
    seq, score = headroom.sokoban_best_open_loop(T, win, moves)
    assert score == pytest.approx(brute) and float(headroom.sokoban_sequence_success(T, win, seq).mean()) == pytest.approx(brute)


def test_sokoban_solvable_agrees_with_the_solver(levels):
    T, win = levels
    solvable = headroom.sokoban_solvable(T, win, 6)
    for index in range(T.shape[0]):
        env = gym.make(SOKOBAN)
        env.reset(seed=VAL_SEED_BASE + index)
        plan = solve_level(env.unwrapped.snapshot())
        env.close()
        assert solvable[index] == float(plan is not None and plan.moves <= 6), index
    assert 0 < solvable.sum()


def test_sokoban_table_on_the_command_line(tmp_path):
    md = tmp_path / "s.md"
    assert headroom.main(["--env", SOKOBAN, "--states", "4", "--moves", "4", "--no-progress", "--md", str(md)]) == 0
    text = md.read_text(encoding="utf-8")
    assert "| protocol's oracle (solvable within the moves) |" in text and "| Up repeated | never |" in text
