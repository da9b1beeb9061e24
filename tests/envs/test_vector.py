"""Vectorised use: gymnasium.make_vec, synchronous and asynchronous (docs/vector.md)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs  # noqa: F401

REPLY = "<think>try</think><answer>Left || Down</answer>"


def test_sync_vector_env_batches_text_and_autoresets():
    envs = gym.make_vec("ragen/FrozenLake-v0", num_envs=3, vectorization_mode="sync")
    try:
        obs, infos = envs.reset(seed=[0, 1, 2])
        assert isinstance(obs, tuple) and len(obs) == 3 and all(isinstance(o, str) for o in obs)
        single = gym.make("ragen/FrozenLake-v0")
        assert obs[1] == single.reset(seed=1)[0]  # env i is seeded with seeds[i]
        assert len(infos["system_prompt"]) == 3
        finished = np.zeros(3, bool)
        for _ in range(6):
            obs, rewards, terminated, truncated, infos = envs.step((REPLY, "bad reply", REPLY))
            assert rewards.shape == (3,) and rewards.dtype == np.float64
            assert infos["reason"][1] is not None and rewards[1] == pytest.approx(-0.1) or finished[1]
            finished |= terminated | truncated
        assert finished.all()  # every env ended within the 5-turn cap and was reset automatically
    finally:
        envs.close()


def test_async_vector_env_without_shared_memory():
    envs = gym.make_vec(
        "ragen/Bandit-v0",
        num_envs=2,
        vectorization_mode="async",
        vector_kwargs={"shared_memory": False},
    )
    try:
        obs, infos = envs.reset(seed=7)
        assert len(obs) == 2 and all("You are playing a bandit game" in o for o in obs)
        obs, rewards, terminated, truncated, infos = envs.step(("<think>t</think><answer>Dragon</answer>",) * 2)
        assert terminated.all() and list(infos["success"]) == [True, True]
        assert set(rewards) <= {0.0, 1.0}
    finally:
        envs.close()


def test_vector_env_with_kwargs_and_reward_wrappers():
    envs = gym.make_vec(
        "ragen/Countdown-v0", num_envs=2, vectorization_mode="sync", reward_wrappers=["format"], max_turns=2
    )
    try:
        envs.reset(seed=0)
        _, rewards, _, _, infos = envs.step(("<think>t</think><answer>1 + 2</answer>", "nonsense"))
        # "1 + 2" is not the puzzle's numbers: 0 from the env (reference scoring), 0.1 from the format wrapper
        assert rewards[0] == pytest.approx(0.0 + 0.1) and rewards[1] == pytest.approx(-0.1)
        # Nested info dicts are batched key by key: reward_parts[name] is an array over the envs.
        assert list(infos["reward_parts"]["format"]) == pytest.approx([0.1, 0.0])
    finally:
        envs.close()
