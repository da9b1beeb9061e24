"""Invalid-reply fuzzing: thousands of random replies per env (empty, huge, unicode, nested or unclosed tags,
eval-looking text). Every reply gets an observation, a reward and a reason; nothing raises, nothing is executed."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragen_envs  # noqa: F401
from ragen_envs.core import INFO_KEYS

ENV_IDS = ["ragen/Bandit-v0", "ragen/BanditTest-v0", "ragen/BanditRev-v0", "ragen/FrozenLake-v0", "ragen/Countdown-v0"]
ALL_REWARDS = ["format", "grounding", "thinking_length"]

FRAGMENTS = [
    "<think>", "</think>", "<answer>", "</answer>", "<think><think>", "</answer></answer>", "<answer><think>",
    "||", "|", " || ", ";", "\n", " ", "\t", "", "Left", "down", "RIGHT", "Up", "north", "Dragon", "phoenix", "1", "2",
    "Trader", "Librarian", "(3 + 5) * 2", "10 / 0", "1 + 1 = 2", "(((((", ")))", "-7", "9" * 30, "2 ** 99999",
    "__import__('os').system('echo pwned')", "eval('1+1')", "exec(open('x').read())", "lambda: 0", "{{7*7}}",
    "${jndi:ldap://x}", "'; DROP TABLE users; --", "√", "→", "中文", "🙂", "\x00", "\ud7ff", "<|im_end|>",
    "<|endoftext|>", "I am at (0, 0)", "the goal is at (3,3)", "moving left leads to a hole", "25 - 5 = 20",
]  # fmt: skip

replies = st.one_of(
    st.text(max_size=400),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=40).map("".join),
    st.builds(
        lambda think, answer: f"<think>{think}</think><answer>{answer}</answer>",
        st.text(max_size=200),
        st.lists(st.sampled_from(FRAGMENTS), max_size=8).map(" || ".join),
    ),
)

_ENVS: dict[str, gym.Env] = {}


def _env(env_id: str) -> gym.Env:
    if env_id not in _ENVS:
        _ENVS[env_id] = gym.make(env_id, reward_wrappers=ALL_REWARDS)
        _ENVS[env_id].reset(seed=0)
    return _ENVS[env_id]


def check_step(env: gym.Env, reply: str) -> None:
    obs, reward, terminated, truncated, info = env.step(reply)
    assert isinstance(obs, str) and env.observation_space.contains(obs)
    assert isinstance(reward, float) and math.isfinite(reward)
    assert set(INFO_KEYS) <= set(info)
    assert sum(info["reward_parts"].values()) == pytest.approx(reward)
    assert isinstance(info["think"], str) and isinstance(info["actions"], list)
    if not info["format_ok"] or not info["action_is_valid"]:
        assert isinstance(info["reason"], str) and info["reason"]
    if info["reason"] is not None and "episode has ended" not in info["reason"]:
        assert info["reward_parts"]["format_penalty"] == pytest.approx(-0.1)
    if terminated or truncated:
        env.reset()


@pytest.mark.parametrize("env_id", ENV_IDS)
@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(reply=replies)
def test_hypothesis_replies_never_raise(env_id, reply):
    check_step(_env(env_id), reply)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_thousands_of_random_fragment_replies(env_id):
    """A faster, seeded fuzz: 3000 replies of random fragments per env, on a fresh env with every reward wrapper."""
    rng = np.random.default_rng(0)
    env = gym.make(env_id, reward_wrappers=ALL_REWARDS)
    env.reset(seed=1)
    for _ in range(3000):
        parts = rng.choice(len(FRAGMENTS), size=int(rng.integers(0, 25)))
        check_step(env, "".join(FRAGMENTS[i] for i in parts))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_huge_and_degenerate_replies(env_id):
    env = gym.make(env_id, reward_wrappers=ALL_REWARDS)
    env.reset(seed=0)
    for reply in (
        "",
        "x" * 2_000_000,
        "<think>" + "a " * 500_000 + "</think><answer>" + "Left || " * 50_000 + "</answer>",
        "<think>" * 100_000,
        "<answer>" * 100_000 + "</answer>",
        "||" * 100_000,
        "\x00\x01\x02",
        "\udcff lone surrogate",
    ):
        check_step(env, reply)
    for bad in (None, 42, b"<answer>Left</answer>", ["Left"]):
        check_step(env, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_eval_looking_text_is_never_executed(env_id, tmp_path):
    marker = tmp_path / "pwned"
    payloads = [
        f"__import__('pathlib').Path({str(marker)!r}).touch()",
        f"open({str(marker)!r}, 'w').write('x')",
        f"exec(\"open({str(marker)!r}, 'w')\")",
    ]
    env = gym.make(env_id, reward_wrappers=ALL_REWARDS)
    for payload in payloads:
        for reply in (payload, f"<think>{payload}</think><answer>{payload}</answer>", f"<answer>{payload}</answer>"):
            env.reset(seed=0)
            check_step(env, reply)
    env_nothink = gym.make(env_id, enable_think=False)
    env_nothink.reset(seed=0)
    check_step(env_nothink, payloads[0])
    assert not marker.exists()
