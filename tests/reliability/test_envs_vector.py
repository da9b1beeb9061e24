"""Every id works in ``gymnasium.make_vec``, sync and async (shared memory, the default, and pipes), with autoreset.

Before, an ``AsyncVectorEnv`` with shared memory (what ``vectorization_mode="async"`` makes) returned 1,000,000
copies of ``"a"`` as every observation: gymnasium's ``Text`` shared memory is read once, into a snapshot of the
zeroed buffer. ``ragen_envs.spaces`` registers a live view for ``UnicodeText``; here the async envs must give exactly
the sync envs' observations, step by step, across episode ends.
"""

from __future__ import annotations

import copy
import multiprocessing as mp

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs  # noqa: F401
from ragen_envs.registration import ENV_IDS
from ragen_envs.spaces import SharedTexts, UnicodeText

#: Small WebShop catalogs: each worker process of an async WebShop builds its own embedded server.
WEBSHOP = {"num_products": 60}
N_ENVS = 2

# Per id: a reply that plays, and one that is malformed. Episodes end within their turn caps (1 turn for Bandit and
# Countdown, 5 for the grids, 9 for WebShop), so a few steps cross several episode ends and autoresets.
GOOD = {
    "Bandit": "<think>risk</think><answer>Dragon</answer>",
    "BanditTest": "<think>risk</think><answer>Librarian</answer>",
    "BanditRev": "<think>safe</think><answer>Phoenix</answer>",
    "FrozenLake": "<think>go</think><answer>Down || Right || Down</answer>",
    "Countdown": "<think>sum</think><answer>1 + 2 + 3</answer>",
    "Sokoban": "<think>push</think><answer>Up || Left || Down || Right</answer>",
    "SokobanLarge": "<think>push</think><answer>Right || Down || Left</answer>",
    "SokobanNewVocab": "<think>push</think><answer>Down || Right</answer>",
    "WebShop": "<think>look</think><answer>search[shirt]</answer>",
}
BAD = "no tags at all, but a unicode tail: √ 中文 🙂 \x00"
STEPS = {"WebShop": 11}  # past the 9-turn cap once; the others: 7 steps


def _kwargs(env_id: str) -> dict:
    return dict(WEBSHOP) if "WebShop" in env_id else {}


def _name(env_id: str) -> str:
    return env_id.split("/")[1].rsplit("-", 1)[0]


def _replies(env_id: str, step: int) -> list[str]:
    good = GOOD[_name(env_id)]
    return [good, BAD if step % 3 == 2 else good][:N_ENVS]


def _run(envs: gym.vector.VectorEnv, env_id: str) -> list:
    """Play a fixed script; check every observation against the spaces; return the trace."""
    single = envs.single_observation_space
    assert isinstance(single, UnicodeText)
    trace = []
    obs, infos = envs.reset(seed=[5, 6])
    first_prompts = obs
    trace.append(obs)
    ended = np.zeros(N_ENVS, bool)
    autoreset = np.zeros(N_ENVS, bool)
    for step in range(STEPS.get(_name(env_id), 7)):
        obs, rewards, terminated, truncated, infos = envs.step(_replies(env_id, step))
        assert isinstance(obs, tuple) and len(obs) == N_ENVS
        assert envs.observation_space.contains(obs)
        assert all(single.contains(o) and len(o) < single.max_length for o in obs)
        assert all("a" * 1000 not in o for o in obs)
        for i in np.flatnonzero(autoreset):  # NEXT_STEP autoreset: the step after an end is a reset
            assert "Turn 1:" in obs[i] and rewards[i] == 0 and not terminated[i] and not truncated[i]
            autoreset[i] = False
        trace.append((obs, rewards.tolist(), terminated.tolist(), truncated.tolist(), list(infos["reason"])))
        autoreset = terminated | truncated
        ended |= autoreset
    assert ended.all(), "every env should have ended an episode (and been reset)"
    assert all("Turn 1:" in p for p in first_prompts)
    return trace


@pytest.mark.parametrize("env_id", list(ENV_IDS))
def test_sync_async_and_async_without_shared_memory_give_the_same_episodes(env_id):
    traces = {}
    for mode, vector_kwargs in (
        ("sync", {}),
        ("async", {}),  # shared memory: gymnasium's default
        ("async-pipes", {"shared_memory": False}),
    ):
        envs = gym.make_vec(
            env_id,
            N_ENVS,
            vectorization_mode=mode.split("-")[0],
            vector_kwargs=vector_kwargs,
            **_kwargs(env_id),
        )
        try:
            traces[mode] = _run(envs, env_id)
        finally:
            envs.close()
    assert traces["async"] == traces["sync"]
    assert traces["async-pipes"] == traces["sync"]


def test_async_observations_match_single_envs():
    env_id = "ragen/Sokoban-v0"
    envs = gym.make_vec(env_id, N_ENVS, vectorization_mode="async")
    try:
        obs, _ = envs.reset(seed=[3, 4])
        singles = [gym.make(env_id) for _ in range(N_ENVS)]
        assert obs == tuple(s.reset(seed=3 + i)[0] for i, s in enumerate(singles))
        reply = GOOD["Sokoban"]
        obs, *_ = envs.step([reply] * N_ENVS)
        assert obs == tuple(s.step(reply)[0] for s in singles)
    finally:
        envs.close()


def test_async_with_spawned_workers_and_a_short_observation_bound():
    # spawn: the workers import ragen_envs afresh, so the shared-memory functions must be registered there too;
    # max_observation_chars sizes the space and so the shared buffers.
    envs = gym.make_vec(
        "ragen/FrozenLake-v0",
        N_ENVS,
        vectorization_mode="async",
        vector_kwargs={"context": "spawn"},
        max_observation_chars=300,
    )
    try:
        assert envs.single_observation_space == UnicodeText(300)
        obs, _ = envs.reset(seed=0)
        assert all(len(o) == 300 and "[... cut ...]" in o for o in obs)  # the reference prompt is longer
        for _ in range(6):
            obs, *_ = envs.step([GOOD["FrozenLake"]] * N_ENVS)
            assert envs.observation_space.contains(obs)
    finally:
        envs.close()


def test_copy_false_gives_a_live_view():
    envs = gym.make_vec("ragen/Bandit-v0", N_ENVS, vectorization_mode="async", vector_kwargs={"copy": False})
    try:
        obs, _ = envs.reset(seed=1)
        assert isinstance(obs, SharedTexts) and len(obs) == N_ENVS
        snapshot = tuple(obs)
        assert copy.deepcopy(obs) == snapshot and obs == snapshot and obs[:1] == snapshot[:1]
        envs.step([GOOD["Bandit"]] * N_ENVS)
        assert tuple(obs) != snapshot  # the view shows the latest observations ("Reward: ...")
    finally:
        envs.close()


def test_shared_memory_round_trip_and_refusals():
    from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

    space = UnicodeText(64)
    memory = create_shared_memory(space, n=3, ctx=mp.get_context("fork"))
    view = read_from_shared_memory(space, memory, n=3)
    texts = ["", "√ 中文 🙂 \x00 \ud800 end", "x" * 64]  # a lone surrogate, a NUL, the longest text
    for i, text in enumerate(texts):
        write_to_shared_memory(space, i, text, memory)
    assert tuple(view) == tuple(texts)
    write_to_shared_memory(space, 2, "short", memory)
    assert view[2] == "short" and view[1] == texts[1]
    for bad in ("y" * 65, None, b"bytes"):
        with pytest.raises(ValueError, match="invalid observation"):
            write_to_shared_memory(space, 0, bad, memory)
    assert view[0] == ""
