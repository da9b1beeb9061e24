"""gymnasium's env checker on every registered offline id (wrapped and unwrapped), and seeded determinism."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import ragen_envs
from ragen_envs.core import BaseTextEnv

# Sokoban and WebShop ids are checked by their own test modules.
OWN_IDS = [i for i in ragen_envs.ENV_IDS if "Sokoban" not in i and "WebShop" not in i]
VARIANTS = [
    ("ragen/FrozenLake-v0", {"map_name": "8x8", "render_mode": "rgb_array"}),
    ("ragen/FrozenLake-v0", {"size": 6, "p": 0.7, "success_rate": 0.8, "render_mode": "ansi"}),
    ("ragen/FrozenLake-v0", {"is_slippery": False, "enable_think": False, "actions_per_turn": 1}),
    (
        "ragen/Countdown-v0",
        {"tasks": "generated", "scoring": "strict", "use_all_numbers": False, "max_numbers": 5, "max_turns": 2},
    ),
    ("ragen/Bandit-v0", {"reward_wrappers": ["format", "grounding", "thinking_length"], "max_turns": 2}),
]


def test_own_ids_are_registered():
    assert OWN_IDS == [
        "ragen/Bandit-v0",
        "ragen/BanditTest-v0",
        "ragen/BanditRev-v0",
        "ragen/FrozenLake-v0",
        "ragen/Countdown-v0",
    ]
    for env_id in OWN_IDS:
        assert env_id in gym.registry


#: gymnasium's checker steps a random reply and rejects an env that truncates after one step; the one-turn ids (the
#: reference's Bandit and Countdown) do exactly that by design, so the checker sees them with a second turn allowed.
CHECKER_TURNS = {i: {"max_turns": 2} for i in OWN_IDS if ragen_envs.reference_settings(i).max_turns == 1}


@pytest.mark.parametrize("env_id, kwargs", [(i, CHECKER_TURNS.get(i, {})) for i in OWN_IDS] + VARIANTS)
def test_check_env_wrapped_and_unwrapped(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "different from the unwrapped version" is expected for the wrapped env
        check_env(env, skip_render_check=False)
    unwrapped = gym.make(env_id, **kwargs).unwrapped
    assert isinstance(unwrapped, BaseTextEnv)
    check_env(unwrapped, skip_render_check=False)


def _trajectory(env_id: str, seed: int, replies: list[str], **kwargs) -> list:
    env = gym.make(env_id, **kwargs)
    out = [env.reset(seed=seed)[0]]
    for reply in replies:
        obs, reward, terminated, truncated, info = env.step(reply)
        out.append((obs, reward, terminated, truncated, info["actions"], info["success"]))
        if terminated or truncated:
            out.append(env.reset()[0])  # an unseeded reset continues the seeded generator: also reproducible
    return out


REPLIES = {
    "ragen/Bandit-v0": ["<think>t</think><answer>Dragon</answer>"] * 6,
    "ragen/BanditTest-v0": ["<think>t</think><answer>Librarian</answer>"] * 6,
    "ragen/BanditRev-v0": ["<think>t</think><answer>Phoenix</answer>"] * 6,
    "ragen/FrozenLake-v0": [
        "<think>t</think><answer>Down || Right || Up</answer>",
        "<think>t</think><answer>Left</answer>",
    ]
    * 6,
    "ragen/Countdown-v0": ["<think>t</think><answer>1 + 2</answer>"] * 4,
}


@pytest.mark.parametrize("env_id", OWN_IDS)
def test_same_seed_same_trajectory(env_id):
    replies = REPLIES[env_id]
    a = _trajectory(env_id, 42, replies)
    assert a == _trajectory(env_id, 42, replies)
    starts = {_trajectory(env_id, seed, [])[0] for seed in range(20)}
    assert len(starts) > 1  # different seeds give different initial states
