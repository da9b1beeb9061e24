"""Lazy seeding and the fast fresh-level Sokoban reset change no level, no draw and no observable behaviour.

``BaseTextEnv.reset(seed=s)`` records ``s`` and builds ``np_random`` on first use; a Sokoban reset computes the first
64-bit draw of that Generator from ``s`` directly and reads its level straight from the generator's kernel. Each test
compares with what gymnasium's eager seeding (``gymnasium.utils.seeding.np_random``) and the generator's own
``generate`` give.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.seeding import np_random

import ragen_envs  # noqa: F401
from ragen_envs.core import BaseTextEnv
from ragen_envs.sokoban.base import first_uint64, numba_available
from ragen_envs.sokoban.env import SokobanEnv
from ragen_envs.sokoban.reference_generator import ReferenceConfig, ReferenceGenerator

SEEDS = [0, 1, 7, 123, 2**31 - 1, 2**32, 2**40 + 5, 2**63 + 11, 2**64 - 1, 2**64, 2**70 + 3]


def _eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed as gymnasium does (the Generator built at reset): the behaviour the lazy seeding must reproduce."""

    def seed_eagerly(self: BaseTextEnv, seed: object) -> None:
        gym.Env.reset(self, seed=seed)  # type: ignore[arg-type]

    monkeypatch.setattr(BaseTextEnv, "_seed_lazily", seed_eagerly)


def _play(env_id: str, kwargs: dict, replies: list[str]) -> tuple[list, dict]:
    """Observations, rewards and the final Generator state of a few seeded episodes and unseeded resets."""
    env = gym.make(env_id, **kwargs)
    trace: list = []
    for episode, seed in enumerate([3, None, 11, None, 2**40]):
        trace.append(env.reset(seed=seed)[0])
        for reply in replies:
            obs, reward, terminated, truncated, _ = env.step(reply)
            trace.append((obs, reward))
            if terminated or truncated:
                break
        if episode == 2:
            trace.append(env.unwrapped.np_random.random())  # a draw in between, from the user
    return trace, env.unwrapped.np_random.bit_generator.state


@pytest.mark.parametrize(
    ("env_id", "kwargs", "replies"),
    [
        ("ragen/FrozenLake-v0", {}, ["<think>t</think><answer>Down || Right || Down</answer>"] * 5),
        (
            "ragen/FrozenLake-v0",
            {"size": 6, "is_slippery": True},
            ["<think>t</think><answer>Right || Down</answer>"] * 5,
        ),
        ("ragen/Bandit-v0", {}, ["<think>t</think><answer>Dragon</answer>"]),
        ("ragen/BanditRev-v0", {}, ["<think>t</think><answer>Phoenix</answer>"]),
        ("ragen/Countdown-v0", {"tasks": "generated"}, ["<think>t</think><answer>1 + 2</answer>"]),
        ("ragen/Sokoban-v0", {}, ["<think>t</think><answer>Up || Left || Down</answer>"] * 5),
        ("ragen/SokobanLarge-v0", {}, ["<think>t</think><answer>Right || Down</answer>"] * 5),
        ("ragen/Sokoban-v0", {"generator": "exact"}, ["<think>t</think><answer>Up</answer>"] * 2),
        ("ragen/Sokoban-v0", {"backend": "python", "search_depth": 20}, ["<think>t</think><answer>Up</answer>"] * 2),
    ],
)
def test_trajectories_and_generator_state_match_eager_gymnasium_seeding(env_id, kwargs, replies, monkeypatch):
    lazy = _play(env_id, kwargs, replies)
    _eager(monkeypatch)
    eager = _play(env_id, kwargs, replies)
    assert lazy[0] == eager[0]
    assert lazy[1] == eager[1]


@pytest.mark.parametrize("seed", SEEDS)
def test_np_random_after_a_sokoban_reset_is_gymnasiums_after_its_one_draw(seed):
    env = SokobanEnv()
    env.reset(seed=seed)
    expected, expected_seed = np_random(seed)
    level_seed = int(expected.integers(2**62))
    assert env.np_random_seed == expected_seed == seed
    assert env.unwrapped._np_random.bit_generator.state == expected.bit_generator.state
    assert env.np_random.random() == expected.random()
    assert env.current_level().seed == level_seed


@pytest.mark.parametrize("seed", SEEDS)
def test_np_random_of_an_untouched_lazy_generator(seed):
    env = gym.make("ragen/Bandit-v0").unwrapped
    gym.Env.reset(env, seed=0)  # some other Generator first
    env._seed_lazily(seed)  # what reset(seed) does before drawing the state
    assert env._np_random_pending == seed  # nothing built yet
    expected, _ = np_random(seed)
    assert copy.deepcopy(env.unwrapped._np_random).bit_generator.state == expected.bit_generator.state
    assert env.np_random_seed == seed


def test_first_uint64_is_numpys_first_pcg64_output():
    rng = np.random.default_rng(5)
    seeds = list(range(300)) + [int(x) for x in rng.integers(0, 2**63, 700)] + SEEDS
    for seed in seeds:
        assert first_uint64(seed) == int(np.random.PCG64(seed).random_raw()), seed
        assert first_uint64(seed) >> 2 == int(np_random(seed)[0].integers(2**62)), seed


def test_seed_semantics_are_gymnasiums():
    env = SokobanEnv()
    env.reset()  # no seed, no Generator yet: a random one, as gymnasium makes
    assert isinstance(env.np_random_seed, int) and env.np_random_seed >= 0
    for bad in (-1, 1.5, "3", np.int64(3)):
        with pytest.raises(gym.error.Error):
            env.reset(seed=bad)
    env.reset(seed=4)
    env.np_random = np.random.default_rng(9)  # gymnasium's setter: seed unknown
    assert env.np_random_seed == -1
    assert env.np_random.bit_generator.state == np.random.default_rng(9).bit_generator.state
    env.reset(seed=True)  # gymnasium accepts a bool (an int); so does the eager path it falls back to
    assert env.np_random_seed == 1


def test_dynamics_seed_replaces_the_lazy_generator():
    env = gym.make("ragen/Bandit-v0").unwrapped
    env.reset(seed=3, options={"dynamics_seed": 8})
    expected, _ = np_random(8)
    assert env.np_random.bit_generator.state == expected.bit_generator.state
    assert env.np_random_seed == 8


@pytest.mark.parametrize(
    ("dim", "boxes", "depth", "vocab"),
    [
        ((6, 6), 1, 300, "default"),
        ((8, 8), 2, 10, "default"),
        ((6, 6), 1, 30, "new"),
        ((7, 9), 2, 20, {"wall": "##", "empty": " ", "target": "\x11", "box_on_target": "*", "box": "√",
                         "player": "@", "player_on_target": "+"}),
    ],
)  # fmt: skip
def test_fast_reset_plays_the_generators_level_and_renders_it_as_before(dim, boxes, depth, vocab):
    env = SokobanEnv(dim, boxes, search_depth=depth, vocab=vocab)
    gen = ReferenceGenerator(ReferenceConfig(dim, boxes, search_depth=depth))

    def grid() -> str:  # the rendering before the change: one symbol per cell code
        return "\n".join("".join(env._symbols[v] for v in row) for row in env._codes())

    for seed in range(300):
        obs, info = env.reset(seed=seed)
        level = gen.generate(int(np_random(seed)[0].integers(2**62)))
        assert env._fixed == level.fixed.tolist()
        assert env._boxes == set(level.boxes) and env._player == level.player
        assert info["optimal_pushes"] is None and info["optimal_moves"] is None
        assert obs == grid()
        assert env.level == level and env.current_level() is env.level
        for action in ("Up", "Left", "Down", "Right"):
            assert env.step(action)[0] == grid()


def test_copies_of_a_sokoban_env_play_their_own_levels():
    env = SokobanEnv()
    env.reset(seed=1)
    twin = copy.deepcopy(env)
    fresh = SokobanEnv()
    # The copy must read the kernel's buffers again, not stale copies of them.
    assert twin.reset(seed=2)[0] == fresh.reset(seed=2)[0]
    assert env.reset(seed=3)[0] == fresh.reset(seed=3)[0]
    assert twin._generator is env._generator  # the process's shared generator


@pytest.mark.skipif(not numba_available(), reason="the fast path needs numba")
def test_fast_reset_is_used_by_default():
    env = SokobanEnv()
    assert env._fast_reference
    env.reset(seed=0)
    assert env._level is None and env._level_seed is not None  # no Level built until asked for
