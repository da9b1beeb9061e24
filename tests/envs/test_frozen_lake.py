"""FrozenLake: random solvable maps per seed, gymnasium's fixed maps and dynamics, slip statistics, symbols,
rendering, reasoning checks and arguments."""

from __future__ import annotations

import json
import math
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import MAPS as GYM_MAPS
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake

import ragen_envs  # noqa: F401
from ragen_envs.frozen_lake import (
    ACTIONS,
    HOLE,
    MAPS,
    FrozenLakeEnv,
    best_action,
    generate_random_map,
    parse_desc,
    reachable,
    shortest_path,
)


def test_random_maps_are_solvable_and_follow_the_seed():
    env = FrozenLakeEnv()
    grids = set()
    for seed in range(100):
        env.reset(seed=seed)
        view = env.state_view()
        assert view["size"] == [4, 4] and view["player"] != view["goal"]
        assert shortest_path(env._grid, tuple(view["player"]), tuple(view["goal"])) is not None
        text = env.state_text()
        env.reset(seed=seed)
        assert env.state_text() == text  # same seed, same initial state
        grids.add(text)
    assert len(grids) > 90  # different seeds give different maps


def test_map_size_and_frozen_probability():
    rng = np.random.default_rng(0)
    holes = cells = 0
    for _ in range(200):
        grid, start, goal = generate_random_map(rng, size=8, p=0.8)
        assert grid.shape == (8, 8) and reachable(grid, start, goal)
        holes += int((grid == HOLE).sum())
        cells += 62  # start and goal are never holes
    # Solvable maps are a little less holey than 1 - p; the redraw only removes the hole-heaviest maps.
    assert 0.12 < holes / cells < 0.21
    no_holes, *_ = generate_random_map(np.random.default_rng(1), size=5, p=1.0)
    assert not (no_holes == HOLE).any()
    env = FrozenLakeEnv(size=6, p=0.9)
    env.reset(seed=0)
    assert len(env.state_text().split("\n")) == 6


def test_fixed_maps_reproduce_gymnasium():
    assert MAPS == GYM_MAPS
    for name in ("4x4", "8x8"):
        env = FrozenLakeEnv(map_name=name)
        env.reset(seed=0)
        rows = env.state_text().split("\n")
        expected = [r.replace("S", "P").replace("F", "_").replace("H", "O") for r in GYM_MAPS[name]]
        assert rows == expected
    custom = FrozenLakeEnv(desc=["SH", "FG"])
    custom.reset(seed=3)
    assert custom.state_text() == "PO\n_G"


class _FixedDraw:
    """A stand-in for np_random whose random() returns a chosen number: selects one branch of a slip."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


@pytest.mark.parametrize("name, success_rate", [("4x4", 1 / 3), ("8x8", 1 / 3), ("4x4", 0.8)])
def test_transition_probabilities_equal_gymnasium(name, success_rate):
    gym_env = GymFrozenLake(map_name=name, is_slippery=True, success_rate=success_rate)
    env = FrozenLakeEnv(map_name=name, success_rate=success_rate)
    env.reset(seed=0)
    ncol = len(GYM_MAPS[name][0])
    side = (1 - success_rate) / 2
    branches = [(0.0, success_rate), (success_rate + 1e-9, side), (1 - 1e-9, side)]
    for s in range(len(GYM_MAPS[name]) * ncol):
        if GYM_MAPS[name][s // ncol][s % ncol] in "HG":
            continue  # terminal cells: no transitions to compare
        for a in range(4):
            expected: Counter = Counter()
            for prob, nxt, reward, done in gym_env.P[s][a]:
                expected[(nxt, reward, done)] += prob
            got: Counter = Counter()
            for u, prob in branches:
                env._pos, env._status = divmod(s, ncol), "playing"
                env.np_random = _FixedDraw(u)  # type: ignore[assignment]
                out = env._apply_action(ACTIONS[a])
                r, c = env._pos
                got[(r * ncol + c, out.reward, out.terminated)] += prob
            assert got.keys() == expected.keys(), (s, a)
            for key in got:
                assert got[key] == pytest.approx(expected[key]), (s, a, key)


@pytest.mark.parametrize("success_rate", [1 / 3, 0.7])
def test_slip_frequencies_match_the_success_rate(success_rate):
    env = FrozenLakeEnv(map_name="8x8", success_rate=success_rate)  # row 1 is hole-free
    env.reset(seed=123)
    counts: Counter = Counter()
    n = 30_000
    for _ in range(n):
        env._pos, env._status = (1, 3), "playing"
        info = env.step("Left")[4]
        counts[info["moved"]] += 1
    assert set(counts) == {"Left", "Up", "Down"}  # never the opposite direction
    expected = {"Left": success_rate, "Down": (1 - success_rate) / 2, "Up": (1 - success_rate) / 2}
    chi2 = sum((counts[k] - n * p) ** 2 / (n * p) for k, p in expected.items())
    assert chi2 < 18.4  # chi-square, 2 dof, p = 1e-4
    for k, p in expected.items():
        assert abs(counts[k] / n - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_not_slippery_moves_go_where_asked():
    env = FrozenLakeEnv(map_name="4x4", is_slippery=False)
    env.reset(seed=0)
    info = env.step("Right")[4]
    assert env.state_view()["player"] == [0, 1] and info["slipped"] is False and info["action_is_effective"]
    _, _, _, _, info = env.step("Up")  # off the edge: stays, ineffective
    assert env.state_view()["player"] == [0, 1] and not info["action_is_effective"]


def test_symbols_rewards_and_episode_end():
    env = FrozenLakeEnv(map_name="4x4", is_slippery=False)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("Down")
    _, reward, terminated, _, info = env.step("Right")  # (1,1) is a hole
    assert terminated and reward == 0.0 and not info["success"]
    assert env.state_text().split("\n")[1] == "_X_O"
    # Further steps change nothing.
    _, reward, terminated, _, info = env.step("Left")
    assert terminated and reward == 0.0 and env.state_view()["player"] == [1, 1]
    env.reset(seed=0)
    for move in ("Down", "Down", "Right", "Right", "Down"):
        env.step(move)
    _, reward, terminated, _, info = env.step("Right")
    assert reward == 1.0 and terminated and info["success"] and env.is_success()
    assert env.state_text().split("\n")[3] == "O__√"


def test_rendering_ansi_and_rgb():
    env = gym.make("ragen/FrozenLake-v0", map_name="4x4", render_mode="rgb_array")
    env.reset(seed=0)
    image = env.render()
    assert image.shape == (128, 128, 3) and image.dtype == np.uint8
    assert not np.array_equal(image[:32, :32], image[:32, 32:64])  # the player's cell differs from plain ice
    ansi = gym.make("ragen/FrozenLake-v0", render_mode="ansi")
    ansi.reset(seed=2)
    assert ansi.render() == ansi.unwrapped.state_text()


def test_cell_separator_spaces_the_observation_and_nothing_else():
    plain = gym.make("ragen/FrozenLake-v0", is_slippery=False)
    spaced = gym.make("ragen/FrozenLake-v0", is_slippery=False, cell_separator=" ")
    for seed in range(5):
        plain.reset(seed=seed)
        spaced.reset(seed=seed)
        for move in ("Down", "Right", "Up"):
            a, b = plain.unwrapped, spaced.unwrapped
            assert b.state_text() == "\n".join(" ".join(row) for row in a.state_text().split("\n"))
            assert a.state_view() == b.state_view()  # the structured view is the same: cells, not text
            plain.step(move)
            spaced.step(move)
    spaced.reset(seed=0)
    protocol = gym.make("ragen/FrozenLake-v0", cell_separator=" ", max_turns=1)
    obs, _ = protocol.reset(seed=0)
    assert spaced.unwrapped.state_text() in obs  # the agent's prompt carries the spaced grid


def test_state_view_is_structured_and_json_serialisable():
    env = FrozenLakeEnv(map_name="4x4")
    env.reset(seed=0)
    view = env.state_view()
    json.dumps(view)
    assert view["player"] == [0, 0] and view["goal"] == [3, 3]
    assert sorted(view["holes"]) == [[1, 1], [1, 3], [2, 3], [3, 0]]
    assert view["grid"][0] == "P___" and view["status"] == "playing" and view["slippery"]


def test_check_reasoning_positions_moves_and_directions():
    env = FrozenLakeEnv(map_name="4x4")
    env.reset(seed=0)
    view = env.state_view()
    check = lambda text: env.check_reasoning(text, view, [])  # noqa: E731
    assert check("I am at (0, 0). The goal is at (3,3).") == {"supported": 2, "contradicted": 0}
    assert check("I'm at (2, 2) and the goal is at (0,1).") == {"supported": 0, "contradicted": 2}
    assert check("Holes at (1,1), (1,3) and (3,1).") == {"supported": 2, "contradicted": 1}
    assert check("I will move to (0, 1) next.") == {"supported": 0, "contradicted": 0}  # a plan, not a claim
    assert check("Moving up hits the edge. Going down is safe, it does not lead to a hole.")["supported"] == 2
    assert check("Moving right leads to a hole.") == {"supported": 0, "contradicted": 1}
    assert check("The goal is below me. The goal is to the left.") == {"supported": 1, "contradicted": 1}
    assert check("I am at (0, 0). I am at (0, 0). I am at (0,0).") == {"supported": 1, "contradicted": 0}
    assert check("") == {"supported": 0, "contradicted": 0}
    near = FrozenLakeEnv(desc=["SFH", "FFF", "FFG"], is_slippery=False)
    near.reset(seed=0)
    near.step("Right")
    assert near.check_reasoning("Moving right leads to a hole", near.state_view(), [])["supported"] == 1


def test_best_action_plans_a_solvable_route():
    env = FrozenLakeEnv(map_name="4x4", is_slippery=False)
    env.reset(seed=0)
    for _ in range(6):
        action, chance = best_action(env.state_view(), 10)
        assert chance == pytest.approx(1.0)
        env.step(action)
    assert env.is_success()
    slippery = FrozenLakeEnv(map_name="4x4")
    slippery.reset(seed=0)
    action, chance = best_action(slippery.state_view(), 100)
    assert 0.7 < chance < 0.8  # gymnasium's 4x4 slippery map: the optimal policy reaches the goal ~74 % of the time
    assert action in ("Left", "Up")  # the known optimal first move pushes against the wall


def test_parse_desc_and_bad_arguments():
    grid, start, goal = parse_desc(["SF", "HG"])
    assert start == (0, 0) and goal == (1, 1) and grid[1, 0] == HOLE
    for kwargs, name in [
        ({"size": 1}, "size"),
        ({"size": 4.0}, "size"),
        ({"p": 0}, "p"),
        ({"p": 1.5}, "p"),
        ({"success_rate": -0.1}, "success_rate"),
        ({"is_slippery": "yes"}, "is_slippery"),
        ({"map_name": "5x5"}, "map_name"),
        ({"desc": ["SF", "F"]}, "desc"),
        ({"desc": ["SX", "FG"]}, "desc"),
        ({"desc": ["SF", "FF"]}, "desc"),
        ({"desc": "SFFG"}, "desc"),
        ({"desc": ["SF", "FG"], "map_name": "4x4"}, "desc"),
        ({"render_mode": "human"}, "render_mode"),
        ({"cell_separator": "|"}, "cell_separator"),
        ({"cell_separator": None}, "cell_separator"),
    ]:
        with pytest.raises(ValueError, match=f"invalid argument {name}="):
            gym.make("ragen/FrozenLake-v0", **kwargs)
